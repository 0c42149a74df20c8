//! 8-bit kernels for several activation rows at once (prompts, batched decode rows), over
//! the rows-by-8 weight layout and activations interleaved in pairs of rows.
//!
//! **The pair layout** ([`crate::kernels::matmul::interleave_pairs`]): Q8_1 activation rows are taken two at a time
//! (`a`, `b`; a lone last row is paired with zeros), and each pair's blocks are stored block
//! by block, 96 bytes each: the 32 codes as four 8-byte octets, octet `j` of `a` at `16j`,
//! of `b` at `16j + 8`; then `[dx_a, dx_b, dx_a, dx_b]` (f32) and `[s_a, s_b, s_a, s_b]`
//! (`s = dx·Σq`, the Q8_1 side values). One 16-byte load is then what `smmla` multiplies
//! (two rows by 8 codes) and what `sdot` by element reads (lanes 0-1 for `a`, 2-3 for `b`).
//!
//! Each weight block's codes are decoded once for up to [`PAIR_ROWS`] activation rows, 4
//! weight rows (half a group) at a time. Every output is the chain of the matrix-vector
//! kernels (`rows8`, `int8`): per block `acc = fma(float(Σ c·q), d·dx, acc)` and `accm =
//! fma(m, s, accm)`, then `acc + accm`, so a row's result does not depend on the path or on
//! how many rows share the step.

use super::rows8::{sdot_lane, Rows8W};
use super::*;
use crate::kernels::matmul::{PAIR_BB, PAIR_ROWS};

/// The two levels' products of 4 weight rows with an activation pair.
pub(in crate::kernels) trait PairMul {
    /// The decoded codes of 4 rows in the form [`Self::sums`] takes.
    type Codes: Copy;
    /// `c[S] = [A, B]`: the codes of step `S` ([`Rows8W::step`]).
    unsafe fn codes(c: [[int8x16_t; 2]; 4]) -> Self::Codes;
    /// The integer sums of the 4 rows with the pair's octets `x` (`Σ c·q`, as many times
    /// 2^FRAC): two vectors in the level's orientation ([`Self::d_lanes`]).
    unsafe fn sums(c: &Self::Codes, x: &[int8x16_t; 4]) -> [int32x4_t; 2];
    /// The 4 rows' per-row values `v` (d or m) in the lanes of [`Self::sums`]' two vectors,
    /// and the pair's side vector `[v_a, v_b, v_a, v_b]` likewise.
    unsafe fn d_lanes(v: float32x4_t) -> [float32x4_t; 2];
    unsafe fn x_lanes(side: float32x4_t) -> [float32x4_t; 2];
    /// Writes the two accumulated vectors as rows `a` and (if `both`) `b` of 4 outputs.
    unsafe fn store(acc: [float32x4_t; 2], out_a: *mut f32, out_b: *mut f32, both: bool);
}

/// dotprod: `sdot` by element; vector 0 holds the 4 rows' sums for `a`, vector 1 for `b`.
pub(in crate::kernels) struct PairSdot;
/// i8mm: `smmla`; vector 0 holds `[r0·a, r0·b, r1·a, r1·b]`, vector 1 rows 2 and 3.
pub(in crate::kernels) struct PairMmla;

