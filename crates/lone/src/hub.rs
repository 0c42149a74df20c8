//! Models from the Hugging Face Hub: `org/name[:QUANT]` (or `hf://org/name[:QUANT]`) resolved
//! to a file in the `huggingface_hub` cache, downloading what is missing.
//!
//! - Cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, in the
//!   layout Python tools share: `models--org--name/{blobs/<hash>, refs/<revision>,
//!   snapshots/<commit>/<file> → ../../blobs/<hash>}`.
//! - Endpoint `$HF_ENDPOINT` (default https://huggingface.co), token `$HF_TOKEN` (else
//!   `$HF_HOME/token`), `HF_HUB_OFFLINE=1` to use the cache only.
//! - Which files: a repo with GGUF files gives the one whose name carries the quant tag
//!   (`Q4_K_M` when none is given and several exist); a checkpoint repo gives its config,
//!   tokenizer and safetensors files.
//! - Downloads go to `blobs/<hash>.incomplete` and resume from there (HTTP Range) after an
//!   interrupted transfer; an LFS file's sha256 must be what the Hub reports, else it is
//!   deleted and refused.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// A parsed `org/name[:QUANT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoRef {
    pub repo: String,
    pub quant: Option<String>,
    pub revision: String,
}

impl RepoRef {
    /// `org/name`, `org/name:QUANT`, `hf://org/name[:QUANT]`, optionally `@REVISION` after the
    /// name.
    pub fn parse(s: &str) -> Option<RepoRef> {
        let s = s.strip_prefix("hf://").unwrap_or(s);
        let (main, quant) = match s.rsplit_once(':') {
            Some((m, q)) if !q.is_empty() && !q.contains('/') => (m, Some(q.to_string())),
            _ => (s, None),
        };
        let (repo, revision) = match main.split_once('@') {
            Some((r, v)) if !v.is_empty() => (r, v.to_string()),
            _ => (main, "main".to_string()),
        };
        let mut parts = repo.split('/');
        let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        let ok = |x: &str| {
            !x.is_empty()
                && !x.starts_with('.')
                && !x.contains("..")
                && x.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !ok(org) || !ok(name) || name.to_ascii_lowercase().ends_with(".gguf") {
            return None;
        }
        Some(RepoRef {
            repo: repo.to_string(),
            quant,
            revision,
        })
    }

    fn cache_dir(&self) -> PathBuf {
        cache_root().join(format!("models--{}", self.repo.replace('/', "--")))
    }
}

/// The `huggingface_hub` cache root.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    hf_home().join("hub")
}

fn hf_home() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("huggingface")
}

fn endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string()
}

