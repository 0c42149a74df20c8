//! Token sampling: logits → next token id.
//!
//! The processing chain follows llama.cpp's default sampler order:
//!
//! 1. `logit_bias` (added to the raw logits),
//! 2. penalties over the last `penalty_last_n` tokens of the history:
//!    repetition (HF / llama.cpp: `l > 0 ? l / p : l * p`), then
//!    frequency and presence (OpenAI: `l -= count * freq + (count > 0) * presence`),
//! 3. `top_k`, 4. `top_p` (over the probabilities renormalised after top-k),
//! 5. `min_p`, 6. `temperature`, 7. a draw from the softmax of what is left.
//!
//! `temperature == 0` means greedy: the argmax after steps 1–2 (the
//! truncation steps can never remove the argmax, so they are skipped).
//!
//! NaN logits are treated as `-inf`; `sample` never panics, whatever the
//! logits or parameters. Randomness comes from a [`ChaCha8Rng`], whose output
//! stream is value-stable across releases of `rand_chacha`, so the same seed
//! gives the same tokens across builds and platforms.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// A sampling parameter that failed [`SamplingParams::validate`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid sampling parameter `{param}`: {reason}")]
pub struct SamplerError {
    /// The name of the offending field, e.g. `"top_p"`.
    pub param: &'static str,
    /// What is wrong with it, including the value given.
    pub reason: String,
}

impl SamplerError {
    fn new(param: &'static str, reason: impl Into<String>) -> Self {
        Self {
            param,
            reason: reason.into(),
        }
    }
}

impl From<SamplerError> for crate::Error {
    fn from(e: SamplerError) -> Self {
        crate::Error::Msg(e.to_string())
    }
}

