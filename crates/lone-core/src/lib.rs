//! lone-core: the library beneath the `lone` CLI.
//!
//! The data path: tokens → embed → layers (+cache) → logits → sampler → text.
pub mod error;
pub mod loader;
pub mod quant;
pub mod tensor;
pub mod tokenizer;

pub use error::{Error, Result};
