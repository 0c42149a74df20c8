//! Every kernel family × format × mode against the scalar reference, over odd shapes.

use super::*;
use crate::quant::{dequantize_row, quantize_row};

use crate::test_rng::Rng;

const FORMATS: [DType; 24] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4NL,
    DType::IQ4XS,
    DType::IQ2XXS,
    DType::IQ2XS,
    DType::IQ2S,
    DType::IQ3XXS,
    DType::IQ3S,
    DType::IQ1S,
    DType::IQ1M,
    DType::TQ1_0,
    DType::TQ2_0,
];

/// Random blocks with finite, moderate scales (the quant bytes stay random).
fn random_weights(rng: &mut Rng, dtype: DType, rows: usize, k: usize) -> Vec<u8> {
    let n = rows * k;
    let mut w: Vec<u8> = (0..dtype.bytes_for(n).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    let half = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let bb = dtype.block_bytes();
    for (i, b) in w.chunks_mut(bb).enumerate() {
        let v = 0.01 * ((i % 13) as f32 + 1.0);
        match dtype {
            DType::F32 => b[3] &= 0xbf,
            DType::F16 | DType::BF16 => b[1] &= 0xbf,
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => b[0..2].copy_from_slice(&half(v)),
            DType::Q4_1 | DType::Q5_1 => {
                b[0..2].copy_from_slice(&half(v));
                b[2..4].copy_from_slice(&half(-v * 7.0));
            }
            DType::Q2K => {
                b[80..82].copy_from_slice(&half(v));
                b[82..84].copy_from_slice(&half(v / 2.0));
            }
            DType::Q3K => b[108..110].copy_from_slice(&half(v)),
            DType::Q4K | DType::Q5K => {
                b[0..2].copy_from_slice(&half(v));
                b[2..4].copy_from_slice(&half(v / 2.0));
            }
            DType::Q6K => b[208..210].copy_from_slice(&half(v)),
            DType::IQ4NL | DType::IQ4XS => b[0..2].copy_from_slice(&half(v)),
            _ => assert!(
                crate::quant::reference_blocks::set_scale(dtype, b, v),
                "{dtype}"
            ),
        }
    }
    w
}

/// The activations a kernel effectively multiplies: `x` itself, or its 8-bit blocks
/// dequantized in fast mode.
fn effective_x(isa: Isa, dtype: DType, exact: bool, x: &[f32], k: usize) -> Vec<f32> {
    match fast_act_for(isa, dtype, x.len() / k, k) {
        Some(ad) if !exact => {
            let mut out = vec![0.0; x.len()];
            for (xr, o) in x.chunks(k).zip(out.chunks_mut(k)) {
                let mut q = vec![0u8; ad.bytes_for(k).unwrap()];
                quantize_row(ad, xr, &mut q).unwrap();
                dequantize_row(ad, &q, o).unwrap();
            }
            out
        }
        _ => x.to_vec(),
    }
}

fn check(isa: Isa, exact: bool, dtype: DType, m: usize, k: usize, n: usize, rng: &mut Rng) {
    let wb = random_weights(rng, dtype, m, k);
    let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
    check_product(
        isa,
        exact,
        &Tensor::from_bytes(dtype, vec![m, k], wb),
        &x,
        n,
    );
}

/// `matmul_with(isa, exact, w, x)` against an f64 product of the dequantized weights and the
/// activations the kernel effectively takes.
fn check_product(isa: Isa, exact: bool, w: &Tensor, x: &[f32], n: usize) {
    let (dtype, m, k) = (w.dtype, w.n_rows(), w.row_len());
    let mut out = vec![f32::NAN; n * m];
    matmul_with(isa, exact, w, x, n, &mut out);
    let xe = effective_x(isa, dtype, exact, x, k);
    let mut wrow = vec![0.0f32; k];
    for r in 0..m {
        w.row_to_f32(r, &mut wrow);
        let wmax = wrow.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
        for t in 0..n {
            let xr = &xe[t * k..(t + 1) * k];
            let exact_dot: f64 = wrow
                .iter()
                .zip(xr)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            // f32 rounding of the sums, and of the dequantized weights themselves (d·q - m
            // rounds relative to |d·q| + |m| ≤ 2·max|w| per element).
            let mag: f64 = wrow
                .iter()
                .zip(xr)
                .map(|(&a, &b)| (a.abs() as f64 + 2.0 * wmax) * b.abs() as f64)
                .sum();
            let tol = (k as f64 + 8.0) * f32::EPSILON as f64 * mag + 1e-30;
            let got = out[t * m + r] as f64;
            assert!(
                (got - exact_dot).abs() <= tol,
                "{isa:?} exact={exact} {dtype} m={m} k={k} n={n} row {r} act {t}: \
                 {got} vs {exact_dot} (tol {tol:e})"
            );
        }
    }
}

#[test]
fn every_kernel_matches_the_reference_on_odd_shapes() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for isa in Isa::available() {
        for dtype in FORMATS {
            let ks: Vec<usize> = if dtype.is_quantized() {
                (1..=3).map(|b| b * dtype.block_size()).collect()
            } else {
                vec![1, 3, 17, 32, 67, 200]
            };
            for exact in [false, true] {
                for &k in &ks {
                    for m in [1usize, 3, 17] {
                        for n in (1..=9).chain([13, 16, 26]) {
                            check(isa, exact, dtype, m, k, n, &mut rng);
                        }
                    }
                }
            }
        }
    }
}

