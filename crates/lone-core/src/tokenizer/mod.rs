//! Tokenizer and chat templates, matching Hugging Face `tokenizers`/`transformers` exactly.
//!
//! A [`Tokenizer`] comes from a model directory (`tokenizer.json` + `tokenizer_config.json`), a
//! single `tokenizer.json`, or GGUF metadata (rebuilt as the equivalent byte-level BPE).
//! [`StreamDecoder`] turns generated ids into text pieces as soon as they are complete UTF-8, and
//! [`ChatTemplate`] renders chat prompts as `apply_chat_template(tokenize=False)` does.

pub mod chat_template;
pub mod gguf;
pub mod stream;

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

pub use chat_template::{ChatMessage, ChatTemplate, DateTime};
pub use gguf::GgufVocab;
pub use stream::StreamDecoder;

mod bytes;
pub use bytes::byte_level_inverse;

use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;

/// A text tokenizer plus what the tokenizer side knows about special tokens and chat formatting.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    add_bos: bool,
    chat_template: Option<String>,
    /// Named templates besides the default (`tool_use`, `rag`, ...), by name.
    named_templates: Vec<(String, String)>,
}

/// Names and ids of the special tokens (`bos_token`, `eos_token`, ... as transformers calls them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub pad: Option<String>,
    pub unk: Option<String>,
    pub bos_id: Option<u32>,
    /// End-of-sequence ids: `eos_token`, then (GGUF) `eot`/`eom` ids, without duplicates.
    pub eos_ids: Vec<u32>,
    pub pad_id: Option<u32>,
}

impl SpecialTokens {
    /// The template variables transformers passes from `special_tokens_map`
    /// (`bos_token`, `eos_token`, `pad_token`, `unk_token`; absent ones are left undefined).
    pub fn template_vars(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        for (name, tok) in [
            ("bos_token", &self.bos),
            ("eos_token", &self.eos),
            ("unk_token", &self.unk),
            ("pad_token", &self.pad),
        ] {
            if let Some(t) = tok {
                v.push((name, t.clone()));
            }
        }
        v
    }
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

fn read_json(path: &Path) -> Result<Json> {
    let text = crate::error::read_text(path)?;
    serde_json::from_str(&text).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        msg: format!("invalid JSON: {e}"),
    })
}

/// A special-token entry of tokenizer_config.json / special_tokens_map.json:
/// either a string or `{"content": ...}`; `null` means "none".
fn token_content(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// What a model directory says about chat formatting and special tokens
/// (tokenizer_config.json, special_tokens_map.json, chat_template.jinja).
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// The chat template transformers would use: `chat_template.jinja` if present, else
    /// tokenizer_config.json `chat_template` (a string, or the `default` entry of a list of
    /// `{name, template}`).
    pub chat_template: Option<String>,
    /// The other entries of such a list, and `additional_chat_templates/NAME.jinja`.
    pub named_chat_templates: Vec<(String, String)>,
}

impl TokenizerConfig {
    /// Reads the files of a model directory; missing files give empty fields.
    pub fn from_dir(dir: &Path) -> Result<TokenizerConfig> {
        let mut cfg = TokenizerConfig::default();
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            Some(read_json(&config_path)?)
        } else {
            None
        };
        let map_path = dir.join("special_tokens_map.json");
        let map = if map_path.is_file() {
            Some(read_json(&map_path)?)
        } else {
            None
        };
        let pick = |key: &str| -> Option<String> {
            if let Some(c) = &config {
                if let Some(v) = c.get(key) {
                    // an explicit null in tokenizer_config.json means "no such token"
                    return token_content(Some(v));
                }
            }
            map.as_ref().and_then(|m| token_content(m.get(key)))
        };
        cfg.bos_token = pick("bos_token");
        cfg.eos_token = pick("eos_token");
        cfg.pad_token = pick("pad_token");
        cfg.unk_token = pick("unk_token");
        if let Some(c) = &config {
            cfg.add_bos_token = c.get("add_bos_token").and_then(Json::as_bool);
            cfg.add_eos_token = c.get("add_eos_token").and_then(Json::as_bool);
            cfg.chat_template = match c.get("chat_template") {
                Some(Json::String(s)) => Some(s.clone()),
                Some(Json::Array(list)) => {
                    cfg.named_chat_templates = named_from_list(list);
                    template_from_list(list, &config_path)?
                }
                _ => None,
            };
        }
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let text = crate::error::read_text(&jinja)?;
            cfg.chat_template = Some(text);
        }
        for (name, t) in additional_chat_templates(dir)? {
            match cfg
                .named_chat_templates
                .iter_mut()
                .find(|(n, _)| *n == name)
            {
                Some(slot) => slot.1 = t,
                None => cfg.named_chat_templates.push((name, t)),
            }
        }
        Ok(cfg)
    }
}

