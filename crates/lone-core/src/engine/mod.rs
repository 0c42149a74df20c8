//! The generation core: one per-sequence state machine ([`Sequence`]: sampler, history,
//! stream decoder, stop strings, finish rule, logprobs, speculation counters) and the
//! [`Scheduler`] that drives several of them step by step over one model. Every front end
//! uses it: `generate()` is the one-slot case (run, chat, bench), the server's engine thread
//! the many-slot one.
//!
//! Each [`Scheduler::step`] builds one [`Batch`]: for every decoding sequence its pending
//! token plus the tokens a [`Speculator`] drafted for it, and chunks of the prompts being
//! prefilled; runs one forward pass; then each sequence verifies its rows in order
//! ([`Sampler::verify`]), emits the tokens it keeps, and rolls its caches back to them
//! ([`SeqCache::reuse`]).

pub mod constrain;
mod gbnf;
pub mod prompt_cache;
pub mod spec;
pub mod stop;

use std::sync::Arc;

pub use constrain::{Constraint, ConstraintState, GrammarSpec, Grammars};
pub use prompt_cache::PromptCache;
pub use spec::{SpecParams, SpecTypes, Speculator};
pub use stop::StopMatcher;

use crate::cache::SeqCache;
use crate::error::Result;
use crate::kernels;
use crate::models::{Batch, Model};
use crate::sampler::{self, Sampler, SamplingParams};
use crate::tokenizer::StreamDecoder;

/// Most prompt rows added to one step (bounds the latency prefill adds to running decodes).
pub const PREFILL_BUDGET: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token, a stop string (or the caller) stopped generation.
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

/// One sequence to generate.
#[derive(Clone, Debug, Default)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (EOS not counted).
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Generation ends before the first occurrence of any of these; no text at or past it is
    /// ever sent. Needs a stream decoder.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// `Some(k)`: report each sampled token's logprob and the `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Tag copied to this sequence's events (the choice index).
    pub index: usize,
    /// Speculation for this sequence; `None`: the scheduler's [`Speculator`] defaults.
    pub spec: Option<SpecParams>,
    /// Keep the logits of every row a token was sampled from (`Done` does not carry them:
    /// read them from [`Scheduler::take_finished`]).
    pub keep_logits: bool,
    /// Decode special tokens into the text (tool-call markers that are special tokens).
    pub keep_special: bool,
    /// A grammar the output must follow (masks applied before sampling).
    pub constraint: Option<Constraint>,
    /// Prefill the whole prompt, reusing nothing from a slot's cache or the prompt cache
    /// (llama-server's `cache_prompt: false`).
    pub fresh_prompt: bool,
    /// Embeddings that replace some prompt rows' token embeddings (the image tokens'). A
    /// cache is reused only up to the first of them.
    pub embeds: Option<Arc<PromptEmbeds>>,
}

/// Embeddings for some prompt positions (an image's rows), ascending by position.
#[derive(Clone, Default, PartialEq)]
pub struct PromptEmbeds {
    /// The prompt positions, ascending.
    pub positions: Vec<usize>,
    /// `[positions.len(), hidden]`.
    pub data: Vec<f32>,
}

impl std::fmt::Debug for PromptEmbeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PromptEmbeds({} rows)", self.positions.len())
    }
}

impl PromptEmbeds {
    /// The embedding of prompt position `pos`, if it has one.
    pub fn get(&self, pos: usize) -> Option<&[f32]> {
        let i = self.positions.binary_search(&pos).ok()?;
        let h = self.data.len() / self.positions.len();
        Some(&self.data[i * h..(i + 1) * h])
    }

    /// The rows of `prompt` equal to `token`, given `data` (`[rows, hidden]`) in order: an
    /// error when their numbers differ.
    pub fn at_token(prompt: &[u32], token: u32, data: Vec<f32>, hidden: usize) -> Result<Self> {
        let positions: Vec<usize> = (0..prompt.len()).filter(|&i| prompt[i] == token).collect();
        if hidden == 0 || data.len() != positions.len() * hidden {
            return Err(crate::Error::Input(format!(
                "the prompt has {} image tokens but the images give {} embeddings: every \
                 image needs its own placeholder (and no placeholder may stand alone)",
                positions.len(),
                data.len() / hidden.max(1)
            )));
        }
        Ok(PromptEmbeds { positions, data })
    }

