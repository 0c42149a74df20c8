//! The codebook ("grid") i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and the
//! ternary formats TQ1_0, TQ2_0 (read only: lone dequantizes and multiplies them).
//!
//! Byte layouts (ggml-common.h), 256 elements per super-block, little endian:
//!
//! | format  | bytes | layout                                                                |
//! |---------|-------|-----------------------------------------------------------------------|
//! | IQ2_XXS | 66    | d:f16, 8 × (4 grid bytes, u32: 4 × 7 sign bits + 4-bit scale)         |
//! | IQ2_XS  | 74    | d:f16, qs:[u16;32] (9-bit grid index + 7 sign bits), scales:[u8;8]    |
//! | IQ2_S   | 82    | d:f16, qs:[u8;32] grid low bits, signs:[u8;32], qh:[u8;8], scales:[u8;8] |
//! | IQ3_XXS | 98    | d:f16, qs:[u8;64] grid indices, 8 × u32 (4 × 7 sign bits + 4-bit scale) |
//! | IQ3_S   | 110   | d:f16, qs:[u8;64], qh:[u8;8] (9th index bits), signs:[u8;32], scales:[u8;4] |
//! | IQ1_S   | 50    | d:f16, qs:[u8;32] grid low bits, qh:[u16;8] (3 × 3 high bits, scale, sign of delta) |
//! | IQ1_M   | 56    | qs:[u8;32], qh:[u8;16], scales:[u16;4] (3-bit scales + the f16 `d` in the top nibbles) |
//! | TQ1_0   | 54    | qs:[u8;48] (5 trits per byte), qh:[u8;4] (4 per byte), d:f16           |
//! | TQ2_0   | 66    | qs:[u8;64] (4 × 2 bits per byte), d:f16                               |
//!
//! A grid entry gives 8 (IQ2, IQ1) or 4 (IQ3) levels; a 7-bit sign index selects one of the
//! 128 even-parity sign patterns of 8 elements ([`KSIGNS_IQ2XS`]), IQ2_S and IQ3_S store the
//! 8 sign bits whole. Every 32 elements (IQ2_XS, IQ2_S, IQ1_M: every 16) have their own scale.
//!
//! The values are computed in f32 as ggml's `dequantize_row_*` do, operation for operation
//! (`db · level · ±1`, `dl · (level + delta)`, `(trit − 1) · d`), so they are bit-exact.

use super::float::f16_to_f32;
use super::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};

/// IQ1_S's and IQ1_M's offset of every level (`IQ1S_DELTA`), its sign stored per group.
pub(crate) const IQ1_DELTA: f32 = 0.125;

#[inline(always)]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// 8 elements `scale · level_j · sign_j` of grid point `g` (8 unsigned byte levels), the sign
/// of element j bit j of `signs`.
#[inline(always)]
fn grid8(scale: f32, g: u64, signs: u8, y: &mut [f32]) {
    for (j, v) in y[..8].iter_mut().enumerate() {
        let level = f32::from((g >> (8 * j)) as u8);
        *v = scale * level * if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
    }
}

/// As [`grid8`] for two 4-level grid points (IQ3): elements 0..4 from `g1`, 4..8 from `g2`.
#[inline(always)]
fn grid4x2(scale: f32, g1: u32, g2: u32, signs: u8, y: &mut [f32]) {
    let g = u64::from(g1) | (u64::from(g2) << 32);
    grid8(scale, g, signs, y);
}

pub(crate) fn dequant_iq2_xxs(b: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let o = 2 + 8 * ib;
        let aux = u32_at(b, o + 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            grid8(db, IQ2XXS_GRID[usize::from(b[o + l])], signs, y8);
        }
    }
}

/// IQ2_XS's and IQ2_S's scales of the two halves of a sub-block, from its scale byte `sc`
/// (a nibble each): `d·(0.5 + s)·0.25`.
#[inline(always)]
pub(crate) fn iq2_scales(d: f32, sc: u8) -> [f32; 2] {
    [
        d * (0.5 + f32::from(sc & 0xf)) * 0.25,
        d * (0.5 + f32::from(sc >> 4)) * 0.25,
    ]
}

pub(crate) fn dequant_iq2_xs(b: &[u8; 74], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let db = iq2_scales(d, b[66 + ib]);
        for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
            grid8(db[l / 2], IQ2XS_GRID[usize::from(q & 511)], signs, y8);
        }
    }
}

pub(crate) fn dequant_iq2_s(b: &[u8; 82], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let db = iq2_scales(d, b[74 + ib]);
        let qh = usize::from(b[66 + ib]);
        for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
            let idx = usize::from(b[2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300);
            grid8(db[l / 2], IQ2S_GRID[idx], b[34 + 4 * ib + l], y8);
        }
    }
}

pub(crate) fn dequant_iq3_xxs(b: &[u8; 98], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        let qs = 2 + 8 * ib;
        for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS_GRID[usize::from(b[qs + 2 * l])];
            let g2 = IQ3XXS_GRID[usize::from(b[qs + 2 * l + 1])];
            grid4x2(db, g1, g2, signs, y8);
        }
    }
}

pub(crate) fn dequant_iq3_s(b: &[u8; 110], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let sc = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0xf;
        let db = d * f32::from(1 + 2 * sc);
        let qh = usize::from(b[66 + ib]);
        let qs = 2 + 8 * ib;
        for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
            let i1 = usize::from(b[qs + 2 * l]) | ((qh << (8 - 2 * l)) & 256);
            let i2 = usize::from(b[qs + 2 * l + 1]) | ((qh << (7 - 2 * l)) & 256);
            grid4x2(db, IQ3S_GRID[i1], IQ3S_GRID[i2], b[74 + 4 * ib + l], y8);
        }
    }
}

