//! 8-bit kernels over the rows-by-8 layout ([`crate::kernels::packed`]), dotprod level: the
//! 8 rows of a group are interleaved 4 bytes at a time, so one `sdot` by element multiplies
//! 4 bytes of 4 rows by the same 4 activation bytes and leaves the 4 rows' sums in its 4
//! lanes. No horizontal sums, and the per-row scales (f16 `d`, `m`; K-quant sub-block
//! scales) apply as vectors over 4 rows, loaded together.
//!
//! The rows past a matrix's last whole group keep the stored layout and take the row-by-row
//! kernels ([`super::int8`]), whose per-block chain these repeat.

use super::int8::{legacy_8bit_n, q6k_8bit_n, Q8K_BB, Q8_1_BB};
use super::*;
use crate::kernels::matmul::Q8_1_SIDE;
use crate::kernels::packed::rows_past_groups;

/// `acc + Σ_j w[4i + j]·x[4L + j]` in lane `i` (`sdot` by element).
#[inline(always)]
unsafe fn sdot_lane<const L: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only; only the dotprod level's entry points (`#[target_feature(enable
    // = "dotprod")]`, dispatched where the CPU has it) reach this.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[{l}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            l = const L,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// A 32-element format in the rows-by-8 layout: where its fields sit in a group's block
/// (8 rows' worth of the format's block), and its codes.
pub(in crate::kernels) trait Rows8W: LegacyW {
    /// Offset of the 8 rows' f16 mins (formats with an offset).
    const M: usize;
    /// Offset of the 8 rows' high-bit words (Q5 formats).
    const QH: usize;
    /// Offset of the quant chunks.
    const QS: usize;
    /// The integer sums are 2^FRAC times the codes' (Q4_0 decodes `(c - 8)·16` in two
    /// instructions); 0 or 4.
    const FRAC: i32;
    /// Codes of step `S` (0..4) for rows 0-3 and 4-7: `[A, B]`, A multiplying activation
    /// elements `4S..4S+4`, B elements `16 + 4S..16 + 4S + 4`, four bytes per row.
    unsafe fn step<const S: i32>(blk: *const u8, qh: &[uint8x16_t; 2]) -> [[int8x16_t; 2]; 2];
}

/// Chunk `s` of a 4-bit group block: 32 bytes, bytes `4s..4s+4` of rows 0-3, then 4-7.
#[inline(always)]
unsafe fn chunk(qs: *const u8, s: i32) -> [uint8x16_t; 2] {
    let p = qs.add(32 * s as usize);
    [vld1q_u8(p), vld1q_u8(p.add(16))]
}

/// Low and high nibbles of a chunk, with the fifth bits of step `s` from the rearranged
/// high-bit words when `FIVE` ([`crate::kernels::packed::high_bits_by_chunk`]), less `off`.
#[inline(always)]
unsafe fn nibble_step<const FIVE: bool>(
    v: [uint8x16_t; 2],
    qh: &[uint8x16_t; 2],
    s: i32,
    off: i8,
) -> [[int8x16_t; 2]; 2] {
    let mut lo = v.map(|u| vandq_u8(u, vdupq_n_u8(0x0f)));
    let mut hi = v.map(|u| vshrq_n_u8::<4>(u));
    if FIVE {
        for h in 0..2 {
            let m = vdupq_n_u8(0x10);
            lo[h] = vorrq_u8(lo[h], vandq_u8(vshlq_u8(qh[h], vdupq_n_s8(4 - s as i8)), m));
            hi[h] = vorrq_u8(hi[h], vandq_u8(vshlq_u8(qh[h], vdupq_n_s8(-s as i8)), m));
        }
    }
    let f = |u: uint8x16_t| vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(off));
    [lo.map(f), hi.map(f)]
}

impl Rows8W for WQ4_0 {
    const M: usize = 0;
    const QH: usize = 0;
    const QS: usize = 16;
    const FRAC: i32 = 4;
    #[inline(always)]
    unsafe fn step<const S: i32>(blk: *const u8, _: &[uint8x16_t; 2]) -> [[int8x16_t; 2]; 2] {
        // c ^ 8 in each nibble, moved to the top: the signed byte (c - 8)·16.
        let v = chunk(blk.add(Self::QS), S).map(|u| veorq_u8(u, vdupq_n_u8(0x88)));
        [
            v.map(|u| vreinterpretq_s8_u8(vshlq_n_u8::<4>(u))),
            v.map(|u| vreinterpretq_s8_u8(vandq_u8(u, vdupq_n_u8(0xf0)))),
        ]
    }
}