/// How to pick the next token. The [`Default`] is greedy decoding with every
/// filter and penalty off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` turns it off.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose
    /// probability sums to at least `top_p`; `1.0` turns it off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times that of the most
    /// likely token; `0.0` turns it off.
    pub min_p: f32,
    /// Multiplicative penalty for tokens in the penalty window
    /// (`l > 0 ? l / p : l * p`); `1.0` turns it off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token in the penalty window.
    pub presence_penalty: f32,
    /// Subtracted `count` times from the logit of every token in the window.
    pub frequency_penalty: f32,
    /// How many of the most recent history tokens the penalties look at;
    /// `0` means the whole history given to [`Sampler::sample`].
    pub penalty_last_n: usize,
    /// Seed of the RNG; `None` draws one from OS entropy
    /// (see [`Sampler::seed`] to read it back).
    pub seed: Option<u64>,
    /// `(token id, bias)` pairs added to the raw logits. `-inf` (or a large
    /// negative value) bans a token, a large positive value forces it.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Check every parameter; `vocab_size` bounds the `logit_bias` token ids.
    pub fn validate(&self, vocab_size: usize) -> Result<(), SamplerError> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(SamplerError::new(
                "temperature",
                format!("must be a finite number >= 0 (0 = greedy), got {t}"),
            ));
        }
        let p = self.top_p;
        if p.is_nan() || p <= 0.0 || p > 1.0 {
            return Err(SamplerError::new(
                "top_p",
                format!("must be in (0, 1] (1 = off), got {p}"),
            ));
        }
        let m = self.min_p;
        if m.is_nan() || !(0.0..=1.0).contains(&m) {
            return Err(SamplerError::new(
                "min_p",
                format!("must be in [0, 1] (0 = off), got {m}"),
            ));
        }
        let r = self.repetition_penalty;
        if !r.is_finite() || r <= 0.0 {
            return Err(SamplerError::new(
                "repetition_penalty",
                format!("must be a finite number > 0 (1 = off), got {r}"),
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() {
                return Err(SamplerError::new(
                    name,
                    format!("must be a finite number (0 = off), got {v}"),
                ));
            }
        }
        for &(id, bias) in &self.logit_bias {
            if id as usize >= vocab_size {
                return Err(SamplerError::new(
                    "logit_bias",
                    format!("token id {id} is out of the vocabulary (size {vocab_size})"),
                ));
            }
            if bias.is_nan() || bias == f32::INFINITY {
                return Err(SamplerError::new(
                    "logit_bias",
                    format!(
                        "bias for token {id} must be a number or -inf, got {bias} \
                         (use e.g. 100 to force a token)"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// Picks tokens from logits. Owns the parameters, the RNG and scratch
/// buffers that are reused from call to call (no per-token allocation once
/// warmed up).
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: ChaCha8Rng,
    /// Sanitised, biased, penalised logits (one per vocab entry).
    logits: Vec<f32>,
    /// Occurrence counts in the penalty window; all zero between calls.
    counts: Vec<u32>,
    /// Surviving `(token, logit)` candidates.
    cands: Vec<(u32, f32)>,
    /// Unnormalised probabilities of `cands`.
    weights: Vec<f64>,
    /// Top-p histogram over logits: probability mass per bucket.
    bucket_mass: Vec<f64>,
}

impl Sampler {
    /// A sampler for `params`. Parameters are not validated here (call
    /// [`SamplingParams::validate`] at the API boundary); invalid ones still
    /// never cause a panic.
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        Self {
            params,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            logits: Vec::new(),
            counts: Vec::new(),
            cands: Vec::new(),
            weights: Vec::new(),
            bucket_mass: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (the drawn one when `params.seed` was `None`), so a
    /// run can be reproduced.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Restart the RNG from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.seed = seed;
        self.rng = ChaCha8Rng::seed_from_u64(seed);
    }

    /// Pick the next token from one row of logits. `history` is the sequence
    /// so far (prompt + generated); only the penalties look at it, and ids
    /// outside the vocabulary are ignored. Returns 0 for empty `logits`.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if logits.is_empty() {
            return 0;
        }
        let t = self.params.temperature;
        let greedy = t.is_nan() || t <= 0.0;
        if greedy && self.params.logit_bias.is_empty() && !self.params.has_penalties() {
            return argmax(logits);
        }
        self.prepare(logits, history);
        let best = argmax(&self.logits);
        let max = self.logits[best as usize];
        // Greedy, a forced (+inf) token, or everything banned.
        if greedy || max == f32::INFINITY || max == f32::NEG_INFINITY {
            return best;
        }
        self.filter();
        if self.cands.len() <= 1 {
            return self.cands.first().map_or(best, |c| c.0);
        }
        self.draw(best)
    }

    /// Speculative verification of one position: the token the target emits after
    /// `history` given a drafted `draft` (proposed deterministically: an n-gram match or a
    /// draft model's greedy pick, i.e. a point-mass proposal q). Returns the token and
    /// whether it is the draft.
    ///
    /// Greedy: the token is [`sample`](Self::sample)'s, accepted when equal to the draft.
    /// Sampling: the draft is accepted with probability p(draft) (= min(1, p/q) for a point
    /// mass q), p being the distribution `sample` draws from (bias, penalties, top-k, top-p,
    /// min-p, temperature); on rejection the token is drawn from norm(max(0, p − q)), i.e.
    /// p without the draft. So the emitted token is distributed exactly as `sample`'s.
    /// Without a draft it is `sample`.
    pub fn verify(&mut self, logits: &[f32], history: &[u32], draft: Option<u32>) -> (u32, bool) {
        let Some(d) = draft else {
            return (self.sample(logits, history), false);
        };
        let t = self.params.temperature;
        if t.is_nan() || t <= 0.0 || logits.is_empty() {
            let tok = self.sample(logits, history);
            return (tok, tok == d);
        }
        self.prepare(logits, history);
        let best = argmax(&self.logits);
        let max = self.logits[best as usize];
        if max.is_infinite() {
            return (best, best == d);
        }
        self.filter();
        if self.cands.len() <= 1 {
            let tok = self.cands.first().map_or(best, |c| c.0);
            return (tok, tok == d);
        }
        self.tempered_weights();
        let total: f64 = self.weights.iter().sum();
        if !(total > 0.0 && total.is_finite()) {
            return (best, best == d);
        }
        let pos = self.cands.iter().position(|c| c.0 == d);
        let p_draft = pos.map_or(0.0, |i| self.weights[i] / total);
        if self.uniform() < p_draft {
            return (d, true);
        }
        if let Some(i) = pos {
            self.weights[i] = 0.0;
        }
        let rest: f64 = self.weights.iter().sum();
        if rest <= 0.0 || rest.is_nan() {
            return (d, true);
        }
        (self.pick(rest, best), false)
    }

    /// The logits after NaN → -inf, `logit_bias` and penalties (steps 1–2),
    /// e.g. for "processed" logprobs via [`top_logprobs`].
    pub fn processed_logits(&mut self, logits: &[f32], history: &[u32]) -> &[f32] {
        self.prepare(logits, history);
        &self.logits
    }

    /// The `(token, logit)` pairs that survive steps 1–5 (bias, penalties,
    /// top-k, top-p, min-p), with their untempered logits, in unspecified
    /// order. `sample` draws from these (or takes the argmax when greedy).
    pub fn candidates(&mut self, logits: &[f32], history: &[u32]) -> &[(u32, f32)] {
        self.prepare(logits, history);
        self.filter();
        &self.cands
    }

    /// Steps 1–2 into `self.logits`.
    fn prepare(&mut self, logits: &[f32], history: &[u32]) {
        let n = logits.len();
        self.logits.clear();
        self.logits.extend(
            logits
                .iter()
                .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l }),
        );

        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = self.logits.get_mut(id as usize) {
                *l = sanitize(*l + bias);
            }
        }

        if !self.params.has_penalties() || history.is_empty() {
            return;
        }
        let last_n = self.params.penalty_last_n;
        let window = if last_n == 0 || last_n >= history.len() {
            history
        } else {
            &history[history.len() - last_n..]
        };
        self.counts.resize(n, 0);
        for &t in window {
            if let Some(c) = self.counts.get_mut(t as usize) {
                *c += 1;
            }
        }
        let (rep, pres, freq) = (
            self.params.repetition_penalty,
            self.params.presence_penalty,
            self.params.frequency_penalty,
        );
        for &t in window {
            let t = t as usize;
            if t >= n || self.counts[t] == 0 {
                continue; // out of vocab, or already penalised
            }
            let count = std::mem::take(&mut self.counts[t]);
            let mut l = self.logits[t];
            if rep != 1.0 {
                l = if l > 0.0 { l / rep } else { l * rep };
            }
            l -= count as f32 * freq + pres;
            self.logits[t] = sanitize(l);
        }
    }

    /// Steps 3–5: build `self.cands` from `self.logits`.
    fn filter(&mut self) {
        self.cands.clear();
        self.cands.extend(
            self.logits
                .iter()
                .enumerate()
                .filter(|(_, &l)| l > f32::NEG_INFINITY)
                .map(|(i, &l)| (i as u32, l)),
        );
        let len = self.cands.len();
        let k = self.params.top_k;
        let mut sorted = false;
        if k > 0 && k < len {
            self.cands.select_nth_unstable_by(k - 1, cand_order);
            self.cands.truncate(k);
            self.cands.sort_unstable_by(cand_order);
            sorted = true;
        }
        self.top_p(sorted);
        self.min_p();
    }

    /// Keep the smallest prefix (by probability) whose mass is >= top_p,
    /// probabilities being the softmax over the current candidates; ties at
    /// the boundary go to the lower token id.
    fn top_p(&mut self, sorted: bool) {
        let p = self.params.top_p;
        let len = self.cands.len();
        if p.is_nan() || p >= 1.0 || len <= 1 {
            return;
        }
        let (max, min) = self
            .cands
            .iter()
            .fold((f32::NEG_INFINITY, f32::INFINITY), |(hi, lo), &(_, l)| {
                (hi.max(l), lo.min(l))
            });
        if sorted || len <= 512 || max - min <= 0.0 {
            if !sorted {
                self.cands.sort_unstable_by(cand_order);
            }
            let z: f64 = self.cands.iter().map(|&(_, l)| weight(l, max)).sum();
            self.keep_prefix_reaching(0, 0.0, p as f64 * z);
            return;
        }
        // Large vocabulary: rather than sorting ~150k entries, bucket the
        // logits (bucket 0 holds the largest), find the bucket where the
        // cumulative mass crosses p, keep every bucket above it and sort only
        // that one. The bucket index is monotone in the logit, so this keeps
        // exactly what a full sort would.
        let scale = NBUCKETS as f32 / (max - min); // 0 if the range overflows: one bucket
        let bucket = |l: f32| (((max - l) * scale) as usize).min(NBUCKETS - 1);
        self.bucket_mass.clear();
        self.bucket_mass.resize(NBUCKETS, 0.0);
        for &(_, l) in &self.cands {
            self.bucket_mass[bucket(l)] += weight(l, max);
        }
        let z: f64 = self.bucket_mass.iter().sum();
        let target = p as f64 * z;
        let (mut cut, mut mass_above) = (NBUCKETS - 1, 0.0);
        for (b, &m) in self.bucket_mass.iter().enumerate() {
            if mass_above + m >= target {
                cut = b;
                break;
            }
            mass_above += m;
        }
        // Move buckets < cut to the front, then bucket == cut after them.
        let mut front = 0;
        for j in 0..len {
            if bucket(self.cands[j].1) < cut {
                self.cands.swap(front, j);
                front += 1;
            }
        }
        let start = front;
        for j in start..len {
            if bucket(self.cands[j].1) == cut {
                self.cands.swap(front, j);
                front += 1;
            }
        }
        self.cands.truncate(front);
        self.cands[start..].sort_unstable_by(cand_order);
        self.keep_prefix_reaching(start, mass_above, target);
    }

    /// `cands[from..]` is sorted and `cands[..from]` (mass `mass_before`) is
    /// kept: keep the shortest prefix whose cumulative mass reaches `target`.
    fn keep_prefix_reaching(&mut self, from: usize, mass_before: f64, target: f64) {
        let max = max_logit(&self.cands);
        let mut cum = mass_before;
        for i in from..self.cands.len() {
            cum += weight(self.cands[i].1, max);
            if cum >= target {
                self.cands.truncate(i + 1);
                return;
            }
        }
        // not reached (rounding): keep everything
    }

    /// Keep tokens with p >= min_p * p_max, i.e. l >= l_max + ln(min_p).
    fn min_p(&mut self) {
        let mp = self.params.min_p;
        if mp.is_nan() || mp <= 0.0 || self.cands.len() <= 1 {
            return;
        }
        let max = max_logit(&self.cands);
        let threshold = if mp >= 1.0 { max } else { max + mp.ln() };
        self.cands.retain(|&(_, l)| l >= threshold);
    }

    /// Steps 6–7: temperature, then a draw from the softmax over `self.cands`.
    fn draw(&mut self, fallback: u32) -> u32 {
        self.tempered_weights();
        let total: f64 = self.weights.iter().sum();
        if !(total > 0.0 && total.is_finite()) {
            return fallback;
        }
        self.pick(total, fallback)
    }

    /// Step 6: `self.weights[i] = exp((l_i - max) / t)` over `self.cands`.
    fn tempered_weights(&mut self) {
        let t = self.params.temperature;
        let max = max_logit(&self.cands);
        self.weights.clear();
        self.weights.extend(
            self.cands
                .iter()
                .map(|&(_, l)| ((l - max) / t).exp() as f64),
        );
    }

    /// 53 random bits → [0, 1); done by hand so the stream depends only on ChaCha8, not on
    /// `rand`'s float conversion.
    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Step 7: a candidate drawn with probability `weights[i] / total`.
    fn pick(&mut self, total: f64, fallback: u32) -> u32 {
        let target = self.uniform() * total;
        let mut cum = 0.0;
        let mut last = fallback;
        for (&(id, _), &w) in self.cands.iter().zip(&self.weights) {
            if w > 0.0 {
                cum += w;
                last = id;
                if target < cum {
                    return id;
                }
            }
        }
        last
    }
}

/// Descending logit, ties broken by ascending token id.
fn cand_order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

const NBUCKETS: usize = 1024;

/// Unnormalised probability `exp(l - max)`: f32 `exp` (fast), summed in f64.
fn weight(l: f32, max: f32) -> f64 {
    (l - max).exp() as f64
}

fn max_logit(cands: &[(u32, f32)]) -> f32 {
    cands.iter().fold(f32::NEG_INFINITY, |m, &(_, l)| m.max(l))
}

fn sanitize(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l
    }
}