/// The named entries (not `default`) of a `chat_template` list.
fn named_from_list(list: &[Json]) -> Vec<(String, String)> {
    list.iter()
        .filter_map(|e| {
            let name = e.get("name")?.as_str()?;
            let tpl = e.get("template")?.as_str()?;
            (name != "default").then(|| (name.to_string(), tpl.to_string()))
        })
        .collect()
}

/// `additional_chat_templates/NAME.jinja` of a model directory (transformers' layout for
/// named templates beside `chat_template.jinja`), sorted by name.
pub fn additional_chat_templates(dir: &Path) -> Result<Vec<(String, String)>> {
    let sub = dir.join("additional_chat_templates");
    let mut out = Vec::new();
    if !sub.is_dir() {
        return Ok(out);
    }
    let entries = std::fs::read_dir(&sub).map_err(|e| Error::io(&sub, e))?;
    for e in entries {
        let path = e.map_err(|e| Error::io(&sub, e))?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("jinja") || !path.is_file() {
            continue;
        }
        if let Some(name) = path.file_stem().and_then(|s| s.to_str()) {
            out.push((name.to_string(), crate::error::read_text(&path)?));
        }
    }
    out.sort();
    Ok(out)
}

fn template_from_list(list: &[Json], path: &Path) -> Result<Option<String>> {
    let mut first = None;
    for entry in list {
        let name = entry.get("name").and_then(Json::as_str);
        let Some(tpl) = entry.get("template").and_then(Json::as_str) else {
            return Err(Error::BadFile {
                path: path.to_path_buf(),
                msg: "chat_template list entries need a string 'template'".into(),
            });
        };
        if name == Some("default") {
            return Ok(Some(tpl.to_string()));
        }
        first.get_or_insert_with(|| tpl.to_string());
    }
    Ok(first)
}

