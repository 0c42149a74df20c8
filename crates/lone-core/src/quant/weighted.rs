//! Importance-weighted quantizers: ggml's `quantize_q*` with `quant_weights` (what
//! llama-quantize runs with `--imatrix`), byte-exact with ggml's C compiled without fused
//! multiply-adds.
//!
//! The importance of column j is an imatrix value (the mean of x_j² over calibration
//! activations); each element's fitting weight is `importance_j · sqrt(σ² + w_j²)` (σ² the
//! mean square of the row for the legacy formats, of the super-block — doubled for Q3_K, Q4_K
//! and Q5_K — for the K formats). Q6_K uses the importances directly. Scales of the K formats
//! are themselves fitted by weighted least squares (`make_qp_quants`) instead of scaled to
//! the largest. Q8_0 (and the float formats) ignore the weights, as ggml does.

use super::float::{f16_to_f32, f32_to_f16};
use super::kquantize::{get_scale_min_k4, make_qkx2_quants, make_qx_quants, pack_scale_min_k4};
use super::kquants::{nearest_int, QK_K};
use super::{legacy, QuantError};
use crate::tensor::DType;

const GROUP_MAX_EPS: f32 = 1e-15;

/// `make_qp_quants`: non-negative levels `0..=nmax` for non-negative `x` (sub-block scales),
/// weighted by `qw`; returns the scale.
fn make_qp_quants(x: &[f32], nmax: i32, l: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        max = max.max(v);
    }
    if max < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let li = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * li as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).min(nmax);
        l[i] = li as u8;
        let w = qw[i];
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for i in 0..n {
            let w = qw[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

fn sum_sq(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// Per-element weights `qw_j · sqrt(sigma2 + x_j²)`.
fn element_weights(x: &[f32], qw: &[f32], sigma2: f32, out: &mut [f32]) {
    for ((o, &v), &q) in out.iter_mut().zip(x).zip(qw) {
        *o = q * (sigma2 + v * v).sqrt();
    }
}

fn q2_k(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let mut sw = [0f32; 16];
    let mut weight = [0f32; 16];
    let sigma2 = sum_sq(x) / QK_K as f32;
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        element_weights(xs, &qw[16 * j..16 * j + 16], sigma2, &mut weight);
        for &w in &weight {
            sw[j] += w;
        }
        let (s, m) = make_qkx2_quants(
            xs,
            &weight,
            3,
            &mut l[16 * j..16 * j + 16],
            -0.9,
            0.05,
            36,
            false,
        );
        scales[j] = s;
        mins[j] = m;
    }
    let mut ls = [0u8; 16];
    let mut lm = [0u8; 16];
    let dm = make_qp_quants(&scales, 15, &mut ls, &sw);
    let mm = make_qp_quants(&mins, 15, &mut lm, &sw);
    let (d16, m16) = (f32_to_f16(dm), f32_to_f16(mm));
    y[80..82].copy_from_slice(&d16);
    y[82..84].copy_from_slice(&m16);
    let (dm, mm) = (f16_to_f32(d16), f16_to_f32(m16));
    for j in 0..16 {
        y[j] = ls[j] | (lm[j] << 4);
    }
    for j in 0..16 {
        let d = dm * (y[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let m = mm * (y[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + m) / d).clamp(0, 3) as u8;
        }
    }
    for (c, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            y[16 + 32 * c + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

fn q3_k(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let mut sw = [0f32; 16];
    let mut weight = [0f32; 16];
    let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        element_weights(xs, &qw[16 * j..16 * j + 16], sigma2, &mut weight);
        let mut sumw = 0.0f32;
        for &w in &weight {
            sumw += w;
        }
        sw[j] = sumw;
        scales[j] = make_qx_quants(xs, 4, &mut l[16 * j..16 * j + 16], Some(&weight));
    }
    let (hmask, rest) = y.split_at_mut(32);
    let (qs, tail) = rest.split_at_mut(64);
    let (sc, dbytes) = tail.split_at_mut(12);
    sc.fill(0);
    let mut ls = [0i8; 16];
    let d_block = make_qx_quants(&scales, 32, &mut ls, Some(&sw));
    for j in 0..16 {
        let mut v = ls[j] as i32;
        if j < 8 {
            sc[j] = (v & 0xF) as u8;
        } else {
            sc[j - 8] |= ((v & 0xF) << 4) as u8;
        }
        v >>= 4;
        sc[j % 4 + 8] |= (v << (2 * (j / 4))) as u8;
    }
    dbytes.copy_from_slice(&f32_to_f16(d_block));
    let d = f16_to_f32([dbytes[0], dbytes[1]]);
    for j in 0..16 {
        let lo = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 } as i8;
        let s = (lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) as i8) - 32;
        let dd = d * s as f32;
        if dd == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dd).clamp(-4, 3) + 4) as i8;
        }
    }
    hmask.fill(0);
    let (mut m, mut hm) = (0usize, 1u8);
    for lj in l.iter_mut() {
        if *lj > 3 {
            hmask[m] |= hm;
            *lj -= 4;
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm <<= 1;
        }
    }
    for (c, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            let q = |k: usize| l[j + i + k] as u8;
            qs[32 * c + i] = q(0) | (q(32) << 2) | (q(64) << 4) | (q(96) << 6);
        }
    }
}

