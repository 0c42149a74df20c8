//! The codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the
//! ternary formats (TQ1_0, TQ2_0) on NEON: a 256-element super-block decoded to 16 groups of
//! 16 signed codes, each group with its f32 scale ([`KExact`], so the K-quants' exact kernel
//! [`k_exact`] and row dequantizer `deq_k` take them as they are), and the 8-bit kernel
//! [`grid_8bit`] over the same decode against Q8_1 activation blocks (x86's pairing,
//! `x86::iqgrid`, so both ISAs multiply the same numbers).
//!
//! The codes, times the scale, are the reference's weights exactly (`quant::iqgrid`): IQ2's
//! and IQ3's `db·level·±1` as `db·(±level)`; IQ1's `dl·(level ± 1/8)` as `(dl/8)·(8·level ±
//! 1)` (codes in −9..=9: `dl/8` is exact, so both round the same real product once); the
//! ternary formats' `(trit − 1)·d`. Grid points are loaded 8 (IQ2, IQ1) or 4 (IQ3) bytes at
//! a time straight from the shared tables into vector lanes; the signs are applied with byte
//! masks (`(g ^ m) − m`), looked up for the 7-bit sign indices ([`KSIGN_MASKS`]) or tested
//! from the stored sign bytes (IQ2_S, IQ3_S).

use super::*;
use crate::kernels::matmul::Q8_1_SIDE;
use crate::quant::reference_blocks::{
    iq2_scales, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGN_MASKS,
};

#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned()
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

/// Entries `i` and `j` of a table of 8-byte rows (a grid of 8 levels, or [`KSIGN_MASKS`]) as
/// one vector: bytes 0..8 row `i`, 8..16 row `j`. The caller keeps `i`, `j` in the table.
#[inline(always)]
unsafe fn rows8(t: &[u64], i: usize, j: usize) -> uint8x16_t {
    debug_assert!(i < t.len() && j < t.len());
    let p = t.as_ptr();
    vcombine_u8(
        vld1_u8(p.add(i) as *const u8),
        vld1_u8(p.add(j) as *const u8),
    )
}

/// Entries `i[0..4]` of a table of 4-byte rows (IQ3's grids) as one vector. The caller keeps
/// the indices in the table.
#[inline(always)]
unsafe fn rows4(t: &[u32], i: [usize; 4]) -> uint8x16_t {
    debug_assert!(i.iter().all(|&i| i < t.len()));
    let p = t.as_ptr();
    let mut v = vdupq_n_u32(0);
    v = vld1q_lane_u32::<0>(p.add(i[0]), v);
    v = vld1q_lane_u32::<1>(p.add(i[1]), v);
    v = vld1q_lane_u32::<2>(p.add(i[2]), v);
    v = vld1q_lane_u32::<3>(p.add(i[3]), v);
    vreinterpretq_u8_u32(v)
}

/// The levels `g` negated where the byte mask `m` is set.
#[inline(always)]
unsafe fn signed(g: uint8x16_t, m: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(vsubq_u8(veorq_u8(g, m), m))
}

/// The sign byte masks of 32 elements from the four sign bytes at `p` (byte `l`: elements
/// `8l..8l + 8`, bit `j` element `8l + j`; 0xff where negative), elements 0..16 and 16..32.
#[inline(always)]
unsafe fn sign_bytes(p: *const u8) -> [uint8x16_t; 2] {
    let s = vreinterpretq_u8_u32(vdupq_n_u32(u32_at(p)));
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    // Byte l of the four repeated over its 8 elements.
    let sel = |l: u64| {
        let b = 0x0101_0101_0101_0101u64;
        vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(l * b), vcreate_u64((l + 1) * b)))
    };
    [
        vtstq_u8(vqtbl1q_u8(s, sel(0)), bit),
        vtstq_u8(vqtbl1q_u8(s, sel(2)), bit),
    ]
}