fn token() -> Option<String> {
    if let Ok(t) = std::env::var("HF_TOKEN") {
        if !t.trim().is_empty() {
            return Some(t.trim().to_string());
        }
    }
    std::fs::read_to_string(hf_home().join("token"))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

#[derive(Deserialize, Debug)]
struct Lfs {
    sha256: String,
    size: u64,
}

#[derive(Deserialize, Debug)]
struct Sibling {
    rfilename: String,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    size: Option<u64>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize, Debug)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

/// Files of a checkpoint repo that lone reads.
fn checkpoint_file(f: &str) -> bool {
    matches!(
        f,
        "config.json"
            | "generation_config.json"
            | "tokenizer.json"
            | "tokenizer_config.json"
            | "special_tokens_map.json"
            | "chat_template.jinja"
            | "chat_template.json"
            | "model.safetensors.index.json"
            | "README.md"
    ) || (!f.contains('/') && f.ends_with(".safetensors"))
        || f.strip_prefix("additional_chat_templates/")
            .is_some_and(|n| !n.contains('/') && n.ends_with(".jinja"))
}

/// Whether GGUF file name `f` carries quant tag `q` (`…-Q4_K_M.gguf`, `….q4_k_m.gguf`).
fn has_tag(f: &str, q: &str) -> bool {
    let (f, q) = (f.to_ascii_lowercase(), q.to_ascii_lowercase());
    let name = f.rsplit('/').next().unwrap_or(&f);
    let mut from = 0;
    while let Some(i) = name[from..].find(&q) {
        let at = from + i;
        let before = name[..at].chars().last();
        let after = name[at + q.len()..].chars().next();
        if before.is_none_or(|c| "-._".contains(c)) && after.is_some_and(|c| ".-".contains(c)) {
            return true;
        }
        from = at + 1;
    }
    false
}

pub fn is_projector(f: &str) -> bool {
    let name = f.rsplit('/').next().unwrap_or(f);
    name.to_ascii_lowercase().starts_with("mmproj")
}

/// The bits of a GGUF file name's quant tag, the text after its last `-` (split parts'
/// `-NNNNN-of-NNNNN` left out): 4 for `…-Q4_K_M.gguf`, 16 for `…-F16.gguf`, 0 without digits
/// (llama.cpp's rule when it picks an mmproj).
fn quant_bits(f: &str) -> u32 {
    let name = f.rsplit('/').next().unwrap_or(f);
    let stem = name
        .strip_suffix(".gguf")
        .or_else(|| name.strip_suffix(".GGUF"))
        .unwrap_or(name);
    let digits = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit());
    let stem = match stem.rsplitn(4, '-').collect::<Vec<_>>()[..] {
        [n, "of", i, rest] if digits(n) && digits(i) => rest,
        _ => stem,
    };
    let tag = stem.rsplit('-').next().unwrap_or(stem);
    let digits: String = tag
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// The mmproj for the GGUF `model` among a repo's `files`, as llama.cpp's `-hf` picks it: an
/// `mmproj` GGUF in the model's directory or one above it, the deepest, then the closest in
/// quant bits to the model (an F16 projector beside an F16 model, say).
pub fn best_projector<'a>(files: &[&'a str], model: &str) -> Option<&'a str> {
    let dir_of = |f: &str| -> Vec<String> {
        let mut parts: Vec<String> = f.split('/').map(str::to_string).collect();
        parts.pop();
        parts
    };
    let model_dir = dir_of(model);
    let bits = quant_bits(model);
    let mut best: Option<(&str, usize, u32)> = None;
    for &f in files {
        if !is_projector(f) || !f.to_ascii_lowercase().ends_with(".gguf") {
            continue;
        }
        let d = dir_of(f);
        if !model_dir.starts_with(&d) {
            continue;
        }
        let diff = quant_bits(f).abs_diff(bits);
        let better = match best {
            None => true,
            Some((_, depth, bd)) => d.len() > depth || (d.len() == depth && diff < bd),
        };
        if better {
            best = Some((f, d.len(), diff));
        }
    }
    best.map(|b| b.0)
}

/// The mmproj `lone pull` fetched beside a GGUF `model` in the Hub cache (the snapshot it lies
/// in holds one), if any: a vision-language repo's model then takes images without
/// `--mmproj`.
pub fn projector_beside(model: &Path) -> Option<PathBuf> {
    let name = model.file_name()?.to_string_lossy().into_owned();
    if !name.to_ascii_lowercase().ends_with(".gguf") || is_projector(&name) {
        return None;
    }
    // The snapshot: the ancestor whose parent is `snapshots` inside a `models--*` directory.
    let snap = model.ancestors().skip(1).find(|a| {
        let parent = a.parent();
        parent
            .and_then(Path::file_name)
            .is_some_and(|n| n == "snapshots")
            && parent
                .and_then(Path::parent)
                .and_then(Path::file_name)
                .is_some_and(|n| n.to_string_lossy().starts_with("models--"))
    })?;
    let rel = model
        .strip_prefix(snap)
        .ok()?
        .to_string_lossy()
        .into_owned();
    let mut files = Vec::new();
    list_files(snap, snap, &mut files);
    let names: Vec<&str> = files.iter().map(String::as_str).collect();
    best_projector(&names, &rel).map(|p| snap.join(p))
}

/// `files`, when they are exactly the parts of one split GGUF (`…-00001-of-0000N.gguf` …),
/// first part first.
fn one_split(files: &[&str]) -> Option<Vec<String>> {
    let mut sorted = files.to_vec();
    sorted.sort_unstable();
    let parts = lone_core::loader::gguf::split_parts_by_name(Path::new(sorted.first()?))?;
    let parts: Vec<String> = parts
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    (parts == sorted).then_some(parts)
}

