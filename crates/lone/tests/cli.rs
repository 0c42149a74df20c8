//! `lone run` end to end on the reference fixtures, and every bad input the engine issue names:
//! each must give a clear message and a non-zero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn lone() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lone"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/fixtures")
        .join(name)
}

fn read_ids(p: &Path) -> Vec<u32> {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Run and expect failure: exit code 1 or 2, a message containing `needle`, no panic.
fn expect_error(out: Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(
        matches!(out.status.code(), Some(1) | Some(2)),
        "exit code {:?}; stderr: {stderr}",
        out.status.code()
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
}

/// `lone run --model PATH --prompt-ids 1`.
fn run_one_token(model: &str) -> Output {
    lone()
        .args(["run", "--model", model, "--prompt-ids", "1"])
        .output()
        .unwrap()
}

fn run_json(args: &[&str]) -> serde_json::Value {
    lone_json(&[&["run"][..], args, &["--json"]].concat())
}

/// `lone ARGS` must succeed; its stdout as JSON.
fn lone_json(args: &[&str]) -> serde_json::Value {
    let out = lone().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "lone {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// [`lone_json`] in exact mode with an f32 KV cache: what comparisons against transformers'
/// recorded values need.
fn lone_exact_json(args: &[&str]) -> serde_json::Value {
    lone_json(&[&["--exact", "--cache-type", "f32"], args].concat())
}

#[test]
fn greedy_json_matches_transformers() {
    // The fixture's greedy tokens come from transformers (tests/reference/generate.py).
    for name in ["llama", "lfm2_a", "lfm3"] {
        let dir = fixture(name);
        let prompt = read_ids(&dir.join("prompt_ids.json"));
        let greedy = read_ids(&dir.join("greedy.json"));
        let v = run_json(&[
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &ids_arg(&prompt),
            "-n",
            &greedy.len().to_string(),
            "--ignore-eos",
        ]);
        let got: Vec<u32> = serde_json::from_value(v["generated_ids"].clone()).unwrap();
        assert_eq!(got, greedy, "{name}");
        assert_eq!(v["finish_reason"], "length");
        assert_eq!(v["stats"]["prompt_tokens"], prompt.len());
        assert!(v["stats"]["peak_rss_bytes"].as_u64().unwrap() > 0);
    }
}

/// `lone run --chat --image` on the vision-language fixtures (LFM2-VL and LFM3-VL, case
/// `one`): transformers' prompt ids and greedy tokens, and the image's tokens in the stats; a
/// raw prompt that places the image itself is accepted, and an image for a text-only model is
/// an error.
#[test]
fn run_with_an_image_gives_transformers_greedy_tokens() {
    for name in ["lfm2_vl", "lfm3_vl"] {
        let dir = fixture(name);
        let case = dir.join("cases/one");
        let image = dir.join("images/small.png");
        let greedy = read_ids(&case.join("greedy.json"));
        let v = lone_exact_json(&[
            "run",
            "--json",
            "--model",
            dir.to_str().unwrap(),
            "--chat",
            "--image",
            image.to_str().unwrap(),
            "-p",
            "What is this?",
            "-n",
            &greedy.len().to_string(),
            "--ignore-eos",
        ]);
        let prompt: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
        assert_eq!(prompt, read_ids(&case.join("input_ids.json")), "{name}");
        let got: Vec<u32> = serde_json::from_value(v["generated_ids"].clone()).unwrap();
        assert_eq!(got, greedy, "{name}");
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let image_token = cfg["image_token_id"].as_u64().unwrap() as u32;
        let tokens = prompt.iter().filter(|&&t| t == image_token).count();
        assert!(tokens > 0, "{name}");
        assert_eq!(v["stats"]["images"]["image_tokens"][0], tokens, "{name}");

        let marker = if name == "lfm2_vl" {
            "<image>"
        } else {
            "<|vision_start|><|image_pad|><|vision_end|>"
        };
        let raw = lone_json(&[
            "run",
            "--json",
            "--model",
            dir.to_str().unwrap(),
            "--image",
            image.to_str().unwrap(),
            "-p",
            &format!("Look: {marker} what?"),
            "-n",
            "2",
        ]);
        assert_eq!(raw["stats"]["images"]["image_tokens"][0], tokens, "{name}");
    }
    let out = lone()
        .args([
            "run",
            "--model",
            fixture("lfm3").to_str().unwrap(),
            "-p",
            "hi",
        ])
        .args([
            "--image",
            fixture("lfm3_vl")
                .join("images/small.png")
                .to_str()
                .unwrap(),
        ])
        .output()
        .unwrap();
    expect_error(out, "takes no images");
}

#[test]
fn dump_logits_matches_transformers() {
    let dir = fixture("qwen2");
    let prompt = read_ids(&dir.join("prompt_ids.json"));
    let greedy = read_ids(&dir.join("greedy.json"));
    let tmp = tempfile::tempdir().unwrap();
    let npy = tmp.path().join("logits.npy");
    let n = 6;
    let reference = lone_core::npy::read(&dir.join("logits.npy")).unwrap();
    let v = reference.shape[1];
    // One row per prompt position, then one per generated token fed back (n - 1).
    let rows = prompt.len() + n - 1;
    // The exact path (f32 cache) within 1e-4; the default f16 cache within its rounding
    // (measured on this fixture: 2.1e-3; tests/parity.rs bounds it for every family).
    for (cache, bar) in [("f32", 1e-4f32), ("f16", 5e-3)] {
        let out = lone()
            .args([
                "run",
                "--model",
                dir.to_str().unwrap(),
                "--prompt-ids",
                &ids_arg(&prompt),
                "-n",
                &n.to_string(),
                "--cache-type",
                cache,
            ])
            .args(["--ignore-eos", "--dump-logits", npy.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = lone_core::npy::read(&npy).unwrap();
        assert_eq!(got.shape, vec![rows, v]);
        let worst = got
            .data
            .iter()
            .zip(&reference.data[..rows * v])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("--cache-type {cache}: max |Δ logit| {worst:e}");
        assert!(
            worst < bar,
            "dumped logits ({cache} cache) differ from transformers by {worst}"
        );
    }
    let _ = greedy;
}

#[test]
fn same_seed_same_sample() {
    let dir = fixture("lfm2_b");
    let args = |seed: &str| {
        run_json(&[
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,5,9,33",
            "-n",
            "16",
            "--ignore-eos",
            "--temperature",
            "1.0",
            "--seed",
            seed,
        ])["generated_ids"]
            .clone()
    };
    let a = args("7");
    assert_eq!(a, args("7"));
    assert_ne!(
        a,
        args("8"),
        "different seeds gave identical 16-token samples"
    );
}

#[test]
fn missing_model_file() {
    expect_error(
        lone()
            .args(["run", "--model", "/nonexistent/model.gguf", "-p", "hi"])
            .output()
            .unwrap(),
        "/nonexistent/model.gguf",
    );
}

#[test]
fn missing_prompt() {
    expect_error(
        lone()
            .args(["run", "--model", fixture("llama").to_str().unwrap()])
            .output()
            .unwrap(),
        "--prompt",
    );
}

#[test]
fn truncated_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture("llama").join("model-f32.gguf")).unwrap();
    for cut in [bytes.len() / 2, 100, 10, 3] {
        let p = tmp.path().join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let out = lone()
            .args(["run", "--model", p.to_str().unwrap(), "--prompt-ids", "1,2"])
            .output()
            .unwrap();
        let needle = if cut < 4 {
            "not a GGUF file"
        } else {
            "truncated"
        };
        expect_error(out, needle);
    }
}

#[test]
fn not_a_model_file() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("junk.gguf");
    std::fs::write(&p, b"this is not a model at all, just text").unwrap();
    expect_error(
        lone()
            .args(["run", "--model", p.to_str().unwrap(), "-p", "x"])
            .output()
            .unwrap(),
        "not a GGUF file",
    );
}

/// A minimal GGUF v3: metadata strings/u32s and tensors of the given ggml type ids.
fn write_gguf(path: &Path, arch: &str, tensors: &[(&str, Vec<u64>, u32, usize)]) {
    write_gguf_at(path, arch, tensors, None)
}

/// [`write_gguf`] with the tensors' data offsets given (else packed, 32-aligned).
fn write_gguf_at(
    path: &Path,
    arch: &str,
    tensors: &[(&str, Vec<u64>, u32, usize)],
    offsets: Option<&[u64]>,
) {
    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    s(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes());
    s(&mut b, arch);
    let (mut off, mut end) = (0u64, 0u64);
    for (i, (name, dims, ty, nbytes)) in tensors.iter().enumerate() {
        s(&mut b, name);
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        let at = offsets.map_or(off, |o| o[i]);
        b.extend_from_slice(&at.to_le_bytes());
        off += (*nbytes as u64).div_ceil(32) * 32;
        end = end.max(at + *nbytes as u64);
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend(std::iter::repeat_n(0u8, off.max(end) as usize));
    std::fs::write(path, b).unwrap();
}

#[test]
fn unknown_gguf_architecture() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.gguf");
    write_gguf(
        &p,
        "gpt2",
        &[("token_embd.weight", vec![64, 8], 0, 64 * 8 * 4)],
    );
    let out = lone()
        .args(["run", "--model", p.to_str().unwrap(), "--prompt-ids", "1"])
        .output()
        .unwrap();
    expect_error(out, "architecture 'gpt2' is not supported");
}

/// GGUF tensor regions must be aligned, inside the data section and not overlap.
#[test]
fn gguf_layout_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.gguf");
    let t = |n| (n, vec![64u64, 8], 0u32, 64 * 8 * 4);
    let two = [t("token_embd.weight"), t("output_norm.weight")];
    for (offsets, needle) in [
        ([0u64, 0], "overlap"),
        ([0, 1024], "overlap"),
        ([0, 2056], "not aligned"),
        // A gap, and the header's order not the file's: llama.cpp refuses both.
        ([0, 4096], "expected 2048"),
        ([2048, 0], "starts at data offset 2048, expected 0"),
    ] {
        write_gguf_at(&p, "llama", &two, Some(&offsets));
        expect_error(run_one_token(p.to_str().unwrap()), needle);
    }
    let dup = [t("token_embd.weight"), t("token_embd.weight")];
    write_gguf(&p, "llama", &dup);
    expect_error(run_one_token(p.to_str().unwrap()), "twice");
}

#[test]
fn unknown_quant_type() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.gguf");
    // ggml type 39 = MXFP4 (17 bytes per 32 elements).
    write_gguf(
        &p,
        "llama",
        &[("token_embd.weight", vec![256, 4], 39, 17 * 8 * 4)],
    );
    let out = lone()
        .args(["run", "--model", p.to_str().unwrap(), "--prompt-ids", "1"])
        .output()
        .unwrap();
    expect_error(out, "MXFP4 which lone does not support");
}

