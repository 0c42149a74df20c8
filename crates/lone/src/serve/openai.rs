//! OpenAI request parsing/validation and response objects (chat completions, completions,
//! streaming chunks, errors).

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use lone_core::generate::FinishReason;
use lone_core::sampler::SamplingParams;
use lone_core::text::TextIo;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::engine::{Event, TokenOut};
use lone_core::engine::SpecStats;

/// Most choices per request (`n`).
pub const MAX_N: u64 = 16;
/// Most `top_logprobs` / legacy `logprobs` alternatives.
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Most stop strings.
pub const MAX_STOP: usize = 16;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            .param(param)
            .code("invalid_value")
    }

    pub fn param(mut self, p: &str) -> ApiError {
        self.param = Some(p.to_string());
        self
    }

    pub fn code(mut self, c: &str) -> ApiError {
        self.code = Some(c.to_string());
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        r
    }
}

/// Parse the body as a JSON object.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("We could not parse the JSON body of your request: {e}"),
        )
        .code("invalid_json")
    })?;
    if !v.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "The request body must be a JSON object.",
        )
        .code("invalid_json"));
    }
    Ok(v)
}

/// Deserialize the known fields of `v` (unknown ones are ignored); a known field of the
/// wrong type is a 400 naming it.
pub fn fields<T: DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.inner().to_string();
        if let Some(field) = inner
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("Missing required parameter: '{field}'."),
            )
            .param(field)
            .code("missing_required_parameter");
        }
        let path = e.path().to_string();
        let param = path.split(['.', '[']).next().unwrap_or("").to_string();
        let param = if param == "?" || param.is_empty() {
            path.clone()
        } else {
            param
        };
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("Invalid type for '{path}': {}", e.inner()),
        )
        .param(&param)
        .code("invalid_type")
    })
}

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Clone, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Fields both endpoints share.
#[derive(Deserialize, Debug, Default)]
pub struct Common {
    /// Only checked to be a string here: the registry picks the model by it first.
    #[allow(dead_code)]
    pub model: Option<String>,
    /// llama-server's: `false` prefills the whole prompt, reusing no cached prefix.
    pub cache_prompt: Option<bool>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub n: Option<u64>,
    /// Accepted (and type-checked) but unused.
    #[allow(dead_code)]
    pub user: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub ignore_eos: Option<bool>,
    /// llama-server's per-request speculation overrides (flat keys with a dot).
    #[serde(rename = "speculative.type")]
    pub spec_type: Option<String>,
    #[serde(rename = "speculative.n_max")]
    pub spec_n_max: Option<u64>,
    #[serde(rename = "speculative.n_min")]
    pub spec_n_min: Option<u64>,
    #[serde(rename = "speculative.p_min")]
    pub spec_p_min: Option<f32>,
    #[serde(rename = "speculative.ngram_size_n")]
    pub spec_ngram_n: Option<u64>,
    #[serde(rename = "speculative.ngram_size_m")]
    pub spec_ngram_m: Option<u64>,
}

impl Common {
    /// The speculation settings for this request: the server's, with llama-server's
    /// `speculative.*` overrides applied (`None` when nothing is overridden).
    pub fn spec_params(
        &self,
        server: &lone_core::engine::SpecParams,
        has_draft: bool,
    ) -> Result<Option<lone_core::engine::SpecParams>, ApiError> {
        if self.spec_type.is_none()
            && self.spec_n_max.is_none()
            && self.spec_n_min.is_none()
            && self.spec_p_min.is_none()
            && self.spec_ngram_n.is_none()
            && self.spec_ngram_m.is_none()
        {
            return Ok(None);
        }
        let mut p = server.clone();
        if let Some(t) = &self.spec_type {
            p.types = lone_core::engine::SpecTypes::parse(t)
                .map_err(|e| ApiError::invalid("speculative.type", e))?;
        }
        let small = |v: u64| v.min(1 << 20) as usize;
        if let Some(v) = self.spec_n_max {
            p.draft_max = small(v);
        }
        if let Some(v) = self.spec_n_min {
            p.draft_min = small(v);
        }
        if let Some(v) = self.spec_p_min {
            p.draft_p_min = v;
        }
        if let Some(v) = self.spec_ngram_n {
            p.ngram_n = small(v);
        }
        if let Some(v) = self.spec_ngram_m {
            p.ngram_m = small(v);
        }
        p.validate(has_draft)
            .map_err(|e| ApiError::invalid("speculative", e))?;
        Ok(Some(p))
    }
}

