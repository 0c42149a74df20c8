//! A Hugging Face checkpoint as llama.cpp's `convert_hf_to_gguf.py` writes it (`--outtype
//! f32|f16|bf16|q8_0`), for lfm2, qwen2, qwen3 and llama; lfm3 in lone's layout (DEVELOPERS.md
//! "LFM3 in GGUF", the layout `tests/reference/generate.py` writes).
//!
//! The converter's rules, followed here:
//! - tensors file by file in file-name order, each file's tensors in name order;
//! - 1-D tensors, `*_norm.weight`, the short-conv kernel and every non-`.weight` tensor (biases)
//!   stay F32; rows that are not whole blocks of the type fall back to F16;
//! - llama's Q/K rows are permuted for GGUF's interleaved RoPE; LFM2's conv kernel
//!   `[H, 1, K]` is stored as `[H, K]`;
//! - metadata keys in the converter's order (a key set twice keeps its first place);
//! - LFM2-MoE: a layer's experts (`experts.J.w1/w2/w3`, or transformers 5.x's fused
//!   `experts.gate_up_proj` and `experts.down_proj`) are stacked `[E, rows, cols]` into
//!   `ffn_gate_exps`, `ffn_down_exps`, `ffn_up_exps` (in that order) where the layer's last
//!   expert tensor comes; the router (`ffn_gate_inp`) stays F32.

use std::path::Path;

use serde_json::Value;

use super::{
    card, interleaved_source, naming, vocab, FileType, Plan, PlanTensor, RowOrder, Source,
};
use crate::config::{Arch, LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::loader::gguf::MetaValue;
use crate::loader::hf_to_gguf_name;
use crate::loader::safetensors::SafetensorsFiles;
use crate::tensor::{DType, Tensor};

/// Choices the checkpoint does not make.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `tokenizer.ggml.pre`, when llama.cpp's table does not know the tokenizer.
    pub tokenizer_pre: Option<String>,
}

fn u32v(x: usize) -> MetaValue {
    MetaValue::U32(x as u32)
}

/// The converter's type for one tensor.
fn tensor_type(gname: &str, n_dims: usize, row_len: usize, ftype: FileType) -> DType {
    if n_dims <= 1
        || gname.ends_with("_norm.weight")
        || gname.contains(".shortconv.conv.")
        || gname.contains(".ffn_gate_inp.")
        || !gname.ends_with(".weight")
    {
        return DType::F32;
    }
    let t = ftype.default_dtype();
    if !row_len.is_multiple_of(t.block_size()) {
        DType::F16
    } else {
        t
    }
}

/// A 1-D bias of `heads` heads, permuted as the converter permutes llama's Q/K rows.
fn permuted_vector(t: &Tensor, heads: usize) -> Result<Tensor> {
    let v = t.to_f32_vec();
    let n = v.len();
    if heads == 0 || !n.is_multiple_of(heads) || !(n / heads).is_multiple_of(2) {
        return Err(Error::Config(format!(
            "cannot permute a bias of {n} values into {heads} heads"
        )));
    }
    let out: Vec<f32> = (0..n).map(|r| v[interleaved_source(r, n, heads)]).collect();
    Ok(Tensor::from_f32(vec![n], &out))
}

/// One expert tensor of a MoE layer: (layer, what), by its HF name.
enum ExpertTensor {
    /// `experts.J.wK.weight`: expert J's matrix K (0 = w1, 1 = w2, 2 = w3).
    One(usize, usize, usize),
    /// transformers 5.x's `experts.gate_up_proj` `[E, 2I, H]`.
    FusedGateUp(usize),
    /// transformers 5.x's `experts.down_proj` `[E, H, I]`.
    FusedDown(usize),
}

fn expert_tensor(name: &str) -> Option<ExpertTensor> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    let rest = rest.strip_prefix("feed_forward.experts.")?;
    match rest {
        "gate_up_proj" => return Some(ExpertTensor::FusedGateUp(layer)),
        "down_proj" => return Some(ExpertTensor::FusedDown(layer)),
        _ => {}
    }
    let (j, w) = rest.strip_suffix(".weight")?.split_once('.')?;
    let k = ["w1", "w2", "w3"].iter().position(|x| *x == w)?;
    Some(ExpertTensor::One(layer, j.parse().ok()?, k))
}

/// The experts of one MoE layer, gathered until all are there.
#[derive(Default)]
struct LayerExperts {
    /// `[w1, w2, w3][expert]`.
    one: [Vec<Option<Tensor>>; 3],
    gate_up: Option<Tensor>,
    down: Option<Tensor>,
}

