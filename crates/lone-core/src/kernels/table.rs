//! Instruction sets and the kernel table: which kernel multiplies each format in each mode.

use super::*;

// ------------------------------------------------------------------ instruction sets

/// A kernel family. [`isa`] is the best one the CPU supports (or `LONE_ISA=scalar|avx2|
/// avxvnni|avx512|neon|dotprod|i8mm` when set and supported); tests and benchmarks can request any available one
/// through [`matmul_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust (`quant::reference`).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX2 + FMA + F16C + AVX-VNNI (Intel client CPUs since Alder Lake, Zen 5 without
    /// AVX-512): the AVX2 kernels, with VEX `vpdpbusd` for the 8-bit ones.
    AvxVnni,
    /// x86-64 AVX-512 F/BW/VL + VNNI (plus AVX2/FMA/F16C): 512-bit float kernels, 256-bit
    /// VNNI integer kernels.
    Avx512,
    /// aarch64 NEON, the ARMv8.0 baseline (Raspberry Pi 4): every format, 8-bit products
    /// by widening multiplies.
    Neon,
    /// aarch64 NEON + dotprod (ARMv8.2+: Raspberry Pi 5, Apple M1 and later, Graviton 2+):
    /// NEON's kernels, with `sdot` for the 8-bit ones.
    NeonDot,
    /// aarch64 NEON + dotprod + i8mm (ARMv8.6: Apple M2 and later, Graviton 3/4, Cortex-A710
    /// and later): the dotprod kernels, with `smmla` for several activation rows at once.
    NeonI8mm,
}

impl Isa {
    pub const ALL: [Isa; 7] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Neon,
        Isa::NeonDot,
        Isa::NeonI8mm,
    ];

    /// Whether this CPU can run the family.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => Isa::Avx2.is_available() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => true,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonI8mm => {
                Isa::NeonDot.is_available() && std::arch::is_aarch64_feature_detected!("i8mm")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// An x86-64 family (AVX2 or above).
    pub fn is_x86(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
    }

    /// An aarch64 family (NEON or above).
    pub fn is_arm(self) -> bool {
        matches!(self, Isa::Neon | Isa::NeonDot | Isa::NeonI8mm)
    }

    /// Whether the family has 8-bit matrix-vector kernels (integer dot products with 8-bit
    /// activation blocks), which [`Mode::Auto`]'s decode rows take: every SIMD family.
    pub fn has_8bit(self) -> bool {
        self != Isa::Scalar
    }

    /// Every family this CPU can run, slowest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::NeonDot => "dotprod",
            Isa::NeonI8mm => "i8mm",
        }
    }
}

/// The kernel family [`matmul`] uses, detected once.
pub fn isa() -> Isa {
    active().isa
}

// ------------------------------------------------------------------ kernel table

