//! Vector primitives on NEON: `exp` (softmax) and attention's weighted sums of value rows.

use super::*;
use crate::kernels::vecops::{mix_entry, quantize_q8_by, MixG, Q8Blocks, EXP_POLY};

/// `e^x` on 4 lanes: x86's `exp8` on NEON — the same range reduction (x = n·ln2 + r, two-part
/// ln2), the same degree-7 polynomial, `2^n` from exponent bits in two halves.
#[inline(always)]
pub(in crate::kernels) unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    let x = vminq_f32(
        vmaxq_f32(x, vdupq_n_f32(-87.336_54)),
        vdupq_n_f32(88.722_83),
    );
    let n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(core::f32::consts::LOG2_E)));
    let r = vfmsq_f32(x, n, vdupq_n_f32(0.693_359_4));
    let r = vfmsq_f32(r, n, vdupq_n_f32(-2.121_944_4e-4));
    let mut p = vdupq_n_f32(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let ni = vcvtq_s32_f32(n);
    let n1 = vshrq_n_s32::<1>(ni);
    let n2 = vsubq_s32(ni, n1);
    let pow2 =
        |k: int32x4_t| vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(k, vdupq_n_s32(127))));
    vmulq_f32(vmulq_f32(p, pow2(n1)), pow2(n2))
}

/// `x[i] = e^x[i]` for `n` f32.
pub(in crate::kernels) unsafe fn exp(x: *mut f32, n: usize) {
    let mut i = 0;
    while i + 4 <= n {
        vst1q_f32(x.add(i), exp4(vld1q_f32(x.add(i))));
        i += 4;
    }
    if i < n {
        let mut t = [0f32; 4];
        core::ptr::copy_nonoverlapping(x.add(i), t.as_mut_ptr(), n - i);
        vst1q_f32(t.as_mut_ptr(), exp4(vld1q_f32(t.as_ptr())));
        core::ptr::copy_nonoverlapping(t.as_ptr(), x.add(i), n - i);
    }
}

/// `out[g·d + i] += Σ_j p[g·p_stride + j] · vals[j·stride + i]` for `g < G`: each value row
/// is loaded once for all `G` weight rows; 16 columns at a time in registers over all `j`.
impl<W: FloatW> MixG for Mix<W> {
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
        let mut c = 0;
        while c + 16 <= d {
            let mut acc = [[vdupq_n_f32(0.0); 4]; G];
            for j in 0..nk {
                let v: [float32x4_t; 4] = core::array::from_fn(|u| {
                    W::load4(vals.add((j * stride + c + 4 * u) * W::SIZE))
                });
                for g in 0..G {
                    let pg = vdupq_n_f32(*p.add(g * p_stride + j));
                    for u in 0..4 {
                        acc[g][u] = vfmaq_f32(acc[g][u], pg, v[u]);
                    }
                }
            }
            for g in 0..G {
                for u in 0..4 {
                    let o = out.add(g * d + c + 4 * u);
                    vst1q_f32(o, vaddq_f32(vld1q_f32(o), acc[g][u]));
                }
            }
            c += 16;
        }
        for i in c..d {
            for g in 0..G {
                let mut a = 0.0f32;
                for j in 0..nk {
                    a += *p.add(g * p_stride + j) * W::one(vals.add((j * stride + i) * W::SIZE));
                }
                *out.add(g * d + i) += a;
            }
        }
    }
}

/// [`Mix`] for Q8_0 value rows (`stride` elements apart, `d` a multiple of 32): per block,
/// the weight times the block's scale, FMA'd with the widened quants.
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
            let mut acc = [[vdupq_n_f32(0.0); 8]; G];
            for j in 0..nk {
                let blk = vals.add(j * rs + c * 34);
                let dq = f16_at(blk);
                let lo = widen(vld1q_s8(blk.add(2) as *const i8));
                let hi = widen(vld1q_s8(blk.add(18) as *const i8));
                for g in 0..G {
                    let w = *p.add(g * p_stride + j) * dq;
                    for u in 0..4 {
                        acc[g][u] = vfmaq_n_f32(acc[g][u], lo[u], w);
                        acc[g][4 + u] = vfmaq_n_f32(acc[g][4 + u], hi[u], w);
                    }
                }
            }
            for g in 0..G {
                for u in 0..8 {
                    let o = out.add(g * d + 32 * c + 4 * u);
                    vst1q_f32(o, vaddq_f32(vld1q_f32(o), acc[g][u]));
                }
            }
        }
    }
}