impl LayerExperts {
    /// Record `t`; once the layer is complete, its stacked (w1, w2, w3) sources.
    fn add(
        &mut self,
        what: &ExpertTensor,
        t: Tensor,
        n_experts: usize,
        ffn: usize,
    ) -> Result<Option<[Vec<Tensor>; 3]>> {
        let bad = |m: String| Error::Config(format!("MoE experts: {m}"));
        match *what {
            ExpertTensor::One(_, j, k) => {
                if j >= n_experts {
                    return Err(bad(format!("expert {j} of {n_experts}")));
                }
                let slot = &mut self.one[k];
                slot.resize(n_experts, None);
                slot[j] = Some(t);
                if self
                    .one
                    .iter()
                    .all(|v| v.len() == n_experts && v.iter().all(Option::is_some))
                {
                    let take = |v: &mut Vec<Option<Tensor>>| v.drain(..).flatten().collect();
                    let [a, b, c] = &mut self.one;
                    return Ok(Some([take(a), take(b), take(c)]));
                }
            }
            ExpertTensor::FusedGateUp(_) => self.gate_up = Some(t),
            ExpertTensor::FusedDown(_) => self.down = Some(t),
        }
        if let (Some(gu), Some(down)) = (&self.gate_up, &self.down) {
            let rows = |t: &Tensor, first: usize, n: usize| {
                t.rows_view(first, n)
                    .ok_or_else(|| bad(format!("a fused tensor {:?} lacks rows", t.shape)))
            };
            let per = |t: &Tensor| t.n_rows() / n_experts.max(1);
            if per(gu) != 2 * ffn {
                return Err(bad(format!(
                    "gate_up_proj {:?} for {n_experts} experts of width {ffn}",
                    gu.shape
                )));
            }
            let mut out: [Vec<Tensor>; 3] = Default::default();
            for j in 0..n_experts {
                out[0].push(rows(gu, 2 * ffn * j, ffn)?);
                out[1].push(rows(down, per(down) * j, per(down))?);
                out[2].push(rows(gu, 2 * ffn * j + ffn, ffn)?);
            }
            return Ok(Some(out));
        }
        Ok(None)
    }
}

