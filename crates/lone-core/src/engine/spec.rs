//! Speculative decoding: proposers of draft tokens, and their options.
//!
//! A decoding sequence's pending token plus `k` drafted tokens run as `k + 1` rows of one
//! forward pass; the sequence keeps the drafts the target agrees with (see
//! [`crate::sampler::Sampler::verify`]) and every cache is rolled back to the accepted prefix
//! ([`crate::cache::SeqCache::reuse`]). Proposers, tried in this order (llama.cpp's): the
//! first that drafts anything is used.
//! - **ngram-simple**: llama.cpp's `common_ngram_simple_draft`: the last `n` tokens (the
//!   pending one included) are looked up in the earlier history, most recent match first; the
//!   `m` tokens that followed it are the draft. Its rules are kept exactly: nothing while the
//!   history holds `n + m + 1` tokens or fewer, position 0 is never a match, and a match
//!   followed by fewer than `n` tokens drafts nothing.
//! - **ngram-cache**: llama.cpp's `common_ngram_cache_draft` on its context cache: counts of
//!   which token followed each 1- to 4-gram of the history; up to 8 tokens are drafted one at
//!   a time from the longest n-gram whose statistics pass llama.cpp's lax thresholds (at least
//!   2, 2, 1, 1 samples and 66, 50, 50, 50 % for the top token, n = 1..4), the draft itself
//!   extending the looked-up n-gram. Unlike llama.cpp, whose context cache only counts the
//!   n-grams lying wholly inside each step's new tokens (so, in practice, the prompt's),
//!   lone counts every n-gram of the history as it grows ([`NgramStats`]); ties go to the most
//!   recent continuation rather than to hash order. Short n-grams match within a few tokens of
//!   a deviation, where ngram-simple's 12-gram needs 12 tokens of agreement again.
//! - **draft**: a second model with the same vocabulary drafts greedily, token by token, while
//!   its top probability is at least `p_min`, up to `n_max` tokens; drafts shorter than
//!   `n_min` are dropped. Its caches live next to the target's (`SeqCache::draft`) and roll
//!   back with them.
//!
//! On top of both, lone's ramp ([`SpecParams::ramp`]) caps how many drafted tokens a sequence
//! verifies per pass, growing while drafts are accepted (the proposers' rules are unchanged:
//! a longer draft is cut, as llama-server cuts drafts to a slot's budget).

use crate::cache::SeqCache;
use crate::error::{Error, Result};
use crate::generate::{prefill, PREFILL_CHUNK};
use crate::models::{Batch, Model};
use crate::sampler::argmax;
use crate::tokenizer::Tokenizer;

/// Which proposers run (llama.cpp's `--spec-type`, comma-separated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecTypes {
    pub ngram_simple: bool,
    pub ngram_cache: bool,
    pub draft: bool,
}

impl SpecTypes {
    /// `none`, `ngram-simple`, `ngram-cache`, `draft` (alias `draft-simple`), comma-separated.
    pub fn parse(s: &str) -> std::result::Result<SpecTypes, String> {
        let mut t = SpecTypes::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "none" => {}
                "ngram-simple" => t.ngram_simple = true,
                "ngram-cache" => t.ngram_cache = true,
                "draft" | "draft-simple" => t.draft = true,
                other => {
                    return Err(format!(
                        "unknown speculative type `{other}`: use none, ngram-simple, ngram-cache \
                         or draft \
                         (comma-separated to combine)"
                    ))
                }
            }
        }
        Ok(t)
    }

    pub fn any(self) -> bool {
        self.ngram_simple || self.ngram_cache || self.draft
    }

    /// The types in the order they are tried, comma-separated (`none` for none).
    pub fn name(self) -> String {
        let names = [
            (self.ngram_simple, "ngram-simple"),
            (self.ngram_cache, "ngram-cache"),
            (self.draft, "draft"),
        ];
        let on: Vec<&str> = names.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect();
        if on.is_empty() {
            "none".into()
        } else {
            on.join(",")
        }
    }
}

