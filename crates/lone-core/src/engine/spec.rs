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
    pub draft: bool,
}

impl SpecTypes {
    /// `none`, `ngram-simple`, `draft` (alias `draft-simple`), comma-separated.
    pub fn parse(s: &str) -> std::result::Result<SpecTypes, String> {
        let mut t = SpecTypes::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "none" => {}
                "ngram-simple" => t.ngram_simple = true,
                "draft" | "draft-simple" => t.draft = true,
                other => {
                    return Err(format!(
                        "unknown speculative type `{other}`: use none, ngram-simple or draft \
                         (comma-separated to combine)"
                    ))
                }
            }
        }
        Ok(t)
    }

    pub fn any(self) -> bool {
        self.ngram_simple || self.draft
    }

    pub fn name(self) -> String {
        match (self.ngram_simple, self.draft) {
            (false, false) => "none".into(),
            (true, false) => "ngram-simple".into(),
            (false, true) => "draft".into(),
            (true, true) => "ngram-simple,draft".into(),
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
    /// ending with the pending token), the most tokens it may take, and its target cache
    /// (whose `draft` cache the draft model uses). Draft-model steps of all sequences share
    /// one forward pass.
    pub(crate) fn propose(&self, seqs: &mut [ProposeIn<'_>]) -> Result<Vec<Vec<u32>>> {
        let mut out: Vec<Vec<u32>> = seqs
            .iter()
            .map(|s| {
                if s.params.types.ngram_simple && s.k_max > 0 {
                    let (last, prev) = s.history.split_last().expect("history is not empty");
                    let mut d = ngram_simple(prev, *last, s.params.ngram_n, s.params.ngram_m);
                    d.truncate(s.k_max);
                    d
                } else {
                    Vec::new()
                }
            })
            .collect();
        if let Some(dm) = &self.draft {
            let want: Vec<usize> = (0..seqs.len())
                .filter(|&i| out[i].is_empty() && seqs[i].params.types.draft && seqs[i].k_max > 0)
                .collect();
            if !want.is_empty() {
                let drafts = draft_model_drafts(dm, seqs, &want)?;
                for (i, d) in want.into_iter().zip(drafts) {
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
    fn spec_types_parse() {
        assert_eq!(SpecTypes::parse("none").unwrap(), SpecTypes::default());
        let t = SpecTypes::parse("ngram-simple,draft").unwrap();
        assert!(t.ngram_simple && t.draft);
        assert_eq!(t.name(), "ngram-simple,draft");
        assert!(SpecTypes::parse("eagle").is_err());
    }
}
