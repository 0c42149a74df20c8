//! The many-row path of the super-block i-quants and ternary formats (`x86::iqsuper`): an
//! 8-bit GEMM (`vpdpbusd`, AVX-VNNI and AVX-512) that keeps their matrix-vector kernels'
//! chain, so a row's outputs are the same bits in any number of rows — the default mode takes
//! it for prompts as fast mode does.
//!
//! Activation rows are quantized to Q8_K (as for the matrix-vector kernels, by the same
//! function) and packed in blocks of [`TB`] rows as the legacy GEMM packs them (`int8`): for
//! every 4 consecutive elements the 4 bytes of each row side by side; per super-block each
//! row's `dx`, per 16 elements each row's `128·Σy`. A tile of weight rows is unpacked once to
//! codes `q + 128`, an i32 scale per 16 elements and `dw` per super-block. Per super-block
//! and (weight row, activation row): `Σ_span s·(Σ (q + 128)·y − 128·Σy)`, exact in i32, then
//! `acc ← fma(float(Σ), dw·dx, acc)` — `iqsuper::sb_rows_n`'s chain (Q2_K's mins a second
//! step, as there).

// Index loops over small constant ranges (accumulators, rows, lanes) say this most plainly.
#![allow(clippy::needless_range_loop)]

use core::arch::x86_64::*;

use super::int8::TB;
use super::x86::{for_each_micro, write_acc256, write_acc512, SbW};
use super::x86::{WIQ1M, WIQ1S, WIQ2S, WIQ2XS, WIQ2XXS, WIQ3S, WIQ3XXS, WIQ4XS, WQ2K, WQ3K};
use super::x86::{WQ4KS, WQ5KS, WQ6KS};
use super::x86::{WTQ1_0, WTQ2_0};
use crate::tensor::DType;

/// The formats this path takes on `isa`: the super-block i-quants, ternary formats and
/// K-quants ([`format`]), on the `vpdpbusd` levels.
pub(super) fn supports(isa: super::Isa, dtype: DType) -> bool {
    matches!(isa, super::Isa::AvxVnni | super::Isa::Avx512) && format(dtype).is_some()
}

/// A format's decoder as this path needs it: the row unpacker, and its decoder's shape.
#[derive(Clone, Copy)]
pub(super) struct SbFormat {
    pub unpack: unsafe fn(*const u8, usize, &Unpacked),
    split: bool,
    min: bool,
}

fn of<W: SbW>() -> SbFormat {
    SbFormat {
        unpack: unpack_sb::<W>,
        split: W::SPLIT,
        min: W::MIN,
    }
}

/// `dtype`'s decoder, if this path takes it.
pub(super) fn format(dtype: DType) -> Option<SbFormat> {
    Some(match dtype {
        DType::Q2K => of::<WQ2K>(),
        DType::Q3K => of::<WQ3K>(),
        DType::Q4K => of::<WQ4KS>(),
        DType::Q5K => of::<WQ5KS>(),
        DType::Q6K => of::<WQ6KS>(),
        DType::IQ4XS => of::<WIQ4XS>(),
        DType::IQ2XXS => of::<WIQ2XXS>(),
        DType::IQ2XS => of::<WIQ2XS>(),
        DType::IQ2S => of::<WIQ2S>(),
        DType::IQ3XXS => of::<WIQ3XXS>(),
        DType::IQ3S => of::<WIQ3S>(),
        DType::IQ1S => of::<WIQ1S>(),
        DType::IQ1M => of::<WIQ1M>(),
        DType::TQ1_0 => of::<WTQ1_0>(),
        DType::TQ2_0 => of::<WTQ2_0>(),
        _ => return None,
    })
}

/// Sizes of one packed activation block for `k` elements: bytes of `xq`, f32 of `dx`, i32
/// of `ys`.
pub(super) fn block_sizes(k: usize) -> (usize, usize, usize) {
    (k * TB, k / 256 * TB, k / 16 * TB)
}