/// Speculation settings, with llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecParams {
    pub types: SpecTypes,
    /// Most tokens the draft model drafts per pass (`--draft-max`, llama.cpp 3).
    pub draft_max: usize,
    /// Drafts shorter than this are dropped (`--draft-min`, 0).
    pub draft_min: usize,
    /// The draft model stops drafting when its top probability is below this (`--draft-p-min`,
    /// 0.0).
    pub draft_p_min: f32,
    /// ngram-simple: length of the looked-up n-gram (`--spec-ngram-simple-size-n`, 12).
    pub ngram_n: usize,
    /// ngram-simple: most tokens drafted after a match (`--spec-ngram-simple-size-m`, 48).
    pub ngram_m: usize,
    /// lone's draft-length ramp (`--spec-ramp`, 3; 0 = off): a sequence verifies at most
    /// this many drafted tokens at first, 4× as many rows after each fully accepted draft
    /// (3, 15, 63 drafts), and falls back to this (or what it just accepted) after a
    /// rejection. A verify
    /// pass costs more the more rows it has, so a long draft that fails early (text the
    /// proposer cannot predict) costs several decode steps; the ramp keeps that cost small
    /// while copying ramps up to the full `ngram_m` / `draft_max` within a few passes.
    /// With the ramp on, a draft model whose whole draft is rejected in two passes in a row
    /// also backs off ([`DRAFT_BACKOFF_MAX`]): each of its steps costs a fraction of a target
    /// step, so drafts that never pass would make decoding several times slower.
    pub ramp: usize,
}

impl Default for SpecParams {
    fn default() -> Self {
        SpecParams {
            types: SpecTypes::default(),
            draft_max: 3,
            draft_min: 0,
            draft_p_min: 0.0,
            ngram_n: 12,
            ngram_m: 48,
            ramp: 3,
        }
    }
}

impl SpecParams {
    /// Check the values (`has_draft_model`: whether `draft` can run).
    pub fn validate(&self, has_draft_model: bool) -> std::result::Result<(), String> {
        if self.types.draft && !has_draft_model {
            return Err("speculative type `draft` needs a draft model (--model-draft PATH)".into());
        }
        if !(1..=1024).contains(&self.ngram_n) || !(1..=1024).contains(&self.ngram_m) {
            return Err(format!(
                "ngram sizes must be between 1 and 1024, got n = {} and m = {}",
                self.ngram_n, self.ngram_m
            ));
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            return Err(format!(
                "draft p-min must be in [0, 1], got {}",
                self.draft_p_min
            ));
        }
        Ok(())
    }
}

/// The longest back-off of a draft model whose drafts keep failing: after the second pass in
/// a row in which none of its drafted tokens was accepted the sequence decodes 1 step without
/// it, then 2, 4, … up to this many, probing it once between (each probe first feeds it the
/// skipped tokens, a prompt pass); one accepted token resets it. A probe that fails after the
/// longest back-off (8 whole rejections in a row, ~70 tokens) drops the draft model for the
/// rest of the sequence: catching it up would keep costing a fifth of the decode time.
pub const DRAFT_BACKOFF_MAX: usize = 32;

/// The speculation a scheduler can do: default settings and the draft model, if any.
pub struct Speculator {
    pub params: SpecParams,
    draft: Option<Model>,
}

impl std::fmt::Debug for Speculator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculator")
            .field("params", &self.params)
            .field("draft", &self.draft.as_ref().map(|m| m.cfg.arch))
            .finish()
    }
}

impl Speculator {
    /// `draft`: the draft model with its tokenizer, checked against the target's.
    pub fn new(
        params: SpecParams,
        target: &Model,
        target_tok: &Tokenizer,
        draft: Option<(Model, &Tokenizer)>,
    ) -> Result<Speculator> {
        params.validate(draft.is_some()).map_err(Error::Input)?;
        let draft = match draft {
            Some((mut m, tok)) => {
                check_vocab(target, target_tok, &m, tok)?;
                // Its numerics never reach the output (the target verifies every token):
                // unless told otherwise it runs in fast mode, prompts included (8-bit GEMMs,
                // no exact rescoring of its head).
                m.compute.mode.get_or_insert(crate::kernels::Mode::Fast);
                Some(m)
            }
            None => None,
        };
        Ok(Speculator { params, draft })
    }

