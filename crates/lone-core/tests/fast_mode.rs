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
        ("qwen2", "q8_0"),
        ("qwen3", "q8_0"),
        ("lfm2_a", "q8_0"),
        ("lfm2_b", "q8_0"),
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
    assert_eq!(checked, 7);
}