/// Q4_K (nmax 15) and Q5_K (nmax 31): fits, weighted scale fits, final levels; writes d,
/// dmin and the scales into `head` (16 bytes).
fn qkx_weighted(x: &[f32], qw: &[f32], nmax: i32, head: &mut [u8]) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut sw = [0f32; 8];
    let mut weights = [0f32; 32];
    let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        element_weights(xs, &qw[32 * j..32 * j + 32], sigma2, &mut weights);
        let mut sumw = 0.0f32;
        for &w in &weights {
            sumw += w;
        }
        sw[j] = sumw;
        let (s, m) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut l[32 * j..32 * j + 32],
            -0.9,
            0.05,
            36,
            false,
        );
        scales[j] = s;
        mins[j] = m;
    }
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    let d_block = make_qp_quants(&scales, 63, &mut ls, &sw);
    let m_block = make_qp_quants(&mins, 63, &mut lm, &sw);
    for j in 0..8 {
        ls[j] = ls[j].min(63);
        lm[j] = lm[j].min(63);
    }
    pack_scale_min_k4(&ls, &lm, &mut head[4..16]);
    let (d, dmin) = (f32_to_f16(d_block), f32_to_f16(m_block));
    head[0..2].copy_from_slice(&d);
    head[2..4].copy_from_slice(&dmin);
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &head[4..16]);
        let dd = df * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = dminf * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dd).clamp(0, nmax) as u8;
        }
    }
    l
}

