//! Quantizers of the 2-bit codebook i-quants IQ2_XXS, IQ2_XS, IQ2_S (here) and of the 1-bit
//! ones IQ1_S, IQ1_M ([`iq1`]): ggml's `quantize_iq2_xxs`, `quantize_iq2_xs`,
//! `quantize_iq2_s`, `quantize_iq1_s`, `quantize_iq1_m`, f32 operation for operation.
//!
//! Every group of 8 elements is a point of an 8-dimensional grid. The quantizers see a point
//! as 8 levels `l ∈ {0, 1, 2}` (the stored bytes 8, 25, 43 of the IQ2 grids, −1, 0, 1 of
//! IQ1's), fitted as the odd values `2l + 1` (IQ2, on the magnitudes, the signs apart) or as
//! `l − 1 ± δ` (IQ1). Rounding each element to its nearest level gives a pattern of 3⁸ that is
//! mostly off the grid; then the group takes the best of the pattern's neighbours, the grid
//! points at its `nwant` smallest squared distances (ggml's `iq2xs_init_impl`: 2 for IQ2_XXS
//! and IQ2_XS, 1 for IQ2_S, 3 for IQ1). Those tables are built from lone's grids on first use.
//!
//! Scales: IQ2_XXS fits a scale per 32 elements (a 4-bit multiple of the super-block's), IQ2_XS
//! and IQ2_S per 16; each is the best of a small search over trial scales (weighted least
//! squares), the groups refitted at the winner.

use std::sync::OnceLock;

use super::super::float::f32_to_f16;
use super::super::iq_tables::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use super::super::kquantize::GROUP_MAX_EPS;
use super::super::kquants::{nearest_int, QK_K};
use super::super::weighted::make_qp_quants;
use super::c_max;
use super::sum_squares;
use crate::tensor::DType;

mod iq1;

pub(super) const WRITES: bool = true;

/// The pattern of 8 levels: element i's level in bits 2i and 2i+1 (ggml's `kgrid_*` packing).
#[inline]
fn pattern(l: &[u8]) -> u16 {
    l[..8]
        .iter()
        .enumerate()
        .fold(0, |u, (i, &v)| u | (u16::from(v & 3) << (2 * i)))
}

/// Where a pattern stands: a grid point, or off the grid with its neighbours.
#[derive(Clone, Copy)]
enum Slot {
    On(u16),
    Off { start: u32, len: u16 },
}

/// A pattern looked up on a grid.
enum Near<'a> {
    On(usize),
    /// The neighbours (grid indices) by increasing distance, then index.
    Off(&'a [u16]),
}

/// A grid as ggml's quantizer sees it (`iq2_data[..]`: `grid`, `map`, `neighbours`).
struct Grid {
    /// The levels of each point's 8 elements.
    points: Box<[[u8; 8]]>,
    /// By pattern (all 4⁸; those with a level 3 never occur and have no neighbours).
    slots: Box<[Slot]>,
    /// The neighbour lists of the off-grid patterns, one after another.
    pool: Box<[u16]>,
}

impl Grid {
    /// The tables of the grid `points`, a pattern's neighbours being the points at its
    /// `nwant` smallest (distinct) squared distances, in order of distance then index (ggml
    /// sorts `(d², index)` pairs).
    fn new(points: Vec<[u8; 8]>, nwant: usize) -> Grid {
        let mut slots = vec![Slot::Off { start: 0, len: 0 }; 1 << 16];
        for (j, p) in points.iter().enumerate() {
            slots[usize::from(pattern(p))] = Slot::On(j as u16);
        }
        let mut pool = Vec::new();
        let mut dist = vec![0usize; points.len()];
        for (u, slot) in slots.iter_mut().enumerate() {
            let l: [u8; 8] = core::array::from_fn(|i| ((u >> (2 * i)) & 3) as u8);
            if matches!(slot, Slot::On(_)) || l.contains(&3) {
                continue;
            }
            // ggml's distance between the odd values 2l + 1 (of levels 0..=3: at most 8 · 6²).
            let mut seen = [false; 8 * 36 + 1];
            for (d, p) in dist.iter_mut().zip(points.iter()) {
                *d = p
                    .iter()
                    .zip(&l)
                    .map(|(&a, &b)| {
                        let e = usize::from(a.abs_diff(b)) * 2;
                        e * e
                    })
                    .sum();
                seen[*d] = true;
            }
            let start = pool.len();
            let nearest = seen.iter().enumerate().filter(|(_, &s)| s).take(nwant);
            for (d2, _) in nearest {
                let at = dist.iter().enumerate().filter(|(_, &d)| d == d2);
                pool.extend(at.map(|(j, _)| j as u16));
            }
            *slot = Slot::Off {
                start: start as u32,
                len: (pool.len() - start) as u16,
            };
        }
        Grid {
            points: points.into_boxed_slice(),
            slots: slots.into_boxed_slice(),
            pool: pool.into_boxed_slice(),
        }
    }

