//! `lone convert` against llama.cpp's own tools on the fixture checkpoints:
//! - at F32/F16/BF16/Q8_0, a checkpoint must become the very bytes convert_hf_to_gguf.py wrote
//!   (`tests/reference/fixtures/<name>/model-<type>.gguf`);
//! - at every llama-quantize type, the converter's F32 file (and the checkpoint itself) must
//!   become the very bytes llama-quantize wrote (sha256 in
//!   `tests/reference/convert/llama-quantize.json`, from `generate.py` there);
//! - the files lone writes load and generate in lone, and bad inputs fail cleanly.

use std::path::{Path, PathBuf};
mod common;

use common::{lone, reference, sha256};

fn fixture(name: &str) -> PathBuf {
    reference().join("fixtures").join(name)
}

const FAMILIES: [&str; 6] = ["lfm2_a", "lfm2_b", "qwen2", "qwen3", "llama", "lfm3"];

/// `lone convert INPUT -o OUT -t TYPE`, which must succeed; OUT's bytes.
fn convert(input: &Path, out: &Path, ty: &str) -> Vec<u8> {
    convert_with(input, out, ty, &[])
}

/// [`convert`] with extra arguments, run in `tests/reference/convert` (where the imatrix
/// files are, so their recorded names match llama-quantize's).
fn convert_with(input: &Path, out: &Path, ty: &str, extra: &[&str]) -> Vec<u8> {
    let o = convert_output(input, out, ty, extra);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "convert {} {ty}: {stderr}",
        input.display()
    );
    std::fs::read(out).unwrap()
}

