//! The server's engine thread: it owns the model and drives lone-core's [`Scheduler`]
//! (`parallel` slots, each with its own `SeqCache`; continuous batching, speculation) step by
//! step. This file only moves sequences between the HTTP side's queue and the scheduler,
//! delivers their events to their channels and keeps the metrics. No HTTP types here.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use lone_core::engine::{AdmitError, Scheduler, Speculator};
pub use lone_core::engine::{Event, GenRequest, TokenOut};
use lone_core::sampler::Sampler;
use lone_core::text::TextIo;
use lone_core::Model;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Slots: sequences decoded together.
    pub parallel: usize,
    /// Sequences that may wait for a slot.
    pub queue: usize,
    /// Context length: prompt + generated tokens of one sequence.
    pub ctx: usize,
    /// Bytes of host memory for prompt-cache snapshots (0: off).
    pub cache_ram: usize,
    /// `--verbose`: one log line per scheduler step.
    pub step_log: Option<super::log::LogConfig>,
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

/// Work that needs the model but is not a generated sequence (embeddings, image encoding), run
/// on the engine thread between steps. A job that returns another runs it after the next step
/// (long work in pieces: running sequences wait at most a piece).
pub struct Job(pub(super) Box<JobFn>);

type JobFn = dyn FnOnce(&Model) -> Option<Job> + Send;

impl Job {
    pub fn new(f: impl FnOnce(&Model) -> Option<Job> + Send + 'static) -> Job {
        Job(Box::new(f))
    }
}

struct State {
    queue: VecDeque<Pending>,
    jobs: VecDeque<Job>,
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
    /// The counters this engine keeps (the model's `/metrics` series).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }
}

