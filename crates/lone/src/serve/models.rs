//! The models one server serves: one (`--model A`, loaded at start, any `model` name answered
//! by it) or several (`--model A --model B …`, `--models-dir DIR`), where the request's `model`
//! selects, a model loads on first use, and the least recently used idle one is unloaded past
//! `--max-loaded N` or `--mem-budget GiB`. Each model has its own engine (slots, queue) and
//! metrics. A request for a model that is loading waits for it, up to `--load-timeout`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::metrics::Metrics;
use super::openai::ApiError;
use super::{load, Ready, ServeArgs};
use crate::cmd::model_info::file_bytes;

/// Where a model is.
#[derive(Clone)]
pub enum Status {
    Unloaded,
    Loading,
    Ready(Arc<Ready>),
    Failed(String),
}

impl Status {
    pub fn name(&self) -> &'static str {
        match self {
            Status::Unloaded => "unloaded",
            Status::Loading => "loading",
            Status::Ready(_) => "loaded",
            Status::Failed(_) => "failed",
        }
    }
}

/// One served model.
pub struct Entry {
    /// The id `/v1/models` reports and responses carry.
    pub id: String,
    /// Names accepted in a request's `model`.
    pub names: Vec<String>,
    pub path: PathBuf,
    /// It takes images: a vision-language checkpoint, or any model with `--mmproj`.
    pub vision: bool,
    /// This model's engine counters and gauges (its own slots, queue, tokens).
    pub metrics: Arc<Metrics>,
    status: Mutex<Status>,
    /// The registry's clock at the last request (least recently used goes first).
    last_used: AtomicU64,
    /// Host memory it takes when loaded (weights + a full cache per slot), estimated.
    bytes: AtomicU64,
}

impl Entry {
    pub fn status(&self) -> Status {
        self.status
            .lock()
            .map(|s| s.clone())
            .unwrap_or(Status::Failed("poisoned".into()))
    }

    fn set(&self, s: Status) {
        if let Ok(mut g) = self.status.lock() {
            *g = s;
        }
    }

    /// The loaded model, if it is.
    pub fn ready(&self) -> Option<Arc<Ready>> {
        match self.status() {
            Status::Ready(r) => Some(r),
            _ => None,
        }
    }
}

pub struct Registry {
    pub entries: Vec<Arc<Entry>>,
    /// One model: any name is answered by it (unless strict) and a failed load ends the server.
    pub single: bool,
    strict: bool,
    max_loaded: usize,
    mem_budget: Option<u64>,
    load_wait: Duration,
    args: ServeArgs,
    clock: AtomicU64,
    /// Held while statuses change hands (a request taking a model, an eviction).
    lock: Mutex<()>,
    /// One load at a time (memory, and the CPU it takes).
    loading: Mutex<()>,
}

/// The model files `--model` and `--models-dir` name, with their ids.
pub fn model_paths(a: &ServeArgs) -> Result<Vec<(String, PathBuf)>> {
    let mut paths = Vec::new();
    for m in &a.model {
        paths.push(super::common::local_model(m)?);
    }
    if let Some(dir) = &a.models_dir {
        let found = scan_dir(dir)?;
        if found.is_empty() {
            bail!(
                "--models-dir {} holds no model: expected .gguf files or Hugging Face checkpoint directories (with config.json)",
                dir.display()
            );
        }
        paths.extend(found);
    }
    if paths.is_empty() {
        paths.push(super::common::resolve_model(None)?);
    }
    if paths.len() > 1 && a.alias.is_some() {
        bail!("--alias names the one model served; with several, each is known by its file or directory name");
    }
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for p in paths {
        let id = match (&a.alias, out.is_empty()) {
            (Some(alias), true) => alias.clone(),
            _ => file_name(&p),
        };
        if let Some((_, other)) = out.iter().find(|(i, _)| *i == id) {
            bail!(
                "two models would both be called '{id}': {} and {}; rename one",
                other.display(),
                p.display()
            );
        }
        out.push((id, p));
    }
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// The models in a directory: `*.gguf` files and checkpoint directories, sorted by name.
fn scan_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list --models-dir {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            if p.is_dir() {
                p.join("config.json").is_file()
            } else {
                p.is_file()
                    && p.extension()
                        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                    && !file_name(p).contains(".imatrix.")
                    && !crate::hub::is_projector(&file_name(p))
            }
        })
        .collect();
    found.sort();
    Ok(found)
}