impl Rows8W for WQ4_1 {
    const M: usize = 16;
    const QH: usize = 0;
    const QS: usize = 32;
    const FRAC: i32 = 0;
    #[inline(always)]
    unsafe fn step<const S: i32>(blk: *const u8, qh: &[uint8x16_t; 2]) -> [[int8x16_t; 2]; 2] {
        nibble_step::<false>(chunk(blk.add(Self::QS), S), qh, S, 0)
    }
}

impl Rows8W for WQ5_0 {
    const M: usize = 0;
    const QH: usize = 16;
    const QS: usize = 48;
    const FRAC: i32 = 0;
    #[inline(always)]
    unsafe fn step<const S: i32>(blk: *const u8, qh: &[uint8x16_t; 2]) -> [[int8x16_t; 2]; 2] {
        nibble_step::<true>(chunk(blk.add(Self::QS), S), qh, S, 16)
    }
}

impl Rows8W for WQ5_1 {
    const M: usize = 16;
    const QH: usize = 32;
    const QS: usize = 64;
    const FRAC: i32 = 0;
    #[inline(always)]
    unsafe fn step<const S: i32>(blk: *const u8, qh: &[uint8x16_t; 2]) -> [[int8x16_t; 2]; 2] {
        nibble_step::<true>(chunk(blk.add(Self::QS), S), qh, S, 0)
    }
}

impl Rows8W for WQ8_0 {
    const M: usize = 0;
    const QH: usize = 0;
    const QS: usize = 16;
    const FRAC: i32 = 0;
    #[inline(always)]
    unsafe fn step<const S: i32>(blk: *const u8, _: &[uint8x16_t; 2]) -> [[int8x16_t; 2]; 2] {
        let q = blk.add(Self::QS) as *const i8;
        let p = q.add(32 * S as usize);
        [
            [vld1q_s8(p), vld1q_s8(p.add(16))],
            [vld1q_s8(p.add(128)), vld1q_s8(p.add(144))],
        ]
    }
}

/// The integer sums of one step for every activation row: `p[t][h] += A[h]·x0[S] +
/// B[h]·x1[S]` (rows 4h..4h+4).
#[inline(always)]
unsafe fn legacy_step<W: Rows8W, const S: i32, const NX: usize>(
    p: &mut [[int32x4_t; 2]; NX],
    blk: *const u8,
    qh: &[uint8x16_t; 2],
    x: &[[int8x16_t; 2]; NX],
) {
    let [a, b] = W::step::<S>(blk, qh);
    for t in 0..NX {
        for h in 0..2 {
            p[t][h] = sdot_lane::<S>(p[t][h], a[h], x[t][0]);
            p[t][h] = sdot_lane::<S>(p[t][h], b[h], x[t][1]);
        }
    }
}