    pub fn draft_model(&self) -> Option<&Model> {
        self.draft.as_ref()
    }

    /// Drafts for several sequences. `seqs[i]`: its settings, its history (prompt + generated,
    /// ending with the pending token), the most tokens it may take, its target cache (whose
    /// `draft` cache the draft model uses) and its speculation state (which notes whether the
    /// draft model made the draft). Draft-model steps of all sequences share one forward pass.
    pub(crate) fn propose(&self, seqs: &mut [ProposeIn<'_>]) -> Result<Vec<Vec<u32>>> {
        let mut out: Vec<Vec<u32>> = seqs
            .iter_mut()
            .map(|s| {
                let types = s.params.types;
                let mut d = Vec::new();
                s.state.model_draft = false;
                if types.ngram_cache {
                    // Counted every step, drafting or not, so no n-gram is missed.
                    s.state.ngrams.update(s.history);
                }
                if s.k_max == 0 {
                    return d;
                }
                if types.ngram_simple {
                    let (last, prev) = s.history.split_last().expect("history is not empty");
                    d = ngram_simple(prev, *last, s.params.ngram_n, s.params.ngram_m);
                }
                if d.is_empty() && types.ngram_cache {
                    d = s
                        .state
                        .ngrams
                        .draft(s.history, NGRAM_CACHE_DRAFT.min(s.k_max));
                }
                d.truncate(s.k_max);
                d
            })
            .collect();
        if let Some(dm) = &self.draft {
            let want: Vec<usize> = (0..seqs.len())
                .filter(|&i| {
                    let s = &mut seqs[i];
                    out[i].is_empty()
                        && s.params.types.draft
                        && s.k_max > 0
                        && s.state.model_turn(s.params)
                })
                .collect();
            if !want.is_empty() {
                let drafts = draft_model_drafts(dm, seqs, &want)?;
                for (i, d) in want.into_iter().zip(drafts) {
                    seqs[i].state.model_draft = !d.is_empty();
                    out[i] = d;
                }
            }
        }
        Ok(out)
    }
}

impl Speculator {
    /// Feed the draft model the prompt tokens its target has just prefilled, so that the
    /// first draft of a sequence reads only its pending token (the draft's prompt work is
    /// prompt work: it belongs to the time to the first token, not to decoding).
    /// `seqs[i]`: a sequence's target cache (holding the draft cache) and its prompt so far.
    /// One forward pass for all of them; no-op without a draft model.
    pub(crate) fn prefill_drafts(&self, seqs: &mut [(&mut SeqCache, &[u32])]) -> Result<()> {
        let Some(dm) = &self.draft else {
            return Ok(());
        };
        let mut seqs: Vec<&mut (&mut SeqCache, &[u32])> = seqs
            .iter_mut()
            .filter(|(_, t)| !t.is_empty() && t.len() <= dm.cfg.max_position_embeddings)
            .collect();
        if seqs.is_empty() {
            return Ok(());
        }
        let mut caches: Vec<SeqCache> = seqs
            .iter_mut()
            .map(|(c, _)| c.draft.take().map(|b| *b).unwrap_or_else(|| dm.new_cache()))
            .collect();
        for ((_, toks), c) in seqs.iter().zip(&mut caches) {
            c.reuse(toks, toks.len());
        }
        // Passes of at most PREFILL_CHUNK rows (a cache may lag by more than one step's
        // prompt rows: after a prompt-cache hit, or a prompt prefilled outside the scheduler).
        let mut res = Ok(());
        loop {
            let mut batch = Batch {
                prompt: true,
                ..Batch::default()
            };
            for (j, ((_, toks), c)) in seqs.iter().zip(&caches).enumerate() {
                let room = PREFILL_CHUNK - batch.tokens.len();
                for (p, &t) in toks.iter().enumerate().skip(c.len()).take(room) {
                    batch.push(j, p, t, false);
                }
            }
            if batch.is_empty() {
                break;
            }
            if let Err(e) = dm.forward(&batch, &mut caches) {
                res = Err(e);
                break;
            }
        }
        if res.is_err() {
            // A failed pass leaves the draft caches in no known state.
            caches.iter_mut().for_each(SeqCache::clear);
        }
        for ((c, _), d) in seqs.into_iter().zip(caches) {
            c.draft = Some(Box::new(d));
        }
        res
    }
}

pub(crate) struct ProposeIn<'a> {
    pub params: &'a SpecParams,
    pub history: &'a [u32],
    pub k_max: usize,
    pub cache: &'a mut SeqCache,
    /// The sequence's speculation state (n-gram statistics, the draft model's back-off).
    pub state: &'a mut SpecState,
}

