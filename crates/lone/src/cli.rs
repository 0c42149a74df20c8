//! The `lone` command line: argument parsing and dispatch over the commands (`cmd`), as a
//! library function so the binary and the Python wheel's `lone` command are the same program.

use crate::cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lone",
    version,
    propagate_version = true,
    about = "Run small language models (LFM2, LFM3, Qwen2/3, Llama) locally"
)]
struct Cli {
    /// Fast mode: 8-bit (bf16 for BF16 weights) activations in every quantized matrix
    /// product, as llama.cpp does — faster, logits no longer exactly transformers' on the
    /// dequantized weights. Same as `LONE_EXACT=0`. Default: auto (on x86 and ARM, 8-bit
    /// activations for quantized weights in every row, each row computed as if alone, so
    /// a request's output does not depend on batching or caching; the top logits recomputed
    /// exactly)
    #[arg(long, global = true, conflicts_with = "exact")]
    fast: bool,
    /// Exact mode: f32 activations everywhere, logits equal to transformers' on the dequantized
    /// weights. Same as `LONE_EXACT=1`. Default: auto (on x86 and ARM, 8-bit activations for
    /// quantized weights in every row, each row computed as if alone; the top logits
    /// recomputed exactly)
    #[arg(long, global = true)]
    exact: bool,
    /// How the attention cache stores keys and values: f16 (half the memory per context
    /// token, as llama.cpp's default), q8_0 (8.5 bits; head_dim a multiple of 32) or f32
    /// (exact: logits equal transformers' to 1e-4)
    #[arg(
        long,
        global = true,
        visible_alias = "cache-type-k",
        default_value = "f16",
        value_parser = parse_cache_type
    )]
    cache_type: lone_core::cache::KvType,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run(cmd::run::RunArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching).
    Serve(cmd::serve::ServeArgs),
    /// Chat interactively, keeping the model and the conversation's cache loaded.
    Chat(cmd::chat::ChatArgs),
    /// Measure speed: prefill/decode tok/s, cold start, peak RSS (like llama-bench).
    Bench(cmd::bench::BenchArgs),
    /// Check a model against a reference (transformers, lone, or recorded outputs): logits,
    /// per-layer drift, first greedy divergence; exit 1 below the bars.
    Verify(cmd::verify::VerifyArgs),
    /// Describe a model file: architecture, config, tensors, sizes, caches, tokenizer, template.
    Inspect(cmd::inspect::InspectArgs),
    /// Perplexity of a text file, with llama-perplexity's method (comparable numbers).
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Write a GGUF file from a HF checkpoint or another GGUF, at a chosen type (as
    /// convert_hf_to_gguf.py and llama-quantize do).
    Convert(cmd::convert::ConvertArgs),
    /// Split a GGUF file into parts or merge them back (as llama-gguf-split).
    GgufSplit(cmd::gguf_split::GgufSplitArgs),
    /// Compute an importance matrix from calibration text (as llama-imatrix), for
    /// `lone convert --imatrix`.
    Imatrix(cmd::imatrix::ImatrixArgs),
    /// Download a model from the Hugging Face Hub into its cache (`org/name[:QUANT]`); print
    /// its local path. `--model org/name[:QUANT]` on every command does the same.
    Pull(cmd::hub::PullArgs),
    /// List the models in the Hugging Face cache.
    Ls(cmd::hub::LsArgs),
    /// Delete a model from the Hugging Face cache.
    Rm(cmd::hub::RmArgs),
}

/// llama.cpp's multi-letter short flags, spelled as their long forms (clap's short flags are
/// one letter); GPU-offload flags are dropped (with their value) with a warning.
fn llama_cpp_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut it = args.peekable();
    while let Some(a) = it.next() {
        let s = a.to_str().unwrap_or("");
        let (flag, inline) = match s.split_once('=') {
            Some((f, _)) if f.starts_with('-') => (f, true),
            _ => (s, false),
        };
        match flag {
            "-md" => out.push("--model-draft".into()),
            "-np" => out.push("--parallel".into()),
            "-ngl"
            | "--n-gpu-layers"
            | "--gpu-layers"
            | "-ngld"
            | "--n-gpu-layers-draft"
            | "-fa"
            | "--flash-attn"
            | "-sm"
            | "--split-mode"
            | "-mg"
            | "--main-gpu" => {
                // The value, when it is a separate argument (-fa takes on/off/auto or nothing).
                let takes = !matches!(flag, "-fa" | "--flash-attn")
                    || it
                        .peek()
                        .and_then(|v| v.to_str())
                        .is_some_and(|v| matches!(v, "on" | "off" | "auto" | "1" | "0"));
                if !inline && takes {
                    it.next();
                }
                eprintln!("lone: warning: ignoring {flag}: lone runs on the CPU, GPU flags do nothing in this build");
            }
            _ => out.push(a),
        }
    }
    out
}

/// The error and its causes, each said once (a cause already in the message is not repeated):
/// how the command, and the Python and C APIs, word an error.
pub fn report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let s = c.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

/// Run the command line `args` (the program name first, as `std::env::args_os()` gives it);
/// the process exit status. `--help`, `--version` and argument errors print and exit the
/// process, as clap does.
pub fn main_with(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let cli = Cli::parse_from(llama_cpp_flags(args.into_iter()));
    if cli.fast {
        lone_core::kernels::set_exact(false);
    }
    if cli.exact {
        lone_core::kernels::set_exact(true);
    }
    cmd::common::set_cache_type(cli.cache_type);
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Chat(a) => cmd::chat::chat(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::GgufSplit(a) => cmd::gguf_split::run(a),
        Command::Imatrix(a) => cmd::imatrix::run(a),
        Command::Pull(a) => cmd::hub::pull(a),
        Command::Ls(a) => cmd::hub::ls(a),
        Command::Rm(a) => cmd::hub::rm(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", report(&e));
            1
        }
    }
}

fn parse_cache_type(s: &str) -> Result<lone_core::cache::KvType, String> {
    lone_core::cache::KvType::parse(s)
        .ok_or_else(|| format!("unknown cache type {s:?}: use f16, f32 or q8_0"))
}
