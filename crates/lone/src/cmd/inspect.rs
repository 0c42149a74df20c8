//! `lone inspect`: what a model file or checkpoint is, as lone reads it.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use lone_core::cache::KvType;
use lone_core::config::LayerKind;
use lone_core::text::TextIo;
use lone_core::Model;
use serde_json::{json, Value};

use super::common;
use super::model_info::{
    cache_bytes, cpu_model, file_bytes, fmt_bytes, fmt_params, measure_membw, model_info,
    tensor_table,
};

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// HF checkpoint directory or GGUF file (default: the default model from the setup step).
    pub model: Option<PathBuf>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Measure this machine's read bandwidth and give the decode ceiling it allows.
    #[arg(long)]
    pub membw: bool,
    /// Leave out the tensor table (text output).
    #[arg(long)]
    pub no_tensors: bool,
    #[command(flatten)]
    pub vision: common::MmprojArgs,
}

fn layer_summary(model: &Model) -> String {
    let mut out: Vec<(String, usize)> = Vec::new();
    for k in &model.cfg.layer_kinds {
        let name = match k {
            LayerKind::Attention => "attention",
            LayerKind::SlidingAttention => "sliding-window attention",
            LayerKind::Conv => "conv",
        };
        match out.last_mut() {
            Some((n, c)) if n == name => *c += 1,
            _ => out.push((name.to_string(), 1)),
        }
    }
    out.iter()
        .map(|(n, c)| format!("{c}×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn run(a: InspectArgs) -> Result<()> {
    let path = common::resolve_model(a.model.as_deref())?;
    let mut model =
        Model::load(&path).with_context(|| format!("cannot load model {}", path.display()))?;
    a.vision.load(&mut model, &path)?;
    let text = TextIo::load(&model, &path).context("cannot load the tokenizer")?;
    let info = model_info(&model, &path);
    let tensors = tensor_table(&model);
    let file_bytes = file_bytes(&path);
    let parts = lone_core::loader::gguf::split_parts_by_name(&path).map_or(1, |p| p.len());
    let c = &model.cfg;
    let caches: Vec<Value> = [KvType::F32, KvType::F16, KvType::Q8_0]
        .into_iter()
        .filter(|k| k.supports(c.head_dim))
        .map(|k| {
            let (t, f) = cache_bytes(&model, k);
            json!({"type": k.name(), "bytes_per_token": t, "fixed_bytes": f})
        })
        .collect();
    let bandwidth = a.membw.then(|| {
        let threads = lone_core::kernels::threads();
        let gbs = measure_membw(1024, threads, 3);
        gbs.iter().copied().fold(0.0, f64::max)
    });
    let tok = &text.tokenizer;
    let tok_kind = serde_json::to_value(tok.inner().get_model())
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let sp = tok.special_tokens();
    let experts = c.moe().map(|m| {
        json!({
            "count": m.n_experts, "used_per_token": m.n_used, "ffn_dim": m.expert_ffn_dim,
            "leading_dense_layers": m.n_dense_layers, "norm_topk_prob": m.norm_topk_prob,
            "routed_scaling_factor": m.routed_scaling_factor, "expert_bias": m.expert_bias,
        })
    });
    // Mixed files (llama-quantize's mixes, "dynamic" quants): the bytes of each type.
    let mut by_type: Vec<(&str, u64, usize)> = Vec::new();
    for t in &tensors {
        match by_type.iter_mut().find(|b| b.0 == t.dtype) {
            Some(b) => (b.1, b.2) = (b.1 + t.bytes, b.2 + 1),
            None => by_type.push((&t.dtype, t.bytes, 1)),
        }
    }
    by_type.sort_by_key(|b| std::cmp::Reverse(b.1));
    let types: Vec<String> = by_type
        .iter()
        .map(|(d, b, n)| format!("{d} {} ({n})", fmt_bytes(*b)))
        .collect();
    let obj = json!({
        "path": path.display().to_string(),
        "format": if path.is_dir() { "safetensors" } else { "gguf" },
        "file_bytes": file_bytes,
        "parts": parts,
        "arch": c.arch.name(),
        "vision": model.vision.as_ref().map(|v| v.describe()),
        "name": info.name,
        "quant": info.quant,
        "params": info.params,
        "active_params": info.active_params,
        "weight_bytes": info.size_bytes,
        "weight_bytes_per_token": info.bytes_per_token,
        "config": {
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "n_layers": c.n_layers,
            "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim,
            "ffn_dim": c.ffn_dim, "norm_eps": c.norm_eps, "rope_theta": c.rope.theta,
            "partial_rotary_factor": c.rope.partial_rotary_factor,
            "rope_proportional": c.rope.proportional,
            "sliding_rope_theta": c.rope_sliding.theta,
            "tie_embeddings": c.tie_embeddings, "conv_kernel": c.conv_kernel,
            "conv_bias": c.conv_bias, "attention_bias": c.attention_bias, "qk_norm": c.qk_norm,
            "sliding_window": c.sliding_window,
            "max_position_embeddings": c.max_position_embeddings,
            "bos_token_id": c.bos_token_id, "eos_token_ids": c.eos_token_ids,
            "layers": c.layer_kinds.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>(),
            "experts": experts,
        },
        "cache": caches,
        "bandwidth_gbs": bandwidth,
        "decode_ceiling_tokens_per_second": bandwidth.map(|b| b * 1e9 / info.bytes_per_token.max(1) as f64),
        "cpu": cpu_model(),
        "tokenizer": {
            "kind": tok_kind, "vocab_size": tok.vocab_size(),
            "bos": sp.bos, "eos": sp.eos, "pad": sp.pad, "unk": sp.unk,
            "eos_ids": text.eos_ids, "add_bos": tok.add_bos_token(),
        },
        "chat_template": text.template.as_ref().map(|t| t.source()),
        "chat_templates": tok.named_chat_templates().iter()
            .map(|(n, t)| (n.clone(), json!(t))).collect::<serde_json::Map<_, _>>(),
        "types": by_type.iter().map(|(d, b, n)| json!({"type": d, "bytes": b, "tensors": n}))
            .collect::<Vec<_>>(),
        "tensors": tensors.iter().map(|t| json!({
            "name": t.name, "type": t.dtype, "shape": t.shape, "bytes": t.bytes,
        })).collect::<Vec<_>>(),
    });
    let mut o = std::io::stdout().lock();
    if a.json {
        writeln!(o, "{obj}")?;
        return Ok(());
    }
    writeln!(
        o,
        "{}  ({}{})",
        path.display(),
        obj["format"].as_str().unwrap_or(""),
        if parts > 1 {
            format!(", split in {parts} parts")
        } else {
            String::new()
        }
    )?;
    let params = if info.active_params < info.params {
        format!(
            "{} parameters ({} active per token)",
            fmt_params(info.params),
            fmt_params(info.active_params)
        )
    } else {
        format!("{} parameters", fmt_params(info.params))
    };
    writeln!(
        o,
        "model: {} — {}, {} of weights ({} on disk), {} read per decoded token",
        info.name,
        params,
        fmt_bytes(info.size_bytes),
        fmt_bytes(file_bytes),
        fmt_bytes(info.bytes_per_token)
    )?;
    writeln!(o, "layers: {} ({})", c.n_layers, layer_summary(&model))?;
    if let Some(m) = c.moe() {
        writeln!(
            o,
            "experts: {} per MoE layer, {} chosen per token (width {}); leading dense layers: {}",
            m.n_experts, m.n_used, m.expert_ffn_dim, m.n_dense_layers
        )?;
    }
    writeln!(
        o,
        "shape: hidden {}, ffn {}, heads {} (kv {}, head_dim {}), vocab {}, context {}",
        c.hidden_size,
        c.ffn_dim,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.vocab_size,
        c.max_position_embeddings
    )?;
    writeln!(
        o,
        "rope: theta {}{}; norm eps {}; tied embeddings {}; qk-norm {}; attention bias {}{}",
        c.rope.theta,
        if c.rope.partial_rotary_factor < 1.0 {
            format!(" (rotary fraction {})", c.rope.partial_rotary_factor)
        } else {
            String::new()
        },
        c.norm_eps,
        c.tie_embeddings,
        c.qk_norm,
        c.attention_bias,
        if c.sliding_window > 0 {
            format!("; sliding window {}", c.sliding_window)
        } else {
            String::new()
        }
    )?;
    for cc in &caches {
        writeln!(
            o,
            "cache {}: {} per context token{}",
            cc["type"].as_str().unwrap_or(""),
            fmt_bytes(cc["bytes_per_token"].as_u64().unwrap_or(0)),
            match cc["fixed_bytes"].as_u64().unwrap_or(0) {
                0 => String::new(),
                f => format!(" + {} per sequence (conv / window state)", fmt_bytes(f)),
            }
        )?;
    }
    if let Some(b) = bandwidth {
        writeln!(
            o,
            "decode ceiling: {:.1} tok/s at {b:.1} GB/s read bandwidth ({})",
            b * 1e9 / info.bytes_per_token.max(1) as f64,
            cpu_model()
        )?;
    }
    writeln!(
        o,
        "tokenizer: {tok_kind}, {} tokens; bos {:?}, eos {:?} (stops at ids {:?}), pad {:?}; adds BOS {}",
        tok.vocab_size(),
        sp.bos,
        sp.eos,
        text.eos_ids,
        sp.pad,
        tok.add_bos_token()
    )?;
    match text.template.as_ref() {
        Some(t) => {
            let src = t.source();
            let tools = if src.contains("tools") {
                ", renders tools"
            } else {
                ""
            };
            writeln!(o, "chat template: {} bytes{tools}", src.len())?;
        }
        None => writeln!(o, "chat template: none")?,
    }
    for (name, src) in tok.named_chat_templates() {
        let used = if name == "tool_use" {
            " (requests with tools)"
        } else {
            ""
        };
        writeln!(o, "chat template '{name}': {} bytes{used}", src.len())?;
    }
    if let Some(v) = &model.vision {
        writeln!(o, "vision: takes images; {}", v.describe())?;
    }
    writeln!(o, "types: {}", types.join(", "))?;
    if !a.no_tensors {
        writeln!(o, "tensors ({}):", tensors.len())?;
        for t in &tensors {
            writeln!(
                o,
                "  {:<48} {:<7} {:<16} {}",
                t.name,
                t.dtype,
                format!("{:?}", t.shape),
                fmt_bytes(t.bytes)
            )?;
        }
    }
    Ok(())
}
