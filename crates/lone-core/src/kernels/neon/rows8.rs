//! 8-bit kernels over the rows-by-8 layout ([`crate::kernels::packed`]), dotprod level: the
//! 8 rows of a group are interleaved 4 bytes at a time, so one `sdot` by element multiplies
//! 4 bytes of 4 rows by the same 4 activation bytes and leaves the 4 rows' sums in its 4
//! lanes. No horizontal sums, and the per-row scales (f16 `d`, `m`; K-quant sub-block
//! scales) apply as vectors over 4 rows, loaded together.
//!
//! The rows past a matrix's last whole group keep the stored layout and take the row-by-row
//! kernels ([`super::int8`]), whose per-block chain these repeat.

use super::int8::{legacy_8bit_n, q23k_8bit_n, q6k_8bit_n, Q8K_BB, Q8_1_BB};
use super::*;
use crate::kernels::matmul::Q8_1_SIDE;
use crate::kernels::packed::rows_past_groups;

/// `acc + Σ_j w[4i + j]·x[4L + j]` in lane `i` (`sdot` by element).
#[inline(always)]
pub(super) unsafe fn sdot_lane<const L: i32>(
    acc: int32x4_t,
    w: int8x16_t,
    x: int8x16_t,
) -> int32x4_t {
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
    /// Codes of step `S` (0..4) for rows `4h..4h+4`: `[A, B]`, A multiplying activation
    /// elements `4S..4S+4`, B elements `16 + 4S..16 + 4S + 4`, four bytes per row; `qh`: the
    /// 4 rows' rearranged high-bit words (Q5 formats).
    unsafe fn step<const S: i32>(blk: *const u8, qh: uint8x16_t, h: usize) -> [int8x16_t; 2];
}

/// Rows `4h..4h+4` of chunk `s` of a 4-bit group block (32 bytes: bytes `4s..4s+4` of rows
/// 0-3, then 4-7).
#[inline(always)]
unsafe fn chunk(qs: *const u8, s: i32, h: usize) -> uint8x16_t {
    vld1q_u8(qs.add(32 * s as usize + 16 * h))
}

/// Low and high nibbles of a chunk, with the fifth bits of step `s` from the rearranged
/// high-bit words when `FIVE` ([`crate::kernels::packed::high_bits_by_chunk`]), less `off`.
#[inline(always)]
unsafe fn nibble_step<const FIVE: bool>(
    v: uint8x16_t,
    qh: uint8x16_t,
    s: i32,
    off: i8,
) -> [int8x16_t; 2] {
    let mut lo = vandq_u8(v, vdupq_n_u8(0x0f));
    let mut hi = vshrq_n_u8::<4>(v);
    if FIVE {
        // Bit 4 from the shifted word, the rest from the nibble (whose bit 4 is clear).
        let m = vdupq_n_u8(0x10);
        lo = vbslq_u8(m, vshlq_u8(qh, vdupq_n_s8(4 - s as i8)), lo);
        hi = vbslq_u8(m, vshlq_u8(qh, vdupq_n_s8(-s as i8)), hi);
    }
    let f = |u: uint8x16_t| vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(off));
    [f(lo), f(hi)]
}

impl Rows8W for WQ4_0 {
    const M: usize = 0;
    const QH: usize = 0;
    const QS: usize = 16;
    const FRAC: i32 = 4;
    #[inline(always)]
    unsafe fn step<const S: i32>(blk: *const u8, _: uint8x16_t, h: usize) -> [int8x16_t; 2] {
        // c ^ 8 in each nibble, moved to the top: the signed byte (c - 8)·16.
        let v = veorq_u8(chunk(blk.add(Self::QS), S, h), vdupq_n_u8(0x88));
        [
            vreinterpretq_s8_u8(vshlq_n_u8::<4>(v)),
            vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0xf0))),
        ]
    }
}

