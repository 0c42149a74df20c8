//! Fast mode's many-row path: an 8-bit GEMM (AVX-512 VNNI on 512-bit registers; AVX-VNNI and
//! AVX2 on 256-bit ones, [`gemm_fn`]).
//!
//! The activation rows are quantized once per matmul to 8-bit blocks of 32 with ggml's Q8_0
//! rule (`d = max|x| / 127` stored as f16, `q = round(x / d)`, halfway cases away from zero)
//! and packed in blocks of [`TB`] rows: for every 4 consecutive elements of `k`, the 4 bytes
//! of each of the `TB` rows side by side (`xq[(k/4)][TB][4]`), plus per group of 16 elements
//! each row's scale `dx` and `sx = dx · Σq` (`f32[k/16][TB]`).
//!
//! Each task unpacks a tile of weight rows once into unsigned 8-bit codes and, per group of 16
//! elements, two f32 `dw`, `cw` such that the weight is `dw · code + cw` (Q4_0: code = nibble
//! ⊕ …, see [`unpack`]). A group's contribution to an output is then
//! `dw · dx · Σ code·q + cw · sx`, the integer sum taken by `vpdpbusd` (u8 × i8, 4 products
//! per 32-bit lane): the exact dot product of the dequantized weights with the dequantized
//! 8-bit activations, up to f32 rounding — fast mode's contract.

// Index loops over small constant ranges (accumulators, rows, lanes) say this most plainly.
#![allow(clippy::needless_range_loop)]

use core::arch::x86_64::*;

use super::x86::WIQ4NL;
use super::x86::{for_each_micro, write_acc256, write_acc512, WQ5_1, WQ8_0, XQ5K, XQ6K};
use super::x86::{KExactW, LegacyW, WQ4_0, WQ4_0U, WQ4_1, WQ5_0, WQ5_0U, XQ4K};
use crate::tensor::DType;

/// Activation rows per packed block: two 16-lane vectors.
pub(super) const TB: usize = 32;

/// Formats this path takes on `isa`. Plain AVX2 leaves Q8_0 and the i-quants to the f32
/// GEMM: their signed 8-bit codes need `vpsignb` twice and a flush per `vpmaddubsw`, slower
/// than the f32 FMA GEMM (Q8_0: LFM2-350M pp512 260-268 against 268-284 tok/s, Qwen2.5-0.5B
/// 203 against 215). The other i-quants take their own GEMM (`int8sb`).
pub(super) fn supports(isa: super::Isa, dtype: DType) -> bool {
    (isa.is_x86()
        && matches!(
            dtype,
            DType::Q4_0
                | DType::Q4_1
                | DType::Q5_0
                | DType::Q5_1
                | DType::Q4K
                | DType::Q5K
                | DType::Q6K
        ))
        || (matches!(isa, super::Isa::AvxVnni | super::Isa::Avx512)
            && matches!(dtype, DType::Q8_0 | DType::IQ4NL))
}

/// Packed activation block sizes for `k` elements: (bytes of `xq`, f32 of `dx`, of `sx`).
pub(super) fn block_sizes(k: usize) -> (usize, usize) {
    (k * TB, k / 16 * TB)
}

