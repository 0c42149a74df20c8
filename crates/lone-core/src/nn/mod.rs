//! Building blocks shared by the model families: linear layers, norms, embeddings, attention,
//! the gated short convolution, the SwiGLU feed-forward, the mixture of experts and the LM head.

mod attention;
mod conv;
mod head;
mod moe;

pub use attention::{Attention, AttentionSpec};
pub use conv::ShortConv;
pub use head::Head;
pub use moe::{Ffn, Moe};

use crate::error::Result;
use crate::kernels;
use crate::loader::Weights;
use crate::tensor::Tensor;

/// A position of one sequence in a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Index into the caches slice given to `forward`.
    pub seq: usize,
    pub pos: usize,
}

/// `y = x Wᵀ (+ b)` with W in its stored format.
pub struct Linear {
    pub w: Tensor,
    pub b: Option<Vec<f32>>,
    pub in_dim: usize,
    pub out_dim: usize,
    /// The weight's GGUF name (`blk.0.attn_q.weight`), under which [`activations`] records
    /// its inputs.
    pub name: Option<String>,
    /// One expert of a stacked tensor (`name` is the stack's): its index and the number of
    /// experts, for [`activations`]' per-expert statistics.
    pub expert: Option<(usize, usize)>,
}

/// The sums of squares of every [`Linear`]'s input columns, by weight name, while recording:
/// the statistics of an importance matrix (`lone imatrix`, llama-imatrix's `in_sum2` and
/// `counts`). As llama-imatrix, passes of fewer than [`activations::MIN_ROWS`] rows are left
/// out. Recording is process-wide and off unless started; off, it costs one atomic load per
/// linear layer.
pub mod activations {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    pub const MIN_ROWS: usize = 16;

    /// Σx² per input column and the number of rows seen, per matrix: one for a plain
    /// weight, one per expert (the sums expert by expert) for a stack of experts.
    pub type Stats = BTreeMap<String, (Vec<f32>, Vec<u64>)>;

    static ON: AtomicBool = AtomicBool::new(false);
    static STATS: Mutex<Stats> = Mutex::new(BTreeMap::new());

    pub fn start() {
        STATS.lock().unwrap_or_else(|e| e.into_inner()).clear();
        ON.store(true, Ordering::SeqCst);
    }

