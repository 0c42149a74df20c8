//! Perplexity as llama.cpp's `llama-perplexity` computes it, so the numbers compare: the text's
//! tokens (BOS added as the tokenizer does) are cut into chunks of `ctx` tokens; each chunk is
//! run from an empty cache with its first token replaced by BOS (when the tokenizer adds one);
//! the tokens of its second half are scored (the logits at positions `ctx/2 .. ctx-2` predict
//! the next token). PPL = exp(mean NLL), and the uncertainty sqrt(var(NLL) / (n-1)) · PPL.

use crate::error::{Error, Result};
use crate::models::{Batch, Model};

#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// Tokens per chunk (llama-perplexity's `-c`).
    pub ctx: usize,
    /// Rows per forward pass (`-b`).
    pub batch: usize,
    /// Most chunks (`--chunks`); `None`: all that fit.
    pub chunks: Option<usize>,
    /// The id put in place of each chunk's first token (the tokenizer's BOS when it adds one).
    pub bos: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerplexityResult {
    /// The running estimate after each chunk (llama-perplexity's `[i]ppl,` line).
    pub running: Vec<f64>,
    pub ppl: f64,
    /// One standard error of the estimate (as llama-perplexity's `+/-`).
    pub stderr: f64,
    /// Tokens scored.
    pub scored: usize,
    pub chunks: usize,
}

/// log p(tok) from `logits`, computed as llama.cpp does (f32 exponentials, f64 sum).
fn log_softmax(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[tok] - max) as f64 - sum.ln()
}

/// The perplexity of `model` on `tokens`; `on_chunk(i, running)` after each chunk.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    opt: &PerplexityOptions,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityResult> {
    let ctx = opt.ctx;
    if ctx < 4 {
        return Err(Error::Input(format!(
            "the context must be at least 4 tokens, got {ctx}"
        )));
    }
    if ctx > model.cfg.max_position_embeddings {
        return Err(Error::Input(format!(
            "the context {ctx} is longer than the model's ({} positions)",
            model.cfg.max_position_embeddings
        )));
    }
    if tokens.len() < 2 * ctx {
        return Err(Error::Input(format!(
            "the text has {} tokens; perplexity with a context of {ctx} needs at least {} (2 × ctx): give more text or a smaller --ctx",
            tokens.len(),
            2 * ctx
        )));
    }
    let batch = opt.batch.max(1);
    let v = model.cfg.vocab_size;
    let n_chunks = (tokens.len() / ctx).min(opt.chunks.unwrap_or(usize::MAX));
    let first = ctx / 2;
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut out = PerplexityResult::default();
    for i in 0..n_chunks {
        let chunk = &tokens[i * ctx..(i + 1) * ctx];
        let mut cache = model.new_cache();
        let mut logits = Vec::with_capacity((ctx - first) * v);
        for start in (0..ctx).step_by(batch) {
            let mut b = Batch::default();
            let end = (start + batch).min(ctx);
            for (pos, &t) in chunk.iter().enumerate().take(end).skip(start) {
                let tok = match (pos, opt.bos) {
                    (0, Some(bos)) => bos,
                    _ => t,
                };
                b.push(0, pos, tok, pos >= first);
            }
            let o = model.forward(&b, std::slice::from_mut(&mut cache))?;
            logits.extend_from_slice(&o.logits);
        }
        for j in 0..ctx - 1 - first {
            let row = &logits[j * v..(j + 1) * v];
            let lp = log_softmax(row, chunk[first + j + 1] as usize);
            if !lp.is_finite() {
                return Err(Error::Msg(format!(
                    "the model gave a non-finite log-probability in chunk {} at position {}",
                    i + 1,
                    first + j
                )));
            }
            nll -= lp;
            nll2 += lp * lp;
        }
        count += ctx - 1 - first;
        let running = (nll / count as f64).exp();
        out.running.push(running);
        on_chunk(i, running);
    }
    let mean = nll / count as f64;
    let var = nll2 / count as f64 - mean * mean;
    out.ppl = mean.exp();
    out.stderr = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * out.ppl
    } else {
        0.0
    };
    out.scored = count;
    out.chunks = n_chunks;
    Ok(out)
}