/// Quantize and pack activation rows `rows` (≤ [`TB`], row-major `k` f32 each) into one
/// block: `xq` (k·TB bytes), `dx` and `sx` (k/16·TB f32 each). Rows past `rows` are zero.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C available; `x` holds `rows·k` f32; the outputs hold the sizes
/// above; `k` is a multiple of 32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn pack_x(
    x: *const f32,
    rows: usize,
    k: usize,
    xq: *mut u8,
    dx: *mut f32,
    sx: *mut f32,
) {
    let groups = k / 16;
    let mut q = [0i8; 32];
    for t in 0..TB {
        if t >= rows {
            for kq in 0..k / 4 {
                (xq.add((kq * TB + t) * 4) as *mut u32).write_unaligned(0);
            }
            for g in 0..groups {
                *dx.add(g * TB + t) = 0.0;
                *sx.add(g * TB + t) = 0.0;
            }
            continue;
        }
        let xr = x.add(t * k);
        for b in 0..k / 32 {
            let v0 = _mm512_loadu_ps(xr.add(32 * b));
            let v1 = _mm512_loadu_ps(xr.add(32 * b + 16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let idv = _mm512_set1_ps(id);
            for (h, v) in [v0, v1].into_iter().enumerate() {
                let s = _mm512_mul_ps(v, idv);
                // roundf: truncate |s|, add 1 where the dropped fraction is ≥ 0.5, restore the
                // sign (exact: |s| ≤ 127).
                let a = _mm512_abs_ps(s);
                let t0 = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
                let up =
                    _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_sub_ps(a, t0), _mm512_set1_ps(0.5));
                let r = _mm512_mask_add_ps(t0, up, t0, _mm512_set1_ps(1.0));
                let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(s, _mm512_setzero_ps());
                let r = _mm512_mask_sub_ps(r, neg, _mm512_setzero_ps(), r);
                let qi = _mm512_cvtps_epi32(r);
                _mm_storeu_si128(
                    q.as_mut_ptr().add(16 * h) as *mut __m128i,
                    _mm512_cvtepi32_epi8(qi),
                );
            }
            // The stored (f16) scale is what the dot products use, as ggml's Q8_0.
            let dq = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
                _mm_set_ss(d),
            )));
            store_block(&q, dq, b, t, xq, dx, sx);
        }
    }
}

/// Stores block `b` (quants `q`, stored scale `dq`) of activation row `t` in the packed layout:
/// its 8 words of 4 quants, and per group of 16 `dx = dq` and `sx = dq · Σq`.
///
/// # Safety
/// The outputs hold one packed block ([`block_sizes`]) and `b`, `t` lie inside it.
#[inline(always)]
unsafe fn store_block(
    q: &[i8; 32],
    dq: f32,
    b: usize,
    t: usize,
    xq: *mut u8,
    dx: *mut f32,
    sx: *mut f32,
) {
    for h in 0..2 {
        let sum: i32 = q[16 * h..16 * h + 16].iter().map(|&v| i32::from(v)).sum();
        let g = 2 * b + h;
        *dx.add(g * TB + t) = dq;
        *sx.add(g * TB + t) = dq * sum as f32;
    }
    for j in 0..8 {
        let w = (q.as_ptr().add(4 * j) as *const u32).read_unaligned();
        (xq.add(((8 * b + j) * TB + t) * 4) as *mut u32).write_unaligned(w);
    }
}

/// [`pack_x`] without AVX-512: the same bytes and scales (ggml's Q8_0 rule through the
/// reference quantizer), for the 256-bit levels.
///
/// # Safety
/// As [`pack_x`], without the AVX-512 requirement.
pub(super) unsafe fn pack_x_portable(
    x: *const f32,
    rows: usize,
    k: usize,
    xq: *mut u8,
    dx: *mut f32,
    sx: *mut f32,
) {
    let mut blk = [0u8; 34];
    for t in 0..TB {
        for b in 0..k / 32 {
            let q: [i8; 32] = if t < rows {
                let v = std::slice::from_raw_parts(x.add(t * k + 32 * b), 32);
                crate::quant::quantize_row(DType::Q8_0, v, &mut blk)
                    .expect("32 elements are one Q8_0 block");
                core::array::from_fn(|i| blk[2 + i] as i8)
            } else {
                [0; 32]
            };
            let dq = if t < rows {
                half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32()
            } else {
                0.0
            };
            store_block(&q, dq, b, t, xq, dx, sx);
        }
    }
}

