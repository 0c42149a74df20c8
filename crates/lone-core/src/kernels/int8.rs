//! Fast mode's many-row path (AVX-512 VNNI): an 8-bit GEMM.
//!
//! The activation rows are quantized once per matmul to 8-bit blocks of 32 with ggml's Q8_0
//! rule (`d = max|x| / 127` stored as f16, `q = round(x / d)`, halfway cases away from zero)
//! and packed in blocks of [`TB`] rows: for every 4 consecutive elements of `k`, the 4 bytes
//! of each of the `TB` rows side by side (`xq[(k/4)][TB][4]`), plus per group of 16 elements
//! each row's scale `dx` and `sx = dx · Σq` (`f32[k/16][TB]`).
//!
//! Each task unpacks a tile of weight rows once into unsigned 8-bit codes and, per group of 16
//! elements, two f32 `dw`, `cw` such that the weight is `dw · code + cw` (Q4_0: code = nibble
//! ⊕ …, see [`unpack`]). A group's contribution to an output is then
//! `dw · dx · Σ code·q + cw · sx`, the integer sum taken by `vpdpbusd` (u8 × i8, 4 products
//! per 32-bit lane): the exact dot product of the dequantized weights with the dequantized
//! 8-bit activations, up to f32 rounding — fast mode's contract.

// Index loops over small constant ranges (accumulators, rows, lanes) say this most plainly.
#![allow(clippy::needless_range_loop)]

use core::arch::x86_64::*;

use super::x86::{for_each_micro, write_acc512, WQ5_1, WQ8_0, XQ5K, XQ6K};
use super::x86::{KExactW, LegacyW, WQ4_0, WQ4_1, WQ5_0, XQ4K};
use crate::tensor::DType;

/// Activation rows per packed block: two 16-lane vectors.
pub(super) const TB: usize = 32;

/// Formats this path unpacks.
pub(super) fn supports(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
    )
}

/// Packed activation block sizes for `k` elements: (bytes of `xq`, f32 of `dx`, of `sx`).
pub(super) fn block_sizes(k: usize) -> (usize, usize) {
    (k * TB, k / 16 * TB)
}

/// Quantize and pack activation rows `rows` (≤ [`TB`], row-major `k` f32 each) into one
/// block: `xq` (k·TB bytes), `dx` and `sx` (k/16·TB f32 each). Rows past `rows` are zero.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C available; `x` holds `rows·k` f32; the outputs hold the sizes
/// above; `k` is a multiple of 32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn pack_x(
    x: *const f32,
    rows: usize,
    k: usize,
    xq: *mut u8,
    dx: *mut f32,
    sx: *mut f32,
) {
    let groups = k / 16;
    let mut q = [0i8; 32];
    for t in 0..TB {
        if t >= rows {
            for kq in 0..k / 4 {
                (xq.add((kq * TB + t) * 4) as *mut u32).write_unaligned(0);
            }
            for g in 0..groups {
                *dx.add(g * TB + t) = 0.0;
                *sx.add(g * TB + t) = 0.0;
            }
            continue;
        }
        let xr = x.add(t * k);
        for b in 0..k / 32 {
            let v0 = _mm512_loadu_ps(xr.add(32 * b));
            let v1 = _mm512_loadu_ps(xr.add(32 * b + 16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let idv = _mm512_set1_ps(id);
            for (h, v) in [v0, v1].into_iter().enumerate() {
                let s = _mm512_mul_ps(v, idv);
                // roundf: truncate |s|, add 1 where the dropped fraction is ≥ 0.5, restore the
                // sign (exact: |s| ≤ 127).
                let a = _mm512_abs_ps(s);
                let t0 = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
                let up =
                    _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_sub_ps(a, t0), _mm512_set1_ps(0.5));
                let r = _mm512_mask_add_ps(t0, up, t0, _mm512_set1_ps(1.0));
                let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(s, _mm512_setzero_ps());
                let r = _mm512_mask_sub_ps(r, neg, _mm512_setzero_ps(), r);
                let qi = _mm512_cvtps_epi32(r);
                _mm_storeu_si128(
                    q.as_mut_ptr().add(16 * h) as *mut __m128i,
                    _mm512_cvtepi32_epi8(qi),
                );
            }
            // The stored (f16) scale is what the dot products use, as ggml's Q8_0.
            let dq = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
                _mm_set_ss(d),
            )));
            for h in 0..2 {
                let sum: i32 = q[16 * h..16 * h + 16].iter().map(|&v| i32::from(v)).sum();
                let g = 2 * b + h;
                *dx.add(g * TB + t) = dq;
                *sx.add(g * TB + t) = dq * sum as f32;
            }
            for j in 0..8 {
                let kq = 8 * b + j;
                let w = (q.as_ptr().add(4 * j) as *const u32).read_unaligned();
                (xq.add((kq * TB + t) * 4) as *mut u32).write_unaligned(w);
            }
        }
    }
}

