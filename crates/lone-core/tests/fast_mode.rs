//! Fast mode (8-bit activations for quantized weights, as llama.cpp) against exact mode (f32
//! activations) on every quantized GGUF fixture: same model, same tokens, both full-sequence
//! prefill logits. Exact mode itself is held to the transformers references in parity.rs.
//!
//! Bounds. Rounding an activation block to 8 bits is the same size of error as rounding a
//! weight block to Q8_0 (2^-8 of the block's largest magnitude), so the bound is
//! self-calibrating: the largest |fast − exact| logit change must stay within twice the
//! largest |exact − f32 transformers| change that the GGUF's own weight rounding causes.
//! Measured on these random-weight fixtures (`--nocapture` prints the table): for Q8_0
//! weights the two effects are equal within ±20% (0.72–1.11×; Q4 weights: 0.07–0.21×),
//! per-row cosine ≥ 0.9936 (lfm2_a; ≥ 0.9988 elsewhere) and at most 6.3% of a row's logit
//! range. Random weights (std 0.1, no trained structure) amplify rounding more than trained
//! models, hence the loose cosine and range bounds (0.99, 10%).

use std::path::{Path, PathBuf};

use lone_core::{kernels, npy};
use lone_core::{Batch, Model};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/fixtures")
}

fn ids(p: &Path) -> Vec<u32> {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn prefill(model: &Model, seq: &[u32], exact: bool) -> Vec<f32> {
    let _mode = kernels::exact_scope(exact);
    let mut cache = model.new_cache();
    model
        .forward(
            &Batch::for_sequence(0, 0, seq, true),
            std::slice::from_mut(&mut cache),
        )
        .unwrap()
        .logits
}

#[test]
fn fast_mode_stays_close_to_exact_mode() {
    let mut checked = 0;
    for (name, kind) in [
        ("llama", "q8_0"),
        ("llama", "q4_0"),
        ("llama", "q4_k"),
        ("llama", "iq4_nl"),
        ("llama", "iq4_xs"),
        ("llama", "iq3_s"),
        ("llama", "iq3_xxs"),
        ("llama", "iq2_xxs"),
        ("llama", "iq2_xs"),
        ("llama", "iq2_s"),
        ("llama", "iq1_s"),
        ("llama", "iq1_m"),
        ("llama", "tq1_0"),
        ("llama", "tq2_0"),
        ("qwen2", "q8_0"),
        ("qwen3", "q8_0"),
        ("lfm2_a", "q8_0"),
        ("lfm2_b", "q8_0"),
        // Not lfm2_moe: its random router's top-3 choices are as close as 5e-4 apart, so
        // 8-bit activations flip some (cosine 0.937); a flip is a different expert, not a
        // rounding error, and says nothing about a trained router's margins.
    ] {
        let dir = fixtures().join(name);
        let path = dir.join(format!("model-{kind}.gguf"));
        let model = Model::load(&path).unwrap();
        let seq: Vec<u32> = ids(&dir.join("prompt_ids.json"))
            .into_iter()
            .chain(ids(&dir.join("greedy.json")))
            .collect();
        let v = model.cfg.vocab_size;
        let exact = prefill(&model, &seq, true);
        let fast = prefill(&model, &seq, false);
        let reference = npy::read(&dir.join("logits.npy")).unwrap();
        let (mut min_cos, mut max_rel) = (1.0f64, 0.0f64);
        let (mut d_fast, mut d_weights) = (0.0f32, 0.0f32);
        for ((e, f), r) in exact
            .chunks(v)
            .zip(fast.chunks(v))
            .zip(reference.data.chunks(v))
        {
            let dot: f64 = e.iter().zip(f).map(|(&a, &b)| a as f64 * b as f64).sum();
            let ne: f64 = e.iter().map(|&a| a as f64 * a as f64).sum::<f64>().sqrt();
            let nf: f64 = f.iter().map(|&a| a as f64 * a as f64).sum::<f64>().sqrt();
            let range = e.iter().fold(f32::MIN, |m, &a| m.max(a))
                - e.iter().fold(f32::MAX, |m, &a| m.min(a));
            let dmax = e
                .iter()
                .zip(f)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            let wmax = e
                .iter()
                .zip(r)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            min_cos = min_cos.min(dot / (ne * nf));
            max_rel = max_rel.max((dmax / range) as f64);
            d_fast = d_fast.max(dmax);
            d_weights = d_weights.max(wmax);
        }
        eprintln!(
            "{name} {kind}: min cosine {min_cos:.6}, max |fast-exact| {d_fast:.4} \
             ({max_rel:.4} of the range), max |exact-f32 reference| {d_weights:.4}"
        );
        // 8-bit activations may cost about as much as the 8-bit (or coarser) weights already do.
        assert!(
            d_fast <= 2.0 * d_weights,
            "{name} {kind}: {d_fast} > {d_weights}"
        );
        assert!(min_cos > 0.99, "{name} {kind}: cosine {min_cos}");
        assert!(max_rel < 0.1, "{name} {kind}: |Δ|/range {max_rel}");
        checked += 1;
    }
    assert_eq!(checked, 18);
}

/// Greedy decode of `steps` tokens after `prompt`, one decode row per step: each step's
/// logits (the prompt's last row first).
fn decode_logits(model: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    let mut out = vec![
        model
            .forward(
                &Batch::for_sequence(0, 0, prompt, false),
                std::slice::from_mut(&mut cache),
            )
            .unwrap()
            .logits,
    ];
    for j in 0..steps {
        let last = out.last().unwrap();
        let next = (0..last.len()).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        let mut b = Batch::default();
        b.push(0, prompt.len() + j, next as u32, true);
        out.push(
            model
                .forward(&b, std::slice::from_mut(&mut cache))
                .unwrap()
                .logits,
        );
    }
    out
}

/// In the default mode on the SIMD families (x86, aarch64) an F16 or BF16 head is read
/// through a Q8_0 copy of itself (`nn::Head`) for every logit row, the prompt's
/// included (every row takes the same computation): every step's top logits are the head's
/// own (exact mode's up to f32 summation order) and the greedy tokens are exact mode's, while
/// the logits below the top 32 are the copy's — off exact mode's by about a Q8_0 rounding,
/// far more than summation order, so the copy is what was read. Fast mode reads the copy
/// too (F16 only here: fast mode's BF16 prompt GEMM takes bf16 activations, so its hidden
/// states are not exact mode's). Without 8-bit kernels (scalar) both modes are exact
/// throughout.
#[test]
fn an_f16_head_decodes_through_its_8bit_copy() {
    let eight_bit = kernels::isa().has_8bit();
    let cases = [
        ("lfm2_a", "f16", kernels::Mode::Auto),
        ("qwen2", "bf16", kernels::Mode::Auto),
        ("llama", "f16", kernels::Mode::Auto),
        ("lfm2_a", "f16", kernels::Mode::Fast),
        ("qwen3", "f16", kernels::Mode::Fast),
    ];
    for (name, kind, mode) in cases {
        let dir = fixtures().join(name);
        let mut model = Model::load(&dir.join(format!("model-{kind}.gguf"))).unwrap();
        let prompt = ids(&dir.join("prompt_ids.json"));
        model.compute.mode = Some(kernels::Mode::Exact);
        let exact = decode_logits(&model, &prompt, 6);
        model.compute.mode = Some(mode);
        let other = decode_logits(&model, &prompt, 6);
        for (s, (e, a)) in exact.iter().zip(&other).enumerate() {
            let what = format!("{name} {kind} {mode:?} step {s}");
            let mut order: Vec<usize> = (0..e.len()).collect();
            order.sort_by(|&i, &j| e[j].total_cmp(&e[i]));
            let range = e[order[0]] - e[order[e.len() - 1]];
            // The top 8 (inside the copy's top 32): the head's own values.
            for &i in &order[..8] {
                assert!((a[i] - e[i]).abs() <= 1e-5 * range, "{what}: top logit {i}");
            }
            let top = (0..a.len()).fold(0, |b, i| if a[i] > a[b] { i } else { b });
            assert_eq!(order[0], top, "{what}");
            let below = order[64..]
                .iter()
                .fold(0f32, |m, &i| m.max((a[i] - e[i]).abs()));
            if !eight_bit {
                assert!(below <= 1e-5 * range, "{what}: {below} of {range}");
            } else {
                assert!(
                    below > 1e-4 * range && below < 0.05 * range,
                    "{what}: logits below the top moved by {below} of {range}"
                );
            }
        }
    }
}
