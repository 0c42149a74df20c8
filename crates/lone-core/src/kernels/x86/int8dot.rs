//! 8-bit dot products (`vpmaddubsw` / `vpdpbusd`), the legacy formats against 8-bit activations, and the rows-by-8 packed kernels.

#![allow(clippy::needless_range_loop)]

use super::*;
use crate::kernels::matmul::Q8_1_SIDE;
pub(in crate::kernels) use crate::kernels::packed::rows_past_groups;

pub(in crate::kernels) trait IDot {
    /// Per i32 lane: the sum of 4 products of unsigned bytes of `a` and signed bytes of `b`.
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i;
    /// `acc + Σ (a·b pairs) · scale` with `scale` per i16 lane (pairs of bytes).
    unsafe fn dot_scaled(acc: __m256i, a: __m256i, b: __m256i, scale: __m256i) -> __m256i;
    /// One step of a running `Σ a·b` (unsigned 5-bit `a`, signed 8-bit `b` in [-127, 127]):
    /// at most 4 steps per chain, then [`IDot::acc_finish`] gives i32 lanes of 4 products'
    /// sums. AVX2 keeps i16 pairs: 4 steps are at most 4·2·31·127 = 31496 < 2^15.
    unsafe fn acc_dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    unsafe fn acc_finish(acc: __m256i) -> __m256i;
    /// Accumulation chains per activation row and block in the packed kernels: 2 (chunks
    /// 0-1, 2-3) where a step is a cheap i16 add off the multiplier's path, 4 (one per chunk)
    /// where each step waits for the previous one's `vpdpbusd` (4-5 cycles): shorter chains
    /// took 8 activation rows of a 4608×1024 Q4_1 matrix from 150 to 137 µs on Zen 4.
    /// Integer sums: the result is the same either way.
    const CHAINS: usize;
}
pub(in crate::kernels) struct Maddubs;
pub(in crate::kernels) struct Vnni;
/// AVX-VNNI: the same `vpdpbusd`/`vpdpwssd` in their VEX encodings (Intel client CPUs since
/// Alder Lake, which have no AVX-512; Zen 5).
pub(in crate::kernels) struct VnniVex;
impl IDot for Maddubs {
    const CHAINS: usize = 2;
    #[inline(always)]
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, a: __m256i, b: __m256i, scale: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), scale))
    }
    #[inline(always)]
    unsafe fn acc_dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi16(acc, _mm256_maddubs_epi16(a, b))
    }
    #[inline(always)]
    unsafe fn acc_finish(acc: __m256i) -> __m256i {
        _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
    }
}
impl IDot for Vnni {
    const CHAINS: usize = 4;
    #[inline(always)]
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    }
    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, a: __m256i, b: __m256i, scale: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(a, b), scale)
    }
    #[inline(always)]
    unsafe fn acc_dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn acc_finish(acc: __m256i) -> __m256i {
        acc
    }
}

impl IDot for VnniVex {
    const CHAINS: usize = 4;
    #[inline(always)]
    unsafe fn dot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b)
    }
    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, a: __m256i, b: __m256i, scale: __m256i) -> __m256i {
        _mm256_dpwssd_avx_epi32(acc, _mm256_maddubs_epi16(a, b), scale)
    }
    #[inline(always)]
    unsafe fn acc_dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn acc_finish(acc: __m256i) -> __m256i {
        acc
    }
}