/// Copy a fixture checkpoint directory (config + weights) to `dst`, editing config.json.
fn copy_checkpoint(src: &Path, dst: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    std::fs::create_dir_all(dst).unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
}

/// A config that disagrees with its weights, or names an unknown family.
#[test]
fn bad_configs() {
    let cases: [(&str, serde_json::Value, &str); 3] = [
        ("model_type", "bert".into(), "model_type 'bert'"),
        ("intermediate_size", 100.into(), "has shape"),
        (
            "num_hidden_layers",
            5.into(),
            "missing tensor 'model.layers.2.",
        ),
    ];
    for (key, value, needle) in cases {
        let tmp = tempfile::tempdir().unwrap();
        copy_checkpoint(&fixture("llama"), tmp.path(), |c| c[key] = value);
        expect_error(run_one_token(tmp.path().to_str().unwrap()), needle);
    }
}

#[test]
fn missing_weights_file() {
    let tmp = tempfile::tempdir().unwrap();
    copy_checkpoint(&fixture("llama"), tmp.path(), |_| {});
    std::fs::remove_file(tmp.path().join("model.safetensors")).unwrap();
    let out = run_one_token(tmp.path().to_str().unwrap());
    expect_error(out, "no model.safetensors");
}

#[test]
fn truncated_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    copy_checkpoint(&fixture("llama"), tmp.path(), |_| {});
    let p = tmp.path().join("model.safetensors");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 1000]).unwrap();
    let out = run_one_token(tmp.path().to_str().unwrap());
    expect_error(out, "truncated or corrupt");
}