/// Unpack one weight row of `k` elements (whole blocks of `dtype`) into codes (`k` bytes) and
/// per group of 16 `dw`, `cw` (k/16 f32 each): weight = `dw · code + cw`.
///
/// # Safety
/// AVX-512 level features available; `src` holds the row; outputs hold the sizes above;
/// `dtype` is one of [`supports`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn unpack(
    dtype: DType,
    src: *const u8,
    k: usize,
    codes: *mut u8,
    dw: *mut f32,
    cw: *mut f32,
) {
    match dtype {
        DType::Q4_0 => unpack_legacy::<WQ4_0>(src, k, codes, dw, cw),
        DType::Q4_1 => unpack_legacy::<WQ4_1>(src, k, codes, dw, cw),
        DType::Q5_0 => unpack_legacy::<WQ5_0>(src, k, codes, dw, cw),
        DType::Q5_1 => unpack_legacy::<WQ5_1>(src, k, codes, dw, cw),
        DType::Q8_0 => unpack_legacy::<WQ8_0>(src, k, codes, dw, cw),
        DType::Q4K => unpack_k::<XQ4K>(src, k, codes, dw, cw),
        DType::Q5K => unpack_k::<XQ5K>(src, k, codes, dw, cw),
        DType::Q6K => unpack_k::<XQ6K>(src, k, codes, dw, cw),
        _ => unreachable!("checked by supports()"),
    }
}

/// Signed quants `q` become codes `q + 128` with `cw = -128·dw`; unsigned ones stay, with
/// the block's min as `cw`.
#[inline(always)]
unsafe fn unpack_legacy<W: LegacyW>(
    src: *const u8,
    k: usize,
    codes: *mut u8,
    dw: *mut f32,
    cw: *mut f32,
) {
    for b in 0..k / 32 {
        let (q, d, m) = W::decode(src.add(b * W::BB));
        let (c, off) = if W::SIGNED {
            (_mm256_xor_si256(q, _mm256_set1_epi8(-128)), -128.0 * d)
        } else {
            (q, m)
        };
        _mm256_storeu_si256(codes.add(32 * b) as *mut __m256i, c);
        for g in 2 * b..2 * b + 2 {
            *dw.add(g) = d;
            *cw.add(g) = off;
        }
    }
}

/// K-quants: with a min, weight = ds·q − ms (codes = q); without (Q6_K), q is signed and
/// becomes `q + 128` with `cw = −128·ds`.
#[inline(always)]
unsafe fn unpack_k<W: KExactW>(
    src: *const u8,
    k: usize,
    codes: *mut u8,
    dw: *mut f32,
    cw: *mut f32,
) {
    let mut q = [0i8; 256];
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    for b in 0..k / 256 {
        W::decode(src.add(b * W::BB), &mut q, &mut ds, &mut ms);
        for j in 0..8 {
            let v = _mm256_loadu_si256(q.as_ptr().add(32 * j) as *const __m256i);
            let c = if W::HAS_MIN {
                v
            } else {
                _mm256_xor_si256(v, _mm256_set1_epi8(-128))
            };
            _mm256_storeu_si256(codes.add(256 * b + 32 * j) as *mut __m256i, c);
        }
        for g in 0..16 {
            let s = g * 16 / W::GROUP;
            let (d, c) = if W::HAS_MIN {
                (ds[s], -ms[s])
            } else {
                (ds[s], -128.0 * ds[s])
            };
            *dw.add(16 * b + g) = d;
            *cw.add(16 * b + g) = c;
        }
    }
}

