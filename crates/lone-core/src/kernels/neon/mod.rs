//! aarch64 kernels, three levels: NEON (the ARMv8.0 baseline: Raspberry Pi 4, every 64-bit
//! ARM core), NEON + dotprod (`sdot`, ARMv8.2+: Raspberry Pi 5, Apple M1 and later,
//! Snapdragon, Graviton 2+) and + i8mm (`smmla`, ARMv8.6: Apple M2 and later, Graviton 3/4),
//! which differs from dotprod in its kernels for several activation rows only.
//!
//! Every format has
//! - an **exact** matrix-vector kernel (f32 activations): float formats widened in registers
//!   (`fcvtl` for F16, a shift for BF16), the 32-element formats decoded to bytes in NEON and
//!   scaled exactly as the reference dequantizer does (`q·d`, or `q·d + m` as a separate
//!   multiply and add), the K-quants likewise per group of 16 (`dl·q - ml`), the codebook
//!   i-quants and ternary formats too (`iqgrid`: grid rows and sign masks looked up into
//!   signed codes); all FMA'd with up to 4 activation rows per weight load (`exact`, `float`);
//! - for the formats llama.cpp pairs with 8-bit activations (here Q2_K and Q3_K too), and the
//!   i-quants and ternary formats (against Q8_1 as on x86: IQ4_NL, IQ4_XS in `int8`, the
//!   codebook ones and ternary in `iqgrid`), an **8-bit** matrix-vector kernel
//!   (`int8`, `iqgrid`): integer dot products of the weight codes with Q8_1 / Q8_K activation
//!   blocks, one generic body over [`Dot`]: `smull`+`sadalp` at the NEON level, `sdot` with
//!   dotprod;
//!   at the dotprod level the formats with a rows-by-8 layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//!   Q2_K, Q3_K, Q6_K) take it (`rows8`: `sdot` by element over 4 interleaved rows);
//! - for several activation rows of the 32-element formats, kernels over activations
//!   interleaved in pairs of rows (`pairs`): `sdot` by element (dotprod: Q4_0, Q5_0, Q5_1)
//!   or `smmla` (i8mm: all five), each weight block decoded once for up to 16 rows.
//!
//! The bodies are `#[inline(always)]` generics instantiated in the entry points below (the
//! dotprod ones inside `#[target_feature(enable = "dotprod")]`). `sdot` is emitted with
//! `asm!` (its intrinsic is not yet stable Rust), as is `fcvtl` (its f16 vector type is not).
//!
//! All functions here are `unsafe`: they read through the raw pointers of a [`MatArgs`], whose
//! validity the caller (`kernels::matmul_with`) establishes, and the dotprod ones must only
//! run on a CPU that has it (the dispatcher checks with `is_aarch64_feature_detected!`).

#![allow(clippy::needless_range_loop)]

use core::arch::aarch64::*;
use core::arch::asm;

use super::{DeqFn, MatArgs, MatFn};
use crate::tensor::DType;

/// `f::<G…, C…, NX>(a)` with the call's activation-row count `a.nx` (1..=4) as the last
/// const `NX`; constants after a `;` come before it.
macro_rules! by_nx {
    ($a:expr, $f:ident $(, $g:ty)* $(; $c:expr)*) => {
        match $a.nx {
            1 => $f::<$($g,)* $({ $c },)* 1>($a),
            2 => $f::<$($g,)* $({ $c },)* 2>($a),
            3 => $f::<$($g,)* $({ $c },)* 3>($a),
            _ => $f::<$($g,)* $({ $c },)* 4>($a),
        }
    };
}

