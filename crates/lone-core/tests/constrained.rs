//! Constrained decoding: random-weight models (which know nothing) sampled at temperature 1
//! still write output that parses and follows the schema or grammar, every seed, every
//! family; with speculation too. The checks are the JSON-schema rules themselves, spelled
//! out here, not lone's own matcher.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lone_core::engine::{Constraint, GrammarSpec, Grammars, SpecParams, SpecTypes, Speculator};
use lone_core::generate::{generate_text, FinishReason, GenerateOptions};
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::text::TextIo;
use lone_core::tools::grammar::{tool_call_grammar, ToolSpec};
use lone_core::tools::{parse_reply, ReplyOptions, ToolFormat};
use lone_core::Model;
use serde_json::{json, Value};

const FAMILIES: [&str; 7] = [
    "lfm2_a", "lfm2_b", "lfm3", "llama", "qwen2", "qwen3", "lfm2_moe",
];

fn load(name: &str) -> (Model, TextIo) {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/fixtures")
        .join(name);
    let m = Model::load(&dir).unwrap();
    let t = TextIo::load(&m, &dir).unwrap();
    (m, t)
}

fn sample(
    m: &Model,
    t: &TextIo,
    c: &Constraint,
    seed: u64,
    spec: Option<Arc<Speculator>>,
    budget: usize,
) -> (String, FinishReason) {
    let prompt = t.encode_raw("Write a record:").unwrap();
    let opts = GenerateOptions {
        max_new_tokens: budget,
        eos_ids: t.eos_ids.clone(),
        constraint: Some(c.clone()),
        spec,
        ..Default::default()
    };
    let mut sampler = Sampler::new(SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::greedy()
    });
    let mut cache = m.new_cache();
    let g = generate_text(
        m,
        &mut cache,
        &prompt,
        &opts,
        &mut sampler,
        Some(&t.tokenizer),
        |_| true,
    )
    .unwrap();
    (g.text, g.finish)
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "kind": {"enum": ["cat", "dog", null]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
        "required": ["name", "age"],
        "additionalProperties": false,
    })
}

/// The rules of [`schema`], checked by hand.
fn valid(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    for k in o.keys() {
        if !["name", "age", "kind", "tags"].contains(&k.as_str()) {
            return Err(format!("extra key {k}"));
        }
    }
    let name = o.get("name").and_then(Value::as_str).ok_or("name")?;
    if name.chars().count() > 6 {
        return Err("name too long".into());
    }
    let age = o.get("age").and_then(Value::as_i64).ok_or("age")?;
    if !(0..=120).contains(&age) {
        return Err("age out of range".into());
    }
    if let Some(k) = o.get("kind") {
        if !(k.is_null() || k == "cat" || k == "dog") {
            return Err("kind".into());
        }
    }
    if let Some(t) = o.get("tags") {
        let a = t.as_array().ok_or("tags")?;
        if a.len() > 3 || !a.iter().all(Value::is_boolean) {
            return Err("tags".into());
        }
    }
    Ok(())
}

#[test]
fn json_schema_output_always_validates() {
    for fam in FAMILIES {
        let (m, t) = load(fam);
        let g = Grammars::new(&t.tokenizer, m.cfg.vocab_size, &t.eos_ids).unwrap();
        let c = g.compile(&GrammarSpec::JsonSchema(schema()), None).unwrap();
        for seed in 0..12 {
            let (text, finish) = sample(&m, &t, &c, seed, None, 400);
            assert_eq!(finish, FinishReason::Stop, "{fam} seed {seed}: {text:?}");
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{fam} seed {seed}: {e}: {text:?}"));
            valid(&v).unwrap_or_else(|e| panic!("{fam} seed {seed}: {e}: {text}"));
        }
    }
}

#[test]
fn constrained_speculation_still_validates() {
    let (m, t) = load("qwen2");
    let g = Grammars::new(&t.tokenizer, m.cfg.vocab_size, &t.eos_ids).unwrap();
    let c = g.compile(&GrammarSpec::JsonSchema(schema()), None).unwrap();
    let params = SpecParams {
        types: SpecTypes {
            ngram_simple: true,
            ngram_cache: true,
            draft: false,
        },
        ngram_n: 2,
        ngram_m: 8,
        ..Default::default()
    };
    let spec = Arc::new(Speculator::new(params, &m, &t.tokenizer, None).unwrap());
    for seed in 0..8 {
        let (text, finish) = sample(&m, &t, &c, seed, Some(spec.clone()), 400);
        assert_eq!(finish, FinishReason::Stop, "seed {seed}: {text:?}");
        valid(&serde_json::from_str(&text).unwrap()).unwrap();
    }
}