/// 32 nibbles of 16 bytes at `p`: low nibbles are elements 0..16, high nibbles 16..32.
#[inline(always)]
pub(in crate::kernels) unsafe fn nibbles32(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// Byte `j` = 0x10 if bit `j` of the little-endian u32 at `p` is set, else 0.
#[inline(always)]
pub(in crate::kernels) unsafe fn high_bits32(p: *const u8) -> __m256i {
    let x = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bit = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// A 32-element weight block decoded to bytes: (quants, d, m). Signed formats give i8 quants
/// and pair with Q8_0 activations; unsigned ones give u8 quants plus a min `m` and pair with
/// Q8_1 activation rows followed by one f32 per block, d·Σq (ggml's f16 `s` field would
/// round it; see `kernels::matmul_kernel`).
pub(in crate::kernels) trait LegacyW {
    const BB: usize;
    const SIGNED: bool;
    /// The min as a multiple of d when there is no stored one (the zero point, negated).
    const ZERO: f32 = 0.0;
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32);
    /// Block `b` (of 32 elements) of the row at `w`: formats whose blocks share a
    /// super-block's fields (IQ4_XS) read them there.
    #[inline(always)]
    unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
        Self::decode(w.add(b * Self::BB))
    }
    /// The two halves of a block (16 elements each) have scales of their own (IQ2_XS,
    /// IQ2_S, IQ1_M): [`LegacyW::decode_split`] gives them.
    const SPLIT: bool = false;
    /// Block `b` as (codes, scale of elements 0..16, scale of 16..32, min).
    #[inline(always)]
    unsafe fn decode_split(w: *const u8, b: usize) -> (__m256i, f32, f32, f32) {
        let (q, d, m) = Self::decode_at(w, b);
        (q, d, d, m)
    }
}
pub(in crate::kernels) struct WQ4_0;
pub(in crate::kernels) struct WQ4_1;
pub(in crate::kernels) struct WQ5_0;
pub(in crate::kernels) struct WQ5_1;
pub(in crate::kernels) struct WQ8_0;
impl LegacyW for WQ4_0 {
    const BB: usize = 18;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let q = _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8));
        (q, f16_at(p), 0.0)
    }
}
impl LegacyW for WQ4_1 {
    const BB: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        (nibbles32(p.add(4)), f16_at(p), f16_at(p.add(2)))
    }
}
impl LegacyW for WQ5_0 {
    const BB: usize = 22;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let q = _mm256_or_si256(nibbles32(p.add(6)), high_bits32(p.add(2)));
        (_mm256_sub_epi8(q, _mm256_set1_epi8(16)), f16_at(p), 0.0)
    }
}
impl LegacyW for WQ5_1 {
    const BB: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let q = _mm256_or_si256(nibbles32(p.add(8)), high_bits32(p.add(4)));
        (q, f16_at(p), f16_at(p.add(2)))
    }
}
/// Q4_0 / Q5_0 for the 8-bit kernels: the unsigned quants with the zero point as a min
/// (`d·(q - 8) = d·q + (-8d)`), against Q8_1 activations and their block sums, which saves
/// the sign juggling `vpmaddubsw` needs for signed × signed.
pub(in crate::kernels) struct WQ4_0U;
pub(in crate::kernels) struct WQ5_0U;
impl LegacyW for WQ4_0U {
    const ZERO: f32 = -8.0;
    const BB: usize = 18;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(p);
        (nibbles32(p.add(2)), d, -8.0 * d)
    }
}
impl LegacyW for WQ5_0U {
    const ZERO: f32 = -16.0;
    const BB: usize = 22;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(p);
        let q = _mm256_or_si256(nibbles32(p.add(6)), high_bits32(p.add(2)));
        (q, d, -16.0 * d)
    }
}
impl LegacyW for WQ8_0 {
    const BB: usize = 34;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        (
            _mm256_loadu_si256(p.add(2) as *const __m256i),
            f16_at(p),
            0.0,
        )
    }
}

/// A format's blocks as its decoder gives them ([`decode_rows`]; [`super::super::DECODED_BB`]
/// bytes each: the 32 codes, then the f32 scales of elements 0..16 and 16..32 and the min):
/// the many-row path of the formats whose decoding costs more than their products (the
/// i-quants), decoded once per tile of weight rows rather than once per 4 activation rows.
/// [`legacy_block`] then does the very operations it does on the stored blocks, so the
/// results are the same bit for bit.
pub(in crate::kernels) struct WDecoded<W>(core::marker::PhantomData<W>);
impl<W: LegacyW> LegacyW for WDecoded<W> {
    const BB: usize = super::super::DECODED_BB;
    const SIGNED: bool = W::SIGNED;
    const ZERO: f32 = W::ZERO;
    const SPLIT: bool = W::SPLIT;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let f = |o: usize| (p.add(o) as *const f32).read_unaligned();
        (_mm256_loadu_si256(p as *const __m256i), f(32), f(40))
    }
    #[inline(always)]
    unsafe fn decode_split(w: *const u8, b: usize) -> (__m256i, f32, f32, f32) {
        let p = w.add(b * Self::BB);
        let f = |o: usize| (p.add(o) as *const f32).read_unaligned();
        (_mm256_loadu_si256(p as *const __m256i), f(32), f(36), f(40))
    }
}