#[test]
fn token_id_out_of_range() {
    let out = lone()
        .args([
            "run",
            "--model",
            fixture("llama").to_str().unwrap(),
            "--prompt-ids",
            "1,99999",
        ])
        .output()
        .unwrap();
    expect_error(out, "token id 99999 is out of range");
}

#[test]
fn prompt_longer_than_context() {
    let ids = ids_arg(&vec![5u32; 2100]);
    let out = lone()
        .args([
            "run",
            "--model",
            fixture("llama").to_str().unwrap(),
            "--prompt-ids",
            &ids,
        ])
        .output()
        .unwrap();
    expect_error(out, "but the context holds 2048");
}

#[test]
fn bad_sampling_values() {
    let m = fixture("llama");
    let base = ["run", "--model", m.to_str().unwrap(), "--prompt-ids", "1"];
    expect_error(
        lone().args(base).arg("--temperature=-1").output().unwrap(),
        "temperature",
    );
    expect_error(
        lone().args(base).args(["--top-p", "1.5"]).output().unwrap(),
        "top_p",
    );
    expect_error(
        lone().args(base).args(["--threads", "0"]).output().unwrap(),
        "--threads",
    );
    expect_error(
        lone()
            .args(base)
            .args(["--max-new-tokens", "many"])
            .output()
            .unwrap(),
        "invalid value",
    );
}