/// The `lone convert` run of [`convert_with`], whatever its outcome.
fn convert_output(input: &Path, out: &Path, ty: &str, extra: &[&str]) -> std::process::Output {
    lone()
        .current_dir(reference().join("convert"))
        .arg("convert")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(["-t", ty, "--force", "--threads", "2"])
        // The fixtures' tokenizer is a small byte-level BPE that llama.cpp's hash table does
        // not know; their GGUFs were converted with `tokenizer.ggml.pre = gpt-2`.
        .args(["--tokenizer-pre", "gpt-2"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn checkpoints_convert_to_the_bytes_llama_cpps_converter_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for fam in FAMILIES {
        for ty in ["f32", "f16", "bf16", "q8_0"] {
            let want = std::fs::read(fixture(fam).join(format!("model-{ty}.gguf"))).unwrap();
            let got = convert(&fixture(fam), &dir.path().join("out.gguf"), ty);
            assert!(
                got == want,
                "{fam} {ty}: lone wrote {} bytes, the converter {}; first difference at byte {:?}",
                got.len(),
                want.len(),
                got.iter().zip(&want).position(|(a, b)| a != b)
            );
            n += 1;
        }
    }
    assert_eq!(n, 24);
}

/// LFM2-MoE: the experts of each layer (one tensor per expert in the Hub's layout, or
/// transformers 5.x's fused `gate_up_proj`/`down_proj`) stacked into `ffn_*_exps` exactly as
/// llama.cpp's converter stacks them: the same metadata and tensor bytes as the converter's file,
/// plus one key the converter drops (`lfm2moe.expert_weights_scale`: the fixture's checkpoint
/// scales its expert weights by 1.7, which a file without the key would lose).
#[test]
fn moe_checkpoints_convert_to_the_converters_tensors_and_keep_their_scaling() {
    use lone_core::loader::gguf::GgufFile;
    let dir = tempfile::tempdir().unwrap();
    let scale_key = "lfm2moe.expert_weights_scale";
    for ty in ["f32", "f16", "bf16", "q8_0"] {
        let want = GgufFile::open(fixture("lfm2_moe").join(format!("model-{ty}.gguf"))).unwrap();
        for (layout, input) in [
            ("per-expert", fixture("lfm2_moe")),
            ("fused", fixture("lfm2_moe").join("fused")),
        ] {
            let out = dir.path().join(format!("{layout}-{ty}.gguf"));
            convert(&input, &out, ty);
            let got = GgufFile::open(&out).unwrap();
            let what = format!("lfm2_moe {layout} {ty}");
            assert_eq!(
                got.meta(scale_key).and_then(|v| v.as_f64()),
                Some(1.7f32 as f64),
                "{what}"
            );
            if layout == "per-expert" {
                // (the fused directory's name and 5.x config give other general.* names)
                let keys: Vec<&String> = got.kv_order.iter().filter(|k| *k != scale_key).collect();
                assert_eq!(keys, want.kv_order.iter().collect::<Vec<_>>(), "{what}");
                for k in &want.kv_order {
                    assert_eq!(
                        format!("{:?}", got.meta(k)),
                        format!("{:?}", want.meta(k)),
                        "{what}: {k}"
                    );
                }
            }
            let names = |g: &GgufFile| {
                g.tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.dtype, t.shape.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(names(&got), names(&want), "{what}");
            for t in &want.tensors {
                let (a, b) = (got.tensor(&t.name).unwrap(), want.tensor(&t.name).unwrap());
                assert!(a.data() == b.data(), "{what}: {} differs", t.name);
            }
        }
    }
}

/// llama-quantize on an LFM2-MoE GGUF (the converter's F32 file → Q4_0): the stacked experts
/// quantized row by row, the router kept F32, and llama.cpp's rule for a model of exactly 8
/// experts (attention K and V in Q8_0) — the very bytes llama-quantize wrote.
#[test]
fn moe_ggufs_requantize_to_llama_quantizes_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let want = std::fs::read(fixture("lfm2_moe").join("model-q4_0.gguf")).unwrap();
    let got = convert(
        &fixture("lfm2_moe").join("model-f32.gguf"),
        &dir.path().join("q4_0.gguf"),
        "q4_0",
    );
    assert!(
        got == want,
        "lone wrote {} bytes, llama-quantize {}; first difference at byte {:?}",
        got.len(),
        want.len(),
        got.iter().zip(&want).position(|(a, b)| a != b)
    );
}

#[test]
fn model_cards_and_named_templates_give_the_converters_metadata() {
    // tests/reference/convert/model_card.py: the llama fixture in directories with a README.md
    // (front matter or none), a config.json `_name_or_path`, named chat templates
    // (tokenizer_config.json lists, additional_chat_templates/), converted by llama.cpp.
    let refs: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(reference().join("convert/model-card.json")).unwrap(),
    )
    .unwrap();
    let cases = refs["cases"].as_array().unwrap();
    assert!(cases.len() >= 7);
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("llama");
    let merge = |path: &Path, with: &serde_json::Value| {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for (k, x) in with.as_object().unwrap() {
            v[k] = x.clone();
        }
        std::fs::write(path, serde_json::to_string(&v).unwrap()).unwrap();
    };
    for c in cases {
        let dir = tmp.path().join(c["dir"].as_str().unwrap());
        std::fs::create_dir(&dir).unwrap();
        for f in [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        merge(&dir.join("config.json"), &c["config"]);
        if let Some(tc) = c.get("tokenizer_config") {
            merge(&dir.join("tokenizer_config.json"), tc);
        }
        for f in c
            .get("remove")
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
        {
            std::fs::remove_file(dir.join(f.as_str().unwrap())).unwrap();
        }
        for (f, text) in c
            .get("files")
            .and_then(|r| r.as_object())
            .into_iter()
            .flatten()
        {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text.as_str().unwrap()).unwrap();
        }
        std::fs::write(dir.join("README.md"), c["readme"].as_str().unwrap()).unwrap();
        let out = tmp
            .path()
            .join(format!("{}.gguf", c["dir"].as_str().unwrap()));
        let got = convert(&dir, &out, "F32");
        let o = lone()
            .arg("inspect")
            .arg(&out)
            .args(["--json", "--no-tensors"])
            .output()
            .unwrap();
        if sha256(&got) != c["sha256"].as_str().unwrap() {
            panic!(
                "{}: lone wrote {} bytes, the converter {}; the converter's metadata: {}\nlone's file: {}",
                c["dir"],
                got.len(),
                c["size"],
                c["general"],
                String::from_utf8_lossy(&o.stdout)
            );
        }
        // What lone then renders with: the default template, the named ones beside it, and
        // llama.cpp's rule that a tool_use template stands in for a missing default.
        let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let meta = &c["general"];
        let named = meta["tokenizer.chat_templates"].as_array().cloned();
        for n in named.iter().flatten() {
            let n = n.as_str().unwrap();
            assert_eq!(
                info["chat_templates"][n],
                meta[format!("tokenizer.chat_template.{n}")],
                "{}",
                c["dir"]
            );
        }
        let default = match &meta["tokenizer.chat_template"] {
            serde_json::Value::Null => &meta["tokenizer.chat_template.tool_use"],
            t => t,
        };
        assert_eq!(&info["chat_template"], default, "{}", c["dir"]);
    }
}

#[test]
fn quantized_types_are_the_bytes_llama_quantize_writes() {
    let refs: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(reference().join("convert/llama-quantize.json")).unwrap(),
    )
    .unwrap();
    let cases = refs["cases"].as_array().unwrap();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    assert!(cases.iter().filter(|c| c["imatrix"].is_string()).count() >= 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let mut refused = 0;
    for c in cases {
        let fam = c["family"].as_str().unwrap();
        let ty = c["type"].as_str().unwrap();
        let imatrix: Vec<&str> = match c["imatrix"].as_str() {
            Some(f) => vec!["--imatrix", f],
            None => vec![],
        };
        if let Some(why) = c["error"].as_str() {
            // llama-quantize refused (an i-quant mix without an importance matrix): so does
            // lone, saying what it needs.
            let input = fixture(fam).join("model-f32.gguf");
            let o = convert_output(&input, &out, ty, &imatrix);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert!(
                !o.status.success() && stderr.contains("needs an importance matrix"),
                "{fam} {ty}: llama-quantize refused ({why}), lone: {stderr}"
            );
            refused += 1;
            continue;
        }
        let want = c["sha256"].as_str().unwrap();
        let from_gguf = convert_with(&fixture(fam).join("model-f32.gguf"), &out, ty, &imatrix);
        assert_eq!(
            (from_gguf.len() as u64, sha256(&from_gguf).as_str()),
            (c["bytes"].as_u64().unwrap(), want),
            "{fam} {ty} {imatrix:?} from model-f32.gguf differs from llama-quantize's file (types it chose: {})",
            c["tensor_types"]
        );
        // From the checkpoint directly: the converter's F32 file, then llama-quantize. Not
        // lfm2_moe, whose checkpoint's expert scaling lone keeps and the converter drops
        // (`moe_checkpoints_convert_to_the_converters_tensors_and_keep_their_scaling`).
        if matches!(ty, "Q4_K_M" | "Q2_K" | "Q6_K" | "Q5_0") && fam != "lfm2_moe" {
            let from_hf = convert_with(&fixture(fam), &out, ty, &imatrix);
            assert_eq!(
                sha256(&from_hf),
                want,
                "{fam} {ty} {imatrix:?} from the checkpoint"
            );
        }
    }
    assert!(refused >= 6, "{refused} refusals");
}

#[test]
fn imatrix_statistics_are_llama_imatrixs() {
    // llama-imatrix's files (tests/reference/convert/generate.py: the LFM license text,
    // -c 128, 8 chunks) against lone imatrix on the same model and text. The sums differ only
    // by f32 summation order (measured: 9e-6 relative); names, shapes, counts, chunk metadata
    // are equal.
    use lone_core::imatrix::Imatrix;
    let text = reference().join("tokenizer/assets/lfm2/LICENSE.lfm1.0.txt");
    let dir = tempfile::tempdir().unwrap();
    for fam in ["llama", "lfm2_a", "lfm2_moe"] {
        let want = Imatrix::load(&reference().join(format!("convert/{fam}.imatrix.gguf"))).unwrap();
        let legacy =
            Imatrix::load(&reference().join(format!("convert/{fam}.imatrix.dat"))).unwrap();
        let out = dir.path().join(format!("{fam}.gguf"));
        let o = lone()
            .args(["imatrix", "-c", "128", "--chunks", "8", "-m"])
            .arg(fixture(fam).join("model-f32.gguf"))
            .arg("-f")
            .arg(&text)
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = Imatrix::load(&out).unwrap();
        assert_eq!(
            (got.chunk_count, got.chunk_size),
            (want.chunk_count, want.chunk_size)
        );
        assert_eq!(got.datasets, vec![text.to_string_lossy().into_owned()]);
        assert_eq!(
            got.entries.keys().collect::<Vec<_>>(),
            want.entries.keys().collect::<Vec<_>>(),
            "{fam}"
        );
        assert!(
            want.entries.len() >= 14,
            "{fam}: {} entries",
            want.entries.len()
        );
        for (name, w) in &want.entries {
            let g = &got.entries[name];
            assert_eq!(g.counts, w.counts, "{fam} {name}");
            assert_eq!(g.sums.len(), w.sums.len(), "{fam} {name}");
            for (a, b) in g.sums.iter().zip(&w.sums) {
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs().max(1e-30),
                    "{fam} {name}: {a} vs {b}"
                );
            }
            // The legacy file holds the same statistics as means per call.
            let (l, i) = (
                legacy.importance(name).unwrap(),
                want.importance(name).unwrap(),
            );
            for (a, b) in l.iter().zip(&i) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1e-30),
                    "{fam} {name} legacy"
                );
            }
        }
    }
}

