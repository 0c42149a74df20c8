//! The numeric mode and the compute context: what a thread's matmuls use.

use super::*;

/// The numeric mode of quantized matrix products (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// 8-bit (bf16) activations everywhere, as llama.cpp.
    Fast = 0,
    /// f32 activations everywhere: logits equal transformers' on the dequantized weights.
    Exact = 1,
    /// The default: one numeric policy for every row of every pass, so that a request's
    /// output does not depend on batching, chunking, caching or speculation. On the SIMD
    /// families (x86 AVX2 and above, aarch64 NEON and above) the products of quantized
    /// weights that have 8-bit kernels there (`auto_8bit`) take the
    /// 8-bit matrix-vector kernels for every row count, prompt rows included (their result
    /// for a row does not depend on the other rows), the other formats the exact
    /// matrix-vector kernels, attention its per-row form, and `Model::forward` recomputes
    /// each logit row's top output logits exactly, so the token picked is the exact head's.
    /// On the scalar kernels `Exact` throughout. [`Mode::resolved`] says what it means on
    /// this CPU.
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

    /// The mode's name with the detected kernel family: `auto` is `exact` on the scalar
    /// kernels (which have no 8-bit ones).
    pub fn resolved(self) -> &'static str {
        match (self, isa()) {
            (Mode::Auto, i) if i.has_8bit() => "auto",
            (Mode::Auto, _) => "exact",
            (m, _) => m.name(),
        }
    }

    /// Whether this mode's products are exact on every path on this CPU (f32 activations):
    /// `Auto` is on the scalar kernels, which have no 8-bit ones.
    pub fn is_exact_here(self) -> bool {
        match self {
            Mode::Exact => true,
            Mode::Fast => false,
            Mode::Auto => !isa().has_8bit(),
        }
    }
}

/// 0: not yet read from `LONE_EXACT`; else 1 + the [`Mode`].
pub(super) static MODE: AtomicU8 = AtomicU8::new(0);

/// What the current thread's matmuls use, set by a [`Scope`] (a model's [`Compute`] for
/// the length of its forward pass, or a test's [`exact_scope`]).
#[derive(Clone, Copy, Default)]
pub(super) struct Here {
    /// None: the process-wide mode.
    pub(super) mode: Option<Mode>,
    /// The model's own mode while `mode` is a prompt pass's exact one (what its decode rows
    /// take: whether the packed layouts are in use).
    pub(super) base: Option<Mode>,
    /// Exact mode's prompt rows: every row count takes the f32 GEMM where the format has
    /// one (see [`Compute::enter`]).
    pub(super) prompt: bool,
    /// A model's pass outside fast mode but for exact mode's prompt rows: the
    /// matrix-vector kernels for every row count (never a many-row GEMM), so a row's
    /// result does not depend on the batch.
    pub(super) decode: bool,
    /// Most threads a parallel region of this thread uses; None: the pool's.
    pub(super) threads: Option<usize>,
}

thread_local! {
    pub(super) static HERE: Cell<Here> = const {
        Cell::new(Here {
            mode: None,
            base: None,
            prompt: false,
            decode: false,
            threads: None,
        })
    };
}

pub(super) fn mode_from(v: u8) -> Mode {
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

/// Whether this thread's matmuls are exact mode's prompt rows ([`Compute::enter`]):
/// attention then takes its GEMM form for every run of rows too.
pub fn prompt_rows() -> bool {
    HERE.with(|c| c.get()).prompt
}

/// Whether this thread's matmuls are a model's rows that must multiply as one row alone
/// ([`Compute::enter`]: every row of the default mode, exact mode's decode rows): every row
/// count takes the matrix-vector kernels, and attention its per-row form, so a row's
/// result is the same alone or in any batch.
pub fn decode_rows() -> bool {
    HERE.with(|c| c.get()).decode
}

/// Whether matmuls issued from this thread are exact on every path (f32 activations).
pub fn exact() -> bool {
    mode().is_exact_here()
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

    /// The pass this context runs rows in — the one place the numeric policy is decided.
    /// `prompt`: the rows are prompt tokens. The default mode multiplies every row as a
    /// decode row (the matrix-vector kernels, 8-bit where the format has them), so a
    /// request's rows give the same results whether they come as a prompt, whole or in
    /// chunks, from a cache, or as a previous reply's decoded tokens. Exact mode's prompt rows
    /// take the f32 GEMM for every row count (each output one FMA chain over `k`: the same
    /// for a row whatever the other rows), its decode rows the matrix-vector kernels; fast
    /// mode picks by row count.
    pub fn pass(&self, prompt: bool) -> Pass {
        let mode = self.mode();
        let kind = match mode {
            Mode::Exact if prompt => PassKind::ExactPrompt,
            Mode::Fast => PassKind::ByRowCount,
            _ => PassKind::RowsAlone,
        };
        Pass {
            kind,
            mode,
            threads: self.threads.or_else(threads_here),
        }
    }

    /// [`Compute::pass`] put in force on the current thread until the guard drops.
    pub fn enter(&self, prompt: bool) -> Scope {
        self.pass(prompt).enter()
    }
}

/// How a pass's rows are multiplied ([`Compute::pass`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassKind {
    /// Every row as it would be alone: the matrix-vector kernels for every row count,
    /// attention row by row (the default mode; exact mode's decode rows).
    RowsAlone,
    /// Exact mode's prompt rows: the f32 GEMM (and attention's matrix products) for every
    /// row count.
    ExactPrompt,
    /// Fast mode: each path by its number of rows.
    ByRowCount,
}

