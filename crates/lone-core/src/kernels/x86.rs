//! x86-64 kernels: AVX2+FMA+F16C, and AVX-512 (F/BW/VL + VNNI).
//!
//! Every kernel body is written once, generic over
//! - an f32 vector width ([`V8`] = `__m256`, [`V16`] = `__m512`) for the float / exact paths, and
//! - an 8-bit dot product ([`Maddubs`] = AVX2 `vpmaddubsw`+`vpmaddwd`, [`Vnni`] = AVX-512 VNNI
//!   `vpdpbusd`/`vpdpwssd` on 256-bit registers) for the integer path,
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

use super::{GemmArgs, MatArgs};
use crate::quant::reference_blocks as rb;

/// `f::<G…, NX>(a)` with the call's activation-row count `a.nx` (1..=4) as the const `NX`.
macro_rules! by_nx {
    ($a:expr, $f:ident $(, $g:ty)*) => {
        match $a.nx {
            1 => $f::<$($g,)* 1>($a),
            2 => $f::<$($g,)* 2>($a),
            3 => $f::<$($g,)* 3>($a),
            _ => $f::<$($g,)* 4>($a),
        }
    };
}

// ------------------------------------------------------------------ f32 vectors

pub(super) trait F32V: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn load_f16(p: *const u8) -> Self;
    unsafe fn load_bf16(p: *const u8) -> Self;
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn sub(a: Self, b: Self) -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// `LANES` signed bytes at `p`, converted to f32.
    unsafe fn from_i8(p: *const i8) -> Self;
    unsafe fn hsum(self) -> f32;
    unsafe fn store(self, p: *mut f32);
    /// Loads `LANES` rows of `LANES` f32 (`stride` apart; rows from `valid` on repeat the
    /// last valid one) and stores them transposed: `dst[c·LANES + r]` = row `r`, column `c`.
    unsafe fn transpose_block(src: *const f32, stride: usize, valid: usize, dst: *mut f32);
}

#[derive(Clone, Copy)]
pub(super) struct V8(__m256);
#[derive(Clone, Copy)]
pub(super) struct V16(__m512);

impl F32V for V8 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        V8(_mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        V8(_mm256_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> Self {
        V8(_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> Self {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        V8(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)))
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        V8(_mm256_fmadd_ps(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        V8(_mm256_add_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        V8(_mm256_mul_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        V8(_mm256_sub_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        V8(_mm256_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn from_i8(p: *const i8) -> Self {
        V8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
            p as *const __m128i,
        ))))
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        hsum256(self.0)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn transpose_block(src: *const f32, stride: usize, valid: usize, dst: *mut f32) {
        let r: [__m256; 8] =
            core::array::from_fn(|j| _mm256_loadu_ps(src.add(j.min(valid - 1) * stride)));
        let t: [__m256; 8] = core::array::from_fn(|j| {
            let (a, b) = (r[2 * (j / 2)], r[2 * (j / 2) + 1]);
            if j % 2 == 0 {
                _mm256_unpacklo_ps(a, b)
            } else {
                _mm256_unpackhi_ps(a, b)
            }
        });
        // tt[4h + 2p + q]: rows 4h..4h+4; q picks the low / high pair of each lane.
        let tt: [__m256; 8] = core::array::from_fn(|j| {
            let (h, p, q) = (j / 4, (j / 2) % 2, j % 2);
            let (a, b) = (t[4 * h + p], t[4 * h + 2 + p]);
            if q == 0 {
                _mm256_shuffle_ps::<0x44>(a, b)
            } else {
                _mm256_shuffle_ps::<0xEE>(a, b)
            }
        });
        for c in 0..8 {
            // tt[j] holds columns j and j + 4 of rows 0..4 (its two halves), tt[4 + j] of
            // rows 4..8.
            let (a, b) = (tt[c % 4], tt[4 + c % 4]);
            let v = if c < 4 {
                _mm256_permute2f128_ps::<0x20>(a, b)
            } else {
                _mm256_permute2f128_ps::<0x31>(a, b)
            };
            _mm256_storeu_ps(dst.add(c * 8), v);
        }
    }
}

impl F32V for V16 {
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        V16(_mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        V16(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> Self {
        V16(_mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> Self {
        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
        V16(_mm512_castsi512_ps(_mm512_slli_epi32(h, 16)))
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        V16(_mm512_fmadd_ps(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        V16(_mm512_add_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        V16(_mm512_mul_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        V16(_mm512_sub_ps(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        V16(_mm512_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn from_i8(p: *const i8) -> Self {
        V16(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            p as *const __m128i,
        ))))
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        let lo = _mm512_castps512_ps256(self.0);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(self.0), 1));
        hsum256(_mm256_add_ps(lo, hi))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn transpose_block(src: *const f32, stride: usize, valid: usize, dst: *mut f32) {
        let mut r: [__m512; 16] =
            core::array::from_fn(|j| _mm512_loadu_ps(src.add(j.min(valid - 1) * stride)));
        transpose16(&mut r);
        for (c, v) in r.iter().enumerate() {
            _mm512_storeu_ps(dst.add(c * 16), *v);
        }
    }
}

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// IEEE half at `p` (unaligned) → f32, with F16C.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    f32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

// ------------------------------------------------------------------ float weights

/// How a plain float weight format loads `V::LANES` elements.
pub(super) trait FloatW {
    const EB: usize;
    unsafe fn load<V: F32V>(p: *const u8) -> V;
    unsafe fn scalar(p: *const u8) -> f32;
}
pub(super) struct WF32;
pub(super) struct WF16;
pub(super) struct WBF16;
impl FloatW for WF32 {
    const EB: usize = 4;
    #[inline(always)]
    unsafe fn load<V: F32V>(p: *const u8) -> V {
        V::load(p as *const f32)
    }
    #[inline(always)]
    unsafe fn scalar(p: *const u8) -> f32 {
        f32_at(p)
    }
}
impl FloatW for WF16 {
    const EB: usize = 2;
    #[inline(always)]
    unsafe fn load<V: F32V>(p: *const u8) -> V {
        V::load_f16(p)
    }
    #[inline(always)]
    unsafe fn scalar(p: *const u8) -> f32 {
        f16_at(p)
    }
}
impl FloatW for WBF16 {
    const EB: usize = 2;
    #[inline(always)]
    unsafe fn load<V: F32V>(p: *const u8) -> V {
        V::load_bf16(p)
    }
    #[inline(always)]
    unsafe fn scalar(p: *const u8) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([*p, *p.add(1)])) << 16)
    }
}

#[inline(always)]
unsafe fn float_rows_n<V: F32V, W: FloatW, const NX: usize>(a: &MatArgs) {
    let l = V::LANES;
    let k = a.k;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        let mut i = 0;
        while i + 4 * l <= k {
            for u in 0..4 {
                let wv: V = W::load(w.add((i + u * l) * W::EB));
                for t in 0..NX {
                    acc[t][u] = V::fma(wv, V::load(xs[t].add(i + u * l)), acc[t][u]);
                }
            }
            i += 4 * l;
        }
        while i + l <= k {
            let wv: V = W::load(w.add(i * W::EB));
            for t in 0..NX {
                acc[t][0] = V::fma(wv, V::load(xs[t].add(i)), acc[t][0]);
            }
            i += l;
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            let mut s = s.hsum();
            for j in i..k {
                s += W::scalar(w.add(j * W::EB)) * *xs[t].add(j);
            }
            *a.out.add(t * a.out_stride + r) = s;
        }
    }
}

#[inline(always)]
unsafe fn float_rows<V: F32V, W: FloatW>(a: &MatArgs) {
    by_nx!(a, float_rows_n, V, W)
}

// ------------------------------------------------------------------ exact quantized weights

#[repr(C, align(64))]
struct Aligned<const N: usize>([f32; N]);

/// Quantized weights against f32 activations: each block is dequantized bit-exactly (the
/// reference dequantizer, inlined and vectorised here) into a stack buffer, then FMA'd with
/// every activation row.
#[inline(always)]
unsafe fn exact_rows_n<V: F32V, const BB: usize, const BS: usize, const NX: usize>(
    a: &MatArgs,
    deq: impl Fn(&[u8; BB], &mut [f32; BS]),
) {
    let l = V::LANES;
    let nb = a.k / BS;
    let mut buf = Aligned::<BS>([0.0; BS]);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        for b in 0..nb {
            deq(&*(w.add(b * BB) as *const [u8; BB]), &mut buf.0);
            let mut u = 0;
            let mut i = 0;
            while i < BS {
                let wv = V::load(buf.0.as_ptr().add(i));
                for t in 0..NX {
                    acc[t][u] = V::fma(wv, V::load(xs[t].add(b * BS + i)), acc[t][u]);
                }
                u = (u + 1) & 3;
                i += l;
            }
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            *a.out.add(t * a.out_stride + r) = s.hsum();
        }
    }
}

#[inline(always)]
unsafe fn exact_rows<V: F32V, const BB: usize, const BS: usize>(
    a: &MatArgs,
    deq: impl Fn(&[u8; BB], &mut [f32; BS]) + Copy,
) {
    match a.nx {
        1 => exact_rows_n::<V, BB, BS, 1>(a, deq),
        2 => exact_rows_n::<V, BB, BS, 2>(a, deq),
        3 => exact_rows_n::<V, BB, BS, 3>(a, deq),
        _ => exact_rows_n::<V, BB, BS, 4>(a, deq),
    }
}

/// Exact mode for the 32-element formats, fully in SIMD: the block's quants are decoded to
/// bytes (as the integer kernels do), widened to f32 and scaled exactly as the reference
/// dequantizer does (`q·d`, or `q·d + m` as a separate multiply and add: bit-identical
/// weights), then FMA'd with every f32 activation row.
#[inline(always)]
unsafe fn exact_legacy_rows_n<V: F32V, W: LegacyW, const NX: usize>(a: &MatArgs) {
    let l = V::LANES;
    let nb = a.k / 32;
    let mut qb = [0i8; 32];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        for b in 0..nb {
            if b % 2 == 0 {
                _mm_prefetch::<_MM_HINT_T0>(w.add(b * W::BB + PREFETCH) as *const i8);
            }
            let (q, d, m) = W::decode(w.add(b * W::BB));
            _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, q);
            let (dv, mv) = (V::splat(d), V::splat(m));
            let mut j = 0;
            while j < 32 {
                let mut wv = V::mul(V::from_i8(qb.as_ptr().add(j)), dv);
                if !W::SIGNED {
                    wv = V::add(wv, mv);
                }
                let u = (j / l) & 3;
                for t in 0..NX {
                    acc[t][u] = V::fma(wv, V::load(xs[t].add(b * 32 + j)), acc[t][u]);
                }
                j += l;
            }
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            *a.out.add(t * a.out_stride + r) = s.hsum();
        }
    }
}

/// The AVX2 level's exact legacy kernels.
#[inline(always)]
unsafe fn exact_legacy8<W: LegacyW>(a: &MatArgs) {
    exact_legacy_rows::<V8, W>(a)
}

#[inline(always)]
unsafe fn exact_legacy_rows<V: F32V, W: LegacyW>(a: &MatArgs) {
    by_nx!(a, exact_legacy_rows_n, V, W)
}

// ------------------------------------------------------------------ exact K-quants

/// A 256-element K-quant super-block decoded for the exact kernels: its quants as bytes
/// (each fits an i8) and, per group of `GROUP` elements, the f32 scale `ds` (and min `ms`)
/// computed exactly as the reference dequantizer computes them, so that `q·ds - ms`
/// (`HAS_MIN`) or `q·ds` reproduces the reference weights bit for bit.
pub(super) trait KExactW {
    const BB: usize;
    const GROUP: usize;
    const HAS_MIN: bool;
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], ms: &mut [f32; 16]);
}
pub(super) struct XQ4K;
pub(super) struct XQ5K;
pub(super) struct XQ6K;

/// Q4_K/Q5_K sub-block scales and mins: `d·sc` and `dmin·m` (the reference's `d1`, `m1`),
/// into `ds[..8]` and `ms[..8]`. The 12 packed bytes are unpacked as ggml does (8 six-bit
/// scales, then 8 six-bit mins; the same values as `scale_min_k4`), then widened and scaled
/// in SIMD: one f32 multiply each, as in the reference.
#[inline(always)]
unsafe fn k4_scales(p: *const u8, ds: &mut [f32; 16], ms: &mut [f32; 16]) {
    let d = f16_at(p);
    let dmin = f16_at(p.add(2));
    let (sc, m) = k4_scale_bytes(p.add(4));
    let widen = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
    _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(d), widen(sc)));
    _mm256_storeu_ps(
        ms.as_mut_ptr(),
        _mm256_mul_ps(_mm256_set1_ps(dmin), widen(m)),
    );
}

/// Q4_K/Q5_K quants: 32-byte chunk `i` of `qs` holds sub-block 2i (low nibbles) and 2i+1
/// (high nibbles); Q5_K's bit 4 of element l of sub-block s is bit s of `qh[l]`.
#[inline(always)]
unsafe fn k45_quants<const FIVE: bool>(p: *const u8, q: &mut [i8; 256]) {
    let qs_off = if FIVE { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let qh = if FIVE {
        _mm256_loadu_si256(p.add(16) as *const __m256i)
    } else {
        _mm256_setzero_si256()
    };
    for i in 0..4 {
        let v = _mm256_loadu_si256(p.add(qs_off + 32 * i) as *const __m256i);
        let mut lo = _mm256_and_si256(v, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if FIVE {
            let s0 = _mm_cvtsi32_si128(2 * i as i32);
            let s1 = _mm_cvtsi32_si128(2 * i as i32 + 1);
            let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, s0), one);
            let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, s1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
        }
        _mm256_storeu_si256(q.as_mut_ptr().add(64 * i) as *mut __m256i, lo);
        _mm256_storeu_si256(q.as_mut_ptr().add(64 * i + 32) as *mut __m256i, hi);
    }
}

impl KExactW for XQ4K {
    const BB: usize = 144;
    const GROUP: usize = 32;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], ms: &mut [f32; 16]) {
        k4_scales(p, ds, ms);
        k45_quants::<false>(p, q);
    }
}
impl KExactW for XQ5K {
    const BB: usize = 176;
    const GROUP: usize = 32;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], ms: &mut [f32; 16]) {
        k4_scales(p, ds, ms);
        k45_quants::<true>(p, q);
    }
}
impl KExactW for XQ6K {
    const BB: usize = 210;
    const GROUP: usize = 16;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], _ms: &mut [f32; 16]) {
        // The reference: d * sc * q, left to right, so (d·sc) first.
        let d = _mm256_set1_ps(f16_at(p.add(208)));
        let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)));
        _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(d, lo));
        _mm256_storeu_ps(ds.as_mut_ptr().add(8), _mm256_mul_ps(d, hi));
        let m4 = _mm256_set1_epi8(0x0f);
        let m3 = _mm256_set1_epi8(3);
        let off = _mm256_set1_epi8(32);
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            let v = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4),
                ),
            ];
            for (rq, &qv) in v.iter().enumerate() {
                _mm256_storeu_si256(
                    q.as_mut_ptr().add(128 * h + 32 * rq) as *mut __m256i,
                    _mm256_sub_epi8(qv, off),
                );
            }
        }
    }
}

