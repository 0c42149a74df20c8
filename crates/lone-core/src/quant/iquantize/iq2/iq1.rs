//! IQ1_S and IQ1_M: ggml's `quantize_row_iq1_s_impl` and `quantize_row_iq1_m_impl`.
//!
//! An element is `d·s·(l − 1 + δ)` with a grid point's level `l ∈ {0, 1, 2}`, a sub-block
//! scale `s` (IQ1_S: per 32 elements, IQ1_M: per 16) and `δ = ±1/8` (its sign per 32, IQ1_M
//! per 8). With three values the weighted least-squares fit of a sub-block is solved exactly:
//! in ascending order, the elements before split `i1` take level 0, those from `i2` on level 2,
//! and every split and sign of δ is scored from prefix sums. The level pattern is then put on
//! the grid group by group, off-grid ones taking their nearest neighbour at the fitted scale.

use super::super::super::float::f32_to_f16;
use super::super::super::iqgrid::IQ1_DELTA;
use super::super::super::kquants::{nearest_int, QK_K};
use super::{c_max, grid, sum_squares, weights, Grid, Near};
use crate::tensor::DType;

/// The values of levels 0, 1, 2 with `+δ` and with `−δ`.
const X_P: [f32; 3] = [-1.0 + IQ1_DELTA, IQ1_DELTA, 1.0 + IQ1_DELTA];
const X_M: [f32; 3] = [-1.0 - IQ1_DELTA, -IQ1_DELTA, 1.0 - IQ1_DELTA];

fn values(minus: bool) -> &'static [f32; 3] {
    if minus {
        &X_M
    } else {
        &X_P
    }
}

/// The indices of `key` in ascending order as glibc's `qsort` leaves them for arrays this
/// small: a top-down merge sort taking the left run's element unless it compares greater
/// (ggml's `iq1_sort_helper`), so equal keys keep their order (and NaNs end somewhere).
fn sort_order<const N: usize>(key: &[f32]) -> [u8; N] {
    let mut idx: [u8; N] = core::array::from_fn(|j| j as u8);
    let mut tmp = [0u8; N];
    merge_sort(&mut idx, key, &mut tmp);
    idx
}

fn merge_sort(idx: &mut [u8], key: &[f32], tmp: &mut [u8]) {
    if idx.len() <= 1 {
        return;
    }
    let (a, b) = idx.split_at_mut(idx.len() / 2);
    merge_sort(a, key, tmp);
    merge_sort(b, key, tmp);
    let (mut i, mut j, mut o) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        if key[usize::from(a[i])] > key[usize::from(b[j])] {
            tmp[o] = b[j];
            j += 1;
        } else {
            tmp[o] = a[i];
            i += 1;
        }
        o += 1;
    }
    // What is left of the right run is already in place.
    let rest = a.len() - i;
    tmp[o..o + rest].copy_from_slice(&a[i..]);
    o += rest;
    idx[..o].copy_from_slice(&tmp[..o]);
}

/// `iq1_find_best_neighbour2`: of `near`, the point whose values `scale · xs[l]` are closest to
/// `xb` (squared differences weighted by `w`); writes its levels into `l`.
fn best_neighbour(
    grid: &Grid,
    near: &[u16],
    xb: &[f32],
    w: &[f32],
    scale: f32,
    xs: &[f32; 3],
    l: &mut [u8],
) -> usize {
    let d2 = |j: usize| {
        let p = grid.point(j);
        let mut d2 = 0.0f32;
        for i in 0..8 {
            let q = xs[usize::from(p[i])];
            let diff = scale * q - xb[i];
            d2 += w[i] * diff * diff;
        }
        d2
    };
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for j in near.iter().map(|&j| usize::from(j)) {
        let v = d2(j);
        if v < best_d2 {
            best_d2 = v;
            best = Some(j);
        }
    }
    if best.is_none() {
        // Then ggml searches the whole grid (reading its values out of bounds: only garbage
        // input gets here).
        for j in 0..grid.len() {
            let v = d2(j);
            if v < best_d2 {
                best_d2 = v;
                best = Some(j);
            }
        }
    }
    let best = best.unwrap_or(0);
    l[..8].copy_from_slice(grid.point(best));
    best
}