/// IQ1's codes `8·level + δ` of two grid points (levels −1, 0, 1), `ds` the delta signs (±1
/// per byte).
#[inline(always)]
unsafe fn iq1_codes(i: usize, j: usize, ds: int8x16_t) -> int8x16_t {
    let g = vreinterpretq_s8_u8(rows8(&IQ1S_GRID, i, j));
    vaddq_s8(vshlq_n_s8::<3>(g), ds)
}

/// A decoded super-block as the 8-bit kernel reads it: its [`KExact`] decode, and whether
/// the two halves of each 32-element sub-block have scales of their own (IQ2_XS, IQ2_S,
/// IQ1_M), else both groups of a sub-block carry its one scale.
pub(in crate::kernels) trait GridW: KExact {
    const SPLIT: bool;
}

pub(in crate::kernels) struct KIQ2XXS;
pub(in crate::kernels) struct KIQ2XS;
pub(in crate::kernels) struct KIQ2S;
pub(in crate::kernels) struct KIQ3XXS;
pub(in crate::kernels) struct KIQ3S;
pub(in crate::kernels) struct KIQ1S;
pub(in crate::kernels) struct KIQ1M;
pub(in crate::kernels) struct KTQ1_0;
pub(in crate::kernels) struct KTQ2_0;

/// IQ2_XXS (66 bytes): sub-block `ib` has 4 grid bytes at `2 + 8·ib` and a u32 after them of
/// four 7-bit sign indices and a 4-bit scale `s`: `db = d·(0.5 + s)·0.25`.
impl KExact for KIQ2XXS {
    const BB: usize = 66;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b);
        for ib in 0..8 {
            let o = b.add(2 + 8 * ib);
            let aux = u32_at(o.add(4));
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            let s = |l: usize| ((aux >> (7 * l)) & 127) as usize;
            for h in 0..2 {
                let g = rows8(
                    &IQ2XXS_GRID,
                    usize::from(*o.add(2 * h)),
                    usize::from(*o.add(2 * h + 1)),
                );
                let m = rows8(&KSIGN_MASKS, s(2 * h), s(2 * h + 1));
                q[2 * ib + h] = signed(g, m);
                dl[2 * ib + h] = db;
            }
        }
    }
}

impl GridW for KIQ2XXS {
    const SPLIT: bool = false;
}

/// IQ2_XS (74 bytes): u16 `q` per 8 elements at `2 + 2·l` (9-bit grid index, 7-bit sign
/// index), a scale byte per sub-block at 66 (a nibble per half).
impl KExact for KIQ2XS {
    const BB: usize = 74;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b);
        for ib in 0..8 {
            let [d0, d1] = iq2_scales(d, *b.add(66 + ib));
            for h in 0..2 {
                let qa = u16_at(b.add(2 + 2 * (4 * ib + 2 * h)));
                let qb = u16_at(b.add(2 + 2 * (4 * ib + 2 * h + 1)));
                let g = rows8(&IQ2XS_GRID, usize::from(qa & 511), usize::from(qb & 511));
                let m = rows8(&KSIGN_MASKS, usize::from(qa >> 9), usize::from(qb >> 9));
                q[2 * ib + h] = signed(g, m);
            }
            dl[2 * ib] = d0;
            dl[2 * ib + 1] = d1;
        }
    }
}

impl GridW for KIQ2XS {
    const SPLIT: bool = true;
}

/// IQ2_S (82 bytes): grid index low bytes at `2 + 4·ib + l`, their 2 high bits in `qh` (byte
/// `66 + ib`, bits `2l..`), sign bytes at `34 + 4·ib`, a scale byte per sub-block at 74.
impl KExact for KIQ2S {
    const BB: usize = 82;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b);
        for ib in 0..8 {
            let [d0, d1] = iq2_scales(d, *b.add(74 + ib));
            let qh = usize::from(*b.add(66 + ib));
            let idx =
                |l: usize| usize::from(*b.add(2 + 4 * ib + l)) | ((qh << (8 - 2 * l)) & 0x300);
            let m = sign_bytes(b.add(34 + 4 * ib));
            for h in 0..2 {
                let g = rows8(&IQ2S_GRID, idx(2 * h), idx(2 * h + 1));
                q[2 * ib + h] = signed(g, m[h]);
            }
            dl[2 * ib] = d0;
            dl[2 * ib + 1] = d1;
        }
    }
}

