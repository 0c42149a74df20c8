//! x86-64 kernels: AVX2+FMA+F16C, AVX-VNNI (AVX2 + VEX `vpdpbusd`), and AVX-512 (F/BW/VL +
//! VNNI).
//!
//! Every kernel body is written once, generic over
//! - an f32 vector width ([`V8`] = `__m256`, [`V16`] = `__m512`) for the float / exact paths, and
//! - an 8-bit dot product ([`Maddubs`] = AVX2 `vpmaddubsw`+`vpmaddwd`, [`Vnni`] = AVX-512 VNNI
//!   `vpdpbusd`/`vpdpwssd` on 256-bit registers, [`VnniVex`] = the same in AVX-VNNI's VEX
//!   encoding) for the integer path,
//!
//! and instantiated inside `#[target_feature]` entry points (bottom of the file), into which
//! the `#[inline(always)]` bodies and intrinsics are inlined. The integer kernels stay 256-bit
//! at the AVX-512 level: one 32-element block is one register, and decode is bandwidth-bound.
//!
//! Exact mode (f32 activations) at the AVX-512 level has its own kernels for the 4/5/6/8-bit
//! formats: the 4- and 5-bit formats take at most 16 or 32 distinct weights per (sub-)block,
//! so those values are computed once with the reference dequantizer's f32 operations (hence
//! bit-identical) into one or two registers and each element is a `vpermps`/`vpermt2ps`
//! lookup indexed straight by the zero-extended packed bytes; Q6_K and Q8_0 widen and
//! multiply. They keep 4 accumulator chains and prefetch the weight stream ([`PREFETCH`]).
//! The AVX2 level uses the generic bodies ([`exact_legacy_rows`], [`exact_k_rows`]).
//!
//! All functions here are `unsafe`: they read through the raw pointers of a [`MatArgs`], whose
//! validity the caller (`kernels::matmul_with`) establishes, and they must only run on a CPU
//! with the named features (the dispatcher checks with `is_x86_feature_detected!`).

// The kernels walk several small arrays (accumulators, activation pointers, sums) in lockstep
// over constant ranges that the compiler unrolls; index loops say that most plainly.
#![allow(clippy::needless_range_loop)]

use core::arch::x86_64::*;

use super::vecops::{mix_entry, MixG};
use super::{GemmArgs, MatArgs};
use crate::quant::reference_blocks as rb;

/// `f::<G…, NX, C…>(a)` with the call's activation-row count `a.nx` (1..=4) as the const `NX`;
/// constants after a `;` follow it.
macro_rules! by_nx {
    ($a:expr, $f:ident $(, $g:ty)* $(; $c:expr)*) => {
        match $a.nx {
            1 => $f::<$($g,)* 1 $(, { $c })*>($a),
            2 => $f::<$($g,)* 2 $(, { $c })*>($a),
            3 => $f::<$($g,)* 3 $(, { $c })*>($a),
            _ => $f::<$($g,)* 4 $(, { $c })*>($a),
        }
    };
}

mod exact;
mod factored;
mod float;
mod int8dot;
#[macro_use]
mod iqsuper;
mod iqgrid;
mod iquant;
mod kquant;
mod quant8;
mod simd;
mod vec;

pub(super) use super::simd::*;
pub(super) use exact::*;
pub(super) use factored::*;
pub(super) use float::*;
pub(super) use int8dot::*;
pub(super) use iqgrid::*;
pub(super) use iqsuper::*;
pub(super) use iquant::*;
pub(super) use kquant::*;
pub(super) use quant8::*;
pub(super) use simd::*;
pub(super) use vec::*;

/// Whether the CPU is an Intel one (CPUID vendor "GenuineIntel"), read once: where the best
/// kernel choice differs between vendors' cores for the same instructions (`bf16::pays`,
/// [`float_rows_n`]'s one-row prefetch).
pub(in crate::kernels) fn intel() -> bool {
    static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INTEL.get_or_init(|| {
        let v = __cpuid(0);
        [v.ebx, v.edx, v.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e]
    })
}

// ------------------------------------------------------------------ entry points

macro_rules! entry {
    ($name:ident, $features:literal, $body:expr) => {
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(a: &MatArgs) {
            $body(a)
        }
    };
}

/// The AVX-512 level's activation packer for the f32 GEMM (blocks of 32 rows).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn pack32_avx512(x: *const f32, k: usize, rows: usize, dst: *mut f32) {
    pack32_v16(x, k, rows, dst)
}