/// Exact mode for Q4_K, Q5_K and Q6_K in SIMD: each super-block's scales are decoded once,
/// its quants unpacked to bytes, widened to f32 and scaled as the reference does (a multiply,
/// then for Q4_K/Q5_K a separate subtract: bit-identical weights), then FMA'd with every f32
/// activation row.
#[inline(always)]
unsafe fn exact_k_rows_n<V: F32V, W: KExactW, const NX: usize>(a: &MatArgs) {
    let l = V::LANES;
    let nb = a.k / 256;
    let mut qb = [0i8; 256];
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        for b in 0..nb {
            for l in 0..W::BB.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(w.add(b * W::BB + PREFETCH + 64 * l) as *const i8);
            }
            W::decode(w.add(b * W::BB), &mut qb, &mut ds, &mut ms);
            for g in 0..256 / W::GROUP {
                let dv = V::splat(ds[g]);
                let mv = V::splat(ms[g]);
                let mut j = g * W::GROUP;
                while j < (g + 1) * W::GROUP {
                    let mut wv = V::mul(V::from_i8(qb.as_ptr().add(j)), dv);
                    if W::HAS_MIN {
                        wv = V::sub(wv, mv);
                    }
                    let u = (j / l) & 3;
                    for t in 0..NX {
                        acc[t][u] = V::fma(wv, V::load(xs[t].add(b * 256 + j)), acc[t][u]);
                    }
                    j += l;
                }
            }
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            *a.out.add(t * a.out_stride + r) = s.hsum();
        }
    }
}

#[inline(always)]
unsafe fn exact_k_rows<V: F32V, W: KExactW>(a: &MatArgs) {
    by_nx!(a, exact_k_rows_n, V, W)
}

/// How far ahead (bytes) the exact kernels prefetch the weight stream (LFM2-350M decode on the
/// dev machine: 4 KiB beat 1, 2 and 8 KiB by 2–5 %).
const PREFETCH: usize = 4096;

/// AVX-512 exact Q4_K, as [`exact_k45_lut_n`] but straight from the packed bytes: `vpermps`
/// reads only the low 4 bits of each index, so the zero-extended `qs` bytes index the low
/// nibbles as they are, and shifted right by 4 the high nibbles.
#[inline(always)]
unsafe fn exact_q4k_lut_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    let iota = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let wb = w.add(b * 144);
            _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + 64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + 128) as *const i8);
            k4_scales(wb, &mut ds, &mut ms);
            for i in 0..4 {
                let raw: [__m512i; 2] = core::array::from_fn(|h| {
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        wb.add(16 + 32 * i + 16 * h) as *const __m128i
                    ))
                });
                for hi in 0..2 {
                    let s = 2 * i + hi;
                    let table = _mm512_sub_ps(
                        _mm512_mul_ps(iota, _mm512_set1_ps(ds[s])),
                        _mm512_set1_ps(ms[s]),
                    );
                    for h in 0..2 {
                        let idx = if hi == 1 {
                            _mm512_srli_epi32(raw[h], 4)
                        } else {
                            raw[h]
                        };
                        let wv = _mm512_permutexvar_ps(idx, table);
                        let j = 32 * s + 16 * h;
                        let u = 2 * hi + h;
                        for t in 0..NX {
                            acc[t][u] = _mm512_fmadd_ps(
                                wv,
                                _mm512_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][u],
                            );
                        }
                    }
                }
            }
        }
        for t in 0..NX {
            let s01 = _mm512_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm512_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = V16(_mm512_add_ps(s01, s23)).hsum();
        }
    }
}

#[inline(always)]
unsafe fn exact_q4k_lut(a: &MatArgs) {
    by_nx!(a, exact_q4k_lut_n)
}

/// A 32-element block's bit-exact weights, as two 16-lane registers, for the AVX-512 exact
/// kernels. The 4- and 5-bit formats take only 16 or 32 distinct values per block: they are
/// computed once with the reference's operations (`(q - 8)·d`, `q·d + m`, `(q - 16)·d`; a
/// separate multiply and add, so bit-identical) into one or two registers and looked up per
/// element with `vpermps`/`vpermt2ps`, which read only the low 4/5 bits of each index: the
/// zero-extended packed bytes index the low nibbles as they are, the high nibbles shifted
/// right by 4, and Q5's fifth bit is or-ed in under a mask made from `qh`.
pub(super) trait Leg512 {
    const BB: usize;
    unsafe fn weights(p: *const u8) -> [__m512; 2];
}
impl Leg512 for WQ4_0 {
    const BB: usize = 18;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let table = _mm512_mul_ps(
            _mm512_sub_ps(iota16(), _mm512_set1_ps(8.0)),
            _mm512_set1_ps(f16_at(p)),
        );
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(2) as *const __m128i));
        [
            _mm512_permutexvar_ps(raw, table),
            _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table),
        ]
    }
}
impl Leg512 for WQ4_1 {
    const BB: usize = 20;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let table = _mm512_add_ps(
            _mm512_mul_ps(iota16(), _mm512_set1_ps(f16_at(p))),
            _mm512_set1_ps(f16_at(p.add(2))),
        );
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(4) as *const __m128i));
        [
            _mm512_permutexvar_ps(raw, table),
            _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table),
        ]
    }
}
/// Q5 indices: low nibbles | bit j of `qh` << 4, high nibbles | bit j+16 << 4.
#[inline(always)]
unsafe fn q5_idx(qh: *const u8, qs: *const u8) -> [__m512i; 2] {
    let h = (qh as *const u32).read_unaligned();
    let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs as *const __m128i));
    let lo = _mm512_and_si512(raw, _mm512_set1_epi32(0x0f));
    let hi = _mm512_srli_epi32(raw, 4);
    let b4 = _mm512_set1_epi32(0x10);
    [
        _mm512_mask_or_epi32(lo, h as u16, lo, b4),
        _mm512_mask_or_epi32(hi, (h >> 16) as u16, hi, b4),
    ]
}
impl Leg512 for WQ5_0 {
    const BB: usize = 22;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let d = _mm512_set1_ps(f16_at(p));
        let t0 = _mm512_mul_ps(_mm512_sub_ps(iota16(), _mm512_set1_ps(16.0)), d);
        let t1 = _mm512_mul_ps(iota16(), d);
        let idx = q5_idx(p.add(2), p.add(6));
        [
            _mm512_permutex2var_ps(t0, idx[0], t1),
            _mm512_permutex2var_ps(t0, idx[1], t1),
        ]
    }
}
impl Leg512 for WQ5_1 {
    const BB: usize = 24;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let d = _mm512_set1_ps(f16_at(p));
        let m = _mm512_set1_ps(f16_at(p.add(2)));
        let t0 = _mm512_add_ps(_mm512_mul_ps(iota16(), d), m);
        let t1 = _mm512_add_ps(
            _mm512_mul_ps(_mm512_add_ps(iota16(), _mm512_set1_ps(16.0)), d),
            m,
        );
        let idx = q5_idx(p.add(4), p.add(8));
        [
            _mm512_permutex2var_ps(t0, idx[0], t1),
            _mm512_permutex2var_ps(t0, idx[1], t1),
        ]
    }
}
impl Leg512 for WQ8_0 {
    const BB: usize = 34;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let d = _mm512_set1_ps(f16_at(p));
        let q = |o: usize| {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(2 + o) as *const __m128i
            )))
        };
        [_mm512_mul_ps(q(0), d), _mm512_mul_ps(q(16), d)]
    }
}

