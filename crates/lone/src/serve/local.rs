//! A model served inside this process, without HTTP, for the Python and C APIs: the server's
//! engine (continuous batching: requests from several threads share its steps), its request
//! validation and its OpenAI response shapes. A request body is what `POST
//! /v1/chat/completions`, `/v1/completions` or `/v1/embeddings` take, and the answer is what
//! they return (a streamed answer: the chunks their SSE events carry).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::http::StatusCode;
use clap::Parser;
use lone_core::models::Model;
use lone_core::text::TextIo;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::engine::Event;
use super::metrics::Metrics;
use super::openai::{self, ApiError, ChoiceAcc, Chunker, Kind, Meta};
use super::{accumulate, engine_stopped, load, log, models, start, Ready, ServeArgs, Started};

/// One loaded model and its engine thread.
pub struct Local {
    ready: Arc<Ready>,
    log: log::LogConfig,
    /// Waits for engine events with a timeout (so a caller can check for an interrupt).
    rt: Arc<tokio::runtime::Runtime>,
}

/// What [`Request::next`] has.
#[derive(Debug)]
pub enum Step {
    /// Nothing yet within the wait.
    Wait,
    /// A streamed chunk (the JSON of one SSE event).
    Chunk(Value),
    /// The whole response (a request without `stream`).
    Response(Value),
    /// The stream has ended.
    End,
}

/// A generation request in flight. Dropping it cancels its sequences.
pub struct Request {
    rt: Arc<tokio::runtime::Runtime>,
    ready: Arc<Ready>,
    meta: Meta,
    rx: mpsc::UnboundedReceiver<Event>,
    log: log::RequestLog,
    /// Streaming: the chunk builder and the chunks not handed out yet.
    chunker: Option<Chunker>,
    pending: VecDeque<String>,
    /// Not streaming: the choices so far and how many are still running.
    acc: Vec<ChoiceAcc>,
    left: usize,
    finished: bool,
    /// Each choice's generated token ids so far.
    ids: Vec<Vec<u32>>,
}

fn internal(msg: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg)
}

impl Local {
    /// Load the model `a` names (its first `--model`, else the default model) with `a`'s
    /// settings (context, slots, threads, speculation, chat template), and start its engine.
    pub fn open(a: &ServeArgs) -> Result<Local> {
        let (id, path) = models::model_paths(a)?
            .into_iter()
            .next()
            .context("no model to open")?;
        let ready = load(a, &id, &path, &Arc::new(Metrics::default()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lone-local")
            .enable_time()
            .build()
            .context("cannot start the async runtime")?;
        Ok(Local {
            ready: Arc::new(ready),
            log: log::LogConfig {
                format: a.log_format,
                prompts: a.log_prompts,
            },
            rt: Arc::new(rt),
        })
    }

    /// The id responses carry (the file or directory name, or `--alias`).
    pub fn id(&self) -> &str {
        &self.ready.id
    }

    pub fn path(&self) -> &std::path::Path {
        &self.ready.path
    }

    /// Positions per sequence (prompt + completion).
    pub fn ctx(&self) -> usize {
        self.ready.ctx
    }

    pub fn vocab(&self) -> usize {
        self.ready.vocab
    }

    /// Embedding width.
    pub fn hidden(&self) -> usize {
        self.ready.hidden
    }

    /// The tokenizer, chat template and end-of-sequence ids.
    pub fn text(&self) -> &TextIo {
        &self.ready.text
    }

    /// What `/api/show` reports: architecture, quantization, parameters.
    pub fn info(&self) -> Value {
        serde_json::json!({
            "id": self.ready.id,
            "path": self.ready.path.display().to_string(),
            "architecture": self.ready.arch,
            "quantization": self.ready.quant,
            "parameters": self.ready.params,
            "context": self.ready.ctx,
            "vocab_size": self.ready.vocab,
            "embedding_size": self.ready.hidden,
            "chat_template": self.ready.text.template_for(false).is_some(),
        })
    }

    /// The token ids of `text`; `add_special`: with the tokenizer's BOS/EOS as it adds them.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ApiError> {
        self.ready
            .text
            .tokenizer
            .encode(text, add_special)
            .map_err(|e| ApiError::invalid("content", format!("cannot tokenize: {e}")))
    }

    /// The text of `ids` (special tokens included as text).
    pub fn detokenize(&self, ids: &[u32]) -> Result<String, ApiError> {
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.ready.vocab) {
            return Err(self.out_of_vocab("tokens", bad));
        }
        self.ready
            .text
            .decode(ids)
            .map_err(|e| ApiError::invalid("tokens", format!("cannot detokenize: {e}")))
    }