/// Index of the largest logit; the first one on ties (like `torch.argmax`
/// and llama.cpp's greedy sampler). NaN counts as `-inf`; if nothing beats
/// `-inf` (or `logits` is empty) the answer is 0. Never panics.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// `ln Σ exp(l)` over `logits` (NaN counts as `-inf`), computed stably in f64.
/// `-inf` if every logit is `-inf`; `+inf` if any is `+inf`.
pub fn logsumexp(logits: &[f32]) -> f32 {
    let norm = Normalizer::of(logits);
    if norm.max.is_finite() {
        (norm.max as f64 + norm.ln_sum) as f32
    } else {
        norm.max
    }
}

/// What turns a logit into a logprob: `lse = max + ln_sum`, kept apart so
/// that `l - lse` does not lose precision for large logits; and how many
/// logits are `+inf` (which then share all the mass).
#[derive(Clone, Copy)]
struct Normalizer {
    max: f32,
    ln_sum: f64,
    n_pos_inf: usize,
}

impl Normalizer {
    fn of(logits: &[f32]) -> Self {
        let max = logits
            .iter()
            .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
        let (ln_sum, n_pos_inf) = if max == f32::INFINITY {
            let k = logits.iter().filter(|&&l| l == f32::INFINITY).count();
            ((k as f64).ln(), k)
        } else if max == f32::NEG_INFINITY {
            (0.0, 0)
        } else {
            let s: f64 = logits
                .iter()
                .filter(|l| !l.is_nan())
                .map(|&l| weight(l, max))
                .sum();
            (s.ln(), 0)
        };
        Self {
            max,
            ln_sum,
            n_pos_inf,
        }
    }

