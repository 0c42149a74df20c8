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
    ) -> Engine {
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
            })
            .expect("spawn engine thread");
        Engine {
            shared,
            thread: Mutex::new(Some(thread)),
            cfg,
        }
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
