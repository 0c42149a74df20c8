//! The `general.*` authorship metadata llama.cpp's converter writes (gguf-py's
//! `Metadata.load` + `set_gguf_meta_model`): from the model card's YAML front matter
//! (`README.md`), then the id in `config.json`'s `_name_or_path`, then the directory name,
//! each filling only what the ones before left unset.
//!
//! Differences, where the converter would fail or guess: the front matter is read as YAML 1.2
//! (PyYAML reads 1.1, so `no`/`yes`/`on` are strings here — gguf-py quotes `- no` itself), and a
//! number where a string belongs is written as its text, and an empty tag or language list
//! is left out (the converter stops with an error on both).

use std::path::Path;

use regex::Regex;
use yaml_rust2::{Yaml, YamlLoader};

use super::naming::{self, IdParts};

/// One `general.base_model.N.*` or `general.dataset.N.*` entry: (field, value) pairs.
pub type Source = Vec<(&'static str, String)>;

/// The fields of a base model / dataset entry, in the order gguf-py writes them.
const SOURCE_FIELDS: [&str; 9] = [
    "name",
    "author",
    "version",
    "organization",
    "description",
    "url",
    "doi",
    "uuid",
    "repo_url",
];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Authorship {
    pub name: Option<String>,
    pub author: Option<String>,
    pub version: Option<String>,
    pub organization: Option<String>,
    pub finetune: Option<String>,
    pub basename: Option<String>,
    pub description: Option<String>,
    pub size_label: Option<String>,
    pub license: Option<String>,
    pub license_name: Option<String>,
    pub license_link: Option<String>,
    pub source_url: Option<String>,
    pub source_doi: Option<String>,
    pub source_uuid: Option<String>,
    pub source_repo_url: Option<String>,
    pub base_models: Option<Vec<Source>>,
    pub datasets: Option<Vec<Source>>,
    pub tags: Option<Vec<String>>,
    pub languages: Option<Vec<String>>,
}

/// The front matter of `dir/README.md` as a YAML mapping (gguf-py's `load_model_card`): the
/// lines between a first line `---` and the next `---`. No card, no front matter, or front
/// matter that is not a mapping is an empty card.
pub fn load(dir: &Path) -> Option<Yaml> {
    let text = std::fs::read_to_string(dir.join("README.md")).ok()?;
    let mut lines = text.lines();
    if lines.next()? != "---" {
        return None;
    }
    let mut yaml = String::new();
    for l in lines.by_ref() {
        if l == "---" {
            break;
        }
        yaml.push_str(l);
        yaml.push('\n');
    }
    // gguf-py's two repairs: the "Norway problem" and tab indentation.
    let yaml = yaml.replace("- no\n", "- \"no\"\n").replace('\t', "  ");
    let doc = YamlLoader::load_from_str(&yaml).ok()?.into_iter().next()?;
    matches!(doc, Yaml::Hash(_)).then_some(doc)
}

/// A scalar as the string gguf-py would write (`None` for null, lists and mappings).
fn text(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(if *b { "True" } else { "False" }.into()),
        _ => None,
    }
}

fn has(card: &Yaml, key: &str) -> bool {
    !card[key].is_badvalue()
}

/// A source entry from a model id or URL (`get_model_id_components` of the id).
fn source_from_id(id: &str, total_params: u64) -> Source {
    let mut e: Source = Vec::new();
    let mut put = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            e.push((k, v));
        }
    };
    let from = |p: &IdParts| {
        (
            p.name.as_deref().map(naming::id_to_title),
            p.organization.as_deref().map(naming::id_to_title),
            p.version.clone(),
        )
    };
    if ["http://", "https://", "ssh://"]
        .iter()
        .any(|s| id.starts_with(s))
    {
        put("repo_url", Some(id.to_string()));
        if id.contains("huggingface.co") {
            let re = Regex::new(r"^https?://huggingface.co/([^/]+/[^/]+)$").expect("valid");
            if let Some(m) = re.captures(id) {
                let (name, org, version) = from(&naming::id_components(&m[1], total_params));
                put("name", name);
                put("organization", org);
                put("version", version);
            }
        }
    } else {
        let p = naming::id_components(id, total_params);
        let repo = p
            .organization
            .as_ref()
            .zip(p.name.as_ref())
            .map(|(o, n)| format!("https://huggingface.co/{o}/{n}"));
        let (name, org, version) = from(&p);
        put("name", name);
        put("organization", org);
        put("version", version);
        put("repo_url", repo);
    }
    sort(e)
}

