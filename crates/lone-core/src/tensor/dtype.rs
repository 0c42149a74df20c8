//! Storage formats of weights: a format is data (block size, bytes per block), not a type.

use std::fmt;

/// How the elements of a tensor are stored. Quantized formats pack `block_size()` elements
/// into `block_bytes()` bytes, exactly as llama.cpp's ggml lays them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    /// IQ4_NL: 32 elements in 18 bytes, f16 `d` then 16 bytes of 4-bit indices into the
    /// non-linear table `kvalues_iq4nl` (element j: low nibble of byte j, j+16: high nibble).
    IQ4NL,
    /// IQ4_XS: 256 elements in 136 bytes, f16 `d`, u16 `scales_h`, 4 bytes `scales_l` (eight
    /// 6-bit sub-block scales) and 128 bytes of 4-bit indices, 16 per sub-block of 32.
    IQ4XS,
    /// IQ2_XXS, 256 elements in 66 bytes: 2.06 bits: 8-element grid points (256), 7-bit sign patterns, 4-bit scales per 32.
    IQ2XXS,
    /// IQ2_XS, 256 elements in 74 bytes: 2.31 bits: 512 grid points, 7-bit signs, 4-bit scales per 16.
    IQ2XS,
    /// IQ3_XXS, 256 elements in 98 bytes: 3.06 bits: 4-element grid points (256), 7-bit signs, 4-bit scales per 32.
    IQ3XXS,
    /// IQ1_S, 256 elements in 50 bytes: 1.56 bits: 2048 ternary grid points with a ±1/8 offset, 3-bit scales per 32.
    IQ1S,
    /// IQ3_S, 256 elements in 110 bytes: 3.44 bits: 512 4-element grid points, 8 stored sign bits, 4-bit scales per 32.
    IQ3S,
    /// IQ2_S, 256 elements in 82 bytes: 2.56 bits: 1024 grid points, 8 stored sign bits, 4-bit scales per 16.
    IQ2S,
    /// IQ1_M, 256 elements in 56 bytes: 1.75 bits: IQ1_S's grid, offsets per 8, 3-bit scales per 16, no f16 field of its own.
    IQ1M,
    /// TQ1_0, 256 elements in 54 bytes: 1.69 bits: ternary (−1, 0, 1) × d, 5 trits per byte.
    TQ1_0,
    /// TQ2_0, 256 elements in 66 bytes: 2.06 bits: ternary (−1, 0, 1) × d, 2 bits each.
    TQ2_0,
}

impl DType {
    pub const ALL: [DType; 26] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8K,
        DType::IQ4NL,
        DType::IQ4XS,
        DType::IQ2XXS,
        DType::IQ2XS,
        DType::IQ3XXS,
        DType::IQ1S,
        DType::IQ3S,
        DType::IQ2S,
        DType::IQ1M,
        DType::TQ1_0,
        DType::TQ2_0,
    ];

    /// Elements per block (1 for plain float formats).
    pub fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q8_1
            | DType::IQ4NL => 32,
            // The K-quants and every i-quant but IQ4_NL: super-blocks of 256.
            _ => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
            DType::Q8K => 292,
            DType::IQ4NL => 18,
            DType::IQ4XS => 136,
            DType::IQ2XXS => 66,
            DType::IQ2XS => 74,
            DType::IQ3XXS => 98,
            DType::IQ1S => 50,
            DType::IQ3S => 110,
            DType::IQ2S => 82,
            DType::IQ1M => 56,
            DType::TQ1_0 => 54,
            DType::TQ2_0 => 66,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Whether lone can write the format (`quant::quantize_row_weighted`; IQ2_XXS, IQ2_XS
    /// and IQ1_S only with importances, `quant::needs_importance`).
    pub fn has_quantizer(self) -> bool {
        !self.is_iquant() || crate::quant::writes_iquant(self)
    }

    /// The i-quants (IQ1_S … IQ4_XS) and the ternary formats (TQ1_0, TQ2_0).
    pub fn is_iquant(self) -> bool {
        matches!(
            self,
            DType::IQ4NL
                | DType::IQ4XS
                | DType::IQ2XXS
                | DType::IQ2XS
                | DType::IQ2S
                | DType::IQ3XXS
                | DType::IQ3S
                | DType::IQ1S
                | DType::IQ1M
                | DType::TQ1_0
                | DType::TQ2_0
        )
    }

    /// Bytes needed for `n` elements, or None if `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.block_bytes())
    }

    /// The ggml type id used in GGUF files.
    pub fn ggml_type(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q8_1 => 9,
            DType::Q2K => 10,
            DType::Q3K => 11,
            DType::Q4K => 12,
            DType::Q5K => 13,
            DType::Q6K => 14,
            DType::Q8K => 15,
            DType::IQ4NL => 20,
            DType::IQ4XS => 23,
            DType::IQ2XXS => 16,
            DType::IQ2XS => 17,
            DType::IQ3XXS => 18,
            DType::IQ1S => 19,
            DType::IQ3S => 21,
            DType::IQ2S => 22,
            DType::IQ1M => 29,
            DType::TQ1_0 => 34,
            DType::TQ2_0 => 35,
            DType::BF16 => 30,
        }
    }

    pub fn from_ggml_type(t: u32) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.ggml_type() == t)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q8_0 => "Q8_0",
            DType::Q8_1 => "Q8_1",
            DType::Q2K => "Q2_K",
            DType::Q3K => "Q3_K",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
            DType::Q8K => "Q8_K",
            DType::IQ4NL => "IQ4_NL",
            DType::IQ4XS => "IQ4_XS",
            DType::IQ2XXS => "IQ2_XXS",
            DType::IQ2XS => "IQ2_XS",
            DType::IQ3XXS => "IQ3_XXS",
            DType::IQ1S => "IQ1_S",
            DType::IQ3S => "IQ3_S",
            DType::IQ2S => "IQ2_S",
            DType::IQ1M => "IQ1_M",
            DType::TQ1_0 => "TQ1_0",
            DType::TQ2_0 => "TQ2_0",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Name of a ggml type id that lone does not support (for error messages).
pub fn ggml_type_name(t: u32) -> String {
    match DType::from_ggml_type(t) {
        Some(d) => d.name().to_string(),
        None => match t {
            24 => "I8".into(),
            25 => "I16".into(),
            26 => "I32".into(),
            27 => "I64".into(),
            28 => "F64".into(),
            39 => "MXFP4".into(),
            _ => format!("type id {t}"),
        },
    }
}
