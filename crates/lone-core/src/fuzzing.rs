//! What the fuzz targets (`fuzz/`, cargo-fuzz) and their stable-toolchain runs
//! (`crates/lone/tests/fuzz.rs`) feed arbitrary bytes to. Each function must return — an
//! error is fine — and never panic, abort, hang or allocate without bound, whatever the input.

use std::path::Path;

use serde_json::Value;

use crate::config::ModelConfig;
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::SafetensorsFiles;
use crate::tokenizer::{ChatTemplate, Tokenizer};
use crate::{Batch, Model};

const LABEL: &str = "fuzz-input";

/// xorshift64*: the mutation tests' reproducible stream (no dependency).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// The GGUF reader, then what a model load does with its result: the config, the tokenizer,
/// every tensor, the model itself and two forward steps.
pub fn gguf(data: &[u8]) {
    let label = Path::new(LABEL);
    let Ok(g) = GgufFile::from_bytes(label, data) else {
        return;
    };
    let names: Vec<String> = g.tensors.iter().map(|t| t.name.clone()).collect();
    for name in names {
        if let Some(t) = g.tensor(&name) {
            std::hint::black_box(t.shape.iter().product::<usize>());
        }
    }
    let _ = g.architecture();
    if let Ok(cfg) = ModelConfig::from_gguf(&g) {
        let _ = cfg.validate();
    }
    let _ = Tokenizer::from_gguf(&g);
    if let Ok(model) = Model::from_gguf(label, g) {
        forward_twice(&model);
    }
}

/// Two steps through a model: a 3-token prompt, then one token, with logits.
fn forward_twice(model: &Model) {
    let mut caches = vec![model.new_cache()];
    let v = model.cfg.vocab_size as u32;
    let toks: Vec<u32> = [1u32, 2, 3].iter().map(|t| t % v.max(1)).collect();
    let b = Batch::for_sequence(0, 0, &toks, false);
    if model.forward(&b, &mut caches).is_ok() {
        let b = Batch::for_sequence(0, 3, &toks[..1], false);
        let _ = model.forward(&b, &mut caches);
    }
}

/// A GGUF file's tokenizer (vocabulary, merges, token types, special ids, pre-tokenizer),
/// then encoding and decoding a mixed string with it.
pub fn gguf_tokenizer(data: &[u8]) {
    let Ok(g) = GgufFile::from_bytes(Path::new(LABEL), data) else {
        return;
    };
    let Ok(tok) = Tokenizer::from_gguf(&g) else {
        return;
    };
    for s in [
        "Hello, world!",
        "  two  spaces\n\tand ümlauts ⚙ 日本語 <|im_start|>",
    ] {
        for special in [false, true] {
            if let Ok(ids) = tok.encode(s, special) {
                let _ = tok.decode(&ids, false);
                let _ = tok.decode(&ids, true);
            }
        }
    }
    let n = tok.vocab_size() as u32;
    let _ = tok.decode(&[0, n.saturating_sub(1), n, u32::MAX], false);
}

/// A safetensors file's header and tensors.
pub fn safetensors(data: &[u8]) {
    let Ok(st) = SafetensorsFiles::from_bytes(Path::new(LABEL), data) else {
        return;
    };
    let names: Vec<String> = st.names().map(str::to_string).collect();
    for n in names {
        if let Some(t) = st.get(&n) {
            std::hint::black_box(t.shape.iter().product::<usize>());
        }
    }
}

/// A `config.json`: the HF config reader and its validation.
pub fn config(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let Ok(cfg) = ModelConfig::from_hf_json(&v) {
        let _ = cfg.validate();
    }
}

/// An image file: decoded (at most 4 M pixels, as a request's limit would refuse more), then
/// processed as LFM2-VL's processor does with a small tile grid, and its placeholder built;
/// and as LFM3-VL's (a small pixel range).
pub fn image(data: &[u8]) {
    use crate::vision::image::{decode, preprocess, ProcessorConfig};
    let Ok(img) = decode(data, 1 << 22) else {
        return;
    };
    let cfg = ProcessorConfig {
        min_image_tokens: 4,
        max_image_tokens: 16,
        tile_size: 64,
        max_tiles: 4,
        ..ProcessorConfig::default()
    };
    if let Ok(p) = preprocess(&img, &cfg) {
        assert_eq!(
            p.placeholder(&cfg).matches("<image>").count(),
            p.n_image_tokens()
        );
    }
    let patches = crate::vision::lfm3::PatchProcessor {
        min_pixels: 32 * 32 * 4,
        max_pixels: 32 * 32 * 64,
        ..Default::default()
    };
    if let Ok(p) = patches.preprocess(&img) {
        assert_eq!(p.pixels.len(), p.grid_h * p.grid_w * p.patch_len);
        assert!(p.grid_h.is_multiple_of(2) && p.grid_w.is_multiple_of(2) && p.n_tokens() > 0);
    }
}

/// A chat template and the messages it renders: the input is the template's source, a NUL
/// byte, then a JSON list of messages (or `{"messages": [...], "tools": [...]}`).
pub fn chat_template(data: &[u8]) {
    let (src, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"[]"[..]),
    };
    let Ok(src) = std::str::from_utf8(src) else {
        return;
    };
    let Ok(t) = ChatTemplate::new(src, Some("<s>"), Some("</s>")) else {
        return;
    };
    let v: Value = serde_json::from_slice(rest).unwrap_or(Value::Array(Vec::new()));
    let (msgs, tools) = match &v {
        Value::Array(m) => (m.clone(), None),
        Value::Object(o) => (
            o.get("messages")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            o.get("tools"),
        ),
        _ => (Vec::new(), None),
    };
    for gen in [false, true] {
        let _ = t.render(&msgs, gen, tools, None);
    }
}
