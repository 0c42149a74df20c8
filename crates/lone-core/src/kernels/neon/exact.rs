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

/// IQ4_NL: 4-bit indices into the 16 signed levels `kvalues_iq4nl`, scaled by `d`.
pub(in crate::kernels) struct WIQ4NL;

/// The levels of the 32 elements whose index pairs are the 16 bytes at `p` (elements 0..16:
/// the low nibbles, 16..32: the high ones), one table lookup (`tbl`) each.
#[inline(always)]
pub(super) unsafe fn iq4_levels(p: *const u8) -> [int8x16_t; 2] {
    let kv = vld1q_s8(crate::quant::reference_blocks::KVALUES_IQ4NL.as_ptr());
    nibbles(p).map(|v| vqtbl1q_s8(kv, v))
}

impl LegacyW for WIQ4NL {
    const BB: usize = 18;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn codes(b: *const u8) -> [int8x16_t; 2] {
        iq4_levels(b.add(2))
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

/// `acc[t][u] += w_u · x[t][at + 4u..]` for the 16 weights `w = f(widen(q))` (the scale and
/// offset applied as the reference dequantizer applies them).
#[inline(always)]
unsafe fn fma16<const NX: usize>(
    acc: &mut [[float32x4_t; 4]; NX],
    q: int8x16_t,
    f: impl Fn(float32x4_t) -> float32x4_t,
    xs: &[*const f32; NX],
    at: usize,
) {
    let qf = widen(q);
    for u in 0..4 {
        let wv = f(qf[u]);
        for t in 0..NX {
            acc[t][u] = vfmaq_f32(acc[t][u], wv, vld1q_f32(xs[t].add(at + 4 * u)));
        }
    }
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
                let f = |v| {
                    if W::MIN {
                        vaddq_f32(vmulq_f32(v, dv), mv)
                    } else {
                        vmulq_f32(v, dv)
                    }
                };
                fma16(&mut acc, q[h], f, &xs, b * 32 + 16 * h);
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

/// A K-quant super-block (256 elements) decoded for the exact kernels: 16 groups of 16 codes
/// (signed bytes) with, per group, the f32 scale `dl` and, for the formats with mins, `ml`,
/// computed as the reference dequantizer computes them, so that its value of an element is
/// `dl·q - ml` (`dl·q` without mins) in f32.
pub(in crate::kernels) trait KExact {
    const BB: usize;
    const MIN: bool;
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], ml: &mut [f32; 16]);
}

pub(in crate::kernels) struct KQ2;
pub(in crate::kernels) struct KQ3;
pub(in crate::kernels) struct KQ4;
pub(in crate::kernels) struct KQ5;
pub(in crate::kernels) struct KQ6;

/// `(v >> SHIFT) & mask` on 16 bytes, for a shift known per call site.
#[inline(always)]
unsafe fn bits(v: uint8x16_t, shift: usize, mask: u8) -> uint8x16_t {
    vandq_u8(vshlq_u8(v, vdupq_n_s8(-(shift as i8))), vdupq_n_u8(mask))
}

/// Q2_K's codes (0..4): group `s` of 16 takes bits `2·plane` of bytes `16 + 32·half + 16·(s %
/// 2)..`, with `half = s / 8`, `plane = (s % 8) / 2`.
#[inline(always)]
pub(in crate::kernels) unsafe fn q2k_codes(b: *const u8, q: &mut [int8x16_t; 16]) {
    for s in 0..16 {
        let (half, plane) = (s / 8, (s % 8) / 2);
        let v = vld1q_u8(b.add(16 + 32 * half + 16 * (s % 2)));
        q[s] = vreinterpretq_s8_u8(bits(v, 2 * plane, 3));
    }
}

/// Q3_K's codes (-4..4): 2 low bits as Q2_K's, minus 4 where the high-mask bit `4·half +
/// plane` of byte `16·(s % 2) + l` is clear.
#[inline(always)]
pub(in crate::kernels) unsafe fn q3k_codes(b: *const u8, q: &mut [int8x16_t; 16]) {
    let hm = [vld1q_u8(b), vld1q_u8(b.add(16))];
    for s in 0..16 {
        let (half, plane, off) = (s / 8, (s % 8) / 2, s % 2);
        let v = bits(vld1q_u8(b.add(32 + 32 * half + 16 * off)), 2 * plane, 3);
        let set = vtstq_u8(hm[off], vdupq_n_u8(1 << (4 * half + plane)));
        let sub = vbicq_u8(vdupq_n_u8(4), set);
        q[s] = vsubq_s8(vreinterpretq_s8_u8(v), vreinterpretq_s8_u8(sub));
    }
}

/// Q3_K's 16 signed 6-bit scales: low nibbles in bytes 96..104 (scale `s` in byte `s % 8`,
/// nibble `s / 8`), 2-bit high parts in bytes 104..108 (byte `s % 4`, bits `2·(s / 4)`).
#[inline(always)]
pub(in crate::kernels) unsafe fn q3k_scale(b: *const u8, s: usize) -> i8 {
    let lo = (*b.add(96 + s % 8) >> (4 * (s / 8))) & 0x0f;
    let hi = (*b.add(104 + s % 4) >> (2 * (s / 4))) & 3;
    (lo | (hi << 4)) as i8 - 32
}

impl KExact for KQ2 {
    const BB: usize = 84;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(
        b: *const u8,
        q: &mut [int8x16_t; 16],
        dl: &mut [f32; 16],
        ml: &mut [f32; 16],
    ) {
        let (d, dmin) = (f16_at(b.add(80)), f16_at(b.add(82)));
        q2k_codes(b, q);
        for s in 0..16 {
            let sc = *b.add(s);
            dl[s] = d * f32::from(sc & 0x0f);
            ml[s] = dmin * f32::from(sc >> 4);
        }
    }
}

impl KExact for KQ3 {
    const BB: usize = 110;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b.add(108));
        q3k_codes(b, q);
        for s in 0..16 {
            dl[s] = d * f32::from(q3k_scale(b, s));
        }
    }
}