fn sort(mut e: Source) -> Source {
    e.sort_by_key(|(k, _)| SOURCE_FIELDS.iter().position(|f| f == k));
    e
}

/// `base_model`/`datasets`-style lists: the first of `keys` present, a string or a list of
/// ids, URLs and mappings (any other value gives an empty list, as in gguf-py).
fn sources(card: &Yaml, keys: [&str; 3], total_params: u64) -> Option<Vec<Source>> {
    if !keys.iter().any(|k| has(card, k)) {
        return None;
    }
    let v = keys.iter().map(|k| &card[*k]).find(|v| !v.is_badvalue())?;
    let items: Vec<&Yaml> = match v {
        Yaml::String(_) => vec![v],
        Yaml::Array(a) => a.iter().collect(),
        _ => vec![],
    };
    Some(
        items
            .into_iter()
            .map(|item| match item {
                Yaml::String(id) => source_from_id(id, total_params),
                Yaml::Hash(_) => sort(
                    SOURCE_FIELDS
                        .iter()
                        .filter_map(|f| text(&item[*f]).map(|v| (*f, v)))
                        .collect(),
                ),
                _ => Vec::new(),
            })
            .collect(),
    )
}

fn fill(slot: &mut Option<String>, v: Option<String>) {
    if slot.is_none() {
        *slot = v;
    }
}

impl Authorship {
    /// gguf-py's heuristics for the checkpoint in `dir` (`dir_name` its directory name).
    pub fn of_checkpoint(
        dir: &Path,
        dir_name: &str,
        name_or_path: Option<&str>,
        total_params: u64,
    ) -> Authorship {
        let mut m = Authorship::default();
        if let Some(card) = load(dir) {
            m.apply_card(&card, total_params);
        }
        if let Some(id) = name_or_path.filter(|id| id.matches('/').count() <= 1) {
            m.apply_id(&naming::id_components(id, total_params));
        }
        m.apply_id(&naming::id_components(dir_name, total_params));
        if m.name.is_none() {
            m.name = Some(dir_name.to_string());
        }
        m
    }

    fn apply_card(&mut self, card: &Yaml, total_params: u64) {
        let get = |k: &str| text(&card[k]);
        // llama.cpp's own keys, the same with model_ in front, then the ones seen on the Hub.
        for prefix in ["", "model_"] {
            let k = |s: &str| format!("{prefix}{s}");
            fill(&mut self.name, get(&k("name")));
            fill(&mut self.author, get(&k("author")));
            fill(&mut self.version, get(&k("version")));
            fill(&mut self.organization, get(&k("organization")));
            fill(&mut self.description, get(&k("description")));
            fill(&mut self.finetune, get(&k("finetune")));
            fill(&mut self.basename, get(&k("basename")));
            fill(&mut self.size_label, get(&k("size_label")));
            fill(&mut self.source_url, get(&k("url")));
            fill(&mut self.source_doi, get(&k("doi")));
            fill(&mut self.source_uuid, get(&k("uuid")));
            fill(&mut self.source_repo_url, get(&k("repo_url")));
        }
        fill(&mut self.author, get("model_creator"));
        fill(&mut self.basename, get("model_type"));
        self.base_models = sources(
            card,
            ["base_model", "base_models", "base_model_sources"],
            total_params,
        );
        self.datasets = sources(
            card,
            ["datasets", "dataset", "dataset_sources"],
            total_params,
        );
        let license = match &card["license"] {
            Yaml::Array(a) => Some(a.iter().filter_map(text).collect::<Vec<_>>().join(",")),
            v => text(v),
        };
        fill(&mut self.license, license);
        fill(&mut self.license_name, get("license_name"));
        fill(&mut self.license_link, get("license_link"));
        let list = |keys: [&str; 2]| -> Option<Vec<String>> {
            let mut out: Option<Vec<String>> = None;
            for k in keys {
                match &card[k] {
                    Yaml::Array(a) => out
                        .get_or_insert_with(Vec::new)
                        .extend(a.iter().filter_map(text)),
                    Yaml::String(s) => out.get_or_insert_with(Vec::new).push(s.clone()),
                    _ => {}
                }
            }
            // gguf-py refuses to write an empty array; lone writes no key.
            out.filter(|v| !v.is_empty())
        };
        self.tags = list(["tags", "pipeline_tag"]);
        self.languages = list(["languages", "language"]);
    }