    /// Each embedded position with its embedding's digest
    /// ([`crate::cache::embedding_digest`]), as a cache records them.
    pub fn digests(&self) -> Vec<(usize, u64)> {
        let h = self.data.len() / self.positions.len().max(1);
        self.positions
            .iter()
            .zip(self.data.chunks_exact(h.max(1)))
            .map(|(&p, e)| (p, crate::cache::embedding_digest(e)))
            .collect()
    }
}

/// A generated token (and its logprobs when asked for).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

/// Speculation counters of one sequence (or of a scheduler's lifetime).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens the target agreed with.
    pub accepted: usize,
    /// Forward passes that decoded this sequence (after its first token).
    pub passes: usize,
}

impl SpecStats {
    /// Share of drafted tokens accepted (0 without drafts).
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Tokens per decode pass for a sequence that generated `tokens` (the first comes from
    /// prefill; 1 without speculation).
    pub fn tokens_per_pass(&self, tokens: usize) -> f64 {
        tokens.saturating_sub(1) as f64 / self.passes.max(1) as f64
    }
}

impl std::ops::AddAssign for SpecStats {
    fn add_assign(&mut self, o: SpecStats) {
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.passes += o.passes;
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text (possibly empty while it is held back for stop strings) and the token
    /// sampled (empty when only held-back text is flushed at the end).
    Delta {
        index: usize,
        text: String,
        tokens: Vec<TokenOut>,
    },
    Done {
        index: usize,
        finish: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens taken from the slot's cache.
        cached_tokens: usize,
        spec: SpecStats,
        /// The stop string that ended it (`finish` is then `Stop`).
        stop: Option<String>,
    },
    Error {
        index: usize,
        message: String,
    },
}

/// What one step did (for metrics and stats).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepStats {
    pub prefill_rows: usize,
    /// Decode rows: pending tokens plus drafts.
    pub decode_rows: usize,
    /// Tokens emitted (EOS excluded).
    pub generated: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Sequences whose receiver went away.
    pub cancelled: usize,
    pub forward_ns: u64,
}

/// A running sequence.
pub struct Sequence<'t> {
    req: GenRequest,
    sampler: Sampler,
    /// Prompt + generated tokens (what the penalties and proposers look at).
    history: Vec<u32>,
    generated: usize,
    cached: usize,
    /// The token sampled last, to feed in the next step (None while prefilling).
    next: Option<u32>,
    decoder: Option<StreamDecoder<'t>>,
    stop: StopMatcher,
    /// Admission order (prefill is first come, first served).
    order: u64,
    spec: SpecStats,
    /// Speculation: the ramp, the n-gram statistics, the draft model's back-off.
    spec_state: spec::SpecState,
    kept: Vec<f32>,
    constraint: Option<ConstraintState>,
    /// Scratch: a row of logits with the grammar's mask applied.
    masked: Vec<f32>,
}

/// How a sequence ended after a token.
enum End {
    Finish(FinishReason, bool),
    Cancelled,
}

impl<'t> Sequence<'t> {
    /// The sampler (e.g. to carry its RNG into the next turn).
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    pub fn spec_stats(&self) -> SpecStats {
        self.spec
    }

