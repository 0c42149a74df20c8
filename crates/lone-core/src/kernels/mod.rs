//! Compute kernels. They know nothing of models: matrices are `Tensor`s in their stored
//! format, activations are row-major f32 slices.
//!
//! Each op has one entry point here; the per-format inner loops live in `crate::quant`.
//! Work is split over the rayon thread pool (`set_threads`).

use rayon::prelude::*;

use crate::tensor::Tensor;

/// Configure the global worker pool once, before the first forward pass.
/// Returns false if the pool was already initialised (the earlier setting stays).
pub fn set_threads(n: usize) -> bool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .build_global()
        .is_ok()
}

/// Number of threads the kernels use.
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// `out[t, r] = sum_k w[r, k] * x[t, k]` for `n` activation rows `x` of length `K = w.row_len()`;
/// `out` has `n * w.n_rows()` elements. Each weight row is loaded once and used for all `n` rows.
pub fn matmul(w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    let k = w.row_len();
    let m = w.n_rows();
    debug_assert_eq!(x.len(), n * k);
    debug_assert_eq!(out.len(), n * m);
    // Chunks of output rows per task: big enough to amortise scheduling, small enough to balance.
    let chunk = (m / (threads() * 8)).clamp(1, 256);
    let dtype = w.dtype;
    let rb = w.row_bytes();
    let data = w.data();
    let mut tmp: Vec<f32> = vec![0.0; n * m];
    // tmp is laid out [m, n] so each task writes a contiguous slab.
    tmp.par_chunks_mut(chunk * n)
        .enumerate()
        .for_each(|(ci, slab)| {
            let r0 = ci * chunk;
            for (ri, dst) in slab.chunks_mut(n).enumerate() {
                let r = r0 + ri;
                let row = &data[r * rb..(r + 1) * rb];
                for (t, d) in dst.iter_mut().enumerate() {
                    *d = crate::quant::dot_row(dtype, row, &x[t * k..(t + 1) * k])
                        .expect("weight rows are whole blocks (checked at load)");
                }
            }
        });
    for r in 0..m {
        for t in 0..n {
            out[t * m + r] = tmp[r * n + t];
        }
    }
}

/// RMSNorm over each row of `x` (length `w.len()`), in place: x * rsqrt(mean(x²) + eps) * w.
pub fn rmsnorm(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_mut(d) {
        let ss: f32 = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// `a = silu(a) * b`, elementwise.
pub fn silu_mul(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = *x / (1.0 + (-*x).exp()) * y;
    }
}

/// Softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += *y;
    }
}

/// Rotary embedding tables for one rotated width `rot_dim` (even) and base `theta`,
/// in the "rotate half" (GPT-NeoX) convention transformers uses.
#[derive(Clone, Debug)]
pub struct Rope {
    pub rot_dim: usize,
    inv_freq: Vec<f32>,
}

impl Rope {
    /// `inv_freq[i] = theta^(-2i / dim_base)` for `i < rot_dim / 2`; `dim_base` is usually `rot_dim`.
    pub fn new(rot_dim: usize, dim_base: usize, theta: f64) -> Rope {
        let inv_freq = (0..rot_dim / 2)
            .map(|i| {
                let e = (2 * i) as f32 / dim_base as f32;
                (1.0 / theta.powf(e as f64)) as f32
            })
            .collect();
        Rope { rot_dim, inv_freq }
    }

    /// transformers' "proportional" RoPE: pairs (i, i + head_dim/2) over the whole head, the
    /// first `angles` frequencies `theta^(-2i/head_dim)`, the rest zero (left unrotated).
    pub fn proportional(head_dim: usize, angles: usize, theta: f64) -> Rope {
        let mut r = Rope::new(2 * angles, head_dim, theta);
        r.inv_freq.resize(head_dim / 2, 0.0);
        r.rot_dim = head_dim;
        r
    }

    /// Rotate the first `rot_dim` dims of each `head_dim`-wide head in `x` at position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.rot_dim / 2;
        let mut cs = [(0f32, 0f32); 256];
        for (i, f) in self.inv_freq.iter().enumerate() {
            let a = pos as f32 * f;
            cs[i] = (a.cos(), a.sin());
        }
        for head in x.chunks_mut(head_dim) {
            for i in 0..half {
                let (c, s) = cs[i];
                let x1 = head[i];
                let x2 = head[i + half];
                head[i] = x1 * c - x2 * s;
                head[i + half] = x2 * c + x1 * s;
            }
        }
    }
}