impl GridW for KIQ2S {
    const SPLIT: bool = true;
}

/// IQ3_XXS (98 bytes): 8 grid bytes per sub-block at `2 + 8·ib` (4 levels each), a u32 per
/// sub-block at `66 + 4·ib` as IQ2_XXS's: `db = d·(0.5 + s)·0.5`.
impl KExact for KIQ3XXS {
    const BB: usize = 98;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b);
        for ib in 0..8 {
            let aux = u32_at(b.add(66 + 4 * ib));
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            let qs = b.add(2 + 8 * ib);
            let s = |l: usize| ((aux >> (7 * l)) & 127) as usize;
            for h in 0..2 {
                let i: [usize; 4] = core::array::from_fn(|j| usize::from(*qs.add(4 * h + j)));
                let m = rows8(&KSIGN_MASKS, s(2 * h), s(2 * h + 1));
                q[2 * ib + h] = signed(rows4(&IQ3XXS_GRID, i), m);
                dl[2 * ib + h] = db;
            }
        }
    }
}

impl GridW for KIQ3XXS {
    const SPLIT: bool = false;
}

/// IQ3_S (110 bytes): grid index `j` of a sub-block (elements `4j..`) byte `2 + 8·ib + j`,
/// bit `j` of `qh` (byte `66 + ib`) its 9th bit; sign bytes at `74 + 4·ib`; 4-bit scales at
/// 106: `db = d·(1 + 2s)`.
impl KExact for KIQ3S {
    const BB: usize = 110;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b);
        for ib in 0..8 {
            let sc = (*b.add(106 + ib / 2) >> (4 * (ib % 2))) & 0xf;
            let db = d * f32::from(1 + 2 * sc);
            let qh = usize::from(*b.add(66 + ib));
            let qs = b.add(2 + 8 * ib);
            let m = sign_bytes(b.add(74 + 4 * ib));
            for h in 0..2 {
                let i: [usize; 4] = core::array::from_fn(|j| {
                    let j = 4 * h + j;
                    usize::from(*qs.add(j)) | ((qh << (8 - j)) & 256)
                });
                q[2 * ib + h] = signed(rows4(&IQ3S_GRID, i), m[h]);
                dl[2 * ib + h] = db;
            }
        }
    }
}

impl GridW for KIQ3S {
    const SPLIT: bool = false;
}

/// IQ1_S (50 bytes): grid index low bytes at `2 + 4·ib + l`, a u16 per sub-block at `34 +
/// 2·ib` (3 high bits per index, a 3-bit scale `s`, the delta's sign): `dl = d·(2s + 1)`,
/// scale `dl/8` of the codes `8·level ± 1`.
impl KExact for KIQ1S {
    const BB: usize = 50;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let d = f16_at(b);
        for ib in 0..8 {
            let qh = u16_at(b.add(34 + 2 * ib));
            let s = d * f32::from(2 * ((qh >> 12) & 7) + 1) * 0.125;
            let ds = vdupq_n_s8(if qh & 0x8000 != 0 { -1 } else { 1 });
            let idx = |l: usize| {
                usize::from(*b.add(2 + 4 * ib + l)) | (usize::from((qh >> (3 * l)) & 7) << 8)
            };
            for h in 0..2 {
                q[2 * ib + h] = iq1_codes(idx(2 * h), idx(2 * h + 1), ds);
                dl[2 * ib + h] = s;
            }
        }
    }
}

impl GridW for KIQ1S {
    const SPLIT: bool = false;
}