#[cfg(unix)]
#[test]
fn invalid_utf8_prompt() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let out = lone()
        .args([
            "run",
            "--model",
            fixture("llama").to_str().unwrap(),
            "--prompt",
        ])
        .arg(bad)
        .output()
        .unwrap();
    expect_error(out, "UTF-8");
}

/// `--stop` cuts the text before the first occurrence; speculation (`--spec-type`,
/// `--model-draft` / `-md`) gives the plain greedy tokens and reports its counters.
#[test]
fn stop_strings_and_speculation_on_run() {
    let dir = fixture("lfm2_a");
    let d = dir.to_str().unwrap();
    let prompt = read_ids(&dir.join("prompt_ids.json"));
    let twice: Vec<u32> = prompt.iter().chain(&prompt).copied().collect();
    let p = ids_arg(&twice);
    let base = ["--model", d, "--prompt-ids", &p, "-n", "48", "--ignore-eos"];
    let plain = run_json(&base);
    let text = plain["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 12, "{text:?}");
    let stop: String = chars[8..11].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let stopped = run_json(&[&base[..], &["--stop", "never-there", "--stop", &stop]].concat());
    assert_eq!(stopped["text"], cut);
    assert_eq!(stopped["finish_reason"], "stop");
    for spec in [
        &[
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "1",
        ][..],
        &[
            "-md",
            fixture("lfm2_b").to_str().unwrap(),
            "--draft-max",
            "4",
        ][..],
        &["--spec-type", "ngram-simple,draft", "--model-draft", d][..],
        &["--spec-type", "ngram-cache"][..],
    ] {
        let g = run_json(&[&base[..], spec].concat());
        assert_eq!(g["generated_ids"], plain["generated_ids"], "{spec:?}");
        assert!(g["stats"]["drafted"].as_u64().unwrap() > 0, "{spec:?}");
        assert!(g["stats"]["passes"].as_u64().unwrap() < 48, "{spec:?}");
    }
}

#[test]
fn bad_speculation_options_are_errors() {
    let d = fixture("lfm2_a");
    let d = d.to_str().unwrap();
    let run = |extra: &[&str]| {
        lone()
            .args(["run", "--model", d, "--prompt-ids", "1,2,3", "-n", "4"])
            .args(extra)
            .output()
            .unwrap()
    };
    expect_error(run(&["--spec-type", "eagle"]), "unknown speculative type");
    expect_error(run(&["--spec-type", "draft"]), "needs a draft model");
    expect_error(run(&["--model-draft", "/nonexistent/draft.gguf"]), "draft");
    expect_error(
        run(&[
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "0",
        ]),
        "ngram sizes",
    );
    // A draft model with another vocabulary is refused at load.
    let smol = std::env::var_os("LONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lone/models")
        })
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if smol.exists() {
        expect_error(
            run(&["--model-draft", smol.to_str().unwrap()]),
            "vocabulary",
        );
    }
}

#[test]
fn grammar_options_on_run() {
    let dir = fixture("lfm2_a");
    let d = dir.to_str().unwrap();
    let schema = r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"], "additionalProperties": false}"#;
    let schema_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(schema_file.path(), schema).unwrap();
    let gbnf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(gbnf.path(), "root ::= (\"ab\" | \"cd\") [0-9]\n").unwrap();
    for seed in ["1", "2", "3"] {
        let base = [
            "--model",
            d,
            "--prompt",
            "x",
            "-n",
            "300",
            "--temperature",
            "1",
            "--seed",
            seed,
        ];
        for schema_arg in [schema, schema_file.path().to_str().unwrap()] {
            let g = run_json(&[&base[..], &["--json-schema", schema_arg]].concat());
            let v: serde_json::Value = serde_json::from_str(g["text"].as_str().unwrap()).unwrap();
            let n = v["n"].as_i64().unwrap();
            assert!(
                (0..=99).contains(&n) && v.as_object().unwrap().len() == 1,
                "{v}"
            );
            assert_eq!(g["finish_reason"], "stop");
        }
        let g = run_json(&[&base[..], &["--regex", "(yes|no)!"]].concat());
        assert!(
            ["yes!", "no!"].contains(&g["text"].as_str().unwrap()),
            "{g}"
        );
        let g = run_json(&[&base[..], &["--grammar", gbnf.path().to_str().unwrap()]].concat());
        let t = g["text"].as_str().unwrap();
        assert!(
            t.len() == 3 && (t.starts_with("ab") || t.starts_with("cd")),
            "{t}"
        );
        let g = run_json(&[&base[..], &["--grammar", "start: \"x\" /[0-9]{2}/"]].concat());
        assert_eq!(g["text"].as_str().unwrap().len(), 3, "{g}");
    }
    for (args, needle) in [
        (&["--json-schema", "{not json"][..], "not valid JSON"),
        (&["--grammar", "root ::= [a-"][..], "invalid GBNF grammar"),
        (&["--regex", "(x"][..], "invalid grammar"),
        (
            &["--regex", "a", "--json-schema", "{}"][..],
            "cannot be used with",
        ),
    ] {
        let out = lone()
            .args([&["run", "--model", d, "--prompt", "x"][..], args].concat())
            .output()
            .unwrap();
        expect_error(out, needle);
    }
}

