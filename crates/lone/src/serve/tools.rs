//! Tools, `tool_choice`, `response_format` and llama-server's `grammar` / `json_schema` for
//! chat completions: the request side (validation, the messages and tools the template gets,
//! the grammar the output must follow) and the response side (the parsed reply as OpenAI's
//! `message` / `delta` objects).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lone_core::engine::{Constraint, GrammarSpec, Grammars};
use lone_core::text::TextIo;
use lone_core::tools::grammar::{tool_call_grammar, ToolSpec};
use lone_core::tools::{Reply, ReplyDelta, ReplyOptions, ToolCall, ToolFormat};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::openai::ApiError;

/// What the model is and can do with tools (fixed at load).
pub struct ToolSupport {
    pub format: ToolFormat,
    /// The call markers are special tokens (decoded only when asked for).
    pub special_markers: bool,
    /// The template renders `tools` itself (else lone adds them to the system prompt).
    pub template_has_tools: bool,
    /// The template renders assistant `tool_calls` itself (else lone writes them into the
    /// content as the model would have).
    pub template_has_tool_calls: bool,
    /// `Err`: why constrained decoding is unavailable for this tokenizer.
    pub grammars: Result<Grammars, String>,
}

impl ToolSupport {
    pub fn new(text: &TextIo, vocab: usize) -> ToolSupport {
        // Requests with tools render with the tool_use template where there is one.
        let src = text.template_for(true).map(|t| t.source());
        let tok = &text.tokenizer;
        let format = ToolFormat::detect(src, |t| tok.token_to_id(t).is_some());
        let start = format.markers().0;
        let special_markers = tok.token_to_id(start).is_some_and(|id| tok.is_special(id));
        let grammars = Grammars::new(tok, vocab, &text.eos_ids).map_err(|e| e.to_string());
        if let Err(e) = &grammars {
            eprintln!("lone serve: warning: constrained decoding is off: {e}");
        }
        ToolSupport {
            format,
            special_markers,
            template_has_tools: src.is_some_and(|s| s.contains("tools")),
            template_has_tool_calls: src.is_some_and(|s| s.contains("tool_calls")),
            grammars,
        }
    }
}

/// The chat fields this module reads.
#[derive(Deserialize, Debug, Default)]
pub struct ToolFields {
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<Value>,
    /// llama-server's extensions.
    pub grammar: Option<String>,
    pub json_schema: Option<Value>,
}

/// A validated tool. Calls are decoded under the tools' grammar, so their arguments follow
/// the schema; with `strict`, a call is also checked against it after parsing (a call the
/// model wrote in a way the lazy constraint did not catch), and one that fails comes back as
/// content.
#[derive(Clone)]
pub struct Tool {
    pub spec: ToolSpec,
    pub strict: Option<Arc<jsonschema::Validator>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// What a chat request asks for beyond text.
pub struct ChatPlan {
    /// The `tools` as the template gets them (`None`: no tools, or `tool_choice: none`).
    pub template_tools: Option<Value>,
    pub constraint: Option<Constraint>,
    pub reply: ReplyOptions,
    pub keep_special: bool,
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(param, msg)
}

fn parse_tools(v: &[Value]) -> Result<Vec<Tool>, ApiError> {
    let mut out: Vec<Tool> = Vec::new();
    for (i, t) in v.iter().enumerate() {
        let p = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str).unwrap_or("function") != "function" {
            return Err(bad(
                "tools",
                format!("{p}: only tools of type 'function' are supported"),
            ));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("tools", format!("{p}: 'function' must be an object")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| {
                !n.is_empty()
                    && n.len() <= 64
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            })
            .ok_or_else(|| {
                bad(
                    "tools",
                    format!("{p}: 'function.name' must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'"),
                )
            })?;
        if out.iter().any(|o| o.spec.name == name) {
            return Err(bad("tools", format!("{p}: two tools are named '{name}'")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => {
                return Err(bad(
                    "tools",
                    format!("{p}: 'function.parameters' must be a JSON schema object"),
                ))
            }
        };
        let strict = match f.get("strict").and_then(Value::as_bool) {
            Some(true) => Some(Arc::new(jsonschema::validator_for(&parameters).map_err(
                |e| {
                    bad(
                        "tools",
                        format!("{p}: 'function.parameters' is not a valid JSON schema: {e}"),
                    )
                },
            )?)),
            _ => None,
        };
        out.push(Tool {
            spec: ToolSpec {
                name: name.to_string(),
                parameters,
            },
            strict,
        });
    }
    Ok(out)
}

fn parse_choice(v: Option<&Value>, tools: &[Tool]) -> Result<Choice, ApiError> {
    let c = match v {
        None | Some(Value::Null) => {
            if tools.is_empty() {
                Choice::None
            } else {
                Choice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!(
                    "'tool_choice' must be 'none', 'auto', 'required' or a function, got '{other}'"
                ),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad("tool_choice", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}")
                })?;
            Choice::Named(name.to_string())
        }
        Some(_) => {
            return Err(bad(
                "tool_choice",
                "'tool_choice' must be a string or an object",
            ))
        }
    };
    match &c {
        Choice::Required | Choice::Named(_) if tools.is_empty() => {
            return Err(bad("tool_choice", "'tool_choice' needs 'tools'"))
        }
        Choice::Named(n) if !tools.iter().any(|t| &t.spec.name == n) => {
            return Err(bad(
                "tool_choice",
                format!("'tool_choice' names '{n}', which is not in 'tools'"),
            ))
        }
        _ => {}
    }
    Ok(c)
}

/// The grammar `response_format` / `json_schema` / `grammar` ask for.
fn output_grammar(f: &ToolFields) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
    if let Some(g) = &f.grammar {
        let spec = if crate::cmd::common::is_gbnf(g) {
            GrammarSpec::Gbnf(g.clone())
        } else {
            GrammarSpec::Lark(g.clone())
        };
        return Ok(Some((spec, "grammar")));
    }
    if let Some(s) = &f.json_schema {
        if !s.is_object() {
            return Err(bad(
                "json_schema",
                "'json_schema' must be a JSON schema object",
            ));
        }
        return Ok(Some((GrammarSpec::JsonSchema(s.clone()), "json_schema")));
    }
    let Some(rf) = &f.response_format else {
        return Ok(None);
    };
    let kind = rf.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some((
            GrammarSpec::JsonSchema(json!({"type": "object"})),
            "response_format",
        ))),
        "json_schema" => {
            let js = rf.get("json_schema");
            // OpenAI: {"json_schema": {"name", "schema", "strict"}}; llama-server also takes
            // {"schema": …} at the top.
            let schema = js
                .and_then(|j| j.get("schema"))
                .or_else(|| rf.get("schema"))
                .cloned()
                .unwrap_or_else(|| json!({}));
            if !schema.is_object() {
                return Err(bad("response_format", "'response_format.json_schema.schema' must be an object"));
            }
            Ok(Some((GrammarSpec::JsonSchema(schema), "response_format")))
        }
        other => Err(bad(
            "response_format",
            format!("'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{other}'"),
        )),
    }
}

