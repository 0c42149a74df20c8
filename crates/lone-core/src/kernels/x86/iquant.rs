//! Exact kernels for the non-linear 4-bit formats IQ4_NL and IQ4_XS (f32 activations).
//!
//! Each 4-bit index selects one of 16 signed levels (`kvalues_iq4nl`, all within an i8), so a
//! group of 32 elements decodes with one byte shuffle (`vpshufb`) of the levels by the index
//! nibbles: the levels as bytes, which widen to f32 exactly. The reference's weights are
//! `d·kv` (IQ4_NL) and `dl·kv` with `dl = d·(ls − 32)` (IQ4_XS), one f32 multiply each, so
//! multiplying the widened levels by the same f32 scale gives them bit for bit. The AVX-512
//! level instead computes the 16 weights a (sub-)block can take (`kv·d` in one register) and
//! looks each element up with `vpermps`, which reads only the low 4 bits of each index, as
//! the other 4-bit formats' AVX-512 kernels do.

#![allow(clippy::needless_range_loop)]

use super::*;

/// IQ4_NL blocks (18 bytes: f16 `d`, 16 bytes of index pairs).
pub(in crate::kernels) struct WIQ4NL;

/// The 16 levels as bytes, in each 128-bit lane.
#[inline(always)]
unsafe fn levels128() -> __m128i {
    _mm_loadu_si128(rb::KVALUES_IQ4NL.as_ptr() as *const __m128i)
}

/// The 16 levels as f32 lanes.
#[inline(always)]
unsafe fn levels512() -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(levels128()))
}

/// The levels of a group of 32 elements stored in the 16 bytes at `p`: elements 0..16 (the
/// low nibbles) and 16..32 (the high ones), as signed bytes.
#[inline(always)]
pub(in crate::kernels) unsafe fn group_levels(p: *const u8) -> [__m128i; 2] {
    let q = _mm_loadu_si128(p as *const __m128i);
    let m4 = _mm_set1_epi8(0x0f);
    let kv = levels128();
    [
        _mm_shuffle_epi8(kv, _mm_and_si128(q, m4)),
        _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4)),
    ]
}

/// 16 signed bytes as two vectors of 8 i32 lanes.
#[inline(always)]
unsafe fn widen16(v: __m128i) -> [__m256i; 2] {
    [
        _mm256_cvtepi8_epi32(v),
        _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)),
    ]
}

/// IQ4_NL for the rows-by-8 8-bit kernels (`packed_rows`, the VNNI levels): the levels as
/// unsigned codes `kv + 128` (one `vpshufb` of the index nibbles, as Q4_0's nibbles are its
/// codes) with `−128·d` as the min, against Q8_1 activations and their block sums. Codes reach
/// 241: only a dot product without i16 saturation (`vpdpbusd`) may take them.
pub(in crate::kernels) struct WIQ4NLU;

/// The 16 levels plus 128 as unsigned bytes, in each 128-bit lane.
#[inline(always)]
unsafe fn levels_u8() -> __m256i {
    _mm256_xor_si256(
        _mm256_broadcastsi128_si256(levels128()),
        _mm256_set1_epi8(-128),
    )
}

impl LegacyW for WIQ4NLU {
    const ZERO: f32 = -128.0;
    const BB: usize = 18;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let d = f16_at(p);
        let q = nibbles32(p.add(2));
        (_mm256_shuffle_epi8(levels_u8(), q), d, -128.0 * d)
    }
}

impl PackW for WIQ4NLU {
    const F16S: usize = 1;
    const QH: bool = false;
    const LUT: bool = true;
    #[inline(always)]
    unsafe fn lut() -> __m256i {
        levels_u8()
    }
}

impl LegacyW for WIQ4NL {
    const BB: usize = 18;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> (__m256i, f32, f32) {
        let [lo, hi] = group_levels(p.add(2));
        (_mm256_set_m128i(hi, lo), f16_at(p), 0.0)
    }
}

impl FacW for WIQ4NL {
    const BB: usize = 18;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> [__m256i; 4] {
        let [lo, hi] = group_levels(p.add(2));
        let [a, b] = widen16(lo);
        let [c, d] = widen16(hi);
        [a, b, c, d]
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (f32, f32) {
        (f16_at(p), 0.0)
    }
}

impl Leg512 for WIQ4NL {
    const BB: usize = 18;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let table = _mm512_mul_ps(levels512(), _mm512_set1_ps(f16_at(p)));
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(2) as *const __m128i));
        [
            _mm512_permutexvar_ps(raw, table),
            _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table),
        ]
    }
}

/// IQ4_XS super-blocks (136 bytes: f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128 bytes of
/// index pairs, 16 per sub-block of 32).
pub(in crate::kernels) struct XIQ4XS;

/// The 8 sub-block scales `dl = d·(ls − 32)` of the IQ4_XS super-block at `p`, as the
/// reference computes them (the 6-bit `ls`: nibble `ib % 2` of `scales_l[ib / 2]`, bits
/// `2·ib..2·ib + 2` of `scales_h` above it).
#[inline(always)]
pub(in crate::kernels) unsafe fn iq4xs_scales(p: *const u8) -> [f32; 8] {
    let d = f16_at(p);
    let h = u16::from_le_bytes([*p.add(2), *p.add(3)]);
    core::array::from_fn(|ib| {
        let lo = (*p.add(4 + ib / 2) >> (4 * (ib % 2))) & 0x0f;
        let hi = ((h >> (2 * ib)) & 3) as u8;
        d * (i32::from(lo | (hi << 4)) - 32) as f32
    })
}

