//! Not written yet.

use super::super::QuantError;
use crate::tensor::DType;

pub(super) const WRITES: bool = false;

pub(super) fn quantize(dtype: DType, _src: &[f32], _qw: Option<&[f32]>, _dst: &mut [u8]) {
    unreachable!("{dtype}: {:?}", QuantError::NoQuantizer { dtype })
}
