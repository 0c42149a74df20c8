//! The batching scheduler: one thread owns the model and `parallel` slots, each with its own
//! `SeqCache`. Every step builds one `Batch` with a row for each decoding slot plus chunks of
//! the prompts of newly admitted sequences, runs one forward pass, and samples each slot's
//! next token with its own `Sampler`. Sequences join between steps and leave as soon as they
//! finish or their client goes away (continuous batching). No HTTP types here.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use lone_core::cache::SeqCache;
use lone_core::generate::FinishReason;
use lone_core::sampler::{self, Sampler, SamplingParams};
use lone_core::text::TextIo;
use lone_core::tokenizer::StreamDecoder;
use lone_core::{Batch, Model};
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use super::stop::StopMatcher;

/// Most prompt rows added to one step (bounds the latency prefill adds to running decodes).
pub const PREFILL_BUDGET: usize = 256;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Slots: sequences decoded together.
    pub parallel: usize,
    /// Sequences that may wait for a slot.
    pub queue: usize,
    /// Context length: prompt + generated tokens of one sequence.
    pub ctx: usize,
}

/// One sequence to generate.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (EOS not counted).
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Generation ends before the first occurrence of any of these; no text at or past it is
    /// ever sent.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// `Some(k)`: report each sampled token's logprob and the `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Tag copied to this sequence's events (the choice index).
    pub index: usize,
}

/// A generated token (and its logprobs when asked for).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text (possibly empty while it is held back for stop strings) and the tokens
    /// sampled since the last event.
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
    },
    Error {
        index: usize,
        message: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull,
    ShuttingDown,
}

struct Pending {
    req: GenRequest,
    tx: UnboundedSender<Event>,
}

struct State {
    queue: VecDeque<Pending>,
    free_slots: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    queue_cap: usize,
    metrics: Arc<Metrics>,
}

/// Handle to the engine thread.
pub struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub cfg: EngineConfig,
}