/// Unpack one weight row of `k` elements (whole blocks of `dtype`) into codes (`k` bytes) and
/// per group of 16 `dw`, `cw` (k/16 f32 each): weight = `dw · code + cw`.
///
/// `small` (AVX2's `vpmaddubsw`, whose i16 pair sums saturate): codes stay below 64 — Q4_0,
/// Q5_0 and Q6_K keep their unsigned quants with the zero point in `cw` (Q8_0 is not taken
/// there, [`supports`]). Otherwise signed quants `q` become `q + 128` with `cw = -128·dw`.
///
/// # Safety
/// AVX2, FMA and F16C available; `src` holds the row; outputs hold the sizes above; `dtype`
/// is one of [`supports`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn unpack(
    dtype: DType,
    src: *const u8,
    k: usize,
    codes: *mut u8,
    dw: *mut f32,
    cw: *mut f32,
    small: bool,
) {
    match (dtype, small) {
        (DType::Q4_0, false) => unpack_legacy::<WQ4_0>(src, k, codes, dw, cw),
        (DType::Q4_0, true) => unpack_legacy::<WQ4_0U>(src, k, codes, dw, cw),
        (DType::Q4_1, _) => unpack_legacy::<WQ4_1>(src, k, codes, dw, cw),
        (DType::Q5_0, false) => unpack_legacy::<WQ5_0>(src, k, codes, dw, cw),
        (DType::Q5_0, true) => unpack_legacy::<WQ5_0U>(src, k, codes, dw, cw),
        (DType::Q5_1, _) => unpack_legacy::<WQ5_1>(src, k, codes, dw, cw),
        (DType::Q8_0, _) => unpack_legacy::<WQ8_0>(src, k, codes, dw, cw),
        (DType::Q4K, _) => unpack_k::<XQ4K, false>(src, k, codes, dw, cw),
        (DType::Q5K, _) => unpack_k::<XQ5K, false>(src, k, codes, dw, cw),
        (DType::Q6K, small) => {
            if small {
                unpack_k::<XQ6K, true>(src, k, codes, dw, cw)
            } else {
                unpack_k::<XQ6K, false>(src, k, codes, dw, cw)
            }
        }
        (DType::IQ4NL, _) => unpack_iq::<WIQ4NL>(src, k, codes, dw, cw),
        _ => unreachable!("checked by supports()"),
    }
}

/// IQ4_NL: each block as the 8-bit matrix-vector kernels decode it (signed levels `q`),
/// `q` becoming `q + 128` with `cw = −128·dw` (whole-byte codes: the `vpdpbusd` levels
/// only, [`supports`]).
#[inline(always)]
unsafe fn unpack_iq<W: LegacyW>(
    src: *const u8,
    k: usize,
    codes: *mut u8,
    dw: *mut f32,
    cw: *mut f32,
) {
    debug_assert!(W::SIGNED);
    for b in 0..k / 32 {
        let (q, d0, d1, _) = W::decode_split(src, b);
        _mm256_storeu_si256(
            codes.add(32 * b) as *mut __m256i,
            _mm256_xor_si256(q, _mm256_set1_epi8(-128)),
        );
        for (g, d) in [(2 * b, d0), (2 * b + 1, d1)] {
            *dw.add(g) = d;
            *cw.add(g) = -128.0 * d;
        }
    }
}