    /// The logits of every row a token was sampled from (with `keep_logits`).
    pub fn take_logits(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.kept)
    }

    /// Emit `tok`, sampled from `logits`; `Some` when the sequence ends here (`flush`: send
    /// what the decoder and stop matcher hold back).
    fn push(
        &mut self,
        tok: u32,
        logits: &[f32],
        ctx: usize,
        eos: &[u32],
        emit: &mut dyn FnMut(Event) -> bool,
    ) -> Option<End> {
        if self.generated >= self.req.max_tokens {
            // A budget of 0: the prompt is prefilled, nothing is emitted.
            return Some(End::Finish(FinishReason::Length, true));
        }
        if !self.req.ignore_eos && eos.contains(&tok) {
            return Some(End::Finish(FinishReason::Stop, true));
        }
        let out = TokenOut {
            id: tok,
            logprob: self
                .req
                .logprobs
                .map(|_| sampler::token_logprob(logits, tok)),
            top: self
                .req
                .logprobs
                .map(|k| sampler::top_logprobs(logits, k))
                .unwrap_or_default(),
        };
        self.generated += 1;
        self.history.push(tok);
        let piece = match &mut self.decoder {
            Some(d) => d.push(tok).ok().flatten().unwrap_or_default(),
            None => String::new(),
        };
        let (text, stopped) = self.stop.push(&piece);
        if !emit(Event::Delta {
            index: self.req.index,
            text,
            tokens: vec![out],
        }) {
            return Some(End::Cancelled);
        }
        if stopped {
            Some(End::Finish(FinishReason::Stop, false))
        } else if self.generated >= self.req.max_tokens || self.history.len() >= ctx {
            Some(End::Finish(FinishReason::Length, true))
        } else {
            None
        }
    }

    /// The last events of a finished sequence.
    fn finish(
        &mut self,
        mut finish: FinishReason,
        flush: bool,
        emit: &mut dyn FnMut(Event) -> bool,
    ) {
        if flush {
            let rest = match &mut self.decoder {
                Some(d) => d.finish().ok().flatten().unwrap_or_default(),
                None => String::new(),
            };
            let (mut text, stopped) = self.stop.push(&rest);
            if stopped {
                finish = FinishReason::Stop;
            } else {
                text.push_str(&self.stop.finish());
            }
            if !text.is_empty() {
                emit(Event::Delta {
                    index: self.req.index,
                    text,
                    tokens: Vec::new(),
                });
            }
        }
        emit(Event::Done {
            index: self.req.index,
            finish,
            prompt_tokens: self.req.prompt.len(),
            completion_tokens: self.generated,
            cached_tokens: self.cached,
            spec: self.spec,
            stop: self.stop.matched().map(str::to_string),
        });
    }

    /// Most drafts this sequence can take now: budget, context and rollback leave room for
    /// the pending token, the drafts and the token sampled after them.
    fn draft_room(&self, ctx: usize, rollback: usize) -> usize {
        let budget = self.req.max_tokens.saturating_sub(self.generated + 1);
        let room = ctx.saturating_sub(self.history.len() + 1);
        budget.min(room).min(rollback)
    }
}

/// Why a sequence was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitError {
    NoFreeSlot,
    /// The prompt is empty or does not fit the context (the message says which).
    BadPrompt(String),
}

impl std::fmt::Display for AdmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdmitError::NoFreeSlot => write!(f, "no free slot"),
            AdmitError::BadPrompt(m) => write!(f, "{m}"),
        }
    }
}

/// Drives sequences in slots, one forward pass per [`step`](Self::step).
pub struct Scheduler<'t> {
    pub caches: Vec<SeqCache>,
    slots: Vec<Option<Sequence<'t>>>,
    ctx: usize,
    eos: Vec<u32>,
    spec: Option<Arc<Speculator>>,
    admitted: u64,
    /// The sequence that finished last in each slot (its sampler, kept logits, counters).
    finished: Vec<Option<Sequence<'t>>>,
    prompt_cache: Option<PromptCache>,
}

