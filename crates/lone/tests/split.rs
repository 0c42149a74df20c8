//! Split GGUF files (`NAME-00001-of-0000N.gguf` …) against llama.cpp's `llama-gguf-split`:
//! - `lone gguf-split` and `lone convert --split-max-*` write the very parts llama-gguf-split
//!   writes, and `--merge` the very file (sha256 in `tests/reference/split/llama-gguf-split.json`,
//!   from `generate.py` there);
//! - a split loads from its first part and computes what the whole file computes;
//! - a wrong part, a missing part, a renamed first part or a wrong tensor count is refused
//!   with a message.

mod common;

use std::path::{Path, PathBuf};

use common::{fails_with, lone, ok, reference, sha256, smollm2};
use serde_json::Value;

fn recorded() -> Value {
    let s = std::fs::read_to_string(reference().join("split/llama-gguf-split.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

fn sha256_file(p: &Path) -> String {
    sha256(&std::fs::read(p).unwrap())
}

/// The parts `prefix-*` must be the recorded case's, part for part.
fn check_parts(case: &Value, prefix: &Path) {
    let name = case["name"].as_str().unwrap();
    let parts = case["parts"].as_array().unwrap();
    for part in parts {
        let p = PathBuf::from(format!(
            "{}{}",
            prefix.display(),
            part["name"].as_str().unwrap()
        ));
        assert!(p.exists(), "{name}: lone did not write {}", p.display());
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            part["bytes"].as_u64().unwrap(),
            "{name}: size of {}",
            p.display()
        );
        assert_eq!(
            sha256_file(&p),
            part["sha256"].as_str().unwrap(),
            "{name}: bytes of {}",
            p.display()
        );
    }
    // No extra part.
    let n = parts.len();
    let extra = PathBuf::from(format!(
        "{}-{:05}-of-{:05}.gguf",
        prefix.display(),
        n + 1,
        n
    ));
    assert!(!extra.exists());
}

fn case<'a>(rec: &'a Value, name: &str) -> &'a Value {
    rec["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

fn args_of(case: &Value) -> Vec<String> {
    case["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn splits_and_merges_are_the_bytes_llama_gguf_split_writes() {
    let rec = recorded();
    let dir = tempfile::tempdir().unwrap();
    let fixture = reference().join("fixtures/llama/model-f32.gguf");
    for name in ["llama-f32-t5", "llama-f32-t7-nofirst"] {
        let c = case(&rec, name);
        let prefix = dir.path().join(name);
        ok(
            lone()
                .arg("gguf-split")
                .args(args_of(c))
                .arg(&fixture)
                .arg(&prefix)
                .output()
                .unwrap(),
            name,
        );
        check_parts(c, &prefix);
    }
    // The default model by size, then merged back.
    let c = case(&rec, "smollm2-40M");
    let prefix = dir.path().join("smollm2-40M");
    ok(
        lone()
            .arg("gguf-split")
            .arg("--split")
            .args(args_of(c))
            .arg(smollm2())
            .arg(&prefix)
            .output()
            .unwrap(),
        "smollm2",
    );
    check_parts(c, &prefix);
    let merged = dir.path().join("merged.gguf");
    let first = dir.path().join("smollm2-40M-00001-of-00003.gguf");
    ok(
        lone()
            .args(["gguf-split", "--merge"])
            .arg(&first)
            .arg(&merged)
            .output()
            .unwrap(),
        "merge",
    );
    assert_eq!(
        std::fs::metadata(&merged).unwrap().len(),
        rec["merged"]["bytes"].as_u64().unwrap()
    );
    assert_eq!(
        sha256_file(&merged),
        rec["merged"]["sha256"].as_str().unwrap()
    );
    // The merged file is not read as a split (split.count = 0) and refuses a second merge
    // into an existing file.
    fails_with(
        lone()
            .args(["gguf-split", "--merge"])
            .arg(&first)
            .arg(&merged)
            .output()
            .unwrap(),
        "exists",
    );
    // Merging the merged file again: llama-gguf-split's "not a valid split count".
    fails_with(
        lone()
            .args(["gguf-split", "--merge"])
            .arg(&merged)
            .arg(dir.path().join("again.gguf"))
            .output()
            .unwrap(),
        "not a valid split count 0",
    );
}

#[test]
fn convert_writes_the_split_of_llama_quantizes_file() {
    let rec = recorded();
    let c = case(&rec, "lfm2_a-q4_k_m-t9");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lfm2_a-q4_k_m-t9.gguf");
    ok(
        lone()
            .arg("convert")
            .arg(reference().join("fixtures/lfm2_a/model-f32.gguf"))
            .arg("-o")
            .arg(&out)
            .args(["-t", "Q4_K_M", "--threads", "2"])
            .args(args_of(c))
            .output()
            .unwrap(),
        "convert",
    );
    check_parts(c, &dir.path().join("lfm2_a-q4_k_m-t9"));
    assert!(!out.exists(), "a split output writes only the parts");
}

#[test]
fn keep_split_is_the_cut_llama_quantize_keeps() {
    // `lone convert SPLIT -t T --keep-split` against `llama-quantize --keep-split` of the same
    // parts (themselves lone gguf-split's, checked above to be llama-gguf-split's).
    let rec = recorded();
    let dir = tempfile::tempdir().unwrap();
    let fixture = reference().join("fixtures/llama/model-f32.gguf");
    for name in ["llama-f32-t5", "llama-f32-t7-nofirst"] {
        let prefix = dir.path().join(name);
        let o = lone()
            .arg("gguf-split")
            .args(args_of(case(&rec, name)))
            .arg(&fixture)
            .arg(&prefix)
            .output()
            .unwrap();
        ok(o, name);
    }
    for c in rec["keep_split"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let input = match c["source"].as_str().unwrap() {
            "fixtures/llama/model-f32.gguf" => fixture.clone(),
            s => dir.path().join(format!("{s}-00001-of-00004.gguf")),
        };
        let out = dir.path().join(format!("{name}.gguf"));
        let o = lone()
            .arg("convert")
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .args(["-t", c["type"].as_str().unwrap(), "--keep-split"])
            .output()
            .unwrap();
        ok(o, name);
        check_parts(c, &dir.path().join(name));
        assert!(!out.exists(), "{name}: only the parts are written");
    }
    // The parts load as one model; a checkpoint directory has no cut to keep; the output may
    // not replace the input's parts; --keep-split goes with no other split option.
    let first = dir.path().join("llama-f32-t5-q4_k_m-00001-of-00004.gguf");
    ok(
        lone()
            .args(["run", "--prompt-ids", "1,2,3", "-n", "2", "--model"])
            .arg(&first)
            .output()
            .unwrap(),
        "run the kept split",
    );
    let keep = |input: &Path, out: &Path, extra: &[&str]| {
        lone()
            .arg("convert")
            .arg(input)
            .arg("-o")
            .arg(out)
            .args(["-t", "Q8_0", "--keep-split", "--force"])
            .args(extra)
            .output()
            .unwrap()
    };
    fails_with(
        keep(
            &reference().join("fixtures/llama"),
            &dir.path().join("x.gguf"),
            &[],
        ),
        "needs a GGUF input",
    );
    fails_with(
        keep(
            &dir.path().join("llama-f32-t5-00001-of-00004.gguf"),
            &dir.path().join("llama-f32-t5.gguf"),
            &[],
        ),
        "would overwrite an input part",
    );
    fails_with(
        keep(
            &first,
            &dir.path().join("y.gguf"),
            &["--split-max-tensors", "3"],
        ),
        "cannot be used with",
    );
}

/// `lone run --prompt-ids … --dump-logits` on `model`: the logits file's bytes and the ids.
fn logits(model: &Path, npy: &Path) -> (Vec<u8>, Value) {
    let o = ok(
        lone()
            .args(["run", "--model"])
            .arg(model)
            .args([
                "--prompt-ids",
                "1,5,9,13,2",
                "-n",
                "6",
                "--ignore-eos",
                "--json",
            ])
            .arg("--dump-logits")
            .arg(npy)
            .output()
            .unwrap(),
        "run",
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    (std::fs::read(npy).unwrap(), v["generated_ids"].clone())
}

#[test]
fn a_split_runs_as_the_whole_file_and_bad_splits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let whole = reference().join("fixtures/llama/model-f32.gguf");
    let parts = dir.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    let prefix = parts.join("m");
    ok(
        lone()
            .args(["gguf-split", "--split-max-tensors", "4"])
            .arg(&whole)
            .arg(&prefix)
            .output()
            .unwrap(),
        "split",
    );
    let n = std::fs::read_dir(&parts).unwrap().count();
    assert!(n > 2, "{n} parts");
    let part = |i: usize| parts.join(format!("m-{i:05}-of-{n:05}.gguf"));
    let (want, want_ids) = logits(&whole, &dir.path().join("a.npy"));
    let (got, got_ids) = logits(&part(1), &dir.path().join("b.npy"));
    assert_eq!(got_ids, want_ids);
    assert!(
        got == want,
        "the split's logits differ from the whole file's"
    );
    // A directory holding one split's parts is that model.
    let (got, _) = logits(&parts, &dir.path().join("c.npy"));
    assert!(got == want);
    // `inspect` counts every part.
    let o = ok(
        lone()
            .args(["inspect", "--json"])
            .arg(part(1))
            .output()
            .unwrap(),
        "inspect",
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["parts"], n);
    let sum: u64 = (1..=n)
        .map(|i| std::fs::metadata(part(i)).unwrap().len())
        .sum();
    assert_eq!(v["file_bytes"], sum);

    let run = |m: &Path| {
        lone()
            .args(["run", "--model"])
            .arg(m)
            .args(["--prompt-ids", "1", "-n", "1"])
            .output()
            .unwrap()
    };
    fails_with(run(&part(2)), "open the first part");
    let renamed = dir.path().join("renamed.gguf");
    std::fs::copy(part(1), &renamed).unwrap();
    fails_with(run(&renamed), "must be named");
    // A part that claims another place.
    let moved = dir.path().join("moved");
    std::fs::rename(part(n), &moved).unwrap();
    fails_with(run(&part(1)), "is missing");
    std::fs::copy(part(2), part(n)).unwrap();
    fails_with(run(&part(1)), "expected part");
    std::fs::rename(&moved, part(n)).unwrap();
    // A wrong total tensor count (split.tensors.count is an i32 after its key and type 5).
    let mut b = std::fs::read(part(1)).unwrap();
    let key = b"split.tensors.count";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    let count = i32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    b[at..at + 4].copy_from_slice(&(count + 1).to_le_bytes());
    std::fs::write(part(1), &b).unwrap();
    fails_with(run(&part(1)), "split.tensors.count");
    // Bad limits.
    fails_with(
        lone()
            .args(["gguf-split", "--split-max-size", "3K"])
            .arg(&whole)
            .arg(dir.path().join("x"))
            .output()
            .unwrap(),
        "M (megabytes) or G",
    );
    fails_with(
        lone()
            .args(["gguf-split", "--split-max-tensors", "0"])
            .arg(&whole)
            .arg(dir.path().join("x"))
            .output()
            .unwrap(),
        "at least 1",
    );
    fails_with(
        lone()
            .args(["gguf-split", "--merge"])
            .arg(&whole)
            .arg(dir.path().join("y.gguf"))
            .output()
            .unwrap(),
        "not a split",
    );
}
