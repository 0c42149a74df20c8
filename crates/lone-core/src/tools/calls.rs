//! Parsing the inside of a tool-call block into calls: Python call syntax (LFM2's
//! `[f(a=1, b='x'), g(c={'k': [1, 2]})]`) or JSON (`{"name": …, "arguments": {…}}`, one or a
//! list; what Hermes-style templates ask for and what LFM2 writes when told to).

use serde_json::{Map, Number, Value as Json};

use super::ToolCall;

/// The calls in `src`, the text between a call block's markers.
pub fn parse_calls(src: &str) -> Result<Vec<ToolCall>, String> {
    let s = src.trim();
    if s.is_empty() {
        return Err("the tool-call block is empty".into());
    }
    let first_json = s.starts_with('{')
        || (s.starts_with('[') && s[1..].trim_start().starts_with('{'))
        || s.starts_with("```");
    if first_json {
        if let Ok(calls) = json_calls(s) {
            return Ok(calls);
        }
    }
    let mut p = Py::new(s);
    let calls = p.calls()?;
    p.ws();
    if !p.done() {
        return Err(format!(
            "unexpected text after the calls at byte {}: {:?}",
            p.i,
            p.rest_preview()
        ));
    }
    if calls.is_empty() {
        return Err("no calls in the tool-call block".into());
    }
    Ok(calls)
}

/// JSON calls: an object, a list of objects, or objects one after another (a fenced
/// ```json block is unwrapped).
fn json_calls(s: &str) -> Result<Vec<ToolCall>, String> {
    let s = s
        .strip_prefix("```json")
        .or_else(|| s.strip_prefix("```"))
        .map(|r| r.trim_end().strip_suffix("```").unwrap_or(r))
        .unwrap_or(s)
        .trim();
    let mut values = Vec::new();
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Json>();
    loop {
        match it.next() {
            None => break,
            Some(Ok(v)) => values.push(v),
            Some(Err(e)) => {
                // Objects separated by commas or newlines: skip a comma and go on.
                let off = it.byte_offset();
                let rest = s[off..].trim_start();
                if let Some(r) = rest.strip_prefix(',') {
                    return json_calls(r).map(|more| {
                        let mut calls = values_to_calls(values).unwrap_or_default();
                        calls.extend(more);
                        calls
                    });
                }
                return Err(format!("invalid JSON in the tool call: {e}"));
            }
        }
    }
    values_to_calls(values)
}

fn values_to_calls(values: Vec<Json>) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for v in values {
        match v {
            Json::Array(items) => {
                for i in items {
                    calls.push(json_call(i)?);
                }
            }
            v => calls.push(json_call(v)?),
        }
    }
    if calls.is_empty() {
        return Err("no calls in the tool-call block".into());
    }
    Ok(calls)
}

/// `{"name": …, "arguments": {…}}`; also `parameters` for `arguments`, arguments given as a
/// JSON string, and OpenAI's `{"function": {…}}` wrapping.
fn json_call(v: Json) -> Result<ToolCall, String> {
    let Json::Object(mut o) = v else {
        return Err("a JSON tool call must be an object".into());
    };
    if let Some(Json::Object(f)) = o.remove("function") {
        return json_call(Json::Object(f));
    }
    let name = match o.remove("name") {
        Some(Json::String(n)) if !n.is_empty() => n,
        _ => return Err("a JSON tool call needs a non-empty string \"name\"".into()),
    };
    let args = o.remove("arguments").or_else(|| o.remove("parameters"));
    let arguments = match args {
        None | Some(Json::Null) => Map::new(),
        Some(Json::Object(m)) => m,
        Some(Json::String(s)) => match serde_json::from_str::<Json>(&s) {
            Ok(Json::Object(m)) => m,
            _ if s.trim().is_empty() => Map::new(),
            _ => return Err(format!("the arguments of {name} are not a JSON object")),
        },
        Some(_) => return Err(format!("the arguments of {name} are not a JSON object")),
    };
    Ok(ToolCall { name, arguments })
}

/// A recursive-descent parser for the Python subset tool calls use.
struct Py<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    depth: usize,
}

const MAX_DEPTH: usize = 128;

impl<'a> Py<'a> {
    fn new(s: &'a str) -> Py<'a> {
        Py {
            s,
            b: s.as_bytes(),
            i: 0,
            depth: 0,
        }
    }

    fn done(&self) -> bool {
        self.i >= self.b.len()
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn rest_preview(&self) -> String {
        self.s[self.i..].chars().take(24).collect()
    }

    fn ws(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_ascii_whitespace() {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8, what: &str) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!(
                "expected '{}' {what} at byte {}, found {:?}",
                c as char,
                self.i,
                self.rest_preview()
            ))
        }
    }

