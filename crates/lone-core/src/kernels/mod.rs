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
#[cfg(target_arch = "x86_64")]
mod int8;
#[cfg(target_arch = "aarch64")]
mod neon;
mod packed;
mod pool;
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

// ------------------------------------------------------------------ numeric mode

/// The numeric mode of quantized matrix products (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// 8-bit (bf16) activations everywhere, as llama.cpp.
    Fast = 0,
    /// f32 activations everywhere: logits equal transformers' on the dequantized weights.
    Exact = 1,
    /// The default: on x86 (AVX2, AVX-512), prompt processing (many rows: the f32 GEMM) is
    /// exact and the matrix-vector products of quantized weights with 8-bit kernels (decode:
    /// fewer than 16 rows; Q4_0-Q8_0 and Q4_K-Q6_K, see `auto_8bit`) take them.
    /// `Model::forward` then
    /// recomputes each row's top output logits exactly, so the token picked is the exact
    /// head's. Exact f32 decode measured 0.6-0.9x llama.cpp on 4-bit formats (compute-bound
    /// on one AVX-512 machine and on AVX2), the 8-bit kernels 1.0-1.2x. Elsewhere (scalar,
    /// NEON) `Exact`. [`Mode::resolved`] says what it means on this CPU.
    Auto = 2,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Fast => "fast",
            Mode::Exact => "exact",
            Mode::Auto => "auto",
        }
    }

    /// The mode's name with the detected kernel family: `auto` is `exact` off x86.
    pub fn resolved(self) -> &'static str {
        match (self, isa()) {
            (Mode::Auto, Isa::Avx2 | Isa::Avx512) => "auto",
            (Mode::Auto, _) => "exact",
            (m, _) => m.name(),
        }
    }
}

/// 0: not yet read from `LONE_EXACT`; else 1 + the [`Mode`].
static MODE: AtomicU8 = AtomicU8::new(0);

/// What the current thread's matmuls use, set by a [`Scope`] (a model's [`Compute`] for
/// the length of its forward pass, or a test's [`exact_scope`]).
#[derive(Clone, Copy, Default)]
struct Here {
    /// None: the process-wide mode.
    mode: Option<Mode>,
    /// The model's own mode while `mode` is a prompt pass's exact one (what its decode rows
    /// take: whether the packed layouts are in use).
    base: Option<Mode>,
    /// Prompt rows: every row count takes the f32 GEMM where the format has one (see
    /// [`Compute::enter`]).
    prompt: bool,
    /// Most threads a parallel region of this thread uses; None: the pool's.
    threads: Option<usize>,
}

thread_local! {
    static HERE: Cell<Here> = const {
        Cell::new(Here {
            mode: None,
            base: None,
            prompt: false,
            threads: None,
        })
    };
}

fn mode_from(v: u8) -> Mode {
    match v {
        1 => Mode::Fast,
        2 => Mode::Exact,
        _ => Mode::Auto,
    }
}

/// Set the process-wide numeric mode: `true` = [`Mode::Exact`], `false` = [`Mode::Fast`].
pub fn set_exact(on: bool) {
    set_mode(if on { Mode::Exact } else { Mode::Fast });
}

/// Set the process-wide numeric mode (what a model whose [`Compute`] names none uses). The
/// initial value comes from the environment: `LONE_EXACT=0` starts in fast mode,
/// `LONE_EXACT=1` in exact mode, else [`Mode::Auto`].
pub fn set_mode(m: Mode) {
    MODE.store(1 + m as u8, Ordering::SeqCst);
}

/// The process-wide numeric mode.
pub fn global_mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        0 => {
            let m = match std::env::var("LONE_EXACT").as_deref().map(str::trim) {
                Ok("0") => Mode::Fast,
                Ok("1") => Mode::Exact,
                _ => Mode::Auto,
            };
            let _ = MODE.compare_exchange(0, 1 + m as u8, Ordering::SeqCst, Ordering::SeqCst);
            mode_from(MODE.load(Ordering::SeqCst))
        }
        v => mode_from(v),
    }
}

/// The mode matmuls issued from this thread use.
pub fn mode() -> Mode {
    HERE.with(|c| c.get()).mode.unwrap_or_else(global_mode)
}

/// Whether this thread's matmuls are on prompt rows ([`Compute::enter`]): attention then
/// takes its GEMM form for every run of rows too.
pub fn prompt_rows() -> bool {
    HERE.with(|c| c.get()).prompt
}

/// Whether matmuls issued from this thread are exact on every path (f32 activations).
pub fn exact() -> bool {
    match mode() {
        Mode::Exact => true,
        Mode::Fast => false,
        Mode::Auto => !matches!(isa(), Isa::Avx2 | Isa::Avx512),
    }
}

/// How a model computes: its numeric mode and threads, owned by the model (so a draft model
/// and its target can differ) and in force on the calling thread for each forward pass
/// ([`Compute::enter`]). `None` fields keep what the calling thread has (a test's
/// [`exact_scope`]), else the process-wide settings ([`set_mode`], [`set_threads`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compute {
    pub mode: Option<Mode>,
    /// Threads of each parallel region (the caller included), at most the pool's.
    pub threads: Option<usize>,
}

impl Compute {
    /// The mode this context resolves to on the calling thread now.
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or_else(mode)
    }

    /// Put this context in force on the current thread until the guard drops. `prompt`: the
    /// rows are prompt tokens. Outside fast mode those are processed exactly and every row
    /// count takes the f32 GEMM (on x86), whose result for a row does not depend on the other
    /// rows or their number (each output is one FMA chain over `k`): a prompt gives the same
    /// logits whether it comes whole, in chunks, or after a cached prefix. Decode rows take
    /// the mode's matrix-vector kernels.
    pub fn enter(&self, prompt: bool) -> Scope {
        let m = self.mode();
        let (mode, prompt) = if prompt && m != Mode::Fast {
            (Mode::Exact, true)
        } else {
            (m, false)
        };
        Scope(HERE.with(|c| {
            c.replace(Here {
                mode: Some(mode),
                base: Some(m),
                prompt,
                threads: self.threads.or(c.get().threads),
            })
        }))
    }
}

/// Override the mode for matmuls issued from the current thread until the guard drops:
/// `true` = [`Mode::Exact`], `false` = [`Mode::Fast`].
pub fn exact_scope(on: bool) -> Scope {
    Compute {
        mode: Some(if on { Mode::Exact } else { Mode::Fast }),
        threads: None,
    }
    .enter(false)
}

/// A [`Compute`] in force on this thread; dropping it restores what was.
pub struct Scope(Here);
impl Drop for Scope {
    fn drop(&mut self) {
        HERE.with(|c| c.set(self.0));
    }
}

/// Whether `dtype`'s decode kernels in this thread's base mode read the packed layout, so
/// that a prompt GEMM should build it (and read only it) rather than the file's pages.
fn packs_here(dtype: DType) -> bool {
    let here = HERE.with(|c| c.get());
    let m = here.base.or(here.mode).unwrap_or_else(global_mode);
    active().table[dtype_index(dtype)][m as usize].packed
}

/// Most threads this thread's parallel regions use.
fn threads_here() -> Option<usize> {
    HERE.with(|c| c.get()).threads
}

// ------------------------------------------------------------------ instruction sets

/// A kernel family. [`isa`] is the best one the CPU supports (or `LONE_ISA=scalar|avx2|
/// avx512|neon` when set and supported); tests and benchmarks can request any available one
/// through [`matmul_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust (`quant::reference`).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI (plus AVX2/FMA/F16C): 512-bit float kernels, 256-bit
    /// VNNI integer kernels.
    Avx512,
    /// aarch64 NEON (float weights; other formats use the scalar kernels for now).
    Neon,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

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
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every family this CPU can run, slowest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

