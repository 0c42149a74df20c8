//! `Tokenizer::from_gguf` against llama.cpp's tokenizer test vectors and the HF tokenizers.

use std::path::PathBuf;

use lone_core::loader::gguf::GgufFile;
use lone_core::tokenizer::gguf::{
    GgufVocab, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED,
};
use lone_core::tokenizer::Tokenizer;
use serde_json::Value;

fn reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/tokenizer")
}

/// llama.cpp tests/test-tokenizer-0.cpp: inputs separated by "\n__ggml_vocab_test__\n",
/// one line of space-separated ids per input; tokenized with add_special=false.
fn vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = reference().join("gguf");
    let inp = std::fs::read_to_string(dir.join(format!("{name}.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    // as in read_tests(): a trailing separator does not start another input
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs: Vec<&str> = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(i) => {
                inputs.push(&rest[..i]);
                rest = &rest[i + sep.len()..];
            }
            None => {
                inputs.push(rest);
                rest = "";
            }
        }
    }
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}");
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(i, o)| {
            let ids = o.split_whitespace().map(|t| t.parse().unwrap()).collect();
            (i.to_string(), ids)
        })
        .collect()
}

fn check_vectors(name: &str) -> Tokenizer {
    let gguf = GgufFile::open(reference().join("gguf").join(name)).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let vs = vectors(name);
    assert!(vs.len() > 40);
    let mut failures = Vec::new();
    for (text, want) in &vs {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}: {got:?} != {want:?}"));
        }
        // streaming decode of the (BOS-prefixed) ids equals the full decode
        let ids = tok.encode(text, true).unwrap();
        for skip in [false, true] {
            let mut sd = tok.stream_decoder(skip);
            let mut acc = String::new();
            for &id in &ids {
                acc.extend(sd.push(id).unwrap());
            }
            acc.extend(sd.finish().unwrap());
            let full = tok.decode(&ids, skip).unwrap();
            if acc != full {
                failures.push(format!("{text:?}: stream {acc:?} != {full:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
    tok
}

#[test]
fn qwen2_gguf_vectors() {
    let tok = check_vectors("ggml-vocab-qwen2.gguf");
    assert_eq!(tok.vocab_size(), 151936);
    assert_eq!(tok.eos_ids(), &[151643]);
    assert!(!tok.add_bos_token());
    assert!(tok.chat_template().is_some());
    assert!(tok.is_special(151644));
}

#[test]
fn llama_bpe_gguf_vectors() {
    let tok = check_vectors("ggml-vocab-llama-bpe.gguf");
    assert_eq!(tok.bos_id(), Some(128000));
    assert!(tok.add_bos_token());
    let ids = tok.encode("Hello", true).unwrap();
    assert_eq!(ids[0], 128000);
    assert_eq!(tok.decode(&ids, true).unwrap(), "Hello");
}

#[test]
fn llama_spm_gguf_vectors() {
    let tok = check_vectors("ggml-vocab-llama-spm.gguf");
    assert_eq!(tok.bos_id(), Some(1));
    assert!(tok.add_bos_token());
    let ids = tok.encode("Hello world", true).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(tok.decode(&ids, true).unwrap(), "Hello world");
}

fn expected(name: &str) -> Value {
    let p = reference()
        .join("expected")
        .join(format!("encode_{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The Qwen2 GGUF vocabulary (Qwen1.5 era) is the same BPE as Qwen2.5's tokenizer.json.
#[test]
fn qwen2_gguf_equals_qwen25_tokenizer_json() {
    let gguf = GgufFile::open(reference().join("gguf/ggml-vocab-qwen2.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let exp = expected("qwen2.5");
    for c in exp["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert_eq!(tok.encode(text, false).unwrap(), ids(&c["ids"]), "{text:?}");
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&c["ids_with_special"]),
            "{text:?}"
        );
        assert_eq!(
            tok.decode(&ids(&c["ids"]), false).unwrap(),
            tok.decode(&ids(&c["ids"]), false).unwrap()
        );
        assert_eq!(
            tok.decode(&ids(&c["ids_with_special"]), false).unwrap(),
            c["decoded"].as_str().unwrap(),
            "{text:?}"
        );
    }
}

/// Builds the GGUF vocabulary llama.cpp's convert_hf_to_gguf.py would write for an HF
/// tokenizer.json (tokens by id, added special → CONTROL, other added → USER_DEFINED).
fn vocab_from_tokenizer_json(path: &str, pre: &str, bos: Option<u32>, eos: u32) -> GgufVocab {
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(reference().join(path)).unwrap()).unwrap();
    let mut entries: Vec<(u32, String, i32)> = j["model"]["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (v.as_u64().unwrap() as u32, k.clone(), TOKEN_TYPE_NORMAL))
        .collect();
    for a in j["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as u32;
        let ty = if a["special"].as_bool().unwrap() {
            TOKEN_TYPE_CONTROL
        } else {
            TOKEN_TYPE_USER_DEFINED
        };
        entries.retain(|e| e.0 != id);
        entries.push((id, a["content"].as_str().unwrap().to_string(), ty));
    }
    entries.sort();
    let n = entries.last().unwrap().0 as usize + 1;
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut types = vec![TOKEN_TYPE_USER_DEFINED; n];
    for (id, t, ty) in entries {
        tokens[id as usize] = t;
        types[id as usize] = ty;
    }
    let merges = j["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            _ => panic!("bad merge"),
        })
        .collect();
    GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: types,
        merges,
        bos_id: bos,
        eos_id: Some(eos),
        ..Default::default()
    }
}

/// LFM2's GGUF pre-tokenizer "lfm2": same pipeline as its tokenizer.json, BOS added,
/// `python`/`Mathias` (USER_DEFINED) split out before BPE.
#[test]
fn lfm2_gguf_vocab_equals_tokenizer_json() {
    let v = vocab_from_tokenizer_json("assets/lfm2/tokenizer.json", "lfm2", Some(1), 7);
    let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids(), &[7]);
    let exp = expected("lfm2");
    for c in exp["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert_eq!(tok.encode(text, false).unwrap(), ids(&c["ids"]), "{text:?}");
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&c["ids_with_special"]),
            "{text:?}"
        );
        let w = ids(&c["ids_with_special"]);
        assert_eq!(
            tok.decode(&w, false).unwrap(),
            c["decoded"].as_str().unwrap(),
            "{text:?}"
        );
        assert_eq!(
            tok.decode(&w, true).unwrap(),
            c["decoded_skip_special"].as_str().unwrap(),
            "{text:?}"
        );
    }
}

#[test]
fn unsupported_gguf_tokenizers_are_clear_errors() {
    let mut v = vocab_from_tokenizer_json("assets/lfm2/tokenizer.json", "lfm2", Some(1), 7);
    v.model = "bert".into();
    let e = Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string();
    assert!(e.contains("'bert'") && e.contains("gpt2"), "{e}");
    v.model = "gpt2".into();
    v.pre = Some("no-such-pre".into());
    let e = Tokenizer::from_gguf_vocab(&v).unwrap_err().to_string();
    assert!(e.contains("no-such-pre") && e.contains("llama-bpe"), "{e}");
}

/// A vocabulary the converter padded past the tokenizer (`[PADn]`, type UNUSED; the lfm2_vl
/// fixture's 544 ids over a 532-token tokenizer): the padding is no token, as in the HF
/// tokenizer (transformers has no such ids; llama.cpp decodes them to nothing), so generation
/// emits nothing for them; no text encodes to them, and the rest decodes as the HF tokenizer does.
#[test]
fn converter_padding_tokens_are_no_tokens() {
    let fixture = reference().join("../fixtures/lfm2_vl");
    let g = GgufFile::open(fixture.join("model-f32.gguf")).unwrap();
    let v = GgufVocab::from_gguf(&g).unwrap();
    let pads: Vec<u32> = (0..v.tokens.len())
        .filter(|&i| v.tokens[i].starts_with("[PAD"))
        .map(|i| i as u32)
        .collect();
    assert_eq!(pads.len(), 544 - 532, "the fixture's padding");
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let hf = Tokenizer::from_dir(&fixture).unwrap();
    assert_eq!(tok.vocab_size(), hf.vocab_size());
    for &p in &pads {
        assert_eq!(tok.id_to_token(p), None, "{p}");
        assert_eq!(hf.id_to_token(p), None, "{p}");
    }
    let text = "Hi [PAD520] there<|im_end|>";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(ids, hf.encode(text, false).unwrap());
    for skip in [false, true] {
        assert_eq!(
            tok.decode(&ids, skip).unwrap(),
            hf.decode(&ids, skip).unwrap()
        );
    }
}
