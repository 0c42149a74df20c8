//! `lone verify`: check a model against a reference before trusting it — logits per prompt
//! position (cosine, max |Δ|, KL divergence, top-1 agreement, top-5 overlap), hidden states
//! per layer (cosine, relative error: where drift starts), and the first greedy divergence.
//!
//! The reference runs in transformers (a Python subprocess, for a Hugging Face checkpoint when
//! `import transformers` works), in lone itself (any model lone loads, e.g. the f32 source of
//! a quantized file), or is read from recorded outputs (`logits.npy`, `hidden.npy`,
//! `prompt_ids.json`, `greedy.json`: the format of lone's test fixtures, made by transformers).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use lone_core::text::TextIo;
use lone_core::{Batch, Model};
use serde_json::{json, Value};

use super::common;

const REFERENCE_PY: &str = include_str!("reference.py");

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Runtime {
    /// transformers for a checkpoint directory when Python has it, else lone.
    Auto,
    Transformers,
    Lone,
    /// Outputs recorded in the reference directory (logits.npy, hidden.npy, prompt_ids.json).
    Recorded,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The model to check (GGUF file or checkpoint directory).
    #[arg(long, short)]
    pub model: PathBuf,
    /// What to check it against.
    #[arg(long, short)]
    pub reference: PathBuf,
    /// How the reference runs.
    #[arg(long, value_enum, default_value = "auto")]
    pub reference_runtime: Runtime,
    /// Prompt text (default: a short English paragraph; recorded references bring their own).
    #[arg(long, short, conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Greedy tokens to generate with both and compare.
    #[arg(long, short = 'n', default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Fail when the mean logits cosine is below this.
    #[arg(long, default_value_t = 0.999)]
    pub min_cos: f64,
    /// Fail when the greedy tokens diverge before this many (default: all must agree).
    #[arg(long)]
    pub min_agree: Option<usize>,
    /// A layer "drifts" when its hidden-state cosine falls below this (reported, not failed).
    #[arg(long, default_value_t = 0.999)]
    pub layer_cos: f64,
    #[arg(long, short)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: bool,
}

const DEFAULT_PROMPT: &str = "The quick brown fox jumps over the lazy dog. Language models predict the next token from the ones before it, one step at a time.";

/// What one side produced.
struct Outputs {
    /// `[P, V]`.
    logits: Vec<f32>,
    /// `[layers + 1][P * H]` when available.
    hidden: Vec<Vec<f32>>,
    greedy: Vec<u32>,
    margins: Vec<f32>,
}

fn top2(row: &[f32]) -> (usize, f32) {
    let (mut a, mut b) = ((0usize, f32::NEG_INFINITY), f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > a.1 {
            b = a.1;
            a = (i, v);
        } else if v > b {
            b = v;
        }
    }
    (a.0, a.1 - b)
}

/// lone's logits, hidden states and greedy continuation on `prompt`.
fn lone_outputs(model: &Model, prompt: &[u32], n: usize) -> Result<Outputs> {
    let v = model.cfg.vocab_size;
    let mut cache = model.new_cache();
    let out = model.forward_opts(
        &Batch::for_sequence(0, 0, prompt, true),
        std::slice::from_mut(&mut cache),
        true,
    )?;
    let (mut greedy, mut margins) = (Vec::new(), Vec::new());
    let mut last = out.logits[(prompt.len() - 1) * v..].to_vec();
    for _ in 0..n {
        let (t, m) = top2(&last);
        greedy.push(t as u32);
        margins.push(m);
        if cache.len() + 1 >= model.cfg.max_position_embeddings {
            break;
        }
        let o = model.forward(
            &Batch::for_sequence(0, cache.len(), &[t as u32], true),
            std::slice::from_mut(&mut cache),
        )?;
        last = o.logits;
    }
    Ok(Outputs {
        logits: out.logits,
        hidden: out.hidden,
        greedy,
        margins,
    })
}