/// 0.0, 1.0, .., 15.0.
#[inline(always)]
unsafe fn iota16() -> __m512 {
    _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    )
}

/// AVX-512 exact mode for the 32-element formats: [`Leg512`] weights FMA'd with every f32
/// activation row, two blocks per step into 4 accumulator chains.
#[inline(always)]
unsafe fn exact_leg512_n<W: Leg512, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        // Two blocks per step, so that the accumulator indices are constants (registers).
        macro_rules! block {
            ($b:expr, $u0:expr) => {{
                let b = $b;
                let wv = W::weights(w.add(b * W::BB));
                for h in 0..2 {
                    for t in 0..NX {
                        acc[t][$u0 + h] = _mm512_fmadd_ps(
                            wv[h],
                            _mm512_loadu_ps(xs[t].add(b * 32 + 16 * h)),
                            acc[t][$u0 + h],
                        );
                    }
                }
            }};
        }
        let mut b = 0;
        while b + 2 <= nb {
            // Two blocks are at most 68 bytes: one line ahead per step keeps up.
            _mm_prefetch::<_MM_HINT_T0>(w.add(b * W::BB + PREFETCH) as *const i8);
            block!(b, 0);
            block!(b + 1, 2);
            b += 2;
        }
        if b < nb {
            block!(b, 0);
        }
        for t in 0..NX {
            let s01 = _mm512_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm512_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = V16(_mm512_add_ps(s01, s23)).hsum();
        }
    }
}

#[inline(always)]
unsafe fn exact_leg512<W: Leg512>(a: &MatArgs) {
    by_nx!(a, exact_leg512_n, W)
}

/// AVX-512 exact Q6_K: the quants are unpacked to bytes in registers (32 at a time, as the
/// integer kernel does), widened to f32 16 at a time and multiplied by `d·sc` (the
/// reference's `d * sc * q`, left to right: bit-identical), then FMA'd.
#[inline(always)]
unsafe fn exact_q6k_512_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let off = _mm256_set1_epi8(32);
    let mut ds = [0f32; 16];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let p = w.add(b * 210);
            for l in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(p.add(PREFETCH + 64 * l) as *const i8);
            }
            let d = _mm512_set1_ps(f16_at(p.add(208)));
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(192) as *const __m128i
            )));
            _mm512_storeu_ps(ds.as_mut_ptr(), _mm512_mul_ps(d, sc));
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
                let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4),
                    ),
                ];
                for rq in 0..4 {
                    let v = _mm256_sub_epi8(q[rq], off);
                    for e in 0..2 {
                        let x16 = if e == 0 {
                            _mm256_castsi256_si128(v)
                        } else {
                            _mm256_extracti128_si256(v, 1)
                        };
                        let g = 8 * h + 2 * rq + e;
                        let wv = _mm512_mul_ps(
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x16)),
                            _mm512_set1_ps(ds[g]),
                        );
                        let u = 2 * (rq & 1) + e;
                        let j = 128 * h + 32 * rq + 16 * e;
                        for t in 0..NX {
                            acc[t][u] = _mm512_fmadd_ps(
                                wv,
                                _mm512_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][u],
                            );
                        }
                    }
                }
            }
        }
        for t in 0..NX {
            let s01 = _mm512_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm512_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = V16(_mm512_add_ps(s01, s23)).hsum();
        }
    }
}

#[inline(always)]
unsafe fn exact_q6k_512(a: &MatArgs) {
    by_nx!(a, exact_q6k_512_n)
}

/// AVX-512 exact Q5_K, as [`exact_q4k_lut_n`] with two tables per sub-block (q = 0..32,
/// `vpermt2ps`): the nibble indices get their fifth bit (bit s of `qh[l]` for sub-block s)
/// or-ed in under a mask tested from the zero-extended `qh` bytes.
#[inline(always)]
unsafe fn exact_q5k_lut_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    let iota0 = iota16();
    let iota1 = _mm512_add_ps(iota0, _mm512_set1_ps(16.0));
    let m4 = _mm512_set1_epi32(0x0f);
    let b4 = _mm512_set1_epi32(0x10);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let wb = w.add(b * 176);
            for l in 0..3 {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + 64 * l) as *const i8);
            }
            k4_scales(wb, &mut ds, &mut ms);
            let qh: [__m512i; 2] = core::array::from_fn(|h| {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(wb.add(16 + 16 * h) as *const __m128i))
            });
            for i in 0..4 {
                let raw: [__m512i; 2] = core::array::from_fn(|h| {
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        wb.add(48 + 32 * i + 16 * h) as *const __m128i
                    ))
                });
                for hi in 0..2 {
                    let s = 2 * i + hi;
                    let dv = _mm512_set1_ps(ds[s]);
                    let mv = _mm512_set1_ps(ms[s]);
                    let t0 = _mm512_sub_ps(_mm512_mul_ps(iota0, dv), mv);
                    let t1 = _mm512_sub_ps(_mm512_mul_ps(iota1, dv), mv);
                    let bit = _mm512_set1_epi32(1 << s);
                    for h in 0..2 {
                        let nib = if hi == 1 {
                            _mm512_srli_epi32(raw[h], 4)
                        } else {
                            _mm512_and_si512(raw[h], m4)
                        };
                        let k = _mm512_test_epi32_mask(qh[h], bit);
                        let idx = _mm512_mask_or_epi32(nib, k, nib, b4);
                        let wv = _mm512_permutex2var_ps(t0, idx, t1);
                        let j = 32 * s + 16 * h;
                        let u = 2 * hi + h;
                        for t in 0..NX {
                            acc[t][u] = _mm512_fmadd_ps(
                                wv,
                                _mm512_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][u],
                            );
                        }
                    }
                }
            }
        }
        for t in 0..NX {
            let s01 = _mm512_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm512_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = V16(_mm512_add_ps(s01, s23)).hsum();
        }
    }
}

#[inline(always)]
unsafe fn exact_q5k_lut(a: &MatArgs) {
    by_nx!(a, exact_q5k_lut_n)
}

/// AVX2 exact Q4_K straight from the packed bytes: 8 zero-extended `qs` bytes at a time give
/// 8 low and 8 high nibbles, each widened to f32 and scaled as the reference does
/// (`d1·q - m1`: a multiply, then a separate subtract), then FMA'd.
#[inline(always)]
unsafe fn exact_q4k_v8_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    let m4 = _mm256_set1_epi32(0x0f);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm256_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let wb = w.add(b * 144);
            for l in 0..3 {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + 64 * l) as *const i8);
            }
            k4_scales(wb, &mut ds, &mut ms);
            for i in 0..4 {
                let d = [_mm256_set1_ps(ds[2 * i]), _mm256_set1_ps(ds[2 * i + 1])];
                let m = [_mm256_set1_ps(ms[2 * i]), _mm256_set1_ps(ms[2 * i + 1])];
                for e in 0..4 {
                    let raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        wb.add(16 + 32 * i + 8 * e) as *const __m128i
                    ));
                    let q = [_mm256_and_si256(raw, m4), _mm256_srli_epi32(raw, 4)];
                    for hi in 0..2 {
                        let wv =
                            _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q[hi]), d[hi]), m[hi]);
                        let j = 32 * (2 * i + hi) + 8 * e;
                        for t in 0..NX {
                            acc[t][e] = _mm256_fmadd_ps(
                                wv,
                                _mm256_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][e],
                            );
                        }
                    }
                }
            }
        }
        for t in 0..NX {
            let s01 = _mm256_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm256_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = hsum256(_mm256_add_ps(s01, s23));
        }
    }
}

#[inline(always)]
unsafe fn exact_q4k_v8(a: &MatArgs) {
    by_nx!(a, exact_q4k_v8_n)
}

// ------------------------------------------------------------------ integer dot products

pub(super) trait IDot {
    /// Per i32 lane: the sum of 4 products of unsigned bytes of `a` and signed bytes of `b`.
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i;
    /// `acc + Σ (a·b pairs) · scale` with `scale` per i16 lane (pairs of bytes).
    unsafe fn dot_scaled(acc: __m256i, a: __m256i, b: __m256i, scale: __m256i) -> __m256i;
    /// One step of a running `Σ a·b` (unsigned 5-bit `a`, signed 8-bit `b` in [-127, 127]):
    /// at most 4 steps per chain, then [`IDot::acc_finish`] gives i32 lanes of 4 products'
    /// sums. AVX2 keeps i16 pairs: 4 steps are at most 4·2·31·127 = 31496 < 2^15.
    unsafe fn acc_dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    unsafe fn acc_finish(acc: __m256i) -> __m256i;
}
pub(super) struct Maddubs;
pub(super) struct Vnni;
impl IDot for Maddubs {
    #[inline(always)]
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, a: __m256i, b: __m256i, scale: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), scale))
    }
    #[inline(always)]
    unsafe fn acc_dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi16(acc, _mm256_maddubs_epi16(a, b))
    }
    #[inline(always)]
    unsafe fn acc_finish(acc: __m256i) -> __m256i {
        _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
    }
}
impl IDot for Vnni {
    #[inline(always)]
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    }
    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, a: __m256i, b: __m256i, scale: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(a, b), scale)
    }
    #[inline(always)]
    unsafe fn acc_dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn acc_finish(acc: __m256i) -> __m256i {
        acc
    }
}

