//! `lone convert`: a HF checkpoint or a GGUF file → a GGUF file of a chosen type, as
//! llama.cpp's converter and llama-quantize write it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lone_core::convert::{self, hf, FileType};

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// HF checkpoint directory (safetensors F32/F16/BF16, sharded too) or GGUF file to
    /// requantize.
    pub input: PathBuf,
    /// Where to write the GGUF file.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// Output type: F32, F16, BF16, Q8_0 (what convert_hf_to_gguf.py writes), or Q6_K,
    /// Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S, Q4_1, Q4_0, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K
    /// (llama-quantize's mixes, from the F32 conversion).
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
    if a.out.exists() && !a.force {
        bail!("{} exists; pass --force to overwrite it", a.out.display());
    }
    if a.out.canonicalize().ok() == a.input.canonicalize().ok() {
        bail!("the output would overwrite the input");
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
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
            "target {b} bpw: {:.3} bpw, KL {:.6} (estimate {:.6}) after {} measurements in {:.1} s; types: {}",
            report.bpw,
            report.kl_measured,
            report.kl_estimate,
            report.measurements,
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
    let total = plan.tensor_bytes() as u64;
    let n = plan.tensors.len();
    let start = Instant::now();
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
    let mut done = 0u64;
    // A partial file is removed on failure, so a crash never leaves a truncated model.
    let tmp = a.out.with_extension("gguf.partial");
    let result = plan.write(&tmp, threads, &mut |i, t, _| {
        done += t.n_bytes() as u64;
        let line = format!("[{}/{n}] {} {:?} {}", i + 1, t.name, t.shape, t.dtype);
        match &bar {
            Some(b) => {
                b.set_position(done);
                b.set_message(line);
            }
            None => eprintln!("{line}"),
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let written = match result {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("cannot write {}", a.out.display()));
        }
    };
    std::fs::rename(&tmp, &a.out)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), a.out.display()))?;
    let params: usize = plan.tensors.iter().map(|t| t.numel()).sum();
    eprintln!(
        "wrote {}: {} ({}), {n} tensors, {:.1} MiB, {:.2} bits per weight, in {:.1} s",
        a.out.display(),
        match a.target_bpw {
            Some(b) => format!("--target-bpw {b}"),
            None => a.out_type.name().to_string(),
        },
        plan.get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("?"),
        written as f64 / (1 << 20) as f64,
        total as f64 * 8.0 / params.max(1) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
