//! 8-bit kernels (fast mode): integer dot products of the weight codes with 8-bit activation
//! blocks — Q8_1 for the 32-element formats, Q8_K for the K-quants, as llama.cpp pairs them;
//! Q8_1 for IQ4_NL and IQ4_XS too, as on x86 (a scale per 32 elements).
//! The result is the dot product of the dequantized weights with the dequantized
//! activations (integer sums are exact; the scales are applied in f32).

use super::*;
use crate::kernels::matmul::Q8_1_SIDE;
use crate::quant::reference_blocks::scale_min_k4;

/// Sixteen signed 8-bit products summed into four 32-bit lanes.
pub(in crate::kernels) trait Dot {
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// ARMv8.0: widening multiplies (`smull`, `smull2`), pairwise accumulate (`sadalp`). Every
/// product of a weight code and an activation (|q| ≤ 128, |x| ≤ 127) fits an i16.
pub(in crate::kernels) struct Smull;
/// ARMv8.2 dotprod: `sdot`, four products per lane.
pub(in crate::kernels) struct Sdot;

impl Dot for Smull {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: register-only; only the dotprod level's kernels (`#[target_feature(enable =
        // "dotprod")]`, dispatched only where the CPU has it) use `Sdot`. The directive lets
        // the assembler take `sdot` in a closure the compiler kept out of line.
        unsafe {
            asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }
}

/// Bytes of a Q8_1 activation block (f16 d, f16 s, 32 codes).
pub(super) const Q8_1_BB: usize = 36;

/// The four f16 `d` of blocks `blk` as f32, and for the formats with an offset their four `m`.
#[inline(always)]
unsafe fn scales4<W: LegacyW>(blk: &[*const u8; 4]) -> (float32x4_t, float32x4_t) {
    if W::MIN {
        // Each row's d and m as one u32 lane, then split and widened.
        let mut dm = vdupq_n_u32(0);
        dm = vsetq_lane_u32::<0>((blk[0] as *const u32).read_unaligned(), dm);
        dm = vsetq_lane_u32::<1>((blk[1] as *const u32).read_unaligned(), dm);
        dm = vsetq_lane_u32::<2>((blk[2] as *const u32).read_unaligned(), dm);
        dm = vsetq_lane_u32::<3>((blk[3] as *const u32).read_unaligned(), dm);
        let h = vreinterpretq_u16_u32(dm);
        (
            cvt_f16x4(vget_low_u16(vuzp1q_u16(h, h))),
            cvt_f16x4(vget_low_u16(vuzp2q_u16(h, h))),
        )
    } else {
        let mut dh = vdup_n_u16(0);
        dh = vset_lane_u16::<0>((blk[0] as *const u16).read_unaligned(), dh);
        dh = vset_lane_u16::<1>((blk[1] as *const u16).read_unaligned(), dh);
        dh = vset_lane_u16::<2>((blk[2] as *const u16).read_unaligned(), dh);
        dh = vset_lane_u16::<3>((blk[3] as *const u16).read_unaligned(), dh);
        (cvt_f16x4(dh), vdupq_n_f32(0.0))
    }
}

/// 32-element weights × Q8_1 activation rows (each row: its blocks, then per block
/// [`Q8_1_SIDE`] bytes: d·Σq and d as f32). With codes `c`, scale `d`, offset `m`:
/// `Σ w·x = d·dx·Σ c·q + m·(dx·Σq)`.
///
/// Four weight rows at a time: each activation block is loaded once for the four, their
/// integer sums are gathered into one vector (`addp`) and scaled by the four rows' `d` (and
/// `m`) as vectors. Every output is the same chain whatever the rows around it: per block,
/// `acc = fma(float(Σ c·q), d·dx, acc)` and `accm = fma(m, dx·Σq, accm)`, then `acc + accm`;
/// the rows past a multiple of 4 compute exactly that one row at a time, so a row's result
/// depends neither on the tile it falls in nor on how many activation rows come with it.
#[inline(always)]
pub(super) unsafe fn legacy_8bit_n<D: Dot, W: LegacyW, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let sides: [*const f32; NX] = core::array::from_fn(|t| xs[t].add(nb * Q8_1_BB) as *const f32);
    let r4 = a.rows / 4 * 4;
    for r in (0..r4).step_by(4) {
        let w: [*const u8; 4] = core::array::from_fn(|i| a.w.add((r + i) * a.w_stride));
        let mut acc = [vdupq_n_f32(0.0); NX];
        let mut accm = [vdupq_n_f32(0.0); NX];
        for b in 0..nb {
            let blk: [*const u8; 4] = core::array::from_fn(|i| w[i].add(b * W::BB));
            let mut q = [[vdupq_n_s8(0); 2]; 4];
            for i in 0..4 {
                q[i] = W::codes(blk[i]);
            }
            let (d, m) = scales4::<W>(&blk);
            for t in 0..NX {
                let xb = xs[t].add(b * Q8_1_BB + 4) as *const i8;
                let (x0, x1) = (vld1q_s8(xb), vld1q_s8(xb.add(16)));
                let mut p = [vdupq_n_s32(0); 4];
                for i in 0..4 {
                    p[i] = D::dot(D::dot(vdupq_n_s32(0), q[i][0], x0), q[i][1], x1);
                }
                let p = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
                // [dx·Σq, dx] of the activation block.
                let sx = vld1_f32(sides[t].add(b * Q8_1_SIDE / 4));
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(p), vmulq_lane_f32::<1>(d, sx));
                if W::MIN {
                    accm[t] = vfmaq_lane_f32::<0>(accm[t], m, sx);
                }
            }
        }
        for t in 0..NX {
            let v = if W::MIN {
                vaddq_f32(acc[t], accm[t])
            } else {
                acc[t]
            };
            vst1q_f32(a.out.add(t * a.out_stride + r), v);
        }
    }
    for r in r4..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [0f32; NX];
        let mut accm = [0f32; NX];
        for b in 0..nb {
            let blk = w.add(b * W::BB);
            let q = W::codes(blk);
            let dm = W::scales(blk);
            let (d, m) = (vget_lane_f32::<0>(dm), vget_lane_f32::<1>(dm));
            for t in 0..NX {
                let xb = xs[t].add(b * Q8_1_BB + 4) as *const i8;
                let p = D::dot(vdupq_n_s32(0), q[0], vld1q_s8(xb));
                let p = D::dot(p, q[1], vld1q_s8(xb.add(16)));
                let side = sides[t].add(b * Q8_1_SIDE / 4);
                let (sq, dx) = (side.read_unaligned(), side.add(1).read_unaligned());
                acc[t] = (vaddvq_s32(p) as f32).mul_add(d * dx, acc[t]);
                if W::MIN {
                    accm[t] = m.mul_add(sq, accm[t]);
                }
            }
        }
        for t in 0..NX {
            let v = if W::MIN { acc[t] + accm[t] } else { acc[t] };
            *a.out.add(t * a.out_stride + r) = v;
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn legacy_8bit<D: Dot, W: LegacyW>(a: &MatArgs) {
    by_nx!(a, legacy_8bit_n, D, W)
}

/// Bytes of an IQ4_XS super-block: f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128 bytes of
/// index pairs (16 per sub-block of 32).
const IQ4XS_BB: usize = 136;

/// IQ4_XS weights × Q8_1 activation rows, as [`legacy_8bit_n`] with each 32-element
/// sub-block `j` of a super-block as a block: its levels (`kvalues_iq4nl` looked up by
/// `tbl`, [`iq4_levels`]) and its scale `dl_j = d·(ls_j − 32)`, the reference's f32 value
/// (x86's pairing: one activation scale per 32 elements, where llama.cpp takes Q8_K's one
/// per 256). Four weight rows at a time, their 6-bit `ls_j` extracted as i32 lanes (one per
/// row) from the four super-blocks' headers; per sub-block
/// `acc = fma(float(Σ c·q), dl·dx, acc)`, the rows past a multiple of 4 computing that very
/// chain one at a time.
#[inline(always)]
unsafe fn iq4xs_8bit_n<D: Dot, const NX: usize>(a: &MatArgs) {
    let (ns, nb) = (a.k / 256, a.k / 32);
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let sides: [*const f32; NX] = core::array::from_fn(|t| xs[t].add(nb * Q8_1_BB) as *const f32);
    // The products of sub-block `b` (its levels `q`) with each activation row's block `b`.
    let dots = |q: [int8x16_t; 2], b: usize, t: usize| {
        let xb = xs[t].add(b * Q8_1_BB + 4) as *const i8;
        D::dot(
            D::dot(vdupq_n_s32(0), q[0], vld1q_s8(xb)),
            q[1],
            vld1q_s8(xb.add(16)),
        )
    };
    let r4 = a.rows / 4 * 4;
    for r in (0..r4).step_by(4) {
        let w: [*const u8; 4] = core::array::from_fn(|i| a.w.add((r + i) * a.w_stride));
        let mut acc = [vdupq_n_f32(0.0); NX];
        for s in 0..ns {
            let sb: [*const u8; 4] = core::array::from_fn(|i| w[i].add(s * IQ4XS_BB));
            // The four headers: lanes of `dh` are `d | scales_h << 16`, of `sl` `scales_l`.
            let head = |i: usize| vreinterpret_u32_u8(vld1_u8(sb[i]));
            let (h01, h23) = (
                vcombine_u32(head(0), head(1)),
                vcombine_u32(head(2), head(3)),
            );
            let (dh, mut sl) = (vuzp1q_u32(h01, h23), vuzp2q_u32(h01, h23));
            let d = cvt_f16x4(vmovn_u32(dh));
            let mut sh = vshrq_n_u32::<16>(dh);
            for j in 0..8 {
                // ls_j: the low nibble of `sl`, the low 2 bits of `sh` above it; then the
                // next sub-block's fields to the bottom.
                let ls = vsliq_n_u32::<4>(
                    vandq_u32(sl, vdupq_n_u32(0x0f)),
                    vandq_u32(sh, vdupq_n_u32(3)),
                );
                sl = vshrq_n_u32::<4>(sl);
                sh = vshrq_n_u32::<2>(sh);
                let ls = vsubq_s32(vreinterpretq_s32_u32(ls), vdupq_n_s32(32));
                let dl = vmulq_f32(d, vcvtq_f32_s32(ls));
                let q: [[int8x16_t; 2]; 4] =
                    core::array::from_fn(|i| iq4_levels(sb[i].add(8 + 16 * j)));
                let b = 8 * s + j;
                for t in 0..NX {
                    let p: [int32x4_t; 4] = core::array::from_fn(|i| dots(q[i], b, t));
                    let p = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
                    // [dx·Σq, dx] of the activation block.
                    let sx = vld1_f32(sides[t].add(b * Q8_1_SIDE / 4));
                    acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(p), vmulq_lane_f32::<1>(dl, sx));
                }
            }
        }
        for t in 0..NX {
            vst1q_f32(a.out.add(t * a.out_stride + r), acc[t]);
        }
    }
    for r in r4..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [0f32; NX];
        for s in 0..ns {
            let sb = w.add(s * IQ4XS_BB);
            let d = f16_at(sb);
            let sh = u32::from((sb.add(2) as *const u16).read_unaligned());
            let sl = (sb.add(4) as *const u32).read_unaligned();
            for j in 0..8 {
                let ls = ((sl >> (4 * j)) & 0x0f) | (((sh >> (2 * j)) & 3) << 4);
                let dl = d * (ls as i32 - 32) as f32;
                let q = iq4_levels(sb.add(8 + 16 * j));
                let b = 8 * s + j;
                for t in 0..NX {
                    let dx = sides[t].add(b * Q8_1_SIDE / 4 + 1).read_unaligned();
                    acc[t] = (vaddvq_s32(dots(q, b, t)) as f32).mul_add(dl * dx, acc[t]);
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = acc[t];
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn iq4xs_8bit<D: Dot>(a: &MatArgs) {
    by_nx!(a, iq4xs_8bit_n, D)
}

/// Bytes of a Q8_K activation block: f32 d, 256 codes, 16 i16 sums of 16 codes.
pub(super) const Q8K_BB: usize = 292;

/// The Q8_K block `b` of an activation row: (d, codes, sums of 16).
#[inline(always)]
unsafe fn q8k(x: *const u8, b: usize) -> (f32, *const i8, *const i16) {
    let p = x.add(b * Q8K_BB);
    (
        (p as *const f32).read_unaligned(),
        p.add(4) as *const i8,
        p.add(260) as *const i16,
    )
}

/// Q4_K (`FIVE` false) / Q5_K weights × Q8_K activation rows: per 32-element sub-block `j`,
/// scale `sc_j` and min `m_j` (6 bits each): `Σ w·x = d·dx·Σ_j sc_j·Σ q·x - dmin·dx·Σ_j
/// m_j·Σx`, the sums of `x` from the block's sums of 16.
#[inline(always)]
unsafe fn q45k_8bit_n<D: Dot, const FIVE: bool, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let bb = if FIVE { 176 } else { 144 };
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [0f32; NX];
        for b in 0..nb {
            let wb = w.add(b * bb);
            let (d, dmin) = (f16_at(wb), f16_at(wb.add(2)));
            let scales = core::slice::from_raw_parts(wb.add(4), 12);
            let sm: [(u8, u8); 8] = core::array::from_fn(|j| scale_min_k4(j, scales));
            let qs = wb.add(if FIVE { 48 } else { 16 });
            let qh = [vld1q_u8(wb.add(16)), vld1q_u8(wb.add(32))];
            let mut isum = [vdupq_n_s32(0); NX];
            for p in 0..4 {
                // Sub-blocks 2p (low nibbles) and 2p + 1 (high nibbles) of bytes 32p..32p+32.
                let lo = [vld1q_u8(qs.add(32 * p)), vld1q_u8(qs.add(32 * p + 16))];
                let mut sub: [[uint8x16_t; 2]; 2] = [
                    lo.map(|v| vandq_u8(v, vdupq_n_u8(0x0f))),
                    lo.map(|v| vshrq_n_u8::<4>(v)),
                ];
                if FIVE {
                    for (s, half) in sub.iter_mut().enumerate() {
                        let bit = vdupq_n_u8(1 << (2 * p + s));
                        for h in 0..2 {
                            let hb = vandq_u8(vtstq_u8(qh[h], bit), vdupq_n_u8(0x10));
                            half[h] = vorrq_u8(half[h], hb);
                        }
                    }
                }
                for t in 0..NX {
                    let (_, xq, _) = q8k(xs[t], b);
                    for s in 0..2 {
                        let x = xq.add(64 * p + 32 * s);
                        let v = D::dot(vdupq_n_s32(0), vreinterpretq_s8_u8(sub[s][0]), vld1q_s8(x));
                        let v = D::dot(v, vreinterpretq_s8_u8(sub[s][1]), vld1q_s8(x.add(16)));
                        isum[t] = vmlaq_n_s32(isum[t], v, i32::from(sm[2 * p + s].0));
                    }
                }
            }
            for t in 0..NX {
                let (dx, _, bs) = q8k(xs[t], b);
                let mut mins = 0i32;
                for j in 0..8 {
                    let sx = i32::from(bs.add(2 * j).read_unaligned())
                        + i32::from(bs.add(2 * j + 1).read_unaligned());
                    mins += i32::from(sm[j].1) * sx;
                }
                acc[t] += d * dx * vaddvq_s32(isum[t]) as f32 - dmin * dx * mins as f32;
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = acc[t];
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn q45k_8bit<D: Dot, const FIVE: bool>(a: &MatArgs) {
    by_nx!(a, q45k_8bit_n, D; FIVE)
}

/// Q6_K weights × Q8_K activation rows: codes `q` (6 bits, 0..64) with 16 signed scales of
/// 16 elements: `Σ w·x = d·dx·(Σ_g sc_g·Σ q·x - 32·Σ_g sc_g·Σx)`.
#[inline(always)]
pub(super) unsafe fn q6k_8bit_n<D: Dot, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [0f32; NX];
        for b in 0..nb {
            let wb = w.add(b * 210);
            let (ql, qh) = (wb, wb.add(128));
            let sc: [i32; 16] = core::array::from_fn(|g| i32::from(*wb.add(192 + g) as i8));
            let d = f16_at(wb.add(208));
            let mut isum = [vdupq_n_s32(0); NX];
            for half in 0..2 {
                let hi = [
                    vld1q_u8(qh.add(32 * half)),
                    vld1q_u8(qh.add(32 * half + 16)),
                ];
                for pair in 0..2 {
                    let lo = [
                        vld1q_u8(ql.add(64 * half + 32 * pair)),
                        vld1q_u8(ql.add(64 * half + 32 * pair + 16)),
                    ];
                    // Chunks r = pair (low nibbles) and r = pair + 2 (high nibbles).
                    for nib in 0..2 {
                        let r4 = pair + 2 * nib;
                        let c = 4 * half + r4;
                        let q: [int8x16_t; 2] = core::array::from_fn(|h| {
                            let l = if nib == 0 {
                                vandq_u8(lo[h], vdupq_n_u8(0x0f))
                            } else {
                                vshrq_n_u8::<4>(lo[h])
                            };
                            let hb = vandq_u8(
                                vshlq_u8(hi[h], vdupq_n_s8(4 - 2 * r4 as i8)),
                                vdupq_n_u8(0x30),
                            );
                            vreinterpretq_s8_u8(vorrq_u8(l, hb))
                        });
                        for t in 0..NX {
                            let (_, xq, _) = q8k(xs[t], b);
                            let x = xq.add(32 * c);
                            let v0 = D::dot(vdupq_n_s32(0), q[0], vld1q_s8(x));
                            let v1 = D::dot(vdupq_n_s32(0), q[1], vld1q_s8(x.add(16)));
                            isum[t] = vmlaq_n_s32(isum[t], v0, sc[2 * c]);
                            isum[t] = vmlaq_n_s32(isum[t], v1, sc[2 * c + 1]);
                        }
                    }
                }
            }
            for t in 0..NX {
                let (dx, _, bs) = q8k(xs[t], b);
                let mut offs = 0i32;
                for g in 0..16 {
                    offs += sc[g] * i32::from(bs.add(g).read_unaligned());
                }
                // The chain of the rows-by-8 kernel (`rows8`): one FMA per block.
                let s = (vaddvq_s32(isum[t]) - 32 * offs) as f32;
                acc[t] = s.mul_add(d * dx, acc[t]);
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = acc[t];
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn q6k_8bit<D: Dot>(a: &MatArgs) {
    by_nx!(a, q6k_8bit_n, D)
}

/// Q2_K (`THREE` false) / Q3_K weights × Q8_K activation rows, per group `s` of 16 with an
/// integer scale `sc_s` (Q2_K: 4 bits, with a 4-bit min `m_s`; Q3_K: signed 6 bits, codes
/// -4..4): `Σ w·x = d·dx·Σ_s sc_s·Σ q·x - dmin·dx·Σ_s m_s·Σx` (no min term for Q3_K).
#[inline(always)]
pub(super) unsafe fn q23k_8bit_n<D: Dot, const THREE: bool, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let bb = if THREE { 110 } else { 84 };
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let mut q = [vdupq_n_s8(0); 16];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [0f32; NX];
        let mut accm = [0f32; NX];
        for b in 0..nb {
            let wb = w.add(b * bb);
            let (sc, mn): ([i32; 16], [i32; 16]) = if THREE {
                q3k_codes(wb, &mut q);
                (
                    core::array::from_fn(|s| i32::from(q3k_scale(wb, s))),
                    [0; 16],
                )
            } else {
                q2k_codes(wb, &mut q);
                (
                    core::array::from_fn(|s| i32::from(*wb.add(s) & 0x0f)),
                    core::array::from_fn(|s| i32::from(*wb.add(s) >> 4)),
                )
            };
            let (d, dmin) = if THREE {
                (f16_at(wb.add(108)), 0.0)
            } else {
                (f16_at(wb.add(80)), f16_at(wb.add(82)))
            };
            for t in 0..NX {
                let (dx, xq, bs) = q8k(xs[t], b);
                let mut isum = vdupq_n_s32(0);
                for s in 0..16 {
                    let v = D::dot(vdupq_n_s32(0), q[s], vld1q_s8(xq.add(16 * s)));
                    isum = vmlaq_n_s32(isum, v, sc[s]);
                }
                // The chain of the rows-by-8 kernel (`rows8`): one FMA per block and sum.
                acc[t] = (vaddvq_s32(isum) as f32).mul_add(d * dx, acc[t]);
                if !THREE {
                    let mut mins = 0i32;
                    for s in 0..16 {
                        mins += mn[s] * i32::from(bs.add(s).read_unaligned());
                    }
                    accm[t] = (mins as f32).mul_add(dmin * dx, accm[t]);
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = if THREE { acc[t] } else { acc[t] - accm[t] };
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn q23k_8bit<D: Dot, const THREE: bool>(a: &MatArgs) {
    by_nx!(a, q23k_8bit_n, D; THREE)
}