/// 32 nibbles of 16 bytes at `p`: low nibbles are elements 0..16, high nibbles 16..32.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// Byte `j` = 0x10 if bit `j` of the little-endian u32 at `p` is set, else 0.
#[inline(always)]
unsafe fn high_bits32(p: *const u8) -> __m256i {
    let x = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bit = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// A 32-element weight block decoded to bytes: (quants, d, m). Signed formats give i8 quants
/// and pair with Q8_0 activations; unsigned ones give u8 quants plus a min `m` and pair with
/// Q8_1 activation rows followed by one f32 per block, d·Σq (ggml's f16 `s` field would
/// round it; see `kernels::matmul_kernel`).
pub(super) trait LegacyW {
    const BB: usize;
    const SIGNED: bool;
    /// The min as a multiple of d when there is no stored one (the zero point, negated).
    const ZERO: f32 = 0.0;
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32);
}
pub(super) struct WQ4_0;
pub(super) struct WQ4_1;
pub(super) struct WQ5_0;
pub(super) struct WQ5_1;
pub(super) struct WQ8_0;
impl LegacyW for WQ4_0 {
    const BB: usize = 18;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let q = _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8));
        (q, f16_at(p), 0.0)
    }
}
impl LegacyW for WQ4_1 {
    const BB: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        (nibbles32(p.add(4)), f16_at(p), f16_at(p.add(2)))
    }
}
impl LegacyW for WQ5_0 {
    const BB: usize = 22;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let q = _mm256_or_si256(nibbles32(p.add(6)), high_bits32(p.add(2)));
        (_mm256_sub_epi8(q, _mm256_set1_epi8(16)), f16_at(p), 0.0)
    }
}
impl LegacyW for WQ5_1 {
    const BB: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let q = _mm256_or_si256(nibbles32(p.add(8)), high_bits32(p.add(4)));
        (q, f16_at(p), f16_at(p.add(2)))
    }
}
/// Q4_0 / Q5_0 for the 8-bit kernels: the unsigned quants with the zero point as a min
/// (`d·(q - 8) = d·q + (-8d)`), against Q8_1 activations and their block sums, which saves
/// the sign juggling `vpmaddubsw` needs for signed × signed.
pub(super) struct WQ4_0U;
pub(super) struct WQ5_0U;
impl LegacyW for WQ4_0U {
    const ZERO: f32 = -8.0;
    const BB: usize = 18;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(p);
        (nibbles32(p.add(2)), d, -8.0 * d)
    }
}
impl LegacyW for WQ5_0U {
    const ZERO: f32 = -16.0;
    const BB: usize = 22;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(p);
        let q = _mm256_or_si256(nibbles32(p.add(6)), high_bits32(p.add(2)));
        (q, d, -16.0 * d)
    }
}
impl LegacyW for WQ8_0 {
    const BB: usize = 34;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        (
            _mm256_loadu_si256(p.add(2) as *const __m256i),
            f16_at(p),
            0.0,
        )
    }
}

/// One 32-element block `b` of the weight row at `w` against the 8-bit activation rows `xs`
/// (`nb` blocks each; Q8_1 rows are followed by their f32 block sums).
#[inline(always)]
unsafe fn legacy_block<D: IDot, W: LegacyW, const NX: usize>(
    w: *const u8,
    b: usize,
    nb: usize,
    xs: &[*const u8; NX],
    acc: &mut [__m256; NX],
    accm: &mut [f32; NX],
) {
    // Q8_0: d, qs at 2 (34 bytes); Q8_1: d, s, qs at 4 (36 bytes).
    let (xbb, xq) = if W::SIGNED { (34, 2) } else { (36, 4) };
    let (q, dw, mw) = W::decode(w.add(b * W::BB));
    let aq = if W::SIGNED { _mm256_sign_epi8(q, q) } else { q };
    for t in 0..NX {
        let xb = xs[t].add(b * xbb);
        let xv = _mm256_loadu_si256(xb.add(xq) as *const __m256i);
        let s = if W::SIGNED {
            D::dot(aq, _mm256_sign_epi8(xv, q))
        } else {
            D::dot(aq, xv)
        };
        let d = _mm256_set1_ps(dw * f16_at(xb));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[t]);
        if !W::SIGNED {
            // d·Σq of this activation block, exact in f32 (after the Q8_1 blocks).
            accm[t] += mw * (xs[t].add(nb * 36 + 4 * b) as *const f32).read_unaligned();
        }
    }
}

#[inline(always)]
unsafe fn legacy_rows_n<D: IDot, W: LegacyW, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
        // Two chains of each (even and odd blocks): one FMA chain alone is latency-bound.
        let (mut a0, mut a1) = ([_mm256_setzero_ps(); NX], [_mm256_setzero_ps(); NX]);
        let (mut m0, mut m1) = ([0.0f32; NX], [0.0f32; NX]);
        let mut b = 0;
        while b + 2 <= nb {
            _mm_prefetch::<_MM_HINT_T0>(w.add(b * W::BB + PREFETCH) as *const i8);
            legacy_block::<D, W, NX>(w, b, nb, &xs, &mut a0, &mut m0);
            legacy_block::<D, W, NX>(w, b + 1, nb, &xs, &mut a1, &mut m1);
            b += 2;
        }
        if b < nb {
            legacy_block::<D, W, NX>(w, b, nb, &xs, &mut a0, &mut m0);
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) =
                hsum256(_mm256_add_ps(a0[t], a1[t])) + (m0[t] + m1[t]);
        }
    }
}

#[inline(always)]
unsafe fn legacy_rows<D: IDot, W: LegacyW>(a: &MatArgs) {
    by_nx!(a, legacy_rows_n, D, W)
}

// ------------------------------------------------------------------ 8-bit, rows packed by 8

/// A legacy format as [`super::packed`] stores it by 8 rows: its f16 fields per block (d, and
/// m) and whether the rearranged high-bit word follows them.
pub(super) trait PackW: LegacyW {
    const F16S: usize;
    const QH: bool;
}
impl PackW for WQ4_0U {
    const F16S: usize = 1;
    const QH: bool = false;
}
impl PackW for WQ4_1 {
    const F16S: usize = 2;
    const QH: bool = false;
}
impl PackW for WQ5_0U {
    const F16S: usize = 1;
    const QH: bool = true;
}
impl PackW for WQ5_1 {
    const F16S: usize = 2;
    const QH: bool = true;
}

/// The 8-bit kernels over Q4_0/Q4_1/Q5_0/Q5_1 rows packed by [`super::packed`]: in groups of
/// 8 rows, block by block, the 8 rows' f16 scales (then mins, then high-bit words), then 4
/// chunks of 32 bytes, chunk `c` holding quant bytes `4c..4c+4` of each row (row `r` in i32
/// lane `r`). One load serves all 8 rows, their block sums are the 8 lanes of one register
/// (no horizontal sums, no scale broadcasts) and the weights are one sequential stream.
/// Activations: Q8_1 rows with f32 block sums (as [`legacy_rows_n`] takes them); rows past the
/// last whole group are stored as they were and take [`legacy_rows_n`].
#[inline(always)]
unsafe fn packed_rows_n<D: IDot, W: PackW, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    let hb = 2 * W::F16S + if W::QH { 4 } else { 0 };
    let gb = 8 * W::BB;
    let groups = a.rows / 8;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let m4 = _mm256_set1_epi8(0x0f);
    let b4 = _mm256_set1_epi8(0x10);
    for g in 0..groups {
        let base = a.w.add(g * 8 * a.w_stride);
        let mut acc = [_mm256_setzero_ps(); NX];
        for b in 0..nb {
            let p = base.add(b * gb);
            for l in 0..gb.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.add(PREFETCH + 64 * l) as *const i8);
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let mv = if W::F16S == 2 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i))
            } else {
                _mm256_mul_ps(dv, _mm256_set1_ps(W::ZERO))
            };
            let h = if W::QH {
                _mm256_loadu_si256(p.add(16 * W::F16S) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let q = p.add(8 * hb);
            // Two chains per row (chunks 0-1, 2-3): at most 4 steps each (IDot::acc_dot).
            let mut s = [[_mm256_setzero_si256(); 2]; NX];
            macro_rules! chunk {
                ($c:literal) => {{
                    let raw = _mm256_loadu_si256(q.add(32 * $c) as *const __m256i);
                    let mut lo = _mm256_and_si256(raw, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    if W::QH {
                        // Fifth bits (packed::high_bits_by_chunk): shifts stay inside bytes.
                        lo =
                            _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(h, 4 - $c), b4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi32(h, $c), b4));
                    }
                    for t in 0..NX {
                        let xq = xs[t].add(b * 36 + 4);
                        let xl = _mm256_set1_epi32((xq.add(4 * $c) as *const i32).read_unaligned());
                        let xh =
                            _mm256_set1_epi32((xq.add(16 + 4 * $c) as *const i32).read_unaligned());
                        s[t][$c / 2] = D::acc_dot(s[t][$c / 2], lo, xl);
                        s[t][$c / 2] = D::acc_dot(s[t][$c / 2], hi, xh);
                    }
                }};
            }
            chunk!(0);
            chunk!(1);
            chunk!(2);
            chunk!(3);
            for t in 0..NX {
                let d = _mm256_mul_ps(dv, _mm256_set1_ps(f16_at(xs[t].add(b * 36))));
                // d·Σq of this activation block, exact in f32 (after the Q8_1 blocks).
                let sum = (xs[t].add(nb * 36 + 4 * b) as *const f32).read_unaligned();
                let si = _mm256_add_epi32(D::acc_finish(s[t][0]), D::acc_finish(s[t][1]));
                let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), d, acc[t]);
                acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(sum), v);
            }
        }
        for t in 0..NX {
            _mm256_storeu_ps(a.out.add(t * a.out_stride + 8 * g), acc[t]);
        }
    }
    let r = groups * 8;
    if r < a.rows {
        let rest = MatArgs {
            w: a.w.add(r * a.w_stride),
            rows: a.rows - r,
            out: a.out.add(r),
            ..*a
        };
        legacy_rows_n::<D, W, NX>(&rest);
    }
}

#[inline(always)]
unsafe fn packed_rows<D: IDot, W: PackW>(a: &MatArgs) {
    by_nx!(a, packed_rows_n, D, W)
}

