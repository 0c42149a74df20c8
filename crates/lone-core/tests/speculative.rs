//! Speculative decoding is exact: at temperature 0 the tokens are those of plain decoding
//! (and transformers' greedy tokens from the fixtures), for every family, with n-gram and
//! draft-model proposers, through rejections, ring wraps, the context limit and the token
//! budget; with sampling, the emitted tokens follow the target's distribution.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lone_core::engine::{
    Event, GenRequest, Scheduler, SpecParams, SpecTypes, Speculator, PREFILL_BUDGET,
};
use lone_core::generate::{generate, prefill, GenerateOptions, Generation, PREFILL_CHUNK};
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::text::TextIo;
use lone_core::Model;

const FAMILIES: [&str; 7] = [
    "lfm2_a", "lfm2_b", "lfm3", "llama", "qwen2", "qwen3", "lfm2_moe",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/fixtures")
        .join(name)
}

fn ids(name: &str, file: &str) -> Vec<u32> {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join(file)).unwrap()).unwrap()
}

fn load(name: &str) -> (Model, TextIo) {
    let dir = fixture(name);
    let m = Model::load(&dir).unwrap();
    let t = TextIo::load(&m, &dir).unwrap();
    (m, t)
}

fn ngram(n: usize, m: usize) -> SpecParams {
    SpecParams {
        types: SpecTypes {
            ngram_simple: true,
            ..Default::default()
        },
        ngram_n: n,
        ngram_m: m,
        ..Default::default()
    }
}

fn with_draft(draft_max: usize) -> SpecParams {
    SpecParams {
        types: SpecTypes {
            draft: true,
            ..Default::default()
        },
        draft_max,
        ..Default::default()
    }
}

fn run(
    m: &Model,
    prompt: &[u32],
    n: usize,
    params: SamplingParams,
    spec: Option<Arc<Speculator>>,
) -> Generation {
    let opts = GenerateOptions {
        max_new_tokens: n,
        ignore_eos: true,
        spec,
        ..Default::default()
    };
    let mut cache = m.new_cache();
    let mut sampler = Sampler::new(params);
    generate(m, &mut cache, prompt, &opts, &mut sampler, |_| true).unwrap()
}

fn speculator(m: &Model, t: &TextIo, p: SpecParams, draft: Option<&str>) -> Arc<Speculator> {
    let (dm, dt) = match draft.map(load) {
        Some((dm, dt)) => (Some(dm), Some(dt)),
        None => (None, None),
    };
    let d = dm.map(|dm| (dm, &dt.as_ref().unwrap().tokenizer));
    Arc::new(Speculator::new(p, m, &t.tokenizer, d).unwrap())
}

/// A prompt whose greedy continuation repeats, so n-gram drafts are found (and some fail).
fn prompt_of(name: &str) -> Vec<u32> {
    let mut p = ids(name, "prompt_ids.json");
    let again = p.clone();
    p.extend(again);
    p
}

#[test]
fn greedy_ngram_speculation_equals_plain_decoding_for_every_family() {
    let (mut drafted, mut accepted) = (0, 0);
    for name in FAMILIES {
        let (m, t) = load(name);
        let want = ids(name, "greedy.json");
        // transformers' greedy tokens, with and without speculation.
        let p = ids(name, "prompt_ids.json");
        for (n, mm) in [(1, 4), (2, 8)] {
            let s = speculator(&m, &t, ngram(n, mm), None);
            let g = run(&m, &p, want.len(), SamplingParams::greedy(), Some(s));
            assert_eq!(g.tokens, want, "{name}: n-gram {n}/{mm} vs transformers");
        }
        // A longer run over a repetitive prompt: drafts are accepted and rejected.
        let p = prompt_of(name);
        let plain = run(&m, &p, 120, SamplingParams::greedy(), None);
        // (1, 1024) without the ramp: drafts as long as the caches' rollback window (64), so
        // a rejection rolls ring and conv state back to the window's end.
        // ngram-cache alone (short n-grams, up to 8 drafts), and behind a 12-gram ngram-simple
        // that rarely matches.
        let cache_only = SpecTypes {
            ngram_cache: true,
            ..Default::default()
        };
        let both = SpecTypes {
            ngram_simple: true,
            ngram_cache: true,
            draft: false,
        };
        for (n, mm, ramp, types) in [
            (1, 3, 3, None),
            (2, 16, 3, None),
            (3, 48, 0, None),
            (1, 1024, 0, None),
            (12, 48, 0, Some(cache_only)),
            (12, 48, 3, Some(both)),
        ] {
            let mut sp = SpecParams {
                ramp,
                ..ngram(n, mm)
            };
            if let Some(types) = types {
                sp.types = types;
            }
            let label = sp.types.name();
            let s = speculator(&m, &t, sp, None);
            let g = run(&m, &p, 120, SamplingParams::greedy(), Some(s));
            assert_eq!(g.tokens, plain.tokens, "{name}: {label} {n}/{mm}");
            if types.is_some() {
                assert!(g.spec.drafted > 0, "{name}: {label} drafted nothing");
            }
            drafted += g.spec.drafted;
            accepted += g.spec.accepted;
            assert!(g.spec.passes < 120, "{name}: {:?}", g.spec);
        }
        assert!(
            accepted > 0 && accepted < drafted,
            "{name}: {accepted}/{drafted}"
        );
    }
}

