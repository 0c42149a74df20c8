use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

fn opts(f: ToolFormat) -> ReplyOptions {
    ReplyOptions {
        tools: Some(f),
        reasoning: true,
        starts_thinking: false,
        single_call: false,
        names: Vec::new(),
        check: None,
    }
}

fn call(name: &str, args: Json) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: args.as_object().unwrap().clone(),
    }
}

/// Whole-text parse, and the same text streamed in pieces of every size 1..=7: all agree.
fn parse(f: ToolFormat, text: &str) -> Reply {
    let whole = parse_reply(opts(f), text);
    let chars: Vec<char> = text.chars().collect();
    for size in 1..=7 {
        let mut p = ReplyParser::new(opts(f));
        let mut r = Reply::default();
        for piece in chars.chunks(size) {
            for d in p.push(&piece.iter().collect::<String>()) {
                r.add(d);
            }
        }
        for d in p.finish() {
            r.add(d);
        }
        assert_eq!(r, whole, "pieces of {size} differ for {text:?}");
    }
    whole
}

#[test]
fn lfm2_corpus() {
    let r = parse(
        ToolFormat::Lfm2,
        "<|tool_call_start|>[get_weather(city=\"Paris\", unit='celsius')]<|tool_call_end|>Checking the weather in Paris.",
    );
    assert_eq!(
        r.calls,
        [call(
            "get_weather",
            json!({"city": "Paris", "unit": "celsius"})
        )]
    );
    assert_eq!(r.content, "Checking the weather in Paris.");
    assert!(r.warnings.is_empty());

    // Text before, several calls, nested values, a second block.
    let r = parse(
        ToolFormat::Lfm2,
        "Sure, let me check.\n<|tool_call_start|>[f(a=1, b=\"x\"), g(c={'k': [1, 2]}, d=True, e=None)]<|tool_call_end|>\n<|tool_call_start|>[h()]<|tool_call_end|>",
    );
    assert_eq!(r.content, "Sure, let me check.");
    assert_eq!(
        r.calls,
        [
            call("f", json!({"a": 1, "b": "x"})),
            call("g", json!({"c": {"k": [1, 2]}, "d": true, "e": null})),
            call("h", json!({})),
        ]
    );

    // JSON inside LFM2's markers (what it writes when the system prompt asks for JSON).
    let r = parse(
        ToolFormat::Lfm2,
        "<|tool_call_start|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}]<|tool_call_end|>",
    );
    assert_eq!(r.calls, [call("get_weather", json!({"city": "東京"}))]);
    assert_eq!(r.content, "");

    // Escapes are decoded once: "\n" in the model's text is a newline, "\\n" a backslash-n.
    let r = parse(
        ToolFormat::Lfm2,
        r#"<|tool_call_start|>[write(path='a.txt', text='line1\nline2 \\n it\'s')]<|tool_call_end|>"#,
    );
    assert_eq!(r.calls[0].arguments["text"], "line1\nline2 \\n it's");

    // Thinking first.
    let r = parse(
        ToolFormat::Lfm2,
        "<think>\nThe user wants the weather.\n</think>\n\n<|tool_call_start|>[get_weather(city='Oslo')]<|tool_call_end|>",
    );
    assert_eq!(r.reasoning.as_deref(), Some("The user wants the weather."));
    assert_eq!(r.calls.len(), 1);
    assert_eq!(r.content, "");

    // The model stopped before the end marker: the call still counts.
    let r = parse(ToolFormat::Lfm2, "<|tool_call_start|>[f(a=1)]");
    assert_eq!(r.calls, [call("f", json!({"a": 1}))]);
}

#[test]
fn hermes_corpus() {
    let r = parse(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    );
    assert_eq!(
        r.calls,
        [
            call("get_weather", json!({"city": "Tokyo", "days": 2})),
            call("get_weather", json!({"city": "Paris"})),
        ]
    );
    assert_eq!(r.content, "");
    let r = parse(
        ToolFormat::Hermes,
        "I'll look that up.\n\n<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"rust\\\"}\"}\n</tool_call>",
    );
    assert_eq!(r.content, "I'll look that up.");
    assert_eq!(r.calls, [call("search", json!({"q": "rust"}))]);
}

