//! Chat templates rendered with minijinja, byte-identical to transformers' `apply_chat_template`.
//!
//! transformers compiles templates in a Jinja2 `ImmutableSandboxedEnvironment` with
//! `trim_blocks=True, lstrip_blocks=True`, the `loopcontrols` extension, a `{% generation %}`
//! tag, and the globals `raise_exception`, `strftime_now`, plus a `tojson` filter that is
//! Python's `json.dumps` (`ensure_ascii=False`, no HTML escaping, `indent`, `separators`,
//! `sort_keys`). Values print as Python's `str()` would (`True`, `None`, `1e-07`, `['a']`).
//! Messages are normalised as transformers does: keys whose value is `null` are dropped, and
//! `reasoning_content`/`thinking`/`reasoning` are aliased to each other.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// A plain chat message (`{"role": ..., "content": ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
    pub fn to_json(&self) -> Json {
        let mut m = Map::new();
        m.insert("role".into(), Json::String(self.role.clone()));
        m.insert("content".into(), Json::String(self.content.clone()));
        Json::Object(m)
    }
}

/// Instructions one render may run (a long tool conversation takes well under 1 %).
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// A compiled chat template with the special-token variables it sees (`bos_token`, ...).
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    vars: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("vars", &self.vars)
            .finish()
    }
}

/// The error `raise_exception(msg)` produces, found again in the error chain after rendering.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn template_error(e: minijinja::Error) -> Error {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return Error::Template(r.0.clone());
        }
        src = s.source();
    }
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        let _ = write!(msg, ": {s}");
        src = s.source();
    }
    Error::Template(msg)
}

impl ChatTemplate {
    /// Compiles a template; `bos_token`/`eos_token` become the template variables of that name.
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate> {
        let mut vars = Vec::new();
        if let Some(b) = bos_token {
            vars.push(("bos_token", b.to_string()));
        }
        if let Some(e) = eos_token {
            vars.push(("eos_token", e.to_string()));
        }
        ChatTemplate::with_special_tokens(source, &vars)
    }

    /// Compiles a template with arbitrary special-token variables
    /// (transformers passes `special_tokens_map`: bos/eos/unk/pad tokens).
    pub fn with_special_tokens(source: &str, vars: &[(&str, String)]) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        // Bounded work: a template that loops without end (or nearly) is an error, not a hang.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            let r = match value.as_str() {
                Some(s) if value.kind() == minijinja::value::ValueKind::String => out.write_str(s),
                _ => out.write_str(&py_str(value)),
            };
            r.map_err(|_| minijinja::Error::from(ErrorKind::WriteFailure))
        });
        env.add_filter("tojson", tojson_filter);
        env.add_filter("string", |v: Value| py_str(&v));
        env.add_function(
            "raise_exception",
            |msg: Value| -> std::result::Result<Value, minijinja::Error> {
                let msg = py_str(&msg);
                Err(
                    minijinja::Error::new(ErrorKind::InvalidOperation, "raise_exception")
                        .with_source(Raised(msg)),
                )
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        })
    }

    /// The template source as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (JSON objects) like `apply_chat_template(messages, tools=tools,
    /// add_generation_prompt=..., tokenize=False, **extra)`.
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        tools: Option<&Json>,
        extra: Option<&Map<String, Json>>,
    ) -> Result<String> {
        let mut ctx = Map::new();
        for (k, v) in &self.vars {
            ctx.insert(k.clone(), Json::String(v.clone()));
        }
        if let Some(extra) = extra {
            for (k, v) in extra {
                ctx.insert(k.clone(), v.clone());
            }
        }
        let msgs = messages
            .iter()
            .map(normalize_message)
            .collect::<Result<Vec<_>>>()?;
        ctx.insert("messages".into(), Json::Array(msgs));
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Json::Null));
        ctx.insert("documents".into(), Json::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        let tpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        tpl.render(Value::from_serialize(&ctx))
            .map_err(template_error)
    }

    /// Renders plain role/content messages.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let msgs: Vec<Json> = messages.iter().map(ChatMessage::to_json).collect();
        self.render(&msgs, add_generation_prompt, None, None)
    }
}

