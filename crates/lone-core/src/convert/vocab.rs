//! A checkpoint's tokenizer as llama.cpp's converter writes it for byte-level BPE vocabularies
//! (`_set_vocab_gpt2` and gguf-py's `SpecialVocab`): the token list and types, the
//! pre-tokenizer name, the merges, the special token ids, whether BOS/EOS are added, and the
//! chat template.
//!
//! Differences, by choice: an added token that is not normalized is written as stored (the
//! converter re-encodes and decodes it, which gives the same text for every tokenizer lone
//! supports); a list of named chat templates keeps only the one named `default`; normalizer
//! flags (lowercasing, accent stripping; WordPiece vocabularies) are not written.

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::pre_table::{CHECK_TEXT, PRE_TOKENIZERS};
use crate::error::{Error, Result};
use crate::loader::gguf::MetaValue;

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

const SPECIAL_TYPES: [&str; 7] = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

pub(super) fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = crate::error::read_text(path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            msg: format!("invalid JSON: {e}"),
        })
}

/// The converter's test for added tokens that should be control tokens.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

fn set_add(v: &mut Vec<(String, bool)>, k: &str, b: bool, overwrite: bool) {
    match v.iter_mut().find(|(n, _)| n == k) {
        Some(slot) if overwrite => slot.1 = b,
        Some(_) => {}
        None => v.push((k.to_string(), b)),
    }
}

