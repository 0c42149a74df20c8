//! Attention primitives over cached keys and values, and the vector functions behind them.

use super::*;

/// Vector primitives (softmax, SiLU, attention): SIMD for the detected family. Safety
/// contract: the pointers are valid for what each function reads and writes (`exp`: `n` f32;
/// `mix`: the extents [`mix_rows`] checks) and the CPU supports the family.
#[derive(Clone, Copy)]
pub(super) struct VecFns {
    /// `x[i] = e^x[i]`, within a few ulp of `f32::exp`.
    pub(super) exp: unsafe fn(*mut f32, usize),
    /// See [`mix_rows`]: f32 values.
    pub(super) mix: MixFn,
    /// f16 values.
    pub(super) mix_f16: MixFn,
    /// Q8_0 values (whole blocks).
    pub(super) mix_q8: MixFn,
    /// The 8-bit activation quantizers, where the ISA has them ([`quantize_q8_by`]; false:
    /// take the reference).
    pub(super) quant8: Option<Quant8Fn>,
}

/// `(format, values, blocks, Q8_1 sums) -> written`: see [`quantize_q8_by`].
pub(super) type Quant8Fn = unsafe fn(DType, &[f32], &mut [u8], &mut [u8]) -> bool;

/// A family's 8-bit activation blocks, bit for bit ggml's reference quantizers
/// (`quant::quantize_row`), which the tests check.
pub(in crate::kernels) trait Q8Blocks {
    /// One Q8_0/Q8_1 block of 32 values at `x` (d = max|x| / 127, codes rounded half away
    /// from zero): the codes to `q`, returns (d, Σq); None for a block with a NaN or an
    /// infinity (nothing written).
    unsafe fn block32(x: *const f32, q: *mut u8) -> Option<(f32, i32)>;
    /// One Q8_K block of 256 values to `b` (292 bytes: d = max / -127 for the first value of
    /// largest magnitude, codes rounded to nearest even, at most 127, sums of each 16);
    /// false for a block with a NaN or an infinity.
    unsafe fn block256(x: *const f32, b: *mut u8) -> bool;
    /// `x` rounded to the nearest f16 (ties to even), as bits.
    #[inline(always)]
    unsafe fn to_f16(x: f32) -> u16 {
        half::f16::from_f32(x).to_bits()
    }
    /// The f16 `h` as f32.
    #[inline(always)]
    unsafe fn from_f16(h: u16) -> f32 {
        half::f16::from_bits(h).to_f32()
    }
}

/// `blocks` ← `x` quantized to `ad` (Q8_0, Q8_1 or Q8_K), as `quant::quantize_row` writes it;
/// for Q8_1, `sums` (empty, or two f32 per block, [`Q8_1_SIDE`] bytes) ← d·Σq and d, with d as
/// stored (f16). Blocks with a
/// non-finite value are left for the caller: returns false when any block was not written
/// (or `ad` is another format, or the sizes do not match).
/// One body for every family, over its [`Q8Blocks`].
///
/// # Safety
/// The CPU runs `B`'s instructions.
#[inline(always)]
pub(in crate::kernels) unsafe fn quantize_q8_by<B: Q8Blocks>(
    ad: DType,
    x: &[f32],
    blocks: &mut [u8],
    sums: &mut [u8],
) -> bool {
    let (bs, bb) = match ad {
        DType::Q8_0 => (32, 34),
        DType::Q8_1 => (32, 36),
        DType::Q8K => (256, 292),
        _ => return false,
    };
    let nb = x.len() / bs;
    if !x.len().is_multiple_of(bs)
        || blocks.len() != nb * bb
        || !(sums.is_empty() || (ad == DType::Q8_1 && sums.len() == Q8_1_SIDE * nb))
    {
        return false;
    }
    let mut all = true;
    for i in 0..nb {
        // SAFETY: block i's bs values and bb bytes are in bounds (sizes checked above).
        let (xp, bp) = (x.as_ptr().add(i * bs), blocks.as_mut_ptr().add(i * bb));
        match ad {
            DType::Q8K => all &= B::block256(xp, bp),
            _ => {
                let q = bp.add(if ad == DType::Q8_1 { 4 } else { 2 });
                let Some((d, sq)) = B::block32(xp, q) else {
                    all = false;
                    continue;
                };
                let d16 = B::to_f16(d);
                (bp as *mut u16).write_unaligned(d16.to_le());
                if ad == DType::Q8_1 {
                    let s16 = B::to_f16(sq as f32 * d);
                    (bp.add(2) as *mut u16).write_unaligned(s16.to_le());
                    if !sums.is_empty() {
                        // [`side_q8_1`]: d·Σq and d, with d as stored.
                        let d = B::from_f16(d16);
                        let side = sums.as_mut_ptr().add(Q8_1_SIDE * i) as *mut f32;
                        side.write_unaligned(d * sq as f32);
                        side.add(1).write_unaligned(d);
                    }
                }
            }
        }
    }
    all
}

