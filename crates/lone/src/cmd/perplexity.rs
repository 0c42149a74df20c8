//! `lone perplexity`: llama-perplexity's method and output on a text file.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use lone_core::perplexity::{perplexity, PerplexityOptions};
use lone_core::text::TextIo;

use super::common;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// HF checkpoint directory or GGUF file (default: the default model from the setup step).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// The text to score (UTF-8).
    #[arg(long, short = 'f', visible_alias = "file")]
    pub text: PathBuf,
    /// Tokens per chunk (llama-perplexity's -c); the second half of each chunk is scored.
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx: usize,
    /// Rows per forward pass (llama-perplexity's -b; does not change the result).
    #[arg(long, short = 'b', default_value_t = 512)]
    pub batch: usize,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Compare against a base model (same vocabulary): llama-perplexity's --kl-divergence
    /// statistics (mean KL divergence, same top token, Δp, both perplexities).
    #[arg(long, requires = "reference")]
    pub kl_divergence: bool,
    /// The base model for --kl-divergence (e.g. the f32/bf16 source of a quantized file),
    /// run in exact mode whatever the mode of the model scored against it.
    #[arg(long, short)]
    pub reference: Option<PathBuf>,
    /// Worker threads for the matrix kernels (default: the CPU's cores).
    #[arg(long, short)]
    pub threads: Option<usize>,
    /// One JSON object instead of llama-perplexity's lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: PerplexityArgs) -> Result<()> {
    let bytes =
        std::fs::read(&a.text).with_context(|| format!("cannot read {}", a.text.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{} is not UTF-8 text: {e}", a.text.display()))?;
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let path = common::resolve_model(a.model.as_deref())?;
    let model = common::load_model(&path, a.threads)?;
    let mut io = TextIo::load(&model, &path).context("cannot load the tokenizer")?;
    // As llama-perplexity: special-token text in the file is text.
    io.tokenizer.set_special_as_text(true);
    let tokens = io.encode_raw(&text)?;
    let opts = PerplexityOptions {
        ctx: a.ctx,
        batch: a.batch,
        chunks: a.chunks,
        bos: io
            .tokenizer
            .add_bos_token()
            .then(|| io.tokenizer.bos_id())
            .flatten(),
    };
    if a.kl_divergence {
        let rpath = common::local_model(a.reference.as_deref().unwrap_or(&path))?;
        let mut reference = common::load_model(&rpath, a.threads)
            .with_context(|| format!("cannot load the reference {}", rpath.display()))?;
        // The base distribution: the reference's exact f32 path.
        reference.compute.mode = Some(lone_core::kernels::Mode::Exact);
        let json = a.json;
        let r =
            lone_core::perplexity::kl_divergence(&model, &reference, &tokens, &opts, |i, k| {
                if !json {
                    eprint!("[{}]{k:.6},", i + 1);
                }
            })?;
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "model": path.display().to_string(), "reference": rpath.display().to_string(),
                    "ppl": r.ppl, "ppl_reference": r.ppl_reference, "ppl_ratio": r.ppl / r.ppl_reference,
                    "kld_mean": r.kld_mean, "kld_stderr": r.kld_stderr, "kld_max": r.kld_max,
                    "same_top": r.same_top, "mean_dp": r.mean_dp, "cos_mean": r.cos_mean, "scored_tokens": r.scored,
                })
            );
        } else {
            eprintln!();
            println!(
                "Mean PPL(Q): {:.6}  PPL(base): {:.6}  ratio {:.6}",
                r.ppl,
                r.ppl_reference,
                r.ppl / r.ppl_reference
            );
            println!(
                "Mean KLD: {:.6} ± {:.6}  Maximum KLD: {:.6}",
                r.kld_mean, r.kld_stderr, r.kld_max
            );
            println!(
                "Same top p: {:.3} %  Mean Δp: {:.3} %  Mean logits cosine: {:.6}",
                100.0 * r.same_top,
                100.0 * r.mean_dp,
                r.cos_mean
            );
        }
        return Ok(());
    }
    let t0 = std::time::Instant::now();
    let mut err = std::io::stderr().lock();
    let json = a.json;
    let r = perplexity(&model, &tokens, &opts, |i, ppl| {
        if !json {
            let _ = write!(err, "[{}]{ppl:.4},", i + 1);
            let _ = err.flush();
        }
    })?;
    let secs = t0.elapsed().as_secs_f64();
    if json {
        let obj = serde_json::json!({
            "model": path.display().to_string(),
            "text": a.text.display().to_string(),
            "tokens": tokens.len(),
            "ctx": a.ctx,
            "chunks": r.chunks,
            "scored_tokens": r.scored,
            "ppl": r.ppl,
            "ppl_stderr": r.stderr,
            "running": r.running,
            "seconds": secs,
        });
        println!("{obj}");
    } else {
        eprintln!();
        println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.stderr);
        eprintln!(
            "[{} tokens, {} chunks of {}, {} scored, {:.1} s]",
            tokens.len(),
            r.chunks,
            a.ctx,
            r.scored,
            secs
        );
    }
    Ok(())
}
