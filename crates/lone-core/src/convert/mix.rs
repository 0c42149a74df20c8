//! What `llama-quantize` writes for a file type (llama.cpp 0c1e570, `src/llama-quant.cpp`),
//! for the types lone produces (experts included: stacked `ffn_*_exps` quantize row by row
//! like any matrix, and a model of exactly 8 experts gets llama.cpp's Mixtral rules: attention
//! K and V in Q8_0, attention output in Q5_K for the K-quant mixes up to Q4_K_M):
//! - metadata copied in order, then `general.quantization_version` and `general.file_type`
//!   moved to the end;
//! - tensors ordered by layer (non-layer tensors first), then by name;
//! - which tensors are quantized (2-D `*weight`, not norms, not the short-conv kernel, …);
//! - the per-tensor type of each mix (`_S`, `_M`, `_L`: attention V, FFN down and attention
//!   output get more bits in some layers; the LM head, or a tied embedding, Q6_K), and the
//!   fallback when a row is not a whole number of blocks.

use super::{FileType, Plan};
use crate::error::{Error, Result};
use crate::imatrix::Imatrix;
use crate::loader::gguf::MetaValue;
use crate::tensor::DType;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", Category::AttnQkv),
        ("attn_kv_b.weight", Category::AttnKvB),
        ("attn_v.weight", Category::AttnV),
        ("attn_k.weight", Category::AttnK),
        ("attn_q.weight", Category::AttnQ),
        ("attn_output.weight", Category::AttnOutput),
        ("ffn_up", Category::FfnUp),
        ("ffn_gate", Category::FfnGate),
        ("ffn_down", Category::FfnDown),
    ];
    table
        .iter()
        .find(|(s, _)| name.contains(s))
        .map(|(_, c)| *c)
        .unwrap_or(Category::Other)
}

fn is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// llama-quantize's `tensor_allows_quantization` (the parts that apply to lone's families).
fn allows_quantization(name: &str, n_dims: usize) -> bool {
    if n_dims < 2 || !name.ends_with("weight") {
        return false;
    }
    const NEVER: [&str; 11] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "attn_rel_b.weight",
        "time_mix_",
        ".position_embd",
    ];
    !NEVER.iter().any(|s| name.contains(s))
        && name != "position_embd.weight"
        && name != "token_types.weight"
}

/// The layer number of `blk.N.…`, -1 for other tensors (`sscanf("blk.%d.")`).
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(-1)
}

fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

struct State {
    n_attention_wv: i64,
    i_attention_wv: i64,
    n_layer: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    n_gqa: u64,
    /// `{arch}.expert_count` (0 without experts).
    n_expert: u64,
    tied: bool,
    has_imatrix: bool,
}

/// The file types whose low-bit rules (`IQ2_*`, `IQ1_*`) llama.cpp groups together.
fn is_iq2_or_iq1(ft: FileType) -> bool {
    use FileType as F;
    matches!(
        ft,
        F::IQ2XXS | F::IQ2XS | F::IQ2S | F::IQ2M | F::IQ1S | F::IQ1M
    )
}

