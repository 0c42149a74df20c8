//! Every block format against fixtures produced outside lone's Rust code
//! (`tests/reference/quant/generate.py`: gguf-py's numpy (de)quantizers, numpy ports of ggml's
//! Q8_1/Q8_K reference quantizers, random K-quant blocks; cross-checked there against ggml's
//! C code).

use std::path::{Path, PathBuf};

use lone_core::quant::{self, QuantError};
use lone_core::tensor::DType;
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/quant")
}

struct Case {
    file: String,
    dtype: DType,
    rows: usize,
    n: usize,
    quantize: bool,
    blob: Vec<u8>,
    meta: Value,
}

impl Case {
    fn section(&self, key: &str) -> Option<&[u8]> {
        let s = self.meta.get(key)?.as_array()?;
        let off = s[0].as_u64().unwrap() as usize;
        let len = s[1].as_u64().unwrap() as usize;
        Some(&self.blob[off..off + len])
    }
    fn f32s(&self, key: &str) -> Vec<f32> {
        let b = self
            .section(key)
            .unwrap_or_else(|| panic!("{}: no {key}", self.file));
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn f64s(&self, key: &str) -> Vec<f64> {
        let b = self.section(key).unwrap();
        b.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn blocks(&self) -> &[u8] {
        self.section("blocks").unwrap()
    }
    fn row_bytes(&self) -> usize {
        quant::row_bytes(self.dtype, self.n).unwrap()
    }
}

fn load_cases() -> Vec<Case> {
    let dir = fixture_dir();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let cases: Vec<Case> = manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let name = m["type"].as_str().unwrap();
            let dtype = DType::ALL
                .into_iter()
                .find(|d| d.name() == name)
                .unwrap_or_else(|| panic!("unknown type {name}"));
            let file = m["file"].as_str().unwrap().to_string();
            let case = Case {
                blob: std::fs::read(dir.join(&file)).unwrap(),
                file,
                dtype,
                rows: m["rows"].as_u64().unwrap() as usize,
                n: m["n"].as_u64().unwrap() as usize,
                quantize: m["quantize"].as_bool().unwrap(),
                meta: m.clone(),
            };
            // The fixture's sizes must agree with lone's idea of the format.
            assert_eq!(
                case.blocks().len(),
                case.rows * case.row_bytes(),
                "{}: block bytes",
                case.file
            );
            assert_eq!(case.f32s("deq").len(), case.rows * case.n);
            assert_eq!(case.f32s("x").len(), case.n);
            assert_eq!(case.f64s("dots").len(), case.rows);
            case
        })
        .collect();
    assert!(!cases.is_empty());
    cases
}

#[test]
fn fixtures_cover_every_format() {
    let cases = load_cases();
    for dtype in DType::ALL {
        let n = cases.iter().filter(|c| c.dtype == dtype).count();
        assert!(n >= 2, "{dtype}: {n} fixture cases");
        if !dtype.has_quantizer() {
            // Read-only formats: dequantization cases, and writing is refused.
            let case = cases.iter().find(|c| c.dtype == dtype).unwrap();
            let mut out = vec![0u8; case.row_bytes()];
            assert_eq!(
                quant::quantize_row(dtype, &vec![0.5; case.n], &mut out),
                Err(QuantError::NoQuantizer { dtype })
            );
            continue;
        }
        if dtype.is_iquant() {
            assert!(
                cases
                    .iter()
                    .any(|c| c.dtype == dtype && c.meta.get("weighted").is_some()),
                "{dtype}: no quantization fixture with importances"
            );
        }
        if quant::needs_importance(dtype) {
            let case = cases.iter().find(|c| c.dtype == dtype).unwrap();
            let mut out = vec![0u8; case.row_bytes()];
            assert_eq!(
                quant::quantize_row(dtype, &vec![0.5; case.n], &mut out),
                Err(QuantError::NeedsImportance { dtype })
            );
            continue;
        }
        assert!(
            cases.iter().any(|c| c.dtype == dtype && c.quantize),
            "{dtype}: no quantization fixture"
        );
    }
}

