//! F32/F16/BF16 weights against f32 activations.

#![allow(clippy::needless_range_loop)]

use super::*;

/// How a plain float weight format loads `V::LANES` elements.
pub(in crate::kernels) trait FloatW {
    const EB: usize;
    unsafe fn load<V: F32X>(p: *const u8) -> V;
    unsafe fn scalar(p: *const u8) -> f32;
}
pub(in crate::kernels) struct WF32;
pub(in crate::kernels) struct WF16;
pub(in crate::kernels) struct WBF16;
impl FloatW for WF32 {
    const EB: usize = 4;
    #[inline(always)]
    unsafe fn load<V: F32X>(p: *const u8) -> V {
        V::load(p as *const f32)
    }
    #[inline(always)]
    unsafe fn scalar(p: *const u8) -> f32 {
        f32_at(p)
    }
}
impl FloatW for WF16 {
    const EB: usize = 2;
    #[inline(always)]
    unsafe fn load<V: F32X>(p: *const u8) -> V {
        V::load_f16(p)
    }
    #[inline(always)]
    unsafe fn scalar(p: *const u8) -> f32 {
        f16_at(p)
    }
}
impl FloatW for WBF16 {
    const EB: usize = 2;
    #[inline(always)]
    unsafe fn load<V: F32X>(p: *const u8) -> V {
        V::load_bf16(p)
    }
    #[inline(always)]
    unsafe fn scalar(p: *const u8) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([*p, *p.add(1)])) << 16)
    }
}

/// How far ahead [`float_rows_n`] prefetches the weight rows with several activation rows.
/// Decode verify passes of an F16 SmolLM2-135M (4 rows, `lone run --model-draft`): 22–23 ms
/// without, 19–20 ms at 1–4 KiB. With one row it depends on the CPU's own prefetcher: on AMD
/// Zen 4 it keeps up and the prefetches cost 15 % (12–13 against 14–16 ms per token); on an
/// Intel Xeon they gain 19 % (Qwen2.5-0.5B F16 decode 18.8–19.2 → 22.5–22.7 tok/s), so Intel
/// CPUs prefetch for one row too ([`super::intel`]).
const FLOAT_PREFETCH: usize = 2048;

/// Every row of `a`: each output is ONE vector accumulator over `k` (lane `j` sums the
/// products at `k ≡ j` modulo the lanes, in order), horizontally summed, then the scalar tail.
/// That chain does not depend on how many weight rows or activation rows share a step, so a
/// row's result is the same alone or among any number of rows (the default mode multiplies
/// prompt rows with these kernels too), and several weight rows per step give the
/// independent chains that keep the FMA units busy: 4 weight rows × `NX` activation rows,
/// each weight vector loaded once for the `NX` rows and each activation vector once for the
/// 4 weight rows (2 weight rows for 3-4 activation rows on 256-bit registers, which hold 16).
#[inline(always)]
pub(in crate::kernels) unsafe fn float_rows_n<
    V: F32X,
    W: FloatW,
    const NX: usize,
    const ONE_ROW_PREFETCH: bool,
>(
    a: &MatArgs,
) {
    let mut r = 0;
    if V::LANES >= 16 || NX <= 2 {
        while r + 4 <= a.rows {
            float_group::<V, W, NX, 4, ONE_ROW_PREFETCH>(a, r);
            r += 4;
        }
    }
    while r + 2 <= a.rows {
        float_group::<V, W, NX, 2, ONE_ROW_PREFETCH>(a, r);
        r += 2;
    }
    while r < a.rows {
        float_group::<V, W, NX, 1, ONE_ROW_PREFETCH>(a, r);
        r += 1;
    }
}

/// Weight rows `r0..r0 + R` of `a` against its `NX` activation rows ([`float_rows_n`]).
#[inline(always)]
unsafe fn float_group<
    V: F32X,
    W: FloatW,
    const NX: usize,
    const R: usize,
    const ONE_ROW_PREFETCH: bool,