/// The kernel family [`matmul`] uses, detected once.
pub fn isa() -> Isa {
    active().isa
}

// ------------------------------------------------------------------ kernel table

/// One call of a kernel: `out[t * out_stride + r] = dot(weight row r, activation row t)` for
/// `r < rows`, `t < nx` (1..=4). Weight rows are `w_stride` bytes apart, activation rows
/// `x_stride` bytes apart (f32 or the kernel's 8-bit activation format), rows of `k` elements.
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
/// reads or writes, `k` is a whole number of the format's blocks, `nx` is 1..=4, the rows
/// written do not overlap other threads' rows, and the CPU supports the kernel's [`Isa`].
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

/// The exact-mode many-row path: rows dequantized once into f32 (`deq`; F32 needs none), then
/// multiplied by every activation row with a register-blocked f32 tile kernel.
#[derive(Clone, Copy)]
struct Gemm {
    deq: Option<DeqFn>,
    tile: GemmFn,
    /// Activation rows per packed block.
    tb: usize,
    /// A SIMD packer for one block (`x`, `k`, rows, `dst`); None: the portable loop.
    pack: Option<unsafe fn(*const f32, usize, usize, *mut f32)>,
    /// For at most [`NARROW_ROWS`] activation rows (plain, not packed): the same outputs,
    /// bit for bit, vectorised over weight rows (`x86::gemm_narrow`).
    narrow: GemmFn,
}

/// Activation rows up to which [`Gemm::narrow`] runs instead of the tile kernel (a short
/// prompt step, which the f32 GEMM takes too: prompt rows give the same results in any
/// number).
const NARROW_ROWS: usize = 8;

/// Which activations a kernel takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
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
struct Kernel {
    f: MatFn,
    act: Act,
    /// The f32 GEMM used instead of `f` for many activation rows (exact kernels only).
    gemm: Option<Gemm>,
    /// Fast mode: the 8-bit GEMM ([`int8`]) is used instead of `f` for many activation rows.
    igemm: bool,
    /// Fast mode, BF16 weights: the bf16 GEMM ([`bf16`]) for many activation rows.
    bgemm: bool,
    /// `f` reads the weights in [`packed`]'s rows-by-8 layout ([`Tensor::packed`]).
    packed: bool,
}

/// The 8-bit activation format llama.cpp pairs with a weight format.
fn act_format(dtype: DType) -> Option<DType> {
    match dtype {
        DType::Q8_0 => Some(DType::Q8_0),
        // Q4_0/Q5_0 as unsigned quants with a min (the zero point), like Q4_1/Q5_1.
        DType::Q4_0 | DType::Q5_0 | DType::Q4_1 | DType::Q5_1 => Some(DType::Q8_1),
        DType::Q4K | DType::Q5K | DType::Q6K => Some(DType::Q8K),
        _ => None,
    }
}

/// Scalar kernel: `quant::reference::dot_row` per (row, activation row), f32 activations.
unsafe fn scalar_rows(a: &MatArgs) {
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

fn kernel(isa: Isa, dtype: DType, exact: bool) -> Kernel {
    let fast_act = if exact { None } else { act_format(dtype) };
    let scalar = Kernel {
        f: scalar_rows,
        act: fast_act.map_or(Act::F32, Act::QuantDeq),
        gemm: None,
        igemm: false,
        bgemm: false,
        packed: false,
    };
    match isa {
        Isa::Scalar => scalar,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => {
            let mut k = x86_kernel(isa, dtype, fast_act).unwrap_or(scalar);
            if isa == Isa::Avx2 && k.gemm.is_none() {
                // No 8-bit GEMM on AVX2 (yet): many rows take the exact f32 GEMM, faster than
                // the 8-bit matrix-vector kernels' four rows per weight pass.
                k.gemm = x86_kernel(isa, dtype, None).and_then(|e| e.gemm);
            }
            k.bgemm = !exact && dtype == DType::BF16 && isa == Isa::Avx512 && bf16::available();
            k.igemm = !exact && isa == Isa::Avx512 && int8::supports(dtype);
            if k.igemm {
                k.gemm = None;
            }
            k
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::kernel(dtype).map_or(scalar, |f| Kernel {
            f,
            act: Act::F32,
            gemm: None,
            igemm: false,
            bgemm: false,
            packed: false,
        }),
        #[allow(unreachable_patterns)]
        _ => scalar,
    }
}

#[cfg(target_arch = "x86_64")]
fn x86_kernel(isa: Isa, dtype: DType, fast_act: Option<DType>) -> Option<Kernel> {
    macro_rules! pick {
        ($name:ident) => {
            if isa == Isa::Avx512 {
                x86::avx512::$name as MatFn
            } else {
                x86::avx2::$name as MatFn
            }
        };
    }
    macro_rules! deq {
        ($name:ident) => {
            Some(if isa == Isa::Avx512 {
                x86::avx512::$name as DeqFn
            } else {
                x86::avx2::$name as DeqFn
            })
        };
    }
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
                tile,
                tb,
                pack,
                narrow,
            }),
            igemm: false,
            bgemm: false,
            packed: false,
        })
    };
    if let Some(ad) = fast_act {
        let packed = packed::packs(dtype);
        let f = match dtype {
            DType::Q4_0 => pick!(q4_0_x8),
            DType::Q4_1 => pick!(q4_1_x8),
            DType::Q5_0 => pick!(q5_0_x8),
            DType::Q5_1 => pick!(q5_1_x8),
            DType::Q8_0 => pick!(q8_0),
            DType::Q4K => pick!(q4_k),
            DType::Q5K => pick!(q5_k),
            DType::Q6K => pick!(q6_k),
            _ => unreachable!("act_format covers these"),
        };
        return Some(Kernel {
            f,
            act: Act::Quant(ad),
            gemm: None,
            igemm: false,
            bgemm: false,
            packed,
        });
    }
    // AVX2, exact: the factored kernels (scales out of the block sums); the AVX-512 level's
    // table-lookup kernels are faster there.
    if isa == Isa::Avx2 {
        let fac =
            |f: MatFn, act: Act, deq: Option<DeqFn>| f32k(f, deq).map(|k| Kernel { act, ..k });
        match dtype {
            DType::Q4_0 => return fac(x86::fac::q4_0, Act::F32Sums, deq!(deq_q4_0)),
            DType::Q4_1 => return fac(x86::fac::q4_1, Act::F32Sums, deq!(deq_q4_1)),
            DType::Q5_0 => return fac(x86::fac::q5_0, Act::F32, deq!(deq_q5_0)),
            DType::Q5_1 => return fac(x86::fac::q5_1, Act::F32Sums, deq!(deq_q5_1)),
            DType::Q8_0 => return fac(x86::fac::q8_0, Act::F32, deq!(deq_q8_0)),
            DType::Q4K => return fac(x86::fac::q4_k, Act::F32Sums, deq!(deq_q4_k)),
            DType::Q5K => return fac(x86::fac::q5_k, Act::F32Sums, deq!(deq_q5_k)),
            DType::Q6K => return fac(x86::fac::q6_k, Act::F32, deq!(deq_q6_k)),
            _ => {}
        }
    }
    match dtype {
        DType::F32 => f32k(pick!(f32), None),
        DType::F16 => f32k(pick!(f16), deq!(deq_f16)),
        DType::BF16 => f32k(pick!(bf16), deq!(deq_bf16)),
        DType::Q4_0 => f32k(pick!(exact_q4_0), deq!(deq_q4_0)),
        DType::Q4_1 => f32k(pick!(exact_q4_1), deq!(deq_q4_1)),
        DType::Q5_0 => f32k(pick!(exact_q5_0), deq!(deq_q5_0)),
        DType::Q5_1 => f32k(pick!(exact_q5_1), deq!(deq_q5_1)),
        DType::Q8_0 => f32k(pick!(exact_q8_0), deq!(deq_q8_0)),
        DType::Q2K => f32k(pick!(exact_q2_k), deq!(deq_q2_k)),
        DType::Q3K => f32k(pick!(exact_q3_k), deq!(deq_q3_k)),
        DType::Q4K => f32k(pick!(exact_q4_k), deq!(deq_q4_k)),
        DType::Q5K => f32k(pick!(exact_q5_k), deq!(deq_q5_k)),
        DType::Q6K => f32k(pick!(exact_q6_k), deq!(deq_q6_k)),
        DType::Q8_1 | DType::Q8K => None,
    }
}

