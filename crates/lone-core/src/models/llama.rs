//! Llama-style decoders: Llama (SmolLM2), Qwen2/Qwen2.5 (q/k/v biases) and Qwen3 (per-head q/k
//! RMSNorm, explicit head_dim). Mirrors transformers' modeling_llama / qwen2 / qwen3:
//!
//! ```text
//! h = x + o_proj(attn(rope(q_norm?(q_proj(norm1(x)))), rope(k_norm?(k_proj(..))), v_proj(..)))
//! out = h + down_proj(silu(gate_proj(norm2(h))) * up_proj(norm2(h)))
//! ```

use super::Layer;
use crate::cache::SeqCache;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::{add_inplace, Pass, Rope};
use crate::loader::Weights;
use crate::nn::{Attention, AttentionSpec, Linear, Mlp, RmsNorm, Row};

pub struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl Layer for DecoderLayer {
    fn forward(
        &self,
        x: &mut [f32],
        rows: &[Row],
        pass: &Pass,
        caches: &mut [SeqCache],
        layer: usize,
    ) {
        let n = rows.len();
        let h = self.input_layernorm.apply(x);
        let a = self.self_attn.forward(&h, rows, pass, caches, layer);
        add_inplace(x, &a);
        let h = self.post_attention_layernorm.apply(x);
        let m = self.mlp.forward(&h, n);
        add_inplace(x, &m);
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = self.self_attn.linears_mut();
        v.extend(self.mlp.linears_mut());
        v
    }
}

pub fn layers(cfg: &ModelConfig, ws: &Weights) -> Result<Vec<Box<dyn Layer>>> {
    let d = cfg.hidden_size;
    let rot = ((cfg.head_dim as f64) * cfg.rope.partial_rotary_factor) as usize;
    (0..cfg.n_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let spec = AttentionSpec {
                prefix: &format!("{p}.self_attn"),
                hidden: d,
                n_heads: cfg.n_heads,
                n_kv_heads: cfg.n_kv_heads,
                head_dim: cfg.head_dim,
                bias: cfg.attention_bias,
                out_name: "o_proj",
                qk_norm: cfg.qk_norm.then_some(("q_norm", "k_norm")),
                norm_eps: cfg.norm_eps,
                rope: Rope::new(rot, rot, cfg.rope.theta),
                window: None,
                gate: None,
            };
            Ok(Box::new(DecoderLayer {
                input_layernorm: RmsNorm::load(
                    ws,
                    &format!("{p}.input_layernorm"),
                    d,
                    cfg.norm_eps,
                )?,
                self_attn: Attention::load(ws, &spec)?,
                post_attention_layernorm: RmsNorm::load(
                    ws,
                    &format!("{p}.post_attention_layernorm"),
                    d,
                    cfg.norm_eps,
                )?,
                mlp: Mlp::load(
                    ws,
                    &format!("{p}.mlp"),
                    ["gate_proj", "up_proj", "down_proj"],
                    d,
                    cfg.ffn_dim,
                )?,
            }) as Box<dyn Layer>)
        })
        .collect()
}
