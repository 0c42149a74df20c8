//! The feed-forward block of a layer: a dense SwiGLU, or a sparse mixture of SwiGLU experts
//! (LFM2-MoE, transformers' `Lfm2MoeSparseMoeBlock`):
//!
//! ```text
//! s = sigmoid(router(x))                                   one score per expert
//! chosen = top_k(s + expert_bias)                          the bias only selects
//! w_e = s_e / (Σ_chosen s + 1e-6) · routed_scaling_factor  (normalised when norm_topk_prob)
//! out = Σ_{e ∈ chosen, ascending} w_e · expert_e(x)
//! ```
//!
//! A step's rows are grouped by expert, so each chosen expert's weights are read once for
//! every row that chose it; each row sums its experts in ascending order, so its result does
//! not depend on which other rows share the step.

use super::{Linear, Mlp};
use crate::config::MoeConfig;
use crate::error::{Error, Result};
use crate::loader::Weights;
use crate::tensor::Tensor;

/// A layer's FFN.
pub enum Ffn {
    Dense(Box<Mlp>),
    Moe(Box<Moe>),
}

impl Ffn {
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        match self {
            Ffn::Dense(m) => m.forward(x, n),
            Ffn::Moe(m) => m.forward(x, n),
        }
    }

    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Ffn::Dense(m) => m.linears_mut(),
            Ffn::Moe(m) => m.linears_mut(),
        }
    }
}

/// A sparse mixture of SwiGLU experts behind a sigmoid router.
pub struct Moe {
    pub router: Linear,
    /// Added to the scores to choose the experts (not to weigh them).
    pub expert_bias: Option<Vec<f32>>,
    pub experts: Vec<Mlp>,
    pub n_used: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
}

/// One expert's rows `[first, first + n)` of a stacked tensor.
fn expert_rows(t: &Tensor, first: usize, n: usize, name: &str) -> Result<Linear> {
    let v = t.rows_view(first, n).ok_or_else(|| {
        Error::Config(format!(
            "{name}: rows {first}..{} are outside the tensor",
            first + n
        ))
    })?;
    Ok(Linear::from_tensor(v))
}

