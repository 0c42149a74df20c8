//! Anthropic's Messages API: `POST /v1/messages` (and `/v1/messages/count_tokens`), with its
//! SSE event sequence when streaming (`message_start`, `content_block_start`, `ping`,
//! `content_block_delta`…, `content_block_stop`, `message_delta`, `message_stop`). The
//! request is turned into an OpenAI-shaped chat request the rest of the server runs.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lone_core::engine::FinishReason;
use serde_json::{json, Map, Value};

use super::engine::Event;
use super::openai::{ApiError, Kind};
use super::{body_json, chat_messages, collect_one, render_chat, start, AppState, Started};

/// Anthropic's error shape.
fn err(e: ApiError) -> Response {
    let kind = match e.status {
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    };
    (
        e.status,
        Json(json!({"type": "error", "error": {"type": kind, "message": e.message}})),
    )
        .into_response()
}

/// Text of a content value: a string or a list of `{"type": "text", "text"}` blocks.
fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut s = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => s.push_str(t),
                    (Some(t), _) => {
                        return Err(ApiError::invalid(
                            what,
                            format!(
                            "{what}: content blocks of type '{t}' are not supported (text only)"
                        ),
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            what,
                            format!("{what}: bad content block"),
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(ApiError::invalid(
            what,
            format!("{what} must be a string or a list of text blocks"),
        )),
    }
}

/// An `image` block (`source`: base64 with its media type, or a URL) as an OpenAI
/// `image_url` part.
fn image_part(block: &Value, what: &str) -> Result<Value, ApiError> {
    let src = block.get("source").unwrap_or(&Value::Null);
    let s = |k: &str| src.get(k).and_then(Value::as_str);
    let url = match (s("type"), s("media_type"), s("data"), s("url")) {
        (Some("base64"), Some(mt), Some(data), _) => format!("data:{mt};base64,{data}"),
        (Some("url"), _, _, Some(url)) => url.to_string(),
        _ => {
            return Err(ApiError::invalid(
                what,
                format!(
                    "{what}: an image block needs a source {{\"type\": \"base64\", \
                     \"media_type\", \"data\"}}"
                ),
            ))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// The OpenAI-shaped chat request for a Messages request.
pub(super) fn openai_request(v: &Value, counting: bool) -> Result<Value, ApiError> {
    let mut out = Map::new();
    let mut msgs = Vec::new();
    if let Some(s) = v.get("system").filter(|s| !s.is_null()) {
        msgs.push(json!({"role": "system", "content": text_of(s, "system")?}));
    }
    let Some(list) = v.get("messages").and_then(Value::as_array) else {
        return Err(ApiError::invalid("messages", "'messages' must be a list"));
    };
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(ApiError::invalid(
                "messages",
                format!("messages.{i}.role must be 'user' or 'assistant'"),
            ));
        }
        let what = format!("messages.{i}.content");
        let content = match m.get("content") {
            // Image blocks become OpenAI image_url parts, text blocks text parts.
            Some(Value::Array(blocks))
                if blocks
                    .iter()
                    .any(|b| b.get("type").and_then(Value::as_str) == Some("image")) =>
            {
                let mut parts = Vec::new();
                for b in blocks {
                    if b.get("type").and_then(Value::as_str) == Some("image") {
                        parts.push(image_part(b, &what)?);
                    } else {
                        parts.push(json!({"type": "text", "text": text_of(&Value::Array(vec![b.clone()]), &what)?}));
                    }
                }
                Value::Array(parts)
            }
            c => Value::String(text_of(c.unwrap_or(&Value::Null), &what)?),
        };
        msgs.push(json!({"role": role, "content": content}));
    }
    out.insert("messages".into(), Value::Array(msgs));
    match v.get("max_tokens").and_then(Value::as_u64) {
        Some(n) => {
            out.insert("max_tokens".into(), json!(n));
        }
        None if !counting => {
            return Err(ApiError::invalid(
                "max_tokens",
                "max_tokens: Field required",
            ))
        }
        None => {}
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stop_sequences", "stop"),
        ("model", "model"),
    ] {
        if let Some(x) = v.get(from).filter(|x| !x.is_null()) {
            out.insert(to.into(), x.clone());
        }
    }
    Ok(Value::Object(out))
}

fn stop_reason(finish: Option<FinishReason>, stop: &Option<String>) -> &'static str {
    match (finish, stop) {
        (Some(FinishReason::Length), _) => "max_tokens",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

fn message_id(openai_id: &str) -> String {
    format!("msg_{}", openai_id.trim_start_matches("chatcmpl-"))
}

pub(super) async fn messages(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let v = match body_json(body) {
        Ok(v) => v,
        Err(e) => return err(e),
    };
    let req = match openai_request(&v, false)
        .and_then(|r| super::request::GenerationRequest::from_openai(&r, Kind::Chat))
    {
        Ok(r) => r,
        Err(e) => return err(e),
    };
    let streaming = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let ready = match st.model(&v).await {
        Ok(r) => r,
        Err(e) => return err(e),
    };
    let Started {
        meta,
        mut rx,
        mut log,
        ..
    } = match start(&st.log, &ready, &req, "/v1/messages", t0) {
        Ok(s) => s,
        Err(e) => return err(e),
    };
    let id = message_id(&meta.id);
    let model = ready.id.clone();
    let input = meta.prompt_tokens;
    if !streaming {
        let c = &match collect_one(&mut rx, &mut log).await {
            Ok(c) => c,
            Err(e) => return err(e),
        };
        return Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": c.text}],
            "stop_reason": stop_reason(c.finish, &c.stop),
            "stop_sequence": c.stop,
            "usage": {
                "input_tokens": input - c.cached_tokens,
                "cache_read_input_tokens": c.cached_tokens,
                "output_tokens": c.completion_tokens,
            },
        }))
        .into_response();
    }
    let ev = |name: &str, data: Value| SseEvent::default().event(name).data(data.to_string());
    let head = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input, "output_tokens": 0},
            }}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ev("ping", json!({"type": "ping"})),
    ];
    struct S {
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        log: super::log::RequestLog,
        pending: std::collections::VecDeque<SseEvent>,
        done: bool,
    }
    let s = S {
        rx,
        log,
        pending: head.into(),
        done: false,
    };
    let stream = futures_util::stream::unfold(s, move |mut s| async move {
        loop {
            if let Some(e) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(e), s));
            }
            if s.done {
                return None;
            }
            let e = s.rx.recv().await.unwrap_or_else(|| Event::Error {
                index: 0,
                message: "the inference engine stopped".into(),
            });
            s.log.on_event(&e);
            match e {
                Event::Delta { text, .. } if !text.is_empty() => {
                    s.pending.push_back(ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                    ));
                }
                Event::Delta { .. } => {}
                Event::Done {
                    finish,
                    completion_tokens,
                    stop,
                    ..
                } => {
                    s.pending.push_back(ev(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": 0}),
                    ));
                    s.pending.push_back(ev(
                        "message_delta",
                        json!({"type": "message_delta",
                               "delta": {"stop_reason": stop_reason(Some(finish), &stop), "stop_sequence": stop},
                               "usage": {"output_tokens": completion_tokens}}),
                    ));
                    s.pending
                        .push_back(ev("message_stop", json!({"type": "message_stop"})));
                    s.done = true;
                    s.log.done(None);
                }
                Event::Error { message, .. } => {
                    s.pending.push_back(ev(
                        "error",
                        json!({"type": "error", "error": {"type": "api_error", "message": message}}),
                    ));
                    s.done = true;
                }
            }
        }
    });
    Sse::new(stream).into_response()
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}` for the rendered prompt.
pub(super) async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async || -> Result<Value, ApiError> {
        let body = body_json(body)?;
        let ready = st.model(&body).await?;
        let v = openai_request(&body, true)?;
        let req = super::request::GenerationRequest::chat_prompt(&v)?;
        let (msgs, plan) = chat_messages(&ready, &req)?;
        let prompt = render_chat(&ready, &msgs, &plan)?;
        let ids = ready.text.tokenizer.encode(&prompt, false).map_err(|e| {
            ApiError::invalid("messages", format!("cannot tokenize the prompt: {e}"))
        })?;
        Ok(json!({"input_tokens": ids.len()}))
    };
    match run().await {
        Ok(v) => Json(v).into_response(),
        Err(e) => err(e),
    }
}
