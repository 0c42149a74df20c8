//! Model-level mutation test (issue 11): the tiny fixture GGUFs with seeded random damage —
//! bit flips in the header, header words overwritten with extreme values, truncations, bit
//! flips in the tensor data — must load and generate finite output or fail with an error:
//! never a panic, never NaN logits sampled as tokens. (An allocation abort or a hang would
//! take the test binary down, which fails the test too.)
//!
//! `LONE_MUTATIONS=N` sets the mutations per fixture file (default 60 here: CI runs a sample;
//! run thousands locally after touching a loader).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use lone_core::generate::{generate, GenerateOptions};
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::Model;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/fixtures");
    [
        "lfm2_a/model-q8_0.gguf",
        "lfm3/model-f16.gguf",
        "llama/model-q4_0.gguf",
        "llama/model-iq4_xs.gguf",
        "qwen3/model-q8_0.gguf",
        "lfm2_moe/model-q4_0.gguf",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect()
}

use lone_core::fuzzing::Rng;

/// The part of the file the "header" mutations hit: its first third, which holds the whole
/// header (metadata, tokenizer, tensor table) and some tensor data in these fixtures; the
/// "data" mutations hit the rest.
fn header_len(bytes: &[u8]) -> usize {
    (bytes.len() / 3).max(64).min(bytes.len())
}

fn mutate(rng: &mut Rng, orig: &[u8]) -> (Vec<u8>, String) {
    let mut b = orig.to_vec();
    let head = header_len(&b);
    match rng.below(4) {
        0 => {
            let flips = 1 + rng.below(4);
            for _ in 0..flips {
                let i = rng.below(head);
                b[i] ^= 1 << rng.below(8);
            }
            (b, format!("{flips} header bit flips"))
        }
        1 => {
            let i = rng.below(head.saturating_sub(8)) & !7;
            let v = [
                0u64,
                1,
                u64::MAX,
                u32::MAX as u64,
                1 << 60,
                u64::MAX - 63,
                rng.next_u64(),
            ][rng.below(7)];
            b[i..i + 8].copy_from_slice(&v.to_le_bytes());
            (b, format!("u64 at {i} = {v:#x}"))
        }
        2 => {
            let n = rng.below(b.len());
            b.truncate(n);
            (b, format!("truncated to {n}"))
        }
        _ => {
            let flips = 1 + rng.below(16);
            for _ in 0..flips {
                let i = head + rng.below(b.len() - head);
                b[i] ^= 1 << rng.below(8);
            }
            (b, format!("{flips} data bit flips"))
        }
    }
}