#[test]
fn malformed_blocks_come_back_as_content_without_markers() {
    for (f, text, content) in [
        (
            ToolFormat::Lfm2,
            "<|tool_call_start|>[f(a=]<|tool_call_end|> ok",
            "[f(a=] ok",
        ),
        (
            ToolFormat::Lfm2,
            "Hi <|tool_call_start|>not a call",
            "Hi not a call",
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": 3}\n</tool_call>",
            "{\"name\": 3}",
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": </tool_call>",
            "{\"name\": \"f\", \"arguments\": {\"a\":",
        ),
    ] {
        let r = parse(f, text);
        assert!(r.calls.is_empty(), "{text}");
        assert_eq!(r.content, content, "{text}");
        assert_eq!(r.warnings.len(), 1, "{text}");
        let (s, e) = f.markers();
        assert!(!r.content.contains(s) && !r.content.contains(e));
    }
}

/// A reply the token budget cut inside a call block: its complete calls alone, no content
/// (the shape OpenAI's API gives with `finish_reason: "length"`); a block cut right at its
/// end marker still parses. The same text ended by the model (EOS) keeps the old rule:
/// an unparsed block comes back as content.
#[test]
fn a_call_cut_by_the_budget_is_dropped_not_returned_as_content() {
    let first = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n";
    for (f, text, calls, eos_content) in [
        (
            ToolFormat::Hermes,
            format!("{first}<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"a\""),
            1,
            "{\"name\": \"f\", \"arguments\": {\"a\"",
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_w".to_string(),
            0,
            "{\"name\": \"get_w",
        ),
        (
            ToolFormat::Hermes,
            format!("{first}<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"a\": 2}}}}\n</tool"),
            2,
            "",
        ),
        (
            ToolFormat::Lfm2,
            "Sure. <|tool_call_start|>[f(a=1), g(b=".to_string(),
            0,
            "Sure. [f(a=1), g(b=",
        ),
        (ToolFormat::Hermes, "<tool_".to_string(), 0, "<tool_"),
        (
            ToolFormat::Lfm2,
            "Sure. <|tool_call".to_string(),
            0,
            "Sure. <|tool_call",
        ),
    ] {
        for pieces in [text.len(), 3] {
            let mut p = ReplyParser::new(opts(f));
            let mut r = Reply::default();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(pieces) {
                for d in p.push(&piece.iter().collect::<String>()) {
                    r.add(d);
                }
            }
            for d in p.finish_ended(true) {
                r.add(d);
            }
            assert_eq!(r, parse_reply_ended(opts(f), &text, true), "{text}");
            assert_eq!(r.calls.len(), calls, "{text}");
            let want = if f == ToolFormat::Lfm2 { "Sure." } else { "" };
            assert_eq!(r.content, want, "{text}");
        }
        let eos = parse(f, &text);
        assert_eq!(eos.calls.len(), calls, "{text}");
        assert_eq!(eos.content, eos_content, "{text}");
    }
}

#[test]
fn plain_text_passes_unchanged() {
    for text in [
        "  Hello <b>world</b> <thin",
        "a < b and <tool_ not a marker\n\n",
        "\n\nTrailing spaces   ",
        "",
    ] {
        let mut o = opts(ToolFormat::Hermes);
        o.tools = None;
        let r = parse_reply(o, text);
        assert_eq!(r.content, text);
        assert!(r.calls.is_empty() && r.reasoning.is_none());
    }
    // Without tools the markers are text.
    let mut o = opts(ToolFormat::Hermes);
    o.tools = None;
    let t = "<tool_call>{\"name\": \"f\"}</tool_call>";
    assert_eq!(parse_reply(o, t).content, t);
}