/// 8 elements `scale · (level_j + delta)` of IQ1 grid point `idx` (signed byte levels).
#[inline(always)]
fn grid_iq1(scale: f32, idx: usize, delta: f32, y: &mut [f32]) {
    let g = IQ1S_GRID[idx];
    for (j, v) in y[..8].iter_mut().enumerate() {
        *v = scale * (f32::from((g >> (8 * j)) as u8 as i8) + delta);
    }
}

pub(crate) fn dequant_iq1_s(b: &[u8; 50], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 {
            -IQ1_DELTA
        } else {
            IQ1_DELTA
        };
        for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
            let idx = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            grid_iq1(dl, idx, delta, y8);
        }
    }
}

/// IQ1_M's super-block scale: an f16 spread over the top nibbles of its four scale words.
#[inline(always)]
pub(crate) fn iq1_m_d(b: &[u8; 56]) -> f32 {
    let sc: [u16; 4] = core::array::from_fn(|i| u16_at(b, 48 + 2 * i));
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    f16_to_f32(bits.to_le_bytes())
}

pub(crate) fn dequant_iq1_m(b: &[u8; 56], y: &mut [f32; 256]) {
    let d = iq1_m_d(b);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let sc = u16_at(b, 48 + 2 * (ib / 2));
        let shift = 6 * (ib % 2);
        let dl = [
            d * f32::from(2 * ((sc >> shift) & 7) + 1),
            d * f32::from(2 * ((sc >> (shift + 3)) & 7) + 1),
        ];
        let qs = &b[4 * ib..4 * ib + 4];
        let qh = [b[32 + 2 * ib], b[32 + 2 * ib + 1]];
        for (l, y8) in ys.chunks_exact_mut(8).enumerate() {
            let h = qh[l / 2] >> (4 * (l % 2));
            let idx = usize::from(qs[l]) | (usize::from(h & 7) << 8);
            let delta = if h & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            grid_iq1(dl[l / 2], idx, delta, y8);
        }
    }
}

/// Trit `n` (0 = most significant) of a byte holding 5 (TQ1_0's packing: the byte is
/// ⌈value · 256 / 243⌉, so multiplying by 3ⁿ and taking the top bits of ·3 reads trit n).
#[inline(always)]
fn trit(q: u8, n: u32) -> f32 {
    let q = q.wrapping_mul(3u8.pow(n));
    f32::from(((u16::from(q) * 3) >> 8) as i16 - 1)
}

pub(crate) fn dequant_tq1_0(b: &[u8; 54], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[52], b[53]]);
    let mut out = y.iter_mut();
    // 32 bytes of 5 trits (160 elements), then 16 bytes of 5 (80), then 4 bytes of 4 (16).
    for (start, len) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for &q in &b[start..start + len] {
                *out.next().expect("256 elements") = trit(q, n) * d;
            }
        }
    }
    for n in 0..4 {
        for &q in &b[48..52] {
            *out.next().expect("256 elements") = trit(q, n) * d;
        }
    }
}

pub(crate) fn dequant_tq2_0(b: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[64], b[65]]);
    for (j, ys) in y.chunks_exact_mut(128).enumerate() {
        for (l, y32) in ys.chunks_exact_mut(32).enumerate() {
            for (m, v) in y32.iter_mut().enumerate() {
                let q = (b[32 * j + m] >> (2 * l)) & 3;
                *v = f32::from(i16::from(q) - 1) * d;
            }
        }
    }
}

/// Test data: sets the f16 super-block scale of one block of a codebook or ternary format
/// to `d` (IQ1_M's spread over its scale words), leaving the other bytes as they are. False
/// for any other format.
#[cfg(test)]
pub(crate) fn set_scale(dtype: crate::tensor::DType, b: &mut [u8], d: f32) -> bool {
    use crate::tensor::DType;
    let h = super::float::f32_to_f16(d);
    let off = match dtype {
        DType::IQ2XXS | DType::IQ2XS | DType::IQ2S | DType::IQ3XXS | DType::IQ3S | DType::IQ1S => 0,
        DType::TQ1_0 => 52,
        DType::TQ2_0 => 64,
        DType::IQ1M => {
            let bits = u16::from_le_bytes(h);
            for i in 0..4 {
                let nib = ((bits >> (4 * i)) & 0xf) as u8;
                b[48 + 2 * i + 1] = (b[48 + 2 * i + 1] & 0x0f) | (nib << 4);
            }
            return true;
        }
        _ => return false,
    };
    b[off..off + 2].copy_from_slice(&h);
    true
}

/// The 8 sign bits of a byte as a byte mask per element (bit j set: byte j is 0xff).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
const fn byte_mask(bits: u8) -> u64 {
    let mut m = 0u64;
    let mut j = 0;
    while j < 8 {
        if bits & (1 << j) != 0 {
            m |= 0xff << (8 * j);
        }
        j += 1;
    }
    m
}

/// [`KSIGNS_IQ2XS`] as byte masks: entry i is the mask of `i` with bit 7 set when `i` has an
/// odd number of bits (the table's rule, checked by a test against the table itself).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) static KSIGN_MASKS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let parity = (i as u8).count_ones() as u8 & 1;
        t[i] = byte_mask(i as u8 | (parity << 7));
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_masks_match_the_sign_table() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(KSIGN_MASKS[i], byte_mask(s), "sign index {i}");
            assert_eq!(s.count_ones() % 2, 0, "sign pattern {i} has even parity");
        }
        assert_eq!(byte_mask(0b1000_0001), 0xff00_0000_0000_00ff);
    }
}