impl Engine {
    pub fn start(
        model: Model,
        text: Arc<TextIo>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Engine> {
        let parallel = cfg.parallel.max(1);
        metrics.slots.store(parallel as u64, Relaxed);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                free_slots: parallel,
                shutdown: false,
            }),
            wake: Condvar::new(),
            queue_cap: cfg.queue,
            metrics,
        });
        let sh = shared.clone();
        let ctx = cfg.ctx;
        let thread = std::thread::Builder::new()
            .name("lone-engine".into())
            .spawn(move || {
                let eos = text.eos_ids.clone();
                let mut w = Worker {
                    caches: (0..parallel).map(|_| model.new_cache()).collect(),
                    slots: (0..parallel).map(|_| None).collect(),
                    model,
                    text: &text,
                    eos,
                    ctx,
                    metrics: sh.metrics.clone(),
                    admitted: 0,
                };
                w.run(&sh);
            })?;
        Ok(Engine {
            shared,
            thread: Mutex::new(Some(thread)),
            cfg,
        })
    }

    /// Queue sequences that share one event channel (the `n` choices of a request). Either
    /// all are queued or none: `QueueFull` when more would wait than `queue` allows.
    pub fn submit(
        &self,
        reqs: Vec<GenRequest>,
        tx: UnboundedSender<Event>,
    ) -> Result<(), SubmitError> {
        let mut st = self
            .shared
            .state
            .lock()
            .map_err(|_| SubmitError::ShuttingDown)?;
        if st.shutdown {
            return Err(SubmitError::ShuttingDown);
        }
        let waiting = (st.queue.len() + reqs.len()).saturating_sub(st.free_slots);
        if waiting > self.shared.queue_cap {
            return Err(SubmitError::QueueFull);
        }
        for req in reqs {
            st.queue.push_back(Pending {
                req,
                tx: tx.clone(),
            });
        }
        self.shared
            .metrics
            .queue_depth
            .store(st.queue.len() as u64, Relaxed);
        drop(st);
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Stop the engine: queued and running sequences get an error event; waits for the thread.
    pub fn shutdown(&self) {
        if let Ok(mut st) = self.shared.state.lock() {
            st.shutdown = true;
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A running sequence.
struct Active<'t> {
    req: GenRequest,
    tx: UnboundedSender<Event>,
    sampler: Sampler,
    /// Prompt + generated tokens (what the penalties look at).
    history: Vec<u32>,
    generated: usize,
    cached: usize,
    /// The token sampled last, to feed in the next step (None while prefilling).
    next: Option<u32>,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    /// Admission order (prefill is first come, first served).
    order: u64,
}

struct Worker<'t> {
    model: Model,
    text: &'t TextIo,
    caches: Vec<SeqCache>,
    slots: Vec<Option<Active<'t>>>,
    eos: Vec<u32>,
    ctx: usize,
    metrics: Arc<Metrics>,
    admitted: u64,
}

impl<'t> Worker<'t> {
    fn run(&mut self, shared: &Shared) {
        loop {
            // Admit waiting sequences into free slots; sleep while there is nothing to do.
            let shutdown = {
                let Ok(mut st) = shared.state.lock() else {
                    return;
                };
                loop {
                    if st.shutdown {
                        break;
                    }
                    while self.slots.iter().any(Option::is_none) {
                        let Some(p) = st.queue.pop_front() else {
                            break;
                        };
                        self.admit(p);
                    }
                    st.free_slots = self.slots.iter().filter(|s| s.is_none()).count();
                    self.metrics
                        .queue_depth
                        .store(st.queue.len() as u64, Relaxed);
                    self.update_active();
                    if self.slots.iter().any(Option::is_some) {
                        break;
                    }
                    st = match shared.wake.wait(st) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                }
                if st.shutdown {
                    for p in st.queue.drain(..) {
                        let _ = p.tx.send(Event::Error {
                            index: p.req.index,
                            message: "the server is shutting down".into(),
                        });
                    }
                }
                st.shutdown
            };
            if shutdown {
                self.fail_all("the server is shutting down");
                return;
            }
            self.drop_cancelled();
            if self.slots.iter().all(Option::is_none) {
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| self.step())) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.fail_all(&format!("inference failed: {e}")),
                Err(_) => self.fail_all("internal error in the inference engine"),
            }
            self.update_active();
        }
    }

    fn update_active(&self) {
        let n = self.slots.iter().filter(|s| s.is_some()).count();
        self.metrics.active_slots.store(n as u64, Relaxed);
    }

    /// Free the slots whose client went away.
    fn drop_cancelled(&mut self) {
        for s in &mut self.slots {
            if s.as_ref().is_some_and(|a| a.tx.is_closed()) {
                *s = None;
                self.metrics.cancelled.fetch_add(1, Relaxed);
            }
        }
    }

    /// End every running sequence with an error and reset the caches (their state may be
    /// inconsistent after a failed step).
    fn fail_all(&mut self, message: &str) {
        for (s, c) in self.slots.iter_mut().zip(&mut self.caches) {
            if let Some(a) = s.take() {
                let _ = a.tx.send(Event::Error {
                    index: a.req.index,
                    message: message.to_string(),
                });
            }
            c.clear();
        }
    }

    /// Put a queued sequence into the free slot whose cache shares the longest prefix with
    /// its prompt; only the rest of the prompt will be prefilled.
    fn admit(&mut self, p: Pending) {
        if p.tx.is_closed() {
            self.metrics.cancelled.fetch_add(1, Relaxed);
            return;
        }
        let prompt = &p.req.prompt;
        if prompt.is_empty() || prompt.len() >= self.ctx {
            let _ = p.tx.send(Event::Error {
                index: p.req.index,
                message: format!(
                    "the prompt has {} tokens; it must have between 1 and {} (the context is {})",
                    prompt.len(),
                    self.ctx - 1,
                    self.ctx
                ),
            });
            return;
        }
        let usable = |c: &SeqCache| {
            let keep = c.common_prefix(prompt).min(prompt.len() - 1);
            if c.can_truncate(keep) {
                keep
            } else {
                0
            }
        };
        let Some(slot) = (0..self.slots.len())
            .filter(|&i| self.slots[i].is_none())
            .max_by_key(|&i| (usable(&self.caches[i]), std::cmp::Reverse(i)))
        else {
            return;
        };
        let cache = &mut self.caches[slot];
        let keep = cache.common_prefix(prompt).min(prompt.len() - 1);
        if !cache.truncate(keep) {
            cache.clear();
        }
        let cached = cache.len();
        self.metrics
            .prompt_tokens
            .fetch_add(prompt.len() as u64, Relaxed);
        self.metrics
            .cached_prompt_tokens
            .fetch_add(cached as u64, Relaxed);
        self.admitted += 1;
        self.slots[slot] = Some(Active {
            sampler: Sampler::new(p.req.params.clone()),
            history: prompt.clone(),
            stop: StopMatcher::new(p.req.stop.clone()),
            req: p.req,
            tx: p.tx,
            generated: 0,
            cached,
            next: None,
            decoder: self.text.stream(),
            order: self.admitted,
        });
    }

    /// One batched forward pass and the sampling after it.
    fn step(&mut self) -> lone_core::Result<()> {
        let mut batch = Batch::default();
        // The slot of each row that wants logits, in batch order.
        let mut owners = Vec::new();
        let mut n_decode = 0usize;
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(tok) = s.as_ref().and_then(|a| a.next) {
                batch.push(i, self.caches[i].len(), tok, true);
                owners.push(i);
                n_decode += 1;
            }
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
        let mut budget = PREFILL_BUDGET;
        let mut n_prefill = 0usize;
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
                batch.push(i, start + j, tok, last);
                if last {
                    owners.push(i);
                }
            }
            budget -= n;
            n_prefill += n;
        }
        if batch.is_empty() {
            return Ok(());
        }
        // A step of mid-prompt chunks wants no logits, but `Model::forward` needs at least one
        // logits row (its lm_head matmul panics on zero rows): ask for one and ignore it.
        let spare = owners.is_empty();
        if spare {
            if let Some(l) = batch.logits.last_mut() {
                *l = true;
            }
        }
        let t0 = Instant::now();
        let out = self.model.forward(&batch, &mut self.caches)?;
        let ns = t0.elapsed().as_nanos() as u64;
        let total = (n_decode + n_prefill) as u64;
        let m = &self.metrics;
        m.steps.fetch_add(1, Relaxed);
        m.prefill_ns
            .fetch_add(ns * n_prefill as u64 / total, Relaxed);
        m.decode_ns.fetch_add(ns * n_decode as u64 / total, Relaxed);
        m.prefill_tokens.fetch_add(n_prefill as u64, Relaxed);
        m.decode_tokens.fetch_add(n_decode as u64, Relaxed);
        let v = self.model.cfg.vocab_size;
        if spare {
            return Ok(());
        }
        for (k, &slot) in owners.iter().enumerate() {
            self.on_logits(slot, &out.logits[k * v..(k + 1) * v]);
        }
        Ok(())
    }

    /// Sample slot `i`'s next token and send what it adds.
    fn on_logits(&mut self, i: usize, logits: &[f32]) {
        let Some(a) = self.slots[i].as_mut() else {
            return;
        };
        let tok = a.sampler.sample(logits, &a.history);
        if !a.req.ignore_eos && self.eos.contains(&tok) {
            self.finish(i, FinishReason::Stop, true);
            return;
        }
        let out = TokenOut {
            id: tok,
            logprob: a.req.logprobs.map(|_| sampler::token_logprob(logits, tok)),
            top: a
                .req
                .logprobs
                .map(|k| sampler::top_logprobs(logits, k))
                .unwrap_or_default(),
        };
        a.generated += 1;
        a.history.push(tok);
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        let piece = a.decoder.push(tok).ok().flatten().unwrap_or_default();
        let (text, stopped) = a.stop.push(&piece);
        let sent = a.tx.send(Event::Delta {
            index: a.req.index,
            text,
            tokens: vec![out],
        });
        if sent.is_err() {
            self.slots[i] = None;
            self.metrics.cancelled.fetch_add(1, Relaxed);
        } else if stopped {
            self.finish(i, FinishReason::Stop, false);
        } else if a.generated >= a.req.max_tokens || a.history.len() >= self.ctx {
            self.finish(i, FinishReason::Length, true);
        } else {
            a.next = Some(tok);
        }
    }

    /// End slot `i`'s sequence: flush held-back text (`flush`), send `Done`, free the slot.
    fn finish(&mut self, i: usize, mut finish: FinishReason, flush: bool) {
        let Some(mut a) = self.slots[i].take() else {
            return;
        };
        if flush {
            let rest = a.decoder.finish().ok().flatten().unwrap_or_default();
            let (mut text, stopped) = a.stop.push(&rest);
            if stopped {
                finish = FinishReason::Stop;
            } else {
                text.push_str(&a.stop.finish());
            }
            if !text.is_empty() {
                let _ = a.tx.send(Event::Delta {
                    index: a.req.index,
                    text,
                    tokens: Vec::new(),
                });
            }
        }
        let _ = a.tx.send(Event::Done {
            index: a.req.index,
            finish,
            prompt_tokens: a.req.prompt.len(),
            completion_tokens: a.generated,
            cached_tokens: a.cached,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/reference/fixtures")
            .join(name)
    }

    fn json_ids(name: &str, file: &str) -> Vec<u32> {
        let s = std::fs::read_to_string(fixture(name).join(file)).unwrap();
        serde_json::from_str(&s).unwrap()
    }

    fn start(name: &str, parallel: usize, queue: usize) -> (Engine, Arc<Metrics>) {
        let path = fixture(name);
        let model = Model::load(&path).unwrap();
        let text = Arc::new(TextIo::load(&model, &path).unwrap());
        let metrics = Arc::new(Metrics::default());
        let cfg = EngineConfig {
            parallel,
            queue,
            ctx: 2048,
        };
        (
            Engine::start(model, text, cfg, metrics.clone()).unwrap(),
            metrics,
        )
    }

    fn greedy(prompt: &[u32], max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt: prompt.to_vec(),
            max_tokens,
            params: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: true,
            logprobs: None,
            index: 0,
        }
    }

    #[derive(Debug, Default, PartialEq)]
    struct Out {
        tokens: Vec<u32>,
        text: String,
        finish: Option<FinishReason>,
        completion_tokens: usize,
        cached: usize,
        logprobs: Vec<TokenOut>,
    }

    fn collect(rx: &mut UnboundedReceiver<Event>) -> Out {
        let mut o = Out::default();
        while let Some(ev) = rx.blocking_recv() {
            match ev {
                Event::Delta { text, tokens, .. } => {
                    o.text.push_str(&text);
                    o.tokens.extend(tokens.iter().map(|t| t.id));
                    o.logprobs.extend(tokens);
                }
                Event::Done {
                    finish,
                    completion_tokens,
                    cached_tokens,
                    ..
                } => {
                    o.finish = Some(finish);
                    o.completion_tokens = completion_tokens;
                    o.cached = cached_tokens;
                    break;
                }
                Event::Error { message, .. } => panic!("engine error: {message}"),
            }
        }
        o
    }

    fn run_one(e: &Engine, req: GenRequest) -> Out {
        let (tx, mut rx) = unbounded_channel();
        e.submit(vec![req], tx).unwrap();
        collect(&mut rx)
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("timed out waiting for {what}");
    }

    #[test]
    fn greedy_matches_transformers() {
        for name in ["lfm2_a", "llama", "lfm3"] {
            let (e, _) = start(name, 2, 4);
            let want = json_ids(name, "greedy.json");
            let o = run_one(&e, greedy(&json_ids(name, "prompt_ids.json"), want.len()));
            assert_eq!(o.tokens, want, "{name}");
            assert_eq!(o.finish, Some(FinishReason::Length));
            assert_eq!(o.completion_tokens, want.len());
        }
    }

    /// Prompts of several lengths (one longer than a prefill chunk), run alone and then all
    /// together, some joining while others decode: greedy tokens must be identical.
    #[test]
    fn batched_greedy_equals_single() {
        for name in ["lfm2_a", "lfm3", "llama"] {
            let p = json_ids(name, "prompt_ids.json");
            let long: Vec<u32> = (0..PREFILL_BUDGET as u32 + 50)
                .map(|i| (i * 37 + 11) % 500 + 3)
                .collect();
            let prompts: Vec<Vec<u32>> = vec![
                p.clone(),
                p[..5].to_vec(),
                p.iter().rev().copied().collect(),
                long,
                vec![p[0]],
            ];
            let solo: Vec<Vec<u32>> = {
                let (e, _) = start(name, 1, 8);
                prompts
                    .iter()
                    .map(|q| {
                        // A fresh cache each time: no prefix from the previous prompt.
                        run_one(&e, greedy(q, 16)).tokens
                    })
                    .collect()
            };
            let (e, m) = start(name, 4, 8);
            // The first two start together; the rest join while those decode.
            let mut rxs = Vec::new();
            for (i, q) in prompts.iter().enumerate() {
                let (tx, mut rx) = unbounded_channel();
                let mut r = greedy(q, 16);
                r.index = i;
                e.submit(vec![r], tx).unwrap();
                if i >= 1 {
                    // Wait for a first token so later prompts are prefilled next to decodes.
                    if let Some(Event::Delta { tokens, .. }) = rx.blocking_recv() {
                        rxs.push((i, rx, tokens[0].id));
                        continue;
                    }
                    panic!("no first token");
                }
                let first = match rx.blocking_recv() {
                    Some(Event::Delta { tokens, .. }) => tokens[0].id,
                    other => panic!("{other:?}"),
                };
                rxs.push((i, rx, first));
            }
            for (i, mut rx, first) in rxs {
                let mut got = vec![first];
                got.extend(collect(&mut rx).tokens);
                assert_eq!(got, solo[i], "{name}: prompt {i} batched vs alone");
            }
            assert!(m.steps.load(Relaxed) > 0);
        }
    }

    #[test]
    fn several_sequences_in_one_submit() {
        let (e, _) = start("lfm2_a", 4, 8);
        let p = json_ids("lfm2_a", "prompt_ids.json");
        let want = json_ids("lfm2_a", "greedy.json");
        let (tx, mut rx) = unbounded_channel();
        let reqs = (0..3)
            .map(|i| GenRequest {
                index: i,
                ..greedy(&p, want.len())
            })
            .collect();
        e.submit(reqs, tx).unwrap();
        let mut got = vec![Vec::new(); 3];
        let mut done = 0;
        while done < 3 {
            match rx.blocking_recv().unwrap() {
                Event::Delta { index, tokens, .. } => {
                    got[index].extend(tokens.iter().map(|t| t.id))
                }
                Event::Done { .. } => done += 1,
                Event::Error { message, .. } => panic!("{message}"),
            }
        }
        for g in got {
            assert_eq!(g, want);
        }
    }

    #[test]
    fn prefix_reuse_only_prefills_the_suffix() {
        for name in ["lfm2_a", "lfm3"] {
            let p = json_ids(name, "prompt_ids.json");
            let (e, m) = start(name, 2, 4);
            let first = run_one(&e, greedy(&p[..12], 4));
            assert_eq!(first.cached, 0);
            let q: Vec<u32> = p.iter().copied().chain([7, 8, 9]).collect();
            let o = run_one(&e, greedy(&q, 10));
            assert_eq!(o.cached, 12, "{name}");
            assert_eq!(m.cached_prompt_tokens.load(Relaxed), 12);
            let (fresh, _) = start(name, 1, 1);
            assert_eq!(o.tokens, run_one(&fresh, greedy(&q, 10)).tokens, "{name}");
            // The same prompt again reuses all but its last token.
            let again = run_one(&e, greedy(&q, 10));
            assert_eq!(again.cached, q.len() - 1);
            assert_eq!(again.tokens, o.tokens);
        }
    }

    #[test]
    fn cancellation_frees_the_slot() {
        let (e, m) = start("lfm2_a", 1, 4);
        let p = json_ids("lfm2_a", "prompt_ids.json");
        let (tx, mut rx) = unbounded_channel();
        e.submit(vec![greedy(&p, 1500)], tx).unwrap();
        for _ in 0..3 {
            assert!(matches!(rx.blocking_recv(), Some(Event::Delta { .. })));
        }
        assert_eq!(m.active_slots.load(Relaxed), 1);
        drop(rx);
        wait_for("the slot to be freed", || {
            m.active_slots.load(Relaxed) == 0 && m.cancelled.load(Relaxed) == 1
        });
        // Counted as cancelled (not finished): it stopped before its 1500 tokens. How many it
        // generated before noticing depends on the kernels' speed, so no tighter bound.
        assert!(m.generated_tokens.load(Relaxed) < 1500);
        let want = json_ids("lfm2_a", "greedy.json");
        assert_eq!(run_one(&e, greedy(&p, want.len())).tokens, want);
    }

    #[test]
    fn full_queue_is_refused() {
        let (e, m) = start("lfm2_a", 1, 1);
        let p = json_ids("lfm2_a", "prompt_ids.json");
        let (tx_a, mut rx_a) = unbounded_channel();
        e.submit(vec![greedy(&p, 1500)], tx_a).unwrap();
        assert!(matches!(rx_a.blocking_recv(), Some(Event::Delta { .. })));
        let (tx_b, mut rx_b) = unbounded_channel();
        e.submit(vec![greedy(&p, 4)], tx_b).unwrap();
        assert_eq!(m.queue_depth.load(Relaxed), 1);
        let (tx_c, _rx_c) = unbounded_channel();
        assert_eq!(
            e.submit(vec![greedy(&p, 4)], tx_c.clone()),
            Err(SubmitError::QueueFull)
        );
        // Two sequences at once never fit in a queue of one.
        drop(rx_a);
        let b = collect(&mut rx_b);
        assert_eq!(b.tokens.len(), 4);
        wait_for("an idle engine", || m.active_slots.load(Relaxed) == 0);
        assert_eq!(
            e.submit(vec![greedy(&p, 1), greedy(&p, 1), greedy(&p, 1)], tx_c),
            Err(SubmitError::QueueFull)
        );
    }

    #[test]
    fn stop_strings_cut_the_text() {
        let (e, _) = start("lfm2_a", 2, 4);
        let p = json_ids("lfm2_a", "prompt_ids.json");
        let full = run_one(&e, greedy(&p, 24));
        let chars: Vec<char> = full.text.chars().collect();
        assert!(chars.len() > 12, "{:?}", full.text);
        let stop: String = chars[6..9].iter().collect();
        let cut = full.text.find(&stop).unwrap();
        let mut r = greedy(&p, 24);
        r.stop = vec!["never-there".into(), stop.clone()];
        let (tx, mut rx) = unbounded_channel();
        e.submit(vec![r], tx).unwrap();
        let mut streamed = String::new();
        loop {
            match rx.blocking_recv().unwrap() {
                Event::Delta { text, .. } => {
                    streamed.push_str(&text);
                    // Nothing at or past the stop string is ever sent.
                    assert!(full.text[..cut].starts_with(&streamed), "{streamed:?}");
                }
                Event::Done {
                    finish,
                    completion_tokens,
                    ..
                } => {
                    assert_eq!(finish, FinishReason::Stop);
                    assert!(completion_tokens < 24);
                    break;
                }
                Event::Error { message, .. } => panic!("{message}"),
            }
        }
        assert_eq!(streamed, full.text[..cut]);
    }

    #[test]
    fn eos_max_tokens_and_logprobs() {
        let (e, _) = start("lfm2_a", 2, 4);
        let p = json_ids("lfm2_a", "prompt_ids.json");
        let want = json_ids("lfm2_a", "greedy.json");
        // Make the 4th greedy token the EOS: generation stops before it.
        let mut r = greedy(&p, 24);
        r.ignore_eos = false;
        r.params.logit_bias = vec![(2, 0.0)];
        let o = run_one(&e, r);
        assert_eq!(o.tokens, want, "bias 0 changes nothing");
        let mut r = greedy(&p, 24);
        r.ignore_eos = false;
        r.params.logit_bias = vec![(2, 100.0)];
        let o = run_one(&e, r);
        assert_eq!(o.finish, Some(FinishReason::Stop));
        assert_eq!(o.completion_tokens, 0);
        assert!(o.tokens.is_empty());
        let mut r = greedy(&p, 5);
        r.logprobs = Some(3);
        let o = run_one(&e, r);
        assert_eq!(o.finish, Some(FinishReason::Length));
        assert_eq!(o.tokens, want[..5]);
        for t in &o.logprobs {
            assert_eq!(t.top.len(), 3);
            assert_eq!(t.top[0].0, t.id);
            assert_eq!(t.top[0].1, t.logprob.unwrap());
            assert!(t.top[0].1 >= t.top[1].1 && t.top[1].1 >= t.top[2].1);
            assert!(t.logprob.unwrap() <= 0.0);
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_batch_independent() {
        let (e, _) = start("lfm2_a", 3, 4);
        let p = json_ids("lfm2_a", "prompt_ids.json");
        let req = |seed| GenRequest {
            params: SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..Default::default()
            },
            ..greedy(&p, 20)
        };
        let a = run_one(&e, req(1));
        let (tx, mut rx) = unbounded_channel();
        e.submit(
            vec![
                GenRequest { index: 0, ..req(1) },
                GenRequest { index: 1, ..req(2) },
            ],
            tx,
        )
        .unwrap();
        let mut got = vec![Vec::new(); 2];
        let mut done = 0;
        while done < 2 {
            match rx.blocking_recv().unwrap() {
                Event::Delta { index, tokens, .. } => {
                    got[index].extend(tokens.iter().map(|t| t.id))
                }
                Event::Done { .. } => done += 1,
                Event::Error { message, .. } => panic!("{message}"),
            }
        }
        assert_eq!(got[0], a.tokens);
        assert_ne!(got[1], a.tokens);
    }

    #[test]
    fn bad_prompts_get_an_error_and_shutdown_ends_everything() {
        let (e, m) = start("lfm2_a", 1, 4);
        let (tx, mut rx) = unbounded_channel();
        e.submit(vec![greedy(&[], 4)], tx).unwrap();
        assert!(matches!(rx.blocking_recv(), Some(Event::Error { .. })));
        let p = json_ids("lfm2_a", "prompt_ids.json");
        let (tx, mut rx) = unbounded_channel();
        e.submit(vec![greedy(&p, 1500), greedy(&p, 4)], tx.clone())
            .unwrap();
        assert!(matches!(rx.blocking_recv(), Some(Event::Delta { .. })));
        e.shutdown();
        let mut errors = 0;
        while let Ok(ev) = rx.try_recv() {
            if matches!(ev, Event::Error { .. }) {
                errors += 1;
            }
        }
        assert_eq!(errors, 2, "the running and the queued sequence");
        assert_eq!(
            e.submit(vec![greedy(&p, 1)], tx),
            Err(SubmitError::ShuttingDown)
        );
        let _ = m;
    }
}