#[test]
fn reasoning_when_the_prompt_opened_think() {
    let mut o = opts(ToolFormat::Hermes);
    o.starts_thinking = true;
    let r = parse_reply(o, "\nstep one\n</think>\n\nThe answer is 4.");
    assert_eq!(r.reasoning.as_deref(), Some("step one"));
    assert_eq!(r.content, "The answer is 4.");
}

#[test]
fn single_call_keeps_the_first() {
    let mut o = opts(ToolFormat::Lfm2);
    o.single_call = true;
    let r = parse_reply(o, "<|tool_call_start|>[f(), g()]<|tool_call_end|>");
    assert_eq!(r.calls, [call("f", json!({}))]);
    assert_eq!(r.warnings.len(), 1);
}

fn random_value(rng: &mut ChaCha8Rng, depth: usize) -> Json {
    let pick = rng.random_range(0..if depth > 2 { 5 } else { 7 });
    match pick {
        0 => Json::Null,
        1 => Json::Bool(rng.random()),
        2 => json!(rng.random_range(-1_000_000i64..1_000_000)),
        3 => json!((rng.random_range(-1e6..1e6f64) * 1000.0).round() / 1000.0),
        4 => {
            let alphabet = [
                'a', 'Z', ' ', '\'', '"', '\\', '\n', '\t', 'é', '東', '😀', '(', ')', ',', '=',
                ']', '<', '\u{1}',
            ];
            let n = rng.random_range(0..12);
            Json::String(
                (0..n)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect(),
            )
        }
        5 => Json::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for i in 0..rng.random_range(0..4) {
                m.insert(format!("k{i} '\"x"), random_value(rng, depth + 1));
            }
            Json::Object(m)
        }
    }
}

#[test]
fn render_then_parse_is_the_same_call() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..500 {
        let calls: Vec<ToolCall> = (0..rng.random_range(1..4))
            .map(|i| {
                let mut arguments = Map::new();
                for j in 0..rng.random_range(0..5) {
                    arguments.insert(format!("arg_{j}"), random_value(&mut rng, 0));
                }
                ToolCall {
                    name: format!("tool_{i}"),
                    arguments,
                }
            })
            .collect();
        for f in [ToolFormat::Lfm2, ToolFormat::Hermes] {
            let text = f.render(&calls);
            let r = parse_reply(opts(f), &text);
            assert_eq!(r.calls, calls, "{text}");
            assert!(r.warnings.is_empty() && r.content.is_empty(), "{text}");
        }
    }
}

#[test]
fn format_detection() {
    assert_eq!(
        ToolFormat::detect(Some("{{ '<|tool_call_start|>' }}"), |_| false),
        ToolFormat::Lfm2
    );
    assert_eq!(
        ToolFormat::detect(None, |t| t == "<|tool_call_start|>"),
        ToolFormat::Lfm2
    );
    assert_eq!(
        ToolFormat::detect(Some("<tool_call>"), |_| false),
        ToolFormat::Hermes
    );
    assert_eq!(
        python_literal(&json!({"a'": [1, null, true, "x\n"]})),
        "{'a\\'': [1, None, True, 'x\\n']}"
    );
}

#[test]
fn calls_failing_the_check_or_naming_no_tool_come_back_as_content() {
    let mut o = opts(ToolFormat::Lfm2);
    o.names = vec!["f".into()];
    o.check = Some(std::sync::Arc::new(|c: &ToolCall| {
        if c.arguments.contains_key("bad") {
            Err("bad argument".into())
        } else {
            Ok(())
        }
    }));
    let r = parse_reply(o.clone(), "<|tool_call_start|>[f(a=1)]<|tool_call_end|>");
    assert_eq!(r.calls, [call("f", json!({"a": 1}))]);
    for text in [
        "<|tool_call_start|>[f(bad=1)]<|tool_call_end|>",
        "<|tool_call_start|>[g(a=1)]<|tool_call_end|>",
    ] {
        let r = parse_reply(o.clone(), text);
        assert!(r.calls.is_empty(), "{text}");
        assert_eq!(r.warnings.len(), 1);
        assert!(
            r.content.starts_with('[') && !r.content.contains("<|"),
            "{}",
            r.content
        );
    }
}