/// Which of a repo's files to fetch, and the file to hand to the loader (a GGUF, or the
/// snapshot directory for a checkpoint).
fn choose(r: &RepoRef, files: &[&str]) -> Result<(Vec<String>, Option<String>)> {
    let mut ggufs: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    // Multimodal projectors (`mmproj-*.gguf`) are not language models to pick.
    if ggufs.iter().any(|f| !is_projector(f)) {
        ggufs.retain(|f| !is_projector(f));
    }
    if !ggufs.is_empty() {
        let pick =
            |q: &str| -> Vec<&str> { ggufs.iter().copied().filter(|f| has_tag(f, q)).collect() };
        let chosen = match &r.quant {
            Some(q) => pick(q),
            None if ggufs.len() == 1 || one_split(&ggufs).is_some() => ggufs.clone(),
            None => pick("Q4_K_M"),
        };
        // A vision-language repo's mmproj comes along (as with llama.cpp's `-hf`).
        let with_projector = |mut get: Vec<String>, entry: &str| {
            if let Some(p) = best_projector(files, entry) {
                if !get.iter().any(|g| g == p) {
                    get.push(p.to_string());
                }
            }
            get
        };
        if let Some(parts) = one_split(&chosen) {
            let first = parts[0].clone();
            return Ok((with_projector(parts, &first), Some(first)));
        }
        return match chosen.as_slice() {
            [one] => Ok((
                with_projector(vec![one.to_string()], one),
                Some(one.to_string()),
            )),
            [] => bail!(
                "{}: no GGUF file {}; it has: {} (pick one with {}:QUANT)",
                r.repo,
                match &r.quant {
                    Some(q) => format!("tagged {q}"),
                    None => "tagged Q4_K_M (the default when there are several)".into(),
                },
                ggufs.join(", "),
                r.repo
            ),
            many => bail!(
                "{}: several GGUF files match: {}; name the file's quant tag exactly",
                r.repo,
                many.join(", ")
            ),
        };
    }
    if let Some(q) = &r.quant {
        bail!("{}: has no GGUF files, so no quant tag {q} to pick", r.repo);
    }
    let want: Vec<String> = files
        .iter()
        .filter(|f| checkpoint_file(f))
        .map(|f| f.to_string())
        .collect();
    if !want.iter().any(|f| f == "config.json") || !want.iter().any(|f| f.ends_with(".safetensors"))
    {
        bail!(
            "{}: neither a GGUF file nor a safetensors checkpoint (config.json + *.safetensors) to load",
            r.repo
        );
    }
    Ok((want, None))
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(std::time::Duration::from_secs(30)))
        .timeout_recv_body(None)
        .build()
        .into()
}

fn get(agent: &ureq::Agent, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
    let mut req = agent
        .get(url)
        .header("User-Agent", concat!("lone/", env!("CARGO_PKG_VERSION")));
    if let Some(t) = token() {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    req
}

fn status_error(r: &RepoRef, status: u16, what: &str) -> anyhow::Error {
    match status {
        401 | 403 => anyhow::anyhow!(
            "{}: access refused ({status}) for {what}: the repo is gated or private. Accept its terms on the Hub, then set HF_TOKEN to a token that may read it",
            r.repo
        ),
        404 => anyhow::anyhow!(
            "{}: not found on {} ({what}): check the repo id and revision '{}'",
            r.repo,
            endpoint(),
            r.revision
        ),
        s => anyhow::anyhow!("{}: the Hub answered {s} for {what}", r.repo),
    }
}

/// The local path for `r`, downloading what the cache lacks (unless offline).
pub fn resolve(r: &RepoRef) -> Result<PathBuf> {
    let dir = r.cache_dir();
    if offline() {
        return resolve_offline(r, &dir);
    }
    let agent = agent();
    let url = format!(
        "{}/api/models/{}/revision/{}?blobs=true",
        endpoint(),
        r.repo,
        r.revision
    );
    let mut resp = match get(&agent, &url).call() {
        Ok(resp) => resp,
        Err(e) => {
            // No network: the cache may still have it.
            if let Ok(p) = resolve_offline(r, &dir) {
                eprintln!(
                    "lone: cannot reach {} ({e}); using the cached copy",
                    endpoint()
                );
                return Ok(p);
            }
            return Err(e).with_context(|| {
                format!(
                    "cannot reach {} to resolve {} (set HF_HUB_OFFLINE=1 to use only the cache)",
                    endpoint(),
                    r.repo
                )
            });
        }
    };
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(status_error(r, status, "its file list"));
    }
    let info: RepoInfo = resp
        .body_mut()
        .read_json()
        .with_context(|| format!("{}: the Hub's file list is not valid JSON", r.repo))?;
    let names: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    let (files, entry) = choose(r, &names)?;
    if info.sha.len() < 7 || !info.sha.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("{}: the Hub gave a bad commit id {:?}", r.repo, info.sha);
    }
    let snapshot = dir.join("snapshots").join(&info.sha);
    for f in &files {
        let s = info
            .siblings
            .iter()
            .find(|s| &s.rfilename == f)
            .expect("chosen from the list");
        fetch_file(&agent, r, &info.sha, s, &dir, &snapshot)?;
    }
    std::fs::create_dir_all(dir.join("refs"))?;
    if r.revision != info.sha {
        std::fs::write(dir.join("refs").join(&r.revision), &info.sha)?;
    }
    Ok(match entry {
        Some(f) => snapshot.join(f),
        None => snapshot,
    })
}