/// The detected family's kernels, [fast, exact] per format, built once.
struct Active {
    isa: Isa,
    /// Per format, indexed by [`Mode`] (fast, exact, auto).
    table: Vec<[Kernel; 3]>,
    vec: VecFns,
}

/// Vector primitives (softmax, SiLU, attention): SIMD for the detected family. Safety
/// contract: the pointers are valid for what each function reads and writes (`exp`: `n` f32;
/// `mix`: the extents [`mix_rows`] checks) and the CPU supports the family.
#[derive(Clone, Copy)]
struct VecFns {
    /// `x[i] = e^x[i]`, within a few ulp of `f32::exp`.
    exp: unsafe fn(*mut f32, usize),
    /// See [`mix_rows`]: f32 values.
    mix: MixFn,
    /// f16 values.
    mix_f16: MixFn,
    /// Q8_0 values (whole blocks).
    mix_q8: MixFn,
}

/// `mix_rows` over raw value rows (`stride` elements apart) of the function's element type.
type MixFn = unsafe fn(*const f32, usize, usize, *const u8, usize, usize, usize, *mut f32);

fn vec_fns(isa: Isa) -> VecFns {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => VecFns {
            exp: x86::exp_avx512,
            mix: x86::avx512::mix,
            mix_f16: x86::avx512::mix_f16,
            mix_q8: x86::avx512::mix_q8,
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => VecFns {
            exp: x86::exp_avx2,
            mix: x86::avx2::mix,
            mix_f16: x86::avx2::mix_f16,
            mix_q8: x86::avx2::mix_q8,
        },
        _ => VecFns {
            exp: exp_scalar,
            mix: mix_scalar::<false>,
            mix_f16: mix_scalar::<true>,
            mix_q8: mix_scalar_q8,
        },
    }
}

/// Scalar reference of [`mix_rows`] (same contract, unchecked): f32 values, or f16 ones.
#[allow(clippy::too_many_arguments)]
unsafe fn mix_scalar<const F16: bool>(
    p: *const f32,
    p_stride: usize,
    nq: usize,
    vals: *const u8,
    stride: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    for g in 0..nq {
        for j in 0..nk {
            // SAFETY: the mix_rows contract (checked by it): row j of d elements.
            let (w, o) = unsafe {
                (
                    *p.add(g * p_stride + j),
                    std::slice::from_raw_parts_mut(out.add(g * d), d),
                )
            };
            for (i, a) in o.iter_mut().enumerate() {
                // SAFETY: as above; element i of row j.
                let b = unsafe {
                    if F16 {
                        let h = (vals as *const u16).add(j * stride + i).read_unaligned();
                        half::f16::from_bits(h).to_f32()
                    } else {
                        (vals as *const f32).add(j * stride + i).read_unaligned()
                    }
                };
                *a += w * b;
            }
        }
    }
}

/// [`mix_scalar`] for Q8_0 values: each block's quants times its scale (the dequantized
/// values), weighted.
#[allow(clippy::too_many_arguments)]
unsafe fn mix_scalar_q8(
    p: *const f32,
    p_stride: usize,
    nq: usize,
    vals: *const u8,
    stride: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    let rs = stride / 32 * 34;
    let mut row = vec![0f32; d];
    for j in 0..nk {
        // SAFETY: the mix_rows contract: row j holds d/32 whole blocks.
        let src = unsafe { std::slice::from_raw_parts(vals.add(j * rs), d / 32 * 34) };
        quant::dequantize_row(DType::Q8_0, src, &mut row).expect("whole blocks");
        for g in 0..nq {
            // SAFETY: as above: weight (g, j) and output row g.
            let (w, o) = unsafe {
                (
                    *p.add(g * p_stride + j),
                    std::slice::from_raw_parts_mut(out.add(g * d), d),
                )
            };
            for (a, &b) in o.iter_mut().zip(&row) {
                *a += w * b;
            }
        }
    }
}

