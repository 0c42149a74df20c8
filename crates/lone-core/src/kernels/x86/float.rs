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

#[inline(always)]
pub(in crate::kernels) unsafe fn float_rows_n<
    V: F32X,
    W: FloatW,
    const NX: usize,
    const ONE_ROW_PREFETCH: bool,
>(
    a: &MatArgs,
) {
    let l = V::LANES;
    let k = a.k;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        let mut i = 0;
        while i + 4 * l <= k {
            if NX >= 2 || ONE_ROW_PREFETCH {
                // With several activation rows the core is busy multiplying and the hardware
                // prefetcher alone falls behind: prefetch each cache line of this step.
                let mut o = 0;
                while o < 4 * l * W::EB {
                    // A hint only: past the end of the rows it fetches nothing.
                    let ahead = w.wrapping_add(i * W::EB + o + FLOAT_PREFETCH);
                    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                    o += 64;
                }
            }
            for u in 0..4 {
                let wv: V = W::load(w.add((i + u * l) * W::EB));
                for t in 0..NX {
                    acc[t][u] = V::fma(wv, V::load(xs[t].add(i + u * l)), acc[t][u]);
                }
            }
            i += 4 * l;
        }
        while i + l <= k {
            let wv: V = W::load(w.add(i * W::EB));
            for t in 0..NX {
                acc[t][0] = V::fma(wv, V::load(xs[t].add(i)), acc[t][0]);
            }
            i += l;
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            let mut s = s.hsum();
            for j in i..k {
                s += W::scalar(w.add(j * W::EB)) * *xs[t].add(j);
            }
            *a.out.add(t * a.out_stride + r) = s;
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