/// IQ4_XS: each 32-element sub-block's levels with its scale `ls − 32` ([`SbW`]: the 8-bit
/// kernels against Q8_K; as [`LegacyW`], `dl = d·(ls − 32)`, the generic exact kernels' and
/// the 8-bit GEMM's).
pub(in crate::kernels) struct WIQ4XS;

legacy_via_sb!(WIQ4XS, 17);

impl KExactW for XIQ4XS {
    const BB: usize = 136;
    const GROUP: usize = 32;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], _ms: &mut [f32; 16]) {
        ds[..8].copy_from_slice(&iq4xs_scales(p));
        for ib in 0..8 {
            let [lo, hi] = group_levels(p.add(8 + 16 * ib));
            _mm_storeu_si128(q.as_mut_ptr().add(32 * ib) as *mut __m128i, lo);
            _mm_storeu_si128(q.as_mut_ptr().add(32 * ib + 16) as *mut __m128i, hi);
        }
    }
}

/// AVX2 exact IQ4_XS, factored: per sub-block of 32, `dl·Σ kv·x` (the reference's `dl·kv`
/// weights; the levels widened to f32 are exact, only the order of the rounding differs).
#[inline(always)]
pub(in crate::kernels) unsafe fn fac_iq4xs_rows_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm256_setzero_ps(); 2]; NX];
        for b in 0..nb {
            let wb = w.add(b * 136);
            for l in 0..3 {
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let dl = iq4xs_scales(wb);
            // Pairs of sub-blocks, one accumulator each (constant indices: registers).
            for ip in 0..4 {
                for h in 0..2 {
                    let ib = 2 * ip + h;
                    let [lo, hi] = group_levels(wb.add(8 + 16 * ib));
                    let [q0, q1] = widen16(lo);
                    let [q2, q3] = widen16(hi);
                    let qf = [q0, q1, q2, q3].map(|q| _mm256_cvtepi32_ps(q));
                    let dv = _mm256_set1_ps(dl[ib]);
                    for t in 0..NX {
                        let x = xs[t].add(b * 256 + 32 * ib);
                        acc[t][h] = _mm256_fmadd_ps(qdot(&qf, x), dv, acc[t][h]);
                    }
                }
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = hsum256(_mm256_add_ps(acc[t][0], acc[t][1]));
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn fac_iq4xs(a: &MatArgs) {
    by_nx!(a, fac_iq4xs_rows_n)
}

/// The 32 weights of IQ4_XS sub-block `ib` of the super-block at `p` with scale `dl`, as two
/// 16-lane registers: table lookups of `kv·dl`.
#[inline(always)]
unsafe fn iq4xs_sub512(p: *const u8, ib: usize, dl: f32) -> [__m512; 2] {
    let table = _mm512_mul_ps(levels512(), _mm512_set1_ps(dl));
    let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(8 + 16 * ib) as *const __m128i));
    [
        _mm512_permutexvar_ps(raw, table),
        _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table),
    ]
}

/// AVX-512 exact IQ4_XS: per sub-block, the 16 weights it can take computed once (`kv·dl`,
/// the reference's f32 product) and looked up per element; 4 accumulator chains.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_iq4xs_512_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let wb = w.add(b * 136);
            for l in 0..3 {
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let dl = iq4xs_scales(wb);
            for ip in 0..4 {
                for e in 0..2 {
                    let ib = 2 * ip + e;
                    let wv = iq4xs_sub512(wb, ib, dl[ib]);
                    for h in 0..2 {
                        let j = b * 256 + 32 * ib + 16 * h;
                        for t in 0..NX {
                            acc[t][2 * e + h] = _mm512_fmadd_ps(
                                wv[h],
                                _mm512_loadu_ps(xs[t].add(j)),
                                acc[t][2 * e + h],
                            );
                        }
                    }
                }
            }
        }
        for t in 0..NX {
            let s01 = _mm512_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm512_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = V16(_mm512_add_ps(s01, s23)).hsum();
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn exact_iq4xs_512(a: &MatArgs) {
    by_nx!(a, exact_iq4xs_512_n)
}

/// IQ4_XS rows to f32 at the AVX-512 level (the f32 GEMM's dequantizer): the lookups above.
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_iq4xs_512(src: *const u8, dst: *mut f32, k: usize) {
    for b in 0..k / 256 {
        let p = src.add(b * 136);
        let dl = iq4xs_scales(p);
        for ib in 0..8 {
            let [lo, hi] = iq4xs_sub512(p, ib, dl[ib]);
            _mm512_storeu_ps(dst.add(b * 256 + 32 * ib), lo);
            _mm512_storeu_ps(dst.add(b * 256 + 32 * ib + 16), hi);
        }
    }
}

/// IQ4_XS rows to f32 at the AVX2 level: the levels widened and scaled by `dl`.
#[inline(always)]
pub(in crate::kernels) unsafe fn deq_iq4xs_v8(src: *const u8, dst: *mut f32, k: usize) {
    for b in 0..k / 256 {
        let p = src.add(b * 136);
        let dl = iq4xs_scales(p);
        for ib in 0..8 {
            let dv = _mm256_set1_ps(dl[ib]);
            let [lo, hi] = group_levels(p.add(8 + 16 * ib));
            let [q0, q1] = widen16(lo);
            let [q2, q3] = widen16(hi);
            for (v, q) in [q0, q1, q2, q3].into_iter().enumerate() {
                let wv = _mm256_mul_ps(_mm256_cvtepi32_ps(q), dv);
                _mm256_storeu_ps(dst.add(b * 256 + 32 * ib + 8 * v), wv);
            }
        }
    }
}