macro_rules! deq_entry {
    ($name:ident, $features:literal, $body:expr) => {
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(src: *const u8, dst: *mut f32, k: usize) {
            $body(src, dst, k)
        }
    };
}

/// A row-group dequantizer ([`super::DeqGroupFn`]) at one level.
macro_rules! deq_group_entry {
    ($name:ident, $features:literal, $body:expr) => {
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(src: *const u8, k: usize, dst: *mut f32, dst_stride: usize) {
            $body(src, k, dst, dst_stride)
        }
    };
}

macro_rules! level {
    ($m:ident, $features:literal, $V:ty, $D:ty, $leg:ident, $q4k:expr, $q5k:expr, $q6k:expr,
     $gr:literal, $deqleg:ident, $iq4xs:expr, $deqiq4xs:expr) => {
        pub(crate) mod $m {
            use super::*;
            mix_entry!(mix, MixFloat<$V, WF32>, $features);
            mix_entry!(mix_f16, MixFloat<$V, WF16>, $features);
            mix_entry!(mix_q8, MixQ8, $features);
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn gemm(g: &GemmArgs) {
                gemm_tile::<$V, $gr>(g)
            }
            /// [`gemm_narrow`]: `g.n` ≤ 8, plain activation rows.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn gemm_narrow(g: &GemmArgs) {
                super::gemm_narrow::<$V>(g)
            }
            deq_entry!(deq_f16, $features, deq_float::<$V, WF16>);
            deq_entry!(deq_bf16, $features, deq_float::<$V, WBF16>);
            deq_entry!(deq_q4_0, $features, $deqleg::<WQ4_0>);
            deq_entry!(deq_q4_1, $features, $deqleg::<WQ4_1>);
            deq_entry!(deq_q5_0, $features, $deqleg::<WQ5_0>);
            deq_entry!(deq_q5_1, $features, $deqleg::<WQ5_1>);
            deq_entry!(deq_q8_0, $features, $deqleg::<WQ8_0>);
            deq_entry!(deq_q2_k, $features, |s, d, k| deq_blocks(
                s,
                d,
                k,
                rb::dequant_q2_k
            ));
            deq_entry!(deq_q3_k, $features, |s, d, k| deq_blocks(
                s,
                d,
                k,
                rb::dequant_q3_k
            ));
            deq_entry!(deq_q4_k, $features, |s, d, k| deq_blocks(
                s,
                d,
                k,
                rb::dequant_q4_k
            ));
            deq_entry!(deq_q5_k, $features, |s, d, k| deq_blocks(
                s,
                d,
                k,
                rb::dequant_q5_k
            ));
            deq_entry!(deq_q6_k, $features, |s, d, k| deq_blocks(
                s,
                d,
                k,
                rb::dequant_q6_k
            ));
            deq_entry!(deq_iq4_nl, $features, $deqleg::<WIQ4NL>);
            deq_entry!(deq_iq4_xs, $features, $deqiq4xs);
            entry!(f32, $features, float_rows::<$V, WF32>);
            entry!(f16, $features, float_rows::<$V, WF16>);
            entry!(bf16, $features, float_rows::<$V, WBF16>);
            entry!(f16_x8, $features, float_rows8::<WF16>);
            entry!(bf16_x8, $features, float_rows8::<WBF16>);
            deq_group_entry!(deq8_f16, $features, deq_rows8::<WF16>);
            deq_group_entry!(deq8_bf16, $features, deq_rows8::<WBF16>);
            entry!(exact_q4_0, $features, $leg::<WQ4_0>);
            entry!(exact_q4_1, $features, $leg::<WQ4_1>);
            entry!(exact_q5_0, $features, $leg::<WQ5_0>);
            entry!(exact_q5_1, $features, $leg::<WQ5_1>);
            entry!(exact_q8_0, $features, $leg::<WQ8_0>);
            entry!(exact_q2_k, $features, |a| exact_rows::<$V, 84, 256>(
                a,
                rb::dequant_q2_k
            ));
            entry!(exact_q3_k, $features, |a| exact_rows::<$V, 110, 256>(
                a,
                rb::dequant_q3_k
            ));
            entry!(exact_q4_k, $features, $q4k);
            entry!(exact_q5_k, $features, $q5k);
            entry!(exact_q6_k, $features, $q6k);
            entry!(exact_iq4_nl, $features, $leg::<WIQ4NL>);
            entry!(exact_iq4_xs, $features, $iq4xs);
            fast_entries!($features, $D);
            grid_entries!($features, $V);
        }
    };
}

