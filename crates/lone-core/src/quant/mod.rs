//! Block formats: dequantization and dot products, one scalar reference per format.
//! (Being written; see the quant helper's task.)

use crate::tensor::DType;

/// Dequantize `dst.len()` elements stored as `dtype` in `src`.
pub fn dequantize_row(_dtype: DType, _src: &[u8], _dst: &mut [f32]) {
    unimplemented!()
}

/// Dot product of one stored row with an f32 vector of the same length.
pub fn dot_row(_dtype: DType, _w: &[u8], _x: &[f32]) -> f32 {
    unimplemented!()
}
