//! The vision side of a vision-language checkpoint as an `mmproj` GGUF (`lone convert
//! --mmproj`):
//! - LFM2-VL (`lfm2_vl`) as llama.cpp's `convert_hf_to_gguf.py --mmproj` writes it (the same
//!   bytes at F32/F16/BF16/Q8_0): its keys in the converter's order, the patch embedding as a
//!   `[hidden, 3, p, p]` convolution kernel;
//! - LFM3-VL (`lfm3_vl`), which llama.cpp does not have, in lone's layout (DEVELOPERS.md
//!   "LFM3-VL in GGUF"; `tests/reference/vision/generate_lfm3_vl.py` writes the same bytes).
//!
//! Tensor types follow the converter's rules for mmprojs: the patch embedding F16 in an F16
//! file and F32 otherwise, 1-D tensors, norms, position embeddings and the depthwise
//! convolution kernels F32, the rest the file's type (F16 where a row is not whole blocks).

use std::path::Path;

use serde_json::Value;

use super::{FileType, Plan, PlanTensor, RowOrder};
use crate::error::{Error, Result};
use crate::loader::gguf::MetaValue;
use crate::loader::hf_to_gguf_name;
use crate::loader::safetensors::SafetensorsFiles;
use crate::tensor::{DType, Tensor};

/// A tensor of the vision tower or projector (not the language model's).
pub fn is_vision_tensor(name: &str) -> bool {
    name.starts_with("model.vision_tower.") || name.starts_with("model.multi_modal_projector.")
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

/// The converter's type for one mmproj tensor.
fn tensor_type(gname: &str, n_dims: usize, row_len: usize, ftype: FileType) -> DType {
    let patch = gname.starts_with("v.patch_embd.weight");
    if n_dims <= 1 || gname.ends_with("_norm.weight") {
        return DType::F32;
    }
    if patch {
        return if ftype == FileType::F16 {
            DType::F16
        } else {
            DType::F32
        };
    }
    if gname.starts_with("v.position_embd.")
        || gname.contains(".shortconv.conv.")
        || !gname.ends_with(".weight")
    {
        return DType::F32;
    }
    let t = ftype.default_dtype();
    if row_len.is_multiple_of(t.block_size()) {
        t
    } else {
        DType::F16
    }
}

fn u32v(x: usize) -> MetaValue {
    MetaValue::U32(x as u32)
}

fn floats(v: &[f64]) -> MetaValue {
    MetaValue::Array(v.iter().map(|&x| MetaValue::F32(x as f32)).collect())
}

/// A whole number of `o` (a config object) or an error naming it.
fn uint(o: &Value, what: &str, key: &str) -> Result<usize> {
    o.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| bad(format!("config.json: {what}.{key} is missing")))
}

/// The image processor's settings (`processor_config.json`'s `image_processor`, or
/// `preprocessor_config.json`), `{}` without either.
fn processor(dir: &Path) -> Result<Value> {
    let v = crate::vision::processor_json(dir)?.unwrap_or(Value::Null);
    Ok(match v.get("image_processor") {
        Some(ip) if ip.is_object() => ip.clone(),
        _ if v.is_object() => v,
        _ => Value::Object(Default::default()),
    })
}

/// `image_mean` / `image_std` of the processor, or `default`.
fn triple(ip: &Value, key: &str, default: [f64; 3]) -> Result<Vec<f64>> {
    match ip.get(key) {
        None | Some(Value::Null) => Ok(default.to_vec()),
        Some(Value::Array(a)) if a.len() == 3 => a
            .iter()
            .map(|x| {
                x.as_f64()
                    .ok_or_else(|| bad(format!("image processor: {key} holds {x}")))
            })
            .collect(),
        Some(x) => Err(bad(format!("image processor: {key} is {x}, not 3 numbers"))),
    }
}

/// One output tensor from a checkpoint tensor's (possibly rearranged) values.
fn planned(name: String, shape: Vec<usize>, source: Tensor, ftype: FileType) -> PlanTensor {
    let row_len = shape.last().copied().unwrap_or(1);
    PlanTensor {
        dtype: tensor_type(&name, shape.len(), row_len, ftype),
        name,
        shape,
        source: source.into(),
        rows: RowOrder::Same,
        importance: None,
    }
}

