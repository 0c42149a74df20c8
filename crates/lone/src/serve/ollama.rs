//! The ollama API (what ollama's clients and Open WebUI speak): `POST /api/chat`,
//! `POST /api/generate` (NDJSON streaming, on by default as in ollama), `GET /api/tags`,
//! `POST /api/show`, `GET /api/version`, `GET /api/ps`. Requests are turned into the
//! OpenAI-shaped requests the rest of the server validates and runs.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lone_core::generate::FinishReason;
use lone_core::tools::{ReplyDelta, ReplyParser};
use serde_json::{json, Map, Value};

use super::engine::Event;
use super::openai::{ApiError, Kind};
use super::{body_json, collect_one, models::Entry, start, AppState, Started};

/// ollama's error shape: `{"error": "..."}` with the status.
fn err(e: ApiError) -> Response {
    (e.status, Json(json!({"error": e.message}))).into_response()
}

/// RFC 3339 time now (UTC), as ollama's `created_at`.
fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let t = lone_core::tokenizer::DateTime::from_unix(d.as_secs() as i64);
    format!(
        "{}.{:09}Z",
        t.strftime("%Y-%m-%dT%H:%M:%S"),
        d.subsec_nanos()
    )
}

/// ollama's `options` (and top-level `format`) as OpenAI request fields.
pub(super) fn openai_fields(v: &Value, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let o = v.get("options").cloned().unwrap_or(json!({}));
    if !o.is_object() {
        return Err(ApiError::invalid("options", "'options' must be an object"));
    }
    let copy = |from: &str, to: &str, out: &mut Map<String, Value>| {
        if let Some(x) = o.get(from).filter(|x| !x.is_null()) {
            out.insert(to.into(), x.clone());
        }
    };
    // ollama's default temperature (its Modelfile default).
    out.insert("temperature".into(), json!(0.8));
    copy("temperature", "temperature", out);
    copy("top_p", "top_p", out);
    copy("top_k", "top_k", out);
    copy("min_p", "min_p", out);
    copy("seed", "seed", out);
    copy("stop", "stop", out);
    copy("repeat_penalty", "repetition_penalty", out);
    copy("presence_penalty", "presence_penalty", out);
    copy("frequency_penalty", "frequency_penalty", out);
    match o.get("num_predict").and_then(Value::as_i64) {
        Some(n) if n > 0 => {
            out.insert("max_tokens".into(), json!(n));
        }
        _ => {}
    }
    match v.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Value::String(s)) if s.is_empty() => {}
        Some(s @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": s}}),
            );
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "format",
                "'format' must be \"json\" or a JSON schema",
            ))
        }
    }
    if let Some(m) = v.get("model") {
        out.insert("model".into(), m.clone());
    }
    Ok(())
}

/// ollama's timing fields (nanoseconds) and counts.
fn stats(
    t0: Instant,
    first: Option<Instant>,
    prompt: usize,
    generated: usize,
) -> Map<String, Value> {
    let end = Instant::now();
    let first = first.unwrap_or(end);
    let mut m = Map::new();
    m.insert("total_duration".into(), json!((end - t0).as_nanos() as u64));
    m.insert("load_duration".into(), json!(0));
    m.insert("prompt_eval_count".into(), json!(prompt));
    m.insert(
        "prompt_eval_duration".into(),
        json!((first - t0).as_nanos() as u64),
    );
    m.insert("eval_count".into(), json!(generated));
    m.insert(
        "eval_duration".into(),
        json!((end - first).as_nanos() as u64),
    );
    m
}

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Chat,
    Generate,
}

/// One NDJSON object (chat: `message`, generate: `response`).
fn piece(api: Api, model: &str, content: &str, thinking: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("model".into(), json!(model));
    m.insert("created_at".into(), json!(now_rfc3339()));
    match api {
        Api::Chat => {
            let mut msg = json!({"role": "assistant", "content": content});
            if !thinking.is_empty() {
                msg["thinking"] = json!(thinking);
            }
            m.insert("message".into(), msg);
        }
        Api::Generate => {
            m.insert("response".into(), json!(content));
            if !thinking.is_empty() {
                m.insert("thinking".into(), json!(thinking));
            }
        }
    }
    m.insert("done".into(), json!(false));
    m
}