// ------------------------------------------------------------------ exact, scales factored (AVX2)

// The AVX2 exact matrix-vector kernels with the scales taken out of the block sums: for a
// block of weights `d·q + o` (o: the format's min, or its zero point `-8d`/`-16d` as a
// multiple of d), `Σ w·x = d·Σ q·x + o·Σ x`. The quants are widened straight from the weight
// bytes to i32 lanes and converted to f32 (small integers: exact), so each 8 weights cost one
// convert and one FMA against the f32 activations, and each block one more FMA by its scale.
// The weights are still exactly the dequantized values; only the order of the f32 rounding
// differs from the reference's `Σ (d·q + o)·x`. `Σ x` per 32 activations comes with the
// activation rows ([`super::Act::F32Sums`]): row `t` is `k` f32 then `k/32` block sums.

/// A 32-element legacy block for the factored kernels.
pub(super) trait FacW {
    const BB: usize;
    /// Whether the block has an offset (`o ≠ 0`), read against the block sums.
    const OFFSET: bool;
    /// The block's 32 quants as i32 lanes: elements 0..8, 8..16, 16..24, 24..32.
    unsafe fn quants(p: *const u8) -> [__m256i; 4];
    /// (d, o).
    unsafe fn scales(p: *const u8) -> (f32, f32);
}

/// Bytes `0..8` and `8..16` at `p` zero-extended to i32 lanes, split into their low nibbles
/// (elements 0..16) and high nibbles (elements 16..32).
#[inline(always)]
unsafe fn nib_lanes(p: *const u8) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi32(0x0f);
    let r0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let r1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
    [
        _mm256_and_si256(r0, m4),
        _mm256_and_si256(r1, m4),
        _mm256_srli_epi32(r0, 4),
        _mm256_srli_epi32(r1, 4),
    ]
}

/// A legacy block's 32 quants as [`LegacyW::decode`] makes them (bytes: signed for the
/// formats without a min), through a stack buffer, widened to i32 lanes.
#[inline(always)]
unsafe fn decoded_lanes<W: LegacyW>(p: *const u8) -> [__m256i; 4] {
    let mut qb = [0u8; 32];
    _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, W::decode(p).0);
    core::array::from_fn(|v| {
        let h = _mm_loadl_epi64(qb.as_ptr().add(8 * v) as *const __m128i);
        if W::SIGNED {
            _mm256_cvtepi8_epi32(h)
        } else {
            _mm256_cvtepu8_epi32(h)
        }
    })
}

impl FacW for WQ4_0 {
    const BB: usize = 18;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> [__m256i; 4] {
        nib_lanes(p.add(2))
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (f32, f32) {
        let d = f16_at(p);
        (d, -8.0 * d)
    }
}
impl FacW for WQ4_1 {
    const BB: usize = 20;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> [__m256i; 4] {
        nib_lanes(p.add(4))
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (f32, f32) {
        (f16_at(p), f16_at(p.add(2)))
    }
}
impl FacW for WQ5_0 {
    const BB: usize = 22;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> [__m256i; 4] {
        decoded_lanes::<Self>(p)
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (f32, f32) {
        (f16_at(p), 0.0)
    }
}
impl FacW for WQ5_1 {
    const BB: usize = 24;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> [__m256i; 4] {
        decoded_lanes::<Self>(p)
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (f32, f32) {
        (f16_at(p), f16_at(p.add(2)))
    }
}
impl FacW for WQ8_0 {
    const BB: usize = 34;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> [__m256i; 4] {
        core::array::from_fn(|v| {
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(2 + 8 * v) as *const __m128i))
        })
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (f32, f32) {
        (f16_at(p), 0.0)
    }
}

/// `Σ_v qf[v]·x[8v..8v+8]`: one block's (or sub-block's) quant-activation sum, 8 lanes.
#[inline(always)]
unsafe fn qdot<const V: usize>(qf: &[__m256; V], x: *const f32) -> __m256 {
    let mut s = _mm256_mul_ps(qf[0], _mm256_loadu_ps(x));
    for v in 1..V {
        s = _mm256_fmadd_ps(qf[v], _mm256_loadu_ps(x.add(8 * v)), s);
    }
    s
}

/// One block `b` of a weight row at `w` against the activation rows `xs` (`k` f32 each, then
/// the block sums): `acc[t] += d·Σ q·x`, `off[t] += o·Σ x`.
#[inline(always)]
unsafe fn fac_block<W: FacW, const NX: usize>(
    w: *const u8,
    b: usize,
    xs: &[*const f32; NX],
    k: usize,
    acc: &mut [__m256; NX],
    off: &mut [f32; NX],
) {
    let p = w.add(b * W::BB);
    let qf = W::quants(p).map(|q| _mm256_cvtepi32_ps(q));
    let (d, o) = W::scales(p);
    let dv = _mm256_set1_ps(d);
    for t in 0..NX {
        acc[t] = _mm256_fmadd_ps(qdot(&qf, xs[t].add(32 * b)), dv, acc[t]);
        if W::OFFSET {
            off[t] += o * *xs[t].add(k + b);
        }
    }
}

#[inline(always)]
unsafe fn fac_legacy_rows_n<W: FacW, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        // Two chains per row (even and odd blocks) and the offsets' scalar sum.
        let mut a0 = [_mm256_setzero_ps(); NX];
        let mut a1 = [_mm256_setzero_ps(); NX];
        let mut off = [0.0f32; NX];
        let mut b = 0;
        while b + 2 <= nb {
            _mm_prefetch::<_MM_HINT_T0>(w.add(b * W::BB + PREFETCH) as *const i8);
            fac_block::<W, NX>(w, b, &xs, a.k, &mut a0, &mut off);
            fac_block::<W, NX>(w, b + 1, &xs, a.k, &mut a1, &mut off);
            b += 2;
        }
        if b < nb {
            fac_block::<W, NX>(w, b, &xs, a.k, &mut a0, &mut off);
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum256(_mm256_add_ps(a0[t], a1[t])) + off[t];
        }
    }
}

#[inline(always)]
unsafe fn fac_legacy<W: FacW>(a: &MatArgs) {
    by_nx!(a, fac_legacy_rows_n, W)
}

/// Q4_K / Q5_K, factored: per sub-block of 32, `d·sc·Σ q·x − dmin·m·Σ x` (the reference's
/// `d1·q − m1` weights); the eight mins of a super-block meet its eight activation sums in one
/// FMA. Chunk `i` of `qs` holds sub-blocks 2i (low nibbles) and 2i+1 (high nibbles); Q5_K's
/// bit 4 of element l of sub-block s is bit s of `qh[l]`.
#[inline(always)]
unsafe fn fac_k45_rows_n<const FIVE: bool, const NX: usize>(a: &MatArgs) {
    let bb = if FIVE { 176 } else { 144 };
    let qs_off = if FIVE { 48 } else { 16 };
    let nb = a.k / 256;
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    let m4 = _mm256_set1_epi32(0x0f);
    let one = _mm256_set1_epi32(1);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm256_setzero_ps(); 2]; NX];
        let mut mins = [_mm256_setzero_ps(); NX];
        for b in 0..nb {
            let wb = w.add(b * bb);
            for l in 0..bb.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + 64 * l) as *const i8);
            }
            k4_scales(wb, &mut ds, &mut ms);
            let mv = _mm256_loadu_ps(ms.as_ptr());
            for t in 0..NX {
                let sums = _mm256_loadu_ps(xs[t].add(a.k + 8 * b));
                mins[t] = _mm256_fmadd_ps(mv, sums, mins[t]);
            }
            for i in 0..4 {
                let mut lo = [_mm256_setzero_ps(); 4];
                let mut hi = [_mm256_setzero_ps(); 4];
                for e in 0..4 {
                    let raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        wb.add(qs_off + 32 * i + 8 * e) as *const __m128i,
                    ));
                    let mut ql = _mm256_and_si256(raw, m4);
                    let mut qh = _mm256_srli_epi32(raw, 4);
                    if FIVE {
                        let h = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                            wb.add(16 + 8 * e) as *const __m128i
                        ));
                        let s0 = _mm_cvtsi32_si128(2 * i as i32);
                        let s1 = _mm_cvtsi32_si128(2 * i as i32 + 1);
                        let h0 = _mm256_and_si256(_mm256_srl_epi32(h, s0), one);
                        let h1 = _mm256_and_si256(_mm256_srl_epi32(h, s1), one);
                        ql = _mm256_or_si256(ql, _mm256_slli_epi32(h0, 4));
                        qh = _mm256_or_si256(qh, _mm256_slli_epi32(h1, 4));
                    }
                    lo[e] = _mm256_cvtepi32_ps(ql);
                    hi[e] = _mm256_cvtepi32_ps(qh);
                }
                let d0 = _mm256_set1_ps(ds[2 * i]);
                let d1 = _mm256_set1_ps(ds[2 * i + 1]);
                for t in 0..NX {
                    let x = xs[t].add(b * 256 + 64 * i);
                    acc[t][0] = _mm256_fmadd_ps(qdot(&lo, x), d0, acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(qdot(&hi, x.add(32)), d1, acc[t][1]);
                }
            }
        }
        for t in 0..NX {
            let s = _mm256_sub_ps(_mm256_add_ps(acc[t][0], acc[t][1]), mins[t]);
            *a.out.add(t * a.out_stride + r) = hsum256(s);
        }
    }
}

#[inline(always)]
unsafe fn fac_k45<const FIVE: bool>(a: &MatArgs) {
    by_nx!(a, fac_k45_rows_n, FIVE)
}

/// Q6_K, factored: the super-block's signed quants decoded to bytes once ([`XQ6K`]), then per
/// group of 16, `(d·sc)·Σ q·x` (the reference's `d·sc·q` weights).
#[inline(always)]
unsafe fn fac_q6k_rows_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let mut qb = [0i8; 256];
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm256_setzero_ps(); 2]; NX];
        for b in 0..nb {
            let wb = w.add(b * 210);
            for l in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + 64 * l) as *const i8);
            }
            XQ6K::decode(wb, &mut qb, &mut ds, &mut ms);
            // Pairs of groups, one accumulator each (a constant index: registers, not a
            // stack slot the loop would store to and reload).
            for gp in 0..8 {
                for h in 0..2 {
                    let g = 2 * gp + h;
                    let q: [__m256; 2] = core::array::from_fn(|v| {
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            qb.as_ptr().add(16 * g + 8 * v) as *const __m128i,
                        )))
                    });
                    let dv = _mm256_set1_ps(ds[g]);
                    for t in 0..NX {
                        let x = xs[t].add(b * 256 + 16 * g);
                        acc[t][h] = _mm256_fmadd_ps(qdot(&q, x), dv, acc[t][h]);
                    }
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum256(_mm256_add_ps(acc[t][0], acc[t][1]));
        }
    }
}