/// A sequence's speculation state, step to step: the ramp's cap, the n-gram statistics of
/// its history, and the draft model's back-off.
#[derive(Debug, Default)]
pub struct SpecState {
    /// The ramp: most drafted tokens to verify next pass ([`SpecParams::ramp`]).
    cap: usize,
    ngrams: NgramStats,
    /// Whether the draft in flight came from the draft model.
    model_draft: bool,
    /// Passes in a row in which the draft model's whole draft was rejected.
    model_misses: u32,
    /// Steps left without the draft model ([`DRAFT_BACKOFF_MAX`]).
    model_skip: usize,
}

impl SpecState {
    /// Most drafted tokens the ramp lets this sequence verify next pass.
    pub(crate) fn cap(&self, params: &SpecParams) -> usize {
        if params.ramp == 0 {
            usize::MAX
        } else {
            self.cap.max(params.ramp)
        }
    }

    /// Whether the draft model may draft this step (not while backed off); counts the step.
    fn model_turn(&mut self, params: &SpecParams) -> bool {
        let turn = params.ramp == 0 || self.model_skip == 0;
        self.model_skip = self.model_skip.saturating_sub(1);
        turn
    }

    /// After a verify pass that accepted `took` of `drafted` tokens: the ramp grows 4× the
    /// rows after a fully accepted draft (4, 16, 64 rows: the sizes the matrix kernels run
    /// best), else restarts from what was taken; a draft model whose whole draft was
    /// rejected twice in a row backs off for 1, 2, 4 … 32 steps, then for the rest of the
    /// sequence.
    pub(crate) fn after_pass(&mut self, drafted: usize, took: usize) {
        self.cap = if took == drafted {
            (drafted + 1).saturating_mul(4) - 1
        } else {
            took
        };
        if !self.model_draft {
            return;
        }
        if took > 0 {
            self.model_misses = 0;
            return;
        }
        self.model_misses += 1;
        if self.model_misses >= 2 {
            let skip = 1usize << (self.model_misses - 2).min(16);
            self.model_skip = if skip > DRAFT_BACKOFF_MAX {
                usize::MAX
            } else {
                skip
            };
        }
    }
}

/// Most tokens ngram-cache drafts per pass (llama.cpp's fixed `n_draft = 8`).
pub const NGRAM_CACHE_DRAFT: usize = 8;

/// Longest n-gram ngram-cache counts (llama.cpp's `LLAMA_NGRAM_MAX`).
const NGRAM_MAX: usize = 4;

/// llama.cpp's lax thresholds for the context cache, for n = 1..=4: the fewest times the
/// n-gram must have been seen, and the least share (percent) of those its top continuation
/// must have.
const NGRAM_MIN_SAMPLES: [u32; NGRAM_MAX] = [2, 2, 1, 1];
const NGRAM_MIN_PERCENT: [u32; NGRAM_MAX] = [66, 50, 50, 50];