/// `lone perplexity` equals transformers' perplexity with llama-perplexity's method
/// (tests/reference/perplexity/expected.json), exact mode, every family.
#[test]
fn perplexity_matches_transformers() {
    let refs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(refs.join("perplexity/expected.json")).unwrap(),
    )
    .unwrap();
    let text = refs.join("../..").join(want["text"].as_str().unwrap());
    let ctx = want["ctx"].to_string();
    for (name, w) in want["models"].as_object().unwrap() {
        let dir = fixture(name);
        let g = lone_exact_json(&[
            "perplexity",
            "--json",
            "-c",
            &ctx,
            "-b",
            "40",
            "--model",
            dir.to_str().unwrap(),
            "-f",
            text.to_str().unwrap(),
        ]);
        assert_eq!(g["tokens"], w["tokens"], "{name}");
        assert_eq!(g["scored_tokens"], w["scored"], "{name}");
        let rel = |a: &serde_json::Value, b: &serde_json::Value| {
            (a.as_f64().unwrap() / b.as_f64().unwrap() - 1.0).abs()
        };
        assert!(
            rel(&g["ppl"], &w["ppl"]) < 1e-4,
            "{name}: {} vs {}",
            g["ppl"],
            w["ppl"]
        );
        assert!(rel(&g["ppl_stderr"], &w["stderr"]) < 1e-3, "{name}");
        for (a, b) in g["running"]
            .as_array()
            .unwrap()
            .iter()
            .zip(w["running"].as_array().unwrap())
        {
            assert!(rel(a, b) < 1e-4, "{name}");
        }
    }
    // --kl-divergence: a model against itself is 0; its Q8_0 copy is close but not 0; the
    // base model's perplexity is transformers'.
    let d = fixture("qwen2");
    let q8 = d.join("model-q8_0.gguf");
    let kl = |m: &Path| {
        lone_exact_json(&[
            "perplexity",
            "--kl-divergence",
            "--json",
            "-c",
            &ctx,
            "-r",
            d.to_str().unwrap(),
            "-m",
            m.to_str().unwrap(),
            "-f",
            text.to_str().unwrap(),
        ])
    };
    let same = kl(&d);
    assert_eq!(
        (same["kld_mean"].as_f64(), same["same_top"].as_f64()),
        (Some(0.0), Some(1.0))
    );
    let w = &want["models"]["qwen2"]["ppl"];
    assert!((same["ppl_reference"].as_f64().unwrap() / w.as_f64().unwrap() - 1.0).abs() < 1e-4);
    let q = kl(&q8);
    let k = q["kld_mean"].as_f64().unwrap();
    assert!(k > 0.0 && k < 0.01, "{q}");
    assert!(q["same_top"].as_f64().unwrap() > 0.9, "{q}");
    let short = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(short.path(), "too short").unwrap();
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), [0xff, 0xfe, 0x41]).unwrap();
    for (f, needle) in [(short.path(), "needs at least"), (bad.path(), "not UTF-8")] {
        let out = lone()
            .args([
                "perplexity",
                "--model",
                d.to_str().unwrap(),
                "-f",
                f.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        expect_error(out, needle);
    }
}

/// `lone inspect` against the files themselves: parameter count and tensor table from the
/// safetensors header read here, KV bytes per token from config.json; GGUF too; bad files fail.
#[test]
fn inspect_describes_the_files() {
    for name in ["lfm2_a", "qwen2", "lfm3"] {
        let dir = fixture(name);
        let raw = std::fs::read(dir.join("model.safetensors")).unwrap();
        let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
        let tensors: Vec<(&String, &serde_json::Value)> = header
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "__metadata__")
            .collect();
        let params: u64 = tensors
            .iter()
            .map(|(_, t)| {
                t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .product::<u64>()
            })
            .sum();
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let g = lone_json(&["inspect", "--json", dir.to_str().unwrap()]);
        assert_eq!(g["params"], params, "{name}");
        assert_eq!(
            g["tensors"].as_array().unwrap().len(),
            tensors.len(),
            "{name}"
        );
        for (k, t) in &tensors {
            let row = g["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == **k)
                .unwrap();
            assert_eq!(row["shape"], t["shape"], "{name} {k}");
        }
        assert_eq!(g["config"]["vocab_size"], cfg["vocab_size"]);
        assert_eq!(g["config"]["hidden_size"], cfg["hidden_size"]);
        // Full-attention layers × K and V × kv heads × head_dim × 2 bytes (f16).
        let layers = g["config"]["layers"].as_array().unwrap();
        let attn = layers.iter().filter(|l| *l == "Attention").count() as u64;
        let heads = cfg["num_attention_heads"].as_u64().unwrap();
        let head_dim = cfg
            .get("head_dim")
            .and_then(|h| h.as_u64())
            .unwrap_or(cfg["hidden_size"].as_u64().unwrap() / heads);
        let kv = cfg["num_key_value_heads"].as_u64().unwrap() * head_dim;
        let f16 = g["cache"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "f16")
            .unwrap();
        assert_eq!(f16["bytes_per_token"], 2 * 2 * kv * attn, "{name}");
        assert!(g["chat_template"].as_str().unwrap().contains("im_start"));
        assert_eq!(g["tokenizer"]["vocab_size"], cfg["vocab_size"]);
    }
    let gguf = fixture("llama").join("model-q8_0.gguf");
    let out = lone()
        .args(["inspect", gguf.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("Q8_0") && text.contains("tensors ("),
        "{text}"
    );
    // llama-quantize's i-quant files: the file type (llama.cpp's `general.file_type`; its
    // IQ2_M mix is what puts IQ2_S tensors in a file) and each tensor's type as gguf-py
    // names it (meta.json, written by generate.py).
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("llama").join("meta.json")).unwrap())
            .unwrap();
    for (file, quant, ftype, tensor_type) in [
        ("model-iq4_nl.gguf", "IQ4_NL", 25, "IQ4_NL"),
        ("model-iq4_xs.gguf", "IQ4_XS", 30, "IQ4_XS"),
        ("model-iq2_xxs.gguf", "IQ2_XXS", 19, "IQ2_XXS"),
        ("model-iq2_xs.gguf", "IQ2_XS", 20, "IQ2_XS"),
        ("model-iq2_s.gguf", "IQ2_M", 29, "IQ2_S"),
        ("model-iq3_xxs.gguf", "IQ3_XXS", 23, "IQ3_XXS"),
        ("model-iq3_s.gguf", "IQ3_S", 26, "IQ3_S"),
        ("model-iq1_s.gguf", "IQ1_S", 24, "IQ1_S"),
        ("model-iq1_m.gguf", "IQ1_M", 31, "IQ1_M"),
        ("model-tq1_0.gguf", "TQ1_0", 36, "TQ1_0"),
        ("model-tq2_0.gguf", "TQ2_0", 37, "TQ2_0"),
    ] {
        let gguf = fixture("llama").join(file);
        let g = lone_json(&["inspect", "--json", gguf.to_str().unwrap()]);
        let want = &meta["gguf"][file];
        assert_eq!(want["kv"]["general.file_type"], ftype, "{file}");
        assert_eq!(g["quant"], quant, "{file}");
        let types = g["types"].as_array().unwrap();
        assert!(
            types.iter().any(|t| t["type"] == tensor_type),
            "{file}: {types:?}"
        );
        let quant = tensor_type;
        let want = want["tensors"].as_object().unwrap();
        let rows = g["tensors"].as_array().unwrap();
        assert_eq!(rows.len(), want.len(), "{file}");
        for row in rows {
            let name = row["name"].as_str().unwrap();
            assert_eq!(row["type"], want[name]["type"], "{file} {name}");
        }
        assert!(rows.iter().any(|r| r["type"] == quant), "{file}");
    }
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), b"GGUF\x03\x00\x00\x00garbage").unwrap();
    expect_error(
        lone()
            .args(["inspect", junk.path().to_str().unwrap()])
            .output()
            .unwrap(),
        "cannot load model",
    );
}