fn python_has_transformers() -> bool {
    Command::new("python3")
        .args(["-c", "import transformers, torch"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn read_npy(p: &Path) -> Result<lone_core::npy::NpyArray> {
    lone_core::npy::read(p).with_context(|| format!("cannot read {}", p.display()))
}

/// transformers' outputs, from the Python subprocess.
fn transformers_outputs(dir: &Path, prompt: &[u32], n: usize) -> Result<Outputs> {
    let tmp = tempdir()?;
    let script = tmp.join("reference.py");
    std::fs::write(&script, REFERENCE_PY)?;
    let ids = tmp.join("ids.json");
    std::fs::write(&ids, serde_json::to_string(prompt)?)?;
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .arg(&ids)
        .arg(&tmp)
        .arg(n.to_string())
        .output()
        .context("cannot run python3")?;
    if !out.status.success() {
        bail!(
            "the transformers reference failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let logits = read_npy(&tmp.join("logits.npy"))?;
    let hidden = read_npy(&tmp.join("hidden.npy"))?;
    let g: Value = serde_json::from_str(&std::fs::read_to_string(tmp.join("greedy.json"))?)?;
    let _ = std::fs::remove_dir_all(&tmp);
    let per = hidden.data.len() / hidden.shape.first().copied().unwrap_or(1).max(1);
    Ok(Outputs {
        logits: logits.data,
        hidden: hidden
            .data
            .chunks(per.max(1))
            .map(<[f32]>::to_vec)
            .collect(),
        greedy: g["tokens"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_u64().map(|t| t as u32))
            .collect(),
        margins: g["margins"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_f64().map(|m| m as f32))
            .collect(),
    })
}

fn tempdir() -> Result<PathBuf> {
    let base = std::env::temp_dir().join(format!(
        "lone-verify-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&base)?;
    Ok(base)
}

/// Outputs recorded in a fixture directory; returns them and the prompt they are for.
fn recorded_outputs(dir: &Path, v: usize) -> Result<(Vec<u32>, Outputs)> {
    let prompt: Vec<u32> = serde_json::from_str(
        &std::fs::read_to_string(dir.join("prompt_ids.json"))
            .with_context(|| format!("{} has no prompt_ids.json", dir.display()))?,
    )?;
    let logits = read_npy(&dir.join("logits.npy"))?;
    let p = prompt.len();
    if logits.data.len() < p * v {
        bail!(
            "{}: logits.npy has fewer rows than the prompt",
            dir.display()
        );
    }
    let hidden = match read_npy(&dir.join("hidden.npy")) {
        Ok(h) => {
            let per = h.data.len() / h.shape.first().copied().unwrap_or(1).max(1);
            h.data.chunks(per.max(1)).map(<[f32]>::to_vec).collect()
        }
        Err(_) => Vec::new(),
    };
    let greedy: Vec<u32> = std::fs::read_to_string(dir.join("greedy.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    // Logits rows after the prompt are the greedy steps': their margins.
    let rows = logits.data.len() / v;
    let margins = (0..greedy.len())
        .map(|i| p - 1 + i)
        .take_while(|&r| r < rows)
        .map(|r| top2(&logits.data[r * v..(r + 1) * v]).1)
        .collect();
    Ok((
        prompt,
        Outputs {
            logits: logits.data[..p * v].to_vec(),
            hidden,
            greedy,
            margins,
        },
    ))
}

fn softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = row.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    if aa == 0.0 && bb == 0.0 {
        1.0
    } else {
        ab / (aa.sqrt() * bb.sqrt()).max(1e-300)
    }
}

fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    idx.truncate(k);
    idx
}

pub fn run(a: VerifyArgs) -> Result<()> {
    let mpath = common::local_model(&a.model)?;
    let model = common::load_model(&mpath, a.threads)?;
    let text = TextIo::load(&model, &mpath).context("cannot load the model's tokenizer")?;
    let v = model.cfg.vocab_size;
    let runtime = match a.reference_runtime {
        Runtime::Auto if a.reference.join("logits.npy").exists() && a.prompt.is_none() && a.prompt_file.is_none() => Runtime::Recorded,
        Runtime::Auto if a.reference.join("config.json").exists() && python_has_transformers() => Runtime::Transformers,
        Runtime::Auto => Runtime::Lone,
        Runtime::Transformers if !python_has_transformers() => bail!(
            "--reference-runtime transformers needs Python with transformers and torch: `pip install torch transformers` (or use --reference-runtime lone)"
        ),
        r => r,
    };
    let prompt_text = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        (None, None) => DEFAULT_PROMPT.to_string(),
    };
    let (prompt, reference) = match runtime {
        Runtime::Recorded => recorded_outputs(&a.reference, v)?,
        _ => {
            let prompt = text.encode_raw(&prompt_text)?;
            if prompt.is_empty() || prompt.len() >= model.cfg.max_position_embeddings {
                bail!(
                    "the prompt has {} tokens; it must fit the model's context",
                    prompt.len()
                );
            }
            let r = if runtime == Runtime::Transformers {
                transformers_outputs(&a.reference, &prompt, a.max_new_tokens)?
            } else {
                let rpath = common::local_model(&a.reference)?;
                let rm = common::load_model(&rpath, a.threads)
                    .with_context(|| format!("cannot load the reference {}", rpath.display()))?;
                if rm.cfg.vocab_size != v {
                    bail!(
                        "the reference has {} logits, the model {v}: they are not the same model",
                        rm.cfg.vocab_size
                    );
                }
                lone_outputs(&rm, &prompt, a.max_new_tokens)?
            };
            (prompt, r)
        }
    };
    let p = prompt.len();
    if reference.logits.len() != p * v {
        bail!(
            "the reference's logits are {} values, expected {p} × {v}",
            reference.logits.len()
        );
    }
    let n_new = if runtime == Runtime::Recorded {
        reference.greedy.len()
    } else {
        a.max_new_tokens
    };
    let mine = lone_outputs(&model, &prompt, n_new)?;

    // Logits per position.
    let mut positions = Vec::new();
    let (mut cos_sum, mut kl_sum, mut agree, mut overlap, mut max_abs) =
        (0.0, 0.0, 0, 0usize, 0.0f32);
    let mut min_cos = (f64::INFINITY, 0);
    for i in 0..p {
        let (x, y) = (
            &mine.logits[i * v..(i + 1) * v],
            &reference.logits[i * v..(i + 1) * v],
        );
        let c = cosine(x, y);
        let d = x
            .iter()
            .zip(y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let (px, py) = (softmax(x), softmax(y));
        let kl: f64 = py
            .iter()
            .zip(&px)
            .map(|(&q, &p)| {
                if q > 0.0 {
                    q * (q / p.max(1e-300)).ln()
                } else {
                    0.0
                }
            })
            .sum();
        let same = top2(x).0 == top2(y).0;
        let (tx, ty) = (top_k(x, 5), top_k(y, 5));
        let ov = tx.iter().filter(|t| ty.contains(t)).count();
        cos_sum += c;
        kl_sum += kl;
        agree += same as usize;
        overlap += ov;
        max_abs = max_abs.max(d);
        if c < min_cos.0 {
            min_cos = (c, i);
        }
        positions.push(
            json!({"pos": i, "cos": c, "max_abs": d, "kl": kl, "top1": same, "top5_overlap": ov}),
        );
    }
    let mean_cos = cos_sum / p as f64;
    // Hidden states per layer.
    let mut layers = Vec::new();
    let mut drift_from = None;
    if mine.hidden.len() == reference.hidden.len() {
        for (l, (x, y)) in mine.hidden.iter().zip(&reference.hidden).enumerate() {
            if x.len() != y.len() {
                continue;
            }
            let c = cosine(x, y);
            let num: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
            let den: f64 = y.iter().map(|b| (*b as f64).powi(2)).sum();
            let rel = (num / den.max(1e-300)).sqrt();
            if c < a.layer_cos && drift_from.is_none() {
                drift_from = Some(l);
            }
            layers.push(json!({"layer": l, "name": if l == 0 { "embeddings".to_string() } else { format!("layer {}", l - 1) }, "cos": c, "rel_err": rel}));
        }
    }
    // Greedy.
    let n = mine.greedy.len().min(reference.greedy.len());
    let diverge = (0..n).find(|&i| mine.greedy[i] != reference.greedy[i]);
    let agreed = diverge.unwrap_or(n);
    let min_agree = a.min_agree.unwrap_or(n);
    let mut fail = Vec::new();
    if mean_cos < a.min_cos {
        fail.push(format!(
            "mean logits cosine {mean_cos:.6} < --min-cos {}",
            a.min_cos
        ));
    }
    if agreed < min_agree {
        fail.push(format!(
            "greedy tokens diverge at {agreed} < --min-agree {min_agree}"
        ));
    }
    let drift_name = drift_from.map(|l| {
        if l == 0 {
            "embeddings".to_string()
        } else {
            format!("layer {}", l - 1)
        }
    });
    let report = json!({
        "model": mpath.display().to_string(),
        "reference": a.reference.display().to_string(),
        "runtime": format!("{runtime:?}").to_lowercase(),
        "prompt_tokens": p,
        "logits": {
            "mean_cos": mean_cos, "min_cos": min_cos.0, "min_cos_pos": min_cos.1, "max_abs": max_abs,
            "mean_kl": kl_sum / p as f64, "top1_agree": agree as f64 / p as f64,
            "top5_overlap": overlap as f64 / (5 * p) as f64, "positions": positions,
        },
        "layers": layers,
        "drift_from": drift_name,
        "greedy": {
            "compared": n, "agreed": agreed,
            "divergence": diverge.map(|i| json!({
                "index": i, "model_token": mine.greedy[i], "reference_token": reference.greedy[i],
                "model_margin": mine.margins.get(i), "reference_margin": reference.margins.get(i),
            })),
        },
        "pass": fail.is_empty(),
        "failures": fail,
    });
    if a.json {
        println!("{report}");
    } else {
        println!(
            "model {} vs reference {} ({})",
            mpath.display(),
            a.reference.display(),
            report["runtime"].as_str().unwrap_or("")
        );
        println!(
            "logits over {p} positions: cosine mean {mean_cos:.6}, min {:.6} (pos {}); max |Δ| {max_abs:.3e}; KL mean {:.3e}; top-1 agree {}/{p}; top-5 overlap {:.1}%",
            min_cos.0, min_cos.1, kl_sum / p as f64, agree, 100.0 * overlap as f64 / (5 * p) as f64
        );
        for l in &layers {
            println!(
                "  {:<12} cos {:.6}  rel err {:.3e}",
                l["name"].as_str().unwrap_or(""),
                l["cos"].as_f64().unwrap_or(0.0),
                l["rel_err"].as_f64().unwrap_or(0.0)
            );
        }
        if let Some(d) = &drift_name {
            println!(
                "drift: hidden states fall below cosine {} from {d} on",
                a.layer_cos
            );
        }
        match diverge {
            None => println!("greedy: {n} tokens, identical"),
            Some(i) => println!(
                "greedy: first divergence at token {i}: model {} (margin {:.3}) vs reference {} (margin {})",
                mine.greedy[i],
                mine.margins.get(i).copied().unwrap_or(0.0),
                reference.greedy[i],
                reference.margins.get(i).map(|m| format!("{m:.3}")).unwrap_or_else(|| "?".into())
            ),
        }
        println!(
            "{}",
            if fail.is_empty() {
                "PASS".to_string()
            } else {
                format!("FAIL: {}", fail.join("; "))
            }
        );
    }
    if !fail.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
