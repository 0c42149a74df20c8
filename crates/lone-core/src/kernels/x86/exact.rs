//! Exact quantized kernels: weights dequantized bit-exactly in registers, f32 activations (legacy formats and K-quants, table lookups at the AVX-512 level).

#![allow(clippy::needless_range_loop)]

use super::*;

/// Quantized weights against f32 activations: each block is dequantized bit-exactly (the
/// reference dequantizer, inlined and vectorised here) into a stack buffer, then FMA'd with
/// every activation row.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_rows_n<
    V: F32X,
    const BB: usize,
    const BS: usize,
    const NX: usize,
>(
    a: &MatArgs,
    deq: impl Fn(&[u8; BB], &mut [f32; BS]),
) {
    let l = V::LANES;
    let nb = a.k / BS;
    let mut buf = Aligned::<BS>([0.0; BS]);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        for b in 0..nb {
            deq(&*(w.add(b * BB) as *const [u8; BB]), &mut buf.0);
            let mut u = 0;
            let mut i = 0;
            while i < BS {
                let wv = V::load(buf.0.as_ptr().add(i));
                for t in 0..NX {
                    acc[t][u] = V::fma(wv, V::load(xs[t].add(b * BS + i)), acc[t][u]);
                }
                u = (u + 1) & 3;
                i += l;
            }
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            *a.out.add(t * a.out_stride + r) = s.hsum();
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn exact_rows<V: F32X, const BB: usize, const BS: usize>(
    a: &MatArgs,
    deq: impl Fn(&[u8; BB], &mut [f32; BS]) + Copy,
) {
    match a.nx {
        1 => exact_rows_n::<V, BB, BS, 1>(a, deq),
        2 => exact_rows_n::<V, BB, BS, 2>(a, deq),
        3 => exact_rows_n::<V, BB, BS, 3>(a, deq),
        _ => exact_rows_n::<V, BB, BS, 4>(a, deq),
    }
}

/// Exact mode for the 32-element formats (and the sub-blocks of the codebook i-quants),
/// fully in SIMD: the block's quants are decoded to bytes (as the integer kernels do),
/// widened to f32 and scaled exactly as the reference dequantizer does (`q·d`, or `q·d + m`
/// as a separate multiply and add: bit-identical weights), then FMA'd with every f32
/// activation row.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_legacy_rows_n<V: F32X, W: LegacyW, const NX: usize>(
    a: &MatArgs,
) {
    let l = V::LANES;
    let nb = a.k / 32;
    let mut qb = [0i8; 32];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        for b in 0..nb {
            if b % 2 == 0 {
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(b * W::BB + PREFETCH) as *const i8);
            }
            let (q, d0, d1, m) = W::decode_split(w, b);
            _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, q);
            let (dv0, dv1, mv) = (V::splat(d0), V::splat(d1), V::splat(m));
            let mut j = 0;
            while j < 32 {
                let dv = if j < 16 { dv0 } else { dv1 };
                let mut wv = V::mul(V::from_i8(qb.as_ptr().add(j)), dv);
                if !W::SIGNED {
                    wv = V::add(wv, mv);
                }
                let u = (j / l) & 3;
                for t in 0..NX {
                    acc[t][u] = V::fma(wv, V::load(xs[t].add(b * 32 + j)), acc[t][u]);
                }
                j += l;
            }
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            *a.out.add(t * a.out_stride + r) = s.hsum();
        }
    }
}

/// The AVX2 level's exact legacy kernels.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_legacy8<W: LegacyW>(a: &MatArgs) {
    exact_legacy_rows::<V8, W>(a)
}

#[inline(always)]
pub(in crate::kernels) unsafe fn exact_legacy_rows<V: F32X, W: LegacyW>(a: &MatArgs) {
    by_nx!(a, exact_legacy_rows_n, V, W)
}

// ------------------------------------------------------------------ exact K-quants