/// `rows` weight rows of `k` elements at `w` (`w_stride` bytes apart) in [`WDecoded`]'s
/// layout at `dst` (`k / 32 ·` [`super::super::DECODED_BB`] bytes a row).
#[inline(always)]
pub(in crate::kernels) unsafe fn decode_rows<W: LegacyW>(
    w: *const u8,
    w_stride: usize,
    rows: usize,
    k: usize,
    dst: *mut u8,
) {
    let nb = k / 32;
    for r in 0..rows {
        let wr = w.add(r * w_stride);
        let out = dst.add(r * nb * super::super::DECODED_BB);
        for b in 0..nb {
            let (q, d0, d1, m) = W::decode_split(wr, b);
            let o = out.add(b * super::super::DECODED_BB);
            _mm256_storeu_si256(o as *mut __m256i, q);
            (o.add(32) as *mut f32).write_unaligned(d0);
            (o.add(36) as *mut f32).write_unaligned(d1);
            (o.add(40) as *mut f32).write_unaligned(m);
        }
    }
}

/// One 32-element block `b` of the weight row at `w` against the 8-bit activation rows `xs`
/// (`nb` Q8_1 blocks each, followed by their side values: [`Q8_1_SIDE`]).
#[inline(always)]
pub(in crate::kernels) unsafe fn legacy_block<D: IDot, W: LegacyW, const NX: usize>(
    w: *const u8,
    b: usize,
    nb: usize,
    xs: &[*const u8; NX],
    acc: &mut [__m256; NX],
    accm: &mut [f32; NX],
) {
    // Q8_1 blocks: d, s, qs at 4 (36 bytes); signed weights read only d and qs.
    let (xbb, xq) = (36, 4);
    let (q, dw, dhi, mw) = W::decode_split(w, b);
    // The i32 lanes of a dot product: 0..4 sum elements 0..16, 4..8 elements 16..32.
    let halves = _mm256_setr_ps(dw, dw, dw, dw, dhi, dhi, dhi, dhi);
    let aq = if W::SIGNED { _mm256_sign_epi8(q, q) } else { q };
    for t in 0..NX {
        let xb = xs[t].add(b * xbb);
        let xv = _mm256_loadu_si256(xb.add(xq) as *const __m256i);
        let s = if W::SIGNED {
            D::dot(aq, _mm256_sign_epi8(xv, q))
        } else {
            D::dot(aq, xv)
        };
        let d = if W::SPLIT {
            _mm256_mul_ps(halves, _mm256_set1_ps(f16_at(xb)))
        } else {
            _mm256_set1_ps(dw * f16_at(xb))
        };
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[t]);
        if !W::SIGNED {
            // d·Σq of this activation block, exact in f32 (after the Q8_1 blocks).
            accm[t] += mw * (xs[t].add(nb * 36 + Q8_1_SIDE * b) as *const f32).read_unaligned();
        }
    }
}

/// Every row of `a` on the 8-bit legacy kernel, prefetching the weight stream `PF` bytes ahead.
#[inline(always)]
pub(in crate::kernels) unsafe fn legacy_rows_n<
    D: IDot,
    W: LegacyW,
    const NX: usize,
    const PF: usize,
>(
    a: &MatArgs,
) {
    let nb = a.k / 32;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
        // Two chains of each (even and odd blocks): one FMA chain alone is latency-bound.
        let (mut a0, mut a1) = ([_mm256_setzero_ps(); NX], [_mm256_setzero_ps(); NX]);
        let (mut m0, mut m1) = ([0.0f32; NX], [0.0f32; NX]);
        let mut b = 0;
        while b + 2 <= nb {
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(b * W::BB + PF) as *const i8);
            legacy_block::<D, W, NX>(w, b, nb, &xs, &mut a0, &mut m0);
            legacy_block::<D, W, NX>(w, b + 1, nb, &xs, &mut a1, &mut m1);
            b += 2;
        }
        if b < nb {
            legacy_block::<D, W, NX>(w, b, nb, &xs, &mut a0, &mut m0);
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) =
                hsum256(_mm256_add_ps(a0[t], a1[t])) + (m0[t] + m1[t]);
        }
    }
}

/// How far ahead the Q8_0 kernel prefetches on Intel CPUs: on a 2-vCPU Xeon guest LFM2-350M
/// Q8_0 decode (every matrix Q8_0) read 40.4–41.0 tok/s at [`PREFETCH`], 43.2–43.9 at 8 KiB
/// and 50.2–50.8 at 16 KiB. AMD keeps [`PREFETCH`], which its measurements chose.
const Q8_PREFETCH_INTEL: usize = 16384;

#[inline(always)]
pub(in crate::kernels) unsafe fn legacy_rows<D: IDot, W: LegacyW>(a: &MatArgs) {
    if super::intel() {
        by_nx!(a, legacy_rows_n, D, W; Q8_PREFETCH_INTEL)
    } else {
        by_nx!(a, legacy_rows_n, D, W; PREFETCH)
    }
}

// ------------------------------------------------------------------ 8-bit, rows packed by 8

