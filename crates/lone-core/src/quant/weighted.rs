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

use super::float::f32_to_f16;
use super::kquantize::{
    k4_levels, make_qkx2_quants, make_qx_quants, pack_q3_k_scales, pack_q4_k, pack_q5_k,
    pack_scale_min_k4, q2_k_finish, q3_k_finish, q6_k_finish, GROUP_MAX_EPS,
};
use super::kquants::{nearest_int, QK_K};
use super::{legacy, QuantError};
use crate::tensor::DType;

/// `make_qp_quants`: non-negative levels `0..=nmax` for non-negative `x` (sub-block scales),
/// weighted by `qw`; returns the scale.
pub(crate) fn make_qp_quants(x: &[f32], nmax: i32, l: &mut [u8], qw: &[f32]) -> f32 {
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

fn sum(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v;
    }
    s
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
        (scales[j], mins[j]) = make_qkx2_quants(
            xs,
            &weight,
            3,
            &mut l[16 * j..16 * j + 16],
            -0.9,
            0.05,
            36,
            false,
        );
    }
    let mut ls = [0u8; 16];
    let mut lm = [0u8; 16];
    let dm = make_qp_quants(&scales, 15, &mut ls, &sw);
    let mm = make_qp_quants(&mins, 15, &mut lm, &sw);
    y[80..82].copy_from_slice(&f32_to_f16(dm));
    y[82..84].copy_from_slice(&f32_to_f16(mm));
    for j in 0..16 {
        y[j] = ls[j] | (lm[j] << 4);
    }
    q2_k_finish(x, y, &mut l);
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
        sw[j] = sum(&weight);
        scales[j] = make_qx_quants(xs, 4, &mut l[16 * j..16 * j + 16], Some(&weight));
    }
    let mut ls = [0i8; 16];
    let d_block = make_qx_quants(&scales, 32, &mut ls, Some(&sw));
    pack_q3_k_scales(&ls.map(i32::from), y);
    y[108..110].copy_from_slice(&f32_to_f16(d_block));
    q3_k_finish(x, y, &mut l);
}

/// Q4_K (nmax 15) and Q5_K (nmax 31): weighted fits, weighted scale fits, final levels;
/// writes d, dmin and the scales into `head` (16 bytes).
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
        sw[j] = sum(&weights);
        (scales[j], mins[j]) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut l[32 * j..32 * j + 32],
            -0.9,
            0.05,
            36,
            false,
        );
    }
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    let d_block = make_qp_quants(&scales, 63, &mut ls, &sw);
    let m_block = make_qp_quants(&mins, 63, &mut lm, &sw);
    pack_scale_min_k4(
        &ls.map(|v| v.min(63)),
        &lm.map(|v| v.min(63)),
        &mut head[4..16],
    );
    head[0..2].copy_from_slice(&f32_to_f16(d_block));
    head[2..4].copy_from_slice(&f32_to_f16(m_block));
    k4_levels(x, head, nmax, &mut l);
    l
}

fn q6_k(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    for (ib, s) in scales.iter_mut().enumerate() {
        let r = 16 * ib..16 * ib + 16;
        *s = make_qx_quants(&x[r.clone()], 32, &mut l[r.clone()], Some(&qw[r]));
    }
    q6_k_finish(x, &scales, &mut l, y);
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
        DType::Q4K => blocks.for_each(|((x, w), y)| {
            let l = qkx_weighted(x, w, 15, &mut y[..16]);
            pack_q4_k(&l, &mut y[16..]);
        }),
        DType::Q5K => blocks.for_each(|((x, w), y)| {
            let l = qkx_weighted(x, w, 31, &mut y[..16]);
            pack_q5_k(&l, &mut y[16..]);
        }),
        DType::Q6K => blocks.for_each(|((x, w), y)| q6_k(x, w, y)),
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
            let sigma2 = sum_sq(src) / src.len() as f32;
            blocks.for_each(|((x, w), y)| legacy_block(dtype, x, w, sigma2, y));
        }
        d if d.is_iquant() => return super::iquantize::quantize(d, src, Some(qw), dst),
        _ => return super::reference::quantize_row(dtype, src, dst),
    }
    Ok(())
}