/// Float value rows as a [`MixG`] (below).
struct Mix<W>(core::marker::PhantomData<W>);
/// Q8_0 value rows as a [`MixG`] (below).
struct MixQ8;

mix_entry!(mix, Mix<WF32>);
mix_entry!(mix_f16, Mix<WF16>);
mix_entry!(mix_q8, MixQ8);

/// NEON's blocks for the 8-bit activation quantizers ([`quantize_q8_by`]): `fcvtas` is C's
/// `roundf` (half away from zero) and `fcvtns` rounds to nearest even, the reference's two
/// rules, exactly.
pub(in crate::kernels) struct NeonQ8;

/// 16 i32 lanes (each in -128..=127) as 16 bytes.
#[inline(always)]
unsafe fn narrow16(q: &[int32x4_t]) -> int8x16_t {
    let lo = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
    let hi = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
    vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
}

impl Q8Blocks for NeonQ8 {
    #[inline(always)]
    unsafe fn to_f16(x: f32) -> u16 {
        f32_to_f16(x)
    }
    #[inline(always)]
    unsafe fn from_f16(h: u16) -> f32 {
        f16_to_f32(h)
    }

    #[inline(always)]
    unsafe fn block32(x: *const f32, q: *mut u8) -> Option<(f32, i32)> {
        let v: [float32x4_t; 8] = core::array::from_fn(|i| vld1q_f32(x.add(4 * i)));
        let mut m = vdupq_n_f32(0.0);
        for vi in v {
            m = vmaxq_f32(m, vabsq_f32(vi));
        }
        // `fmax` carries a NaN through, and |±inf| is inf: one test of the maximum.
        let amax = vmaxvq_f32(m);
        if !amax.is_finite() {
            return None;
        }
        let d = amax / 127.0;
        let id = vdupq_n_f32(if d != 0.0 { 1.0 / d } else { 0.0 });
        let qi: [int32x4_t; 8] = core::array::from_fn(|i| vcvtaq_s32_f32(vmulq_f32(v[i], id)));
        vst1q_s8(q as *mut i8, narrow16(&qi[..4]));
        vst1q_s8(q.add(16) as *mut i8, narrow16(&qi[4..]));
        let s = vaddq_s32(
            vaddq_s32(vaddq_s32(qi[0], qi[1]), vaddq_s32(qi[2], qi[3])),
            vaddq_s32(vaddq_s32(qi[4], qi[5]), vaddq_s32(qi[6], qi[7])),
        );
        Some((d, vaddvq_s32(s)))
    }

    #[inline(always)]
    unsafe fn block256(x: *const f32, b: *mut u8) -> bool {
        let mut m = vdupq_n_f32(0.0);
        for i in 0..64 {
            m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x.add(4 * i))));
        }
        // As in `block32`: a NaN or an infinity makes the maximum non-finite.
        let amax = vmaxvq_f32(m);
        if !amax.is_finite() {
            return false;
        }
        if amax == 0.0 {
            core::ptr::write_bytes(b, 0, 292);
            return true;
        }
        // The first element whose magnitude is amax (the reference's strict `>` keeps it).
        let mut max = 0.0;
        for i in 0..256 {
            if (*x.add(i)).abs() == amax {
                max = *x.add(i);
                break;
            }
        }
        let iscale = -127.0f32 / max;
        core::ptr::copy_nonoverlapping((1.0 / iscale).to_le_bytes().as_ptr(), b, 4);
        let s = vdupq_n_f32(iscale);
        let top = vdupq_n_s32(127);
        for c in 0..16 {
            let qi: [int32x4_t; 4] = core::array::from_fn(|i| {
                vminq_s32(
                    vcvtnq_s32_f32(vmulq_f32(s, vld1q_f32(x.add(16 * c + 4 * i)))),
                    top,
                )
            });
            vst1q_s8(b.add(4 + 16 * c) as *mut i8, narrow16(&qi));
            let sum = vaddvq_s32(vaddq_s32(vaddq_s32(qi[0], qi[1]), vaddq_s32(qi[2], qi[3])));
            core::ptr::copy_nonoverlapping(
                (sum as i16).to_le_bytes().as_ptr(),
                b.add(260 + 2 * c),
                2,
            );
        }
        true
    }
}

/// [`quantize_q8_by`] on NEON (the aarch64 baseline).
pub(in crate::kernels) unsafe fn quantize_q8(
    ad: DType,
    x: &[f32],
    blocks: &mut [u8],
    sums: &mut [u8],
) -> bool {
    quantize_q8_by::<NeonQ8>(ad, x, blocks, sums)
}