fn mix_type(s: &mut State, ft: FileType, default: DType, cat: Category, ncols: usize) -> DType {
    use DType as D;
    use FileType as F;
    let mut t = default;
    let iq2s = matches!(ft, F::IQ2S | F::IQ2M);
    if cat == Category::Output || (s.tied && cat == Category::TokenEmbd) {
        if !ncols.is_multiple_of(t.block_size()) {
            t = D::Q8_0;
        } else if is_iq2_or_iq1(ft) || ft == F::IQ3XXS {
            t = D::Q5K;
        } else if t != D::Q8_0 {
            t = D::Q6K;
        }
    } else if cat == Category::TokenEmbd {
        match ft {
            F::IQ2XXS | F::IQ2XS | F::IQ1S | F::IQ1M => t = D::Q2K,
            F::IQ2S | F::IQ2M | F::IQ3XXS => t = D::IQ3S,
            F::TQ1_0 | F::TQ2_0 => t = D::Q4K,
            _ => {}
        }
    } else if is_iq2_or_iq1(ft) {
        // The lowest-bit mixes: their own rules for V, K, FFN down and attention output.
        if is_attn_v(cat) {
            t = if s.n_gqa >= 4 || s.n_expert >= 4 {
                D::Q4K
            } else if iq2s {
                D::IQ3S
            } else {
                D::Q2K
            };
            s.i_attention_wv += 1;
        } else if s.n_expert == 8 && cat == Category::AttnK {
            t = D::Q4K;
        } else if cat == Category::FfnDown {
            if s.i_ffn_down < s.n_layer / 8 {
                t = if iq2s { D::IQ3S } else { D::Q2K };
            }
            s.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if s.n_expert == 8 {
                t = D::Q5K;
            } else if matches!(ft, F::IQ1S | F::IQ1M) {
                t = D::IQ2XXS;
            } else if iq2s {
                t = D::IQ3S;
            }
        }
    } else if is_attn_v(cat) {
        let gqa4 = s.n_gqa >= 4;
        match ft {
            F::Q2K => t = if gqa4 { D::Q4K } else { D::Q3K },
            F::IQ3XXS => {
                t = if gqa4 {
                    D::Q4K
                } else if !s.has_imatrix {
                    D::IQ3S
                } else {
                    D::IQ3XXS
                }
            }
            F::IQ3XS | F::IQ3S if gqa4 => t = D::Q4K,
            F::IQ3M => t = D::Q4K,
            F::Q3KM => t = if s.i_attention_wv < 2 { D::Q5K } else { D::Q4K },
            F::Q3KL => t = D::Q5K,
            F::IQ4NL | F::IQ4XS if gqa4 => t = D::Q5K,
            F::Q4KM | F::Q5KM if use_more_bits(s.i_attention_wv, s.n_attention_wv) => t = D::Q6K,
            F::Q4KS if s.i_attention_wv < 4 => t = D::Q5K,
            _ => {}
        }
        if s.n_expert == 8 {
            t = D::Q8_0;
        }
        s.i_attention_wv += 1;
    } else if cat == Category::AttnK {
        if s.n_expert == 8 {
            t = D::Q8_0;
        } else if ft == F::IQ3XS {
            t = D::IQ3XXS;
        } else if ft == F::IQ3XXS {
            t = D::IQ2S;
        }
    } else if cat == Category::AttnQ {
        if ft == F::IQ3XS {
            t = D::IQ3XXS;
        } else if ft == F::IQ3XXS {
            t = D::IQ2S;
        }
    } else if cat == Category::FfnDown {
        let (i, n) = (s.i_ffn_down, s.n_layer);
        match ft {
            F::Q2K => t = D::Q3K,
            F::IQ3XXS if !s.has_imatrix => t = if i < n / 8 { D::Q4K } else { D::Q3K },
            F::Q3KM => t = if i < n / 16 { D::Q5K } else { D::Q4K },
            F::IQ3M if i < n / 8 || (s.n_expert == 8 && use_more_bits(i, n)) => t = D::Q4K,
            F::Q3KL => t = D::Q5K,
            F::Q4KM if use_more_bits(i, n) => t = D::Q6K,
            F::IQ4NL | F::IQ4XS if i < n / 8 && !s.has_imatrix => t = D::Q5K,
            F::Q5KM if use_more_bits(i, n) => t = D::Q6K,
            F::Q4KS if i < n / 8 => t = D::Q5K,
            // With an imatrix, Q4_0/Q5_0 guard the first layers' ffn_down with a min.
            F::Q4_0 if s.has_imatrix && i < n / 8 => t = D::Q4_1,
            F::Q5_0 if s.has_imatrix && i < n / 8 => t = D::Q5_1,
            _ => {}
        }
        s.i_ffn_down += 1;
    } else if cat == Category::AttnOutput {
        if s.n_expert == 8 {
            let k_or_iq3 = [
                F::Q2K,
                F::IQ3XS,
                F::IQ3XXS,
                F::Q3KS,
                F::Q3KM,
                F::IQ4NL,
                F::Q4KS,
                F::Q4KM,
                F::IQ3S,
                F::IQ3M,
                F::IQ4XS,
            ];
            if k_or_iq3.contains(&ft) {
                t = D::Q5K;
            }
        } else {
            match ft {
                F::Q2K => t = D::Q3K,
                F::IQ3XXS => t = D::IQ3S,
                F::Q3KM | F::IQ3M => t = D::Q4K,
                F::Q3KL => t = D::Q5K,
                _ => {}
            }
        }
    } else if cat == Category::AttnQkv {
        match ft {
            F::Q3KM | F::Q3KL | F::IQ3M => t = D::Q4K,
            F::Q4KM => t = D::Q5K,
            F::Q5KM => t = D::Q6K,
            _ => {}
        }
    } else if cat == Category::FfnGate || cat == Category::FfnUp {
        let i = if cat == Category::FfnGate {
            &mut s.i_ffn_gate
        } else {
            &mut s.i_ffn_up
        };
        let n = s.n_layer;
        if ft == F::IQ3XS && *i >= n / 8 && *i < 7 * n / 8 {
            t = D::IQ3XXS;
        }
        *i += 1;
    }
    fallback(t, ncols)
}

