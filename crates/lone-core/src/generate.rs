//! The generation loop around `Model::forward` and a sampler: prefill the prompt, then
//! decode one token at a time until EOS, a stop condition or the token budget.

use std::time::{Duration, Instant};

use crate::cache::SeqCache;
use crate::error::{Error, Result};
use crate::models::{Batch, Model};
use crate::sampler::Sampler;

/// Largest number of prompt rows in one forward pass (bounds activation memory).
pub const PREFILL_CHUNK: usize = 512;

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Token ids that end generation (not included in the output).
    pub eos_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Keep the logits of every prompt position and every step (for `--dump-logits`).
    pub keep_logits: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token (or the caller) stopped generation.
    Stop,
    /// The token budget or the context ran out.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_tokens: usize,
    /// Prompt tokens actually run through the model (fewer if the cache held a prefix).
    pub prefilled_tokens: usize,
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    /// Time from the start of prefill to the first sampled token.
    pub prefill_time: Duration,
    /// Time for the remaining tokens.
    pub decode_time: Duration,
    /// `[rows, vocab]` logits when `keep_logits` was set.
    pub logits: Vec<f32>,
}

impl Generation {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prefilled_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    /// Decode rate over the tokens after the first.
    pub fn decode_tok_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        n as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Feed `tokens` to the sequence in chunks; returns the logits of the last row, or of all
/// rows with `all_logits`.
pub fn prefill(
    model: &Model,
    cache: &mut SeqCache,
    tokens: &[u32],
    all_logits: bool,
) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    let v = model.cfg.vocab_size;
    for chunk in tokens.chunks(PREFILL_CHUNK) {
        let batch = Batch::for_sequence(0, cache.len(), chunk, all_logits);
        let o = model.forward(&batch, std::slice::from_mut(cache))?;
        if all_logits {
            out.extend_from_slice(&o.logits);
        } else {
            out = o.logits;
        }
    }
    debug_assert!(out.len() % v == 0);
    Ok(out)
}

/// Generate after `prompt`. `cache` may already hold a prefix of `prompt` (chat reuse):
/// only the rest is prefilled. `on_token` sees each new token and returns false to stop.
pub fn generate(
    model: &Model,
    cache: &mut SeqCache,
    prompt: &[u32],
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::Input(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    let ctx = model.cfg.max_position_embeddings;
    if prompt.len() >= ctx {
        return Err(Error::Input(format!(
            "the prompt has {} tokens but the context holds {ctx}: shorten it",
            prompt.len()
        )));
    }
    let v = model.cfg.vocab_size;
    // Reuse the cached prefix, keeping at least one token to prefill for fresh logits.
    let keep = cache.common_prefix(prompt).min(prompt.len() - 1);
    if !cache.truncate(keep) {
        cache.clear();
    }
    let start = cache.len();
    let t0 = Instant::now();
    let mut logits = prefill(model, cache, &prompt[start..], opts.keep_logits)?;
    let mut history: Vec<u32> = prompt.to_vec();
    let mut kept = Vec::new();
    let mut last = if opts.keep_logits {
        kept = logits.clone();
        logits.split_off(logits.len() - v)
    } else {
        logits
    };
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    let mut prefill_time = Duration::ZERO;
    let mut t_first = t0;
    while tokens.len() < opts.max_new_tokens && history.len() < ctx {
        let tok = sampler.sample(&last, &history);
        if tokens.is_empty() {
            t_first = Instant::now();
            prefill_time = t_first - t0;
        }
        if !opts.ignore_eos && opts.eos_ids.contains(&tok) {
            finish = FinishReason::Stop;
            break;
        }
        tokens.push(tok);
        history.push(tok);
        if !on_token(tok) {
            finish = FinishReason::Stop;
            break;
        }
        if tokens.len() >= opts.max_new_tokens || history.len() >= ctx {
            break;
        }
        let batch = Batch::for_sequence(0, cache.len(), &[tok], true);
        last = model.forward(&batch, std::slice::from_mut(cache))?.logits;
        if opts.keep_logits {
            kept.extend_from_slice(&last);
        }
    }
    let decode_time = if tokens.is_empty() {
        Duration::ZERO
    } else {
        t_first.elapsed()
    };
    Ok(Generation {
        prompt_tokens: prompt.len(),
        prefilled_tokens: prompt.len() - start,
        tokens,
        finish,
        prefill_time,
        decode_time,
        logits: kept,
    })
}
