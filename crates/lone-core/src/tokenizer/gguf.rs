//! Rebuilding a Hugging Face tokenizer from GGUF `tokenizer.*` metadata.
//!
//! GGUF stores the vocabulary as llama.cpp sees it: `tokenizer.ggml.model` names the algorithm,
//! `tokenizer.ggml.pre` names the pre-tokenizer (a fixed set of split regexes in llama.cpp's
//! `llama-vocab.cpp`), and each token has a type (NORMAL=1, UNKNOWN=2, CONTROL=3,
//! USER_DEFINED=4, UNUSED=5, BYTE=6). We translate this to the `tokenizer.json` that the
//! original Hugging Face model shipped, so that encoding matches transformers. Supported:
//! `gpt2` (byte-level BPE; pre-tokenizers listed in [`SUPPORTED_PRE`]) and `llama`
//! (SentencePiece BPE with byte fallback, merges rebuilt from the scores as transformers does).

use serde_json::{json, Map, Value as Json};

use super::{SpecialTokens, Tokenizer};
use crate::error::{Error, Result};
use crate::loader::gguf::{GgufFile, MetaValue};

pub const TOKEN_TYPE_NORMAL: i32 = 1;
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
pub const TOKEN_TYPE_CONTROL: i32 = 3;
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
pub const TOKEN_TYPE_UNUSED: i32 = 5;
pub const TOKEN_TYPE_BYTE: i32 = 6;

