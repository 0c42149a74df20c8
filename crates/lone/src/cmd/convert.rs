//! `lone convert`: a HF checkpoint or a GGUF file → a GGUF file of a chosen type, as
//! llama.cpp's converter and llama-quantize write it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lone_core::convert::split::{self, SplitBy, SplitOptions};
use lone_core::convert::{self, hf, FileType, Plan};

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// HF checkpoint directory (safetensors F32/F16/BF16, sharded too) or GGUF file to
    /// requantize.
    pub input: PathBuf,
    /// Where to write the GGUF file.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// Output type: F32, F16, BF16, Q8_0 (what convert_hf_to_gguf.py writes), or Q6_K,
    /// Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S, Q4_1, Q4_0, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K,
    /// IQ4_XS, IQ4_NL, IQ3_M, IQ3_S, IQ3_XS, IQ3_XXS, IQ2_M, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M,
    /// IQ1_S, TQ2_0, TQ1_0 (llama-quantize's mixes, from the F32 conversion; IQ3_XXS and
    /// below need --imatrix, as in llama-quantize).
    #[arg(long = "type", short = 't', default_value = "F16", value_parser = parse_type)]
    pub out_type: FileType,
    /// `tokenizer.ggml.pre` for a tokenizer llama.cpp's table does not know (llama-bpe,
    /// qwen2, smollm, lfm2, gpt-2, …).
    #[arg(long)]
    pub tokenizer_pre: Option<String>,
    /// An importance matrix (from `lone imatrix` or llama-imatrix; GGUF or legacy .dat) for
    /// the quantizers, as llama-quantize's --imatrix.
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// Choose each weight matrix's type to minimise the measured KL divergence of the logits
    /// (on --calibration text) within this many bits per weight (whole file). See
    /// docs/quantization.md for the method.
    #[arg(long, requires = "calibration")]
    pub target_bpw: Option<f64>,
    /// Keep --target-bpw's measurements in this file (JSON) and reuse those it already holds:
    /// a second target on the same source, calibration and imatrix measures nothing, and an
    /// interrupted search resumes.
    #[arg(long, requires = "target_bpw")]
    pub sensitivity: Option<PathBuf>,
    /// Calibration text for --target-bpw (UTF-8).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Tokens per calibration chunk (--target-bpw).
    #[arg(long, default_value_t = 128)]
    pub calibration_ctx: usize,
    /// Calibration chunks (--target-bpw): each candidate type of each tensor is measured on
    /// all of them.
    #[arg(long, default_value_t = 2)]
    pub calibration_chunks: usize,
    /// Quantization threads [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Overwrite the output file if it exists.
    #[arg(long, short = 'f')]
    pub force: bool,
    #[command(flatten)]
    pub split: SplitArgs,
    /// Cut the output where the (split) GGUF input is cut: `OUT-00001-of-0000N.gguf` …, as
    /// `llama-quantize --keep-split` (a one-part input gives `OUT-00001-of-00001.gguf`).
    #[arg(long, conflicts_with_all = ["split_max_tensors", "split_max_size", "no_tensor_first_split"])]
    pub keep_split: bool,
    /// Also write the vision side of a vision-language checkpoint (LFM2-VL as llama.cpp's
    /// `convert_hf_to_gguf.py --mmproj` writes it; LFM3-VL in lone's layout) to this mmproj
    /// GGUF, beside the language model written to --out.
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// The mmproj's type: F32, F16, BF16 or Q8_0 [default: --type when it is one of those,
    /// else F16].
    #[arg(long, value_parser = parse_type, requires = "mmproj")]
    pub mmproj_type: Option<FileType>,
}

/// Writing the output as a split GGUF (llama-gguf-split's options).
#[derive(Args, Debug, Default)]
pub struct SplitArgs {
    /// Write the output in parts of at most N tensors each (`OUT-00001-of-0000N.gguf` …, as
    /// llama-gguf-split).
    #[arg(long, value_name = "N", conflicts_with = "split_max_size")]
    pub split_max_tensors: Option<usize>,
    /// Write the output in parts of at most this much tensor data each: N followed by M
    /// (10^6 bytes) or G (10^9), e.g. 2G.
    #[arg(long, value_name = "N(M|G)")]
    pub split_max_size: Option<String>,
    /// In a split output, keep the first part to the metadata alone.
    #[arg(long)]
    pub no_tensor_first_split: bool,
}

impl SplitArgs {
    /// The split asked for, if any (`default` when neither limit is given).
    pub fn options(&self, default: Option<SplitBy>) -> Result<Option<SplitOptions>> {
        let by = match (&self.split_max_tensors, &self.split_max_size) {
            (Some(n), _) => Some(SplitBy::Tensors(*n)),
            (None, Some(s)) => Some(SplitBy::Bytes(split::parse_size(s)?)),
            (None, None) => default,
        };
        if by.is_none() && self.no_tensor_first_split {
            bail!("--no-tensor-first-split needs --split-max-tensors or --split-max-size");
        }
        Ok(by.map(|by| SplitOptions {
            by,
            no_tensor_first_split: self.no_tensor_first_split,
        }))
    }
}