/// Validate the tool and format fields and decide what the generation needs.
pub fn plan(sup: &ToolSupport, f: &ToolFields) -> Result<ChatPlan, ApiError> {
    let tools = parse_tools(f.tools.as_deref().unwrap_or(&[]))?;
    let choice = parse_choice(f.tool_choice.as_ref(), &tools)?;
    let parallel = f.parallel_tool_calls.unwrap_or(true);
    let output = output_grammar(f)?;
    let calling = choice != Choice::None && !tools.is_empty();
    let compile = |spec: &GrammarSpec, lazy: Option<&str>, param: &str| {
        let g = sup.grammars.as_ref().map_err(|e| {
            bad(
                param,
                format!("constrained decoding is not available for this model: {e}"),
            )
        })?;
        g.compile(spec, lazy).map_err(|e| bad(param, e.to_string()))
    };
    let chosen: Vec<ToolSpec> = match &choice {
        Choice::Named(n) => tools
            .iter()
            .filter(|t| &t.spec.name == n)
            .map(|t| t.spec.clone())
            .collect(),
        _ => tools.iter().map(|t| t.spec.clone()).collect(),
    };
    let call_grammar = || tool_call_grammar(sup.format, &chosen, parallel, sup.special_markers);
    let constraint = match (&choice, &output) {
        (Choice::Required | Choice::Named(_), _) => {
            Some(compile(&call_grammar(), None, "tool_choice")?)
        }
        (_, Some((spec, param))) => Some(compile(spec, None, param)?),
        (Choice::Auto, None) if calling => {
            // Free text until the model starts a call; then only a well-formed one.
            let g = call_grammar();
            Some(compile(&g, Some(sup.format.markers().0), "tools")?)
        }
        _ => None,
    };
    Ok(ChatPlan {
        template_tools: calling.then(|| Value::Array(f.tools.clone().unwrap_or_default())),
        constraint,
        reply: ReplyOptions {
            tools: calling.then_some(sup.format),
            reasoning: true,
            starts_thinking: false,
            single_call: !parallel,
            names: tools.iter().map(|t| t.spec.name.clone()).collect(),
            check: strict_check(&tools),
        },
        keep_special: calling && sup.special_markers,
    })
}