/// Puts the levels of each group of 8 of `l` on the grid (group g fitted with the values
/// `xs(g)` at `scale`): the grid indices, and whether all were on it already.
fn on_grid<const G: usize>(
    grid: &Grid,
    l: &mut [u8],
    xb: &[f32],
    w: &[f32],
    scale: f32,
    xs: impl Fn(usize) -> &'static [f32; 3],
) -> ([usize; G], bool) {
    let mut index = [0usize; G];
    let mut all_on_grid = true;
    for (k, index) in index.iter_mut().enumerate() {
        let g = 8 * k..8 * k + 8;
        *index = match grid.lookup(&l[g.clone()]) {
            Near::On(j) => j,
            Near::Off(near) => {
                all_on_grid = false;
                best_neighbour(
                    grid,
                    near,
                    &xb[g.clone()],
                    &w[g.clone()],
                    scale,
                    xs(k),
                    &mut l[g],
                )
            }
        };
    }
    (index, all_on_grid)
}

/// The scale refitted to the grid points `index` (group g's values `xs(g)`), when the fit is
/// positive.
fn refit(
    grid: &Grid,
    index: &[usize],
    xb: &[f32],
    w: &[f32],
    xs: impl Fn(usize) -> &'static [f32; 3],
) -> Option<f32> {
    let mut sumqx = 0.0f32;
    let mut sumq2 = 0.0f32;
    for (k, &j) in index.iter().enumerate() {
        let p = grid.point(j);
        for i in 0..8 {
            let w = w[8 * k + i];
            let q = xs(k)[usize::from(p[i])];
            sumqx += w * q * xb[8 * k + i];
            sumq2 += w * q * q;
        }
    }
    (sumqx > 0.0 && sumq2 > 0.0).then(|| sumqx / sumq2)
}

/// The largest magnitude (ggml's `MAX` over `fabsf`).
fn max_abs(x: &[f32]) -> f32 {
    x[1..].iter().fold(x[0].abs(), |m, v| c_max(m, v.abs()))
}

/// The levels of the split (i1, i2) of the elements in `order`.
fn split_levels<const N: usize>(order: &[u8; N], i1: usize, i2: usize) -> [u8; N] {
    let mut l = [0u8; N];
    for (j, &i) in order.iter().enumerate() {
        l[usize::from(i)] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
    l
}

/// The 3-bit sub-block scale of `scale` against the super-block's inverse scale `id`.
fn scale_code(id: f32, scale: f32) -> u16 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 7) as u16
}