    fn apply_id(&mut self, p: &IdParts) {
        fill(&mut self.name, p.name.as_deref().map(naming::id_to_title));
        fill(
            &mut self.organization,
            p.organization.as_deref().map(naming::id_to_title),
        );
        fill(&mut self.basename, p.basename.clone());
        fill(&mut self.finetune, p.finetune.clone());
        fill(&mut self.version, p.version.clone());
        fill(&mut self.size_label, p.size_label.clone());
    }

    /// The `general.*` keys in gguf-py's order (`set_gguf_meta_model`), after the sampling
    /// defaults: (key, value) with strings, a count, or a string list.
    pub fn entries(&self) -> Vec<(String, Entry)> {
        let mut out = Vec::new();
        let mut s = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                out.push((format!("general.{k}"), Entry::Str(v.clone())));
            }
        };
        s("name", &self.name);
        s("author", &self.author);
        s("version", &self.version);
        s("organization", &self.organization);
        s("finetune", &self.finetune);
        s("basename", &self.basename);
        s("description", &self.description);
        s("size_label", &self.size_label);
        s("license", &self.license);
        s("license.name", &self.license_name);
        s("license.link", &self.license_link);
        s("source.url", &self.source_url);
        s("source.doi", &self.source_doi);
        s("source.uuid", &self.source_uuid);
        s("source.repo_url", &self.source_repo_url);
        for (key, list) in [
            ("base_model", &self.base_models),
            ("dataset", &self.datasets),
        ] {
            if let Some(list) = list {
                out.push((format!("general.{key}.count"), Entry::Count(list.len())));
                for (i, e) in list.iter().enumerate() {
                    for (f, v) in e {
                        out.push((format!("general.{key}.{i}.{f}"), Entry::Str(v.clone())));
                    }
                }
            }
        }
        for (key, list) in [("tags", &self.tags), ("languages", &self.languages)] {
            if let Some(list) = list {
                out.push((format!("general.{key}"), Entry::List(list.clone())));
            }
        }
        out
    }
}

/// A `general.*` value: a string, a `u32` count, or an array of strings.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Str(String),
    Count(usize),
    List(Vec<String>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(yaml: &str) -> Yaml {
        YamlLoader::load_from_str(yaml).unwrap().remove(0)
    }

    #[test]
    fn ids_and_urls_become_sources() {
        let c = card("base_model: [Org/Some-Model-v2, 'https://huggingface.co/A/B-C', ssh://x]\n");
        let s = sources(&c, ["base_model", "base_models", "base_model_sources"], 0).unwrap();
        assert_eq!(s[0][0], ("name", "Some Model v2".to_string()));
        assert!(s[0].contains(&(
            "repo_url",
            "https://huggingface.co/Org/Some-Model-v2".into()
        )));
        assert_eq!(s[1].last().unwrap().0, "repo_url");
        assert_eq!(s[2], vec![("repo_url", "ssh://x".to_string())]);
        // One mapping instead of a list: gguf-py records no base model.
        let c = card("base_model: {name: X}\n");
        assert_eq!(sources(&c, ["base_model", "b", "c"], 0), Some(vec![]));
        assert_eq!(sources(&c, ["datasets", "dataset", "d"], 0), None);
    }
}
