//! One model description for every family, read from a HF `config.json` (4.x or 5.x keys) or
//! from GGUF metadata.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;

/// The model families lone implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Lfm2,
    /// LFM2's hybrid stack with sparse mixture-of-experts FFNs (LFM2-8B-A1B, LFM2-24B-A2B).
    Lfm2Moe,
    Lfm3,
}

pub const SUPPORTED: &str = "llama (SmolLM2 and other Llama-family), qwen2 (Qwen2/Qwen2.5), qwen3, lfm2 (LFM2/LFM2.5), lfm2_moe (LFM2-8B-A1B, LFM2-24B-A2B), lfm3";

impl Arch {
    pub fn from_model_type(t: &str) -> Option<Arch> {
        Some(match t {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "lfm2" => Arch::Lfm2,
            // transformers' model_type, llama.cpp's GGUF architecture
            "lfm2_moe" | "lfm2moe" => Arch::Lfm2Moe,
            "lfm3" => Arch::Lfm3,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Lfm2 => "lfm2",
            Arch::Lfm2Moe => "lfm2moe",
            Arch::Lfm3 => "lfm3",
        }
    }

    /// LFM's hybrid stack of gated short convolutions and attention.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Lfm2 | Arch::Lfm2Moe | Arch::Lfm3)
    }
}

/// A sparse mixture-of-experts FFN (transformers' `Lfm2MoeSparseMoeBlock`): a linear router,
/// sigmoid scores, the top `n_used` experts of `scores + expert_bias` (the bias only
/// selects), weighted by their unbiased scores (normalised to sum 1 when `norm_topk_prob`)
/// times `routed_scaling_factor`; each expert a SwiGLU of width `expert_ffn_dim`.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub n_used: usize,
    pub expert_ffn_dim: usize,
    /// Layers below this index have the dense FFN (of width `ffn_dim`).
    pub n_dense_layers: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    pub expert_bias: bool,
}

/// What a family adds to the common description.
#[derive(Clone, Debug, PartialEq)]
pub enum FamilyConfig {
    /// Nothing beyond the common fields.
    Plain,
    /// LFM3's optional parts (both on unless a config turns them off).
    Lfm3 {
        /// RMSNorms on the operator and FFN outputs.
        sandwich_norm: bool,
        /// A per-head sigmoid gate on the attention output.
        attention_gate: bool,
    },
    /// LFM2-MoE.
    Moe(MoeConfig),
}

/// The FFN of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    /// SwiGLU of width `ffn_dim`.
    Dense,
    /// [`MoeConfig`]'s experts.
    Moe,
}

/// Most experts a MoE layer may declare.
pub const MAX_EXPERTS: usize = 4096;

/// What a decoder layer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Causal attention over the whole sequence.
    Attention,
    /// Causal attention over the last `sliding_window` positions.
    SlidingAttention,
    /// LFM's gated short convolution.
    Conv,
}

/// Rotary embedding of one attention kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    /// Fraction of head_dim that is rotated (1.0 = all).
    pub partial_rotary_factor: f64,
    /// transformers' "proportional" RoPE: the first `factor * head_dim / 2` frequencies of a
    /// full-width table (exponent denominator head_dim), the rest zero (not rotated).
    pub proportional: bool,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// The FFN width actually used (LFM2's adjustment rule already applied).
    pub ffn_dim: usize,
    pub norm_eps: f32,
    pub rope: RopeConfig,
    /// RoPE of sliding-window layers, where it differs.
    pub rope_sliding: RopeConfig,
    pub tie_embeddings: bool,
    pub layer_kinds: Vec<LayerKind>,
    pub conv_kernel: usize,
    pub conv_bias: bool,
    pub attention_bias: bool,
    pub qk_norm: bool,
    pub sliding_window: usize,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The config names head_dim itself (not hidden_size / n_heads).
    pub explicit_head_dim: bool,
    pub family: FamilyConfig,
}

/// Bounds on what a model may declare (far above any model lone runs; they keep a corrupt
/// file from asking for absurd allocations).
pub const MAX_LAYERS: usize = 4096;
pub const MAX_DIM: usize = 1 << 16;
pub const MAX_VOCAB: usize = 1 << 22;
pub const MAX_CONTEXT: usize = 1 << 24;

