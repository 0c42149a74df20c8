//! x86's f32 vectors (`V8`, `V16`: the shared layer's [`F32V`], and [`F32X`] for x86's
//! float and exact kernels), small load helpers, and the f32 GEMM micro-kernel over them.

#![allow(clippy::needless_range_loop)]

use super::*;

/// What x86's float and exact kernels ask of a vector beyond [`F32V`].
pub(in crate::kernels) trait F32X: F32V {
    unsafe fn load_f16(p: *const u8) -> Self;
    unsafe fn load_bf16(p: *const u8) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn sub(a: Self, b: Self) -> Self;
    /// `LANES` signed bytes at `p`, converted to f32.
    unsafe fn from_i8(p: *const i8) -> Self;
    unsafe fn hsum(self) -> f32;
}

#[derive(Clone, Copy)]
pub(in crate::kernels) struct V8(pub(in crate::kernels) __m256);
#[derive(Clone, Copy)]
pub(in crate::kernels) struct V16(pub(in crate::kernels) __m512);

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
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        V8(_mm256_fmadd_ps(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        V8(_mm256_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn transpose_block(src: *const f32, stride: usize, valid: usize, dst: *mut f32) {
        let r: [__m256; 8] =
            core::array::from_fn(|j| _mm256_loadu_ps(src.add(j.min(valid - 1) * stride)));
        for (c, v) in transpose8(r).into_iter().enumerate() {
            _mm256_storeu_ps(dst.add(c * 8), v);
        }
    }
}

/// The 8×8 transpose of `r` (row `j` = `r[j]`) in registers: result `c` holds column `c`.
#[inline(always)]
pub(in crate::kernels) unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
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
    core::array::from_fn(|c| {
        // tt[j] holds columns j and j + 4 of rows 0..4 (its two halves), tt[4 + j] of
        // rows 4..8.
        let (a, b) = (tt[c % 4], tt[4 + c % 4]);
        if c < 4 {
            _mm256_permute2f128_ps::<0x20>(a, b)
        } else {
            _mm256_permute2f128_ps::<0x31>(a, b)
        }
    })
}

impl F32X for V8 {
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
    unsafe fn from_i8(p: *const i8) -> Self {
        V8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
            p as *const __m128i,
        ))))
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        hsum256(self.0)
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
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        V16(_mm512_fmadd_ps(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        V16(_mm512_set1_ps(v))
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

impl F32X for V16 {
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
}

#[inline(always)]
pub(in crate::kernels) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// IEEE half at `p` (unaligned) → f32, with F16C.
#[inline(always)]
pub(in crate::kernels) unsafe fn f16_at(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline(always)]
pub(in crate::kernels) unsafe fn f32_at(p: *const u8) -> f32 {
    f32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

/// Writes an AVX-512 micro-kernel's accumulators (`acc[r][v]` lane `l` = weight row `r`,
/// activation row `16v + l`) with [`write_tile`]: the first `rows` × `tokens` of them to
/// `out[t·stride + r]`.
///
/// # Safety
/// AVX-512F available; `out` is valid for those writes.
#[inline(always)]
pub(in crate::kernels) unsafe fn write_acc512<const R: usize, const NV: usize>(
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

/// [`write_acc512`] for a 256-bit micro-kernel (`acc[r][v]` lane `l` = weight row `r`,
/// activation row `8v + l`).
///
/// # Safety
/// AVX available; `out` is valid for those writes.
#[inline(always)]
pub(in crate::kernels) unsafe fn write_acc256<const R: usize, const NV: usize>(
    acc: &[[__m256; NV]; R],
    rows: usize,
    tokens: usize,
    out: *mut f32,
    stride: usize,
) {
    let mut tmp = [[0.0f32; 32]; R];
    for r in 0..R {
        for v in 0..NV {
            _mm256_storeu_ps(tmp[r].as_mut_ptr().add(8 * v), acc[r][v]);
        }
    }
    write_tile(&tmp, rows, tokens, out, stride);
}

/// `R` weight rows × `NV·LANES` rows of one block of `2·LANES` packed activation rows over the
/// whole of `k`: each step loads `NV` vectors of the block's activations (one `k` index) and
/// broadcasts one weight per row, `NV·R` FMAs into `NV·R` accumulators that end up holding
/// the outputs themselves (no horizontal sums). Rows past `g.rows` reuse the last row (clamped
/// pointers: every load is in bounds) and, like the block's padding rows, are not written.
#[inline(always)]
pub(in crate::kernels) unsafe fn gemm_micro<V: F32X, const R: usize, const NV: usize>(
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

/// Every (row, activation row) pair of a [`GemmArgs`]: for each block of `2·LANES` packed
/// activation rows (`k·2·LANES` f32, in L2), every group of `R` weight rows.
#[inline(always)]
pub(in crate::kernels) unsafe fn gemm_tile<V: F32X, const R: usize>(g: &GemmArgs) {
    for_each_micro(g.n, g.rows, R, V::LANES, |r0, t0, one| {
        let xp = g.x.add(t0 * g.k);
        if one {
            gemm_micro::<V, R, 1>(g, r0, t0, xp);
        } else {
            gemm_micro::<V, R, 2>(g, r0, t0, xp);
        }
    });
}
