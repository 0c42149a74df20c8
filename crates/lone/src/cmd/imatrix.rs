//! `lone imatrix`: an importance matrix from calibration text, as llama-imatrix computes it,
//! for `lone convert --imatrix` (or llama-quantize --imatrix).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use lone_core::imatrix::{CollectOptions, Imatrix};
use lone_core::text::TextIo;

use super::common;

#[derive(Args, Debug)]
pub struct ImatrixArgs {
    /// HF checkpoint directory or GGUF file (best: the unquantized model).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// Calibration text (UTF-8).
    #[arg(long, short = 'f', visible_alias = "file")]
    pub text: PathBuf,
    /// Where to write the imatrix (llama.cpp's GGUF imatrix format).
    #[arg(long, short, default_value = "imatrix.gguf")]
    pub out: PathBuf,
    /// Tokens per chunk (llama-imatrix's -c); each chunk starts from an empty cache.
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx: usize,
    /// Use at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Also collect the LM head's inputs (`output.weight`), as llama-imatrix's
    /// --process-output.
    #[arg(long)]
    pub process_output: bool,
    /// Worker threads for the matrix kernels (default: the CPU's cores).
    #[arg(long, short)]
    pub threads: Option<usize>,
}

pub fn run(a: ImatrixArgs) -> Result<()> {
    let bytes =
        std::fs::read(&a.text).with_context(|| format!("cannot read {}", a.text.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{} is not UTF-8 text: {e}", a.text.display()))?;
    let path = common::resolve_model(a.model.as_deref())?;
    let model = common::load_model(&path, a.threads)?;
    let mut io = TextIo::load(&model, &path).context("cannot load the tokenizer")?;
    // As llama-imatrix: special-token text in the file is text.
    io.tokenizer.set_special_as_text(true);
    let tokens = io.encode_raw(&text)?;
    let bos = io
        .tokenizer
        .add_bos_token()
        .then(|| io.tokenizer.bos_id())
        .flatten();
    let t0 = std::time::Instant::now();
    let mut err = std::io::stderr().lock();
    let n_chunks = (tokens.len() / a.ctx.max(1)).min(a.chunks.unwrap_or(usize::MAX));
    let opts = CollectOptions {
        ctx: a.ctx,
        chunks: a.chunks,
        bos,
        process_output: a.process_output,
        dataset: a.text.to_string_lossy().into_owned(),
    };
    let im = Imatrix::collect(&model, &tokens, &opts, |i| {
        let _ = write!(err, "\rchunk {}/{n_chunks}", i + 1);
        let _ = err.flush();
    })?;
    let _ = writeln!(err);
    im.write(&a.out)
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!(
        "wrote {}: {} entries from {} chunks of {} tokens in {:.1} s",
        a.out.display(),
        im.entries.len(),
        im.chunk_count,
        im.chunk_size,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
