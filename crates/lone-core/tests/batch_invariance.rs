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
use std::sync::Arc;

use lone_core::engine::{Event, GenRequest, Scheduler, SpecParams, SpecTypes, Speculator};
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
    cases_with_paths()
        .into_iter()
        .map(|(l, m, p, _)| (l, m, p))
        .collect()
}

/// [`cases`] with each model's path.
fn cases_with_paths() -> Vec<(String, Model, Vec<u32>, PathBuf)> {
    let mut out = Vec::new();
    // `LONE_TEST_MODELS=fixtures` leaves the default model out (the aarch64 suite under qemu
    // runs it on one CPU class only: it is most of the time).
    if std::env::var("LONE_TEST_MODELS").as_deref() != Ok("fixtures") {
        let p = common::default_model();
        let m = Model::load(&p).unwrap();
        let t = TextIo::load(&m, &p).unwrap();
        let prompt = t
            .chat_prompt(
                Some("You are a helpful assistant. Answer briefly and precisely."),
                "What is 2 + 2? Explain how you add two numbers, in one sentence.",
            )
            .unwrap();
        out.push(("smollm2-q4_1".to_string(), m, prompt, p));
    }
    for (fam, file) in [
        ("lfm2_a", "model-q8_0.gguf"),
        ("qwen2", "model-q8_0.gguf"),
        ("lfm3", "model-f32.gguf"),
        // F16/BF16: on x86 their many-row steps take the f32 GEMM, decode rows a kernel
        // that keeps the GEMM's chain.
        ("qwen2", "model-f16.gguf"),
        ("lfm2_a", "model-bf16.gguf"),
        ("lfm2_moe", "model-q4_0.gguf"),
        // IQ4_XS (8-bit kernels: a scale per sub-block of 32; IQ4_NL on the other tensors).
        ("llama", "model-iq4_xs.gguf"),
        // IQ2_XS: a codebook i-quant with two scales per 32 elements.
        ("llama", "model-iq2_xs.gguf"),
    ] {
        let path = fixture(fam, file);
        let m = Model::load(&path).unwrap();
        let v = m.cfg.vocab_size as u32;
        // A deterministic prompt of 45 in-vocabulary tokens.
        let prompt = (0..45u32).map(|i| (i * 7919 + 13) % v).collect();
        out.push((format!("{fam}/{file}"), m, prompt, path));
    }
    out
}

/// One sequence's output: its tokens and the logits each was sampled from (what is
/// compared), and how many tokens speculation drafted for it.
#[derive(Debug)]
struct Run {
    tokens: Vec<u32>,
    logits: Vec<f32>,
    drafted: usize,
}