/// Mutations per fixture: `LONE_MUTATIONS`, else 60.
fn mutations() -> usize {
    std::env::var("LONE_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// Load and generate a few greedy tokens: Ok(()) or an error, panics caught as failures.
fn run(path: &Path) -> Result<(), String> {
    let model = Model::load(path).map_err(|e| e.to_string())?;
    let mut cache = model.new_cache();
    let opts = GenerateOptions {
        max_new_tokens: 3,
        ignore_eos: true,
        ..Default::default()
    };
    let mut sampler = Sampler::new(SamplingParams::default());
    let prompt: Vec<u32> = (1..6).collect();
    generate(&model, &mut cache, &prompt, &opts, &mut sampler, |_| true)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn damaged_model_files_load_and_run_or_fail_cleanly() {
    let per_file = mutations();
    let dir = tempfile::tempdir().unwrap();
    let (mut ok, mut refused) = (0, 0);
    for (fi, f) in fixtures().iter().enumerate() {
        let orig = std::fs::read(f).unwrap();
        assert!(run(f).is_ok(), "the undamaged {} runs", f.display());
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (fi as u64 + 1));
        for i in 0..per_file {
            let (bytes, what) = mutate(&mut rng, &orig);
            let p = dir.path().join(format!("m{fi}-{i}.gguf"));
            std::fs::write(&p, &bytes).unwrap();
            match catch_unwind(AssertUnwindSafe(|| run(&p))) {
                Ok(Ok(())) => ok += 1,
                Ok(Err(msg)) => {
                    assert!(
                        !msg.trim().is_empty(),
                        "{}: {what}: empty error",
                        f.display()
                    );
                    refused += 1;
                }
                Err(_) => panic!("{}: {what}: panicked", f.display()),
            }
            std::fs::remove_file(&p).unwrap();
        }
    }
    eprintln!("mutations: {ok} ran, {refused} refused with an error");
    // Both outcomes occur: the damage reaches the checks and also leaves runnable files.
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}

/// A checkpoint directory (config.json + model.safetensors) of a fixture copied to `dst`,
/// with `st` as its safetensors bytes and `cfg` as its config.
fn write_checkpoint(src: &Path, dst: &Path, st: &[u8], cfg: &str) {
    std::fs::create_dir_all(dst).unwrap();
    std::fs::write(dst.join("model.safetensors"), st).unwrap();
    std::fs::write(dst.join("config.json"), cfg).unwrap();
    for f in ["generation_config.json"] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
    }
}

/// The same for HF checkpoints: safetensors headers (length prefix and JSON) with bit flips
/// and truncations, and config.json with each numeric value replaced by an extreme one.
#[test]
fn damaged_checkpoints_load_and_run_or_fail_cleanly() {
    let per_dir = mutations();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/fixtures");
    let tmp = tempfile::tempdir().unwrap();
    let (mut ok, mut refused) = (0, 0);
    let extremes = [
        "0",
        "-1",
        "1e308",
        "-1e308",
        "1152921504606846976",
        "4294967295",
        "0.5",
        "2.0",
        "null",
        "\"x\"",
        "[]",
    ];
    for (di, name) in ["lfm2_a", "lfm3", "qwen2", "llama", "lfm2_moe"]
        .iter()
        .enumerate()
    {
        let src = root.join(name);
        let st = std::fs::read(src.join("model.safetensors")).unwrap();
        let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
        let head = 8 + u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
        // Byte ranges of the config's numbers (after a ':' or '[' or ',').
        let nums: Vec<(usize, usize)> = {
            let b = cfg.as_bytes();
            let mut v = Vec::new();
            let mut i = 0;
            while i < b.len() {
                if (b[i] == b'-' || b[i].is_ascii_digit())
                    && i > 0
                    && matches!(b[i - 1], b':' | b' ' | b'[' | b',')
                {
                    let s = i;
                    while i < b.len()
                        && matches!(b[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                    {
                        i += 1;
                    }
                    v.push((s, i));
                } else {
                    i += 1;
                }
            }
            v
        };
        assert!(nums.len() > 5, "{name}: numbers found in config.json");
        let mut rng = Rng(0x51f1_5eed ^ (di as u64 + 1));
        for i in 0..per_dir {
            let (mut s, mut c) = (st.clone(), cfg.clone());
            let what = match rng.below(3) {
                0 => {
                    let at = rng.below(head.min(s.len()));
                    s[at] ^= 1 << rng.below(8);
                    format!("safetensors header bit flip at {at}")
                }
                1 => {
                    let n = rng.below(s.len());
                    s.truncate(n);
                    format!("safetensors truncated to {n}")
                }
                _ => {
                    let (a, b) = nums[rng.below(nums.len())];
                    let v = extremes[rng.below(extremes.len())];
                    c.replace_range(a..b, v);
                    format!("config.json {:?} -> {v}", &cfg[a.saturating_sub(30)..b])
                }
            };
            let d = tmp.path().join(format!("c{di}-{i}"));
            write_checkpoint(&src, &d, &s, &c);
            match catch_unwind(AssertUnwindSafe(|| run(&d))) {
                Ok(Ok(())) => ok += 1,
                Ok(Err(msg)) => {
                    assert!(!msg.trim().is_empty(), "{name}: {what}: empty error");
                    refused += 1;
                }
                Err(_) => panic!("{name}: {what}: panicked"),
            }
            std::fs::remove_dir_all(&d).unwrap();
        }
    }
    eprintln!("checkpoint mutations: {ok} ran, {refused} refused with an error");
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}