fn q4_k(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let l = qkx_weighted(x, qw, 15, &mut y[..16]);
    for (c, j) in (0..QK_K).step_by(64).enumerate() {
        for i in 0..32 {
            y[16 + 32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
        }
    }
}

fn q5_k(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let l = qkx_weighted(x, qw, 31, &mut y[..16]);
    let (qh, ql) = y[16..].split_at_mut(32);
    qh.fill(0);
    let (mut m1, mut m2) = (1u8, 2u8);
    for (c, n) in (0..QK_K).step_by(64).enumerate() {
        for j in 0..32 {
            let mut l1 = l[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * c + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

fn q6_k(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for (ib, sc) in scales.iter_mut().enumerate() {
        let r = 16 * ib..16 * ib + 16;
        let s = make_qx_quants(&x[r.clone()], 32, &mut l[r.clone()], Some(&qw[r]));
        *sc = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y[..210].fill(0);
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d = f32_to_f16(1.0 / iscale);
    y[208..210].copy_from_slice(&d);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        y[192 + ib] = sc[ib] as u8;
    }
    let df = f16_to_f32(d);
    for j in 0..16 {
        let dd = df * sc[j] as f32;
        if dd == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dd).clamp(-32, 31) + 32) as i8;
        }
    }
    let (ql, rest) = y.split_at_mut(128);
    let qh = &mut rest[..64];
    for (c, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            let q = |k: usize| l[j + i + k] as u8;
            ql[64 * c + i] = (q(0) & 0xF) | ((q(64) & 0xF) << 4);
            ql[64 * c + i + 32] = (q(32) & 0xF) | ((q(96) & 0xF) << 4);
            qh[32 * c + i] =
                (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
        }
    }
}

/// Legacy 32-element formats; `sigma2` is over the whole row.
fn legacy_block(dtype: DType, xb: &[f32], qw: &[f32], sigma2: f32, y: &mut [u8]) {
    let mut weight = [0f32; 32];
    element_weights(xb, qw, sigma2, &mut weight);
    match dtype {
        DType::Q4_0 | DType::Q5_0 => {
            let nmax = if dtype == DType::Q4_0 { 8 } else { 16 };
            let mut l = [0i8; 32];
            let d = make_qx_quants(xb, nmax, &mut l, Some(&weight));
            y[0..2].copy_from_slice(&f32_to_f16(d));
            let q: [u8; 32] = l.map(|v| v as u8);
            if dtype == DType::Q4_0 {
                for j in 0..16 {
                    y[2 + j] = q[j] | (q[j + 16] << 4);
                }
            } else {
                let (qh, qs) = y[2..22].split_at_mut(4);
                legacy::pack_q5(&q, qh, qs);
            }
        }
        _ => {
            let nmax = if dtype == DType::Q4_1 { 15 } else { 31 };
            let mut l = [0u8; 32];
            let (d, min) = make_qkx2_quants(xb, &weight, nmax, &mut l, -0.9, 0.05, 36, false);
            y[0..2].copy_from_slice(&f32_to_f16(d));
            y[2..4].copy_from_slice(&f32_to_f16(-min));
            if dtype == DType::Q4_1 {
                for j in 0..16 {
                    y[4 + j] = l[j] | (l[j + 16] << 4);
                }
            } else {
                let (qh, qs) = y[4..24].split_at_mut(4);
                legacy::pack_q5(&l, qh, qs);
            }
        }
    }
}

/// Quantize one row with per-column importances `qw` (as long as the row).
pub fn quantize_row_weighted(
    dtype: DType,
    src: &[f32],
    qw: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    super::reference::check_row(dtype, src.len(), dst.len())?;
    if qw.len() != src.len() {
        return Err(QuantError::ByteLen {
            dtype,
            n: src.len(),
            expected: src.len(),
            got: qw.len(),
        });
    }
    let bs = dtype.block_size();
    let bb = dtype.block_bytes();
    let blocks = src
        .chunks_exact(bs)
        .zip(qw.chunks_exact(bs))
        .zip(dst.chunks_exact_mut(bb));
    match dtype {
        DType::Q2K => blocks.for_each(|((x, w), y)| q2_k(x, w, y)),
        DType::Q3K => blocks.for_each(|((x, w), y)| q3_k(x, w, y)),
        DType::Q4K => blocks.for_each(|((x, w), y)| q4_k(x, w, y)),
        DType::Q5K => blocks.for_each(|((x, w), y)| q5_k(x, w, y)),
        DType::Q6K => blocks.for_each(|((x, w), y)| q6_k(x, w, y)),
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
            let sigma2 = sum_sq(src) / src.len() as f32;
            blocks.for_each(|((x, w), y)| legacy_block(dtype, x, w, sigma2, y));
        }
        _ => return super::reference::quantize_row(dtype, src, dst),
    }
    Ok(())
}