#[test]
fn greedy_draft_model_speculation_equals_plain_decoding() {
    // Every fixture shares one tokenizer: another family drafts (many rejections), and the
    // model's own Q8_0 GGUF drafts for its f32 self (mostly accepted).
    for (target, draft) in [
        ("lfm2_a", "lfm2_b"),
        ("lfm3", "lfm2_a"),
        ("qwen3", "llama"),
        ("llama", "qwen2"),
    ] {
        let (m, t) = load(target);
        let p = prompt_of(target);
        let plain = run(&m, &p, 60, SamplingParams::greedy(), None);
        for k in [1, 3, 8] {
            let s = speculator(&m, &t, with_draft(k), Some(draft));
            let g = run(&m, &p, 60, SamplingParams::greedy(), Some(s));
            assert_eq!(g.tokens, plain.tokens, "{target} drafted by {draft}, k {k}");
            assert!(g.spec.drafted > 0);
        }
    }
    for name in ["lfm3", "lfm2_a"] {
        let (m, t) = load(name);
        let q8 = fixture(name).join("model-q8_0.gguf");
        let dm = Model::load(&q8).unwrap();
        let s = Arc::new(
            Speculator::new(with_draft(4), &m, &t.tokenizer, Some((dm, &t.tokenizer))).unwrap(),
        );
        let p = prompt_of(name);
        let plain = run(&m, &p, 60, SamplingParams::greedy(), None);
        let g = run(&m, &p, 60, SamplingParams::greedy(), Some(s));
        assert_eq!(g.tokens, plain.tokens, "{name} drafted by its Q8_0 copy");
        assert!(
            g.spec.accepted * 2 > g.spec.drafted,
            "{name}: its own Q8_0 copy should mostly agree: {:?}",
            g.spec
        );
    }
}

/// A draft model whose drafts keep failing (another random model) backs off: far fewer
/// drafted tokens than with the ramp off, which drafts every step; the tokens stay plain
/// decoding's either way.
#[test]
fn a_failing_draft_model_backs_off() {
    let (m, t) = load("lfm2_a");
    let p = prompt_of("lfm2_a");
    let n = 80;
    let plain = run(&m, &p, n, SamplingParams::greedy(), None);
    let go = |ramp| {
        let s = speculator(
            &m,
            &t,
            SpecParams {
                ramp,
                ..with_draft(3)
            },
            Some("lfm2_b"),
        );
        run(&m, &p, n, SamplingParams::greedy(), Some(s))
    };
    let (on, off) = (go(3), go(0));
    eprintln!("back-off {:?}, none {:?}", on.spec, off.spec);
    assert_eq!(on.tokens, plain.tokens);
    assert_eq!(off.tokens, plain.tokens);
    assert!(off.spec.accepted * 4 < off.spec.drafted, "{:?}", off.spec);
    assert!(
        on.spec.drafted * 3 < off.spec.drafted,
        "{:?} vs {:?}",
        on.spec,
        off.spec
    );
    assert!(on.spec.drafted > 0);
}