/// One call of a kernel: `out[t * out_stride + r] = dot(weight row r, activation row t)` for
/// `r < rows`, `t < nx` (1..=4; a [`Kernel::pairs`] kernel 1..=`PAIR_ROWS`). Weight rows
/// are `w_stride` bytes apart, activation rows `x_stride` bytes apart (f32 or the kernel's
/// 8-bit activation format; pairs of rows in the pair layout for [`Kernel::pairs`]), rows of
/// `k` elements.
pub(crate) struct MatArgs {
    pub dtype: DType,
    pub w: *const u8,
    pub w_stride: usize,
    pub rows: usize,
    pub x: *const u8,
    pub x_stride: usize,
    pub nx: usize,
    pub k: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// A kernel. Safety contract: every pointer in the `MatArgs` is valid for the bytes the call
/// reads or writes, `k` is a whole number of the format's blocks, `nx` is 1..=4
/// (1..=`PAIR_ROWS` for [`Kernel::pairs`]), the rows written do not overlap other threads'
/// rows, and the CPU supports the kernel's [`Isa`].
pub(crate) type MatFn = unsafe fn(&MatArgs);

/// A tile of an f32 matrix product: `out[t * out_stride + r] = Σ_i w[r * w_stride + i] ·
/// x[t, i]` for `r < rows`, `t < n`, `i < k` (strides in elements). The activations are
/// packed in blocks of `tb` rows (the kernel's [`Gemm::tb`]): block `b` holds `x[b·tb + j, i]`
/// at `x[(b·tb + i)·k... ]`, precisely `x[b·tb·k + i·tb + j]`, zero past row `n`.
pub(crate) struct GemmArgs {
    pub w: *const f32,
    pub w_stride: usize,
    pub rows: usize,
    pub x: *const f32,
    pub n: usize,
    pub k: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// An f32 GEMM tile kernel. Safety contract: every pointer in the `GemmArgs` is valid for
/// what the call reads or writes, `rows` and `n` are at least 1, the outputs do not overlap
/// other threads', and the CPU supports the kernel's [`Isa`].
pub(crate) type GemmFn = unsafe fn(&GemmArgs);

/// Dequantize one stored row of `k` elements (whole blocks) at `src` into `k` f32 at `dst`,
/// bit-exactly. Same safety contract as [`GemmFn`].
pub(crate) type DeqFn = unsafe fn(*const u8, *mut f32, usize);

/// Widen one group of 8 rows of `k` elements in the rows-by-8 layout ([`packed`]) at `src`
/// to f32 rows `dst_stride` apart at `dst`, bit for bit what [`DeqFn`] gives for the stored
/// rows. Safety: as [`DeqFn`]'s.
pub(crate) type DeqGroupFn = unsafe fn(*const u8, usize, *mut f32, usize);

/// The exact-mode many-row path: rows dequantized once into f32 (`deq`; F32 needs none), then
/// multiplied by every activation row with a register-blocked f32 tile kernel.
#[derive(Clone, Copy)]
pub(super) struct Gemm {
    pub(super) deq: Option<DeqFn>,
    /// The dequantizer of a group of 8 rows in the rows-by-8 layout, for a tensor whose
    /// packed copy exists (read in place of the stored rows); None: stored rows rebuilt.
    pub(super) deq_group: Option<DeqGroupFn>,
    pub(super) tile: GemmFn,
    /// Activation rows per packed block.
    pub(super) tb: usize,
    /// A SIMD packer for one block (`x`, `k`, rows, `dst`); None: the portable loop.
    pub(super) pack: Option<unsafe fn(*const f32, usize, usize, *mut f32)>,
    /// For at most [`NARROW_ROWS`] activation rows (plain, not packed): the same outputs,
    /// bit for bit, vectorised over weight rows (`x86::gemm_narrow`).
    pub(super) narrow: GemmFn,
}

/// Activation rows up to which [`Gemm::narrow`] runs instead of the tile kernel (a short
/// prompt step, which the f32 GEMM takes too: prompt rows give the same results in any
/// number).
pub(super) const NARROW_ROWS: usize = 8;

/// Which activations a kernel takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Act {
    F32,
    /// f32 rows of `k`, each followed by `k/32` f32 block sums (the sum of each 32
    /// consecutive activations): the factored exact kernels read `Σ x` per block from them.
    F32Sums,
    /// 8-bit blocks of this format.
    Quant(DType),
    /// f32 values of the 8-bit blocks (quantized, then dequantized): the scalar fast path.
    QuantDeq(DType),
}

#[derive(Clone, Copy)]
// `igemm`, `bgemm` and `isa` are read by x86's many-row GEMMs only.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Kernel {
    pub(super) f: MatFn,
    pub(super) act: Act,
    /// The f32 GEMM used instead of `f` for many activation rows (exact kernels only).
    pub(super) gemm: Option<Gemm>,
    /// Fast mode: the 8-bit GEMM ([`int8`]) is used instead of `f` for many activation rows.
    pub(super) igemm: bool,
    /// Fast mode, BF16 weights: the bf16 GEMM ([`bf16`]) for many activation rows.
    pub(super) bgemm: bool,
    /// The super-block i-quants' 8-bit GEMM ([`int8sb`]) for many activation rows: each row's
    /// outputs those of `f` alone, so [`Mode::Auto`] keeps it too.
    pub(super) sbgemm: bool,
    /// `f` reads the weights in [`packed`]'s rows-by-8 layout ([`Tensor::packed`]).
    pub(super) packed: bool,
    /// `f` gives each output the f32 GEMM's own FMA chain (`x86::float_rows8`: F16, BF16),
    /// so `gemm` may take many rows in every mode without changing a row's result.
    pub(super) gemm_chain: bool,
    /// The family the kernel belongs to (the 8-bit GEMM's level).
    pub(super) isa: Isa,
    /// Fast mode on aarch64: the kernel for several activation rows in the pair layout
    /// (`neon::pairs`), reading the rows-by-8 layout as `f` does.
    pub(super) pairs: Option<MatFn>,
    /// For more than 4 activation rows: a tile's weight rows decoded once into the
    /// [`DECODED_BB`] layout, and the kernel `f` is, over that layout (the i-quants on x86).
    pub(super) predecode: Option<(DecodeFn, MatFn)>,
}

