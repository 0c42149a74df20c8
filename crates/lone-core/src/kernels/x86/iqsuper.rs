//! The super-block i-quants (IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M),
//! the ternary formats (TQ1_0, TQ2_0) and Q2_K, Q3_K against Q8_K activations, as llama.cpp
//! pairs them: **one float operation per 256 elements**.
//!
//! Every weight of these formats is `dw · s · q` with one float `dw` per super-block of 256,
//! an integer scale `s` per sub-block of 32 (or per 16) and a signed integer code `q`
//! (IQ2_XXS's `d·(0.5 + ls)·0.25` is `(d/8)·(2·ls + 1)`; IQ1's `dl·(level ± 1/8)` is
//! `(d/8)·(2·s + 1)·(8·level ± 1)`; IQ4_XS's `d·(ls − 32)`). A Q8_K activation block is
//! `dx · y` with one `dx` per 256. So each output is
//!
//! `acc ← fma(float(Σ_sub s·Σ q·y), dw·dx, acc)`, super-block after super-block,
//!
//! where the integer sum is exact in any order. Q3_K fits the same shape (codes −4..=3, a
//! scale per 16); Q2_K adds a min per 16 (`dw·s·q − dmin·m`): a second step
//! `acc ← fma(float(Σ m·Σy), −dmin·dx, acc)` with Q8_K's sums of 16. Every kernel that keeps
//! that chain — this file's row-by-row ones, on the stored or on the decoded rows, the
//! K-quants' own (`kquant`), and the 8-bit GEMM (`int8sb`) — gives each output the same bits
//! whatever the number of activation rows: the default mode takes all of them.

use super::*;

/// A super-block format as integers: sub-block `b`'s signed codes with the integer scales of
/// its elements 0..16 and 16..32, and super-block `s`'s float scale.
pub(in crate::kernels) trait SbW {
    /// Bytes per super-block (what the prefetch distance is counted in).
    const SB: usize;
    /// Whether the two halves of a sub-block can have different scales.
    const SPLIT: bool = false;
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16);
    unsafe fn super_d(w: *const u8, s: usize) -> f32;
    /// `Some(u)`: every code `q` lies in `[-u, 63 - u]`, so the row kernel multiplies the
    /// unsigned `q + u` by the activations (no sign moves; i16 pairs ≤ 2·63·128) and takes
    /// `u·Σ s·Σy` (Q8_K's sums of 16) off the integer sum, the same integer. None: `|q|`
    /// against the activations with `q`'s signs (codes up to ±127).
    const CODE_OFFSET: Option<i8> = None;
    /// The weight is `dw·s·q − dmin·m` with an integer min `m` per 16 elements (Q2_K).
    const MIN: bool = false;
    /// Sub-block `b`'s integer mins of elements 0..16 and 16..32 ([`SbW::MIN`] formats).
    #[inline(always)]
    unsafe fn sub_min(_w: *const u8, _b: usize) -> (i16, i16) {
        (0, 0)
    }
    /// Super-block `s`'s float scale of the mins ([`SbW::MIN`] formats).
    #[inline(always)]
    unsafe fn super_dmin(_w: *const u8, _s: usize) -> f32 {
        0.0
    }
}

impl SbW for WIQ4XS {
    const SB: usize = 136;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 136), b % 8);
        let h = u16_at(p.add(2));
        let lo = (*p.add(4 + ib / 2) >> (4 * (ib % 2))) & 0x0f;
        let hi = ((h >> (2 * ib)) & 3) as u8;
        let s = i16::from(lo | (hi << 4)) - 32;
        let [l, hh] = group_levels(p.add(8 + 16 * ib));
        (_mm256_set_m128i(hh, l), s, s)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 136))
    }
}

/// A super-block format's [`LegacyW`] (the exact kernels and row dequantizers): each
/// sub-block's codes with the f32 scales `dw·s` — the reference's scales bit for bit (see
/// the formats' decoders: `dw` carries the power-of-two factors, which commute with rounding).
macro_rules! legacy_via_sb {
    ($W:ty, $bb:expr) => {
        impl LegacyW for $W {
            const BB: usize = $bb;
            const SIGNED: bool = true;
            const SPLIT: bool = <$W as SbW>::SPLIT;
            unsafe fn decode(_: *const u8) -> (__m256i, f32, f32) {
                unreachable!("super-block formats are decoded by index (decode_at)")
            }
            #[inline(always)]
            unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
                let (q, s, _) = <$W as SbW>::sub_int(w, b);
                (q, <$W as SbW>::super_d(w, b / 8) * f32::from(s), 0.0)
            }
            #[inline(always)]
            unsafe fn decode_split(w: *const u8, b: usize) -> (__m256i, f32, f32, f32) {
                let (q, s0, s1) = <$W as SbW>::sub_int(w, b);
                let d = <$W as SbW>::super_d(w, b / 8);
                (q, d * f32::from(s0), d * f32::from(s1), 0.0)
            }
        }
    };
}

