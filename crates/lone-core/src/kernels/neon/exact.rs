//! Exact quantized kernels: weights dequantized bit-exactly in registers (the 32-element
//! formats) or through the reference block dequantizer (K-quants), f32 activations.

use super::*;

/// A 32-element format's block decoded: the codes `c` of elements 0..16 and 16..32 as signed
/// bytes, the scale `d` and the offset `m` (none for the formats without one), such that the
/// reference dequantizer's value of element `j` is `c_j·d + m` (`c_j·d` without an offset),
/// computed in f32 as it does.
pub(in crate::kernels) trait LegacyW {
    /// Bytes per block.
    const BB: usize;
    /// The format adds an offset `m` (Q4_1, Q5_1).
    const MIN: bool;
    unsafe fn codes(b: *const u8) -> [int8x16_t; 2];
    /// `d` in lane 0 and, for the formats with an offset, `m` in lane 1: the block's leading
    /// halves widened at once (every block is at least 8 bytes long).
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> float32x2_t {
        vget_low_f32(cvt_f16x4(vld1_u16(b as *const u16)))
    }
}

pub(in crate::kernels) struct WQ4_0;
pub(in crate::kernels) struct WQ4_1;
pub(in crate::kernels) struct WQ5_0;
pub(in crate::kernels) struct WQ5_1;
pub(in crate::kernels) struct WQ8_0;

/// Bit `i % 8` of each byte `i`: tests the high bits of 16 consecutive elements.
static BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// The two nibble vectors of 16 packed bytes: element `j` is the low nibble of byte `j`,
/// element `16 + j` the high one.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> [uint8x16_t; 2] {
    let q = vld1q_u8(p);
    [vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q)]
}

/// 0x10 in each byte whose element has its bit set in the 16 bits `lo | hi << 8`.
#[inline(always)]
unsafe fn high_bits(lo: u8, hi: u8) -> uint8x16_t {
    let v = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
    vandq_u8(vtstq_u8(v, vld1q_u8(BITS.as_ptr())), vdupq_n_u8(0x10))
}

/// The 5-bit codes of a Q5 block: nibbles at `qs`, fifth bits from the 4 bytes at `qh`.
#[inline(always)]
unsafe fn five_bits(qh: *const u8, qs: *const u8) -> [uint8x16_t; 2] {
    let [lo, hi] = nibbles(qs);
    [
        vorrq_u8(lo, high_bits(*qh, *qh.add(1))),
        vorrq_u8(hi, high_bits(*qh.add(2), *qh.add(3))),
    ]
}

#[inline(always)]
unsafe fn minus(v: [uint8x16_t; 2], off: i8) -> [int8x16_t; 2] {
    v.map(|u| vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(off)))
}

impl LegacyW for WQ4_0 {
    const BB: usize = 18;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [int8x16_t; 2] {
        minus(nibbles(b.add(2)), 8)
    }
}

impl LegacyW for WQ4_1 {
    const BB: usize = 20;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [int8x16_t; 2] {
        nibbles(b.add(4)).map(|v| vreinterpretq_s8_u8(v))
    }
}

impl LegacyW for WQ5_0 {
    const BB: usize = 22;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [int8x16_t; 2] {
        minus(five_bits(b.add(2), b.add(6)), 16)
    }
}

impl LegacyW for WQ5_1 {
    const BB: usize = 24;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [int8x16_t; 2] {
        five_bits(b.add(4), b.add(8)).map(|v| vreinterpretq_s8_u8(v))
    }
}

impl LegacyW for WQ8_0 {
    const BB: usize = 34;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [int8x16_t; 2] {
        [
            vld1q_s8(b.add(2) as *const i8),
            vld1q_s8(b.add(18) as *const i8),
        ]
    }
}

/// 16 signed bytes as four f32 vectors (exact).
#[inline(always)]
pub(in crate::kernels) unsafe fn widen(q: int8x16_t) -> [float32x4_t; 4] {
    let (l, h) = (vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q));
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))),
        vcvtq_f32_s32(vmovl_high_s16(l)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))),
        vcvtq_f32_s32(vmovl_high_s16(h)),
    ]
}

#[inline(always)]
unsafe fn hsum4(acc: [float32x4_t; 4]) -> f32 {
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ))
}

#[inline(always)]
unsafe fn legacy_exact_n<W: LegacyW, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [[vdupq_n_f32(0.0); 4]; NX];
        for b in 0..nb {
            let blk = w.add(b * W::BB);
            let q = W::codes(blk);
            let dm = W::scales(blk);
            let (dv, mv) = (vdupq_lane_f32::<0>(dm), vdupq_lane_f32::<1>(dm));
            for h in 0..2 {
                let f = widen(q[h]);
                for u in 0..4 {
                    let mut wv = vmulq_f32(f[u], dv);
                    if W::MIN {
                        wv = vaddq_f32(wv, mv);
                    }
                    for t in 0..NX {
                        let x = vld1q_f32(xs[t].add(b * 32 + 16 * h + 4 * u));
                        acc[t][u] = vfmaq_f32(acc[t][u], wv, x);
                    }
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum4(acc[t]);
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn legacy_exact<W: LegacyW>(a: &MatArgs) {
    by_nx!(a, legacy_exact_n, W)
}

#[repr(C, align(16))]
struct Buf([f32; 256]);

#[inline(always)]
unsafe fn k_exact_n<const BB: usize, const NX: usize>(
    a: &MatArgs,
    deq: impl Fn(&[u8; BB], &mut [f32; 256]),
) {
    let nb = a.k / 256;
    let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
    let mut buf = Buf([0.0; 256]);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [[vdupq_n_f32(0.0); 4]; NX];
        for b in 0..nb {
            deq(&*(w.add(b * BB) as *const [u8; BB]), &mut buf.0);
            for i in (0..256).step_by(16) {
                for u in 0..4 {
                    let wv = vld1q_f32(buf.0.as_ptr().add(i + 4 * u));
                    for t in 0..NX {
                        let x = vld1q_f32(xs[t].add(b * 256 + i + 4 * u));
                        acc[t][u] = vfmaq_f32(acc[t][u], wv, x);
                    }
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum4(acc[t]);
        }
    }
}

/// K-quant weights through the reference block dequantizer `deq` (bit-exact by construction).
#[inline(always)]
pub(in crate::kernels) unsafe fn k_exact<const BB: usize>(
    a: &MatArgs,
    deq: impl Fn(&[u8; BB], &mut [f32; 256]) + Copy,
) {
    match a.nx {
        1 => k_exact_n::<BB, 1>(a, deq),
        2 => k_exact_n::<BB, 2>(a, deq),
        3 => k_exact_n::<BB, 3>(a, deq),
        _ => k_exact_n::<BB, 4>(a, deq),
    }
}