    /// `[call, call]`, or calls without the brackets.
    fn calls(&mut self) -> Result<Vec<ToolCall>, String> {
        self.ws();
        let bracketed = self.eat(b'[');
        let mut out = Vec::new();
        loop {
            self.ws();
            if bracketed && self.eat(b']') {
                break;
            }
            if self.done() && !bracketed {
                break;
            }
            out.push(self.call()?);
            if self.eat(b',') {
                continue;
            }
            if bracketed {
                self.expect(b']', "after the calls")?;
            }
            break;
        }
        Ok(out)
    }

    fn ident(&mut self, dotted: bool) -> Option<&'a str> {
        self.ws();
        let start = self.i;
        while let Some(c) = self.peek() {
            let ok = c.is_ascii_alphanumeric()
                || c == b'_'
                || c >= 0x80
                || (dotted && self.i > start && (c == b'.' || c == b'-'));
            if !ok || (self.i == start && c.is_ascii_digit()) {
                break;
            }
            self.i += 1;
        }
        // Non-ASCII identifiers: stop on a char boundary.
        while !self.s.is_char_boundary(self.i) {
            self.i += 1;
        }
        (self.i > start).then(|| &self.s[start..self.i])
    }

    /// `name(k=v, …)`.
    fn call(&mut self) -> Result<ToolCall, String> {
        let at = self.i;
        let name = self
            .ident(true)
            .ok_or_else(|| format!("expected a function name at byte {at}"))?
            .to_string();
        self.expect(b'(', &format!("after the function name {name}"))?;
        let mut arguments = Map::new();
        loop {
            if self.eat(b')') {
                break;
            }
            let at = self.i;
            let key = self.ident(false).map(str::to_string);
            let Some(key) = key.filter(|_| self.eat(b'=')) else {
                return Err(format!(
                    "{name}: expected a keyword argument (name=value) at byte {at}; positional arguments are not supported"
                ));
            };
            let v = self.value()?;
            arguments.insert(key, v);
            if self.eat(b',') {
                continue;
            }
            self.expect(b')', &format!("to close the arguments of {name}"))?;
            break;
        }
        Ok(ToolCall { name, arguments })
    }

    fn value(&mut self) -> Result<Json, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("the arguments nest too deeply".into());
        }
        let v = self.value_inner();
        self.depth -= 1;
        v
    }

    fn value_inner(&mut self) -> Result<Json, String> {
        self.ws();
        let at = self.i;
        match self.peek() {
            None => Err("the arguments end in the middle of a value".into()),
            Some(b'[') => {
                self.i += 1;
                self.seq(b']').map(Json::Array)
            }
            Some(b'(') => {
                self.i += 1;
                self.seq(b')').map(Json::Array)
            }
            Some(b'{') => {
                self.i += 1;
                self.dict()
            }
            Some(c) if c == b'\'' || c == b'"' => self.string().map(Json::String),
            Some(c) if c == b'-' || c == b'+' || c == b'.' || c.is_ascii_digit() => self.number(),
            Some(_) => {
                let word = self.ident(true).unwrap_or("");
                // String prefixes: r'…', u'…', b'…' and combinations.
                if matches!(self.peek(), Some(b'\'' | b'"'))
                    && !word.is_empty()
                    && word.len() <= 2
                    && word.chars().all(|c| "rRuUbBfF".contains(c))
                {
                    let raw = word.contains(['r', 'R']);
                    return self.string_body(raw).map(Json::String);
                }
                match word {
                    "True" | "true" => Ok(Json::Bool(true)),
                    "False" | "false" => Ok(Json::Bool(false)),
                    "None" | "null" => Ok(Json::Null),
                    "" => Err(format!(
                        "expected a value at byte {at}, found {:?}",
                        self.rest_preview()
                    )),
                    w => Err(format!("unknown name '{w}' where a value was expected")),
                }
            }
        }
    }

    fn seq(&mut self, close: u8) -> Result<Vec<Json>, String> {
        let mut out = Vec::new();
        loop {
            if self.eat(close) {
                return Ok(out);
            }
            out.push(self.value()?);
            if self.eat(b',') {
                continue;
            }
            self.expect(close, "to close a list")?;
            return Ok(out);
        }
    }

    fn dict(&mut self) -> Result<Json, String> {
        let mut m = Map::new();
        loop {
            if self.eat(b'}') {
                return Ok(Json::Object(m));
            }
            let k = match self.value()? {
                Json::String(s) => s,
                // JSON keys are strings: other literals by their JSON text.
                Json::Null => "null".into(),
                v @ (Json::Bool(_) | Json::Number(_)) => v.to_string(),
                _ => return Err("dict keys must be strings, numbers or booleans".into()),
            };
            self.expect(b':', "after a dict key")?;
            let v = self.value()?;
            m.insert(k, v);
            if self.eat(b',') {
                continue;
            }
            self.expect(b'}', "to close a dict")?;
            return Ok(Json::Object(m));
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.string_body(false)
    }

    /// A quoted string at the cursor ('…', "…", '''…''', """…"""), escapes decoded.
    fn string_body(&mut self, raw: bool) -> Result<String, String> {
        let q = self.peek().ok_or("expected a string")?;
        let triple = self.b[self.i..].starts_with(&[q, q, q]);
        self.i += if triple { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err("a string is not closed".into());
            };
            if c == q && (!triple || self.b[self.i..].starts_with(&[q, q, q])) {
                self.i += if triple { 3 } else { 1 };
                return Ok(out);
            }
            if c == b'\\' {
                if raw {
                    // Raw strings keep the backslash; it still protects a quote.
                    out.push('\\');
                    self.i += 1;
                    if let Some(n) = self.next_char() {
                        out.push(n);
                    }
                    continue;
                }
                self.i += 1;
                self.escape(&mut out)?;
                continue;
            }
            if c == b'\n' && !triple {
                // Models do write literal newlines inside strings: keep them.
                out.push('\n');
                self.i += 1;
                continue;
            }
            let ch = self.next_char().ok_or("bad UTF-8 in a string")?;
            out.push(ch);
        }
    }

    fn next_char(&mut self) -> Option<char> {
        let ch = self.s[self.i..].chars().next()?;
        self.i += ch.len_utf8();
        Some(ch)
    }

    fn hex(&mut self, n: usize) -> Result<u32, String> {
        let h = self
            .s
            .get(self.i..self.i + n)
            .ok_or("a \\x/\\u escape is cut short")?;
        let v = u32::from_str_radix(h, 16).map_err(|_| format!("bad escape digits '{h}'"))?;
        self.i += n;
        Ok(v)
    }

    fn escape(&mut self, out: &mut String) -> Result<(), String> {
        let Some(c) = self.next_char() else {
            return Err("a string ends in a backslash".into());
        };
        let push = |out: &mut String, v: u32| -> Result<(), String> {
            out.push(char::from_u32(v).ok_or_else(|| format!("bad code point {v:#x}"))?);
            Ok(())
        };
        match c {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0' => out.push('\0'),
            'a' => out.push('\x07'),
            'b' => out.push('\x08'),
            'f' => out.push('\x0c'),
            'v' => out.push('\x0b'),
            '\n' => {}
            'x' => {
                let v = self.hex(2)?;
                push(out, v)?;
            }
            'u' => {
                let v = self.hex(4)?;
                // JSON-style surrogate pairs.
                if (0xD800..0xDC00).contains(&v) && self.b[self.i..].starts_with(b"\\u") {
                    self.i += 2;
                    let lo = self.hex(4)?;
                    push(
                        out,
                        0x10000 + ((v - 0xD800) << 10) + (lo.wrapping_sub(0xDC00)),
                    )?;
                } else {
                    push(out, v)?;
                }
            }
            'U' => {
                let v = self.hex(8)?;
                push(out, v)?;
            }
            '/' => out.push('/'),
            // \\ \' \" and unknown escapes (Python keeps the backslash for those).
            '\\' | '\'' | '"' => out.push(c),
            other => {
                out.push('\\');
                out.push(other);
            }
        }
        Ok(())
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'_') {
                // A sign only at the start or after an exponent.
                if matches!(c, b'-' | b'+')
                    && self.i > start
                    && !matches!(self.b[self.i - 1], b'e' | b'E')
                {
                    break;
                }
                self.i += 1;
            } else {
                break;
            }
        }
        let text: String = self.s[start..self.i]
            .chars()
            .filter(|&c| c != '_')
            .collect();
        let t = text.strip_prefix('+').unwrap_or(&text);
        if let Ok(i) = t.parse::<i64>() {
            return Ok(Json::Number(i.into()));
        }
        if let Ok(u) = t.parse::<u64>() {
            return Ok(Json::Number(u.into()));
        }
        let lower = t.to_ascii_lowercase();
        if !lower.contains("inf") && !lower.contains("nan") {
            if let Ok(f) = t.parse::<f64>() {
                if let Some(n) = Number::from_f64(f) {
                    return Ok(Json::Number(n));
                }
            }
        }
        Err(format!("'{text}' is not a number JSON can hold"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(s: &str) -> (String, Json) {
        let c = parse_calls(s).unwrap();
        assert_eq!(c.len(), 1, "{s}");
        (c[0].name.clone(), Json::Object(c[0].arguments.clone()))
    }

    #[test]
    fn python_calls() {
        let c = parse_calls(r#"[f(a=1, b="x"), g(c={'k': [1, 2]})]"#).unwrap();
        assert_eq!(c[0].name, "f");
        assert_eq!(
            Json::Object(c[0].arguments.clone()),
            json!({"a": 1, "b": "x"})
        );
        assert_eq!(
            Json::Object(c[1].arguments.clone()),
            json!({"c": {"k": [1, 2]}})
        );
        assert_eq!(
            one("get_weather(city='東京', unit=None, ok=True, no=False, r=-2.5e3, t=(1, 'a'))"),
            (
                "get_weather".into(),
                json!({"city": "東京", "unit": null, "ok": true, "no": false, "r": -2500.0, "t": [1, "a"]})
            )
        );
        assert_eq!(one("[f()]"), ("f".into(), json!({})));
        assert_eq!(
            one("[ns.tool-x( a = 1 , )]"),
            ("ns.tool-x".into(), json!({"a": 1}))
        );
    }

    #[test]
    fn python_strings() {
        let (_, a) = one(
            r#"f(a='it\'s', b="say \"hi\"", c='line\nnext', d='\\n', e='\u00e9\x41', f='''tri'ple''', g=r'\d+')"#,
        );
        assert_eq!(
            a,
            json!({"a": "it's", "b": "say \"hi\"", "c": "line\nnext", "d": "\\n", "e": "éA", "f": "tri'ple", "g": "\\d+"})
        );
        // A literal newline inside a single-quoted string is kept.
        assert_eq!(one("f(a='x\ny')").1, json!({"a": "x\ny"}));
        assert_eq!(one(r#"f(a="\ud83d\ude00")"#).1, json!({"a": "😀"}));
    }

    #[test]
    fn json_calls_inside_markers() {
        assert_eq!(
            one(r#"{"name": "f", "arguments": {"a": [1, {"b": null}]}}"#),
            ("f".into(), json!({"a": [1, {"b": null}]}))
        );
        assert_eq!(
            one(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#),
            ("f".into(), json!({"a": 1}))
        );
        assert_eq!(
            one(r#"{"name": "f", "parameters": {"a": 1}}"#),
            ("f".into(), json!({"a": 1}))
        );
        let c = parse_calls(
            r#"[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": 1}}]"#,
        )
        .unwrap();
        assert_eq!(c.len(), 2);
        let c = parse_calls("{\"name\": \"f\", \"arguments\": {}}\n{\"name\": \"g\"}").unwrap();
        assert_eq!((c[0].name.as_str(), c[1].name.as_str()), ("f", "g"));
        let c = parse_calls("{\"name\": \"f\"}, {\"name\": \"g\"}").unwrap();
        assert_eq!(c.len(), 2);
        let c = parse_calls("```json\n{\"name\": \"f\", \"arguments\": {\"a\": 2}}\n```").unwrap();
        assert_eq!(c[0].arguments["a"], 2);
    }

    #[test]
    fn malformed_is_an_error_not_a_panic() {
        for bad in [
            "",
            "[",
            "[f(",
            "[f(a=)]",
            "[f(1, 2)]",
            "[f(a='x)]",
            "[f(a=1) g()]",
            "f(a=inf)",
            "f(a=nan)",
            "f(a=foo)",
            "{\"name\": 5}",
            "{\"arguments\": {}}",
            "[f(a={1: })]",
            "[f(a='\\x4')]",
            "[f(a='\\",
            "f(a=\"\\ud800\")x",
            "((((",
            "[f(a=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[)]",
        ] {
            assert!(parse_calls(bad).is_err(), "{bad:?} parsed");
        }
    }
}