#[inline(always)]
unsafe fn fac_q6k(a: &MatArgs) {
    by_nx!(a, fac_q6k_rows_n)
}

// ------------------------------------------------------------------ K-quants × Q8_K

/// A byte shuffle of 8 i16 (repeated in both 128-bit lanes) that broadcasts word `j`.
#[inline(always)]
unsafe fn word_shuffle(j: usize) -> __m256i {
    _mm256_set1_epi16((0x0100 + 0x0202 * j as i32) as i16)
}

/// Q4_K/Q5_K's 8 six-bit scales and 8 six-bit mins (the 12 packed bytes at `p`, unpacked as
/// ggml does), one per byte.
#[inline(always)]
unsafe fn k4_scale_bytes(p: *const u8) -> (u64, u64) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let u0 = (p as *const u32).read_unaligned();
    let u1 = (p.add(4) as *const u32).read_unaligned();
    let u2 = (p.add(8) as *const u32).read_unaligned();
    let sc_lo = u0 & K1;
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m_lo = u1 & K1;
    let m_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    (
        (u64::from(sc_hi) << 32) | u64::from(sc_lo),
        (u64::from(m_hi) << 32) | u64::from(m_lo),
    )
}

/// A byte shuffle of 8 i16 (repeated in both 128-bit lanes) that broadcasts word `2j` over
/// the low lane and word `2j + 1` over the high lane.
#[inline(always)]
unsafe fn pair_shuffle(j: usize) -> __m256i {
    let lo = 0x0100 + 0x0202 * (2 * j as i16);
    let hi = 0x0100 + 0x0202 * (2 * j as i16 + 1);
    _mm256_setr_epi16(
        lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
    )
}

//
// Q8_K block (292 bytes): d:f32 @0, qs:[i8;256] @4, bsums:[i16;16] @260 (sums of 16 quants).

/// Q4_K (144 bytes: d, dmin, scales[12], qs[128]) and Q5_K (176 bytes: d, dmin, scales[12],
/// qh[32], qs[128]).
#[inline(always)]
unsafe fn q45k_rows_n<D: IDot, const FIVE: bool, const NX: usize>(a: &MatArgs) {
    let bb = if FIVE { 176 } else { 144 };
    let qs_off = if FIVE { 48 } else { 16 };
    let nb = a.k / 256;
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut accm = [_mm256_setzero_ps(); NX];
        for b in 0..nb {
            let wb = w.add(b * bb);
            let d = f16_at(wb);
            let dmin = f16_at(wb.add(2));
            let (sc8, mn8) = k4_scale_bytes(wb.add(4));
            // The 8 scales as i16 in both lanes; the mins as pairs (m0 m0 m1 m1 …) against
            // the 16 activation sums of 16.
            let sc16 =
                _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8 as i64)));
            let mn = _mm_cvtsi64_si128(mn8 as i64);
            let mpairs = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
            let qh = if FIVE {
                _mm256_loadu_si256(wb.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut sumi = [_mm256_setzero_si256(); NX];
            for i in 0..4 {
                let q = _mm256_loadu_si256(wb.add(qs_off + 32 * i) as *const __m256i);
                let mut lo = _mm256_and_si256(q, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if FIVE {
                    // Bit (2i) / (2i+1) of qh byte l is bit 4 of element l of the sub-block.
                    let s0 = _mm_cvtsi32_si128(2 * i as i32);
                    let s1 = _mm_cvtsi32_si128(2 * i as i32 + 1);
                    let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, s0), one);
                    let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, s1), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
                }
                let s_lo = _mm256_shuffle_epi8(sc16, word_shuffle(2 * i));
                let s_hi = _mm256_shuffle_epi8(sc16, word_shuffle(2 * i + 1));
                for t in 0..NX {
                    let xq = xs[t].add(b * 292 + 4 + 64 * i);
                    let x0 = _mm256_loadu_si256(xq as *const __m256i);
                    let x1 = _mm256_loadu_si256(xq.add(32) as *const __m256i);
                    sumi[t] = D::dot_scaled(sumi[t], lo, x0, s_lo);
                    sumi[t] = D::dot_scaled(sumi[t], hi, x1, s_hi);
                }
            }
            for t in 0..NX {
                let xb = xs[t].add(b * 292);
                let dx = f32_at(xb);
                let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
                let mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mpairs));
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * dx), acc[t]);
                accm[t] = _mm256_fmadd_ps(mins, _mm256_set1_ps(-dmin * dx), accm[t]);
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum256(_mm256_add_ps(acc[t], accm[t]));
        }
    }
}

#[inline(always)]
unsafe fn q45k_rows<D: IDot, const FIVE: bool>(a: &MatArgs) {
    by_nx!(a, q45k_rows_n, D, FIVE)
}

/// Q6_K (210 bytes: ql[128], qh[64], scales:[i8;16], d).
#[inline(always)]
unsafe fn q6k_rows_n<D: IDot, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
        let mut acc = [_mm256_setzero_ps(); NX];
        for b in 0..nb {
            let wb = w.add(b * 210);
            let d = f16_at(wb.add(208));
            let sc8 = _mm_loadu_si128(wb.add(192) as *const __m128i);
            let sc16 = _mm256_cvtepi8_epi16(sc8);
            let mut sumi = [_mm256_setzero_si256(); NX];
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(wb.add(64 * h) as *const __m256i);
                let ql1 = _mm256_loadu_si256(wb.add(64 * h + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(wb.add(128 + 32 * h) as *const __m256i);
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4),
                    ),
                ];
                // This half's 8 scales as i16 in both 128-bit lanes; group g = 8h + 2rq's
                // scale to the low lane, g + 1's to the high lane, by one byte shuffle.
                let sch = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(if h == 0 {
                    sc8
                } else {
                    _mm_srli_si128::<8>(sc8)
                }));
                for (rq, &qv) in q.iter().enumerate() {
                    let scv = _mm256_shuffle_epi8(sch, pair_shuffle(rq));
                    for t in 0..NX {
                        let xq = xs[t].add(b * 292 + 4 + 128 * h + 32 * rq);
                        let xv = _mm256_loadu_si256(xq as *const __m256i);
                        sumi[t] = D::dot_scaled(sumi[t], qv, xv, scv);
                    }
                }
            }
            for t in 0..NX {
                let xb = xs[t].add(b * 292);
                let dx = f32_at(xb);
                // The -32 offset of every quant: Σ_g scale_g · Σ x (group g of 16), as 8
                // lanes of pair sums: 32 · madd(bsums, scales).
                let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
                let offs = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                let s = _mm256_sub_epi32(sumi[t], offs);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * dx), acc[t]);
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum256(acc[t]);
        }
    }
}

#[inline(always)]
unsafe fn q6k_rows<D: IDot>(a: &MatArgs) {
    by_nx!(a, q6k_rows_n, D)
}

// ------------------------------------------------------------------ f32 GEMM (exact, many rows)

/// `R` weight rows × `NV·LANES` rows of one block of `2·LANES` packed activation rows over the
/// whole of `k`: each step loads `NV` vectors of the block's activations (one `k` index) and
/// broadcasts one weight per row, `NV·R` FMAs into `NV·R` accumulators that end up holding
/// the outputs themselves (no horizontal sums). Rows past `g.rows` reuse the last row (clamped
/// pointers: every load is in bounds) and, like the block's padding rows, are not written.
#[inline(always)]
unsafe fn gemm_micro<V: F32V, const R: usize, const NV: usize>(
    g: &GemmArgs,
    r0: usize,
    t0: usize,
    xp: *const f32,
) {
    let l = V::LANES;
    let tb = 2 * l;
    let w: [*const f32; R] =
        core::array::from_fn(|r| g.w.add((r0 + r).min(g.rows - 1) * g.w_stride));
    let mut acc = [[V::zero(); NV]; R];
    for i in 0..g.k {
        let xv: [V; NV] = core::array::from_fn(|v| V::load(xp.add(i * tb + v * l)));
        for r in 0..R {
            let b = V::splat(*w[r].add(i));
            for v in 0..NV {
                acc[r][v] = V::fma(b, xv[v], acc[r][v]);
            }
        }
    }
    let mut tmp = [[0.0f32; 32]; R];
    for r in 0..R {
        for v in 0..NV {
            acc[r][v].store(tmp[r].as_mut_ptr().add(v * l));
        }
    }
    write_tile(
        &tmp,
        R.min(g.rows - r0),
        (NV * l).min(g.n - t0),
        g.out.add(t0 * g.out_stride + r0),
        g.out_stride,
    );
}

/// Writes a GEMM micro-kernel's results, `tmp[r][t]` = output of weight row `r` for activation
/// row `t`, to `out[t·stride + r]` for `r < rows`, `t < tokens` (the valid part of the tile).
///
/// # Safety
/// `out` is valid for those writes.
#[inline(always)]
pub(super) unsafe fn write_tile<const R: usize>(
    tmp: &[[f32; 32]; R],
    rows: usize,
    tokens: usize,
    out: *mut f32,
    stride: usize,
) {
    for t in 0..tokens {
        let o = out.add(t * stride);
        for r in 0..rows {
            *o.add(r) = tmp[r][t];
        }
    }
}

/// Every (row, activation row) pair of a [`GemmArgs`]: for each block of `2·LANES` packed
/// activation rows (`k·2·LANES` f32, in L2), every group of `R` weight rows.
#[inline(always)]
unsafe fn gemm_tile<V: F32V, const R: usize>(g: &GemmArgs) {
    for_each_micro(g.n, g.rows, R, V::LANES, |r0, t0, one| {
        let xp = g.x.add(t0 * g.k);
        if one {
            gemm_micro::<V, R, 1>(g, r0, t0, xp);
        } else {
            gemm_micro::<V, R, 2>(g, r0, t0, xp);
        }
    });
}

/// Most weight-row groups of `LANES` rows one pass of [`gemm_narrow_n`] keeps accumulators
/// for (`G`: 3 for up to 4 activation rows; fewer for more, within the registers).
const NARROW_GROUPS: usize = 3;

