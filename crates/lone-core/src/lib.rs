//! lone-core: the library beneath the `lone` CLI.
//!
//! The data path: tokens → embed → layers (+cache) → logits → sampler → text.
pub mod error;
pub mod quant;
pub mod sampler;
pub mod tensor;

pub use error::{Error, Result};