/// Packs `rows` (≤ [`TB`]) Q8_K rows (`q`, `qs` bytes apart) into one block; rows past
/// `rows` are zero.
///
/// # Safety
/// `q` holds `rows` rows of `k / 256` Q8_K blocks; the outputs hold [`block_sizes`]`(k)`.
pub(super) unsafe fn pack_q8k(
    q: *const u8,
    qs: usize,
    rows: usize,
    k: usize,
    xq: *mut u8,
    dx: *mut f32,
    ys: *mut i32,
) {
    for t in 0..TB {
        let row = (t < rows).then(|| q.add(t * qs));
        for s in 0..k / 256 {
            let b = row.map(|r| r.add(s * 292));
            *dx.add(s * TB + t) = b.map_or(0.0, |b| (b as *const f32).read_unaligned());
            for w in 0..64 {
                let v = b.map_or(0, |b| (b.add(4 + 4 * w) as *const u32).read_unaligned());
                (xq.add(((64 * s + w) * TB + t) * 4) as *mut u32).write_unaligned(v);
            }
            for g in 0..16 {
                let sum = b.map_or(0, |b| {
                    i32::from((b.add(260 + 2 * g) as *const i16).read_unaligned())
                });
                *ys.add((16 * s + g) * TB + t) = 128 * sum;
            }
        }
    }
}

/// Where [`SbFormat::unpack`] writes one row of `k` elements: codes `q + 128` (k bytes), the
/// scale and min of every 16 elements (k/16 i32 each; mins for [`SbW::MIN`] formats only),
/// `dw` and `dmin` of every super-block (k/256 f32 each).
pub(super) struct Unpacked {
    pub codes: *mut u8,
    pub sc: *mut i32,
    pub dw: *mut f32,
    pub mn: *mut i32,
    pub dmin: *mut f32,
}

/// Unpacks the stored row at `src` into `u`.
///
/// # Safety
/// AVX2 available; `src` holds the row; `u` holds the sizes above.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_sb<W: SbW>(src: *const u8, k: usize, u: &Unpacked) {
    for b in 0..k / 32 {
        let (q, s0, s1) = W::sub_int(src, b);
        _mm256_storeu_si256(
            u.codes.add(32 * b) as *mut __m256i,
            _mm256_xor_si256(q, _mm256_set1_epi8(-128)),
        );
        *u.sc.add(2 * b) = i32::from(s0);
        *u.sc.add(2 * b + 1) = i32::from(s1);
        if W::MIN {
            let (m0, m1) = W::sub_min(src, b);
            *u.mn.add(2 * b) = i32::from(m0);
            *u.mn.add(2 * b + 1) = i32::from(m1);
        }
    }
    for s in 0..k / 256 {
        *u.dw.add(s) = W::super_d(src, s);
        if W::MIN {
            *u.dmin.add(s) = W::super_dmin(src, s);
        }
    }
}