/// The `tokenizer.*` metadata of a GGUF file.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) is supported.
    pub model: String,
    /// `tokenizer.ggml.pre`: pre-tokenizer name ("qwen2", "llama-bpe", "smollm", "lfm2", ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (empty: all NORMAL).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, "left right" strings in rank order (gpt2).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` (llama/SentencePiece: merge priorities).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix` (llama/SentencePiece; default true).
    pub add_space_prefix: Option<bool>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.chat_template.NAME` (named templates such as `tool_use`), by name.
    pub named_templates: Vec<(String, String)>,
}

fn meta_err(key: &str, what: &str) -> Error {
    Error::Tokenizer(format!("GGUF metadata '{key}' {what}"))
}

fn string_array(gguf: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    let Some(v) = gguf.meta(key) else {
        return Ok(None);
    };
    let arr = v
        .as_array()
        .ok_or_else(|| meta_err(key, "is not an array"))?;
    arr.iter()
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| meta_err(key, "is not an array of strings"))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn id_key(gguf: &GgufFile, key: &str) -> Result<Option<u32>> {
    match gguf.meta(key) {
        None => Ok(None),
        Some(v) => {
            let id = v
                .as_i64()
                .ok_or_else(|| meta_err(key, "is not an integer"))?;
            // llama.cpp writes -1 (or u32::MAX) for "none"
            Ok(u32::try_from(id).ok().filter(|&x| x != u32::MAX))
        }
    }
}

impl GgufVocab {
    /// Reads the tokenizer metadata of a GGUF file.
    pub fn from_gguf(gguf: &GgufFile) -> Result<GgufVocab> {
        let model = gguf
            .meta("tokenizer.ggml.model")
            .and_then(MetaValue::as_str)
            .ok_or_else(|| {
                Error::Tokenizer(
                    "GGUF file has no 'tokenizer.ggml.model' (no embedded tokenizer)".into(),
                )
            })?
            .to_string();
        let tokens = string_array(gguf, "tokenizer.ggml.tokens")?
            .ok_or_else(|| meta_err("tokenizer.ggml.tokens", "is missing"))?;
        let token_types = match gguf.meta("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .ok_or_else(|| meta_err("tokenizer.ggml.token_type", "is not an array"))?
                .iter()
                .map(|x| {
                    x.as_i64()
                        .and_then(|t| i32::try_from(t).ok())
                        .ok_or_else(|| meta_err("tokenizer.ggml.token_type", "has a non-integer"))
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let merges = string_array(gguf, "tokenizer.ggml.merges")?.unwrap_or_default();
        let scores = match gguf.meta("tokenizer.ggml.scores") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .ok_or_else(|| meta_err("tokenizer.ggml.scores", "is not an array"))?
                .iter()
                .map(|x| x.as_f64().map(|f| f as f32).unwrap_or(0.0))
                .collect(),
        };
        let flag = |key: &str| gguf.meta(key).and_then(MetaValue::as_bool);
        Ok(GgufVocab {
            model,
            pre: gguf
                .meta("tokenizer.ggml.pre")
                .and_then(MetaValue::as_str)
                .map(str::to_string),
            tokens,
            token_types,
            merges,
            scores,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix"),
            bos_id: id_key(gguf, "tokenizer.ggml.bos_token_id")?,
            eos_id: id_key(gguf, "tokenizer.ggml.eos_token_id")?,
            eot_id: id_key(gguf, "tokenizer.ggml.eot_token_id")?,
            eom_id: id_key(gguf, "tokenizer.ggml.eom_token_id")?,
            pad_id: id_key(gguf, "tokenizer.ggml.padding_token_id")?,
            unk_id: id_key(gguf, "tokenizer.ggml.unknown_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token"),
            add_eos: flag("tokenizer.ggml.add_eos_token"),
            chat_template: gguf
                .meta("tokenizer.chat_template")
                .and_then(MetaValue::as_str)
                .map(str::to_string),
            named_templates: gguf
                .metadata
                .iter()
                .filter_map(|(k, v)| {
                    let name = k.strip_prefix("tokenizer.chat_template.")?;
                    Some((name.to_string(), v.as_str()?.to_string()))
                })
                .collect(),
        })
    }

    fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(TOKEN_TYPE_NORMAL)
    }
}

// Pre-tokenizer split regexes, as in the original tokenizer.json files (llama.cpp rewrites the
// case-insensitive group `(?i:...)` for its own regex engine; onig supports it natively).
const RE_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const RE_DIGIT: &str = r"\p{N}";
// llama.cpp's fallback for BPE vocabularies without (or with "default") pre-tokenizer
const RE_DEFAULT: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// How a `tokenizer.ggml.pre` maps to the Hugging Face pipeline.
struct PreConfig {
    /// Split regexes applied in sequence (each keeps matches and gaps as pieces).
    regexes: Vec<&'static str>,
    nfc: bool,
    ignore_merges: bool,
    default_add_bos: bool,
}

pub const SUPPORTED_PRE: &str = "qwen2 (deepseek-r1-qwen, megrez, stablelm2), qwen35, \
    llama3/llama-bpe (llama-v3, falcon3, pixtral, dbrx, smaug-bpe), lfm2, \
    smollm (starcoder, refact, codeshell), gpt-2 (mpt, olmo, phi-2), default";

fn pre_config(pre: Option<&str>) -> Result<PreConfig> {
    let cfg = |regexes: Vec<&'static str>, nfc, ignore_merges, default_add_bos| PreConfig {
        regexes,
        nfc,
        ignore_merges,
        default_add_bos,
    };
    Ok(match pre.unwrap_or("default") {
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => {
            cfg(vec![RE_QWEN2], true, false, false)
        }
        "qwen35" => cfg(vec![RE_QWEN35], true, false, false),
        // Llama 3 tokenizer.json sets ignore_merges; LFM2's does not (same regex).
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe" => {
            cfg(vec![RE_LLAMA3], false, true, true)
        }
        "lfm2" => cfg(vec![RE_LLAMA3], false, false, true),
        // SmolLM/StarCoder: Digits(individual) then GPT-2 byte-level regex
        "smollm" | "starcoder" | "refact" | "codeshell" => {
            cfg(vec![RE_DIGIT, RE_GPT2], false, false, false)
        }
        "gpt-2" | "gpt2" | "mpt" | "olmo" | "phi-2" => cfg(vec![RE_GPT2], false, false, false),
        "default" => cfg(RE_DEFAULT.to_vec(), false, false, false),
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported GGUF pre-tokenizer '{other}'; supported: {SUPPORTED_PRE}"
            )))
        }
    })
}

/// Builds the `tokenizers` pipeline for a GGUF vocabulary.
pub(super) fn build(v: &GgufVocab) -> Result<Tokenizer> {
    if v.model != "gpt2" && v.model != "llama" {
        return Err(Error::Tokenizer(format!(
            "unsupported GGUF tokenizer model '{}'; supported: gpt2 (byte-level BPE), \
             llama (SentencePiece BPE with byte fallback)",
            v.model
        )));
    }
    if v.tokens.is_empty() {
        return Err(Error::Tokenizer("GGUF vocabulary is empty".into()));
    }
    if v.tokens.len() > u32::MAX as usize {
        return Err(Error::Tokenizer("GGUF vocabulary is too large".into()));
    }
    if !v.token_types.is_empty() && v.token_types.len() != v.tokens.len() {
        return Err(Error::Tokenizer(format!(
            "GGUF has {} tokens but {} token types",
            v.tokens.len(),
            v.token_types.len()
        )));
    }
    let spm = v.model == "llama";
    let pre = if spm {
        // SentencePiece: no pre-tokenizer regexes; BOS by default
        PreConfig {
            regexes: Vec::new(),
            nfc: false,
            ignore_merges: false,
            default_add_bos: true,
        }
    } else {
        pre_config(v.pre.as_deref())?
    };

    // Every token goes into the BPE vocabulary (so added tokens keep their GGUF ids);
    // CONTROL/UNKNOWN become special added tokens, USER_DEFINED non-special ones, which HF
    // splits out of the text before BPE.
    let mut vocab = Map::with_capacity(v.tokens.len());
    let mut added = Vec::new();
    for (id, tok) in v.tokens.iter().enumerate() {
        let ty = v.token_type(id);
        // UNUSED: the converter's `[PADn]` filling a vocabulary padded past the tokenizer.
        // Left out, they decode to nothing (as in llama.cpp and transformers, which has no
        // such tokens) and no text encodes to them.
        if ty == TOKEN_TYPE_UNUSED {
            continue;
        }
        if !vocab.contains_key(tok) {
            vocab.insert(tok.clone(), json!(id));
        }
        let special = match ty {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => true,
            TOKEN_TYPE_USER_DEFINED => false,
            _ => continue,
        };
        if tok.is_empty() {
            continue;
        }
        added.push(json!({
            "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": !special, "special": special,
        }));
    }
    let mut merges = Vec::with_capacity(v.merges.len());
    if spm {
        for (a, b) in spm_merges(&v.tokens, &v.scores) {
            merges.push(json!([a, b]));
        }
    }
    for (i, m) in v.merges.iter().enumerate() {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| Error::Tokenizer(format!("GGUF merge {i} '{m}' is not 'left right'")))?;
        merges.push(json!([a, b]));
    }

    let mut pretoks: Vec<Json> = pre
        .regexes
        .iter()
        .map(|re| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false}))
        .collect();
    pretoks.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));

    let name = |id: Option<u32>| id.and_then(|i| v.tokens.get(i as usize).cloned());
    let add_bos = v.add_bos.unwrap_or(pre.default_add_bos) && v.bos_id.is_some();
    let add_eos = v.add_eos.unwrap_or(false) && v.eos_id.is_some();
    let byte_level_pp = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let post_processor = if add_bos || add_eos {
        let mut single = Vec::new();
        let mut special_tokens = Map::new();
        let mut push_special = |id: Option<u32>, single: &mut Vec<Json>| -> Result<()> {
            let id = id.ok_or_else(|| Error::Tokenizer("missing special token id".into()))?;
            let tok = name(Some(id)).ok_or_else(|| {
                Error::Tokenizer(format!("special token id {id} is out of range"))
            })?;
            single.push(json!({"SpecialToken": {"id": tok, "type_id": 0}}));
            special_tokens.insert(
                tok.clone(),
                json!({"id": tok, "ids": [id], "tokens": [tok]}),
            );
            Ok(())
        };
        if add_bos {
            push_special(v.bos_id, &mut single)?;
        }
        single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        if add_eos {
            push_special(v.eos_id, &mut single)?;
        }
        let mut pair = single.clone();
        pair.extend(single.iter().map(|p| match p.get("Sequence") {
            Some(_) => json!({"Sequence": {"id": "B", "type_id": 1}}),
            None => p.clone(),
        }));
        json!({"type": "Sequence", "processors": [
            byte_level_pp,
            {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens}
        ]})
    } else {
        byte_level_pp
    };

    let spec = if spm {
        let mut norm = Vec::new();
        if v.add_space_prefix.unwrap_or(true) {
            norm.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
        }
        norm.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
        let unk = name(v.unk_id);
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": norm},
            "pre_tokenizer": null,
            "post_processor": post_processor,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": usize::from(v.add_space_prefix.unwrap_or(true)), "stop": 0}
            ]},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                "ignore_merges": false, "vocab": vocab, "merges": merges,
            },
        })
    } else {
        json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": if pre.nfc { json!({"type": "NFC"}) } else { Json::Null },
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretoks},
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": pre.ignore_merges, "vocab": vocab, "merges": merges,
        },
        })
    };
    let bytes = serde_json::to_vec(&spec).map_err(|e| Error::Tokenizer(e.to_string()))?;
    let inner = tokenizers::Tokenizer::from_bytes(bytes)
        .map_err(|e| Error::Tokenizer(format!("cannot build tokenizer from GGUF: {e}")))?;

    let mut eos_ids = Vec::new();
    for id in [v.eos_id, v.eot_id, v.eom_id].into_iter().flatten() {
        if (id as usize) < v.tokens.len() && !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    let valid = |id: Option<u32>| id.filter(|&i| (i as usize) < v.tokens.len());
    let special = SpecialTokens {
        bos: name(v.bos_id),
        eos: name(v.eos_id),
        pad: name(v.pad_id),
        unk: name(v.unk_id),
        bos_id: valid(v.bos_id),
        eos_ids,
        pad_id: valid(v.pad_id),
    };
    let mut tok = Tokenizer::from_parts(inner, Default::default());
    tok.set_special(special, add_bos);
    tok.set_chat_templates(v.chat_template.clone(), v.named_templates.clone());
    Ok(tok)
}

/// BPE merges for a SentencePiece vocabulary, as transformers' `generate_merges`: every split
/// of a piece into two pieces of the vocabulary (ties by the parts' ids), ordered by the merged
/// piece's score, highest first (then longer left, longer right part), or by its id when there
/// are no scores.
fn spm_merges<'a>(tokens: &'a [String], scores: &[f32]) -> Vec<(&'a str, &'a str)> {
    let mut ids: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        ids.entry(t.as_str()).or_insert(i);
    }
    let use_scores = scores.len() == tokens.len();
    // (priority: lower sorts first, left len, right len, left, right)
    let mut merges: Vec<(f64, usize, usize, &str, &str)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if ids.get(piece.as_str()) != Some(&id) {
            continue;
        }
        let mut local = Vec::new();
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&il), Some(&ir)) = (ids.get(l), ids.get(r)) {
                local.push((il, ir, l, r));
            }
        }
        local.sort_by_key(|x| (x.0, x.1));
        for (_, _, l, r) in local {
            let (ll, rl) = (l.chars().count(), r.chars().count());
            merges.push(if use_scores {
                (
                    -f64::from(scores[id]),
                    usize::MAX - ll,
                    usize::MAX - rl,
                    l,
                    r,
                )
            } else {
                (id as f64, ll, rl, l, r)
            });
        }
    }
    // stable: equal keys keep vocabulary order, as Python's sorted() does
    merges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges.into_iter().map(|m| (m.3, m.4)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_and_pre_are_clear_errors() {
        let v = GgufVocab {
            model: "bert".into(),
            tokens: vec!["a".into()],
            ..Default::default()
        };
        let e = build(&v).unwrap_err().to_string();
        assert!(e.contains("'bert'") && e.contains("gpt2"), "{e}");
        let v = GgufVocab {
            model: "gpt2".into(),
            pre: Some("nonsense".into()),
            tokens: vec!["a".into()],
            ..Default::default()
        };
        let e = build(&v).unwrap_err().to_string();
        assert!(e.contains("'nonsense'") && e.contains("qwen2"), "{e}");
    }

    #[test]
    fn tiny_vocab_roundtrip() {
        let tokens: Vec<String> = ["a", "b", "ab", "Ġ", "Ġab", "<s>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let v = GgufVocab {
            model: "gpt2".into(),
            pre: Some("gpt-2".into()),
            token_types: vec![1, 1, 1, 1, 1, 3],
            tokens,
            merges: vec!["a b".into(), "Ġ ab".into()],
            bos_id: Some(5),
            add_bos: Some(true),
            ..Default::default()
        };
        let t = build(&v).unwrap();
        assert_eq!(t.encode("ab ab<s>", true).unwrap(), vec![5, 2, 4, 5]);
        assert_eq!(t.encode("ab ab", false).unwrap(), vec![2, 4]);
        assert_eq!(t.decode(&[5, 2, 4], true).unwrap(), "ab ab");
        assert_eq!(t.bos_id(), Some(5));
        assert!(t.decode(&[6], false).is_err());
    }
}