/// `e^r` on |r| ≤ ln2/2: Horner coefficients of its degree-7 Taylor polynomial (truncation
/// error < 1e-8 relative), highest degree first; every family's SIMD `exp` uses them.
pub(super) const EXP_POLY: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `mix_rows` over raw value rows (`stride` elements apart) of the function's element type.
pub(super) type MixFn =
    unsafe fn(*const f32, usize, usize, *const u8, usize, usize, usize, *mut f32);

pub(super) fn vec_fns(isa: Isa) -> VecFns {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => VecFns {
            exp: x86::exp_avx512,
            mix: x86::avx512::mix,
            mix_f16: x86::avx512::mix_f16,
            mix_q8: x86::avx512::mix_q8,
            quant8: Some(x86::quantize_q8_avx2),
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => VecFns {
            exp: x86::exp_avx2,
            mix: x86::avx2::mix,
            mix_f16: x86::avx2::mix_f16,
            mix_q8: x86::avx2::mix_q8,
            quant8: Some(x86::quantize_q8_avx2),
        },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonDot | Isa::NeonI8mm => VecFns {
            exp: neon::vec::exp,
            mix: neon::vec::mix,
            mix_f16: neon::vec::mix_f16,
            mix_q8: neon::vec::mix_q8,
            quant8: Some(neon::vec::quantize_q8),
        },
        _ => VecFns {
            exp: exp_scalar,
            mix: mix_scalar::<false>,
            mix_f16: mix_scalar::<true>,
            mix_q8: mix_scalar_q8,
            quant8: None,
        },
    }
}

/// A weighted sum of value rows for `G` weight rows at once (each family's kernels).
pub(in crate::kernels) trait MixG {
    unsafe fn mix<const G: usize>(
        p: *const f32,
        p_stride: usize,
        vals: *const u8,
        stride: usize,
        nk: usize,
        d: usize,
        out: *mut f32,
    );
}

/// [`MixG`] for any number of weight rows, 4 at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn mix_by_4<M: MixG>(
    p: *const f32,
    p_stride: usize,
    nq: usize,
    vals: *const u8,
    stride: usize,
    nk: usize,
    d: usize,
    out: *mut f32,
) {
    let mut g0 = 0;
    while g0 < nq {
        let (pp, oo) = (p.add(g0 * p_stride), out.add(g0 * d));
        match nq - g0 {
            1 => M::mix::<1>(pp, p_stride, vals, stride, nk, d, oo),
            2 => M::mix::<2>(pp, p_stride, vals, stride, nk, d, oo),
            3 => M::mix::<3>(pp, p_stride, vals, stride, nk, d, oo),
            _ => M::mix::<4>(pp, p_stride, vals, stride, nk, d, oo),
        }
        g0 += 4;
    }
}

/// A family's entry point of [`mix_rows`] over its [`MixG`] (the same contract, unchecked),
/// inside `#[target_feature]` when given.
macro_rules! mix_entry {
    ($name:ident, $M:ty $(, $features:literal)?) => {
        $(#[target_feature(enable = $features)])?
        #[allow(clippy::too_many_arguments)]
        pub(in crate::kernels) unsafe fn $name(
            p: *const f32,
            p_stride: usize,
            nq: usize,
            vals: *const u8,
            stride: usize,
            nk: usize,
            d: usize,
            out: *mut f32,
        ) {
            $crate::kernels::vecops::mix_by_4::<$M>(p, p_stride, nq, vals, stride, nk, d, out)
        }
    };
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(in crate::kernels) use mix_entry;

/// Scalar reference of [`mix_rows`] (same contract, unchecked): f32 values, or f16 ones.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn mix_scalar<const F16: bool>(
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
pub(super) unsafe fn mix_scalar_q8(
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
    pub(super) fn len(&self) -> usize {
        match self {
            KvSlice::F32(x) => x.len(),
            KvSlice::F16(x) => x.len(),
            KvSlice::Q8_0(x) => x.len() / 34 * 32,
        }
    }
    pub(super) fn dtype(&self) -> DType {
        match self {
            KvSlice::F32(_) => DType::F32,
            KvSlice::F16(_) => DType::F16,
            KvSlice::Q8_0(_) => DType::Q8_0,
        }
    }
    pub(super) fn ptr(&self) -> *const u8 {
        match self {
            KvSlice::F32(x) => x.as_ptr() as *const u8,
            KvSlice::F16(x) => x.as_ptr() as *const u8,
            KvSlice::Q8_0(x) => x.as_ptr(),
        }
    }
    /// Bytes between rows `stride` elements apart.
    pub(super) fn stride_bytes(&self, stride: usize) -> usize {
        match self {
            KvSlice::F32(_) => 4 * stride,
            KvSlice::F16(_) => 2 * stride,
            KvSlice::Q8_0(_) => stride / 32 * 34,
        }
    }
    /// Whether rows of `d` elements `stride` apart are whole blocks.
    pub(super) fn blocks_ok(&self, d: usize, stride: usize) -> bool {
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
    let f = active().stored[dtype_index(dtype)];
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
            f(&a);
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
pub(super) unsafe fn exp_scalar(x: *mut f32, n: usize) {
    // SAFETY: the VecFns contract.
    let x = unsafe { std::slice::from_raw_parts_mut(x, n) };
    x.iter_mut().for_each(|v| *v = v.exp());
}
