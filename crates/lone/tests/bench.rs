//! `lone bench` on the tiny reference fixtures: the JSON lines have the documented shape and
//! every number is positive and finite. No timing thresholds.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn lone() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lone"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/fixtures")
        .join(name)
}

fn bench_lines(args: &[&str]) -> Vec<Value> {
    let out = lone()
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lone bench failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x} in {v}");
    x
}

fn check_common(v: &Value) {
    assert_eq!(v["engine"], "lone");
    assert_eq!(v["backend"], "CPU");
    assert!(v["isa"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(v["cpu"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(v["model_name"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(v["threads"].as_u64().unwrap() >= 1);
    let size = positive(v, "size_bytes");
    positive(v, "params");
    let per_tok = positive(v, "weight_bytes_per_token");
    assert!(per_tok <= size, "{v}");
    positive(v, "peak_rss_bytes");
}

#[test]
fn depth_runs_the_tests_after_a_filled_context() {
    let model = fixture("lfm3");
    let lines = bench_lines(&[
        "--model",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "-d",
        "20",
        "-r",
        "1",
    ]);
    let tests: Vec<&str> = lines.iter().filter_map(|v| v["test"].as_str()).collect();
    assert!(
        tests.contains(&"pp8 @ d20") && tests.contains(&"tg4 @ d20"),
        "{tests:?}"
    );
    for v in lines.iter().filter(|v| v["test"] != "cold_start") {
        assert_eq!(v["depth"], 20, "{v}");
        positive(v, "avg_ts");
    }
}

#[test]
fn fast_flag_selects_fast_mode() {
    let model = fixture("llama/model-q4_0.gguf");
    let m = model.to_str().unwrap();
    // The default (auto) is exact except on the x86 kernels (8-bit decode there).
    let auto = bench_lines(&["--model", m, "-p", "16", "-n", "0", "-r", "1"]);
    assert!(
        !auto.is_empty()
            && auto.iter().all(|v| v["mode"]
                == if v["isa"] == "avx2" || v["isa"] == "avx512" {
                    "auto"
                } else {
                    "exact"
                }),
        "{auto:?}"
    );
    assert!(auto.iter().all(|v| v["cache_type"] == "f16"), "{auto:?}");
    let exact = bench_lines(&[
        "--exact",
        "--cache-type",
        "f32",
        "--model",
        m,
        "-p",
        "16",
        "-n",
        "0",
        "-r",
        "1",
    ]);
    assert!(exact.iter().all(|v| v["cache_type"] == "f32"), "{exact:?}");
    assert!(
        !exact.is_empty() && exact.iter().all(|v| v["mode"] == "exact"),
        "{exact:?}"
    );
    let fast = bench_lines(&["--fast", "--model", m, "-p", "16", "-n", "0", "-r", "1"]);
    assert!(
        !fast.is_empty() && fast.iter().all(|v| v["mode"] == "fast"),
        "{fast:?}"
    );
}

#[test]
fn pp_tg_json_lines() {
    for model in [
        fixture("llama"),
        fixture("llama/model-q4_0.gguf"),
        fixture("lfm2_a"),
    ] {
        let lines = bench_lines(&[
            "--model",
            model.to_str().unwrap(),
            "-p",
            "16,32",
            "-n",
            "8",
            "-r",
            "2",
            "--threads",
            "2",
        ]);
        let tests: Vec<&str> = lines.iter().map(|v| v["test"].as_str().unwrap()).collect();
        assert_eq!(tests, ["cold_start", "pp16", "pp32", "tg8"], "{model:?}");
        for v in &lines {
            check_common(v);
        }
        let cold = &lines[0];
        for k in [
            "load_s",
            "tokenizer_s",
            "first_token_s",
            "start_to_first_token_s",
            "rss_after_load_bytes",
        ] {
            positive(cold, k);
        }
        assert!(
            positive(cold, "start_to_first_token_s") >= positive(cold, "first_token_s"),
            "{cold}"
        );
        for (v, np, ng) in [(&lines[1], 16, 0), (&lines[2], 32, 0), (&lines[3], 0, 8)] {
            assert_eq!(v["n_prompt"], np);
            assert_eq!(v["n_gen"], ng);
            assert_eq!(v["reps"], 2);
            for k in ["samples_s", "samples_ts"] {
                let xs = v[k].as_array().unwrap();
                assert_eq!(xs.len(), 2, "{v}");
                assert!(xs
                    .iter()
                    .all(|x| x.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)));
            }
            positive(v, "avg_ts");
            let sd = v["stddev_ts"].as_f64().unwrap();
            assert!(sd.is_finite() && sd >= 0.0);
        }
    }
    // The label says the file type of a GGUF.
    let v = &bench_lines(&[
        "-m",
        fixture("llama/model-q4_0.gguf").to_str().unwrap(),
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
    ])[1];
    assert_eq!(v["quant"], "Q4_0");
    assert_eq!(v["test"], "tg2");
    // llama.cpp's file types 25 and 30 (`general.file_type`): the i-quants.
    for (file, quant) in [
        ("llama/model-iq4_nl.gguf", "IQ4_NL"),
        ("llama/model-iq4_xs.gguf", "IQ4_XS"),
    ] {
        let m = fixture(file);
        let v = &bench_lines(&["-m", m.to_str().unwrap(), "-p", "4", "-n", "2", "-r", "1"]);
        assert!(v.iter().all(|v| v["quant"] == quant), "{v:?}");
        assert!(v.iter().any(|v| v["test"] == "tg2"), "{v:?}");
    }
}

#[test]
fn suite_json_lines() {
    let lines = bench_lines(&[
        "-m",
        fixture("llama").to_str().unwrap(),
        "--suite",
        "--suite-max-tokens",
        "4",
    ]);
    let tests: Vec<&str> = lines.iter().map(|v| v["test"].as_str().unwrap()).collect();
    assert_eq!(
        tests,
        [
            "cold_start",
            "suite:tiny",
            "suite:short",
            "suite:medium",
            "suite:long",
            "suite:stress"
        ]
    );
    let mut ran = 0;
    let mut last_len = 0;
    for v in &lines[1..] {
        check_common(v);
        let n = v["prompt_tokens"].as_u64().unwrap();
        assert!(n > last_len, "prompts grow: {v}");
        last_len = n;
        if v.get("skipped").is_some() {
            // The fixture's 2048-token context cannot hold the byte-level stress prompt.
            continue;
        }
        ran += 1;
        for k in ["prefill_ts", "ttft_s", "total_s"] {
            positive(v, k);
        }
        let new = v["new_tokens"].as_u64().unwrap();
        assert!((1..=4).contains(&new), "{v}");
        if new > 1 {
            positive(v, "decode_ts");
        }
        assert!(v["total_s"].as_f64() >= v["ttft_s"].as_f64());
    }
    assert!(ran >= 4, "{lines:?}");
}

#[test]
fn membw_json() {
    let lines = bench_lines(&["--membw", "--membw-mib", "16", "-r", "2", "-t", "2"]);
    assert_eq!(lines.len(), 1);
    let v = &lines[0];
    assert_eq!(v["test"], "membw");
    assert_eq!(v["buffer_bytes"], 16u64 << 20);
    assert_eq!(v["threads"], 2);
    assert_eq!(v["samples_gbs"].as_array().unwrap().len(), 2);
    positive(v, "best_gbs");
    positive(v, "avg_gbs");
}

#[test]
fn human_table() {
    let out = lone()
        .args(["bench", "-m"])
        .arg(fixture("qwen2"))
        .args(["-p", "8", "-n", "4", "-r", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        s.contains("| model | size | params | backend | threads | test | t/s |"),
        "{s}"
    );
    assert!(s.contains("| pp8 |") && s.contains("| tg4 |"), "{s}");
    assert!(
        s.contains(" exact | ") || s.contains(" auto | "),
        "the mode is in the backend column: {s}"
    );
    assert!(s.contains("cold start:") && s.contains("peak RSS"), "{s}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let llama = fixture("llama");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["-m", llama.to_str().unwrap(), "-r", "0"], "--reps"),
        (
            vec!["-m", llama.to_str().unwrap(), "-p", "5000", "-n", "0"],
            "context",
        ),
        (vec!["-m", "/nonexistent/model.gguf"], "cannot load model"),
        (vec!["--membw", "--membw-mib", "0"], "--membw-mib"),
    ];
    for (args, needle) in cases {
        let out = lone().arg("bench").args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