impl Registry {
    pub fn new(a: &ServeArgs, models: Vec<(String, PathBuf)>) -> Result<Registry> {
        let single = models.len() == 1;
        let entries = models
            .into_iter()
            .map(|(id, path)| {
                let mut names = vec![id.clone(), file_name(&path)];
                if let Some(stem) = path.file_stem() {
                    names.push(stem.to_string_lossy().into_owned());
                }
                names.dedup();
                Arc::new(Entry {
                    // Until it is loaded: its files' size.
                    bytes: AtomicU64::new(file_bytes(&path)),
                    vision: a.vision.path_for(&path).is_some()
                        || lone_core::vision::takes_images(&path),
                    id,
                    names,
                    path,
                    metrics: Arc::new(Metrics::default()),
                    status: Mutex::new(Status::Unloaded),
                    last_used: AtomicU64::new(0),
                })
            })
            .collect();
        if a.max_loaded == 0 {
            bail!("--max-loaded must be at least 1");
        }
        let mem_budget = match a.mem_budget {
            None => None,
            Some(g) if g.is_finite() && g > 0.0 && g < 1e6 => {
                Some((g * (1u64 << 30) as f64) as u64)
            }
            Some(g) => bail!("--mem-budget must be a positive number of GiB, not {g}"),
        };
        let load_wait = match a.load_timeout {
            Some(s) => super::seconds("--load-timeout", s)?,
            // One model: llama-server's habit, 503 while it loads (a balancer keeps the replica
            // out meanwhile). Several: a request waits for the model it asked for.
            None if single => Duration::ZERO,
            None => Duration::from_secs(300),
        };
        Ok(Registry {
            entries,
            single,
            strict: a.strict_model_name,
            max_loaded: a.max_loaded,
            mem_budget,
            load_wait,
            args: a.clone(),
            clock: AtomicU64::new(1),
            lock: Mutex::new(()),
            loading: Mutex::new(()),
        })
    }