impl Engine {
    pub fn start(
        model: Model,
        text: Arc<TextIo>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
        spec: Option<Arc<Speculator>>,
    ) -> std::io::Result<Engine> {
        let parallel = cfg.parallel.max(1);
        metrics.slots.store(parallel as u64, Relaxed);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                jobs: VecDeque::new(),
                free_slots: parallel,
                shutdown: false,
            }),
            wake: Condvar::new(),
            queue_cap: cfg.queue,
            metrics,
        });
        let sh = shared.clone();
        let (ctx, cache_ram, step_log) = (cfg.ctx, cfg.cache_ram, cfg.step_log.clone());
        let thread = std::thread::Builder::new()
            .name("lone-engine".into())
            .spawn(move || {
                let caches = (0..parallel).map(|_| model.new_cache()).collect();
                let mut sched = Scheduler::new(caches, ctx, text.eos_ids.clone(), spec);
                sched.set_prompt_cache(cache_ram);
                let mut w = Worker {
                    sched,
                    txs: (0..parallel).map(|_| None).collect(),
                    model: &model,
                    text: &text,
                    metrics: sh.metrics.clone(),
                    step_log,
                    steps: 0,
                };
                w.run(&sh);
            })?;
        Ok(Engine {
            shared,
            thread: Mutex::new(Some(thread)),
            cfg,
        })
    }
    /// The queue's state, unless the engine is shutting down.
    fn open_state(&self) -> Result<std::sync::MutexGuard<'_, State>, SubmitError> {
        let st = self
            .shared
            .state
            .lock()
            .map_err(|_| SubmitError::ShuttingDown)?;
        if st.shutdown {
            return Err(SubmitError::ShuttingDown);
        }
        Ok(st)
    }

    /// Run `job` on the engine thread between steps.
    pub fn run_job(&self, job: Job) -> Result<(), SubmitError> {
        let mut st = self.open_state()?;
        st.jobs.push_back(job);
        drop(st);
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Queue sequences that share one event channel (the `n` choices of a request). Either
    /// all are queued or none: `QueueFull` when more would wait than `queue` allows.
    pub fn submit(
        &self,
        reqs: Vec<GenRequest>,
        tx: UnboundedSender<Event>,
    ) -> Result<(), SubmitError> {
        let mut st = self.open_state()?;
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

    /// Nothing queued, no job waiting and every slot free (a model that may be unloaded).
    pub fn is_idle(&self) -> bool {
        self.shared.state.lock().is_ok_and(|st| {
            !st.shutdown
                && st.queue.is_empty()
                && st.jobs.is_empty()
                && st.free_slots == self.cfg.parallel.max(1)
        })
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

struct Worker<'t> {
    model: &'t Model,
    text: &'t TextIo,
    sched: Scheduler<'t>,
    /// The event channel of each slot's sequence.
    txs: Vec<Option<UnboundedSender<Event>>>,
    metrics: Arc<Metrics>,
    step_log: Option<super::log::LogConfig>,
    steps: u64,
}

impl<'t> Worker<'t> {
    fn run(&mut self, shared: &Shared) {
        loop {
            // Admit waiting sequences into free slots; sleep while there is nothing to do.
            let (shutdown, jobs) = {
                let Ok(mut st) = shared.state.lock() else {
                    return;
                };
                loop {
                    if st.shutdown || !st.jobs.is_empty() {
                        break;
                    }
                    while self.sched.free_slots() > 0 {
                        let Some(p) = st.queue.pop_front() else {
                            break;
                        };
                        self.admit(p);
                    }
                    st.free_slots = self.sched.free_slots();
                    self.metrics
                        .queue_depth
                        .store(st.queue.len() as u64, Relaxed);
                    self.update_active();
                    if self.sched.active() > 0 {
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
                let jobs: Vec<Job> = st.jobs.drain(..).collect();
                (st.shutdown, jobs)
            };
            if shutdown {
                self.fail_all("the server is shutting down");
                return;
            }
            let mut later = Vec::new();
            for job in jobs {
                // A job that panics answers nobody (its sender is dropped); the engine goes on.
                let model = self.model;
                if let Ok(Some(next)) = catch_unwind(AssertUnwindSafe(|| (job.0)(model))) {
                    later.push(next);
                }
            }
            if !later.is_empty() {
                match shared.state.lock() {
                    Ok(mut st) => st.jobs.extend(later),
                    Err(_) => return,
                }
            }
            self.drop_cancelled();
            if self.sched.active() == 0 {
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
        let m = &self.metrics;
        m.active_slots.store(self.sched.active() as u64, Relaxed);
        if let Some(pc) = self.sched.prompt_cache() {
            m.prompt_cache_bytes.store(pc.bytes() as u64, Relaxed);
            m.prompt_cache_entries.store(pc.len() as u64, Relaxed);
            m.prompt_cache_hits.store(pc.hits, Relaxed);
        }
    }

    /// Free the slots whose client went away.
    fn drop_cancelled(&mut self) {
        for (i, tx) in self.txs.iter_mut().enumerate() {
            if tx.as_ref().is_some_and(|t| t.is_closed()) {
                *tx = None;
                if self.sched.cancel(i).is_some() {
                    self.metrics.cancelled.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// End every running sequence with an error and reset the caches.
    fn fail_all(&mut self, message: &str) {
        for (slot, index) in self.sched.fail_all() {
            if let Some(tx) = self.txs[slot].take() {
                let _ = tx.send(Event::Error {
                    index,
                    message: message.to_string(),
                });
            }
        }
    }

    /// Hand a queued sequence to the scheduler (it picks the slot with the longest reusable
    /// prefix).
    fn admit(&mut self, p: Pending) {
        if p.tx.is_closed() {
            self.metrics.cancelled.fetch_add(1, Relaxed);
            return;
        }
        let (index, prompt_len) = (p.req.index, p.req.prompt.len());
        let sampler = Sampler::new(p.req.params.clone());
        let decoder = self.text.tokenizer.stream_decoder(!p.req.keep_special);
        match self.sched.admit(p.req, sampler, Some(decoder)) {
            Ok(slot) => {
                self.metrics
                    .prompt_tokens
                    .fetch_add(prompt_len as u64, Relaxed);
                self.metrics
                    .cached_prompt_tokens
                    .fetch_add(self.sched.cached(slot) as u64, Relaxed);
                self.txs[slot] = Some(p.tx);
            }
            Err(AdmitError::BadPrompt(message)) => {
                let _ = p.tx.send(Event::Error { index, message });
            }
            Err(AdmitError::NoFreeSlot) => {
                let _ = p.tx.send(Event::Error {
                    index,
                    message: "no free slot".into(),
                });
            }
        }
    }

    /// One batched forward pass and the sampling after it.
    fn step(&mut self) -> lone_core::Result<()> {
        let txs = &mut self.txs;
        let st = self.sched.step(self.model, &mut |slot, ev| {
            let done = matches!(ev, Event::Done { .. });
            let Some(tx) = &txs[slot] else {
                return false;
            };
            let sent = tx.send(ev).is_ok();
            if done || !sent {
                txs[slot] = None;
            }
            sent
        })?;
        let m = &self.metrics;
        let total = (st.prefill_rows + st.decode_rows).max(1) as u64;
        let ns = st.forward_ns;
        m.steps.fetch_add(1, Relaxed);
        m.prefill_ns
            .fetch_add(ns * st.prefill_rows as u64 / total, Relaxed);
        m.decode_ns
            .fetch_add(ns * st.decode_rows as u64 / total, Relaxed);
        m.prefill_tokens.fetch_add(st.prefill_rows as u64, Relaxed);
        m.decode_tokens.fetch_add(st.decode_rows as u64, Relaxed);
        m.generated_tokens.fetch_add(st.generated as u64, Relaxed);
        m.drafted_tokens.fetch_add(st.drafted as u64, Relaxed);
        m.accepted_tokens.fetch_add(st.accepted as u64, Relaxed);
        m.cancelled.fetch_add(st.cancelled as u64, Relaxed);
        self.steps += 1;
        if let Some(log) = &self.step_log {
            log.line(
                "step",
                serde_json::json!({
                    "step": self.steps,
                    "decode_rows": st.decode_rows,
                    "prefill_rows": st.prefill_rows,
                    "drafted": st.drafted,
                    "accepted": st.accepted,
                    "generated": st.generated,
                    "forward_ms": (st.forward_ns as f64 / 1e4).round() / 100.0,
                    "active": self.sched.active(),
                    "queued": m.queue_depth.load(Relaxed),
                }),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use lone_core::engine::{FinishReason, PREFILL_BUDGET};
    use lone_core::sampler::SamplingParams;
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
        start_spec(name, parallel, queue, None)
    }

    fn start_cached(name: &str, parallel: usize, cache_ram: usize) -> (Engine, Arc<Metrics>) {
        start_with(name, parallel, 4, None, cache_ram)
    }

    /// An engine whose sequences speculate with `spec` (a draft model from fixture `draft`).
    fn start_spec(
        name: &str,
        parallel: usize,
        queue: usize,
        spec: Option<(lone_core::engine::SpecParams, Option<&str>)>,
    ) -> (Engine, Arc<Metrics>) {
        start_with(name, parallel, queue, spec, 0)
    }

    fn start_with(
        name: &str,
        parallel: usize,
        queue: usize,
        spec: Option<(lone_core::engine::SpecParams, Option<&str>)>,
        cache_ram: usize,
    ) -> (Engine, Arc<Metrics>) {
        let path = fixture(name);
        let model = Model::load(&path).unwrap();
        let text = Arc::new(TextIo::load(&model, &path).unwrap());
        let spec = spec.map(|(p, draft)| {
            let d = draft.map(|d| Model::load(&fixture(d)).unwrap());
            Arc::new(
                Speculator::new(p, &model, &text.tokenizer, d.map(|d| (d, &text.tokenizer)))
                    .unwrap(),
            )
        });
        let metrics = Arc::new(Metrics::default());
        let cfg = EngineConfig {
            parallel,
            queue,
            ctx: 2048,
            cache_ram,
            step_log: None,
        };
        (
            Engine::start(model, text, cfg, metrics.clone(), spec).unwrap(),
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
            ..Default::default()
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

    /// Submit sequences indexed 0..n on one channel; the tokens of each.
    fn run_all(e: &Engine, reqs: Vec<GenRequest>) -> Vec<Vec<u32>> {
        let n = reqs.len();
        let (tx, mut rx) = unbounded_channel();
        e.submit(reqs, tx).unwrap();
        let mut got = vec![Vec::new(); n];
        let mut done = 0;
        while done < n {
            match rx.blocking_recv().unwrap() {
                Event::Delta { index, tokens, .. } => {
                    got[index].extend(tokens.iter().map(|t| t.id))
                }
                Event::Done { .. } => done += 1,
                Event::Error { message, .. } => panic!("{message}"),
            }
        }
        got
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

    /// One slot, two conversations taking turns: each returning conversation starts from its
    /// snapshot (prefills only its new turn) and generates what an uncached engine does.
    #[test]
    fn prompt_cache_resumes_evicted_conversations() {
        for name in ["lfm2_a", "lfm3", "qwen2"] {
            let (e, m) = start_cached(name, 1, 64 << 20);
            let (plain, _) = start(name, 1, 4);
            let base = json_ids(name, "prompt_ids.json");
            let mut convs: Vec<Vec<u32>> =
                vec![base.clone(), base[1..].iter().rev().copied().collect()];
            for turn in 0..3 {
                for (ci, conv) in convs.iter_mut().enumerate() {
                    let o = run_one(&e, greedy(conv, 12));
                    let want = run_one(&plain, greedy(conv, 12));
                    assert_eq!(
                        o.tokens, want.tokens,
                        "{name} conversation {ci} turn {turn}"
                    );
                    if turn > 0 {
                        // All but the new turn (3 tokens) came from the snapshot of the reply
                        // (or of the prompt, up to the rollback window).
                        assert!(
                            o.cached + 3 >= conv.len() - 1,
                            "{name} conv {ci} turn {turn}: cached {} of {}",
                            o.cached,
                            conv.len()
                        );
                    }
                    conv.extend(&o.tokens);
                    conv.extend([1, 2, 3]);
                }
            }
            let metrics = m.render();
            assert!(
                metrics.contains("lone_prompt_cache_hits_total 4"),
                "{metrics}"
            );
            e.shutdown();
            plain.shutdown();
        }
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
        let reqs = (0..3)
            .map(|i| GenRequest {
                index: i,
                ..greedy(&p, want.len())
            })
            .collect();
        let got = run_all(&e, reqs);
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

    /// Each slot speculates on its own and all verify rows share one forward pass: greedy
    /// output equals plain decoding alone, and /metrics counts the drafts.
    #[test]
    fn speculative_batched_greedy_equals_plain_alone() {
        use lone_core::engine::{SpecParams, SpecTypes};
        for (name, draft) in [("lfm2_a", None), ("lfm3", Some("lfm2_b")), ("qwen2", None)] {
            let p = json_ids(name, "prompt_ids.json");
            let twice: Vec<u32> = p.iter().chain(&p).copied().collect();
            let prompts = [twice.clone(), p.clone(), twice[3..].to_vec()];
            let solo: Vec<Vec<u32>> = {
                let (e, _) = start(name, 1, 8);
                prompts
                    .iter()
                    .map(|q| run_one(&e, greedy(q, 40)).tokens)
                    .collect()
            };
            let spec = SpecParams {
                types: SpecTypes {
                    ngram_simple: true,
                    // Where ngram-simple (n = 1) finds nothing.
                    ngram_cache: name == "qwen2",
                    draft: draft.is_some(),
                },
                ngram_n: 1,
                ngram_m: 6,
                draft_max: 4,
                ..Default::default()
            };
            let (e, m) = start_spec(name, 3, 8, Some((spec, draft)));
            let reqs = prompts
                .iter()
                .enumerate()
                .map(|(i, q)| GenRequest {
                    index: i,
                    ..greedy(q, 40)
                })
                .collect();
            let got = run_all(&e, reqs);
            assert_eq!(got, solo, "{name}");
            assert!(m.drafted_tokens.load(Relaxed) > 0, "{name}");
            assert!(m.render().contains("lone_draft_acceptance_rate"));
        }
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
        let got = run_all(
            &e,
            vec![
                GenRequest { index: 0, ..req(1) },
                GenRequest { index: 1, ..req(2) },
            ],
        );
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