/// IQ1_S (50 bytes: d, qs[32], qh[8]): one super-block, importances `qw`.
pub(super) fn iq1_s(x: &[f32], qw: &[f32], y: &mut [u8]) {
    /// ggml's `GROUP_MAX_EPS_IQ1_S`.
    const EPS: f32 = 1e-12;
    let grid = grid(DType::IQ1S);
    y.fill(0);
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut scales = [0.0f32; QK_K / 32];
    let mut minus = [false; QK_K / 32];
    // Per 32: 4 × 3 high index bits, then (at the end) the scale and δ's sign.
    let mut qh = [0u16; QK_K / 32];
    let mut max_scale = 0.0f32;
    for (ib, (xb, qw)) in x.chunks_exact(32).zip(qw.chunks_exact(32)).enumerate() {
        let mut weight = [0.0f32; 32];
        weights(xb, qw, sigma2, &mut weight);
        let max = max_abs(xb);
        if max < EPS {
            continue;
        }
        let order: [u8; 32] = sort_order(xb);
        let mut sumx = [0.0f32; 33];
        let mut sumw = [0.0f32; 33];
        for (j, &i) in order.iter().enumerate() {
            let i = usize::from(i);
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best = None;
        for i1 in 0..=32 {
            for i2 in i1..=32 {
                for m in [false, true] {
                    let xs = values(m);
                    let sumqx = (sumx[i1] - sumx[0]) * xs[0]
                        + (sumx[i2] - sumx[i1]) * xs[1]
                        + (sumx[32] - sumx[i2]) * xs[2];
                    let sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                        + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                        + (sumw[32] - sumw[i2]) * xs[2] * xs[2];
                    if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        best = Some((i1, i2, m));
                    }
                }
            }
        }
        let Some((i1, i2, mut m)) = best else {
            continue;
        };
        let mut l = split_levels(&order, i1, i2);
        if scale < 0.0 {
            l = l.map(|v| 2 - v);
            scale = -scale;
            m = !m;
        }
        let (index, all_on_grid) = on_grid::<4>(grid, &mut l, xb, &weight, scale, |_| values(m));
        if !all_on_grid {
            if let Some(s) = refit(grid, &index, xb, &weight, |_| values(m)) {
                scale = s;
            }
        }
        for (k, &j) in index.iter().enumerate() {
            y[2 + 4 * ib + k] = j as u8;
            qh[ib] |= ((j >> 8) as u16) << (3 * k);
        }
        scales[ib] = scale;
        minus[ib] = m;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale != 0.0 {
        let d = max_scale / 15.0;
        y[..2].copy_from_slice(&f32_to_f16(d * 1.125));
        let id = 1.0 / d;
        for ((h, &s), &m) in qh.iter_mut().zip(&scales).zip(&minus) {
            *h |= (scale_code(id, s) | if m { 8 } else { 0 }) << 12;
        }
    }
    for (o, h) in y[34..].chunks_exact_mut(2).zip(qh) {
        o.copy_from_slice(&h.to_le_bytes());
    }
}

/// IQ1_M's sign bits of δ in a sub-block's `qh` byte, by sign combination (bit 1: the first
/// 8's δ is negative, bit 0: the second 8's).
const SHIFT_MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];

/// The values of group `g` (0, 1) of a sub-block with sign combination `k`.
fn m_values(k: usize, g: usize) -> &'static [f32; 3] {
    values((k >> (1 - g)) & 1 == 1)
}