/// Decode `rows` weight rows of `k` elements (`w_stride` bytes apart) into [`DECODED_BB`]
/// bytes per 32 elements at `dst`. Safety: the pointers are valid for those bytes and the
/// CPU supports the kernel's [`Isa`].
pub(crate) type DecodeFn = unsafe fn(*const u8, usize, usize, usize, *mut u8);

/// Bytes per 32 elements of a decoded row ([`Kernel::predecode`]): 32 signed codes, the f32
/// scales of the two halves and the f32 min.
pub(crate) const DECODED_BB: usize = 44;

/// One weight format as the kernel table sees it: its 8-bit activation format and its
/// kernels per ISA, all in one place (as ggml's `type_traits_cpu`). A format is added here
/// (plus its quantizer in `quant`, and for the rows-by-8 layout `packed::units`).
pub(super) struct Format {
    pub(super) dtype: DType,
    /// The 8-bit activation format llama.cpp pairs with it in fast mode (Q4_0/Q5_0 as
    /// unsigned quants with a min, the zero point, like Q4_1/Q5_1), if any.
    pub(super) act: Option<DType>,
    #[cfg(target_arch = "x86_64")]
    pub(super) x86: X86Kernels,
    #[cfg(target_arch = "aarch64")]
    pub(super) arm: neon::ArmKernels,
}

/// A format's x86 kernels; pairs are [AVX2, AVX-512].
#[cfg(target_arch = "x86_64")]
pub(super) struct X86Kernels {
    /// The exact matrix-vector kernel (f32 activations).
    pub(super) exact: [MatFn; 2],
    /// The bit-exact row dequantizer of the f32 GEMM; None: rows used in place (F32).
    pub(super) deq: Option<[DeqFn; 2]>,
    /// The exact kernel over rows packed by 8 that keeps the f32 GEMM's chain
    /// ([`Kernel::gemm_chain`]), with the GEMM's group dequantizer for that layout: the
    /// weight matrices' kernel (attention's key rows keep `exact`, the stored layout).
    pub(super) chain: Option<([MatFn; 2], [DeqGroupFn; 2])>,
    /// AVX2's factored exact kernel (scales out of the block sums), faster there than the
    /// generic one, and the activations it takes.
    pub(super) fac: Option<(MatFn, Act)>,
    /// The 8-bit matrix-vector kernels (activations in `act`'s format): [AVX2, AVX-VNNI,
    /// AVX-512], each with whether it reads the rows-by-8 layout ([`packed`]; the format
    /// must be one [`packed::packs`], test `packed_kernels_have_a_packed_layout`).
    pub(super) fast: Option<[(MatFn, bool); 3]>,
    /// The 8-bit kernels' many-row form ([`Kernel::predecode`]), per level as `fast`.
    pub(super) predecode: Option<[(DecodeFn, MatFn); 3]>,
}

#[cfg(target_arch = "x86_64")]
macro_rules! both {
    ($name:ident, $t:ty) => {
        [x86::avx2::$name as $t, x86::avx512::$name as $t]
    };
}

