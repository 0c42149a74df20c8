//! `lone`: run small language models locally.

mod cmd;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lone",
    version,
    about = "Run small language models (LFM2, LFM3, Qwen2/3, Llama) locally"
)]
struct Cli {
    /// Fast mode: 8-bit (bf16 for BF16 weights) activations in every quantized matrix
    /// product, as llama.cpp does — faster, logits no longer exactly transformers' on the
    /// dequantized weights. Same as `LONE_EXACT=0`. Default: auto (exact, except 8-bit decode
    /// on CPUs without AVX-512)
    #[arg(long, global = true, conflicts_with = "exact")]
    fast: bool,
    /// Exact mode: f32 activations everywhere, logits equal to transformers' on the dequantized
    /// weights. Same as `LONE_EXACT=1`. Default: auto (exact on AVX-512 CPUs; on AVX2-only
    /// CPUs exact prefill with 8-bit decode)
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
    /// Describe a model file: architecture, config, tensors, sizes, caches, tokenizer, template.
    Inspect(cmd::inspect::InspectArgs),
    /// Perplexity of a text file, with llama-perplexity's method (comparable numbers).
    Perplexity(cmd::perplexity::PerplexityArgs),
}

/// llama.cpp's multi-letter short flags, spelled as their long forms (clap's short flags are
/// one letter).
fn llama_cpp_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-md") => "--model-draft".into(),
        _ => a,
    })
    .collect()
}

fn main() {
    let cli = Cli::parse_from(llama_cpp_flags(std::env::args_os()));
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
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn parse_cache_type(s: &str) -> Result<lone_core::cache::KvType, String> {
    lone_core::cache::KvType::parse(s)
        .ok_or_else(|| format!("unknown cache type {s:?}: use f16, f32 or q8_0"))
}