/// IQ1_M (56 bytes): grid index low bytes at `4·ib + l`, a nibble per index in `qh` (bytes
/// `32 + 2·ib..`: 3 high bits, the delta's sign), 3-bit scales per half in the u16s at 48
/// whose top nibbles spread the f16 `d`.
impl KExact for KIQ1M {
    const BB: usize = 56;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        let sc: [u16; 4] = core::array::from_fn(|i| u16_at(b.add(48 + 2 * i)));
        let bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let d = f16_to_f32(bits);
        for ib in 0..8 {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            dl[2 * ib] = d * f32::from(2 * (s & 7) + 1) * 0.125;
            dl[2 * ib + 1] = d * f32::from(2 * ((s >> 3) & 7) + 1) * 0.125;
            for h in 0..2 {
                // Grid points 2h (low nibble of qh) and 2h + 1 (high nibble).
                let qh = *b.add(32 + 2 * ib + h);
                let (h0, h1) = (qh & 0x0f, qh >> 4);
                let i0 = usize::from(*b.add(4 * ib + 2 * h)) | (usize::from(h0 & 7) << 8);
                let i1 = usize::from(*b.add(4 * ib + 2 * h + 1)) | (usize::from(h1 & 7) << 8);
                let sign = |h: u8| if h & 8 != 0 { -1 } else { 1 };
                let ds = vcombine_s8(vdup_n_s8(sign(h0)), vdup_n_s8(sign(h1)));
                q[2 * ib + h] = iq1_codes(i0, i1, ds);
            }
        }
    }
}

impl GridW for KIQ1M {
    const SPLIT: bool = true;
}

/// Trits − 1 of 16 bytes already multiplied by `3ⁿ` (mod 256) for trit `n`: `(v·3) >> 8` as
/// `((v + (v >> 1)) >> 1) >> 6` (`⌊⌊3v/4⌋/64⌋ = ⌊3v/256⌋`, without widening).
#[inline(always)]
unsafe fn trits(v: uint8x16_t) -> int8x16_t {
    let t = vshrq_n_u8::<6>(vhaddq_u8(v, vshrq_n_u8::<1>(v)));
    vsubq_s8(vreinterpretq_s8_u8(t), vdupq_n_s8(1))
}

/// TQ1_0 (54 bytes): 5 trits per byte of 0..48, 4 per byte of 48..52, f16 `d` at 52.
/// Elements 0..160: trit `n` of bytes 0..32 (n = 0..5, groups `2n`, `2n + 1`); 160..240:
/// trit `n` of bytes 32..48 (group `10 + n`); 240..256: trit `n` of bytes 48..52
/// (elements `240 + 4n..`).
impl KExact for KTQ1_0 {
    const BB: usize = 54;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        const POW3: [u8; 5] = [1, 3, 9, 27, 81];
        let p = [vld1q_u8(b), vld1q_u8(b.add(16)), vld1q_u8(b.add(32))];
        for n in 0..5 {
            let m = |v: uint8x16_t| {
                if n == 0 {
                    v
                } else {
                    vmulq_u8(v, vdupq_n_u8(POW3[n]))
                }
            };
            q[2 * n] = trits(m(p[0]));
            q[2 * n + 1] = trits(m(p[1]));
            q[10 + n] = trits(m(p[2]));
        }
        // The 4 bytes of qh repeated, lanes 4n..4n+4 times 3ⁿ.
        let qh = vreinterpretq_u8_u32(vdupq_n_u32(u32_at(b.add(48))));
        let pow = vreinterpretq_u8_u64(vcombine_u64(
            vcreate_u64(0x0303_0303_0101_0101),
            vcreate_u64(0x1b1b_1b1b_0909_0909),
        ));
        q[15] = trits(vmulq_u8(qh, pow));
        *dl = [f16_at(b.add(52)); 16];
    }
}

impl GridW for KTQ1_0 {
    const SPLIT: bool = false;
}