/// The 8-bit paths at the edges of their integer ranges: every quant at its largest (and,
/// for Q8_0, smallest) code against activations at ±max, where an i16 pair sum in
/// `vpmaddubsw` would saturate if the codes or the flushes were wrong.
#[test]
fn eight_bit_products_do_not_saturate() {
    let (m, k, n) = (5, 512, 24);
    for isa in Isa::available() {
        for dtype in FORMATS.into_iter().filter(|d| d.is_quantized()) {
            for fill in [0xffu8, 0x81, 0x7f] {
                let mut rng = Rng(7);
                let mut wb = random_weights(&mut rng, dtype, m, k);
                let bb = dtype.block_bytes();
                // The quant bytes (everything but the scales random_weights set) to `fill`.
                let scales: Vec<u8> = wb.clone();
                wb.iter_mut().for_each(|b| *b = fill);
                for (blk, orig) in wb.chunks_mut(bb).zip(scales.chunks(bb)) {
                    let keep = match dtype {
                        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4NL => 0..2,
                        DType::IQ4XS => 0..8,
                        DType::IQ2XXS
                        | DType::IQ2XS
                        | DType::IQ2S
                        | DType::IQ3XXS
                        | DType::IQ3S
                        | DType::IQ1S => 0..2,
                        DType::IQ1M => 48..56,
                        DType::TQ1_0 => 52..54,
                        DType::TQ2_0 => 64..66,
                        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => 0..4,
                        DType::Q2K => 80..84,
                        DType::Q3K => 108..110,
                        DType::Q6K => 208..210,
                        _ => 0..0,
                    };
                    blk[keep.clone()].copy_from_slice(&orig[keep]);
                }
                let x: Vec<f32> = (0..n * k)
                    .map(|i| {
                        if (i / 3) % 2 == 0 || fill == 0x7f {
                            1.0
                        } else {
                            -1.0
                        }
                    })
                    .collect();
                check_product(
                    isa,
                    false,
                    &Tensor::from_bytes(dtype, vec![m, k], wb),
                    &x,
                    n,
                );
            }
        }
    }
}