/// An unpacked weight tile and a packed activation block set, for [`gemm`].
pub(super) struct IGemmArgs {
    /// `rows` rows of `k` codes, `c_stride` bytes apart.
    pub codes: *const u8,
    pub c_stride: usize,
    /// `rows` rows of `k/16` f32, `g_stride` f32 apart.
    pub dw: *const f32,
    pub cw: *const f32,
    pub g_stride: usize,
    pub rows: usize,
    /// Packed activation blocks ([`block_sizes`] apart).
    pub xq: *const u8,
    pub dx: *const f32,
    pub sx: *const f32,
    pub n: usize,
    pub k: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// Weight rows per micro-kernel.
const R: usize = 4;

#[inline(always)]
unsafe fn micro<const NV: usize>(g: &IGemmArgs, r0: usize, t0: usize) {
    let blk = t0 / TB;
    let (xb, fb) = block_sizes(g.k);
    let xq = g.xq.add(blk * xb);
    let dx = g.dx.add(blk * fb);
    let sx = g.sx.add(blk * fb);
    let rr: [usize; R] = core::array::from_fn(|r| (r0 + r).min(g.rows - 1));
    let codes: [*const u8; R] = core::array::from_fn(|r| g.codes.add(rr[r] * g.c_stride));
    let dw: [*const f32; R] = core::array::from_fn(|r| g.dw.add(rr[r] * g.g_stride));
    let cw: [*const f32; R] = core::array::from_fn(|r| g.cw.add(rr[r] * g.g_stride));
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for grp in 0..g.k / 16 {
        let mut iacc = [[_mm512_setzero_si512(); NV]; R];
        for j in 0..4 {
            let kq = 4 * grp + j;
            let xv: [__m512i; NV] = core::array::from_fn(|v| {
                _mm512_loadu_si512(xq.add(kq * TB * 4 + 64 * v) as *const _)
            });
            for r in 0..R {
                let b = _mm512_set1_epi32((codes[r].add(4 * kq) as *const i32).read_unaligned());
                for v in 0..NV {
                    iacc[r][v] = _mm512_dpbusd_epi32(iacc[r][v], b, xv[v]);
                }
            }
        }
        let dxv: [__m512; NV] =
            core::array::from_fn(|v| _mm512_loadu_ps(dx.add(grp * TB + 16 * v)));
        let sxv: [__m512; NV] =
            core::array::from_fn(|v| _mm512_loadu_ps(sx.add(grp * TB + 16 * v)));
        for r in 0..R {
            let d = _mm512_set1_ps(*dw[r].add(grp));
            let c = _mm512_set1_ps(*cw[r].add(grp));
            for v in 0..NV {
                let scale = _mm512_mul_ps(d, dxv[v]);
                acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][v]), scale, acc[r][v]);
                acc[r][v] = _mm512_fmadd_ps(c, sxv[v], acc[r][v]);
            }
        }
    }
    write_acc512(
        &acc,
        R.min(g.rows - r0),
        (NV * 16).min(g.n - t0),
        g.out.add(t0 * g.out_stride + r0),
        g.out_stride,
    );
}

/// Every (row, activation row) pair of an [`IGemmArgs`].
///
/// # Safety
/// AVX-512 level features available; every pointer valid for what it describes; `rows ≥ 1`,
/// `n ≥ 1`; the outputs written belong to the caller alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemm(g: &IGemmArgs) {
    for_each_micro(g.n, g.rows, R, TB / 2, |r0, t0, one| {
        if one {
            micro::<1>(g, r0, t0);
        } else {
            micro::<2>(g, r0, t0);
        }
    });
}
