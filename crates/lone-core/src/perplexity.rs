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

/// The logits of one chunk's scored half (`ctx/2 ..`), from an empty cache, BOS first.
fn chunk_logits(model: &Model, chunk: &[u32], opt: &PerplexityOptions) -> Result<Vec<f32>> {
    let (ctx, first, batch) = (chunk.len(), chunk.len() / 2, opt.batch.max(1));
    let mut cache = model.new_cache();
    let mut logits = Vec::with_capacity((ctx - first) * model.cfg.vocab_size);
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
    Ok(logits)
}

/// llama-perplexity's `--kl-divergence` statistics of `model` against `reference` (a base
/// model with the same vocabulary) on the scored tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KlResult {
    pub ppl: f64,
    pub ppl_reference: f64,
    /// Mean KL(reference ‖ model) per token, and its standard error.
    pub kld_mean: f64,
    pub kld_stderr: f64,
    pub kld_max: f64,
    /// Share of tokens where both put the same token on top.
    pub same_top: f64,
    /// Mean of p_model(token) − p_reference(token) for the actual next token.
    pub mean_dp: f64,
    /// Mean cosine similarity of the logit rows.
    pub cos_mean: f64,
    pub scored: usize,
}

/// `model` against `reference` with the perplexity method's chunks; `on_chunk(i, mean KLD)`.
pub fn kl_divergence(
    model: &Model,
    reference: &Model,
    tokens: &[u32],
    opt: &PerplexityOptions,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<KlResult> {
    let v = model.cfg.vocab_size;
    if reference.cfg.vocab_size != v {
        return Err(Error::Input(format!(
            "the reference has {} logits and the model {v}: they must share a vocabulary",
            reference.cfg.vocab_size
        )));
    }
    let ctx = opt.ctx;
    if ctx < 4 || tokens.len() < 2 * ctx {
        return Err(Error::Input(format!(
            "the text has {} tokens; a context of {ctx} needs at least {} (2 × ctx, ctx ≥ 4)",
            tokens.len(),
            2 * ctx
        )));
    }
    let n_chunks = (tokens.len() / ctx).min(opt.chunks.unwrap_or(usize::MAX));
    let first = ctx / 2;
    let mut r = KlResult::default();
    let (mut nll, mut nll_ref, mut k, mut k2, mut same, mut dp) = (0.0, 0.0, 0.0, 0.0, 0usize, 0.0);
    let mut n = 0usize;
    let mut cos = 0.0f64;
    for i in 0..n_chunks {
        let chunk = &tokens[i * ctx..(i + 1) * ctx];
        let (lm, lr) = (
            chunk_logits(model, chunk, opt)?,
            chunk_logits(reference, chunk, opt)?,
        );
        for j in 0..ctx - 1 - first {
            let (a, b) = (&lm[j * v..(j + 1) * v], &lr[j * v..(j + 1) * v]);
            let (pa, pb) = (log_probs(a), log_probs(b));
            let kl: f64 = pb.iter().zip(&pa).map(|(&q, &p)| q.exp() * (q - p)).sum();
            let next = chunk[first + j + 1] as usize;
            nll -= pa[next];
            nll_ref -= pb[next];
            k += kl;
            k2 += kl * kl;
            r.kld_max = r.kld_max.max(kl);
            same += (argmax(a) == argmax(b)) as usize;
            dp += pa[next].exp() - pb[next].exp();
            let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
            for (&x, &y) in a.iter().zip(b) {
                let (x, y) = (x as f64, y as f64);
                ab += x * y;
                aa += x * x;
                bb += y * y;
            }
            cos += if aa > 0.0 && bb > 0.0 {
                ab / (aa.sqrt() * bb.sqrt())
            } else {
                0.0
            };
            n += 1;
        }
        on_chunk(i, k / n as f64);
    }
    let nf = n as f64;
    r.ppl = (nll / nf).exp();
    r.ppl_reference = (nll_ref / nf).exp();
    r.kld_mean = k / nf;
    let var = k2 / nf - r.kld_mean * r.kld_mean;
    r.kld_stderr = if var > 0.0 && n > 1 {
        (var / (nf - 1.0)).sqrt()
    } else {
        0.0
    };
    r.same_top = same as f64 / nf;
    r.mean_dp = dp / nf;
    r.cos_mean = cos / nf;
    r.scored = n;
    Ok(r)
}

/// The log-softmax of a logit row, in f64.
pub(crate) fn log_probs(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&l| l as f64 - lse).collect()
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0
}

/// llama.cpp's rules for cutting a text into chunks of `ctx` tokens: at least `min_ctx`, no
/// longer than the model's context, and at least two chunks of text (`what` names the tool).
pub(crate) fn check_chunks(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    min_ctx: usize,
    what: &str,
) -> Result<()> {
    if ctx < min_ctx {
        return Err(Error::Input(format!(
            "the context must be at least {min_ctx} tokens, got {ctx}"
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
            "the text has {} tokens; {what} with a context of {ctx} needs at least {} (2 × ctx): give more text or a smaller --ctx",
            tokens.len(),
            2 * ctx
        )));
    }
    Ok(())
}

/// The perplexity of `model` on `tokens`; `on_chunk(i, running)` after each chunk.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    opt: &PerplexityOptions,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityResult> {
    let ctx = opt.ctx;
    check_chunks(model, tokens, ctx, 4, "perplexity")?;
    let v = model.cfg.vocab_size;
    let n_chunks = (tokens.len() / ctx).min(opt.chunks.unwrap_or(usize::MAX));
    let first = ctx / 2;
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut out = PerplexityResult::default();
    for i in 0..n_chunks {
        let chunk = &tokens[i * ctx..(i + 1) * ctx];
        let logits = chunk_logits(model, chunk, opt)?;
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
