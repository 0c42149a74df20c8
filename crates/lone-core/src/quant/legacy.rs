//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Byte layouts (ggml-common.h), all little endian, `f16` = IEEE half:
//!
//! | format | bytes | layout                                             | value                  |
//! |--------|-------|----------------------------------------------------|------------------------|
//! | Q4_0   | 18    | d:f16, qs:[u8;16]                                  | (q - 8)·d              |
//! | Q4_1   | 20    | d:f16, m:f16, qs:[u8;16]                           | q·d + m                |
//! | Q5_0   | 22    | d:f16, qh:u32, qs:[u8;16]                          | (q - 16)·d             |
//! | Q5_1   | 24    | d:f16, m:f16, qh:u32, qs:[u8;16]                   | q·d + m                |
//! | Q8_0   | 34    | d:f16, qs:[i8;32]                                  | q·d                    |
//! | Q8_1   | 36    | d:f16, s:f16 (= d·Σq), qs:[i8;32]                  | q·d                    |
//!
//! 4-bit quants: byte `j` holds element `j` in its low nibble and element `j + 16` in its high
//! nibble (not neighbouring elements). 5-bit quants add bit `j` of `qh` as bit 4 of element `j`.

use super::float::{f16_to_f32, f32_to_f16};

pub(crate) const QK: usize = 32;

#[inline]
fn half_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32([b[at], b[at + 1]])
}

// ---------------------------------------------------------------- dequantization

#[inline(always)]
pub(crate) fn dequant_q4_0(b: &[u8; 18], y: &mut [f32; QK]) {
    let d = half_at(b, 0);
    let qs = &b[2..18];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
        y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

#[inline(always)]
pub(crate) fn dequant_q4_1(b: &[u8; 20], y: &mut [f32; QK]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let qs = &b[4..20];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = f32::from(q & 0x0f) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The 5-bit quant `j` (0..32) from the 32 high bits `qh` and the 16 nibble bytes `qs`.
#[inline]
fn q5(qh: u32, qs: &[u8], j: usize) -> u8 {
    let lo = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    lo | ((((qh >> j) & 1) as u8) << 4)
}

#[inline(always)]
pub(crate) fn dequant_q5_0(b: &[u8; 22], y: &mut [f32; QK]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, out) in y.iter_mut().enumerate() {
        *out = (i32::from(q5(qh, qs, j)) - 16) as f32 * d;
    }
}

#[inline(always)]
pub(crate) fn dequant_q5_1(b: &[u8; 24], y: &mut [f32; QK]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, out) in y.iter_mut().enumerate() {
        *out = f32::from(q5(qh, qs, j)) * d + m;
    }
}

#[inline(always)]
pub(crate) fn dequant_q8_0(b: &[u8; 34], y: &mut [f32; QK]) {
    let d = half_at(b, 0);
    for (out, &q) in y.iter_mut().zip(&b[2..34]) {
        *out = f32::from(q as i8) * d;
    }
}

/// Q8_1 is the activation side of Q4_1/Q5_1 dot products; ggml never dequantizes it, but the
/// value of element `j` is plainly `qs[j]·d` (`s` is redundant).
#[inline(always)]
pub(crate) fn dequant_q8_1(b: &[u8; 36], y: &mut [f32; QK]) {
    let d = half_at(b, 0);
    for (out, &q) in y.iter_mut().zip(&b[4..36]) {
        *out = f32::from(q as i8) * d;
    }
}

// ---------------------------------------------------------------- quantization
//
// Each mirrors ggml's `quantize_row_*_ref`, operation for operation, so results are
// byte-identical. C's float→integer casts truncate toward zero, as Rust's `as` does; the
// values cast are always in range for finite input (Rust saturates otherwise; NaN → 0).

/// The element with the largest magnitude (first one on ties), and that magnitude.
#[inline]
fn signed_absmax(x: &[f32; QK]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline]
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// `MAX(amax, fabsf(v))` over the block, with C's `MAX` macro semantics.
#[inline]
fn absmax(x: &[f32; QK]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    amax
}

pub(crate) fn quant_q4_0(x: &[f32; QK], b: &mut [u8; 18]) {
    let d = signed_absmax(x) / -8.0;
    let id = inv(d);
    b[0..2].copy_from_slice(&f32_to_f16(d));
    for j in 0..16 {
        let x0 = x[j] * id;
        let x1 = x[j + 16] * id;
        let q0 = ((x0 + 8.5) as i8).min(15) as u8;
        let q1 = ((x1 + 8.5) as i8).min(15) as u8;
        b[2 + j] = q0 | (q1 << 4);
    }
}

pub(crate) fn quant_q4_1(x: &[f32; QK], b: &mut [u8; 20]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    b[0..2].copy_from_slice(&f32_to_f16(d));
    b[2..4].copy_from_slice(&f32_to_f16(min));
    for j in 0..16 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[j + 16] - min) * id;
        let q0 = ((x0 + 0.5) as i8).min(15) as u8;
        let q1 = ((x1 + 0.5) as i8).min(15) as u8;
        b[4 + j] = q0 | (q1 << 4);
    }
}

