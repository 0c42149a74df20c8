//! A model's text side: its tokenizer, chat template and end-of-sequence ids, found next to
//! the weights (HF directory) or inside them (GGUF).

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::loader::WeightFiles;
use crate::models::Model;
use crate::tokenizer::{ChatTemplate, StreamDecoder, Tokenizer};

pub struct TextIo {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// The `tool_use` template, where the model has one besides the default: requests with
    /// tools render with it (as transformers and llama.cpp choose).
    pub tool_template: Option<ChatTemplate>,
    /// Model config + generation_config + tokenizer EOS ids (and `<|im_end|>` where present).
    pub eos_ids: Vec<u32>,
}

impl TextIo {
    pub fn load(model: &Model, path: &Path) -> Result<TextIo> {
        let tokenizer = match &model.weights.files {
            WeightFiles::Gguf(g) => Tokenizer::from_gguf(g)?,
            WeightFiles::Safetensors(_) => Tokenizer::from_dir(path)?,
        };
        let mut tool_template = tokenizer.chat_template_renderer_named("tool_use")?;
        // Without a default, the tool_use template serves every request (llama.cpp's rule).
        let template = match tokenizer.chat_template_renderer()? {
            None => tool_template.take(),
            t => t,
        };
        let mut eos_ids = model.cfg.eos_token_ids.clone();
        for &id in tokenizer.eos_ids() {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        // ChatML models end a turn with <|im_end|> even where the config names another EOS.
        if let Some(id) = tokenizer.token_to_id("<|im_end|>") {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        eos_ids.retain(|&id| (id as usize) < model.cfg.vocab_size);
        Ok(TextIo {
            tokenizer,
            template,
            tool_template,
            eos_ids,
        })
    }

    /// Tokenize raw text, adding BOS etc. as the tokenizer is configured to.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text, true)
    }

    /// Render messages with the chat template (with the generation prompt) and tokenize.
    pub fn encode_chat(&self, messages: &[Json]) -> Result<Vec<u32>> {
        let text = self.render_chat(messages, true)?;
        self.tokenizer.encode(&text, false)
    }

    pub fn render_chat(&self, messages: &[Json], add_generation_prompt: bool) -> Result<String> {
        self.render_chat_tools(messages, add_generation_prompt, None)
    }

    /// [`render_chat`](Self::render_chat) with `tools` (OpenAI's list) given to the template.
    pub fn render_chat_tools(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        tools: Option<&Json>,
    ) -> Result<String> {
        let t = self.template_for(tools.is_some()).ok_or_else(|| {
            Error::Template("this model has no chat template; use a raw prompt instead".into())
        })?;
        t.render(messages, add_generation_prompt, tools, None)
    }

    /// The template a request renders with: the `tool_use` one when it has tools and the
    /// model has such a template, else the default.
    pub fn template_for(&self, with_tools: bool) -> Option<&ChatTemplate> {
        match &self.tool_template {
            Some(t) if with_tools => Some(t),
            _ => self.template.as_ref(),
        }
    }

    /// Replace the chat template (e.g. `--chat-template-file`): it then serves every request,
    /// with tools or not.
    pub fn set_template(&mut self, template: ChatTemplate) {
        self.template = Some(template);
        self.tool_template = None;
    }

    /// A single user turn, optionally after a system message.
    pub fn chat_prompt(&self, system: Option<&str>, user: &str) -> Result<Vec<u32>> {
        let mut msgs = Vec::new();
        if let Some(s) = system {
            msgs.push(serde_json::json!({"role": "system", "content": s}));
        }
        msgs.push(serde_json::json!({"role": "user", "content": user}));
        self.encode_chat(&msgs)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true)
    }

    pub fn stream(&self) -> StreamDecoder<'_> {
        self.tokenizer.stream_decoder(true)
    }
}