/// tokenizer_config.json's `<typ>_token` (a string or `{"content": …}`).
fn tc_token(tc: &Option<Value>, typ: &str) -> Option<String> {
    match tc.as_ref()?.get(format!("{typ}_token"))? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// gguf-py's crude reading of a `TemplateProcessing` post-processor: whether BOS, EOS and a
/// separator are added, and which tokens they are (written back into the tokenizer config,
/// as gguf-py does).
fn template_processing(
    p: &Value,
    tc: &mut Option<Value>,
    special_types: &mut Vec<String>,
    add: &mut Vec<(String, bool)>,
) {
    let sp = |v: &Value| -> Option<String> {
        v.pointer("/SpecialToken/id")
            .and_then(|s| s.as_str())
            .map(str::to_string)
    };
    let seq = |v: &Value| -> Option<String> {
        v.pointer("/Sequence/id")
            .and_then(|s| s.as_str())
            .map(str::to_string)
    };
    let arr = |k: &str| -> Vec<Value> {
        p.get(k)
            .and_then(|s| s.as_array())
            .cloned()
            .unwrap_or_default()
    };
    let (single, pair) = (arr("single"), arr("pair"));
    let has_tc = tc
        .as_ref()
        .is_some_and(|t| t.as_object().is_some_and(|o| !o.is_empty()));
    let mut bos = tc_token(tc, "bos");
    let mut cls = tc_token(tc, "cls");
    let mut eos = tc_token(tc, "eos");
    let sep = tc_token(tc, "sep");
    let put = |tc: &mut Option<Value>, k: &str, v: Value| {
        if let Some(Value::Object(o)) = tc.as_mut() {
            o.insert(k.to_string(), v);
        }
    };
    let (mut first, mut last) = (None, None);
    if single.len() > 1 {
        first = sp(&single[0]);
        if let Some(f) = &first {
            if !has_tc {
                bos = Some(f.clone());
            } else if Some(f) != bos.as_ref() && Some(f) != cls.as_ref() {
                if bos.is_none() {
                    bos = Some(f.clone());
                    put(tc, "bos_token", Value::String(f.clone()));
                }
                if cls.is_none() {
                    cls = Some(f.clone());
                    put(tc, "cls_token", Value::String(f.clone()));
                }
            }
            let is = Some(f) == bos.as_ref() || Some(f) == cls.as_ref();
            set_add(add, "bos", is, true);
        }
        last = single.last().and_then(sp);
        if let Some(l) = &last {
            if !has_tc {
                eos = Some(l.clone());
            } else if Some(l) != eos.as_ref() {
                let old = eos.clone().map(Value::String).unwrap_or(Value::Null);
                if !special_types.iter().any(|t| t == "eot") {
                    special_types.push("eot".into());
                    put(tc, "eot_token", old);
                } else if !special_types.iter().any(|t| t == "eom") {
                    special_types.push("eom".into());
                    put(tc, "eom_token", old);
                }
                eos = Some(l.clone());
                put(tc, "eos_token", Value::String(l.clone()));
            }
            set_add(add, "eos", Some(l) == eos.as_ref(), true);
        }
    }
    if pair.is_empty() {
        return;
    }
    let start = usize::from(first.is_some() && sp(&pair[0]) == first);
    let stop = if last.is_some() && pair.last().and_then(sp) == last {
        pair.len().saturating_sub(1)
    } else {
        pair.len()
    };
    let inner = if start < stop {
        &pair[start..stop]
    } else {
        &[][..]
    };
    if inner.is_empty() {
        return;
    }
    let (a, b) = (seq(&inner[0]), seq(&inner[inner.len() - 1]));
    if a.as_deref() != Some("A") || b.as_deref() != Some("B") || inner.len() < 3 {
        return;
    }
    let mid = &inner[1..inner.len() - 1];
    let mut add_sep = false;
    if let Some(e) = sp(&mid[0]) {
        if (Some(&e) == sep.as_ref() || Some(&e) == eos.as_ref()) && last.is_none() {
            add_sep = true;
        }
    }
    if mid.len() == 2 {
        if let Some(e) = sp(&mid[1]) {
            if Some(&e) == sep.as_ref() || Some(&e) == eos.as_ref() {
                add_sep = true;
            }
        }
    }
    set_add(add, "sep", add_sep, true);
    if add_sep && sep.is_none() && has_tc {
        if let Some(e) = eos {
            put(tc, "sep_token", Value::String(e));
        }
    }
}

/// The pre-tokenizer name llama.cpp gives this tokenizer: the sha256 of its ids for
/// [`CHECK_TEXT`] looked up in llama.cpp's table.
pub fn pre_tokenizer(tok: &tokenizers::Tokenizer) -> Result<(String, Option<&'static str>)> {
    let enc = tok.encode(CHECK_TEXT, true).map_err(|e| {
        Error::Tokenizer(format!("cannot encode the pre-tokenizer check text: {e}"))
    })?;
    let ids: Vec<String> = enc.get_ids().iter().map(|i| i.to_string()).collect();
    let printed = format!("[{}]", ids.join(", "));
    let hash = Sha256::digest(printed.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let name = PRE_TOKENIZERS
        .iter()
        .find(|(h, _)| *h == hex)
        .map(|(_, n)| *n);
    Ok((hex, name))
}

/// Append the tokenizer metadata of checkpoint `dir` to `kv` (in the converter's order).
/// `vocab_size` is config.json's; `pre` overrides the pre-tokenizer name.
pub fn add_gpt2_vocab(
    dir: &Path,
    vocab_size: usize,
    pre: Option<&str>,
    kv: &mut super::Plan,
) -> Result<()> {
    let tok_path = dir.join("tokenizer.json");
    let tok_json = read_json(&tok_path)?.ok_or_else(|| Error::BadFile {
        path: tok_path.clone(),
        msg: "missing: lone convert needs the checkpoint's tokenizer.json (a byte-level BPE \
              tokenizer)"
            .into(),
    })?;
    let model_type = tok_json
        .pointer("/model/type")
        .and_then(|t| t.as_str())
        .unwrap_or("");
    if model_type != "BPE" {
        return Err(Error::BadFile {
            path: tok_path,
            msg: format!(
                "tokenizer model {model_type:?}: lone convert writes BPE (gpt2-style) vocabularies only"
            ),
        });
    }
    let tok = tokenizers::Tokenizer::from_file(&tok_path).map_err(|e| Error::BadFile {
        path: tok_path.clone(),
        msg: format!("not a tokenizers file: {e}"),
    })?;
    let added: Vec<(u32, String, bool)> = tok_json
        .get("added_tokens")
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|t| {
                    Some((
                        t.get("id")?.as_u64()? as u32,
                        t.get("content")?.as_str()?.to_string(),
                        t.get("special").and_then(|s| s.as_bool()).unwrap_or(false),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();

    // Tokens and types.
    let vocab = tok.get_vocab(true);
    let mut by_id: Vec<Option<&str>> = vec![None; vocab_size];
    for (t, &id) in &vocab {
        if (id as usize) >= vocab_size {
            return Err(Error::BadFile {
                path: tok_path,
                msg: format!("token {t:?} has id {id}, past config.json's vocab_size {vocab_size}"),
            });
        }
        by_id[id as usize] = Some(t.as_str());
    }
    let mut tokens = Vec::with_capacity(vocab_size);
    let mut types = Vec::with_capacity(vocab_size);
    for (i, t) in by_id.iter().enumerate() {
        match t {
            None => {
                tokens.push(MetaValue::String(format!("[PAD{i}]")));
                types.push(MetaValue::I32(UNUSED));
            }
            Some(t) if added.iter().any(|(_, c, _)| c == t) => {
                let special = added
                    .iter()
                    .find(|(id, _, _)| *id == i as u32)
                    .is_some_and(|a| a.2);
                if special || looks_special(t) {
                    tokens.push(MetaValue::String(t.to_string()));
                    types.push(MetaValue::I32(CONTROL));
                } else {
                    tokens.push(MetaValue::String(t.replace('\u{2581}', " ")));
                    types.push(MetaValue::I32(USER_DEFINED));
                }
            }
            Some(t) => {
                tokens.push(MetaValue::String(t.to_string()));
                types.push(MetaValue::I32(NORMAL));
            }
        }
    }
    let pre = match pre {
        Some(p) => p.to_string(),
        None => {
            let (hash, name) = pre_tokenizer(&tok)?;
            name.ok_or_else(|| {
                Error::Tokenizer(format!(
                    "llama.cpp does not know this tokenizer's pre-tokenizer (check hash {hash}); \
                     name it with --tokenizer-pre (e.g. llama-bpe, qwen2, smollm, lfm2, gpt-2)"
                ))
            })?
            .to_string()
        }
    };
    kv.set("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    kv.set("tokenizer.ggml.pre", MetaValue::String(pre));
    kv.set("tokenizer.ggml.tokens", MetaValue::Array(tokens));
    kv.set("tokenizer.ggml.token_type", MetaValue::Array(types));

    // Merges (the 4.45+ pair form is joined with a space, spaces inside encoded as U+0120).
    let merges: Vec<MetaValue> = match tok_json.pointer("/model/merges").and_then(|m| m.as_array())
    {
        Some(m) => m
            .iter()
            .map(|e| match e {
                Value::String(s) => Ok(s.clone()),
                Value::Array(p) if p.len() == 2 => Ok(p
                    .iter()
                    .map(|x| x.as_str().unwrap_or("").replace(' ', "\u{0120}"))
                    .collect::<Vec<_>>()
                    .join(" ")),
                _ => Err(Error::BadFile {
                    path: dir.join("tokenizer.json"),
                    msg: "unknown merges format".into(),
                }),
            })
            .map(|r| r.map(MetaValue::String))
            .collect::<Result<_>>()?,
        None => vec![],
    };
    if !merges.is_empty() {
        kv.set("tokenizer.ggml.merges", MetaValue::Array(merges));
    }

    // Special tokens, as gguf-py's SpecialVocab finds them.
    let mut tc = read_json(&dir.join("tokenizer_config.json"))?;
    let mut special_ids: Vec<(String, u32)> = Vec::new();
    let mut add_special: Vec<(String, bool)> = Vec::new();
    let mut special_types: Vec<String> = SPECIAL_TYPES.iter().map(|s| s.to_string()).collect();
    for (missing, from) in [("bos", "cls"), ("eos", "sep")] {
        if tc_token(&tc, missing).is_none() {
            if let (Some(v), Some(Value::Object(o))) = (tc_token(&tc, from), tc.as_mut()) {
                o.insert(format!("{missing}_token"), Value::String(v));
            }
        }
    }
    if let Some(pp) = tok_json.get("post_processor").filter(|p| !p.is_null()) {
        let procs: Vec<&Value> = match pp.get("processors").and_then(|p| p.as_array()) {
            Some(a) => a.iter().collect(),
            None => vec![pp],
        };
        for p in procs {
            match p.get("type").and_then(|t| t.as_str()) {
                Some("ByteLevel") => {
                    set_add(&mut add_special, "bos", false, false);
                    set_add(&mut add_special, "eos", false, false);
                }
                Some("RobertaProcessing") => {
                    for k in ["bos", "eos", "sep"] {
                        set_add(&mut add_special, k, true, true);
                    }
                }
                Some("TemplateProcessing") => {
                    template_processing(p, &mut tc, &mut special_types, &mut add_special);
                }
                _ => {}
            }
        }
    }
    if let Some(cfg) = tc.as_ref() {
        for typ in &special_types {
            if let Some(b) = cfg
                .get(format!("add_{typ}_token"))
                .and_then(|b| b.as_bool())
            {
                set_add(&mut add_special, typ, b, false);
            }
            let Some(content) = tc_token(&tc, typ) else {
                continue;
            };
            if let Some((id, _, _)) = added.iter().find(|(_, c, _)| *c == content) {
                if !special_ids.iter().any(|(t, _)| t == typ) {
                    special_ids.push((typ.clone(), *id));
                }
            }
        }
    }
    if let Some(cfg) = read_json(&dir.join("config.json"))? {
        for typ in &special_types {
            let key = format!("{typ}_token_id");
            let v = cfg
                .get(&key)
                .or_else(|| cfg.get("text_config").and_then(|t| t.get(&key)));
            if let Some(id) = v.and_then(|v| v.as_u64()) {
                if !special_ids.iter().any(|(t, _)| t == typ) {
                    special_ids.push((typ.clone(), id as u32));
                }
            }
        }
    }
    for (typ, id) in &special_ids {
        let key = match typ.as_str() {
            "bos" => "bos_token_id",
            "eos" => "eos_token_id",
            "unk" => "unknown_token_id",
            "sep" => "seperator_token_id",
            "pad" => "padding_token_id",
            "mask" => "mask_token_id",
            "eot" => "eot_token_id",
            "eom" => "eom_token_id",
            _ => continue, // gguf-py has no key for cls
        };
        kv.set(&format!("tokenizer.ggml.{key}"), MetaValue::U32(*id));
    }
    for (typ, b) in &add_special {
        if matches!(typ.as_str(), "bos" | "eos" | "sep") {
            kv.set(
                &format!("tokenizer.ggml.add_{typ}_token"),
                MetaValue::Bool(*b),
            );
        }
    }

    // Chat template: tokenizer_config.json's, else chat_template.jinja (with the named
    // templates of additional_chat_templates/) / chat_template.json.
    if let Some(cfg) = tc.as_ref() {
        let alt = if dir.join("chat_template.jinja").is_file() {
            let default = crate::error::read_text(&dir.join("chat_template.jinja"))?;
            let extra = crate::tokenizer::additional_chat_templates(dir)?;
            if extra.is_empty() {
                Some(Value::String(default))
            } else {
                let mut list = vec![serde_json::json!({"name": "default", "template": default})];
                list.extend(
                    extra
                        .into_iter()
                        .map(|(name, t)| serde_json::json!({"name": name, "template": t})),
                );
                Some(Value::Array(list))
            }
        } else {
            read_json(&dir.join("chat_template.json"))?
                .and_then(|j| j.get("chat_template").cloned())
        };
        match cfg.get("chat_template").cloned().or(alt) {
            Some(Value::String(s)) => kv.set("tokenizer.chat_template", MetaValue::String(s)),
            Some(Value::Array(list)) => set_chat_templates(kv, &list),
            _ => {}
        }
    }
    Ok(())
}

/// A list of `{name, template}` as gguf-py's `add_chat_template` writes it: each named one
/// (its name with every character but ASCII letters and digits made `_`) as
/// `tokenizer.chat_template.NAME`, then `tokenizer.chat_templates` listing those names, then
/// the `default` one as `tokenizer.chat_template`. gguf-py lists the names in the order of a
/// Python set (arbitrary when there are several); lone keeps their order in the list.
fn set_chat_templates(kv: &mut super::Plan, list: &[Value]) {
    let mut default = None;
    let mut names: Vec<String> = Vec::new();
    for choice in list {
        let name: String = choice
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let Some(template) = choice.get("template").and_then(Value::as_str) else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        if name == "default" {
            default = Some(template.to_string());
        } else {
            kv.set(
                &format!("tokenizer.chat_template.{name}"),
                MetaValue::String(template.to_string()),
            );
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    if !names.is_empty() {
        kv.set(
            "tokenizer.chat_templates",
            MetaValue::Array(names.into_iter().map(MetaValue::String).collect()),
        );
    }
    if let Some(t) = default {
        kv.set("tokenizer.chat_template", MetaValue::String(t));
    }
}
