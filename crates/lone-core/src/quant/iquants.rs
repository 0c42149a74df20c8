//! The non-linear 4-bit "i-quant" formats IQ4_NL and IQ4_XS (read only: lone dequantizes and
//! multiplies them, it does not write them).
//!
//! Byte layouts (ggml-common.h), little endian:
//!
//! | format | elements | bytes | layout                                                     |
//! |--------|----------|-------|------------------------------------------------------------|
//! | IQ4_NL | 32       | 18    | d:f16, qs:[u8;16]                                          |
//! | IQ4_XS | 256      | 136   | d:f16, scales_h:u16, scales_l:[u8;4], qs:[u8;128]          |
//!
//! Each 4-bit index selects one of the 16 signed values of [`KVALUES_IQ4NL`]. In a group of
//! 32 elements stored in 16 bytes, element `j` (0..16) is the low nibble of byte `j` and
//! element `j + 16` its high nibble (as Q4_0). IQ4_NL scales its block by `d`; IQ4_XS splits
//! its super-block into 8 sub-blocks of 32, sub-block `ib` scaled by `d·(ls − 32)` with the
//! 6-bit `ls` made of nibble `ib % 2` of `scales_l[ib / 2]` (low 4 bits) and bits
//! `2·ib..2·ib + 2` of `scales_h` (high 2 bits).
//!
//! The values are computed as ggml's `dequantize_row_iq4_nl` / `dequantize_row_iq4_xs` do, in
//! f32: `d · kvalue` (IQ4_NL), `dl = d · (ls − 32)` then `dl · kvalue` (IQ4_XS), so they are
//! bit-exact.

use super::float::f16_to_f32;

/// ggml's `kvalues_iq4nl`: the 16 levels an IQ4 index selects.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One group of 32 elements from its 16 index bytes, each level times `scale` (f32).
#[inline(always)]
fn group(qs: &[u8], scale: f32, y: &mut [f32]) {
    let (lo, hi) = y.split_at_mut(16);
    for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
        *l = scale * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
        *h = scale * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

#[inline(always)]
pub(crate) fn dequant_iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_to_f32([b[0], b[1]]);
    group(&b[2..18], d, y);
}

/// IQ4_XS's 6-bit scale of sub-block `ib` (0..8), before the −32 offset.
#[inline(always)]
pub(crate) fn iq4_xs_scale(b: &[u8; 136], ib: usize) -> u8 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
    let hi = ((scales_h >> (2 * ib)) & 3) as u8;
    lo | (hi << 4)
}

#[inline(always)]
pub(crate) fn dequant_iq4_xs(b: &[u8; 136], y: &mut [f32; 256]) {
    let d = f16_to_f32([b[0], b[1]]);
    for (ib, ys) in y.chunks_exact_mut(32).enumerate() {
        let dl = d * f32::from(i16::from(iq4_xs_scale(b, ib)) - 32);
        group(&b[8 + 16 * ib..8 + 16 * (ib + 1)], dl, ys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One hand-made block of each format, its values worked out from the format description
    /// (ggml-common.h, ggml-quants.c) rather than from the code above.
    #[test]
    fn hand_made_blocks() {
        // IQ4_NL, d = 0.5 (f16 0x3800): byte j = j | (15 - j) << 4.
        let mut b = [0u8; 18];
        b[0..2].copy_from_slice(&0x3800u16.to_le_bytes());
        for j in 0..16 {
            b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0f32; 32];
        dequant_iq4_nl(&b, &mut y);
        let kv = [
            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
        ];
        for j in 0..16 {
            assert_eq!(y[j], kv[j] as f32 * 0.5);
            assert_eq!(y[j + 16], kv[15 - j] as f32 * 0.5);
        }

        // IQ4_XS, d = 2 (f16 0x4000), sub-block scales ls = 32 + ib·5 − 17 (15, 20, ..., 50):
        // low nibbles in scales_l, high 2 bits in scales_h.
        let mut b = [0u8; 136];
        b[0..2].copy_from_slice(&0x4000u16.to_le_bytes());
        let ls: Vec<u8> = (0..8).map(|ib| 15 + 5 * ib as u8).collect();
        let mut h = 0u16;
        for (ib, &s) in ls.iter().enumerate() {
            b[4 + ib / 2] |= (s & 0x0f) << (4 * (ib % 2));
            h |= u16::from(s >> 4) << (2 * ib);
        }
        b[2..4].copy_from_slice(&h.to_le_bytes());
        for (i, q) in b[8..].iter_mut().enumerate() {
            *q = (i % 16) as u8 | (((i + 3) % 16) as u8) << 4;
        }
        let mut y = [0f32; 256];
        dequant_iq4_xs(&b, &mut y);
        for ib in 0..8 {
            assert_eq!(iq4_xs_scale(&b, ib), ls[ib]);
            let dl = 2.0 * (f32::from(ls[ib]) - 32.0);
            for j in 0..16 {
                let i = 16 * ib + j;
                assert_eq!(
                    y[32 * ib + j],
                    dl * kv[i % 16] as f32,
                    "sub-block {ib} element {j}"
                );
                assert_eq!(y[32 * ib + 16 + j], dl * kv[(i + 3) % 16] as f32);
            }
        }
    }
}