/// The mmproj of the vision-language checkpoint in `dir` at `ftype` (F32, F16, BF16, Q8_0).
pub fn plan(dir: &Path, ftype: FileType) -> Result<Plan> {
    if !ftype.is_converter_type() {
        return Err(bad(format!(
            "an mmproj is written as F32, F16, BF16 or Q8_0 (as the converter writes them), \
             not {}",
            ftype.name()
        )));
    }
    let cfg = crate::error::read_json(&dir.join("config.json"))?;
    let model_type = cfg.get("model_type").and_then(Value::as_str).unwrap_or("");
    let lfm3 = match model_type {
        "lfm2_vl" => false,
        "lfm3_vl" => true,
        _ => {
            return Err(Error::Unsupported(format!(
                "{}: model_type {model_type:?} has no vision side lone writes (lfm2_vl, lfm3_vl)",
                dir.display()
            )))
        }
    };
    let vc = cfg
        .get("vision_config")
        .filter(|v| v.is_object())
        .ok_or_else(|| bad("config.json: a vision-language model needs a vision_config"))?;
    let tc = cfg
        .get("text_config")
        .filter(|v| v.is_object())
        .ok_or_else(|| bad("config.json: a vision-language model needs a text_config"))?;
    let st = SafetensorsFiles::open_dir(dir)?;
    let p = uint(vc, "vision_config", "patch_size")?;
    let d = uint(vc, "vision_config", "hidden_size")?;

    let mut tensors = Vec::new();
    for name in st.ordered_names().iter().filter(|n| is_vision_tensor(n)) {
        let t = st
            .get(name)
            .cloned()
            .ok_or_else(|| bad(format!("tensor '{name}' vanished")))?;
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        if lfm3 && (stem.ends_with(".patchifier") || stem.ends_with(".patch_embed")) {
            // [D, 3·T·p·p] over (channel, time, y, x): one [D, 3, p, p] kernel per time step.
            let pp = p * p;
            let t_steps = t.row_len() / (3 * pp).max(1);
            if t.shape.len() != 2 || t.shape[0] != d || t.row_len() != 3 * t_steps * pp {
                return Err(bad(format!("{name}: shape {:?}", t.shape)));
            }
            let w = t.to_f32_vec();
            for ti in 0..t_steps {
                let mut k = vec![0f32; d * 3 * pp];
                for o in 0..d {
                    for c in 0..3 {
                        let src = &w[o * 3 * t_steps * pp + (c * t_steps + ti) * pp..][..pp];
                        k[(o * 3 + c) * pp..][..pp].copy_from_slice(src);
                    }
                }
                let gname = match ti {
                    0 => "v.patch_embd.weight".to_string(),
                    _ => format!("v.patch_embd.weight.{ti}"),
                };
                let shape = vec![d, 3, p, p];
                tensors.push(planned(
                    gname,
                    shape.clone(),
                    Tensor::from_f32(shape, &k),
                    ftype,
                ));
            }
            continue;
        }
        let gname = hf_to_gguf_name(name).ok_or_else(|| {
            Error::Unsupported(format!(
                "cannot map tensor '{name}' of this {model_type} checkpoint to an mmproj name"
            ))
        })?;
        if !lfm3 && gname == "v.patch_embd.weight" && t.shape.len() == 2 {
            // The converter's `view(D, p, p, 3).permute(0, 3, 1, 2)`: a convolution kernel.
            if t.shape != [d, 3 * p * p] {
                return Err(bad(format!("{name}: shape {:?}", t.shape)));
            }
            let w = t.to_f32_vec();
            let mut k = vec![0f32; w.len()];
            for o in 0..d {
                for c in 0..3 {
                    for y in 0..p {
                        for x in 0..p {
                            k[((o * 3 + c) * p + y) * p + x] =
                                w[o * 3 * p * p + (y * p + x) * 3 + c];
                        }
                    }
                }
            }
            let shape = vec![d, 3, p, p];
            tensors.push(planned(
                gname,
                shape.clone(),
                Tensor::from_f32(shape, &k),
                ftype,
            ));
            continue;
        }
        let shape = t.shape.clone();
        tensors.push(planned(gname, shape, t, ftype));
    }
    if tensors.is_empty() {
        return Err(bad(format!(
            "{}: no vision tower or projector tensors",
            dir.display()
        )));
    }
    let total: u64 = tensors.iter().map(|t| t.numel() as u64).sum();

    let mut plan = Plan {
        kv: Vec::new(),
        tensors,
    };
    plan.set("general.architecture", MetaValue::String("clip".into()));
    plan.set("general.type", MetaValue::String("mmproj".into()));
    super::hf::authorship(
        &mut plan,
        dir,
        total,
        Some(super::naming::size_label(total)),
    );
    plan.set("general.file_type", MetaValue::U32(ftype.id()));
    plan.set("clip.has_vision_encoder", MetaValue::Bool(true));
    plan.set(
        "clip.vision.projection_dim",
        u32v(uint(tc, "text_config", "hidden_size")?),
    );
    let ip = processor(dir)?;
    let v = |k: &str| uint(vc, "vision_config", k);
    if !lfm3 {
        let layer = cfg
            .get("vision_feature_layer")
            .and_then(Value::as_i64)
            .unwrap_or(-1);
        if layer != -1 {
            return Err(Error::Unsupported(format!(
                "vision_feature_layer {layer}: lone writes LFM2-VL mmprojs of the last layer (-1)"
            )));
        }
        // The converter's fixed size for LFM2-VL's dynamic resolution.
        plan.set("clip.vision.image_size", u32v(256));
    }
    // Every mmproj's header (the converter's MmprojModel), then each family's keys.
    plan.set("clip.vision.patch_size", u32v(p));
    plan.set("clip.vision.embedding_length", u32v(d));
    plan.set(
        "clip.vision.feed_forward_length",
        u32v(v("intermediate_size")?),
    );
    plan.set("clip.vision.block_count", u32v(v("num_hidden_layers")?));
    plan.set(
        "clip.vision.attention.head_count",
        u32v(v("num_attention_heads")?),
    );
    let lfm3_defaults = crate::vision::lfm3::PatchProcessor::default();
    let (mean, std) = if lfm3 {
        (
            lfm3_defaults.norm.mean.map(f64::from),
            lfm3_defaults.norm.std.map(f64::from),
        )
    } else {
        ([0.5; 3], [0.5; 3])
    };
    plan.set(
        "clip.vision.image_mean",
        floats(&triple(&ip, "image_mean", mean)?),
    );
    plan.set(
        "clip.vision.image_std",
        floats(&triple(&ip, "image_std", std)?),
    );
    if lfm3 {
        let size = ip.get("size");
        let pixels = |k: &str, d: usize| {
            size.and_then(|s| s.get(k))
                .and_then(Value::as_u64)
                .map_or(d, |x| x as usize)
        };
        plan.set("clip.projector_type", MetaValue::String("lfm3".into()));
        plan.set(
            "clip.vision.attention.head_count_kv",
            u32v(v("num_key_value_heads")?),
        );
        let eps = vc.get("norm_eps").and_then(Value::as_f64).unwrap_or(1e-5);
        plan.set(
            "clip.vision.attention.layer_norm_epsilon",
            MetaValue::F32(eps as f32),
        );
        plan.set(
            "clip.vision.spatial_merge_size",
            u32v(v("spatial_merge_size")?),
        );
        plan.set(
            "clip.vision.image_min_pixels",
            u32v(pixels("shortest_edge", lfm3_defaults.min_pixels)),
        );
        plan.set(
            "clip.vision.image_max_pixels",
            u32v(pixels("longest_edge", lfm3_defaults.max_pixels)),
        );
        plan.set("clip.use_gelu", MetaValue::Bool(true));
        let kinds = crate::vision::lfm3::Lfm3VisionConfig::from_hf_json(&cfg, 1)?;
        plan.set(
            "clip.vision.is_conv_layers",
            MetaValue::Array(
                kinds
                    .attention
                    .iter()
                    .map(|a| MetaValue::Bool(!a))
                    .collect(),
            ),
        );
        plan.set("clip.vision.conv_kernel_size", u32v(kinds.conv_kernel_size));
        plan.set(
            "clip.vision.rope.freq_base",
            MetaValue::F32(kinds.rope_theta as f32),
        );
    } else {
        plan.set("clip.projector_type", MetaValue::String("lfm2".into()));
        let eps = vc
            .get("layer_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-6);
        plan.set(
            "clip.vision.attention.layer_norm_epsilon",
            MetaValue::F32(eps as f32),
        );
        let factor = cfg
            .get("downsample_factor")
            .and_then(Value::as_u64)
            .unwrap_or(2);
        plan.set(
            "clip.vision.projector.scale_factor",
            MetaValue::U32(factor as u32),
        );
        plan.set("clip.use_gelu", MetaValue::Bool(true));
    }
    plan.set("general.quantization_version", MetaValue::U32(2));
    Ok(plan)
}
