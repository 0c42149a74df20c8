//! IQ4_NL and IQ4_XS: ggml's `quantize_row_iq4_nl_impl` (what `quantize_iq4_nl` /
//! `quantize_iq4_xs` run, 7 trial scales either side).
//!
//! Each group of 32 gets its own scale: the least-squares fit of the nearest levels of
//! [`KVALUES_IQ4NL`] at the scale that maps the largest magnitude to the outermost level,
//! then at 15 trial scales around it, keeping the best weighted fit. IQ4_NL stores that scale
//! (f16); IQ4_XS stores one f16 per 256 (`d = −max_scale / 32`, the group scale of largest
//! magnitude) and each group's scale as a 6-bit multiple of it, then re-picks the levels for
//! the stored scale. Element weights are `importance · sqrt(σ² + x²)` (σ² twice the mean
//! square of the block), or `x²` without importances.

use super::super::float::f32_to_f16;
use super::super::iquants::KVALUES_IQ4NL;
use super::super::kquantize::GROUP_MAX_EPS;
use super::super::kquants::{nearest_int, QK_K};
use super::sum_squares;
use crate::tensor::DType;

pub(super) const WRITES: bool = true;

/// Trial scales either side of the first fit (ggml's `ntry`).
const NTRY: i32 = 7;

/// The level nearest `x` (ties to the upper level; `x` beyond the ends clamps), as ggml's
/// `best_index_int8`.
pub(crate) fn best_index(values: &[i8; 16], x: f32) -> u8 {
    if x <= f32::from(values[0]) {
        return 0;
    }
    if x >= f32::from(values[15]) {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < f32::from(values[mid]) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - f32::from(values[hi - 1]) < f32::from(values[hi]) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// Weighted sums `Σ w·q·x` and `Σ w·q²` of the levels nearest `id·x`, in ggml's order.
fn fit(xb: &[f32], weight: &[f32], id: f32, mut levels: Option<&mut [u8]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (j, (&x, &w)) in xb.iter().zip(weight).enumerate() {
        let l = best_index(&KVALUES_IQ4NL, id * x);
        if let Some(levels) = levels.as_deref_mut() {
            levels[j] = l;
        }
        let q = f32::from(KVALUES_IQ4NL[usize::from(l)]);
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The scale of one group of 32 (0 for a group of zeros), its levels in `levels`.
fn group_scale(xb: &[f32], weight: &[f32], levels: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = f32::from(KVALUES_IQ4NL[0]);
    let (sumqx, sumq2) = fit(xb, weight, 1.0 / (-max / v0), Some(levels));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + i32::from(KVALUES_IQ4NL[0])) as f32 / max;
        let (sumqx, sumq2) = fit(xb, weight, id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Element weights of group `xb` (its importances `qw`) in a block of mean square `sigma2/2`.
fn weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32, out: &mut [f32; 32]) {
    match qw {
        Some(qw) => {
            for ((w, &q), &x) in out.iter_mut().zip(qw).zip(xb) {
                *w = q * (sigma2 + x * x).sqrt();
            }
        }
        None => {
            for (w, &x) in out.iter_mut().zip(xb) {
                *w = x * x;
            }
        }
    }
}

fn sigma2(x: &[f32]) -> f32 {
    sum_squares(x) * (2.0 / x.len() as f32)
}

/// 32 levels into 16 bytes: element j in the low nibble of byte j, j + 16 in the high.
fn pack(levels: &[u8], q: &mut [u8]) {
    for (j, b) in q[..16].iter_mut().enumerate() {
        *b = levels[j] | (levels[16 + j] << 4);
    }
}

fn iq4_nl(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let mut weight = [0.0f32; 32];
    weights(x, qw, sigma2(x), &mut weight);
    let mut levels = [0u8; 32];
    let d = group_scale(x, &weight, &mut levels);
    b[0..2].copy_from_slice(&f32_to_f16(d));
    // The stored scale's levels (the search's, unless the scale is not one of its fits).
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = best_index(&KVALUES_IQ4NL, id * v);
    }
    pack(&levels, &mut b[2..18]);
}

fn iq4_xs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let sigma2 = sigma2(x);
    let mut scales = [0.0f32; QK_K / 32];
    let mut levels = [0u8; 32];
    let (mut amax_scale, mut max_scale) = (0.0f32, 0.0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * (ib + 1)];
        let mut weight = [0.0f32; 32];
        weights(
            xb,
            qw.map(|q| &q[32 * ib..32 * (ib + 1)]),
            sigma2,
            &mut weight,
        );
        *s = group_scale(xb, &weight, &mut levels);
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = *s;
        }
    }
    let d = -max_scale / 32.0;
    b[0..2].copy_from_slice(&f32_to_f16(d));
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    b[4..8].fill(0);
    for (ib, &s) in scales.iter().enumerate() {
        let l = nearest_int(id * s).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for (lv, &v) in levels.iter_mut().zip(&x[32 * ib..32 * (ib + 1)]) {
            *lv = best_index(&KVALUES_IQ4NL, idl * v);
        }
        pack(&levels, &mut b[8 + 16 * ib..8 + 16 * (ib + 1)]);
        let l = (l + 32) as u8;
        b[4 + ib / 2] |= (l & 0x0f) << (4 * (ib % 2));
        scales_h |= u16::from(l >> 4) << (2 * ib);
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

/// One row of IQ4_NL (blocks of 32) or IQ4_XS (super-blocks of 256).
pub(super) fn quantize(dtype: DType, src: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    let (bs, bb) = (dtype.block_size(), dtype.block_bytes());
    for (i, (x, b)) in src
        .chunks_exact(bs)
        .zip(dst.chunks_exact_mut(bb))
        .enumerate()
    {
        let qw = qw.map(|q| &q[bs * i..bs * (i + 1)]);
        match dtype {
            DType::IQ4NL => iq4_nl(x, qw, b),
            _ => iq4_xs(x, qw, b),
        }
    }
}
