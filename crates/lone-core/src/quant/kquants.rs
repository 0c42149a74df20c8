//! The 256-element "K" super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.
//!
//! Byte layouts (ggml-common.h, `QK_K = 256`), little endian:
//!
//! | format | bytes | layout                                                              |
//! |--------|-------|---------------------------------------------------------------------|
//! | Q2_K   | 84    | scales:[u8;16], qs:[u8;64], d:f16, dmin:f16                         |
//! | Q3_K   | 110   | hmask:[u8;32], qs:[u8;64], scales:[u8;12], d:f16                    |
//! | Q4_K   | 144   | d:f16, dmin:f16, scales:[u8;12], qs:[u8;128]                        |
//! | Q5_K   | 176   | d:f16, dmin:f16, scales:[u8;12], qh:[u8;32], qs:[u8;128]            |
//! | Q6_K   | 210   | ql:[u8;128], qh:[u8;64], scales:[i8;16], d:f16                      |
//! | Q8_K   | 292   | d:f32, qs:[i8;256], bsums:[i16;16]                                  |
//!
//! Note the field order differs between formats (the super-block scale comes last in Q2_K,
//! Q3_K and Q6_K, first in Q4_K and Q5_K), and Q8_K's scale is a full f32.
//!
//! Low bits are interleaved in "planes": within each 128-element half of a super-block, the
//! 32 bytes of `qs` hold elements `l`, `l+32`, `l+64`, `l+96` in successive 2-bit fields (Q2_K,
//! Q3_K) or the 64 bytes hold `l`/`l+32` in low/high nibbles (Q4_K, Q5_K, Q6_K).

use super::float::{f16_to_f32, f32_from_le};

pub(crate) const QK_K: usize = 256;

#[inline]
fn half_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32([b[at], b[at + 1]])
}

#[inline(always)]
pub(crate) fn dequant_q2_k(b: &[u8; 84], y: &mut [f32; QK_K]) {
    let scales = &b[0..16];
    let d = half_at(b, 80);
    let dmin = half_at(b, 82);
    // 16 sub-blocks of 16: sub-block s = 2·(4·half + plane) + (l ≥ 16), scale byte s holds
    // the 4-bit scale (low nibble) and 4-bit min (high nibble).
    for (s, ys) in y.chunks_exact_mut(16).enumerate() {
        let half = s / 8;
        let plane = (s % 8) / 2;
        let q = &b[16 + 32 * half + 16 * (s % 2)..][..16];
        let sc = scales[s];
        let dl = d * f32::from(sc & 0x0f);
        let ml = dmin * f32::from(sc >> 4);
        let shift = 2 * plane;
        for (out, &qb) in ys.iter_mut().zip(q) {
            *out = dl * f32::from((qb >> shift) & 3) - ml;
        }
    }
}

/// The 16 six-bit Q3_K scales (still offset by 32). Bytes 0..8 hold the low nibbles (scale
/// `i` in byte `i % 8`, nibble `i / 8`), bytes 8..12 the 2-bit high parts (scale `i` in byte
/// `8 + i % 4`, bits `2·(i / 4)`).
#[inline]
fn q3_k_scales(sc: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = (sc[i % 8] >> (4 * (i / 8))) & 0x0f;
        let hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

#[inline(always)]
pub(crate) fn dequant_q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d = half_at(b, 108);
    for (s, ys) in y.chunks_exact_mut(16).enumerate() {
        let half = s / 8;
        let plane = (s % 8) / 2;
        let off = 16 * (s % 2);
        let q = &qs[32 * half + off..][..16];
        let hm = &hmask[off..off + 16];
        // The high-mask bit is shared across both halves: bit (4·half + plane).
        let m = 1u8 << (4 * half + plane);
        let shift = 2 * plane;
        let dl = d * f32::from(scales[s]);
        for ((out, &qb), &h) in ys.iter_mut().zip(q).zip(hm) {
            // A *clear* high bit subtracts 4: values are -4..=3.
            let v = ((qb >> shift) & 3) as i8 - if h & m != 0 { 0 } else { 4 };
            *out = dl * f32::from(v);
        }
    }
}

/// Scale and min `j` (0..8) of Q4_K/Q5_K, 6 bits each, from the 12 packed bytes
/// (ggml's `get_scale_min_k4`).
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[inline(always)]
pub(crate) fn dequant_q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    // Sub-block s (32 elements): bytes qs[32·(s/2)..][..32], low nibble for even s.
    for (s, ys) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(s, scales);
        let d1 = d * f32::from(sc);
        let m1 = dmin * f32::from(m);
        let q = &qs[32 * (s / 2)..][..32];
        let shift = 4 * (s % 2);
        for (out, &qb) in ys.iter_mut().zip(q) {
            *out = d1 * f32::from((qb >> shift) & 0x0f) - m1;
        }
    }
}

