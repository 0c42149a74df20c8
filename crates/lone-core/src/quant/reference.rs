//! The portable scalar implementation of every format: the specification that faster kernels
//! are tested against.
//!
//! - [`dequantize_row`] and [`quantize_row`] are bit-exact with ggml's reference C code.
//! - [`dot_row`] dequantizes one block at a time into a stack buffer, sums that block's
//!   products in f32 (element order), and adds the block sums to an f32 total (block order).
//!   Plain float formats are summed the same way in groups of 32 elements. No allocation.

use super::{float, iqgrid, iquants, kquantize, kquants, legacy, QuantError};
use crate::tensor::DType;

/// Checks that `n` elements are whole blocks stored in exactly `bytes` bytes.
pub fn check_row(dtype: DType, n: usize, bytes: usize) -> Result<(), QuantError> {
    let expected = dtype
        .bytes_for(n)
        .ok_or(QuantError::NotBlockMultiple { dtype, n })?;
    if bytes != expected {
        return Err(QuantError::ByteLen {
            dtype,
            n,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------- generic drivers

/// Apply a block dequantizer over a row. Lengths were checked by the caller.
#[inline]
fn deq_blocks<const BB: usize, const BS: usize>(
    src: &[u8],
    dst: &mut [f32],
    f: impl Fn(&[u8; BB], &mut [f32; BS]),
) {
    let (blocks, _) = src.as_chunks::<BB>();
    let (outs, _) = dst.as_chunks_mut::<BS>();
    for (b, y) in blocks.iter().zip(outs) {
        f(b, y);
    }
}

#[inline]
fn dot_blocks<const BB: usize, const BS: usize>(
    w: &[u8],
    x: &[f32],
    f: impl Fn(&[u8; BB], &mut [f32; BS]),
) -> f32 {
    let (blocks, _) = w.as_chunks::<BB>();
    let (xs, _) = x.as_chunks::<BS>();
    let mut buf = [0.0f32; BS];
    let mut total = 0.0f32;
    for (b, xb) in blocks.iter().zip(xs) {
        f(b, &mut buf);
        let mut s = 0.0f32;
        for (a, c) in buf.iter().zip(xb) {
            s += a * c;
        }
        total += s;
    }
    total
}

#[inline]
fn quant_blocks<const BB: usize, const BS: usize>(
    src: &[f32],
    dst: &mut [u8],
    f: impl Fn(&[f32; BS], &mut [u8; BB]),
) {
    let (xs, _) = src.as_chunks::<BS>();
    let (blocks, _) = dst.as_chunks_mut::<BB>();
    for (x, b) in xs.iter().zip(blocks) {
        f(x, b);
    }
}

/// Float formats: elements of `EB` bytes, converted by `f`. Sums in groups of 32 like the
/// block formats.
#[inline]
fn dot_floats<const EB: usize>(w: &[u8], x: &[f32], f: impl Fn(&[u8; EB]) -> f32) -> f32 {
    let (elems, _) = w.as_chunks::<EB>();
    let mut total = 0.0f32;
    for (eg, xg) in elems.chunks(32).zip(x.chunks(32)) {
        let mut s = 0.0f32;
        for (e, &c) in eg.iter().zip(xg) {
            s += f(e) * c;
        }
        total += s;
    }
    total
}

#[inline]
fn deq_floats<const EB: usize>(src: &[u8], dst: &mut [f32], f: impl Fn(&[u8; EB]) -> f32) {
    let (elems, _) = src.as_chunks::<EB>();
    for (e, y) in elems.iter().zip(dst) {
        *y = f(e);
    }
}

// ---------------------------------------------------------------- entry points

/// Dequantize `dst.len()` elements; see [`super::dequantize_row`].
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_row(dtype, dst.len(), src.len())?;
    match dtype {
        DType::F32 => deq_floats(src, dst, float::f32_from_le),
        DType::F16 => deq_floats(src, dst, |b: &[u8; 2]| float::f16_to_f32(*b)),
        DType::BF16 => deq_floats(src, dst, |b: &[u8; 2]| float::bf16_to_f32(*b)),
        DType::Q4_0 => deq_blocks(src, dst, legacy::dequant_q4_0),
        DType::Q4_1 => deq_blocks(src, dst, legacy::dequant_q4_1),
        DType::Q5_0 => deq_blocks(src, dst, legacy::dequant_q5_0),
        DType::Q5_1 => deq_blocks(src, dst, legacy::dequant_q5_1),
        DType::Q8_0 => deq_blocks(src, dst, legacy::dequant_q8_0),
        DType::Q8_1 => deq_blocks(src, dst, legacy::dequant_q8_1),
        DType::Q2K => deq_blocks(src, dst, kquants::dequant_q2_k),
        DType::Q3K => deq_blocks(src, dst, kquants::dequant_q3_k),
        DType::Q4K => deq_blocks(src, dst, kquants::dequant_q4_k),
        DType::Q5K => deq_blocks(src, dst, kquants::dequant_q5_k),
        DType::Q6K => deq_blocks(src, dst, kquants::dequant_q6_k),
        DType::Q8K => deq_blocks(src, dst, kquants::dequant_q8_k),
        DType::IQ4NL => deq_blocks(src, dst, iquants::dequant_iq4_nl),
        DType::IQ4XS => deq_blocks(src, dst, iquants::dequant_iq4_xs),
        DType::IQ2XXS => deq_blocks(src, dst, iqgrid::dequant_iq2_xxs),
        DType::IQ2XS => deq_blocks(src, dst, iqgrid::dequant_iq2_xs),
        DType::IQ3XXS => deq_blocks(src, dst, iqgrid::dequant_iq3_xxs),
        DType::IQ1S => deq_blocks(src, dst, iqgrid::dequant_iq1_s),
        DType::IQ3S => deq_blocks(src, dst, iqgrid::dequant_iq3_s),
        DType::IQ2S => deq_blocks(src, dst, iqgrid::dequant_iq2_s),
        DType::IQ1M => deq_blocks(src, dst, iqgrid::dequant_iq1_m),
        DType::TQ1_0 => deq_blocks(src, dst, iqgrid::dequant_tq1_0),
        DType::TQ2_0 => deq_blocks(src, dst, iqgrid::dequant_tq2_0),
    }
    Ok(())
}

/// Dot product of a stored row with `x`; see [`super::dot_row`] and the module docs for the
/// exact summation order.
pub fn dot_row(dtype: DType, w: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    check_row(dtype, x.len(), w.len())?;
    Ok(match dtype {
        DType::F32 => dot_floats(w, x, float::f32_from_le),
        DType::F16 => dot_floats(w, x, |b: &[u8; 2]| float::f16_to_f32(*b)),
        DType::BF16 => dot_floats(w, x, |b: &[u8; 2]| float::bf16_to_f32(*b)),
        DType::Q4_0 => dot_blocks(w, x, legacy::dequant_q4_0),
        DType::Q4_1 => dot_blocks(w, x, legacy::dequant_q4_1),
        DType::Q5_0 => dot_blocks(w, x, legacy::dequant_q5_0),
        DType::Q5_1 => dot_blocks(w, x, legacy::dequant_q5_1),
        DType::Q8_0 => dot_blocks(w, x, legacy::dequant_q8_0),
        DType::Q8_1 => dot_blocks(w, x, legacy::dequant_q8_1),
        DType::Q2K => dot_blocks(w, x, kquants::dequant_q2_k),
        DType::Q3K => dot_blocks(w, x, kquants::dequant_q3_k),
        DType::Q4K => dot_blocks(w, x, kquants::dequant_q4_k),
        DType::Q5K => dot_blocks(w, x, kquants::dequant_q5_k),
        DType::Q6K => dot_blocks(w, x, kquants::dequant_q6_k),
        DType::Q8K => dot_blocks(w, x, kquants::dequant_q8_k),
        DType::IQ4NL => dot_blocks(w, x, iquants::dequant_iq4_nl),
        DType::IQ4XS => dot_blocks(w, x, iquants::dequant_iq4_xs),
        DType::IQ2XXS => dot_blocks(w, x, iqgrid::dequant_iq2_xxs),
        DType::IQ2XS => dot_blocks(w, x, iqgrid::dequant_iq2_xs),
        DType::IQ3XXS => dot_blocks(w, x, iqgrid::dequant_iq3_xxs),
        DType::IQ1S => dot_blocks(w, x, iqgrid::dequant_iq1_s),
        DType::IQ3S => dot_blocks(w, x, iqgrid::dequant_iq3_s),
        DType::IQ2S => dot_blocks(w, x, iqgrid::dequant_iq2_s),
        DType::IQ1M => dot_blocks(w, x, iqgrid::dequant_iq1_m),
        DType::TQ1_0 => dot_blocks(w, x, iqgrid::dequant_tq1_0),
        DType::TQ2_0 => dot_blocks(w, x, iqgrid::dequant_tq2_0),
    })
}

/// Quantize `src.len()` values; see [`super::quantize_row`].
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_row(dtype, src.len(), dst.len())?;
    match dtype {
        DType::F32 => quant_blocks(src, dst, |x: &[f32; 1], b: &mut [u8; 4]| {
            *b = x[0].to_le_bytes()
        }),
        DType::F16 => quant_blocks(src, dst, |x: &[f32; 1], b: &mut [u8; 2]| {
            *b = float::f32_to_f16(x[0])
        }),
        DType::BF16 => quant_blocks(src, dst, |x: &[f32; 1], b: &mut [u8; 2]| {
            *b = float::f32_to_bf16(x[0])
        }),
        DType::Q4_0 => quant_blocks(src, dst, legacy::quant_q4_0),
        DType::Q4_1 => quant_blocks(src, dst, legacy::quant_q4_1),
        DType::Q5_0 => quant_blocks(src, dst, legacy::quant_q5_0),
        DType::Q5_1 => quant_blocks(src, dst, legacy::quant_q5_1),
        DType::Q8_0 => quant_blocks(src, dst, legacy::quant_q8_0),
        DType::Q8_1 => quant_blocks(src, dst, legacy::quant_q8_1),
        DType::Q8K => quant_blocks(src, dst, kquants::quant_q8_k),
        DType::Q2K => quant_blocks(src, dst, kquantize::quant_q2_k),
        DType::Q3K => quant_blocks(src, dst, kquantize::quant_q3_k),
        DType::Q4K => quant_blocks(src, dst, kquantize::quant_q4_k),
        DType::Q5K => quant_blocks(src, dst, kquantize::quant_q5_k),
        DType::Q6K => quant_blocks(src, dst, kquantize::quant_q6_k),
        d if d.is_iquant() => return super::iquantize::quantize(d, src, None, dst),
        _ => return Err(QuantError::NoQuantizer { dtype }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_rng::Rng;

    #[test]
    fn rejects_partial_blocks_and_wrong_byte_counts() {
        for dtype in DType::ALL {
            let bs = dtype.block_size();
            let bb = dtype.block_bytes();
            // Element counts that are not whole blocks (only possible for block formats).
            if bs > 1 {
                for n in [1, bs - 1, bs + 1, 3 * bs + 7] {
                    let mut dst = vec![0.0f32; n];
                    let src = vec![0u8; bb * (n / bs + 1)];
                    assert_eq!(
                        dequantize_row(dtype, &src, &mut dst),
                        Err(QuantError::NotBlockMultiple { dtype, n })
                    );
                    assert!(dot_row(dtype, &src, &dst).is_err());
                    let mut out = vec![0u8; src.len()];
                    assert!(quantize_row(dtype, &dst, &mut out).is_err());
                }
            }
            // Whole blocks, but one byte short / long / empty.
            for blocks in [1usize, 3, 5] {
                let n = blocks * bs;
                let mut dst = vec![0.0f32; n];
                for got in [blocks * bb - 1, blocks * bb + 1, 0] {
                    let src = vec![0u8; got];
                    let want = Err(QuantError::ByteLen {
                        dtype,
                        n,
                        expected: blocks * bb,
                        got,
                    });
                    assert_eq!(dequantize_row(dtype, &src, &mut dst), want);
                    assert_eq!(dot_row(dtype, &src, &dst), want.map(|()| 0.0));
                }
            }
        }
    }

    #[test]
    fn empty_rows_are_fine() {
        for dtype in DType::ALL {
            assert_eq!(dequantize_row(dtype, &[], &mut []), Ok(()));
            assert_eq!(dot_row(dtype, &[], &[]), Ok(0.0));
            let want = if !dtype.has_quantizer() {
                Err(QuantError::NoQuantizer { dtype })
            } else if crate::quant::needs_importance(dtype) {
                Err(QuantError::NeedsImportance { dtype })
            } else {
                Ok(())
            };
            assert_eq!(quantize_row(dtype, &[], &mut []), want);
        }
    }

    /// For random bytes of every format and odd block counts: the dot product agrees with
    /// dequantize-then-dot in f64 within the f32 summation bound, and dequantizing a row equals
    /// dequantizing its blocks one at a time (no state leaks between blocks).
    #[test]
    fn dot_agrees_with_dequantize_on_random_blocks() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for dtype in DType::ALL {
            let bs = dtype.block_size();
            let bb = dtype.block_bytes();
            for blocks in [1usize, 3, 7] {
                let blocks = if bs == 1 { blocks * 37 } else { blocks };
                let n = blocks * bs;
                let mut w: Vec<u8> = (0..blocks * bb).map(|_| rng.next() as u8).collect();
                sanitize_scales(dtype, &mut w);
                let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
                let mut deq = vec![0.0f32; n];
                dequantize_row(dtype, &w, &mut deq).unwrap();
                for (b, (wb, yb)) in w.chunks(bb).zip(deq.chunks(bs)).enumerate() {
                    let mut one = vec![0.0f32; bs];
                    dequantize_row(dtype, wb, &mut one).unwrap();
                    assert_eq!(one, yb, "{dtype} block {b}");
                }
                let exact: f64 = deq.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = deq
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = dot_row(dtype, &w, &x).unwrap() as f64;
                let tol = (n as f64 + 1.0) * f32::EPSILON as f64 / 2.0 * mag;
                assert!(
                    (got - exact).abs() <= tol,
                    "{dtype} n={n}: {got} vs {exact} (tol {tol})"
                );
            }
        }
    }

    /// Untrusted input: arbitrary bytes (NaN/inf scales included) and non-finite activations
    /// must never panic (overflow checks are on in test builds).
    #[test]
    fn garbage_never_panics() {
        let mut rng = Rng(777);
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -0.0,
            1e-45,
        ];
        for dtype in DType::ALL {
            let n = 2 * dtype.block_size().max(32);
            let w: Vec<u8> = (0..dtype.bytes_for(n).unwrap())
                .map(|_| rng.next() as u8)
                .collect();
            let mut x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            for (i, &s) in specials.iter().enumerate() {
                x[i * 7 % n] = s;
            }
            let mut y = vec![0.0f32; n];
            dequantize_row(dtype, &w, &mut y).unwrap();
            let _ = dot_row(dtype, &w, &x).unwrap();
            let mut q = vec![0u8; w.len()];
            let big = vec![f32::MAX; n];
            let qw: Vec<f32> = (0..n)
                .map(|i| if i % 5 == 0 { f32::NAN } else { rng.f32() })
                .collect();
            if !dtype.has_quantizer() {
                let no = Err(QuantError::NoQuantizer { dtype });
                assert_eq!(quantize_row(dtype, &x, &mut q), no);
                assert_eq!(
                    crate::quant::quantize_row_weighted(dtype, &x, &qw, &mut q),
                    no
                );
                continue;
            }
            if crate::quant::needs_importance(dtype) {
                let no = Err(QuantError::NeedsImportance { dtype });
                assert_eq!(quantize_row(dtype, &x, &mut q), no);
            } else {
                quantize_row(dtype, &x, &mut q).unwrap();
                // All f32::MAX: the f16 scales overflow to inf.
                quantize_row(dtype, &big, &mut q).unwrap();
            }
            // The importance-weighted quantizers too, with garbage importances.
            crate::quant::quantize_row_weighted(dtype, &x, &qw, &mut q).unwrap();
            crate::quant::quantize_row_weighted(dtype, &big, &qw, &mut q).unwrap();
        }
    }

    /// Replace scale fields of random bytes with finite values so products stay finite.
    fn sanitize_scales(dtype: DType, w: &mut [u8]) {
        let bb = dtype.block_bytes();
        let half = |v: f32| float::f32_to_f16(v);
        for (i, b) in w.chunks_mut(bb).enumerate() {
            let v = 0.01 * (i as f32 + 1.0);
            match dtype {
                DType::F16 | DType::BF16 => {
                    // Clear the exponent's top bit: finite, |v| < 2.
                    b[1] &= 0xbf;
                }
                DType::F32 => b[3] &= 0xbf,
                DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => b[0..2].copy_from_slice(&half(v)),
                DType::Q4_1 | DType::Q5_1 | DType::Q8_1 => {
                    b[0..2].copy_from_slice(&half(v));
                    b[2..4].copy_from_slice(&half(-v));
                }
                DType::Q2K => {
                    b[80..82].copy_from_slice(&half(v));
                    b[82..84].copy_from_slice(&half(v / 2.0));
                }
                DType::Q3K => b[108..110].copy_from_slice(&half(v)),
                DType::Q4K | DType::Q5K => {
                    b[0..2].copy_from_slice(&half(v));
                    b[2..4].copy_from_slice(&half(v / 2.0));
                }
                DType::Q6K => b[208..210].copy_from_slice(&half(v)),
                DType::Q8K => b[0..4].copy_from_slice(&v.to_le_bytes()),
                DType::IQ4NL | DType::IQ4XS => b[0..2].copy_from_slice(&half(v)),
                _ => assert!(super::super::iqgrid::set_scale(dtype, b, v), "{dtype}"),
            }
        }
    }

    /// Quantize → dequantize round trips stay within half a quantization step (plus the f16
    /// rounding of the scale) for every quantizable format, over odd block counts.
    #[test]
    fn quantize_round_trip_error_is_bounded() {
        let mut rng = Rng(12345);
        // The K formats and the i-quants are checked byte for byte against ggml instead
        // (tests/quant_formats.rs).
        let k = [DType::Q2K, DType::Q3K, DType::Q4K, DType::Q5K, DType::Q6K];
        for dtype in DType::ALL
            .into_iter()
            .filter(|d| !k.contains(d) && !d.is_iquant() && d.has_quantizer())
        {
            let bs = dtype.block_size();
            for blocks in [1usize, 3, 5] {
                let n = blocks * bs.max(32);
                let x: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
                let mut q = vec![0u8; dtype.bytes_for(n).unwrap()];
                quantize_row(dtype, &x, &mut q).unwrap();
                let mut y = vec![0.0f32; n];
                dequantize_row(dtype, &q, &mut y).unwrap();
                // Levels per block: the step is range / levels.
                let levels = match dtype {
                    DType::F32 => 0.0,
                    DType::F16 => 2048.0,
                    DType::BF16 => 256.0,
                    DType::Q4_0 => 8.0,
                    DType::Q4_1 => 15.0,
                    DType::Q5_0 => 16.0,
                    DType::Q5_1 => 31.0,
                    DType::Q8_0 | DType::Q8_1 | DType::Q8K => 127.0,
                    _ => unreachable!(),
                };
                for (xb, yb) in x.chunks(bs.max(32)).zip(y.chunks(bs.max(32))) {
                    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    for (&a, &b) in xb.iter().zip(yb) {
                        let tol = if levels == 0.0 {
                            0.0
                        } else if bs == 1 {
                            a.abs() / levels + 1e-7
                        } else {
                            // One step (the symmetric formats clamp the far end by a step,
                            // the asymmetric ones span 2·amax), plus the f16 rounding of
                            // the scale and min.
                            2.0 * amax / levels + amax * 2e-3
                        };
                        assert!((a - b).abs() <= tol, "{dtype}: {a} -> {b} (tol {tol})");
                    }
                }
            }
        }
    }
}