/// Q3_K (110 bytes: high-bit mask, 2-bit quants, 16 packed 6-bit scales, d): codes
/// `q − 4·(high bit clear)` in −4..=3, a scale `sc − 32` per 16 elements.
pub(in crate::kernels) struct WQ3K;
impl SbW for WQ3K {
    const SB: usize = 110;
    const SPLIT: bool = true;
    const CODE_OFFSET: Option<i8> = Some(4);
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 110), b % 8);
        let (n, j) = (ib / 4, ib % 4);
        let v = _mm256_loadu_si256(p.add(32 + 32 * n) as *const __m256i);
        let q = _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)),
            _mm256_set1_epi8(3),
        );
        let hm = _mm256_loadu_si256(p as *const __m256i);
        let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
        let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
        let q = _mm256_sub_epi8(q, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
        let sc = p.add(96);
        let scale = |i: usize| {
            let low = if i < 8 {
                *sc.add(i) & 0xf
            } else {
                *sc.add(i - 8) >> 4
            };
            let high = (*sc.add(8 + i % 4) >> (2 * (i / 4))) & 3;
            i16::from(low | (high << 4)) - 32
        };
        (q, scale(2 * ib), scale(2 * ib + 1))
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 110 + 108))
    }
}

/// Q2_K (84 bytes: 16 scale/min bytes, 2-bit quants, d, dmin): codes 0..=3, a scale (low
/// nibble) and a min (high nibble) per 16 elements.
pub(in crate::kernels) struct WQ2K;
impl SbW for WQ2K {
    const SB: usize = 84;
    const SPLIT: bool = true;
    const CODE_OFFSET: Option<i8> = Some(0);
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 84), b % 8);
        let (n, j) = (ib / 4, ib % 4);
        let v = _mm256_loadu_si256(p.add(16 + 32 * n) as *const __m256i);
        let q = _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)),
            _mm256_set1_epi8(3),
        );
        let sc = |i: usize| i16::from(*p.add(i) & 0xf);
        (q, sc(2 * ib), sc(2 * ib + 1))
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 84 + 80))
    }
    #[inline(always)]
    unsafe fn sub_min(w: *const u8, b: usize) -> (i16, i16) {
        let (p, ib) = (w.add(b / 8 * 84), b % 8);
        let m = |i: usize| i16::from(*p.add(i) >> 4);
        (m(2 * ib), m(2 * ib + 1))
    }
    #[inline(always)]
    unsafe fn super_dmin(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 84 + 82))
    }
}

/// Q4_K's and Q5_K's 6-bit scale and min of sub-block `j` from the 12 packed bytes at `q`.
#[inline(always)]
unsafe fn scale_min_k4(q: *const u8, j: usize) -> (i16, i16) {
    let (s, m) = rb::scale_min_k4(j, core::slice::from_raw_parts(q, 12));
    (i16::from(s), i16::from(m))
}

/// Q4_K (144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles): codes
/// 0..=15, a scale and a min per 32 elements.
pub(in crate::kernels) struct WQ4KS;
impl SbW for WQ4KS {
    const SB: usize = 144;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 144), b % 8);
        let v = _mm256_loadu_si256(p.add(16 + 32 * (ib / 2)) as *const __m256i);
        let q = _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (ib % 2) as i32)),
            _mm256_set1_epi8(15),
        );
        let (s, _) = scale_min_k4(p.add(4), ib);
        (q, s, s)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 144))
    }
    #[inline(always)]
    unsafe fn sub_min(w: *const u8, b: usize) -> (i16, i16) {
        let (_, m) = scale_min_k4(w.add(b / 8 * 144 + 4), b % 8);
        (m, m)
    }
    #[inline(always)]
    unsafe fn super_dmin(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 144 + 2))
    }
}

