//! LFM2 / LFM2.5 (transformers' modeling_lfm2): a stack of gated short-conv blocks and GQA
//! attention blocks (per-head q/k RMSNorm before RoPE), each followed by a SwiGLU FFN;
//! final norm `embedding_norm`, tied embeddings.
//!
//! ```text
//! h = x + operator(operator_norm(x))          operator = ShortConv | Attention
//! out = h + w2(silu(w1(ffn_norm(h))) * w3(ffn_norm(h)))
//! ```

use super::Layer;
use crate::cache::SeqCache;
use crate::config::{LayerKind, ModelConfig};
use crate::error::Result;
use crate::kernels::{add_inplace, Rope};
use crate::loader::Weights;
use crate::nn::{Attention, AttentionSpec, Mlp, Operator, RmsNorm, Row, ShortConv};

pub struct Lfm2Layer {
    operator_norm: RmsNorm,
    operator: Operator,
    ffn_norm: RmsNorm,
    feed_forward: Mlp,
}

impl Layer for Lfm2Layer {
    fn forward(&self, x: &mut [f32], rows: &[Row], caches: &mut [SeqCache], layer: usize) {
        let h = self.operator_norm.apply(x);
        let a = self.operator.forward(&h, rows, caches, layer);
        add_inplace(x, &a);
        let h = self.ffn_norm.apply(x);
        let m = self.feed_forward.forward(&h, rows.len());
        add_inplace(x, &m);
    }
}

pub fn layers(cfg: &ModelConfig, ws: &Weights) -> Result<Vec<Box<dyn Layer>>> {
    let d = cfg.hidden_size;
    cfg.layer_kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let p = format!("model.layers.{i}");
            let operator = match kind {
                LayerKind::Conv => Operator::Conv(Box::new(ShortConv::load(
                    ws,
                    &format!("{p}.conv"),
                    d,
                    cfg.conv_kernel,
                    cfg.conv_bias,
                )?)),
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
            Ok(Box::new(Lfm2Layer {
                operator_norm: RmsNorm::load(ws, &format!("{p}.operator_norm"), d, cfg.norm_eps)?,
                operator,
                ffn_norm: RmsNorm::load(ws, &format!("{p}.ffn_norm"), d, cfg.norm_eps)?,
                feed_forward: Mlp::load(
                    ws,
                    &format!("{p}.feed_forward"),
                    ["w1", "w3", "w2"],
                    d,
                    cfg.ffn_dim,
                )?,
            }) as Box<dyn Layer>)
        })
        .collect()
}