impl PairMul for PairSdot {
    type Codes = [[int8x16_t; 2]; 4];
    #[inline(always)]
    unsafe fn codes(c: [[int8x16_t; 2]; 4]) -> Self::Codes {
        c
    }
    #[inline(always)]
    unsafe fn sums(c: &Self::Codes, x: &[int8x16_t; 4]) -> [int32x4_t; 2] {
        // A_S multiplies elements 4S..4S+4: octet S/2, lane S%2 (a) or 2 + S%2 (b); B_S
        // elements 16 + 4S..: octet 2 + S/2.
        let mut pa = vdupq_n_s32(0);
        let mut pb = vdupq_n_s32(0);
        pa = sdot_lane::<0>(pa, c[0][0], x[0]);
        pb = sdot_lane::<2>(pb, c[0][0], x[0]);
        pa = sdot_lane::<1>(pa, c[1][0], x[0]);
        pb = sdot_lane::<3>(pb, c[1][0], x[0]);
        pa = sdot_lane::<0>(pa, c[2][0], x[1]);
        pb = sdot_lane::<2>(pb, c[2][0], x[1]);
        pa = sdot_lane::<1>(pa, c[3][0], x[1]);
        pb = sdot_lane::<3>(pb, c[3][0], x[1]);
        pa = sdot_lane::<0>(pa, c[0][1], x[2]);
        pb = sdot_lane::<2>(pb, c[0][1], x[2]);
        pa = sdot_lane::<1>(pa, c[1][1], x[2]);
        pb = sdot_lane::<3>(pb, c[1][1], x[2]);
        pa = sdot_lane::<0>(pa, c[2][1], x[3]);
        pb = sdot_lane::<2>(pb, c[2][1], x[3]);
        pa = sdot_lane::<1>(pa, c[3][1], x[3]);
        pb = sdot_lane::<3>(pb, c[3][1], x[3]);
        [pa, pb]
    }
    #[inline(always)]
    unsafe fn d_lanes(v: float32x4_t) -> [float32x4_t; 2] {
        [v, v]
    }
    #[inline(always)]
    unsafe fn x_lanes(side: float32x4_t) -> [float32x4_t; 2] {
        [vdupq_laneq_f32::<0>(side), vdupq_laneq_f32::<1>(side)]
    }
    #[inline(always)]
    unsafe fn store(acc: [float32x4_t; 2], out_a: *mut f32, out_b: *mut f32, both: bool) {
        vst1q_f32(out_a, acc[0]);
        if both {
            vst1q_f32(out_b, acc[1]);
        }
    }
}