/// `lone perplexity --kl-divergence` of `model` against `reference` on `text`: mean KL.
fn kl(model: &Path, reference: &Path, text: &Path) -> f64 {
    let o = lone()
        .args([
            "perplexity",
            "-c",
            "128",
            "--chunks",
            "2",
            "--kl-divergence",
            "--json",
            "-m",
        ])
        .arg(model)
        .arg("-r")
        .arg(reference)
        .arg("-f")
        .arg(text)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["kld_mean"].as_f64().unwrap()
}

#[test]
fn target_bpw_beats_q4_k_m_at_no_larger_size() {
    // --target-bpw at the bits per weight of llama-quantize's Q4_K_M of the same source: the
    // file must be no larger and its KL divergence from the source (measured on the
    // calibration text by lone perplexity, independently of the search) lower. Measured here:
    // llama 0.0064 vs 0.0087, lfm2_a 0.0092 vs 0.033, qwen2 0.0032 vs 0.0044.
    let text = reference().join("tokenizer/assets/lfm2/LICENSE.lfm1.0.txt");
    let dir = tempfile::tempdir().unwrap();
    for fam in ["llama", "lfm2_a", "qwen2"] {
        let src = fixture(fam).join("model-f32.gguf");
        let q4 = dir.path().join(format!("{fam}-q4km.gguf"));
        let q4_bytes = convert(&src, &q4, "Q4_K_M");
        let params = |p: &Path| -> f64 {
            let o = lone()
                .arg("inspect")
                .arg(p)
                .args(["--json", "--no-tensors"])
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            v["weight_bytes"].as_f64().unwrap() * 8.0 / v["params"].as_f64().unwrap()
        };
        let bpw = params(&q4);
        let tb = dir.path().join(format!("{fam}-tb.gguf"));
        let tb_bytes = convert_with(
            &src,
            &tb,
            "F32",
            &[
                "--target-bpw",
                &format!("{bpw:.4}"),
                "--calibration",
                text.to_str().unwrap(),
            ],
        );
        assert!(
            params(&tb) <= bpw + 1e-9,
            "{fam}: {} bpw over the {bpw} target",
            params(&tb)
        );
        assert!(
            tb_bytes.len() <= q4_bytes.len() + 4096,
            "{fam}: larger file"
        );
        let (k_tb, k_q4) = (kl(&tb, &src, &text), kl(&q4, &src, &text));
        assert!(
            k_tb < k_q4,
            "{fam}: KL {k_tb} (target-bpw) vs {k_q4} (Q4_K_M)"
        );
    }
}