fn resolve_offline(r: &RepoRef, dir: &Path) -> Result<PathBuf> {
    let commit = match std::fs::read_to_string(dir.join("refs").join(&r.revision)) {
        Ok(c) => c.trim().to_string(),
        Err(_) if dir.join("snapshots").join(&r.revision).is_dir() => r.revision.clone(),
        Err(_) => bail!(
            "{} is not in the cache at {} and HF_HUB_OFFLINE is set (or the Hub is unreachable): run `lone pull {}` while online",
            r.repo,
            cache_root().display(),
            r.repo
        ),
    };
    let snap = dir.join("snapshots").join(&commit);
    let mut files = Vec::new();
    list_files(&snap, &snap, &mut files);
    let names: Vec<&str> = files.iter().map(String::as_str).collect();
    let (_, entry) =
        choose(r, &names).with_context(|| format!("in the cached snapshot {}", snap.display()))?;
    Ok(match entry {
        Some(f) => snap.join(f),
        None => snap,
    })
}

fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            list_files(root, &p, out);
        } else if p.exists() {
            if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
}

fn fetch_file(
    agent: &ureq::Agent,
    r: &RepoRef,
    commit: &str,
    s: &Sibling,
    dir: &Path,
    snapshot: &Path,
) -> Result<()> {
    let f = &s.rfilename;
    if f.split('/').any(|p| p == ".." || p.is_empty()) || f.starts_with('/') {
        bail!("{}: refusing the file name {f:?}", r.repo);
    }
    let link = snapshot.join(f);
    if link.exists() {
        return Ok(());
    }
    let blob_name = match (&s.lfs, &s.blob_id) {
        (Some(l), _) => l.sha256.clone(),
        (None, Some(b)) => b.clone(),
        (None, None) => bail!("{}: the Hub lists {f} without a hash", r.repo),
    };
    if !blob_name.chars().all(|c| c.is_ascii_hexdigit()) || blob_name.is_empty() {
        bail!("{}: bad hash {blob_name:?} for {f}", r.repo);
    }
    let size = s.lfs.as_ref().map(|l| l.size).or(s.size);
    let blobs = dir.join("blobs");
    std::fs::create_dir_all(&blobs)?;
    let blob = blobs.join(&blob_name);
    if !blob.exists() {
        let part = blobs.join(format!("{blob_name}.incomplete"));
        let url = format!("{}/{}/resolve/{commit}/{f}", endpoint(), r.repo);
        download(agent, r, &url, &part, size, f)?;
        if let Some(l) = &s.lfs {
            let got = sha256_file(&part)?;
            if got != l.sha256 {
                let _ = std::fs::remove_file(&part);
                bail!(
                    "{}: {f} has sha256 {got}, but the Hub says {}: the download is corrupt and was deleted; try again",
                    r.repo,
                    l.sha256
                );
            }
        }
        std::fs::rename(&part, &blob)?;
    }
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let depth = f.matches('/').count() + 2;
    let target = PathBuf::from("../".repeat(depth))
        .join("blobs")
        .join(&blob_name);
    #[cfg(unix)]
    std::os::unix::fs::symlink(&target, &link)
        .with_context(|| format!("cannot link {}", link.display()))?;
    #[cfg(not(unix))]
    std::fs::copy(&blob, &link).map(|_| ())?;
    Ok(())
}