impl Tokenizer {
    /// Loads a `tokenizer.json`. Special tokens are not known (no config); see [`Tokenizer::from_dir`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let bytes = crate::error::read_bytes(path)?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            msg: format!("not a valid tokenizer.json: {e}"),
        })?;
        Ok(Tokenizer::from_parts(inner, TokenizerConfig::default()))
    }

    /// Loads `tokenizer.json` from a model directory together with `tokenizer_config.json`,
    /// `special_tokens_map.json` and `chat_template.jinja` when present.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let path: PathBuf = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::Tokenizer(format!(
                "no tokenizer.json in {} (only fast/`tokenizers` tokenizers are supported)",
                dir.display()
            )));
        }
        let mut tok = Tokenizer::from_file(&path)?;
        let cfg = TokenizerConfig::from_dir(dir)?;
        tok.apply_config(cfg);
        Ok(tok)
    }

    /// Builds the tokenizer described by a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer> {
        Tokenizer::from_gguf_vocab(&GgufVocab::from_gguf(gguf)?)
    }

    /// Builds the tokenizer from already extracted GGUF vocabulary metadata.
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Tokenizer> {
        gguf::build(vocab)
    }

    /// Wraps an existing `tokenizers::Tokenizer` with the given configuration.
    pub fn from_parts(inner: tokenizers::Tokenizer, cfg: TokenizerConfig) -> Tokenizer {
        let mut tok = Tokenizer {
            inner,
            special: SpecialTokens::default(),
            add_bos: false,
            chat_template: None,
            named_templates: Vec::new(),
        };
        tok.apply_config(cfg);
        tok
    }

    fn apply_config(&mut self, cfg: TokenizerConfig) {
        let id = |t: &Option<String>| t.as_deref().and_then(|t| self.inner.token_to_id(t));
        let bos_id = id(&cfg.bos_token);
        let eos_ids = id(&cfg.eos_token).into_iter().collect();
        let pad_id = id(&cfg.pad_token);
        self.special = SpecialTokens {
            bos: cfg.bos_token,
            eos: cfg.eos_token,
            pad: cfg.pad_token,
            unk: cfg.unk_token,
            bos_id,
            eos_ids,
            pad_id,
        };
        // The post-processor in tokenizer.json is what actually adds BOS; this flag reports
        // the configuration (and whether that processor adds a BOS when asked to).
        self.add_bos = cfg.add_bos_token.unwrap_or_else(|| {
            bos_id.is_some_and(|b| {
                self.inner
                    .encode("", true)
                    .map(|e| e.get_ids().first() == Some(&b))
                    .unwrap_or(false)
            })
        });
        self.chat_template = cfg.chat_template;
        self.named_templates = cfg.named_chat_templates;
    }

    pub(crate) fn set_special(&mut self, special: SpecialTokens, add_bos: bool) {
        self.special = special;
        self.add_bos = add_bos;
    }

    pub(crate) fn set_chat_templates(&mut self, tpl: Option<String>, named: Vec<(String, String)>) {
        self.chat_template = tpl;
        self.named_templates = named;
    }

    /// Encodes text. `add_special_tokens` applies the tokenizer's post-processor (e.g. BOS).
    /// Special/added tokens written in the text (`<|im_start|>`) are always recognised, as in HF.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Whether [`encode`](Self::encode) reads special-token text (`<|im_start|>`) in the input
    /// as plain text rather than as the special token (llama.cpp's `parse_special = false`,
    /// what llama-perplexity does); added tokens that are not special still match.
    pub fn set_special_as_text(&mut self, on: bool) {
        self.inner.set_encode_special_tokens(on);
    }

    /// Decodes ids to text; `skip_special` drops special tokens. Unknown ids are an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.check_ids(ids)?;
        self.inner.decode(ids, skip_special).map_err(tok_err)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        for &id in ids {
            if self.inner.id_to_token(id).is_none() {
                return Err(Error::Tokenizer(format!(
                    "invalid token id {id} (vocabulary size {})",
                    self.vocab_size()
                )));
            }
        }
        Ok(())
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token's vocabulary string (byte-level encoded for BPE tokens, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos_id
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.special.eos_ids
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.special.pad_id
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.special.bos.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.special.eos.as_deref()
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// Whether encoding with special tokens starts with BOS (tokenizer_config `add_bos_token`,
    /// GGUF `tokenizer.ggml.add_bos_token`).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Whether the id is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_vocabulary()
            .simple_id_to_token(id)
            .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    /// The chat template source, if the tokenizer files carry one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The named templates besides the default (`tool_use`, ...), as (name, source).
    pub fn named_chat_templates(&self) -> &[(String, String)] {
        &self.named_templates
    }

    /// The source of the template called `name`, if the tokenizer files carry one.
    pub fn chat_template_named(&self, name: &str) -> Option<&str> {
        self.named_templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// A [`ChatTemplate`] for this tokenizer's template and special tokens, if it has one.
    pub fn chat_template_renderer(&self) -> Result<Option<ChatTemplate>> {
        self.renderer(self.chat_template.as_deref())
    }

    /// A [`ChatTemplate`] for the named template (e.g. `tool_use`), if there is one.
    pub fn chat_template_renderer_named(&self, name: &str) -> Result<Option<ChatTemplate>> {
        self.renderer(self.chat_template_named(name))
    }

    fn renderer(&self, src: Option<&str>) -> Result<Option<ChatTemplate>> {
        src.map(|s| ChatTemplate::with_special_tokens(s, &self.special.template_vars()))
            .transpose()
    }

    /// A streaming decoder over this tokenizer.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// The wrapped `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.special)
            .field("add_bos", &self.add_bos)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// Finds the chat template and special tokens of a model directory, as transformers would,
/// and returns a ready renderer (`None` if the directory has no template).
pub fn load_chat_template(dir: impl AsRef<Path>) -> Result<Option<ChatTemplate>> {
    let cfg = TokenizerConfig::from_dir(dir.as_ref())?;
    let Some(src) = &cfg.chat_template else {
        return Ok(None);
    };
    let special = SpecialTokens {
        bos: cfg.bos_token.clone(),
        eos: cfg.eos_token.clone(),
        pad: cfg.pad_token.clone(),
        unk: cfg.unk_token.clone(),
        ..Default::default()
    };
    Ok(Some(ChatTemplate::with_special_tokens(
        src,
        &special.template_vars(),
    )?))
}
