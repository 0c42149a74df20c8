//! `lone`: run small language models locally.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lone",
    version,
    about = "Run small language models (LFM2, LFM3, Qwen2/3, Llama) locally"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run(cmd::run::RunArgs),
    /// Measure speed: prefill/decode tok/s, cold start, peak RSS (like llama-bench).
    Bench(cmd::bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Bench(a) => cmd::bench::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