/// [`unpack`] of 8 Q8_0 rows straight from their rows-by-8 group ([`super::packed`]):
/// the same codes (`q + 128`), `dw` and `cw` as unpacking the stored rows, without
/// rebuilding them first. Each block's 8 chunks (8 rows × 4 bytes each) are transposed
/// in registers into the 8 rows' 32 codes.
///
/// # Safety
/// AVX2, FMA and F16C available; `src` holds one packed group of 8 Q8_0 rows of `k`
/// elements (`k / 32` blocks of 272 bytes); row `r`'s outputs are `codes + r·cs` (k bytes)
/// and `dw/cw + r·gs` (k/16 f32 each).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_q8_0_group(
    src: *const u8,
    k: usize,
    codes: *mut u8,
    cs: usize,
    dw: *mut f32,
    cw: *mut f32,
    gs: usize,
) {
    let flip = _mm256_set1_epi8(-128);
    for b in 0..k / 32 {
        let p = src.add(b * 8 * 34);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let mut ds = [0f32; 8];
        _mm256_storeu_ps(ds.as_mut_ptr(), d);
        // c[j] = chunk j: dword r = row r's quants 4j..4j+4.
        let q = p.add(16);
        let c: [__m256i; 8] = [
            _mm256_loadu_si256(q as *const __m256i),
            _mm256_loadu_si256(q.add(32) as *const __m256i),
            _mm256_loadu_si256(q.add(64) as *const __m256i),
            _mm256_loadu_si256(q.add(96) as *const __m256i),
            _mm256_loadu_si256(q.add(128) as *const __m256i),
            _mm256_loadu_si256(q.add(160) as *const __m256i),
            _mm256_loadu_si256(q.add(192) as *const __m256i),
            _mm256_loadu_si256(q.add(224) as *const __m256i),
        ];
        // 8×8 dword transpose: t[r] = [c0[r], c1[r], …, c7[r]].
        let a0 = _mm256_unpacklo_epi32(c[0], c[1]);
        let a1 = _mm256_unpackhi_epi32(c[0], c[1]);
        let a2 = _mm256_unpacklo_epi32(c[2], c[3]);
        let a3 = _mm256_unpackhi_epi32(c[2], c[3]);
        let a4 = _mm256_unpacklo_epi32(c[4], c[5]);
        let a5 = _mm256_unpackhi_epi32(c[4], c[5]);
        let a6 = _mm256_unpacklo_epi32(c[6], c[7]);
        let a7 = _mm256_unpackhi_epi32(c[6], c[7]);
        let b0 = _mm256_unpacklo_epi64(a0, a2);
        let b1 = _mm256_unpackhi_epi64(a0, a2);
        let b2 = _mm256_unpacklo_epi64(a1, a3);
        let b3 = _mm256_unpackhi_epi64(a1, a3);
        let b4 = _mm256_unpacklo_epi64(a4, a6);
        let b5 = _mm256_unpackhi_epi64(a4, a6);
        let b6 = _mm256_unpacklo_epi64(a5, a7);
        let b7 = _mm256_unpackhi_epi64(a5, a7);
        let t: [__m256i; 8] = [
            _mm256_permute2x128_si256::<0x20>(b0, b4),
            _mm256_permute2x128_si256::<0x20>(b1, b5),
            _mm256_permute2x128_si256::<0x20>(b2, b6),
            _mm256_permute2x128_si256::<0x20>(b3, b7),
            _mm256_permute2x128_si256::<0x31>(b0, b4),
            _mm256_permute2x128_si256::<0x31>(b1, b5),
            _mm256_permute2x128_si256::<0x31>(b2, b6),
            _mm256_permute2x128_si256::<0x31>(b3, b7),
        ];
        for r in 0..8 {
            _mm256_storeu_si256(
                codes.add(r * cs + 32 * b) as *mut __m256i,
                _mm256_xor_si256(t[r], flip),
            );
            for g in 2 * b..2 * b + 2 {
                *dw.add(r * gs + g) = ds[r];
                *cw.add(r * gs + g) = -128.0 * ds[r];
            }
        }
    }
}

/// Signed quants `q` become codes `q + 128` with `cw = -128·dw`; unsigned ones stay, with
/// the block's min as `cw`.
#[inline(always)]
unsafe fn unpack_legacy<W: LegacyW>(
    src: *const u8,
    k: usize,
    codes: *mut u8,
    dw: *mut f32,
    cw: *mut f32,
) {
    for b in 0..k / 32 {
        let (q, d, m) = W::decode(src.add(b * W::BB));
        let (c, off) = if W::SIGNED {
            (_mm256_xor_si256(q, _mm256_set1_epi8(-128)), -128.0 * d)
        } else {
            (q, m)
        };
        _mm256_storeu_si256(codes.add(32 * b) as *mut __m256i, c);
        for g in 2 * b..2 * b + 2 {
            *dw.add(g) = d;
            *cw.add(g) = off;
        }
    }
}

/// K-quants: with a min, weight = ds·q − ms (codes = q); without (Q6_K), q is signed and
/// becomes `q + 128` with `cw = −128·ds` (`SMALL`: `q + 32`, `cw = −32·ds`).
#[inline(always)]
unsafe fn unpack_k<W: KExactW, const SMALL: bool>(
    src: *const u8,
    k: usize,
    codes: *mut u8,
    dw: *mut f32,
    cw: *mut f32,
) {
    let off: i8 = if SMALL { 32 } else { -128 };
    let mut q = [0i8; 256];
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    for b in 0..k / 256 {
        W::decode(src.add(b * W::BB), &mut q, &mut ds, &mut ms);
        for j in 0..8 {
            let v = _mm256_loadu_si256(q.as_ptr().add(32 * j) as *const __m256i);
            let c = if W::HAS_MIN {
                v
            } else {
                // q + 128 is q ^ 0x80; q + 32 (q ≥ −32) an add.
                _mm256_add_epi8(v, _mm256_set1_epi8(off))
            };
            _mm256_storeu_si256(codes.add(256 * b + 32 * j) as *mut __m256i, c);
        }
        for g in 0..16 {
            let s = g * 16 / W::GROUP;
            let (d, c) = if W::HAS_MIN {
                (ds[s], -ms[s])
            } else {
                (ds[s], -f32::from(off as u8) * ds[s])
            };
            *dw.add(16 * b + g) = d;
            *cw.add(16 * b + g) = c;
        }
    }
}