#[test]
fn a_sensitivity_table_is_reused_and_checked() {
    // A second --target-bpw on the same source and calibration measures nothing and, at the
    // same target, writes the bytes of a search without the table; another calibration text
    // is refused, as is a file that is not a table.
    let text = reference().join("tokenizer/assets/lfm2/LICENSE.lfm1.0.txt");
    let other = reference().join("tokenizer/assets/lfm2/chat_template.jinja");
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("llama").join("model-f32.gguf");
    let table = dir.path().join("llama.sensitivity.json");
    let search = |out: &str, bpw: &str, calibration: &Path, table: Option<&Path>| {
        let mut extra = vec!["--target-bpw", bpw, "--calibration"];
        extra.push(calibration.to_str().unwrap());
        if let Some(t) = table {
            extra.extend(["--sensitivity", t.to_str().unwrap()]);
        }
        let out = dir.path().join(out);
        let o = convert_output(&src, &out, "F32", &extra);
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        (
            o.status.success(),
            stderr,
            std::fs::read(&out).unwrap_or_default(),
        )
    };
    let measured = |stderr: &str| -> usize {
        let at = stderr.find(" measurements").expect(stderr);
        let n = stderr[..at].rsplit(' ').next().unwrap();
        n.parse().unwrap_or_else(|_| panic!("{stderr}"))
    };
    let (ok, first, a) = search("a.gguf", "5.0", &text, Some(&table));
    assert!(ok, "{first}");
    assert!(measured(&first) > 10, "{first}");
    assert!(!first.contains("from the sensitivity table"), "{first}");
    let (ok, second, b) = search("b.gguf", "4.5", &text, Some(&table));
    assert!(ok, "{second}");
    assert_eq!(measured(&second), 0, "{second}");
    assert!(
        second.contains(&format!(
            "({} more from the sensitivity table)",
            measured(&first)
        )),
        "{second}"
    );
    assert!(b.len() < a.len(), "4.5 bpw is not smaller than 5.0");
    let (ok, plain, c) = search("c.gguf", "5.0", &text, None);
    assert!(ok, "{plain}");
    assert!(a == c, "the table changed the search's choice");
    let (ok, refused, _) = search("d.gguf", "5.0", &other, Some(&table));
    assert!(!ok && refused.contains("fingerprint differs"), "{refused}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"format\": \"something else\"}").unwrap();
    let (ok, refused, _) = search("e.gguf", "5.0", &text, Some(&bad));
    assert!(!ok && refused.contains("sensitivity table"), "{refused}");
}

