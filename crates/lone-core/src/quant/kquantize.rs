//! Quantizers for the K super-block weight formats, byte-exact with ggml's reference
//! quantizers without an importance matrix (`quantize_row_q{2..6}_K_ref`, which is what
//! llama-quantize runs when it has no imatrix).
//!
//! The methods, per 256-element super-block:
//! - Q2_K / Q4_K / Q5_K (scale and min per sub-block of 16 / 32 / 32): a weighted least-squares
//!   search over candidate scales (`make_qkx2_quants`), then the sub-block scales and mins are
//!   themselves quantized to 4 (Q2_K) or 6 bits against the largest, and the values re-rounded
//!   with the stored scales.
//! - Q3_K: symmetric 3-bit with a coordinate-descent refinement (`make_q3_quants`), 6-bit
//!   signed sub-block scales.
//! - Q6_K: symmetric 6-bit, the best of 19 trial scales per sub-block of 16 (`make_qx_quants`),
//!   8-bit signed sub-block scales.
//!
//! Arithmetic is f32 in ggml's order and without fused multiply-adds, as ggml's reference
//! compiled with `-ffp-contract=off`.

use super::float::{f16_to_f32, f32_to_f16};
use super::kquants::{nearest_int, QK_K};

pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The element of largest magnitude (the first of equals), or None when the group is all
/// (nearly) zero.
fn signed_max(x: &[f32]) -> Option<f32> {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax >= GROUP_MAX_EPS).then_some(max)
}