/// Attention keys or values as the cache stores them: rows of elements some stride apart.
#[derive(Clone, Copy, Debug)]
pub enum KvSlice<'a> {
    F32(&'a [f32]),
    /// IEEE half-precision bit patterns.
    F16(&'a [u16]),
    /// Q8_0 blocks (rows and heads of whole blocks; strides in elements, multiples of 32).
    Q8_0(&'a [u8]),
}

impl KvSlice<'_> {
    /// Elements held.
    fn len(&self) -> usize {
        match self {
            KvSlice::F32(x) => x.len(),
            KvSlice::F16(x) => x.len(),
            KvSlice::Q8_0(x) => x.len() / 34 * 32,
        }
    }
    fn dtype(&self) -> DType {
        match self {
            KvSlice::F32(_) => DType::F32,
            KvSlice::F16(_) => DType::F16,
            KvSlice::Q8_0(_) => DType::Q8_0,
        }
    }
    fn ptr(&self) -> *const u8 {
        match self {
            KvSlice::F32(x) => x.as_ptr() as *const u8,
            KvSlice::F16(x) => x.as_ptr() as *const u8,
            KvSlice::Q8_0(x) => x.as_ptr(),
        }
    }
    /// Bytes between rows `stride` elements apart.
    fn stride_bytes(&self, stride: usize) -> usize {
        match self {
            KvSlice::F32(_) => 4 * stride,
            KvSlice::F16(_) => 2 * stride,
            KvSlice::Q8_0(_) => stride / 32 * 34,
        }
    }
    /// Whether rows of `d` elements `stride` apart are whole blocks.
    fn blocks_ok(&self, d: usize, stride: usize) -> bool {
        !matches!(self, KvSlice::Q8_0(_)) || (d.is_multiple_of(32) && stride.is_multiple_of(32))
    }
}

/// Dot products of `nq` rows of `q` (`d` each, contiguous) with `nk` rows of `keys` (`d`
/// each, `stride` elements apart, f32 or f16): `out[g·nk + j] = q_g · key_j` (attention
/// scores). Runs on the calling thread, with the F32/F16 matrix-vector kernel (f32
/// activations: f16 keys are exactly widened).
///
/// Panics if the slices are too short.
#[allow(clippy::too_many_arguments)]
pub fn dot_rows(
    q: &[f32],
    nq: usize,
    keys: KvSlice,
    stride: usize,
    nk: usize,
    d: usize,
    out: &mut [f32],
) {
    assert!(
        q.len() >= nq * d && out.len() >= nq * nk,
        "dot_rows: lengths"
    );
    assert!(
        nk == 0
            || (keys.len() >= (nk - 1) * stride + d && stride >= d && keys.blocks_ok(d, stride)),
        "dot_rows: keys"
    );
    if nq == 0 || nk == 0 {
        return;
    }
    if d == 0 {
        out[..nq * nk].fill(0.0);
        return;
    }
    let dtype = keys.dtype();
    let kern = active().table[dtype_index(dtype)][Mode::Exact as usize];
    debug_assert!(kern.act == Act::F32);
    let mut g0 = 0;
    while g0 < nq {
        let nx = 4.min(nq - g0);
        // SAFETY: nk key rows of d elements, `stride` apart, lie in `keys`; nx query rows of
        // d f32 from g0 in `q`; out rows g0..g0+nx of nk f32 in `out` (all asserted above);
        // the F32/F16 kernel takes f32 activations, rows at any stride, and runs on this CPU.
        unsafe {
            let a = MatArgs {
                dtype,
                w: keys.ptr(),
                w_stride: keys.stride_bytes(stride),
                rows: nk,
                x: q.as_ptr().add(g0 * d) as *const u8,
                x_stride: 4 * d,
                nx,
                k: d,
                out: out.as_mut_ptr().add(g0 * nk),
                out_stride: nk,
            };
            (kern.f)(&a);
        }
        g0 += nx;
    }
}

/// `out[g·d + i] += Σ_j p[g·p_stride + j] · vals[j·stride + i]` for `g < nq`, `j < nk`,
/// `i < d` (attention's weighted sum of values, several heads at once).
///
/// Panics if the slices are too short.
#[allow(clippy::too_many_arguments)]
pub fn mix_rows(
    p: &[f32],
    p_stride: usize,
    nq: usize,
    vals: KvSlice,
    stride: usize,
    nk: usize,
    d: usize,
    out: &mut [f32],
) {
    if nq == 0 || nk == 0 || d == 0 {
        return;
    }
    assert!(
        p.len() >= (nq - 1) * p_stride + nk && p_stride >= nk,
        "mix_rows: weights"
    );
    assert!(
        vals.len() >= (nk - 1) * stride + d && stride >= d && vals.blocks_ok(d, stride),
        "mix_rows: values"
    );
    assert!(out.len() >= nq * d, "mix_rows: output");
    let v = active().vec;
    let f = match vals {
        KvSlice::F32(_) => v.mix,
        KvSlice::F16(_) => v.mix_f16,
        KvSlice::Q8_0(_) => v.mix_q8,
    };
    // SAFETY: the extents were asserted above; the table's functions run on this CPU.
    unsafe {
        f(
            p.as_ptr(),
            p_stride,
            nq,
            vals.ptr(),
            stride,
            nk,
            d,
            out.as_mut_ptr(),
        )
    }
}

/// Scalar reference of the `exp` vector primitive: `f32::exp`.
unsafe fn exp_scalar(x: *mut f32, n: usize) {
    // SAFETY: the VecFns contract.
    let x = unsafe { std::slice::from_raw_parts_mut(x, n) };
    x.iter_mut().for_each(|v| *v = v.exp());
}

/// Whether [`Mode::Auto`] multiplies `dtype` with 8-bit activations on the matrix-vector path
/// of `isa`: x86, every format with 8-bit kernels. The 4/5-bit legacy formats take the
/// rows-by-8 packed kernels ([`packed`]), bandwidth-bound where the exact ones are not
/// (LFM2-350M Q4_0 decode: 110-116 against 74-88 tok/s; Qwen2.5-0.5B Q4_K_M, whose 896-wide
/// rows make llama-quantize fall back to Q5_0: 58-63 against 46-53; docs/performance.md).
fn auto_8bit(isa: Isa, dtype: DType) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512) && act_format(dtype).is_some()
}

/// Most rows of one matmul whose results do not depend on how many rows there are, for
/// `dtype` in this thread's mode: in [`Mode::Auto`] on x86, formats on the 8-bit matrix-vector
/// kernels switch to the exact f32 GEMM at [`GEMM_MIN_ROWS`] rows, so a row's logits (and
/// possibly a greedy token) would differ between a one-row decode and a long batch.
/// `usize::MAX` where every row count multiplies the same way (exact f32 everywhere, up to the
/// order of rounding). Speculation keeps verify passes within this.
pub fn row_invariant_rows(dtype: DType) -> usize {
    if mode() == Mode::Auto && auto_8bit(isa(), dtype) {
        GEMM_MIN_ROWS - 1
    } else {
        usize::MAX
    }
}

/// [`Mode::Auto`]'s kernel: where [`auto_8bit`], fast mode's matrix-vector kernel with the
/// exact f32 GEMM for many rows; elsewhere the exact kernel.
fn auto_kernel(isa: Isa, dtype: DType, fast: Kernel, exact: Kernel) -> Kernel {
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

fn active() -> &'static Active {
    static ACTIVE: OnceLock<Active> = OnceLock::new();
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
            vec: vec_fns(isa),
        }
    })
}

// ------------------------------------------------------------------ matmul

/// Weight rows per kernel call: a tile small enough to stay in L1 while every group of 4
/// activation rows passes over it.
const TILE_ROWS: usize = 16;

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: used only to hand disjoint output rows / read-only buffers to pool threads, all of
// which finish before the owning borrow ends.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