    /// The model a request's `model` names: an exact name; with one model, any name (unless
    /// `--strict-model-name`); without a name, the first model.
    pub fn find(&self, name: Option<&str>) -> Result<&Arc<Entry>, ApiError> {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return Ok(&self.entries[0]);
        };
        // ollama's clients add a `:latest` tag.
        let bare = name.strip_suffix(":latest").unwrap_or(name);
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.names.iter().any(|n| n == name || n == bare))
        {
            return Ok(e);
        }
        if self.single && !self.strict {
            return Ok(&self.entries[0]);
        }
        let known: Vec<&str> = self.entries.iter().map(|e| e.id.as_str()).collect();
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "The model '{name}' does not exist; this server has: {}",
                known.join(", ")
            ),
        )
        .param("model")
        .code("model_not_found"))
    }

    /// The loaded model a request names, loading it first if need be (waits up to
    /// `--load-timeout`; then 503 with Retry-After).
    pub async fn get(self: &Arc<Self>, name: Option<&str>) -> Result<Arc<Ready>, ApiError> {
        let entry = self.find(name)?.clone();
        let deadline = Instant::now() + self.load_wait;
        loop {
            let status = {
                let _g = self.lock.lock().map_err(|_| internal())?;
                let s = entry.status();
                if let Status::Ready(_) = &s {
                    entry
                        .last_used
                        .store(self.clock.fetch_add(1, Relaxed), Relaxed);
                }
                if let Status::Unloaded = &s {
                    entry.set(Status::Loading);
                    self.spawn_load(entry.clone());
                }
                s
            };
            match status {
                Status::Ready(r) => return Ok(r),
                Status::Failed(msg) => {
                    return Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        format!("The model '{}' failed to load: {msg}", entry.id),
                    )
                    .code("model_load_failed"))
                }
                Status::Loading | Status::Unloaded => {}
            }
            if Instant::now() >= deadline {
                let mut e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable_error",
                    format!("The model '{}' is loading; retry shortly.", entry.id),
                )
                .code("model_loading");
                e.retry_after = Some(1);
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Start loading `entry` (at start with one model).
    pub fn start_load(self: &Arc<Self>, entry: &Arc<Entry>) {
        entry.set(Status::Loading);
        self.spawn_load(entry.clone());
    }

    fn spawn_load(self: &Arc<Self>, entry: Arc<Entry>) {
        let reg = self.clone();
        let spawned = std::thread::Builder::new()
            .name("lone-load".into())
            .spawn(move || reg.load(&entry));
        if let Err(e) = spawned {
            eprintln!("error: cannot start a loading thread: {e}");
        }
    }

    fn load(&self, entry: &Arc<Entry>) {
        let _one = self.loading.lock();
        // Test hook: hold the model in the "loading" state for a while.
        if let Some(ms) = std::env::var("LONE_SERVE_TEST_LOAD_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
        self.make_room(entry);
        let t0 = Instant::now();
        match load(&self.args, &entry.id, &entry.path, &entry.metrics) {
            Ok(r) => {
                entry.bytes.store(r.mem_bytes, Relaxed);
                eprintln!(
                    "lone serve: model {} ready in {:.1} s ({} slots, context {}, queue {})",
                    entry.id,
                    t0.elapsed().as_secs_f64(),
                    r.engine.cfg.parallel,
                    r.ctx,
                    r.engine.cfg.queue
                );
                let _g = self.lock.lock();
                entry
                    .last_used
                    .store(self.clock.fetch_add(1, Relaxed), Relaxed);
                entry.set(Status::Ready(Arc::new(r)));
            }
            Err(e) => {
                eprintln!("error: model {}: {e:#}", entry.id);
                if self.single {
                    std::process::exit(1);
                }
                entry.set(Status::Failed(format!("{e:#}")));
            }
        }
    }

    /// Unload least recently used idle models until `entry` fits `--max-loaded` and
    /// `--mem-budget`. A model with requests in flight stays (the limits are then exceeded
    /// until it is idle, and a line says so).
    fn make_room(&self, entry: &Arc<Entry>) {
        let mut dropped = Vec::new();
        {
            let Ok(_g) = self.lock.lock() else { return };
            loop {
                let loaded: Vec<(&Arc<Entry>, Arc<Ready>)> = self
                    .entries
                    .iter()
                    .filter(|e| !Arc::ptr_eq(e, entry))
                    .filter_map(|e| e.ready().map(|r| (e, r)))
                    .collect();
                let used: u64 = loaded.iter().map(|(e, _)| e.bytes.load(Relaxed)).sum();
                let want = entry.bytes.load(Relaxed);
                let over_count = loaded.len() >= self.max_loaded;
                let over_mem = self
                    .mem_budget
                    .is_some_and(|b| !loaded.is_empty() && used.saturating_add(want) > b);
                if !over_count && !over_mem {
                    break;
                }
                // Idle: nobody holds it but the registry (and this loop's copy), and its
                // engine has nothing queued or running.
                let victim = loaded
                    .iter()
                    .filter(|(_, r)| Arc::strong_count(r) == 2 && r.engine.is_idle())
                    .min_by_key(|(e, _)| e.last_used.load(Relaxed));
                let Some((v, _)) = victim else {
                    eprintln!(
                        "lone serve: warning: loading {} goes past --max-loaded/--mem-budget: every loaded model is busy",
                        entry.id
                    );
                    break;
                };
                let v = (*v).clone();
                drop(loaded);
                if let Some(r) = v.ready() {
                    dropped.push((v.id.clone(), r));
                }
                v.set(Status::Unloaded);
                v.metrics.active_slots.store(0, Relaxed);
            }
        }
        // Outside the lock: dropping the last handle stops the engine thread and frees memory.
        for (id, r) in dropped {
            drop(r);
            eprintln!(
                "lone serve: unloaded {id} (least recently used) to load {}",
                entry.id
            );
        }
    }

    /// Every model and where it is, for `/v1/models`, `/health` and `/api/tags`.
    pub fn states(&self) -> Vec<(Arc<Entry>, Status)> {
        self.entries
            .iter()
            .map(|e| (e.clone(), e.status()))
            .collect()
    }

    /// `/health`: with one model, 503 until it is loaded (a balancer keeps this replica out);
    /// with several, the server is up once it listens and each model's state is listed.
    pub fn health(&self) -> (StatusCode, Value) {
        if self.single {
            return match self.entries[0].status() {
                Status::Ready(_) => (StatusCode::OK, json!({"status": "ok"})),
                _ => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({"status": "loading"}),
                ),
            };
        }
        let models: serde_json::Map<String, Value> = self
            .states()
            .iter()
            .map(|(e, s)| (e.id.clone(), json!(s.name())))
            .collect();
        (StatusCode::OK, json!({"status": "ok", "models": models}))
    }

    /// Stop every engine (SIGTERM).
    pub fn shutdown(&self) {
        for e in &self.entries {
            if let Some(r) = e.ready() {
                r.engine.shutdown();
            }
        }
    }
}

fn internal() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "the model registry is unavailable",
    )
}