/// The nibble formats' [`Rows8W`]: field offsets, five bits or four, the code offset.
macro_rules! nibble_rows8 {
    ($w:ty, m: $m:expr, qh: $qh:expr, qs: $qs:expr, five: $five:expr, off: $off:expr) => {
        impl Rows8W for $w {
            const M: usize = $m;
            const QH: usize = $qh;
            const QS: usize = $qs;
            const FRAC: i32 = 0;
            #[inline(always)]
            unsafe fn step<const S: i32>(
                blk: *const u8,
                qh: uint8x16_t,
                h: usize,
            ) -> [int8x16_t; 2] {
                nibble_step::<$five>(chunk(blk.add(Self::QS), S, h), qh, S, $off)
            }
        }
    };
}

nibble_rows8!(WQ4_1, m: 16, qh: 0, qs: 32, five: false, off: 0);
nibble_rows8!(WQ5_0, m: 0, qh: 16, qs: 48, five: true, off: 16);
nibble_rows8!(WQ5_1, m: 16, qh: 32, qs: 64, five: true, off: 0);

impl Rows8W for WQ8_0 {
    const M: usize = 0;
    const QH: usize = 0;
    const QS: usize = 16;
    const FRAC: i32 = 0;
    #[inline(always)]
    unsafe fn step<const S: i32>(blk: *const u8, _: uint8x16_t, h: usize) -> [int8x16_t; 2] {
        let p = (blk.add(Self::QS) as *const i8).add(32 * S as usize + 16 * h);
        [vld1q_s8(p), vld1q_s8(p.add(128))]
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
    let [a0, b0] = W::step::<S>(blk, qh[0], 0);
    let [a1, b1] = W::step::<S>(blk, qh[1], 1);
    let (a, b) = ([a0, a1], [b0, b1]);
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

/// A K-quant in the rows-by-8 layout ([`crate::kernels::packed`]) with 16 groups of 16 per
/// 256-element block, each with an integer scale: Q2_K, Q3_K, Q6_K. Codes are unsigned (Q3_K's
/// and Q6_K's offsets, 4 and 32, come off through the activations' sums of 16).
pub(in crate::kernels) trait KRows8 {
    /// Bytes per block (per row).
    const BB: usize;
    /// The offset taken off every code.
    const OFF: i32;
    /// The format has mins (Q2_K): `- dmin·Σ_g m_g·Σx`.
    const MIN: bool;
    /// d (and dmin) of rows `4h..4h+4` of a group block: the block's leading 8 f16 (and the
    /// next 8, for the formats with mins).
    #[inline(always)]
    unsafe fn d(blk: *const u8, h: usize) -> (float32x4_t, float32x4_t) {
        let p = blk as *const u16;
        let dmin = if Self::MIN {
            cvt_f16x4(vld1_u16(p.add(8 + 4 * h)))
        } else {
            vdupq_n_f32(0.0)
        };
        (cvt_f16x4(vld1_u16(p.add(4 * h))), dmin)
    }
    /// The 16 groups' scales (and mins) of rows `4h..4h+4`, one row per lane.
    unsafe fn scales(blk: *const u8, h: usize) -> ([int32x4_t; 16], [int32x4_t; 16]);
    /// The row-by-row kernel over the stored layout (the rows past a matrix's last group).
    unsafe fn stored_rows<const NX: usize>(a: &MatArgs);
    /// Rows `4h..4h+4`, half `n` (elements 128n..), quarter `lq`: `c[s][u]` are 4 codes of
    /// each row in group `8n + lq + 2u`, multiplying activation bytes `4s..4s+4` of the group.
    unsafe fn codes(blk: *const u8, n: usize, lq: usize, h: usize) -> [[int8x16_t; 4]; 4];
}

pub(in crate::kernels) struct KR2;
pub(in crate::kernels) struct KR3;
pub(in crate::kernels) struct KR6;

/// Byte `j` of each i32 lane, sign-extended: the lanes' (rows') `j`-th of four byte fields.
#[inline(always)]
unsafe fn scale_byte(w: int32x4_t, j: usize) -> int32x4_t {
    match j {
        0 => vshrq_n_s32::<24>(vshlq_n_s32::<24>(w)),
        1 => vshrq_n_s32::<24>(vshlq_n_s32::<16>(w)),
        2 => vshrq_n_s32::<24>(vshlq_n_s32::<8>(w)),
        _ => vshrq_n_s32::<24>(w),
    }
}

/// Word `w` of 4 rows (rows `4h..4h+4`), at `at + 32w + 16h` of a group block.
#[inline(always)]
unsafe fn word4(blk: *const u8, at: usize, w: usize, h: usize) -> uint8x16_t {
    vld1q_u8(blk.add(at + 32 * w + 16 * h))
}

/// The scales of 16 groups from four words of four byte fields each.
#[inline(always)]
unsafe fn bytes16(w: [uint8x16_t; 4]) -> [int32x4_t; 16] {
    core::array::from_fn(|g| scale_byte(vreinterpretq_s32_u8(w[g / 4]), g % 4))
}

/// Half `n`, quarter `lq`'s 2-bit codes of Q2_K / Q3_K (code `u`: bits `2u` of `qs` chunk
/// `8n + 4lq + s`, at `qs`) for rows `4h..`, with Q3_K's high bit `4n + u` of `hmask`
/// chunk `4lq + s` (at `hm`) as bit 2.
#[inline(always)]
unsafe fn codes23<const THREE: bool>(
    qs: *const u8,
    hm: *const u8,
    n: usize,
    lq: usize,
    h: usize,
) -> [[int8x16_t; 4]; 4] {
    core::array::from_fn(|s| {
        let q = vld1q_u8(qs.add(32 * (8 * n + 4 * lq + s) + 16 * h));
        let hb = if THREE {
            vld1q_u8(hm.add(32 * (4 * lq + s) + 16 * h))
        } else {
            vdupq_n_u8(0)
        };
        core::array::from_fn(|u| {
            let c = vandq_u8(vshlq_u8(q, vdupq_n_s8(-2 * u as i8)), vdupq_n_u8(3));
            let c = if THREE {
                let p = (4 * n + u) as i8;
                vbslq_u8(vdupq_n_u8(4), vshlq_u8(hb, vdupq_n_s8(2 - p)), c)
            } else {
                c
            };
            vreinterpretq_s8_u8(c)
        })
    })
}

/// Q2_K rows by 8: d, dmin (16 bytes each), the 16 scale bytes (4 words: low nibble scale,
/// high nibble min), `qs` (16 words).
impl KRows8 for KR2 {
    const BB: usize = 84;
    const OFF: i32 = 0;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn stored_rows<const NX: usize>(a: &MatArgs) {
        q23k_8bit_n::<Sdot, false, NX>(a)
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, h: usize) -> ([int32x4_t; 16], [int32x4_t; 16]) {
        let w: [uint8x16_t; 4] = core::array::from_fn(|w| word4(blk, 32, w, h));
        (
            bytes16(w.map(|v| vandq_u8(v, vdupq_n_u8(0x0f)))),
            bytes16(w.map(|v| vshrq_n_u8::<4>(v))),
        )
    }
    #[inline(always)]
    unsafe fn codes(blk: *const u8, n: usize, lq: usize, h: usize) -> [[int8x16_t; 4]; 4] {
        codes23::<false>(blk.add(160), blk, n, lq, h)
    }
}

/// Q3_K rows by 8: d (16 bytes), the 12 scale bytes (3 words), `hmask` (8 words), `qs`
/// (16 words).
impl KRows8 for KR3 {
    const BB: usize = 110;
    const OFF: i32 = 4;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn stored_rows<const NX: usize>(a: &MatArgs) {
        q23k_8bit_n::<Sdot, true, NX>(a)
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, h: usize) -> ([int32x4_t; 16], [int32x4_t; 16]) {
        // Scale 4Q + j: low nibble from word Q % 2 (nibble Q / 2), high bits 2Q of word 2.
        let (w0, w1, w2) = (
            word4(blk, 16, 0, h),
            word4(blk, 16, 1, h),
            word4(blk, 16, 2, h),
        );
        let m4 = vdupq_n_u8(0x0f);
        let m3 = vdupq_n_u8(3);
        let q: [uint8x16_t; 4] = [
            vorrq_u8(vandq_u8(w0, m4), vshlq_n_u8::<4>(vandq_u8(w2, m3))),
            vorrq_u8(
                vandq_u8(w1, m4),
                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(w2), m3)),
            ),
            vorrq_u8(
                vshrq_n_u8::<4>(w0),
                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(w2), m3)),
            ),
            vorrq_u8(vshrq_n_u8::<4>(w1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(w2))),
        ];
        let q = q.map(|v| vsubq_u8(v, vdupq_n_u8(32)));
        (bytes16(q), [vdupq_n_s32(0); 16])
    }
    #[inline(always)]
    unsafe fn codes(blk: *const u8, n: usize, lq: usize, h: usize) -> [[int8x16_t; 4]; 4] {
        codes23::<true>(blk.add(368), blk.add(112), n, lq, h)
    }
}