fn sha256_file(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Download `url` into `part`, resuming from what `part` holds; retries an interrupted
/// transfer a few times.
fn download(
    agent: &ureq::Agent,
    r: &RepoRef,
    url: &str,
    part: &Path,
    size: Option<u64>,
    name: &str,
) -> Result<()> {
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(size.unwrap_or(0));
        b.set_style(
            ProgressStyle::with_template(
                "{msg} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} {bytes_per_sec} (ETA {eta})",
            )
            .expect("a valid template"),
        );
        b.set_message(name.to_string());
        b
    });
    let mut last_err = None;
    for attempt in 0..5 {
        let have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
        if size.is_some_and(|s| have == s) {
            break;
        }
        let mut req = get(agent, url);
        if have > 0 {
            req = req.header("Range", &format!("bytes={have}-"));
        }
        let resp = match req.call() {
            Ok(resp) => resp,
            Err(e) => {
                last_err = Some(anyhow::anyhow!("{e}"));
                std::thread::sleep(std::time::Duration::from_millis(200 << attempt));
                continue;
            }
        };
        let status = resp.status().as_u16();
        let mut file = match status {
            206 if have > 0 => std::fs::OpenOptions::new().append(true).open(part)?,
            200 => std::fs::File::create(part)?,
            416 => {
                // Nothing past what we hold: start over.
                std::fs::remove_file(part)?;
                continue;
            }
            s => return Err(status_error(r, s, name)),
        };
        let start = if status == 206 { have } else { 0 };
        if !std::io::stderr().is_terminal() {
            eprintln!(
                "lone: downloading {}/{name}{}",
                r.repo,
                if start > 0 {
                    format!(" (resuming at {start} bytes)")
                } else {
                    String::new()
                }
            );
        }
        let mut reader = resp.into_body().into_reader();
        let mut buf = vec![0u8; 1 << 16];
        let mut done = start;
        let result: std::io::Result<()> = (|| loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            file.write_all(&buf[..n])?;
            done += n as u64;
            if let Some(b) = &bar {
                b.set_position(done);
            }
        })();
        file.flush()?;
        match result {
            Ok(()) if size.is_none_or(|s| done == s) => {
                if let Some(b) = &bar {
                    b.finish_and_clear();
                }
                return Ok(());
            }
            Ok(()) => last_err = Some(anyhow::anyhow!("the transfer ended at {done} bytes")),
            Err(e) => last_err = Some(e.into()),
        }
        std::thread::sleep(std::time::Duration::from_millis(200 << attempt));
    }
    if size.is_some_and(|s| std::fs::metadata(part).map(|m| m.len()).unwrap_or(0) == s) {
        return Ok(());
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no data"))).with_context(|| {
        format!(
            "{}: downloading {name} failed (run again to resume)",
            r.repo
        )
    })
}