/// `acc + a·bᵀ` for `a`, `b` two rows of 8 signed bytes each (`smmla`): lanes `[a0·b0,
/// a0·b1, a1·b0, a1·b1]`.
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only; only the i8mm level's entry points (`#[target_feature(enable =
    // "i8mm")]`, dispatched where the CPU has it) reach this.
    unsafe {
        asm!(
            ".arch_extension i8mm",
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

impl PairMul for PairMmla {
    /// `[rows 0-1, rows 2-3]` × octet `j`: the two rows' 8 codes of elements `8j..8j + 8`.
    type Codes = [[int8x16_t; 4]; 2];
    #[inline(always)]
    unsafe fn codes(c: [[int8x16_t; 2]; 4]) -> Self::Codes {
        // Step S holds 4 bytes of each row (elements 4S.. in A, 16 + 4S.. in B): zipping
        // steps 2j and 2j + 1 by 32-bit lanes gives rows 0-1's octet, then rows 2-3's.
        let z = |u: int8x16_t, v: int8x16_t| {
            let (u, v) = (vreinterpretq_s32_s8(u), vreinterpretq_s32_s8(v));
            [
                vreinterpretq_s8_s32(vzip1q_s32(u, v)),
                vreinterpretq_s8_s32(vzip2q_s32(u, v)),
            ]
        };
        let o = [
            z(c[0][0], c[1][0]),
            z(c[2][0], c[3][0]),
            z(c[0][1], c[1][1]),
            z(c[2][1], c[3][1]),
        ];
        [
            [o[0][0], o[1][0], o[2][0], o[3][0]],
            [o[0][1], o[1][1], o[2][1], o[3][1]],
        ]
    }
    #[inline(always)]
    unsafe fn sums(c: &Self::Codes, x: &[int8x16_t; 4]) -> [int32x4_t; 2] {
        core::array::from_fn(|h| {
            let mut p = vdupq_n_s32(0);
            for j in 0..4 {
                p = smmla(p, c[h][j], x[j]);
            }
            p
        })
    }
    #[inline(always)]
    unsafe fn d_lanes(v: float32x4_t) -> [float32x4_t; 2] {
        [vzip1q_f32(v, v), vzip2q_f32(v, v)]
    }
    #[inline(always)]
    unsafe fn x_lanes(side: float32x4_t) -> [float32x4_t; 2] {
        [side, side]
    }
    #[inline(always)]
    unsafe fn store(acc: [float32x4_t; 2], out_a: *mut f32, out_b: *mut f32, both: bool) {
        vst1q_f32(out_a, vuzp1q_f32(acc[0], acc[1]));
        if both {
            vst1q_f32(out_b, vuzp2q_f32(acc[0], acc[1]));
        }
    }
}

/// 32-element weights in the rows-by-8 layout × `NP` activation pairs (`a.x`, `a.x_stride`
/// bytes apart, `a.nx` rows: `2·NP` or one fewer) for the whole groups of `a.rows`.
#[inline(always)]
unsafe fn legacy_pairs_n<M: PairMul, W: Rows8W, const NP: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    for g in 0..a.rows / 8 {
        let gw = a.w.add(8 * g * a.w_stride);
        for h in 0..2 {
            let mut acc = [[vdupq_n_f32(0.0); 2]; NP];
            let mut accm = [[vdupq_n_f32(0.0); 2]; NP];
            for b in 0..nb {
                let blk = gw.add(8 * b * W::BB);
                let qh = if W::QH > 0 {
                    vld1q_u8(blk.add(W::QH + 16 * h))
                } else {
                    vdupq_n_u8(0)
                };
                let c = M::codes([
                    W::step::<0>(blk, qh, h),
                    W::step::<1>(blk, qh, h),
                    W::step::<2>(blk, qh, h),
                    W::step::<3>(blk, qh, h),
                ]);
                let d = M::d_lanes(cvt_f16x4(vld1_u16((blk as *const u16).add(4 * h))));
                let m = if W::MIN {
                    M::d_lanes(cvt_f16x4(vld1_u16(
                        (blk.add(W::M) as *const u16).add(4 * h),
                    )))
                } else {
                    [vdupq_n_f32(0.0); 2]
                };
                unroll8!(p < NP, {
                    let xb = a.x.add(p * a.x_stride + b * PAIR_BB);
                    let x = [0, 1, 2, 3].map(|j| vld1q_s8((xb as *const i8).add(16 * j)));
                    let s = M::sums(&c, &x);
                    let dx = M::x_lanes(vld1q_f32(xb.add(64) as *const f32));
                    for i in 0..2 {
                        let f = if W::FRAC == 4 {
                            vcvtq_n_f32_s32::<4>(s[i])
                        } else {
                            vcvtq_f32_s32(s[i])
                        };
                        acc[p][i] = vfmaq_f32(acc[p][i], f, vmulq_f32(d[i], dx[i]));
                    }
                    if W::MIN {
                        let sx = M::x_lanes(vld1q_f32(xb.add(80) as *const f32));
                        for i in 0..2 {
                            accm[p][i] = vfmaq_f32(accm[p][i], m[i], sx[i]);
                        }
                    }
                });
            }
            for p in 0..NP {
                let v = if W::MIN {
                    [0, 1].map(|i| vaddq_f32(acc[p][i], accm[p][i]))
                } else {
                    acc[p]
                };
                let o = a.out.add(2 * p * a.out_stride + 8 * g + 4 * h);
                M::store(v, o, o.add(a.out_stride), 2 * p + 1 < a.nx);
            }
        }
    }
}

/// [`legacy_pairs_n`] with the call's pair count: up to 16 activation rows per weight pass
/// (the formats with an offset, whose second accumulator would not fit the registers: 8).
#[inline(always)]
pub(in crate::kernels) unsafe fn legacy_pairs<M: PairMul, W: Rows8W>(a: &MatArgs) {
    let most = if W::MIN { 8 } else { PAIR_ROWS };
    for t0 in (0..a.nx).step_by(most) {
        let a = &MatArgs {
            x: a.x.add(t0 / 2 * a.x_stride),
            nx: most.min(a.nx - t0),
            out: a.out.add(t0 * a.out_stride),
            ..*a
        };
        legacy_pairs_np::<M, W>(a);
    }
}

#[inline(always)]
unsafe fn legacy_pairs_np<M: PairMul, W: Rows8W>(a: &MatArgs) {
    match a.nx.div_ceil(2) {
        1 => legacy_pairs_n::<M, W, 1>(a),
        2 => legacy_pairs_n::<M, W, 2>(a),
        3 => legacy_pairs_n::<M, W, 3>(a),
        4 => legacy_pairs_n::<M, W, 4>(a),
        5 => legacy_pairs_n::<M, W, 5>(a),
        6 => legacy_pairs_n::<M, W, 6>(a),
        7 => legacy_pairs_n::<M, W, 7>(a),
        _ => legacy_pairs_n::<M, W, 8>(a),
    }
}