/// Dequantization is bit-exact: lone and gguf-py (and ggml) do the same f32 operations in
/// the same order, so there is no rounding slack to allow. Compared as bits, so -0.0 vs 0.0
/// and NaN payloads would count too.
#[test]
fn dequantize_matches_reference_bit_for_bit() {
    for case in load_cases() {
        let want = case.f32s("deq");
        let rb = case.row_bytes();
        for (r, (row, want)) in case
            .blocks()
            .chunks(rb)
            .zip(want.chunks(case.n))
            .enumerate()
        {
            let mut got = vec![f32::NAN; case.n];
            quant::dequantize_row(case.dtype, row, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} row {r} element {i}: got {g:e}, want {w:e}",
                    case.file
                );
            }
        }
        // All rows as one long row (rows are whole blocks): the same values.
        let mut all = vec![0.0f32; case.rows * case.n];
        quant::dequantize_row(case.dtype, case.blocks(), &mut all).unwrap();
        assert!(
            all.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}: whole-buffer dequantization differs",
            case.file
        );
    }
}

/// `dot_row` against the float64 dot of the reference dequantization with `x`.
///
/// Tolerance: since the dequantized values are exact (previous test), the only error is the
/// f32 arithmetic of the products and their sum. For any summation order of n products,
/// |computed − exact| ≤ γ_n · Σ|w_i x_i| with γ_n = n·u/(1 − n·u), u = 2⁻²⁴ (Higham,
/// *Accuracy and Stability of Numerical Algorithms*, §3.1). The float64 reference itself is
/// off by ~n·2⁻⁵³·Σ|w_i x_i|, negligible here. Rows with non-finite values (the F16 fixture
/// overflows to ±inf on purpose) must give a non-finite result.
#[test]
fn dot_matches_float64_within_summation_bound() {
    let u = f64::from(f32::EPSILON) / 2.0;
    for case in load_cases() {
        let x = case.f32s("x");
        let dots = case.f64s("dots");
        let mags = case.f64s("mags");
        let rb = case.row_bytes();
        for (r, row) in case.blocks().chunks(rb).enumerate() {
            let got = f64::from(quant::dot_row(case.dtype, row, &x).unwrap());
            let (want, mag) = (dots[r], mags[r]);
            if !mag.is_finite() {
                assert!(!got.is_finite(), "{} row {r}: {got} is finite", case.file);
                continue;
            }
            let nu = case.n as f64 * u;
            let tol = nu / (1.0 - nu) * mag;
            assert!(
                (got - want).abs() <= tol,
                "{} row {r}: dot {got:e}, want {want:e} (|err| {:e} > tol {tol:e})",
                case.file,
                (got - want).abs()
            );
        }
    }
}

/// Panics at the first byte of row `r` that differs, naming its block and offset.
fn assert_same_bytes(case: &Case, r: usize, got: &[u8], want: &[u8]) {
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let bb = case.dtype.block_bytes();
        panic!(
            "{} row {r}: byte {i} (block {}, offset {}) is {:#04x}, want {:#04x}",
            case.file,
            i / bb,
            i % bb,
            got[i],
            want[i]
        );
    }
}

/// Quantization is byte-for-byte ggml's `quantize_row_*_ref` (via gguf-py, whose numpy code
/// does the same f32 operations, the generator's numpy ports for Q8_1 and Q8_K, or ggml's C
/// itself for Q2_K..Q6_K).
#[test]
fn quantize_matches_reference_byte_for_byte() {
    let mut checked = 0;
    for case in load_cases().into_iter().filter(|c| c.quantize) {
        let src = case.f32s("src");
        let rb = case.row_bytes();
        for (r, (x, want)) in src.chunks(case.n).zip(case.blocks().chunks(rb)).enumerate() {
            let mut got = vec![0xa5u8; rb];
            quant::quantize_row(case.dtype, x, &mut got).unwrap();
            assert_same_bytes(&case, r, &got, want);
        }
        checked += 1;
    }
    // F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, Q2_K..Q6_K: two cases each;
    // one for each i-quant lone writes without importances.
    let iq = DType::ALL
        .into_iter()
        .filter(|d| d.is_iquant() && d.has_quantizer() && !quant::needs_importance(*d))
        .count();
    assert_eq!(checked, 30 + iq);
}

