//! The codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the
//! ternary formats (TQ1_0, TQ2_0) decoded: each 32-element sub-block to 32 signed codes with
//! integer scales (one per 16 elements where the format has them), and each super-block's
//! float scale ([`SbW`]). The 8-bit kernels take them as they are (`iqsuper`); the exact
//! kernels and row dequantizers through [`LegacyW`] (`legacy_via_sb!`), scale `dw·s`.
//!
//! `dw·s·code` is the reference's weight exactly: IQ2's `d·(0.5 + ls)·0.25·level·±1` is
//! `(d/8)·(2·ls + 1)·level·±1` (the halving and quartering are exact), IQ3_XXS's likewise with
//! `d/4`, IQ3_S's `d·(1 + 2·s)`; IQ1's `dl·(level ± 1/8)` is `(dl/8)·(8·level ± 1)` (codes in
//! −9..=9, `dl/8 = (d/8)·(2·s + 1)`); the ternary formats' `(trit − 1)·d`. Grid points are
//! looked up 8 bytes at a time, the signs applied with byte masks (`(g ^ m) − m`).

use super::*;
use crate::quant::reference_blocks::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGN_MASKS,
};

#[inline(always)]
pub(in crate::kernels) unsafe fn u16_at(p: *const u8) -> u16 {
    u16::from_le_bytes([*p, *p.add(1)])
}

#[inline(always)]
pub(in crate::kernels) unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

/// Four groups of 8 bytes, each negated where its mask is set.
#[inline(always)]
pub(in crate::kernels) unsafe fn signed(g: [u64; 4], m: [u64; 4]) -> __m256i {
    let g = _mm256_setr_epi64x(g[0] as i64, g[1] as i64, g[2] as i64, g[3] as i64);
    let m = _mm256_setr_epi64x(m[0] as i64, m[1] as i64, m[2] as i64, m[3] as i64);
    _mm256_sub_epi8(_mm256_xor_si256(g, m), m)
}

/// Four stored sign bytes as a byte mask of 32 elements (0xff: negative).
#[inline(always)]
pub(in crate::kernels) unsafe fn sign_bytes(s: u32) -> __m256i {
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

/// IQ1 codes `8·level ± 1` of four grid points, the delta signs as 8 bytes each.
#[inline(always)]
pub(in crate::kernels) unsafe fn iq1_codes(idx: [usize; 4], ds: [u64; 4]) -> __m256i {
    let g = idx.map(|i| IQ1S_GRID[i] as i64);
    let g = _mm256_setr_epi64x(g[0], g[1], g[2], g[3]);
    let d = _mm256_setr_epi64x(ds[0] as i64, ds[1] as i64, ds[2] as i64, ds[3] as i64);
    _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), d)
}

const PLUS: u64 = 0x0101_0101_0101_0101;
const MINUS: u64 = u64::MAX;

/// `2·n + 1` as the i16 scale of a 4-bit (or 3-bit) field.
#[inline(always)]
fn odd(n: u32) -> i16 {
    (2 * n + 1) as i16
}

pub(in crate::kernels) struct WIQ2XXS;
pub(in crate::kernels) struct WIQ2XS;
pub(in crate::kernels) struct WIQ2S;
pub(in crate::kernels) struct WIQ3XXS;
pub(in crate::kernels) struct WIQ3S;
pub(in crate::kernels) struct WIQ1S;
pub(in crate::kernels) struct WIQ1M;
pub(in crate::kernels) struct WTQ2_0;
pub(in crate::kernels) struct WTQ1_0;

// `BB`: an eighth of a super-block (rounded), what the prefetch distance is counted in.
legacy_via_sb!(WIQ2XXS, 8);
legacy_via_sb!(WIQ2XS, 9);
legacy_via_sb!(WIQ2S, 10);
legacy_via_sb!(WIQ3XXS, 12);
legacy_via_sb!(WIQ3S, 13);
legacy_via_sb!(WIQ1S, 6);
legacy_via_sb!(WIQ1M, 7);
legacy_via_sb!(WTQ2_0, 8);
legacy_via_sb!(WTQ1_0, 7);

impl SbW for WIQ2XXS {
    const SB: usize = 66;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 66), b % 8);
        let o = p.add(2 + 8 * ib);
        let aux = u32_at(o.add(4));
        let g = core::array::from_fn(|l| IQ2XXS_GRID[usize::from(*o.add(l))]);
        let m = core::array::from_fn(|l| KSIGN_MASKS[((aux >> (7 * l)) & 127) as usize]);
        let s = odd(aux >> 28);
        (signed(g, m), s, s)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 66)) * 0.125
    }
}

impl SbW for WIQ2XS {
    const SB: usize = 74;
    const SPLIT: bool = true;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 74), b % 8);
        let sc = u32::from(*p.add(66 + ib));
        let q: [u16; 4] = core::array::from_fn(|l| u16_at(p.add(2 + 2 * (4 * ib + l))));
        let g = q.map(|q| IQ2XS_GRID[usize::from(q & 511)]);
        let m = q.map(|q| KSIGN_MASKS[usize::from(q >> 9)]);
        (signed(g, m), odd(sc & 15), odd(sc >> 4))
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 74)) * 0.125
    }
}

