//! What a model file is: sizes, the quantization label, the bytes a decoded token reads, the
//! tensors (shared by `lone bench` and `lone inspect`), and the machine's read bandwidth.

use std::path::Path;
use std::time::Instant;

use lone_core::cache::{KvType, SeqCache, DEFAULT_ROLLBACK};
use lone_core::config::LayerKind;
use lone_core::loader::WeightFiles;
use lone_core::Model;
use serde_json::{json, Value};

/// Bytes a model's files take on disk: the file (every part of a split GGUF), or a checkpoint
/// directory's regular files.
pub fn file_bytes(path: &Path) -> u64 {
    if let Some(parts) = lone_core::loader::gguf::split_parts_by_name(path) {
        return parts
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
    }
    if path.is_dir() {
        std::fs::read_dir(path)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }
}

/// Bytes of cache state for a KV type: per context token (full-attention layers), and fixed
/// per sequence (sliding-window rings, conv state, with the rows kept for rolling back).
pub fn cache_bytes(model: &Model, kv: KvType) -> (u64, u64) {
    let c = &model.cfg;
    let row = kv.row_bytes(c.n_kv_heads * c.head_dim) as u64;
    let attention = c
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::Attention)
        .count() as u64;
    let fixed = SeqCache::with_kv_type(c, DEFAULT_ROLLBACK, kv).bytes() as u64;
    (2 * row * attention, fixed)
}

/// What the table and the JSON lines say about the model and the machine.
pub struct Info {
    pub path: String,
    pub name: String,
    pub arch: &'static str,
    pub quant: String,
    pub size_bytes: u64,
    pub params: u64,
    /// Parameters a decoded token uses: all but the experts it does not choose (= `params`
    /// for a dense model).
    pub active_params: u64,
    /// Bytes of weights a decoded token reads (a MoE model's chosen experts only).
    pub bytes_per_token: u64,
    pub cpu: String,
    pub threads: usize,
}

impl Info {
    pub fn json(&self) -> Value {
        json!({
            "engine": "lone",
            "lone_version": env!("CARGO_PKG_VERSION"),
            "model": self.path,
            "model_name": self.name,
            "arch": self.arch,
            "quant": self.quant,
            "size_bytes": self.size_bytes,
            "params": self.params,
            "active_params": self.active_params,
            "weight_bytes_per_token": self.bytes_per_token,
            "backend": "CPU",
            "isa": lone_core::kernels::isa().name(),
            "mode": lone_core::kernels::mode().resolved(),
            "cache_type": crate::cmd::common::cache_type().name(),
            "cpu": self.cpu,
            "threads": self.threads,
        })
    }
}

pub fn fmt_bytes(b: u64) -> String {
    let g = b as f64 / (1u64 << 30) as f64;
    if g >= 1.0 {
        format!("{g:.2} GiB")
    } else if b >= 1 << 20 {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.2} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

pub fn fmt_params(p: u64) -> String {
    if p >= 1_000_000_000 {
        format!("{:.2} B", p as f64 / 1e9)
    } else {
        format!("{:.2} M", p as f64 / 1e6)
    }
}

/// llama.cpp's `llama_ftype` names (`general.file_type`).
pub fn ftype_name(t: u64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        _ => return None,
    })
}

/// A "2 threads"-free CPU name from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// One stored tensor.
pub struct TensorRow {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: u64,
    pub elements: u64,
}

/// Every tensor of the model's files, in file order (GGUF) or name order (safetensors).
pub fn tensor_table(model: &Model) -> Vec<TensorRow> {
    match &model.weights.files {
        WeightFiles::Gguf(g) => g
            .tensors
            .iter()
            .map(|t| TensorRow {
                name: t.name.clone(),
                dtype: t.dtype.name().to_string(),
                shape: t.shape.clone(),
                bytes: t.len as u64,
                elements: t.shape.iter().product::<usize>() as u64,
            })
            .collect(),
        WeightFiles::Safetensors(st) => {
            let mut names: Vec<&str> = st.names().collect();
            names.sort_unstable();
            names
                .into_iter()
                .filter_map(|n| st.get(n).map(|t| (n, t)))
                .map(|(n, t)| TensorRow {
                    name: n.to_string(),
                    dtype: t.dtype.name().to_string(),
                    shape: t.shape.clone(),
                    bytes: t.data().len() as u64,
                    elements: t.numel() as u64,
                })
                .collect()
        }
    }
}

/// Whether a tensor holds experts of a MoE layer (GGUF `ffn_*_exps`, HF `experts.*`).
fn is_expert_tensor(name: &str) -> bool {
    name.contains("_exps.") || name.contains(".experts.")
}