    fn lookup(&self, l: &[u8]) -> Near<'_> {
        match self.slots[usize::from(pattern(l))] {
            Slot::On(j) => Near::On(usize::from(j)),
            Slot::Off { start, len } => {
                let start = start as usize;
                Near::Off(&self.pool[start..start + usize::from(len)])
            }
        }
    }

    /// The number of grid points.
    fn len(&self) -> usize {
        self.points.len()
    }

    /// The levels of grid point `j`.
    #[inline]
    fn point(&self, j: usize) -> &[u8; 8] {
        &self.points[j]
    }

    /// `iq2_find_best_neighbour`: of `near`, the point whose values `scale · (2l + 1)` are
    /// closest to `xval` (squared differences weighted by `w`); writes its levels into `l`.
    fn best_neighbour(
        &self,
        near: &[u16],
        xval: &[f32],
        w: &[f32],
        scale: f32,
        l: &mut [u8],
    ) -> usize {
        let mut best_d2 = f32::MAX;
        // ggml asserts that one is below f32::MAX (only garbage input has none).
        let mut best = near.first().map_or(0, |&j| usize::from(j));
        for &j in near {
            let p = self.point(usize::from(j));
            let mut d2 = 0.0f32;
            for i in 0..8 {
                let q = f32::from(2 * p[i] + 1);
                let diff = scale * q - xval[i];
                d2 += w[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                best = usize::from(j);
            }
        }
        l[..8].copy_from_slice(self.point(best));
        best
    }

    /// The levels of the 8 elements `xval` nearest their values at `id`, into `l`; a pattern
    /// off the grid takes its best neighbour at `scale` (weights `w`). Whether it was on it.
    fn fit(&self, id: f32, scale: f32, xval: &[f32], w: &[f32], l: &mut [u8]) -> bool {
        for (li, &v) in l[..8].iter_mut().zip(xval) {
            *li = nearest_level(id, v);
        }
        match self.lookup(l) {
            Near::On(_) => true,
            Near::Off(near) => {
                self.best_neighbour(near, xval, w, scale, l);
                false
            }
        }
    }

    /// The grid index of the levels `l`, which the fit has put on the grid (ggml aborts
    /// otherwise; garbage input may get point 0).
    fn index_of(&self, l: &[u8]) -> usize {
        match self.lookup(l) {
            Near::On(j) => j,
            Near::Off(_) => 0,
        }
    }
}

/// The stored bytes of the IQ2 grids' levels 0, 1, 2.
const IQ2_LEVEL_BYTES: [u8; 3] = [0x08, 0x19, 0x2b];

fn grid_points(grid: &[u64], level: impl Fn(u8) -> u8) -> Vec<[u8; 8]> {
    grid.iter()
        .map(|&g| core::array::from_fn(|i| level((g >> (8 * i)) as u8)))
        .collect()
}

/// An IQ2 grid's level of a stored byte.
fn iq2_level(b: u8) -> u8 {
    IQ2_LEVEL_BYTES.iter().position(|&v| v == b).unwrap_or(3) as u8
}