impl Moe {
    /// The MoE block under `prefix` (`model.layers.N.feed_forward`), its experts in any of
    /// the layouts files have: one tensor per expert and matrix (`experts.J.w1.weight`, the
    /// Hub's), transformers 5.x's fused `experts.gate_up_proj` `[E, 2I, H]` (the gate rows,
    /// then the up rows) and `experts.down_proj` `[E, H, I]`, or a GGUF's stacked
    /// `ffn_{gate,up,down}_exps` — stacked tensors seen one expert at a time, with no copy.
    pub fn load(ws: &Weights, prefix: &str, cfg: &MoeConfig, dim: usize) -> Result<Moe> {
        let (e, ffn) = (cfg.n_experts, cfg.expert_ffn_dim);
        let router = Linear::load(ws, &format!("{prefix}.gate"), dim, e, false)?;
        let expert_bias = if cfg.expert_bias {
            Some(ws.get_f32(&format!("{prefix}.expert_bias"), &[e])?)
        } else {
            None
        };
        let fused = format!("{prefix}.experts.gate_up_proj");
        let stacked = format!("{prefix}.experts.w1.weight");
        let mut experts = if ws.get_opt(&fused)?.is_some() {
            let gu = ws.get(&fused, &[e, 2 * ffn, dim])?;
            let down_name = format!("{prefix}.experts.down_proj");
            let down = ws.get(&down_name, &[e, dim, ffn])?;
            (0..e)
                .map(|j| {
                    Ok(Mlp {
                        gate: expert_rows(&gu, 2 * ffn * j, ffn, &fused)?,
                        up: expert_rows(&gu, 2 * ffn * j + ffn, ffn, &fused)?,
                        down: expert_rows(&down, dim * j, dim, &down_name)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        } else if ws.get_opt(&stacked)?.is_some() {
            let get = |w: &str, rows: usize, cols: usize| {
                let name = format!("{prefix}.experts.{w}.weight");
                ws.get(&name, &[e, rows, cols]).map(|t| (t, name))
            };
            let (g, gn) = get("w1", ffn, dim)?;
            let (u, un) = get("w3", ffn, dim)?;
            let (d, dn) = get("w2", dim, ffn)?;
            (0..e)
                .map(|j| {
                    Ok(Mlp {
                        gate: expert_rows(&g, ffn * j, ffn, &gn)?,
                        up: expert_rows(&u, ffn * j, ffn, &un)?,
                        down: expert_rows(&d, dim * j, dim, &dn)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            (0..e)
                .map(|j| {
                    Mlp::load(
                        ws,
                        &format!("{prefix}.experts.{j}"),
                        ["w1", "w3", "w2"],
                        dim,
                        ffn,
                    )
                })
                .collect::<Result<Vec<_>>>()?
        };
        // Statistics (`lone imatrix`) by the GGUF stack's name and the expert's index, as
        // llama-imatrix keeps them, whatever the layout.
        let stack =
            |w: &str| crate::loader::hf_to_gguf_name(&format!("{prefix}.experts.{w}.weight"));
        for (j, m) in experts.iter_mut().enumerate() {
            for (l, w) in [(&mut m.gate, "w1"), (&mut m.up, "w3"), (&mut m.down, "w2")] {
                l.name = stack(w);
                l.expert = Some((j, e));
            }
        }
        Ok(Moe {
            router,
            expert_bias,
            experts,
            n_used: cfg.n_used,
            norm_topk_prob: cfg.norm_topk_prob,
            routed_scaling_factor: cfg.routed_scaling_factor,
        })
    }

    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = vec![&mut self.router];
        for m in &mut self.experts {
            v.extend(m.linears_mut());
        }
        v
    }

    /// The experts one row chose and their weights, from its router logits, in ascending
    /// expert order.
    pub fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
        let key = |e: usize| {
            let k = match &self.expert_bias {
                Some(b) => scores[e] + b[e],
                None => scores[e],
            };
            if k.is_nan() {
                f32::NEG_INFINITY
            } else {
                k
            }
        };
        // The top n_used keys, highest first; equal keys by lower index (torch.topk's
        // order is unspecified there). NaN never ranks above a number.
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        let mut chosen: Vec<(usize, f32)> = order[..self.n_used.min(order.len())]
            .iter()
            .map(|&e| (e, scores[e]))
            .collect();
        if self.norm_topk_prob {
            let sum: f32 = chosen.iter().map(|c| c.1).sum::<f32>() + 1e-6;
            for c in &mut chosen {
                c.1 /= sum;
            }
        }
        for c in &mut chosen {
            c.1 *= self.routed_scaling_factor;
        }
        chosen.sort_by_key(|c| c.0);
        chosen
    }

    /// `n` rows of `hidden` → `n` rows of `hidden`.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let d = self.router.in_dim;
        let logits = self.router.forward(x, n);
        let n_experts = self.experts.len();
        // Each expert's rows and their weights, in row order.
        let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_experts];
        for r in 0..n {
            for (e, w) in self.route(&logits[r * n_experts..(r + 1) * n_experts]) {
                by_expert[e].push((r, w));
            }
        }
        let mut out = vec![0f32; n * d];
        let mut xe = Vec::new();
        for (expert, rows) in self.experts.iter().zip(&by_expert) {
            if rows.is_empty() {
                continue;
            }
            xe.clear();
            for &(r, _) in rows {
                xe.extend_from_slice(&x[r * d..(r + 1) * d]);
            }
            let y = expert.forward(&xe, rows.len());
            for (&(r, w), yr) in rows.iter().zip(y.chunks_exact(d)) {
                for (o, &v) in out[r * d..(r + 1) * d].iter_mut().zip(yr) {
                    *o += v * w;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn moe(bias: Option<Vec<f32>>, n_used: usize, norm: bool, scale: f32) -> Moe {
        Moe {
            router: Linear::from_tensor(Tensor::from_f32(vec![4, 1], &[0.0; 4])),
            expert_bias: bias,
            experts: Vec::new(),
            n_used,
            norm_topk_prob: norm,
            routed_scaling_factor: scale,
        }
    }

    /// transformers' routing on hand-made logits: the bias picks (expert 1's high score loses
    /// to its bias), the unbiased scores weigh, normalised with its `+ 1e-6` and scaled; a NaN
    /// score is never chosen; the result comes in ascending expert order.
    #[test]
    fn routing_is_transformers_rule() {
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let logits = [0.0, 2.0, f32::NAN, 1.0];
        let m = moe(Some(vec![0.0, -3.0, 0.0, 0.0]), 2, true, 1.7);
        let got = m.route(&logits);
        let (s0, s3) = (sig(0.0), sig(1.0));
        let sum = s0 + s3 + 1e-6;
        assert_eq!(got, vec![(0, s0 / sum * 1.7), (3, s3 / sum * 1.7)]);
        // Without the bias expert 1 wins; without normalisation the scores stay as they are.
        let got = moe(None, 2, false, 1.0).route(&logits);
        assert_eq!(got, vec![(1, sig(2.0)), (3, s3)]);
    }
}