fn cfg_err(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

fn get_usize(v: &Value, keys: &[&str]) -> Option<usize> {
    keys.iter()
        .find_map(|k| v.get(*k).and_then(|x| x.as_u64()).map(|x| x as usize))
}

fn get_f64(v: &Value, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| v.get(*k).and_then(|x| x.as_f64()))
}

fn need_usize(v: &Value, keys: &[&str]) -> Result<usize> {
    get_usize(v, keys).ok_or_else(|| cfg_err(format!("config.json lacks {}", keys.join(" / "))))
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => vec![],
    }
}

/// RoPE theta from `rope_parameters` (5.x; may be nested per layer type) or `rope_theta` (4.x).
fn rope_theta(
    v: &Value,
    layer_type: Option<&str>,
    default: f64,
) -> Result<(f64, Option<f64>, bool)> {
    let check_type = |rp: &Value| -> Result<()> {
        if let Some(t) = rp.get("rope_type").and_then(|t| t.as_str()) {
            if t != "default" && t != "proportional" {
                return Err(cfg_err(format!(
                    "rope type '{t}' is not supported yet (lone supports default RoPE)"
                )));
            }
        }
        Ok(())
    };
    if let Some(rp) = v.get("rope_parameters").filter(|x| x.is_object()) {
        let rp = match layer_type.and_then(|lt| rp.get(lt)) {
            Some(inner) if inner.is_object() => inner,
            _ => rp,
        };
        check_type(rp)?;
        if let Some(t) = rp.get("rope_theta").and_then(|x| x.as_f64()) {
            let prop = rp.get("rope_type").and_then(|x| x.as_str()) == Some("proportional");
            return Ok((
                t,
                rp.get("partial_rotary_factor").and_then(|x| x.as_f64()),
                prop,
            ));
        }
    }
    if let Some(rs) = v.get("rope_scaling").filter(|x| x.is_object()) {
        check_type(rs)?;
    }
    Ok((get_f64(v, &["rope_theta"]).unwrap_or(default), None, false))
}

impl ModelConfig {
    /// Parse a HF `config.json` (plus `generation_config.json` beside it, for EOS ids).
    pub fn from_hf_dir(dir: &Path) -> Result<ModelConfig> {
        let v = crate::error::read_json(&dir.join("config.json"))?;
        let mut cfg = Self::from_hf_json(&v)?;
        let gpath = dir.join("generation_config.json");
        if let Ok(t) = crate::error::read_text(&gpath) {
            if let Ok(g) = serde_json::from_str::<Value>(&t) {
                for id in ids(g.get("eos_token_id")) {
                    if !cfg.eos_token_ids.contains(&id) {
                        cfg.eos_token_ids.push(id);
                    }
                }
            }
        }
        Ok(cfg)
    }