/// With importances (an imatrix row), quantization is byte-for-byte ggml's `quantize_*`
/// given `quant_weights` (C, no fused multiply-add), for every format that uses them.
#[test]
fn weighted_quantize_matches_ggml_byte_for_byte() {
    let mut types = Vec::new();
    for case in load_cases()
        .into_iter()
        .filter(|c| c.meta.get("weighted").is_some())
    {
        let src = case.f32s("src");
        let qw = case.f32s("qw");
        assert_eq!(qw.len(), case.n);
        let rb = case.row_bytes();
        for (r, (x, want)) in src.chunks(case.n).zip(case.blocks().chunks(rb)).enumerate() {
            let mut got = vec![0xa5u8; rb];
            quant::quantize_row_weighted(case.dtype, x, &qw, &mut got).unwrap();
            assert_same_bytes(&case, r, &got, want);
        }
        types.push(case.dtype);
    }
    types.dedup();
    // Q2_K..Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, and every i-quant lone writes.
    let iq = DType::ALL
        .into_iter()
        .filter(|d| d.is_iquant() && d.has_quantizer())
        .count();
    assert_eq!(types.len(), 9 + iq, "{types:?}");
}

#[test]
fn length_errors_are_reported_not_panicked() {
    let case = load_cases()
        .into_iter()
        .find(|c| c.dtype == DType::Q4K)
        .unwrap();
    let row = &case.blocks()[..case.row_bytes()];
    let mut out = vec![0.0f32; case.n - 1];
    assert_eq!(
        quant::dequantize_row(DType::Q4K, row, &mut out),
        Err(QuantError::NotBlockMultiple {
            dtype: DType::Q4K,
            n: case.n - 1
        })
    );
    let x = vec![0.0f32; case.n];
    assert_eq!(
        quant::dot_row(DType::Q4K, &row[1..], &x),
        Err(QuantError::ByteLen {
            dtype: DType::Q4K,
            n: case.n,
            expected: row.len(),
            got: row.len() - 1
        })
    );
    // Errors convert into the crate's error type with a readable message.
    let e: lone_core::Error = quant::dot_row(DType::Q4K, &row[1..], &x)
        .unwrap_err()
        .into();
    assert!(e.to_string().contains("Q4_K"), "{e}");
}

/// Every i-quant tensor llama-quantize wrote into the llama fixture's i-quant GGUFs, read and
/// dequantized by lone, is bit for bit gguf-py's dequantization of it: the SHA-256 of the f32
/// values (little endian, row-major) that `tests/reference/generate.py` recorded in meta.json
/// (`iq_dequant_sha256`), for each tensor of the file whose type is an i-quant.
#[test]
fn iq_files_dequantize_as_gguf_py_does() {
    use lone_core::loader::gguf::GgufFile;
    use sha2::{Digest, Sha256};

    let dir = fixture_dir().join("../fixtures/llama");
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    let mut seen = std::collections::HashSet::new();
    let files = [
        "model-iq4_nl.gguf",
        "model-iq4_xs.gguf",
        "model-iq2_xxs.gguf",
        "model-iq2_xs.gguf",
        "model-iq2_s.gguf",
        "model-iq3_xxs.gguf",
        "model-iq3_s.gguf",
        "model-iq1_s.gguf",
        "model-iq1_m.gguf",
        "model-tq1_0.gguf",
        "model-tq2_0.gguf",
    ];
    for file in files {
        let want = meta["gguf"][file]["iq_dequant_sha256"].as_object().unwrap();
        let types = meta["gguf"][file]["tensors"].as_object().unwrap();
        let g = GgufFile::open(dir.join(file)).unwrap();
        let iq: Vec<_> = g.tensors.iter().filter(|t| t.dtype.is_iquant()).collect();
        assert_eq!(iq.len(), want.len(), "{file}: i-quant tensors");
        for info in iq {
            // gguf-py's name of the tensor's type.
            assert_eq!(
                types[&info.name]["type"],
                info.dtype.name(),
                "{file} {}",
                info.name
            );
            let t = g.tensor(&info.name).unwrap();
            let digest = Sha256::digest(
                t.to_f32_vec()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            );
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(want[&info.name], hex, "{file} {}", info.name);
            seen.insert(info.dtype);
        }
    }
    let all: Vec<DType> = DType::ALL.into_iter().filter(|d| d.is_iquant()).collect();
    assert_eq!(
        seen.len(),
        all.len(),
        "every i-quant and ternary format: {seen:?}"
    );
}