/// The plan for checkpoint `dir` at `ftype` (one of the converter's own types).
pub fn plan(dir: &Path, ftype: FileType, opts: &Options) -> Result<Plan> {
    if !ftype.is_converter_type() {
        return Err(Error::Config(format!(
            "{} is not a converter output type (F32, F16, BF16, Q8_0)",
            ftype.name()
        )));
    }
    let cfg = ModelConfig::from_hf_dir(dir)?;
    cfg.validate()?;
    let st = SafetensorsFiles::open_dir(dir)?;
    let arch = cfg.arch;

    // Tensors.
    let mut tensors = Vec::new();
    let mut experts: std::collections::BTreeMap<usize, LayerExperts> = Default::default();
    if arch == Arch::Lfm3 {
        tensors.push(lfm3_rope_freqs(&cfg));
    }
    for hf_name in st.ordered_names() {
        if hf_name.ends_with(".attention.masked_bias")
            || hf_name.ends_with(".attention.bias")
            || hf_name.ends_with(".rotary_emb.inv_freq")
            || super::mmproj::is_vision_tensor(hf_name)
        {
            continue;
        }
        let mut source = st
            .get(hf_name)
            .cloned()
            .ok_or_else(|| Error::Config(format!("tensor '{hf_name}' vanished")))?;
        // A vision-language checkpoint's language model (its vision side: `convert::mmproj`).
        let lm_name = hf_name
            .strip_prefix("model.language_model.")
            .map(|rest| format!("model.{rest}"));
        let name = lm_name.as_deref().unwrap_or(hf_name);
        if let Some(what) = expert_tensor(name) {
            let moe = cfg.moe().ok_or_else(|| {
                Error::Unsupported(format!("'{name}': experts in a {} checkpoint", arch.name()))
            })?;
            let layer = match what {
                ExpertTensor::One(l, ..)
                | ExpertTensor::FusedGateUp(l)
                | ExpertTensor::FusedDown(l) => l,
            };
            let done = experts.entry(layer).or_default().add(
                &what,
                source,
                moe.n_experts,
                moe.expert_ffn_dim,
            )?;
            if let Some(stacks) = done {
                experts.remove(&layer);
                for (w, parts) in ["w1", "w2", "w3"].iter().zip(stacks) {
                    let hf = format!("model.layers.{layer}.feed_forward.experts.{w}.weight");
                    let gname = hf_to_gguf_name(&hf).unwrap_or(hf);
                    let first = &parts[0];
                    let shape = vec![parts.len(), first.n_rows(), first.row_len()];
                    let source = Source::stacked(parts).ok_or_else(|| {
                        Error::Config(format!("{gname}: experts of different widths"))
                    })?;
                    tensors.push(PlanTensor {
                        dtype: tensor_type(&gname, 3, shape[2], ftype),
                        name: gname,
                        shape,
                        source,
                        rows: RowOrder::Same,
                        importance: None,
                    });
                }
            }
            continue;
        }
        let gname = hf_to_gguf_name(name).ok_or_else(|| {
            Error::Unsupported(format!(
                "cannot map tensor '{name}' of this {} checkpoint to a GGUF name",
                arch.name()
            ))
        })?;
        let mut shape = source.shape.clone();
        if gname.contains(".shortconv.conv.") && shape.len() == 3 && shape[1] == 1 {
            shape = vec![shape[0], shape[2]];
        }
        let mut rows = RowOrder::Same;
        if arch == Arch::Llama {
            let heads = if name.contains("self_attn.q_proj.") {
                Some(cfg.n_heads)
            } else if name.contains("self_attn.k_proj.") {
                Some(cfg.n_kv_heads)
            } else {
                None
            };
            if let Some(h) = heads {
                if shape.len() == 1 {
                    source = permuted_vector(&source, h)?;
                } else {
                    rows = RowOrder::InterleaveHeads(h);
                }
            }
        }
        let row_len = shape.last().copied().unwrap_or(1);
        tensors.push(PlanTensor {
            dtype: tensor_type(&gname, shape.len(), row_len, ftype),
            name: gname,
            shape,
            source: source.into(),
            rows,
            importance: None,
        });
    }
    if let Some(layer) = experts.keys().next() {
        return Err(Error::Config(format!(
            "layer {layer}'s experts are incomplete in the checkpoint"
        )));
    }
    let total_params: u64 = tensors
        .iter()
        .filter(|t| t.name != "rope_freqs.weight")
        .map(|t| t.numel() as u64)
        .sum();

    let mut plan = Plan {
        kv: Vec::new(),
        tensors,
    };
    let a = arch.name();
    let key = |k: &str| format!("{a}.{k}");
    plan.set("general.architecture", MetaValue::String(a.into()));
    plan.set("general.type", MetaValue::String("model".into()));
    // gguf-py's size label: `{E}x{shared + one expert's}` for experts, else the total.
    let size_label = (arch != Arch::Lfm3).then(|| {
        let exps: Vec<&PlanTensor> = plan
            .tensors
            .iter()
            .filter(|t| t.name.contains("_exps.") && t.shape.len() >= 3)
            .collect();
        match exps.first() {
            None => naming::size_label(total_params),
            Some(first) => {
                let e = first.shape[0] as u64;
                let all: u64 = exps.iter().map(|t| t.numel() as u64).sum();
                let one: u64 = exps
                    .iter()
                    .map(|t| t.numel() as u64 / t.shape[0] as u64)
                    .sum();
                format!("{e}x{}", naming::size_label(total_params - all + one))
            }
        }
    });
    general_names(&mut plan, dir, total_params, size_label)?;
    if arch == Arch::Lfm3 {
        lfm3_params(&mut plan, &cfg, ftype);
    } else {
        plan.set(&key("block_count"), u32v(cfg.n_layers));
        plan.set(&key("context_length"), u32v(cfg.max_position_embeddings));
        plan.set(&key("embedding_length"), u32v(cfg.hidden_size));
        plan.set(&key("feed_forward_length"), u32v(cfg.ffn_dim));
        plan.set(&key("attention.head_count"), u32v(cfg.n_heads));
        if matches!(arch, Arch::Lfm2 | Arch::Lfm2Moe) {
            plan.set(&key("attention.head_count_kv"), kv_heads_per_layer(&cfg));
        } else {
            plan.set(&key("attention.head_count_kv"), u32v(cfg.n_kv_heads));
        }
        plan.set(
            &key("rope.freq_base"),
            MetaValue::F32(cfg.rope.theta as f32),
        );
        plan.set(
            &key("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(cfg.norm_eps),
        );
        if let Some(m) = cfg.moe() {
            plan.set(&key("expert_count"), u32v(m.n_experts));
            plan.set(&key("expert_used_count"), u32v(m.n_used));
        }
        if matches!(arch, Arch::Llama | Arch::Qwen3) || cfg.explicit_head_dim {
            plan.set(&key("attention.key_length"), u32v(cfg.head_dim));
            plan.set(&key("attention.value_length"), u32v(cfg.head_dim));
        }
        plan.set("general.file_type", MetaValue::U32(ftype.id()));
        match arch {
            Arch::Llama => {
                plan.set(&key("vocab_size"), u32v(cfg.vocab_size));
                plan.set(&key("rope.dimension_count"), u32v(cfg.head_dim));
            }
            Arch::Lfm2 => {
                plan.set(&key("vocab_size"), u32v(cfg.vocab_size));
                plan.set(&key("shortconv.l_cache"), u32v(cfg.conv_kernel));
            }
            Arch::Lfm2Moe => {
                if let Some(m) = cfg.moe() {
                    plan.set(&key("expert_feed_forward_length"), u32v(m.expert_ffn_dim));
                    plan.set(&key("leading_dense_block_count"), u32v(m.n_dense_layers));
                    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
                    plan.set(&key("expert_gating_func"), MetaValue::U32(2));
                    // The converter writes no scaling factor and llama.cpp reads none for
                    // lfm2moe; a checkpoint that scales keeps it where lone reads it.
                    if m.routed_scaling_factor != 1.0 {
                        plan.set(
                            &key("expert_weights_scale"),
                            MetaValue::F32(m.routed_scaling_factor),
                        );
                    }
                }
                plan.set(&key("vocab_size"), u32v(cfg.vocab_size));
                plan.set(&key("shortconv.l_cache"), u32v(cfg.conv_kernel));
            }
            _ => {}
        }
        plan.set("general.quantization_version", MetaValue::U32(2));
    }
    if arch == Arch::Llama {
        if let Some(b) = read_json(&dir.join("tokenizer_config.json"))
            .and_then(|tc| tc.get("add_prefix_space").and_then(|b| b.as_bool()))
        {
            plan.set("tokenizer.ggml.add_space_prefix", MetaValue::Bool(b));
        }
    }
    vocab::add_gpt2_vocab(
        dir,
        cfg.vocab_size,
        opts.tokenizer_pre.as_deref(),
        &mut plan,
    )?;
    if arch == Arch::Llama && cfg.vocab_size == 49152 {
        // The converter's rule for granite-sized (and SmolLM's) vocabularies.
        plan.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    }
    Ok(plan)
}

/// An optional JSON file beside the checkpoint; unreadable or invalid counts as absent.
fn read_json(path: &Path) -> Option<Value> {
    vocab::read_json(path).ok().flatten()
}

fn kv_heads_per_layer(cfg: &ModelConfig) -> MetaValue {
    MetaValue::Array(
        cfg.layer_kinds
            .iter()
            .map(|k| {
                MetaValue::I32(if *k == LayerKind::Conv {
                    0
                } else {
                    cfg.n_kv_heads as i32
                })
            })
            .collect(),
    )
}

/// `general.*`: sampling defaults from generation_config.json, then the authorship the model
/// card, `_name_or_path` and the directory name give (gguf-py's heuristics, [`card`]) and the
/// size label.
fn general_names(
    plan: &mut Plan,
    dir: &Path,
    total_params: u64,
    size_label: Option<String>,
) -> Result<()> {
    if let Some(g) = read_json(&dir.join("generation_config.json")) {
        let f = |k: &str| g.get(k).and_then(|v| v.as_f64());
        let i = |k: &str| g.get(k).and_then(|v| v.as_i64());
        if let Some(s) = g.get("sequence").and_then(|v| v.as_str()) {
            plan.set("general.sampling.sequence", MetaValue::String(s.into()));
        }
        // gguf-py's order: sequence, top_k, top_p, min_p, xtc_probability, xtc_threshold,
        // temp, penalty_last_n, penalty_repeat, mirostat, mirostat_tau, mirostat_eta.
        if let Some(v) = i("top_k") {
            plan.set("general.sampling.top_k", MetaValue::I32(v as i32));
        }
        for (k, src) in [
            ("top_p", "top_p"),
            ("min_p", "min_p"),
            ("xtc_probability", "xtc_probability"),
            ("xtc_threshold", "xtc_threshold"),
            ("temp", "temperature"),
        ] {
            if let Some(v) = f(src) {
                plan.set(&format!("general.sampling.{k}"), MetaValue::F32(v as f32));
            }
        }
        if let Some(v) = i("penalty_last_n") {
            plan.set("general.sampling.penalty_last_n", MetaValue::I32(v as i32));
        }
        if let Some(v) = f("penalty_repeat").or_else(|| f("repetition_penalty")) {
            plan.set("general.sampling.penalty_repeat", MetaValue::F32(v as f32));
        }
        if let Some(v) = i("mirostat") {
            plan.set("general.sampling.mirostat", MetaValue::I32(v as i32));
        }
        for k in ["mirostat_tau", "mirostat_eta"] {
            if let Some(v) = f(k) {
                plan.set(&format!("general.sampling.{k}"), MetaValue::F32(v as f32));
            }
        }
    }
    authorship(plan, dir, total_params, size_label);
    Ok(())
}

/// `general.*` of the authorship the model card, `_name_or_path` and the directory name give
/// (gguf-py's heuristics, [`card`]) and the size label (`None`: none).
pub(super) fn authorship(
    plan: &mut Plan,
    dir: &Path,
    total_params: u64,
    size_label: Option<String>,
) {
    let dir_name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let name_or_path = read_json(&dir.join("config.json"))
        .and_then(|c| c.get("_name_or_path")?.as_str().map(str::to_string));
    let mut who =
        card::Authorship::of_checkpoint(dir, &dir_name, name_or_path.as_deref(), total_params);
    match size_label {
        Some(label) => {
            if who.size_label.is_none() && total_params > 0 {
                who.size_label = Some(label);
            }
        }
        None => who.size_label = None,
    }
    for (k, v) in who.entries() {
        let v = match v {
            card::Entry::Str(s) => MetaValue::String(s),
            card::Entry::Count(n) => MetaValue::U32(n as u32),
            card::Entry::List(l) => {
                MetaValue::Array(l.into_iter().map(MetaValue::String).collect())
            }
        };
        plan.set(&k, v);
    }
}

/// LFM3's proportional RoPE as per-pair frequency divisors: 1 for the rotated pairs, 1e30
/// (angle 0) for the rest.
fn lfm3_rope_freqs(cfg: &ModelConfig) -> PlanTensor {
    let hd = cfg.head_dim;
    let angles = ((cfg.rope.partial_rotary_factor * hd as f64) / 2.0).floor() as usize;
    let f: Vec<f32> = (0..hd / 2)
        .map(|i| if i < angles { 1.0 } else { 1e30 })
        .collect();
    PlanTensor {
        name: "rope_freqs.weight".into(),
        shape: vec![hd / 2],
        dtype: DType::F32,
        source: Tensor::from_f32(vec![hd / 2], &f).into(),
        rows: RowOrder::Same,
        importance: None,
    }
}

fn lfm3_params(plan: &mut Plan, cfg: &ModelConfig, ftype: FileType) {
    let key = |k: &str| format!("lfm3.{k}");
    plan.set(&key("block_count"), u32v(cfg.n_layers));
    plan.set(&key("context_length"), u32v(cfg.max_position_embeddings));
    plan.set(&key("embedding_length"), u32v(cfg.hidden_size));
    plan.set(&key("feed_forward_length"), u32v(cfg.ffn_dim));
    plan.set(&key("attention.head_count"), u32v(cfg.n_heads));
    plan.set(&key("attention.head_count_kv"), kv_heads_per_layer(cfg));
    plan.set(&key("attention.key_length"), u32v(cfg.head_dim));
    plan.set(&key("attention.value_length"), u32v(cfg.head_dim));
    plan.set(
        &key("attention.layer_norm_rms_epsilon"),
        MetaValue::F32(cfg.norm_eps),
    );
    plan.set(&key("attention.sliding_window"), u32v(cfg.sliding_window));
    plan.set(
        &key("attention.sliding_window_pattern"),
        MetaValue::Array(
            cfg.layer_kinds
                .iter()
                .map(|k| MetaValue::Bool(*k == LayerKind::SlidingAttention))
                .collect(),
        ),
    );
    plan.set(
        &key("rope.freq_base"),
        MetaValue::F32(cfg.rope.theta as f32),
    );
    plan.set(
        &key("rope.freq_base_swa"),
        MetaValue::F32(cfg.rope_sliding.theta as f32),
    );
    plan.set(&key("rope.dimension_count"), u32v(cfg.head_dim));
    plan.set(&key("rope.dimension_count_swa"), u32v(cfg.head_dim));
    plan.set(&key("vocab_size"), u32v(cfg.vocab_size));
    plan.set(&key("shortconv.l_cache"), u32v(cfg.conv_kernel));
    plan.set("general.file_type", MetaValue::U32(ftype.id()));
    plan.set("general.quantization_version", MetaValue::U32(2));
}
