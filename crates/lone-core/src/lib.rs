//! lone-core: the library beneath the `lone` CLI.
//!
//! The data path: tokens → embed → layers (+cache) → logits → sampler → text.
//! - `loader` reads GGUF and safetensors files into `tensor::Tensor`s (stored formats),
//! - `config` describes a model whatever file it came from,
//! - `kernels` / `quant` do the arithmetic, knowing nothing of models,
//! - `nn` holds the shared blocks, `models` the families and the forward pass,
//! - `cache` the per-sequence caches,
//! - `engine` the generation core (sequences, scheduler, speculation) every front end drives.
pub mod cache;
pub mod config;
pub mod convert;
pub mod engine;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod generate;
pub mod imatrix;
pub mod kernels;
pub mod loader;
pub mod models;
pub mod nn;
pub mod npy;
pub mod perplexity;
pub mod quant;
pub mod sampler;
pub mod tensor;
#[cfg(test)]
mod test_rng;
pub mod text;
pub mod tokenizer;
pub mod tools;
pub mod vision;

pub use error::{Error, Result};
pub use models::{Batch, Model};
