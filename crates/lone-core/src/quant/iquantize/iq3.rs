//! IQ3_XXS and IQ3_S: ggml's `quantize_iq3_xxs` / `quantize_iq3_s`.
//!
//! Each group of 4 elements is one point of a grid of 4-tuples of levels `l ∈ 0..8` (the value
//! `2l + 1` times the sub-block scale): 256 points for IQ3_XXS, 512 for IQ3_S. The signs are
//! stored apart, so the fit is of the magnitudes `|x|`. Per 32-element sub-block a scale
//! search tries `id = (15 + 0.2·is) / max` (IQ3_XXS: `is ∈ −15..=15`, IQ3_S: `−9..=9`),
//! rounds every element to a level, and where a group's levels are no grid point takes the
//! point nearest in weighted distance among a precomputed list of its nearest neighbours (the
//! points at the smallest 2 (IQ3_XXS) or 3 (IQ3_S) lattice distances); the candidate with the
//! largest `(Σ w·x·q)² / Σ w·q²` wins, its least-squares scale is the sub-block's. If some
//! group was off the grid, the groups are rounded once more with that scale (IQ3_XXS only the
//! off-grid ones) and the scale refitted. The sub-block scales are finally quantized to 4 bits
//! against the super-block's `d = max / 31` (stored with a fudge factor: 1.0125 for IQ3_XXS,
//! 1.033 for IQ3_S).
//!
//! IQ3_XXS stores 7 sign bits per 8 elements (even parity: with an odd number of negatives,
//! the element of least `w·x²` is fitted with its sign flipped); IQ3_S stores all 8.
//!
//! Reproduced from ggml: in IQ3_S an all-zero sub-block (largest magnitude exactly 0) does
//! not advance the grid-index and sign slots, so the following sub-blocks' indices and signs
//! are stored one slot early (their high index bits and scales stay in place), leaving the
//! last slots zero. ggml aborts where no neighbour is nearer than `f32::MAX` (NaN or infinite
//! input); lone takes the list's first and goes on.
//!
//! The arithmetic is ggml's f32 operations in its order, so the bytes are the same.

use std::ops::RangeInclusive;
use std::sync::OnceLock;

use super::super::float::f32_to_f16;
use super::super::iq_tables::{IQ3S_GRID, IQ3XXS_GRID};
use super::super::kquants::{nearest_int, QK_K};
use super::{c_max, sum_squares};
use crate::tensor::DType;

pub(super) const WRITES: bool = true;

/// Where a 4-tuple of levels lies with respect to the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    /// The grid point of that index.
    On(u16),
    /// Off the grid: its nearest points are `Grid::neighbours[start..end]`.
    Off { start: u32, end: u32 },
}

/// A grid with ggml's lookup tables (`iq3xs_init_impl`).
struct Grid {
    /// Each point's 4 levels (0..8).
    points: Vec<[u8; 4]>,
    /// Every 4-tuple of levels, keyed by [`key`].
    cells: Vec<Cell>,
    neighbours: Vec<u16>,
}

/// A 4-tuple of levels as ggml's index: level i in bits 3i..3i+3.
fn key(levels: [u8; 4]) -> usize {
    levels
        .iter()
        .enumerate()
        .fold(0, |u, (i, &l)| u | usize::from(l) << (3 * i))
}