/// One forward pass's numeric policy, decided once by [`Compute::pass`] and handed down
/// `Model::forward` → layers → attention; [`Pass::enter`] puts it in force for the kernels
/// the pass calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pass {
    pub kind: PassKind,
    pub mode: Mode,
    /// Threads of each parallel region (the caller included); None: the pool's.
    pub threads: Option<usize>,
}

impl Pass {
    /// Whether each row must come out as it would alone (no many-row GEMM, attention row
    /// by row).
    pub fn rows_alone(&self) -> bool {
        self.kind == PassKind::RowsAlone
    }

    /// Whether rows take the exact many-row products whatever their number.
    pub fn exact_prompt(&self) -> bool {
        self.kind == PassKind::ExactPrompt
    }

    /// Whether this pass's products are exact on every path (f32 activations).
    pub fn exact(&self) -> bool {
        self.mode.is_exact_here()
    }

    /// The same pass for rows that must be exact and alone: the head's logit rows of an exact
    /// prompt pass (the matrix-vector head, not a GEMM that would dequantize all of it).
    pub fn exact_rows(&self) -> Pass {
        Pass {
            kind: PassKind::RowsAlone,
            mode: Mode::Exact,
            threads: self.threads,
        }
    }

    /// Put this pass in force on the current thread until the guard drops: the kernels read
    /// it at their entry.
    pub fn enter(&self) -> Scope {
        Scope(HERE.with(|c| {
            c.replace(Here {
                mode: Some(self.mode),
                base: Some(self.mode),
                prompt: self.kind == PassKind::ExactPrompt,
                decode: self.kind == PassKind::RowsAlone && self.mode != Mode::Fast,
                threads: self.threads,
            })
        }))
    }
}

/// Override the mode for matmuls issued from the current thread until the guard drops:
/// `true` = [`Mode::Exact`], `false` = [`Mode::Fast`] (every path by row count, as outside a
/// model's pass: tests and benchmarks).
pub fn exact_scope(on: bool) -> Scope {
    Pass {
        kind: PassKind::ByRowCount,
        mode: if on { Mode::Exact } else { Mode::Fast },
        threads: threads_here(),
    }
    .enter()
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
pub(super) fn packs_here(dtype: DType) -> bool {
    let here = HERE.with(|c| c.get());
    let m = here.base.or(here.mode).unwrap_or_else(global_mode);
    active().table[dtype_index(dtype)][m as usize].packed
}

/// Whether fast mode's matrix-vector kernel for `dtype` reads the rows-by-8 packed layout.
pub(super) fn fast_rows_packed(dtype: DType) -> bool {
    active().table[dtype_index(dtype)][Mode::Fast as usize].packed
}

/// `w` (float rows of a length that is a multiple of 32) rounded to Q8_0 by ggml's quantizer,
/// laid out as fast mode's matrix-vector kernel for Q8_0 reads it on this CPU: rows by 8 on
/// x86's VNNI levels and aarch64's dotprod level, kept only in that layout
/// ([`Tensor::prepacked`]), as stored on AVX2 and ARMv8.0 NEON. An
/// 8-bit copy of a weight that only those kernels multiply (`Model`'s decode head), made
/// 256 rows per task so that no stored copy of the whole is ever held.
///
/// Panics if `w`'s rows are not whole Q8_0 blocks.
pub(crate) fn q8_0_copy_for_fast_rows(w: &Tensor) -> Tensor {
    const CHUNK: usize = 256;
    let (rows, k) = (w.n_rows(), w.row_len());
    let rb = DType::Q8_0
        .bytes_for(k)
        .expect("q8_0_copy_for_fast_rows: rows of whole Q8_0 blocks");
    let pack = fast_rows_packed(DType::Q8_0);
    // The bit-exact row dequantizer of the f32 GEMM (F16/BF16: a SIMD conversion).
    let deq = active().table[dtype_index(w.dtype)][Mode::Exact as usize]
        .gemm
        .and_then(|g| g.deq);
    let mut out = vec![0u8; rows * rb];
    let op = SendPtr(out.as_mut_ptr());
    parallel_for(rows.div_ceil(CHUNK), 1, &|range| {
        let op = &op;
        let mut f = vec![0f32; CHUNK * k];
        let mut q = vec![0u8; CHUNK * rb];
        for c in range {
            let (r0, n) = (c * CHUNK, CHUNK.min(rows - c * CHUNK));
            for (j, fr) in f.chunks_exact_mut(k).take(n).enumerate() {
                match deq {
                    // SAFETY: row r0 + j of `w` holds k values of its format (whole blocks:
                    // the table's dequantizer for it), `fr` k f32; the kernel table holds
                    // only functions of the running CPU's family.
                    Some(d) => unsafe { d(w.row(r0 + j).as_ptr(), fr.as_mut_ptr(), k) },
                    None => w.row_to_f32(r0 + j, fr),
                }
            }
            // SAFETY: rows r0..r0 + n of `out` (n·rb bytes from r0·rb, inside its rows·rb)
            // belong to this task alone.
            let dst = unsafe { std::slice::from_raw_parts_mut(op.0.add(r0 * rb), n * rb) };
            if pack {
                // Chunks start at multiples of 8 rows: the groups are the whole tensor's.
                quantize_rows(DType::Q8_0, &f[..n * k], k, rb, rb, &mut q[..n * rb]);
                packed::rows_by_8_into(DType::Q8_0, k, &q[..n * rb], dst);
            } else {
                quantize_rows(DType::Q8_0, &f[..n * k], k, rb, rb, dst);
            }
        }
    });
    let t = Tensor::from_bytes(DType::Q8_0, vec![rows, k], out);
    if pack {
        t.prepacked()
    } else {
        t
    }
}

/// Most threads this thread's parallel regions use.
pub(super) fn threads_here() -> Option<usize> {
    HERE.with(|c| c.get()).threads
}