/// What followed each 1- to 4-gram of a sequence's history: per n-gram, each continuation
/// token with its count and the position it was last seen at.
#[derive(Debug, Default)]
pub struct NgramStats {
    /// Keyed by (n, the n tokens padded with zeros).
    next: std::collections::HashMap<(u8, [u32; NGRAM_MAX]), Vec<Continuation>>,
    /// How many tokens of the history have been counted (as continuations).
    counted: usize,
    /// The last counted token, to notice a history that is not the one counted.
    last: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Continuation {
    token: u32,
    count: u32,
    last_pos: u32,
}

fn ngram_key(toks: &[u32]) -> (u8, [u32; NGRAM_MAX]) {
    let mut k = [0u32; NGRAM_MAX];
    k[..toks.len()].copy_from_slice(toks);
    (toks.len() as u8, k)
}

impl NgramStats {
    /// Count the n-grams of `history` not counted yet. A history that does not extend the
    /// counted one (shorter, or a different token where the last counted one was) is
    /// counted again from the start.
    pub fn update(&mut self, history: &[u32]) {
        let extends = self.counted <= history.len()
            && (self.counted == 0 || self.last == Some(history[self.counted - 1]));
        if !extends {
            *self = NgramStats::default();
        }
        for i in self.counted.max(1)..history.len() {
            let tok = history[i];
            for n in 1..=NGRAM_MAX.min(i) {
                let conts = self.next.entry(ngram_key(&history[i - n..i])).or_default();
                match conts.iter_mut().find(|c| c.token == tok) {
                    Some(c) => {
                        c.count += 1;
                        c.last_pos = i as u32;
                    }
                    None => conts.push(Continuation {
                        token: tok,
                        count: 1,
                        last_pos: i as u32,
                    }),
                }
            }
        }
        self.counted = history.len();
        self.last = history.last().copied();
    }

    /// Up to `n_draft` tokens to follow `history` (which [`NgramStats::update`] has
    /// counted): each from the longest n-gram ending at the history-plus-draft whose top
    /// continuation passes the thresholds; stops at the first position none does.
    pub fn draft(&self, history: &[u32], n_draft: usize) -> Vec<u32> {
        let mut d: Vec<u32> = Vec::new();
        // llama.cpp drafts nothing from fewer than 2 tokens (`LLAMA_NGRAM_STATIC`).
        if history.len() < 2 {
            return d;
        }
        let mut tail: Vec<u32> = Vec::with_capacity(NGRAM_MAX);
        while d.len() < n_draft {
            let total = history.len() + d.len();
            let at = |i: usize| {
                if i < history.len() {
                    history[i]
                } else {
                    d[i - history.len()]
                }
            };
            let pick = (1..=NGRAM_MAX.min(total)).rev().find_map(|n| {
                tail.clear();
                tail.extend((total - n..total).map(at));
                let conts = self.next.get(&ngram_key(&tail))?;
                let sum: u32 = conts.iter().map(|c| c.count).sum();
                let best = conts.iter().max_by_key(|c| (c.count, c.last_pos))?;
                (sum >= NGRAM_MIN_SAMPLES[n - 1]
                    && 100 * best.count >= NGRAM_MIN_PERCENT[n - 1] * sum)
                    .then_some(best.token)
            });
            match pick {
                Some(t) => d.push(t),
                None => break,
            }
        }
        d
    }
}

/// llama.cpp's `common_ngram_simple_draft`: `tokens` is the history before the last sampled
/// token `sampled`.
pub fn ngram_simple(tokens: &[u32], sampled: u32, n: usize, m: usize) -> Vec<u32> {
    let cur = tokens.len();
    if n == 0 || cur <= n + m + 1 {
        return Vec::new();
    }
    let mut pattern: Vec<u32> = tokens[cur - n + 1..].to_vec();
    pattern.push(sampled);
    // Backwards from the most recent earlier position; position 0 means "no match".
    let match_pos = (1..cur - n)
        .rev()
        .find(|&j| tokens[j..j + n] == pattern[..])
        .unwrap_or(0);
    if match_pos == 0 {
        return Vec::new();
    }
    let copy = m.min(cur - (match_pos + n));
    if copy < n {
        return Vec::new();
    }
    tokens[match_pos + n..match_pos + n + copy].to_vec()
}

/// The draft model's greedy drafts for `seqs[want[..]]`.
fn draft_model_drafts(
    dm: &Model,
    seqs: &mut [ProposeIn<'_>],
    want: &[usize],
) -> Result<Vec<Vec<u32>>> {
    // Take the draft caches out (one contiguous slice for the forward pass), catch each up
    // with its history but the pending token, and put them back at the end.
    let mut caches: Vec<SeqCache> = want
        .iter()
        .map(|&i| {
            seqs[i]
                .cache
                .draft
                .take()
                .map(|b| *b)
                .unwrap_or_else(|| dm.new_cache())
        })
        .collect();
    let res = draft_steps(dm, seqs, want, &mut caches);
    for (&i, c) in want.iter().zip(caches) {
        seqs[i].cache.draft = Some(Box::new(c));
    }
    res
}

fn draft_steps(
    dm: &Model,
    seqs: &[ProposeIn<'_>],
    want: &[usize],
    caches: &mut [SeqCache],
) -> Result<Vec<Vec<u32>>> {
    let v = dm.cfg.vocab_size;
    let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); want.len()];
    // Whether sequence j still drafts after its last pick (that pick then needs a row).
    let mut going = vec![false; want.len()];
    let pick = |s: &ProposeIn<'_>, logits: &[f32], d: &mut Vec<u32>| -> bool {
        let tok = argmax(logits);
        if s.params.draft_p_min > 0.0 && top_prob(logits, tok) < s.params.draft_p_min {
            return false;
        }
        d.push(tok);
        d.len() < s.k_max.min(s.params.draft_max)
    };
    for (j, &i) in want.iter().enumerate() {
        let s = &seqs[i];
        let h = s.history;
        let c = &mut caches[j];
        c.reuse(h, h.len() - 1);
        if h.len() > dm.cfg.max_position_embeddings {
            continue;
        }
        let logits = prefill(dm, c, &h[c.len()..], false)?;
        going[j] = pick(s, &logits[..v], &mut drafts[j]);
    }
    loop {
        let mut batch = Batch::default();
        let mut rows = Vec::new();
        for j in 0..want.len() {
            if going[j] {
                let c = &caches[j];
                if c.len() + 1 >= dm.cfg.max_position_embeddings {
                    going[j] = false;
                    continue;
                }
                batch.push(j, c.len(), *drafts[j].last().expect("drafting"), true);
                rows.push(j);
            }
        }
        if rows.is_empty() {
            break;
        }
        let out = dm.forward(&batch, caches)?;
        for (r, &j) in rows.iter().enumerate() {
            going[j] = pick(
                &seqs[want[j]],
                &out.logits[r * v..(r + 1) * v],
                &mut drafts[j],
            );
        }
    }
    for (j, &i) in want.iter().enumerate() {
        if drafts[j].len() < seqs[i].params.draft_min {
            drafts[j].clear();
        }
    }
    Ok(drafts)
}