#[test]
fn the_draft_model_reads_the_prompt_with_its_target() {
    // A prompt longer than one step's prefill budget: target and draft read it together,
    // step by step, so the first draft pass feeds the draft only the pending token.
    let (m, t) = load("lfm2_a");
    let s = speculator(&m, &t, with_draft(3), Some("lfm2_b"));
    let dm = s.draft_model().unwrap();
    let mut p = prompt_of("lfm2_a");
    while p.len() <= PREFILL_BUDGET {
        p.extend_from_within(..);
    }
    let greedy = SamplingParams::greedy();
    let mut sched = Scheduler::new(vec![m.new_cache()], 1 << 16, Vec::new(), Some(s.clone()));
    let req = GenRequest {
        prompt: p.clone(),
        max_tokens: 8,
        params: greedy.clone(),
        ignore_eos: true,
        ..Default::default()
    };
    let slot = sched.admit(req, Sampler::new(greedy), None).unwrap();
    let mut emitted = 0;
    let mut count = |_: usize, e: Event| {
        if let Event::Delta { tokens, .. } = e {
            emitted += tokens.len();
        }
        true
    };
    let st = sched.step(&m, &mut count).unwrap();
    assert_eq!(st.prefill_rows, PREFILL_BUDGET);
    let draft = |s: &Scheduler| s.caches[slot].draft.as_ref().map(|d| d.tokens().to_vec());
    assert_eq!(draft(&sched).as_deref(), Some(&p[..PREFILL_BUDGET]));
    sched.step(&m, &mut count).unwrap();
    assert_eq!(draft(&sched).as_deref(), Some(&p[..]));
    // The draft cache holds what a plain prefill of the prompt gives: the same next logits.
    let mut fresh = dm.new_cache();
    prefill(dm, &mut fresh, &p, false).unwrap();
    let mut ours = (**sched.caches[slot].draft.as_ref().unwrap()).clone();
    let next = [p[3]];
    let a = prefill(dm, &mut fresh, &next, false).unwrap();
    let b = prefill(dm, &mut ours, &next, false).unwrap();
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-3, "draft logits differ by {diff}");
    // The first speculative pass drafts, and the draft cache then runs ahead of the prompt.
    let st = sched.step(&m, &mut count).unwrap();
    assert!(st.drafted > 0, "{st:?}");
    assert!(draft(&sched).unwrap().len() > p.len());
    assert!(emitted >= 2);
    // A prompt prefilled outside the scheduler (`keep_logits`) and longer than a prefill
    // chunk: the draft catches up in several passes, and the output is still plain decoding's.
    while p.len() <= PREFILL_CHUNK {
        p.extend_from_within(..);
    }
    let opts = |spec| GenerateOptions {
        max_new_tokens: 24,
        ignore_eos: true,
        keep_logits: true,
        spec,
        ..Default::default()
    };
    let gen = |o: &GenerateOptions| {
        let (mut c, mut smp) = (m.new_cache(), Sampler::new(SamplingParams::greedy()));
        let g = generate(&m, &mut c, &p, o, &mut smp, |_| true).unwrap();
        (g, c)
    };
    let (plain, _) = gen(&opts(None));
    let (g, c) = gen(&opts(Some(s)));
    assert_eq!(g.tokens, plain.tokens);
    assert!(g.spec.drafted > 0, "{:?}", g.spec);
    assert_eq!(c.draft.unwrap().common_prefix(&p), p.len());
}

#[test]
fn speculation_respects_the_budget_and_the_context_limit() {
    for name in ["lfm3", "lfm2_a", "qwen2"] {
        let (mut m, t) = load(name);
        let p = prompt_of(name);
        for budget in [1, 2, 5, 17] {
            let plain = run(&m, &p, budget, SamplingParams::greedy(), None);
            let s = speculator(&m, &t, ngram(1, 48), None);
            let g = run(&m, &p, budget, SamplingParams::greedy(), Some(s));
            assert_eq!(g.tokens, plain.tokens, "{name}: budget {budget}");
            assert_eq!(g.tokens.len(), budget);
        }
        // A context a few tokens past the prompt: verify passes near the end stay exact.
        m.cfg.max_position_embeddings = p.len() + 30;
        let plain = run(&m, &p, 1000, SamplingParams::greedy(), None);
        assert_eq!(plain.tokens.len(), 30);
        for spec in [ngram(1, 48), with_draft(8)] {
            let draft = spec.types.draft.then_some("lfm2_b");
            let s = speculator(&m, &t, spec, draft);
            let g = run(&m, &p, 1000, SamplingParams::greedy(), Some(s));
            assert_eq!(g.tokens, plain.tokens, "{name}: at the context limit");
        }
    }
}

