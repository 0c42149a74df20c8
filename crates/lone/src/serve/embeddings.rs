//! `POST /v1/embeddings` (OpenAI's shape): mean-pooled, L2-normalised final hidden states
//! (llama-server's `--embeddings --pooling mean`), for a string, a list of strings, token ids
//! or lists of ids; `encoding_format` `float` or `base64` (little-endian f32, as OpenAI).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::openai::{self, ApiError, Prompt};
use super::{body_json, AppState, Ready};

/// Most inputs per request.
const MAX_INPUTS: usize = 256;

#[derive(Deserialize)]
struct Fields {
    input: Prompt,
    encoding_format: Option<String>,
    /// Accepted and checked: lone returns the model's full width.
    dimensions: Option<u64>,
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(A[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub(super) async fn embeddings(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(&st, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn run(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let v = body_json(body)?;
    let ready = st.model(&v).await?;
    embed(&ready, &v).await
}

/// The response to an embeddings request `v` for the model `ready`.
pub(super) async fn embed(ready: &Ready, v: &Value) -> Result<Value, ApiError> {
    let f: Fields = openai::fields(v)?;
    let base64_out = match f.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(o) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', got '{o}'"),
            ))
        }
    };
    let width = ready.hidden;
    if let Some(d) = f.dimensions {
        if d as usize != width {
            return Err(ApiError::invalid(
                "dimensions",
                format!("this model's embeddings have {width} dimensions; 'dimensions' cannot change that"),
            ));
        }
    }
    let tok = &ready.text.tokenizer;
    let encode = |s: &str| {
        tok.encode(s, true)
            .map_err(|e| ApiError::invalid("input", format!("cannot tokenize the input: {e}")))
    };
    let inputs: Vec<Vec<u32>> = match f.input {
        Prompt::Text(s) => vec![encode(&s)?],
        Prompt::Texts(v) => v.iter().map(|s| encode(s)).collect::<Result<_, _>>()?,
        Prompt::Ids(ids) => vec![ids],
        Prompt::IdLists(l) => l,
    };
    if inputs.is_empty() || inputs.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("'input' must hold between 1 and {MAX_INPUTS} items"),
        ));
    }
    for (i, t) in inputs.iter().enumerate() {
        if t.is_empty() {
            return Err(ApiError::invalid(
                "input",
                format!("input {i} is empty (0 tokens)"),
            ));
        }
        if t.len() > ready.ctx {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "input {i} has {} tokens; the context is {}",
                    t.len(),
                    ready.ctx
                ),
            )
            .code("context_length_exceeded"));
        }
        if let Some(&bad) = t.iter().find(|&&id| id as usize >= ready.vocab) {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "token id {bad} is out of the vocabulary (size {})",
                    ready.vocab
                ),
            ));
        }
    }
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job_inputs = inputs;
    ready
        .engine
        .run_job(super::engine::Job::new(move |model| {
            let r: Result<Vec<Vec<f32>>, String> = job_inputs
                .iter()
                .map(|t| model.embed_mean(t).map_err(|e| e.to_string()))
                .collect();
            let _ = tx.send(r);
            None
        }))
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The server is shutting down.",
            )
        })?;
    let vecs = rx
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the embedding job failed",
            )
        })?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e))?;
    let data: Vec<Value> = vecs
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let e = if base64_out {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": e})
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": ready.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(i.as_bytes()), o);
        }
    }
}
