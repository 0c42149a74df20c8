//! The cost of constrained decoding per generated token: llguidance's token mask for a
//! typical JSON schema (and a forced tool call), over the real LFM2 (65k) and Qwen2.5 (152k)
//! vocabularies in ../shared/assets, walked along a valid output token by token. Compare with
//! the decode time per token of the same model (`lone bench`); docs/performance.md has both.
//!
//! `cargo bench -p lone-core --bench grammar`

use std::path::PathBuf;

use divan::Bencher;
use lone_core::engine::{GrammarSpec, Grammars};
use lone_core::tokenizer::Tokenizer;
use lone_core::tools::grammar::{tool_call_grammar, ToolSpec};
use lone_core::tools::ToolFormat;
use serde_json::json;

fn main() {
    divan::main();
}

fn tokenizer(name: &str) -> Option<Tokenizer> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/assets")
        .join(name);
    Tokenizer::from_dir(&dir).ok()
}

const DOC: &str = r#"{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "engines"], "address": {"city": "London", "zip": "W1"}}"#;

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}, "required": ["city"]},
        },
        "required": ["name", "age"],
    })
}

/// Mask + consume for every token of `text` under `spec` (one iteration = one whole output);
/// prints the per-token time.
fn walk(b: Bencher, vocab_name: &str, spec: GrammarSpec, text: &str) {
    let Some(tok) = tokenizer(vocab_name) else {
        eprintln!("../shared/assets/{vocab_name} missing: skipped");
        return;
    };
    let vocab = tok.vocab_size();
    let g = Grammars::new(&tok, vocab, tok.eos_ids()).unwrap();
    let c = g.compile(&spec, None).unwrap();
    let ids = tok.encode(text, false).unwrap();
    let mut logits = vec![0.0f32; vocab];
    eprintln!(
        "{vocab_name}: vocab {vocab}, {} tokens per output",
        ids.len()
    );
    b.counter(divan::counter::ItemsCount::new(ids.len()))
        .bench_local(|| {
            let mut st = c.start();
            let mut hist = Vec::new();
            for &t in &ids {
                assert!(st.mask(&mut logits));
                hist.push(t);
                st.consume(t, &hist);
            }
        });
}

#[divan::bench(args = ["lfm2", "qwen2.5"], sample_count = 10)]
fn json_schema(b: Bencher, vocab: &str) {
    walk(b, vocab, GrammarSpec::JsonSchema(schema()), DOC);
}

#[divan::bench(args = ["lfm2", "qwen2.5"], sample_count = 10)]
fn forced_tool_call(b: Bencher, vocab: &str) {
    let tools = [ToolSpec {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}),
    }];
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
    walk(
        b,
        vocab,
        tool_call_grammar(ToolFormat::Hermes, &tools, false, false),
        text,
    );
}