#[inline(always)]
pub(crate) fn dequant_q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (s, ys) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(s, scales);
        let d1 = d * f32::from(sc);
        let m1 = dmin * f32::from(m);
        let q = &qs[32 * (s / 2)..][..32];
        let shift = 4 * (s % 2);
        // Bit s of qh[l] is the fifth bit of element l of sub-block s.
        for ((out, &qb), &h) in ys.iter_mut().zip(q).zip(qh) {
            let v = ((qb >> shift) & 0x0f) | (((h >> s) & 1) << 4);
            *out = d1 * f32::from(v) - m1;
        }
    }
}

#[inline(always)]
pub(crate) fn dequant_q6_k(b: &[u8; 210], y: &mut [f32; QK_K]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = half_at(b, 208);
    // Each 128-element half: quarter r (32 elements) takes nibble r/2 of ql[64·half + 32·(r%2)
    // + l] and bits 2r..2r+2 of qh[32·half + l]; scale = scales[8·half + 2r + l/16].
    for (c, ys) in y.chunks_exact_mut(32).enumerate() {
        let half = c / 4;
        let r = c % 4;
        let lo = &ql[64 * half + 32 * (r % 2)..][..32];
        let hi = &qh[32 * half..][..32];
        let lshift = 4 * (r / 2);
        let hshift = 2 * r;
        for (l, out) in ys.iter_mut().enumerate() {
            let q = ((lo[l] >> lshift) & 0x0f) | (((hi[l] >> hshift) & 3) << 4);
            let sc = scales[8 * half + 2 * r + l / 16] as i8;
            // ggml: d * sc * q, evaluated left to right.
            *out = d * f32::from(sc) * f32::from(q as i8 - 32);
        }
    }
}

#[inline(always)]
pub(crate) fn dequant_q8_k(b: &[u8; 292], y: &mut [f32; QK_K]) {
    let d = f32_from_le(&[b[0], b[1], b[2], b[3]]);
    for (out, &q) in y.iter_mut().zip(&b[4..260]) {
        *out = d * f32::from(q as i8);
    }
}

/// ggml's `nearest_int`: round to nearest, ties to even, via the 1.5·2^23 trick. Exact for
/// |v| ≤ 2^22 (ggml asserts that); outside that range it returns garbage, as ggml would.
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Q8_K activation quantization (ggml's `quantize_row_q8_K_ref`): scale so that the element
/// of largest magnitude maps to -127, round to nearest (ties to even), and store the sums of
/// each 16 quants. An all-zero block gets d = 0 and zero quants; ggml leaves `bsums`
/// uninitialized there, lone zeroes them.
pub(crate) fn quant_q8_k(x: &[f32; QK_K], b: &mut [u8; 292]) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0f32 / max;
    let mut q = [0i8; QK_K];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = nearest_int(iscale * v).min(127) as i8;
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (out, &qj) in b[4..260].iter_mut().zip(&q) {
        *out = qj as u8;
    }
    for (j, group) in q.chunks_exact(16).enumerate() {
        let sum: i32 = group.iter().map(|&v| i32::from(v)).sum();
        b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_ties_to_even() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (126.49, 126),
            (-127.0, -127),
            (3.7, 4),
            (-3.7, -4),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }

    #[test]
    fn q3_k_scale_unpacking() {
        // Scale i := i + 20 (6 bits), packed as ggml does; check the unpacker recovers them.
        let want: [u8; 16] = core::array::from_fn(|i| i as u8 + 20);
        let mut sc = [0u8; 12];
        for (i, &v) in want.iter().enumerate() {
            sc[i % 8] |= (v & 0x0f) << (4 * (i / 8));
            sc[8 + i % 4] |= (v >> 4) << (2 * (i / 4));
        }
        let got = q3_k_scales(&sc);
        for i in 0..16 {
            assert_eq!(got[i], want[i] as i8 - 32);
        }
    }

    #[test]
    fn scale_min_k4_layout() {
        // 8 scales and 8 mins of 6 bits: first 4 of each straight in bytes 0..4 / 4..8
        // (low 6 bits), the rest split: low nibbles in bytes 8..12, high 2 bits in the top
        // bits of bytes 0..8.
        let sc: [u8; 8] = [1, 2, 3, 4, 63, 40, 17, 33];
        let mn: [u8; 8] = [5, 6, 7, 8, 50, 0, 62, 21];
        let mut q = [0u8; 12];
        q[..4].copy_from_slice(&sc[..4]);
        q[4..8].copy_from_slice(&mn[..4]);
        for j in 4..8 {
            q[j + 4] = (sc[j] & 0x0f) | ((mn[j] & 0x0f) << 4);
            q[j - 4] |= (sc[j] >> 4) << 6;
            q[j] |= (mn[j] >> 4) << 6;
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &q), (sc[j], mn[j]), "{j}");
        }
    }

    #[test]
    fn q8_k_zero_block() {
        let mut b = [0xaau8; 292];
        quant_q8_k(&[0.0; QK_K], &mut b);
        assert!(b.iter().all(|&v| v == 0));
    }
}
