//! Images in requests (OpenAI `image_url` parts, ollama `images`, Anthropic `image` blocks,
//! all normalized to transformers' `{"type": "image", "image": ...}` parts): decoded here,
//! encoded on the engine thread between steps.

use std::sync::Arc;

use base64::Engine as _;
use lone_core::vision::{image, ImagePrompt, MAX_IMAGE_PIXELS};

use super::openai::ApiError;
use super::{bad_request, Ready};

/// Most images one request may carry.
pub const MAX_IMAGES: usize = 16;

/// Decode every image of a request (data URLs or bare base64): a 400 for a model without
/// a vision tower, too many images, a remote URL, bad base64 or bytes that are not an image.
pub fn decode_all(ready: &Ready, refs: &[String]) -> Result<Vec<image::Rgb8>, ApiError> {
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    if !ready.vision {
        return Err(bad_request(
            "messages",
            format!(
                "model '{}' takes no images (it has no vision tower); send text only, or load \
                 a vision-language model such as LFM2-VL",
                ready.id
            ),
        ));
    }
    if refs.len() > MAX_IMAGES {
        return Err(bad_request(
            "messages",
            format!(
                "{} images in one request; at most {MAX_IMAGES} are accepted",
                refs.len()
            ),
        ));
    }
    tokio::task::block_in_place(|| {
        refs.iter()
            .enumerate()
            .map(|(i, r)| {
                decode_one(r).map_err(|m| bad_request("messages", format!("image {i}: {m}")))
            })
            .collect()
    })
}

fn decode_one(r: &str) -> Result<image::Rgb8, String> {
    let r = r.trim();
    if r.starts_with("http://") || r.starts_with("https://") {
        return Err(
            "image URLs are not fetched: send the image inline as a data: URL \
                    (data:image/png;base64,...)"
                .into(),
        );
    }
    let b64 = match r.strip_prefix("data:") {
        Some(rest) => {
            let (head, data) = rest
                .split_once(',')
                .ok_or("a data: URL needs a comma before its data")?;
            if !head.ends_with(";base64") {
                return Err(
                    "only base64 data: URLs are accepted (data:image/...;base64,...)".into(),
                );
            }
            data
        }
        None => r,
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("invalid base64: {e}"))?;
    image::decode(&bytes, MAX_IMAGE_PIXELS).map_err(|e| e.to_string())
}

/// The prompt's tokens with each image's placeholder expanded, and its image rows'
/// embeddings, computed on the engine thread (between two steps of the running sequences).
pub fn prompt(
    ready: &Ready,
    text: &str,
    images: Vec<image::Rgb8>,
) -> Result<ImagePrompt, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tio = Arc::clone(&ready.text);
    let text = text.to_string();
    ready
        .engine
        .run_job(Box::new(move |model| {
            let r = match &model.vision {
                Some(v) => v
                    .prompt(&tio.tokenizer, &text, false, &images, &model.compute)
                    .map_err(|e| e.to_string()),
                None => Err("the model has no vision tower".to_string()),
            };
            let _ = tx.send(r);
        }))
        .map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The server is shutting down.",
            )
        })?;
    tokio::task::block_in_place(|| rx.blocking_recv())
        .map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the image encoding job failed",
            )
        })?
        .map_err(|e| bad_request("messages", e))
}