#[derive(Deserialize, Debug)]
pub struct ChatFields {
    pub messages: Vec<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize, Debug)]
pub struct CompletionFields {
    pub prompt: Prompt,
    pub logprobs: Option<u64>,
    pub echo: Option<bool>,
}

/// Validated generation settings shared by both endpoints.
#[derive(Debug, Clone)]
pub struct Settings {
    pub params: SamplingParams,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
}

impl Common {
    pub fn settings(&self, vocab: usize) -> Result<Settings, ApiError> {
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => Some(("max_completion_tokens", m)),
            (None, Some(m)) => Some(("max_tokens", m)),
            (None, None) => None,
        };
        if let Some((p, 0)) = max_tokens {
            return Err(ApiError::invalid(p, format!("'{p}' must be at least 1")));
        }
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::invalid(
                "n",
                format!("'n' must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        let top_k = self.top_k.unwrap_or(0);
        if top_k < 0 {
            return Err(ApiError::invalid(
                "top_k",
                format!("'top_k' must be >= 0 (0 = off), got {top_k}"),
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP {
            return Err(ApiError::invalid(
                "stop",
                format!("at most {MAX_STOP} stop sequences are allowed"),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                "stop sequences must not be empty",
            ));
        }
        for (p, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if let Some(v) = v {
                if !(-2.0..=2.0).contains(&v) {
                    return Err(ApiError::invalid(
                        p,
                        format!("'{p}' must be between -2 and 2, got {v}"),
                    ));
                }
            }
        }
        let mut logit_bias = Vec::new();
        for (k, &b) in self.logit_bias.iter().flatten() {
            let id: u32 = k.trim().parse().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias keys must be token ids, got '{k}'"),
                )
            })?;
            if id as usize >= vocab {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("token id {id} in logit_bias is out of the vocabulary (size {vocab})"),
                ));
            }
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias values must be between -100 and 100, got {b}"),
                ));
            }
            logit_bias.push((id, b));
        }
        logit_bias.sort_by_key(|&(id, _)| id);
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: top_k as usize,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            penalty_last_n: 0,
            seed: self.seed.map(|s| s as u64),
            logit_bias,
        };
        if let Some(t) = self.temperature {
            if t > 2.0 {
                return Err(ApiError::invalid(
                    "temperature",
                    format!("'temperature' must be between 0 and 2, got {t}"),
                ));
            }
        }
        params
            .validate(vocab)
            .map_err(|e| ApiError::invalid(e.param, e.to_string()))?;
        Ok(Settings {
            params,
            max_tokens: max_tokens.map(|(_, m)| m.min(usize::MAX as u64) as usize),
            stop,
            n: n as usize,
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            ignore_eos: self.ignore_eos.unwrap_or(false),
        })
    }
}