    /// Stop recording; what was recorded.
    pub fn stop() -> Stats {
        ON.store(false, Ordering::SeqCst);
        std::mem::take(&mut *STATS.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn record(name: &str, x: &[f32], n: usize, dim: usize) {
        if n >= MIN_ROWS {
            add(name, 0, 1, x, n, dim);
        }
    }

    /// Expert `j` of `n_experts` in the stack `name` saw rows `x`: recorded whatever their
    /// number, as llama-imatrix records every expert product (`MUL_MAT_ID`).
    pub(crate) fn record_expert(
        name: &str,
        j: usize,
        n_experts: usize,
        x: &[f32],
        n: usize,
        dim: usize,
    ) {
        add(name, j, n_experts, x, n, dim);
    }

    fn add(name: &str, j: usize, n_mat: usize, x: &[f32], n: usize, dim: usize) {
        if !ON.load(Ordering::Relaxed) || n == 0 || dim == 0 || j >= n_mat {
            return;
        }
        let mut stats = STATS.lock().unwrap_or_else(|e| e.into_inner());
        let e = stats
            .entry(name.to_string())
            .or_insert_with(|| (vec![0.0; dim * n_mat], vec![0; n_mat]));
        if e.0.len() != dim * n_mat || e.1.len() != n_mat {
            return;
        }
        let sums = &mut e.0[j * dim..(j + 1) * dim];
        for row in x.chunks_exact(dim).take(n) {
            for (a, &v) in sums.iter_mut().zip(row) {
                *a += v * v;
            }
        }
        e.1[j] += n as u64;
    }
}

impl Linear {
    pub fn load(
        ws: &Weights,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Result<Linear> {
        let w = ws.get(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let b = if bias {
            Some(ws.get_f32(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            None
        };
        Ok(Linear {
            w,
            b,
            in_dim,
            out_dim,
            name: crate::loader::hf_to_gguf_name(&format!("{prefix}.weight")),
            expert: None,
        })
    }

    pub fn from_tensor(w: Tensor) -> Linear {
        let (out_dim, in_dim) = (w.n_rows(), w.row_len());
        Linear {
            w,
            b: None,
            in_dim,
            out_dim,
            name: None,
            expert: None,
        }
    }

    fn record(&self, x: &[f32], n: usize) {
        match (&self.name, self.expert) {
            (Some(name), Some((j, e))) => activations::record_expert(name, j, e, x, n, self.in_dim),
            (Some(name), None) => activations::record(name, x, n, self.in_dim),
            _ => {}
        }
    }

    /// `n` rows of `in_dim` → `n` rows of `out_dim`.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        self.record(x, n);
        let mut y = vec![0.0; n * self.out_dim];
        kernels::matmul(&self.w, x, n, &mut y);
        self.add_bias(&mut y);
        y
    }

    /// [`Linear::forward`] of several layers on the same input (q/k/v, gate/up): one
    /// [`kernels::matmul_many`], so a prefill packs the activations once for all of them.
    pub fn forward_many<const N: usize>(ls: [&Linear; N], x: &[f32], n: usize) -> [Vec<f32>; N] {
        for l in ls {
            l.record(x, n);
        }
        let mut ys: [Vec<f32>; N] = ls.map(|l| vec![0.0; n * l.out_dim]);
        let ws: [&Tensor; N] = ls.map(|l| &l.w);
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        kernels::matmul_many(&ws, x, n, &mut outs);
        for (l, y) in ls.iter().zip(ys.iter_mut()) {
            l.add_bias(y);
        }
        ys
    }

    fn add_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.b {
            for row in y.chunks_mut(self.out_dim) {
                kernels::add_inplace(row, b);
            }
        }
    }
}

pub struct RmsNorm {
    pub w: Vec<f32>,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(ws: &Weights, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            w: ws.get_f32(&format!("{name}.weight"), &[dim])?,
            eps,
        })
    }
    /// Normalise each `w.len()`-wide row of `x` in place.
    pub fn forward(&self, x: &mut [f32]) {
        kernels::rmsnorm(x, &self.w, self.eps);
    }
    /// A normalised copy.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        self.forward(&mut y);
        y
    }
}

pub struct Embedding {
    pub t: Tensor,
    pub dim: usize,
}

impl Embedding {
    pub fn load(ws: &Weights, name: &str, vocab: usize, dim: usize) -> Result<Embedding> {
        Ok(Embedding {
            t: ws.get(name, &[vocab, dim])?,
            dim,
        })
    }
    /// Rows for `ids` (ids already checked against the vocabulary size).
    pub fn forward(&self, ids: &[u32]) -> Vec<f32> {
        let mut out = vec![0.0; ids.len() * self.dim];
        for (dst, &id) in out.chunks_mut(self.dim).zip(ids) {
            self.t.row_to_f32(id as usize, dst);
        }
        out
    }
}

/// The sequence-mixing operator of a hybrid (LFM) layer.
pub enum Operator {
    Conv(Box<ShortConv>),
    Attention(Box<Attention>),
}

impl Operator {
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Operator::Conv(c) => vec![&mut c.in_proj, &mut c.out_proj],
            Operator::Attention(a) => a.linears_mut(),
        }
    }

    pub fn forward(
        &self,
        x: &[f32],
        rows: &[Row],
        pass: &kernels::Pass,
        caches: &mut [crate::cache::SeqCache],
        layer: usize,
    ) -> Vec<f32> {
        match self {
            Operator::Conv(c) => c.forward(x, rows, caches, layer),
            Operator::Attention(a) => a.forward(x, rows, pass, caches, layer),
        }
    }
}

/// SwiGLU feed-forward: `down(silu(gate x) * up x)`.
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        vec![&mut self.gate, &mut self.up, &mut self.down]
    }

    /// `names` = (gate, up, down) module names under `prefix`.
    pub fn load(
        ws: &Weights,
        prefix: &str,
        names: [&str; 3],
        dim: usize,
        ffn: usize,
    ) -> Result<Mlp> {
        Ok(Mlp {
            gate: Linear::load(ws, &format!("{prefix}.{}", names[0]), dim, ffn, false)?,
            up: Linear::load(ws, &format!("{prefix}.{}", names[1]), dim, ffn, false)?,
            down: Linear::load(ws, &format!("{prefix}.{}", names[2]), ffn, dim, false)?,
        })
    }
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let [mut g, u] = Linear::forward_many([&self.gate, &self.up], x, n);
        kernels::silu_mul(&mut g, &u);
        self.down.forward(&g, n)
    }
}