/// An unpacked weight tile and the packed activation blocks.
pub(super) struct SbGemmArgs {
    /// `rows` rows of `k` codes, `c_stride` bytes apart.
    pub codes: *const u8,
    pub c_stride: usize,
    /// `rows` rows of `k/16` i32 scales, `k/16` apart.
    pub sc: *const i32,
    /// `rows` rows of `k/256` f32, `k/256` apart.
    pub dw: *const f32,
    /// Q2_K's mins and their scales, shaped as `sc` and `dw` (unread for other formats).
    pub mn: *const i32,
    pub dmin: *const f32,
    pub rows: usize,
    /// Packed activation blocks ([`block_sizes`] apart).
    pub xq: *const u8,
    pub dx: *const f32,
    pub ys: *const i32,
    pub n: usize,
    pub k: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// `R` weight rows × `NV` vectors of 16 activation rows (AVX-512).
#[inline(always)]
unsafe fn micro512<const R: usize, const NV: usize, const SPAN: usize, const MIN: bool>(
    g: &SbGemmArgs,
    r0: usize,
    t0: usize,
) {
    let blk = t0 / TB;
    let (xb, db, yb) = block_sizes(g.k);
    let xq = g.xq.add(blk * xb);
    let dx = g.dx.add(blk * db);
    let ys = g.ys.add(blk * yb);
    let (gs, ss) = (g.k / 16, g.k / 256);
    let rr: [usize; R] = core::array::from_fn(|r| (r0 + r).min(g.rows - 1));
    let codes: [*const u8; R] = core::array::from_fn(|r| g.codes.add(rr[r] * g.c_stride));
    let sc: [*const i32; R] = core::array::from_fn(|r| g.sc.add(rr[r] * gs));
    let dw: [*const f32; R] = core::array::from_fn(|r| g.dw.add(rr[r] * ss));
    let mn: [*const i32; R] = core::array::from_fn(|r| g.mn.wrapping_add(rr[r] * gs));
    let dmin: [*const f32; R] = core::array::from_fn(|r| g.dmin.wrapping_add(rr[r] * ss));
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for s in 0..ss {
        let mut sacc = [[_mm512_setzero_si512(); NV]; R];
        for span in 16 * s / (SPAN / 16)..16 * (s + 1) / (SPAN / 16) {
            let mut iacc = [[_mm512_setzero_si512(); NV]; R];
            for j in 0..SPAN / 4 {
                let kq = span * SPAN / 4 + j;
                let xv: [__m512i; NV] = core::array::from_fn(|v| {
                    _mm512_loadu_si512(xq.add(kq * TB * 4 + 64 * v) as *const _)
                });
                for r in 0..R {
                    let b =
                        _mm512_set1_epi32((codes[r].add(4 * kq) as *const i32).read_unaligned());
                    for v in 0..NV {
                        iacc[r][v] = _mm512_dpbusd_epi32(iacc[r][v], b, xv[v]);
                    }
                }
            }
            let grp = span * SPAN / 16;
            let yv: [__m512i; NV] = core::array::from_fn(|v| {
                let y = _mm512_loadu_si512(ys.add(grp * TB + 16 * v) as *const _);
                if SPAN == 32 {
                    _mm512_add_epi32(
                        y,
                        _mm512_loadu_si512(ys.add((grp + 1) * TB + 16 * v) as *const _),
                    )
                } else {
                    y
                }
            });
            for r in 0..R {
                let m = _mm512_set1_epi32(*sc[r].add(grp));
                for v in 0..NV {
                    let t = _mm512_sub_epi32(iacc[r][v], yv[v]);
                    sacc[r][v] = _mm512_add_epi32(sacc[r][v], _mm512_mullo_epi32(t, m));
                }
            }
        }
        for v in 0..NV {
            let dxv = _mm512_loadu_ps(dx.add(s * TB + 16 * v));
            for r in 0..R {
                let scale = _mm512_mul_ps(_mm512_set1_ps(*dw[r].add(s)), dxv);
                acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sacc[r][v]), scale, acc[r][v]);
            }
            if MIN {
                // Σ m·Σy over the super-block's groups of 16 (ys holds 128·Σy).
                let mut msum = [_mm512_setzero_si512(); R];
                for grp in 16 * s..16 * (s + 1) {
                    let y = _mm512_srai_epi32::<7>(_mm512_loadu_si512(
                        ys.add(grp * TB + 16 * v) as *const _
                    ));
                    for r in 0..R {
                        let m = _mm512_set1_epi32(*mn[r].add(grp));
                        msum[r] = _mm512_add_epi32(msum[r], _mm512_mullo_epi32(y, m));
                    }
                }
                for r in 0..R {
                    let scale = _mm512_mul_ps(_mm512_set1_ps(*dmin[r].add(s)), dxv);
                    acc[r][v] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[r]), scale, acc[r][v]);
                }
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

/// `R` weight rows × `NV` vectors of 8 activation rows (AVX-VNNI).
#[inline(always)]
unsafe fn micro256<const R: usize, const NV: usize, const SPAN: usize, const MIN: bool>(
    g: &SbGemmArgs,
    r0: usize,
    t0: usize,
) {
    let (blk, off) = (t0 / TB, t0 % TB);
    let (xb, db, yb) = block_sizes(g.k);
    let xq = g.xq.add(blk * xb + 4 * off);
    let dx = g.dx.add(blk * db + off);
    let ys = g.ys.add(blk * yb + off);
    let (gs, ss) = (g.k / 16, g.k / 256);
    let rr: [usize; R] = core::array::from_fn(|r| (r0 + r).min(g.rows - 1));
    let codes: [*const u8; R] = core::array::from_fn(|r| g.codes.add(rr[r] * g.c_stride));
    let sc: [*const i32; R] = core::array::from_fn(|r| g.sc.add(rr[r] * gs));
    let dw: [*const f32; R] = core::array::from_fn(|r| g.dw.add(rr[r] * ss));
    let mn: [*const i32; R] = core::array::from_fn(|r| g.mn.wrapping_add(rr[r] * gs));
    let dmin: [*const f32; R] = core::array::from_fn(|r| g.dmin.wrapping_add(rr[r] * ss));
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    for s in 0..ss {
        let mut sacc = [[_mm256_setzero_si256(); NV]; R];
        for span in 16 * s / (SPAN / 16)..16 * (s + 1) / (SPAN / 16) {
            let mut iacc = [[_mm256_setzero_si256(); NV]; R];
            for j in 0..SPAN / 4 {
                let kq = span * SPAN / 4 + j;
                let xv: [__m256i; NV] = core::array::from_fn(|v| {
                    _mm256_loadu_si256(xq.add(kq * TB * 4 + 32 * v) as *const __m256i)
                });
                for r in 0..R {
                    let b =
                        _mm256_set1_epi32((codes[r].add(4 * kq) as *const i32).read_unaligned());
                    for v in 0..NV {
                        iacc[r][v] = _mm256_dpbusd_avx_epi32(iacc[r][v], b, xv[v]);
                    }
                }
            }
            let grp = span * SPAN / 16;
            let yv: [__m256i; NV] = core::array::from_fn(|v| {
                let y = _mm256_loadu_si256(ys.add(grp * TB + 8 * v) as *const __m256i);
                if SPAN == 32 {
                    _mm256_add_epi32(
                        y,
                        _mm256_loadu_si256(ys.add((grp + 1) * TB + 8 * v) as *const __m256i),
                    )
                } else {
                    y
                }
            });
            for r in 0..R {
                let m = _mm256_set1_epi32(*sc[r].add(grp));
                for v in 0..NV {
                    let t = _mm256_sub_epi32(iacc[r][v], yv[v]);
                    sacc[r][v] = _mm256_add_epi32(sacc[r][v], _mm256_mullo_epi32(t, m));
                }
            }
        }
        for v in 0..NV {
            let dxv = _mm256_loadu_ps(dx.add(s * TB + 8 * v));
            for r in 0..R {
                let scale = _mm256_mul_ps(_mm256_set1_ps(*dw[r].add(s)), dxv);
                acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sacc[r][v]), scale, acc[r][v]);
            }
            if MIN {
                // Σ m·Σy over the super-block's groups of 16 (ys holds 128·Σy).
                let mut msum = [_mm256_setzero_si256(); R];
                for grp in 16 * s..16 * (s + 1) {
                    let y = _mm256_srai_epi32::<7>(_mm256_loadu_si256(
                        ys.add(grp * TB + 8 * v) as *const __m256i
                    ));
                    for r in 0..R {
                        let m = _mm256_set1_epi32(*mn[r].add(grp));
                        msum[r] = _mm256_add_epi32(msum[r], _mm256_mullo_epi32(y, m));
                    }
                }
                for r in 0..R {
                    let scale = _mm256_mul_ps(_mm256_set1_ps(*dmin[r].add(s)), dxv);
                    acc[r][v] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[r]), scale, acc[r][v]);
                }
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

/// Every (row, activation row) pair on AVX-512: 4 rows × 32 activation rows (the tile sizes:
/// docs/performance.md, "Design choices measured").
///
/// # Safety
/// AVX-512 level features available; every pointer valid for what it describes; `rows ≥ 1`,
/// `n ≥ 1`; the outputs written belong to the caller alone.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemm512<const SPAN: usize, const MIN: bool>(g: &SbGemmArgs) {
    for_each_micro(g.n, g.rows, 4, TB / 2, |r0, t0, one| {
        if one {
            micro512::<4, 1, SPAN, MIN>(g, r0, t0);
        } else {
            micro512::<4, 2, SPAN, MIN>(g, r0, t0);
        }
    });
}

