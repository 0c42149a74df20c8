//! Float weights (F32, F16, BF16) × f32 activations.

use super::*;

/// A float weight format: how to widen 4 stored elements, and one.
pub(in crate::kernels) trait FloatW {
    /// Bytes per element.
    const SIZE: usize;
    unsafe fn load4(p: *const u8) -> float32x4_t;
    unsafe fn one(p: *const u8) -> f32;
}

pub(in crate::kernels) struct WF32;
pub(in crate::kernels) struct WF16;
pub(in crate::kernels) struct WBF16;

impl FloatW for WF32 {
    const SIZE: usize = 4;
    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        vld1q_f32(p as *const f32)
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        (p as *const f32).read_unaligned()
    }
}

impl FloatW for WF16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        cvt_f16x4(vld1_u16(p as *const u16))
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        f16_at(p)
    }
}

impl FloatW for WBF16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p as *const u16)))
    }
    #[inline(always)]
    unsafe fn one(p: *const u8) -> f32 {
        f32::from_bits(u32::from((p as *const u16).read_unaligned()) << 16)
    }
}

/// `out[t, r] = Σ_i w[r, i] · x[t, i]`, any `k`: 16 elements per step in 4 accumulator chains
/// per activation row, then 4, then one at a time.
#[inline(always)]
pub(in crate::kernels) unsafe fn float_rows_n<W: FloatW, const NX: usize>(a: &MatArgs) {
    let k = a.k;
    let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [[vdupq_n_f32(0.0); 4]; NX];
        let mut i = 0;
        while i + 16 <= k {
            for u in 0..4 {
                let wv = W::load4(w.add((i + 4 * u) * W::SIZE));
                for t in 0..NX {
                    acc[t][u] = vfmaq_f32(acc[t][u], wv, vld1q_f32(xs[t].add(i + 4 * u)));
                }
            }
            i += 16;
        }
        while i + 4 <= k {
            let wv = W::load4(w.add(i * W::SIZE));
            for t in 0..NX {
                acc[t][0] = vfmaq_f32(acc[t][0], wv, vld1q_f32(xs[t].add(i)));
            }
            i += 4;
        }
        for t in 0..NX {
            let v = vaddq_f32(
                vaddq_f32(acc[t][0], acc[t][1]),
                vaddq_f32(acc[t][2], acc[t][3]),
            );
            let mut s = vaddvq_f32(v);
            for j in i..k {
                s += W::one(w.add(j * W::SIZE)) * *xs[t].add(j);
            }
            *a.out.add(t * a.out_stride + r) = s;
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn float_rows<W: FloatW>(a: &MatArgs) {
    by_nx!(a, float_rows_n, W)
}