/// The f32 GEMM's outputs for `NX ≤ 8` activation rows, vectorised over weight rows instead
/// of activation rows (which would leave most lanes of a block empty): each `LANES × LANES`
/// block of weights is transposed in registers, then every column is one FMA per group and
/// activation row. `g.x` holds plain activation rows (`k` apart), not packed blocks. Each
/// output is the same FMA chain over `i = 0..k` in order as [`gemm_micro`]'s
/// (`acc = fma(w[r, i], x[t, i], acc)`), so the results are bit for bit the GEMM's: a row's
/// output does not depend on how many rows came with it.
#[inline(always)]
unsafe fn gemm_narrow_n<V: F32V, const G: usize, const NX: usize>(g: &GemmArgs) {
    let l = V::LANES;
    let mut blk = Aligned::<{ 16 * 16 * NARROW_GROUPS }>([0.0; 16 * 16 * NARROW_GROUPS]);
    let bp = blk.0.as_mut_ptr();
    let mut r0 = 0;
    while r0 < g.rows {
        // G groups of `l` rows; rows past the end repeat the last one (not written).
        let valid: [usize; G] =
            core::array::from_fn(|gi| g.rows.saturating_sub(r0 + gi * l).min(l).max(1));
        let first: [usize; G] = core::array::from_fn(|gi| (r0 + gi * l).min(g.rows - 1));
        let mut acc = [[V::zero(); NX]; G];
        let mut i0 = 0;
        while i0 + l <= g.k {
            for gi in 0..G {
                V::transpose_block(
                    g.w.add(first[gi] * g.w_stride + i0),
                    g.w_stride,
                    valid[gi],
                    bp.add(gi * l * l),
                );
            }
            for c in 0..l {
                let xv: [V; NX] = core::array::from_fn(|t| V::splat(*g.x.add(t * g.k + i0 + c)));
                for gi in 0..G {
                    let w = V::load(bp.add(gi * l * l + c * l));
                    for t in 0..NX {
                        acc[gi][t] = V::fma(w, xv[t], acc[gi][t]);
                    }
                }
            }
            i0 += l;
        }
        // The last columns (k not a multiple of LANES): one element at a time, in order.
        for i in i0..g.k {
            let xv: [V; NX] = core::array::from_fn(|t| V::splat(*g.x.add(t * g.k + i)));
            for gi in 0..G {
                for r in 0..l {
                    *bp.add(r) = *g.w.add((first[gi] + r.min(valid[gi] - 1)) * g.w_stride + i);
                }
                let w = V::load(bp);
                for t in 0..NX {
                    acc[gi][t] = V::fma(w, xv[t], acc[gi][t]);
                }
            }
        }
        let mut tmp = [0.0f32; 16];
        for gi in 0..G {
            if r0 + gi * l >= g.rows {
                break;
            }
            for t in 0..NX {
                acc[gi][t].store(tmp.as_mut_ptr());
                let o = g.out.add(t * g.out_stride + r0 + gi * l);
                for (r, &val) in tmp.iter().enumerate().take(valid[gi]) {
                    *o.add(r) = val;
                }
            }
        }
        r0 += G * l;
    }
}

#[inline(always)]
unsafe fn gemm_narrow<V: F32V>(g: &GemmArgs) {
    // Accumulators G·NX within the 32 (16 on AVX2) vector registers, with room for the
    // weights and the broadcast activations.
    let wide = V::LANES == 16;
    match (g.n, wide) {
        (1, _) => gemm_narrow_n::<V, 3, 1>(g),
        (2, _) => gemm_narrow_n::<V, 3, 2>(g),
        (3, _) => gemm_narrow_n::<V, 3, 3>(g),
        (4, _) => gemm_narrow_n::<V, 3, 4>(g),
        (5, true) => gemm_narrow_n::<V, 2, 5>(g),
        (6, true) => gemm_narrow_n::<V, 2, 6>(g),
        (7, true) => gemm_narrow_n::<V, 2, 7>(g),
        (_, true) => gemm_narrow_n::<V, 2, 8>(g),
        (5, false) => gemm_narrow_n::<V, 1, 5>(g),
        (6, false) => gemm_narrow_n::<V, 1, 6>(g),
        (7, false) => gemm_narrow_n::<V, 1, 7>(g),
        (_, false) => gemm_narrow_n::<V, 1, 8>(g),
    }
}

/// The walk of every GEMM tile kernel (f32, 8-bit, bf16): blocks of `2·lanes` activation
/// rows, `r_step` weight rows at a time, calling `micro(r0, t0, one)`; `one` says the block
/// holds at most `lanes` rows, so a one-vector micro-kernel covers it.
#[inline(always)]
pub(super) fn for_each_micro(
    n: usize,
    rows: usize,
    r_step: usize,
    lanes: usize,
    mut micro: impl FnMut(usize, usize, bool),
) {
    let mut t0 = 0;
    while t0 < n {
        let one = n - t0 <= lanes;
        let mut r0 = 0;
        while r0 < rows {
            micro(r0, t0, one);
            r0 += r_step;
        }
        t0 += 2 * lanes;
    }
}

/// Writes an AVX-512 micro-kernel's accumulators (`acc[r][v]` lane `l` = weight row `r`,
/// activation row `16v + l`) with [`write_tile`]: the first `rows` × `tokens` of them to
/// `out[t·stride + r]`.
///
/// # Safety
/// AVX-512F available; `out` is valid for those writes.
#[inline(always)]
pub(super) unsafe fn write_acc512<const R: usize, const NV: usize>(
    acc: &[[__m512; NV]; R],
    rows: usize,
    tokens: usize,
    out: *mut f32,
    stride: usize,
) {
    let mut tmp = [[0.0f32; 32]; R];
    for r in 0..R {
        for v in 0..NV {
            _mm512_storeu_ps(tmp[r].as_mut_ptr().add(16 * v), acc[r][v]);
        }
    }
    write_tile(&tmp, rows, tokens, out, stride);
}

// ------------------------------------------------------------------ vector primitives

/// e^x for 16 lanes: x = n·ln2 + r (|r| ≤ ln2/2, two-part ln2), e^r by its degree-7 Taylor
/// polynomial (truncation error < 1e-8 relative), times 2^n by `vscalefps`. Inputs are clamped
/// to [-87.3, 88.7] (e^-87.3 ≈ 1.2e-38: what underflows becomes that, not 0).
/// `e^r` on |r| ≤ ln2/2: Horner coefficients, highest degree first (shared by [`exp16`] and
/// [`exp8`]).
const EXP_POLY: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

#[inline(always)]
unsafe fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.336_54)),
        _mm512_set1_ps(88.722_83),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(core::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let c = EXP_POLY;
    let mut p = _mm512_set1_ps(c[0]);
    for &ci in &c[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ci));
    }
    _mm512_scalef_ps(p, n)
}

/// `e^x` on 8 lanes, the AVX2 form of [`exp16`]: the same range reduction and polynomial,
/// then `2^n` built from exponent bits in two halves (each within the normal range, so
/// `n = 128` near the top of the range does not overflow early).
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.336_54)),
        _mm256_set1_ps(88.722_83),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(core::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let c = EXP_POLY;
    let mut p = _mm256_set1_ps(c[0]);
    for &ci in &c[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ci));
    }
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32(ni, 1);
    let n2 = _mm256_sub_epi32(ni, n1);
    let pow2 = |k: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(k, _mm256_set1_epi32(127)),
            23,
        ))
    };
    _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(n2))
}

/// `x[i] = e^x[i]` for `n` f32 (AVX2).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp_avx2(x: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(x.add(i), exp8(_mm256_loadu_ps(x.add(i))));
        i += 8;
    }
    if i < n {
        let mut t = [0f32; 8];
        core::ptr::copy_nonoverlapping(x.add(i), t.as_mut_ptr(), n - i);
        _mm256_storeu_ps(t.as_mut_ptr(), exp8(_mm256_loadu_ps(t.as_ptr())));
        core::ptr::copy_nonoverlapping(t.as_ptr(), x.add(i), n - i);
    }
}

/// `x[i] = e^x[i]` over `n` f32 (AVX-512; [`exp16`], masked tail).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn exp_avx512(x: *mut f32, n: usize) {
    let mut i = 0;
    while i + 16 <= n {
        _mm512_storeu_ps(x.add(i), exp16(_mm512_loadu_ps(x.add(i))));
        i += 16;
    }
    if i < n {
        let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
        let v = _mm512_maskz_loadu_ps(m, x.add(i));
        _mm512_mask_storeu_ps(x.add(i), m, exp16(v));
    }
}

/// `vpermt2ps` indices of [`transpose16`]'s stage `b` (`m = 2^b`): for the pair of registers
/// (`j`, `j | m`), `[b][0]` makes the new `j` (lanes with bit `m` clear from `j`, the others from
/// `j | m` shifted down), `[b][1]` the new `j | m`.
const T16_IDX: [[[i32; 16]; 2]; 4] = {
    let mut t = [[[0i32; 16]; 2]; 4];
    let mut b = 0;
    while b < 4 {
        let m = 1i32 << b;
        let mut c = 0;
        while c < 16 {
            let ci = c as i32;
            t[b][0][c] = if ci & m == 0 { ci } else { 16 + (ci ^ m) };
            t[b][1][c] = if ci & m == 0 { ci | m } else { 16 + ci };
            c += 1;
        }
        b += 1;
    }
    t
};

/// One stage of [`transpose16`]: bit `M` of the row index swapped with bit `M` of the column
/// index between the register pairs (`j`, `j | M`).
#[inline(always)]
unsafe fn t16_stage<const B: usize, const M: usize>(r: &mut [__m512; 16]) {
    let ia = _mm512_loadu_si512(T16_IDX[B][0].as_ptr() as *const _);
    let ib = _mm512_loadu_si512(T16_IDX[B][1].as_ptr() as *const _);
    for j in 0..16 {
        if j & M == 0 {
            let (a, bv) = (r[j], r[j | M]);
            r[j] = _mm512_permutex2var_ps(a, ia, bv);
            r[j | M] = _mm512_permutex2var_ps(a, ib, bv);
        }
    }
}

/// Transposes 16×16 f32 in registers: afterwards `r[c]` holds what was column `c`. Four
/// stages; stage `m` (1, 2, 4, 8) swaps bit `m` of the row index with bit `m` of the column
/// index between the register pairs (`j`, `j | m`).
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512; 16]) {
    t16_stage::<0, 1>(r);
    t16_stage::<1, 2>(r);
    t16_stage::<2, 4>(r);
    t16_stage::<3, 8>(r);
}