#[cfg(target_arch = "x86_64")]
#[cfg(target_arch = "x86_64")]
macro_rules! predecoded {
    ($mat:ident, $dec:ident) => {
        Some([
            (x86::avx2::$dec as DecodeFn, x86::avx2::$mat as MatFn),
            (x86::avxvnni::$dec, x86::avxvnni::$mat),
            (x86::avx512::$dec, x86::avx512::$mat),
        ])
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! all3 {
    ($name:ident, packed: $p:expr) => {
        [
            (x86::avx2::$name as MatFn, $p),
            (x86::avxvnni::$name as MatFn, $p),
            (x86::avx512::$name as MatFn, $p),
        ]
    };
}

/// A format's aarch64 kernels: the exact one, and the 8-bit ones of both levels when the
/// format has an 8-bit activation format.
#[cfg(target_arch = "aarch64")]
macro_rules! arm {
    (f32) => {
        neon::ArmKernels {
            exact: neon::ex::f32,
            deq: None,
            fast: None,
            pairs: [None; 2],
        }
    };
    ($name:ident) => {
        neon::ArmKernels {
            exact: neon::ex::$name,
            deq: Some(neon::deq::$name),
            fast: None,
            pairs: [None; 2],
        }
    };
    ($name:ident, 8bit: $act:ident) => {
        neon::ArmKernels {
            exact: neon::ex::$name,
            deq: Some(neon::deq::$name),
            fast: Some((
                [(neon::base::$name, false), (neon::dot::$name, false)],
                DType::$act,
            )),
            pairs: [None; 2],
        }
    };
    ($name:ident, 8bit: $act:ident, rows8) => {
        neon::ArmKernels {
            exact: neon::ex::$name,
            deq: Some(neon::deq::$name),
            fast: Some((
                [(neon::base::$name, false), (neon::dot::$name, true)],
                DType::$act,
            )),
            pairs: [None; 2],
        }
    };
    ($name:ident, 8bit: $act:ident, rows8, pairs) => {
        neon::ArmKernels {
            pairs: [Some(neon::pair_dot::$name), Some(neon::pair_mmla::$name)],
            ..arm!($name, 8bit: $act, rows8)
        }
    };
    ($name:ident, 8bit: $act:ident, rows8, pairs: i8mm) => {
        neon::ArmKernels {
            pairs: [None, Some(neon::pair_mmla::$name)],
            ..arm!($name, 8bit: $act, rows8)
        }
    };
}

macro_rules! weight_format {
    ($dtype:ident, $act:expr, exact: $exact:ident, deq: $deq:expr, fac: $fac:expr, fast: $fast:expr,
     arm: $($arm:tt)*) => {
        Format {
            dtype: DType::$dtype,
            act: $act,
            #[cfg(target_arch = "x86_64")]
            x86: X86Kernels {
                exact: both!($exact, MatFn),
                deq: $deq,
                chain: None,
                fac: $fac,
                fast: $fast,
                predecode: None,
            },
            #[cfg(target_arch = "aarch64")]
            arm: arm!($($arm)*),
        }
    };
}

/// A codebook i-quant or ternary format: on x86, sub-blocks of 32 decoded to signed codes
/// with integer scales against Q8_K activations, one float step per super-block (8-bit,
/// `x86::iqsuper`), or with their f32 scales widened to f32 (exact, and the f32 GEMM's row
/// dequantizer, `x86::iqgrid`); on aarch64 from super-blocks decoded to groups of 16 in NEON
/// against Q8_1 (`neon::iqgrid`), its kernels named `$fast`.
macro_rules! grid_format {
    ($dtype:ident, $fast:ident, $exact:ident, $deq:ident, $mat:ident, $dec:ident) => {
        Format {
            dtype: DType::$dtype,
            act: Some(DType::Q8K),
            #[cfg(target_arch = "x86_64")]
            x86: X86Kernels {
                exact: both!($exact, MatFn),
                deq: Some(both!($deq, DeqFn)),
                chain: None,
                fac: None,
                fast: Some(all3!($fast, packed: false)),
                predecode: predecoded!($mat, $dec),
            },
            #[cfg(target_arch = "aarch64")]
            arm: arm!($fast, 8bit: Q8_1),
        }
    };
}

/// A float format entry with its x86 rows-by-8 chain kernel ([`X86Kernels::chain`]).
macro_rules! with_chain {
    ($f:expr, $mat:ident, $deq:ident) => {{
        #[allow(unused_mut)]
        let mut f = $f;
        #[cfg(target_arch = "x86_64")]
        {
            f.x86.chain = Some((both!($mat, MatFn), both!($deq, DeqGroupFn)));
        }
        f
    }};
}

/// A format entry with its x86 8-bit kernels' many-row form ([`Kernel::predecode`]).
macro_rules! with_predecode {
    ($f:expr, $mat:ident, $dec:ident) => {{
        #[allow(unused_mut)]
        let mut f = $f;
        #[cfg(target_arch = "x86_64")]
        {
            f.x86.predecode = predecoded!($mat, $dec);
        }
        f
    }};
}

/// Every weight format lone multiplies (Q8_1 and Q8_K are activation formats only).
pub(super) const FORMATS: &[Format] = &[
    weight_format!(F32, None, exact: f32, deq: None, fac: None, fast: None,
        arm: f32),
    with_chain!(
        weight_format!(F16, None, exact: f16, deq: Some(both!(deq_f16, DeqFn)), fac: None,
        fast: None, arm: f16),
        f16_x8,
        deq8_f16
    ),
    with_chain!(
        weight_format!(BF16, None, exact: bf16, deq: Some(both!(deq_bf16, DeqFn)), fac: None,
        fast: None, arm: bf16),
        bf16_x8,
        deq8_bf16
    ),
    weight_format!(Q4_0, Some(DType::Q8_1), exact: exact_q4_0, deq: Some(both!(deq_q4_0, DeqFn)),
        fac: Some((x86::fac::q4_0 as MatFn, Act::F32Sums)), fast: Some(all3!(q4_0_x8, packed: true)),
        arm: q4_0, 8bit: Q8_1, rows8, pairs),
    weight_format!(Q4_1, Some(DType::Q8_1), exact: exact_q4_1, deq: Some(both!(deq_q4_1, DeqFn)),
        fac: Some((x86::fac::q4_1 as MatFn, Act::F32Sums)), fast: Some(all3!(q4_1_x8, packed: true)),
        arm: q4_1, 8bit: Q8_1, rows8, pairs: i8mm),
    weight_format!(Q5_0, Some(DType::Q8_1), exact: exact_q5_0, deq: Some(both!(deq_q5_0, DeqFn)),
        fac: Some((x86::fac::q5_0 as MatFn, Act::F32)), fast: Some(all3!(q5_0_x8, packed: true)),
        arm: q5_0, 8bit: Q8_1, rows8, pairs),
    weight_format!(Q5_1, Some(DType::Q8_1), exact: exact_q5_1, deq: Some(both!(deq_q5_1, DeqFn)),
        fac: Some((x86::fac::q5_1 as MatFn, Act::F32Sums)), fast: Some(all3!(q5_1_x8, packed: true)),
        arm: q5_1, 8bit: Q8_1, rows8, pairs),
    // Q8_0: packed by 8 rows (`vpdpbusd` takes codes + 128, AVX2 |codes| and signs).
    weight_format!(Q8_0, Some(DType::Q8_1), exact: exact_q8_0, deq: Some(both!(deq_q8_0, DeqFn)),
        fac: Some((x86::fac::q8_0 as MatFn, Act::F32)),
        fast: Some([(x86::q8_0::avx2 as MatFn, true), (x86::q8_0::avxvnni, true),
            (x86::q8_0::avx512, true)]),
        arm: q8_0, 8bit: Q8_1, rows8, pairs: i8mm),
    // Q2_K, Q3_K: on x86 the super-block kernels of the i-quants (`x86::iqsuper`).
    with_predecode!(
        weight_format!(Q2K, Some(DType::Q8K), exact: exact_q2_k, deq: Some(both!(deq_q2_k, DeqFn)),
        fac: None, fast: Some(all3!(q2_k, packed: false)), arm: q2_k, 8bit: Q8K, rows8),
        q2_k_dec,
        q2_k_decode
    ),
    with_predecode!(
        weight_format!(Q3K, Some(DType::Q8K), exact: exact_q3_k, deq: Some(both!(deq_q3_k, DeqFn)),
        fac: None, fast: Some(all3!(q3_k, packed: false)), arm: q3_k, 8bit: Q8K, rows8),
        q3_k_dec,
        q3_k_decode
    ),
    weight_format!(Q4K, Some(DType::Q8K), exact: exact_q4_k, deq: Some(both!(deq_q4_k, DeqFn)),
        fac: Some((x86::fac::q4_k as MatFn, Act::F32Sums)), fast: Some(all3!(q4_k_x8, packed: true)),
        arm: q4_k, 8bit: Q8K),
    with_predecode!(
        weight_format!(Q5K, Some(DType::Q8K), exact: exact_q5_k, deq: Some(both!(deq_q5_k, DeqFn)),
        fac: Some((x86::fac::q5_k as MatFn, Act::F32Sums)), fast: Some(all3!(q5_k, packed: false)),
        arm: q5_k, 8bit: Q8K),
        q5_k_dec,
        q5_k_decode
    ),
    with_predecode!(
        weight_format!(Q6K, Some(DType::Q8K), exact: exact_q6_k, deq: Some(both!(deq_q6_k, DeqFn)),
        fac: Some((x86::fac::q6_k as MatFn, Act::F32)), fast: Some(all3!(q6_k, packed: false)),
        arm: q6_k, 8bit: Q8K, rows8),
        q6_k_dec,
        q6_k_decode
    ),
    // The i-quants: 8-bit kernels on x86 and aarch64. IQ4_NL: 32-element blocks of levels
    // against Q8_1 activations (rows packed by 8 on x86's VNNI levels). IQ4_XS, like the codebook and ternary formats
    // (`grid_format!`), against Q8_K on x86 (`x86::iqsuper`), Q8_1 on aarch64.
    with_predecode!(
        weight_format!(IQ4NL, Some(DType::Q8_1), exact: exact_iq4_nl,
        deq: Some(both!(deq_iq4_nl, DeqFn)), fac: Some((x86::fac::iq4_nl as MatFn, Act::F32)),
        fast: Some([(x86::iq4_nl::avx2 as MatFn, false), (x86::iq4_nl::avxvnni, true),
            (x86::iq4_nl::avx512, true)]),
        arm: iq4_nl, 8bit: Q8_1),
        iq4_nl_dec,
        iq4_nl_decode
    ),
    with_predecode!(
        weight_format!(IQ4XS, Some(DType::Q8K), exact: exact_iq4_xs,
        deq: Some(both!(deq_iq4_xs, DeqFn)), fac: Some((x86::fac::iq4_xs as MatFn, Act::F32)),
        fast: Some(all3!(iq4_xs, packed: false)), arm: iq4_xs, 8bit: Q8_1),
        iq4_xs_dec,
        iq4_xs_decode
    ),
    grid_format!(
        IQ2XXS,
        iq2_xxs,
        exact_iq2_xxs,
        deq_iq2_xxs,
        iq2_xxs_dec,
        iq2_xxs_decode
    ),
    grid_format!(
        IQ2XS,
        iq2_xs,
        exact_iq2_xs,
        deq_iq2_xs,
        iq2_xs_dec,
        iq2_xs_decode
    ),
    grid_format!(IQ2S, iq2_s, exact_iq2_s, deq_iq2_s, iq2_s_dec, iq2_s_decode),
    grid_format!(
        IQ3XXS,
        iq3_xxs,
        exact_iq3_xxs,
        deq_iq3_xxs,
        iq3_xxs_dec,
        iq3_xxs_decode
    ),
    grid_format!(IQ3S, iq3_s, exact_iq3_s, deq_iq3_s, iq3_s_dec, iq3_s_decode),
    grid_format!(IQ1S, iq1_s, exact_iq1_s, deq_iq1_s, iq1_s_dec, iq1_s_decode),
    grid_format!(IQ1M, iq1_m, exact_iq1_m, deq_iq1_m, iq1_m_dec, iq1_m_decode),
    grid_format!(
        TQ1_0,
        tq1_0,
        exact_tq1_0,
        deq_tq1_0,
        tq1_0_dec,
        tq1_0_decode
    ),
    grid_format!(
        TQ2_0,
        tq2_0,
        exact_tq2_0,
        deq_tq2_0,
        tq2_0_dec,
        tq2_0_decode
    ),
];

/// `dtype`'s entry in [`FORMATS`].
pub(super) fn format_of(dtype: DType) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.dtype == dtype)
}