/// The quantizer's tables of `dtype`'s grid, built on first use.
fn grid(dtype: DType) -> &'static Grid {
    static IQ2XXS: OnceLock<Grid> = OnceLock::new();
    static IQ2XS: OnceLock<Grid> = OnceLock::new();
    static IQ2S: OnceLock<Grid> = OnceLock::new();
    static IQ1: OnceLock<Grid> = OnceLock::new();
    match dtype {
        DType::IQ2XXS => IQ2XXS.get_or_init(|| Grid::new(grid_points(&IQ2XXS_GRID, iq2_level), 2)),
        DType::IQ2XS => IQ2XS.get_or_init(|| Grid::new(grid_points(&IQ2XS_GRID, iq2_level), 2)),
        DType::IQ2S => IQ2S.get_or_init(|| Grid::new(grid_points(&IQ2S_GRID, iq2_level), 1)),
        // IQ1: signed levels −1, 0, 1.
        _ => IQ1.get_or_init(|| Grid::new(grid_points(&IQ1S_GRID, |b| (b as i8 + 1) as u8), 3)),
    }
}

/// Quantize one row (whole super-blocks, `dst` exactly its bytes) into `dtype`, with the
/// row's importances `qw`: required by IQ2_XXS, IQ2_XS and IQ1_S (the dispatch refuses them
/// without, as ggml asserts).
pub(super) fn quantize(dtype: DType, src: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    let bytes = dtype.block_bytes();
    let blocks = src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(bytes));
    for (ibl, (x, y)) in blocks.enumerate() {
        let qw = qw.map(|q| &q[QK_K * ibl..QK_K * (ibl + 1)]);
        match dtype {
            DType::IQ2XXS => iq2_xxs(x, qw.expect("IQ2_XXS needs importances"), y),
            DType::IQ2XS => iq2_xs(x, qw.expect("IQ2_XS needs importances"), y),
            DType::IQ2S => iq2_s(x, qw, y),
            DType::IQ1S => iq1::iq1_s(x, qw.expect("IQ1_S needs importances"), y),
            DType::IQ1M => iq1::iq1_m(x, qw, y),
            _ => unreachable!("{dtype} is not a 2-bit or 1-bit i-quant"),
        }
    }
}

/// The 3 levels of the IQ2 fits.
const KMAX_Q: i32 = 3;

/// The level nearest `v` at inverse scale `id` (the value `2l + 1` nearest `id · v`).
#[inline]
fn nearest_level(id: f32, v: f32) -> u8 {
    nearest_int(0.5 * (id * v - 1.0)).clamp(0, KMAX_Q - 1) as u8
}