impl Grid {
    /// The tables of `points`, an off-grid tuple's neighbours being the points at its
    /// `nwant` smallest distances, nearest first (ties by index, as ggml's qsort of
    /// (distance, index) pairs).
    fn new(points: Vec<[u8; 4]>, nwant: usize) -> Self {
        let mut cells = vec![Cell::Off { start: 0, end: 0 }; 1 << 12];
        for (j, &p) in points.iter().enumerate() {
            cells[key(p)] = Cell::On(j as u16);
        }
        let mut neighbours = Vec::new();
        let mut dist: Vec<(u32, u16)> = Vec::with_capacity(points.len());
        for (u, cell) in cells.iter_mut().enumerate() {
            if matches!(cell, Cell::On(_)) {
                continue;
            }
            let levels: [u8; 4] = std::array::from_fn(|i| ((u >> (3 * i)) & 7) as u8);
            dist.clear();
            dist.extend(points.iter().enumerate().map(|(j, p)| {
                // ggml's squared distance of the values 2l+1: 4 times that of the levels.
                let d2 = p
                    .iter()
                    .zip(&levels)
                    .map(|(&a, &b)| 4 * (i32::from(a) - i32::from(b)).pow(2) as u32)
                    .sum::<u32>();
                (d2, j as u16)
            }));
            dist.sort_unstable();
            let start = neighbours.len() as u32;
            let mut distances = 0;
            let mut last = None;
            for &(d2, j) in &dist {
                if last != Some(d2) {
                    if distances == nwant {
                        break;
                    }
                    distances += 1;
                    last = Some(d2);
                }
                neighbours.push(j);
            }
            *cell = Cell::Off {
                start,
                end: neighbours.len() as u32,
            };
        }
        Grid {
            points,
            cells,
            neighbours,
        }
    }

    /// `q = 2l + 1` of element i of point j.
    fn value(&self, j: u16, i: usize) -> f32 {
        f32::from(2 * self.points[usize::from(j)][i] + 1)
    }

    /// The grid point for magnitudes `x` (4) at inverse scale `id`: the one its rounded levels
    /// name, else the neighbour nearest `x` at `scale` in `w`-weighted distance. Whether the
    /// levels were on the grid comes with it.
    fn point(&self, x: &[f32], w: &[f32], id: f32, scale: f32) -> (u16, bool) {
        let levels: [u8; 4] =
            std::array::from_fn(|i| nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, 7) as u8);
        match self.cells[key(levels)] {
            Cell::On(j) => (j, true),
            Cell::Off { start, end } => {
                let near = &self.neighbours[start as usize..end as usize];
                (self.best_neighbour(near, x, w, scale), false)
            }
        }
    }

    /// ggml's `iq3_find_best_neighbour`: the first of `near` with the least
    /// `Σ w·(scale·q − x)²` (the first of all when none is below `f32::MAX`).
    fn best_neighbour(&self, near: &[u16], x: &[f32], w: &[f32], scale: f32) -> u16 {
        let mut best = (f32::MAX, near[0]);
        for &j in near {
            let mut d2 = 0.0f32;
            for i in 0..4 {
                let diff = scale * self.value(j, i) - x[i];
                d2 += w[i] * diff * diff;
            }
            if d2 < best.0 {
                best = (d2, j);
            }
        }
        best.1
    }

    /// `(Σ w·x·q, Σ w·q²)` over a sub-block of 8 groups at grid points `idx`.
    fn sums(&self, idx: &[u16; 8], xval: &[f32; 32], weight: &[f32; 32]) -> (f32, f32) {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for i in 0..32 {
            let (w, q) = (weight[i], self.value(idx[i / 4], i % 4));
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    }
}

/// IQ3_XXS's grid: its dequantization levels 4, 12, …, 52, 62 are the levels 0..8.
fn xxs_grid() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(|| {
        const LEVELS: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
        let level = |b: u8| {
            LEVELS
                .iter()
                .position(|&v| v == b)
                .expect("an IQ3_XXS level") as u8
        };
        let points = IQ3XXS_GRID
            .iter()
            .map(|g| g.to_le_bytes().map(level))
            .collect();
        Grid::new(points, 2)
    })
}

/// IQ3_S's grid: its dequantization levels are the values 2l + 1.
fn s_grid() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(|| {
        let points = IQ3S_GRID
            .iter()
            .map(|g| g.to_le_bytes().map(|b| (b - 1) / 2))
            .collect();
        Grid::new(points, 3)
    })
}

/// What differs between the two formats' sub-block fits.
struct Fit {
    /// The scale search's steps `is`.
    steps: RangeInclusive<i32>,
    /// IQ3_XXS: groups start "on the grid" (no refinement unless a search candidate was taken
    /// with an off-grid group) and only off-grid groups are refined. IQ3_S: all start off and
    /// all are refined.
    xxs: bool,
}

/// The fitting weights of a sub-block: `qw·sqrt(σ² + x²)` with importances, else `x²`.
fn weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32) -> [f32; 32] {
    std::array::from_fn(|i| match qw {
        Some(qw) => qw[i] * (sigma2 + xb[i] * xb[i]).sqrt(),
        None => xb[i] * xb[i],
    })
}

