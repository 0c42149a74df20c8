//! Images in requests (OpenAI `image_url` parts, ollama `images`, Anthropic `image` blocks,
//! all normalized to transformers' `{"type": "image", "image": ...}` parts): decoded here,
//! encoded on the engine thread between steps.

use std::sync::Arc;

use base64::Engine as _;
use lone_core::vision::{image, ImagePrompt, MAX_IMAGE_PIXELS};

use super::openai::ApiError;
use super::{bad_request, Ready};

type Reply = tokio::sync::oneshot::Sender<Result<ImagePrompt, String>>;

/// The job that encodes `e`'s next piece and, until every image is encoded, returns the job
/// for the piece after; then it answers `tx`. A request that went away stops it.
fn encode_piece(
    mut e: lone_core::vision::Encoding,
    tio: Arc<lone_core::text::TextIo>,
    tx: Reply,
) -> super::engine::Job {
    super::engine::Job::new(move |model| {
        let Some(v) = &model.vision else {
            let _ = tx.send(Err("the model has no vision tower".to_string()));
            return None;
        };
        if tx.is_closed() {
            return None;
        }
        match e.step(v, &model.compute) {
            Ok(false) => Some(encode_piece(e, tio, tx)),
            Ok(true) => {
                let _ = tx.send(e.finish(v, &tio.tokenizer).map_err(|e| e.to_string()));
                None
            }
            Err(err) => {
                let _ = tx.send(Err(err.to_string()));
                None
            }
        }
    })
}

/// Most images one request may carry.
pub const MAX_IMAGES: usize = 16;

/// The largest image an `http(s)` URL may deliver (`--allow-image-urls`).
pub const MAX_URL_BYTES: u64 = 20 << 20;

/// How long fetching one image URL may take, redirects and body included.
const URL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
                decode_one(r, ready.image_urls)
                    .map_err(|m| bad_request("messages", format!("image {i}: {m}")))
            })
            .collect()
    })
}

pub(super) fn decode_one(r: &str, fetch_urls: bool) -> Result<image::Rgb8, String> {
    let r = r.trim();
    if r.starts_with("http://") || r.starts_with("https://") {
        if !fetch_urls {
            return Err(
                "image URLs are not fetched: send the image inline as a data: URL \
                 (data:image/png;base64,...), or start the server with --allow-image-urls"
                    .into(),
            );
        }
        return image::decode(&fetch(r)?, MAX_IMAGE_PIXELS).map_err(|e| e.to_string());
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

/// The body of an `http(s)` image URL: a success status within [`URL_TIMEOUT`], at most
/// [`MAX_URL_BYTES`], up to 5 redirects.
fn fetch(url: &str) -> Result<Vec<u8>, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(URL_TIMEOUT))
        .max_redirects(5)
        .build()
        .into();
    let shown: String = url.chars().take(200).collect();
    let resp = agent
        .get(url)
        .header("User-Agent", concat!("lone/", env!("CARGO_PKG_VERSION")))
        .call()
        .map_err(|e| format!("cannot fetch {shown}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!(
            "fetching {shown} answered HTTP {}",
            status.as_u16()
        ));
    }
    resp.into_body()
        .with_config()
        .limit(MAX_URL_BYTES)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => format!(
                "the image at {shown} is larger than {} MiB",
                MAX_URL_BYTES >> 20
            ),
            e => format!("cannot read {shown}: {e}"),
        })
}

/// The prompt's tokens with each image's placeholder expanded, and its image rows'
/// embeddings, computed on the engine thread a piece (an LFM2-VL tile, an LFM3-VL image) at a
/// time, between the steps of the running sequences.
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
        .run_job(super::engine::Job::new(move |model| {
            let Some(v) = &model.vision else {
                let _ = tx.send(Err("the model has no vision tower".to_string()));
                return None;
            };
            match v.begin(&text, false, images) {
                Ok(e) => (encode_piece(e, tio, tx).0)(model),
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    None
                }
            }
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