const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers' `_normalize_chat_messages` + `_alias_reasoning_fields`.
fn normalize_message(m: &Json) -> Result<Json> {
    let Json::Object(obj) = m else {
        return Err(Error::Template(format!(
            "chat messages must be JSON objects, got {m}"
        )));
    };
    let mut out: Map<String, Json> = obj
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let reasoning = REASONING_FIELDS.iter().find_map(|k| out.get(*k).cloned());
    if let Some(r) = reasoning {
        // {"thinking": r, **message, "reasoning_content": r}
        let mut aliased = Map::new();
        aliased.insert("thinking".into(), r.clone());
        for (k, v) in out {
            aliased.insert(k, v);
        }
        aliased.insert("reasoning_content".into(), r);
        out = aliased;
    }
    Ok(Json::Object(out))
}

/// Rewrites transformers' `{% generation %}`/`{% endgeneration %}` (assistant-mask markers that
/// render their body unchanged) to `{% if true %}`/`{% endif %}`, keeping whitespace control.
fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        let (before, tag) = rest.split_at(pos);
        out.push_str(before);
        let mut i = 2;
        let b = tag.as_bytes();
        if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
            i += 1;
        }
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let word_start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        let word = &tag[word_start..i];
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        let mut j = i;
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
            j += 1;
        }
        let closes = tag[j..].starts_with("%}");
        match replacement {
            Some(r) if closes => {
                out.push_str(&tag[..word_start]);
                out.push_str(r);
                rest = &tag[i..];
            }
            _ => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// Python semantics: str(), repr(), json.dumps

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside [1e-4, 1e16).
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let e_repr = format!("{f:e}"); // e.g. "-1.2345e-5"
    let (mant, exp) = e_repr.split_once('e').unwrap_or((&e_repr, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mant.starts_with('-');
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                s.push_str(&digits);
                s.extend(std::iter::repeat_n('0', int_len - digits.len()));
                s.push_str(".0");
            } else {
                s.push_str(&digits[..int_len]);
                s.push('.');
                s.push_str(&digits[int_len..]);
            }
        } else {
            s.push_str("0.");
            s.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            s.push_str(&digits);
        }
    } else {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    s
}

fn value_f64(v: &Value) -> Option<f64> {
    f64::try_from(v.clone()).ok()
}

/// Python's `str(value)` for template values.
pub fn py_str(v: &Value) -> String {
    use minijinja::value::ValueKind as K;
    match v.kind() {
        K::Undefined => String::new(),
        K::String => v.as_str().unwrap_or_default().to_string(),
        _ => py_repr(v),
    }
}