fn split(deltas: Vec<ReplyDelta>) -> (String, String) {
    let (mut c, mut t) = (String::new(), String::new());
    for d in deltas {
        match d {
            ReplyDelta::Content(s) => c.push_str(&s),
            ReplyDelta::Reasoning(s) => t.push_str(&s),
            _ => {}
        }
    }
    (c, t)
}

async fn run(st: Arc<AppState>, body: Result<Bytes, BytesRejection>, api: Api) -> Response {
    let t0 = Instant::now();
    let v = match body_json(body) {
        Ok(v) => v,
        Err(e) => return err(e),
    };
    let mut req = Map::new();
    if let Err(e) = openai_fields(&v, &mut req) {
        return err(e);
    }
    let (kind, endpoint) = match api {
        Api::Chat => {
            let Some(msgs) = v.get("messages").filter(|m| m.is_array()) else {
                return err(ApiError::invalid("messages", "'messages' must be a list"));
            };
            req.insert("messages".into(), msgs.clone());
            (Kind::Chat, "/api/chat")
        }
        Api::Generate => {
            let prompt = v.get("prompt").and_then(Value::as_str).unwrap_or("");
            if prompt.is_empty() {
                // ollama: an empty prompt only loads the model.
                let done = st.model(&v).await.is_ok();
                let name = v.get("model").and_then(Value::as_str);
                let id = st.models.find(name).map_or("", |e| e.id.as_str());
                let mut m = piece(api, id, "", "");
                m.insert("done".into(), json!(done));
                m.insert("done_reason".into(), json!("load"));
                return Json(Value::Object(m)).into_response();
            }
            if v.get("raw").and_then(Value::as_bool).unwrap_or(false) {
                req.insert("prompt".into(), json!(prompt));
                (Kind::Completion, "/api/generate")
            } else {
                let mut msgs = Vec::new();
                if let Some(s) = v.get("system").and_then(Value::as_str) {
                    msgs.push(json!({"role": "system", "content": s}));
                }
                let mut user = json!({"role": "user", "content": prompt});
                if let Some(images) = v.get("images").filter(|i| !i.is_null()) {
                    user["images"] = images.clone();
                }
                msgs.push(user);
                req.insert("messages".into(), Value::Array(msgs));
                (Kind::Chat, "/api/generate")
            }
        }
    };
    let streaming = v.get("stream").and_then(Value::as_bool).unwrap_or(true);
    let ready = match st.model(&v).await {
        Ok(r) => r,
        Err(e) => return err(e),
    };
    let Started {
        meta,
        mut rx,
        mut log,
        ..
    } = match super::request::GenerationRequest::from_openai(&Value::Object(req), kind)
        .and_then(|req| start(&st.log, &ready, &req, endpoint, t0))
    {
        Ok(s) => s,
        Err(e) => return err(e),
    };
    let model = ready.id.clone();
    // Chat: the plan's options (reasoning split, a template that opens `<think>`); raw
    // generate: plain text.
    let opts = meta.reply.clone().unwrap_or_default();
    let prompt_tokens = meta.prompt_tokens;
    if !streaming {
        let c = &match collect_one(&mut rx, &mut log).await {
            Ok(c) => c,
            Err(e) => return err(e),
        };
        let mut p = ReplyParser::new(opts);
        let mut d = p.push(&c.text);
        d.extend(p.finish_ended(c.finish == Some(FinishReason::Length)));
        let (content, thinking) = split(d);
        let mut m = piece(api, &model, &content, &thinking);
        m.insert("done".into(), json!(true));
        let reason = c.finish.map(|f| f.as_str()).unwrap_or("stop");
        m.insert("done_reason".into(), json!(reason));
        m.extend(stats(t0, None, prompt_tokens, c.completion_tokens));
        return Json(Value::Object(m)).into_response();
    }
    struct S {
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        log: super::log::RequestLog,
        parser: ReplyParser,
        first: Option<Instant>,
        done: bool,
    }
    let s = S {
        rx,
        log,
        parser: ReplyParser::new(opts),
        first: None,
        done: false,
    };
    let stream = futures_util::stream::unfold(s, move |mut s| {
        let model = model.clone();
        async move {
            if s.done {
                return None;
            }
            loop {
                let ev = s.rx.recv().await.unwrap_or_else(|| Event::Error {
                    index: 0,
                    message: "the inference engine stopped".into(),
                });
                s.log.on_event(&ev);
                let line = match ev {
                    Event::Delta { text, tokens, .. } => {
                        if s.first.is_none() && !tokens.is_empty() {
                            s.first = Some(Instant::now());
                        }
                        let (c, t) = split(s.parser.push(&text));
                        if c.is_empty() && t.is_empty() {
                            continue;
                        }
                        Value::Object(piece(api, &model, &c, &t)).to_string()
                    }
                    Event::Done {
                        finish,
                        completion_tokens,
                        ..
                    } => {
                        let cut = finish == FinishReason::Length;
                        let (c, t) = split(s.parser.finish_ended(cut));
                        let mut m = piece(api, &model, &c, &t);
                        m.insert("done".into(), json!(true));
                        m.insert("done_reason".into(), json!(finish.as_str()));
                        m.extend(stats(t0, s.first, prompt_tokens, completion_tokens));
                        s.done = true;
                        s.log.done(None);
                        Value::Object(m).to_string()
                    }
                    Event::Error { message, .. } => {
                        s.done = true;
                        json!({"error": message}).to_string()
                    }
                };
                return Some((Ok::<_, Infallible>(Bytes::from(line + "\n")), s));
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

pub(super) async fn chat(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(st, body, Api::Chat).await
}

pub(super) async fn generate(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(st, body, Api::Generate).await
}

/// A model as `/api/tags` and `/api/ps` list it.
fn model_entry(e: &Entry) -> Value {
    let size = crate::cmd::model_info::file_bytes(&e.path);
    let (family, quant, params) = match e.ready() {
        Some(r) => (r.arch.to_string(), r.quant.clone(), r.params_label.clone()),
        None => (String::new(), String::new(), String::new()),
    };
    json!({
        "name": e.id,
        "model": e.id,
        "modified_at": now_rfc3339(),
        "size": size,
        "digest": "",
        "details": {
            "parent_model": "",
            "format": if e.path.is_dir() { "safetensors" } else { "gguf" },
            "family": family,
            "families": [family],
            "parameter_size": params,
            "quantization_level": quant,
        },
    })
}

pub(super) async fn tags(State(st): State<Arc<AppState>>) -> Json<Value> {
    let models: Vec<Value> = st.models.entries.iter().map(|e| model_entry(e)).collect();
    Json(json!({ "models": models }))
}

/// The loaded models.
pub(super) async fn ps(State(st): State<Arc<AppState>>) -> Json<Value> {
    let models: Vec<Value> = st
        .models
        .entries
        .iter()
        .filter(|e| e.ready().is_some())
        .map(|e| {
            let mut m = model_entry(e);
            m["expires_at"] = json!("9999-12-31T23:59:59Z");
            m["size_vram"] = json!(0);
            m
        })
        .collect();
    Json(json!({ "models": models }))
}

pub(super) async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

pub(super) async fn show(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let v = match body_json(body) {
        Ok(v) => v,
        Err(e) => return err(e),
    };
    // ollama's clients send the name as `model` (older ones as `name`).
    let name = v
        .get("model")
        .or_else(|| v.get("name"))
        .and_then(Value::as_str);
    let ready = match st.models.get(name).await {
        Ok(r) => r,
        Err(e) => return err(e),
    };
    let entry = match st.models.find(Some(&ready.id)) {
        Ok(e) => model_entry(e),
        Err(e) => return err(e),
    };
    let template = ready
        .text
        .template
        .as_ref()
        .map(|t| t.source().to_string())
        .unwrap_or_default();
    let mut caps = vec!["completion"];
    if template.contains("tools") {
        caps.push("tools");
    }
    if ready.vision {
        caps.push("vision");
    }
    Json(json!({
        "modelfile": format!("FROM {}\n", ready.path.display()),
        "parameters": "",
        "template": template,
        "details": entry["details"],
        "model_info": {
            "general.architecture": ready.arch,
            "general.parameter_count": ready.params,
            "context_length": ready.ctx,
        },
        "capabilities": caps,
        "modified_at": entry["modified_at"],
    }))
    .into_response()
}
