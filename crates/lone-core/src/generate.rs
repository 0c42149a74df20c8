//! One sequence through the generation core: [`generate`] is the one-slot case of the
//! [`Scheduler`] the server runs (prefill the prompt, then decode, speculatively when asked,
//! until EOS, a stop string, the caller, the token budget or the context).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache::SeqCache;
pub use crate::engine::FinishReason;
use crate::engine::{Event, GenRequest, Scheduler, SpecParams, SpecStats, Speculator};
use crate::error::{Error, Result};
use crate::models::{Batch, Model};
use crate::sampler::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Largest number of prompt rows in one forward pass (bounds activation memory).
pub const PREFILL_CHUNK: usize = 512;

#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Token ids that end generation (not included in the output).
    pub eos_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Keep the logits of every prompt position and every step (for `--dump-logits`).
    pub keep_logits: bool,
    /// Stop strings (need a tokenizer: see [`generate_text`]).
    pub stop: Vec<String>,
    /// Speculative decoding: the proposers and the draft model.
    pub spec: Option<Arc<Speculator>>,
    /// Override of the speculator's settings for this generation.
    pub spec_params: Option<SpecParams>,
    /// A grammar the output must follow.
    pub constraint: Option<crate::engine::Constraint>,
    /// Embeddings of the prompt's image rows.
    pub embeds: Option<Arc<crate::engine::PromptEmbeds>>,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_tokens: usize,
    /// Prompt tokens actually run through the model (fewer if the cache held a prefix).
    pub prefilled_tokens: usize,
    pub tokens: Vec<u32>,
    /// The generated text (with a tokenizer), cut before a stop string.
    pub text: String,
    pub finish: FinishReason,
    /// Time from the start of prefill to the first sampled token.
    pub prefill_time: Duration,
    /// Time for the remaining tokens.
    pub decode_time: Duration,
    /// `[rows, vocab]` logits when `keep_logits` was set.
    pub logits: Vec<f32>,
    /// Drafted / accepted tokens and decode passes.
    pub spec: SpecStats,
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
    /// Share of drafted tokens accepted (0 without drafts).
    pub fn acceptance(&self) -> f64 {
        self.spec.acceptance()
    }
    /// Tokens emitted per decode pass (1 without speculation).
    pub fn tokens_per_pass(&self) -> f64 {
        self.spec.tokens_per_pass(self.tokens.len())
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

/// [`prefill`] with every row's logits, the rows at positions `embeds` names taking its
/// embeddings (a prompt's images).
fn prefill_embeds(
    model: &Model,
    cache: &mut SeqCache,
    tokens: &[u32],
    embeds: Option<&crate::engine::PromptEmbeds>,
) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for chunk in tokens.chunks(PREFILL_CHUNK) {
        let start = cache.len();
        let mut batch = Batch::for_sequence(0, start, chunk, true);
        if let Some(e) = embeds {
            batch.embeds = (0..chunk.len())
                .filter_map(|i| e.get(start + i).map(|row| (i, row.to_vec())))
                .collect();
        }
        out.extend(model.forward(&batch, std::slice::from_mut(cache))?.logits);
    }
    Ok(out)
}

/// Generate after `prompt` without text: [`generate_text`] with no tokenizer, `on_token`
/// seeing each new token (false stops).
pub fn generate(
    model: &Model,
    cache: &mut SeqCache,
    prompt: &[u32],
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    generate_text(model, cache, prompt, opts, sampler, None, |ev| match ev {
        Event::Delta { tokens, .. } => tokens.iter().all(|t| on_token(t.id)),
        _ => true,
    })
}

/// Generate after `prompt`. `cache` may already hold a prefix of `prompt` (chat reuse):
/// only the rest is prefilled. With a tokenizer, `Delta` events carry text and stop strings
/// apply. `on_event` sees every event and returns false to stop (finish reason `stop`).
pub fn generate_text(
    model: &Model,
    cache: &mut SeqCache,
    prompt: &[u32],
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    tokenizer: Option<&Tokenizer>,
    mut on_event: impl FnMut(&Event) -> bool,
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
    if !opts.stop.is_empty() && tokenizer.is_none() {
        return Err(Error::Input(
            "stop strings need the tokenizer (generate_text)".into(),
        ));
    }
    let req = GenRequest {
        prompt: prompt.to_vec(),
        max_tokens: opts.max_new_tokens,
        params: sampler.params().clone(),
        stop: opts.stop.clone(),
        ignore_eos: opts.ignore_eos,
        spec: opts.spec_params.clone(),
        keep_logits: opts.keep_logits,
        constraint: opts.constraint.clone(),
        embeds: opts.embeds.clone(),
        ..Default::default()
    };
    let own = std::mem::replace(cache, SeqCache::new(&model.cfg, 0));
    let mut sched = Scheduler::new(vec![own], ctx, opts.eos_ids.clone(), opts.spec.clone());
    let res = run_one(
        model,
        &mut sched,
        req,
        opts,
        sampler,
        tokenizer,
        &mut on_event,
    );
    *cache = sched.caches.pop().expect("one cache");
    res
}

fn run_one<'t>(
    model: &Model,
    sched: &mut Scheduler<'t>,
    req: GenRequest,
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    tokenizer: Option<&'t Tokenizer>,
    on_event: &mut dyn FnMut(&Event) -> bool,
) -> Result<Generation> {
    let prompt_len = req.prompt.len();
    let decoder = tokenizer.map(|t| StreamDecoder::new(t, true));
    let t0 = Instant::now();
    let slot = sched
        .admit(req.clone(), sampler.clone(), decoder)
        .map_err(|e| Error::Input(e.to_string()))?;
    let start = sched.cached(slot);
    // The scheduler keeps the rows it samples from; the earlier prompt rows' logits come
    // from prefilling them here.
    let mut logits = Vec::new();
    if opts.keep_logits {
        let c = &mut sched.caches[slot];
        logits = prefill_embeds(
            model,
            c,
            &req.prompt[start..prompt_len - 1],
            req.embeds.as_deref(),
        )?;
    }
    let mut t_first = None;
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut finish = None;
    let mut spec = SpecStats::default();
    let mut failed = None;
    // Until the sequence finishes, or the caller's `false` cancels it (finish `stop`).
    while sched.is_active(slot) {
        sched.step(model, &mut |_, ev| {
            match &ev {
                Event::Delta {
                    tokens: t,
                    text: piece,
                    ..
                } => {
                    if t_first.is_none() && !t.is_empty() {
                        t_first = Some(Instant::now());
                    }
                    tokens.extend(t.iter().map(|t| t.id));
                    text.push_str(piece);
                }
                Event::Done {
                    finish: f, spec: s, ..
                } => {
                    finish = Some(*f);
                    spec = *s;
                }
                Event::Error { message, .. } => failed = Some(message.clone()),
            }
            on_event(&ev)
        })?;
    }
    if let Some(m) = failed {
        return Err(Error::Msg(m));
    }
    let seq = sched.cancel(slot).or_else(|| sched.take_finished(slot));
    if let Some(mut seq) = seq {
        *sampler = seq.sampler().clone();
        spec = seq.spec_stats();
        logits.extend(seq.take_logits());
    }
    let t_first = t_first.unwrap_or_else(Instant::now);
    Ok(Generation {
        prompt_tokens: prompt_len,
        prefilled_tokens: prompt_len - start,
        decode_time: if tokens.is_empty() {
            Duration::ZERO
        } else {
            t_first.elapsed()
        },
        prefill_time: t_first - t0,
        tokens,
        text,
        finish: finish.unwrap_or(FinishReason::Stop),
        logits,
        spec,
    })
}
