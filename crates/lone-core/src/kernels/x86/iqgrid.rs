//! The codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the
//! ternary formats (TQ1_0, TQ2_0) for the 8-bit matrix-vector kernels ([`legacy_rows`]):
//! each 32-element sub-block decoded to 32 signed bytes with its scale (one per 16 elements
//! where the format has them: [`LegacyW::SPLIT`]), against Q8_1 activation blocks.
//!
//! The codes, times the scale, are the reference's weights exactly: `db·level·±1` (IQ2,
//! IQ3); IQ1's `dl·(level ± 1/8)` as `(dl/8)·(8·level ± 1)` (codes in −9..=9); the ternary
//! formats' `(trit − 1)·d`. Grid points are looked up 8 bytes at a time, the signs applied
//! with byte masks (`(g ^ m) − m`).

use super::*;
use crate::quant::reference_blocks::{
    iq2_scales, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGN_MASKS,
};

#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u16 {
    u16::from_le_bytes([*p, *p.add(1)])
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

/// Four groups of 8 bytes (`g[l]` elements 8l..8l+8), each negated where its mask is set.
#[inline(always)]
unsafe fn signed(g: [u64; 4], m: [u64; 4]) -> __m256i {
    let g = _mm256_setr_epi64x(g[0] as i64, g[1] as i64, g[2] as i64, g[3] as i64);
    let m = _mm256_setr_epi64x(m[0] as i64, m[1] as i64, m[2] as i64, m[3] as i64);
    _mm256_sub_epi8(_mm256_xor_si256(g, m), m)
}

/// Super-block `b / 8` of `bytes` bytes at `w`, and the sub-block `b % 8`.
#[inline(always)]
unsafe fn sub(w: *const u8, b: usize, bytes: usize) -> (*const u8, usize) {
    (w.add(b / 8 * bytes), b % 8)
}

macro_rules! never_whole {
    () => {
        unsafe fn decode(_: *const u8) -> (__m256i, f32, f32) {
            unreachable!("super-block formats are decoded by index (decode_at)")
        }
    };
}

pub(in crate::kernels) struct WIQ2XXS;
impl LegacyW for WIQ2XXS {
    /// An eighth of a super-block (rounded): what the prefetch distance is counted in.
    const BB: usize = 8;
    const SIGNED: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
        let (p, ib) = sub(w, b, 66);
        let o = p.add(2 + 8 * ib);
        let aux = u32_at(o.add(4));
        let db = f16_at(p) * (0.5 + (aux >> 28) as f32) * 0.25;
        let g = core::array::from_fn(|l| IQ2XXS_GRID[usize::from(*o.add(l))]);
        let m = core::array::from_fn(|l| KSIGN_MASKS[((aux >> (7 * l)) & 127) as usize]);
        (signed(g, m), db, 0.0)
    }
}

pub(in crate::kernels) struct WIQ2XS;
impl LegacyW for WIQ2XS {
    const BB: usize = 9;
    const SIGNED: bool = true;
    const SPLIT: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_split(w: *const u8, b: usize) -> (__m256i, f32, f32, f32) {
        let (p, ib) = sub(w, b, 74);
        let [d0, d1] = iq2_scales(f16_at(p), *p.add(66 + ib));
        let q: [u16; 4] = core::array::from_fn(|l| u16_at(p.add(2 + 2 * (4 * ib + l))));
        let g = q.map(|q| IQ2XS_GRID[usize::from(q & 511)]);
        let m = q.map(|q| KSIGN_MASKS[usize::from(q >> 9)]);
        (signed(g, m), d0, d1, 0.0)
    }
}

pub(in crate::kernels) struct WIQ2S;
impl LegacyW for WIQ2S {
    const BB: usize = 10;
    const SIGNED: bool = true;
    const SPLIT: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_split(w: *const u8, b: usize) -> (__m256i, f32, f32, f32) {
        let (p, ib) = sub(w, b, 82);
        let [d0, d1] = iq2_scales(f16_at(p), *p.add(74 + ib));
        let qh = usize::from(*p.add(66 + ib));
        let g: [u64; 4] = core::array::from_fn(|l| {
            IQ2S_GRID[usize::from(*p.add(2 + 4 * ib + l)) | ((qh << (8 - 2 * l)) & 0x300)]
        });
        let g = _mm256_setr_epi64x(g[0] as i64, g[1] as i64, g[2] as i64, g[3] as i64);
        let m = sign_bytes(u32_at(p.add(34 + 4 * ib)));
        (_mm256_sub_epi8(_mm256_xor_si256(g, m), m), d0, d1, 0.0)
    }
}