fn parse_type(s: &str) -> Result<FileType, String> {
    FileType::parse(s)
        .ok_or_else(|| format!("unknown type {s:?}; use one of {}", FileType::names()))
}

pub fn run(a: ConvertArgs) -> Result<()> {
    if !a.input.exists() && crate::hub::RepoRef::parse(&a.input.to_string_lossy()).is_none() {
        bail!(
            "{}: no such file or directory (give a checkpoint directory, a GGUF file or a Hub repo id)",
            a.input.display()
        );
    }
    let mut a = a;
    a.input = super::common::local_model(&a.input)?;
    // Before any work (a --target-bpw search takes minutes); a split's part names are checked
    // once the plan is cut.
    let split_opts = a.split.options(None)?;
    let keep_split = match a.keep_split {
        false => None,
        true => Some(
            lone_core::loader::gguf::GgufFile::open(&a.input).with_context(|| {
                format!("--keep-split needs a GGUF input ({})", a.input.display())
            })?,
        ),
    };
    if split_opts.is_none() && keep_split.is_none() && a.out.exists() && !a.force {
        bail!("{} exists; pass --force to overwrite it", a.out.display());
    }
    if a.out.canonicalize().ok() == a.input.canonicalize().ok() {
        bail!("the output would overwrite the input");
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // The vision side first: a checkpoint that has none fails before any other work.
    let mmproj = match &a.mmproj {
        None => None,
        Some(path) => {
            if !a.input.is_dir() {
                bail!(
                    "--mmproj needs a vision-language checkpoint directory, not {}",
                    a.input.display()
                );
            }
            if path.exists() && !a.force {
                bail!("{} exists; pass --force to overwrite it", path.display());
            }
            let t = a.mmproj_type.unwrap_or(if a.out_type.is_converter_type() {
                a.out_type
            } else {
                FileType::F16
            });
            let plan = lone_core::convert::mmproj::plan(&a.input, t)
                .with_context(|| format!("cannot write the mmproj of {}", a.input.display()))?;
            Some((path.clone(), plan, t))
        }
    };
    let opts = hf::Options {
        tokenizer_pre: a.tokenizer_pre.clone(),
    };
    let imatrix = match &a.imatrix {
        Some(p) => Some(
            lone_core::imatrix::Imatrix::load(p)
                .with_context(|| format!("cannot read the imatrix {}", p.display()))?,
        ),
        None => None,
    };
    let imatrix_name = a
        .imatrix
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out_type = match a.target_bpw {
        // The base mix (for the tensors the search leaves alone, and general.file_type).
        Some(b) if b < 5.0 => FileType::Q4KM,
        Some(b) if b < 6.0 => FileType::Q5KM,
        Some(_) => FileType::Q6K,
        None => a.out_type,
    };
    let mut plan = convert::plan(
        &a.input,
        out_type,
        &opts,
        imatrix.as_ref().map(|i| (i, imatrix_name.as_str())),
    )
    .with_context(|| format!("cannot convert {}", a.input.display()))?;
    if let (Some(b), Some(cal)) = (a.target_bpw, &a.calibration) {
        if !(1.0..=32.0).contains(&b) {
            bail!("--target-bpw {b}: give a number of bits per weight between 1 and 32");
        }
        let text = std::fs::read_to_string(cal)
            .with_context(|| format!("cannot read the calibration text {}", cal.display()))?;
        let mut model = super::common::load_model(&a.input, a.threads)?;
        let mut io =
            lone_core::text::TextIo::load(&model, &a.input).context("cannot load the tokenizer")?;
        io.tokenizer.set_special_as_text(true);
        let tokens = io.encode_raw(&text)?;
        let so = lone_core::convert::search::SearchOptions {
            target_bpw: b,
            tokens: &tokens,
            ctx: a.calibration_ctx,
            chunks: a.calibration_chunks,
            imatrix: imatrix.as_ref(),
            sensitivity: a.sensitivity.as_deref(),
        };
        let t0 = Instant::now();
        let (p, report) =
            lone_core::convert::search::target_bpw(&mut model, plan, &so, &mut |done, total| {
                eprint!("\rmeasuring tensor types: {done}/{total}")
            })?;
        eprintln!();
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        for t in report.chosen.values() {
            *counts.entry(t.name().to_string()).or_default() += 1;
        }
        eprintln!(
            "target {b} bpw: {:.3} bpw, KL {:.6} (estimate {:.6}) after {} measurements{} in {:.1} s; types: {}",
            report.bpw,
            report.kl_measured,
            report.kl_estimate,
            report.measurements,
            match report.reused {
                0 => String::new(),
                n => format!(" ({n} more from the sensitivity table)"),
            },
            t0.elapsed().as_secs_f64(),
            counts
                .iter()
                .map(|(t, n)| format!("{t}×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        plan = p;
        plan.set(
            "quantize.target_bpw",
            lone_core::loader::gguf::MetaValue::F32(b as f32),
        );
    }
    let start = Instant::now();
    let outputs = match &keep_split {
        Some(src) => {
            let parts = split::keep_split(&plan, src)?;
            let paths = split::part_paths(&a.out, parts.len());
            let inputs: Vec<_> = src
                .parts
                .iter()
                .filter_map(|p| p.canonicalize().ok())
                .collect();
            if let Some(p) = paths
                .iter()
                .find(|p| p.canonicalize().is_ok_and(|c| inputs.contains(&c)))
            {
                bail!(
                    "the output part {} would overwrite an input part",
                    p.display()
                );
            }
            checked(paths.into_iter().zip(parts).collect(), a.force)?
        }
        None => outputs(&a.out, &plan, split_opts, a.force)?,
    };
    let written = write_parts(&outputs, threads)?;
    let params: usize = plan.tensors.iter().map(|t| t.numel()).sum();
    eprintln!(
        "wrote {}: {} ({}), {} tensors, {:.1} MiB, {:.2} bits per weight, in {:.1} s",
        match outputs.len() {
            1 => a.out.display().to_string(),
            n => format!("{} … ({n} parts)", outputs[0].0.display()),
        },
        match a.target_bpw {
            Some(b) => format!("--target-bpw {b}"),
            None => a.out_type.name().to_string(),
        },
        plan.get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("?"),
        plan.tensors.len(),
        written as f64 / (1 << 20) as f64,
        plan.tensor_bytes() as f64 * 8.0 / params.max(1) as f64,
        start.elapsed().as_secs_f64()
    );
    if let Some((path, plan, t)) = mmproj {
        let written = write_parts(&[(path.clone(), plan.clone())], threads)?;
        eprintln!(
            "wrote {}: {} mmproj ({}), {} tensors, {:.1} MiB",
            path.display(),
            t.name(),
            plan.get("clip.projector_type")
                .and_then(|v| v.as_str())
                .unwrap_or("?"),
            plan.tensors.len(),
            written as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}

/// The files to write for `plan` at `out`: one, or the parts of a split. Refuses to replace
/// an existing file unless `force`.
pub fn outputs(
    out: &std::path::Path,
    plan: &Plan,
    split: Option<SplitOptions>,
    force: bool,
) -> Result<Vec<(PathBuf, Plan)>> {
    let outs: Vec<(PathBuf, Plan)> = match split {
        None => vec![(out.to_path_buf(), plan.clone())],
        Some(o) => {
            let parts = split::split(plan, o)?;
            split::part_paths(out, parts.len())
                .into_iter()
                .zip(parts)
                .collect()
        }
    };
    checked(outs, force)
}

/// `outs`, unless one of its paths exists and not `force`.
fn checked(outs: Vec<(PathBuf, Plan)>, force: bool) -> Result<Vec<(PathBuf, Plan)>> {
    if !force {
        if let Some((p, _)) = outs.iter().find(|(p, _)| p.exists()) {
            bail!("{} exists; pass --force to overwrite it", p.display());
        }
    }
    Ok(outs)
}

/// Writes each (path, plan) with a progress bar on a terminal (plain lines otherwise); each
/// file goes to `PATH.partial` first, removed on failure, so a crash never leaves a truncated
/// model. Returns the bytes written.
pub fn write_parts(outputs: &[(PathBuf, Plan)], threads: usize) -> Result<u64> {
    let total: u64 = outputs.iter().map(|(_, p)| p.tensor_bytes() as u64).sum();
    let n: usize = outputs.iter().map(|(_, p)| p.tensors.len()).sum();
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} {msg} (ETA {eta})",
            )
            .expect("a valid template"),
        );
        b
    });
    let (mut done, mut index, mut written) = (0u64, 0usize, 0u64);
    for (path, plan) in outputs {
        let tmp = path.with_extension("gguf.partial");
        let result = plan.write(&tmp, threads, &mut |_, t, _| {
            done += t.n_bytes() as u64;
            index += 1;
            let line = format!("[{index}/{n}] {} {:?} {}", t.name, t.shape, t.dtype);
            match &bar {
                Some(b) => {
                    b.set_position(done);
                    b.set_message(line);
                }
                None => eprintln!("{line}"),
            }
        });
        match result {
            Ok(w) => written += w,
            Err(e) => {
                if let Some(b) = &bar {
                    b.finish_and_clear();
                }
                let _ = std::fs::remove_file(&tmp);
                return Err(e).with_context(|| format!("cannot write {}", path.display()));
            }
        }
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))?;
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    Ok(written)
}
