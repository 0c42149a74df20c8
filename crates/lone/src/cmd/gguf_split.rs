//! `lone gguf-split`: split a GGUF file into parts or merge the parts back, byte for byte as
//! llama.cpp's `llama-gguf-split` does (`lone run` and every other command open a split from
//! its first part).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use lone_core::convert::split::{self, SplitBy};
use lone_core::loader::gguf::GgufFile;

use super::convert::{outputs, write_parts, SplitArgs};

#[derive(Args, Debug)]
pub struct GgufSplitArgs {
    /// Split INPUT into OUTPUT-00001-of-0000N.gguf … (the default).
    #[arg(long, conflicts_with = "merge")]
    pub split: bool,
    /// Merge the split whose first part is INPUT into the one file OUTPUT.
    #[arg(long)]
    pub merge: bool,
    #[command(flatten)]
    pub limits: SplitArgs,
    /// Print the plan (parts, tensors, sizes) without writing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Overwrite output files that exist.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// The GGUF file to split, or a split's first part to merge.
    pub input: PathBuf,
    /// The parts' prefix (split; a trailing `.gguf` is dropped), or the merged file.
    pub output: PathBuf,
}

pub fn run(a: GgufSplitArgs) -> Result<()> {
    let g =
        GgufFile::open(&a.input).with_context(|| format!("cannot open {}", a.input.display()))?;
    let outs = if a.merge {
        if a.limits.options(None)?.is_some() {
            bail!("--merge takes no split limits");
        }
        let plan = split::merge(&g)?;
        outputs(&a.output, &plan, None, a.force)?
    } else {
        let plan = lone_core::convert::Plan::from_gguf(&g)?;
        // llama-gguf-split's default: 128 tensors per part.
        let o = a.limits.options(Some(SplitBy::Tensors(128)))?;
        outputs(&a.output, &plan, o, a.force)?
    };
    for (i, (p, plan)) in outs.iter().enumerate() {
        eprintln!(
            "{} {:05}: {} tensors, {:.1} MB of tensor data -> {}",
            if a.merge { "merged" } else { "split" },
            i + 1,
            plan.tensors.len(),
            plan.tensor_bytes() as f64 / 1e6,
            p.display()
        );
    }
    if a.dry_run {
        return Ok(());
    }
    let threads = 1;
    let written = write_parts(&outs, threads)?;
    eprintln!(
        "wrote {} file{}, {:.1} MiB, from {} part{}",
        outs.len(),
        if outs.len() == 1 { "" } else { "s" },
        written as f64 / (1 << 20) as f64,
        g.parts.len(),
        if g.parts.len() == 1 { "" } else { "s" }
    );
    Ok(())
}
