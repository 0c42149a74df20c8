//! Cache behaviour that chat reuse, speculation and batching rely on: truncating a sequence
//! (full KV, sliding ring and conv state alike) and re-feeding gives the logits of a fresh
//! prefill, and several sequences in one batch give the same logits as each alone. The
//! reference for each case is transformers' full-sequence logits from the fixtures.

use std::path::{Path, PathBuf};

use lone_core::generate::{generate, GenerateOptions};
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::{Batch, Model};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/fixtures")
        .join(name)
}

fn ids(p: &Path) -> Vec<u32> {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

struct Ref {
    model: Model,
    seq: Vec<u32>,
    logits: Vec<f32>,
    v: usize,
}

fn load(name: &str) -> Ref {
    let dir = fixture(name);
    let model = Model::load(&dir).unwrap();
    let mut seq = ids(&dir.join("prompt_ids.json"));
    seq.extend(ids(&dir.join("greedy.json")));
    let logits = lone_core::npy::read(&dir.join("logits.npy")).unwrap().data;
    let v = model.cfg.vocab_size;
    Ref {
        model,
        seq,
        logits,
        v,
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Feed the whole sequence, truncate back to `keep`, then feed a wrong token, truncate again
/// and re-feed the true continuation: every re-fed row must equal the reference.
fn truncate_and_refeed(name: &str, keep: usize) {
    let r = load(name);
    let m = &r.model;
    let mut cache = m.new_cache();
    let n = r.seq.len();
    m.forward(
        &Batch::for_sequence(0, 0, &r.seq, false),
        std::slice::from_mut(&mut cache),
    )
    .unwrap();
    assert!(
        cache.truncate(keep),
        "{name}: truncate {n} -> {keep} refused"
    );
    assert_eq!(cache.len(), keep);
    // A detour: a different token at position `keep`, then back again.
    let wrong = (r.seq[keep] + 1) % r.v as u32;
    m.forward(
        &Batch::for_sequence(0, keep, &[wrong], true),
        std::slice::from_mut(&mut cache),
    )
    .unwrap();
    assert!(cache.truncate(keep));
    let out = m
        .forward(
            &Batch::for_sequence(0, keep, &r.seq[keep..], true),
            std::slice::from_mut(&mut cache),
        )
        .unwrap();
    let d = max_diff(&out.logits, &r.logits[keep * r.v..n * r.v]);
    assert!(
        d < 1e-4,
        "{name}: after truncating to {keep}, re-fed logits differ by {d}"
    );
}

#[test]
fn truncate_llama_kv() {
    truncate_and_refeed("llama", 3);
}

#[test]
fn truncate_lfm2_conv_and_kv() {
    for keep in [1, 7, 20, 40] {
        truncate_and_refeed("lfm2_a", keep);
    }
}

#[test]
fn truncate_lfm3_ring_conv_and_kv() {
    // The lfm3 fixture's window is 8 and its prompt 23 tokens: keeps inside and past the window.
    for keep in [2, 9, 17, 30, 46] {
        truncate_and_refeed("lfm3", keep);
    }
}

#[test]
fn truncate_beyond_rollback_is_refused_and_generate_recovers() {
    let r = load("lfm2_b");
    let m = &r.model;
    let mut cache = lone_core::cache::SeqCache::new(&m.cfg, 4);
    let n = r.seq.len();
    m.forward(
        &Batch::for_sequence(0, 0, &r.seq, false),
        std::slice::from_mut(&mut cache),
    )
    .unwrap();
    assert!(
        !cache.can_truncate(n - 10),
        "conv state cannot go back 10 with a rollback of 4"
    );
    assert!(!cache.truncate(n - 10));
    assert_eq!(cache.len(), n, "a refused truncate changes nothing");
    assert!(cache.truncate(n - 4));
    // generate() with a prompt diverging before what the cache can roll back to: it must
    // clear and prefill, giving transformers' greedy continuation of the prompt.
    let dir = fixture("lfm2_b");
    let prompt = ids(&dir.join("prompt_ids.json"));
    let greedy = ids(&dir.join("greedy.json"));
    let opts = GenerateOptions {
        max_new_tokens: greedy.len(),
        eos_ids: vec![],
        ignore_eos: true,
        keep_logits: false,
        ..Default::default()
    };
    let g = generate(
        m,
        &mut cache,
        &prompt,
        &opts,
        &mut Sampler::new(SamplingParams::default()),
        |_| true,
    )
    .unwrap();
    assert_eq!(g.tokens, greedy);
    let greedy_again = |cache: &mut lone_core::cache::SeqCache| {
        let mut sampler = Sampler::new(SamplingParams::default());
        let g = generate(m, cache, &prompt, &opts, &mut sampler, |_| true).unwrap();
        assert_eq!(g.tokens, greedy);
        g.prefilled_tokens
    };
    // With 4 positions of rollback, going back over the 23 generated tokens is refused: the
    // same prompt again is prefilled in full.
    assert_eq!(greedy_again(&mut cache), prompt.len());
    // With the default rollback window the cached prefix is reused: only the last prompt
    // token is prefilled.
    let mut cache = m.new_cache();
    greedy_again(&mut cache);
    assert_eq!(greedy_again(&mut cache), 1);
}

#[test]
fn several_sequences_in_one_batch() {
    for name in ["lfm2_a", "lfm3", "qwen3"] {
        let r = load(name);
        let m = &r.model;
        let n = r.seq.len();
        // Sequence 0 prefills the first half while sequence 1, already holding 10 positions,
        // decodes one token per step alongside; then both decode together.
        let mut caches = vec![m.new_cache(), m.new_cache()];
        m.forward(
            &Batch::for_sequence(1, 0, &r.seq[..10], false),
            &mut caches[..],
        )
        .unwrap();
        let half = n / 2;
        let mut b = Batch::default();
        for (i, &t) in r.seq[..half].iter().enumerate() {
            b.push(0, i, t, true);
        }
        b.push(1, 10, r.seq[10], true);
        let out = m.forward(&b, &mut caches).unwrap();
        let v = r.v;
        assert!(
            max_diff(&out.logits[..half * v], &r.logits[..half * v]) < 1e-4,
            "{name}: seq 0 prefill"
        );
        assert!(
            max_diff(&out.logits[half * v..], &r.logits[10 * v..11 * v]) < 1e-4,
            "{name}: seq 1 decode"
        );
        for step in 0..5 {
            let mut b = Batch::default();
            b.push(1, 11 + step, r.seq[11 + step], true);
            b.push(0, half + step, r.seq[half + step], true);
            let out = m.forward(&b, &mut caches).unwrap();
            let d1 = max_diff(
                &out.logits[..v],
                &r.logits[(11 + step) * v..(12 + step) * v],
            );
            let d0 = max_diff(
                &out.logits[v..],
                &r.logits[(half + step) * v..(half + step + 1) * v],
            );
            assert!(d0 < 1e-4 && d1 < 1e-4, "{name}: step {step}: {d0} {d1}");
        }
    }
}

#[test]
fn batch_without_logits_rows() {
    // A prefill chunk that wants no logits (e.g. the middle of a long prompt) must work.
    let r = load("llama");
    let mut cache = r.model.new_cache();
    let mut b = Batch::for_sequence(0, 0, &r.seq[..5], false);
    b.logits.iter_mut().for_each(|l| *l = false);
    let out = r
        .model
        .forward(&b, std::slice::from_mut(&mut cache))
        .unwrap();
    assert!(out.logits.is_empty());
    assert_eq!(cache.len(), 5);
    let out = r
        .model
        .forward(
            &Batch::for_sequence(0, 5, &r.seq[5..6], true),
            std::slice::from_mut(&mut cache),
        )
        .unwrap();
    assert!(max_diff(&out.logits, &r.logits[5 * r.v..6 * r.v]) < 1e-4);
}
