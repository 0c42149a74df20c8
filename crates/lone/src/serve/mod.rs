//! `lone serve`: an OpenAI-compatible HTTP server (axum) in front of the batching engine.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (SSE with `stream: true`),
//! `GET /v1/models`, `GET /health`, `GET /metrics`. The model loads in the background after
//! the port is bound; until then `/health` answers 503 `{"status": "loading"}`.

mod anthropic;
mod embeddings;
pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
mod images;
pub mod local;
pub mod log;
pub mod metrics;
mod models;
mod ollama;
pub mod openai;
pub mod request;
pub mod tools;
mod transport;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use lone_core::text::TextIo;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use self::engine::{Engine, EngineConfig, Event, GenRequest, SubmitError};
use self::metrics::Metrics;
use self::openai::{ApiError, ChoiceAcc, Chunker, Kind, Meta, Prompt};
use crate::cmd::{common, model_info};

/// Largest request body.
pub const BODY_LIMIT: usize = 2 << 20;
/// The body limit of a server whose models take images (a phone photo is 3–8 MB, a third
/// more in base64).
pub const IMAGE_BODY_LIMIT: usize = 32 << 20;
/// Default context cap when `--ctx` is not given.
pub const DEFAULT_CTX_CAP: usize = 4096;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// HF checkpoint directory or GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the setup
    /// step). Repeat it to serve several models: the request's `model` selects one.
    #[arg(long, short)]
    pub model: Vec<PathBuf>,
    /// Serve every model in DIR (its `.gguf` files and checkpoint directories), each loaded on
    /// first use.
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// With several models: how many may be loaded at once; past it the least recently used
    /// idle one is unloaded.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_loaded: usize,
    /// With several models: host memory (GiB) the loaded ones may take (weights + KV caches,
    /// estimated); past it the least recently used idle one is unloaded. Default: no limit.
    #[arg(long, value_name = "GiB")]
    pub mem_budget: Option<f64>,
    /// Seconds a request waits for its model to load before a 503 (default: 0 with one model,
    /// as llama-server answers 503 while loading; 300 with several).
    #[arg(long, value_name = "SECS")]
    pub load_timeout: Option<f64>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded together (slots, each with its own cache).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Context length per sequence (prompt + completion); default: the model's
    /// max_position_embeddings capped at 4096.
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Require `Authorization: Bearer KEY` on /v1/* requests.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Worker threads for the matrix kernels (default: the CPU's cores).
    #[arg(long, short)]
    pub threads: Option<usize>,
    /// Sequences that may wait for a slot; beyond that requests get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Model id reported by /v1/models and accepted in `model` (default: the file or directory name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Host memory (MiB) for snapshots of finished prompts and replies, so conversations that
    /// lost their slot resume without prefilling again (LRU; 0 = off, -1 = no limit).
    #[arg(
        long,
        default_value_t = 8192,
        allow_negative_numbers = true,
        value_name = "MiB"
    )]
    pub cache_ram: i64,
    /// Request log lines on stderr: text, json, or off.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: log::LogFormat,
    /// Put the prompt text in the request log lines (off by default: prompts can be private).
    #[arg(long)]
    pub log_prompts: bool,
    /// Also log one line per scheduler step: decode and prompt rows, drafts accepted, tokens
    /// generated, forward-pass time, active slots and queue depth.
    #[arg(long, short)]
    pub verbose: bool,
    /// Answer 404 for a `model` that is not this server's (default: any name is answered by
    /// the one model served, as llama-server does).
    #[arg(long)]
    pub strict_model_name: bool,
    /// Chat template (Jinja) to use instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// The vision side of a GGUF model: requests may then carry images.
    #[command(flatten)]
    pub vision: crate::cmd::common::MmprojArgs,
    /// Fetch `http(s)` image URLs in requests (at most 20 MiB each, 10 s), as OpenAI's API
    /// does; off by default, since the server would then reach any address a client names.
    #[arg(long)]
    pub allow_image_urls: bool,
    /// Seconds a request body may take to arrive (llama-server's read timeout); then 408.
    #[arg(
        long,
        visible_alias = "to",
        default_value_t = 60.0,
        value_name = "SECS"
    )]
    pub timeout: f64,
    /// Seconds a request's headers may take to arrive, and a kept-alive connection may wait
    /// idle for its next request; then the connection is closed.
    #[arg(long, default_value_t = 15.0, value_name = "SECS")]
    pub header_timeout: f64,
    /// Open connections at most; past it a new connection gets one 503 and is closed.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    #[command(flatten)]
    pub spec: crate::cmd::common::SpecArgs,
    /// The model's numeric mode, when the embedding program sets one per model (the Python
    /// and C APIs); else the process-wide one (`--exact`, `--fast`).
    #[arg(skip)]
    pub mode: Option<lone_core::kernels::Mode>,
    /// The model's cache type, when the embedding program sets one per model; else the
    /// process-wide `--cache-type`.
    #[arg(skip)]
    pub cache_type: Option<lone_core::cache::KvType>,
}

pub struct Ready {
    /// The id responses carry, and the model's path.
    id: String,
    path: PathBuf,
    engine: Engine,
    text: Arc<TextIo>,
    ctx: usize,
    vocab: usize,
    /// The server-wide speculation settings (requests may override them as llama-server's
    /// `speculative.*` fields do).
    spec_default: lone_core::engine::SpecParams,
    has_draft: bool,
    tools: tools::ToolSupport,
    /// What /api/tags and /api/show report.
    arch: &'static str,
    quant: String,
    params: u64,
    params_label: String,
    /// Embedding width.
    hidden: usize,
    /// The model takes images (it has a vision tower).
    vision: bool,
    /// `--allow-image-urls`: fetch `http(s)` image URLs.
    image_urls: bool,
    /// Host memory it takes with every slot's cache full (weights + caches), for
    /// `--mem-budget`.
    mem_bytes: u64,
}

struct AppState {
    models: Arc<models::Registry>,
    created: u64,
    /// Server-wide counters (requests by endpoint and status); each model has its own engine
    /// metrics in its registry entry.
    metrics: Arc<Metrics>,
    api_key: Option<String>,
    log: log::LogConfig,
}

impl AppState {
    /// The loaded model a request names (its `model` field), loading it if need be.
    async fn model(&self, v: &Value) -> Result<Arc<Ready>, ApiError> {
        self.models
            .get(v.get("model").and_then(Value::as_str))
            .await
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn run(a: ServeArgs) -> Result<()> {
    let (state, rt) = prepare(&a)?;
    rt.block_on(async {
        let listener = bind(&a).await?;
        let stop = shutdown_signal(state.clone());
        serve_on(a, state, listener, stop).await
    })
}

/// The server's state and async runtime for `a`, its flags checked.
fn prepare(a: &ServeArgs) -> Result<(Arc<AppState>, tokio::runtime::Runtime)> {
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if a.ctx == Some(0) {
        bail!("--ctx must be at least 1");
    }
    if a.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let registry = Arc::new(models::Registry::new(a, models::model_paths(a)?)?);
    let state = Arc::new(AppState {
        models: registry,
        created: now(),
        metrics: Arc::new(Metrics::default()),
        api_key: a.api_key.clone(),
        log: log::LogConfig {
            format: a.log_format,
            prompts: a.log_prompts,
        },
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    Ok((state, rt))
}

async fn bind(a: &ServeArgs) -> Result<tokio::net::TcpListener> {
    let addr: SocketAddr = tokio::net::lookup_host((a.host.as_str(), a.port))
        .await
        .with_context(|| format!("cannot resolve --host {}", a.host))?
        .next()
        .with_context(|| format!("no address for --host {}", a.host))?;
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// A server running on a thread of this process (the Python API's `lone.serve`): it stops
/// when [`Background::stop`] is called or it is dropped.
pub struct Background {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Background {
    /// Bind `a`'s address (port 0: any free port), then serve on a new thread.
    pub fn start(a: ServeArgs) -> Result<Background> {
        let (state, rt) = prepare(&a)?;
        let listener = rt.block_on(bind(&a))?;
        let addr = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lone-serve".into())
            .spawn(move || {
                rt.block_on(serve_on(a, state, listener, async {
                    let _ = rx.await;
                }))
            })
            .context("cannot start the server thread")?;
        Ok(Background {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop serving (open connections get 2 s to finish) and unload the models.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the server thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

async fn serve_on(
    a: ServeArgs,
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let reg = &state.models;
    if reg.single {
        eprintln!(
            "lone serve: listening on http://{} (loading {})",
            listener.local_addr()?,
            reg.entries[0].path.display()
        );
        // Load in the background: /health says "loading" until this is done.
        reg.start_load(&reg.entries[0]);
    } else {
        eprintln!(
            "lone serve: listening on http://{} ({} models, each loaded on first use, at most {} at once: {})",
            listener.local_addr()?,
            reg.entries.len(),
            a.max_loaded,
            reg.entries
                .iter()
                .map(|e| e.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    let limits = transport::Limits {
        header_timeout: seconds("--header-timeout", a.header_timeout)?,
        body_timeout: seconds("--timeout", a.timeout)?,
        body_limit: if reg.entries.iter().any(|e| e.vision) {
            IMAGE_BODY_LIMIT
        } else {
            BODY_LIMIT
        },
        max_connections: a.max_connections,
    };
    if limits.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let app = router(state.clone(), limits);
    transport::serve(listener, app, limits, stop).await;
    state.models.shutdown();
    eprintln!("lone serve: stopped");
    Ok(())
}

fn load(a: &ServeArgs, id: &str, path: &std::path::Path, metrics: &Arc<Metrics>) -> Result<Ready> {
    let mut model = common::load_model(path, a.threads)?;
    a.vision.load(&mut model, path)?;
    if let Some(t) = a.cache_type {
        model.set_kv_type(t)?;
    }
    if a.mode.is_some() {
        model.compute.mode = a.mode;
    }
    let (kv_per_token, kv_fixed) = model_info::cache_bytes(&model, model.kv_type);
    let mut text = TextIo::load(&model, path).context("cannot load the tokenizer")?;
    if let Some(f) = &a.chat_template_file {
        let src = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the chat template {}", f.display()))?;
        let vars = text.tokenizer.special_tokens().template_vars();
        text.set_template(
            lone_core::tokenizer::ChatTemplate::with_special_tokens(&src, &vars)
                .with_context(|| format!("bad chat template {}", f.display()))?,
        );
    }
    let max_pos = model.cfg.max_position_embeddings;
    let ctx = match a.ctx {
        Some(c) if c > max_pos => {
            bail!("--ctx {c} is larger than the model's context ({max_pos} positions)")
        }
        Some(c) => c,
        None => max_pos.min(DEFAULT_CTX_CAP),
    };
    if ctx < 2 {
        bail!("the context must hold at least 2 positions");
    }
    let vocab = model.cfg.vocab_size;
    let hidden = model.cfg.hidden_size;
    let vision = model.vision.is_some();
    let text = Arc::new(text);
    let cfg = EngineConfig {
        parallel: a.parallel,
        queue: a.queue,
        ctx,
        cache_ram: match a.cache_ram {
            n if n < 0 => usize::MAX,
            n => (n as usize).saturating_mul(1 << 20),
        },
        step_log: a.verbose.then_some(log::LogConfig {
            format: a.log_format,
            prompts: false,
        }),
    };
    let spec = a.spec.build(&model, &text)?;
    let spec_default = spec.as_ref().map(|s| s.params.clone()).unwrap_or_default();
    let has_draft = spec.as_ref().is_some_and(|s| s.draft_model().is_some());
    let tools = tools::ToolSupport::new(&text, vocab);
    let info = model_info::model_info(&model, path);
    let slot_bytes = kv_fixed.saturating_add(kv_per_token.saturating_mul(ctx as u64));
    let mem_bytes = info
        .size_bytes
        .saturating_add(slot_bytes.saturating_mul(a.parallel as u64));
    let params_label = if info.params >= 1_000_000_000 {
        format!("{:.1}B", info.params as f64 / 1e9)
    } else {
        format!("{:.0}M", info.params as f64 / 1e6)
    };
    let engine = Engine::start(model, text.clone(), cfg, metrics.clone(), spec)
        .context("cannot start the engine thread")?;
    Ok(Ready {
        id: id.to_string(),
        path: path.to_path_buf(),
        mem_bytes,
        engine,
        text,
        ctx,
        vocab,
        spec_default,
        has_draft,
        tools,
        arch: info.arch,
        quant: info.quant,
        params: info.params,
        params_label,
        hidden,
        vision,
        image_urls: a.allow_image_urls,
    })
}

async fn shutdown_signal(state: Arc<AppState>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("lone serve: shutting down");
    // Running streams end (with an error event) so connections can close; the transport
    // drains for 2 s, and this gives up after 3.
    std::thread::spawn(move || {
        state.models.shutdown();
        std::thread::sleep(Duration::from_secs(3));
        std::process::exit(0);
    });
}

/// A positive, finite number of seconds.
fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
        bail!("{flag} must be a number of seconds in (0, 86400], not {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

fn router(state: Arc<AppState>, limits: transport::Limits) -> Router {
    Router::new()
        .route("/", get(web_chat))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/apply-template", post(apply_template))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/props", get(props))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/version", get(ollama::version))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(limits, transport::read_body))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(limits.body_limit))
        .with_state(state)
}

const ENDPOINTS: [&str; 6] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/v1/health",
    "/metrics",
];

async fn count_requests(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let endpoint = if path.starts_with("/v1/models/") {
        "/v1/models"
    } else {
        ENDPOINTS
            .iter()
            .find(|&&e| e == path)
            .copied()
            .unwrap_or("other")
    };
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    st.metrics.record_request(endpoint, status);
    if status >= 400 {
        st.log
            .line("request", json!({"endpoint": path, "status": status}));
    }
    resp
}

/// Compare a given key with the server's in time that does not depend on where they differ.
fn same_secret(given: &str, key: &str) -> bool {
    let (a, b) = (given.as_bytes(), key.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(diff) == 0
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        // The chat page itself is open; it sends the key it is given with its API calls.
        let open = matches!(
            req.uri().path(),
            "/" | "/health" | "/v1/health" | "/metrics"
        );
        if !open {
            let h = req.headers();
            let bearer = h
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            // Anthropic's clients send `x-api-key`.
            let x_key = h
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim);
            let ok = |g: Option<&str>| g.is_some_and(|g| same_secret(g, key));
            if !ok(bearer) && !ok(x_key) {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    "Incorrect API key provided. Pass it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY').",
                )
                .code("invalid_api_key")
                .into_response();
            }
        }
    }
    next.run(req).await
}

/// The web chat page (one file compiled in: no CDN, works offline).
async fn web_chat() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("web/index.html"),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "Unknown endpoint: see /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics",
    )
    .code("unknown_url")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "Method not allowed for this endpoint",
    )
    .code("method_not_allowed")
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let (code, v) = st.models.health();
    (code, Json(v)).into_response()
}

/// A model as `/v1/models` lists it, with llama-server's router `status`.
fn model_object(st: &AppState, e: &models::Entry, status: &models::Status) -> Value {
    let mut caps = vec!["completion"];
    if e.vision {
        caps.push("vision");
    }
    json!({
        "id": e.id, "object": "model", "created": st.created, "owned_by": "lone",
        "status": {"value": status.name()}, "capabilities": caps,
    })
}

async fn list_models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = st
        .models
        .states()
        .iter()
        .map(|(e, s)| model_object(&st, e, s))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`; an id that is not UTF-8 once percent-decoded is a 400 in OpenAI's
/// error shape, as every other bad request.
async fn get_model(
    State(st): State<Arc<AppState>>,
    id: Result<UrlPath<String>, PathRejection>,
) -> Response {
    let UrlPath(id) = match id {
        Ok(id) => id,
        Err(e) => {
            let msg = format!(
                "{}: the model id must be percent-encoded UTF-8",
                e.body_text()
            );
            return ApiError::invalid("model", msg).into_response();
        }
    };
    match st.models.find(Some(&id)) {
        Ok(e) => Json(model_object(&st, e, &e.status())).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    let reg = &st.models;
    let models: Vec<(&str, &Metrics)> = reg
        .entries
        .iter()
        .map(|e| (e.id.as_str(), &*e.metrics))
        .collect();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&st.metrics, &models, !reg.single),
    )
        .into_response()
}

fn body_json(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let body =
        body.map_err(|e| ApiError::new(e.status(), "invalid_request_error", e.body_text()))?;
    openai::parse_body(&body)
}

#[derive(serde::Deserialize)]
struct TokenizeFields {
    content: String,
    add_special: Option<bool>,
    with_pieces: Option<bool>,
}

/// llama-server's `POST /tokenize`: `{"content", "add_special", "with_pieces"}` →
/// `{"tokens": [ids]}` or `{"tokens": [{"id", "piece"}]}` (a piece that is not whole UTF-8 is
/// its byte values, as llama-server gives it).
async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async || -> Result<Value, ApiError> {
        let v = body_json(body)?;
        let ready = st.model(&v).await?;
        let f: TokenizeFields = openai::fields(&v)?;
        let tok = &ready.text.tokenizer;
        let ids =
            tokio::task::block_in_place(|| tok.encode(&f.content, f.add_special.unwrap_or(false)))
                .map_err(|e| bad_request("content", format!("cannot tokenize: {e}")))?;
        let tokens: Vec<Value> = if f.with_pieces.unwrap_or(false) {
            ids.iter()
                .map(|&id| {
                    let b = tok.token_bytes(id);
                    let piece = match String::from_utf8(b.clone()) {
                        Ok(s) => json!(s),
                        Err(_) => json!(b),
                    };
                    json!({"id": id, "piece": piece})
                })
                .collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok(json!({ "tokens": tokens }))
    };
    run()
        .await
        .map(|v| Json(v).into_response())
        .unwrap_or_else(IntoResponse::into_response)
}

#[derive(serde::Deserialize)]
struct DetokenizeFields {
    tokens: Vec<u32>,
}

/// llama-server's `POST /detokenize`: `{"tokens": [ids]}` → `{"content": text}`.
async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async || -> Result<Value, ApiError> {
        let v = body_json(body)?;
        let ready = st.model(&v).await?;
        let f: DetokenizeFields = openai::fields(&v)?;
        let content = ready
            .text
            .tokenizer
            .decode(&f.tokens, false)
            .map_err(|e| bad_request("tokens", e.to_string()))?;
        Ok(json!({ "content": content }))
    };
    run()
        .await
        .map(|v| Json(v).into_response())
        .unwrap_or_else(IntoResponse::into_response)
}

/// llama-server's `GET /props` (`?model=` picks one of several): the server's settings.
async fn props(
    State(st): State<Arc<AppState>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let ready = match st.models.get(q.get("model").map(String::as_str)).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let tok = &ready.text.tokenizer;
    let piece = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).unwrap_or_default();
    Json(json!({
        "default_generation_settings": {
            "n_ctx": ready.ctx,
            "params": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "n_predict": -1},
            "model": ready.id,
        },
        "total_slots": ready.engine.cfg.parallel,
        "model_alias": ready.id,
        "model_path": ready.path.display().to_string(),
        "chat_template": ready.text.template.as_ref().map(|t| t.source()).unwrap_or(""),
        "bos_token": piece(tok.bos_id()),
        "eos_token": piece(ready.text.eos_ids.first().copied()),
        "modalities": {"vision": false, "audio": false},
        "build_info": openai::SYSTEM_FINGERPRINT,
        "is_sleeping": false,
    }))
    .into_response()
}

/// llama-server's `POST /apply-template`: the prompt a chat request would be rendered to
/// (`{"prompt": …}`), tools and tool calls included.
async fn apply_template(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async || -> Result<Value, ApiError> {
        let v = body_json(body)?;
        let ready = st.model(&v).await?;
        let req = request::GenerationRequest::chat_prompt(&v)?;
        let (msgs, plan) = chat_messages(&ready, &req)?;
        Ok(json!({ "prompt": render_chat(&ready, &msgs, &plan)? }))
    };
    match run().await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The prompt text `msgs` render to with the request's tools (off the async workers:
/// templates can take a while on big inputs).
fn render_chat(ready: &Ready, msgs: &[Value], plan: &tools::ChatPlan) -> Result<String, ApiError> {
    tokio::task::block_in_place(|| {
        ready
            .text
            .render_chat_tools(msgs, true, plan.template_tools.as_ref())
    })
    .map_err(|e| bad_request("messages", format!("cannot apply the chat template: {e}")))
}

/// A chat request's messages as the template gets them, and what its tools ask for.
/// The messages as the template gets them (tools and tool calls written in) and the plan
/// for the reply (tool calls, grammar, reasoning), for the request's model.
fn chat_messages(
    ready: &Ready,
    req: &request::GenerationRequest,
) -> Result<(Vec<Value>, tools::ChatPlan), ApiError> {
    let plan = tokio::task::block_in_place(|| tools::plan(&ready.tools, &req.tools))?;
    let msgs = tools::template_messages(&ready.tools, req.messages().to_vec(), &plan);
    Ok((msgs, plan))
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(st, body, Kind::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(st, body, Kind::Completion)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn bad_request(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", msg).param(param)
}

/// Requests are ids from a counter plus the start time: unique within a server run.
fn request_id(kind: Kind) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    format!("{prefix}-{:x}{n:06x}", now())
}

async fn handle(
    st: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<Response, ApiError> {
    let t0 = std::time::Instant::now();
    let body = body.map_err(|e| {
        let status = e.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request_too_large"
        } else {
            "invalid_body"
        };
        ApiError::new(status, "invalid_request_error", e.body_text()).code(code)
    })?;
    let v = openai::parse_body(&body)?;
    let endpoint = match kind {
        Kind::Chat => "/v1/chat/completions",
        Kind::Completion => "/v1/completions",
    };
    let ready = st.model(&v).await?;
    let req = request::GenerationRequest::from_openai(&v, kind)?;
    let Started {
        meta,
        stream,
        mut rx,
        mut log,
    } = start(&st.log, &ready, &req, endpoint, t0)?;
    if stream {
        return Ok(stream_response(meta, ready.text.clone(), rx, log));
    }
    let acc = collect(&mut rx, &mut log, meta.choices).await?;
    let resp = openai::full_response(&meta, &ready.text, &acc);
    log.done(resp["choices"].as_array().map(|cs| {
        cs.iter()
            .map(|c| finish_name(&c["finish_reason"]))
            .collect()
    }));
    Ok(Json(resp).into_response())
}

/// A generation request handed to the engine: what the response needs and its events.
struct Started {
    pub meta: Meta,
    pub stream: bool,
    pub rx: mpsc::UnboundedReceiver<Event>,
    pub log: log::RequestLog,
}

/// Check a request against its model and submit its sequences.
fn start(
    log_cfg: &log::LogConfig,
    ready: &Ready,
    req: &request::GenerationRequest,
    endpoint: &'static str,
    t0: std::time::Instant,
) -> Result<Started, ApiError> {
    use request::Input;
    let kind = req.kind;
    let mut prompt_log: Option<String> = None;
    let common = &req.common;
    let settings = common.settings(ready.vocab)?;
    let spec = common.spec_params(&ready.spec_default, ready.has_draft)?;
    let text = &ready.text;

    // Prompts (several for a completions list) and logprobs; chat: the messages as the
    // template gets them; both: the grammar the output follows.
    let mut embeds = None;
    let mut image_info = None;
    let (prompts, logprobs, plan): (Vec<Vec<u32>>, Option<usize>, tools::ChatPlan) = match &req
        .input
    {
        Input::Chat {
            images, logprobs, ..
        } => {
            let (msgs, mut plan) = chat_messages(ready, req)?;
            let images = images::decode_all(ready, images)?;
            let prompt_text = render_chat(ready, &msgs, &plan)?;
            let ids = if images.is_empty() {
                tokio::task::block_in_place(|| text.tokenizer.encode(&prompt_text, false)).map_err(
                    |e| bad_request("messages", format!("cannot apply the chat template: {e}")),
                )?
            } else {
                let p = images::prompt(ready, &prompt_text, images)?;
                embeds = Some(Arc::new(p.embeds));
                image_info = Some((p.images.len(), p.reused, p.encode_time));
                p.ids
            };
            if log_cfg.prompts {
                prompt_log = Some(prompt_text.clone());
            }
            // A template that opens the reasoning block (`<think>` at the end of the
            // prompt): the reply starts inside it.
            plan.reply.starts_thinking = prompt_text.trim_end().ends_with("<think>");
            (vec![ids], *logprobs, plan)
        }
        Input::Completion { prompt, logprobs } => {
            let plan = tokio::task::block_in_place(|| tools::plan(&ready.tools, &req.tools))?;
            if plan.template_tools.is_some() {
                return Err(bad_request("tools", "'tools' are for /v1/chat/completions"));
            }
            let encode = |s: &str| {
                tokio::task::block_in_place(|| text.encode_raw(s))
                    .map_err(|e| bad_request("prompt", format!("cannot tokenize the prompt: {e}")))
            };
            let prompts = match prompt {
                Prompt::Text(s) => {
                    if log_cfg.prompts {
                        prompt_log = Some(s.clone());
                    }
                    vec![encode(s)?]
                }
                Prompt::Texts(v) => v.iter().map(|s| encode(s)).collect::<Result<_, _>>()?,
                Prompt::Ids(ids) => vec![ids.clone()],
                Prompt::IdLists(l) => l.clone(),
            };
            (prompts, *logprobs, plan)
        }
    };
    if prompts.is_empty() {
        return Err(openai::ApiError::invalid(
            "prompt",
            "the prompt list is empty",
        ));
    }
    let param = if kind == Kind::Chat {
        "messages"
    } else {
        "prompt"
    };
    for p in &prompts {
        if p.is_empty() {
            return Err(openai::ApiError::invalid(
                param,
                "the prompt is empty (0 tokens)",
            ));
        }
        if let Some(&bad) = p.iter().find(|&&t| t as usize >= ready.vocab) {
            return Err(openai::ApiError::invalid(
                param,
                format!(
                    "token id {bad} is out of the vocabulary (size {})",
                    ready.vocab
                ),
            ));
        }
    }
    if prompts.len() * settings.n > openai::MAX_N as usize {
        return Err(openai::ApiError::invalid(
            "n",
            format!(
                "at most {} choices (prompts x n) per request",
                openai::MAX_N
            ),
        ));
    }

    // Context: prompt + max_tokens must fit (OpenAI's rule); without max_tokens, generate
    // until the context is full.
    let ctx = ready.ctx;
    let mut reqs = Vec::new();
    for (pi, p) in prompts.iter().enumerate() {
        let room = ctx.saturating_sub(p.len());
        let max_tokens = match settings.max_tokens {
            Some(m) if m > room || room == 0 => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!(
                        "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({} in the {param}, {m} in the completion). Please reduce the length of the {param} or completion.",
                        p.len().saturating_add(m),
                        p.len()
                    ),
                )
                .param(param)
                .code("context_length_exceeded"))
            }
            Some(m) => m,
            None if room == 0 => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!(
                        "This model's maximum context length is {ctx} tokens. However, your {param} has {} tokens. Please reduce the length of the {param}.",
                        p.len()
                    ),
                )
                .param(param)
                .code("context_length_exceeded"))
            }
            None => room,
        };
        for j in 0..settings.n {
            let index = pi * settings.n + j;
            let mut params = settings.params.clone();
            // Each choice is its own sequence: with a seed, choice j uses seed + j.
            params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
            reqs.push(GenRequest {
                prompt: p.clone(),
                max_tokens,
                params,
                stop: settings.stop.clone(),
                ignore_eos: settings.ignore_eos,
                logprobs,
                index,
                spec: spec.clone(),
                keep_special: plan.keep_special,
                constraint: plan.constraint.clone(),
                fresh_prompt: common.cache_prompt == Some(false),
                embeds: embeds.clone(),
                ..Default::default()
            });
        }
    }
    let meta = Meta {
        kind,
        id: request_id(kind),
        created: now(),
        model: ready.id.clone(),
        choices: reqs.len(),
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
        logprobs: logprobs.is_some(),
        include_usage: settings.include_usage,
        reply: (kind == Kind::Chat).then(|| plan.reply.clone()),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    match ready.engine.submit(reqs, tx) {
        Ok(()) => {}
        Err(SubmitError::QueueFull) => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The server is busy (all slots and the queue are full); retry later.",
            )
            .code("queue_full");
            e.retry_after = Some(1);
            return Err(e);
        }
        Err(SubmitError::ShuttingDown) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The server is shutting down.",
            ))
        }
    }

    let mut log = log::RequestLog::new(
        log_cfg,
        &meta.id,
        endpoint,
        &ready.id,
        meta.prompt_tokens,
        meta.choices,
        prompt_log,
        t0,
    );
    log.count_in(ready.engine.metrics());
    if let Some((n, reused, t)) = image_info {
        log.set_images(n, reused, t);
    }
    Ok(Started {
        meta,
        stream: settings.stream,
        rx,
        log,
    })
}

/// The one choice of a request whose front end asks for one (ollama, Anthropic), logged.
async fn collect_one(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    log: &mut log::RequestLog,
) -> Result<ChoiceAcc, ApiError> {
    let mut acc = collect(rx, log, 1).await?;
    log.done(None);
    Ok(acc.remove(0))
}

/// Every choice's text, tokens and counters (non-streaming responses).
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    log: &mut log::RequestLog,
    choices: usize,
) -> Result<Vec<ChoiceAcc>, ApiError> {
    let mut acc = vec![ChoiceAcc::default(); choices];
    let mut left = choices;
    while left > 0 {
        let ev = rx.recv().await.ok_or_else(engine_stopped)?;
        log.on_event(&ev);
        if accumulate(&mut acc, ev)? {
            left -= 1;
        }
    }
    Ok(acc)
}

fn engine_stopped() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "the inference engine stopped",
    )
}

/// Add one event to the choices it belongs to; whether it finished a choice.
fn accumulate(acc: &mut [ChoiceAcc], ev: Event) -> Result<bool, ApiError> {
    match ev {
        Event::Delta {
            index,
            text,
            tokens,
        } => {
            if let Some(c) = acc.get_mut(index) {
                c.text.push_str(&text);
                c.tokens.extend(tokens);
            }
            Ok(false)
        }
        Event::Done {
            index,
            finish,
            completion_tokens,
            cached_tokens,
            spec,
            stop,
            ..
        } => match acc.get_mut(index) {
            Some(c) => {
                c.finish = Some(finish);
                c.completion_tokens = completion_tokens;
                c.cached_tokens = cached_tokens;
                c.spec = spec;
                c.stop = stop;
                Ok(true)
            }
            None => Ok(false),
        },
        Event::Error { message, .. } => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            message,
        )),
    }
}

fn finish_name(v: &Value) -> &'static str {
    match v.as_str() {
        Some("tool_calls") => "tool_calls",
        Some("length") => "length",
        _ => "stop",
    }
}

/// SSE: the role chunks, one chunk per text piece, a finish chunk per choice, the usage
/// chunk when asked for, then `[DONE]`. Dropping the stream (client gone) drops the receiver,
/// which cancels the sequences.
fn stream_response(
    meta: Meta,
    text: Arc<TextIo>,
    rx: mpsc::UnboundedReceiver<Event>,
    log: log::RequestLog,
) -> Response {
    struct S {
        rx: mpsc::UnboundedReceiver<Event>,
        chunker: Chunker,
        pending: VecDeque<String>,
        finished: bool,
        /// Logged when the stream ends or is dropped (client gone).
        log: log::RequestLog,
    }
    let chunker = Chunker::new(meta, text);
    let s = S {
        rx,
        pending: chunker.start().into(),
        chunker,
        finished: false,
        log,
    };
    let stream = futures_util::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(p) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(p)), s));
            }
            if s.finished {
                return None;
            }
            let ev = s.rx.recv().await.unwrap_or_else(|| Event::Error {
                index: 0,
                message: "the inference engine stopped".into(),
            });
            let failed = matches!(ev, Event::Error { .. });
            s.log.on_event(&ev);
            s.pending.extend(s.chunker.on_event(ev));
            if failed {
                s.pending.push_back("[DONE]".into());
                s.finished = true;
            } else if s.chunker.all_done() {
                s.pending.extend(s.chunker.end());
                s.finished = true;
            }
            if s.finished {
                // Nothing more is wanted: cancels any sequence still running.
                s.rx.close();
                let f = s.chunker.finishes.clone();
                s.log.done((!failed).then_some(f));
            }
        }
    });
    Sse::new(stream).into_response()
}
