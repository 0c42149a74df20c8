//! LFM2 / LFM2.5 (transformers' modeling_lfm2) and LFM2-MoE (modeling_lfm2_moe): a stack of
//! gated short-conv blocks and GQA attention blocks (per-head q/k RMSNorm before RoPE), each
//! followed by a SwiGLU FFN — in LFM2-MoE, from layer `num_dense_layers` on, a sparse mixture
//! of SwiGLU experts ([`crate::nn::Moe`]); final norm `embedding_norm`, tied embeddings.
//!
//! ```text
//! h = x + operator(operator_norm(x))          operator = ShortConv | Attention
//! out = h + ffn(ffn_norm(h))                  ffn = w2(silu(w1 ·) * w3 ·) | Moe
//! ```

use super::Layer;
use crate::cache::SeqCache;
use crate::config::{FfnKind, LayerKind, ModelConfig};
use crate::error::Result;
use crate::kernels::{add_inplace, Pass, Rope};
use crate::loader::Weights;
use crate::nn::{
    Attention, AttentionSpec, Ffn, Linear, Mlp, Moe, Operator, RmsNorm, Row, ShortConv,
};

/// One LFM decoder layer: a sequence-mixing operator and an FFN (dense or experts), each
/// pre-normed and added to the residual stream; LFM3 also norms each output ("sandwich"
/// norms).
pub struct HybridLayer {
    operator_norm: RmsNorm,
    operator: Operator,
    post_operator_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    feed_forward: Ffn,
    post_ffn_norm: Option<RmsNorm>,
}

impl HybridLayer {
    /// The norms and FFN of layer `layer` around `operator`; `sandwich` loads the post norms.
    pub fn load(
        ws: &Weights,
        cfg: &ModelConfig,
        layer: usize,
        operator: Operator,
        sandwich: bool,
    ) -> Result<HybridLayer> {
        let p = &format!("model.layers.{layer}");
        let (d, eps) = (cfg.hidden_size, cfg.norm_eps);
        let ffn_prefix = format!("{p}.feed_forward");
        let feed_forward = match (cfg.ffn_kind(layer), cfg.moe()) {
            (FfnKind::Moe, Some(moe)) => Ffn::Moe(Box::new(Moe::load(ws, &ffn_prefix, moe, d)?)),
            _ => Ffn::Dense(Box::new(Mlp::load(
                ws,
                &ffn_prefix,
                ["w1", "w3", "w2"],
                d,
                cfg.ffn_dim,
            )?)),
        };
        let norm = |name: &str| RmsNorm::load(ws, &format!("{p}.{name}"), d, eps);
        Ok(HybridLayer {
            operator_norm: norm("operator_norm")?,
            operator,
            post_operator_norm: if sandwich {
                Some(norm("post_operator_norm")?)
            } else {
                None
            },
            ffn_norm: norm("ffn_norm")?,
            feed_forward,
            post_ffn_norm: if sandwich {
                Some(norm("post_ffn_norm")?)
            } else {
                None
            },
        })
    }
}

impl Layer for HybridLayer {
    fn forward(
        &self,
        x: &mut [f32],
        rows: &[Row],
        pass: &Pass,
        caches: &mut [SeqCache],
        layer: usize,
    ) {
        let h = self.operator_norm.apply(x);
        let mut a = self.operator.forward(&h, rows, pass, caches, layer);
        if let Some(n) = &self.post_operator_norm {
            n.forward(&mut a);
        }
        add_inplace(x, &a);
        let h = self.ffn_norm.apply(x);
        let mut m = self.feed_forward.forward(&h, rows.len());
        if let Some(n) = &self.post_ffn_norm {
            n.forward(&mut m);
        }
        add_inplace(x, &m);
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = self.operator.linears_mut();
        v.extend(self.feed_forward.linears_mut());
        v
    }
}

/// The gated short convolution of layer `p`.
pub fn conv_operator(ws: &Weights, cfg: &ModelConfig, p: &str) -> Result<Operator> {
    let conv = ShortConv::load(
        ws,
        &format!("{p}.conv"),
        cfg.hidden_size,
        cfg.conv_kernel,
        cfg.conv_bias,
    )?;
    Ok(Operator::Conv(Box::new(conv)))
}

pub fn layers(cfg: &ModelConfig, ws: &Weights) -> Result<Vec<Box<dyn Layer>>> {
    let d = cfg.hidden_size;
    cfg.layer_kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let p = format!("model.layers.{i}");
            let operator = match kind {
                LayerKind::Conv => conv_operator(ws, cfg, &p)?,
                _ => Operator::Attention(Box::new(Attention::load(
                    ws,
                    &AttentionSpec {
                        prefix: &format!("{p}.self_attn"),
                        hidden: d,
                        n_heads: cfg.n_heads,
                        n_kv_heads: cfg.n_kv_heads,
                        head_dim: cfg.head_dim,
                        bias: false,
                        out_name: "out_proj",
                        qk_norm: Some(("q_layernorm", "k_layernorm")),
                        norm_eps: cfg.norm_eps,
                        rope: Rope::new(cfg.head_dim, cfg.head_dim, cfg.rope.theta),
                        window: None,
                        gate: None,
                    },
                )?)),
            };
            Ok(Box::new(HybridLayer::load(ws, cfg, i, operator, false)?) as Box<dyn Layer>)
        })
        .collect()
}