/// An unpacked weight tile and a packed activation block set, for [`gemm`].
pub(super) struct IGemmArgs {
    /// `rows` rows of `k` codes, `c_stride` bytes apart.
    pub codes: *const u8,
    pub c_stride: usize,
    /// `rows` rows of `k/16` f32, `g_stride` f32 apart.
    pub dw: *const f32,
    pub cw: *const f32,
    pub g_stride: usize,
    pub rows: usize,
    /// Packed activation blocks ([`block_sizes`] apart).
    pub xq: *const u8,
    pub dx: *const f32,
    pub sx: *const f32,
    pub n: usize,
    pub k: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// Weight rows per micro-kernel.
const R: usize = 4;

#[inline(always)]
unsafe fn micro<const NV: usize>(g: &IGemmArgs, r0: usize, t0: usize) {
    let blk = t0 / TB;
    let (xb, fb) = block_sizes(g.k);
    let xq = g.xq.add(blk * xb);
    let dx = g.dx.add(blk * fb);
    let sx = g.sx.add(blk * fb);
    let rr: [usize; R] = core::array::from_fn(|r| (r0 + r).min(g.rows - 1));
    let codes: [*const u8; R] = core::array::from_fn(|r| g.codes.add(rr[r] * g.c_stride));
    let dw: [*const f32; R] = core::array::from_fn(|r| g.dw.add(rr[r] * g.g_stride));
    let cw: [*const f32; R] = core::array::from_fn(|r| g.cw.add(rr[r] * g.g_stride));
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for grp in 0..g.k / 16 {
        let mut iacc = [[_mm512_setzero_si512(); NV]; R];
        for j in 0..4 {
            let kq = 4 * grp + j;
            let xv: [__m512i; NV] = core::array::from_fn(|v| {
                _mm512_loadu_si512(xq.add(kq * TB * 4 + 64 * v) as *const _)
            });
            for r in 0..R {
                let b = _mm512_set1_epi32((codes[r].add(4 * kq) as *const i32).read_unaligned());
                for v in 0..NV {
                    iacc[r][v] = _mm512_dpbusd_epi32(iacc[r][v], b, xv[v]);
                }
            }
        }
        let dxv: [__m512; NV] =
            core::array::from_fn(|v| _mm512_loadu_ps(dx.add(grp * TB + 16 * v)));
        let sxv: [__m512; NV] =
            core::array::from_fn(|v| _mm512_loadu_ps(sx.add(grp * TB + 16 * v)));
        for r in 0..R {
            let d = _mm512_set1_ps(*dw[r].add(grp));
            let c = _mm512_set1_ps(*cw[r].add(grp));
            for v in 0..NV {
                let scale = _mm512_mul_ps(d, dxv[v]);
                acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][v]), scale, acc[r][v]);
                acc[r][v] = _mm512_fmadd_ps(c, sxv[v], acc[r][v]);
            }
        }
    }
    write_acc512(
        &acc,
        R.min(g.rows - r0),
        (NV * 16).min(g.n - t0),
        g.out.add(t0 * g.out_stride + r0),
        g.out_stride,
    );
}

/// Every (row, activation row) pair of an [`IGemmArgs`].
///
/// # Safety
/// AVX-512 level features available; every pointer valid for what it describes; `rows ≥ 1`,
/// `n ≥ 1`; the outputs written belong to the caller alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemm(g: &IGemmArgs) {
    for_each_micro(g.n, g.rows, R, TB / 2, |r0, t0, one| {
        if one {
            micro::<1>(g, r0, t0);
        } else {
            micro::<2>(g, r0, t0);
        }
    });
}

// ------------------------------------------------------------------ 256-bit levels