impl PartialEq for Run {
    fn eq(&self, o: &Run) -> bool {
        self.tokens == o.tokens
            && self.logits.len() == o.logits.len()
            && self
                .logits
                .iter()
                .zip(&o.logits)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
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
/// Admit `req` into the scheduler's only slot and cancel it at once: the prompt rows its
/// cache gave (the cache keeps them).
fn cached_on_admit(sched: &mut Scheduler, req: GenRequest) -> usize {
    let sampler = Sampler::new(req.params.clone());
    let slot = sched.admit(req, sampler, None).unwrap();
    let cached = sched.cached(slot);
    sched.cancel(slot);
    cached
}

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
        .map(|(&s, tokens)| {
            let mut seq = sched.take_finished(s).unwrap();
            Run {
                tokens,
                drafted: seq.spec_stats().drafted,
                logits: seq.take_logits(),
            }
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

/// The default mode's promise: one greedy request gives the same tokens and the same logits
/// (so the same logprobs) however it reaches the model. The request's prompt begins with an
/// earlier request's prompt and reply (a chat's second turn); it is run
/// - cold and alone (the reference);
/// - after that earlier request in the same slot, so the reply's tokens come from the cache,
///   where they were computed as decode rows, not as prompt rows;
/// - admitted together with 1, 3 and 7 other requests (the prefill budget shared, so its
///   prompt is chunked differently, and its decode rows share passes with their prompt and
///   decode rows);
/// - speculated (a draft model's tokens verified as several rows of one pass).
#[test]
fn the_same_request_gives_the_same_answer() {
    let mut failures = Vec::new();
    for (label, mut m, prompt, path) in cases_with_paths() {
        m.compute.mode = Some(Mode::Auto);
        let (n, first) = (10, &prompt[..16]);
        let reply = alone(&m, first, 8).tokens;
        let mut req: Vec<u32> = first.to_vec();
        req.extend(&reply);
        req.extend(&prompt[16..40]);
        let cold = alone(&m, &req, n);
        let mut check = |what: String, got: &Run| {
            if *got != cold {
                failures.push(format!("{label}: {what}: {}", first_difference(got, &cold)));
            }
        };
        // The earlier turn in the same slot: its reply's tokens (but the last) are cached.
        let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), None);
        drive(&m, &mut s, vec![(0, request(first, 8))]);
        let warm = drive(&m, &mut s, vec![(0, request(&req, n))])
            .pop()
            .unwrap();
        check("after the earlier turn (its reply cached)".into(), &warm);
        for others in [1, 3, 7] {
            let caches = (0..=others).map(|_| m.new_cache()).collect();
            let mut s = Scheduler::new(caches, 1 << 20, Vec::new(), None);
            let v = m.cfg.vocab_size as u32;
            let mut admit = vec![(0, request(&req, n))];
            for j in 0..others {
                // Long prompts beside it (they share the prefill budget), some arriving
                // while it decodes.
                let len = 24 + 16 * j;
                let p: Vec<u32> = (0..len as u32)
                    .map(|i| (i * 31 + 7 * j as u32) % v)
                    .collect();
                admit.push((j % 3, request(&p, 5 + j)));
            }
            let got = drive(&m, &mut s, admit).swap_remove(0);
            check(format!("beside {others} other requests"), &got);
        }
        // The model drafting for itself (a second copy, in fast mode as a draft model is):
        // drafts are always there, and mostly accepted.
        let t = TextIo::load(&m, &path).unwrap();
        let params = SpecParams {
            types: SpecTypes {
                draft: true,
                ..Default::default()
            },
            draft_max: 4,
            ..Default::default()
        };
        let draft = Model::load(&path).unwrap();
        let d = Some((draft, &t.tokenizer));
        let spec = Arc::new(Speculator::new(params, &m, &t.tokenizer, d).unwrap());
        let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), Some(spec));
        let got = drive(&m, &mut s, vec![(0, request(&req, n))])
            .pop()
            .unwrap();
        assert!(
            got.drafted > 0,
            "{label}: nothing was drafted: the case tests nothing"
        );
        if got != cold {
            failures.push(format!(
                "{label}: speculated: {}",
                first_difference(&got, &cold)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A request with images (LFM2-VL and LFM3-VL, its image rows entering as embeddings) gives its alone
/// logits when its prompt shares steps with another sequence's decoding and with another
/// image request's prompt (the default mode merges prompt rows into the decode pass, the
/// embeddings' rows moving with them), and when a slot's cache already holds its text prefix.
#[test]
fn requests_with_images_give_their_alone_logits_in_any_company() {
    use lone_core::engine::PromptEmbeds;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/fixtures");
    let read_ids = |p: PathBuf| -> Vec<u32> {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let mut failures = Vec::new();
    for ((family, big, two), mode) in [("lfm2_vl", "tiled", "two"), ("lfm3_vl", "large", "two")]
        .into_iter()
        .flat_map(|f| [(f, Mode::Auto), (f, Mode::Exact)])
    {
        let dir = fixtures.join(family);
        let mut m = Model::load(&dir).unwrap();
        m.compute.mode = Some(mode);
        let image_token = m.vision.as_ref().unwrap().image_token_id;
        // The prompt of case `ids_case` with the image embeddings of case `case`.
        let swapped_req = |ids_case: &str, case: &str| {
            let ids = read_ids(dir.join("cases").join(ids_case).join("input_ids.json"));
            let c = dir.join("cases").join(case);
            let f = lone_core::npy::read(&c.join("features.npy")).unwrap();
            let e = PromptEmbeds::at_token(&ids, image_token, f.data, m.cfg.hidden_size).unwrap();
            GenRequest {
                embeds: Some(Arc::new(e)),
                ..request(&ids, 8)
            }
        };
        let image_req = |case: &str| swapped_req(case, case);
        let alone_req = |req: GenRequest| {
            let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), None);
            drive(&m, &mut s, vec![(0, req)]).pop().unwrap()
        };
        let text = request(&(1..40u32).collect::<Vec<_>>(), 8);
        let (rt, r1, r2) = (
            alone_req(text.clone()),
            alone_req(image_req(big)),
            alone_req(image_req(two)),
        );
        let caches = vec![m.new_cache(), m.new_cache(), m.new_cache()];
        let mut s = Scheduler::new(caches, 1 << 20, Vec::new(), None);
        let runs = drive(
            &m,
            &mut s,
            vec![(0, text), (2, image_req(big)), (2, image_req(two))],
        );
        for (i, (got, want)) in runs.iter().zip([&rt, &r1, &r2]).enumerate() {
            if got != want {
                failures.push(format!(
                    "{family} {} request {i}: {}",
                    mode.name(),
                    first_difference(got, want)
                ));
            }
        }
        // The same image request again in one slot: its prompt (images included) comes from the
        // cache.
        let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), None);
        drive(&m, &mut s, vec![(0, image_req(big))]);
        let cached = cached_on_admit(&mut s, image_req(big));
        let want = image_req(big).prompt.len() - 1;
        if cached != want {
            failures.push(format!(
                "{family} {}: the same image request reused {cached} of its {want} rows",
                mode.name()
            ));
        }
        let again = drive(&m, &mut s, vec![(0, image_req(big))]);
        if again[0] != r1 {
            failures.push(format!(
                "{family} {}: after a cached prefix: {}",
                mode.name(),
                first_difference(&again[0], &r1)
            ));
        }
        // The same tokens with another image (LFM3-VL's `one` and `exact` images both give 6
        // tokens): the cache holds the first image's rows, which must not be reused.
        if family == "lfm3_vl" {
            let want = alone_req(swapped_req("one", "exact"));
            let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), None);
            drive(&m, &mut s, vec![(0, image_req("one"))]);
            let got = drive(&m, &mut s, vec![(0, swapped_req("one", "exact"))]);
            if got[0] != want {
                failures.push(format!(
                    "{family} {}: another image after the same tokens: {}",
                    mode.name(),
                    first_difference(&got[0], &want)
                ));
            }
            let mut s = Scheduler::new(vec![m.new_cache()], 1 << 20, Vec::new(), None);
            drive(&m, &mut s, vec![(0, image_req("one"))]);
            let req = swapped_req("one", "exact");
            let first_image = req.embeds.as_ref().unwrap().positions[0];
            let cached = cached_on_admit(&mut s, req);
            if cached > first_image {
                failures.push(format!(
                    "{family}: {cached} rows reused past the first image row {first_image}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