/// Q6_K rows by 8: d (16 bytes), the 16 scales (4 words), `ql` (32 words), `qh` (16 words).
impl KRows8 for KR6 {
    const BB: usize = 210;
    const OFF: i32 = 32;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn stored_rows<const NX: usize>(a: &MatArgs) {
        q6k_8bit_n::<Sdot, NX>(a)
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8, h: usize) -> ([int32x4_t; 16], [int32x4_t; 16]) {
        let w: [uint8x16_t; 4] = core::array::from_fn(|w| word4(blk, 16, w, h));
        (bytes16(w), [vdupq_n_s32(0); 16])
    }
    /// Codes from the low nibbles of `ql` chunks `16n + 4lq + s` (groups u = 0, 2) and
    /// `16n + 8 + 4lq + s` (u = 1, 3), their high two bits from `qh` chunk `8n + 4lq + s`.
    #[inline(always)]
    unsafe fn codes(blk: *const u8, n: usize, lq: usize, h: usize) -> [[int8x16_t; 4]; 4] {
        let (ql, qh) = (blk.add(144), blk.add(144 + 1024));
        core::array::from_fn(|s| {
            let l0 = vld1q_u8(ql.add(32 * (16 * n + 4 * lq + s) + 16 * h));
            let l1 = vld1q_u8(ql.add(32 * (16 * n + 8 + 4 * lq + s) + 16 * h));
            let hb = vld1q_u8(qh.add(32 * (8 * n + 4 * lq + s) + 16 * h));
            let m3 = vdupq_n_u8(3);
            let m30 = vdupq_n_u8(0x30);
            [
                vsliq_n_u8::<4>(l0, vandq_u8(hb, m3)),
                vsliq_n_u8::<4>(l1, vandq_u8(vshrq_n_u8::<2>(hb), m3)),
                vsriq_n_u8::<4>(vandq_u8(hb, m30), l0),
                vsriq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(hb), m30), l1),
            ]
            .map(|v| vreinterpretq_s8_u8(v))
        })
    }
}

