//! Plain float formats: F32, F16 (IEEE binary16) and BF16 (bfloat16), little endian.

use half::f16;

/// IEEE half → f32 (exact).
#[inline]
pub(crate) fn f16_to_f32(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// f32 → IEEE half, round to nearest even (what ggml's `GGML_FP32_TO_FP16` does).
#[inline]
pub(crate) fn f32_to_f16(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// bfloat16 → f32 (exact: bf16 is the high half of an f32).
#[inline]
pub(crate) fn bf16_to_f32(b: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
}

/// f32 → bfloat16 as ggml's `ggml_compute_fp32_to_bf16`: NaNs are made quiet (keeping sign
/// and high payload), everything else rounds to nearest even (overflowing to ±inf).
#[inline]
pub(crate) fn f32_to_bf16(v: f32) -> [u8; 2] {
    let u = v.to_bits();
    let h = if u & 0x7fff_ffff > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        (u + (0x7fff + ((u >> 16) & 1))) >> 16
    };
    (h as u16).to_le_bytes()
}

#[inline]
pub(crate) fn f32_from_le(b: &[u8; 4]) -> f32 {
    f32::from_le_bytes(*b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_ggml() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
        let tie_down = f32::from_bits(0x3f80_8000);
        assert_eq!(u16::from_le_bytes(f32_to_bf16(tie_down)), 0x3f80);
        // 0x3f81_8000 is halfway with an odd low bit: rounds up.
        assert_eq!(
            u16::from_le_bytes(f32_to_bf16(f32::from_bits(0x3f81_8000))),
            0x3f82
        );
        // Just above the tie rounds up.
        assert_eq!(
            u16::from_le_bytes(f32_to_bf16(f32::from_bits(0x3f80_8001))),
            0x3f81
        );
        // The largest finite f32 rounds to +inf.
        assert_eq!(u16::from_le_bytes(f32_to_bf16(f32::MAX)), 0x7f80);
        // A signalling NaN becomes quiet, keeping its sign.
        let snan = f32::from_bits(0xff80_0001);
        assert_eq!(u16::from_le_bytes(f32_to_bf16(snan)), 0xffc0);
        // Round trip of every bf16 that is not NaN.
        for h in 0..=u16::MAX {
            let v = bf16_to_f32(h.to_le_bytes());
            if !v.is_nan() {
                assert_eq!(u16::from_le_bytes(f32_to_bf16(v)), h);
            }
        }
    }

    #[test]
    fn f16_round_trip() {
        for h in 0..=u16::MAX {
            let v = f16_to_f32(h.to_le_bytes());
            if !v.is_nan() {
                assert_eq!(u16::from_le_bytes(f32_to_f16(v)), h);
            }
        }
        // 65520 is the smallest f32 that rounds to +inf in half.
        assert_eq!(f32_to_f16(65520.0), 0x7c00u16.to_le_bytes());
        assert_eq!(f32_to_f16(65519.99), 0x7bffu16.to_le_bytes());
    }
}
