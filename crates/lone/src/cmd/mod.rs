pub mod bench;
mod bench_suite;
pub mod chat;
pub mod common;
pub mod convert;
pub mod gguf_split;
pub mod hub;
pub mod imatrix;
pub mod inspect;
pub mod model_info;
pub mod perplexity;
pub mod run;
pub mod verify;
/// `lone serve` lives in `crate::serve` (its own directory: router, OpenAI types, engine, metrics).
pub use crate::serve;