/// Cached models: (repo, snapshot files with sizes).
pub fn list_cached() -> Vec<(String, PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(cache_root()) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("models--") else {
            continue;
        };
        let repo = rest.replacen("--", "/", 1);
        let mut size = 0;
        let mut stack = vec![e.path().join("blobs")];
        while let Some(d) = stack.pop() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for f in rd.flatten() {
                    if let Ok(m) = f.metadata() {
                        if m.is_dir() {
                            stack.push(f.path());
                        } else {
                            size += m.len();
                        }
                    }
                }
            }
        }
        out.push((repo, e.path(), size));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_parse() {
        let r = RepoRef::parse("LiquidAI/LFM2-350M-GGUF:Q4_K_M").unwrap();
        assert_eq!(r.repo, "LiquidAI/LFM2-350M-GGUF");
        assert_eq!(r.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(r.revision, "main");
        let r = RepoRef::parse("hf://Qwen/Qwen2.5-0.5B-Instruct@v1").unwrap();
        assert_eq!(
            (r.repo.as_str(), r.revision.as_str()),
            ("Qwen/Qwen2.5-0.5B-Instruct", "v1")
        );
        assert_eq!(r.quant, None);
        for bad in [
            "model.gguf",
            "a/b/c",
            "../x",
            "a/..",
            "/abs",
            "org/name.gguf",
            "a b/c",
        ] {
            assert_eq!(RepoRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn quant_tags_match_whole_tags_only() {
        assert!(has_tag("LFM2-350M-Q4_K_M.gguf", "q4_k_m"));
        assert!(has_tag("smollm2-135m-instruct.q4_k_m.gguf", "Q4_K_M"));
        assert!(!has_tag("LFM2-350M-Q4_K_M.gguf", "Q4_K"));
        assert!(!has_tag("LFM2-350M-Q4_0.gguf", "Q4_K_M"));
        assert!(has_tag("m-F16.gguf", "f16"));
        assert!(!has_tag("m-BF16.gguf", "f16"));
    }

    #[test]
    fn split_files_are_fetched_together_with_the_projector() {
        let files = [
            "README.md",
            "mmproj-F16.gguf",
            "m-F16.gguf",
            "Q8_0/m-Q8_0-00001-of-00002.gguf",
            "Q8_0/m-Q8_0-00002-of-00002.gguf",
            "m-Q4_K_M.gguf",
        ];
        let pick = |quant: Option<&str>| {
            let r = RepoRef {
                quant: quant.map(str::to_string),
                ..RepoRef::parse("org/m-GGUF").unwrap()
            };
            choose(&r, &files)
        };
        let (get, entry) = pick(Some("Q8_0")).unwrap();
        assert_eq!(
            get,
            [
                "Q8_0/m-Q8_0-00001-of-00002.gguf",
                "Q8_0/m-Q8_0-00002-of-00002.gguf",
                "mmproj-F16.gguf"
            ]
        );
        assert_eq!(entry.as_deref(), Some("Q8_0/m-Q8_0-00001-of-00002.gguf"));
        let (get, entry) = pick(Some("F16")).unwrap();
        assert_eq!(
            entry.as_deref(),
            Some("m-F16.gguf"),
            "the projector is not a candidate"
        );
        assert_eq!(
            get,
            ["m-F16.gguf", "mmproj-F16.gguf"],
            "the projector comes along"
        );
        assert_eq!(pick(None).unwrap().0, ["m-Q4_K_M.gguf", "mmproj-F16.gguf"]);
        // One split alone needs no tag; an incomplete one is not a split.
        let (get, _) = choose(
            &RepoRef::parse("org/m").unwrap(),
            &["b-00002-of-00002.gguf", "b-00001-of-00002.gguf"],
        )
        .unwrap();
        assert_eq!(get, ["b-00001-of-00002.gguf", "b-00002-of-00002.gguf"]);
        assert!(choose(
            &RepoRef::parse("org/m:Q8_0").unwrap(),
            &["m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00002-of-00003.gguf"]
        )
        .is_err());
    }

    /// llama.cpp's choice of mmproj: in the model's directory or above, the deepest, then
    /// the closest in quant bits; none for a repo without one.
    #[test]
    fn the_closest_projector_is_chosen() {
        assert_eq!(quant_bits("m-Q4_K_M.gguf"), 4);
        assert_eq!(quant_bits("x/m-BF16-00001-of-00002.gguf"), 16);
        assert_eq!(quant_bits("mmproj-model-f32.gguf"), 32);
        assert_eq!(quant_bits("model.gguf"), 0);
        let files = [
            "mmproj-F32.gguf",
            "mmproj-F16.gguf",
            "mmproj-Q8_0.gguf",
            "m-Q4_K_M.gguf",
            "m-F16.gguf",
            "sub/m-Q8_0.gguf",
            "sub/mmproj-sub-F32.gguf",
            "other/mmproj-Q4_0.gguf",
        ];
        assert_eq!(
            best_projector(&files, "m-F16.gguf"),
            Some("mmproj-F16.gguf")
        );
        assert_eq!(
            best_projector(&files, "m-Q4_K_M.gguf"),
            Some("mmproj-Q8_0.gguf")
        );
        assert_eq!(
            best_projector(&files, "sub/m-Q8_0.gguf"),
            Some("sub/mmproj-sub-F32.gguf"),
            "its own directory first"
        );
        assert_eq!(best_projector(&files[3..5], "m-F16.gguf"), None);
    }

    /// A snapshot's mmproj is found beside the model file (and only in the Hub cache layout).
    #[test]
    fn a_pulled_projector_is_found_beside_its_model() {
        let root = tempfile::tempdir().unwrap();
        let snap = root.path().join("models--org--m-GGUF/snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        for f in ["m-Q4_K_M.gguf", "mmproj-m-F16.gguf", "mmproj-m-Q8_0.gguf"] {
            std::fs::write(snap.join(f), b"GGUF").unwrap();
        }
        assert_eq!(
            projector_beside(&snap.join("m-Q4_K_M.gguf")),
            Some(snap.join("mmproj-m-Q8_0.gguf"))
        );
        assert_eq!(projector_beside(&snap.join("mmproj-m-F16.gguf")), None);
        let plain = root.path().join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        for f in ["m-Q4_K_M.gguf", "mmproj-m-F16.gguf"] {
            std::fs::write(plain.join(f), b"GGUF").unwrap();
        }
        assert_eq!(projector_beside(&plain.join("m-Q4_K_M.gguf")), None);
    }
}