pub(in crate::kernels) struct WIQ3XXS;
impl LegacyW for WIQ3XXS {
    const BB: usize = 12;
    const SIGNED: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
        let (p, ib) = sub(w, b, 98);
        let aux = u32_at(p.add(66 + 4 * ib));
        let db = f16_at(p) * (0.5 + (aux >> 28) as f32) * 0.5;
        let qs = p.add(2 + 8 * ib);
        let g = core::array::from_fn(|l| {
            u64::from(IQ3XXS_GRID[usize::from(*qs.add(2 * l))])
                | (u64::from(IQ3XXS_GRID[usize::from(*qs.add(2 * l + 1))]) << 32)
        });
        let m = core::array::from_fn(|l| KSIGN_MASKS[((aux >> (7 * l)) & 127) as usize]);
        (signed(g, m), db, 0.0)
    }
}

pub(in crate::kernels) struct WIQ3S;
impl LegacyW for WIQ3S {
    const BB: usize = 13;
    const SIGNED: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
        let (p, ib) = sub(w, b, 110);
        let sc = (*p.add(106 + ib / 2) >> (4 * (ib % 2))) & 0xf;
        let db = f16_at(p) * f32::from(1 + 2 * sc);
        // Grid index j (elements 4j..4j+4): byte j of qs, bit j of qh as its 9th bit.
        let qs = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(2 + 8 * ib) as *const __m128i));
        let qh = _mm256_set1_epi32(i32::from(*p.add(66 + ib)));
        let hi = _mm256_and_si256(
            _mm256_sllv_epi32(qh, _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1)),
            _mm256_set1_epi32(256),
        );
        let mut idx = [0u32; 8];
        _mm256_storeu_si256(idx.as_mut_ptr() as *mut __m256i, _mm256_or_si256(qs, hi));
        let g = _mm256_setr_epi32(
            IQ3S_GRID[idx[0] as usize] as i32,
            IQ3S_GRID[idx[1] as usize] as i32,
            IQ3S_GRID[idx[2] as usize] as i32,
            IQ3S_GRID[idx[3] as usize] as i32,
            IQ3S_GRID[idx[4] as usize] as i32,
            IQ3S_GRID[idx[5] as usize] as i32,
            IQ3S_GRID[idx[6] as usize] as i32,
            IQ3S_GRID[idx[7] as usize] as i32,
        );
        let m = sign_bytes(u32_at(p.add(74 + 4 * ib)));
        (_mm256_sub_epi8(_mm256_xor_si256(g, m), m), db, 0.0)
    }
}

/// Four stored sign bytes (byte l: the signs of elements 8l..8l+8, bit j element 8l + j) as
/// a byte mask of 32 elements (0xff: negative).
#[inline(always)]
unsafe fn sign_bytes(s: u32) -> __m256i {
    let v = _mm256_shuffle_epi8(
        _mm256_set1_epi32(s as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit)
}

/// IQ1 codes `8·level + delta_sign` of four grid points (levels −1, 0, 1 as bytes), the
/// delta signs `ds` as 8 bytes each (0x01.. or 0xff..).
#[inline(always)]
unsafe fn iq1_codes(idx: [usize; 4], ds: [u64; 4]) -> __m256i {
    let g = idx.map(|i| IQ1S_GRID[i] as i64);
    let g = _mm256_setr_epi64x(g[0], g[1], g[2], g[3]);
    let d = _mm256_setr_epi64x(ds[0] as i64, ds[1] as i64, ds[2] as i64, ds[3] as i64);
    _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), d)
}

const PLUS: u64 = 0x0101_0101_0101_0101;
const MINUS: u64 = u64::MAX;

