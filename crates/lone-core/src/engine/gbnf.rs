//! llama.cpp's GBNF grammars, converted to the Lark dialect llguidance reads: `name ::= …`
//! becomes `r_name: …` (one line per rule, `root` is the start), character classes and `.`
//! become regexes; strings, groups, `| * + ?` and `{m,n}` carry over.

use crate::error::{Error, Result};

fn err(msg: impl Into<String>) -> Error {
    Error::Input(format!("invalid GBNF grammar: {}", msg.into()))
}

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Def,
    Lit(String),
    Other(String),
}

fn rule_name(n: &str) -> String {
    format!("r_{}", n.replace('-', "_").to_lowercase())
}

/// Read a quoted string or class starting at `i` (`open`..`close`), escapes kept verbatim.
fn delimited(c: &[char], mut i: usize, close: char) -> Result<(String, usize)> {
    let mut s = String::new();
    s.push(c[i]);
    i += 1;
    while i < c.len() {
        let ch = c[i];
        s.push(ch);
        i += 1;
        if ch == '\\' {
            if i < c.len() {
                s.push(c[i]);
                i += 1;
            }
            continue;
        }
        if ch == close {
            return Ok((s, i));
        }
    }
    Err(err(format!(
        "unclosed {}",
        if close == '"' {
            "string"
        } else {
            "character class"
        }
    )))
}

fn lex(src: &str) -> Result<Vec<Tok>> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        match ch {
            '#' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            c0 if c0.is_whitespace() => i += 1,
            ':' if c[i..].starts_with(&[':', ':', '=']) => {
                out.push(Tok::Def);
                i += 3;
            }
            '"' => {
                let (s, j) = delimited(&c, i, '"')?;
                out.push(Tok::Lit(s));
                i = j;
            }
            '[' => {
                let (s, j) = delimited(&c, i, ']')?;
                // A regex between slashes: a slash inside must be escaped.
                let body = s.replace('/', "\\/");
                out.push(Tok::Lit(format!("/{body}/")));
                i = j;
            }
            '.' => {
                out.push(Tok::Lit("/(?s:.)/".into()));
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                out.push(Tok::Other(ch.to_string()));
                i += 1;
            }
            '{' => {
                let j = c[i..]
                    .iter()
                    .position(|&x| x == '}')
                    .ok_or_else(|| err("unclosed {m,n}"))?;
                let rep: String = c[i..i + j + 1]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                out.push(Tok::Other(rep));
                i += j + 1;
            }
            c0 if c0.is_ascii_alphanumeric() || c0 == '-' || c0 == '_' => {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '-' || c[i] == '_') {
                    i += 1;
                }
                out.push(Tok::Name(c[start..i].iter().collect()));
            }
            other => return Err(err(format!("unexpected character '{other}'"))),
        }
    }
    Ok(out)
}

/// The Lark text of `src`.
pub fn to_lark(src: &str) -> Result<String> {
    let toks = lex(src)?;
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if let (Tok::Name(n), Some(Tok::Def)) = (&toks[i], toks.get(i + 1)) {
            rules.push((n.clone(), Vec::new()));
            i += 2;
            continue;
        }
        let Some((_, body)) = rules.last_mut() else {
            return Err(err("the grammar must start with a rule (name ::= ...)"));
        };
        body.push(match &toks[i] {
            Tok::Name(n) => rule_name(n),
            Tok::Lit(s) | Tok::Other(s) => s.clone(),
            Tok::Def => return Err(err("'::=' without a rule name")),
        });
        i += 1;
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err(err("no 'root' rule"));
    }
    let mut out = String::from("start: r_root\n");
    for (n, body) in &rules {
        if body.is_empty() {
            out.push_str(&format!("{}: \"\"\n", rule_name(n)));
        } else {
            out.push_str(&format!("{}: {}\n", rule_name(n), body.join(" ")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_llama_cpp_grammars() {
        let g = r#"
# a list of items
root ::= "[" ws item ("," ws item)* "]"   # the list
item ::= [a-zA-Z_/]+ | "\"" ( [^"\\] | "\\" . )* "\""
ws ::= [ \t\n]{0,3}
"#;
        let l = to_lark(g).unwrap();
        assert_eq!(
            l,
            "start: r_root\nr_root: \"[\" r_ws r_item ( \",\" r_ws r_item ) * \"]\"\nr_item: /[a-zA-Z_\\/]/ + | \"\\\"\" ( /[^\"\\\\]/ | \"\\\\\" /(?s:.)/ ) * \"\\\"\"\nr_ws: /[ \\t\\n]/ {0,3}\n"
        );
        assert!(to_lark("item ::= \"a\"").is_err());
        assert!(to_lark("root ::= \"a").is_err());
        assert!(to_lark("root ::= [a-").is_err());
        assert!(to_lark("\"a\" root ::= x").is_err());
        assert!(to_lark("root ::= a ; b").is_err());
    }
}
