//! Row-wise ops of the layers: RMSNorm, SiLU·mul, softmax, residual add, RoPE.

use super::*;

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
    assert_eq!(a.len(), b.len(), "silu_mul: lengths");
    let exp = active().vec.exp;
    let one = |a: &mut [f32], b: &[f32]| {
        let mut t = [0.0f32; 256];
        for (ac, bc) in a.chunks_mut(256).zip(b.chunks(256)) {
            let t = &mut t[..ac.len()];
            for (tv, &x) in t.iter_mut().zip(ac.iter()) {
                *tv = -x;
            }
            // SAFETY: t holds t.len() f32; the table's functions run on this CPU.
            unsafe { exp(t.as_mut_ptr(), t.len()) };
            for ((x, &e), &y) in ac.iter_mut().zip(t.iter()).zip(bc) {
                *x = *x / (1.0 + e) * y;
            }
        }
    };
    // Prefill-sized inputs (an exp per element) are split over the pool.
    chunked(a, &|ac, s| one(ac, &b[s..s + ac.len()]));
}

/// `f(chunk, start)` over `a` in chunks of 16 Ki elements, split over the pool when there are
/// at least two (an elementwise op with an exp per element).
fn chunked(a: &mut [f32], f: &(dyn Fn(&mut [f32], usize) + Sync)) {
    const CHUNK: usize = 16 * 1024;
    if a.len() < 2 * CHUNK {
        return f(a, 0);
    }
    let ap = SendPtr(a.as_mut_ptr());
    let len = a.len();
    parallel_for(len.div_ceil(CHUNK), 1, &|range| {
        let ap = &ap;
        for c in range {
            let s = c * CHUNK;
            let e = (s + CHUNK).min(len);
            // SAFETY: chunk c of `a` is written by this task alone; the borrow outlives the op.
            f(
                unsafe { std::slice::from_raw_parts_mut(ap.0.add(s), e - s) },
                s,
            );
        }
    });
}

/// torch's tanh GELU (`gelu_pytorch_tanh`) in place: `0.5·x·(1 + tanh(z))` with
/// `z = √(2/π)·(x + 0.044715·x³)`, computed as the equal `x·σ(2z) = x / (1 + e^(−2z))` with the
/// detected family's SIMD `exp` (within a few ulp of torch's tanh form), split over the pool
/// for large inputs.
pub fn gelu_tanh(x: &mut [f32]) {
    const C2: f32 = 2.0 * 0.797_884_6; // 2·√(2/π)
    let exp = active().vec.exp;
    let one = |a: &mut [f32]| {
        let mut t = [0.0f32; 256];
        for ac in a.chunks_mut(256) {
            let t = &mut t[..ac.len()];
            for (tv, &v) in t.iter_mut().zip(ac.iter()) {
                *tv = -C2 * (v + 0.044715 * v * v * v);
            }
            // SAFETY: t holds t.len() f32; the table's functions run on this CPU.
            unsafe { exp(t.as_mut_ptr(), t.len()) };
            for (v, &e) in ac.iter_mut().zip(t.iter()) {
                *v /= 1.0 + e;
            }
        }
    };
    chunked(x, &|c, _| one(c));
}

/// Softmax in place (the exponentials by the detected family's SIMD `exp`; the max and the
/// sum over 16 interleaved lanes, which the compiler vectorises — a sequential f32 sum is
/// latency-bound and dominated long attention rows).
pub fn softmax(x: &mut [f32]) {
    let (_, sum) = softmax_unnormalized(x);
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The first half of [`softmax`]: `x[i] = e^(x[i] - max)`; returns `(max, Σ x[i])` (the
/// normaliser), so that pieces of a row softmaxed apart can be combined.
pub fn softmax_unnormalized(x: &mut [f32]) -> (f32, f32) {
    let (chunks, tail) = x.as_chunks::<16>();
    let mut m = [f32::NEG_INFINITY; 16];
    for c in chunks {
        for j in 0..16 {
            m[j] = m[j].max(c[j]);
        }
    }
    let max = m
        .iter()
        .chain(tail)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    x.iter_mut().for_each(|v| *v -= max);
    // SAFETY: x holds x.len() f32; the table's functions run on this CPU.
    unsafe { (active().vec.exp)(x.as_mut_ptr(), x.len()) };
    let (chunks, tail) = x.as_chunks::<16>();
    let mut acc = [0f32; 16];
    for c in chunks {
        for j in 0..16 {
            acc[j] += c[j];
        }
    }
    (max, acc.iter().chain(tail).sum())
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
    pub(super) inv_freq: Vec<f32>,
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

    /// Rotate the first `rot_dim` dims of each `head_dim`-wide head of `q` and `k` at `pos`.
    pub fn apply(&self, q: &mut [f32], k: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.rot_dim / 2;
        // One cos/sin table per position, shared by the query and key heads.
        let mut cs = [(0f32, 0f32); 256];
        for (i, f) in self.inv_freq.iter().enumerate() {
            let a = pos as f32 * f;
            cs[i] = (a.cos(), a.sin());
        }
        for head in q.chunks_mut(head_dim).chain(k.chunks_mut(head_dim)) {
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