/// Packs 32 five-bit quants into `qh` (4 bytes) and `qs` (16 bytes).
#[inline]
pub(crate) fn pack_q5(q: &[u8; QK], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
        h |= u32::from((q[j] & 0x10) >> 4) << j;
        h |= u32::from((q[j + 16] & 0x10) >> 4) << (j + 16);
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

pub(crate) fn quant_q5_0(x: &[f32; QK], b: &mut [u8; 22]) {
    let d = signed_absmax(x) / -16.0;
    let id = inv(d);
    b[0..2].copy_from_slice(&f32_to_f16(d));
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = ((v * id + 16.5) as i8).min(31) as u8;
    }
    let (qh, qs) = b[2..].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

pub(crate) fn quant_q5_1(x: &[f32; QK], b: &mut [u8; 24]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    b[0..2].copy_from_slice(&f32_to_f16(d));
    b[2..4].copy_from_slice(&f32_to_f16(min));
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        // ggml casts straight to uint8_t here (no clamp); (v - min)·id never exceeds 31.5
        // for finite input, so the clamp only guards against garbage.
        *qj = (((v - min) * id + 0.5) as u8).min(31);
    }
    let (qh, qs) = b[4..].split_at_mut(4);
    pack_q5(&q, qh, qs);
}

/// `v.round() as i32` (C's `roundf`: halfway cases away from zero) for |v| < 2^23 (the 8-bit
/// quantizers scale into [-127, 127]) and 0 for NaN, in operations the compiler vectorizes
/// (truncate, then step by the exact remainder) instead of a `roundf` call per element.
#[inline(always)]
fn round_away(v: f32) -> i32 {
    let t = v as i32;
    let f = v - t as f32;
    t + i32::from(f >= 0.5) - i32::from(f <= -0.5)
}

pub(crate) fn quant_q8_0(x: &[f32; QK], b: &mut [u8; 34]) {
    let d = absmax(x) / 127.0;
    let id = inv(d);
    b[0..2].copy_from_slice(&f32_to_f16(d));
    for (out, &v) in b[2..].iter_mut().zip(x) {
        *out = round_away(v * id) as i8 as u8;
    }
}

pub(crate) fn quant_q8_1(x: &[f32; QK], b: &mut [u8; 36]) {
    let d = absmax(x) / 127.0;
    let id = inv(d);
    let mut sum = 0i32;
    for (out, &v) in b[4..].iter_mut().zip(x) {
        let q = round_away(v * id) as i8;
        sum += i32::from(q);
        *out = q as u8;
    }
    b[0..2].copy_from_slice(&f32_to_f16(d));
    b[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `round_away` is `f32::round` (C's roundf) on the quantizers' range: every halfway
    /// case, its float neighbours, and a dense sweep.
    #[test]
    fn round_away_is_roundf() {
        let mut vals = vec![0.0f32, -0.0, f32::NAN, 127.0, -127.0, 127.49, -127.49];
        for n in -128..128 {
            let h = n as f32 + 0.5;
            vals.extend([
                h,
                h.next_up(),
                h.next_down(),
                n as f32,
                (n as f32).next_up(),
            ]);
        }
        vals.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 0.00127));
        for v in vals {
            let want = if v.is_nan() { 0 } else { v.round() as i32 };
            assert_eq!(round_away(v), want, "{v:e}");
        }
    }

    #[test]
    fn q4_0_nibble_order() {
        // d = 1.0 (0x3c00); byte j = element j (low) | element j+16 (high).
        let mut b = [0u8; 18];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        for j in 0..16 {
            b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0.0; QK];
        dequant_q4_0(&b, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], j as f32 - 8.0);
            assert_eq!(y[j + 16], (15 - j) as f32 - 8.0);
        }
    }

    #[test]
    fn q5_high_bits() {
        // All low nibbles zero, qh = bit pattern: element j is 16 if bit j set else 0.
        let mut b = [0u8; 24];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
        b[2..4].copy_from_slice(&0xbc00u16.to_le_bytes()); // m = -1
        let qh: u32 = 0x8000_0001 | (1 << 17);
        b[4..8].copy_from_slice(&qh.to_le_bytes());
        let mut y = [0.0; QK];
        dequant_q5_1(&b, &mut y);
        for (j, &v) in y.iter().enumerate() {
            let want = if qh >> j & 1 == 1 { 15.0 } else { -1.0 };
            assert_eq!(v, want, "element {j}");
        }
    }

    #[test]
    fn quantize_zero_block() {
        let x = [0.0f32; QK];
        let mut b = [0xffu8; 34];
        quant_q8_0(&x, &mut b);
        assert!(b.iter().all(|&v| v == 0));
        let mut b = [0xffu8; 18];
        quant_q4_0(&x, &mut b);
        // d = 0 / -8 = -0.0, as in ggml (the all-zero Q4_0 block stores a negative zero).
        assert_eq!(&b[0..2], &[0, 0x80]);
        // Zero maps to quant 8 in both nibbles.
        assert!(b[2..].iter().all(|&v| v == 0x88));
    }

    #[test]
    fn q8_1_sum_field() {
        let mut x = [0.0f32; QK];
        for (j, v) in x.iter_mut().enumerate() {
            *v = j as f32 - 10.0;
        }
        let mut b = [0u8; 36];
        quant_q8_1(&x, &mut b);
        // s uses the f32 scale, before it is rounded to f16 for `d`.
        let d = 21.0f32 / 127.0;
        assert_eq!(half_at(&b, 0), f16_to_f32(f32_to_f16(d)));
        let sum: i32 = b[4..].iter().map(|&q| i32::from(q as i8)).sum();
        assert_eq!(half_at(&b, 2), f16_to_f32(f32_to_f16(sum as f32 * d)));
        // Largest magnitude (21) maps to 127.
        assert_eq!(b[4 + 31] as i8, 127);
    }
}