/// The codebook i-quants' and ternary formats' exact kernels and row dequantizers of one
/// level: their sub-blocks decoded as the 8-bit kernels decode them, scaled bit-exactly.
macro_rules! grid_entries {
    ($features:literal, $V:ty) => {
        grid_entries!($features, $V, [
            (exact_iq2_xxs, deq_iq2_xxs, WIQ2XXS),
            (exact_iq2_xs, deq_iq2_xs, WIQ2XS),
            (exact_iq2_s, deq_iq2_s, WIQ2S),
            (exact_iq3_xxs, deq_iq3_xxs, WIQ3XXS),
            (exact_iq3_s, deq_iq3_s, WIQ3S),
            (exact_iq1_s, deq_iq1_s, WIQ1S),
            (exact_iq1_m, deq_iq1_m, WIQ1M),
            (exact_tq1_0, deq_tq1_0, WTQ1_0),
            (exact_tq2_0, deq_tq2_0, WTQ2_0)
        ]);
    };
    ($features:literal, $V:ty, [$(($exact:ident, $deq:ident, $W:ty)),*]) => {
        $(
            entry!($exact, $features, exact_legacy_rows::<$V, $W>);
            deq_entry!($deq, $features, deq_legacy8::<$W>);
        )*
    };
}

/// The 8-bit matrix-vector kernels (fast mode) of one level, over the dot product `$D`.
macro_rules! fast_entries {
    ($features:literal, $D:ty) => {
        entry!(q4_0_x8, $features, packed_rows::<$D, WQ4_0U>);
        entry!(q4_1_x8, $features, packed_rows::<$D, WQ4_1>);
        entry!(q5_0_x8, $features, packed_rows::<$D, WQ5_0U>);
        entry!(q5_1_x8, $features, packed_rows::<$D, WQ5_1>);
        entry!(q4_k_x8, $features, q4k_x8::<$D>);
        entry!(q5_k, $features, q45k_rows::<$D, true>);
        entry!(q6_k, $features, q6k_rows::<$D>);
        sb_entries!(
            $features,
            $D,
            [
                (q2_k, q2_k_dec, q2_k_decode, WQ2K),
                (q3_k, q3_k_dec, q3_k_decode, WQ3K),
                (iq4_xs, iq4_xs_dec, iq4_xs_decode, WIQ4XS),
                (iq2_xxs, iq2_xxs_dec, iq2_xxs_decode, WIQ2XXS),
                (iq2_xs, iq2_xs_dec, iq2_xs_decode, WIQ2XS),
                (iq2_s, iq2_s_dec, iq2_s_decode, WIQ2S),
                (iq3_xxs, iq3_xxs_dec, iq3_xxs_decode, WIQ3XXS),
                (iq3_s, iq3_s_dec, iq3_s_decode, WIQ3S),
                (iq1_s, iq1_s_dec, iq1_s_decode, WIQ1S),
                (iq1_m, iq1_m_dec, iq1_m_decode, WIQ1M),
                (tq1_0, tq1_0_dec, tq1_0_decode, WTQ1_0),
                (tq2_0, tq2_0_dec, tq2_0_decode, WTQ2_0)
            ]
        );
        predecoded!($features, $D, [(iq4_nl_dec, iq4_nl_decode, WIQ4NL)]);
        sb_decoded!(
            $features,
            $D,
            [
                (q5_k_dec, q5_k_decode, WQ5KS),
                (q6_k_dec, q6_k_decode, WQ6KS)
            ]
        );
    };
}

/// The super-block i-quants' and ternary formats' 8-bit kernels of one level ([`iqsuper`]:
/// Q8_K activations), row by row on the stored rows and on a tile's rows decoded once.
/// The many-row form alone, for formats whose own matrix-vector kernel keeps [`iqsuper`]'s
/// chain (Q5_K, Q6_K).
macro_rules! sb_decoded {
    ($features:literal, $D:ty, [$(($mat:ident, $dec:ident, $W:ty)),*]) => {
        $(
            entry!($mat, $features, sb_rows::<$D, WSbDecoded<$W>>);
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn $dec(w: *const u8, w_stride: usize, rows: usize, k: usize,
                                      dst: *mut u8) {
                decode_rows_sb::<$W>(w, w_stride, rows, k, dst)
            }
        )*
    };
}