/// The check of strict tools' arguments (`None` when no tool is strict).
fn strict_check(tools: &[Tool]) -> Option<lone_core::tools::CallCheck> {
    let strict: Vec<(String, Arc<jsonschema::Validator>)> = tools
        .iter()
        .filter_map(|t| t.strict.clone().map(|v| (t.spec.name.clone(), v)))
        .collect();
    if strict.is_empty() {
        return None;
    }
    Some(Arc::new(move |c: &ToolCall| {
        let Some((_, v)) = strict.iter().find(|(n, _)| n == &c.name) else {
            return Ok(());
        };
        let args = Value::Object(c.arguments.clone());
        let first = v.iter_errors(&args).next().map(|e| e.to_string());
        match first {
            None => Ok(()),
            Some(e) => Err(format!(
                "the arguments of {} do not follow its strict schema: {e}",
                c.name
            )),
        }
    }))
}

/// Messages as the template wants them: assistant `tool_calls` with their arguments as
/// objects (OpenAI sends JSON strings; templates iterate them); for templates that do not
/// render `tool_calls`, the calls written into the content as the model writes them; for
/// templates without tools, the tools described in a system message.
pub fn template_messages(sup: &ToolSupport, msgs: Vec<Value>, plan: &ChatPlan) -> Vec<Value> {
    let mut out: Vec<Value> = msgs
        .into_iter()
        .map(|mut m| {
            let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) else {
                return m;
            };
            let mut parsed = Vec::new();
            for c in calls.iter_mut() {
                let Some(f) = c.get_mut("function").filter(|f| f.is_object()) else {
                    continue;
                };
                if let Some(Value::String(s)) = f.get("arguments") {
                    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                        f["arguments"] = v;
                    }
                }
                let name = f
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let arguments = f
                    .get("arguments")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                parsed.push(ToolCall { name, arguments });
            }
            if !sup.template_has_tool_calls && !parsed.is_empty() {
                let content = m
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let rendered = sup.format.render(&parsed);
                m["content"] = Value::String(if content.is_empty() {
                    rendered
                } else {
                    format!("{content}\n{rendered}")
                });
            }
            m
        })
        .collect();
    if let (Some(tools), false) = (&plan.template_tools, sup.template_has_tools) {
        let (start, end) = sup.format.markers();
        let list: Vec<String> = tools
            .as_array()
            .into_iter()
            .flatten()
            .map(Value::to_string)
            .collect();
        let desc = format!(
            "You can call these tools:\n[{}]\nTo call one, write {start}\n{{\"name\": <tool name>, \"arguments\": <arguments as a JSON object>}}\n{end}",
            list.join(", ")
        );
        match out.first_mut() {
            Some(m) if m.get("role").and_then(Value::as_str) == Some("system") => {
                let c = m
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                m["content"] = Value::String(format!("{c}\n\n{desc}"));
            }
            _ => out.insert(0, json!({"role": "system", "content": desc})),
        }
    }
    out
}

/// Ids for tool calls: unique within a server run.
pub fn call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("call_{:x}{n:08x}", super::now())
}

/// A call OpenAI's way: `{"id", "type": "function", "function": {"name", "arguments"}}`.
pub fn call_json(call: &ToolCall, id: &str) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": Value::Object(call.arguments.clone()).to_string()},
    })
}

/// The non-streaming `message` of a parsed reply.
pub fn message(reply: &Reply) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    let content = if reply.content.is_empty() && !reply.calls.is_empty() {
        Value::Null
    } else {
        Value::String(reply.content.clone())
    };
    m.insert("content".into(), content);
    if let Some(r) = &reply.reasoning {
        m.insert("reasoning_content".into(), json!(r));
    }
    if !reply.calls.is_empty() {
        let calls: Vec<Value> = reply
            .calls
            .iter()
            .map(|c| call_json(c, &call_id()))
            .collect();
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(m)
}

/// Pieces of a call's arguments for streaming (OpenAI sends them in several chunks).
pub fn argument_pieces(args: &str) -> Vec<String> {
    const PIECE: usize = 16;
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in args.chars() {
        cur.push(ch);
        if cur.len() >= PIECE {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() || out.is_empty() {
        out.push(cur);
    }
    out
}

/// Streaming `delta` objects for one parsed piece.
pub fn deltas(d: ReplyDelta) -> Vec<Value> {
    match d {
        ReplyDelta::Content(s) => vec![json!({"content": s})],
        ReplyDelta::Reasoning(s) => vec![json!({"reasoning_content": s})],
        ReplyDelta::Call { index, call } => {
            let id = call_id();
            let args = Value::Object(call.arguments.clone()).to_string();
            let mut out = vec![json!({"tool_calls": [{
                "index": index, "id": id, "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]})];
            for p in argument_pieces(&args) {
                out.push(json!({"tool_calls": [{"index": index, "function": {"arguments": p}}]}));
            }
            out
        }
        ReplyDelta::Warning(w) => {
            eprintln!("lone serve: warning: {w}");
            Vec::new()
        }
    }
}