/// IQ1_M (56 bytes: qs[32], qh[16], 4 scale words holding the f16 `d` in their top nibbles):
/// one super-block; without importances each element is weighted `x²`.
pub(super) fn iq1_m(x: &[f32], qw: Option<&[f32]>, y: &mut [u8]) {
    /// ggml's `GROUP_MAX_EPS_IQ1_M`.
    const EPS: f32 = 1e-7;
    let grid = grid(DType::IQ1M);
    y.fill(0);
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let weigh = |ib: usize, w: &mut [f32; 16]| {
        let xb = &x[16 * ib..16 * ib + 16];
        match qw {
            Some(qw) => weights(xb, &qw[16 * ib..16 * ib + 16], sigma2, w),
            None => {
                for (w, &v) in w.iter_mut().zip(xb) {
                    *w = v * v;
                }
            }
        }
    };
    let mut scales = [0.0f32; QK_K / 16];
    let mut shifts = [0usize; QK_K / 16];
    let mut qh = [0u8; QK_K / 16];
    let mut max_scale = 0.0f32;
    for (ib, xb) in x.chunks_exact(16).enumerate() {
        let mut weight = [0.0f32; 16];
        weigh(ib, &mut weight);
        let max = max_abs(xb);
        if max < EPS {
            continue;
        }
        let order: [u8; 16] = sort_order(xb);
        // Prefix sums per half (each half has its own δ): px[h][j] sums w·x of the first j
        // elements in order that lie in half h.
        let mut px = [[0.0f32; 17]; 2];
        let mut pw = [[0.0f32; 17]; 2];
        for (j, &i) in order.iter().enumerate() {
            let i = usize::from(i);
            let h = usize::from(i >= 8);
            px[h][j + 1] = px[h][j] + weight[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + weight[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        let txs = [px[0][16], px[1][16]];
        let tws = [pw[0][16], pw[1][16]];
        // Adjacent levels differ by 1, so a split's Σ w·x·q is T·v₂ − P(i1) − P(i2).
        let (p2, m2) = (X_P[2], X_M[2]);
        let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
        let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
        let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
        let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best = None;
        for i1 in 0..=16 {
            for i2 in i1..=16 {
                let mut qx_p = [0.0f32; 2];
                let mut qx_m = [0.0f32; 2];
                let mut q2_p = [0.0f32; 2];
                let mut q2_m = [0.0f32; 2];
                for h in 0..2 {
                    let sx = px[h][i1] + px[h][i2];
                    qx_p[h] = txs[h] * p2 - sx;
                    qx_m[h] = txs[h] * m2 - sx;
                    q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                let sumqx = [
                    qx_p[0] + qx_p[1],
                    qx_p[0] + qx_m[1],
                    qx_m[0] + qx_p[1],
                    qx_m[0] + qx_m[1],
                ];
                let sumq2 = [
                    q2_p[0] + q2_p[1],
                    q2_p[0] + q2_m[1],
                    q2_m[0] + q2_p[1],
                    q2_m[0] + q2_m[1],
                ];
                for k in 0..4 {
                    if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        best = Some((i1, i2, k));
                    }
                }
            }
        }
        let Some((i1, i2, mut k)) = best else {
            continue;
        };
        let mut l = split_levels(&order, i1, i2);
        if scale < 0.0 {
            l = l.map(|v| 2 - v);
            scale = -scale;
            k = 3 - k;
        }
        let xs = |g| m_values(k, g);
        let (index, all_on_grid) = on_grid::<2>(grid, &mut l, xb, &weight, scale, xs);
        if !all_on_grid {
            if let Some(s) = refit(grid, &index, xb, &weight, xs) {
                scale = s;
            }
        }
        y[2 * ib] = index[0] as u8;
        y[2 * ib + 1] = index[1] as u8;
        qh[ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
        scales[ib] = scale;
        shifts[ib] = k;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale != 0.0 {
        // The sub-block scales against the largest, then d refitted to the stored values.
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let mut sumqx = 0.0f32;
        let mut sumq2 = 0.0f32;
        for (ib, xb) in x.chunks_exact(16).enumerate() {
            let l = scale_code(id, scales[ib]);
            sc[ib / 4] |= l << (3 * (ib % 4));
            qh[ib] |= SHIFT_MASKS[shifts[ib]];
            let mut weight = [0.0f32; 16];
            weigh(ib, &mut weight);
            for g in 0..2 {
                let xs = m_values(shifts[ib], g);
                let j = usize::from(y[2 * ib + g]) | ((usize::from(qh[ib]) << (8 - 4 * g)) & 0x700);
                let p = grid.point(j);
                for i in 0..8 {
                    let w = weight[8 * g + i];
                    let q = xs[usize::from(p[i])] * f32::from(2 * l + 1);
                    sumqx += w * q * xb[8 * g + i];
                    sumq2 += w * q * q;
                }
            }
        }
        if sumq2 > 0.0 {
            d = sumqx / sumq2;
        }
        let s = u16::from_le_bytes(f32_to_f16(d * 1.1125));
        for (i, w) in sc.iter_mut().enumerate() {
            // Nibble i of the f16 in the top nibble of word i.
            *w |= ((s >> (4 * i)) & 0xf) << 12;
        }
        for (o, w) in y[48..].chunks_exact_mut(2).zip(sc) {
            o.copy_from_slice(&w.to_le_bytes());
        }
    }
    y[32..48].copy_from_slice(&qh);
}