    fn out_of_vocab(&self, param: &str, id: u32) -> ApiError {
        ApiError::invalid(
            param,
            format!(
                "token id {id} is out of the vocabulary (size {})",
                self.ready.vocab
            ),
        )
    }

    /// The prompt a chat request's `messages` (and `tools`) render to with the chat template.
    pub fn apply_template(&self, body: &Value) -> Result<String, ApiError> {
        let req = super::request::GenerationRequest::chat_prompt(body)?;
        let (msgs, plan) = super::chat_messages(&self.ready, &req)?;
        super::render_chat(&self.ready, &msgs, &plan)
    }

    /// Start a chat or completion request (`body` as the HTTP endpoint takes it).
    pub fn request(&self, kind: Kind, body: &Value) -> Result<Request, ApiError> {
        let endpoint = match kind {
            Kind::Chat => "/v1/chat/completions",
            Kind::Completion => "/v1/completions",
        };
        let Started {
            meta,
            stream,
            rx,
            log,
        } = start(
            &self.log,
            &self.ready,
            &super::request::GenerationRequest::from_openai(body, kind)?,
            endpoint,
            Instant::now(),
        )?;
        let (chunker, pending) = if stream {
            let c = Chunker::new(meta.clone(), self.ready.text.clone());
            let first = c.start().into();
            (Some(c), first)
        } else {
            (None, VecDeque::new())
        };
        Ok(Request {
            rt: self.rt.clone(),
            ready: self.ready.clone(),
            acc: vec![ChoiceAcc::default(); meta.choices],
            ids: vec![Vec::new(); meta.choices],
            left: meta.choices,
            meta,
            rx,
            log,
            chunker,
            pending,
            finished: false,
        })
    }

    /// The answer to an embeddings request (`input`, `encoding_format`, `dimensions`).
    pub fn embeddings(&self, body: &Value) -> Result<Value, ApiError> {
        self.rt
            .handle()
            .block_on(super::embeddings::embed(&self.ready, body))
    }

    /// Run `f` with the model on the engine thread, between its steps (so it never races a
    /// running generation), and wait for its result.
    pub fn with_model<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Model) -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.ready
            .engine
            .run_job(super::engine::Job::new(move |m| {
                let _ = tx.send(f(m));
                None
            }))
            .map_err(|_| internal("the model is shutting down"))?;
        rx.recv().map_err(|_| internal("the model's job failed"))
    }

    /// The logits of `ids` as a prompt from position 0: `[vocab]` for its last position, or
    /// `[positions, vocab]` with `all`.
    pub fn logits(&self, ids: &[u32], all: bool) -> Result<Vec<f32>, ApiError> {
        if ids.is_empty() {
            return Err(ApiError::invalid("tokens", "the token list is empty"));
        }
        if ids.len() > self.ready.ctx {
            return Err(ApiError::invalid(
                "tokens",
                format!(
                    "{} tokens do not fit the context of {}",
                    ids.len(),
                    self.ready.ctx
                ),
            )
            .code("context_length_exceeded"));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.ready.vocab) {
            return Err(self.out_of_vocab("tokens", bad));
        }
        let ids = ids.to_vec();
        self.with_model(move |m| {
            let mut cache = vec![m.new_cache()];
            let batch = lone_core::models::Batch::for_sequence(0, 0, &ids, all);
            m.forward(&batch, &mut cache).map(|o| o.logits)
        })?
        .map_err(|e| internal(e.to_string()))
    }

    /// The perplexity of `text` as `lone perplexity` computes it (llama-perplexity's method:
    /// chunks of `ctx` tokens, the second half of each scored).
    pub fn perplexity(
        &self,
        text: &str,
        ctx: usize,
        chunks: Option<usize>,
    ) -> Result<lone_core::perplexity::PerplexityResult, ApiError> {
        let tok = &self.ready.text.tokenizer;
        let mut io_tok = lone_core::tokenizer::Tokenizer::clone(tok);
        io_tok.set_special_as_text(true);
        let tokens = io_tok
            .encode(text, false)
            .map_err(|e| ApiError::invalid("text", format!("cannot tokenize: {e}")))?;
        let opts = lone_core::perplexity::PerplexityOptions {
            ctx,
            batch: ctx.clamp(1, 512),
            chunks,
            bos: tok.add_bos_token().then(|| tok.bos_id()).flatten(),
        };
        self.with_model(move |m| lone_core::perplexity::perplexity(m, &tokens, &opts, |_, _| {}))?
            .map_err(|e| ApiError::invalid("text", e.to_string()))
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.ready.engine.shutdown();
    }
}