/// Packs `rows` (≤ 32) activation rows of `k` f32 into one GEMM block of 32 rows
/// (`dst[i·32 + t] = x[t·k + i]`, zero for `t ≥ rows`): 16×16 register transposes.
#[inline(always)]
unsafe fn pack32_v16(x: *const f32, k: usize, rows: usize, dst: *mut f32) {
    let mut i0 = 0;
    while i0 + 16 <= k {
        for h in 0..2 {
            let mut r: [__m512; 16] = core::array::from_fn(|j| {
                let t = 16 * h + j;
                if t < rows {
                    _mm512_loadu_ps(x.add(t * k + i0))
                } else {
                    _mm512_setzero_ps()
                }
            });
            transpose16(&mut r);
            for c in 0..16 {
                _mm512_storeu_ps(dst.add((i0 + c) * 32 + 16 * h), r[c]);
            }
        }
        i0 += 16;
    }
    for i in i0..k {
        for t in 0..32 {
            *dst.add(i * 32 + t) = if t < rows { *x.add(t * k + i) } else { 0.0 };
        }
    }
}

/// `out[g·d + i] += Σ_j p[g·p_stride + j] · vals[j·stride + i]` for `g < G`, `i < d`,
/// `j < nk`: each value row is loaded once for all `G` rows of weights, the accumulators
/// (`G` × 4 vectors, 64 columns at a time on AVX-512) stay in registers over all `j`.
#[inline(always)]
unsafe fn mix_v<V: F32V, W: FloatW, const G: usize>(
    p: *const f32,
    p_stride: usize,
    vals: *const u8,
    stride: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    let l = V::LANES;
    let mut c = 0;
    while c + 4 * l <= d {
        let mut acc = [[V::zero(); 4]; G];
        for j in 0..nk {
            let v: [V; 4] =
                core::array::from_fn(|u| W::load::<V>(vals.add((j * stride + c + u * l) * W::EB)));
            for g in 0..G {
                let pg = V::splat(*p.add(g * p_stride + j));
                for u in 0..4 {
                    acc[g][u] = V::fma(pg, v[u], acc[g][u]);
                }
            }
        }
        for g in 0..G {
            for u in 0..4 {
                let o = out.add(g * d + c + u * l);
                V::add(V::load(o), acc[g][u]).store(o);
            }
        }
        c += 4 * l;
    }
    while c + l <= d {
        let mut acc = [V::zero(); G];
        for j in 0..nk {
            let v = W::load::<V>(vals.add((j * stride + c) * W::EB));
            for g in 0..G {
                acc[g] = V::fma(V::splat(*p.add(g * p_stride + j)), v, acc[g]);
            }
        }
        for g in 0..G {
            let o = out.add(g * d + c);
            V::add(V::load(o), acc[g]).store(o);
        }
        c += l;
    }
    for i in c..d {
        for g in 0..G {
            let mut a = 0.0f32;
            for j in 0..nk {
                a += *p.add(g * p_stride + j) * W::scalar(vals.add((j * stride + i) * W::EB));
            }
            *out.add(g * d + i) += a;
        }
    }
}

/// [`mix_v`] for Q8_0 value rows (`stride` elements apart, `d` a multiple of 32): per block,
/// the weight times the block's scale, FMA'd with the widened quants; up to 4 weight rows
/// share each value block.
#[inline(always)]
unsafe fn mix_q8_v<const G: usize>(
    p: *const f32,
    p_stride: usize,
    vals: *const u8,
    stride: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    let rs = stride / 32 * 34;
    for c in 0..d / 32 {
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        for j in 0..nk {
            let blk = vals.add(j * rs + c * 34);
            let dq = f16_at(blk);
            let q: [__m256; 4] = core::array::from_fn(|u| {
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    blk.add(2 + 8 * u) as *const __m128i
                )))
            });
            for g in 0..G {
                let w = _mm256_set1_ps(*p.add(g * p_stride + j) * dq);
                for u in 0..4 {
                    acc[g][u] = _mm256_fmadd_ps(w, q[u], acc[g][u]);
                }
            }
        }
        for g in 0..G {
            for u in 0..4 {
                let o = out.add(g * d + 32 * c + 8 * u);
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[g][u]));
            }
        }
    }
}

/// A weighted sum of value rows for `G` weight rows at once ([`mix_v`], [`mix_q8_v`]).
pub(super) trait MixG {
    unsafe fn mix<const G: usize>(
        p: *const f32,
        p_stride: usize,
        vals: *const u8,
        stride: usize,
        nk: usize,
        d: usize,
        out: *mut f32,
    );
}
/// Float value rows loaded as `W`, `V` lanes at a time.
pub(super) struct MixFloat<V, W>(core::marker::PhantomData<(V, W)>);
/// Q8_0 value rows.
pub(super) struct MixQ8;
impl<V: F32V, W: FloatW> MixG for MixFloat<V, W> {
    #[inline(always)]
    unsafe fn mix<const G: usize>(
        p: *const f32,
        p_stride: usize,
        vals: *const u8,
        stride: usize,
        nk: usize,
        d: usize,
        out: *mut f32,
    ) {
        mix_v::<V, W, G>(p, p_stride, vals, stride, nk, d, out)
    }
}
impl MixG for MixQ8 {
    #[inline(always)]
    unsafe fn mix<const G: usize>(
        p: *const f32,
        p_stride: usize,
        vals: *const u8,
        stride: usize,
        nk: usize,
        d: usize,
        out: *mut f32,
    ) {
        mix_q8_v::<G>(p, p_stride, vals, stride, nk, d, out)
    }
}

/// [`MixG`] for any number of weight rows, 4 at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn mix_rows<M: MixG>(
    p: *const f32,
    p_stride: usize,
    nq: usize,
    vals: *const u8,
    stride: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    let mut g0 = 0;
    while g0 < nq {
        let (pp, oo) = (p.add(g0 * p_stride), out.add(g0 * d));
        match nq - g0 {
            1 => M::mix::<1>(pp, p_stride, vals, stride, nk, d, oo),
            2 => M::mix::<2>(pp, p_stride, vals, stride, nk, d, oo),
            3 => M::mix::<3>(pp, p_stride, vals, stride, nk, d, oo),
            _ => M::mix::<4>(pp, p_stride, vals, stride, nk, d, oo),
        }
        g0 += 4;
    }
}

/// Float weight rows to f32 (`k` elements), vectorised.
#[inline(always)]
unsafe fn deq_float<V: F32V, W: FloatW>(src: *const u8, dst: *mut f32, k: usize) {
    let l = V::LANES;
    let mut i = 0;
    while i + l <= k {
        let v: V = W::load(src.add(i * W::EB));
        v.store(dst.add(i));
        i += l;
    }
    while i < k {
        *dst.add(i) = W::scalar(src.add(i * W::EB));
        i += 1;
    }
}

/// Legacy 32-element blocks to f32 at the AVX-512 level: [`Leg512`]'s bit-exact weights.
#[inline(always)]
unsafe fn deq_leg512<W: Leg512>(src: *const u8, dst: *mut f32, k: usize) {
    for b in 0..k / 32 {
        let [lo, hi] = W::weights(src.add(b * W::BB));
        _mm512_storeu_ps(dst.add(b * 32), lo);
        _mm512_storeu_ps(dst.add(b * 32 + 16), hi);
    }
}

/// Legacy 32-element blocks to f32 at the AVX2 level: decoded quants scaled as the reference
/// does (`q·d`, or `q·d + m`: a separate multiply and add), hence bit-exact.
#[inline(always)]
unsafe fn deq_legacy8<W: LegacyW>(src: *const u8, dst: *mut f32, k: usize) {
    let mut qb = [0i8; 32];
    for b in 0..k / 32 {
        let (q, d, m) = W::decode(src.add(b * W::BB));
        _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, q);
        let (dv, mv) = (V8::splat(d), V8::splat(m));
        for j in (0..32).step_by(8) {
            let mut wv = V8::mul(V8::from_i8(qb.as_ptr().add(j)), dv);
            if !W::SIGNED {
                wv = V8::add(wv, mv);
            }
            wv.store(dst.add(b * 32 + j));
        }
    }
}

/// Quantized weight rows to f32 with the reference block dequantizer (inlined here, so the
/// compiler vectorises it for the entry point's features): bit-exact by construction.
#[inline(always)]
unsafe fn deq_blocks<const BB: usize, const BS: usize>(
    src: *const u8,
    dst: *mut f32,
    k: usize,
    deq: impl Fn(&[u8; BB], &mut [f32; BS]),
) {
    for b in 0..k / BS {
        deq(
            &*(src.add(b * BB) as *const [u8; BB]),
            &mut *(dst.add(b * BS) as *mut [f32; BS]),
        );
    }
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

macro_rules! level {
    ($m:ident, $features:literal, $V:ty, $D:ty, $leg:ident, $q4k:expr, $q5k:expr, $q6k:expr,
     $gr:literal, $deqleg:ident) => {
        pub(crate) mod $m {
            use super::*;
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn mix(
                p: *const f32,
                p_stride: usize,
                nq: usize,
                vals: *const u8,
                stride: usize,
                nk: usize,
                d: usize,
                out: *mut f32,
            ) {
                mix_rows::<MixFloat<$V, WF32>>(p, p_stride, nq, vals, stride, nk, d, out)
            }
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn mix_f16(
                p: *const f32,
                p_stride: usize,
                nq: usize,
                vals: *const u8,
                stride: usize,
                nk: usize,
                d: usize,
                out: *mut f32,
            ) {
                mix_rows::<MixFloat<$V, WF16>>(p, p_stride, nq, vals, stride, nk, d, out)
            }
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn mix_q8(
                p: *const f32,
                p_stride: usize,
                nq: usize,
                vals: *const u8,
                stride: usize,
                nk: usize,
                d: usize,
                out: *mut f32,
            ) {
                mix_rows::<MixQ8>(p, p_stride, nq, vals, stride, nk, d, out)
            }
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
            entry!(f32, $features, float_rows::<$V, WF32>);
            entry!(f16, $features, float_rows::<$V, WF16>);
            entry!(bf16, $features, float_rows::<$V, WBF16>);
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
            entry!(q4_0_x8, $features, packed_rows::<$D, WQ4_0U>);
            entry!(q4_1_x8, $features, packed_rows::<$D, WQ4_1>);
            entry!(q5_0_x8, $features, packed_rows::<$D, WQ5_0U>);
            entry!(q5_1_x8, $features, packed_rows::<$D, WQ5_1>);
            entry!(q8_0, $features, legacy_rows::<$D, WQ8_0>);
            entry!(q4_k, $features, q45k_rows::<$D, false>);
            entry!(q5_k, $features, q45k_rows::<$D, true>);
            entry!(q6_k, $features, q6k_rows::<$D>);
        }
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
    deq_legacy8
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
    deq_leg512
);

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
}