macro_rules! sb_entries {
    ($features:literal, $D:ty, [$(($name:ident, $mat:ident, $dec:ident, $W:ty)),*]) => {
        $(
            entry!($name, $features, sb_rows::<$D, $W>);
            entry!($mat, $features, sb_rows::<$D, WSbDecoded<$W>>);
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn $dec(w: *const u8, w_stride: usize, rows: usize, k: usize,
                                      dst: *mut u8) {
                decode_rows_sb::<$W>(w, w_stride, rows, k, dst)
            }
        )*
    };
}

/// The i-quants' many-row 8-bit path of one level: a tile's rows decoded once
/// ([`decode_rows`]), then the 8-bit kernel over the decoded blocks ([`WDecoded`]).
macro_rules! predecoded {
    ($features:literal, $D:ty, [$(($mat:ident, $dec:ident, $W:ty)),*]) => {
        $(
            entry!($mat, $features, legacy_rows::<$D, WDecoded<$W>>);
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn $dec(w: *const u8, w_stride: usize, rows: usize, k: usize,
                                      dst: *mut u8) {
                decode_rows::<$W>(w, w_stride, rows, k, dst)
            }
        )*
    };
}

level!(
    avx2,
    "avx2,fma,f16c",
    V8,
    Maddubs,
    exact_legacy8,
    exact_q4k_v8,
    exact_k_rows::<V8, XQ5K>,
    exact_k_rows::<V8, XQ6K>,
    6,
    deq_legacy8,
    exact_k_rows::<V8, XIQ4XS>,
    deq_iq4xs_v8
);
level!(
    avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    V16,
    Vnni,
    exact_leg512,
    exact_q4k_lut,
    exact_q5k_lut,
    exact_q6k_512,
    12,
    deq_leg512,
    exact_iq4xs_512,
    deq_iq4xs_512
);

/// The AVX-VNNI level (AVX2 + VEX `vpdpbusd`, no AVX-512): the AVX2 level's float and exact
/// kernels, its own 8-bit ones.
pub(crate) mod avxvnni {
    use super::*;
    fast_entries!("avx2,fma,f16c,avxvnni", VnniVex);
}

/// The Q8_0 8-bit matrix-vector kernels per level, rows packed by 8: `vpdpbusd` takes the
/// whole-byte codes as `q + 128` (AVX-VNNI, AVX-512); AVX2's `vpmaddubsw` would saturate on
/// those, so it takes `|q|` against the activations with `q`'s signs (`vpsignb`).
pub(crate) mod q8_0 {
    use super::*;
    entry!(avx2, "avx2,fma,f16c", packed_rows::<Maddubs, WQ8_0>);
    entry!(
        avxvnni,
        "avx2,fma,f16c,avxvnni",
        packed_rows::<VnniVex, WQ8_0U>
    );
    entry!(
        avx512,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        packed_rows::<Vnni, WQ8_0U>
    );
}

/// The IQ4_NL 8-bit matrix-vector kernels per level: rows packed by 8 on the `vpdpbusd`
/// levels (unsigned codes `kv + 128`, [`WIQ4NLU`]), row by row on AVX2 (`|kv|` against
/// `sign(x, kv)`, which `vpmaddubsw` takes without saturating).
pub(crate) mod iq4_nl {
    use super::*;
    entry!(avx2, "avx2,fma,f16c", legacy_rows::<Maddubs, WIQ4NL>);
    entry!(
        avxvnni,
        "avx2,fma,f16c,avxvnni",
        packed_rows::<VnniVex, WIQ4NLU>
    );
    entry!(
        avx512,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        packed_rows::<Vnni, WIQ4NLU>
    );
}

/// The AVX2 level's factored exact matrix-vector kernels (f32 activations; the ones with an
/// offset take [`super::Act::F32Sums`] rows).
pub(crate) mod fac {
    use super::*;
    entry!(q4_0, "avx2,fma,f16c", fac_legacy::<WQ4_0>);
    entry!(q4_1, "avx2,fma,f16c", fac_legacy::<WQ4_1>);
    entry!(q5_0, "avx2,fma,f16c", fac_legacy::<WQ5_0>);
    entry!(q5_1, "avx2,fma,f16c", fac_legacy::<WQ5_1>);
    entry!(q8_0, "avx2,fma,f16c", fac_legacy::<WQ8_0>);
    entry!(q4_k, "avx2,fma,f16c", fac_k45::<false>);
    entry!(q5_k, "avx2,fma,f16c", fac_k45::<true>);
    entry!(q6_k, "avx2,fma,f16c", fac_q6k);
    entry!(iq4_nl, "avx2,fma,f16c", fac_legacy::<WIQ4NL>);
    entry!(iq4_xs, "avx2,fma,f16c", fac_iq4xs);
}