impl Request {
    /// Whether the request streams (chunks, then [`Step::End`]) or answers once
    /// ([`Step::Response`]).
    pub fn is_stream(&self) -> bool {
        self.chunker.is_some()
    }

    /// The token ids choice `index` has generated so far (those its text was made of; a
    /// stop string's tokens included).
    pub fn token_ids(&self, index: usize) -> &[u32] {
        self.ids.get(index).map_or(&[], Vec::as_slice)
    }

    /// The next thing this request has, waiting at most `wait` for the engine: also while
    /// a request that does not stream is still gathering its answer, so that a caller polling
    /// with a short `wait` (the Python module, to see Ctrl-C) gets control back that often
    /// however fast the tokens come.
    pub fn next(&mut self, wait: Duration) -> Result<Step, ApiError> {
        let deadline = std::time::Instant::now() + wait;
        let mut polled = false;
        loop {
            if let Some(p) = self.pending.pop_front() {
                if p == "[DONE]" {
                    continue;
                }
                return serde_json::from_str(&p)
                    .map(Step::Chunk)
                    .map_err(|e| internal(format!("bad chunk: {e}")));
            }
            if self.finished {
                return Ok(Step::End);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if polled && left.is_zero() {
                return Ok(Step::Wait);
            }
            polled = true;
            let rx = &mut self.rx;
            // The timer is made inside the runtime (it needs its time driver).
            let got = self
                .rt
                .handle()
                .block_on(async { tokio::time::timeout(left, rx.recv()).await });
            let ev = match got {
                Err(_) => return Ok(Step::Wait),
                Ok(None) => {
                    self.finished = true;
                    return Err(engine_stopped());
                }
                Ok(Some(ev)) => ev,
            };
            self.log.on_event(&ev);
            if let Event::Delta { index, tokens, .. } = &ev {
                if let Some(ids) = self.ids.get_mut(*index) {
                    ids.extend(tokens.iter().map(|t| t.id));
                }
            }
            let Some(chunker) = self.chunker.as_mut() else {
                let done = accumulate(&mut self.acc, ev).inspect_err(|_| self.finished = true)?;
                self.left -= usize::from(done);
                if self.left == 0 {
                    self.finished = true;
                    let resp = openai::full_response(&self.meta, &self.ready.text, &self.acc);
                    self.log.done(resp["choices"].as_array().map(|cs| {
                        cs.iter()
                            .map(|c| super::finish_name(&c["finish_reason"]))
                            .collect()
                    }));
                    return Ok(Step::Response(resp));
                }
                continue;
            };
            if let Event::Error { message, .. } = ev {
                self.finished = true;
                self.log.done(None);
                return Err(internal(message));
            }
            self.pending.extend(chunker.on_event(ev));
            if chunker.all_done() {
                self.pending.extend(chunker.end());
                self.finished = true;
                self.rx.close();
                let f = chunker.finishes.clone();
                self.log.done(Some(f));
            }
        }
    }

    /// Wait for the whole answer (no interrupt check): the response, or for a stream every
    /// chunk in order.
    pub fn wait_all(mut self) -> Result<Vec<Value>, ApiError> {
        let mut out = Vec::new();
        loop {
            match self.next(Duration::from_secs(3600))? {
                Step::Wait => {}
                Step::Chunk(c) => out.push(c),
                Step::Response(r) => return Ok(vec![r]),
                Step::End => return Ok(out),
            }
        }
    }
}

/// `lone serve`'s flags, parsed as the command parses them.
#[derive(Parser)]
#[command(name = "lone")]
struct ServeCli {
    #[command(flatten)]
    args: ServeArgs,
}

/// [`ServeArgs`] from `lone serve`'s flags (`["--model", "m.gguf", "--ctx", "2048"]`, no
/// program name), parsed as the command parses them: the Python API's keyword arguments.
pub fn serve_args(flags: impl IntoIterator<Item = String>) -> Result<ServeArgs, String> {
    let argv = std::iter::once("lone".to_string()).chain(flags);
    ServeCli::try_parse_from(argv)
        .map(|c| c.args)
        .map_err(|e| e.render().to_string().trim_end().to_string())
}

/// The numeric mode called `s` (`auto`, `exact`, `fast`).
pub fn mode_named(s: &str) -> Result<lone_core::kernels::Mode, String> {
    use lone_core::kernels::Mode;
    match s {
        "auto" => Ok(Mode::Auto),
        "exact" => Ok(Mode::Exact),
        "fast" => Ok(Mode::Fast),
        m => Err(format!(
            "must be \"auto\", \"exact\" or \"fast\", not {m:?}"
        )),
    }
}

/// The cache type called `s` (`f16`, `f32`, `q8_0`).
pub fn cache_type_named(s: &str) -> Result<lone_core::cache::KvType, String> {
    lone_core::cache::KvType::parse(s)
        .ok_or_else(|| format!("must be \"f16\", \"f32\" or \"q8_0\", not {s:?}"))
}

const OPTIONS: &str =
    "threads, ctx, parallel, mode, cache_type, chat_template_file, cache_ram, log_format";

fn option_str<'a>(k: &str, v: &'a Value) -> Result<&'a str, String> {
    v.as_str()
        .ok_or_else(|| format!("option \"{k}\" must be a string, not {v}"))
}

