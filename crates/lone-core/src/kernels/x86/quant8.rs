//! The 8-bit activation quantizers that every 8-bit matrix product runs first (Q8_0, Q8_1,
//! Q8_K), on AVX2: bit for bit ggml's reference quantizers (`quant::quantize_row`), which the
//! tests check. A block holding a NaN or an infinity is left to the reference (the caller
//! runs it when this returns false).

use super::*;
use crate::kernels::vecops::{quantize_q8_by, Q8Blocks};
use crate::tensor::DType;

/// `round_away(p)` of `quant::legacy` (C's `roundf`) on 8 lanes: truncate, then step away
/// from zero where the dropped fraction is at least one half. Exact: `p - trunc(p)` is
/// representable.
#[inline(always)]
unsafe fn round_away8(p: __m256) -> __m256i {
    let t = _mm256_cvttps_epi32(p);
    let f = _mm256_sub_ps(p, _mm256_cvtepi32_ps(t));
    // Compare masks are -1 where true.
    let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, _mm256_set1_ps(0.5)));
    let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(f, _mm256_set1_ps(-0.5)));
    _mm256_add_epi32(_mm256_sub_epi32(t, up), down)
}

/// 32 i32 lanes (in order, each in -128..=127) as 32 bytes at `dst`.
#[inline(always)]
unsafe fn store_i8x32(q: [__m256i; 4], dst: *mut u8) {
    // packs interleave the 128-bit lanes: 4-byte groups come out as q0a q1a q2a q3a q0b …
    let a = _mm256_packs_epi32(q[0], q[1]);
    let b = _mm256_packs_epi32(q[2], q[3]);
    let c = _mm256_packs_epi16(a, b);
    let c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(dst as *mut __m256i, c);
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// |v| of 8 lanes, and whether any lane is a NaN or an infinity.
#[inline(always)]
unsafe fn abs_finite(v: __m256) -> (__m256, bool) {
    let a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
    // Not less than +inf (unordered counts as true): an infinity or a NaN.
    let bad = _mm256_cmp_ps::<_CMP_NLT_UQ>(a, _mm256_set1_ps(f32::INFINITY));
    (a, _mm256_movemask_ps(bad) == 0)
}

/// One Q8_0/Q8_1 block of 32 values at `x`: the quants to `q`, returns (d, Σq); None for a
/// block with a non-finite value.
#[inline(always)]
unsafe fn block32(x: *const f32, q: *mut u8) -> Option<(f32, i32)> {
    // Arrays spelled out, not `core::array::from_fn`: its closure is not always inlined, and
    // an outlined closure calls each intrinsic as a function (it once made this 5× slower).
    let v: [__m256; 4] = [
        _mm256_loadu_ps(x),
        _mm256_loadu_ps(x.add(8)),
        _mm256_loadu_ps(x.add(16)),
        _mm256_loadu_ps(x.add(24)),
    ];
    let mut m = _mm256_setzero_ps();
    for vi in v {
        let (a, ok) = abs_finite(vi);
        if !ok {
            return None;
        }
        m = _mm256_max_ps(m, a);
    }
    let d = hmax(m) / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let qi: [__m256i; 4] = [
        round_away8(_mm256_mul_ps(v[0], id)),
        round_away8(_mm256_mul_ps(v[1], id)),
        round_away8(_mm256_mul_ps(v[2], id)),
        round_away8(_mm256_mul_ps(v[3], id)),
    ];
    let s = _mm256_add_epi32(
        _mm256_add_epi32(qi[0], qi[1]),
        _mm256_add_epi32(qi[2], qi[3]),
    );
    store_i8x32(qi, q);
    Some((d, hsum_i32(s)))
}

/// One Q8_K block of 256 values (`quant_q8_k`): d (f32) = max / -127 where max is the first
/// value of largest magnitude, quants rounded to nearest even, sums of each 16.
#[inline(always)]
unsafe fn block256(x: *const f32, b: *mut u8) -> bool {
    let mut m = _mm256_setzero_ps();
    for i in 0..32 {
        let (a, ok) = abs_finite(_mm256_loadu_ps(x.add(8 * i)));
        if !ok {
            return false;
        }
        m = _mm256_max_ps(m, a);
    }
    let amax = hmax(m);
    if amax == 0.0 {
        core::ptr::write_bytes(b, 0, 292);
        return true;
    }
    // The first element whose magnitude is amax (the reference's strict `>` keeps the first).
    let mut max = 0.0;
    for i in 0..32 {
        let (a, _) = abs_finite(_mm256_loadu_ps(x.add(8 * i)));
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, _mm256_set1_ps(amax)));
        if hit != 0 {
            max = *x.add(8 * i + hit.trailing_zeros() as usize);
            break;
        }
    }
    let iscale = -127.0f32 / max;
    core::ptr::copy_nonoverlapping((1.0 / iscale).to_le_bytes().as_ptr(), b, 4);
    let s = _mm256_set1_ps(iscale);
    let top = _mm256_set1_epi32(127);
    for c in 0..8 {
        // `nearest_int` (ties to even) is the default rounding of cvtps on |v| ≤ 2^22.
        let qi: [__m256i; 4] = core::array::from_fn(|i| {
            _mm256_min_epi32(
                _mm256_cvtps_epi32(_mm256_mul_ps(s, _mm256_loadu_ps(x.add(32 * c + 8 * i)))),
                top,
            )
        });
        store_i8x32(qi, b.add(4 + 32 * c));
        for h in 0..2 {
            let sum = hsum_i32(_mm256_add_epi32(qi[2 * h], qi[2 * h + 1])) as i16;
            let o = 260 + 2 * (2 * c + h);
            core::ptr::copy_nonoverlapping(sum.to_le_bytes().as_ptr(), b.add(o), 2);
        }
    }
    true
}

/// AVX2's blocks for [`quantize_q8_by`].
pub(in crate::kernels) struct Avx2Q8;

impl Q8Blocks for Avx2Q8 {
    #[inline(always)]
    unsafe fn block32(x: *const f32, q: *mut u8) -> Option<(f32, i32)> {
        block32(x, q)
    }
    #[inline(always)]
    unsafe fn block256(x: *const f32, b: *mut u8) -> bool {
        block256(x, b)
    }
}

/// [`quantize_q8_by`] on AVX2.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_avx2(
    ad: DType,
    x: &[f32],
    blocks: &mut [u8],
    sums: &mut [u8],
) -> bool {
    quantize_q8_by::<Avx2Q8>(ad, x, blocks, sums)
}