/// A 256-element K-quant super-block decoded for the exact kernels: its quants as bytes
/// (each fits an i8) and, per group of `GROUP` elements, the f32 scale `ds` (and min `ms`)
/// computed exactly as the reference dequantizer computes them, so that `q·ds - ms`
/// (`HAS_MIN`) or `q·ds` reproduces the reference weights bit for bit.
pub(in crate::kernels) trait KExactW {
    const BB: usize;
    const GROUP: usize;
    const HAS_MIN: bool;
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], ms: &mut [f32; 16]);
}
pub(in crate::kernels) struct XQ4K;
pub(in crate::kernels) struct XQ5K;
pub(in crate::kernels) struct XQ6K;

/// Q4_K/Q5_K sub-block scales and mins: `d·sc` and `dmin·m` (the reference's `d1`, `m1`),
/// into `ds[..8]` and `ms[..8]`. The 12 packed bytes are unpacked as ggml does (8 six-bit
/// scales, then 8 six-bit mins; the same values as `scale_min_k4`), then widened and scaled
/// in SIMD: one f32 multiply each, as in the reference.
#[inline(always)]
pub(in crate::kernels) unsafe fn k4_scales(p: *const u8, ds: &mut [f32; 16], ms: &mut [f32; 16]) {
    let d = f16_at(p);
    let dmin = f16_at(p.add(2));
    let (sc, m) = k4_scale_bytes(p.add(4));
    let widen = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
    _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(d), widen(sc)));
    _mm256_storeu_ps(
        ms.as_mut_ptr(),
        _mm256_mul_ps(_mm256_set1_ps(dmin), widen(m)),
    );
}

/// Q4_K/Q5_K quants: 32-byte chunk `i` of `qs` holds sub-block 2i (low nibbles) and 2i+1
/// (high nibbles); Q5_K's bit 4 of element l of sub-block s is bit s of `qh[l]`.
#[inline(always)]
pub(in crate::kernels) unsafe fn k45_quants<const FIVE: bool>(p: *const u8, q: &mut [i8; 256]) {
    let qs_off = if FIVE { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let qh = if FIVE {
        _mm256_loadu_si256(p.add(16) as *const __m256i)
    } else {
        _mm256_setzero_si256()
    };
    for i in 0..4 {
        let v = _mm256_loadu_si256(p.add(qs_off + 32 * i) as *const __m256i);
        let mut lo = _mm256_and_si256(v, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if FIVE {
            let s0 = _mm_cvtsi32_si128(2 * i as i32);
            let s1 = _mm_cvtsi32_si128(2 * i as i32 + 1);
            let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, s0), one);
            let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, s1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
        }
        _mm256_storeu_si256(q.as_mut_ptr().add(64 * i) as *mut __m256i, lo);
        _mm256_storeu_si256(q.as_mut_ptr().add(64 * i + 32) as *mut __m256i, hi);
    }
}

impl KExactW for XQ4K {
    const BB: usize = 144;
    const GROUP: usize = 32;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], ms: &mut [f32; 16]) {
        k4_scales(p, ds, ms);
        k45_quants::<false>(p, q);
    }
}
impl KExactW for XQ5K {
    const BB: usize = 176;
    const GROUP: usize = 32;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], ms: &mut [f32; 16]) {
        k4_scales(p, ds, ms);
        k45_quants::<true>(p, q);
    }
}
impl KExactW for XQ6K {
    const BB: usize = 210;
    const GROUP: usize = 16;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8, q: &mut [i8; 256], ds: &mut [f32; 16], _ms: &mut [f32; 16]) {
        // The reference: d * sc * q, left to right, so (d·sc) first.
        let d = _mm256_set1_ps(f16_at(p.add(208)));
        let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)));
        _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(d, lo));
        _mm256_storeu_ps(ds.as_mut_ptr().add(8), _mm256_mul_ps(d, hi));
        let m4 = _mm256_set1_epi8(0x0f);
        let m3 = _mm256_set1_epi8(3);
        let off = _mm256_set1_epi8(32);
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            let v = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4),
                ),
            ];
            for (rq, &qv) in v.iter().enumerate() {
                _mm256_storeu_si256(
                    q.as_mut_ptr().add(128 * h + 32 * rq) as *mut __m256i,
                    _mm256_sub_epi8(qv, off),
                );
            }
        }
    }
}