/// The joint distribution of the first two sampled tokens, with a draft model proposing the
/// second (verified in the step after the first), must be the plain sampler's:
/// total-variation distance within sampling noise.
#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    let (m, t) = load("lfm2_a");
    let p = ids("lfm2_a", "prompt_ids.json");
    let params = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 4,
        seed: Some(seed),
        ..Default::default()
    };
    // Its own Q8_0 copy drafts: the draft is (nearly) the target's argmax, accepted with that
    // token's probability, rejected otherwise.
    let dm = Model::load(&fixture("lfm2_a").join("model-q8_0.gguf")).unwrap();
    let s = Arc::new(
        Speculator::new(with_draft(2), &m, &t.tokenizer, Some((dm, &t.tokenizer))).unwrap(),
    );
    let n = 10_000u64;
    let mut plain = std::collections::HashMap::new();
    let mut spec = std::collections::HashMap::new();
    let mut drafted = 0;
    let mut rejected = 0;
    for i in 0..n {
        let a = run(&m, &p, 3, params(i), None);
        *plain.entry(a.tokens[..2].to_vec()).or_insert(0u64) += 1;
        let b = run(&m, &p, 3, params(1_000_000 + i), Some(s.clone()));
        *spec.entry(b.tokens[..2].to_vec()).or_insert(0u64) += 1;
        drafted += b.spec.drafted;
        rejected += b.spec.drafted - b.spec.accepted;
    }
    assert!(
        drafted > 0 && rejected > 0,
        "{drafted} drafted, {rejected} rejected"
    );
    let keys: std::collections::HashSet<_> = plain.keys().chain(spec.keys()).cloned().collect();
    let tv: f64 = keys
        .iter()
        .map(|k| {
            let a = *plain.get(k).unwrap_or(&0) as f64 / n as f64;
            let b = *spec.get(k).unwrap_or(&0) as f64 / n as f64;
            (a - b).abs()
        })
        .sum::<f64>()
        / 2.0;
    // ≤ 16 outcomes, 10⁴ samples each: the TV of two samples of one distribution is about
    // 0.02 (measured 0.0188); taking the draft whenever offered gives far more.
    eprintln!(
        "total variation {tv:.4} over {} outcomes; {drafted} drafted, {rejected} rejected",
        keys.len()
    );
    assert!(
        tv < 0.05,
        "total variation {tv:.4} over {} outcomes",
        keys.len()
    );
}

/// In the default mode on x86, Q8_0 layers decode with 8-bit kernels but many-row passes
/// multiply exactly: verify passes then stay under the GEMM threshold, so speculation still
/// gives the plain greedy tokens of the quantized file.
#[test]
fn verify_passes_keep_the_one_row_numerics_of_8bit_decode() {
    let (f32m, _) = load("lfm2_a");
    assert_eq!(f32m.row_invariant_rows(), usize::MAX, "f32 weights");
    let m = Model::load(&fixture("lfm2_a").join("model-q8_0.gguf")).unwrap();
    let (_, t) = load("lfm2_a");
    let auto_x86 = lone_core::kernels::mode() == lone_core::kernels::Mode::Auto
        && cfg!(target_arch = "x86_64")
        && lone_core::kernels::isa() != lone_core::kernels::Isa::Scalar;
    if auto_x86 {
        assert_eq!(m.row_invariant_rows(), 15);
    }
    let p = prompt_of("lfm2_a");
    let plain = run(&m, &p, 100, SamplingParams::greedy(), None);
    let s = speculator(
        &m,
        &t,
        SpecParams {
            ramp: 0,
            ..ngram(1, 1024)
        },
        None,
    );
    let g = run(&m, &p, 100, SamplingParams::greedy(), Some(s));
    assert_eq!(g.tokens, plain.tokens);
}