#[test]
fn regex_lark_and_gbnf_grammars_hold() {
    let (m, t) = load("llama");
    let g = Grammars::new(&t.tokenizer, m.cfg.vocab_size, &t.eos_ids).unwrap();
    type Check = fn(&str) -> bool;
    let cases: [(GrammarSpec, Check); 3] = [
        (GrammarSpec::Regex("(yes|no), [0-9]{1,3}".into()), |s| {
            let (a, b) = s.split_once(", ").unwrap();
            (a == "yes" || a == "no")
                && (1..=3).contains(&b.len())
                && b.bytes().all(|c| c.is_ascii_digit())
        }),
        (
            GrammarSpec::Lark(
                "start: \"<\" WORD (\" \" WORD){0,2} \">\"\nWORD: /[a-z]{1,5}/".into(),
            ),
            |s| {
                let inner = s
                    .strip_prefix('<')
                    .and_then(|r| r.strip_suffix('>'))
                    .unwrap();
                let w: Vec<&str> = inner.split(' ').collect();
                w.len() <= 3
                    && w.iter().all(|w| {
                        (1..=5).contains(&w.len()) && w.bytes().all(|c| c.is_ascii_lowercase())
                    })
            },
        ),
        (
            GrammarSpec::Gbnf(
                "root ::= item (\"+\" item){0,3}\nitem ::= [0-9] | \"(\" [a-c]+ \")\"".into(),
            ),
            |s| {
                s.split('+').all(|i| {
                    (i.len() == 1 && i.as_bytes()[0].is_ascii_digit())
                        || (i.starts_with('(')
                            && i.ends_with(')')
                            && i.len() > 2
                            && i[1..i.len() - 1]
                                .bytes()
                                .all(|c| (b'a'..=b'c').contains(&c)))
                }) && s.split('+').count() <= 4
            },
        ),
    ];
    for (spec, check) in cases {
        let c = g.compile(&spec, None).unwrap();
        for seed in 0..10 {
            let (text, finish) = sample(&m, &t, &c, seed, None, 400);
            if finish == FinishReason::Stop {
                assert!(check(&text), "{spec:?} seed {seed}: {text:?}");
            } else {
                panic!("{spec:?} seed {seed}: did not finish: {text:?}");
            }
        }
    }
}

#[test]
fn forced_tool_calls_always_parse_and_validate() {
    let tools = [
        ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            }, "required": ["city"]}),
        },
        ToolSpec {
            name: "now".into(),
            parameters: json!({}),
        },
    ];
    for fam in ["lfm2_a", "qwen2"] {
        let (m, t) = load(fam);
        let g = Grammars::new(&t.tokenizer, m.cfg.vocab_size, &t.eos_ids).unwrap();
        for format in [ToolFormat::Lfm2, ToolFormat::Hermes] {
            let c = g
                .compile(&tool_call_grammar(format, &tools, true, false), None)
                .unwrap();
            for seed in 0..8 {
                // Up to 16 calls of a model that loves whitespace: a generous budget.
                let (text, finish) = sample(&m, &t, &c, seed, None, 3000);
                assert_eq!(
                    finish,
                    FinishReason::Stop,
                    "{fam} {format:?} seed {seed}: {text:?}"
                );
                let r = parse_reply(
                    ReplyOptions {
                        tools: Some(format),
                        reasoning: false,
                        starts_thinking: false,
                        single_call: false,
                        names: Vec::new(),
                        check: None,
                    },
                    &text,
                );
                assert!(
                    !r.calls.is_empty() && r.warnings.is_empty() && r.content.is_empty(),
                    "{text}"
                );
                for call in r.calls {
                    match call.name.as_str() {
                        "get_weather" => {
                            let city = call.arguments["city"].as_str().unwrap();
                            assert!(city.chars().count() <= 8);
                            if let Some(d) = call.arguments.get("days") {
                                assert!((1..=7).contains(&d.as_i64().unwrap()));
                            }
                            assert!(
                                call.arguments.keys().all(|k| k == "city" || k == "days"),
                                "{text}"
                            );
                        }
                        "now" => {}
                        other => panic!("unknown tool {other}: {text}"),
                    }
                }
            }
        }
    }
}

#[test]
fn bad_grammars_are_errors() {
    let (m, t) = load("qwen3");
    let g = Grammars::new(&t.tokenizer, m.cfg.vocab_size, &t.eos_ids).unwrap();
    for bad in [
        GrammarSpec::Lark("start: nothing_defined".into()),
        GrammarSpec::Lark("start: (\"a\"".into()),
        GrammarSpec::Regex("(unclosed".into()),
        GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
        GrammarSpec::Gbnf("root ::= [a-".into()),
    ] {
        assert!(g.compile(&bad, None).is_err(), "{bad:?}");
    }
}
