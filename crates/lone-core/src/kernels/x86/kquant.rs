//! K-quants against Q8_K activations (8-bit path).

#![allow(clippy::needless_range_loop)]

use super::*;

/// A byte shuffle of 8 i16 (repeated in both 128-bit lanes) that broadcasts word `j`.
#[inline(always)]
pub(in crate::kernels) unsafe fn word_shuffle(j: usize) -> __m256i {
    _mm256_set1_epi16((0x0100 + 0x0202 * j as i32) as i16)
}

/// Q4_K/Q5_K's 8 six-bit scales and 8 six-bit mins (the 12 packed bytes at `p`, unpacked as
/// ggml does), one per byte.
#[inline(always)]
pub(in crate::kernels) unsafe fn k4_scale_bytes(p: *const u8) -> (u64, u64) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let u0 = (p as *const u32).read_unaligned();
    let u1 = (p.add(4) as *const u32).read_unaligned();
    let u2 = (p.add(8) as *const u32).read_unaligned();
    let sc_lo = u0 & K1;
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m_lo = u1 & K1;
    let m_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    (
        (u64::from(sc_hi) << 32) | u64::from(sc_lo),
        (u64::from(m_hi) << 32) | u64::from(m_lo),
    )
}

/// A byte shuffle of 8 i16 (repeated in both 128-bit lanes) that broadcasts word `2j` over
/// the low lane and word `2j + 1` over the high lane.
#[inline(always)]
pub(in crate::kernels) unsafe fn pair_shuffle(j: usize) -> __m256i {
    let lo = 0x0100 + 0x0202 * (2 * j as i16);
    let hi = 0x0100 + 0x0202 * (2 * j as i16 + 1);
    _mm256_setr_epi16(
        lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
    )
}

//
// Q8_K block (292 bytes): d:f32 @0, qs:[i8;256] @4, bsums:[i16;16] @260 (sums of 16 quants).