    pub fn from_hf_json(v: &Value) -> Result<ModelConfig> {
        let model_type = v.get("model_type").and_then(|x| x.as_str()).unwrap_or("");
        // A vision-language checkpoint: its language model is configured by `text_config`
        // (the vision tower by `vision_config`, read by `vision::VisionConfig`).
        if crate::vision::VisionConfig::is_vl_model_type(model_type) {
            let Some(text) = v.get("text_config").filter(|t| t.is_object()) else {
                return Err(cfg_err(format!(
                    "config.json: a {model_type} model needs a text_config object"
                )));
            };
            let mut text = text.clone();
            if let (Some(t), Some(o)) = (text.as_object_mut(), v.as_object()) {
                for key in ["tie_word_embeddings", "eos_token_id", "bos_token_id"] {
                    if let (false, Some(val)) = (t.contains_key(key), o.get(key)) {
                        t.insert(key.into(), val.clone());
                    }
                }
            }
            return Self::from_hf_json(&text);
        }
        let arch = Arch::from_model_type(model_type).ok_or_else(|| {
            let archs = v
                .get("architectures")
                .map(|a| a.to_string())
                .unwrap_or_default();
            Error::Unsupported(format!(
                "model_type '{model_type}' {archs} is not supported; lone supports {SUPPORTED}"
            ))
        })?;
        let hidden_size = need_usize(v, &["hidden_size", "block_dim", "d_model"])?;
        let n_layers = need_usize(v, &["num_hidden_layers", "n_layers"])?;
        if !(1..=MAX_LAYERS).contains(&n_layers) {
            return Err(cfg_err(format!(
                "config.json: num_hidden_layers is {n_layers}; expected 1..={MAX_LAYERS}"
            )));
        }
        let n_heads = need_usize(v, &["num_attention_heads", "num_heads"])?;
        let n_kv_heads = get_usize(v, &["num_key_value_heads"]).unwrap_or(n_heads);
        let vocab_size = need_usize(v, &["vocab_size"])?;
        let lfm3 = arch == Arch::Lfm3;
        let head_dim = get_usize(v, &["head_dim"]).unwrap_or(if lfm3 {
            128
        } else {
            hidden_size / n_heads.max(1)
        });
        let norm_eps =
            get_f64(v, &["rms_norm_eps", "norm_eps", "block_norm_eps"]).unwrap_or(1e-6) as f32;
        let max_pos = get_usize(v, &["max_position_embeddings"]).unwrap_or(4096);
        let tie_default = arch.is_hybrid();
        let tie = v
            .get("tie_word_embeddings")
            .or_else(|| v.get("tie_embedding"))
            .and_then(|x| x.as_bool())
            .unwrap_or(tie_default);

        // Layer kinds.
        let layer_kinds: Vec<LayerKind> = match arch {
            _ if arch.is_hybrid() => {
                if let Some(lt) = v.get("layer_types").and_then(|x| x.as_array()) {
                    lt.iter()
                        .map(|t| match t.as_str() {
                            Some("conv") => Ok(LayerKind::Conv),
                            Some("full_attention") | Some("attention") => Ok(LayerKind::Attention),
                            Some("sliding_attention") => Ok(LayerKind::SlidingAttention),
                            other => Err(cfg_err(format!(
                                "unknown layer type {other:?} in layer_types"
                            ))),
                        })
                        .collect::<Result<_>>()?
                } else if let Some(idx) = v.get("full_attn_idxs").and_then(|x| x.as_array()) {
                    let idx: Vec<u64> = idx.iter().filter_map(|x| x.as_u64()).collect();
                    (0..n_layers as u64)
                        .map(|i| {
                            if idx.contains(&i) {
                                LayerKind::Attention
                            } else {
                                LayerKind::Conv
                            }
                        })
                        .collect()
                } else {
                    vec![LayerKind::Attention; n_layers]
                }
            }
            _ => vec![LayerKind::Attention; n_layers],
        };
        if layer_kinds.len() != n_layers {
            return Err(cfg_err(format!(
                "layer_types has {} entries but num_hidden_layers is {n_layers}",
                layer_kinds.len()
            )));
        }

        // FFN width.
        let mut ffn_dim = need_usize(v, &["block_ff_dim", "intermediate_size"])?;
        if arch == Arch::Lfm2
            && v.get("block_auto_adjust_ff_dim")
                .and_then(|x| x.as_bool())
                .unwrap_or(true)
        {
            ffn_dim = 2 * ffn_dim / 3;
            let mult = v.get("block_ffn_dim_multiplier");
            let mult = match mult {
                None => Some(1.0),
                Some(Value::Null) => None,
                Some(m) => m.as_f64(),
            };
            if let Some(m) = mult {
                ffn_dim = (m * ffn_dim as f64) as usize;
                let mo = get_usize(v, &["block_multiple_of"]).unwrap_or(256).max(1);
                ffn_dim = ffn_dim.div_ceil(mo) * mo;
            }
        }

        let has_rope = v.get("rope_parameters").is_some_and(|x| x.is_object())
            || v.get("rope_theta").is_some();
        let (rope, rope_sliding) = if arch == Arch::Lfm3 && !has_rope {
            // Lfm3Config's defaults.
            (
                RopeConfig {
                    theta: 1e6,
                    partial_rotary_factor: 0.5,
                    proportional: true,
                },
                RopeConfig {
                    theta: 1e4,
                    partial_rotary_factor: 1.0,
                    proportional: false,
                },
            )
        } else {
            let default_theta = match arch {
                Arch::Lfm2 | Arch::Lfm2Moe | Arch::Lfm3 | Arch::Qwen2 | Arch::Qwen3 => 1e6,
                Arch::Llama => 1e4,
            };
            let (theta, prf, prop) = rope_theta(v, Some("full_attention"), default_theta)?;
            let (theta_s, prf_s, prop_s) = rope_theta(v, Some("sliding_attention"), theta)?;
            let top_prf = get_f64(v, &["partial_rotary_factor"]);
            (
                RopeConfig {
                    theta,
                    partial_rotary_factor: prf.or(top_prf).unwrap_or(1.0),
                    proportional: prop,
                },
                RopeConfig {
                    theta: theta_s,
                    partial_rotary_factor: prf_s.unwrap_or(1.0),
                    proportional: prop_s,
                },
            )
        };

        let flag = |k: &str, default: bool| v.get(k).and_then(|x| x.as_bool()).unwrap_or(default);
        let family = match arch {
            Arch::Lfm3 => FamilyConfig::Lfm3 {
                sandwich_norm: flag("use_sandwich_norm", true),
                attention_gate: flag("use_attention_gate", true),
            },
            // Lfm2MoeConfig's defaults where a key is absent.
            Arch::Lfm2Moe => FamilyConfig::Moe(MoeConfig {
                n_experts: get_usize(v, &["num_experts", "num_local_experts"]).unwrap_or(32),
                n_used: get_usize(v, &["num_experts_per_tok"]).unwrap_or(4),
                expert_ffn_dim: get_usize(v, &["moe_intermediate_size"]).unwrap_or(1792),
                n_dense_layers: get_usize(v, &["num_dense_layers"]).unwrap_or(2),
                norm_topk_prob: flag("norm_topk_prob", true),
                routed_scaling_factor: get_f64(v, &["routed_scaling_factor"]).unwrap_or(1.0) as f32,
                expert_bias: flag("use_expert_bias", true),
            }),
            _ => FamilyConfig::Plain,
        };
        let mut eos = ids(v.get("eos_token_id"));
        eos.dedup();
        let cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            norm_eps,
            rope,
            rope_sliding,
            tie_embeddings: tie,
            layer_kinds,
            conv_kernel: get_usize(v, &["conv_L_cache", "conv_kernel_size"]).unwrap_or(if lfm3 {
                7
            } else {
                3
            }),
            conv_bias: v
                .get("conv_bias")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
            attention_bias: match arch {
                Arch::Qwen2 => true,
                _ => v
                    .get("attention_bias")
                    .and_then(|x| x.as_bool())
                    .unwrap_or(false),
            },
            qk_norm: matches!(arch, Arch::Qwen3) || arch.is_hybrid(),
            sliding_window: get_usize(v, &["sliding_window"]).unwrap_or(if lfm3 { 256 } else { 0 }),
            max_position_embeddings: max_pos,
            bos_token_id: ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: eos,
            explicit_head_dim: v.get("head_dim").is_some(),
            family,
        };
        Ok(cfg)
    }

    /// Build the description from GGUF metadata (`{arch}.*` keys as llama.cpp writes them).
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig> {
        let path = g.path.display().to_string();
        let a = g
            .architecture()
            .ok_or_else(|| cfg_err(format!("{path}: no general.architecture")))?;
        if a == "clip" {
            return Err(Error::Input(format!(
                "{path} is an mmproj (the vision side of a vision-language model), not a \
                 language model: give the language model's GGUF and this file with --mmproj"
            )));
        }
        let arch = Arch::from_model_type(a).ok_or_else(|| {
            Error::Unsupported(format!(
                "{path}: GGUF architecture '{a}' is not supported; lone supports {SUPPORTED}"
            ))
        })?;
        let key = |k: &str| format!("{a}.{k}");
        let need = |k: &str| -> Result<usize> {
            g.meta(&key(k))
                .and_then(|v| {
                    v.as_u64().map(|x| x as usize).or_else(|| {
                        v.as_array()
                            .and_then(|a| a.iter().filter_map(|x| x.as_u64()).max())
                            .map(|x| x as usize)
                    })
                })
                .ok_or_else(|| cfg_err(format!("{path}: GGUF metadata lacks {}", key(k))))
        };
        let hidden_size = need("embedding_length")?;
        let n_layers = need("block_count")?;
        if !(1..=MAX_LAYERS).contains(&n_layers) {
            return Err(cfg_err(format!(
                "{path}: {} is {n_layers}; expected 1..={MAX_LAYERS}",
                key("block_count")
            )));
        }
        let n_heads = need("attention.head_count")?;
        // lfm2 stores head_count_kv per layer (0 for conv layers).
        let kv_meta = g.meta(&key("attention.head_count_kv"));
        let (n_kv_heads, layer_kinds) = match kv_meta {
            Some(v) if v.as_array().is_some() => {
                let arr: Vec<u64> = v
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|x| x.as_u64())
                    .collect();
                if arr.len() != n_layers {
                    return Err(cfg_err(format!(
                        "{path}: {} has {} entries for {n_layers} layers",
                        key("attention.head_count_kv"),
                        arr.len()
                    )));
                }
                let kv = arr.iter().copied().max().unwrap_or(0) as usize;
                let kinds = arr
                    .iter()
                    .map(|&x| {
                        if x == 0 {
                            LayerKind::Conv
                        } else {
                            LayerKind::Attention
                        }
                    })
                    .collect();
                (kv, kinds)
            }
            Some(v) => (
                v.as_u64().unwrap_or(n_heads as u64) as usize,
                vec![LayerKind::Attention; n_layers],
            ),
            None => (n_heads, vec![LayerKind::Attention; n_layers]),
        };
        let head_dim = g
            .meta(&key("attention.key_length"))
            .and_then(|v| v.as_u64())
            .map(|x| x as usize)
            .unwrap_or(hidden_size / n_heads.max(1));
        let ffn_dim = need("feed_forward_length")?;
        let norm_eps = g
            .meta(&key("attention.layer_norm_rms_epsilon"))
            .and_then(|v| v.as_f64())
            .unwrap_or(1e-5) as f32;
        let theta = g
            .meta(&key("rope.freq_base"))
            .and_then(|v| v.as_f64())
            .unwrap_or(10000.0);
        let vocab_size = g
            .meta(&key("vocab_size"))
            .and_then(|v| v.as_u64())
            .map(|x| x as usize)
            .or_else(|| {
                g.meta("tokenizer.ggml.tokens")
                    .and_then(|v| v.as_array())
                    .map(|a| a.len())
            })
            .or_else(|| g.tensor_info("token_embd.weight").map(|t| t.shape[0]))
            .ok_or_else(|| cfg_err(format!("{path}: cannot tell the vocabulary size")))?;
        let max_pos = g
            .meta(&key("context_length"))
            .and_then(|v| v.as_u64())
            .unwrap_or(4096) as usize;
        let tie = g.tensor_info("output.weight").is_none();
        let conv_kernel = g
            .meta(&key("shortconv.l_cache"))
            .and_then(|v| v.as_u64())
            .unwrap_or(3) as usize;
        let attention_bias = g.tensor_info("blk.0.attn_q.bias").is_some();
        let qk_norm = g
            .tensors
            .iter()
            .any(|t| t.name.ends_with("attn_q_norm.weight"));
        let bos = g
            .meta("tokenizer.ggml.bos_token_id")
            .and_then(|v| v.as_u64())
            .map(|x| x as u32);
        let mut eos: Vec<u32> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
            .iter()
            .filter_map(|k| g.meta(k).and_then(|v| v.as_u64()).map(|x| x as u32))
            .collect();
        eos.dedup();
        let rope = RopeConfig {
            theta,
            partial_rotary_factor: 1.0,
            proportional: false,
        };
        let mut cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            norm_eps,
            rope,
            rope_sliding: rope,
            tie_embeddings: tie,
            layer_kinds,
            conv_kernel,
            conv_bias: g.tensor_info("blk.0.shortconv.conv.bias").is_some(),
            attention_bias,
            qk_norm,
            sliding_window: 0,
            max_position_embeddings: max_pos,
            bos_token_id: bos,
            eos_token_ids: eos,
            explicit_head_dim: g.meta(&key("attention.key_length")).is_some(),
            family: FamilyConfig::Plain,
        };
        match arch {
            Arch::Lfm3 => cfg.lfm3_from_gguf(g)?,
            Arch::Lfm2Moe => cfg.moe_from_gguf(g)?,
            _ => {}
        }
        Ok(cfg)
    }

    /// Every size bounded, every float finite and in range, the shapes consistent.
    fn check_values(&self) -> std::result::Result<(), String> {
        let range = |name: &str, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} is {v}; expected {lo}..={hi}"))
            }
        };
        range("the vocabulary size", self.vocab_size, 1, MAX_VOCAB)?;
        range("the hidden size", self.hidden_size, 1, MAX_DIM)?;
        range("the layer count", self.n_layers, 1, MAX_LAYERS)?;
        range("the head count", self.n_heads, 1, MAX_DIM)?;
        range("the KV head count", self.n_kv_heads, 1, self.n_heads)?;
        range("head_dim", self.head_dim, 1, MAX_DIM)?;
        range("the FFN width", self.ffn_dim, 1, 16 * MAX_DIM)?;
        range(
            "the context length",
            self.max_position_embeddings,
            1,
            MAX_CONTEXT,
        )?;
        if self.layer_kinds.len() != self.n_layers {
            return Err(format!(
                "{} layer kinds for {} layers",
                self.layer_kinds.len(),
                self.n_layers
            ));
        }
        if self.layer_kinds.contains(&LayerKind::SlidingAttention) {
            range("the sliding window", self.sliding_window, 1, MAX_CONTEXT)?;
        }
        if self.layer_kinds.contains(&LayerKind::Conv) {
            range("the conv kernel size", self.conv_kernel, 1, 64)?;
        }
        let eps = self.norm_eps;
        if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
            return Err(format!(
                "the norm epsilon is {eps}; expected a finite number in (0, 1)"
            ));
        }
        for (what, r) in [
            ("rope", &self.rope),
            ("sliding-window rope", &self.rope_sliding),
        ] {
            if !(r.theta.is_finite() && r.theta > 0.0) {
                return Err(format!(
                    "the {what} theta is {}; expected a finite number > 0",
                    r.theta
                ));
            }
            let f = r.partial_rotary_factor;
            if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                return Err(format!(
                    "the {what} partial_rotary_factor is {f}; expected (0, 1]"
                ));
            }
        }
        if let Some(m) = self.moe() {
            range("the expert count", m.n_experts, 1, MAX_EXPERTS)?;
            range("the experts used per token", m.n_used, 1, m.n_experts)?;
            range("the expert FFN width", m.expert_ffn_dim, 1, 16 * MAX_DIM)?;
            range(
                "the leading dense layers",
                m.n_dense_layers,
                0,
                self.n_layers,
            )?;
            let s = m.routed_scaling_factor;
            if !(s.is_finite() && s > 0.0 && s < 1e6) {
                return Err(format!(
                    "the routed scaling factor is {s}; expected a finite number > 0"
                ));
            }
        }
        for &e in &self.eos_token_ids {
            if e as usize >= self.vocab_size {
                return Err(format!(
                    "EOS id {e} is outside the vocabulary ({})",
                    self.vocab_size
                ));
            }
        }
        Ok(())
    }

    /// What an `lfm3` GGUF adds to lfm2's metadata. llama.cpp has no LFM3 architecture yet; these
    /// are llama.cpp's keys for the same things in other architectures (DEVELOPERS.md, "LFM3 in
    /// GGUF"): `attention.sliding_window_pattern` (one bool per layer) and
    /// `attention.sliding_window`; `rope.freq_base` (full attention) and `rope.freq_base_swa`;
    /// proportional RoPE as gemma4 stores it: `rope.dimension_count` = head_dim and a
    /// `rope_freqs` tensor of per-pair frequency divisors, 1 for rotated pairs and 1e30 (angle
    /// zero) for the rest. The output gate and sandwich norms are on when their tensors exist.
    fn lfm3_from_gguf(&mut self, g: &GgufFile) -> Result<()> {
        let path = g.path.display().to_string();
        let a = self.arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let lacks = |k: &str, what: &str| {
            cfg_err(format!(
                "{path}: GGUF metadata lacks {} ({what}), which an lfm3 GGUF needs",
                key(k)
            ))
        };
        let hd = self.head_dim;

        // Layer kinds: conv (head_count_kv 0, already set), sliding or full attention.
        let k = "attention.sliding_window_pattern";
        let pattern: Vec<bool> = g
            .meta(&key(k))
            .and_then(|v| v.as_array())
            .ok_or_else(|| lacks(k, "one bool per layer, true for sliding-window attention"))?
            .iter()
            .map(|x| x.as_bool().or_else(|| x.as_u64().map(|x| x != 0)))
            .collect::<Option<_>>()
            .ok_or_else(|| cfg_err(format!("{path}: {} must hold bools", key(k))))?;
        if pattern.len() != self.n_layers {
            return Err(cfg_err(format!(
                "{path}: {} has {} entries for {} layers",
                key(k),
                pattern.len(),
                self.n_layers
            )));
        }
        for (i, (kind, &swa)) in self.layer_kinds.iter_mut().zip(&pattern).enumerate() {
            if swa {
                if *kind == LayerKind::Conv {
                    return Err(cfg_err(format!(
                        "{path}: layer {i} is a conv layer (head_count_kv 0) but {} marks it sliding",
                        key(k)
                    )));
                }
                *kind = LayerKind::SlidingAttention;
            }
        }
        let has = |kind| self.layer_kinds.contains(&kind);
        let (has_full, has_swa, has_conv) = (
            has(LayerKind::Attention),
            has(LayerKind::SlidingAttention),
            has(LayerKind::Conv),
        );

        let get_u = |k: &str| g.meta(&key(k)).and_then(|v| v.as_u64()).map(|x| x as usize);
        let get_f = |k: &str| g.meta(&key(k)).and_then(|v| v.as_f64());
        if has_swa {
            let k = "attention.sliding_window";
            self.sliding_window = get_u(k).ok_or_else(|| lacks(k, "the sliding window"))?;
        }
        if has_conv {
            let k = "shortconv.l_cache";
            self.conv_kernel = get_u(k).ok_or_else(|| lacks(k, "the conv kernel size"))?;
        }

        // RoPE. llama.cpp's default rotary width is head_dim; lone rotates all of it (the
        // proportional part is in rope_freqs).
        for k in ["rope.dimension_count", "rope.dimension_count_swa"] {
            if let Some(n) = get_u(k) {
                if n != hd {
                    return Err(Error::Unsupported(format!(
                        "{path}: {} = {n}: lfm3 rotates all of head_dim {hd} (partial RoPE is \
                         stored as rope_freqs)",
                        key(k)
                    )));
                }
            }
        }
        if has_full {
            let k = "rope.freq_base";
            self.rope.theta = get_f(k).ok_or_else(|| lacks(k, "RoPE base of full attention"))?;
            let t = g.tensor("rope_freqs.weight").ok_or_else(|| {
                cfg_err(format!(
                    "{path}: an lfm3 GGUF with full-attention layers needs the tensor \
                     rope_freqs.weight (proportional RoPE: 1 per rotated pair, 1e30 per other)"
                ))
            })?;
            let f = t.to_f32_vec();
            let rotated = f.iter().take_while(|&&x| x == 1.0).count();
            if f.len() != hd / 2 || f[rotated..].iter().any(|&x| x < 1e30) {
                return Err(Error::Unsupported(format!(
                    "{path}: rope_freqs.weight must be {} factors, 1 for the rotated pairs then \
                     >= 1e30 (not rotated); other frequency factors are not supported",
                    hd / 2
                )));
            }
            self.rope.proportional = true;
            self.rope.partial_rotary_factor = (2 * rotated) as f64 / hd as f64;
            // models/lfm3.rs turns the factor back into a pair count as transformers does
            if (self.rope.partial_rotary_factor * hd as f64 / 2.0) as usize != rotated {
                return Err(Error::Unsupported(format!(
                    "{path}: {rotated} rotated RoPE pairs of head_dim {hd} do not round-trip \
                     through partial_rotary_factor"
                )));
            }
        }
        if has_swa {
            let k = "rope.freq_base_swa";
            self.rope_sliding = RopeConfig {
                theta: get_f(k).ok_or_else(|| lacks(k, "RoPE base of sliding-window attention"))?,
                partial_rotary_factor: 1.0,
                proportional: false,
            };
        }

        // Output gate and sandwich norms: on when their tensors are there.
        let first_attn = self.layer_kinds.iter().position(|k| *k != LayerKind::Conv);
        let gate = first_attn.is_some_and(|i| {
            g.tensor_info(&format!("blk.{i}.attn_gate.weight"))
                .is_some()
        });
        let sandwich = g.tensor_info("blk.0.post_attention_norm.weight").is_some();
        self.family = FamilyConfig::Lfm3 {
            sandwich_norm: sandwich,
            attention_gate: gate,
        };
        Ok(())
    }

    /// An `lfm2moe` GGUF's experts, under the keys llama.cpp's converter writes:
    /// `expert_count`, `expert_used_count`, `expert_feed_forward_length`,
    /// `leading_dense_block_count`, `expert_gating_func` (2, sigmoid, the only one LFM2-MoE
    /// has), and optionally `expert_weights_scale` and `expert_weights_norm` — llama.cpp's
    /// reader of lfm2moe reads neither (it always normalises and never scales), and its
    /// converter writes neither, so absent they mean 1 and true. The expert bias is on when
    /// the first MoE layer has its `exp_probs_b.bias` tensor.
    fn moe_from_gguf(&mut self, g: &GgufFile) -> Result<()> {
        let path = g.path.display().to_string();
        let a = self.arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let need = |k: &str| -> Result<usize> {
            g.meta(&key(k))
                .and_then(|v| v.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| {
                    cfg_err(format!(
                        "{path}: GGUF metadata lacks {}, which an {a} GGUF needs",
                        key(k)
                    ))
                })
        };
        let gating = need("expert_gating_func")?;
        if gating != 2 {
            return Err(Error::Unsupported(format!(
                "{path}: {} is {gating}; lfm2moe routes with a sigmoid (2)",
                key("expert_gating_func")
            )));
        }
        let n_dense_layers = g
            .meta(&key("leading_dense_block_count"))
            .and_then(|v| v.as_u64())
            .unwrap_or(0) as usize;
        let scale = match g.meta(&key("expert_weights_scale")) {
            None => 1.0,
            Some(v) => match v.as_f64() {
                Some(0.0) => 1.0, // llama.cpp's "unset"
                Some(x) => x as f32,
                None => {
                    return Err(cfg_err(format!(
                        "{path}: {} is not a number",
                        key("expert_weights_scale")
                    )))
                }
            },
        };
        self.family = FamilyConfig::Moe(MoeConfig {
            n_experts: need("expert_count")?,
            n_used: need("expert_used_count")?,
            expert_ffn_dim: need("expert_feed_forward_length")?,
            n_dense_layers,
            norm_topk_prob: g
                .meta(&key("expert_weights_norm"))
                .and_then(|v| v.as_bool())
                .unwrap_or(true),
            routed_scaling_factor: scale,
            expert_bias: g
                .tensor_info(&format!("blk.{n_dense_layers}.exp_probs_b.bias"))
                .is_some(),
        });
        Ok(())
    }

    /// The mixture-of-experts description, for a MoE family.
    pub fn moe(&self) -> Option<&MoeConfig> {
        match &self.family {
            FamilyConfig::Moe(m) => Some(m),
            _ => None,
        }
    }

    /// The FFN of layer `i`.
    pub fn ffn_kind(&self, i: usize) -> FfnKind {
        match self.moe() {
            Some(m) if i >= m.n_dense_layers => FfnKind::Moe,
            _ => FfnKind::Dense,
        }
    }

    /// Sanity checks that keep later indexing in bounds and allocations sane (run before any
    /// weight is read).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(cfg_err(m));
        self.check_values()
            .map_err(|m| cfg_err(format!("invalid model config: {m}")))?;
        if self.hidden_size == 0
            || self.n_layers == 0
            || self.n_heads == 0
            || self.n_kv_heads == 0
            || self.vocab_size == 0
        {
            return bad(format!("model config has a zero size: {self:?}"));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) || self.head_dim > 512 {
            return bad(format!(
                "head_dim {} must be even and at most 512",
                self.head_dim
            ));
        }
        if self.layer_kinds.contains(&LayerKind::SlidingAttention) && self.sliding_window == 0 {
            return bad("sliding_attention layers need a sliding_window > 0".into());
        }
        if self.conv_kernel == 0 || self.conv_kernel > 64 {
            return bad(format!(
                "conv kernel size {} out of range",
                self.conv_kernel
            ));
        }
        Ok(())
    }
}