/// A vision-language GGUF pair: `inspect --mmproj` describes the tower (both families, the
/// description the checkpoint directory gives); an mmproj given as the model says what it is.
#[test]
fn inspect_describes_a_gguf_pair() {
    for fam in ["lfm2_vl", "lfm3_vl"] {
        let d = fixture(fam);
        let (gguf, mmproj) = (d.join("model-f32.gguf"), d.join("mmproj-q8_0.gguf"));
        let pair = lone_json(&[
            "inspect",
            "--json",
            gguf.to_str().unwrap(),
            "--mmproj",
            mmproj.to_str().unwrap(),
        ]);
        let dir = lone_json(&["inspect", "--json", d.to_str().unwrap()]);
        assert!(pair["vision"].is_string(), "{fam}: {pair}");
        assert_eq!(pair["vision"], dir["vision"], "{fam}");
        let text_only = lone_json(&["inspect", "--json", gguf.to_str().unwrap()]);
        assert!(text_only["vision"].is_null(), "{fam}");
        expect_error(
            lone()
                .args(["inspect", mmproj.to_str().unwrap()])
                .output()
                .unwrap(),
            "is an mmproj",
        );
    }
}

/// llama.cpp's flag forms, GPU flags ignored with a warning, --version everywhere, and the
/// error messages for a Hub id, a directory of GGUFs and a missing file (each cause once).
#[test]
fn llama_cpp_habits() {
    let d = fixture("llama");
    let d = d.to_str().unwrap();
    let out = lone()
        .args([
            "run", "-m", d, "-p", "Hi", "-n", "2", "-ngl", "99", "-fa", "on", "--temp", "0", "-s",
            "3", "-t", "1", "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ignoring -ngl") && err.contains("ignoring -fa"),
        "{err}"
    );
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(g["generated_ids"].as_array().unwrap().len(), 2);
    for sub in [
        "run",
        "serve",
        "chat",
        "bench",
        "inspect",
        "perplexity",
        "convert",
        "pull",
        "ls",
        "rm",
    ] {
        let out = lone().args([sub, "--version"]).output().unwrap();
        assert!(
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")),
            "{sub}"
        );
    }
    // A repo id is looked up on the Hub (here a closed loopback port: tests never download).
    let hub_cache = tempfile::tempdir().unwrap();
    let out = lone()
        .args(["run", "-m", "Qwen/Qwen2.5-0.5B-Instruct", "-p", "x"])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HUB_CACHE", hub_cache.path())
        .output()
        .unwrap();
    expect_error(out, "as a Hugging Face repo id it did not resolve");
    let out = lone()
        .args(["run", "-m", "/no/such/model.gguf", "-p", "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert_eq!(err.matches("no such file").count(), 1, "{err}");
    let dir = tempfile::tempdir().unwrap();
    let gguf = fixture("qwen2").join("model-q8_0.gguf");
    std::fs::copy(&gguf, dir.path().join("a.gguf")).unwrap();
    let one = run_json(&[
        "-m",
        dir.path().to_str().unwrap(),
        "--prompt-ids",
        "1",
        "-n",
        "1",
    ]);
    assert_eq!(one["generated_ids"].as_array().unwrap().len(), 1);
    std::fs::copy(&gguf, dir.path().join("b.gguf")).unwrap();
    let out = lone()
        .args([
            "run",
            "-m",
            dir.path().to_str().unwrap(),
            "--prompt-ids",
            "1",
        ])
        .output()
        .unwrap();
    expect_error(out, "several GGUF files");
}

/// `lone verify`: the f32 fixtures pass against transformers' recorded outputs; a copy with one
/// tensor of layer 3 scaled fails, and the drift is found starting at layer 3.
#[test]
fn verify_passes_good_files_and_names_the_broken_layer() {
    for name in ["lfm2_a", "qwen3", "lfm3"] {
        let d = fixture(name);
        let g = lone_exact_json(&[
            "verify",
            "--json",
            "-m",
            d.to_str().unwrap(),
            "-r",
            d.to_str().unwrap(),
        ]);
        assert_eq!(g["runtime"], "recorded");
        assert_eq!(g["pass"], true, "{name}: {g}");
        assert!(g["logits"]["mean_cos"].as_f64().unwrap() > 0.99999);
        assert_eq!(g["greedy"]["agreed"], g["greedy"]["compared"]);
    }
    // Quantized against its f32 source, both run by lone.
    let q = fixture("qwen2").join("model-q8_0.gguf");
    let g = lone_json(&[
        "verify",
        "--json",
        "--reference-runtime",
        "lone",
        "-m",
        q.to_str().unwrap(),
        "-r",
        fixture("qwen2").to_str().unwrap(),
    ]);
    assert_eq!(g["pass"], true, "{g}");
    // A corrupted copy: layer 3's FFN output projection scaled by 8.
    let src = fixture("lfm2_a");
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let st = tmp.path().join("model.safetensors");
    let mut raw = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    let t = &header["model.layers.3.feed_forward.w2.weight"];
    assert_eq!(t["dtype"], "F32");
    let (a, b) = (
        t["data_offsets"][0].as_u64().unwrap() as usize,
        t["data_offsets"][1].as_u64().unwrap() as usize,
    );
    for c in raw[8 + n + a..8 + n + b].chunks_exact_mut(4) {
        let v = f32::from_le_bytes(c.try_into().unwrap()) * 8.0;
        c.copy_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&st, raw).unwrap();
    let out = lone()
        .args(["--exact", "--cache-type", "f32", "verify", "--json", "-m"])
        .arg(tmp.path())
        .arg("-r")
        .arg(&src)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(g["pass"], false);
    assert_eq!(g["drift_from"], "layer 3", "{}", g["layers"]);
    assert!(g["failures"][0].as_str().unwrap().contains("cosine"), "{g}");
    let out = lone()
        .args([
            "verify",
            "-m",
            src.to_str().unwrap(),
            "-r",
            "/no/such/ref",
            "--reference-runtime",
            "lone",
        ])
        .output()
        .unwrap();
    expect_error(out, "cannot load the reference");
}

/// A copy of fixture `name` in a temp dir, `edit` applied to its config.json.
fn fixture_copy(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_checkpoint(&fixture(name), tmp.path(), edit);
    tmp
}

/// Config values that make no sense are errors naming the value, before anything is
/// allocated from them; a pipe as the model file is an error, not a hang; NaN weights stop
/// generation with an error instead of sampling token 0; absurd thread counts are capped.
#[test]
fn hostile_model_files_are_clear_errors() {
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "lfm3",
            Box::new(|c| {
                c["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 2.0.into()
            }),
            "partial_rotary_factor",
        ),
        (
            "lfm2_a",
            Box::new(|c| c["norm_eps"] = (-1.0).into()),
            "norm epsilon",
        ),
        (
            "qwen2",
            Box::new(|c| c["rms_norm_eps"] = 1e308.into()),
            "norm epsilon",
        ),
        (
            "qwen2",
            Box::new(|c| c["rope_parameters"]["rope_theta"] = 0.0.into()),
            "theta",
        ),
        (
            "llama",
            Box::new(|c| c["num_hidden_layers"] = 1_000_000_000_000u64.into()),
            "num_hidden_layers",
        ),
        (
            "lfm3",
            Box::new(|c| c["sliding_window"] = (1u64 << 60).into()),
            "sliding window",
        ),
        (
            "qwen3",
            Box::new(|c| c["num_key_value_heads"] = 3.into()),
            "num_key_value_heads",
        ),
        (
            "llama",
            Box::new(|c| c["max_position_embeddings"] = (1u64 << 40).into()),
            "context length",
        ),
    ];
    for (name, edit, needle) in cases {
        let d = fixture_copy(name, edit);
        let t0 = std::time::Instant::now();
        let out = lone()
            .args([
                "run",
                "-m",
                d.path().to_str().unwrap(),
                "--prompt-ids",
                "1",
                "-n",
                "2",
            ])
            .output()
            .unwrap();
        assert!(t0.elapsed().as_secs() < 30);
        expect_error(out, needle);
    }
    // A named pipe: refused at once (opening it would block forever).
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let mut child = lone()
        .args(["run", "-m", fifo.to_str().unwrap(), "--prompt-ids", "1"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed().as_secs() > 20 {
            child.kill().unwrap();
            panic!("lone hung on a named pipe");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    expect_error(child.wait_with_output().unwrap(), "not a regular file");
    // NaN weights: the final norm's weight.
    let d = fixture_copy("qwen2", |_| {});
    let st = d.path().join("model.safetensors");
    let mut raw = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    let t = &header["model.norm.weight"];
    let (a, b) = (
        t["data_offsets"][0].as_u64().unwrap() as usize,
        t["data_offsets"][1].as_u64().unwrap() as usize,
    );
    for c in raw[8 + n + a..8 + n + b].chunks_exact_mut(4) {
        c.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(&st, raw).unwrap();
    let out = lone()
        .args([
            "run",
            "-m",
            d.path().to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "-n",
            "4",
        ])
        .output()
        .unwrap();
    expect_error(out, "NaN");
    // --threads far above the CPUs: capped, with a warning.
    let q = fixture("qwen2");
    let out = lone()
        .args([
            "run",
            "-m",
            q.to_str().unwrap(),
            "--prompt-ids",
            "1",
            "-n",
            "1",
            "-t",
            "100000",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than the"));
}
