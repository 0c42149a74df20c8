//! The `general.*` names llama.cpp's converter derives from a checkpoint's directory name
//! (gguf-py's `Metadata.get_model_id_components`, `id_to_title` and `size_label`).
//! The model card and `_name_or_path` come first: see [`super::card`].

use regex::Regex;

/// What a model id such as `SmolLM2-135M-Instruct` says about the model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdParts {
    pub name: Option<String>,
    pub organization: Option<String>,
    pub basename: Option<String>,
    pub finetune: Option<String>,
    pub version: Option<String>,
    pub size_label: Option<String>,
}

fn full(re: &str) -> Regex {
    Regex::new(&format!("(?i)^(?:{re})$")).expect("a valid pattern")
}

/// Python's `str.title()`: the first cased character after a non-cased one goes upper case,
/// the others lower case.
fn py_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        let cased = c.is_lowercase() || c.is_uppercase();
        if cased && !prev_cased {
            out.extend(c.to_uppercase());
        } else if cased {
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
        prev_cased = cased;
    }
    out
}

/// Python's `str.islower()`: at least one cased character and no upper case one.
fn py_islower(s: &str) -> bool {
    s.chars().any(|c| c.is_lowercase()) && !s.chars().any(|c| c.is_uppercase())
}

/// gguf-py's `id_to_title`: words title-cased unless they are acronyms or versions.
pub fn id_to_title(s: &str) -> String {
    let ver = full(r"v\d+(?:\.\d+)*|\d.*");
    s.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            if py_islower(w) && !ver.is_match(w) {
                py_title(w)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// gguf-py's `get_model_id_components` for a model id (`org/name` or `name`).
pub fn id_components(model_id: &str, total_params: u64) -> IdParts {
    if model_id.contains(' ') {
        return IdParts {
            name: Some(model_id.to_string()),
            ..Default::default()
        };
    }
    let (org, full_name) = match model_id.split_once('/') {
        Some((o, n)) => (Some(o.to_string()).filter(|o| !o.starts_with('.')), n),
        None => (None, model_id),
    };
    let mut parts: Vec<String> = full_name
        .split('-')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    #[derive(Default, Clone)]
    struct T {
        basename: bool,
        size_label: bool,
        finetune: bool,
        version: bool,
        kind: bool,
    }
    impl T {
        fn empty(&self) -> bool {
            !(self.basename || self.size_label || self.finetune || self.version || self.kind)
        }
        fn count(&self) -> usize {
            [
                self.basename,
                self.size_label,
                self.finetune,
                self.version,
                self.kind,
            ]
            .iter()
            .filter(|b| **b)
            .count()
        }
    }
    let mut types = vec![T::default(); parts.len()];
    let version_re = full(r"(v|iter)?\d+([.]\d+)*");
    let type_re = full(r"i?q\d(_\w)*|b?fp?(16|32)");
    let size_re = full(r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)");
    let finetune_re = full(r"chat|instruct|vision|lora");
    for i in 0..parts.len() {
        let part = parts[i].clone();
        if version_re.is_match(&part) {
            types[i].version = true;
        } else if type_re.is_match(&part) {
            types[i].kind = true;
            parts[i] = part.to_uppercase();
        } else if i > 0 && size_re.is_match(&part) {
            let mut p: Vec<char> = part.replace('_', ".").chars().collect();
            if p.last().is_some_and(|c| c.is_ascii_digit()) && p.len() >= 2 {
                // bloom-7b1 → 7.1b
                let n = p.len();
                let (a, b) = (p[n - 2], p[n - 1]);
                p.truncate(n - 2);
                p.push('.');
                p.push(b);
                p.push(a);
            }
            let n = p.len();
            if n > 1 && p[n - 2].is_ascii_digit() && "kmbt".contains(p[n - 1]) {
                p[n - 1] = p[n - 1].to_ascii_uppercase();
            }
            let mut s: String = p.iter().collect();
            if total_params != 0 {
                let last = s.chars().last().unwrap_or(' ');
                let scale = " KMBT".find(last);
                if let (Ok(v), Some(scale)) = (s[..s.len() - last.len_utf8()].parse::<f64>(), scale)
                {
                    let label = v * 1000f64.powi(scale as i32);
                    let total = total_params as f64;
                    if (label - total).abs() > (7 * total_params / 8) as f64 {
                        types[i].finetune = true;
                        let l = s.pop().unwrap_or(' ');
                        s.extend(l.to_lowercase());
                    }
                }
            }
            if types[i].empty() {
                types[i].size_label = true;
            }
            parts[i] = s;
        } else if i > 0 && finetune_re.is_match(&part) {
            types[i].finetune = true;
        }
    }
    // Word size labels give way to numeric ones.
    if parts
        .iter()
        .zip(&types)
        .any(|(n, t)| t.size_label && n.chars().any(|c| c.is_ascii_digit()))
    {
        for (n, t) in parts.iter().zip(types.iter_mut()) {
            if t.size_label && n.chars().all(|c| c.is_alphabetic()) {
                t.size_label = false;
            }
        }
    }
    let mut at_start = true;
    for (p, t) in parts.iter().zip(types.iter_mut()) {
        let starts_alpha = p.chars().next().is_some_and(|c| c.is_alphabetic());
        if at_start && ((t.empty() && starts_alpha) || t.version) {
            t.basename = true;
        } else {
            at_start = false;
            if t.empty() {
                t.finetune = true;
            }
        }
    }
    for t in types.iter_mut().rev() {
        if t.basename && t.count() > 1 {
            t.basename = false;
        } else {
            break;
        }
    }
    let join = |f: &dyn Fn(&T) -> bool| -> Option<String> {
        let v: Vec<&str> = parts
            .iter()
            .zip(&types)
            .filter(|(_, t)| f(t))
            .map(|(p, _)| p.as_str())
            .collect();
        (!v.is_empty()).then(|| v.join("-"))
    };
    let mut basename = join(&|t| t.basename);
    let size_label = {
        let mut seen: Vec<&str> = Vec::new();
        for (p, t) in parts.iter().zip(&types) {
            if t.size_label && !seen.contains(&p.as_str()) {
                seen.push(p);
            }
        }
        (!seen.is_empty()).then(|| seen.join("-"))
    };
    let finetune = join(&|t| t.finetune);
    let version = join(&|t| t.version && !t.basename);
    if size_label.is_none() && finetune.is_none() && version.is_none() {
        basename = None;
    }
    IdParts {
        name: Some(full_name.to_string()),
        organization: org,
        basename,
        finetune,
        version,
        size_label,
    }
}

/// gguf-py's `model_weight_count_rounded_notation` with two significant digits: `169K`,
/// `1.2B`.
pub fn size_label(total_params: u64) -> String {
    let n = total_params as f64;
    let (scaled, suffix) = if n > 1e12 {
        (n * 1e-12, "T")
    } else if n > 1e9 {
        (n * 1e-9, "B")
    } else if n > 1e6 {
        (n * 1e-6, "M")
    } else {
        (n * 1e-3, "K")
    };
    // Python's round() is round-half-even.
    let rounded = scaled.round_ties_even() as u64;
    let digits = rounded.to_string().trim_start_matches('0').len();
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values: gguf-py 0.19 (llama.cpp 0c1e570) run on the same ids.
    #[test]
    fn model_ids_split_as_gguf_py_splits_them() {
        let p = id_components("SmolLM2-135M-Instruct", 134_515_008);
        assert_eq!(p.basename.as_deref(), Some("SmolLM2"));
        assert_eq!(p.size_label.as_deref(), Some("135M"));
        assert_eq!(p.finetune.as_deref(), Some("Instruct"));
        assert_eq!(p.version, None);
        assert_eq!(
            id_to_title("SmolLM2-135M-Instruct"),
            "SmolLM2 135M Instruct"
        );
        let p = id_components("Qwen2.5-0.5B-Instruct", 494_032_768);
        assert_eq!(p.basename.as_deref(), Some("Qwen2.5"));
        assert_eq!(p.size_label.as_deref(), Some("0.5B"));
        assert_eq!(p.finetune.as_deref(), Some("Instruct"));
        let p = id_components("LiquidAI/LFM2-350M", 354_483_968);
        assert_eq!(p.organization.as_deref(), Some("LiquidAI"));
        assert_eq!(p.basename.as_deref(), Some("LFM2"));
        assert_eq!(p.size_label.as_deref(), Some("350M"));
        assert_eq!(id_to_title("lfm2_a"), "Lfm2_A");
        assert_eq!(id_to_title("qwen2"), "Qwen2");
        assert_eq!(id_components("lfm2_a", 169_000).basename, None);
    }

    #[test]
    fn size_labels_have_two_significant_digits() {
        assert_eq!(size_label(169_024), "169K");
        assert_eq!(size_label(111_000), "111K");
        assert_eq!(size_label(1_170_000_000), "1.2B");
        assert_eq!(size_label(354_483_968), "354M");
        assert_eq!(size_label(8_300), "8.3K");
    }
}