/// A legacy format as [`super::packed`] stores it by 8 rows: its f16 fields per block (d, and
/// m) and whether the rearranged high-bit word follows them.
pub(in crate::kernels) trait PackW: LegacyW {
    const F16S: usize;
    const QH: bool;
    /// Quant bytes per row and block: 16 nibble pairs, or Q8_0's 32 bytes (whole-byte codes,
    /// one chunk per 4 elements).
    const QBYTES: usize = 16;
    /// The nibbles index a table of codes ([`PackW::lut`], IQ4_NL's levels) instead of being
    /// the codes.
    const LUT: bool = false;
    #[inline(always)]
    unsafe fn lut() -> __m256i {
        _mm256_setzero_si256()
    }
}
/// Q8_0 for the packed VNNI kernels: codes `q + 128` (unsigned, `vpdpbusd`'s first operand)
/// with `-128·d` as the min, against Q8_1 activations and their block sums, like Q4_0's `-8`.
/// Products reach 255·127 per byte pair: only a dot product without i16 saturation
/// (`vpdpbusd`, [`IDot::CHAINS`] 4) may take it.
pub(in crate::kernels) struct WQ8_0U;
impl LegacyW for WQ8_0U {
    const ZERO: f32 = -128.0;
    const BB: usize = 34;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(p);
        let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
        (_mm256_xor_si256(q, _mm256_set1_epi8(-128)), d, -128.0 * d)
    }
}
impl PackW for WQ8_0U {
    const F16S: usize = 1;
    const QH: bool = false;
    const QBYTES: usize = 32;
}
/// Q8_0 for AVX2's packed kernel: signed codes, no min (`vpsignb` moves the weights' signs
/// onto the activations, as the row-by-row kernel does).
impl PackW for WQ8_0 {
    const F16S: usize = 1;
    const QH: bool = false;
    const QBYTES: usize = 32;
}
impl PackW for WQ4_0U {
    const F16S: usize = 1;
    const QH: bool = false;
}
impl PackW for WQ4_1 {
    const F16S: usize = 2;
    const QH: bool = false;
}
impl PackW for WQ5_0U {
    const F16S: usize = 1;
    const QH: bool = true;
}
impl PackW for WQ5_1 {
    const F16S: usize = 2;
    const QH: bool = true;
}

