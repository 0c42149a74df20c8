//! The ISA-neutral SIMD layer: f32 vectors ([`F32V`], instantiated by x86's `V8`/`V16` and
//! NEON's `V4`) and the f32 GEMM tile kernels over them (exact prompts: many activation rows
//! per dequantized weight tile).

#![allow(clippy::needless_range_loop)]

use super::GemmArgs;

#[repr(C, align(64))]
pub(in crate::kernels) struct Aligned<const N: usize>(pub(in crate::kernels) [f32; N]);

pub(in crate::kernels) trait F32V: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// `a·b + c`, one rounding.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn splat(v: f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// Loads `LANES` rows of `LANES` f32 (`stride` apart; rows from `valid` on repeat the
    /// last valid one) and stores them transposed: `dst[c·LANES + r]` = row `r`, column `c`.
    unsafe fn transpose_block(src: *const f32, stride: usize, valid: usize, dst: *mut f32);
}

/// Writes a GEMM micro-kernel's results, `tmp[r][t]` = output of weight row `r` for activation
/// row `t`, to `out[t·stride + r]` for `r < rows`, `t < tokens` (the valid part of the tile).
///
/// # Safety
/// `out` is valid for those writes.
#[inline(always)]
pub(in crate::kernels) unsafe fn write_tile<const R: usize>(
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

/// Most weight-row groups of `LANES` rows one pass of [`gemm_narrow_n`] keeps accumulators
/// for (`G`: 3 for up to 4 activation rows; fewer for more, within the registers).
pub(in crate::kernels) const NARROW_GROUPS: usize = 3;

/// The f32 GEMM's outputs for `NX ≤ 8` activation rows, vectorised over weight rows instead
/// of activation rows (which would leave most lanes of a block empty): each `LANES × LANES`
/// block of weights is transposed in registers, then every column is one FMA per group and
/// activation row. `g.x` holds plain activation rows (`k` apart), not packed blocks. Each
/// output is the same FMA chain over `i = 0..k` in order as [`gemm_micro`]'s
/// (`acc = fma(w[r, i], x[t, i], acc)`), so the results are bit for bit the GEMM's: a row's
/// output does not depend on how many rows came with it.
#[inline(always)]
pub(in crate::kernels) unsafe fn gemm_narrow_n<V: F32V, const G: usize, const NX: usize>(
    g: &GemmArgs,
) {
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
pub(in crate::kernels) unsafe fn gemm_narrow<V: F32V>(g: &GemmArgs) {
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
pub(in crate::kernels) fn for_each_micro(
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
