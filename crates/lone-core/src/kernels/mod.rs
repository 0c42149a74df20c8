//! Compute kernels. They know nothing of models: matrices are `Tensor`s in their stored
//! format, activations are row-major f32 slices.
//!
//! Matrix products go through [`matmul`], which picks a kernel for the weight format from a
//! table built once for the CPU ([`Isa`], detected at first use) and splits the weight rows
//! over the persistent thread pool (`pool`, configured by [`set_threads`]).
//!
//! Two numeric modes (see [`set_exact`]):
//! - **exact** (default): quantized weights are dequantized (bit-exactly, block by block) and
//!   dotted with the f32 activations: the exact dot product of the dequantized weights with the
//!   activations, up to f32 rounding. At decode this is about as fast as the fast mode (both
//!   are bound by reading the weights) and it keeps lone's logits equal to transformers' on the
//!   dequantized weights.
//! - **fast** (`LONE_EXACT=0` or `set_exact(false)`): like llama.cpp, the activation rows are
//!   quantized once per matmul to 8-bit blocks (Q8_0 for Q4_0/Q5_0/Q8_0 weights, Q8_1 for Q4_1/Q5_1, Q8_K for Q4_K/Q5_K/Q6_K;
//!   ggml's reference quantizers, byte-exact) and dotted with integer SIMD (AVX2 `vpmaddubsw`,
//!   AVX-512 VNNI `vpdpbusd`). The result is the exact dot product of the dequantized weights
//!   with the *dequantized 8-bit activations*, up to f32 rounding.
//!   Other quantized formats (Q2_K, Q3_K) always take the exact path.
//!
//!   With many activation rows (prefill, batches) fast mode runs an 8-bit GEMM (`kernels/int8.rs`:
//!   AVX-512 VNNI, activations in Q8_0-style blocks of 32 for every supported format).
//! - BF16 weights in fast mode, with many activation rows on a CPU with AVX-512 BF16, take
//!   bf16-rounded activations and `vdpbf16ps` (`kernels/bf16.rs`), as llama.cpp does.
//!
//! Other float weights (F32, F16) always use f32 activations, so both modes agree on them.
//!
//! Exact mode with many activation rows dequantizes each weight tile once into f32 and runs a
//! register-blocked f32 GEMM over all the rows (`gemm`).

#[cfg(target_arch = "x86_64")]
mod bf16;
mod gemm;
#[cfg(target_arch = "x86_64")]
mod int8;
#[cfg(target_arch = "x86_64")]
mod int8sb;
mod matmul;
mod mode;
#[cfg(target_arch = "aarch64")]
mod neon;
mod ops;
mod packed;
mod pool;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod simd;
mod table;
mod vecops;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::quant;
use crate::tensor::{DType, Tensor};

pub use pool::parallel_for;

/// Configure the worker pool once, before the first forward pass.
/// Returns false if the pool was already started (the earlier setting stays).
pub fn set_threads(n: usize) -> bool {
    pool::set_threads(n)
}

/// Number of threads the kernels use (the caller included): the pool's, or fewer where this
/// thread's [`Compute`] says so.
pub fn threads() -> usize {
    let n = pool::global().threads();
    threads_here().map_or(n, |t| t.clamp(1, n))
}

use gemm::*;
use matmul::*;
use mode::*;
use table::*;
use vecops::*;

pub(crate) use gemm::stored_row;
pub use matmul::{matmul, matmul_many, matmul_with};
pub(crate) use mode::q8_0_copy_for_fast_rows;
// What the thread's pass put in force, for the kernels' own choices (layers get the `Pass`).
pub(crate) use mode::{decode_rows, prompt_rows};
pub use mode::{
    exact, exact_scope, global_mode, mode, set_exact, set_mode, Compute, Mode, Pass, PassKind,
    Scope,
};
pub use ops::{add_inplace, gelu_tanh, rmsnorm, silu_mul, softmax, softmax_unnormalized, Rope};
pub use table::{isa, row_invariant_rows, Isa};
pub use vecops::{dot_rows, mix_rows, KvSlice};

#[cfg(test)]
mod tests;