/// The 8-bit activation format llama.cpp pairs with a weight format.
pub(super) fn act_format(dtype: DType) -> Option<DType> {
    format_of(dtype).and_then(|f| f.act)
}

/// The 8-bit activation format fast mode multiplies `dtype` with on `isa`'s matrix-vector
/// kernels: [`act_format`], and on aarch64 also Q8_K for Q2_K/Q3_K, which have 8-bit kernels
/// there (none on x86, where fast mode takes them exactly).
pub(super) fn act_format_on(isa: Isa, dtype: DType) -> Option<DType> {
    #[cfg(target_arch = "aarch64")]
    if isa.is_arm() {
        return format_of(dtype)?.arm.fast.map(|(_, ad)| ad);
    }
    let _ = isa;
    act_format(dtype)
}

/// Scalar kernel: `quant::reference::dot_row` per (row, activation row), f32 activations.
pub(super) unsafe fn scalar_rows(a: &MatArgs) {
    // Rows of `rb` bytes, `w_stride` apart (the stride may be longer: strided key rows).
    let rb = a
        .dtype
        .bytes_for(a.k)
        .expect("weight rows are whole blocks (checked by matmul)");
    for r in 0..a.rows {
        // SAFETY: the MatFn contract: row r of `rb` bytes at r·w_stride and activation rows of
        // `k` f32.
        let w = unsafe { std::slice::from_raw_parts(a.w.add(r * a.w_stride), rb) };
        for t in 0..a.nx {
            // SAFETY: as above; f32 activations are 4-byte aligned (they come from &[f32]).
            let x =
                unsafe { std::slice::from_raw_parts(a.x.add(t * a.x_stride) as *const f32, a.k) };
            let v = quant::reference::dot_row(a.dtype, w, x)
                .expect("weight rows are whole blocks (checked by matmul)");
            // SAFETY: the MatFn contract: out[t * out_stride + r] is ours to write.
            unsafe { *a.out.add(t * a.out_stride + r) = v };
        }
    }
}