impl<'t> Scheduler<'t> {
    /// Slots over `caches` (one each), a context of `ctx` tokens per sequence, `eos` ids.
    pub fn new(
        caches: Vec<SeqCache>,
        ctx: usize,
        eos: Vec<u32>,
        spec: Option<Arc<Speculator>>,
    ) -> Scheduler<'t> {
        let n = caches.len();
        Scheduler {
            caches,
            slots: (0..n).map(|_| None).collect(),
            ctx,
            eos,
            spec,
            admitted: 0,
            finished: (0..n).map(|_| None).collect(),
            prompt_cache: None,
        }
    }

    /// Keep snapshots of finished prompts and replies in up to `budget` bytes of host memory
    /// ([`PromptCache`]); 0 turns it off.
    pub fn set_prompt_cache(&mut self, budget: usize) {
        self.prompt_cache = (budget > 0).then(|| PromptCache::new(budget));
    }

    pub fn prompt_cache(&self) -> Option<&PromptCache> {
        self.prompt_cache.as_ref()
    }

    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.is_none()).count()
    }

    pub fn active(&self) -> usize {
        self.slots.len() - self.free_slots()
    }

    pub fn is_active(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(Option::is_some)
    }

    pub fn speculator(&self) -> Option<&Speculator> {
        self.spec.as_deref()
    }

    /// Put a sequence into the free slot whose cache shares the longest prefix with its
    /// prompt; only the rest of the prompt will be prefilled. Returns the slot.
    pub fn admit(
        &mut self,
        req: GenRequest,
        sampler: Sampler,
        decoder: Option<StreamDecoder<'t>>,
    ) -> std::result::Result<usize, AdmitError> {
        let prompt = &req.prompt;
        if prompt.is_empty() || prompt.len() >= self.ctx {
            return Err(AdmitError::BadPrompt(format!(
                "the prompt has {} tokens; it must have between 1 and {} (the context is {})",
                prompt.len(),
                self.ctx.saturating_sub(1),
                self.ctx
            )));
        }
        // The most prompt tokens a cache may give (the last one is always run, for its logits);
        // an image's rows only where the cache holds the same embeddings there.
        let max = if req.fresh_prompt {
            0
        } else {
            prompt.len() - 1
        };
        let digests = req.embeds.as_ref().map(|e| e.digests()).unwrap_or_default();
        let Some(slot) = (0..self.slots.len())
            .filter(|&i| self.slots[i].is_none())
            .max_by_key(|&i| {
                (
                    self.caches[i].reusable_embedded(prompt, &digests, max),
                    std::cmp::Reverse(i),
                )
            })
        else {
            return Err(AdmitError::NoFreeSlot);
        };
        if let Some(pc) = &mut self.prompt_cache {
            let c = &mut self.caches[slot];
            let own = c.reusable_embedded(prompt, &digests, max);
            if let Some((snap, _)) = pc.lookup(prompt, &digests, max, own) {
                // The slot's content is kept as a snapshot; the better one comes in.
                let old = std::mem::replace(c, snap);
                pc.insert(&old);
            } else if own < c.len() {
                // What the slot holds past the shared prefix is about to go: keep it.
                pc.insert(c);
            }
        }
        let cached = self.caches[slot].reuse_embedded(prompt, &digests, max);
        let req_constraint = req.constraint.as_ref().map(Constraint::start);
        self.admitted += 1;
        self.finished[slot] = None;
        self.slots[slot] = Some(Sequence {
            sampler,
            history: prompt.clone(),
            stop: StopMatcher::new(req.stop.clone()),
            req,
            generated: 0,
            cached,
            next: None,
            decoder,
            order: self.admitted,
            spec: SpecStats::default(),
            spec_state: spec::SpecState::default(),
            kept: Vec::new(),
            constraint: req_constraint,
            masked: Vec::new(),
        });
        Ok(slot)
    }

    /// Prompt tokens slot `slot`'s sequence took from the cache.
    pub fn cached(&self, slot: usize) -> usize {
        self.slots[slot].as_ref().map_or(0, |s| s.cached)
    }

    /// Drop slot `slot`'s sequence (its client went away); its cache stays for reuse.
    pub fn cancel(&mut self, slot: usize) -> Option<Sequence<'t>> {
        self.slots.get_mut(slot).and_then(Option::take)
    }

    /// End every sequence (after a failed step) and clear the caches, whose state may be
    /// inconsistent. Returns the request indices by slot.
    pub fn fail_all(&mut self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (i, (s, c)) in self.slots.iter_mut().zip(&mut self.caches).enumerate() {
            if let Some(a) = s.take() {
                out.push((i, a.req.index));
            }
            c.clear();
        }
        out
    }

    /// The sequence that finished last in slot `slot`.
    pub fn take_finished(&mut self, slot: usize) -> Option<Sequence<'t>> {
        self.finished.get_mut(slot).and_then(Option::take)
    }

    /// One batched forward pass and the sampling after it. `emit(slot, event)` delivers each
    /// event; it returns false when the receiver is gone (the slot is then freed).
    pub fn step(
        &mut self,
        model: &Model,
        emit: &mut dyn FnMut(usize, Event) -> bool,
    ) -> Result<StepStats> {
        let mut st = StepStats::default();
        let drafts = self.drafts(model)?;
        let mut batch = Batch::default();
        // (slot, rows with logits, drafts) in batch order.
        let mut owners: Vec<(usize, usize, Vec<u32>)> = Vec::new();
        for (i, d) in drafts.into_iter().enumerate() {
            let Some(tok) = self.slots[i].as_ref().and_then(|a| a.next) else {
                continue;
            };
            let p = self.caches[i].len();
            batch.push(i, p, tok, true);
            for (j, &t) in d.iter().enumerate() {
                batch.push(i, p + 1 + j, t, true);
            }
            st.decode_rows += 1 + d.len();
            st.drafted += d.len();
            owners.push((i, 1 + d.len(), d));
        }
        let mut prefilling: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.as_ref()
                    .filter(|a| a.next.is_none())
                    .map(|a| (a.order, i))
            })
            .collect();
        prefilling.sort_unstable();
        // Prompt rows go in a pass of their own in exact mode (the f32 GEMM, decode rows the
        // matrix-vector kernels; neither changes with the other's presence); the default
        // and fast modes share one pass. A sequence's logits are the same alone, batched,
        // or after a cached prefix (tests/batch_invariance.rs).
        let mut pbatch = Batch {
            prompt: true,
            ..Batch::default()
        };
        let mut powners: Vec<(usize, usize, Vec<u32>)> = Vec::new();
        let mut budget = PREFILL_BUDGET;
        // (slot, prompt tokens in its cache after this pass) of sequences with a draft model.
        let mut draft_prompts: Vec<(usize, usize)> = Vec::new();
        for (_, i) in prefilling {
            if budget == 0 {
                break;
            }
            let Some(a) = &self.slots[i] else { continue };
            let start = self.caches[i].len();
            let prompt = &a.req.prompt;
            let n = (prompt.len() - start).min(budget);
            for (j, &tok) in prompt[start..start + n].iter().enumerate() {
                let last = start + j + 1 == prompt.len();
                if let Some(e) = a.req.embeds.as_ref().and_then(|e| e.get(start + j)) {
                    pbatch.embeds.push((pbatch.len(), e.to_vec()));
                }
                pbatch.push(i, start + j, tok, last);
                if last {
                    powners.push((i, 1, Vec::new()));
                }
            }
            budget -= n;
            st.prefill_rows += n;
            if a.req
                .spec
                .as_ref()
                .or(self.spec.as_ref().map(|s| &s.params))
                .is_some_and(|p| p.types.draft)
            {
                draft_prompts.push((i, start + n));
            }
        }
        if let Some(spec) = self.spec.clone().filter(|_| !draft_prompts.is_empty()) {
            let mut seqs: Vec<(&mut SeqCache, &[u32])> = Vec::new();
            for (i, c) in self.caches.iter_mut().enumerate() {
                if let Some(&(_, upto)) = draft_prompts.iter().find(|d| d.0 == i) {
                    let a = self.slots[i].as_ref().expect("prefilling");
                    seqs.push((c, &a.req.prompt[..upto]));
                }
            }
            spec.prefill_drafts(&mut seqs)?;
        }
        let passes = if model.compute.mode() != kernels::Mode::Exact {
            let base = batch.len();
            for ((&t, r), &l) in pbatch.tokens.iter().zip(&pbatch.rows).zip(&pbatch.logits) {
                batch.push(r.seq, r.pos, t, l);
            }
            let embeds = std::mem::take(&mut pbatch.embeds);
            batch
                .embeds
                .extend(embeds.into_iter().map(|(r, e)| (base + r, e)));
            owners.append(&mut powners);
            vec![(batch, owners)]
        } else {
            vec![(batch, owners), (pbatch, powners)]
        };
        let v = model.cfg.vocab_size;
        for (batch, owners) in passes {
            if batch.is_empty() {
                continue;
            }
            let t0 = std::time::Instant::now();
            let out = model.forward(&batch, &mut self.caches)?;
            st.forward_ns += t0.elapsed().as_nanos() as u64;
            let mut row = 0;
            for (slot, n, d) in owners {
                let logits = &out.logits[row * v..(row + n) * v];
                row += n;
                self.verify(slot, logits, &d, &mut st, emit);
            }
        }
        Ok(st)
    }

    /// The drafts of each slot (empty for slots not decoding, or without speculation).
    fn drafts(&mut self, model: &Model) -> Result<Vec<Vec<u32>>> {
        let mut out = vec![Vec::new(); self.slots.len()];
        let Some(spec) = self.spec.clone() else {
            return Ok(out);
        };
        let ctx = self.ctx;
        // Verify rows beyond this would multiply differently from a one-row decode.
        let rows = model.row_invariant_rows();
        let mut ins = Vec::new();
        let mut idx = Vec::new();
        for (i, (s, c)) in self
            .slots
            .iter_mut()
            .zip(self.caches.iter_mut())
            .enumerate()
        {
            let Some(a) = s.as_mut().filter(|a| a.next.is_some()) else {
                continue;
            };
            let params = a.req.spec.as_ref().unwrap_or(&spec.params);
            if !params.types.any() {
                continue;
            }
            let k_max = a
                .draft_room(ctx, c.rollback())
                .min(a.spec_state.cap(params))
                .min(rows.saturating_sub(1));
            ins.push(spec::ProposeIn {
                params,
                history: &a.history,
                k_max,
                cache: c,
                state: &mut a.spec_state,
            });
            idx.push(i);
        }
        for (i, d) in idx.into_iter().zip(spec.propose(&mut ins)?) {
            out[i] = d;
        }
        Ok(out)
    }

    /// Slot `slot` got `logits` for its pending token and `drafts`: keep the tokens the
    /// target agrees with, emit them, roll the caches back to them.
    fn verify(
        &mut self,
        slot: usize,
        logits: &[f32],
        drafts: &[u32],
        st: &mut StepStats,
        emit: &mut dyn FnMut(usize, Event) -> bool,
    ) {
        let (ctx, v) = (self.ctx, logits.len() / (drafts.len() + 1));
        let Some(a) = self.slots[slot].as_mut() else {
            return;
        };
        let mut emit_here = |e: Event| emit(slot, e);
        let decoding = a.next.is_some();
        if !decoding {
            // The prompt is in the cache: a snapshot for conversations that come back.
            if let Some(pc) = &mut self.prompt_cache {
                pc.insert(&self.caches[slot]);
            }
        }
        if decoding {
            a.spec.passes += 1;
            a.spec.drafted += drafts.len();
        }
        let before = a.generated;
        let mut took = 0;
        let mut end = None;
        for j in 0..=drafts.len() {
            let row = &logits[j * v..(j + 1) * v];
            let draft = drafts.get(j).copied();
            if row.iter().any(|x| x.is_nan() || *x == f32::INFINITY) {
                // Corrupt weights (or a broken kernel): never sample token 0 from NaNs.
                emit_here(Event::Error {
                    index: a.req.index,
                    message: "the model produced NaN or infinite logits (corrupt weights or invalid config values?); generation stopped".into(),
                });
                end = Some(End::Cancelled);
                break;
            }
            let (tok, ok) = match a.constraint.as_mut().filter(|c| c.active()) {
                None => a.sampler.verify(row, &a.history, draft),
                Some(c) => {
                    if c.finished() {
                        // The grammar is complete: the output ends here.
                        end = Some(End::Finish(FinishReason::Stop, true));
                        break;
                    }
                    a.masked.clear();
                    a.masked.extend_from_slice(row);
                    if !c.mask(&mut a.masked) {
                        let message = format!(
                            "constrained decoding failed: {}",
                            c.error().unwrap_or("unknown error")
                        );
                        emit_here(Event::Error {
                            index: a.req.index,
                            message,
                        });
                        end = Some(End::Cancelled);
                        break;
                    }
                    a.sampler.verify(&a.masked, &a.history, draft)
                }
            };
            if a.req.keep_logits {
                a.kept.extend_from_slice(row);
            }
            if ok {
                a.spec.accepted += 1;
                st.accepted += 1;
                took += 1;
            }
            let emitted = a.generated;
            end = a.push(tok, row, ctx, &self.eos, &mut emit_here);
            if let Some(c) = a.constraint.as_mut().filter(|_| a.generated > emitted) {
                c.consume(tok, &a.history);
            }
            if end.is_some() || !ok {
                a.next = Some(tok);
                break;
            }
        }
        st.generated += a.generated - before;
        if !drafts.is_empty() {
            a.spec_state.after_pass(drafts.len(), took);
        }
        // Keep the rows of the tokens that stay (the pending one and accepted drafts).
        let keep = self.caches[slot].common_prefix(&a.history);
        self.caches[slot].reuse(&a.history, keep);
        match end {
            None => {}
            Some(End::Cancelled) => {
                self.finished[slot] = self.slots[slot].take();
                st.cancelled += 1;
            }
            Some(End::Finish(f, flush)) => {
                let mut a = self.slots[slot].take().expect("active");
                a.finish(f, flush, &mut |e| emit(slot, e));
                self.finished[slot] = Some(a);
            }
        }
    }
}