/// Python's `repr(value)` (strings quoted, `True`/`None`, lists and dicts recursively).
fn py_repr(v: &Value) -> String {
    use minijinja::value::ValueKind as K;
    match v.kind() {
        K::Undefined => String::new(),
        K::None => "None".into(),
        K::Bool => if v.is_true() { "True" } else { "False" }.into(),
        K::Number => {
            if v.is_integer() {
                v.to_string()
            } else {
                value_f64(v)
                    .map(py_float_repr)
                    .unwrap_or_else(|| v.to_string())
            }
        }
        K::String => py_str_repr(v.as_str().unwrap_or_default()),
        K::Seq | K::Iterable => {
            let items: Vec<String> = match v.try_iter() {
                Ok(it) => it.map(|x| py_repr(&x)).collect(),
                Err(_) => return v.to_string(),
            };
            format!("[{}]", items.join(", "))
        }
        K::Map => {
            let Ok(keys) = v.try_iter() else {
                return v.to_string();
            };
            let items: Vec<String> = keys
                .map(|k| {
                    let val = v.get_item(&k).unwrap_or_default();
                    format!("{}: {}", py_repr(&k), py_repr(&val))
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

fn py_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{a0}' | '\u{ad}' | '\u{600}'..='\u{605}' | '\u{61c}' | '\u{6dd}' | '\u{70f}'
            | '\u{1680}' | '\u{180e}' | '\u{2000}'..='\u{200f}' | '\u{2028}'..='\u{202f}'
            | '\u{205f}'..='\u{2064}' | '\u{2066}'..='\u{206f}' | '\u{3000}' | '\u{e000}'..='\u{f8ff}'
            | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{10ffff}')
}

/// Python's `repr(str)`.
fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_unprintable(c) => {
                let n = c as u32;
                if n < 0x100 {
                    let _ = write!(out, "\\x{n:02x}");
                } else if n < 0x10000 {
                    let _ = write!(out, "\\u{n:04x}");
                } else {
                    let _ = write!(out, "\\U{n:08x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        py_float_repr(f)
    }
}

fn not_serializable(v: &Value) -> minijinja::Error {
    minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", v.kind()),
    )
}

/// Python `json.dumps` for a template value.
fn py_json(
    v: &Value,
    o: &JsonOpts,
    level: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    use minijinja::value::ValueKind as K;
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        K::None => out.push_str("null"),
        K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        K::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                out.push_str(&json_float(
                    value_f64(v).ok_or_else(|| not_serializable(v))?,
                ));
            }
        }
        K::String => json_str(v.as_str().unwrap_or_default(), o.ensure_ascii, out),
        K::Seq | K::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, level + 1);
                py_json(x, o, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        K::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for k in v.try_iter()? {
                let key = match k.kind() {
                    K::String => k.as_str().unwrap_or_default().to_string(),
                    K::None => "null".into(),
                    K::Bool => if k.is_true() { "true" } else { "false" }.into(),
                    K::Number if k.is_integer() => k.to_string(),
                    K::Number => json_float(value_f64(&k).unwrap_or(f64::NAN)),
                    _ => {
                        return Err(minijinja::Error::new(
                            ErrorKind::InvalidOperation,
                            format!(
                                "keys must be str, int, float, bool or None, not {}",
                                k.kind()
                            ),
                        ))
                    }
                };
                let val = v.get_item(&k)?;
                entries.push((key, val));
            }
            if o.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, x)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, level + 1);
                json_str(k, o.ensure_ascii, out);
                out.push_str(&o.key_sep);
                py_json(x, o, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson_filter(
    value: Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii = match kwargs.get::<Option<Value>>("ensure_ascii")? {
        Some(v) => v.is_true(),
        None => ensure_ascii.is_some_and(|v| v.is_true()),
    };
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) => Some(v),
        None => indent,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == minijinja::value::ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => {
            let n = v.as_i64().ok_or_else(|| {
                minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson indent must be an integer or string",
                )
            })?;
            Some(" ".repeat(n.max(0) as usize))
        }
    };
    let (mut item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(seps) if !seps.is_none() => {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson separators must be a pair of strings",
                    ))
                }
            }
        }
        _ => (", ".to_string(), ": ".to_string()),
    };
    if indent.is_some() && !kwargs.has("separators") {
        item_sep = ",".into();
    }
    let sort_keys = kwargs
        .get::<Option<Value>>("sort_keys")?
        .is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let opts = JsonOpts {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    py_json(&value, &opts, 0, &mut out)?;
    Ok(Value::from(out))
}

// ---------------------------------------------------------------------------------------------
// strftime_now

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday
    pub weekday: u32,
    /// 1-based day of the year
    pub yday: u32,
}

