//! A sequence's logits do not depend on how its rows reached the model, in the default mode
//! (and `--exact`): a prompt continued from a cached prefix, split at any point, or processed
//! in a step shared with another sequence's decoding gives the same logits, bit for bit, as
//! the same prompt prefilled cold and alone. (Before, a short prompt tail took the
//! matrix-vector kernels instead of the GEMM, and a decode row sharing a step with a prompt
//! ran exact instead of 8-bit: greedy output at temperature 0 changed with the cache and the
//! load, e.g. SmolLM2 "What is 2 + 2?" → "The answer is 4." cold, "The answer to this
//! classic math problem is 4." after 37 cached tokens.)
//!
//! References: each case's own cold, alone run. These compare two paths of lone, by design:
//! the property is that they are the same computation.

mod common;

use std::path::{Path, PathBuf};

use lone_core::engine::{Event, GenRequest, Scheduler};
use lone_core::kernels::Mode;
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::text::TextIo;
use lone_core::Model;

fn fixture(name: &str, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/fixtures")
        .join(name)
        .join(file)
}

/// (label, model, a prompt of at least 40 tokens).
fn cases() -> Vec<(String, Model, Vec<u32>)> {
    let mut out = Vec::new();
    {
        let p = common::default_model();
        let m = Model::load(&p).unwrap();
        let t = TextIo::load(&m, &p).unwrap();
        let prompt = t
            .chat_prompt(
                Some("You are a helpful assistant. Answer briefly and precisely."),
                "What is 2 + 2? Explain how you add two numbers, in one sentence.",
            )
            .unwrap();
        out.push(("smollm2-q4_1".to_string(), m, prompt));
    }
    for (fam, file) in [
        ("lfm2_a", "model-q8_0.gguf"),
        ("qwen2", "model-q8_0.gguf"),
        ("lfm3", "model-f32.gguf"),
    ] {
        let m = Model::load(&fixture(fam, file)).unwrap();
        let v = m.cfg.vocab_size as u32;
        // A deterministic prompt of 45 in-vocabulary tokens.
        let prompt = (0..45u32).map(|i| (i * 7919 + 13) % v).collect();
        out.push((format!("{fam}/{file}"), m, prompt));
    }
    out
}

/// One sequence's output: its tokens and the logits each was sampled from.
#[derive(Debug, PartialEq)]
struct Run {
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

fn request(prompt: &[u32], max_tokens: usize) -> GenRequest {
    GenRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        params: SamplingParams::greedy(),
        ignore_eos: true,
        keep_logits: true,
        ..Default::default()
    }
}

/// Steps the scheduler until every admitted sequence is done. `admit_at[k] = (step, slot,
/// request)`: admitted before that step. Returns each request's run, by admission order.
fn drive(m: &Model, sched: &mut Scheduler, admit_at: Vec<(usize, GenRequest)>) -> Vec<Run> {
    let mut pending = admit_at;
    pending.reverse();
    let mut slots = Vec::new();
    let mut tokens: Vec<Vec<u32>> = Vec::new();
    let mut step = 0;
    loop {
        while pending.last().is_some_and(|(s, _)| *s <= step) {
            let (_, mut req) = pending.pop().unwrap();
            req.index = slots.len();
            let sampler = Sampler::new(req.params.clone());
            slots.push(sched.admit(req, sampler, None).unwrap());
            tokens.push(Vec::new());
        }
        if pending.is_empty() && slots.iter().all(|&s| !sched.is_active(s)) {
            break;
        }
        sched
            .step(m, &mut |_, ev| {
                if let Event::Delta {
                    index, tokens: t, ..
                } = ev
                {
                    tokens[index].extend(t.iter().map(|t| t.id));
                }
                true
            })
            .unwrap();
        step += 1;
    }
    slots
        .iter()
        .zip(tokens)
        .map(|(&s, tokens)| Run {
            tokens,
            logits: sched.take_finished(s).unwrap().take_logits(),
        })
        .collect()
}

