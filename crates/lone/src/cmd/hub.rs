//! `lone pull`, `lone ls`, `lone rm`: models in the Hugging Face cache.

use anyhow::{bail, Result};
use clap::Args;

use crate::hub::{self, RepoRef};

#[derive(Args, Debug)]
pub struct PullArgs {
    /// `org/name[:QUANT]` (or `hf://…`, `org/name@REVISION`): a GGUF repo (the file whose name
    /// carries QUANT; Q4_K_M when several and none is named) or a safetensors checkpoint.
    pub repo: String,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// One JSON object per model instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// `org/name` of the cached model to delete (every revision and file).
    pub repo: String,
}

fn parse(s: &str) -> Result<RepoRef> {
    RepoRef::parse(s).ok_or_else(|| {
        anyhow::anyhow!("{s:?} is not a Hub repo id: write org/name or org/name:QUANT")
    })
}

pub fn pull(a: PullArgs) -> Result<()> {
    let r = parse(&a.repo)?;
    let path = hub::resolve(&r)?;
    println!("{}", path.display());
    Ok(())
}

pub fn ls(a: LsArgs) -> Result<()> {
    let models = hub::list_cached();
    if a.json {
        for (repo, path, size) in &models {
            println!(
                "{}",
                serde_json::json!({"repo": repo, "path": path, "bytes": size})
            );
        }
        return Ok(());
    }
    if models.is_empty() {
        eprintln!("no models in {}", hub::cache_root().display());
        return Ok(());
    }
    println!("{:<50} {:>10}  PATH", "REPO", "SIZE");
    for (repo, path, size) in &models {
        println!(
            "{repo:<50} {:>7.1} MiB  {}",
            *size as f64 / (1 << 20) as f64,
            path.display()
        );
    }
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    let r = parse(&a.repo)?;
    let Some((_, path, size)) = hub::list_cached()
        .into_iter()
        .find(|(repo, _, _)| *repo == r.repo)
    else {
        bail!(
            "{} is not in the cache at {} (`lone ls` lists what is)",
            r.repo,
            hub::cache_root().display()
        );
    };
    std::fs::remove_dir_all(&path)?;
    eprintln!(
        "removed {} ({:.1} MiB) from {}",
        r.repo,
        size as f64 / (1 << 20) as f64,
        path.display()
    );
    Ok(())
}