/// Softmax probability of `tok`.
fn top_prob(logits: &[f32], tok: u32) -> f32 {
    crate::sampler::token_logprob(logits, tok).exp()
}

/// The draft model must speak the target's vocabulary: same size, same token strings.
fn check_vocab(target: &Model, tt: &Tokenizer, draft: &Model, dt: &Tokenizer) -> Result<()> {
    let (nt, nd) = (target.cfg.vocab_size, draft.cfg.vocab_size);
    if nt != nd {
        return Err(Error::Input(format!(
            "the draft model's vocabulary has {nd} entries but the target's has {nt}: \
             speculation needs a draft model with the target's tokenizer"
        )));
    }
    let n = tt.vocab_size().min(dt.vocab_size()) as u32;
    if let Some(id) = (0..n).find(|&id| tt.id_to_token(id) != dt.id_to_token(id)) {
        return Err(Error::Input(format!(
            "the draft model's tokenizer differs from the target's at token {id} \
             ({:?} vs {:?}): speculation needs a draft model with the target's tokenizer",
            dt.id_to_token(id),
            tt.id_to_token(id)
        )));
    }
    if tt.eos_ids() != dt.eos_ids() || tt.bos_id() != dt.bos_id() {
        return Err(Error::Input(
            "the draft model's special tokens (BOS/EOS) differ from the target's".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_simple_follows_llama_cpp() {
        // n = 2, m = 3: needs more than 6 tokens of history.
        let h = [9, 1, 2, 3, 4, 5, 7, 1];
        assert_eq!(ngram_simple(&h, 2, 2, 3), vec![3, 4, 5]);
        // Too short a history: nothing.
        assert!(ngram_simple(&h[..5], 2, 2, 3).is_empty());
        // A match at position 0 does not count.
        let h0 = [1, 2, 3, 4, 5, 6, 7, 1];
        assert!(ngram_simple(&h0, 2, 2, 3).is_empty());
        // The most recent earlier match wins.
        let h2 = [0, 1, 2, 8, 8, 8, 1, 2, 6, 6, 6, 0, 1];
        assert_eq!(ngram_simple(&h2, 2, 2, 3), vec![6, 6, 6]);
        // Fewer than n tokens after the match: nothing (llama.cpp's `copy_max < n`).
        let h3 = [0, 5, 5, 5, 5, 5, 5, 5, 1, 2, 1];
        assert!(ngram_simple(&h3, 2, 2, 3).is_empty());
        // The draft may run up to the end of the history.
        let h4 = [0, 5, 5, 5, 5, 5, 5, 1, 2, 4, 4, 1];
        assert_eq!(ngram_simple(&h4, 2, 2, 3), vec![4, 4, 1]);
    }

    #[test]
    fn ngram_cache_follows_llama_cpp_thresholds() {
        let draft = |h: &[u32], n: usize| {
            let mut s = NgramStats::default();
            s.update(h);
            s.draft(h, n)
        };
        // A 4-gram seen once (1 sample is enough for n = 3, 4) drafts what followed it, and
        // the draft extends the n-gram: 5 6 7 8 | 9 4 then 6 7 8 again.
        let h = [5, 6, 7, 8, 9, 4, 1, 5, 6, 7];
        assert_eq!(draft(&h, 8), vec![8, 9, 4, 1, 5, 6, 7, 8]);
        assert_eq!(draft(&h, 3), vec![8, 9, 4]);
        // A 1-gram or 2-gram needs 2 samples: `3` seen once followed by 4 drafts nothing.
        assert!(draft(&[3, 4, 1, 3], 8).is_empty());
        // ... and twice (2 of 2 = 100 %) drafts; the 2-gram (1, 3) never seen, so n = 1 is used.
        assert_eq!(draft(&[3, 4, 9, 3, 4, 1, 3], 1), vec![4]);
        // n = 1 needs 66 %: `3` followed by 4, 5 (50 %) drafts nothing.
        assert!(draft(&[3, 4, 2, 3, 5, 1, 3], 8).is_empty());
        // n = 2 needs 50 %: (2, 3) followed by 4 and by 5 drafts; the tie goes to the most recent.
        assert_eq!(draft(&[2, 3, 4, 2, 3, 5, 1, 2, 3], 1), vec![5]);
        // Fewer than 2 tokens: nothing.
        assert!(draft(&[3], 8).is_empty());
    }

    #[test]
    fn ngram_stats_count_incrementally() {
        let h: Vec<u32> = (0..40).map(|i| (i * 7 % 11) as u32).collect();
        let mut whole = NgramStats::default();
        whole.update(&h);
        let mut steps = NgramStats::default();
        for end in [1, 2, 3, 10, 11, 25, 40] {
            steps.update(&h[..end]);
        }
        for n in [1, 5, 8] {
            assert_eq!(whole.draft(&h, n), steps.draft(&h, n));
        }
        // A different history is counted from scratch.
        let other: Vec<u32> = h.iter().map(|t| t + 100).collect();
        steps.update(&other);
        let mut fresh = NgramStats::default();
        fresh.update(&other);
        assert_eq!(steps.draft(&other, 8), fresh.draft(&other, 8));
        assert_eq!(steps.next.len(), fresh.next.len());
    }

    #[test]
    fn spec_types_parse() {
        assert_eq!(SpecTypes::parse("none").unwrap(), SpecTypes::default());
        let t = SpecTypes::parse("ngram-simple,draft").unwrap();
        assert!(t.ngram_simple && t.draft && !t.ngram_cache);
        assert_eq!(t.name(), "ngram-simple,draft");
        let t = SpecTypes::parse("draft,ngram-cache").unwrap();
        assert_eq!(t.name(), "ngram-cache,draft");
        assert!(SpecTypes::parse("eagle").is_err());
    }
}