/// Q4_K (`FIVE` false) and Q5_K: sub-block `j` of 32 (groups `2j`, `2j + 1`) takes nibble
/// `j % 2` of bytes `32·(j / 2)..`, Q5_K bit `j` of `qh` as the fifth.
#[inline(always)]
unsafe fn q45k_decode<const FIVE: bool>(
    b: *const u8,
    q: &mut [int8x16_t; 16],
    dl: &mut [f32; 16],
    ml: &mut [f32; 16],
) {
    let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
    let scales = core::slice::from_raw_parts(b.add(4), 12);
    let qs = b.add(if FIVE { 48 } else { 16 });
    let qh = [vld1q_u8(b.add(16)), vld1q_u8(b.add(32))];
    for j in 0..8 {
        let (sc, m) = crate::quant::reference_blocks::scale_min_k4(j, scales);
        let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
        for h in 0..2 {
            let mut v = bits(vld1q_u8(qs.add(32 * (j / 2) + 16 * h)), 4 * (j % 2), 0x0f);
            if FIVE {
                let hb = vandq_u8(vtstq_u8(qh[h], vdupq_n_u8(1 << j)), vdupq_n_u8(0x10));
                v = vorrq_u8(v, hb);
            }
            q[2 * j + h] = vreinterpretq_s8_u8(v);
            dl[2 * j + h] = d1;
            ml[2 * j + h] = m1;
        }
    }
}

impl KExact for KQ4 {
    const BB: usize = 144;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(
        b: *const u8,
        q: &mut [int8x16_t; 16],
        dl: &mut [f32; 16],
        ml: &mut [f32; 16],
    ) {
        q45k_decode::<false>(b, q, dl, ml)
    }
}

impl KExact for KQ5 {
    const BB: usize = 176;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(
        b: *const u8,
        q: &mut [int8x16_t; 16],
        dl: &mut [f32; 16],
        ml: &mut [f32; 16],
    ) {
        q45k_decode::<true>(b, q, dl, ml)
    }
}

impl KExact for KQ6 {
    const BB: usize = 210;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let (ql, qh) = (b, b.add(128));
        let d = f16_at(b.add(208));
        // Chunk c = 4·half + r (32 elements): nibble r / 2 of ql[64·half + 32·(r % 2) + l],
        // bits 2r..2r+2 of qh[32·half + l]; group 2c + h takes elements 16h.. of it.
        for c in 0..8 {
            let (half, r) = (c / 4, c % 4);
            for h in 0..2 {
                let lo = bits(
                    vld1q_u8(ql.add(64 * half + 32 * (r % 2) + 16 * h)),
                    4 * (r / 2),
                    0x0f,
                );
                let hi = bits(vld1q_u8(qh.add(32 * half + 16 * h)), 2 * r, 3);
                let v = vorrq_u8(lo, vshlq_n_u8::<4>(hi));
                let g = 2 * c + h;
                q[g] = vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(32));
                // ggml: d * sc * q, evaluated left to right.
                dl[g] = d * f32::from(*b.add(192 + g) as i8);
            }
        }
    }
}

/// IQ4_XS: sub-block `ib` of 32 (groups `2·ib`, `2·ib + 1`) takes the levels of bytes
/// `8 + 16·ib..` and the scale `d·(ls − 32)`, `ls` 6 bits: nibble `ib % 2` of
/// `scales_l[ib / 2]`, bits `2·ib..` of `scales_h` above it.
pub(in crate::kernels) struct KIQ4XS;

impl KExact for KIQ4XS {
    const BB: usize = 136;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b);
        let h = u16::from_le_bytes([*b.add(2), *b.add(3)]);
        for ib in 0..8 {
            let lo = (*b.add(4 + ib / 2) >> (4 * (ib % 2))) & 0x0f;
            let hi = ((h >> (2 * ib)) & 3) as u8;
            let s = d * (i32::from(lo | (hi << 4)) - 32) as f32;
            let [l, u] = iq4_levels(b.add(8 + 16 * ib));
            q[2 * ib] = l;
            q[2 * ib + 1] = u;
            dl[2 * ib] = s;
            dl[2 * ib + 1] = s;
        }
    }
}

#[inline(always)]
unsafe fn k_exact_n<K: KExact, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
    let mut q = [vdupq_n_s8(0); 16];
    let (mut dl, mut ml) = ([0f32; 16], [0f32; 16]);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [[vdupq_n_f32(0.0); 4]; NX];
        for b in 0..nb {
            K::decode(w.add(b * K::BB), &mut q, &mut dl, &mut ml);
            for g in 0..16 {
                let (dv, mv) = (vdupq_n_f32(dl[g]), vdupq_n_f32(ml[g]));
                let f = |v| {
                    if K::MIN {
                        vsubq_f32(vmulq_f32(v, dv), mv)
                    } else {
                        vmulq_f32(v, dv)
                    }
                };
                fma16(&mut acc, q[g], f, &xs, b * 256 + 16 * g);
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum4(acc[t]);
        }
    }
}

/// K-quant weights decoded in NEON ([`KExact`]), bit-exactly, × f32 activations.
#[inline(always)]
pub(in crate::kernels) unsafe fn k_exact<K: KExact>(a: &MatArgs) {
    by_nx!(a, k_exact_n, K)
}