/// The sub-block's scale and grid points for magnitudes `xval` (largest `max`, not 0).
fn fit(grid: &Grid, how: &Fit, xval: &[f32; 32], weight: &[f32; 32], max: f32) -> (f32, [u16; 8]) {
    let waux: [f32; 32] = weight.map(f32::sqrt);
    let group = |k: usize| (&xval[4 * k..4 * k + 4], &waux[4 * k..4 * k + 4]);
    let mut best = 0.0f32;
    let mut scale = max / 15.0;
    // ggml's levels start at 0: point 0 of both grids.
    let mut idx = [0u16; 8];
    let mut on_grid = [how.xxs; 8];
    for is in how.steps.clone() {
        let id = (15.0 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        let mut aux = [0u16; 8];
        let mut aux_on = [true; 8];
        for k in 0..8 {
            let (x, w) = group(k);
            (aux[k], aux_on[k]) = grid.point(x, w, id, this_scale);
        }
        let (sumqx, sumq2) = grid.sums(&aux, xval, weight);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            idx = aux;
            on_grid = aux_on;
        }
    }
    if on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if how.xxs && on_grid[k] {
                continue;
            }
            let (x, w) = group(k);
            idx[k] = grid.point(x, w, id, scale).0;
        }
        let (sumqx, sumq2) = grid.sums(&idx, xval, weight);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    (scale, idx)
}

