//! One generation request, read once from its body: what every front end (OpenAI chat and
//! completions, ollama and Anthropic after their conversion, the Python and C APIs) hands to
//! `start`. Its typed fields, its messages in transformers' form with their images listed, and
//! its prompt: nothing after this reads the JSON again.

use serde_json::Value;

use super::openai::{self, ApiError, Common, Kind, Prompt};
use super::tools::ToolFields;

/// A chat or completions request, checked field by field.
pub struct GenerationRequest {
    pub kind: Kind,
    /// Sampling, stopping, streaming and speculation settings.
    pub common: Common,
    /// Tools, tool choice and response formats (grammars).
    pub tools: ToolFields,
    pub input: Input,
}

/// What the request asks the model to continue.
pub enum Input {
    Chat {
        /// The messages as the chat template gets them (`normalize_messages`): content parts
        /// as `{"type": "text"}` / `{"type": "image", "image": REF}`, whatever the front end.
        messages: Vec<Value>,
        /// Every image part's reference (a data URL, base64, an http(s) URL), in order.
        images: Vec<String>,
        /// Top logprobs per token (`Some(0)`: the chosen token's only).
        logprobs: Option<usize>,
    },
    Completion {
        prompt: Prompt,
        logprobs: Option<usize>,
    },
}

impl GenerationRequest {
    /// An OpenAI-shaped body (`/v1/chat/completions` or `/v1/completions`, or what the ollama
    /// and Anthropic adapters convert theirs to).
    pub fn from_openai(v: &Value, kind: Kind) -> Result<GenerationRequest, ApiError> {
        let common: Common = openai::fields(v)?;
        let tools: ToolFields = openai::fields(v)?;
        let input = match kind {
            Kind::Chat => {
                let f: openai::ChatFields = openai::fields(v)?;
                let messages = openai::normalize_messages(&f.messages)?;
                let images = openai::message_images(&messages);
                let logprobs = match (f.logprobs.unwrap_or(false), f.top_logprobs) {
                    (_, Some(k)) if k > openai::MAX_TOP_LOGPROBS => {
                        return Err(ApiError::invalid(
                            "top_logprobs",
                            format!(
                                "'top_logprobs' must be between 0 and {}",
                                openai::MAX_TOP_LOGPROBS
                            ),
                        ))
                    }
                    (false, Some(k)) if k > 0 => {
                        return Err(ApiError::invalid(
                            "top_logprobs",
                            "'top_logprobs' needs 'logprobs': true",
                        ))
                    }
                    (true, k) => Some(k.unwrap_or(0) as usize),
                    (false, _) => None,
                };
                Input::Chat {
                    messages,
                    images,
                    logprobs,
                }
            }
            Kind::Completion => {
                let f: openai::CompletionFields = openai::fields(v)?;
                if f.echo.unwrap_or(false) {
                    return Err(ApiError::invalid("echo", "'echo' is not supported"));
                }
                let logprobs = match f.logprobs {
                    Some(k) if k > openai::MAX_TOP_LOGPROBS => {
                        return Err(ApiError::invalid(
                            "logprobs",
                            format!(
                                "'logprobs' must be between 0 and {}",
                                openai::MAX_TOP_LOGPROBS
                            ),
                        ))
                    }
                    k => k.map(|k| k as usize),
                };
                Input::Completion {
                    prompt: f.prompt,
                    logprobs,
                }
            }
        };
        Ok(GenerationRequest {
            kind,
            common,
            tools,
            input,
        })
    }

    /// A chat body read for its prompt only (`/apply-template`, token counting): its messages
    /// and tools; other fields are not looked at.
    pub fn chat_prompt(v: &Value) -> Result<GenerationRequest, ApiError> {
        let f: openai::ChatFields = openai::fields(v)?;
        let messages = openai::normalize_messages(&f.messages)?;
        Ok(GenerationRequest {
            kind: Kind::Chat,
            common: Common::default(),
            tools: openai::fields(v)?,
            input: Input::Chat {
                images: openai::message_images(&messages),
                messages,
                logprobs: None,
            },
        })
    }

    /// The chat messages (none for a completion).
    pub fn messages(&self) -> &[Value] {
        match &self.input {
            Input::Chat { messages, .. } => messages,
            Input::Completion { .. } => &[],
        }
    }
}
