//! Grammars that only let a model write a well-formed tool call in its own format
//! (`tool_choice: required` or a named function, and lazily after the call-start marker with
//! `auto`). Arguments follow each tool's JSON schema (`%json` in llguidance's Lark).

use serde_json::{json, Value as Json};

use super::ToolFormat;
use crate::engine::constrain::CALL_WS;
use crate::engine::GrammarSpec;

/// Most calls in one block (a bound, so a model that has lost its way still stops).
pub const MAX_PARALLEL_CALLS: usize = 16;

/// A tool as the grammar needs it: its name and the JSON schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Json,
}

fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

/// The arguments' schema; a function takes no arguments it does not declare, so
/// `additionalProperties` is false unless the schema says otherwise.
fn params_schema(t: &ToolSpec) -> Json {
    let mut p = match &t.parameters {
        Json::Object(o) if !o.is_empty() => t.parameters.clone(),
        _ => json!({"type": "object", "properties": {}}),
    };
    if let Some(o) = p.as_object_mut() {
        o.entry("additionalProperties").or_insert(Json::Bool(false));
    }
    p
}

/// A Python keyword-argument list for LFM2: required parameters first (in the schema's
/// order), then any optional ones; each value a JSON literal of the parameter's schema
/// (JSON literals are Python literals, and the parser reads true/false/null too).
fn python_args(t: &ToolSpec, rule: &str, out: &mut String) {
    let p = params_schema(t);
    let props = p.get("properties").and_then(Json::as_object);
    let required: Vec<&str> = p
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let Some(props) = props.filter(|p| !p.is_empty()) else {
        out.push_str(&format!("{rule}: \"\"\n"));
        return;
    };
    let arg = |k: &str, s: &Json| {
        let s = crate::engine::constrain::with_ws(s, CALL_WS);
        format!("{} %json {}", lit(&format!("{k}=")), s)
    };
    let req: Vec<String> = required
        .iter()
        .filter_map(|k| props.get(*k).map(|s| arg(k, s)))
        .collect();
    let opt: Vec<String> = props
        .iter()
        .filter(|(k, _)| !required.contains(&k.as_str()))
        .map(|(k, s)| arg(k, s))
        .collect();
    let opt_rule = format!("{rule}_opt");
    if !opt.is_empty() {
        out.push_str(&format!("{opt_rule}: {}\n", opt.join(" | ")));
    }
    let body = match (req.is_empty(), opt.is_empty()) {
        (true, true) => "\"\"".to_string(),
        (true, false) => format!("({opt_rule} (\", \" {opt_rule})*)?"),
        (false, true) => req.join(" \", \" "),
        (false, false) => format!("{} (\", \" {opt_rule})*", req.join(" \", \" ")),
    };
    out.push_str(&format!("{rule}: {body}\n"));
}

/// The grammar of a tool-call block (or several, with `parallel`) calling one of `tools`.
/// `special`: the markers are special tokens of the tokenizer (else they are text).
pub fn tool_call_grammar(
    format: ToolFormat,
    tools: &[ToolSpec],
    parallel: bool,
    special: bool,
) -> GrammarSpec {
    let (start, end) = format.markers();
    let marker = |m: &str| if special { marker(m) } else { lit(m) };
    let mut g = String::new();
    match format {
        ToolFormat::Lfm2 => {
            let more = if parallel {
                format!(" (\", \" call){{0,{}}}", MAX_PARALLEL_CALLS - 1)
            } else {
                String::new()
            };
            g.push_str(&format!(
                "start: {} \"[\" call{more} \"]\" {}\n",
                marker(start),
                marker(end)
            ));
            let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
            g.push_str(&format!("call: {}\n", names.join(" | ")));
            for (i, t) in tools.iter().enumerate() {
                g.push_str(&format!(
                    "call_{i}: {} args_{i} \")\"\n",
                    lit(&format!("{}(", t.name))
                ));
                python_args(t, &format!("args_{i}"), &mut g);
            }
        }
        ToolFormat::Hermes => {
            let schema = crate::engine::constrain::with_ws(
                &json!({"anyOf": tools.iter().map(|t| json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params_schema(t)},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })).collect::<Vec<_>>()}),
                CALL_WS,
            );
            let more = if parallel {
                format!(" (\"\\n\" call){{0,{}}}", MAX_PARALLEL_CALLS - 1)
            } else {
                String::new()
            };
            g.push_str(&format!("start: call{more}\n"));
            g.push_str(&format!(
                "call: {} \"\\n\" %json {schema} \"\\n\" {}\n",
                marker(start),
                marker(end)
            ));
        }
    }
    GrammarSpec::Lark(g)
}

/// A marker as a Lark atom: special tokens (`<|…|>`) by name, other text as a string.
fn marker(m: &str) -> String {
    if m.starts_with("<|") && m.ends_with("|>") {
        m.to_string()
    } else {
        lit(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammars_have_the_expected_shape() {
        let tools = [ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}),
        }];
        let GrammarSpec::Lark(g) = tool_call_grammar(ToolFormat::Lfm2, &tools, true, true) else {
            panic!()
        };
        assert!(g.starts_with("start: <|tool_call_start|> \"[\" call (\", \" call){0,15} \"]\" <|tool_call_end|>\n"), "{g}");
        assert!(g.contains("call_0: \"get_weather(\" args_0 \")\""), "{g}");
        assert!(
            g.contains("args_0: \"city=\" %json {\"type\":\"string\",\"x-guidance\""),
            "{g}"
        );
        let GrammarSpec::Lark(g) = tool_call_grammar(ToolFormat::Hermes, &tools, false, true)
        else {
            panic!()
        };
        assert!(
            g.starts_with("start: call\ncall: \"<tool_call>\" \"\\n\" %json {\"anyOf\""),
            "{g}"
        );
    }
}