/// Prefetches the cache lines of the block [`PREFETCH`] bytes past `wb` (`bb` bytes): the
/// 8-bit K-quant kernels otherwise stall on their weight loads (LFM2-350M Q4_K_M decode on a
/// 2-vCPU Xeon guest). Into L2 (T1), as the packed kernels: on Zen 4 a packed kernel's
/// T0 prefetches (18-27 lines a block) filled L1's miss queue, and streaming weights from
/// memory went slower than with none (docs/perf/history.md, 2026-12-04).
#[inline(always)]
unsafe fn prefetch_block(wb: *const u8, bb: usize) {
    let ahead = wb.wrapping_add(PREFETCH);
    let mut o = 0;
    while o < bb + 63 {
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// Q4_K (144 bytes: d, dmin, scales[12], qs[128]) and Q5_K (176 bytes: d, dmin, scales[12],
/// qh[32], qs[128]).
#[inline(always)]
pub(in crate::kernels) unsafe fn q45k_rows_n<D: IDot, const FIVE: bool, const NX: usize>(
    a: &MatArgs,
) {
    let bb = if FIVE { 176 } else { 144 };
    let qs_off = if FIVE { 48 } else { 16 };
    let nb = a.k / 256;
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
        let mut acc = [0f32; NX];
        for b in 0..nb {
            let wb = w.add(b * bb);
            prefetch_block(wb, bb);
            let d = f16_at(wb);
            let dmin = f16_at(wb.add(2));
            let (sc8, mn8) = k4_scale_bytes(wb.add(4));
            // The 8 scales as i16 in both lanes; the mins as pairs (m0 m0 m1 m1 …) against
            // the 16 activation sums of 16.
            let sc16 =
                _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8 as i64)));
            let mn = _mm_cvtsi64_si128(mn8 as i64);
            let mpairs = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
            let qh = if FIVE {
                _mm256_loadu_si256(wb.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            // Two chains per activation row (low and high nibbles): `vpdpwssd` accumulates
            // with a latency of several cycles, and one chain of 8 per block bounds a row.
            let mut sumi = [[_mm256_setzero_si256(); 2]; NX];
            for i in 0..4 {
                let q = _mm256_loadu_si256(wb.add(qs_off + 32 * i) as *const __m256i);
                let mut lo = _mm256_and_si256(q, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if FIVE {
                    // Bit (2i) / (2i+1) of qh byte l is bit 4 of element l of the sub-block.
                    let s0 = _mm_cvtsi32_si128(2 * i as i32);
                    let s1 = _mm_cvtsi32_si128(2 * i as i32 + 1);
                    let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, s0), one);
                    let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, s1), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
                }
                let s_lo = _mm256_shuffle_epi8(sc16, word_shuffle(2 * i));
                let s_hi = _mm256_shuffle_epi8(sc16, word_shuffle(2 * i + 1));
                for t in 0..NX {
                    let xq = xs[t].add(b * 292 + 4 + 64 * i);
                    let x0 = _mm256_loadu_si256(xq as *const __m256i);
                    let x1 = _mm256_loadu_si256(xq.add(32) as *const __m256i);
                    sumi[t][0] = D::dot_scaled(sumi[t][0], lo, x0, s_lo);
                    sumi[t][1] = D::dot_scaled(sumi[t][1], hi, x1, s_hi);
                }
            }
            for t in 0..NX {
                let xb = xs[t].add(b * 292);
                let dx = f32_at(xb);
                let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
                // The super-block's integer sums, then `iqsuper`'s two float steps.
                let mins = hsum_i32(_mm256_madd_epi16(bs, mpairs));
                let si = hsum_i32(_mm256_add_epi32(sumi[t][0], sumi[t][1]));
                acc[t] = (si as f32).mul_add(d * dx, acc[t]);
                acc[t] = (mins as f32).mul_add(-(dmin * dx), acc[t]);
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = acc[t];
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn q45k_rows<D: IDot, const FIVE: bool>(a: &MatArgs) {
    by_nx!(a, q45k_rows_n, D, FIVE)
}

/// Q4_K packed by 8 rows ([`crate::kernels::packed`]): per block of 256 elements and group,
/// the 8 rows' d (16 bytes), dmin (16), the three words of packed 6-bit scales and mins (3 ×
/// 32), then 32 chunks of 32 bytes (chunk `8i + c`: quant bytes `32i + 4c..+4` of each row;
/// their low nibbles are elements `4c..4c+4` of sub-block `2i`, their high nibbles those of
/// sub-block `2i + 1`). One `vpdpbusd` (or `vpmaddubsw` pair) serves 8 rows × 4 elements;
/// each sub-block's integer sums are scaled by the 8 rows' 6-bit scales as i32 lanes, and
/// the mins meet the activation block's sums of 32 by `vpmaddwd`: the 8 rows' results are
/// the lanes of one register, without horizontal sums. Rows past the last whole group are
/// stored as they were and take [`q45k_rows_n`].
#[inline(always)]
pub(in crate::kernels) unsafe fn q4k_x8_n<D: IDot, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let gb = 8 * 144;
    let groups = a.rows / 8;
    let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
    let m4 = _mm256_set1_epi8(0x0f);
    let k1 = _mm256_set1_epi32(0x3f3f_3f3f);
    let k2 = _mm256_set1_epi32(0x0f0f_0f0f);
    let k3 = _mm256_set1_epi32(0x0303_0303);
    let byte = _mm256_set1_epi32(0xff);
    let words = _mm256_set1_epi32(0x00ff_00ff);
    // Per 128-bit lane of the activation sums of 32 (B0..B3 | B4..B7 as i16, twice): the
    // dwords (B0, B2), (B1, B3) | (B4, B6), (B5, B7).
    let pairs = _mm256_setr_epi8(
        0, 1, 4, 5, 2, 3, 6, 7, 0, 1, 4, 5, 2, 3, 6, 7, 0, 1, 4, 5, 2, 3, 6, 7, 0, 1, 4, 5, 2, 3,
        6, 7,
    );
    for g in 0..groups {
        let base = a.w.add(g * 8 * a.w_stride);
        let mut acc = [_mm256_setzero_ps(); NX];
        for b in 0..nb {
            let p = base.add(b * gb);
            prefetch_block(p, gb);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
            // ggml's unpacking of the 12 scale bytes, lane r = row r.
            let u0 = _mm256_loadu_si256(p.add(32) as *const __m256i);
            let u1 = _mm256_loadu_si256(p.add(64) as *const __m256i);
            let u2 = _mm256_loadu_si256(p.add(96) as *const __m256i);
            let sc_lo = _mm256_and_si256(u0, k1);
            let sc_hi = _mm256_or_si256(
                _mm256_and_si256(u2, k2),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4),
            );
            let m_lo = _mm256_and_si256(u1, k1);
            let m_hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4),
            );
            // Mins as i16 pairs: (m0, m2), (m1, m3), (m4, m6), (m5, m7).
            let m02 = _mm256_and_si256(m_lo, words);
            let m13 = _mm256_and_si256(_mm256_srli_epi32(m_lo, 8), words);
            let m46 = _mm256_and_si256(m_hi, words);
            let m57 = _mm256_and_si256(_mm256_srli_epi32(m_hi, 8), words);
            let mut sumi = [_mm256_setzero_si256(); NX];
            for i in 0..4 {
                let sc4 = if i < 2 { sc_lo } else { sc_hi };
                let sh = 16 * (i as i32 & 1);
                let sa = _mm256_and_si256(_mm256_srl_epi32(sc4, _mm_cvtsi32_si128(sh)), byte);
                let sb = _mm256_and_si256(_mm256_srl_epi32(sc4, _mm_cvtsi32_si128(sh + 8)), byte);
                let q = p.add(128 + 256 * i);
                // Four chains per activation row: low / high nibbles, even / odd chunks (4
                // steps each: within AVX2's i16 bound for 4-bit codes).
                // (Chains indexed by constants: a chain picked by the loop counter would keep
                // them in memory.)
                let mut s = [[_mm256_setzero_si256(); 4]; NX];
                macro_rules! chunk {
                    ($c:expr, $lo:expr, $hi:expr) => {{
                        let raw = _mm256_loadu_si256(q.add(32 * $c) as *const __m256i);
                        let lo = _mm256_and_si256(raw, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                        for t in 0..NX {
                            let xq = xs[t].add(b * 292 + 4 + 64 * i + 4 * $c);
                            let xl = _mm256_set1_epi32((xq as *const i32).read_unaligned());
                            let xh = _mm256_set1_epi32((xq.add(32) as *const i32).read_unaligned());
                            s[t][$lo] = D::acc_dot(s[t][$lo], lo, xl);
                            s[t][$hi] = D::acc_dot(s[t][$hi], hi, xh);
                        }
                    }};
                }
                // From 3 activation rows on, 2 chains per row (8 steps of at most 2·15·128:
                // still within i16): their accumulators and the others' fit the registers.
                let (odd_lo, odd_hi) = if NX <= 2 { (1, 3) } else { (0, 2) };
                for c in (0..8).step_by(2) {
                    chunk!(c, 0, 2);
                    chunk!(c + 1, odd_lo, odd_hi);
                }
                for t in 0..NX {
                    let da = _mm256_add_epi32(D::acc_finish(s[t][0]), D::acc_finish(s[t][1]));
                    let db = _mm256_add_epi32(D::acc_finish(s[t][2]), D::acc_finish(s[t][3]));
                    sumi[t] = _mm256_add_epi32(
                        sumi[t],
                        _mm256_add_epi32(_mm256_mullo_epi32(da, sa), _mm256_mullo_epi32(db, sb)),
                    );
                }
            }
            for t in 0..NX {
                let xb = xs[t].add(b * 292);
                let dx = _mm256_set1_ps(f32_at(xb));
                // Sums of 32 activations B0..B7 from the 16 sums of 16, then Σ m_j·B_j.
                let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
                let bp = _mm256_shuffle_epi8(_mm256_hadd_epi16(bs, bs), pairs);
                macro_rules! at {
                    ($j:literal) => {
                        _mm256_permutevar8x32_epi32(bp, _mm256_set1_epi32($j))
                    };
                }
                let mins = _mm256_add_epi32(
                    _mm256_add_epi32(
                        _mm256_madd_epi16(m02, at!(0)),
                        _mm256_madd_epi16(m13, at!(1)),
                    ),
                    _mm256_add_epi32(
                        _mm256_madd_epi16(m46, at!(4)),
                        _mm256_madd_epi16(m57, at!(5)),
                    ),
                );
                let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_mul_ps(d, dx), acc[t]);
                acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, dx), v);
            }
        }
        for t in 0..NX {
            _mm256_storeu_ps(a.out.add(t * a.out_stride + 8 * g), acc[t]);
        }
    }
    if let Some(rest) = rows_past_groups(a) {
        q45k_rows_n::<D, false, NX>(&rest);
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn q4k_x8<D: IDot>(a: &MatArgs) {
    by_nx!(a, q4k_x8_n, D)
}

/// Q6_K (210 bytes: ql[128], qh[64], scales:[i8;16], d).
#[inline(always)]
pub(in crate::kernels) unsafe fn q6k_rows_n<D: IDot, const NX: usize>(a: &MatArgs) {
    let nb = a.k / 256;
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    for r in 0..a.rows {
        let w = a.w.add(r * a.w_stride);
        let xs: [*const u8; NX] = core::array::from_fn(|t| a.x.add(t * a.x_stride));
        let mut acc = [0f32; NX];
        for b in 0..nb {
            let wb = w.add(b * 210);
            prefetch_block(wb, 210);
            let d = f16_at(wb.add(208));
            let sc8 = _mm_loadu_si128(wb.add(192) as *const __m128i);
            let sc16 = _mm256_cvtepi8_epi16(sc8);
            // Two chains per activation row (even and odd sub-blocks), as in Q4_K.
            let mut sumi = [[_mm256_setzero_si256(); 2]; NX];
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(wb.add(64 * h) as *const __m256i);
                let ql1 = _mm256_loadu_si256(wb.add(64 * h + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(wb.add(128 + 32 * h) as *const __m256i);
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
                // This half's 8 scales as i16 in both 128-bit lanes; group g = 8h + 2rq's
                // scale to the low lane, g + 1's to the high lane, by one byte shuffle.
                let sch = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(if h == 0 {
                    sc8
                } else {
                    _mm_srli_si128::<8>(sc8)
                }));
                for (rq, &qv) in q.iter().enumerate() {
                    let scv = _mm256_shuffle_epi8(sch, pair_shuffle(rq));
                    for t in 0..NX {
                        let xq = xs[t].add(b * 292 + 4 + 128 * h + 32 * rq);
                        let xv = _mm256_loadu_si256(xq as *const __m256i);
                        sumi[t][rq & 1] = D::dot_scaled(sumi[t][rq & 1], qv, xv, scv);
                    }
                }
            }
            for t in 0..NX {
                let xb = xs[t].add(b * 292);
                let dx = f32_at(xb);
                // The -32 offset of every quant: Σ_g scale_g · Σ x (group g of 16), as 8
                // lanes of pair sums: 32 · madd(bsums, scales).
                let bs = _mm256_loadu_si256(xb.add(260) as *const __m256i);
                let offs = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                let s = _mm256_sub_epi32(_mm256_add_epi32(sumi[t][0], sumi[t][1]), offs);
                // The super-block's integer sum, then `iqsuper`'s float step.
                acc[t] = (hsum_i32(s) as f32).mul_add(d * dx, acc[t]);
            }
        }
        for t in 0..NX {
            *a.out.add(t * a.out_stride + r) = acc[t];
        }
    }
}

#[inline(always)]
pub(in crate::kernels) unsafe fn q6k_rows<D: IDot>(a: &MatArgs) {
    by_nx!(a, q6k_rows_n, D)
}