/// `tensor_type_fallback`: a type whose blocks do not tile the row gives way.
fn fallback(t: DType, ncols: usize) -> DType {
    use DType as D;
    if ncols.is_multiple_of(t.block_size()) {
        return t;
    }
    let f = match t {
        D::IQ1S | D::IQ1M | D::IQ2XXS | D::IQ2XS | D::IQ2S | D::IQ3XXS | D::IQ3S | D::IQ4XS => {
            D::IQ4NL
        }
        D::Q2K | D::Q3K | D::TQ1_0 | D::TQ2_0 => D::Q4_0,
        D::Q4K => D::Q5_0,
        D::Q5K => D::Q5_1,
        D::Q6K => D::Q8_0,
        other => other,
    };
    if !ncols.is_multiple_of(f.block_size()) {
        D::F16
    } else {
        f
    }
}

/// llama-quantize's `tensor_requires_imatrix`: the types it will not make without importances
/// (except in the embedding and the LM head).
fn requires_imatrix(name: &str, t: DType) -> bool {
    let embd_or_head = matches!(category(name), Category::Output | Category::TokenEmbd);
    !embd_or_head
        && matches!(
            t,
            DType::IQ3XXS | DType::IQ2XXS | DType::IQ2XS | DType::IQ2S | DType::IQ1M | DType::IQ1S
        )
}

fn first_u64(v: Option<&MetaValue>) -> Option<u64> {
    match v? {
        MetaValue::Array(a) => a.first().and_then(|x| x.as_u64()),
        x => x.as_u64(),
    }
}