>(
    a: &MatArgs,
    r0: usize,
) {
    let l = V::LANES;
    let k = a.k;
    let ws: [*const u8; R] = core::array::from_fn(|j| a.w.add((r0 + j) * a.w_stride));
    let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
    let mut acc = [[V::zero(); NX]; R];
    let mut i = 0;
    while i + l <= k {
        if (NX >= 2 || ONE_ROW_PREFETCH) && (i * W::EB) % 64 == 0 {
            // With several activation rows the core is busy multiplying and the hardware
            // prefetcher alone falls behind: prefetch each row's cache lines ahead, the
            // group's R rows FLOAT_PREFETCH bytes ahead together: each row its share, past
            // its end the same row of the next group (the next rows are this group's).
            let d = i * W::EB + FLOAT_PREFETCH / R;
            let row_bytes = k * W::EB;
            let next = if d < row_bytes {
                d
            } else {
                R * a.w_stride + d - row_bytes
            };
            for w in ws {
                // A hint only: past the end of the rows it fetches nothing.
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(next) as *const i8);
            }
        }
        let xv: [V; NX] = core::array::from_fn(|t| V::load(xs[t].add(i)));
        for j in 0..R {
            let wv: V = W::load(ws[j].add(i * W::EB));
            for t in 0..NX {
                acc[j][t] = V::fma(wv, xv[t], acc[j][t]);
            }
        }
        i += l;
    }
    for j in 0..R {
        for t in 0..NX {
            let mut s = acc[j][t].hsum();
            for e in i..k {
                s += W::scalar(ws[j].add(e * W::EB)) * *xs[t].add(e);
            }
            *a.out.add(t * a.out_stride + r0 + j) = s;
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn float_rows<V: F32X, W: FloatW>(a: &MatArgs) {
    if a.nx == 1 && super::intel() {
        float_rows_n::<V, W, 1, true>(a)
    } else {
        by_nx!(a, float_rows_n, V, W; false)
    }
}

/// F16/BF16 weights in [`super::super::packed`]'s rows-by-8 layout (element `i` of a group's
/// 8 rows side by side) against `NX` f32 activation rows: each output is ONE FMA chain over
/// `i = 0..k` in order from zero, `acc = fma(w[r, i], x[t, i], acc)` on the exactly widened
/// weight — the f32 GEMM's chain ([`gemm_micro`], [`gemm_narrow_n`]) — so a row's output is
/// the same whether the GEMM or this kernel takes it, alone or among any number of rows: the
/// default mode lets the GEMM take its many-row steps. 8 rows a vector (rows in lanes: no
/// horizontal sums); the matrix-vector driver hands it `CHAIN_TILE_ROWS`
/// rows a call, so that one activation row has 8 groups' independent chains.
/// Rows past the last whole group (stored as they were) take the same chain one element at a
/// time.
#[inline(always)]
pub(in crate::kernels) unsafe fn float_rows8_n<W: FloatW, const NX: usize>(a: &MatArgs) {
    let groups = a.rows / 8;
    let gb = 8 * a.w_stride;
    let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
    // Groups side by side: 8 independent chains where the registers allow (the FMA's
    // latency, not the memory, bounds one chain per activation row).
    let mut g = 0;
    while g < groups {
        let left = groups - g;
        g += if NX == 1 && left >= 8 {
            float_groups8::<W, NX, 8>(a, g, gb, &xs);
            8
        } else if NX <= 2 && left >= 4 {
            float_groups8::<W, NX, 4>(a, g, gb, &xs);
            4
        } else if left >= 2 {
            float_groups8::<W, NX, 2>(a, g, gb, &xs);
            2
        } else {
            float_groups8::<W, NX, 1>(a, g, gb, &xs);
            1
        };
    }
    for r in groups * 8..a.rows {
        let w = a.w.add(r * a.w_stride);
        for t in 0..NX {
            let mut acc = 0.0f32;
            for i in 0..a.k {
                acc = W::scalar(w.add(i * W::EB)).mul_add(*xs[t].add(i), acc);
            }
            *a.out.add(t * a.out_stride + r) = acc;
        }
    }
}

/// How far ahead [`float_groups8`] prefetches each group's stream of the weights.
const CHAIN_PREFETCH: usize = 1024;

/// Groups `g..g + G` of 8 packed rows of `a` ([`float_rows8_n`]).
#[inline(always)]
unsafe fn float_groups8<W: FloatW, const NX: usize, const G: usize>(
    a: &MatArgs,
    g: usize,
    gb: usize,
    xs: &[*const f32; NX],
) {
    let ws: [*const u8; G] = core::array::from_fn(|j| a.w.add((g + j) * gb));
    let eb = 8 * W::EB;
    let mut acc = [[_mm256_setzero_ps(); NX]; G];
    for i in 0..a.k {
        if i % 4 == 0 {
            // Each group's stream CHAIN_PREFETCH bytes ahead (a hint: past the end of the
            // rows it fetches nothing).
            for w in ws {
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(i * eb + CHAIN_PREFETCH) as *const i8);
            }
        }
        let xv: [__m256; NX] = core::array::from_fn(|t| _mm256_set1_ps(*xs[t].add(i)));
        for j in 0..G {
            let w: V8 = W::load(ws[j].add(i * eb));
            for t in 0..NX {
                acc[j][t] = _mm256_fmadd_ps(w.0, xv[t], acc[j][t]);
            }
        }
    }
    for j in 0..G {
        for t in 0..NX {
            _mm256_storeu_ps(a.out.add(t * a.out_stride + 8 * (g + j)), acc[j][t]);
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn float_rows8<W: FloatW>(a: &MatArgs) {
    by_nx!(a, float_rows8_n, W)
}

/// One group of 8 rows of `k` F16/BF16 elements in the rows-by-8 layout at `src`, widened to
/// f32 rows `dst_stride` apart at `dst` (the f32 GEMM's tile, read straight from the packed
/// copy): 8 elements of the 8 rows at a time, transposed in registers.
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_rows8<W: FloatW>(
    src: *const u8,
    k: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    let eb = 8 * W::EB;
    let mut i = 0;
    while i + 8 <= k {
        let cols: [__m256; 8] = core::array::from_fn(|c| {
            let v: V8 = W::load(src.add((i + c) * eb));
            v.0
        });
        for (r, v) in transpose8(cols).into_iter().enumerate() {
            _mm256_storeu_ps(dst.add(r * dst_stride + i), v);
        }
        i += 8;
    }
    while i < k {
        for r in 0..8 {
            *dst.add(r * dst_stride + i) = W::scalar(src.add(i * eb + r * W::EB));
        }
        i += 1;
    }
}
