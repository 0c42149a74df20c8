//! LFM3 (transformers' modeling_lfm3): LFM2's conv/attention stack plus sliding-window
//! attention layers, per-layer-type RoPE (sliding: default RoPE; full: proportional RoPE
//! over part of head_dim), a per-head sigmoid output gate (`g_proj`) and "sandwich" norms
//! on the operator and FFN outputs.
//!
//! ```text
//! h = x + post_operator_norm(operator(operator_norm(x)))   operator = ShortConv | Attention
//! out = h + post_ffn_norm(w2(silu(w1(ffn_norm(h))) * w3(ffn_norm(h))))
//! ```

use super::Layer;
use crate::cache::SeqCache;
use crate::config::{LayerKind, ModelConfig, RopeConfig};
use crate::error::Result;
use crate::kernels::{add_inplace, Rope};
use crate::loader::Weights;
use crate::nn::{Attention, AttentionSpec, Mlp, Operator, RmsNorm, Row, ShortConv};

pub struct Lfm3Layer {
    operator_norm: RmsNorm,
    operator: Operator,
    post_operator_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    feed_forward: Mlp,
    post_ffn_norm: Option<RmsNorm>,
}

impl Layer for Lfm3Layer {
    fn forward(&self, x: &mut [f32], rows: &[Row], caches: &mut [SeqCache], layer: usize) {
        let h = self.operator_norm.apply(x);
        let mut a = self.operator.forward(&h, rows, caches, layer);
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
}

fn rope_for(r: &RopeConfig, head_dim: usize) -> Rope {
    if r.proportional {
        Rope::proportional(
            head_dim,
            (r.partial_rotary_factor * head_dim as f64 / 2.0) as usize,
            r.theta,
        )
    } else {
        Rope::new(head_dim, head_dim, r.theta)
    }
}

pub fn layers(cfg: &ModelConfig, ws: &Weights) -> Result<Vec<Box<dyn Layer>>> {
    let d = cfg.hidden_size;
    let flag = |k: &str| cfg.raw.get(k).and_then(|v| v.as_bool()).unwrap_or(true);
    let sandwich = flag("use_sandwich_norm");
    let gate = flag("use_attention_gate");
    let eps = cfg.norm_eps;
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
                LayerKind::Attention | LayerKind::SlidingAttention => {
                    let sliding = *kind == LayerKind::SlidingAttention;
                    let rope = if sliding {
                        &cfg.rope_sliding
                    } else {
                        &cfg.rope
                    };
                    // transformers 5.24 saves the gate as `gate_proj`; the module is `g_proj`.
                    let gate_name = if ws
                        .get_opt(&format!("{p}.self_attn.g_proj.weight"))?
                        .is_some()
                    {
                        "g_proj"
                    } else {
                        "gate_proj"
                    };
                    Operator::Attention(Box::new(Attention::load(
                        ws,
                        &AttentionSpec {
                            prefix: &format!("{p}.self_attn"),
                            hidden: d,
                            n_heads: cfg.n_heads,
                            n_kv_heads: cfg.n_kv_heads,
                            head_dim: cfg.head_dim,
                            bias: cfg.attention_bias,
                            out_name: "o_proj",
                            qk_norm: Some(("q_norm", "k_norm")),
                            norm_eps: eps,
                            rope: rope_for(rope, cfg.head_dim),
                            window: sliding.then_some(cfg.sliding_window),
                            gate: gate.then_some(gate_name),
                        },
                    )?))
                }
            };
            let post = |name: &str| -> Result<Option<RmsNorm>> {
                if sandwich {
                    Ok(Some(RmsNorm::load(ws, &format!("{p}.{name}"), d, eps)?))
                } else {
                    Ok(None)
                }
            };
            Ok(Box::new(Lfm3Layer {
                operator_norm: RmsNorm::load(ws, &format!("{p}.operator_norm"), d, eps)?,
                operator,
                post_operator_norm: post("post_operator_norm")?,
                ffn_norm: RmsNorm::load(ws, &format!("{p}.ffn_norm"), d, eps)?,
                feed_forward: Mlp::load(
                    ws,
                    &format!("{p}.feed_forward"),
                    ["w1", "w3", "w2"],
                    d,
                    cfg.ffn_dim,
                )?,
                post_ffn_norm: post("post_ffn_norm")?,
            }) as Box<dyn Layer>)
        })
        .collect()
}