/// An 8-bit multiply-accumulate step of the 256-bit GEMM: one broadcast code word `w` (4
/// codes of a weight row) against 8 packed activation rows `x` (4 bytes of each).
trait Dot8 {
    /// The step accumulates straight into i32 lanes (no partial sums to flush).
    const DIRECT: bool;
    /// `p` + the step: i32 lanes (`DIRECT`), else i16 pair sums.
    unsafe fn step(p: __m256i, w: __m256i, x: __m256i) -> __m256i;
    /// i32 lanes `acc` + the i16 partial sums `p`.
    unsafe fn flush(acc: __m256i, p: __m256i) -> __m256i;
}
/// AVX-VNNI `vpdpbusd` (codes unsigned, activations signed; no saturation).
struct GVnni;
/// AVX2 `vpmaddubsw` into i16 pair sums, codes below 64 ([`unpack`]'s `small`); the caller
/// flushes them (`vpmaddwd` by ones) before they could pass 2^15 ([`steps_for`]).
struct GMaddubs;
impl Dot8 for GVnni {
    const DIRECT: bool = true;
    #[inline(always)]
    unsafe fn step(p: __m256i, w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(p, w, x)
    }
    #[inline(always)]
    unsafe fn flush(acc: __m256i, _p: __m256i) -> __m256i {
        acc
    }
}
impl Dot8 for GMaddubs {
    const DIRECT: bool = false;
    #[inline(always)]
    unsafe fn step(p: __m256i, w: __m256i, x: __m256i) -> __m256i {
        _mm256_add_epi16(p, _mm256_maddubs_epi16(w, x))
    }
    #[inline(always)]
    unsafe fn flush(acc: __m256i, p: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }
}
/// One micro-tile: `R` weight rows × `NV` vectors of 8 activation rows. Per span of `SPAN`
/// elements (32 where the format's scale and offset are the same for both 16-element groups
/// of each 32 — every format but Q6_K — else 16) the integer sums run in registers: `STEPS`
/// code words per i16 partial before a flush (AVX2), or straight into i32 (VNNI); then one
/// scaling per span (`dx` is the same for both groups of a 32-block; the offsets' `sx` add).
#[inline(always)]
unsafe fn micro256<
    D: Dot8,
    const R: usize,
    const NV: usize,
    const SPAN: usize,
    const STEPS: usize,
>(
    g: &IGemmArgs,
    r0: usize,
    t0: usize,
) {
    let (blk, off) = (t0 / TB, t0 % TB);
    let (xb, fb) = block_sizes(g.k);
    let xq = g.xq.add(blk * xb + 4 * off);
    let dx = g.dx.add(blk * fb + off);
    let sx = g.sx.add(blk * fb + off);
    let rr: [usize; R] = core::array::from_fn(|r| (r0 + r).min(g.rows - 1));
    let codes: [*const u8; R] = core::array::from_fn(|r| g.codes.add(rr[r] * g.c_stride));
    let dw: [*const f32; R] = core::array::from_fn(|r| g.dw.add(rr[r] * g.g_stride));
    let cw: [*const f32; R] = core::array::from_fn(|r| g.cw.add(rr[r] * g.g_stride));
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    let words = SPAN / 4;
    for span in 0..g.k / SPAN {
        let mut iacc = [[_mm256_setzero_si256(); NV]; R];
        let mut j = 0;
        while j < words {
            let mut p = [[_mm256_setzero_si256(); NV]; R];
            for jj in 0..STEPS.min(words) {
                let kq = span * words + j + jj;
                let xv: [__m256i; NV] = core::array::from_fn(|v| {
                    _mm256_loadu_si256(xq.add(kq * TB * 4 + 32 * v) as *const __m256i)
                });
                for r in 0..R {
                    let w =
                        _mm256_set1_epi32((codes[r].add(4 * kq) as *const i32).read_unaligned());
                    for v in 0..NV {
                        if D::DIRECT {
                            iacc[r][v] = D::step(iacc[r][v], w, xv[v]);
                        } else {
                            p[r][v] = D::step(p[r][v], w, xv[v]);
                        }
                    }
                }
            }
            if !D::DIRECT {
                for r in 0..R {
                    for v in 0..NV {
                        iacc[r][v] = D::flush(iacc[r][v], p[r][v]);
                    }
                }
            }
            j += STEPS;
        }
        let grp = span * SPAN / 16;
        for v in 0..NV {
            let dxv = _mm256_loadu_ps(dx.add(grp * TB + 8 * v));
            let mut sxv = _mm256_loadu_ps(sx.add(grp * TB + 8 * v));
            if SPAN == 32 {
                sxv = _mm256_add_ps(sxv, _mm256_loadu_ps(sx.add((grp + 1) * TB + 8 * v)));
            }
            for r in 0..R {
                let scale = _mm256_mul_ps(_mm256_set1_ps(*dw[r].add(grp)), dxv);
                acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][v]), scale, acc[r][v]);
                acc[r][v] = _mm256_fmadd_ps(_mm256_set1_ps(*cw[r].add(grp)), sxv, acc[r][v]);
            }
        }
    }
    write_acc256(
        &acc,
        R.min(g.rows - r0),
        (NV * 8).min(g.n - t0),
        g.out.add(t0 * g.out_stride + r0),
        g.out_stride,
    );
}

