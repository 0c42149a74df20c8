//! Vector primitives: exp, transposes, activation packing, attention mixes, dequantizers.

#![allow(clippy::needless_range_loop)]

use super::*;
use crate::kernels::vecops::EXP_POLY;

/// e^x for 16 lanes: x = n·ln2 + r (|r| ≤ ln2/2, two-part ln2), e^r by its degree-7 Taylor
/// polynomial (truncation error < 1e-8 relative), times 2^n by `vscalefps`. Inputs are clamped
/// to [-87.3, 88.7] (e^-87.3 ≈ 1.2e-38: what underflows becomes that, not 0).
#[inline(always)]
pub(in crate::kernels) unsafe fn exp16(x: __m512) -> __m512 {
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
pub(in crate::kernels) unsafe fn exp8(x: __m256) -> __m256 {
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
pub(in crate::kernels) const T16_IDX: [[[i32; 16]; 2]; 4] = {
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
pub(in crate::kernels) unsafe fn t16_stage<const B: usize, const M: usize>(r: &mut [__m512; 16]) {
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
pub(in crate::kernels) unsafe fn transpose16(r: &mut [__m512; 16]) {
    t16_stage::<0, 1>(r);
    t16_stage::<1, 2>(r);
    t16_stage::<2, 4>(r);
    t16_stage::<3, 8>(r);
}

/// Packs `rows` (≤ 32) activation rows of `k` f32 into one GEMM block of 32 rows
/// (`dst[i·32 + t] = x[t·k + i]`, zero for `t ≥ rows`): 16×16 register transposes.
#[inline(always)]
pub(in crate::kernels) unsafe fn pack32_v16(x: *const f32, k: usize, rows: usize, dst: *mut f32) {
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
impl<V: F32X, W: FloatW> MixG for MixFloat<V, W> {
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
        let l = V::LANES;
        let mut c = 0;
        while c + 4 * l <= d {
            let mut acc = [[V::zero(); 4]; G];
            for j in 0..nk {
                let v: [V; 4] = core::array::from_fn(|u| {
                    W::load::<V>(vals.add((j * stride + c + u * l) * W::EB))
                });
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
}

/// [`MixFloat`] for Q8_0 value rows (`stride` elements apart, `d` a multiple of 32): per block,
/// the weight times the block's scale, FMA'd with the widened quants; up to 4 weight rows
/// share each value block.
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
}

/// Float value rows loaded as `W`, `V` lanes at a time.
pub(in crate::kernels) struct MixFloat<V, W>(core::marker::PhantomData<(V, W)>);
/// Q8_0 value rows.
pub(in crate::kernels) struct MixQ8;

/// Float weight rows to f32 (`k` elements), vectorised.
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_float<V: F32X, W: FloatW>(
    src: *const u8,
    dst: *mut f32,
    k: usize,
) {
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
pub(in crate::kernels) unsafe fn deq_leg512<W: Leg512>(src: *const u8, dst: *mut f32, k: usize) {
    for b in 0..k / 32 {
        let [lo, hi] = W::weights(src.add(b * W::BB));
        _mm512_storeu_ps(dst.add(b * 32), lo);
        _mm512_storeu_ps(dst.add(b * 32 + 16), hi);
    }
}

/// Legacy 32-element blocks to f32 at the AVX2 level: decoded quants scaled as the reference
/// does (`q·d`, or `q·d + m`: a separate multiply and add), hence bit-exact.
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_legacy8<W: LegacyW>(src: *const u8, dst: *mut f32, k: usize) {
    let mut qb = [0i8; 32];
    for b in 0..k / 32 {
        let (q, d0, d1, m) = W::decode_split(src, b);
        _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, q);
        let (dv0, dv1, mv) = (V8::splat(d0), V8::splat(d1), V8::splat(m));
        for j in (0..32).step_by(8) {
            let dv = if j < 16 { dv0 } else { dv1 };
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
pub(in crate::kernels) unsafe fn deq_blocks<const BB: usize, const BS: usize>(
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