/// [`ServeArgs`] from the C API's `options_json` (`{"threads": 2, "ctx": 2048, "mode":
/// "exact", ...}`) and model path (`None`: the default model). Unknown keys, wrong types and
/// values the command would refuse are errors that say what to pass.
pub fn serve_args_json(path: Option<&str>, options: Option<&str>) -> Result<ServeArgs, String> {
    let mut flags = vec!["lone".to_string()];
    if let Some(p) = path {
        if p.is_empty() {
            return Err(
                "path is empty; pass a GGUF file or checkpoint directory, or NULL for the default model".into(),
            );
        }
        flags.push(format!("--model={p}"));
    }
    let (mut mode, mut cache_type, mut log_format) = (None, None, "off".to_string());
    let opts = match options.map(serde_json::from_str::<Value>) {
        None => Map::new(),
        Some(Err(e)) => {
            return Err(format!(
                "options_json is not valid JSON ({e}); pass an object such as {{\"threads\": 2}}"
            ))
        }
        Some(Ok(Value::Null)) => Map::new(),
        Some(Ok(Value::Object(m))) => m,
        Some(Ok(v)) => {
            return Err(format!(
                "options_json must be a JSON object such as {{\"threads\": 2}}, not {v}"
            ))
        }
    };
    for (k, v) in &opts {
        match k.as_str() {
            "threads" | "ctx" | "parallel" | "cache_ram" => {
                let n = v
                    .as_u64()
                    .filter(|&n| n > 0 || k == "cache_ram")
                    .ok_or_else(|| format!("option \"{k}\" must be a positive integer, not {v}"))?;
                flags.push(format!("--{}={n}", k.replace('_', "-")));
            }
            "mode" => {
                mode = Some(
                    mode_named(option_str(k, v)?).map_err(|e| format!("option \"mode\" {e}"))?,
                )
            }
            "cache_type" => {
                let t = cache_type_named(option_str(k, v)?)
                    .map_err(|e| format!("option \"cache_type\" {e}"))?;
                cache_type = Some(t);
            }
            "chat_template_file" => {
                flags.push(format!("--chat-template-file={}", option_str(k, v)?));
            }
            "log_format" => log_format = option_str(k, v)?.to_string(),
            _ => {
                return Err(format!(
                    "unknown option \"{k}\" in options_json; the options are {OPTIONS}"
                ))
            }
        }
    }
    flags.push(format!("--log-format={log_format}"));
    let mut a = serve_args(flags.into_iter().skip(1))?;
    a.mode = mode;
    a.cache_type = cache_type;
    Ok(a)
}