thread_local! {
    static QBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static DBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[t, r] = sum_k w[r, k] * x[t, k]` for `n` activation rows `x` of length `K = w.row_len()`;
/// `out` has `n * w.n_rows()` elements. Each weight block is loaded once per group of up to
/// 4 activation rows. Uses the detected [`Isa`] and this thread's [`exact`] mode.
pub fn matmul(w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    let a = active();
    let kern = a.table[dtype_index(w.dtype)][mode() as usize];
    matmul_kernel(kern, w, x, n, out);
}

/// [`matmul`] with an explicit kernel family and mode (tests, benchmarks).
///
/// Panics if `isa` is not available on this CPU or the shapes do not match.
pub fn matmul_with(isa: Isa, exact: bool, w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    assert!(isa.is_available(), "{isa:?} is not supported by this CPU");
    matmul_kernel(kernel(isa, w.dtype, exact), w, x, n, out);
}

/// [`matmul`] of several matrices with the same input width over the same activations
/// (`outs[i]` gets `x · ws[i]ᵀ`), e.g. the q/k/v or gate/up projections. When they all take
/// the same many-row GEMM, the activations are packed once and all the matrices' tiles share
/// one parallel region; the results are those of separate [`matmul`] calls.
///
/// Panics if the shapes do not match.
pub fn matmul_many(ws: &[&Tensor], x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), outs.len(), "matmul_many: one output per matrix");
    let a = active();
    let ex = mode() as usize;
    let kerns: Vec<Kernel> = ws
        .iter()
        .map(|w| a.table[dtype_index(w.dtype)][ex])
        .collect();
    let k = ws.first().map_or(0, |w| w.row_len());
    let p = kerns.first().map_or(Path::Rows, |kern| path(kern, n, k));
    // One pass serves them all when every matrix is well formed and takes the same path, and,
    // on the matrix-vector path, its kernels take the f32 activations as they are (no
    // per-format preparation).
    let shared = ws.len() > 1
        && n > 0
        && k > 0
        && ws.iter().zip(outs.iter()).all(|(w, o)| {
            w.row_len() == k
                && x.len() == n * k
                && o.len() == n * w.n_rows()
                && w.dtype.bytes_for(k).map(|rb| rb * w.n_rows()) == Some(w.data().len())
                && w.n_rows() > 0
        })
        && kerns.iter().all(|kern| {
            path(kern, n, k) == p
                && (p != Path::Rows || matches!(kern.act, Act::F32 | Act::F32Sums))
        });
    if !shared {
        for ((w, kern), o) in ws.iter().zip(kerns).zip(outs.iter_mut()) {
            matmul_kernel(kern, w, x, n, o);
        }
        return;
    }
    let jobs: Vec<Job> = ws
        .iter()
        .zip(kerns)
        .zip(outs.iter_mut())
        .map(|((w, kern), o)| Job {
            w,
            kern,
            out: SendPtr(o.as_mut_ptr()),
        })
        .collect();
    if p != Path::Rows {
        run_gemm_path(p, &jobs, x, n);
        return;
    }
    // f32 kernels read the first k of each row, whatever the stride: one F32Sums copy serves
    // every job when any of them needs the block sums.
    let mut sbuf = SBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let (xp, xs) = if jobs.iter().any(|j| j.kern.act == Act::F32Sums) {
        with_block_sums(x, n, k, &mut sbuf);
        (SendPtr(sbuf.as_ptr() as *mut u8), 4 * (k + k / 32))
    } else {
        (SendPtr(x.as_ptr() as *mut u8), 4 * k)
    };
    for_each_chunk(&jobs, rows_chunk, &|job, range| {
        let xp = &xp;
        // SAFETY: checked above: whole weight rows, n activation rows of xs bytes (k f32,
        // then block sums where the kernels take them), n·m outputs per job; each chunk's
        // columns belong to its task alone.
        unsafe { rows_task(job, xp.0, xs, n, range) }
    });
    SBUF.with(|b| *b.borrow_mut() = sbuf);
}

fn dtype_index(d: DType) -> usize {
    DType::ALL
        .iter()
        .position(|&x| x == d)
        .expect("DType::ALL lists every format")
}

fn matmul_kernel(kern: Kernel, w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    let k = w.row_len();
    let m = w.n_rows();
    let dtype = w.dtype;
    assert_eq!(x.len(), n * k, "matmul: activation length");
    assert_eq!(out.len(), n * m, "matmul: output length");
    let rb = dtype
        .bytes_for(k)
        .expect("weight rows are whole blocks (checked at load)");
    let data = w.data();
    assert_eq!(data.len(), m * rb, "matmul: weight bytes");
    if n == 0 || m == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let p = path(&kern, n, k);
    if p != Path::Rows {
        let job = Job {
            w,
            kern,
            out: SendPtr(out.as_mut_ptr()),
        };
        run_gemm_path(p, std::slice::from_ref(&job), x, n);
        return;
    }
    let mut qbuf = QBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut dbuf = DBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let mut sbuf = SBUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let (xp, xs): (*const u8, usize) = match kern.act {
        Act::F32 => (x.as_ptr() as *const u8, 4 * k),
        Act::F32Sums => {
            with_block_sums(x, n, k, &mut sbuf);
            (sbuf.as_ptr() as *const u8, 4 * (k + k / 32))
        }
        Act::Quant(ad) | Act::QuantDeq(ad) => {
            let qb = ad
                .bytes_for(k)
                .expect("8-bit blocks match the weight blocks");
            // Q8_1 rows for the integer kernels carry one f32 per block after the blocks:
            // d·Σq, exactly (ggml's f16 `s` field rounds it).
            let sums = matches!(kern.act, Act::Quant(DType::Q8_1));
            let qs = if sums { qb + 4 * (k / 32) } else { qb };
            qbuf.resize(n * qs, 0);
            quantize_rows(ad, x, k, qb, qs, &mut qbuf);
            if let Act::QuantDeq(_) = kern.act {
                dbuf.resize(n * k, 0.0);
                for (q, d) in qbuf.chunks(qs).zip(dbuf.chunks_mut(k)) {
                    quant::dequantize_row(ad, &q[..qb], d).expect("sizes checked above");
                }
                (dbuf.as_ptr() as *const u8, 4 * k)
            } else {
                (qbuf.as_ptr(), qs)
            }
        }
    };
    let job = Job {
        w,
        kern,
        out: SendPtr(out.as_mut_ptr()),
    };
    let xp = SendPtr(xp as *mut u8);
    for_each_chunk(std::slice::from_ref(&job), rows_chunk, &|job, range| {
        let xp = &xp;
        // SAFETY: the weights hold m·rb bytes (checked above), the activations n rows of xs
        // bytes in the kernel's format (built above), out n·m f32; `range` is this task's.
        unsafe { rows_task(job, xp.0, xs, n, range) }
    });
    QBUF.with(|b| *b.borrow_mut() = qbuf);
    DBUF.with(|b| *b.borrow_mut() = dbuf);
    SBUF.with(|b| *b.borrow_mut() = sbuf);
}

/// [`Act::F32Sums`] rows of the `n` activation rows `x` (`k` each) into `buf`.
fn with_block_sums(x: &[f32], n: usize, k: usize, buf: &mut Vec<f32>) {
    let nb = k / 32;
    let rs = k + nb;
    grow(buf, n * rs);
    for (xr, o) in x.chunks_exact(k).zip(buf.chunks_exact_mut(rs)).take(n) {
        o[..k].copy_from_slice(xr);
        for (b, s) in o[k..].iter_mut().enumerate() {
            *s = xr[32 * b..32 * b + 32].iter().sum();
        }
    }
}

/// Rows per task of the matrix-vector path: about 4 tasks per thread, whole tiles.
fn rows_chunk(m: usize) -> usize {
    m.div_ceil(threads() * 4).next_multiple_of(TILE_ROWS)
}

/// The matrix-vector kernels over weight rows `range` of `job`: `TILE_ROWS` rows by up to 4
/// activation rows per call.
///
/// # Safety
/// `job.w` holds whole rows of its format; `xp` holds `n` activation rows of `xs` bytes in
/// the format `job.kern` takes; `job.out` holds `n × m` f32 and no other task writes the
/// columns `range`.
unsafe fn rows_task(job: &Job, xp: *const u8, xs: usize, n: usize, range: std::ops::Range<usize>) {
    let k = job.w.row_len();
    let m = job.w.n_rows();
    let rb = job.w.dtype.bytes_for(k).expect("checked by the caller");
    let wp = if job.kern.packed {
        // Groups of 8 rows at the rows' own offsets: `range` starts at a multiple of
        // TILE_ROWS (`rows_chunk`), so every tile starts a group.
        job.w.packed(packed::rows_by_8).as_ptr()
    } else {
        job.w.data().as_ptr()
    };
    let mut r0 = range.start;
    while r0 < range.end {
        let rows = TILE_ROWS.min(range.end - r0);
        let mut t0 = 0;
        while t0 < n {
            let nx = 4.min(n - t0);
            // SAFETY: rows r0..r0+rows of the weights and activation rows t0..t0+nx are in
            // bounds; out[t·m + r] for these r belongs to this task alone; `kern` was built
            // for this dtype on an available ISA (the function's contract).
            unsafe {
                let a = MatArgs {
                    dtype: job.w.dtype,
                    w: wp.add(r0 * rb),
                    w_stride: rb,
                    rows,
                    x: xp.add(t0 * xs),
                    x_stride: xs,
                    nx,
                    k,
                    out: job.out.0.add(t0 * m + r0),
                    out_stride: m,
                };
                (job.kern.f)(&a);
            }
            t0 += nx;
        }
        r0 += rows;
    }
}

/// Grows a scratch buffer to at least `n` elements. Never shrinks, and never re-initialises
/// what is there: every user overwrites the part it reads (buffers alternate between the
/// sizes of different matrices, and zero-filling on each growth showed up as memset time).
fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// Activation rows from which the exact path switches from the matrix-vector kernels (which
/// dequantize each weight block once per 4 activation rows) to dequantize-once + f32 GEMM
/// (measured crossover ≈ 13 rows on the dev machine: the GEMM pays a whole dequantization
/// pass and computes 16 rows at a time).
const GEMM_MIN_ROWS: usize = 16;

/// The same for fast mode's 8-bit GEMM (crossover ≈ 6 rows: its unpacking pass is cheap).
const IGEMM_MIN_ROWS: usize = 6;

/// The same for fast mode's bf16 GEMM (no unpacking at all; 16 rows per pass).
const BGEMM_MIN_ROWS: usize = 8;

thread_local! {
    static BPACK: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Fast mode's many-row path for BF16 weights ([`bf16`]): activation rows rounded to bf16 and
/// packed once, then every weight row (used in place) multiplied by every block.
#[cfg(target_arch = "x86_64")]
fn bgemm(jobs: &[Job], x: &[f32], n: usize) {
    let k = jobs[0].w.row_len();
    let rb = 2 * k;
    let blocks = n.div_ceil(bf16::TB);
    let bl = bf16::block_len(k);
    let mut xp = BPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    grow(&mut xp, blocks * bl);
    let pp = SendPtr(xp.as_mut_ptr());
    parallel_for(blocks, 1, &|range| {
        let pp = &pp;
        for b in range {
            let rows = bf16::TB.min(n - b * bf16::TB);
            // SAFETY: block b's u32 lie inside xp and only this task writes them; x holds
            // rows·k f32 from row b·TB; the bgemm flag means bf16::available().
            unsafe { bf16::pack_x(x.as_ptr().add(b * bf16::TB * k), rows, k, pp.0.add(b * bl)) };
        }
    });
    let xq = SendPtr(xp.as_mut_ptr());
    for_each_tile(jobs, &|job, range| {
        let xq = &xq;
        let m = job.w.n_rows();
        let a = bf16::Bf16GemmArgs {
            // SAFETY: rows of `range` lie inside the m·rb weight bytes (checked by
            // matmul_kernel).
            w: unsafe { job.w.data().as_ptr().add(range.start * rb) },
            w_stride: rb,
            rows: range.len(),
            x: xq.0,
            n,
            k,
            // SAFETY: columns `range` of every output row (out has n·m elements).
            out: unsafe { job.out.0.add(range.start) },
            out_stride: m,
        };
        // SAFETY: the args describe valid buffers; out[t·m + r] for r in this task's range is
        // written by this task alone; rows ≥ 1, n ≥ BGEMM_MIN_ROWS; bf16::available().
        unsafe { bf16::gemm(&a) };
    });
    BPACK.with(|b| *b.borrow_mut() = xp);
}

/// Weight rows dequantized at a time by one task of the GEMM path.
const GEMM_TILE_ROWS: usize = 48;

/// One weight matrix of a (multi-)matmul on a GEMM path, and where its `n × m` output goes.
struct Job<'a> {
    w: &'a Tensor,
    kern: Kernel,
    out: SendPtr<f32>,
}

/// Hands the `GEMM_TILE_ROWS`-row tiles of every job out over the pool in one parallel region
/// (several small matrices then share one synchronisation and balance each other).
fn for_each_tile(jobs: &[Job], task: &(dyn Fn(&Job, std::ops::Range<usize>) + Sync)) {
    for_each_chunk(jobs, |_| GEMM_TILE_ROWS, task)
}

/// Splits every job's rows into chunks of `chunk(m)` rows and runs `task(job, rows)` on each,
/// all jobs in one parallel region.
fn for_each_chunk(
    jobs: &[Job],
    chunk: impl Fn(usize) -> usize,
    task: &(dyn Fn(&Job, std::ops::Range<usize>) + Sync),
) {
    let mut starts = Vec::with_capacity(jobs.len());
    let mut sizes = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for j in jobs {
        let m = j.w.n_rows();
        let c = chunk(m).max(1);
        starts.push(total);
        sizes.push(c);
        total += m.div_ceil(c);
    }
    parallel_for(total, 1, &|chunks| {
        for t in chunks {
            let j = starts.partition_point(|&s| s <= t) - 1;
            let m = jobs[j].w.n_rows();
            let r0 = (t - starts[j]) * sizes[j];
            task(&jobs[j], r0..(r0 + sizes[j]).min(m));
        }
    });
}

/// Which way [`matmul`] multiplies: a many-row GEMM (one activation packing for all the
/// matrices that share it) or the matrix-vector kernels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// Fast mode, BF16 weights.
    Bgemm,
    /// The f32 GEMM with activation blocks of this many rows.
    Gemm(usize),
    /// Fast mode's 8-bit GEMM.
    Igemm,
    Rows,
}

fn path(kern: &Kernel, n: usize, k: usize) -> Path {
    #[cfg(target_arch = "x86_64")]
    if kern.bgemm && n >= BGEMM_MIN_ROWS {
        return Path::Bgemm;
    }
    if let Some(g) = kern.gemm.filter(|_| n >= GEMM_MIN_ROWS || prompt_rows()) {
        return Path::Gemm(g.tb);
    }
    #[cfg(target_arch = "x86_64")]
    if kern.igemm && n >= IGEMM_MIN_ROWS && k.is_multiple_of(32) {
        return Path::Igemm;
    }
    let _ = k;
    Path::Rows
}

/// Runs jobs that all take `p` (not [`Path::Rows`]).
fn run_gemm_path(p: Path, jobs: &[Job], x: &[f32], n: usize) {
    match p {
        #[cfg(target_arch = "x86_64")]
        Path::Bgemm => bgemm(jobs, x, n),
        Path::Gemm(_) => gemm(jobs, x, n),
        #[cfg(target_arch = "x86_64")]
        Path::Igemm => igemm(jobs, x, n),
        _ => unreachable!("not a GEMM path: {p:?}"),
    }
}

thread_local! {
    static RBUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Builds the packed copy of every job's weights that this thread's decode kernels will read
/// anyway, before a GEMM reads the stored rows: from then on only that copy is read (the
/// file's pages of the original are handed back), so a model holds its weights once.
fn pack_for_decode(jobs: &[Job]) {
    for j in jobs {
        if packed::packs(j.w.dtype) && j.w.packed_if_built().is_none() && packs_here(j.w.dtype) {
            j.w.packed(packed::rows_by_8);
        }
    }
}

/// Calls `f` with a pointer to weight rows `range` of `w` in the stored layout: the tensor's
/// own bytes or, once it has a packed copy, those rows rebuilt from it (`range` starts at a
/// multiple of 8: the GEMM tiles do).
fn with_stored_rows<R>(
    w: &Tensor,
    range: std::ops::Range<usize>,
    f: impl FnOnce(*const u8) -> R,
) -> R {
    let rb = w.row_bytes();
    match w.packed_if_built() {
        Some(p) if packed::packs(w.dtype) => RBUF.with(|b| {
            let mut b = b.borrow_mut();
            grow(&mut b, range.len() * rb);
            packed::stored_rows(w, p, range.start, range.len(), &mut b);
            f(b.as_ptr())
        }),
        // SAFETY: the rows of `range` lie inside the tensor's n_rows·rb bytes (the callers'
        // ranges are within its rows).
        _ => f(unsafe { w.data().as_ptr().add(range.start * rb) }),
    }
}

thread_local! {
    static GBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static XPACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The many-row exact path of [`matmul`]: the activation rows are packed once into blocks of
/// `g.tb` rows ([`GemmArgs`]); each task dequantizes `GEMM_TILE_ROWS` weight rows into f32
/// once and multiplies them by every block.
fn gemm(jobs: &[Job], x: &[f32], n: usize) {
    pack_for_decode(jobs);
    let g = jobs[0].kern.gemm.expect("the GEMM path");
    let k = jobs[0].w.row_len();
    let narrow = n <= NARROW_ROWS;
    let tb = g.tb;
    // The narrow kernel reads the activation rows as they are.
    let blocks = if narrow { 0 } else { n.div_ceil(tb) };
    let mut xpack = XPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    grow(&mut xpack, blocks * tb * k);
    let pp = SendPtr(xpack.as_mut_ptr());
    parallel_for(blocks, 1, &|range| {
        let pp = &pp;
        for b in range {
            // SAFETY: block b's tb·k f32 lie inside xpack and only this task writes them.
            let dst = unsafe { std::slice::from_raw_parts_mut(pp.0.add(b * tb * k), tb * k) };
            let rows = tb.min(n - b * tb);
            if let Some(p) = g.pack {
                // SAFETY: x holds rows·k f32 from row b·tb; dst holds tb·k f32; the packer
                // was picked for an available ISA with this tb.
                unsafe { p(x.as_ptr().add(b * tb * k), k, rows, dst.as_mut_ptr()) };
                continue;
            }
            if rows < tb {
                dst.fill(0.0);
            }
            // 16 columns at a time: contiguous reads of each row, writes within a
            // 16·tb-float tile.
            for i0 in (0..k).step_by(16) {
                let w = 16.min(k - i0);
                let tile = &mut dst[i0 * tb..(i0 + w) * tb];
                for j in 0..rows {
                    let src = &x[(b * tb + j) * k + i0..][..w];
                    for (d, &v) in tile.iter_mut().skip(j).step_by(tb).zip(src) {
                        *d = v;
                    }
                }
            }
        }
    });
    let xp = SendPtr(if narrow {
        x.as_ptr() as *mut f32
    } else {
        xpack.as_mut_ptr()
    });
    for_each_tile(jobs, &|job, range| {
        let xp = &xp;
        let g = job.kern.gemm.expect("the GEMM path");
        let m = job.w.n_rows();
        let rb = job.w.dtype.bytes_for(k).expect("checked by matmul_kernel");
        let rows = range.len();
        with_stored_rows(job.w, range.clone(), |wp| {
            GBUF.with(|buf| {
                let mut buf = buf.borrow_mut();
                let (wf, ws) = match g.deq {
                    Some(deq) => {
                        // Rows 16 f32 longer than k: rows a multiple of 4 KiB apart would all
                        // fall in the same L1 sets while the kernel reads them side by side.
                        let ws = k + 16;
                        grow(&mut buf, rows * ws);
                        for r in 0..rows {
                            // SAFETY: `wp` holds the tile's rows·rb stored bytes
                            // (`with_stored_rows`); buf holds rows·k f32; `deq` was picked for
                            // this dtype on an available ISA and k is whole blocks.
                            unsafe { deq(wp.add(r * rb), buf.as_mut_ptr().add(r * ws), k) };
                        }
                        (buf.as_ptr(), ws)
                    }
                    // F32 rows are used in place: rb = 4k bytes each, the tile's rows at `wp`.
                    None => (wp as *const f32, k),
                };
                let a = GemmArgs {
                    w: wf,
                    w_stride: ws,
                    rows,
                    x: xp.0,
                    n,
                    k,
                    // SAFETY: columns range of every output row t (out has n·m elements).
                    out: unsafe { job.out.0.add(range.start) },
                    out_stride: m,
                };
                // SAFETY: the GemmFn contract: weights (buf or F32 rows) hold rows·k f32 at
                // stride ws, x holds ceil(n/tb) packed blocks of tb·k f32 (the narrow kernel: n
                // plain rows of k, n ≤ 8), out[t·m + r] for r in this task's range is written
                // by this task alone; rows ≥ 1 and n ≥ 1.
                unsafe {
                    if narrow {
                        (g.narrow)(&a)
                    } else {
                        (g.tile)(&a)
                    }
                };
            })
        });
    });
    XPACK.with(|b| *b.borrow_mut() = xpack);
}

thread_local! {
    static IBUF: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    static XIPACK: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Fast mode's many-row path ([`int8`]): activation rows quantized to 8 bits and packed once,
/// then each task unpacks `GEMM_TILE_ROWS` weight rows to 8-bit codes and multiplies them by
/// every packed block with `vpdpbusd`. Only on an AVX-512 VNNI CPU (the caller checks).
#[cfg(target_arch = "x86_64")]
fn igemm(jobs: &[Job], x: &[f32], n: usize) {
    pack_for_decode(jobs);
    let k = jobs[0].w.row_len();
    let blocks = n.div_ceil(int8::TB);
    let (xb, fb) = int8::block_sizes(k);
    let (mut xq, mut xf) = XIPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
    grow(&mut xq, blocks * xb);
    grow(&mut xf, 2 * blocks * fb);
    let (xqp, xfp) = (SendPtr(xq.as_mut_ptr()), SendPtr(xf.as_mut_ptr()));
    parallel_for(blocks, 1, &|range| {
        let (xqp, xfp) = (&xqp, &xfp);
        for b in range {
            let rows = int8::TB.min(n - b * int8::TB);
            // SAFETY: block b's bytes and f32 (dx in the first half of xf, sx in the second)
            // lie inside the buffers sized above and only this task writes them; x holds
            // rows·k f32 from row b·TB; k is a multiple of 32; AVX-512 VNNI (igemm flag).
            unsafe {
                int8::pack_x(
                    x.as_ptr().add(b * int8::TB * k),
                    rows,
                    k,
                    xqp.0.add(b * xb),
                    xfp.0.add(b * fb),
                    xfp.0.add((blocks + b) * fb),
                )
            };
        }
    });
    let (xqp, xfp) = (SendPtr(xq.as_mut_ptr()), SendPtr(xf.as_mut_ptr()));
    for_each_tile(jobs, &|job, range| {
        let (xqp, xfp) = (&xqp, &xfp);
        let m = job.w.n_rows();
        let dtype = job.w.dtype;
        let rb = dtype.bytes_for(k).expect("checked by matmul_kernel");
        let rows = range.len();
        // Code rows 64 bytes longer than k (see `gemm`'s f32 rows).
        let cs = k + 64;
        let gs = k / 16;
        with_stored_rows(job.w, range.clone(), |wp| {
            IBUF.with(|buf| {
                let mut buf = buf.borrow_mut();
                let (codes, f) = &mut *buf;
                grow(codes, rows * cs);
                grow(f, 2 * rows * gs);
                let (dw, cw) = f[..2 * rows * gs].split_at_mut(rows * gs);
                for r in 0..rows {
                    // SAFETY: `wp` holds the tile's rows·rb stored bytes (`with_stored_rows`);
                    // the outputs are row r of buffers sized above; `dtype` is supported (igemm
                    // flag).
                    unsafe {
                        int8::unpack(
                            dtype,
                            wp.add(r * rb),
                            k,
                            codes.as_mut_ptr().add(r * cs),
                            dw.as_mut_ptr().add(r * gs),
                            cw.as_mut_ptr().add(r * gs),
                        )
                    };
                }
                let a = int8::IGemmArgs {
                    codes: codes.as_ptr(),
                    c_stride: cs,
                    dw: dw.as_ptr(),
                    cw: cw.as_ptr(),
                    g_stride: gs,
                    rows,
                    xq: xqp.0,
                    dx: xfp.0,
                    sx: xfp.0.wrapping_add(blocks * fb),
                    n,
                    k,
                    // SAFETY: columns `range` of every output row (out has n·m elements).
                    out: unsafe { job.out.0.add(range.start) },
                    out_stride: m,
                };
                // SAFETY: the buffers hold what IGemmArgs describes; out[t·m + r] for r in this
                // task's range is written by this task alone; rows ≥ 1, n ≥ IGEMM_MIN_ROWS.
                unsafe { int8::gemm(&a) };
            })
        });
    });
    XIPACK.with(|b| *b.borrow_mut() = (xq, xf));
}

/// The 8-bit format fast mode multiplies `dtype` weights with for `n` activation rows on
/// `isa`, if any (tests use it to build the effective activations).
#[cfg(test)]
fn fast_act_for(isa: Isa, dtype: DType, n: usize, k: usize) -> Option<DType> {
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::BF16 && isa == Isa::Avx512 && bf16::available() && n >= BGEMM_MIN_ROWS {
        return Some(DType::BF16);
    }
    let ad = act_format(dtype)?;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && int8::supports(dtype) && n >= IGEMM_MIN_ROWS && k.is_multiple_of(32) {
        return Some(DType::Q8_0);
    }
    if isa == Isa::Avx2 && n >= GEMM_MIN_ROWS {
        return None;
    }
    let _ = (isa, n, k);
    Some(ad)
}

/// Quantize `n` rows of `k` values to `ad` blocks (ggml's reference quantizers) into rows of
/// `qs` bytes (`qb` of blocks, then for Q8_1 the f32 block sums), in parallel for many rows.
fn quantize_rows(ad: DType, x: &[f32], k: usize, qb: usize, qs: usize, q: &mut [u8]) {
    let one = |xr: &[f32], qr: &mut [u8]| {
        let (blocks, sums) = qr.split_at_mut(qb);
        quant::quantize_row(ad, xr, blocks).expect("sizes checked by the caller");
        if !sums.is_empty() {
            for (b, s) in blocks.chunks(36).zip(sums.chunks_mut(4)) {
                let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                let sq: i32 = b[4..].iter().map(|&v| i32::from(v as i8)).sum();
                s.copy_from_slice(&(d * sq as f32).to_ne_bytes());
            }
        }
    };
    let n = x.len() / k;
    if n < 8 {
        for (xr, qr) in x.chunks(k).zip(q.chunks_mut(qs)) {
            one(xr, qr);
        }
        return;
    }
    let qp = SendPtr(q.as_mut_ptr());
    parallel_for(n, 4, &|range| {
        let qp = &qp;
        for t in range {
            // SAFETY: row t's bytes lie inside `q` and no other task touches them.
            let qr = unsafe { std::slice::from_raw_parts_mut(qp.0.add(t * qs), qs) };
            one(&x[t * k..(t + 1) * k], qr);
        }
    });
}

/// RMSNorm over each row of `x` (length `w.len()`), in place: x * rsqrt(mean(x²) + eps) * w.
pub fn rmsnorm(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_mut(d) {
        let ss: f32 = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// `a = silu(a) * b`, elementwise.
pub fn silu_mul(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "silu_mul: lengths");
    let exp = active().vec.exp;
    let one = |a: &mut [f32], b: &[f32]| {
        let mut t = [0.0f32; 256];
        for (ac, bc) in a.chunks_mut(256).zip(b.chunks(256)) {
            let t = &mut t[..ac.len()];
            for (tv, &x) in t.iter_mut().zip(ac.iter()) {
                *tv = -x;
            }
            // SAFETY: t holds t.len() f32; the table's functions run on this CPU.
            unsafe { exp(t.as_mut_ptr(), t.len()) };
            for ((x, &e), &y) in ac.iter_mut().zip(t.iter()).zip(bc) {
                *x = *x / (1.0 + e) * y;
            }
        }
    };
    // Prefill-sized inputs (an exp per element) are split over the pool.
    const CHUNK: usize = 16 * 1024;
    if a.len() < 2 * CHUNK {
        return one(a, b);
    }
    let ap = SendPtr(a.as_mut_ptr());
    let len = a.len();
    parallel_for(len.div_ceil(CHUNK), 1, &|range| {
        let ap = &ap;
        for c in range {
            let s = c * CHUNK;
            let e = (s + CHUNK).min(len);
            // SAFETY: chunk c of `a` is written by this task alone; the borrow outlives the op.
            let ac = unsafe { std::slice::from_raw_parts_mut(ap.0.add(s), e - s) };
            one(ac, &b[s..e]);
        }
    });
}

/// Softmax in place (the exponentials by the detected family's SIMD `exp`; the max and the
/// sum over 16 interleaved lanes, which the compiler vectorises — a sequential f32 sum is
/// latency-bound and dominated long attention rows).
pub fn softmax(x: &mut [f32]) {
    let (chunks, tail) = x.as_chunks::<16>();
    let mut m = [f32::NEG_INFINITY; 16];
    for c in chunks {
        for j in 0..16 {
            m[j] = m[j].max(c[j]);
        }
    }
    let max = m
        .iter()
        .chain(tail)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    x.iter_mut().for_each(|v| *v -= max);
    // SAFETY: x holds x.len() f32; the table's functions run on this CPU.
    unsafe { (active().vec.exp)(x.as_mut_ptr(), x.len()) };
    let (chunks, tail) = x.as_chunks::<16>();
    let mut acc = [0f32; 16];
    for c in chunks {
        for j in 0..16 {
            acc[j] += c[j];
        }
    }
    let sum: f32 = acc.iter().chain(tail).sum();
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += *y;
    }
}

/// Rotary embedding tables for one rotated width `rot_dim` (even) and base `theta`,
/// in the "rotate half" (GPT-NeoX) convention transformers uses.
#[derive(Clone, Debug)]
pub struct Rope {
    pub rot_dim: usize,
    inv_freq: Vec<f32>,
}

impl Rope {
    /// `inv_freq[i] = theta^(-2i / dim_base)` for `i < rot_dim / 2`; `dim_base` is usually `rot_dim`.
    pub fn new(rot_dim: usize, dim_base: usize, theta: f64) -> Rope {
        let inv_freq = (0..rot_dim / 2)
            .map(|i| {
                let e = (2 * i) as f32 / dim_base as f32;
                (1.0 / theta.powf(e as f64)) as f32
            })
            .collect();
        Rope { rot_dim, inv_freq }
    }

    /// transformers' "proportional" RoPE: pairs (i, i + head_dim/2) over the whole head, the
    /// first `angles` frequencies `theta^(-2i/head_dim)`, the rest zero (left unrotated).
    pub fn proportional(head_dim: usize, angles: usize, theta: f64) -> Rope {
        let mut r = Rope::new(2 * angles, head_dim, theta);
        r.inv_freq.resize(head_dim / 2, 0.0);
        r.rot_dim = head_dim;
        r
    }

    /// Rotate the first `rot_dim` dims of each `head_dim`-wide head of `q` and `k` at `pos`.
    pub fn apply(&self, q: &mut [f32], k: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.rot_dim / 2;
        // One cos/sin table per position, shared by the query and key heads.
        let mut cs = [(0f32, 0f32); 256];
        for (i, f) in self.inv_freq.iter().enumerate() {
            let a = pos as f32 * f;
            cs[i] = (a.cos(), a.sin());
        }
        for head in q.chunks_mut(head_dim).chain(k.chunks_mut(head_dim)) {
            for i in 0..half {
                let (c, s) = cs[i];
                let x1 = head[i];
                let x2 = head[i + half];
                head[i] = x1 * c - x2 * s;
                head[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

#[cfg(test)]
mod tests;