pub(in crate::kernels) struct WIQ1S;
impl LegacyW for WIQ1S {
    const BB: usize = 6;
    const SIGNED: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
        let (p, ib) = sub(w, b, 50);
        let qh = u16_at(p.add(34 + 2 * ib));
        let dl = f16_at(p) * f32::from(2 * ((qh >> 12) & 7) + 1);
        let ds = if qh & 0x8000 != 0 { MINUS } else { PLUS };
        let idx = core::array::from_fn(|l| {
            usize::from(*p.add(2 + 4 * ib + l)) | (usize::from((qh >> (3 * l)) & 7) << 8)
        });
        (iq1_codes(idx, [ds; 4]), dl * 0.125, 0.0)
    }
}

pub(in crate::kernels) struct WIQ1M;
impl LegacyW for WIQ1M {
    const BB: usize = 7;
    const SIGNED: bool = true;
    const SPLIT: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_split(w: *const u8, b: usize) -> (__m256i, f32, f32, f32) {
        let (p, ib) = sub(w, b, 56);
        let sc: [u16; 4] = core::array::from_fn(|i| u16_at(p.add(48 + 2 * i)));
        let bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))));
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let d0 = d * f32::from(2 * (s & 7) + 1) * 0.125;
        let d1 = d * f32::from(2 * ((s >> 3) & 7) + 1) * 0.125;
        let qh = [*p.add(32 + 2 * ib), *p.add(33 + 2 * ib)];
        let h: [u8; 4] = core::array::from_fn(|l| qh[l / 2] >> (4 * (l % 2)));
        let idx = core::array::from_fn(|l| {
            usize::from(*p.add(4 * ib + l)) | (usize::from(h[l] & 7) << 8)
        });
        let ds = h.map(|h| if h & 8 != 0 { MINUS } else { PLUS });
        (iq1_codes(idx, ds), d0, d1, 0.0)
    }
}

pub(in crate::kernels) struct WTQ2_0;
impl LegacyW for WTQ2_0 {
    const BB: usize = 8;
    const SIGNED: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
        // Element 128·h + 32·l + m of a super-block: bits 2l..2l+2 of byte 32·h + m.
        let (p, j) = sub(w, b, 66);
        let (h, l) = (j / 4, j % 4);
        let v = _mm256_loadu_si256(p.add(32 * h) as *const __m256i);
        let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * l as i32));
        let q = _mm256_sub_epi8(
            _mm256_and_si256(v, _mm256_set1_epi8(3)),
            _mm256_set1_epi8(1),
        );
        (q, f16_at(p.add(64)), 0.0)
    }
}

pub(in crate::kernels) struct WTQ1_0;

/// Trit `n` (0 = most significant) of a TQ1_0 byte, minus 1: `(q·3ⁿ mod 256)·3 >> 8`.
#[inline(always)]
fn trit(q: u8, n: u32) -> i8 {
    let q = q.wrapping_mul(3u8.pow(n));
    ((u16::from(q) * 3) >> 8) as i8 - 1
}

impl LegacyW for WTQ1_0 {
    const BB: usize = 7;
    const SIGNED: bool = true;
    never_whole!();
    #[inline(always)]
    unsafe fn decode_at(w: *const u8, b: usize) -> (__m256i, f32, f32) {
        // Elements 0..160: trit n of bytes 0..32 (n = 0..5), 32 at a time; 160..240: trit n
        // of bytes 32..48, 16 at a time; 240..256: trit n of qh bytes 48..52, 4 at a time.
        let (p, j) = sub(w, b, 54);
        let at = |i: usize| *p.add(i);
        let q: [i8; 32] = core::array::from_fn(|m| match j {
            0..5 => trit(at(m), j as u32),
            5 | 6 => trit(at(32 + m % 16), (2 * (j - 5) + m / 16) as u32),
            _ if m < 16 => trit(at(32 + m), 4),
            _ => trit(at(48 + (m - 16) % 4), ((m - 16) / 4) as u32),
        });
        (
            _mm256_loadu_si256(q.as_ptr() as *const __m256i),
            f16_at(p.add(52)),
            0.0,
        )
    }
}
