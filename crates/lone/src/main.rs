//! `lone`: run small language models locally.

fn main() {
    std::process::exit(lone::cli::main_with(std::env::args_os()));
}