fn alone(m: &Model, prompt: &[u32], n: usize) -> Run {
    let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), None);
    drive(m, &mut s, vec![(0, request(prompt, n))])
        .pop()
        .unwrap()
}

fn first_difference(a: &Run, b: &Run) -> String {
    let t = a.tokens.iter().zip(&b.tokens).position(|(x, y)| x != y);
    let l = a
        .logits
        .iter()
        .zip(&b.logits)
        .position(|(x, y)| x.to_bits() != y.to_bits());
    format!(
        "tokens {:?} vs {:?} (first difference at {t:?}); first differing logit at {l:?}",
        a.tokens, b.tokens
    )
}

/// Runs `f` on every case in the default and the exact mode; fails with every failure.
fn check_modes(f: impl Fn(&str, &Model, &[u32], &mut Vec<String>)) {
    let mut failures = Vec::new();
    for mode in [Mode::Auto, Mode::Exact] {
        for (label, mut m, prompt) in cases() {
            m.compute.mode = Some(mode);
            f(
                &format!("{label} ({})", mode.name()),
                &m,
                &prompt,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_cached_prefix_gives_the_cold_logits() {
    check_modes(|label, m, prompt, failures| {
        let n = 12;
        let cold = alone(m, prompt, n);
        for cut in [1, 5, 17, 30, prompt.len() - 1] {
            // Slot 0 holds prompt[..cut] (prefilled by a request that generated one token
            // from it, so the cache ends at the cut); the full prompt then reuses it.
            let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), None);
            drive(m, &mut s, vec![(0, request(&prompt[..cut], 1))]);
            let warm = drive(m, &mut s, vec![(0, request(prompt, n))])
                .pop()
                .unwrap();
            assert_eq!(s.caches[0].len(), prompt.len() + n - 1);
            if warm != cold {
                failures.push(format!(
                    "{label}: {cut} cached tokens changed the output: {}",
                    first_difference(&warm, &cold)
                ));
            }
        }
    });
}

#[test]
fn sharing_steps_with_other_sequences_gives_the_alone_logits() {
    check_modes(|label, m, prompt, failures| {
        let n = 10;
        let a = &prompt[..20];
        let b = prompt;
        let (ra, rb) = (alone(m, a, n), alone(m, b, n));
        // B's prompt arrives while A decodes (their rows share steps), then A's second
        // request arrives while B decodes.
        let caches = vec![m.new_cache(), m.new_cache(), m.new_cache()];
        let mut s = Scheduler::new(caches, 1 << 20, Vec::new(), None);
        let runs = drive(
            m,
            &mut s,
            vec![(0, request(a, n)), (3, request(b, n)), (5, request(a, n))],
        );
        for (i, (got, want)) in runs.iter().zip([&ra, &rb, &ra]).enumerate() {
            if got != want {
                failures.push(format!(
                    "{label}: request {i} changed when sharing steps: {}",
                    first_difference(got, want)
                ));
            }
        }
    });
}

/// Seventeen sequences decoding together (decode passes of 17 rows: past the many-row GEMM's
/// threshold) give each one's alone logits: decode rows take the matrix-vector kernels and
/// per-row attention for every row count. (A server with 2 speculating slots failed this:
/// their verify rows together reached the GEMM.)
#[test]
fn many_sequences_decoding_together_give_the_alone_logits() {
    check_modes(|label, m, prompt, failures| {
        let n = 6;
        let prompts: Vec<&[u32]> = (0..17).map(|i| &prompt[i % 5..20 + i % 7]).collect();
        let caches = (0..17).map(|_| m.new_cache()).collect();
        let mut s = Scheduler::new(caches, 1 << 20, Vec::new(), None);
        let runs = drive(
            m,
            &mut s,
            prompts.iter().map(|p| (0, request(p, n))).collect(),
        );
        for (i, (got, p)) in runs.iter().zip(&prompts).enumerate() {
            let want = alone(m, p, n);
            if *got != want {
                failures.push(format!(
                    "{label}: sequence {i} of 17 changed: {}",
                    first_difference(got, &want)
                ));
            }
        }
    });
}
