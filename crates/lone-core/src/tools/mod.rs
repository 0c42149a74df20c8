//! Tool calls and reasoning in what a model writes.
//!
//! [`ReplyParser`] splits generated text, piece by piece as it streams, into content,
//! reasoning (`<think>…</think>`) and tool calls, in the format of the model's family
//! ([`ToolFormat`]): LFM2's `<|tool_call_start|>[f(a=1)]<|tool_call_end|>` (Python call syntax,
//! or JSON) and Hermes' `<tool_call>{"name": …, "arguments": …}</tool_call>` (Qwen2.5 and most
//! others). Text that could still become a marker is held back, so no marker ever reaches the
//! content; a block that does not parse comes back as content, with a warning. Parsing the
//! whole text at once is the same parser fed one piece, so streamed and non-streamed results
//! agree.

mod calls;
pub mod grammar;

use serde_json::{Map, Value as Json};

pub use calls::parse_calls;

/// One call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Map<String, Json>,
}

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<|tool_call_start|>[f(a=1, b='x')]<|tool_call_end|>` (LFM2, LFM2.5, LFM3).
    Lfm2,
    /// `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>` (Qwen2.5, Hermes, and the
    /// default for templates that say nothing).
    Hermes,
}

impl ToolFormat {
    /// The format a model uses, from its chat template and vocabulary: LFM2's markers when
    /// its tokenizer has them, else Hermes'.
    pub fn detect(template: Option<&str>, has_token: impl Fn(&str) -> bool) -> ToolFormat {
        let t = template.unwrap_or("");
        if t.contains("<|tool_call_start|>") || has_token("<|tool_call_start|>") {
            ToolFormat::Lfm2
        } else {
            ToolFormat::Hermes
        }
    }

    /// Start and end markers of a call block.
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::Lfm2 => ("<|tool_call_start|>", "<|tool_call_end|>"),
            ToolFormat::Hermes => ("<tool_call>", "</tool_call>"),
        }
    }

    /// `calls` as the model would write them (for templates that do not render an
    /// assistant message's `tool_calls` themselves, and for tests).
    pub fn render(self, calls: &[ToolCall]) -> String {
        let (start, end) = self.markers();
        match self {
            ToolFormat::Lfm2 => {
                let items: Vec<String> = calls.iter().map(python_call).collect();
                format!("{start}[{}]{end}", items.join(", "))
            }
            ToolFormat::Hermes => calls
                .iter()
                .map(|c| {
                    let v = serde_json::json!({"name": c.name, "arguments": c.arguments});
                    format!("{start}\n{v}\n{end}")
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// `name(k=v, …)` with Python literals.
pub fn python_call(c: &ToolCall) -> String {
    let args: Vec<String> = c
        .arguments
        .iter()
        .map(|(k, v)| format!("{k}={}", python_literal(v)))
        .collect();
    format!("{}({})", c.name, args.join(", "))
}

/// A JSON value as a Python literal (strings single-quoted, escaped as Python's repr does).
pub fn python_literal(v: &Json) -> String {
    match v {
        Json::Null => "None".into(),
        Json::Bool(true) => "True".into(),
        Json::Bool(false) => "False".into(),
        Json::Number(n) => n.to_string(),
        Json::String(s) => {
            let mut out = String::from("'");
            for ch in s.chars() {
                match ch {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("\\'"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        out.push_str(&format!("\\x{:02x}", c as u32))
                    }
                    c => out.push(c),
                }
            }
            out.push('\'');
            out
        }
        Json::Array(a) => {
            let items: Vec<String> = a.iter().map(python_literal).collect();
            format!("[{}]", items.join(", "))
        }
        Json::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}: {}",
                        python_literal(&Json::String(k.clone())),
                        python_literal(v)
                    )
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

/// A piece of a parsed reply.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyDelta {
    Content(String),
    Reasoning(String),
    /// A complete call; `index` counts calls from 0.
    Call {
        index: usize,
        call: ToolCall,
    },
    /// A block that did not parse (returned as content) or a call that was dropped.
    Warning(String),
}

/// The whole parsed reply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    pub content: String,
    pub reasoning: Option<String>,
    pub calls: Vec<ToolCall>,
    pub warnings: Vec<String>,
}

impl Reply {
    pub fn add(&mut self, d: ReplyDelta) {
        match d {
            ReplyDelta::Content(s) => self.content.push_str(&s),
            ReplyDelta::Reasoning(s) => self.reasoning.get_or_insert_with(String::new).push_str(&s),
            ReplyDelta::Call { call, .. } => self.calls.push(call),
            ReplyDelta::Warning(w) => self.warnings.push(w),
        }
    }
}

const THINK: (&str, &str) = ("<think>", "</think>");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Text,
    Think,
    Call,
}

/// A check a parsed call must pass to count as a call (e.g. its arguments against a strict
/// schema); `Err` sends the block back as content.
pub type CallCheck = std::sync::Arc<dyn Fn(&ToolCall) -> Result<(), String> + Send + Sync>;

/// What the parser looks for (default: plain text, nothing split).
#[derive(Clone, Default)]
pub struct ReplyOptions {
    /// `None`: tool calls are not parsed (no tools, or `tool_choice: none`).
    pub tools: Option<ToolFormat>,
    /// Split `<think>…</think>` into reasoning.
    pub reasoning: bool,
    /// The prompt ended inside `<think>` (the template opened it): start in reasoning.
    pub starts_thinking: bool,
    /// Keep only the first call (`parallel_tool_calls: false`).
    pub single_call: bool,
    /// The tools that exist: a block calling another name is returned as content (empty:
    /// any name).
    pub names: Vec<String>,
    pub check: Option<CallCheck>,
}

impl std::fmt::Debug for ReplyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyOptions")
            .field("tools", &self.tools)
            .field("reasoning", &self.reasoning)
            .field("starts_thinking", &self.starts_thinking)
            .field("single_call", &self.single_call)
            .field("names", &self.names)
            .field("check", &self.check.is_some())
            .finish()
    }
}

/// The streaming splitter; see the module docs.
pub struct ReplyParser {
    opt: ReplyOptions,
    state: State,
    buf: String,
    /// Whitespace held back in text: dropped before a block, sent before more text.
    ws: String,
    /// Drop whitespace at the start of the next text (after a block, at the start).
    trim_next: bool,
    dropped_ws: String,
    calls: usize,
}

impl ReplyParser {
    pub fn new(opt: ReplyOptions) -> ReplyParser {
        let state = if opt.reasoning && opt.starts_thinking {
            State::Think
        } else {
            State::Text
        };
        // Plain text passes unchanged; with tools, whitespace around blocks is dropped.
        let trim_next = opt.tools.is_some() || state == State::Think;
        ReplyParser {
            opt,
            state,
            buf: String::new(),
            ws: String::new(),
            trim_next,
            dropped_ws: String::new(),
            calls: 0,
        }
    }

    /// Calls emitted so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn starts(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.opt.reasoning {
            m.push(THINK.0);
        }
        if let Some(f) = self.opt.tools {
            m.push(f.markers().0);
        }
        m
    }

    fn end_marker(&self) -> &'static str {
        match self.state {
            State::Think => THINK.1,
            State::Call => self.opt.tools.map_or("", |f| f.markers().1),
            State::Text => "",
        }
    }

    /// Feed the next piece of generated text.
    pub fn push(&mut self, piece: &str) -> Vec<ReplyDelta> {
        self.buf.push_str(piece);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Text => {
                    let starts = self.starts();
                    let hit = starts
                        .iter()
                        .filter_map(|m| self.buf.find(m).map(|p| (p, *m)))
                        .min();
                    if let Some((p, m)) = hit {
                        let before: String = self.buf[..p].to_string();
                        self.text(&before, &mut out);
                        // Whitespace before a block is dropped (unless the block turns
                        // out to be text).
                        self.dropped_ws = std::mem::take(&mut self.ws);
                        self.buf.drain(..p + m.len());
                        self.state = if m == THINK.0 {
                            State::Think
                        } else {
                            State::Call
                        };
                        continue;
                    }
                    // Hold back a tail that could still become a marker.
                    let keep = starts
                        .iter()
                        .map(|m| partial_suffix(&self.buf, m))
                        .max()
                        .unwrap_or(0);
                    let send: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.text(&send, &mut out);
                    return out;
                }
                State::Think | State::Call => {
                    let end = self.end_marker();
                    if let Some(p) = self.buf.find(end) {
                        let inner: String = self.buf[..p].to_string();
                        self.buf.drain(..p + end.len());
                        self.close_block(&inner, End::Closed, &mut out);
                        continue;
                    }
                    if self.state == State::Think {
                        // Reasoning streams as it comes (less a possible partial end marker).
                        // (less a possible partial end marker and trailing whitespace).
                        let cut = self.buf.len() - partial_suffix(&self.buf, end);
                        let body = self.buf[..cut].trim_end().len();
                        let send: String = self.buf.drain(..body).collect();
                        let send = if self.trim_next {
                            send.trim_start().to_string()
                        } else {
                            send
                        };
                        if !send.is_empty() {
                            self.trim_next = false;
                            out.push(ReplyDelta::Reasoning(send));
                        }
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the text: whatever is held back.
    pub fn finish(&mut self) -> Vec<ReplyDelta> {
        self.finish_ended(false)
    }

    /// The end of the text, `cut` when the token budget ended it (finish reason `length`):
    /// a tool-call block it cut short that does not parse is then dropped with a warning
    /// instead of coming back as content, as is a call-start marker it cut, so a cut reply is
    /// its complete calls (or its text) alone. An unclosed block loses a partial end marker
    /// before it is parsed.
    pub fn finish_ended(&mut self, cut: bool) -> Vec<ReplyDelta> {
        let mut out = Vec::new();
        let mut rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Text => {
                let marker = match self.opt.tools.filter(|_| cut) {
                    Some(f) => partial_suffix(&rest, f.markers().0),
                    None => 0,
                };
                rest.truncate(rest.len() - marker);
                self.text(&rest, &mut out);
                let ws = std::mem::take(&mut self.ws);
                // Whitespace before a (cut) block is dropped, as before a whole one.
                if !ws.is_empty() && marker == 0 {
                    out.push(ReplyDelta::Content(ws));
                }
            }
            // An unclosed block (the model stopped at EOS or the budget).
            _ => {
                rest.truncate(rest.len() - partial_suffix(&rest, self.end_marker()));
                let end = if cut { End::Cut } else { End::Unclosed };
                self.close_block(&rest, end, &mut out)
            }
        }
        out
    }

    fn close_block(&mut self, inner: &str, end: End, out: &mut Vec<ReplyDelta>) {
        match self.state {
            State::Think => {
                let s = if self.trim_next {
                    inner.trim_start()
                } else {
                    inner
                };
                let s = s.trim_end();
                if !s.is_empty() {
                    out.push(ReplyDelta::Reasoning(s.to_string()));
                }
            }
            State::Call => match parse_calls(inner).and_then(|calls| {
                if let Some(c) = calls
                    .iter()
                    .find(|c| !self.opt.names.is_empty() && !self.opt.names.contains(&c.name))
                {
                    return Err(format!("'{}' is not one of the tools", c.name));
                }
                if let Some(check) = &self.opt.check {
                    for c in &calls {
                        check(c)?;
                    }
                }
                Ok(calls)
            }) {
                Ok(calls) => {
                    for call in calls {
                        if self.opt.single_call && self.calls > 0 {
                            out.push(ReplyDelta::Warning(format!(
                                "dropped a second tool call ({}): parallel_tool_calls is false",
                                call.name
                            )));
                            continue;
                        }
                        out.push(ReplyDelta::Call {
                            index: self.calls,
                            call,
                        });
                        self.calls += 1;
                    }
                }
                Err(e) if end == End::Cut => out.push(ReplyDelta::Warning(format!(
                    "dropped a tool-call block that the token budget cut short ({e})"
                ))),
                Err(e) => {
                    let what = if end == End::Closed {
                        ""
                    } else {
                        " (unclosed)"
                    };
                    out.push(ReplyDelta::Warning(format!(
                        "a tool-call block{what} did not parse ({e}); returned as content"
                    )));
                    let text = inner.trim();
                    self.state = State::Text;
                    if !text.is_empty() {
                        // The text goes on as content: keep the spacing after it.
                        self.trim_next = false;
                        self.ws = std::mem::take(&mut self.dropped_ws);
                        self.flush_ws(out);
                        out.push(ReplyDelta::Content(text.to_string()));
                        return;
                    }
                }
            },
            State::Text => {}
        }
        self.state = State::Text;
        self.trim_next = true;
    }

    fn flush_ws(&mut self, out: &mut Vec<ReplyDelta>) {
        if !self.ws.is_empty() {
            out.push(ReplyDelta::Content(std::mem::take(&mut self.ws)));
        }
    }

    /// Text outside blocks: trailing whitespace is held (dropped before a block).
    fn text(&mut self, s: &str, out: &mut Vec<ReplyDelta>) {
        let s = if self.trim_next { s.trim_start() } else { s };
        if s.is_empty() {
            return;
        }
        self.trim_next = false;
        let body = s.trim_end();
        if body.is_empty() {
            self.ws.push_str(s);
            return;
        }
        self.flush_ws(out);
        out.push(ReplyDelta::Content(body.to_string()));
        self.ws.push_str(&s[body.len()..]);
    }
}

/// How a block ended: by its end marker, at the end of the text, or at the end of the token
/// budget.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Closed,
    Unclosed,
    Cut,
}

/// Length of the longest suffix of `s` that is a proper prefix of `marker`.
fn partial_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && marker.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

/// Parse a whole reply at once (the same as streaming it).
pub fn parse_reply(opt: ReplyOptions, text: &str) -> Reply {
    parse_reply_ended(opt, text, false)
}

/// [`parse_reply`] of a reply the token budget cut when `cut` ([`ReplyParser::finish_ended`]).
pub fn parse_reply_ended(opt: ReplyOptions, text: &str, cut: bool) -> Reply {
    let mut p = ReplyParser::new(opt);
    let mut r = Reply::default();
    for d in p.push(text).into_iter().chain(p.finish_ended(cut)) {
        r.add(d);
    }
    r
}

#[cfg(test)]
mod tests;