#[test]
fn a_converted_file_runs_with_transformers_logits() {
    // The Q4_K_M file lone writes from the llama checkpoint, run by lone on the exact path:
    // its logits are transformers' on the dequantized weights of llama-quantize's Q4_K_M file
    // (gguf-q4_k.logits.npy, from tests/reference/generate.py) to 1e-4.
    let fam = fixture("llama");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q4km.gguf");
    convert(&fam, &out, "Q4_K_M");
    let ids = |f: &str| -> Vec<String> {
        let v: Vec<u32> =
            serde_json::from_str(&std::fs::read_to_string(fam.join(f)).unwrap()).unwrap();
        v.iter().map(|i| i.to_string()).collect()
    };
    // The reference rows follow the f32 model's greedy tokens: feed them as the prompt.
    let mut prompt = ids("prompt_ids.json");
    prompt.extend(ids("greedy.json").into_iter().take(6));
    let npy = dir.path().join("logits.npy");
    let n = 1;
    let o = lone()
        .args([
            "--exact",
            "--cache-type",
            "f32",
            "run",
            "--ignore-eos",
            "--model",
        ])
        .arg(&out)
        .args(["--prompt-ids", &prompt.join(","), "-n", &n.to_string()])
        .arg("--dump-logits")
        .arg(&npy)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = lone_core::npy::read(&npy).unwrap();
    let want = lone_core::npy::read(&fam.join("gguf-q4_k.logits.npy")).unwrap();
    let rows = prompt.len() + n - 1;
    let v = want.shape[1];
    assert_eq!(got.shape, vec![rows, v]);
    let worst = got
        .data
        .iter()
        .zip(&want.data[..rows * v])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-4, "max |Δ logit| {worst:e}");
}