/// `vdupq_laneq_s32` with a lane known only after unrolling.
#[inline(always)]
unsafe fn lane_dup(v: int32x4_t, lane: usize) -> int32x4_t {
    match lane {
        0 => vdupq_laneq_s32::<0>(v),
        1 => vdupq_laneq_s32::<1>(v),
        2 => vdupq_laneq_s32::<2>(v),
        _ => vdupq_laneq_s32::<3>(v),
    }
}

/// A K-quant in the rows-by-8 layout × Q8_K activation rows. Per group of 16 elements, the 4
/// rows' sums come out of 4 `sdot`s by element started from `-OFF·Σx` of the group, and are
/// scaled by the 4 rows' scales in one multiply-add: per block `acc = fma(float(Σ_g sc_g·(Σ
/// q·x - OFF·Σx)), d·dx, acc)` and for Q2_K `accm = fma(float(Σ_g m_g·Σx), dmin·dx, accm)`,
/// then `acc - accm` — the row-by-row kernels' chain, which take the rows past the last group.
#[inline(always)]
unsafe fn k_rows8_n<K: KRows8, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    for g in 0..a.rows / 8 {
        let gw = a.w.add(8 * g * a.w_stride);
        let mut acc = [[vdupq_n_f32(0.0); 2]; NX];
        let mut accm = [[vdupq_n_f32(0.0); 2]; NX];
        for b in 0..nb {
            let blk = gw.add(8 * b * K::BB);
            // Per activation row: the sums of each group of 16 as i32, and -OFF times them.
            let bs: [[int32x4_t; 4]; NX] = core::array::from_fn(|t| {
                let p = xs[t].add(b * Q8K_BB + 260) as *const i16;
                let (lo, hi) = (vld1q_s16(p), vld1q_s16(p.add(8)));
                [
                    vmovl_s16(vget_low_s16(lo)),
                    vmovl_high_s16(lo),
                    vmovl_s16(vget_low_s16(hi)),
                    vmovl_high_s16(hi),
                ]
            });
            let neg: [[int32x4_t; 4]; NX] =
                core::array::from_fn(|t| bs[t].map(|v| vmulq_n_s32(v, -K::OFF)));
            for h in 0..2 {
                let (sc, mn) = K::scales(blk, h);
                let mut isum = [vdupq_n_s32(0); NX];
                // Unrolled whole (LLVM keeps these loops rolled, and the scales in memory).
                unroll8!(nl < 4, {
                    let (n, lq) = (nl / 2, nl % 2);
                    let c = K::codes(blk, n, lq, h);
                    unroll8!(u < 4, {
                        let grp = 8 * n + lq + 2 * u;
                        unroll8!(t < NX, {
                            let x = vld1q_s8(xs[t].add(b * Q8K_BB + 4 + 16 * grp) as *const i8);
                            let mut p = if K::OFF != 0 {
                                lane_dup(neg[t][grp / 4], grp % 4)
                            } else {
                                vdupq_n_s32(0)
                            };
                            p = sdot_lane::<0>(p, c[0][u], x);
                            p = sdot_lane::<1>(p, c[1][u], x);
                            p = sdot_lane::<2>(p, c[2][u], x);
                            p = sdot_lane::<3>(p, c[3][u], x);
                            isum[t] = vmlaq_s32(isum[t], p, sc[grp]);
                        });
                    });
                });
                let (d, dmin) = K::d(blk, h);
                for t in 0..NX {
                    let dx = (xs[t].add(b * Q8K_BB) as *const f32).read_unaligned();
                    acc[t][h] = vfmaq_f32(acc[t][h], vcvtq_f32_s32(isum[t]), vmulq_n_f32(d, dx));
                    if K::MIN {
                        let mut ms = vdupq_n_s32(0);
                        for grp in 0..16 {
                            ms = vmlaq_s32(ms, mn[grp], lane_dup(bs[t][grp / 4], grp % 4));
                        }
                        let s = vmulq_n_f32(dmin, dx);
                        accm[t][h] = vfmaq_f32(accm[t][h], vcvtq_f32_s32(ms), s);
                    }
                }
            }
        }
        for t in 0..NX {
            for h in 0..2 {
                let v = if K::MIN {
                    vsubq_f32(acc[t][h], accm[t][h])
                } else {
                    acc[t][h]
                };
                vst1q_f32(a.out.add(t * a.out_stride + 8 * g + 4 * h), v);
            }
        }
    }
    if let Some(rest) = rows_past_groups(a) {
        K::stored_rows::<NX>(&rest);
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn k_rows8<K: KRows8>(a: &MatArgs) {
    by_nx!(a, k_rows8_n, K)
}
