//! The fuzz targets (`fuzz/fuzz_targets/`, libFuzzer via `scripts/fuzz.sh`) on the stable
//! toolchain: each target's function runs on its committed seeds (`fuzz/seeds/<target>/`, plus
//! the fixture GGUFs) and then on mutations of them — bit flips, interesting integers written
//! over the bytes, insertions from a dictionary, deletions, duplications, splices — for
//! `LONE_FUZZ_SECONDS` seconds per target (default 3; `LONE_FUZZ_SEED` picks the run). Not
//! coverage-guided (that is the cargo-fuzz run); a panic fails the test with the input saved
//! under `target/fuzz-failures/`, an abort or allocation failure takes the process down, and an
//! input running over 30 s aborts it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("fuzz/seeds").join(target))
        .unwrap_or_else(|e| panic!("fuzz/seeds/{target}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    if target == "gguf" {
        for fam in [
            "lfm2_a", "lfm2_b", "lfm3", "llama", "qwen2", "qwen3", "lfm2_moe",
        ] {
            paths.push(root().join(format!("tests/reference/fixtures/{fam}/model-q8_0.gguf")));
        }
    }
    paths.sort();
    let out: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!out.is_empty(), "no seeds for {target}");
    out
}

use lone_core::fuzzing::Rng;

const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    1 << 60,
    u64::MAX - 63,
    u64::MAX,
];

const DICT: [&[u8]; 24] = [
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b",",
    b":",
    b"null",
    b"-1",
    b"0",
    b"1e308",
    b"NaN",
    b"18446744073709551615",
    b"{%",
    b"%}",
    b"{{",
    b"}}",
    b"{% for i in range(100000) %}",
    b"{% endfor %}",
    b"\"role\"",
    b"\"content\"",
    b"\xff\xfe",
    b"\0",
    b"\"max_tokens\":",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let n = d.len();
        match rng.below(8) {
            0 if n > 0 => {
                let i = rng.below(n);
                d[i] ^= 1 << rng.below(8);
            }
            1 if n >= 8 => {
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let w = [1usize, 2, 4, 8][rng.below(4)];
                let i = rng.below(n - w + 1);
                d[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            2 => {
                let t = DICT[rng.below(DICT.len())];
                let i = rng.below(n + 1);
                d.splice(i..i, t.iter().copied());
            }
            3 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(64));
                d.drain(i..i + len);
            }
            4 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(256));
                let piece = d[i..i + len].to_vec();
                let j = rng.below(n + 1);
                d.splice(j..j, piece);
            }
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let i = rng.below(other.len());
                    let cut = rng.below(d.len() + 1);
                    d.truncate(cut);
                    d.extend_from_slice(&other[i..]);
                }
            }
            6 if n > 0 => d.truncate(rng.below(n)),
            _ if n > 0 => {
                let i = rng.below(n);
                d[i] = rng.next_u64() as u8;
            }
            _ => d.push(rng.next_u64() as u8),
        }
    }
    d
}

/// Run `f` on the seeds, then on mutations until the time is up. Returns the inputs run.
fn fuzz(target: &str, f: &(dyn Fn(&[u8]) + Sync)) -> u64 {
    let seeds = seeds(target);
    let secs: f64 = std::env::var("LONE_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("LONE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut rng =
        Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x1000_0000_01b3) ^ target.len() as u64);
    // A watchdog: one input running past 30 s is a hang.
    let started = Arc::new(AtomicU64::new(0));
    let current: Arc<Mutex<Vec<u8>>> = Arc::default();
    let t0 = Instant::now();
    {
        let (started, current, target) = (started.clone(), current.clone(), target.to_string());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let s = started.load(Ordering::Relaxed);
            if s != 0 && t0.elapsed().as_secs().saturating_sub(s) > 30 {
                let p = save(&target, "hang", &current.lock().unwrap());
                eprintln!(
                    "fuzz {target}: an input ran over 30 s, saved to {}",
                    p.display()
                );
                std::process::abort();
            }
        });
    }
    let deadline = t0 + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let mut i = 0usize;
    loop {
        let input = if i < seeds.len() {
            seeds[i].clone()
        } else {
            if Instant::now() >= deadline {
                break;
            }
            mutate(&mut rng, &seeds)
        };
        i += 1;
        *current.lock().unwrap() = input.clone();
        started.store(t0.elapsed().as_secs().max(1), Ordering::Relaxed);
        let r = catch_unwind(AssertUnwindSafe(|| f(&input)));
        started.store(0, Ordering::Relaxed);
        n += 1;
        if r.is_err() {
            let p = save(target, "panic", &input);
            panic!(
                "fuzz {target}: input {n} panicked; saved to {}",
                p.display()
            );
        }
    }
    eprintln!(
        "fuzz {target}: {n} inputs in {:.1} s, no panic",
        t0.elapsed().as_secs_f64()
    );
    n
}

fn save(target: &str, what: &str, input: &[u8]) -> PathBuf {
    let dir = root().join("target/fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(format!("{target}-{what}.bin"));
    let _ = std::fs::write(&p, input);
    p
}

#[test]
fn gguf() {
    assert!(fuzz("gguf", &lone_core::fuzzing::gguf) > 12);
}

#[test]
fn gguf_tokenizer() {
    // The seeds must reach what this target is for: each builds a tokenizer.
    for s in seeds("gguf_tokenizer") {
        let g = lone_core::loader::gguf::GgufFile::from_bytes(Path::new("seed"), &s).unwrap();
        lone_core::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    }
    fuzz("gguf_tokenizer", &lone_core::fuzzing::gguf_tokenizer);
}

#[test]
fn safetensors() {
    for s in seeds("safetensors") {
        lone_core::loader::safetensors::SafetensorsFiles::from_bytes(Path::new("seed"), &s)
            .unwrap();
    }
    fuzz("safetensors", &lone_core::fuzzing::safetensors);
}

#[test]
fn config() {
    for s in seeds("config") {
        let v: serde_json::Value = serde_json::from_slice(&s).unwrap();
        lone_core::config::ModelConfig::from_hf_json(&v).unwrap();
    }
    fuzz("config", &lone_core::fuzzing::config);
}

#[test]
fn chat_template() {
    fuzz("chat_template", &lone_core::fuzzing::chat_template);
}

#[test]
fn openai_request() {
    let ctx =
        lone::serve::fuzzing::RequestFuzz::new(&root().join("tests/reference/fixtures/lfm2_a"))
            .expect("the tiny LFM2 fixture loads");
    fuzz("openai_request", &|d| ctx.run(d));
}

#[test]
fn embed_options() {
    fuzz("embed_options", &lone::serve::fuzzing::embed_options);
}

#[test]
fn image() {
    for s in seeds("image") {
        lone_core::vision::image::decode(&s, 1 << 22).unwrap();
    }
    fuzz("image", &lone_core::fuzzing::image);
}