impl SbW for WIQ2S {
    const SB: usize = 82;
    const SPLIT: bool = true;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 82), b % 8);
        let sc = u32::from(*p.add(74 + ib));
        let qh = usize::from(*p.add(66 + ib));
        let g: [u64; 4] = core::array::from_fn(|l| {
            IQ2S_GRID[usize::from(*p.add(2 + 4 * ib + l)) | ((qh << (8 - 2 * l)) & 0x300)]
        });
        let g = _mm256_setr_epi64x(g[0] as i64, g[1] as i64, g[2] as i64, g[3] as i64);
        let m = sign_bytes(u32_at(p.add(34 + 4 * ib)));
        (
            _mm256_sub_epi8(_mm256_xor_si256(g, m), m),
            odd(sc & 15),
            odd(sc >> 4),
        )
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 82)) * 0.125
    }
}

impl SbW for WIQ3XXS {
    const SB: usize = 98;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 98), b % 8);
        let aux = u32_at(p.add(66 + 4 * ib));
        let qs = p.add(2 + 8 * ib);
        let g = core::array::from_fn(|l| {
            u64::from(IQ3XXS_GRID[usize::from(*qs.add(2 * l))])
                | (u64::from(IQ3XXS_GRID[usize::from(*qs.add(2 * l + 1))]) << 32)
        });
        let m = core::array::from_fn(|l| KSIGN_MASKS[((aux >> (7 * l)) & 127) as usize]);
        let s = odd(aux >> 28);
        (signed(g, m), s, s)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 98)) * 0.25
    }
}

impl SbW for WIQ3S {
    const SB: usize = 110;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 110), b % 8);
        let sc = u32::from((*p.add(106 + ib / 2) >> (4 * (ib % 2))) & 0xf);
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
        let s = odd(sc);
        (_mm256_sub_epi8(_mm256_xor_si256(g, m), m), s, s)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 110))
    }
}

impl SbW for WIQ1S {
    const SB: usize = 50;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 50), b % 8);
        let qh = u16_at(p.add(34 + 2 * ib));
        let ds = if qh & 0x8000 != 0 { MINUS } else { PLUS };
        let idx = core::array::from_fn(|l| {
            usize::from(*p.add(2 + 4 * ib + l)) | (usize::from((qh >> (3 * l)) & 7) << 8)
        });
        let s = odd(u32::from((qh >> 12) & 7));
        (iq1_codes(idx, [ds; 4]), s, s)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 50)) * 0.125
    }
}

impl SbW for WIQ1M {
    const SB: usize = 56;
    const SPLIT: bool = true;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        let (p, ib) = (w.add(b / 8 * 56), b % 8);
        let s = u32::from(u16_at(p.add(48 + 2 * (ib / 2))) >> (6 * (ib % 2)));
        let qh = [*p.add(32 + 2 * ib), *p.add(33 + 2 * ib)];
        let h: [u8; 4] = core::array::from_fn(|l| qh[l / 2] >> (4 * (l % 2)));
        let idx = core::array::from_fn(|l| {
            usize::from(*p.add(4 * ib + l)) | (usize::from(h[l] & 7) << 8)
        });
        let ds = h.map(|h| if h & 8 != 0 { MINUS } else { PLUS });
        (iq1_codes(idx, ds), odd(s & 7), odd((s >> 3) & 7))
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        let p = w.add(s * 56);
        let sc: [u16; 4] = core::array::from_fn(|i| u16_at(p.add(48 + 2 * i)));
        let bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) * 0.125
    }
}

impl SbW for WTQ2_0 {
    const SB: usize = 66;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        // Element 128·h + 32·l + m of a super-block: bits 2l..2l+2 of byte 32·h + m.
        let (p, j) = (w.add(b / 8 * 66), b % 8);
        let (h, l) = (j / 4, j % 4);
        let v = _mm256_loadu_si256(p.add(32 * h) as *const __m256i);
        let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * l as i32));
        let q = _mm256_sub_epi8(
            _mm256_and_si256(v, _mm256_set1_epi8(3)),
            _mm256_set1_epi8(1),
        );
        (q, 1, 1)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 66 + 64))
    }
}

/// Trit `n` (0 = most significant) of a TQ1_0 byte, minus 1: `(q·3ⁿ mod 256)·3 >> 8`.
#[inline(always)]
fn trit(q: u8, n: u32) -> i8 {
    let q = q.wrapping_mul(3u8.pow(n));
    ((u16::from(q) * 3) >> 8) as i8 - 1
}

impl SbW for WTQ1_0 {
    const SB: usize = 54;
    #[inline(always)]
    unsafe fn sub_int(w: *const u8, b: usize) -> (__m256i, i16, i16) {
        // Elements 0..160: trit n of bytes 0..32 (n = 0..5), 32 at a time; 160..240: trit n
        // of bytes 32..48, 16 at a time; 240..256: trit n of qh bytes 48..52, 4 at a time.
        let (p, j) = (w.add(b / 8 * 54), b % 8);
        let at = |i: usize| *p.add(i);
        let q: [i8; 32] = core::array::from_fn(|m| match j {
            0..5 => trit(at(m), j as u32),
            5 | 6 => trit(at(32 + m % 16), (2 * (j - 5) + m / 16) as u32),
            _ if m < 16 => trit(at(32 + m), 4),
            _ => trit(at(48 + (m - 16) % 4), ((m - 16) / 4) as u32),
        });
        (_mm256_loadu_si256(q.as_ptr() as *const __m256i), 1, 1)
    }
    #[inline(always)]
    unsafe fn super_d(w: *const u8, s: usize) -> f32 {
        f16_at(w.add(s * 54 + 52))
    }
}
