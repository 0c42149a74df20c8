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
    n_gqa: u64,
    /// `{arch}.expert_count` (0 without experts).
    n_expert: u64,
    tied: bool,
    has_imatrix: bool,
}

fn mix_type(s: &mut State, ft: FileType, default: DType, cat: Category, ncols: usize) -> DType {
    use DType as D;
    use FileType as F;
    let mut t = default;
    if cat == Category::Output || (s.tied && cat == Category::TokenEmbd) {
        if !ncols.is_multiple_of(t.block_size()) {
            t = D::Q8_0;
        } else if t != D::Q8_0 {
            t = D::Q6K;
        }
    } else if cat == Category::TokenEmbd {
        // no change for these file types
    } else if is_attn_v(cat) {
        match ft {
            F::Q2K => t = if s.n_gqa >= 4 { D::Q4K } else { D::Q3K },
            F::Q3KM => t = if s.i_attention_wv < 2 { D::Q5K } else { D::Q4K },
            F::Q3KL => t = D::Q5K,
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
        }
    } else if cat == Category::FfnDown {
        let (i, n) = (s.i_ffn_down, s.n_layer);
        match ft {
            F::Q2K => t = D::Q3K,
            F::Q3KM => t = if i < n / 16 { D::Q5K } else { D::Q4K },
            F::Q3KL => t = D::Q5K,
            F::Q4KM if use_more_bits(i, n) => t = D::Q6K,
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
            if matches!(ft, F::Q2K | F::Q3KS | F::Q3KM | F::Q4KS | F::Q4KM) {
                t = D::Q5K;
            }
        } else {
            match ft {
                F::Q2K => t = D::Q3K,
                F::Q3KM => t = D::Q4K,
                F::Q3KL => t = D::Q5K,
                _ => {}
            }
        }
    } else if cat == Category::AttnQkv {
        match ft {
            F::Q3KM | F::Q3KL => t = D::Q4K,
            F::Q4KM => t = D::Q5K,
            F::Q5KM => t = D::Q6K,
            _ => {}
        }
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
        D::Q2K | D::Q3K => D::Q4_0,
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
    }
    Ok(plan)
}