/// TQ2_0 (66 bytes): element `128h + 32l + m` is bits `2l..2l + 2` of byte `32h + m`, minus
/// 1; f16 `d` at 64.
impl KExact for KTQ2_0 {
    const BB: usize = 66;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(b: *const u8, q: &mut [int8x16_t; 16], dl: &mut [f32; 16], _: &mut [f32; 16]) {
        for h in 0..2 {
            let v = [vld1q_u8(b.add(32 * h)), vld1q_u8(b.add(32 * h + 16))];
            for l in 0..4 {
                for (s, &v) in v.iter().enumerate() {
                    let c = vandq_u8(vshlq_u8(v, vdupq_n_s8(-2 * l as i8)), vdupq_n_u8(3));
                    q[8 * h + 2 * l + s] = vsubq_s8(vreinterpretq_s8_u8(c), vdupq_n_s8(1));
                }
            }
        }
        *dl = [f16_at(b.add(64)); 16];
    }
}

impl GridW for KTQ2_0 {
    const SPLIT: bool = false;
}

/// Grid-format weights × Q8_1 activation rows (each row: its blocks, then per block
/// [`Q8_1_SIDE`] bytes: d·Σq and d as f32), row by row: per super-block the 16 groups are
/// decoded once ([`KExact::decode`]) for every activation row, and per group of 16 (SPLIT) or
/// sub-block of 32 the integer sum `Σ c·q` is scaled by `scale·dx`, four groups or sub-blocks
/// as one vector: `acc = fma(float(Σ c·q), scale·dx, acc)` per lane, the lanes summed at the
/// end. A row's chain depends on nothing but its own weights and activations (not on the rows
/// or activation rows around it).
#[inline(always)]
unsafe fn grid_8bit_n<D: Dot, K: GridW, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let sides: [*const f32; NX] =
        core::array::from_fn(|t| xs[t].add(a.k / 32 * Q8_1_BB) as *const f32);
    let mut q = [vdupq_n_s8(0); 16];
    let (mut dl, mut ml) = ([0f32; 16], [0f32; 16]);
    let zero = vdupq_n_s32(0);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [vdupq_n_f32(0.0); NX];
        for b in 0..nb {
            K::decode(w.add(b * K::BB), &mut q, &mut dl, &mut ml);
            for t in 0..NX {
                // The super-block's 8 activation blocks (codes at 4 in each) and side values.
                let xq = xs[t].add(8 * b * Q8_1_BB + 4) as *const i8;
                let side = sides[t].add(8 * b * Q8_1_SIDE / 4);
                let x16 = |g: usize| vld1q_s8(xq.add(g / 2 * Q8_1_BB + 16 * (g % 2)));
                if K::SPLIT {
                    // Groups 4c..4c + 4: activation blocks 2c, 2c + 1.
                    for c in 0..4 {
                        let p: [int32x4_t; 4] =
                            core::array::from_fn(|i| D::dot(zero, q[4 * c + i], x16(4 * c + i)));
                        let s = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
                        // [dx·Σq, dx] of blocks 2c and 2c + 1: dx of each repeated.
                        let sx = vld1q_f32(side.add(4 * c));
                        let scale =
                            vmulq_f32(vld1q_f32(dl.as_ptr().add(4 * c)), vtrn2q_f32(sx, sx));
                        acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), scale);
                    }
                } else {
                    // Sub-blocks 4c..4c + 4 (groups 8c..8c + 8).
                    for c in 0..2 {
                        let p: [int32x4_t; 4] = core::array::from_fn(|i| {
                            let g = 8 * c + 2 * i;
                            D::dot(D::dot(zero, q[g], x16(g)), q[g + 1], x16(g + 1))
                        });
                        let s = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
                        // Every other group's scale (one per sub-block), every other side
                        // value (the blocks' dx).
                        let dls = vld2q_f32(dl.as_ptr().add(8 * c)).0;
                        let dx = vld2q_f32(side.add(8 * c)).1;
                        acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), vmulq_f32(dls, dx));
                    }
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = vaddvq_f32(acc[t]);
        }
    }
}

/// The 8-bit kernel of a grid format over the dot product `D` ([`grid_8bit_n`]).
#[inline(always)]
pub(in crate::kernels) unsafe fn grid_8bit<D: Dot, K: GridW>(a: &MatArgs) {
    by_nx!(a, grid_8bit_n, D, K)
}