/// Every (row, activation row) pair: AVX-VNNI 3 rows × 16 activation rows (6 i32 and 6 f32
/// accumulators); AVX2 4 rows × 8 (4 i16 partials, 4 i32 sums, 4 f32 accumulators), within
/// the 16 registers.
#[inline(always)]
unsafe fn gemm256<D: Dot8, const SPAN: usize, const STEPS: usize>(g: &IGemmArgs) {
    if D::DIRECT {
        for_each_micro(g.n, g.rows, 3, 8, |r0, t0, one| {
            if one {
                micro256::<D, 3, 1, SPAN, STEPS>(g, r0, t0);
            } else {
                micro256::<D, 3, 2, SPAN, STEPS>(g, r0, t0);
            }
        });
    } else {
        for_each_micro(g.n, g.rows, 4, 4, |r0, t0, _| {
            micro256::<D, 4, 1, SPAN, STEPS>(g, r0, t0);
        });
    }
}

macro_rules! gemm256_entry {
    ($name:ident, $features:literal, $D:ty, $span:literal, $steps:literal) => {
        /// [`gemm`] on a 256-bit level (see [`gemm_fn`] for which format takes it).
        ///
        /// # Safety
        /// As [`gemm`], with this entry's CPU features instead of AVX-512, and the codes
        /// [`gemm_fn`] pairs it with.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(g: &IGemmArgs) {
            gemm256::<$D, $span, $steps>(g)
        }
    };
}
gemm256_entry!(gemm_avxvnni_16, "avx2,fma,f16c,avxvnni", GVnni, 16, 4);
gemm256_entry!(gemm_avxvnni_32, "avx2,fma,f16c,avxvnni", GVnni, 32, 8);
// i16 partials: codes < 16 take 8 steps (8·2·15·127 = 30480 < 2^15), < 32 four (31496),
// < 64 two (32004).
gemm256_entry!(gemm_avx2_4bit, "avx2,fma,f16c", GMaddubs, 32, 8);
gemm256_entry!(gemm_avx2_5bit, "avx2,fma,f16c", GMaddubs, 32, 4);
gemm256_entry!(gemm_avx2_q6k, "avx2,fma,f16c", GMaddubs, 16, 2);

/// The 8-bit GEMM pieces for an ISA level: the activation packer, whether codes are
/// [`unpack`]'s `small` ones, and the tile kernel for `dtype`.
pub(super) struct IgemmFns {
    pub pack: unsafe fn(*const f32, usize, usize, *mut u8, *mut f32, *mut f32),
    pub small: bool,
    pub gemm: unsafe fn(&IGemmArgs),
}

pub(super) fn gemm_fn(isa: super::Isa, dtype: DType) -> IgemmFns {
    use super::Isa;
    match isa {
        Isa::Avx512 => IgemmFns {
            pack: pack_x,
            small: false,
            gemm,
        },
        Isa::AvxVnni => IgemmFns {
            pack: pack_x_portable,
            small: false,
            gemm: if dtype == DType::Q6K {
                gemm_avxvnni_16
            } else {
                gemm_avxvnni_32
            },
        },
        _ => IgemmFns {
            pack: pack_x_portable,
            small: true,
            gemm: match dtype {
                DType::Q6K => gemm_avx2_q6k,
                DType::Q5_0 | DType::Q5_1 | DType::Q5K => gemm_avx2_5bit,
                _ => gemm_avx2_4bit,
            },
        },
    }
}