/// `$body` for `$t` = 0, 1, … while `$t < $n` (at most 8; `$n` a constant): unrolled, so
/// that arrays indexed by `$t` stay in registers (LLVM keeps a loop of long bodies rolled).
macro_rules! unroll8 {
    ($t:ident < $n:expr, $body:block) => {
        unroll8!(@ $t < $n, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $t:ident < $n:expr, $body:block, $($i:literal)*) => {
        $(
            if $i < $n {
                let $t: usize = $i;
                $body
            }
        )*
    };
}

mod exact;
mod float;
mod gemm;
mod int8;
mod iqgrid;
pub(in crate::kernels) mod pairs;
mod rows8;
pub(in crate::kernels) mod vec;

use exact::*;
use float::*;
use gemm::{deq_float, deq_k, deq_legacy};
pub(in crate::kernels) use gemm::{gemm, gemm_narrow, TB};
use int8::*;
use iqgrid::*;
use pairs::{legacy_pairs, PairMmla, PairSdot};
use rows8::*;

/// One format's aarch64 kernels (its entry in `table::FORMATS`).
pub(in crate::kernels) struct ArmKernels {
    /// The exact matrix-vector kernel (f32 activations), both levels.
    pub(in crate::kernels) exact: MatFn,
    /// The bit-exact row dequantizer of the f32 GEMM (exact prompt rows); None: F32 rows are
    /// used in place.
    pub(in crate::kernels) deq: Option<DeqFn>,
    /// The 8-bit matrix-vector kernels, [NEON, NEON + dotprod], each with whether it reads
    /// the rows-by-8 layout ([`crate::kernels::packed`]), and the activation format they take:
    /// llama.cpp's pairing (Q8_1 for the 32-element formats, Q8_K for the K-quants, Q2_K and
    /// Q3_K included, which have no 8-bit kernels on x86), Q8_1 for the i-quants and ternary
    /// formats (x86's pairing: llama.cpp takes Q8_0 for IQ4_NL, Q8_K for the others).
    pub(in crate::kernels) fast: Option<([(MatFn, bool); 2], DType)>,
    /// The 8-bit kernels for several activation rows in the pair layout ([`pairs`]), over
    /// the rows-by-8 layout: [NEON + dotprod, + i8mm]. At the dotprod level only where
    /// decoding the codes costs more than loading the activations twice as often (Q4_0,
    /// Q5_0, Q5_1: not Q4_1 and Q8_0, measured).
    pub(in crate::kernels) pairs: [Option<MatFn>; 2],
}

/// IEEE half bits → f32 (`fcvt`, part of the ARMv8.0 floating point baseline).
#[inline(always)]
pub(in crate::kernels) unsafe fn f16_to_f32(h: u16) -> f32 {
    let r: f32;
    // SAFETY: register-only conversion; `fmov` puts the bits in the low half of the vector
    // register, `fcvt` reads them as a half.
    unsafe {
        asm!(
            "fmov {t:s}, {h:w}",
            "fcvt {r:s}, {t:h}",
            h = in(reg) u32::from(h),
            t = out(vreg) _,
            r = out(vreg) r,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    r
}

/// f32 → IEEE half bits, rounded to nearest even (`fcvt`).
#[inline(always)]
pub(in crate::kernels) unsafe fn f32_to_f16(x: f32) -> u16 {
    let h: u32;
    // SAFETY: register-only conversion; `fcvt` writes the half to the low 16 bits of the
    // vector register (the rest zero), `fmov` moves them out.
    unsafe {
        asm!(
            "fcvt {t:h}, {x:s}",
            "fmov {h:w}, {t:s}",
            x = in(vreg) x,
            t = out(vreg) _,
            h = out(reg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    h as u16
}

/// The little-endian f16 at `p` (unaligned) as f32.
#[inline(always)]
pub(in crate::kernels) unsafe fn f16_at(p: *const u8) -> f32 {
    f16_to_f32((p as *const u16).read_unaligned())
}

/// Four IEEE halves → four f32 (`fcvtl`).
#[inline(always)]
pub(in crate::kernels) unsafe fn cvt_f16x4(h: uint16x4_t) -> float32x4_t {
    let r: float32x4_t;
    // SAFETY: register-only conversion.
    unsafe {
        asm!(
            "fcvtl {r:v}.4s, {h:v}.4h",
            h = in(vreg) h,
            r = out(vreg) r,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    r
}

// ------------------------------------------------------------------ entry points

macro_rules! entry {
    ($name:ident, $body:expr) => {
        pub(in crate::kernels) unsafe fn $name(a: &MatArgs) {
            $body(a)
        }
    };
    ($name:ident, $features:literal, $body:expr) => {
        #[target_feature(enable = $features)]
        pub(in crate::kernels) unsafe fn $name(a: &MatArgs) {
            $body(a)
        }
    };
}

/// The exact kernels (both levels: NEON is the aarch64 baseline).
pub(in crate::kernels) mod ex {
    use super::*;
    entry!(f32, float_rows::<WF32>);
    entry!(f16, float_rows::<WF16>);
    entry!(bf16, float_rows::<WBF16>);
    entry!(q4_0, legacy_exact::<WQ4_0>);
    entry!(q4_1, legacy_exact::<WQ4_1>);
    entry!(q5_0, legacy_exact::<WQ5_0>);
    entry!(q5_1, legacy_exact::<WQ5_1>);
    entry!(q8_0, legacy_exact::<WQ8_0>);
    entry!(q2_k, k_exact::<KQ2>);
    entry!(q3_k, k_exact::<KQ3>);
    entry!(q4_k, k_exact::<KQ4>);
    entry!(q5_k, k_exact::<KQ5>);
    entry!(q6_k, k_exact::<KQ6>);
    entry!(iq4_nl, legacy_exact::<WIQ4NL>);
    entry!(iq4_xs, k_exact::<KIQ4XS>);
    entry!(iq2_xxs, k_exact::<KIQ2XXS>);
    entry!(iq2_xs, k_exact::<KIQ2XS>);
    entry!(iq2_s, k_exact::<KIQ2S>);
    entry!(iq3_xxs, k_exact::<KIQ3XXS>);
    entry!(iq3_s, k_exact::<KIQ3S>);
    entry!(iq1_s, k_exact::<KIQ1S>);
    entry!(iq1_m, k_exact::<KIQ1M>);
    entry!(tq1_0, k_exact::<KTQ1_0>);
    entry!(tq2_0, k_exact::<KTQ2_0>);
}

/// The row dequantizers of the f32 GEMM (both levels).
pub(in crate::kernels) mod deq {
    use super::*;
    macro_rules! deq {
        ($name:ident, $body:expr) => {
            pub(in crate::kernels) unsafe fn $name(src: *const u8, dst: *mut f32, k: usize) {
                $body(src, dst, k)
            }
        };
    }
    deq!(f16, deq_float::<WF16>);
    deq!(bf16, deq_float::<WBF16>);
    deq!(q4_0, deq_legacy::<WQ4_0>);
    deq!(q4_1, deq_legacy::<WQ4_1>);
    deq!(q5_0, deq_legacy::<WQ5_0>);
    deq!(q5_1, deq_legacy::<WQ5_1>);
    deq!(q8_0, deq_legacy::<WQ8_0>);
    deq!(q2_k, deq_k::<KQ2>);
    deq!(q3_k, deq_k::<KQ3>);
    deq!(q4_k, deq_k::<KQ4>);
    deq!(q5_k, deq_k::<KQ5>);
    deq!(q6_k, deq_k::<KQ6>);
    deq!(iq4_nl, deq_legacy::<WIQ4NL>);
    deq!(iq4_xs, deq_k::<KIQ4XS>);
    deq!(iq2_xxs, deq_k::<KIQ2XXS>);
    deq!(iq2_xs, deq_k::<KIQ2XS>);
    deq!(iq2_s, deq_k::<KIQ2S>);
    deq!(iq3_xxs, deq_k::<KIQ3XXS>);
    deq!(iq3_s, deq_k::<KIQ3S>);
    deq!(iq1_s, deq_k::<KIQ1S>);
    deq!(iq1_m, deq_k::<KIQ1M>);
    deq!(tq1_0, deq_k::<KTQ1_0>);
    deq!(tq2_0, deq_k::<KTQ2_0>);
}

/// The 8-bit kernels of the NEON level (`smull`), every format with an 8-bit activation
/// format.
pub(in crate::kernels) mod base {
    use super::*;
    entry!(q4_0, legacy_8bit::<Smull, WQ4_0>);
    entry!(q4_1, legacy_8bit::<Smull, WQ4_1>);
    entry!(q5_0, legacy_8bit::<Smull, WQ5_0>);
    entry!(q5_1, legacy_8bit::<Smull, WQ5_1>);
    entry!(q8_0, legacy_8bit::<Smull, WQ8_0>);
    entry!(q2_k, q23k_8bit::<Smull, false>);
    entry!(q3_k, q23k_8bit::<Smull, true>);
    entry!(q4_k, q45k_8bit::<Smull, false>);
    entry!(q5_k, q45k_8bit::<Smull, true>);
    entry!(q6_k, q6k_8bit::<Smull>);
    entry!(iq4_nl, legacy_8bit::<Smull, WIQ4NL>);
    entry!(iq4_xs, iq4xs_8bit::<Smull>);
    entry!(iq2_xxs, grid_8bit::<Smull, KIQ2XXS>);
    entry!(iq2_xs, grid_8bit::<Smull, KIQ2XS>);
    entry!(iq2_s, grid_8bit::<Smull, KIQ2S>);
    entry!(iq3_xxs, grid_8bit::<Smull, KIQ3XXS>);
    entry!(iq3_s, grid_8bit::<Smull, KIQ3S>);
    entry!(iq1_s, grid_8bit::<Smull, KIQ1S>);
    entry!(iq1_m, grid_8bit::<Smull, KIQ1M>);
    entry!(tq1_0, grid_8bit::<Smull, KTQ1_0>);
    entry!(tq2_0, grid_8bit::<Smull, KTQ2_0>);
}

/// The 8-bit kernels of the dotprod level (`sdot`): over the rows-by-8 layout (`rows8`)
/// where the format has one, row by row for the others.
pub(in crate::kernels) mod dot {
    use super::*;
    entry!(q4_0, "dotprod", legacy_rows8::<WQ4_0>);
    entry!(q4_1, "dotprod", legacy_rows8::<WQ4_1>);
    entry!(q5_0, "dotprod", legacy_rows8::<WQ5_0>);
    entry!(q5_1, "dotprod", legacy_rows8::<WQ5_1>);
    entry!(q8_0, "dotprod", legacy_rows8::<WQ8_0>);
    entry!(q2_k, "dotprod", k_rows8::<KR2>);
    entry!(q3_k, "dotprod", k_rows8::<KR3>);
    entry!(q4_k, "dotprod", q45k_8bit::<Sdot, false>);
    entry!(q5_k, "dotprod", q45k_8bit::<Sdot, true>);
    entry!(q6_k, "dotprod", k_rows8::<KR6>);
    entry!(iq4_nl, "dotprod", legacy_8bit::<Sdot, WIQ4NL>);
    entry!(iq4_xs, "dotprod", iq4xs_8bit::<Sdot>);
    entry!(iq2_xxs, "dotprod", grid_8bit::<Sdot, KIQ2XXS>);
    entry!(iq2_xs, "dotprod", grid_8bit::<Sdot, KIQ2XS>);
    entry!(iq2_s, "dotprod", grid_8bit::<Sdot, KIQ2S>);
    entry!(iq3_xxs, "dotprod", grid_8bit::<Sdot, KIQ3XXS>);
    entry!(iq3_s, "dotprod", grid_8bit::<Sdot, KIQ3S>);
    entry!(iq1_s, "dotprod", grid_8bit::<Sdot, KIQ1S>);
    entry!(iq1_m, "dotprod", grid_8bit::<Sdot, KIQ1M>);
    entry!(tq1_0, "dotprod", grid_8bit::<Sdot, KTQ1_0>);
    entry!(tq2_0, "dotprod", grid_8bit::<Sdot, KTQ2_0>);
}

/// The pair-layout kernels ([`pairs`]) of the dotprod level (`sdot` by element).
pub(in crate::kernels) mod pair_dot {
    use super::*;
    entry!(q4_0, "dotprod", legacy_pairs::<PairSdot, WQ4_0>);
    entry!(q5_0, "dotprod", legacy_pairs::<PairSdot, WQ5_0>);
    entry!(q5_1, "dotprod", legacy_pairs::<PairSdot, WQ5_1>);
}

/// The pair-layout kernels ([`pairs`]) of the i8mm level (`smmla`).
pub(in crate::kernels) mod pair_mmla {
    use super::*;
    entry!(q4_0, "i8mm", legacy_pairs::<PairMmla, WQ4_0>);
    entry!(q4_1, "i8mm", legacy_pairs::<PairMmla, WQ4_1>);
    entry!(q5_0, "i8mm", legacy_pairs::<PairMmla, WQ5_0>);
    entry!(q5_1, "i8mm", legacy_pairs::<PairMmla, WQ5_1>);
    entry!(q8_0, "i8mm", legacy_pairs::<PairMmla, WQ8_0>);
}
