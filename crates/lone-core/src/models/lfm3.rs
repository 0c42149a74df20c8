//! LFM3 (transformers' modeling_lfm3): LFM2's conv/attention stack plus sliding-window
//! attention layers, per-layer-type RoPE (sliding: default RoPE; full: proportional RoPE
//! over part of head_dim), a per-head sigmoid output gate (`g_proj`) and "sandwich" norms
//! on the operator and FFN outputs.
//!
//! ```text
//! h = x + post_operator_norm(operator(operator_norm(x)))   operator = ShortConv | Attention
//! out = h + post_ffn_norm(w2(silu(w1(ffn_norm(h))) * w3(ffn_norm(h))))
//! ```

use super::lfm2::{conv_operator, HybridLayer};
use super::Layer;
use crate::config::{FamilyConfig, LayerKind, ModelConfig, RopeConfig};
use crate::error::Result;
use crate::kernels::Rope;
use crate::loader::Weights;
use crate::nn::{Attention, AttentionSpec, Operator};

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
    let (sandwich, gate) = match cfg.family {
        FamilyConfig::Lfm3 {
            sandwich_norm,
            attention_gate,
        } => (sandwich_norm, attention_gate),
        _ => (true, true),
    };
    cfg.layer_kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let p = format!("model.layers.{i}");
            let operator = match kind {
                LayerKind::Conv => conv_operator(ws, cfg, &p)?,
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
                            norm_eps: cfg.norm_eps,
                            rope: rope_for(rope, cfg.head_dim),
                            window: sliding.then_some(cfg.sliding_window),
                            gate: gate.then_some(gate_name),
                        },
                    )?))
                }
            };
            Ok(Box::new(HybridLayer::load(ws, cfg, i, operator, sandwich)?) as Box<dyn Layer>)
        })
        .collect()
}