/// `plan` as llama-quantize would write it at `ftype`, with `imatrix` (and the file name it is
/// recorded under) as its `--imatrix`.
pub fn requantize(
    mut plan: Plan,
    ftype: FileType,
    imatrix: Option<(&Imatrix, &str)>,
) -> Result<Plan> {
    let arch = plan
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| Error::Config("the input has no general.architecture".into()))?
        .to_string();
    let n_layer = plan
        .get(&format!("{arch}.block_count"))
        .and_then(|v| v.as_u64())
        .ok_or_else(|| Error::Config(format!("the input has no {arch}.block_count")))?;
    let n_head = first_u64(plan.get(&format!("{arch}.attention.head_count"))).unwrap_or(0);
    let n_head_kv = first_u64(plan.get(&format!("{arch}.attention.head_count_kv"))).unwrap_or(0);

    plan.set_last("general.quantization_version", MetaValue::U32(2));
    plan.set_last("general.file_type", MetaValue::U32(ftype.id()));
    for k in ["split.no", "split.count", "split.tensors.count"] {
        plan.remove(k);
    }
    if let Some((im, file)) = imatrix {
        let short = |s: &str| s.chars().take(127).collect::<String>();
        plan.set_last("quantize.imatrix.file", MetaValue::String(short(file)));
        if let Some(d) = im.datasets.first() {
            plan.set_last("quantize.imatrix.dataset", MetaValue::String(short(d)));
        }
        plan.set_last(
            "quantize.imatrix.entries_count",
            MetaValue::U32(im.entries.len() as u32),
        );
        if im.chunk_count > 0 {
            plan.set_last(
                "quantize.imatrix.chunks_count",
                MetaValue::U32(im.chunk_count),
            );
        }
    }
    plan.tensors
        .sort_by(|a, b| (layer_of(&a.name), &a.name).cmp(&(layer_of(&b.name), &b.name)));

    let mut s = State {
        n_attention_wv: plan
            .tensors
            .iter()
            .filter(|t| is_attn_v(category(&t.name)))
            .count() as i64,
        i_attention_wv: 0,
        n_layer: n_layer as i64,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        n_gqa: n_head.checked_div(n_head_kv).unwrap_or(0),
        n_expert: plan
            .get(&format!("{arch}.expert_count"))
            .and_then(|v| v.as_u64())
            .unwrap_or(0),
        tied: !plan.tensors.iter().any(|t| t.name == "output.weight"),
        has_imatrix: imatrix.is_some(),
    };
    let default = ftype.default_dtype();
    for t in &mut plan.tensors {
        if !allows_quantization(&t.name, t.shape.len()) {
            continue;
        }
        t.dtype = if default.is_quantized() {
            mix_type(&mut s, ftype, default, category(&t.name), t.row_len())
        } else {
            default
        };
        if let Some((im, _)) = imatrix {
            if t.dtype.is_quantized() {
                if let Some(qw) = im.importance(&t.name) {
                    // One row of importances per matrix: per expert for a stack of experts.
                    let n_mat = if t.shape.len() == 3 { t.shape[0] } else { 1 };
                    if qw.len() != t.row_len() * n_mat {
                        if category(&t.name) != Category::TokenEmbd {
                            return Err(Error::Config(format!(
                                "imatrix size {} is different from tensor size {} for {}",
                                qw.len(),
                                t.row_len() * n_mat,
                                t.name
                            )));
                        }
                    } else {
                        t.importance = Some(std::sync::Arc::new(qw));
                    }
                }
            }
        }
        if requires_imatrix(&t.name, t.dtype) && t.importance.is_none() {
            return Err(match imatrix {
                None => Error::Config(format!(
                    "{} needs an importance matrix ({} for {}): make one with `lone imatrix` \
                     (or llama-imatrix) and pass it with --imatrix",
                    ftype.name(),
                    t.dtype,
                    t.name
                )),
                Some(_) => Error::Config(format!(
                    "the importance matrix has no entry for {}, which {} quantizes to {}",
                    t.name,
                    ftype.name(),
                    t.dtype
                )),
            });
        }
        if !t.dtype.has_quantizer() {
            return Err(Error::Config(format!(
                "lone cannot write {} yet ({} for {})",
                t.dtype,
                ftype.name(),
                t.name
            )));
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{PlanTensor, RowOrder};
    use crate::imatrix::{Entry, Imatrix};
    use crate::tensor::Tensor;

    /// Every file type, with and without an importance matrix, on models wide enough that no
    /// type falls back (`tests/reference/convert/mix_wide.py`: 8 and 16 layers of 256, GQA 2
    /// with a tied embedding and GQA 4 with an LM head): each tensor gets the type
    /// `llama-quantize --dry-run` chose.
    #[test]
    fn wide_models_get_llama_quantizes_types() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/reference/convert/mix-wide.json"
        );
        let refs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (mut checked, mut refused) = (0, 0);
        for v in refs["variants"].as_array().unwrap() {
            let mut base = Plan::default();
            for (k, val) in v["kv"].as_object().unwrap() {
                let val = match val {
                    serde_json::Value::String(s) => MetaValue::String(s.clone()),
                    n => MetaValue::U32(n.as_u64().unwrap() as u32),
                };
                base.set(k, val);
            }
            let dummy = Tensor::from_f32(vec![1], &[0.0]);
            let mut imatrix = Imatrix {
                entries: Default::default(),
                datasets: vec!["ones".into()],
                chunk_count: 1,
                chunk_size: 1,
                legacy: false,
            };
            for t in v["tensors"].as_array().unwrap() {
                let name = t[0].as_str().unwrap().to_string();
                let shape: Vec<usize> = t[1]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                if shape.len() == 2 && !name.contains("token_embd") {
                    let sums = vec![1.0; shape[1]];
                    imatrix.entries.insert(
                        name.clone(),
                        Entry {
                            sums,
                            counts: vec![1.0],
                        },
                    );
                }
                base.tensors.push(PlanTensor {
                    name,
                    shape,
                    dtype: DType::F32,
                    source: dummy.clone().into(),
                    rows: RowOrder::Same,
                    importance: None,
                });
            }
            for c in v["cases"].as_array().unwrap() {
                let ty = c["type"].as_str().unwrap();
                let ft = FileType::parse(ty).unwrap();
                let im = c["imatrix"].as_bool().unwrap();
                let r = requantize(base.clone(), ft, im.then_some((&imatrix, "ones.gguf")));
                if c["needs_imatrix"].as_bool().unwrap() {
                    // llama-quantize would refuse to quantize without one: so does lone.
                    let e = r.err().map(|e| e.to_string()).unwrap_or_default();
                    assert!(e.contains("needs an importance matrix"), "{ty}: {e}");
                    refused += 1;
                    continue;
                }
                let plan = r.unwrap_or_else(|e| panic!("{} {ty} imatrix {im}: {e}", v["name"]));
                let want = c["types"].as_array().unwrap();
                for (t, w) in v["tensors"].as_array().unwrap().iter().zip(want) {
                    let name = t[0].as_str().unwrap();
                    let got = plan.tensors.iter().find(|p| p.name == name).unwrap();
                    assert_eq!(
                        got.dtype.to_string(),
                        w.as_str().unwrap(),
                        "{} {ty} imatrix {im}: {name}",
                        v["name"]
                    );
                }
                checked += 1;
            }
        }
        // 2 models × 28 file types (all but F16 and BF16) × with and without an imatrix; the
        // IQ3_XXS, IQ3_XS and IQ2/IQ1 mixes without one are refused.
        assert_eq!((checked, refused), (2 * 28 * 2 - 2 * 8, 2 * 8));
    }
}
