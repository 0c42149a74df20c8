//! Quantizers of the i-quants and the ternary formats: ggml's `quantize_iq*` / `quantize_tq*`
//! (what llama-quantize runs), byte-exact with ggml's C compiled without fused multiply-adds,
//! with and without an importance matrix.
//!
//! - [`iq4`]: IQ4_NL, IQ4_XS (a scale search over the 16 non-linear levels);
//! - [`ternary`]: TQ1_0, TQ2_0 (round to −1, 0, 1 times the block's largest magnitude);
//! - [`iq3`]: IQ3_XXS, IQ3_S (4-level grid points, nearest neighbours on the grid);
//! - [`iq2`]: IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M (8-level grid points).
//!
//! Without importances ggml fits each element with weight `x²`; some formats (IQ2_XXS, IQ2_XS,
//! IQ1_S) cannot be made without them, as in ggml ([`needs_importance`]).

use super::QuantError;
use crate::tensor::DType;

mod iq2;
mod iq3;
mod iq4;
mod ternary;

/// ggml's `MAX(a, b)`, `a > b ? a : b` (a NaN `b` wins, a NaN `a` loses, unlike
/// [`f32::max`]), which the quantizers' searches keep for the same bytes.
#[inline]
pub(super) fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `Σ x²` in order (f32).
pub(super) fn sum_squares(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// Whether lone writes `dtype` (an i-quant or ternary format).
pub(crate) fn writes(dtype: DType) -> bool {
    match dtype {
        DType::IQ4NL | DType::IQ4XS => iq4::WRITES,
        DType::TQ1_0 | DType::TQ2_0 => ternary::WRITES,
        DType::IQ3XXS | DType::IQ3S => iq3::WRITES,
        DType::IQ2XXS | DType::IQ2XS | DType::IQ2S | DType::IQ1S | DType::IQ1M => iq2::WRITES,
        _ => false,
    }
}

/// Formats ggml quantizes only with an importance matrix (its quantizer asserts one).
pub(crate) fn needs_importance(dtype: DType) -> bool {
    matches!(dtype, DType::IQ2XXS | DType::IQ2XS | DType::IQ1S)
}

/// Quantize one row `src` (a whole number of blocks, `dst` exactly its bytes: checked by the
/// caller) into `dtype`, fitting column `j` with importance `qw[j]` when given.
pub(crate) fn quantize(
    dtype: DType,
    src: &[f32],
    qw: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    if !writes(dtype) {
        return Err(QuantError::NoQuantizer { dtype });
    }
    if qw.is_none() && needs_importance(dtype) {
        return Err(QuantError::NeedsImportance { dtype });
    }
    match dtype {
        DType::IQ4NL | DType::IQ4XS => iq4::quantize(dtype, src, qw, dst),
        DType::TQ1_0 | DType::TQ2_0 => ternary::quantize(dtype, src, dst),
        DType::IQ3XXS | DType::IQ3S => iq3::quantize(dtype, src, qw, dst),
        _ => iq2::quantize(dtype, src, qw, dst),
    }
    Ok(())
}