/// `make_qx_quants` (rmse_type 1): symmetric levels in `[-nmax, nmax)`, stored offset by
/// `nmax`, fitted with weights `qw` (x² without); returns the scale.
pub(crate) fn make_qx_quants(x: &[f32], nmax: i32, l_out: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let Some(max) = signed_max(x) else {
        l_out.fill(0);
        return 0.0;
    };
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    let weight = |i: usize, v: f32| qw.map_or(v * v, |q| q[i]);
    for (i, (o, &v)) in l_out.iter_mut().zip(x).enumerate() {
        let l = clamp(nearest_int(iscale * v));
        *o = (l + nmax) as i8;
        let w = weight(i, v);
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &v) in x.iter().enumerate() {
            let l = clamp(nearest_int(iscale * v));
            let w = weight(i, v);
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l_out.iter_mut().zip(x) {
                *o = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(.., do_rmse = true)`: levels in `[-nmax, nmax)` (stored offset by nmax),
/// refined one element at a time while that lowers the x²-weighted error.
fn make_q3_quants(x: &[f32], nmax: i32, l_out: &mut [i8]) -> f32 {
    let Some(max) = signed_max(x) else {
        l_out.fill(0);
        return 0.0;
    };
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    let mut l = [0i32; 16];
    for (i, &v) in x.iter().enumerate() {
        l[i] = clamp(nearest_int(iscale * v));
        let w = v * v;
        sumlx += w * v * l[i] as f32;
        suml2 += w * l[i] as f32 * l[i] as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * l[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * l[i] as f32 * l[i] as f32;
                let new_l = clamp(nearest_int(v * sl2 / slx));
                if new_l != l[i] {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
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
    for (o, &li) in l_out.iter_mut().zip(&l) {
        *o = (li + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `make_qkx2_quants`: levels `0..=nmax` with a scale and a (non-positive) min, the best of a
/// weighted least-squares fit at `nstep + 1` trial scales. Returns (scale, -min).
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins.
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], out: &mut [u8]) {
    out[..12].fill(0);
    for j in 0..8 {
        if j < 4 {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            out[j - 4] |= (ls[j] >> 4) << 6;
            out[j] |= (lm[j] >> 4) << 6;
        }
    }
}

// ------------------------------------------------------------------ shared tails
// What every Q2_K..Q6_K quantizer does once its (sub-block) scales are chosen, with or
// without an imatrix: re-round the values with the stored scales and pack the levels.

/// Q4_K/Q5_K: the levels `0..=nmax` of `x` under the d, dmin and scales already in `head`
/// (16 bytes); sub-blocks whose scale is 0 keep the fit's levels in `l`.
pub(crate) fn k4_levels(x: &[f32], head: &[u8], nmax: i32, l: &mut [u8; QK_K]) {
    let df = f16_to_f32([head[0], head[1]]);
    let dminf = f16_to_f32([head[2], head[3]]);
    for j in 0..8 {
        let (sc, m) = super::kquants::scale_min_k4(j, &head[4..16]);
        let dd = df * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = dminf * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dd).clamp(0, nmax) as u8;
        }
    }
}

/// Q4_K's 128 bytes of nibbles.
pub(crate) fn pack_q4_k(l: &[u8; QK_K], q: &mut [u8]) {
    for (c, j) in (0..QK_K).step_by(64).enumerate() {
        for i in 0..32 {
            q[32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
        }
    }
}

/// Q5_K's 32 bytes of high bits then 128 bytes of nibbles.
pub(crate) fn pack_q5_k(l: &[u8; QK_K], out: &mut [u8]) {
    let (qh, ql) = out.split_at_mut(32);
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

/// Q2_K after its scale bytes (0..16), d (80) and dmin (82) are set: the 2-bit levels and
/// their packing into bytes 16..80.
pub(crate) fn q2_k_finish(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K]) {
    let d = f16_to_f32([b[80], b[81]]);
    let dmin = f16_to_f32([b[82], b[83]]);
    for j in 0..16 {
        let dd = d * (b[j] & 0xF) as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = dmin * (b[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / dd).clamp(0, 3) as u8;
        }
    }
    for (c, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            b[16 + 32 * c + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// Q3_K's 12 scale bytes (96..108) from 16 six-bit values `0..=63`.
pub(crate) fn pack_q3_k_scales(vals: &[i32; 16], b: &mut [u8]) {
    let sc = &mut b[96..108];
    sc.fill(0);
    for (j, &v) in vals.iter().enumerate() {
        if j < 8 {
            sc[j] = (v & 0xF) as u8;
        } else {
            sc[j - 8] |= ((v & 0xF) << 4) as u8;
        }
        sc[j % 4 + 8] |= ((v >> 4) << (2 * (j / 4))) as u8;
    }
}

/// Q3_K after its scales (96..108) and d (108) are set: the levels, the high-bit mask
/// (0..32) and the low bits (32..96).
pub(crate) fn q3_k_finish(x: &[f32], b: &mut [u8], l: &mut [i8; QK_K]) {
    let d = f16_to_f32([b[108], b[109]]);
    let (hmask, rest) = b.split_at_mut(32);
    let (qs, sc) = rest.split_at_mut(64);
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

/// Q6_K from its 16 sub-block scales: the 8-bit scales against the largest, d, the levels
/// and their packing. An all-zero block is all zero bytes.
pub(crate) fn q6_k_finish(x: &[f32], scales: &[f32; 16], l: &mut [i8; QK_K], b: &mut [u8]) {
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for &s in scales {
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        b[..210].fill(0);
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d = f32_to_f16(1.0 / iscale);
    b[208..210].copy_from_slice(&d);
    let mut sc = [0i8; 16];
    for (ib, s) in sc.iter_mut().enumerate() {
        *s = nearest_int(iscale * scales[ib]).min(127) as i8;
        b[192 + ib] = *s as u8;
    }
    let df = f16_to_f32(d);
    for (j, &s) in sc.iter().enumerate() {
        let dd = df * s as f32;
        if dd == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dd).clamp(-32, 31) + 32) as i8;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
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

// ------------------------------------------------------------------ reference quantizers

/// The sub-block fits of Q4_K (nmax 15) and Q5_K (nmax 31), their 6-bit scales and mins,
/// and the final levels; writes d, dmin and the scales, returns the levels.
fn qkx_super_block(
    x: &[f32; QK_K],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    head: &mut [u8],
) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    let mut weights = [0f32; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    head[0..2].copy_from_slice(&f32_to_f16(max_scale / 63.0));
    head[2..4].copy_from_slice(&f32_to_f16(max_min / 63.0));
    pack_scale_min_k4(&ls, &lm, &mut head[4..16]);
    k4_levels(x, head, nmax, &mut l);
    l
}

/// `quantize_row_q4_K_ref` for one super-block.
pub(crate) fn quant_q4_k(x: &[f32; QK_K], b: &mut [u8; 144]) {
    let l = qkx_super_block(x, 15, -1.0, 20, &mut b[..16]);
    pack_q4_k(&l, &mut b[16..]);
}

/// `quantize_row_q5_K_ref` for one super-block.
pub(crate) fn quant_q5_k(x: &[f32; QK_K], b: &mut [u8; 176]) {
    let l = qkx_super_block(x, 31, -0.5, 15, &mut b[..16]);
    pack_q5_k(&l, &mut b[16..]);
}

/// `quantize_row_q2_K_ref` for one super-block.
pub(crate) fn quant_q2_k(x: &[f32; QK_K], b: &mut [u8; 84]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let mut weights = [0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (s, m) = make_qkx2_quants(
            xs,
            &weights,
            3,
            &mut l[16 * j..16 * j + 16],
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let q4scale = 15.0f32;
    if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]) as u8;
        }
        b[80..82].copy_from_slice(&f32_to_f16(max_scale / q4scale));
    } else {
        b[..16].fill(0);
        b[80..82].copy_from_slice(&f32_to_f16(0.0));
    }
    if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        b[82..84].copy_from_slice(&f32_to_f16(max_min / q4scale));
    } else {
        b[82..84].copy_from_slice(&f32_to_f16(0.0));
    }
    q2_k_finish(x, b, &mut l);
}

/// `quantize_row_q3_K_ref` for one super-block.
pub(crate) fn quant_q3_k(x: &[f32; QK_K], b: &mut [u8; 110]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    for j in 0..16 {
        scales[j] = make_q3_quants(&x[16 * j..16 * j + 16], 4, &mut l[16 * j..16 * j + 16]);
        let s = scales[j].abs();
        if s > amax {
            amax = s;
            max_scale = scales[j];
        }
    }
    if max_scale != 0.0 {
        let iscale = -32.0f32 / max_scale;
        let vals: [i32; 16] = std::array::from_fn(|j| {
            i32::from((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32)
        });
        pack_q3_k_scales(&vals, b);
        b[108..110].copy_from_slice(&f32_to_f16(1.0 / iscale));
    } else {
        b[96..108].fill(0);
        b[108..110].copy_from_slice(&f32_to_f16(0.0));
    }
    q3_k_finish(x, b, &mut l);
}

/// `quantize_row_q6_K_ref` for one super-block.
pub(crate) fn quant_q6_k(x: &[f32; QK_K], b: &mut [u8; 210]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    for (ib, s) in scales.iter_mut().enumerate() {
        let r = 16 * ib..16 * ib + 16;
        *s = make_qx_quants(&x[r.clone()], 32, &mut l[r], None);
    }
    q6_k_finish(x, &scales, &mut l, b);
}