/// Every (row, activation row) pair on AVX-VNNI: 3 rows × 16 activation rows.
///
/// # Safety
/// As [`gemm512`], with AVX-VNNI instead of AVX-512.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn gemm_vnni<const SPAN: usize, const MIN: bool>(g: &SbGemmArgs) {
    for_each_micro(g.n, g.rows, 3, 8, |r0, t0, one| {
        if one {
            micro256::<3, 1, SPAN, MIN>(g, r0, t0);
        } else {
            micro256::<3, 2, SPAN, MIN>(g, r0, t0);
        }
    });
}

/// The tile kernel for a format's decoder on `isa` (a `vpdpbusd` level).
pub(super) fn gemm_fn(isa: super::Isa, f: SbFormat) -> unsafe fn(&SbGemmArgs) {
    match (isa, f.split, f.min) {
        (super::Isa::Avx512, true, true) => gemm512::<16, true>,
        (super::Isa::Avx512, true, false) => gemm512::<16, false>,
        (super::Isa::Avx512, false, true) => gemm512::<32, true>,
        (super::Isa::Avx512, false, false) => gemm512::<32, false>,
        (_, true, true) => gemm_vnni::<16, true>,
        (_, true, false) => gemm_vnni::<16, false>,
        (_, false, true) => gemm_vnni::<32, true>,
        (_, false, false) => gemm_vnni::<32, false>,
    }
}
