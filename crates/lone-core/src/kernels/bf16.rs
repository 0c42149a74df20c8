//! Fast mode's many-row path for BF16 weights on CPUs with AVX-512 BF16: activations rounded
//! to bf16 (round to nearest even, as ggml's `GGML_FP32_TO_BF16`) and multiplied with
//! `vdpbf16ps` (two bf16 products per f32 lane per instruction), as llama.cpp does. The
//! weights are used in place.
//!
//! Activation rows are packed in blocks of [`TB`] rows: for every pair of consecutive
//! elements, the pair of each of the `TB` rows side by side (`u32[k/2][TB]`, zero past the
//! last row; an odd `k` is padded with a zero element).

// Index loops over small constant ranges (accumulators, rows, lanes) say this most plainly.
#![allow(clippy::needless_range_loop)]

use core::arch::x86_64::*;

use super::x86::{for_each_micro, write_acc512};

/// Activation rows per packed block: two 16-lane vectors.
pub(super) const TB: usize = 32;

/// Whether this CPU has the instructions.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
}

/// Whether fast mode takes this GEMM: the instructions are there and the CPU is not an
/// Intel one. Intel's cores issue `vdpbf16ps` once per cycle against two f32 FMAs, so 32
/// products per cycle either way, and the packing makes it slower than the exact f32 GEMM
/// (LFM2-350M BF16 pp512 on a 2-vCPU Xeon guest: 289 against 400 tok/s); AMD's Zen 4 ran it
/// 1.2-1.8× faster than llama.cpp.
pub(super) fn pays() -> bool {
    available() && !super::x86::intel()
}

/// u32 (bf16 pairs) in one packed block for rows of `k` elements.
pub(super) fn block_len(k: usize) -> usize {
    k.div_ceil(2) * TB
}

/// Round `rows` (≤ [`TB`]) activation rows of `k` f32 to bf16 and pack them into one block of
/// [`block_len`] u32.
///
/// # Safety
/// [`available`]; `x` holds `rows·k` f32 and `out` `block_len(k)` u32.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_x(x: *const f32, rows: usize, k: usize, out: *mut u32) {
    let pairs = k.div_ceil(2);
    let mut row = vec![0u16; 2 * pairs];
    for t in 0..TB {
        if t >= rows {
            for p in 0..pairs {
                *out.add(p * TB + t) = 0;
            }
            continue;
        }
        let xr = x.add(t * k);
        let mut i = 0;
        while i + 16 <= k {
            let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(xr.add(i)));
            _mm256_storeu_si256(
                row.as_mut_ptr().add(i) as *mut __m256i,
                core::mem::transmute::<__m256bh, __m256i>(h),
            );
            i += 16;
        }
        while i < k {
            row[i] = bf16_rne(*xr.add(i));
            i += 1;
        }
        if k % 2 == 1 {
            row[k] = 0;
        }
        for p in 0..pairs {
            *out.add(p * TB + t) = u32::from(row[2 * p]) | (u32::from(row[2 * p + 1]) << 16);
        }
    }
}

/// f32 → bf16, round to nearest even (NaN stays NaN).
fn bf16_rne(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// BF16 weight rows and packed activation blocks, for [`gemm`].
pub(super) struct Bf16GemmArgs {
    /// `rows` rows of `k` bf16, `w_stride` bytes apart.
    pub w: *const u8,
    pub w_stride: usize,
    pub rows: usize,
    /// Packed activation blocks, [`block_len`] u32 apart.
    pub x: *const u32,
    pub n: usize,
    pub k: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// Weight rows per micro-kernel.
const R: usize = 12;

#[inline(always)]
unsafe fn micro<const NV: usize>(g: &Bf16GemmArgs, r0: usize, t0: usize) {
    let xb = g.x.add((t0 / TB) * block_len(g.k));
    let w: [*const u8; R] =
        core::array::from_fn(|r| g.w.add((r0 + r).min(g.rows - 1) * g.w_stride));
    let full = g.k / 2;
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for p in 0..full {
        let xv: [__m512bh; NV] = core::array::from_fn(|v| {
            core::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                xb.add(p * TB + 16 * v) as *const _
            ))
        });
        for r in 0..R {
            let b = core::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                (w[r].add(4 * p) as *const i32).read_unaligned(),
            ));
            for v in 0..NV {
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], b, xv[v]);
            }
        }
    }
    if g.k % 2 == 1 {
        // The last element: its pair's second half is zero on the activation side.
        let p = full;
        let xv: [__m512bh; NV] = core::array::from_fn(|v| {
            core::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                xb.add(p * TB + 16 * v) as *const _
            ))
        });
        for r in 0..R {
            let lo = u16::from_le_bytes([*w[r].add(4 * p), *w[r].add(4 * p + 1)]);
            let b = core::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(i32::from(lo)));
            for v in 0..NV {
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], b, xv[v]);
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

/// Every (row, activation row) pair of a [`Bf16GemmArgs`].
///
/// # Safety
/// [`available`]; every pointer valid for what it describes; `rows ≥ 1`, `n ≥ 1`; the outputs
/// written belong to the caller alone.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn gemm(g: &Bf16GemmArgs) {
    for_each_micro(g.n, g.rows, R, TB / 2, |r0, t0, one| {
        if one {
            micro::<1>(g, r0, t0);
        } else {
            micro::<2>(g, r0, t0);
        }
    });
}