#[test]
fn bad_inputs_fail_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let run = |args: &[&str]| {
        let o = lone().arg("convert").args(args).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(!e.contains("panicked"), "{e}");
        e
    };
    let outs = out.to_str().unwrap();
    let fam = fixture("llama");
    let f = fam.to_str().unwrap();
    assert!(run(&[f, "-o", outs, "-t", "Q9_9"]).contains("unknown type"));
    // The lowest-bit i-quants need an importance matrix, as in llama-quantize.
    for t in ["IQ2_XXS", "iq1_s", "IQ2_M"] {
        let e = run(&[f, "-o", outs, "-t", t, "--tokenizer-pre", "gpt-2"]);
        assert!(e.contains("needs an importance matrix"), "{e}");
    }
    assert!(run(&["/nonexistent/dir", "-o", outs]).contains("no such file"));
    // The fixture tokenizer is not in llama.cpp's pre-tokenizer table: say so and name the
    // flag.
    assert!(run(&[f, "-o", outs, "-t", "f16"]).contains("--tokenizer-pre"));
    std::fs::write(&out, b"x").unwrap();
    assert!(run(&[f, "-o", outs, "-t", "f16", "--tokenizer-pre", "gpt-2"]).contains("--force"));
    // A corrupt GGUF input.
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let e = run(&[
        bad.to_str().unwrap(),
        "-o",
        dir.path().join("y.gguf").to_str().unwrap(),
    ]);
    assert!(e.contains("cannot convert"), "{e}");
    assert!(!dir.path().join("y.gguf").exists());
}

/// A vision-language checkpoint: the language model to `-o` and the vision side to
/// `--mmproj`, as the very bytes of the fixture's pair — LFM2-VL's written by llama.cpp's
/// converter (`convert_hf_to_gguf.py` and `--mmproj`, F32/F16/Q8_0), LFM3-VL's by
/// `tests/reference/vision/generate_lfm3_vl.py` (lone's layout: llama.cpp has no LFM3-VL).
/// The mmproj's type follows `--type` when the converter has it, else F16; `--mmproj` on a
/// text checkpoint or a GGUF input is an error, and nothing is written.
#[test]
fn vision_checkpoints_convert_to_their_gguf_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let (out, mm) = (dir.path().join("lm.gguf"), dir.path().join("mmproj.gguf"));
    let mut n = 0;
    for fam in ["lfm2_vl", "lfm3_vl"] {
        for (ty, mm_type, want_mm) in [
            ("f32", None, "f32"),
            ("f32", Some("f16"), "f16"),
            ("f32", Some("q8_0"), "q8_0"),
            ("Q4_K_M", None, "f16"),
        ] {
            let mut extra = vec!["--mmproj", mm.to_str().unwrap()];
            if let Some(t) = mm_type {
                extra.extend(["--mmproj-type", t]);
            }
            let got = convert_with(&fixture(fam), &out, ty, &extra);
            if ty == "f32" {
                let want = std::fs::read(fixture(fam).join("model-f32.gguf")).unwrap();
                assert!(got == want, "{fam}: the language model's bytes");
            }
            let got = std::fs::read(&mm).unwrap();
            let want = std::fs::read(fixture(fam).join(format!("mmproj-{want_mm}.gguf"))).unwrap();
            assert!(
                got == want,
                "{fam} {ty} {mm_type:?}: the mmproj ({} bytes, want {}); first difference at {:?}",
                got.len(),
                want.len(),
                got.iter().zip(&want).position(|(a, b)| a != b)
            );
            n += 1;
        }
    }
    assert_eq!(n, 8);
    let _ = std::fs::remove_file(&mm);
    for (input, msg) in [
        (fixture("qwen2"), "no vision side"),
        (
            fixture("lfm2_vl").join("model-f32.gguf"),
            "checkpoint directory",
        ),
    ] {
        let o = convert_output(&input, &out, "f16", &["--mmproj", mm.to_str().unwrap()]);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains(msg), "{e}");
        assert!(!mm.exists());
    }
}