/// Chat messages as the template wants them: text `content` parts joined into one string;
/// with images (`image_url` parts, ollama's `images`), transformers' list of `{"type":
/// "image", "image": URL}` and `{"type": "text"}` parts.
pub fn normalize_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let bad = |what: &str| {
            ApiError::invalid(&format!("messages[{i}]"), format!("messages[{i}]: {what}"))
                .param("messages")
        };
        let Some(obj) = m.as_object() else {
            return Err(bad("must be an object"));
        };
        match obj.get("role").and_then(Value::as_str) {
            Some("system" | "user" | "assistant" | "tool" | "developer" | "function") => {}
            Some(r) => {
                return Err(bad(&format!(
                    "unknown role '{r}': use system, developer, user, assistant or tool"
                )))
            }
            None => return Err(bad("'role' must be a string")),
        }
        let mut obj = obj.clone();
        // OpenAI's newer name for the system role.
        if obj.get("role").and_then(Value::as_str) == Some("developer") {
            obj.insert("role".into(), Value::String("system".into()));
        }
        // ollama's images ride on the message, before its text.
        let mut images: Vec<String> = Vec::new();
        if let Some(list) = obj.remove("images").filter(|v| !v.is_null()) {
            let Some(list) = list.as_array() else {
                return Err(bad("'images' must be a list of base64 strings"));
            };
            for img in list {
                let Some(b64) = img.as_str() else {
                    return Err(bad("'images' must be a list of base64 strings"));
                };
                images.push(b64.to_string());
            }
        }
        let mut parts: Vec<Value> = images
            .iter()
            .map(|i| json!({"type": "image", "image": i}))
            .collect();
        let mut text = String::new();
        match obj.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => text.push_str(s),
            Some(Value::Array(list)) => {
                for p in list {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        (Some("image_url"), _) => {
                            // {"image_url": {"url": ...}} or {"image_url": "..."}
                            let iu = p.get("image_url");
                            let Some(url) =
                                iu.and_then(|u| u.get("url")).or(iu).and_then(Value::as_str)
                            else {
                                return Err(bad(
                                    "image_url parts must be {\"type\": \"image_url\", \
                                     \"image_url\": {\"url\": ...}}",
                                ));
                            };
                            if !text.is_empty() {
                                parts.push(
                                    json!({"type": "text", "text": std::mem::take(&mut text)}),
                                );
                            }
                            parts.push(json!({"type": "image", "image": url}));
                        }
                        (Some(t), _) if t != "text" => {
                            return Err(bad(&format!(
                                "content parts of type '{t}' are not supported (text and \
                                 image_url only)"
                            )))
                        }
                        _ => {
                            return Err(bad(
                                "content parts must be {\"type\": \"text\", \"text\": ...}",
                            ))
                        }
                    }
                }
            }
            Some(_) => {
                return Err(bad(
                    "'content' must be a string, an array of content parts or null",
                ))
            }
        }
        // Text-only messages keep a string (what every template expects); with images the
        // content is transformers' list of parts ({"type": "image"} / {"type": "text"}).
        let content = if parts.is_empty() {
            Value::String(text)
        } else {
            if !text.is_empty() {
                parts.push(json!({"type": "text", "text": text}));
            }
            Value::Array(parts)
        };
        obj.insert("content".into(), content);
        out.push(Value::Object(obj));
    }
    Ok(out)
}

fn token_string(text: &TextIo, id: u32) -> (String, Vec<u8>) {
    let b = text.tokenizer.token_bytes(id);
    (String::from_utf8_lossy(&b).into_owned(), b)
}

fn finite(lp: f32) -> f32 {
    // JSON has no -inf: report it as OpenAI does for impossible tokens.
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

/// Chat `logprobs.content[]` entries.
pub fn chat_logprobs(text: &TextIo, toks: &[TokenOut]) -> Vec<Value> {
    toks.iter()
        .map(|t| {
            let (s, b) = token_string(text, t.id);
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (s, b) = token_string(text, id);
                    json!({"token": s, "logprob": finite(lp), "bytes": b})
                })
                .collect();
            json!({"token": s, "logprob": finite(t.logprob.unwrap_or(0.0)), "bytes": b, "top_logprobs": top})
        })
        .collect()
}