/// Sizes and labels from the weight files: every tensor's stored bytes and element count;
/// bytes read per decoded token = all tensors except the embedding table (one row is looked
/// up) plus the matrix the lm_head matmul reads (the embedding when tied; an F16/BF16
/// head's Q8_0 copy where decode reads that), of a MoE layer's experts only the share a
/// token chooses (`n_used / n_experts`: the active bytes).
pub fn model_info(model: &Model, path: &Path) -> Info {
    let tensors: Vec<(String, u64, u64, String)> = tensor_table(model)
        .into_iter()
        .map(|t| (t.name, t.bytes, t.elements, t.dtype))
        .collect();
    let (embed_name, head_name) = match &model.weights.files {
        WeightFiles::Gguf(_) => ("token_embd.weight", "output.weight"),
        WeightFiles::Safetensors(_) => ("model.embed_tokens.weight", "lm_head.weight"),
    };
    let quant_meta = match &model.weights.files {
        WeightFiles::Gguf(g) => g
            .meta("general.file_type")
            .and_then(|v| v.as_u64())
            .and_then(ftype_name)
            .map(str::to_string),
        WeightFiles::Safetensors(_) => None,
    };
    let bytes_of = |name: &str| {
        tensors
            .iter()
            .find(|t| t.0 == name)
            .map(|t| t.1)
            .unwrap_or(0)
    };
    let size_bytes: u64 = tensors.iter().map(|t| t.1).sum();
    let params: u64 = tensors.iter().map(|t| t.2).sum();
    let (embed, head) = (bytes_of(embed_name), bytes_of(head_name));
    let head_used = if head > 0 && !model.cfg.tie_embeddings {
        head
    } else {
        embed
    };
    // An F16/BF16 head is read at decode through its Q8_0 copy on x86 and ARM (default and fast mode).
    let head_used = model.decode_head_copy_bytes().unwrap_or(head_used);
    let mut bytes_per_token = size_bytes - embed - head + head_used;
    let mut active_params = params;
    if let Some(m) = model.cfg.moe() {
        let (eb, ep) = tensors
            .iter()
            .filter(|t| is_expert_tensor(&t.0))
            .fold((0u64, 0u64), |a, t| (a.0 + t.1, a.1 + t.2));
        let share = |x: u64| (x as u128 * m.n_used as u128 / m.n_experts as u128) as u64;
        bytes_per_token = bytes_per_token - eb + share(eb);
        active_params = params - ep + share(ep);
    }
    // Without a file type: the format holding the most bytes.
    let quant = quant_meta.unwrap_or_else(|| {
        let mut by: Vec<(String, u64)> = Vec::new();
        for t in &tensors {
            match by.iter_mut().find(|b| b.0 == t.3) {
                Some(b) => b.1 += t.1,
                None => by.push((t.3.clone(), t.1)),
            }
        }
        by.sort_by_key(|b| std::cmp::Reverse(b.1));
        by.first()
            .map(|b| b.0.to_uppercase())
            .unwrap_or_else(|| "?".into())
    });
    let arch = model.cfg.arch.name();
    let size_label = |params: u64| {
        if params >= 1_000_000_000 {
            format!("{:.1}B", params as f64 / 1e9)
        } else if params >= 10_000_000 {
            format!("{}M", (params as f64 / 1e6).round())
        } else {
            format!("{:.2}M", params as f64 / 1e6)
        }
    };
    // A MoE model as llama.cpp names it: total and active parameters (8.3B-A1.5B).
    let label = if active_params < params {
        format!("{}-A{}", size_label(params), size_label(active_params))
    } else {
        size_label(params)
    };
    Info {
        path: path.display().to_string(),
        name: format!("{arch} {label} {quant}"),
        arch,
        quant,
        size_bytes,
        params,
        active_params,
        bytes_per_token,
        cpu: cpu_model(),
        threads: lone_core::kernels::threads(),
    }
}

/// Read bandwidth in GB/s of `reps` passes summing a `mib` MiB buffer with `threads` threads
/// (after one untimed pass).
pub fn measure_membw(mib: usize, threads: usize, reps: usize) -> Vec<f64> {
    let n = mib * (1 << 20) / 8;
    let buf: Vec<u64> = (0..n as u64).collect();
    let chunk = n.div_ceil(threads.max(1));
    let pass = || -> f64 {
        let t = Instant::now();
        let s: u64 = std::thread::scope(|sc| {
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|c| sc.spawn(move || sum_u64(c)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(s);
        t.elapsed().as_secs_f64()
    };
    pass();
    let bytes = (n * 8) as f64;
    (0..reps).map(|_| bytes / pass() / 1e9).collect()
}

/// Sum with eight independent lanes so the compiler vectorises it and the loop is bound by
/// memory, not by the add chain.
fn sum_u64(s: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = s.chunks_exact(8);
    for c in &mut it {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(x);
        }
    }
    let rest = it.remainder().iter().fold(0u64, |a, &b| a.wrapping_add(b));
    acc.iter().fold(rest, |a, &b| a.wrapping_add(b))
}