/// Exact mode dequantizes bit-exactly: with one-hot activation rows, each output is one
/// dequantized weight times 1 plus zeros, so it must equal the reference weight exactly.
#[test]
fn exact_mode_weights_are_bit_exact() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for isa in Isa::available() {
        for dtype in FORMATS.into_iter().filter(|d| d.is_quantized()) {
            for blocks in 1..=3 {
                let k = blocks * dtype.block_size();
                let m = 5;
                let w =
                    Tensor::from_bytes(dtype, vec![m, k], random_weights(&mut rng, dtype, m, k));
                let mut x = vec![0.0f32; k * k];
                for i in 0..k {
                    x[i * k + i] = 1.0;
                }
                let mut out = vec![f32::NAN; k * m];
                matmul_with(isa, true, &w, &x, k, &mut out);
                let mut wrow = vec![0.0f32; k];
                for r in 0..m {
                    w.row_to_f32(r, &mut wrow);
                    for i in 0..k {
                        // f32 `==`: bit equality up to the sign of zero.
                        assert!(
                            out[i * m + r] == wrow[i],
                            "{isa:?} {dtype} k={k} row {r} element {i}: {} vs {}",
                            out[i * m + r],
                            wrow[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn many_rows_split_over_threads() {
    let mut rng = Rng(99);
    for isa in Isa::available() {
        for dtype in FORMATS {
            let k = 2 * dtype.block_size().max(64);
            for exact in [false, true] {
                check(isa, exact, dtype, 301, k, 5, &mut rng);
                check(isa, exact, dtype, 37, k, 29, &mut rng);
                check(isa, exact, dtype, 53, k, 45, &mut rng);
            }
        }
    }
}

#[test]
fn detected_isa_is_available() {
    assert!(isa().is_available());
    eprintln!("kernels: {:?}, available {:?}", isa(), Isa::available());
}

#[test]
fn exact_scope_overrides_this_thread_only() {
    let before = exact();
    {
        let _g = exact_scope(!before);
        assert_eq!(exact(), !before);
        std::thread::spawn(move || assert_eq!(exact(), before))
            .join()
            .unwrap();
    }
    assert_eq!(exact(), before);
}

#[test]
fn simd_exp_is_within_a_few_ulp() {
    for isa in Isa::available() {
        let f = vec_fns(isa);
        let xs: Vec<f32> = (0..20011)
            .map(|i| -87.0 + 175.0 * i as f32 / 20010.0)
            .chain([
                0.0, -0.0, 1e-8, -1e-8, 0.5, -0.5, 80.0, -80.0, 88.5, 88.7, -87.3,
            ])
            .collect();
        for len in [xs.len(), 1, 7, 17] {
            let mut y = xs[..len].to_vec();
            // SAFETY: y holds len f32; `isa` is available.
            unsafe { (f.exp)(y.as_mut_ptr(), len) };
            for (&x, &got) in xs.iter().zip(&y) {
                let want = (x as f64).exp();
                let rel = ((got as f64 - want) / want).abs();
                assert!(
                    rel <= 4.0 * f32::EPSILON as f64,
                    "{isa:?} exp({x}) = {got}, want {want}"
                );
            }
        }
    }
}

/// `matmul_many` gives exactly the results of separate `matmul` calls, whether the matrices
/// share a GEMM path (mixed formats included) or not, on both sides of every row threshold.
#[test]
fn matmul_many_equals_separate_matmuls() {
    let mut rng = Rng(23);
    let k = 256;
    let sets: [&[(DType, usize)]; 4] = [
        &[(DType::Q4K, 37), (DType::Q4K, 64), (DType::Q6K, 5)],
        &[(DType::Q4_0, 50), (DType::Q8_0, 17)],
        &[(DType::BF16, 20), (DType::BF16, 49)],
        &[(DType::F16, 30), (DType::Q4_0, 3), (DType::F32, 11)],
    ];
    for exact in [true, false] {
        let _mode = exact_scope(exact);
        for set in sets {
            let ws: Vec<Tensor> = set
                .iter()
                .map(|&(d, m)| Tensor::from_bytes(d, vec![m, k], random_weights(&mut rng, d, m, k)))
                .collect();
            for n in [1, 5, 6, 8, 15, 16, 40] {
                let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
                let want: Vec<Vec<f32>> = ws
                    .iter()
                    .map(|w| {
                        let mut o = vec![0.0; n * w.n_rows()];
                        matmul(w, &x, n, &mut o);
                        o
                    })
                    .collect();
                let mut got: Vec<Vec<f32>> =
                    ws.iter().map(|w| vec![f32::NAN; n * w.n_rows()]).collect();
                let refs: Vec<&Tensor> = ws.iter().collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|o| o.as_mut_slice()).collect();
                matmul_many(&refs, &x, n, &mut outs);
                assert_eq!(got, want, "exact={exact} {set:?} n={n}");
            }
        }
    }
}

/// The attention primitives against plain f64 loops, over odd sizes and strides, with f32
/// and f16 keys/values (the f16 reference: the stored halves widened exactly).
#[test]
fn dot_rows_and_mix_rows_match_the_reference() {
    let mut rng = Rng(31);
    for f16 in [false, true] {
        for (nq, nk, d, stride) in [
            (1, 1, 1, 1),
            (3, 17, 64, 80),
            (7, 40, 64, 128),
            (5, 9, 72, 72),
            (2, 33, 128, 256),
            (4, 5, 17, 19),
        ] {
            let q: Vec<f32> = (0..nq * d).map(|_| rng.f32()).collect();
            let raw: Vec<f32> = (0..(nk - 1) * stride + d).map(|_| rng.f32()).collect();
            let halves: Vec<u16> = raw
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            // The values the kernels see.
            let keys: Vec<f32> = if f16 {
                halves
                    .iter()
                    .map(|&h| half::f16::from_bits(h).to_f32())
                    .collect()
            } else {
                raw.clone()
            };
            let view = if f16 {
                KvSlice::F16(&halves)
            } else {
                KvSlice::F32(&raw)
            };
            let mut s = vec![f32::NAN; nq * nk];
            dot_rows(&q, nq, view, stride, nk, d, &mut s);
            for g in 0..nq {
                for j in 0..nk {
                    let want: f64 = (0..d)
                        .map(|i| q[g * d + i] as f64 * keys[j * stride + i] as f64)
                        .sum();
                    let mag: f64 = (0..d)
                        .map(|i| (q[g * d + i] as f64 * keys[j * stride + i] as f64).abs())
                        .sum();
                    let got = s[g * nk + j] as f64;
                    assert!(
                        (got - want).abs() <= (d as f64 + 2.0) * f32::EPSILON as f64 * mag + 1e-30,
                        "dot_rows f16={f16} {nq}x{nk}x{d}: {got} vs {want}"
                    );
                }
            }
            // Every family's F32/F16 kernel on strided rows (what dot_rows hands it).
            for isa in Isa::available() {
                let dtype = view.dtype();
                let f = stored_kernel(isa, dtype);
                let mut s2 = vec![f32::NAN; nq * nk];
                for g0 in (0..nq).step_by(4) {
                    let a = MatArgs {
                        dtype,
                        w: view.ptr(),
                        w_stride: view.stride_bytes(stride),
                        rows: nk,
                        x: q[g0 * d..].as_ptr() as *const u8,
                        x_stride: 4 * d,
                        nx: 4.min(nq - g0),
                        k: d,
                        out: s2[g0 * nk..].as_mut_ptr(),
                        out_stride: nk,
                    };
                    // SAFETY: the extents match the MatFn contract; `isa` is available.
                    unsafe { f(&a) };
                }
                for (i, (&a, &b)) in s2.iter().zip(&s).enumerate() {
                    let tol = 1e-5 * (1.0 + b.abs()) * d as f32;
                    assert!(
                        (a - b).abs() <= tol,
                        "{isa:?} strided {dtype} kernel {nq}x{nk}x{d} [{i}]: {a} vs {b}"
                    );
                }
            }
            let p_stride = nk + 3;
            let p: Vec<f32> = (0..(nq - 1) * p_stride + nk).map(|_| rng.f32()).collect();
            let base: Vec<f32> = (0..nq * d).map(|_| rng.f32()).collect();
            for isa in Isa::available() {
                let f = vec_fns(isa);
                let mix = if f16 { f.mix_f16 } else { f.mix };
                let mut out = base.clone();
                // SAFETY: the extents match mix_rows' contract; `isa` is available.
                unsafe {
                    mix(
                        p.as_ptr(),
                        p_stride,
                        nq,
                        view.ptr(),
                        stride,
                        nk,
                        d,
                        out.as_mut_ptr(),
                    )
                };
                for g in 0..nq {
                    for i in 0..d {
                        let terms = (0..nk)
                            .map(|j| p[g * p_stride + j] as f64 * keys[j * stride + i] as f64);
                        let want = base[g * d + i] as f64 + terms.clone().sum::<f64>();
                        let mag = (base[g * d + i] as f64).abs() + terms.map(f64::abs).sum::<f64>();
                        let got = out[g * d + i] as f64;
                        assert!(
                            (got - want).abs()
                                <= (nk as f64 + 2.0) * f32::EPSILON as f64 * mag + 1e-30,
                            "{isa:?} mix f16={f16} {nq}x{nk}x{d} g={g} i={i}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// `Mode::Auto`: quantized formats with 8-bit kernels take them for few activation rows
/// (decode) and, where the family has one (x86), the exact f32 GEMM for many (prefill; a
/// model's prompt rows are exact on every family: `Compute::enter`); everything else is exact.
#[test]
fn auto_mode_is_8bit_decode_and_exact_prefill() {
    let mut rng = Rng(0x51f1_5eed);
    for isa in Isa::available() {
        for dtype in FORMATS {
            let (fast, exact) = (kernel(isa, dtype, false), kernel(isa, dtype, true));
            let auto = auto_kernel(isa, dtype, fast, exact);
            let k = 2 * dtype.block_size().max(64);
            let m = 19;
            let w = Tensor::from_bytes(dtype, vec![m, k], random_weights(&mut rng, dtype, m, k));
            let eight_bit = auto_8bit(isa, dtype);
            assert!(
                !eight_bit || matches!(fast.act, Act::Quant(_)),
                "{isa:?} {dtype}"
            );
            for n in [1, 3, GEMM_MIN_ROWS + 4] {
                let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
                let run = |kern: Kernel| {
                    let mut out = vec![f32::NAN; n * m];
                    matmul_kernel(kern, &w, &x, n, &mut out);
                    out
                };
                let many = n >= GEMM_MIN_ROWS && exact.gemm.is_some();
                let want = if eight_bit && !many {
                    run(fast)
                } else {
                    run(exact)
                };
                assert_eq!(run(auto), want, "{isa:?} {dtype} n={n}");
                if eight_bit && !many {
                    assert_ne!(run(exact), want, "{isa:?} {dtype}: 8-bit and exact differ");
                }
            }
        }
    }
}

/// `dot_rows` / `mix_rows` over Q8_0 rows (whole blocks) against f64 loops over the
/// dequantized values, every family.
#[test]
fn q8_0_attention_rows_match_the_reference() {
    let mut rng = Rng(37);
    for (nq, nk, d, stride) in [
        (1, 1, 32, 32),
        (3, 17, 64, 96),
        (7, 40, 64, 128),
        (5, 9, 96, 96),
        (2, 33, 128, 256),
    ] {
        let q: Vec<f32> = (0..nq * d).map(|_| rng.f32()).collect();
        let raw: Vec<f32> = (0..(nk - 1) * stride + d.max(stride))
            .map(|_| rng.f32())
            .collect();
        let mut bytes = vec![0u8; raw.len() / 32 * 34];
        quantize_row(DType::Q8_0, &raw, &mut bytes).unwrap();
        let mut vals = vec![0f32; raw.len()];
        dequantize_row(DType::Q8_0, &bytes, &mut vals).unwrap();
        let view = KvSlice::Q8_0(&bytes);
        let mut s = vec![f32::NAN; nq * nk];
        dot_rows(&q, nq, view, stride, nk, d, &mut s);
        for g in 0..nq {
            for j in 0..nk {
                let terms = (0..d).map(|i| q[g * d + i] as f64 * vals[j * stride + i] as f64);
                let want: f64 = terms.clone().sum();
                let mag: f64 = terms.map(f64::abs).sum();
                let got = s[g * nk + j] as f64;
                assert!(
                    (got - want).abs() <= (d as f64 + 2.0) * f32::EPSILON as f64 * mag + 1e-30,
                    "q8 dot_rows {nq}x{nk}x{d}: {got} vs {want}"
                );
            }
        }
        let p_stride = nk + 3;
        let p: Vec<f32> = (0..(nq - 1) * p_stride + nk).map(|_| rng.f32()).collect();
        let base: Vec<f32> = (0..nq * d).map(|_| rng.f32()).collect();
        for isa in Isa::available() {
            let mut out = base.clone();
            // SAFETY: the extents match mix_rows' contract; `isa` is available.
            unsafe {
                (vec_fns(isa).mix_q8)(
                    p.as_ptr(),
                    p_stride,
                    nq,
                    bytes.as_ptr(),
                    stride,
                    nk,
                    d,
                    out.as_mut_ptr(),
                )
            };
            for g in 0..nq {
                for i in 0..d {
                    let terms =
                        (0..nk).map(|j| p[g * p_stride + j] as f64 * vals[j * stride + i] as f64);
                    let want = base[g * d + i] as f64 + terms.clone().sum::<f64>();
                    let mag = (base[g * d + i] as f64).abs() + terms.map(f64::abs).sum::<f64>();
                    let got = out[g * d + i] as f64;
                    assert!(
                        (got - want).abs() <= (nk as f64 + 4.0) * f32::EPSILON as f64 * mag + 1e-30,
                        "{isa:?} q8 mix {nq}x{nk}x{d} g={g} i={i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// Once a tensor has its rows-by-8 copy the GEMMs read the stored rows rebuilt from it (the
/// file's pages of the original are handed back): their results are bit for bit those from
/// the original bytes, for tiles that start and end anywhere a tile can (odd row counts, a
/// partial last group), in the exact prompt GEMM (every row count) and fast mode's 8-bit
/// GEMM.
#[test]
fn gemms_read_the_packed_copy_as_the_original() {
    let mut rng = Rng(77);
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1] {
        for (m, k, n) in [(53usize, 64usize, 20usize), (104, 96, 3), (7, 32, 17)] {
            let w = Tensor::from_bytes(dtype, vec![m, k], random_weights(&mut rng, dtype, m, k));
            let x: Vec<f32> = (0..n * k).map(|_| rng.f32() - 0.5).collect();
            // `pack`: the base mode is one whose decode kernels read the packed copy (the GEMM
            // then builds it); else exact (it never does).
            let run = |w: &Tensor, fast: bool, pack: bool| {
                let mut out = vec![0f32; n * m];
                let base = if pack { Mode::Auto } else { Mode::Exact };
                let was = HERE.with(|c| {
                    c.replace(Here {
                        mode: Some(if fast { Mode::Fast } else { Mode::Exact }),
                        base: Some(if fast && pack { Mode::Fast } else { base }),
                        prompt: !fast,
                        decode: false,
                        threads: None,
                    })
                });
                matmul(w, &x, n, &mut out);
                HERE.with(|c| c.set(was));
                out
            };
            // Fast mode's GEMM from IGEMM_MIN_ROWS rows (fewer take the packed kernels).
            // (aarch64 has no many-row GEMM: its exact rows read the stored rows rebuilt from
            // the packed copy, built here as a decode step would.)
            #[cfg(target_arch = "x86_64")]
            let igemm = isa().is_x86() && n >= IGEMM_MIN_ROWS;
            #[cfg(not(target_arch = "x86_64"))]
            let igemm = false;
            let want_exact = run(&w, false, false);
            let want_fast = if igemm { run(&w, true, false) } else { vec![] };
            assert!(w.packed_if_built().is_none());
            if !isa().is_x86() {
                w.packed(packed::rows_by_8);
            }
            let got_exact = run(&w, false, true);
            let got_fast = if igemm { run(&w, true, true) } else { vec![] };
            if isa().is_x86() {
                assert!(
                    w.packed_if_built().is_some(),
                    "{dtype}: the GEMM packs first"
                );
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got_exact),
                bits(&want_exact),
                "{dtype} {m}x{k} n {n} exact"
            );
            assert_eq!(
                bits(&got_fast),
                bits(&want_fast),
                "{dtype} {m}x{k} n {n} fast"
            );
        }
    }
}

/// `run(n, x)` (the outputs of `n` activation rows) for 1–9 rows equals, bit for bit, the same
/// rows' outputs among 21 (`xs` holds 21 rows of `k`).
fn same_rows_in_any_number(
    run: &dyn Fn(usize, &[f32]) -> Vec<f32>,
    xs: &[f32],
    k: usize,
    what: &str,
) {
    let wide = run(21, xs);
    for n in 1..=9 {
        let got = run(n, &xs[..n * k]);
        let same = got
            .iter()
            .zip(&wide)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: {n} rows differ from the same rows of 21");
    }
}

/// Prompt rows give the same outputs in any number: a step of 1–8 rows (the narrow kernel,
/// vectorised over weight rows) and the same rows inside a longer prompt (the tile kernel)
/// agree bit for bit, for every format with an f32 GEMM, odd row counts and widths.
#[test]
fn prompt_rows_give_the_same_outputs_in_any_number() {
    let mut rng = Rng(5);
    for isa in Isa::available() {
        for dtype in FORMATS {
            let bs = dtype.block_size();
            for (m, k) in [
                (53usize, 3 * bs.max(32)),
                (100, bs.max(32) + bs),
                (7, bs.max(32)),
            ] {
                let k = k / bs * bs;
                let w =
                    Tensor::from_bytes(dtype, vec![m, k], random_weights(&mut rng, dtype, m, k));
                let xs: Vec<f32> = (0..21 * k).map(|_| rng.f32() - 0.5).collect();
                let run = |n: usize, x: &[f32]| {
                    let mut out = vec![0f32; n * m];
                    let c = Compute {
                        mode: Some(Mode::Exact),
                        threads: None,
                    };
                    let _scope = c.enter(true);
                    matmul_kernel(kernel(isa, dtype, true), &w, x, n, &mut out);
                    out
                };
                same_rows_in_any_number(&run, &xs, k, &format!("{isa:?} {dtype} {m}x{k}"));
            }
        }
    }
}

/// Decode rows give the same outputs in any number: outside fast mode a decode step's rows
/// take the matrix-vector kernels for every row count, and each row's output must not depend
/// on how many rows share the step (1–9 rows against the same rows of 21), for every format,
/// both modes' decode kernels, odd row counts (tails of the row tiles) and widths.
#[test]
fn decode_rows_give_the_same_outputs_in_any_number() {
    let mut rng = Rng(11);
    for isa in Isa::available() {
        for dtype in FORMATS {
            let bs = dtype.block_size();
            for (m, k) in [(53usize, 3 * bs.max(32) + 1), (7, bs.max(32)), (18, 67)] {
                let k = (k / bs * bs).max(bs);
                let w =
                    Tensor::from_bytes(dtype, vec![m, k], random_weights(&mut rng, dtype, m, k));
                let xs: Vec<f32> = (0..21 * k).map(|_| rng.f32() - 0.5).collect();
                for mode in [Mode::Exact, Mode::Auto] {
                    let run = |n: usize, x: &[f32]| {
                        let mut out = vec![0f32; n * m];
                        let c = Compute {
                            mode: Some(mode),
                            threads: None,
                        };
                        let _scope = c.enter(false);
                        assert!(decode_rows());
                        let exact = kernel(isa, dtype, true);
                        let kern = if mode == Mode::Exact {
                            exact
                        } else {
                            auto_kernel(isa, dtype, kernel(isa, dtype, false), exact)
                        };
                        matmul_kernel(kern, &w, x, n, &mut out);
                        out
                    };
                    let what = format!("{isa:?} {mode:?} {dtype} {m}x{k} (decode)");
                    same_rows_in_any_number(&run, &xs, k, &what);
                }
            }
        }
    }
}

/// The 8-bit GEMM's activation packer of the 256-bit levels writes the AVX-512 one's bytes and
/// scales (both are ggml's Q8_0 rule): rows of several scales, halfway values, a zero row,
/// and a partial block of rows (the rest zero).
#[cfg(target_arch = "x86_64")]
#[test]
fn activation_packers_agree() {
    if !Isa::Avx512.is_available() {
        eprintln!("no AVX-512: nothing to compare the portable packer with");
        return;
    }
    let mut rng = Rng(0x51f1_5eed_0bad_cafe);
    let k = 96;
    for rows in [1usize, 7, 32] {
        let mut x: Vec<f32> = (0..rows * k)
            .map(|i| (rng.f32() - 0.5) * [0.01f32, 1.0, 300.0][i / k % 3])
            .collect();
        x[..32]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (i as f32 - 15.5) * 0.5);
        if rows > 3 {
            x[2 * k..3 * k].fill(0.0);
        }
        let (xb, fb) = int8::block_sizes(k);
        let run = |f: unsafe fn(*const f32, usize, usize, *mut u8, *mut f32, *mut f32)| {
            let (mut q, mut d, mut s) = (vec![0xAAu8; xb], vec![-1f32; fb], vec![-1f32; fb]);
            // SAFETY: x holds rows·k f32, the outputs the block sizes; k is a multiple of 32;
            // AVX-512 checked above (the portable packer needs nothing).
            unsafe {
                f(
                    x.as_ptr(),
                    rows,
                    k,
                    q.as_mut_ptr(),
                    d.as_mut_ptr(),
                    s.as_mut_ptr(),
                )
            };
            (q, d, s)
        };
        let (a, b) = (run(int8::pack_x), run(int8::pack_x_portable));
        assert_eq!(a.0, b.0, "{rows} rows: codes");
        assert_eq!(a.1, b.1, "{rows} rows: scales");
        assert_eq!(a.2, b.2, "{rows} rows: scaled sums");
    }
}

/// The SIMD 8-bit activation quantizers write what ggml's reference quantizers write, byte for
/// byte: random rows at several scales, all-zero blocks, values exactly halfway between two
/// quants, a largest magnitude held by both signs (Q8_K keeps the first), and blocks with a
/// NaN or an infinity (left to the reference: the function says so).
#[test]
fn simd_activation_quantizers_are_the_reference() {
    let Some(f) = active().vec.quant8 else {
        return;
    };
    let mut rng = Rng(17);
    for ad in [DType::Q8_0, DType::Q8_1, DType::Q8K] {
        let bs = ad.block_size();
        for case in 0..40 {
            let k = bs * (1 + case % 3);
            let scale = [1e-3f32, 1.0, 37.0, 1e4][case % 4];
            let mut x: Vec<f32> = (0..k).map(|_| (rng.f32() - 0.5) * scale).collect();
            match case % 8 {
                1 => x[..bs].fill(0.0),
                2 => {
                    // Halfway cases: with amax = 127 the scale is 1 and x·id = x.
                    x[0] = 127.0;
                    for (j, v) in x[1..bs].iter_mut().enumerate() {
                        *v = (j as f32 - 15.0) + 0.5;
                    }
                }
                3 => {
                    x[3] = -scale;
                    x[7] = scale;
                }
                4 => x[5] = -0.0,
                _ => {}
            }
            let qb = ad.bytes_for(k).unwrap();
            let mut want = vec![0u8; qb];
            quantize_row(ad, &x, &mut want).unwrap();
            let mut got = vec![0xa5u8; qb];
            let mut sums = if ad == DType::Q8_1 {
                vec![0u8; super::matmul::Q8_1_SIDE * (k / 32)]
            } else {
                Vec::new()
            };
            // SAFETY: the table holds the function only where its ISA is available.
            assert!(
                unsafe { f(ad, &x, &mut got, &mut sums) },
                "{ad} case {case}"
            );
            assert_eq!(
                got, want,
                "{ad} case {case}: blocks differ from the reference"
            );
            for (b, s) in want.chunks(36).zip(sums.chunks(super::matmul::Q8_1_SIDE)) {
                let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                let sq: i32 = b[4..].iter().map(|&v| i32::from(v as i8)).sum();
                assert_eq!(
                    s[..4],
                    (d * sq as f32).to_ne_bytes(),
                    "{ad} case {case}: sums"
                );
                assert_eq!(s[4..], d.to_ne_bytes(), "{ad} case {case}: d");
            }
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut y = x.clone();
                y[k - 2] = bad;
                let mut got = vec![0u8; qb];
                let mut sums = sums.clone();
                // SAFETY: as above.
                assert!(!unsafe { f(ad, &y, &mut got, &mut sums) }, "{ad} {bad}");
            }
        }
    }
}

/// A kernel that reads the rows-by-8 layout belongs to a format `packed` lays out, and every
/// format `packed` lays out has such a kernel on x86's VNNI levels or aarch64's dotprod level
/// (a layout no kernel reads would only cost the copy): on x86 all but Q2_K, Q3_K and Q6_K,
/// on aarch64 all but Q4_K, F16 and BF16. x86's F16/BF16 are read packed by their exact
/// kernels (the GEMM's chain) on every level.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn packed_kernels_have_a_packed_layout() {
    for dtype in FORMATS {
        #[cfg(target_arch = "x86_64")]
        if format_of(dtype).and_then(|f| f.x86.chain).is_some() {
            assert!(
                packed::packs(dtype),
                "{dtype}: a chain kernel without the layout"
            );
            for isa in Isa::available().into_iter().filter(|i| *i != Isa::Scalar) {
                let k = kernel(isa, dtype, true);
                assert!(k.packed && k.gemm_chain, "{dtype} {isa:?}");
            }
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        let (flags, best, not_here) = {
            let fast = format_of(dtype).and_then(|f| f.x86.fast);
            let flags: Vec<bool> = fast.iter().flatten().map(|&(_, p)| p).collect();
            // AVX-VNNI and AVX-512 read it alike.
            if let Some(f) = fast {
                assert_eq!(f[1].1, f[2].1, "{dtype}");
            }
            (
                flags,
                fast.map(|f| f[2].1),
                &[DType::Q2K, DType::Q3K, DType::Q6K][..],
            )
        };
        #[cfg(target_arch = "aarch64")]
        let (flags, best, not_here) = {
            let fast = format_of(dtype).and_then(|f| f.arm.fast).map(|(f, _)| f);
            let flags: Vec<bool> = fast.iter().flatten().map(|&(_, p)| p).collect();
            // Q4_K, IQ4_NL, F16 and BF16 are packed for x86's kernels only.
            let x86_only = &[DType::Q4K, DType::IQ4NL, DType::F16, DType::BF16][..];
            (flags, fast.map(|f| f[1].1), x86_only)
        };
        for (level, &p) in flags.iter().enumerate() {
            assert!(!p || packed::packs(dtype), "{dtype} level {level}");
        }
        if let Some(best) = best {
            assert_eq!(
                best,
                packed::packs(dtype) && !not_here.contains(&dtype),
                "{dtype} on the best level"
            );
        } else {
            assert!(
                !packed::packs(dtype) || not_here.contains(&dtype),
                "{dtype}: packed without 8-bit kernels"
            );
        }
    }
}

/// The pair layout puts each byte where `matmul::interleave_pairs`' docs say: three Q8_1
/// rows of two blocks (the third paired with zeros), every code and side value distinct.
#[test]
fn pair_layout_is_as_documented() {
    use super::matmul::{interleave_pairs, PAIR_BB, Q8_1_SIDE};
    let (n, k) = (3usize, 64usize);
    let nb = k / 32;
    let qs = nb * 36 + nb * Q8_1_SIDE;
    let q: Vec<u8> = (0..n * qs).map(|i| (i % 251) as u8).collect();
    let mut out = vec![0xa5u8; n.div_ceil(2) * nb * PAIR_BB];
    interleave_pairs(&q, n, k, qs, &mut out);
    for p in 0..2 {
        for b in 0..nb {
            let o = &out[(p * nb + b) * PAIR_BB..][..PAIR_BB];
            for i in 0..2 {
                let t = 2 * p + i;
                let code = |e: usize| if t < n { q[t * qs + b * 36 + 4 + e] } else { 0 };
                let side = |j: usize| {
                    if t < n {
                        q[t * qs + nb * 36 + b * Q8_1_SIDE..][j..j + 4].to_vec()
                    } else {
                        vec![0; 4]
                    }
                };
                for e in 0..32 {
                    assert_eq!(
                        o[16 * (e / 8) + 8 * i + e % 8],
                        code(e),
                        "pair {p} block {b} row {i} code {e}"
                    );
                }
                for lane in [i, i + 2] {
                    assert_eq!(
                        o[64 + 4 * lane..68 + 4 * lane],
                        side(4)[..],
                        "dx lane {lane}"
                    );
                    assert_eq!(
                        o[80 + 4 * lane..84 + 4 * lane],
                        side(0)[..],
                        "s lane {lane}"
                    );
                }
            }
        }
    }
}

/// `gelu_tanh` (x·σ(2z) through the active family's `exp`, whose every level is checked
/// above) against torch's tanh form in f64, over odd sizes, the parallel path included.
#[test]
fn gelu_tanh_matches_the_tanh_form() {
    for len in [1usize, 7, 255, 257, 33_000, 70_001] {
        let x: Vec<f32> = (0..len)
            .map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 97.0)
            .collect();
        let mut y = x.clone();
        super::gelu_tanh(&mut y);
        for (&x, &y) in x.iter().zip(&y) {
            let t = x as f64;
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let want = 0.5 * t * (1.0 + (c * (t + 0.044715 * t * t * t)).tanh());
            assert!(
                (y as f64 - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "gelu_tanh({x}) = {y}, want {want} (len {len})"
            );
        }
    }
}