/// Exact mode for Q4_K, Q5_K and Q6_K in SIMD: each super-block's scales are decoded once,
/// its quants unpacked to bytes, widened to f32 and scaled as the reference does (a multiply,
/// then for Q4_K/Q5_K a separate subtract: bit-identical weights), then FMA'd with every f32
/// activation row.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_k_rows_n<V: F32X, W: KExactW, const NX: usize>(a: &MatArgs) {
    let l = V::LANES;
    let nb = a.k / 256;
    let mut qb = [0i8; 256];
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[V::zero(); 4]; NX];
        for b in 0..nb {
            for l in 0..W::BB.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(
                    w.wrapping_add(b * W::BB + PREFETCH + 64 * l) as *const i8
                );
            }
            W::decode(w.add(b * W::BB), &mut qb, &mut ds, &mut ms);
            for g in 0..256 / W::GROUP {
                let dv = V::splat(ds[g]);
                let mv = V::splat(ms[g]);
                let mut j = g * W::GROUP;
                while j < (g + 1) * W::GROUP {
                    let mut wv = V::mul(V::from_i8(qb.as_ptr().add(j)), dv);
                    if W::HAS_MIN {
                        wv = V::sub(wv, mv);
                    }
                    let u = (j / l) & 3;
                    for t in 0..NX {
                        acc[t][u] = V::fma(wv, V::load(xs[t].add(b * 256 + j)), acc[t][u]);
                    }
                    j += l;
                }
            }
        }
        for t in 0..NX {
            let s = V::add(V::add(acc[t][0], acc[t][1]), V::add(acc[t][2], acc[t][3]));
            *a.out.add(t * a.out_stride + r) = s.hsum();
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn exact_k_rows<V: F32X, W: KExactW>(a: &MatArgs) {
    by_nx!(a, exact_k_rows_n, V, W)
}

/// How far ahead (bytes) the kernels prefetch the weight stream (LFM2-350M decode on the AMD
/// dev machine: 4 KiB beat 1, 2 and 8 KiB by 2–5 %; on a 2-vCPU Xeon guest 8 KiB looked 0–8 %
/// faster for Q8_0/Q4_0, within its noise, and a distance read at run time cost 25 %).
pub(in crate::kernels) const PREFETCH: usize = 4096;

/// AVX-512 exact Q4_K, as [`exact_k45_lut_n`] but straight from the packed bytes: `vpermps`
/// reads only the low 4 bits of each index, so the zero-extended `qs` bytes index the low
/// nibbles as they are, and shifted right by 4 the high nibbles.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_q4k_lut_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    let iota = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let wb = w.add(b * 144);
            _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 128) as *const i8);
            k4_scales(wb, &mut ds, &mut ms);
            for i in 0..4 {
                let raw: [__m512i; 2] = core::array::from_fn(|h| {
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        wb.add(16 + 32 * i + 16 * h) as *const __m128i
                    ))
                });
                for hi in 0..2 {
                    let s = 2 * i + hi;
                    let table = _mm512_sub_ps(
                        _mm512_mul_ps(iota, _mm512_set1_ps(ds[s])),
                        _mm512_set1_ps(ms[s]),
                    );
                    for h in 0..2 {
                        let idx = if hi == 1 {
                            _mm512_srli_epi32(raw[h], 4)
                        } else {
                            raw[h]
                        };
                        let wv = _mm512_permutexvar_ps(idx, table);
                        let j = 32 * s + 16 * h;
                        let u = 2 * hi + h;
                        for t in 0..NX {
                            acc[t][u] = _mm512_fmadd_ps(
                                wv,
                                _mm512_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][u],
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
pub(in crate::kernels) unsafe fn exact_q4k_lut(a: &MatArgs) {
    by_nx!(a, exact_q4k_lut_n)
}

/// A 32-element block's bit-exact weights, as two 16-lane registers, for the AVX-512 exact
/// kernels. The 4- and 5-bit formats take only 16 or 32 distinct values per block: they are
/// computed once with the reference's operations (`(q - 8)·d`, `q·d + m`, `(q - 16)·d`; a
/// separate multiply and add, so bit-identical) into one or two registers and looked up per
/// element with `vpermps`/`vpermt2ps`, which read only the low 4/5 bits of each index: the
/// zero-extended packed bytes index the low nibbles as they are, the high nibbles shifted
/// right by 4, and Q5's fifth bit is or-ed in under a mask made from `qh`.
pub(in crate::kernels) trait Leg512 {
    const BB: usize;
    unsafe fn weights(p: *const u8) -> [__m512; 2];
}
impl Leg512 for WQ4_0 {
    const BB: usize = 18;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let table = _mm512_mul_ps(
            _mm512_sub_ps(iota16(), _mm512_set1_ps(8.0)),
            _mm512_set1_ps(f16_at(p)),
        );
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(2) as *const __m128i));
        [
            _mm512_permutexvar_ps(raw, table),
            _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table),
        ]
    }
}
impl Leg512 for WQ4_1 {
    const BB: usize = 20;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let table = _mm512_add_ps(
            _mm512_mul_ps(iota16(), _mm512_set1_ps(f16_at(p))),
            _mm512_set1_ps(f16_at(p.add(2))),
        );
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(4) as *const __m128i));
        [
            _mm512_permutexvar_ps(raw, table),
            _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table),
        ]
    }
}
/// Q5 indices: low nibbles | bit j of `qh` << 4, high nibbles | bit j+16 << 4.
#[inline(always)]
pub(in crate::kernels) unsafe fn q5_idx(qh: *const u8, qs: *const u8) -> [__m512i; 2] {
    let h = (qh as *const u32).read_unaligned();
    let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs as *const __m128i));
    let lo = _mm512_and_si512(raw, _mm512_set1_epi32(0x0f));
    let hi = _mm512_srli_epi32(raw, 4);
    let b4 = _mm512_set1_epi32(0x10);
    [
        _mm512_mask_or_epi32(lo, h as u16, lo, b4),
        _mm512_mask_or_epi32(hi, (h >> 16) as u16, hi, b4),
    ]
}
impl Leg512 for WQ5_0 {
    const BB: usize = 22;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let d = _mm512_set1_ps(f16_at(p));
        let t0 = _mm512_mul_ps(_mm512_sub_ps(iota16(), _mm512_set1_ps(16.0)), d);
        let t1 = _mm512_mul_ps(iota16(), d);
        let idx = q5_idx(p.add(2), p.add(6));
        [
            _mm512_permutex2var_ps(t0, idx[0], t1),
            _mm512_permutex2var_ps(t0, idx[1], t1),
        ]
    }
}
impl Leg512 for WQ5_1 {
    const BB: usize = 24;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let d = _mm512_set1_ps(f16_at(p));
        let m = _mm512_set1_ps(f16_at(p.add(2)));
        let t0 = _mm512_add_ps(_mm512_mul_ps(iota16(), d), m);
        let t1 = _mm512_add_ps(
            _mm512_mul_ps(_mm512_add_ps(iota16(), _mm512_set1_ps(16.0)), d),
            m,
        );
        let idx = q5_idx(p.add(4), p.add(8));
        [
            _mm512_permutex2var_ps(t0, idx[0], t1),
            _mm512_permutex2var_ps(t0, idx[1], t1),
        ]
    }
}
impl Leg512 for WQ8_0 {
    const BB: usize = 34;
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> [__m512; 2] {
        let d = _mm512_set1_ps(f16_at(p));
        let q = |o: usize| {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(2 + o) as *const __m128i
            )))
        };
        [_mm512_mul_ps(q(0), d), _mm512_mul_ps(q(16), d)]
    }
}