pub(super) fn kernel(isa: Isa, dtype: DType, exact: bool) -> Kernel {
    let fast_act = if exact {
        None
    } else {
        act_format_on(isa, dtype)
    };
    let scalar = Kernel {
        f: scalar_rows,
        act: fast_act.map_or(Act::F32, Act::QuantDeq),
        gemm: None,
        igemm: false,
        bgemm: false,
        sbgemm: false,
        packed: false,
        gemm_chain: false,
        isa: Isa::Scalar,
        pairs: None,
        predecode: None,
    };
    match isa {
        Isa::Scalar => scalar,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512 => {
            let mut k = x86_kernel(isa, dtype, fast_act).unwrap_or(scalar);
            if k.gemm.is_none() {
                // Many rows take the exact f32 GEMM (faster than the 8-bit matrix-vector
                // kernels' four rows per weight pass) unless the 8-bit GEMM takes them (below).
                k.gemm = x86_kernel(isa, dtype, None).and_then(|e| e.gemm);
            }
            k.bgemm = !exact && dtype == DType::BF16 && isa == Isa::Avx512 && bf16::pays();
            k.igemm = !exact && int8::supports(isa, dtype);
            k.sbgemm = !exact && int8sb::supports(isa, dtype);
            if k.igemm || k.sbgemm {
                k.gemm = None;
            }
            k
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonDot | Isa::NeonI8mm => {
            arm_kernel(isa, dtype, fast_act).unwrap_or(scalar)
        }
        #[allow(unreachable_patterns)]
        _ => scalar,
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) fn x86_kernel(isa: Isa, dtype: DType, fast_act: Option<DType>) -> Option<Kernel> {
    let f = format_of(dtype)?;
    let k = &f.x86;
    // Float and exact kernels: [AVX2 (also AVX-VNNI's), AVX-512]; 8-bit ones: one per level.
    let level = usize::from(isa == Isa::Avx512);
    let fast_level = match isa {
        Isa::Avx2 => 0,
        Isa::AvxVnni => 1,
        _ => 2,
    };
    type PackFn = unsafe fn(*const f32, usize, usize, *mut f32);
    let (tile, tb, pack, narrow) = if isa == Isa::Avx512 {
        (
            x86::avx512::gemm as GemmFn,
            32,
            Some(x86::pack32_avx512 as PackFn),
            x86::avx512::gemm_narrow as GemmFn,
        )
    } else {
        (
            x86::avx2::gemm as GemmFn,
            16,
            None,
            x86::avx2::gemm_narrow as GemmFn,
        )
    };
    let f32k = |f: MatFn, deq: Option<DeqFn>| {
        Some(Kernel {
            f,
            act: Act::F32,
            gemm: Some(Gemm {
                deq,
                deq_group: None,
                tile,
                tb,
                pack,
                narrow,
            }),
            igemm: false,
            bgemm: false,
            sbgemm: false,
            packed: false,
            gemm_chain: false,
            isa,
            pairs: None,
            predecode: None,
        })
    };
    if let Some(ad) = fast_act {
        let fast = k
            .fast
            .expect("a format with an 8-bit activation format has 8-bit kernels");
        let (f, packed) = fast[fast_level];
        return Some(Kernel {
            f,
            act: Act::Quant(ad),
            gemm: None,
            igemm: false,
            bgemm: false,
            sbgemm: false,
            packed,
            gemm_chain: false,
            isa,
            pairs: None,
            // Tiles decoded once from the stored rows: the row-by-row kernels only.
            predecode: k.predecode.filter(|_| !packed).map(|p| p[fast_level]),
        });
    }
    let deq = k.deq.map(|d| d[level]);
    // AVX2, exact: the factored kernels (scales out of the block sums); the AVX-512 level's
    // table-lookup kernels are faster there.
    match (k.chain, k.fac) {
        // Rows packed by 8 with the GEMM's chain (F16, BF16), the GEMM reading that layout.
        (Some((mats, groups)), _) => f32k(mats[level], deq).map(|kern| Kernel {
            packed: true,
            gemm_chain: true,
            gemm: kern.gemm.map(|g| Gemm {
                deq_group: Some(groups[level]),
                ..g
            }),
            ..kern
        }),
        (_, Some((fac, act))) if isa != Isa::Avx512 => {
            f32k(fac, deq).map(|kern| Kernel { act, ..kern })
        }
        _ => f32k(k.exact[level], deq),
    }
}

/// An aarch64 level's kernel for `dtype`: the 8-bit one where `fast_act` names the
/// activation format, else the exact one with the f32 GEMM (`neon::gemm`) for many rows.
#[cfg(target_arch = "aarch64")]
pub(super) fn arm_kernel(isa: Isa, dtype: DType, fast_act: Option<DType>) -> Option<Kernel> {
    let k = &format_of(dtype)?.arm;
    let ((f, packed), act) = match (fast_act, k.fast) {
        (Some(ad), Some((fast, _))) => (fast[usize::from(isa != Isa::Neon)], Act::Quant(ad)),
        _ => ((k.exact, false), Act::F32),
    };
    // Several rows in the pair layout, where the level has a kernel for the format.
    let pairs = match isa {
        Isa::NeonDot if packed => k.pairs[0],
        Isa::NeonI8mm if packed => k.pairs[1],
        _ => None,
    };
    // Exact rows take the f32 GEMM for many rows; the 8-bit kernels keep every row count
    // (four activation rows per weight pass beat the f32 GEMM's FMAs on NEON).
    let gemm = (act == Act::F32).then_some(Gemm {
        deq: k.deq,
        deq_group: None,
        tile: neon::gemm,
        tb: neon::TB,
        pack: None,
        narrow: neon::gemm_narrow,
    });
    Some(Kernel {
        f,
        act,
        gemm,
        igemm: false,
        bgemm: false,
        sbgemm: false,
        packed,
        gemm_chain: false,
        isa,
        pairs,
        predecode: None,
    })
}

/// The detected family's kernels, [fast, exact] per format, built once.
pub(super) struct Active {
    pub(super) isa: Isa,
    /// Per format, indexed by [`Mode`] (fast, exact, auto).
    pub(super) table: Vec<[Kernel; 3]>,
    /// Per format, the exact kernel over rows in the stored layout at any stride (attention's
    /// key rows: [`super::dot_rows`]); the weight matrices' kernel may read a packed copy.
    pub(super) stored: Vec<MatFn>,
    pub(super) vec: VecFns,
}

/// [`kernel`]'s exact kernel for `dtype`, reading rows in the stored layout.
pub(super) fn stored_kernel(isa: Isa, dtype: DType) -> MatFn {
    let k = kernel(isa, dtype, true);
    #[cfg(target_arch = "x86_64")]
    if k.gemm_chain {
        let level = usize::from(isa == Isa::Avx512);
        return format_of(dtype)
            .expect("a chain kernel has a format")
            .x86
            .exact[level];
    }
    k.f
}

/// Whether [`Mode::Auto`] multiplies `dtype` with 8-bit activations on the matrix-vector path
/// of `isa`: every SIMD family ([`Isa::has_8bit`]), every format with 8-bit kernels. The 4/5-bit legacy formats take the
/// rows-by-8 packed kernels ([`packed`]), bandwidth-bound where the exact ones are not
/// (LFM2-350M Q4_0 decode: 110-116 against 74-88 tok/s; Qwen2.5-0.5B Q4_K_M, whose 896-wide
/// rows make llama-quantize fall back to Q5_0: 58-63 against 46-53; docs/perf/history.md).
pub(super) fn auto_8bit(isa: Isa, dtype: DType) -> bool {
    isa.has_8bit() && act_format_on(isa, dtype).is_some()
}

/// The most rows a speculative verify pass of one sequence takes for `dtype` in this thread's
/// mode: in [`Mode::Auto`] on x86, formats on the 8-bit matrix-vector kernels, which a
/// model's decode rows take for every row count (one weight pass per 4 rows), are held to
/// what a GEMM would otherwise take over; `usize::MAX` elsewhere. (Decode rows give the same
/// result in any number: [`decode_rows`].) `Model::forward` also reads it: where it is finite
/// the 8-bit head's top logits are recomputed exactly.
pub fn row_invariant_rows(dtype: DType) -> usize {
    if mode() == Mode::Auto && auto_8bit(isa(), dtype) {
        GEMM_MIN_ROWS - 1
    } else {
        usize::MAX
    }
}

/// [`Mode::Auto`]'s kernel: where [`auto_8bit`], fast mode's matrix-vector kernel (and the
/// super-block GEMM, which keeps its chain) with the exact f32 GEMM for many rows; elsewhere
/// the exact kernel.
pub(super) fn auto_kernel(isa: Isa, dtype: DType, fast: Kernel, exact: Kernel) -> Kernel {
    if auto_8bit(isa, dtype) {
        Kernel {
            gemm: exact.gemm,
            igemm: false,
            bgemm: false,
            ..fast
        }
    } else {
        exact
    }
}

pub(super) fn active() -> &'static Active {
    pub(super) static ACTIVE: OnceLock<Active> = OnceLock::new();
    ACTIVE.get_or_init(|| {
        let best = *Isa::available().last().expect("scalar is always available");
        let isa = std::env::var("LONE_ISA")
            .ok()
            .and_then(|v| Isa::ALL.into_iter().find(|i| i.name() == v.trim()))
            .filter(|i| i.is_available())
            .unwrap_or(best);
        let table = DType::ALL
            .iter()
            .map(|&d| {
                let (fast, exact) = (kernel(isa, d, false), kernel(isa, d, true));
                [fast, exact, auto_kernel(isa, d, fast, exact)]
            })
            .collect();
        Active {
            isa,
            table,
            stored: DType::ALL.iter().map(|&d| stored_kernel(isa, d)).collect(),
            vec: vec_fns(isa),
        }
    })
}
