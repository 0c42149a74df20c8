//! Block formats: dequantization, dot products and (activation) quantization.
//!
//! Every format is stored exactly as llama.cpp's ggml lays it out (`ggml-common.h`), little
//! endian. The functions here are the entry points the rest of lone calls; today they forward to
//! [`reference`], the portable scalar implementation. Faster kernels (SIMD, integer dot
//! products) will be added behind the same functions later and tested against [`reference`].
//!
//! Lengths are always given by the f32 side (`dst.len()`, `x.len()`, `src.len()`): the element
//! count must be a whole number of blocks, and the byte side must hold exactly
//! [`row_bytes`]`(dtype, n)` bytes. Anything else is an [`QuantError`], never a panic, so the
//! functions are safe to call on data read from untrusted files.
//!
//! Bit-exactness: [`dequantize_row`] reproduces ggml's `dequantize_row_*` exactly (same f32
//! operations in the same order, no fused multiply-add), and [`quantize_row`] reproduces
//! ggml's `quantize_row_*_ref` byte for byte. [`dot_row`] is only specified up to f32
//! rounding of the accumulation (see its documentation).

mod float;
mod iq_tables;
mod iqgrid;
mod iquantize;
mod iquants;
mod kquantize;
mod kquants;
mod legacy;
pub mod reference;
mod weighted;

/// The per-block reference dequantizers and scale unpacking, for the SIMD kernels to inline.
pub(crate) mod reference_blocks {
    /// The codebook i-quants' grids and sign masks (the x86 and aarch64 kernels decode with
    /// them).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(crate) use super::iq_tables::{
        IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
    };
    #[cfg(target_arch = "aarch64")]
    pub(crate) use super::iqgrid::iq2_scales;
    /// Test data: a finite scale in a random block of those formats.
    #[cfg(test)]
    pub(crate) use super::iqgrid::set_scale;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(crate) use super::iqgrid::KSIGN_MASKS;
    /// The i-quants' levels, which the SIMD kernels look their indices up in.
    pub(crate) use super::iquants::KVALUES_IQ4NL;
    /// The 8-bit K-quant kernels read the packed scales with it.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(crate) use super::kquants::scale_min_k4;
    /// The x86 exact kernels inline them (aarch64 decodes K-quants in NEON).
    #[cfg(target_arch = "x86_64")]
    pub(crate) use super::kquants::{
        dequant_q2_k, dequant_q3_k, dequant_q4_k, dequant_q5_k, dequant_q6_k,
    };
}

use crate::tensor::DType;

/// Why a row could not be (de)quantized.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a whole number of blocks of the format.
    #[error("{dtype}: {n} elements is not a whole number of {}-element blocks", dtype.block_size())]
    NotBlockMultiple { dtype: DType, n: usize },
    /// The stored (byte) side does not hold exactly the bytes `n` elements need.
    #[error("{dtype}: {n} elements take {expected} bytes, got {got}")]
    ByteLen {
        dtype: DType,
        n: usize,
        expected: usize,
        got: usize,
    },
    /// lone reads the format but cannot write it.
    #[error("{dtype}: lone reads this format but cannot quantize into it")]
    NoQuantizer { dtype: DType },
    /// The format is only made with an importance matrix (as llama-quantize requires).
    #[error(
        "{dtype} needs an importance matrix: make one with `lone imatrix` (or llama-imatrix) \
         and pass it with --imatrix"
    )]
    NeedsImportance { dtype: DType },
}

impl From<QuantError> for crate::Error {
    fn from(e: QuantError) -> Self {
        crate::Error::Msg(e.to_string())
    }
}

/// Bytes one row of `n` elements takes in `dtype`, or None if `n` is not a whole number of
/// blocks.
pub fn row_bytes(dtype: DType, n: usize) -> Option<usize> {
    dtype.bytes_for(n)
}

/// Whether lone writes the i-quant or ternary format `dtype` ([`DType::has_quantizer`]).
pub(crate) fn writes_iquant(dtype: DType) -> bool {
    iquantize::writes(dtype)
}

/// Whether `dtype` can only be written with importances ([`quantize_row_weighted`]): ggml's
/// IQ2_XXS, IQ2_XS and IQ1_S quantizers require them.
pub fn needs_importance(dtype: DType) -> bool {
    iquantize::needs_importance(dtype)
}

/// Dequantize `dst.len()` elements stored as `dtype` in `src` (exactly
/// `row_bytes(dtype, dst.len())` bytes). Bit-exact with ggml's `dequantize_row_*`.
///
/// Q8_1's `s` field and Q8_K's `bsums` are not needed to dequantize and are ignored.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    reference::dequantize_row(dtype, src, dst)
}

/// Dot product of one stored row `w` (exactly `row_bytes(dtype, x.len())` bytes) with the f32
/// vector `x`.
///
/// The result equals the exact dot product of the dequantized row with `x` up to f32
/// rounding of the accumulation: implementations may sum in any order, so callers must not
/// expect bit-identical results across kernels. The error is bounded by about
/// `x.len() * f32::EPSILON / 2 * Σ|w_i x_i|`.
pub fn dot_row(dtype: DType, w: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    reference::dot_row(dtype, w, x)
}

/// Quantize `src.len()` f32 values into `dst` (exactly `row_bytes(dtype, src.len())` bytes),
/// byte-exact with ggml's `quantize_row_*_ref`.
///
/// Every format lone writes ([`DType::has_quantizer`]): F32, F16, BF16 (round to nearest
/// even, like ggml's converters), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, and Q2_K..Q6_K
/// (ggml's reference quantizers without an importance matrix), and the i-quants and ternary
/// formats lone writes (ggml's `quantize_iq*` without weights); the formats only made with
/// importances ([`needs_importance`]) are [`QuantError::NeedsImportance`].
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    reference::quantize_row(dtype, src, dst)
}

/// Quantize `src` into `dst` fitting each column with importance `qw` (an imatrix row, as
/// long as `src`), byte-exact with ggml's `quantize_*` given `quant_weights` (what
/// llama-quantize does with `--imatrix`). Formats ggml quantizes without weights (Q8_0, the
/// float formats) ignore `qw`.
pub fn quantize_row_weighted(
    dtype: DType,
    src: &[f32],
    qw: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    weighted::quantize_row_weighted(dtype, src, qw, dst)
}