impl DateTime {
    /// Converts seconds since the Unix epoch (UTC).
    pub fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Howard Hinnant's civil_from_days
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUM[(month - 1) as usize] + day + u32::from(leap && month > 2);
        DateTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
            weekday: (days + 3).rem_euclid(7) as u32, // 1970-01-01 was a Thursday
            yday,
        }
    }

    /// Python/C `strftime` for the common directives (`%-d` style no-padding included).
    pub fn strftime(&self, fmt: &str) -> String {
        let mut out = String::new();
        let mut chars = fmt.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let no_pad = chars.peek() == Some(&'-');
            if no_pad {
                chars.next();
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let num = |out: &mut String, v: i64, width: usize| {
                if no_pad {
                    let _ = write!(out, "{v}");
                } else {
                    let _ = write!(out, "{v:0width$}");
                }
            };
            let h12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            match d {
                'Y' => {
                    let _ = write!(out, "{}", self.year);
                }
                'y' => num(&mut out, self.year.rem_euclid(100), 2),
                'm' => num(&mut out, self.month.into(), 2),
                'd' => num(&mut out, self.day.into(), 2),
                'e' => {
                    let _ = write!(out, "{:2}", self.day);
                }
                'H' => num(&mut out, self.hour.into(), 2),
                'I' => num(&mut out, h12.into(), 2),
                'M' => num(&mut out, self.minute.into(), 2),
                'S' => num(&mut out, self.second.into(), 2),
                'j' => num(&mut out, self.yday.into(), 3),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'B' => out.push_str(MONTHS[(self.month - 1) as usize]),
                'b' | 'h' => out.push_str(&MONTHS[(self.month - 1) as usize][..3]),
                'A' => out.push_str(WEEKDAYS[self.weekday as usize]),
                'a' => out.push_str(&WEEKDAYS[self.weekday as usize][..3]),
                'u' => {
                    let _ = write!(out, "{}", self.weekday + 1);
                }
                'w' => {
                    let _ = write!(out, "{}", (self.weekday + 1) % 7);
                }
                'F' => {
                    let _ = write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day);
                }
                'T' => {
                    let _ = write!(
                        out,
                        "{:02}:{:02}:{:02}",
                        self.hour, self.minute, self.second
                    );
                }
                'D' => {
                    let _ = write!(
                        out,
                        "{:02}/{:02}/{:02}",
                        self.month,
                        self.day,
                        self.year.rem_euclid(100)
                    );
                }
                'Z' => out.push_str("UTC"),
                'z' => out.push_str("+0000"),
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    if no_pad {
                        out.push('-');
                    }
                    out.push(other);
                }
            }
        }
        out
    }
}

/// `strftime_now(fmt)`: the current time (UTC; transformers uses the local time zone).
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    DateTime::from_unix(secs).strftime(fmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (100.0, "100.0"),
            (1e-7, "1e-07"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (1.2345678, "1.2345678"),
            (1.5e300, "1.5e+300"),
            (123456.789, "123456.789"),
        ] {
            assert_eq!(py_float_repr(f), s, "{f}");
        }
    }

    #[test]
    fn dates() {
        let d = DateTime::from_unix(0);
        assert_eq!(
            d.strftime("%Y-%m-%d %H:%M:%S %a %A %b %j"),
            "1970-01-01 00:00:00 Thu Thursday Jan 001"
        );
        // 2024-02-29 13:05:09 UTC
        let d = DateTime::from_unix(1_709_211_909);
        assert_eq!(
            d.strftime("%d %B %Y %I%p %-d %%"),
            "29 February 2024 01PM 29 %"
        );
        assert_eq!(d.yday, 60);
        let d = DateTime::from_unix(1_735_603_200); // 2024-12-31
        assert_eq!(d.strftime("%d %b %Y %j %a"), "31 Dec 2024 366 Tue");
    }

    #[test]
    fn generation_tags() {
        assert_eq!(
            rewrite_generation_tags(
                "a{%- generation -%}b{% endgeneration %}{%generation%}{{ '{%' }}"
            ),
            "a{%- if true -%}b{% endif %}{%if true%}{{ '{%' }}"
        );
        assert_eq!(rewrite_generation_tags("{% if x %}{%"), "{% if x %}{%");
    }
}
