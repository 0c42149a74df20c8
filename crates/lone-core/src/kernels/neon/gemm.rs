//! The exact many-row path on NEON: `V4` (the shared layer's [`F32V`] over `float32x4_t`),
//! the f32 GEMM tile kernel with `fmla` by element, and the bit-exact row dequantizers that
//! feed it (a tile of weight rows is dequantized once, then multiplied by every block of
//! activation rows).

use super::*;
use crate::kernels::simd::{for_each_micro, write_tile, F32V};
use crate::kernels::GemmArgs;

#[derive(Clone, Copy)]
pub(in crate::kernels) struct V4(float32x4_t);

/// Activation rows per packed block (two vectors of 4), the GEMM's `Gemm::tb`.
pub(in crate::kernels) const TB: usize = 8;

impl F32V for V4 {
    const LANES: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> Self {
        V4(vdupq_n_f32(0.0))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        V4(vld1q_f32(p))
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        V4(vfmaq_f32(c.0, a.0, b.0))
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        V4(vdupq_n_f32(v))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        vst1q_f32(p, self.0)
    }
    #[inline(always)]
    unsafe fn transpose_block(src: *const f32, stride: usize, valid: usize, dst: *mut f32) {
        let r: [float32x4_t; 4] =
            core::array::from_fn(|j| vld1q_f32(src.add(j.min(valid - 1) * stride)));
        // [r0c0 r1c0 r0c2 r1c2], [r0c1 r1c1 r0c3 r1c3], likewise rows 2, 3.
        let (a0, a1) = (vtrn1q_f32(r[0], r[1]), vtrn2q_f32(r[0], r[1]));
        let (b0, b1) = (vtrn1q_f32(r[2], r[3]), vtrn2q_f32(r[2], r[3]));
        let c = |x: float32x4_t, y: float32x4_t, hi: bool| {
            let (x, y) = (vreinterpretq_f64_f32(x), vreinterpretq_f64_f32(y));
            vreinterpretq_f32_f64(if hi {
                vtrn2q_f64(x, y)
            } else {
                vtrn1q_f64(x, y)
            })
        };
        vst1q_f32(dst, c(a0, b0, false));
        vst1q_f32(dst.add(4), c(a1, b1, false));
        vst1q_f32(dst.add(8), c(a0, b0, true));
        vst1q_f32(dst.add(12), c(a1, b1, true));
    }
}

/// `R` weight rows × the `4·NV` activation rows of one packed block (4 per vector), over the
/// whole of `k`: four weights of each row are loaded as one vector and multiplied in by
/// element (`fmla v, x, w.s[c]`), each output one FMA chain over `i = 0..k` in order — the
/// shared narrow kernel's ([`crate::kernels::simd::gemm_narrow`]), so a row's result does not
/// depend on how many rows came with it. Rows past `g.rows` reuse the last row.
#[inline(always)]
unsafe fn micro<const R: usize, const NV: usize>(g: &GemmArgs, r0: usize, t0: usize) {
    let xp = g.x.add(t0 * g.k);
    let tb = TB;
    let w: [*const f32; R] =
        core::array::from_fn(|r| g.w.add((r0 + r).min(g.rows - 1) * g.w_stride));
    let mut acc = [[vdupq_n_f32(0.0); NV]; R];
    let mut i = 0;
    while i + 4 <= g.k {
        let wv: [float32x4_t; R] = core::array::from_fn(|r| vld1q_f32(w[r].add(i)));
        macro_rules! step {
            ($c:literal) => {
                let xv: [float32x4_t; NV] =
                    core::array::from_fn(|v| vld1q_f32(xp.add((i + $c) * tb + 4 * v)));
                for r in 0..R {
                    for v in 0..NV {
                        acc[r][v] = vfmaq_laneq_f32::<$c>(acc[r][v], xv[v], wv[r]);
                    }
                }
            };
        }
        step!(0);
        step!(1);
        step!(2);
        step!(3);
        i += 4;
    }
    while i < g.k {
        let xv: [float32x4_t; NV] = core::array::from_fn(|v| vld1q_f32(xp.add(i * tb + 4 * v)));
        for r in 0..R {
            let b = vdupq_n_f32(*w[r].add(i));
            for v in 0..NV {
                acc[r][v] = vfmaq_f32(acc[r][v], xv[v], b);
            }
        }
        i += 1;
    }
    let mut tmp = [[0.0f32; 32]; R];
    for r in 0..R {
        for v in 0..NV {
            vst1q_f32(tmp[r].as_mut_ptr().add(4 * v), acc[r][v]);
        }
    }
    write_tile(
        &tmp,
        R.min(g.rows - r0),
        (4 * NV).min(g.n - t0),
        g.out.add(t0 * g.out_stride + r0),
        g.out_stride,
    );
}

/// Weight rows by 8 over each block of 8 packed activation rows (16 accumulators).
pub(in crate::kernels) unsafe fn gemm(g: &GemmArgs) {
    for_each_micro(g.n, g.rows, 8, 4, |r0, t0, one| {
        if one {
            micro::<8, 1>(g, r0, t0)
        } else {
            micro::<8, 2>(g, r0, t0)
        }
    });
}

/// The shared narrow kernel (`g.n` ≤ 8, plain activation rows) over `V4`.
pub(in crate::kernels) unsafe fn gemm_narrow(g: &GemmArgs) {
    crate::kernels::simd::gemm_narrow::<V4>(g)
}

// ------------------------------------------------------------------ row dequantizers

/// `k` float elements at `src` widened into `dst`.
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_float<W: FloatW>(src: *const u8, dst: *mut f32, k: usize) {
    let mut i = 0;
    while i + 4 <= k {
        vst1q_f32(dst.add(i), W::load4(src.add(i * W::SIZE)));
        i += 4;
    }
    while i < k {
        *dst.add(i) = W::one(src.add(i * W::SIZE));
        i += 1;
    }
}

/// A 32-element format's row, bit for bit the reference's `q·d` (`q·d + m`).
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_legacy<W: LegacyW>(src: *const u8, dst: *mut f32, k: usize) {
    for b in 0..k / 32 {
        let blk = src.add(b * W::BB);
        let q = W::codes(blk);
        let dm = W::scales(blk);
        let (dv, mv) = (vdupq_lane_f32::<0>(dm), vdupq_lane_f32::<1>(dm));
        for h in 0..2 {
            for (u, v) in widen(q[h]).into_iter().enumerate() {
                let w = if W::MIN {
                    vaddq_f32(vmulq_f32(v, dv), mv)
                } else {
                    vmulq_f32(v, dv)
                };
                vst1q_f32(dst.add(32 * b + 16 * h + 4 * u), w);
            }
        }
    }
}

/// A K-quant's row, bit for bit the reference's `dl·q - ml` (`dl·q`).
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_k<K: KExact>(src: *const u8, dst: *mut f32, k: usize) {
    let mut q = [vdupq_n_s8(0); 16];
    let (mut dl, mut ml) = ([0f32; 16], [0f32; 16]);
    for b in 0..k / 256 {
        K::decode(src.add(b * K::BB), &mut q, &mut dl, &mut ml);
        for g in 0..16 {
            let (dv, mv) = (vdupq_n_f32(dl[g]), vdupq_n_f32(ml[g]));
            for (u, v) in widen(q[g]).into_iter().enumerate() {
                let w = if K::MIN {
                    vsubq_f32(vmulq_f32(v, dv), mv)
                } else {
                    vmulq_f32(v, dv)
                };
                vst1q_f32(dst.add(256 * b + 16 * g + 4 * u), w);
            }
        }
    }
}