/// Legacy completions logprobs object; `offset` is the text offset of the first token.
pub fn legacy_logprobs(text: &TextIo, toks: &[TokenOut], offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    let mut off = offset;
    for t in toks {
        let (s, _) = token_string(text, t.id);
        offsets.push(off);
        off += s.len();
        tokens.push(s);
        lps.push(finite(t.logprob.unwrap_or(0.0)));
        let mut m = serde_json::Map::new();
        for &(id, lp) in &t.top {
            m.insert(token_string(text, id).0, json!(finite(lp)));
        }
        tops.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// Which endpoint a response is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// What the response builders need to know about the request.
#[derive(Clone, Debug)]
pub struct Meta {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Choices in all.
    pub choices: usize,
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: usize,
    /// Whether logprobs were asked for.
    pub logprobs: bool,
    pub include_usage: bool,
    /// Chat: how to split the text into content, reasoning and tool calls.
    pub reply: Option<lone_core::tools::ReplyOptions>,
}

/// `tool_calls` when the model called tools and stopped by itself.
fn finish_str(finish: Option<FinishReason>, calls: usize) -> &'static str {
    match finish.unwrap_or(FinishReason::Stop) {
        FinishReason::Stop if calls > 0 => "tool_calls",
        f => f.as_str(),
    }
}

/// One choice's result, gathered for a non-streaming response.
#[derive(Clone, Debug, Default)]
pub struct ChoiceAcc {
    pub text: String,
    pub tokens: Vec<TokenOut>,
    pub finish: Option<FinishReason>,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    pub spec: SpecStats,
    /// The stop string that ended it.
    pub stop: Option<String>,
}

/// OpenAI's usage object. Speculative decoding's drafts are reported as OpenAI reports
/// predicted outputs: `completion_tokens_details.accepted_prediction_tokens` /
/// `rejected_prediction_tokens` (only when something was drafted).
pub fn usage(meta: &Meta, completion: usize, cached: usize, spec: SpecStats) -> Value {
    let mut u = json!({
        "prompt_tokens": meta.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": meta.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    });
    if spec.drafted > 0 {
        u["completion_tokens_details"] = json!({
            "accepted_prediction_tokens": spec.accepted,
            "rejected_prediction_tokens": spec.drafted - spec.accepted,
        });
    }
    u
}

/// The whole (non-streaming) response.
pub fn full_response(meta: &Meta, text: &TextIo, choices: &[ChoiceAcc]) -> Value {
    let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let cached: usize = choices.iter().map(|c| c.cached_tokens).sum();
    let mut spec = SpecStats::default();
    for c in choices {
        spec += c.spec;
    }
    let finish = |c: &ChoiceAcc| finish_str(c.finish, 0);
    let cs: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match meta.kind {
            Kind::Chat => {
                let opt = meta.reply.clone().unwrap_or_default();
                let cut = c.finish == Some(FinishReason::Length);
                let reply = lone_core::tools::parse_reply_ended(opt, &c.text, cut);
                for w in &reply.warnings {
                    eprintln!("lone serve: warning: {w}");
                }
                json!({
                    "index": i,
                    "message": super::tools::message(&reply),
                    "logprobs": if meta.logprobs { json!({"content": chat_logprobs(text, &c.tokens)}) } else { Value::Null },
                    "finish_reason": finish_str(c.finish, reply.calls.len()),
                })
            }
            Kind::Completion => json!({
                "index": i,
                "text": c.text,
                "logprobs": if meta.logprobs { legacy_logprobs(text, &c.tokens, 0) } else { Value::Null },
                "finish_reason": finish(c),
            }),
        })
        .collect();
    json!({
        "id": meta.id,
        "object": match meta.kind { Kind::Chat => "chat.completion", Kind::Completion => "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": cs,
        "usage": usage(meta, completion, cached, spec),
    })
}

pub const SYSTEM_FINGERPRINT: &str = concat!("lone-", env!("CARGO_PKG_VERSION"));

/// Turns engine events into SSE `data:` payloads, OpenAI's chunk sequence.
pub struct Chunker {
    pub meta: Meta,
    text: Arc<TextIo>,
    done: Vec<bool>,
    /// Text sent per choice (for legacy `text_offset`).
    sent_len: Vec<usize>,
    completion: usize,
    spec: SpecStats,
    cached: usize,
    failed: bool,
    /// Chat: one reply parser per choice.
    parsers: Vec<lone_core::tools::ReplyParser>,
    /// The finish reasons sent, in order.
    pub finishes: Vec<&'static str>,
}

impl Chunker {
    pub fn new(meta: Meta, text: Arc<TextIo>) -> Chunker {
        let n = meta.choices;
        let parsers = match &meta.reply {
            Some(o) => (0..n)
                .map(|_| lone_core::tools::ReplyParser::new(o.clone()))
                .collect(),
            None => Vec::new(),
        };
        Chunker {
            finishes: Vec::new(),
            parsers,
            meta,
            text,
            done: vec![false; n],
            sent_len: vec![0; n],
            completion: 0,
            spec: SpecStats::default(),
            cached: 0,
            failed: false,
        }
    }

    fn chunk(&self, choices: Vec<Value>) -> String {
        let mut c = json!({
            "id": self.meta.id,
            "object": match self.meta.kind { Kind::Chat => "chat.completion.chunk", Kind::Completion => "text_completion" },
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        });
        if self.meta.include_usage {
            c["usage"] = Value::Null;
        }
        c.to_string()
    }

    /// The first chunks: the assistant role of every chat choice.
    pub fn start(&self) -> Vec<String> {
        if self.meta.kind != Kind::Chat {
            return Vec::new();
        }
        (0..self.meta.choices)
            .map(|i| {
                self.chunk(vec![json!({
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                })])
            })
            .collect()
    }

    pub fn all_done(&self) -> bool {
        self.failed || self.done.iter().all(|&d| d)
    }

    pub fn on_event(&mut self, ev: Event) -> Vec<String> {
        match ev {
            Event::Delta {
                index,
                text,
                tokens,
            } => {
                let with_lp = self.meta.logprobs && !tokens.is_empty();
                if text.is_empty() && !with_lp {
                    return Vec::new();
                }
                let off = self.sent_len.get(index).copied().unwrap_or(0);
                if let Some(l) = self.sent_len.get_mut(index) {
                    *l += text.len();
                }
                let c = match self.meta.kind {
                    Kind::Chat => {
                        let mut ds = match self.parsers.get_mut(index) {
                            Some(p) => p
                                .push(&text)
                                .into_iter()
                                .flat_map(super::tools::deltas)
                                .collect(),
                            None => vec![json!({"content": text})],
                        };
                        if ds.is_empty() && with_lp {
                            ds.push(json!({"content": ""}));
                        }
                        let lp = if with_lp {
                            json!({"content": chat_logprobs(&self.text, &tokens)})
                        } else {
                            Value::Null
                        };
                        return ds
                            .into_iter()
                            .enumerate()
                            .map(|(k, d)| {
                                self.chunk(vec![json!({
                                    "index": index,
                                    "delta": d,
                                    "logprobs": if k == 0 { lp.clone() } else { Value::Null },
                                    "finish_reason": null,
                                })])
                            })
                            .collect();
                    }
                    Kind::Completion => json!({
                        "index": index,
                        "text": text,
                        "logprobs": if with_lp { legacy_logprobs(&self.text, &tokens, off) } else { Value::Null },
                        "finish_reason": null,
                    }),
                };
                vec![self.chunk(vec![c])]
            }
            Event::Done {
                index,
                finish,
                completion_tokens,
                cached_tokens,
                spec,
                ..
            } => {
                if let Some(d) = self.done.get_mut(index) {
                    *d = true;
                }
                self.completion += completion_tokens;
                self.cached += cached_tokens;
                self.spec += spec;
                let mut out = Vec::new();
                let mut calls = 0;
                if let Some(p) = self.parsers.get_mut(index) {
                    let ds: Vec<Value> = p
                        .finish_ended(finish == FinishReason::Length)
                        .into_iter()
                        .flat_map(super::tools::deltas)
                        .collect();
                    calls = p.calls();
                    for d in ds {
                        out.push(self.chunk(vec![json!({
                            "index": index, "delta": d, "logprobs": null, "finish_reason": null,
                        })]));
                    }
                }
                let reason = match self.meta.kind {
                    Kind::Chat => finish_str(Some(finish), calls),
                    Kind::Completion => finish.as_str(),
                };
                self.finishes.push(reason);
                let c = match self.meta.kind {
                    Kind::Chat => json!({
                        "index": index, "delta": {}, "logprobs": null, "finish_reason": reason,
                    }),
                    Kind::Completion => json!({
                        "index": index, "text": "", "logprobs": null, "finish_reason": finish.as_str(),
                    }),
                };
                out.push(self.chunk(vec![c]));
                out
            }
            Event::Error { message, .. } => {
                self.failed = true;
                vec![
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
                        .body()
                        .to_string(),
                ]
            }
        }
    }

    /// After the last choice: the usage chunk (if asked for) and `[DONE]`.
    pub fn end(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.meta.include_usage && !self.failed {
            let mut c: Value = serde_json::from_str(&self.chunk(Vec::new())).unwrap_or(Value::Null);
            c["usage"] = usage(&self.meta, self.completion, self.cached, self.spec);
            out.push(c.to_string());
        }
        out.push("[DONE]".to_string());
        out
    }
}

/// The images of normalized chat messages, in prompt order (each part's URL or base64).
pub fn message_images(msgs: &[Value]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("image"))
        .filter_map(|p| p.get("image").and_then(Value::as_str).map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_types_name_the_field() {
        let v = parse_body(br#"{"temperature": "hot", "extra": [1,2]}"#).unwrap();
        let e = fields::<Common>(&v).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let v = parse_body(br#"{"whatever": {"x": 1}, "n": 2}"#).unwrap();
        assert_eq!(fields::<Common>(&v).unwrap().n, Some(2));
        assert!(parse_body(b"[1]").is_err());
        assert!(parse_body(b"{").is_err());
    }

    #[test]
    fn settings_validation() {
        let ok = |j: &str| {
            fields::<Common>(&parse_body(j.as_bytes()).unwrap())
                .unwrap()
                .settings(100)
        };
        assert!(ok(r#"{}"#).is_ok());
        assert_eq!(
            ok(r#"{"temperature": -1}"#).unwrap_err().param.as_deref(),
            Some("temperature")
        );
        assert_eq!(
            ok(r#"{"top_p": 1.5}"#).unwrap_err().param.as_deref(),
            Some("top_p")
        );
        assert_eq!(ok(r#"{"n": 0}"#).unwrap_err().param.as_deref(), Some("n"));
        assert_eq!(
            ok(r#"{"max_tokens": 0}"#).unwrap_err().param.as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            ok(r#"{"logit_bias": {"100": 1}}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("logit_bias")
        );
        assert_eq!(
            ok(r#"{"logit_bias": {"x": 1}}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("logit_bias")
        );
        assert_eq!(
            ok(r#"{"stop": ""}"#).unwrap_err().param.as_deref(),
            Some("stop")
        );
        let s =
            ok(r#"{"stop": ["a", "b"], "logit_bias": {"5": -100}, "seed": 3, "n": 2}"#).unwrap();
        assert_eq!(s.stop, ["a", "b"]);
        assert_eq!(s.params.logit_bias, [(5, -100.0)]);
        assert_eq!(s.params.seed, Some(3));
    }

    #[test]
    fn messages_are_normalized() {
        let m = normalize_messages(&[json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})]).unwrap();
        assert_eq!(m[0]["content"], "ab");
        assert!(normalize_messages(&[]).is_err());
        assert!(normalize_messages(&[json!({"content": "x"})]).is_err());
        assert!(normalize_messages(&[json!({"role": "user", "content": 5})]).is_err());
        let m = normalize_messages(&[json!({"role": "developer", "content": "be brief"})]).unwrap();
        assert_eq!(m[0]["role"], "system");
    }

    #[test]
    fn image_parts_become_transformers_parts_in_order() {
        let m = normalize_messages(&[json!({"role": "user", "content": [
            {"type": "text", "text": "a "},
            {"type": "image_url", "image_url": {"url": "data:1"}},
            {"type": "text", "text": "b"},
            {"type": "image_url", "image_url": "data:2"},
        ]})])
        .unwrap();
        assert_eq!(
            m[0]["content"],
            json!([{"type": "text", "text": "a "}, {"type": "image", "image": "data:1"},
                   {"type": "text", "text": "b"}, {"type": "image", "image": "data:2"}])
        );
        // ollama: the message's images come before its text.
        let o = normalize_messages(&[json!({"role": "user", "content": "hi", "images": ["QUJD"]})])
            .unwrap();
        assert_eq!(
            o[0]["content"],
            json!([{"type": "image", "image": "QUJD"}, {"type": "text", "text": "hi"}])
        );
        assert!(o[0].get("images").is_none());
        let all: Vec<Value> = m.into_iter().chain(o).collect();
        assert_eq!(message_images(&all), ["data:1", "data:2", "QUJD"]);
        for bad in [
            json!({"role": "user", "content": [{"type": "image_url"}]}),
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": 3}}]}),
            json!({"role": "user", "content": "x", "images": "QUJD"}),
            json!({"role": "user", "content": "x", "images": [1]}),
            json!({"role": "user", "content": [{"type": "input_audio"}]}),
        ] {
            assert!(
                normalize_messages(std::slice::from_ref(&bad)).is_err(),
                "{bad} accepted"
            );
        }
    }
}
