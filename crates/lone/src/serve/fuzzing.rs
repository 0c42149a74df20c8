//! The server's request parsing, for the `openai_request` fuzz target (`fuzz/`) and its
//! stable-toolchain run (`crates/lone/tests/fuzz.rs`): arbitrary bytes as the body of every
//! generation endpoint, through everything a handler does before it queues sequences — JSON,
//! typed fields, sampling settings, speculation overrides, messages and roles, tools and
//! response formats (grammar compilation), image parts (data URLs and base64 decoded as images),
//! the chat template, tokenization, the Anthropic and ollama conversions. Must return (an error
//! is fine), never panic or hang.

use std::path::Path;
use std::sync::Arc;

use lone_core::text::TextIo;
use serde_json::{Map, Value};

use super::openai::{self, Kind, Prompt};
use super::request::{GenerationRequest, Input};
use super::{anthropic, ollama, tools};

/// A loaded tokenizer and template to parse requests against (the model itself is not run).
pub struct RequestFuzz {
    text: Arc<TextIo>,
    tools: tools::ToolSupport,
    vocab: usize,
}

impl RequestFuzz {
    /// From a model directory or GGUF file (the tiny fixtures).
    pub fn new(model: &Path) -> anyhow::Result<RequestFuzz> {
        let m = lone_core::Model::load(model)?;
        let text = TextIo::load(&m, model)?;
        let vocab = m.cfg.vocab_size;
        let tools = tools::ToolSupport::new(&text, vocab);
        Ok(RequestFuzz {
            text: Arc::new(text),
            tools,
            vocab,
        })
    }

    pub fn run(&self, body: &[u8]) {
        let Ok(v) = openai::parse_body(body) else {
            return;
        };
        self.openai(&v);
        if let Ok(req) = anthropic::openai_request(&v, false) {
            self.openai(&req);
        }
        let mut req = Map::new();
        if ollama::openai_fields(&v, &mut req).is_ok() {
            if let Some(m) = v.get("messages") {
                req.insert("messages".into(), m.clone());
            }
            self.openai(&Value::Object(req));
        }
    }

    /// What `start` checks and builds for a chat and a completions request.
    fn openai(&self, v: &Value) {
        for kind in [Kind::Chat, Kind::Completion] {
            let Ok(req) = GenerationRequest::from_openai(v, kind) else {
                continue;
            };
            let _ = req.common.settings(self.vocab);
            let _ = req.common.spec_params(&Default::default(), false);
            let Ok(plan) = tools::plan(&self.tools, &req.tools) else {
                continue;
            };
            match &req.input {
                Input::Chat { images, .. } => {
                    // Decoded as a handler decodes them (URLs are not fetched here).
                    for r in images.iter().take(super::images::MAX_IMAGES) {
                        let _ = super::images::decode_one(r, false);
                    }
                    let msgs =
                        tools::template_messages(&self.tools, req.messages().to_vec(), &plan);
                    if let Ok(p) =
                        self.text
                            .render_chat_tools(&msgs, true, plan.template_tools.as_ref())
                    {
                        let _ = self.text.tokenizer.encode(&p, false);
                    }
                }
                Input::Completion { prompt, .. } => {
                    if let Prompt::Text(s) = prompt {
                        let _ = self.text.encode_raw(s);
                    }
                }
            }
        }
    }
}

/// The Python and C APIs' option parsing (`embed_options` target): the input up to its first
/// NUL is the C API's `options_json`; the rest, split at NULs, is the flag list the Python
/// API makes from keyword arguments. Both are only parsed (nothing is loaded). Must return
/// (an error is fine), never panic.
pub fn embed_options(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0);
    if let Ok(json) = std::str::from_utf8(parts.next().unwrap_or_default()) {
        let _ = super::local::serve_args_json(Some("model.gguf"), Some(json));
        let _ = super::local::serve_args_json(None, Some(json));
    }
    let flags: Vec<String> = parts
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let _ = super::local::serve_args(flags);
}