/// A verify pass's rows on an 8-bit head (here 8 rows of one sequence: a Q8_0 head takes fast
/// mode's 8-bit GEMM for them in the default mode with `LONE_ISA=avx2`, and its packed
/// matrix-vector kernel on the VNNI levels; an F16/BF16 head its Q8_0 copy) give each row the
/// top logit that decoding the same tokens one by one gives, bit for bit, and the same
/// argmax: the top of each row is the exact head's, rescored, whatever kernel produced the
/// rest.
#[test]
fn a_verify_pass_has_the_one_row_top_logits_on_an_8bit_head() {
    for file in ["model-q8_0.gguf", "model-f16.gguf", "model-bf16.gguf"] {
        let m = Model::load(&fixture("lfm2_a").join(file)).unwrap();
        let p = ids("lfm2_a", "prompt_ids.json");
        let next: Vec<u32> = ids("lfm2_a", "greedy.json").into_iter().take(8).collect();
        let v = m.cfg.vocab_size;
        let top = |l: &[f32]| {
            let (i, x) =
                l.iter().enumerate().fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &x)| {
                        if x > b.1 {
                            (i, x)
                        } else {
                            b
                        }
                    },
                );
            (i, x.to_bits())
        };
        let (want, got) = one_by_one_and_verify(&m, &p, &next);
        let want: Vec<_> = want.chunks_exact(v).map(top).collect();
        assert_eq!(top(&got[..v]), want[0], "{file}: the single row");
        for (j, w) in want.iter().enumerate() {
            assert_eq!(
                top(&got[(j + 1) * v..(j + 2) * v]),
                *w,
                "{file}: verify row {j}"
            );
        }
    }
}

/// Logits of `next` decoded one by one after `prompt`, and of the same tokens as one verify
/// pass (beside another sequence's single decode row, which comes first in the output).
fn one_by_one_and_verify(m: &Model, prompt: &[u32], next: &[u32]) -> (Vec<f32>, Vec<f32>) {
    use lone_core::Batch;
    let mut one = vec![m.new_cache()];
    m.forward(&Batch::for_sequence(0, 0, prompt, false), &mut one)
        .unwrap();
    let mut want = Vec::new();
    for (j, &t) in next.iter().enumerate() {
        let mut b = Batch::default();
        b.push(0, prompt.len() + j, t, true);
        want.extend(m.forward(&b, &mut one).unwrap().logits);
    }
    let mut two = vec![m.new_cache(), m.new_cache()];
    for seq in 0..2 {
        m.forward(&Batch::for_sequence(seq, 0, prompt, false), &mut two)
            .unwrap();
    }
    let mut b = Batch::default();
    b.push(1, prompt.len(), next[0], true);
    for (j, &t) in next.iter().enumerate() {
        b.push(0, prompt.len() + j, t, true);
    }
    (want, m.forward(&b, &mut two).unwrap().logits)
}

/// Deep in the context (decode attention split into runs of 256 keys, combined after), a
/// verify pass's logits are those of decoding its tokens one by one, bit for bit, for every
/// family (f32 weights: every matmul and attention of decode rows is the same for any number
/// of rows).
#[test]
fn deep_verify_passes_give_the_one_by_one_logits() {
    for name in FAMILIES {
        let (m, _) = load(name);
        let base = ids(name, "prompt_ids.json");
        let v = m.cfg.vocab_size;
        // Depths inside the second and third runs of 256 keys, and one where the first
        // verify row's last run is exactly whole.
        for depth in [300usize, 511, 700] {
            let prompt: Vec<u32> = base.iter().copied().cycle().take(depth).collect();
            let next: Vec<u32> = base.iter().rev().copied().cycle().take(9).collect();
            let (want, got) = one_by_one_and_verify(&m, &prompt, &next);
            assert_eq!(got.len(), (next.len() + 1) * v);
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same(&got[..v], &want[..v]),
                "{name} @ {depth}: the single row"
            );
            for j in 0..next.len() {
                assert!(
                    same(&got[(j + 1) * v..(j + 2) * v], &want[j * v..(j + 1) * v]),
                    "{name} @ {depth}: verify row {j}"
                );
            }
        }
    }
}