/// Q5_K (176 bytes: d, dmin, scales and mins as Q4_K's, 32 bytes of fifth bits, 128 of
/// nibbles): codes 0..=31.
pub(in crate::kernels) struct WQ5KS;
impl SbW for WQ5KS {
    const SB: usize = 176;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 176), b % 8);
        let v = _mm256_loadu_si256(p.add(48 + 32 * (ib / 2)) as *const __m256i);
        let lo = _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (ib % 2) as i32)),
            _mm256_set1_epi8(15),
        );
        let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
        let bit = _mm256_set1_epi8((1u8 << ib) as i8);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        let q = _mm256_or_si256(lo, _mm256_and_si256(set, _mm256_set1_epi8(16)));
        let (s, _) = scale_min_k4(p.add(4), ib);
        (q, s, s)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 176))
    }
    #[inline(always)]
    unsafe fn sub_min(w: *const u8, b: usize) -> (i16, i16) {
        let (_, m) = scale_min_k4(w.add(b / 8 * 176 + 4), b % 8);
        (m, m)
    }
    #[inline(always)]
    unsafe fn super_dmin(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 176 + 2))
    }
}

/// Q6_K (210 bytes: 128 bytes of low nibbles, 64 of high bit pairs, 16 i8 scales, d): codes
/// −32..=31, a scale per 16 elements.
pub(in crate::kernels) struct WQ6KS;
impl SbW for WQ6KS {
    const SB: usize = 210;
    const SPLIT: bool = true;
    const CODE_OFFSET: Option<i8> = Some(32);
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        // Sub-block 4n + k: nibbles of ql[64n + 32·(k % 2) ..] (low for k < 2, else high),
        // bits 2k..2k+2 of qh[32n ..].
        let (p, ib) = (w.add(b / 8 * 210), b % 8);
        let (n, k) = (ib / 4, ib % 4);
        let v = _mm256_loadu_si256(p.add(64 * n + 32 * (k % 2)) as *const __m256i);
        let lo = _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (k / 2) as i32)),
            _mm256_set1_epi8(15),
        );
        let h = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
        let hi = _mm256_and_si256(
            _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * k as i32)),
            _mm256_set1_epi8(3),
        );
        let q = _mm256_sub_epi8(
            _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)),
            _mm256_set1_epi8(32),
        );
        let sc = p.add(192 + 8 * n + 2 * k) as *const i8;
        (q, i16::from(*sc), i16::from(*sc.add(1)))
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 210 + 208))
    }
}

/// A format's sub-blocks as [`decode_rows_sb`] writes them ([`super::super::DECODED_BB`]
/// bytes each: the 32 codes, the two i16 scales at 32 and 34, the two i16 mins at 36 and 38,
/// then an f32 at 40: the super-block's `dw` in its first sub-block, `dmin` in its second):
/// the many-row path's tiles, decoded once per tile of weight rows.
pub(in crate::kernels) struct WSbDecoded<W>(core::marker::PhantomData<W>);
impl<W: SbW> SbW for WSbDecoded<W> {
    const SB: usize = 8 * super::super::DECODED_BB;
    const SPLIT: bool = W::SPLIT;
    const CODE_OFFSET: Option<i8> = W::CODE_OFFSET;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let p = w.add(b * super::super::DECODED_BB);
        let s = |o: usize| (p.add(o) as *const i16).read_unaligned();
        (_mm256_loadu_si256(p as *const __m256i), s(32), s(34))
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f32_at(w.add(s * Self::SB + 40))
    }
    const MIN: bool = W::MIN;
    #[inline(always)]
    unsafe fn sub_min(w: *const u8, b: usize) -> (i16, i16) {
        let p = w.add(b * super::super::DECODED_BB);
        let s = |o: usize| (p.add(o) as *const i16).read_unaligned();
        (s(36), s(38))
    }
    #[inline(always)]
    unsafe fn super_dmin(w: *const u8, s: usize) -> f32 {
        f32_at(w.add(s * Self::SB + super::super::DECODED_BB + 40))
    }
}

/// `rows` weight rows of `k` elements at `w` (`w_stride` bytes apart) in [`WSbDecoded`]'s
/// layout at `dst`.
#[inline(always)]
pub(in crate::kernels) unsafe fn decode_rows_sb<W: SbW>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    k: usize,
    dst: *mut u8,
) {
    let bb = super::super::DECODED_BB;
    let nb = k / 32;
    for r in 0..rows {
        let wr = w.add(r * w_stride);
        let out = dst.add(r * nb * bb);
        for b in 0..nb {
            let (q, s0, s1) = W::sub_int(wr, b);
            let (m0, m1) = W::sub_min(wr, b);
            let o = out.add(b * bb);
            _mm256_storeu_si256(o as *mut __m256i, q);
            (o.add(32) as *mut i16).write_unaligned(s0);
            (o.add(34) as *mut i16).write_unaligned(s1);
            (o.add(36) as *mut i16).write_unaligned(m0);
            (o.add(38) as *mut i16).write_unaligned(m1);
            let f = if b % 8 == 1 {
                W::super_dmin(wr, b / 8)
            } else {
                W::super_d(wr, b / 8)
            };
            (o.add(40) as *mut f32).write_unaligned(f);
        }
    }
}