    fn logprob(self, l: f32) -> f32 {
        if self.n_pos_inf > 0 {
            if l == f32::INFINITY {
                -self.ln_sum as f32
            } else {
                f32::NEG_INFINITY
            }
        } else if l.is_nan() || self.max == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else {
            ((l - self.max) as f64 - self.ln_sum) as f32
        }
    }
}

/// Log-probability of every token under `softmax(logits)`, written in place.
/// NaN counts as `-inf`. If every logit is `-inf` all results are `-inf`; if
/// some are `+inf` they share the mass equally and the rest get `-inf`.
pub fn log_softmax_in_place(logits: &mut [f32]) {
    let norm = Normalizer::of(logits);
    for l in logits.iter_mut() {
        *l = norm.logprob(*l);
    }
}

/// Allocating version of [`log_softmax_in_place`].
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let mut out = logits.to_vec();
    log_softmax_in_place(&mut out);
    out
}

/// Log-probability of `token` under `softmax(logits)` (`-inf` if it is out
/// of range). See [`log_softmax_in_place`] for the non-finite cases.
pub fn token_logprob(logits: &[f32], token: u32) -> f32 {
    match logits.get(token as usize) {
        Some(&l) => Normalizer::of(logits).logprob(l),
        None => f32::NEG_INFINITY,
    }
}

/// The `n` most likely tokens as `(token id, logprob)`, most likely first
/// (ties: lower id first), for OpenAI-style `top_logprobs`.
///
/// Pass the raw model logits for the model's own distribution (what this
/// crate reports, as vLLM does by default: no penalties, bias or
/// temperature), or [`Sampler::processed_logits`] for the post-penalty one.
/// Two passes over the vocabulary; allocates only the `n` results.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (i, &l) in logits.iter().enumerate() {
        let l = sanitize(l);
        if top.len() == n && l <= top[n - 1].1 {
            continue;
        }
        // Insert after every entry >= l, so equal logits keep id order.
        let pos = top.partition_point(|&(_, v)| v >= l);
        top.insert(pos, (i as u32, l));
        top.truncate(n);
    }
    let norm = Normalizer::of(logits);
    for e in &mut top {
        e.1 = norm.logprob(e.1);
    }
    top
}
