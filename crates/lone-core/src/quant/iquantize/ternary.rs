//! TQ1_0 and TQ2_0: ggml's `quantize_row_tq1_0_ref` / `quantize_row_tq2_0_ref` (importances
//! are not used). Every element is rounded (half away from zero) to −1, 0 or 1 times the
//! super-block's largest magnitude `d`, stored as the trit 0, 1, 2.
//!
//! TQ2_0 packs 4 trits a byte as 2-bit fields (byte `m` of each 32 holds elements `m + 32n`
//! at bits `2n`). TQ1_0 packs 5 trits a byte as the base-3 number they spell, scaled to a
//! byte (`⌈q · 256 / 243⌉`): 32 bytes for elements 0..160 (`m + 32n`), 16 for 160..240
//! (`m + 16n`), and 4 bytes of 4 trits (`j + 4m`, the last trit position 0) for 240..256.

use super::super::float::f32_to_f16;
use super::super::kquants::QK_K;
use crate::tensor::DType;

pub(super) const WRITES: bool = true;

/// The super-block's scale (its largest magnitude, with ggml's `MAX` on NaN) and its inverse.
fn scale(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    for &v in x {
        // ggml's MAX(amax, |v|): `amax > |v| ? amax : |v|`.
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    (amax, if amax != 0.0 { 1.0 / amax } else { 0.0 })
}

/// The trit of `v`: `round(v · id) + 1` (0, 1, 2 for |v| ≤ d; anything for garbage).
fn trit(v: f32, id: f32) -> u8 {
    ((v * id).round() as i32).wrapping_add(1) as u8
}

/// Trits into a byte: their base-3 number (the first most significant), scaled up to 256.
fn pack5(trits: impl Iterator<Item = u8>) -> u8 {
    let q = trits.fold(0u8, |q, t| q.wrapping_mul(3).wrapping_add(t));
    (u16::from(q) * 256).div_ceil(243) as u8
}

fn tq1_0(x: &[f32], b: &mut [u8]) {
    let (d, id) = scale(x);
    for m in 0..32 {
        b[m] = pack5((0..5).map(|n| trit(x[m + 32 * n], id)));
    }
    let x = &x[160..];
    for m in 0..16 {
        b[32 + m] = pack5((0..5).map(|n| trit(x[m + 16 * n], id)));
    }
    let x = &x[80..];
    for j in 0..4 {
        // Four trits, then a zero in the least significant position.
        b[48 + j] = pack5((0..5).map(|m| if m < 4 { trit(x[j + 4 * m], id) } else { 0 }));
    }
    b[52..54].copy_from_slice(&f32_to_f16(d));
}

fn tq2_0(x: &[f32], b: &mut [u8]) {
    let (d, id) = scale(x);
    for (half, q) in x.chunks_exact(128).zip(b[..64].chunks_exact_mut(32)) {
        for (m, byte) in q.iter_mut().enumerate() {
            *byte = (0..4).fold(0u8, |acc, n| {
                acc | ((trit(half[m + 32 * n], id) & 3) << (2 * n))
            });
        }
    }
    b[64..66].copy_from_slice(&f32_to_f16(d));
}

/// One row of TQ1_0 or TQ2_0.
pub(super) fn quantize(dtype: DType, src: &[f32], dst: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(dtype.block_bytes()))
    {
        match dtype {
            DType::TQ1_0 => tq1_0(x, b),
            _ => tq2_0(x, b),
        }
    }
}