/// 0.0, 1.0, .., 15.0.
#[inline(always)]
pub(in crate::kernels) unsafe fn iota16() -> __m512 {
    _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    )
}

/// AVX-512 exact mode for the 32-element formats: [`Leg512`] weights FMA'd with every f32
/// activation row, two blocks per step into 4 accumulator chains.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_leg512_n<W: Leg512, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 32;
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        // Two blocks per step, so that the accumulator indices are constants (registers).
        macro_rules! block {
            ($b:expr, $u0:expr) => {{
                let b = $b;
                let wv = W::weights(w.add(b * W::BB));
                for h in 0..2 {
                    for t in 0..NX {
                        acc[t][$u0 + h] = _mm512_fmadd_ps(
                            wv[h],
                            _mm512_loadu_ps(xs[t].add(b * 32 + 16 * h)),
                            acc[t][$u0 + h],
                        );
                    }
                }
            }};
        }
        let mut b = 0;
        while b + 2 <= nb {
            // Two blocks are at most 68 bytes: one line ahead per step keeps up.
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(b * W::BB + PREFETCH) as *const i8);
            block!(b, 0);
            block!(b + 1, 2);
            b += 2;
        }
        if b < nb {
            block!(b, 0);
        }
        for t in 0..NX {
            let s01 = _mm512_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm512_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = V16(_mm512_add_ps(s01, s23)).hsum();
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn exact_leg512<W: Leg512>(a: &MatArgs) {
    by_nx!(a, exact_leg512_n, W)
}

/// AVX-512 exact Q6_K: the quants are unpacked to bytes in registers (32 at a time, as the
/// integer kernel does), widened to f32 16 at a time and multiplied by `d·sc` (the
/// reference's `d * sc * q`, left to right: bit-identical), then FMA'd.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_q6k_512_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let off = _mm256_set1_epi8(32);
    let mut ds = [0f32; 16];
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let p = w.add(b * 210);
            for l in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let d = _mm512_set1_ps(f16_at(p.add(208)));
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(192) as *const __m128i
            )));
            _mm512_storeu_ps(ds.as_mut_ptr(), _mm512_mul_ps(d, sc));
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
                let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4),
                    ),
                ];
                for rq in 0..4 {
                    let v = _mm256_sub_epi8(q[rq], off);
                    for e in 0..2 {
                        let x16 = if e == 0 {
                            _mm256_castsi256_si128(v)
                        } else {
                            _mm256_extracti128_si256(v, 1)
                        };
                        let g = 8 * h + 2 * rq + e;
                        let wv = _mm512_mul_ps(
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x16)),
                            _mm512_set1_ps(ds[g]),
                        );
                        let u = 2 * (rq & 1) + e;
                        let j = 128 * h + 32 * rq + 16 * e;
                        for t in 0..NX {
                            acc[t][u] = _mm512_fmadd_ps(
                                wv,
                                _mm512_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][u],
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
pub(in crate::kernels) unsafe fn exact_q6k_512(a: &MatArgs) {
    by_nx!(a, exact_q6k_512_n)
}

/// AVX-512 exact Q5_K, as [`exact_q4k_lut_n`] with two tables per sub-block (q = 0..32,
/// `vpermt2ps`): the nibble indices get their fifth bit (bit s of `qh[l]` for sub-block s)
/// or-ed in under a mask tested from the zero-extended `qh` bytes.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_q5k_lut_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    let iota0 = iota16();
    let iota1 = _mm512_add_ps(iota0, _mm512_set1_ps(16.0));
    let m4 = _mm512_set1_epi32(0x0f);
    let b4 = _mm512_set1_epi32(0x10);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm512_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let wb = w.add(b * 176);
            for l in 0..3 {
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            k4_scales(wb, &mut ds, &mut ms);
            let qh: [__m512i; 2] = core::array::from_fn(|h| {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(wb.add(16 + 16 * h) as *const __m128i))
            });
            for i in 0..4 {
                let raw: [__m512i; 2] = core::array::from_fn(|h| {
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        wb.add(48 + 32 * i + 16 * h) as *const __m128i
                    ))
                });
                for hi in 0..2 {
                    let s = 2 * i + hi;
                    let dv = _mm512_set1_ps(ds[s]);
                    let mv = _mm512_set1_ps(ms[s]);
                    let t0 = _mm512_sub_ps(_mm512_mul_ps(iota0, dv), mv);
                    let t1 = _mm512_sub_ps(_mm512_mul_ps(iota1, dv), mv);
                    let bit = _mm512_set1_epi32(1 << s);
                    for h in 0..2 {
                        let nib = if hi == 1 {
                            _mm512_srli_epi32(raw[h], 4)
                        } else {
                            _mm512_and_si512(raw[h], m4)
                        };
                        let k = _mm512_test_epi32_mask(qh[h], bit);
                        let idx = _mm512_mask_or_epi32(nib, k, nib, b4);
                        let wv = _mm512_permutex2var_ps(t0, idx, t1);
                        let j = 32 * s + 16 * h;
                        let u = 2 * hi + h;
                        for t in 0..NX {
                            acc[t][u] = _mm512_fmadd_ps(
                                wv,
                                _mm512_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][u],
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
pub(in crate::kernels) unsafe fn exact_q5k_lut(a: &MatArgs) {
    by_nx!(a, exact_q5k_lut_n)
}

/// AVX2 exact Q4_K straight from the packed bytes: 8 zero-extended `qs` bytes at a time give
/// 8 low and 8 high nibbles, each widened to f32 and scaled as the reference does
/// (`d1·q - m1`: a multiply, then a separate subtract), then FMA'd.
#[inline(always)]
pub(in crate::kernels) unsafe fn exact_q4k_v8_n<const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let mut ds = [0f32; 16];
    let mut ms = [0f32; 16];
    let m4 = _mm256_set1_epi32(0x0f);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const f32; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride) as *const f32);
        let mut acc = [[_mm256_setzero_ps(); 4]; NX];
        for b in 0..nb {
            let wb = w.add(b * 144);
            for l in 0..3 {
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            k4_scales(wb, &mut ds, &mut ms);
            for i in 0..4 {
                let d = [_mm256_set1_ps(ds[2 * i]), _mm256_set1_ps(ds[2 * i + 1])];
                let m = [_mm256_set1_ps(ms[2 * i]), _mm256_set1_ps(ms[2 * i + 1])];
                for e in 0..4 {
                    let raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        wb.add(16 + 32 * i + 8 * e) as *const __m128i
                    ));
                    let q = [_mm256_and_si256(raw, m4), _mm256_srli_epi32(raw, 4)];
                    for hi in 0..2 {
                        let wv =
                            _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q[hi]), d[hi]), m[hi]);
                        let j = 32 * (2 * i + hi) + 8 * e;
                        for t in 0..NX {
                            acc[t][e] = _mm256_fmadd_ps(
                                wv,
                                _mm256_loadu_ps(xs[t].add(b * 256 + j)),
                                acc[t][e],
                            );
                        }
                    }
                }
            }
        }
        for t in 0..NX {
            let s01 = _mm256_add_ps(acc[t][0], acc[t][1]);
            let s23 = _mm256_add_ps(acc[t][2], acc[t][3]);
            *a.out.add(t * a.out_stride + r) = hsum256(_mm256_add_ps(s01, s23));
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn exact_q4k_v8(a: &MatArgs) {
    by_nx!(a, exact_q4k_v8_n)
}