/// A sub-block scale's 4-bit code against the super-block's inverse scale `id`.
fn scale_code(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

/// `2·Σx² / 256` of a super-block.
fn sigma2(x: &[f32]) -> f32 {
    2.0 * sum_squares(x) / QK_K as f32
}

/// One IQ3_XXS super-block (98 bytes): d, 64 grid indices, 8 × (4 × 7 sign bits, scale).
fn iq3_xxs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    const FIT: Fit = Fit {
        steps: -15..=15,
        xxs: true,
    };
    let grid = xxs_grid();
    b.fill(0);
    let sigma2 = sigma2(x);
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    for (ib, xb) in x.chunks_exact(32).enumerate() {
        let weight = weights(xb, qw.map(|w| &w[32 * ib..32 * ib + 32]), sigma2);
        let mut xval = [0.0f32; 32];
        let mut signs = [0u8; 4];
        for (k, s) in signs.iter_mut().enumerate() {
            for i in 8 * k..8 * k + 8 {
                if xb[i] >= 0.0 {
                    xval[i] = xb[i];
                } else {
                    xval[i] = -xb[i];
                    *s |= 1 << (i - 8 * k);
                }
            }
            if s.count_ones() % 2 == 1 {
                // Even parity: flip the element of least w·x².
                let mut imin = 8 * k;
                let mut min = weight[imin] * xb[imin] * xb[imin];
                for i in 8 * k + 1..8 * k + 8 {
                    let ax = weight[i] * xb[i] * xb[i];
                    if ax < min {
                        (min, imin) = (ax, i);
                    }
                }
                xval[imin] = -xval[imin];
                *s ^= 1 << (imin - 8 * k);
            }
            *s &= 127;
        }
        let max = xval[1..].iter().fold(xval[0], |m, &v| c_max(m, v));
        if max < 1e-8 {
            continue;
        }
        let (mut scale, idx) = fit(grid, &FIT, &xval, &weight, max);
        if scale < 0.0 {
            scale = -scale;
            signs = signs.map(|s| !s & 127);
        }
        for (q, &j) in b[2 + 8 * ib..2 + 8 * ib + 8].iter_mut().zip(&idx) {
            *q = j as u8;
        }
        let aux = signs
            .iter()
            .enumerate()
            .fold(0u32, |a, (k, &s)| a | u32::from(s) << (7 * k));
        b[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&aux.to_le_bytes());
        scales[ib] = scale;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale == 0.0 {
        b.fill(0);
        return;
    }
    let d = max_scale / 31.0;
    b[..2].copy_from_slice(&f32_to_f16(d * 1.0125));
    let id = 1.0 / d;
    for (ib, &s) in scales.iter().enumerate() {
        b[69 + 4 * ib] |= scale_code(id, s) << 4;
    }
}

/// One IQ3_S super-block (110 bytes): d, 64 low index bytes, 8 high-bit bytes, 32 sign
/// bytes, 4 scale bytes (two 4-bit codes each).
fn iq3_s(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    const FIT: Fit = Fit {
        steps: -9..=9,
        xxs: false,
    };
    let grid = s_grid();
    b.fill(0);
    let sigma2 = sigma2(x);
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    // ggml's qs / signs write positions, advanced only past a fitted sub-block.
    let mut slot = 0;
    for (ib, xb) in x.chunks_exact(32).enumerate() {
        let weight = weights(xb, qw.map(|w| &w[32 * ib..32 * ib + 32]), sigma2);
        let mut xval = [0.0f32; 32];
        let mut signs = [0u8; 4];
        for (i, (v, &x)) in xval.iter_mut().zip(xb).enumerate() {
            if x >= 0.0 {
                *v = x;
            } else {
                *v = -x;
                signs[i / 8] |= 1 << (i % 8);
            }
        }
        let max = xval[1..].iter().fold(xval[0], |m, &v| c_max(m, v));
        if max == 0.0 {
            continue;
        }
        let (mut scale, idx) = fit(grid, &FIT, &xval, &weight, max);
        if scale < 0.0 {
            scale = -scale;
            signs = signs.map(|s| !s);
        }
        for (k, &j) in idx.iter().enumerate() {
            b[2 + 8 * slot + k] = j as u8;
            b[66 + ib] |= ((j >> 8) as u8) << k;
        }
        b[74 + 4 * slot..78 + 4 * slot].copy_from_slice(&signs);
        slot += 1;
        scales[ib] = scale;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    b[..2].copy_from_slice(&f32_to_f16(d * 1.033));
    let id = 1.0 / d;
    for (p, s) in scales.chunks_exact(2).enumerate() {
        b[106 + p] = scale_code(id, s[0]) | scale_code(id, s[1]) << 4;
    }
}

/// A super-block quantizer: `x` (256), its importances, its bytes.
type Block = fn(&[f32], Option<&[f32]>, &mut [u8]);

pub(super) fn quantize(dtype: DType, src: &[f32], qw: Option<&[f32]>, dst: &mut [u8]) {
    let (block, bytes): (Block, usize) = match dtype {
        DType::IQ3XXS => (iq3_xxs, 98),
        DType::IQ3S => (iq3_s, 110),
        _ => unreachable!("{dtype} is no IQ3 format"),
    };
    for (i, (x, b)) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(bytes))
        .enumerate()
    {
        block(x, qw.map(|w| &w[QK_K * i..QK_K * (i + 1)]), b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::iq_tables::KSIGNS_IQ2XS;
    use crate::quant::iqgrid::{dequant_iq3_s, dequant_iq3_xxs};
    use crate::test_rng::Rng;

    #[test]
    fn grids_have_ggmls_lookup_tables() {
        for (grid, nwant) in [(xxs_grid(), 2), (s_grid(), 3)] {
            // ggml lists the points by ascending key, the first being all lowest levels.
            let keys: Vec<usize> = grid.points.iter().map(|&p| key(p)).collect();
            assert!(keys.windows(2).all(|k| k[0] < k[1]));
            assert_eq!(grid.points[0], [0; 4]);
            for (u, &cell) in grid.cells.iter().enumerate() {
                match cell {
                    Cell::On(j) => assert_eq!(keys[usize::from(j)], u),
                    Cell::Off { start, end } => {
                        let near = &grid.neighbours[start as usize..end as usize];
                        let dist = |&j: &u16| {
                            (0..4)
                                .map(|i| {
                                    let l = ((u >> (3 * i)) & 7) as i32;
                                    (i32::from(grid.points[usize::from(j)][i]) - l).pow(2)
                                })
                                .sum::<i32>()
                        };
                        let d: Vec<(i32, u16)> = near.iter().map(|j| (dist(j), *j)).collect();
                        assert!(d.windows(2).all(|p| p[0] < p[1]), "cell {u}: {d:?}");
                        let mut distinct: Vec<i32> = d.iter().map(|p| p.0).collect();
                        distinct.dedup();
                        assert_eq!(distinct.len(), nwant, "cell {u}");
                        // Every point at those distances is listed.
                        let listed = (0..grid.points.len() as u16)
                            .filter(|j| dist(j) <= distinct[nwant - 1])
                            .count();
                        assert_eq!(listed, near.len(), "cell {u}");
                    }
                }
            }
        }
    }

    /// A row of 2 super-blocks whose groups of 4 are grid points (each sub-block's first
    /// holding the top level) times a sub-block scale, with signs of even parity per 8.
    fn grid_row(grid: &Grid, rng: &mut Rng) -> (Vec<f32>, Vec<u16>, Vec<u8>) {
        let top: Vec<u16> = (0..grid.points.len() as u16)
            .filter(|&j| grid.points[usize::from(j)].contains(&7))
            .collect();
        let mut x = Vec::new();
        let mut idx = Vec::new();
        let mut signs = Vec::new();
        for sub in 0..16 {
            let scale = (1.5 + rng.f32()) * 10f32.powi(sub % 5 - 3);
            for k in 0..8 {
                let j = if k == 0 {
                    top[rng.next() as usize % top.len()]
                } else {
                    (rng.next() % grid.points.len() as u64) as u16
                };
                idx.push(j);
                if k % 2 == 0 {
                    signs.push(KSIGNS_IQ2XS[(rng.next() % 128) as usize]);
                }
                let s = signs[signs.len() - 1] >> (4 * (k % 2));
                for i in 0..4 {
                    let sign = if s & (1 << i) != 0 { -1.0 } else { 1.0 };
                    x.push(sign * scale * grid.value(j, i));
                }
            }
        }
        (x, idx, signs)
    }

    #[test]
    fn rows_on_the_grid_keep_their_points_and_signs() {
        let mut rng = Rng(0x1a3);
        for dtype in [DType::IQ3XXS, DType::IQ3S] {
            let grid = if dtype == DType::IQ3XXS {
                xxs_grid()
            } else {
                s_grid()
            };
            for weighted in [false, true] {
                let (x, idx, signs) = grid_row(grid, &mut rng);
                let qw: Vec<f32> = (0..x.len()).map(|_| 1.5 + rng.f32()).collect();
                let qw = weighted.then_some(&qw[..]);
                let mut b = vec![0u8; x.len() / QK_K * if dtype == DType::IQ3S { 110 } else { 98 }];
                quantize(dtype, &x, qw, &mut b);
                let mut y = [0.0f32; QK_K];
                for (ibl, blk) in b.chunks_exact(b.len() / 2).enumerate() {
                    for ib in 0..8 {
                        let s = 8 * ibl + ib;
                        for k in 0..8 {
                            let q = usize::from(blk[2 + 8 * ib + k]);
                            let got = if dtype == DType::IQ3S {
                                q | usize::from(blk[66 + ib] >> k & 1) << 8
                            } else {
                                q
                            };
                            assert_eq!(got, usize::from(idx[8 * s + k]), "{dtype} group {s}.{k}");
                        }
                        for l in 0..4 {
                            let got = if dtype == DType::IQ3S {
                                blk[74 + 4 * ib + l]
                            } else {
                                let aux = u32::from_le_bytes(
                                    blk[66 + 4 * ib..70 + 4 * ib].try_into().unwrap(),
                                );
                                KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize]
                            };
                            assert_eq!(got, signs[4 * s + l], "{dtype} signs {s}.{l}");
                        }
                    }
                    // The values keep their signs (and zeros stay out).
                    let xb = &x[QK_K * ibl..QK_K * (ibl + 1)];
                    if dtype == DType::IQ3S {
                        dequant_iq3_s(blk.try_into().unwrap(), &mut y);
                    } else {
                        dequant_iq3_xxs(blk.try_into().unwrap(), &mut y);
                    }
                    for (v, w) in xb.iter().zip(&y) {
                        assert_eq!(v.is_sign_negative(), w.is_sign_negative());
                        assert!(*w != 0.0);
                    }
                }
            }
        }
    }
}
