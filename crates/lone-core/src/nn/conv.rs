//! LFM's gated short convolution: in_proj → (B, C, x); B⊙x → causal depthwise conv over the
//! last `kernel` positions → C⊙y → out_proj.

use super::{Linear, Row};
use crate::cache::{LayerCache, SeqCache};
use crate::error::Result;
use crate::loader::Weights;

pub struct ShortConv {
    pub in_proj: Linear,
    pub out_proj: Linear,
    /// Taps transposed to `[kernel, dim]` (HF stores `[dim, 1, kernel]`): tap `kernel-1`
    /// multiplies the current position. Row-major by tap so a position's update runs along
    /// contiguous channels.
    pub taps: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub dim: usize,
    pub kernel: usize,
}

impl ShortConv {
    pub fn load(
        ws: &Weights,
        prefix: &str,
        dim: usize,
        kernel: usize,
        bias: bool,
    ) -> Result<ShortConv> {
        let stored = ws.get_f32(&format!("{prefix}.conv.weight"), &[dim, 1, kernel])?;
        let mut taps = vec![0.0; kernel * dim];
        for (ch, row) in stored.chunks(kernel).enumerate() {
            for (t, &v) in row.iter().enumerate() {
                taps[t * dim + ch] = v;
            }
        }
        let cbias = if bias {
            Some(ws.get_f32(&format!("{prefix}.conv.bias"), &[dim])?)
        } else {
            None
        };
        Ok(ShortConv {
            in_proj: Linear::load(ws, &format!("{prefix}.in_proj"), dim, 3 * dim, bias)?,
            out_proj: Linear::load(ws, &format!("{prefix}.out_proj"), dim, dim, bias)?,
            taps,
            bias: cbias,
            dim,
            kernel,
        })
    }

    pub fn forward(
        &self,
        x: &[f32],
        rows: &[Row],
        caches: &mut [SeqCache],
        layer: usize,
    ) -> Vec<f32> {
        let n = rows.len();
        let d = self.dim;
        let bcx = self.in_proj.forward(x, n);
        let mut y = vec![0.0; n * d];
        for (i, r) in rows.iter().enumerate() {
            let row = &bcx[i * 3 * d..(i + 1) * 3 * d];
            let (b, rest) = row.split_at(d);
            let (c, xx) = rest.split_at(d);
            let LayerCache::Conv { hist, cap, .. } = &mut caches[r.seq].layers[layer] else {
                unreachable!("conv layer without a conv cache")
            };
            let cap = *cap;
            let s = (r.pos % cap) * d;
            for ((h, bb), xv) in hist[s..s + d].iter_mut().zip(b).zip(xx) {
                *h = bb * xv;
            }
            let out = &mut y[i * d..(i + 1) * d];
            match &self.bias {
                Some(b) => out.copy_from_slice(b),
                None => out.fill(0.0),
            }
            for t in 0..self.kernel {
                // Tap t looks at position pos - (kernel-1) + t.
                let back = self.kernel - 1 - t;
                if back > r.pos {
                    continue;
                }
                let p = (r.pos - back) % cap;
                let tap = &self.taps[t * d..(t + 1) * d];
                for ((o, &w), &h) in out.iter_mut().zip(tap).zip(&hist[p * d..(p + 1) * d]) {
                    *o += w * h;
                }
            }
            for (o, &cv) in out.iter_mut().zip(c) {
                *o *= cv;
            }
        }
        self.out_proj.forward(&y, n)
    }
}
