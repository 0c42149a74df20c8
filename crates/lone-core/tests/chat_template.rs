//! Chat templates rendered byte-identically to transformers' apply_chat_template
//! (expected outputs: tests/reference/tokenizer/expected/chat.json).

use std::path::PathBuf;

use lone_core::tokenizer::{load_chat_template, ChatMessage, ChatTemplate, Tokenizer};
use lone_core::Error;
use serde_json::{json, Value};

fn reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/tokenizer")
}

fn chat_json() -> Value {
    let p = reference().join("expected/chat.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_dir(reference().join("assets").join(name)).unwrap()
}

fn template_for(case: &Value, lfm2: &Tokenizer, qwen: &Tokenizer) -> ChatTemplate {
    let tok = match case["tokenizer"].as_str().unwrap() {
        "lfm2" => lfm2,
        _ => qwen,
    };
    match case["template_file"].as_str() {
        None => tok.chat_template_renderer().unwrap().unwrap(),
        Some(f) => {
            let src =
                std::fs::read_to_string(reference().join("assets/chat-templates").join(f)).unwrap();
            ChatTemplate::with_special_tokens(&src, &tok.special_tokens().template_vars()).unwrap()
        }
    }
}

#[test]
fn renders_match_transformers() {
    let data = chat_json();
    let (lfm2, qwen) = (tokenizer("lfm2"), tokenizer("qwen2.5"));
    let cases = data["cases"].as_array().unwrap();
    assert!(cases.len() > 50);
    let mut failures = Vec::new();
    for c in cases {
        let tpl = template_for(c, &lfm2, &qwen);
        let msgs = c["messages"].as_array().unwrap();
        let tools = (!c["tools"].is_null()).then_some(&c["tools"]);
        let got = tpl.render(
            msgs,
            c["add_generation_prompt"].as_bool().unwrap(),
            tools,
            c["kwargs"].as_object(),
        );
        let want = c["expected"]["ok"]
            .as_str()
            .expect("generator recorded an error");
        match got {
            Ok(g) if g == want => {}
            Ok(g) => failures.push(format!("{}:\n--- got\n{g}\n--- want\n{want}", c["name"])),
            Err(e) => failures.push(format!("{}: error {e}", c["name"])),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn model_dir_templates_are_found() {
    let data = chat_json();
    for (dir, name) in [
        ("lfm2", "lfm2/system_multi_turn/agp=True"),
        ("qwen2.5", "qwen2.5/system_multi_turn/agp=True"),
    ] {
        let tpl = load_chat_template(reference().join("assets").join(dir))
            .unwrap()
            .unwrap();
        let case = data["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap();
        let msgs: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        assert_eq!(
            tpl.render_chat(&msgs, true).unwrap(),
            case["expected"]["ok"].as_str().unwrap()
        );
    }
    assert!(load_chat_template(reference().join("gguf"))
        .unwrap()
        .is_none());
}

#[test]
fn python_semantics() {
    let data = chat_json();
    let mut failures = Vec::new();
    for c in data["python"].as_array().unwrap() {
        let tpl = ChatTemplate::with_special_tokens(
            c["template"].as_str().unwrap(),
            &[
                ("eos_token", "<|im_end|>".to_string()),
                ("pad_token", "<|endoftext|>".to_string()),
            ],
        )
        .unwrap();
        let got = tpl
            .render(
                c["messages"].as_array().unwrap(),
                false,
                None,
                c["kwargs"].as_object(),
            )
            .unwrap_or_else(|e| format!("ERROR {e}"));
        if got != c["expected"].as_str().unwrap() {
            failures.push(format!(
                "{}: got {got:?}\n want {:?}",
                c["name"], c["expected"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn raise_exception_gives_template_error_with_message() {
    let data = chat_json();
    for c in data["errors"].as_array().unwrap() {
        let tpl = ChatTemplate::new(c["template"].as_str().unwrap(), None, None).unwrap();
        match tpl.render(c["messages"].as_array().unwrap(), false, None, None) {
            Err(Error::Template(m)) => assert_eq!(m, c["message"].as_str().unwrap()),
            other => panic!("{}: expected Error::Template, got {other:?}", c["name"]),
        }
    }
}

#[test]
fn syntax_and_runtime_errors_are_template_errors() {
    for bad in [
        "{% for m in messages %}",
        "{{ messages[0] ",
        "{% endgeneration %}",
        "{% if %}",
    ] {
        match ChatTemplate::new(bad, None, None) {
            Err(Error::Template(m)) => assert!(!m.is_empty()),
            other => panic!("{bad:?}: expected Error::Template, got {other:?}"),
        }
    }
    // non-serializable value in tojson, unknown kwargs, undefined attribute access
    for tpl in [
        "{{ foo | tojson }}",
        "{{ messages | tojson(bogus=1) }}",
        "{{ nothing.attr }}",
    ] {
        let t = ChatTemplate::new(tpl, None, None).unwrap();
        match t.render(
            &[json!({"role": "user", "content": "x"})],
            false,
            None,
            None,
        ) {
            Err(Error::Template(m)) => assert!(!m.is_empty()),
            other => panic!("{tpl:?}: expected Error::Template, got {other:?}"),
        }
    }
    // messages must be objects
    let t = ChatTemplate::new("{{ messages }}", None, None).unwrap();
    assert!(matches!(
        t.render(&[json!("hi")], false, None, None),
        Err(Error::Template(_))
    ));
}

#[test]
fn message_normalisation_and_builtins() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.keys() | list }}|{{ m.thinking }}|{% endfor %}{{ bos_token }}{{ eos_token }}",
        Some("<s>"),
        Some("</s>"),
    )
    .unwrap();
    let out = t
        .render(
            &[json!({"role": "assistant", "content": "a", "tool_calls": null, "reasoning_content": "r"})],
            false,
            None,
            None,
        )
        .unwrap();
    assert_eq!(
        out,
        "['thinking', 'role', 'content', 'reasoning_content']|r|<s></s>"
    );
    let t = ChatTemplate::new(
        "{{ strftime_now('%Y') | length }} {{ strftime_now('%d %b %Y')[2:3] }}",
        None,
        None,
    )
    .unwrap();
    assert_eq!(t.render(&[], false, None, None).unwrap(), "4  ");
}

/// A template that loops (nearly) forever is an error after bounded work, not a hang.
#[test]
fn runaway_templates_stop_with_an_error() {
    let t = ChatTemplate::with_special_tokens(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        &[],
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let e = t.render(
        &[json!({"role": "user", "content": "hi"})],
        true,
        None,
        None,
    );
    assert!(e.is_err(), "rendered");
    assert!(t0.elapsed().as_secs() < 20, "took {:?}", t0.elapsed());
    assert!(e.unwrap_err().to_string().contains("fuel"), "message");
}
