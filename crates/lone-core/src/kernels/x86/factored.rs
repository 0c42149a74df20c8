//! AVX2 exact kernels with each block's scale (and offset) factored out of its sum.

#![allow(clippy::needless_range_loop)]

use super::*;

// The AVX2 exact matrix-vector kernels with the scales taken out of the block sums: for a
// block of weights `d·q + o` (o: the format's min, or its zero point `-8d`/`-16d` as a
// multiple of d), `Σ w·x = d·Σ q·x + o·Σ x`. The quants are widened straight from the weight
// bytes to i32 lanes and converted to f32 (small integers: exact), so each 8 weights cost one
// convert and one FMA against the f32 activations, and each block one more FMA by its scale.
// The weights are still exactly the dequantized values; only the order of the f32 rounding
// differs from the reference's `Σ (d·q + o)·x`. `Σ x` per 32 activations comes with the
// activation rows ([`super::Act::F32Sums`]): row `t` is `k` f32 then `k/32` block sums.

/// A 32-element legacy block for the factored kernels.
pub(in crate::kernels) trait FacW {
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
pub(in crate::kernels) unsafe fn nib_lanes(p: *const u8) -> [__m256i; 4] {
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
pub(in crate::kernels) unsafe fn decoded_lanes<W: LegacyW>(p: *const u8) -> [__m256i; 4] {
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
pub(in crate::kernels) unsafe fn qdot<const V: usize>(qf: &[__m256; V], x: *const f32) -> __m256 {
    let mut s = _mm256_mul_ps(qf[0], _mm256_loadu_ps(x));
    for v in 1..V {
        s = _mm256_fmadd_ps(qf[v], _mm256_loadu_ps(x.add(8 * v)), s);
    }
    s
}

/// One block `b` of a weight row at `w` against the activation rows `xs` (`k` f32 each, then
/// the block sums): `acc[t] += d·Σ q·x`, `off[t] += o·Σ x`.
#[inline(always)]
pub(in crate::kernels) unsafe fn fac_block<W: FacW, const NX: usize>(
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
pub(in crate::kernels) unsafe fn fac_legacy_rows_n<W: FacW, const NX: usize>(a: &MatArgs) {
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
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(b * W::BB + PREFETCH) as *const i8);
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
pub(in crate::kernels) unsafe fn fac_legacy<W: FacW>(a: &MatArgs) {
    by_nx!(a, fac_legacy_rows_n, W)
}

/// Q4_K / Q5_K, factored: per sub-block of 32, `d·sc·Σ q·x − dmin·m·Σ x` (the reference's
/// `d1·q − m1` weights); the eight mins of a super-block meet its eight activation sums in one
/// FMA. Chunk `i` of `qs` holds sub-blocks 2i (low nibbles) and 2i+1 (high nibbles); Q5_K's
/// bit 4 of element l of sub-block s is bit s of `qh[l]`.
#[inline(always)]
pub(in crate::kernels) unsafe fn fac_k45_rows_n<const FIVE: bool, const NX: usize>(a: &MatArgs) {
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
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 64 * l) as *const i8);
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
pub(in crate::kernels) unsafe fn fac_k45<const FIVE: bool>(a: &MatArgs) {
    by_nx!(a, fac_k45_rows_n, FIVE)
}

/// Q6_K, factored: the super-block's signed quants decoded to bytes once ([`XQ6K`]), then per
/// group of 16, `(d·sc)·Σ q·x` (the reference's `d·sc·q` weights).
#[inline(always)]
pub(in crate::kernels) unsafe fn fac_q6k_rows_n<const NX: usize>(a: &MatArgs) {
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
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 64 * l) as *const i8);
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
pub(in crate::kernels) unsafe fn fac_q6k(a: &MatArgs) {
    by_nx!(a, fac_q6k_rows_n)
}
