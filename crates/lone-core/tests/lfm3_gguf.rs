//! LFM3 from GGUF (tests/reference/fixtures/lfm3/model-*.gguf, written by generate.py; the
//! logits are checked in parity.rs). Here: the metadata lone reads equals the checkpoint's
//! config.json, the embedded tokenizer gives transformers' prompt ids, and a file that lacks a
//! key an lfm3 GGUF needs (or holds a value lone cannot honour) is refused with a message
//! naming it. The broken files are the fixture with one key renamed or one value patched.

use std::path::{Path, PathBuf};

use lone_core::config::{LayerKind, ModelConfig};
use lone_core::loader::gguf::GgufFile;
use lone_core::tokenizer::Tokenizer;
use lone_core::Model;
use serde_json::Value;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/fixtures/lfm3")
}

fn gguf_path() -> PathBuf {
    fixture().join("model-f32.gguf")
}

fn json(name: &str) -> Value {
    let p = fixture().join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// Where the GGUF string `s` (u64 length, then bytes) starts; it must occur exactly once.
fn find_string(bytes: &[u8], s: &str) -> usize {
    let mut pat = (s.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(s.as_bytes());
    let hits: Vec<usize> = bytes
        .windows(pat.len())
        .enumerate()
        .filter(|(_, w)| *w == pat.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "{s:?} occurs {} times", hits.len());
    hits[0]
}

/// Rename a metadata key or tensor in place (same length, so the file stays well-formed).
fn rename(bytes: &mut [u8], from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let at = find_string(bytes, from) + 8;
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
}

/// Byte offset of the value of metadata key `key` (after its u32 type tag).
fn value_at(bytes: &[u8], key: &str) -> usize {
    find_string(bytes, key) + 8 + key.len() + 4
}

/// Load the fixture GGUF after `edit`; the error message.
fn load_err(edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut bytes = std::fs::read(gguf_path()).unwrap();
    edit(&mut bytes);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, &bytes).unwrap();
    match Model::load(&p) {
        Ok(_) => panic!("the edited GGUF loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn metadata_matches_config_json() {
    let c = json("config.json");
    let cfg = ModelConfig::from_gguf(&GgufFile::open(gguf_path()).unwrap()).unwrap();
    cfg.validate().unwrap();
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    assert_eq!(cfg.arch.name(), "lfm3");
    assert_eq!(cfg.n_layers, n("num_hidden_layers"));
    assert_eq!(cfg.hidden_size, n("hidden_size"));
    assert_eq!(cfg.n_heads, n("num_attention_heads"));
    assert_eq!(cfg.n_kv_heads, n("num_key_value_heads"));
    assert_eq!(cfg.head_dim, n("head_dim"));
    assert_eq!(cfg.ffn_dim, n("intermediate_size"));
    assert_eq!(cfg.vocab_size, n("vocab_size"));
    assert_eq!(cfg.conv_kernel, n("conv_L_cache"));
    assert_eq!(cfg.sliding_window, n("sliding_window"));
    assert_eq!(cfg.max_position_embeddings, n("max_position_embeddings"));
    assert_eq!(cfg.norm_eps, c["norm_eps"].as_f64().unwrap() as f32);
    let kinds: Vec<LayerKind> = c["layer_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| match t.as_str().unwrap() {
            "conv" => LayerKind::Conv,
            "sliding_attention" => LayerKind::SlidingAttention,
            "full_attention" => LayerKind::Attention,
            other => panic!("{other}"),
        })
        .collect();
    assert_eq!(cfg.layer_kinds, kinds);
    let full = &c["rope_parameters"]["full_attention"];
    let swa = &c["rope_parameters"]["sliding_attention"];
    assert_eq!(full["rope_type"], "proportional");
    assert_eq!(swa["rope_type"], "default");
    assert_eq!(cfg.rope.theta, full["rope_theta"].as_f64().unwrap());
    assert!(cfg.rope.proportional);
    assert_eq!(
        cfg.rope.partial_rotary_factor,
        full["partial_rotary_factor"].as_f64().unwrap()
    );
    assert_eq!(cfg.rope_sliding.theta, swa["rope_theta"].as_f64().unwrap());
    assert!(!cfg.rope_sliding.proportional);
    assert_eq!(cfg.rope_sliding.partial_rotary_factor, 1.0);
    assert!(cfg.tie_embeddings && c["tie_word_embeddings"] == true);
    assert_eq!(
        cfg.family,
        lone_core::config::FamilyConfig::Lfm3 {
            attention_gate: c["use_attention_gate"].as_bool().unwrap(),
            sandwich_norm: c["use_sandwich_norm"].as_bool().unwrap(),
        }
    );
    assert_eq!(cfg.bos_token_id, Some(n("bos_token_id") as u32));
    assert_eq!(cfg.eos_token_ids, vec![n("eos_token_id") as u32]);
}

/// The embedded tokenizer encodes the prompt text as the HF tokenizer did (prompt_ids.json).
#[test]
fn embedded_tokenizer() {
    let tok = Tokenizer::from_gguf(&GgufFile::open(gguf_path()).unwrap()).unwrap();
    let text = json("meta.json")["prompt_text"]
        .as_str()
        .unwrap()
        .to_string();
    let want: Vec<u32> = serde_json::from_value(json("prompt_ids.json")).unwrap();
    assert_eq!(tok.encode(&text, false).unwrap(), want);
}

#[test]
fn missing_keys_are_named() {
    for key in [
        "attention.sliding_window_pattern",
        "attention.sliding_window",
        "rope.freq_base",
        "rope.freq_base_swa",
        "shortconv.l_cache",
    ] {
        let full = format!("lfm3.{key}");
        let msg = load_err(|b| rename(b, &full, &full.replacen("lfm3", "lfmX", 1)));
        assert!(
            msg.contains(&format!("lacks {full} (")) && msg.contains("an lfm3 GGUF needs"),
            "{full}: {msg}"
        );
    }
    let msg = load_err(|b| rename(b, "rope_freqs.weight", "rope_freqX.weight"));
    assert!(msg.contains("needs the tensor rope_freqs.weight"), "{msg}");
}

#[test]
fn unsupported_values_are_refused() {
    // a conv layer (layer 0) marked sliding
    let msg = load_err(|b| {
        // array: u32 element type, u64 count, then one byte per bool
        let at = value_at(b, "lfm3.attention.sliding_window_pattern") + 4 + 8;
        assert_eq!(b[at], 0);
        b[at] = 1;
    });
    assert!(msg.contains("layer 0 is a conv layer"), "{msg}");

    // partial RoPE in llama.cpp's sense (a rotary width below head_dim)
    let msg = load_err(|b| {
        let at = value_at(b, "lfm3.rope.dimension_count");
        assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 16);
        b[at..at + 4].copy_from_slice(&8u32.to_le_bytes());
    });
    assert!(msg.contains("lfm3.rope.dimension_count = 8"), "{msg}");

    // a frequency factor that is neither 1 nor "not rotated"
    let g = GgufFile::open(gguf_path()).unwrap();
    let t = g.tensor_info("rope_freqs.weight").unwrap().clone();
    drop(g);
    let msg = load_err(|b| {
        let at = t.offset + 4; // factor of pair 1
        assert_eq!(f32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 1.0);
        b[at..at + 4].copy_from_slice(&0.5f32.to_le_bytes());
    });
    assert!(
        msg.contains("other frequency factors are not supported"),
        "{msg}"
    );
}
