//! Encode/decode/streaming against committed Hugging Face outputs
//! (tests/reference/tokenizer/generate.py).

use std::path::PathBuf;

use lone_core::tokenizer::Tokenizer;
use lone_core::Error;
use serde_json::Value;

fn reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/tokenizer")
}

fn load_expected(name: &str) -> Value {
    let p = reference()
        .join("expected")
        .join(format!("encode_{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_model(name: &str) -> Tokenizer {
    let tok = Tokenizer::from_dir(reference().join("assets").join(name)).unwrap();
    let exp = load_expected(name);
    assert_eq!(tok.vocab_size() as u64, exp["vocab_size"].as_u64().unwrap());
    let cases = exp["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let plain = tok.encode(text, false).unwrap();
        let special = tok.encode(text, true).unwrap();
        if plain != ids(&c["ids"]) {
            failures.push(format!("{text:?}: ids {plain:?} != {:?}", c["ids"]));
        }
        if special != ids(&c["ids_with_special"]) {
            failures.push(format!(
                "{text:?}: ids+special {special:?} != {:?}",
                c["ids_with_special"]
            ));
        }
        let want = ids(&c["ids_with_special"]);
        let dec = tok.decode(&want, false).unwrap();
        if dec != c["decoded"].as_str().unwrap() {
            failures.push(format!("{text:?}: decode {dec:?}"));
        }
        let dec_skip = tok.decode(&want, true).unwrap();
        if dec_skip != c["decoded_skip_special"].as_str().unwrap() {
            failures.push(format!("{text:?}: decode(skip) {dec_skip:?}"));
        }
        // streaming, one id at a time, equals the full decode
        for skip in [false, true] {
            let mut sd = tok.stream_decoder(skip);
            let mut acc = String::new();
            for &id in &want {
                if let Some(piece) = sd.push(id).unwrap() {
                    assert!(!piece.contains('\u{FFFD}'), "{text:?}: piece {piece:?}");
                    acc.push_str(&piece);
                }
            }
            if let Some(rest) = sd.finish().unwrap() {
                acc.push_str(&rest);
            }
            let full = tok.decode(&want, skip).unwrap();
            if acc != full {
                failures.push(format!("{text:?}: stream(skip={skip}) {acc:?} != {full:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
    tok
}

#[test]
fn lfm2_matches_hf() {
    let tok = check_model("lfm2");
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.bos_token(), Some("<|startoftext|>"));
    assert_eq!(tok.eos_ids(), &[7]);
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.pad_id(), Some(0));
    assert!(tok.add_bos_token());
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    // non-special added tokens are split out before BPE, as in HF
    assert_eq!(tok.token_to_id("python"), Some(64014));
    assert_eq!(tok.encode("python", false).unwrap(), vec![64014]);
    assert!(!tok.is_special(64014));
    assert!(tok.is_special(7));
    assert_eq!(tok.id_to_token(7).as_deref(), Some("<|im_end|>"));
}

#[test]
fn qwen25_matches_hf() {
    let tok = check_model("qwen2.5");
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.eos_ids(), &[151645]);
    assert_eq!(tok.pad_id(), Some(151643));
    assert!(!tok.add_bos_token());
    assert!(tok.chat_template().unwrap().contains("tool_call"));
    assert_eq!(tok.vocab_size(), 151665);
}

#[test]
fn from_file_has_no_config() {
    let tok = Tokenizer::from_file(reference().join("assets/qwen2.5/tokenizer.json")).unwrap();
    assert_eq!(tok.encode("Hello world", false).unwrap(), vec![9707, 1879]);
    assert!(tok.chat_template().is_none());
    assert!(tok.eos_ids().is_empty());
}

#[test]
fn invalid_ids_are_errors_not_panics() {
    let tok = Tokenizer::from_file(reference().join("assets/qwen2.5/tokenizer.json")).unwrap();
    let n = tok.vocab_size() as u32;
    for bad in [n, n + 1, u32::MAX] {
        match tok.decode(&[9707, bad], false) {
            Err(Error::Tokenizer(m)) => assert!(m.contains(&bad.to_string()), "{m}"),
            other => panic!("expected tokenizer error, got {other:?}"),
        }
        let mut sd = tok.stream_decoder(false);
        assert!(sd.push(bad).is_err());
    }
    assert!(tok.id_to_token(u32::MAX).is_none());
    assert_eq!(tok.decode(&[], false).unwrap(), "");
    assert!(Tokenizer::from_dir("/nonexistent/dir").is_err());
    assert!(Tokenizer::from_file(reference().join("generate.py")).is_err());
}

#[test]
fn stream_holds_back_split_characters() {
    let tok = Tokenizer::from_dir(reference().join("assets/qwen2.5")).unwrap();
    // "🦙" is several byte-level tokens; no piece may contain a partial character
    let text = "a🦙b 😶‍🌫️ 日本語";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > text.chars().count() / 2);
    let mut sd = tok.stream_decoder(false);
    let mut pieces = Vec::new();
    for &id in &ids {
        if let Some(p) = sd.push(id).unwrap() {
            pieces.push(p);
        }
    }
    pieces.extend(sd.finish().unwrap());
    assert_eq!(pieces.concat(), text);
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    // an incomplete character at the end is flushed exactly as a full decode renders it
    let llama = tok.encode("🦙", false).unwrap();
    let cut = &llama[..llama.len() - 1];
    let mut sd = tok.stream_decoder(false);
    let mut acc = String::new();
    for &id in cut {
        acc.extend(sd.push(id).unwrap());
    }
    assert_eq!(acc, "");
    acc.extend(sd.finish().unwrap());
    assert_eq!(acc, tok.decode(cut, false).unwrap());
    assert!(sd.finish().unwrap().is_none());
}

/// Named templates of a directory: the non-default entries of a tokenizer_config.json
/// `chat_template` list, and `additional_chat_templates/NAME.jinja` beside
/// `chat_template.jinja` (transformers' two layouts for them).
#[test]
fn named_chat_templates_of_a_directory() {
    let src = reference().join("assets/qwen2.5");
    let tmp = tempfile::tempdir().unwrap();
    let list = tmp.path().join("list");
    let jinja = tmp.path().join("jinja");
    for d in [&list, &jinja] {
        std::fs::create_dir(d).unwrap();
        std::fs::copy(src.join("tokenizer.json"), d.join("tokenizer.json")).unwrap();
    }
    let cfg = serde_json::json!({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]});
    std::fs::write(list.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let tok = Tokenizer::from_dir(&list).unwrap();
    assert_eq!(tok.chat_template(), Some("D"));
    assert_eq!(tok.chat_template_named("tool_use"), Some("T"));
    assert_eq!(tok.named_chat_templates().len(), 1);

    std::fs::write(jinja.join("tokenizer_config.json"), "{}").unwrap();
    std::fs::write(jinja.join("chat_template.jinja"), "D2").unwrap();
    std::fs::create_dir(jinja.join("additional_chat_templates")).unwrap();
    for (n, t) in [("tool_use", "T2"), ("rag", "R2")] {
        let p = jinja.join(format!("additional_chat_templates/{n}.jinja"));
        std::fs::write(p, t).unwrap();
    }
    std::fs::write(jinja.join("additional_chat_templates/notes.txt"), "x").unwrap();
    let tok = Tokenizer::from_dir(&jinja).unwrap();
    assert_eq!(tok.chat_template(), Some("D2"));
    let named: Vec<(&str, &str)> = tok
        .named_chat_templates()
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    assert_eq!(named, [("rag", "R2"), ("tool_use", "T2")]);
}