/// `Σ w·x·q` and `Σ w·q²` of the values `q = 2l + 1`.
fn sums(xval: &[f32], w: &[f32], l: &[u8]) -> (f32, f32) {
    let mut sumqx = 0.0f32;
    let mut sumq2 = 0.0f32;
    for ((&x, &w), &l) in xval.iter().zip(w).zip(l) {
        let q = f32::from(2 * l + 1);
        sumqx += w * x * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The magnitudes of a group of 8 (`xval`) and the bits of its negative elements. IQ2_XXS and
/// IQ2_XS store 7 sign bits (the 8th makes the count even): an odd count leaves the element of
/// least `w·x²` positive, its magnitude negated. Returns the 7 stored bits.
fn even_signs(xb: &[f32], w: &[f32], xval: &mut [f32]) -> u8 {
    let mut s = odd_signs(xb, xval);
    if s.count_ones() % 2 == 1 {
        let mut imin = 0;
        let mut min = w[0] * xb[0] * xb[0];
        for i in 1..8 {
            let ax = w[i] * xb[i] * xb[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    s & 127
}

/// The magnitudes of a group of 8 and the bits of its negative elements (all 8: IQ2_S).
fn odd_signs(xb: &[f32], xval: &mut [f32]) -> u8 {
    let mut s = 0u8;
    for (i, (v, &x)) in xval[..8].iter_mut().zip(xb).enumerate() {
        if x >= 0.0 {
            *v = x;
        } else {
            *v = -x;
            s |= 1 << i;
        }
    }
    s
}

/// The weights `qw_i · sqrt(sigma2 + x_i²)` of the weighted fits.
fn weights(x: &[f32], qw: &[f32], sigma2: f32, w: &mut [f32]) {
    for ((w, &x), &q) in w.iter_mut().zip(x).zip(qw) {
        *w = q * (sigma2 + x * x).sqrt();
    }
}

fn max_of(x: &[f32]) -> f32 {
    x[1..].iter().fold(x[0], |m, &v| c_max(m, v))
}

/// The 4-bit sub-block scale of `scale` against the super-block's inverse scale `id`.
#[inline]
fn scale_nibble(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

/// IQ2_XXS (66 bytes): `quantize_row_iq2_xxs_impl` of one super-block.
fn iq2_xxs(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let grid = grid(DType::IQ2XXS);
    let sigma2 = sum_squares(x) / QK_K as f32;
    let mut scales = [0.0f32; QK_K / 32];
    // Per 32: 4 grid indices, then 4 × 7 sign bits and the 4-bit scale.
    let mut q2 = [0u32; QK_K / 16];
    let mut max_scale = 0.0f32;
    for (ib, (xb, qw)) in x.chunks_exact(32).zip(qw.chunks_exact(32)).enumerate() {
        let mut weight = [0.0f32; 32];
        weights(xb, qw, sigma2, &mut weight);
        let waux = weight.map(f32::sqrt);
        let mut xval = [0.0f32; 32];
        let mut signs = [0u8; 4];
        for (k, s) in signs.iter_mut().enumerate() {
            let g = 8 * k..8 * k + 8;
            *s = even_signs(&xb[g.clone()], &weight[g.clone()], &mut xval[g]);
        }
        if max_of(&xval) < GROUP_MAX_EPS {
            continue;
        }
        let mut l = [0u8; 32];
        let mut scale = make_qp_quants(&xval, KMAX_Q + 1, &mut l, &weight);
        let eff_max = scale * KMAX_Q as f32;
        if eff_max <= 0.0 {
            continue;
        }
        let mut best = 0.0f32;
        for is in -6..=6 {
            let id = ((2 * KMAX_Q - 1) as f32 + is as f32 * 0.1) / eff_max;
            let this_scale = 1.0 / id;
            let mut laux = [0u8; 32];
            for k in 0..4 {
                let g = 8 * k..8 * k + 8;
                grid.fit(
                    id,
                    this_scale,
                    &xval[g.clone()],
                    &waux[g.clone()],
                    &mut laux[g],
                );
            }
            let (sumqx, sumq2) = sums(&xval, &weight, &laux);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                l = laux;
            }
        }
        if scale > 0.0 {
            // Refit every group at the chosen scale.
            let id = 1.0 / scale;
            for k in 0..4 {
                let g = 8 * k..8 * k + 8;
                grid.fit(id, scale, &xval[g.clone()], &waux[g.clone()], &mut l[g]);
            }
            let (sumqx, sumq2) = sums(&xval, &weight, &l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        if scale < 0.0 {
            // ggml: "should never happen"; the signs flip with the scale.
            scale = -scale;
            for s in &mut signs {
                *s = !*s & 127;
            }
        }
        for (k, &s) in signs.iter().enumerate() {
            let j = grid.index_of(&l[8 * k..8 * k + 8]);
            q2[2 * ib] |= (j as u32) << (8 * k);
            q2[2 * ib + 1] |= u32::from(s) << (7 * k);
        }
        scales[ib] = scale;
        max_scale = c_max(max_scale, scale);
    }
    y.fill(0);
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    y[..2].copy_from_slice(&f32_to_f16(d));
    let id = 1.0 / d;
    for (ib, &s) in scales.iter().enumerate() {
        q2[2 * ib + 1] |= u32::from(scale_nibble(id, s)) << 28;
    }
    for (o, q) in y[2..].chunks_exact_mut(4).zip(q2) {
        o.copy_from_slice(&q.to_le_bytes());
    }
}

/// The fit of a 16-element sub-block of IQ2_XS or IQ2_S (magnitudes `xval`, weights
/// `weight`): its scale and its two grid indices, or None when it is all (nearly) zero.
/// `negated`: the scale came out negative and was negated (the signs must flip).
struct Fit16 {
    scale: f32,
    index: [usize; 2],
    negated: bool,
}

/// The scale search of `quantize_row_iq2_xs_impl` / `quantize_row_iq2_s_impl`: trial inverse
/// scales `(5 + 0.1·is) / max`, `is ∈ −9..=9`, the best weighted least-squares fit kept, its
/// off-grid groups refitted at the fitted scale.
fn fit16(grid: &Grid, xval: &[f32; 16], weight: &[f32; 16], eps: f32) -> Option<Fit16> {
    let waux = weight.map(f32::sqrt);
    let max = max_of(xval);
    if max < eps {
        return None;
    }
    let mut l = [0u8; 16];
    let mut best = 0.0f32;
    let mut scale = max / (2 * KMAX_Q - 1) as f32;
    let mut on_grid = [true; 2];
    for is in -9..=9 {
        let id = ((2 * KMAX_Q - 1) as f32 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        let mut laux = [0u8; 16];
        let mut on_grid_aux = [true; 2];
        for (k, on) in on_grid_aux.iter_mut().enumerate() {
            let g = 8 * k..8 * k + 8;
            *on = grid.fit(
                id,
                this_scale,
                &xval[g.clone()],
                &waux[g.clone()],
                &mut laux[g],
            );
        }
        let (sumqx, sumq2) = sums(xval, weight, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            on_grid = on_grid_aux;
        }
    }
    if on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in (0..2).filter(|&k| !on_grid[k]) {
            let g = 8 * k..8 * k + 8;
            grid.fit(id, scale, &xval[g.clone()], &waux[g.clone()], &mut l[g]);
        }
        let (sumqx, sumq2) = sums(xval, weight, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    let negated = scale < 0.0;
    if negated {
        scale = -scale;
    }
    Some(Fit16 {
        scale,
        index: [grid.index_of(&l[..8]), grid.index_of(&l[8..])],
        negated,
    })
}

/// IQ2_XS (74 bytes): `quantize_row_iq2_xs_impl` of one super-block.
fn iq2_xs(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let grid = grid(DType::IQ2XS);
    let sigma2 = sum_squares(x) / QK_K as f32;
    let mut scales = [0.0f32; QK_K / 16];
    // Per 8: a 9-bit grid index and 7 sign bits.
    let mut q2 = [0u16; QK_K / 8];
    let mut max_scale = 0.0f32;
    for (ib, (xb, qw)) in x.chunks_exact(16).zip(qw.chunks_exact(16)).enumerate() {
        let mut weight = [0.0f32; 16];
        weights(xb, qw, sigma2, &mut weight);
        let mut xval = [0.0f32; 16];
        let mut signs = [0u8; 2];
        for (k, s) in signs.iter_mut().enumerate() {
            let g = 8 * k..8 * k + 8;
            *s = even_signs(&xb[g.clone()], &weight[g.clone()], &mut xval[g]);
        }
        let Some(fit) = fit16(grid, &xval, &weight, GROUP_MAX_EPS) else {
            continue;
        };
        for (q, (&j, &s)) in q2[2 * ib..].iter_mut().zip(fit.index.iter().zip(&signs)) {
            let s = if fit.negated { !s & 127 } else { s };
            *q = j as u16 | (u16::from(s) << 9);
        }
        scales[ib] = fit.scale;
        max_scale = c_max(max_scale, fit.scale);
    }
    y.fill(0);
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    y[..2].copy_from_slice(&f32_to_f16(d));
    let id = 1.0 / d;
    for (o, q) in y[2..66].chunks_exact_mut(2).zip(q2) {
        o.copy_from_slice(&q.to_le_bytes());
    }
    for (o, s) in y[66..].iter_mut().zip(scales.chunks_exact(2)) {
        *o = scale_nibble(id, s[0]) | (scale_nibble(id, s[1]) << 4);
    }
}

/// IQ2_S (82 bytes): `quantize_row_iq2_s_impl` of one super-block; without importances each
/// element is weighted `σ²/4 + x²`.
fn iq2_s(x: &[f32], qw: Option<&[f32]>, y: &mut [u8]) {
    /// ggml's `GROUP_MAX_EPS_IQ2_S`.
    const EPS: f32 = 1e-8;
    let grid = grid(DType::IQ2S);
    y.fill(0);
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    for (ib, xb) in x.chunks_exact(16).enumerate() {
        let mut weight = [0.0f32; 16];
        match qw {
            Some(qw) => weights(xb, &qw[16 * ib..16 * ib + 16], sigma2, &mut weight),
            None => {
                for (w, &v) in weight.iter_mut().zip(xb) {
                    *w = 0.25 * sigma2 + v * v;
                }
            }
        }
        let mut xval = [0.0f32; 16];
        let signs = [
            odd_signs(&xb[..8], &mut xval[..8]),
            odd_signs(&xb[8..], &mut xval[8..]),
        ];
        let Some(fit) = fit16(grid, &xval, &weight, EPS) else {
            continue;
        };
        for (k, (&j, &s)) in fit.index.iter().zip(&signs).enumerate() {
            let i8 = 2 * ib + k;
            y[2 + i8] = j as u8;
            y[66 + i8 / 4] |= ((j >> 8) << (2 * (i8 % 4))) as u8;
            y[34 + i8] = if fit.negated { !s } else { s };
        }
        scales[ib] = fit.scale;
        max_scale = c_max(max_scale, fit.scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    y[..2].copy_from_slice(&f32_to_f16(d * 0.9875));
    let id = 1.0 / d;
    for (o, s) in y[74..].iter_mut().zip(scales.chunks_exact(2)) {
        *o = scale_nibble(id, s[0]) | (scale_nibble(id, s[1]) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::iq_tables::KSIGNS_IQ2XS;
    use super::*;

    const FORMATS: [DType; 5] = [
        DType::IQ2XXS,
        DType::IQ2XS,
        DType::IQ2S,
        DType::IQ1S,
        DType::IQ1M,
    ];

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// The grids' points in lone's order are ggml's `kgrid_*` tables (packed patterns: the
    /// first, the last, and a checksum weighted by position).
    #[test]
    fn grids_are_ggmls_kgrid_tables() {
        for (dtype, last, checksum) in [
            (DType::IQ2XXS, 43268u64, 711_230_818u64),
            (DType::IQ2XS, 43690, 3_063_311_876),
            (DType::IQ2S, 43690, 12_275_367_849),
            (DType::IQ1S, 43690, 61_384_112_667),
        ] {
            let g = grid(dtype);
            let packed: Vec<u64> = g.points.iter().map(|p| u64::from(pattern(p))).collect();
            assert!(g.points.iter().flatten().all(|&l| l <= 2), "{dtype}");
            assert_eq!(&packed[..6], &[0, 2, 5, 8, 10, 17], "{dtype}");
            assert_eq!(packed.last(), Some(&last), "{dtype}");
            let sum: u64 = packed
                .iter()
                .enumerate()
                .map(|(j, &u)| (j as u64 + 1) * u)
                .sum();
            assert_eq!(sum, checksum, "{dtype}");
        }
    }

    /// Every point is its own pattern; an off-grid pattern's neighbours are in order of
    /// distance then index, starting with all the points nearest it.
    #[test]
    fn neighbours_are_the_nearest_points_in_order() {
        let dist = |a: &[u8; 8], b: &[u8; 8]| -> u32 {
            a.iter()
                .zip(b)
                .map(|(&x, &y)| 4 * u32::from(x.abs_diff(y)).pow(2))
                .sum()
        };
        for (dtype, nwant) in [(DType::IQ2XXS, 2), (DType::IQ2S, 1), (DType::IQ1M, 3)] {
            let g = grid(dtype);
            for (j, p) in g.points.iter().enumerate() {
                assert!(matches!(g.lookup(p), Near::On(i) if i == j), "{dtype} {j}");
            }
            let mut rng = Rng(0x5eed);
            for _ in 0..200 {
                let l: [u8; 8] = core::array::from_fn(|_| rng.below(3) as u8);
                let Near::Off(near) = g.lookup(&l) else {
                    continue;
                };
                let d: Vec<(u32, u16)> = near
                    .iter()
                    .map(|&j| (dist(&l, g.point(usize::from(j))), j))
                    .collect();
                assert!(d.windows(2).all(|w| w[0] < w[1]), "{dtype} {l:?}");
                let nearest = g.points.iter().map(|p| dist(&l, p)).min().unwrap();
                let at_nearest = g.points.iter().filter(|p| dist(&l, p) == nearest).count();
                assert_eq!(d[0].0, nearest);
                assert!(d.iter().filter(|e| e.0 == nearest).count() == at_nearest);
                let mut distinct: Vec<u32> = d.iter().map(|e| e.0).collect();
                distinct.dedup();
                assert!(distinct.len() <= nwant, "{dtype} {l:?}");
            }
        }
    }

    /// A row made of grid points (signs, δ as the format stores them) at one scale comes
    /// back as those points: the dequantized row is a constant times their stored values.
    #[test]
    fn a_row_on_the_grid_round_trips() {
        let mut rng = Rng(0x1234_5678_9abc);
        for dtype in FORMATS {
            let g = grid(dtype);
            let iq1 = matches!(dtype, DType::IQ1S | DType::IQ1M);
            let n = 2 * QK_K;
            // Per element: the value the format stores for the chosen point (up to the scale).
            let mut want = vec![0.0f32; n];
            let sub = match dtype {
                DType::IQ2XXS | DType::IQ1S => 32,
                _ => 16,
            };
            for ws in want.chunks_exact_mut(sub) {
                let delta = if rng.below(2) == 0 { 0.125 } else { -0.125 };
                loop {
                    for wg in ws.chunks_exact_mut(8) {
                        let p = g.point(rng.below(g.len()));
                        let signs = match dtype {
                            DType::IQ2XXS | DType::IQ2XS => KSIGNS_IQ2XS[rng.below(128)],
                            DType::IQ2S => rng.below(256) as u8,
                            _ => 0,
                        };
                        let delta = if dtype == DType::IQ1M && rng.below(2) == 0 {
                            -delta
                        } else {
                            delta
                        };
                        for (i, w) in wg.iter_mut().enumerate() {
                            *w = if iq1 {
                                f32::from(p[i]) - 1.0 + delta
                            } else {
                                let q = f32::from(2 * p[i] + 1);
                                if signs & (1 << i) != 0 {
                                    -q
                                } else {
                                    q
                                }
                            };
                        }
                    }
                    // Each IQ2 sub-block holds a level 2 (its largest magnitude is 5 steps).
                    if iq1 || ws.iter().any(|v| v.abs() == 5.0) {
                        break;
                    }
                }
            }
            let x: Vec<f32> = want.iter().map(|&v| 0.37 * v).collect();
            let ones = vec![1.0f32; n];
            let mut q = vec![0u8; dtype.bytes_for(n).unwrap()];
            quantize(dtype, &x, Some(&ones), &mut q);
            let mut y = vec![0.0f32; n];
            crate::quant::dequantize_row(dtype, &q, &mut y).unwrap();
            // The stored values of the chosen points (IQ2: the grid's bytes, not 2l + 1).
            let stored: Vec<f32> = if iq1 {
                want.clone()
            } else {
                want.iter()
                    .map(|&v| {
                        let b = IQ2_LEVEL_BYTES[((v.abs() as usize) - 1) / 2];
                        f32::from(b).copysign(v)
                    })
                    .collect()
            };
            for (blk, (y, s)) in y.chunks(QK_K).zip(stored.chunks(QK_K)).enumerate() {
                let (i0, _) = s.iter().enumerate().fold((0, 0.0f32), |m, (i, v)| {
                    if v.abs() > m.1 {
                        (i, v.abs())
                    } else {
                        m
                    }
                });
                let c = y[i0] / s[i0];
                assert!(c > 0.0, "{dtype} block {blk}");
                for (i, (&y, &s)) in y.iter().zip(s).enumerate() {
                    assert!(
                        (y - c * s).abs() <= 1e-5 * c.abs(),
                        "{dtype} block {blk} [{i}]: {y} vs {}",
                        c * s
                    );
                }
            }
        }
    }
}