/// The 8-bit kernels over Q4_0/Q4_1/Q5_0/Q5_1 rows packed by [`super::packed`]: in groups of
/// 8 rows, block by block, the 8 rows' f16 scales (then mins, then high-bit words), then 4
/// chunks of 32 bytes, chunk `c` holding quant bytes `4c..4c+4` of each row (row `r` in i32
/// lane `r`). One load serves all 8 rows, their block sums are the 8 lanes of one register
/// (no horizontal sums, no scale broadcasts) and the weights are one sequential stream.
/// Activations: Q8_1 rows with f32 block sums (as [`legacy_rows_n`] takes them); rows past the
/// last whole group are stored as they were and take [`legacy_rows_n`].
#[inline(always)]
pub(in crate::kernels) unsafe fn packed_rows_n<D: IDot, W: PackW, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    let hb = 2 * W::F16S + if W::QH { 4 } else { 0 };
    let gb = 8 * W::BB;
    let groups = a.rows / 8;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let m4 = _mm256_set1_epi8(0x0f);
    let b4 = _mm256_set1_epi8(0x10);
    for g in 0..groups {
        let base = a.w.add(g * 8 * a.w_stride);
        let mut acc = [_mm256_setzero_ps(); NX];
        for b in 0..nb {
            let p = base.add(b * gb);
            // Into L2 (see kquant's `prefetch_block`).
            for l in 0..gb.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let mv = if W::F16S == 2 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i))
            } else {
                _mm256_mul_ps(dv, _mm256_set1_ps(W::ZERO))
            };
            let h = if W::QH {
                _mm256_loadu_si256(p.add(16 * W::F16S) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let q = p.add(8 * hb);
            // D::CHAINS chains per row (chunks 0-1, 2-3, or one per chunk): at most 4 steps
            // each (IDot::acc_dot).
            let mut s = [[_mm256_setzero_si256(); 4]; NX];
            // Whole-byte codes (Q8_0): chunk c is elements 4c..4c+4 of each row; chains by
            // pairs of chunks. Only the saturation-free dot product takes them (WQ8_0U).
            macro_rules! byte_chunk {
                ($c:literal) => {{
                    let raw = _mm256_loadu_si256(q.add(32 * $c) as *const __m256i);
                    if W::SIGNED {
                        // Signed codes (Q8_0 on AVX2): |w| against x with w's signs, each
                        // step widened to i32 at once (a pair of 127·127 fills an i16).
                        let aw = _mm256_sign_epi8(raw, raw);
                        for t in 0..NX {
                            let xq = xs[t].add(b * 36 + 4);
                            let xv =
                                _mm256_set1_epi32((xq.add(4 * $c) as *const i32).read_unaligned());
                            let d = D::dot(aw, _mm256_sign_epi8(xv, raw));
                            s[t][$c / 2] = _mm256_add_epi32(s[t][$c / 2], d);
                        }
                    } else {
                        let codes = _mm256_xor_si256(raw, _mm256_set1_epi8(-128));
                        for t in 0..NX {
                            let xq = xs[t].add(b * 36 + 4);
                            let xv =
                                _mm256_set1_epi32((xq.add(4 * $c) as *const i32).read_unaligned());
                            s[t][$c / 2] = D::acc_dot(s[t][$c / 2], codes, xv);
                        }
                    }
                }};
            }
            macro_rules! chunk {
                ($c:literal) => {{
                    let raw = _mm256_loadu_si256(q.add(32 * $c) as *const __m256i);
                    let mut lo = _mm256_and_si256(raw, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    if W::LUT {
                        lo = _mm256_shuffle_epi8(W::lut(), lo);
                        hi = _mm256_shuffle_epi8(W::lut(), hi);
                    }
                    if W::QH {
                        // Fifth bits (packed::high_bits_by_chunk): shifts stay inside bytes.
                        lo =
                            _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(h, 4 - $c), b4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi32(h, $c), b4));
                    }
                    for t in 0..NX {
                        let xq = xs[t].add(b * 36 + 4);
                        let xl = _mm256_set1_epi32((xq.add(4 * $c) as *const i32).read_unaligned());
                        let xh =
                            _mm256_set1_epi32((xq.add(16 + 4 * $c) as *const i32).read_unaligned());
                        let ch = $c * D::CHAINS / 4;
                        s[t][ch] = D::acc_dot(s[t][ch], lo, xl);
                        s[t][ch] = D::acc_dot(s[t][ch], hi, xh);
                    }
                }};
            }
            debug_assert!(
                !W::SIGNED || W::QBYTES == 32,
                "signed codes are whole bytes"
            );
            if W::QBYTES == 32 {
                debug_assert!(
                    W::SIGNED || D::CHAINS == 4,
                    "unsigned whole-byte codes need vpdpbusd"
                );
                byte_chunk!(0);
                byte_chunk!(1);
                byte_chunk!(2);
                byte_chunk!(3);
                byte_chunk!(4);
                byte_chunk!(5);
                byte_chunk!(6);
                byte_chunk!(7);
            } else {
                chunk!(0);
                chunk!(1);
                chunk!(2);
                chunk!(3);
            }
            for t in 0..NX {
                // d·Σq of this activation block, exact in f32, and d (after the Q8_1 blocks).
                let side = xs[t].add(nb * 36 + Q8_1_SIDE * b) as *const f32;
                let d = _mm256_mul_ps(dv, _mm256_set1_ps(side.add(1).read_unaligned()));
                let sum = side.read_unaligned();
                let si = if W::SIGNED {
                    // Plain i32 sums (byte_chunk).
                    _mm256_add_epi32(
                        _mm256_add_epi32(s[t][0], s[t][1]),
                        _mm256_add_epi32(s[t][2], s[t][3]),
                    )
                } else if D::CHAINS == 4 {
                    _mm256_add_epi32(
                        _mm256_add_epi32(D::acc_finish(s[t][0]), D::acc_finish(s[t][1])),
                        _mm256_add_epi32(D::acc_finish(s[t][2]), D::acc_finish(s[t][3])),
                    )
                } else {
                    _mm256_add_epi32(D::acc_finish(s[t][0]), D::acc_finish(s[t][1]))
                };
                let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), d, acc[t]);
                acc[t] = if W::SIGNED {
                    v
                } else {
                    _mm256_fmadd_ps(mv, _mm256_set1_ps(sum), v)
                };
            }
        }
        for t in 0..NX {
            _mm256_storeu_ps(a.out.add(t * a.out_stride + 8 * g), acc[t]);
        }
    }
    if let Some(rest) = rows_past_groups(a) {
        legacy_rows_n::<D, W, NX, PREFETCH>(&rest);
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn packed_rows<D: IDot, W: PackW>(a: &MatArgs) {
    by_nx!(a, packed_rows_n, D, W)
}