/// 32-element weights in the rows-by-8 layout × Q8_1 activation rows: per group of 8 rows
/// and block, `acc = fma(float(Σ c·q), d·dx, acc)` and `accm = fma(m, dx·Σq, accm)`, then
/// `acc + accm` — [`legacy_8bit_n`]'s chain, which takes the rows past the last group.
#[inline(always)]
unsafe fn legacy_rows8_n<W: Rows8W, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let sides: [*const f32; NX] = core::array::from_fn(|t| xs[t].add(nb * Q8_1_BB) as *const f32);
    for g in 0..a.rows / 8 {
        let gw = a.w.add(8 * g * a.w_stride);
        let mut acc = [[vdupq_n_f32(0.0); 2]; NX];
        let mut accm = [[vdupq_n_f32(0.0); 2]; NX];
        for b in 0..nb {
            let blk = gw.add(8 * b * W::BB);
            let d = [0, 1].map(|h| cvt_f16x4(vld1_u16((blk as *const u16).add(4 * h))));
            let qh = if W::QH > 0 {
                [vld1q_u8(blk.add(W::QH)), vld1q_u8(blk.add(W::QH + 16))]
            } else {
                [vdupq_n_u8(0); 2]
            };
            let x: [[int8x16_t; 2]; NX] = core::array::from_fn(|t| {
                let xb = xs[t].add(b * Q8_1_BB + 4) as *const i8;
                [vld1q_s8(xb), vld1q_s8(xb.add(16))]
            });
            let mut p = [[vdupq_n_s32(0); 2]; NX];
            legacy_step::<W, 0, NX>(&mut p, blk, &qh, &x);
            legacy_step::<W, 1, NX>(&mut p, blk, &qh, &x);
            legacy_step::<W, 2, NX>(&mut p, blk, &qh, &x);
            legacy_step::<W, 3, NX>(&mut p, blk, &qh, &x);
            let m = if W::MIN {
                [0, 1].map(|h| cvt_f16x4(vld1_u16((blk.add(W::M) as *const u16).add(4 * h))))
            } else {
                [vdupq_n_f32(0.0); 2]
            };
            for t in 0..NX {
                // [dx·Σq, dx] of the activation block.
                let sx = vld1_f32(sides[t].add(b * Q8_1_SIDE / 4));
                for h in 0..2 {
                    let s = if W::FRAC == 4 {
                        vcvtq_n_f32_s32::<4>(p[t][h])
                    } else {
                        vcvtq_f32_s32(p[t][h])
                    };
                    acc[t][h] = vfmaq_f32(acc[t][h], s, vmulq_lane_f32::<1>(d[h], sx));
                    if W::MIN {
                        accm[t][h] = vfmaq_lane_f32::<0>(accm[t][h], m[h], sx);
                    }
                }
            }
        }
        for t in 0..NX {
            for h in 0..2 {
                let v = if W::MIN {
                    vaddq_f32(acc[t][h], accm[t][h])
                } else {
                    acc[t][h]
                };
                vst1q_f32(a.out.add(t * a.out_stride + 8 * g + 4 * h), v);
            }
        }
    }
    if let Some(rest) = rows_past_groups(a) {
        legacy_8bit_n::<Sdot, W, NX>(&rest);
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn legacy_rows8<W: Rows8W>(a: &MatArgs) {
    by_nx!(a, legacy_rows8_n, W)
}

/// Q6_K in the rows-by-8 layout (`packed::units`: the 8 rows' d, their 16 scales as four
/// words each, then `ql` and `qh` in 4-byte chunks) × Q8_K activation rows. Per group of 16
/// elements the 4 rows' sums come out of 4 `sdot`s by element, started from `-32·Σx` of the
/// group (the codes are stored unsigned, 0..64) and scaled by the 4 rows' scales in one
/// multiply-add: `Σ w·x = d·dx·Σ_g sc_g·(Σ q·x - 32·Σx)`, [`q6k_8bit_n`]'s chain.
#[inline(always)]
unsafe fn q6k_rows8_n<const NX: usize>(a: &MatArgs) {
    const BB: usize = 210;
    let nb = a.k / 256;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    for g in 0..a.rows / 8 {
        let gw = a.w.add(8 * g * a.w_stride);
        let mut acc = [[vdupq_n_f32(0.0); 2]; NX];
        for b in 0..nb {
            let blk = gw.add(8 * b * BB);
            let d = [0, 1].map(|h| cvt_f16x4(vld1_u16((blk as *const u16).add(4 * h))));
            // Scale words: word w of rows 0-3 at 16 + 32w, of rows 4-7 16 bytes on.
            let sw: [[int32x4_t; 2]; 4] = core::array::from_fn(|w| {
                [0, 1].map(|h| vld1q_s32(blk.add(16 + 32 * w + 16 * h) as *const i32))
            });
            let (ql, qh) = (blk.add(144), blk.add(144 + 1024));
            // Per activation row: -32·(Σx of each group of 16), as i32.
            let neg: [[int32x4_t; 4]; NX] = core::array::from_fn(|t| {
                let bs = xs[t].add(b * Q8K_BB + 260) as *const i16;
                let (lo, hi) = (vld1q_s16(bs), vld1q_s16(bs.add(8)));
                [
                    vmovl_s16(vget_low_s16(lo)),
                    vmovl_high_s16(lo),
                    vmovl_s16(vget_low_s16(hi)),
                    vmovl_high_s16(hi),
                ]
                .map(|v| vshlq_n_s32::<5>(vnegq_s32(v)))
            });
            let mut isum = [[vdupq_n_s32(0); 2]; NX];
            for n in 0..2 {
                for jq in 0..2 {
                    q6k_quad::<NX>(&mut isum, &sw, &neg, ql, qh, xs, b, n, jq);
                }
            }
            for t in 0..NX {
                let dx = (xs[t].add(b * Q8K_BB) as *const f32).read_unaligned();
                for h in 0..2 {
                    let s = vmulq_n_f32(d[h], dx);
                    acc[t][h] = vfmaq_f32(acc[t][h], vcvtq_f32_s32(isum[t][h]), s);
                }
            }
        }
        for t in 0..NX {
            for h in 0..2 {
                vst1q_f32(a.out.add(t * a.out_stride + 8 * g + 4 * h), acc[t][h]);
            }
        }
    }
    if let Some(rest) = rows_past_groups(a) {
        q6k_8bit_n::<Sdot, NX>(&rest);
    }
}

/// Lane `j` of each i32 lane's four bytes, sign-extended: scale `4w + j` of 4 rows.
#[inline(always)]
unsafe fn scale_byte(w: int32x4_t, j: usize) -> int32x4_t {
    match j {
        0 => vshrq_n_s32::<24>(vshlq_n_s32::<24>(w)),
        1 => vshrq_n_s32::<24>(vshlq_n_s32::<16>(w)),
        2 => vshrq_n_s32::<24>(vshlq_n_s32::<8>(w)),
        _ => vshrq_n_s32::<24>(w),
    }
}

/// Half `n` (elements 128n..128n+128), quad `jq` of its 4-byte positions: the four groups of
/// 16 (`8n + jq + 2u`, u = 0..4: codes from the low nibbles of `ql` chunks `16n + 4jq + s`
/// and `16n + 8 + 4jq + s` and from `qh` chunk `8n + 4jq + s`, s = 0..4).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn q6k_quad<const NX: usize>(
    isum: &mut [[int32x4_t; 2]; NX],
    sw: &[[int32x4_t; 2]; 4],
    neg: &[[int32x4_t; 4]; NX],
    ql: *const u8,
    qh: *const u8,
    xs: [*const u8; NX],
    b: usize,
    n: usize,
    jq: usize,
) {
    // Codes of step s for element groups u = 0..4, rows 4h..4h+4.
    let codes = |s: usize, h: usize| -> [int8x16_t; 4] {
        let l0 = vld1q_u8(ql.add(32 * (16 * n + 4 * jq + s) + 16 * h));
        let l1 = vld1q_u8(ql.add(32 * (16 * n + 8 + 4 * jq + s) + 16 * h));
        let hb = vld1q_u8(qh.add(32 * (8 * n + 4 * jq + s) + 16 * h));
        let m3 = vdupq_n_u8(3);
        let m30 = vdupq_n_u8(0x30);
        [
            vsliq_n_u8::<4>(l0, vandq_u8(hb, m3)),
            vsliq_n_u8::<4>(l1, vandq_u8(vshrq_n_u8::<2>(hb), m3)),
            vsriq_n_u8::<4>(vandq_u8(hb, m30), l0),
            vsriq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(hb), m30), l1),
        ]
        .map(|v| vreinterpretq_s8_u8(v))
    };
    for h in 0..2 {
        let c = [codes(0, h), codes(1, h), codes(2, h), codes(3, h)];
        for u in 0..4 {
            let grp = 8 * n + jq + 2 * u;
            let sc = scale_byte(sw[grp / 4][h], grp % 4);
            for t in 0..NX {
                let x = vld1q_s8(xs[t].add(b * Q8K_BB + 4 + 16 * grp) as *const i8);
                let bias = vdupq_laneq_s32_dyn(neg[t][grp / 4], grp % 4);
                let mut p = sdot_lane::<0>(bias, c[0][u], x);
                p = sdot_lane::<1>(p, c[1][u], x);
                p = sdot_lane::<2>(p, c[2][u], x);
                p = sdot_lane::<3>(p, c[3][u], x);
                isum[t][h] = vmlaq_s32(isum[t][h], p, sc);
            }
        }
    }
}

/// `vdupq_laneq_s32` with a lane known only after unrolling.
#[inline(always)]
unsafe fn vdupq_laneq_s32_dyn(v: int32x4_t, lane: usize) -> int32x4_t {
    match lane {
        0 => vdupq_laneq_s32::<0>(v),
        1 => vdupq_laneq_s32::<1>(v),
        2 => vdupq_laneq_s32::<2>(v),
        _ => vdupq_laneq_s32::<3>(v),
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn q6k_rows8(a: &MatArgs) {
    by_nx!(a, q6k_rows8_n)
}