/// The eight i32 lanes' sum.
#[inline(always)]
pub(in crate::kernels) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b0100_1110>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b1011_0001>(s));
    _mm_cvtsi128_si32(s)
}

/// Every row of `a` against `NX` Q8_K activation rows: per super-block the exact integer
/// `Σ_sub s·Σ q·y` (`vpmaddubsw` of `|q|` and `y` signed by `q`, then the i16 pairs times
/// the sub-block's scale into i32), then `acc ← fma(float(Σ), dw·dx, acc)`.
#[inline(always)]
pub(in crate::kernels) unsafe fn sb_rows_n<D: IDot, W: SbW, const NX: usize>(a: &MatArgs) {
    let ns = a.k / 256;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let mut acc = [0f32; NX];
        for s in 0..ns {
            for l in 0..W::SB.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(
                    w.wrapping_add(s * W::SB + PREFETCH + 64 * l) as *const i8
                );
            }
            // Two chains (even and odd sub-blocks): integer sums, the same in any order.
            let mut ia = [[_mm256_setzero_si256(); NX]; 2];
            // The scales of the 16 groups of 16 (the offset's share, below).
            let mut scales = [0i16; 16];
            for j in 0..8 {
                let (q, s0, s1) = W::sub_int(w, 8 * s + j);
                (scales[2 * j], scales[2 * j + 1]) = (s0, s1);
                let aq = match W::CODE_OFFSET {
                    Some(u) => _mm256_add_epi8(q, _mm256_set1_epi8(u)),
                    None => _mm256_sign_epi8(q, q),
                };
                let sc = if W::SPLIT {
                    _mm256_setr_m128i(_mm_set1_epi16(s0), _mm_set1_epi16(s1))
                } else {
                    _mm256_set1_epi16(s0)
                };
                for t in 0..NX {
                    let y = _mm256_loadu_si256(xs[t].add(s * 292 + 4 + 32 * j) as *const __m256i);
                    let y = if W::CODE_OFFSET.is_some() {
                        y
                    } else {
                        _mm256_sign_epi8(y, q)
                    };
                    ia[j % 2][t] = D::dot_scaled(ia[j % 2][t], aq, y, sc);
                }
            }
            let dw = W::super_d(w, s);
            // The mins' integer sums against the activations' sums of 16 (Q8_K's bsums).
            let mins: [(i16, i16); 8] = if W::MIN {
                core::array::from_fn(|j| W::sub_min(w, 8 * s + j))
            } else {
                [(0, 0); 8]
            };
            // u·s per group (|u·s| ≤ 32·128: an i16).
            let offset = W::CODE_OFFSET.filter(|&u| u != 0).map(|u| {
                let sv = _mm256_loadu_si256(scales.as_ptr() as *const __m256i);
                _mm256_mullo_epi16(sv, _mm256_set1_epi16(i16::from(u)))
            });
            for t in 0..NX {
                let mut ia = _mm256_add_epi32(ia[0][t], ia[1][t]);
                if let Some(usv) = offset {
                    // The offset's share, Σ u·s·Σy over the sums of 16 (|Σy| ≤ 16·128: the
                    // pairs of i16 products fit i32), taken off lane by lane.
                    let bs = _mm256_loadu_si256(xs[t].add(s * 292 + 260) as *const __m256i);
                    ia = _mm256_sub_epi32(ia, _mm256_madd_epi16(usv, bs));
                }
                let isum = hsum_i32(ia);
                let dx = f32_at(xs[t].add(s * 292));
                acc[t] = (isum as f32).mul_add(dw * dx, acc[t]);
                if W::MIN {
                    let bs = xs[t].add(s * 292 + 260) as *const i16;
                    let msum: i32 = (0..8)
                        .map(|j| {
                            i32::from(mins[j].0) * i32::from(bs.add(2 * j).read_unaligned())
                                + i32::from(mins[j].1)
                                    * i32::from(bs.add(2 * j + 1).read_unaligned())
                        })
                        .sum();
                    acc[t] = (msum as f32).mul_add(-(W::super_dmin(w, s) * dx), acc[t]);
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = acc[t];
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn sb_rows<D: IDot, W: SbW>(a: &MatArgs) {
    by_nx!(a, sb_rows_n, D, W)
}
