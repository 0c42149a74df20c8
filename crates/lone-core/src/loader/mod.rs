//! Model file loaders: GGUF and safetensors. Models ask for tensors by their Hugging Face
//! names; for GGUF files the names are mapped to llama.cpp's and llama's Q/K row permutation
//! is undone, so model code never sees which file it came from.

pub mod gguf;
pub mod safetensors;

use std::path::{Path, PathBuf};

use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

use self::gguf::GgufFile;
use self::safetensors::SafetensorsFiles;

/// `bytes` in an anonymous read-only map, so in-memory files (the fuzz targets') take the
/// same path as mapped ones.
pub(crate) fn anon_map(label: &Path, bytes: &[u8]) -> Result<memmap2::Mmap> {
    let mut m = memmap2::MmapOptions::new()
        .len(bytes.len())
        .map_anon()
        .map_err(|e| Error::io(label, e))?;
    m.copy_from_slice(bytes);
    m.make_read_only().map_err(|e| Error::io(label, e))
}

/// Where a model's weights come from.
pub enum WeightFiles {
    Safetensors(SafetensorsFiles),
    Gguf(GgufFile),
}

/// Named weights of one model.
pub struct Weights {
    pub files: WeightFiles,
    pub path: PathBuf,
    arch: Arch,
    n_heads: usize,
    n_kv_heads: usize,
}

/// llama.cpp's name for a HF tensor name.
pub fn hf_to_gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "lm_head.weight" => Some("output.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "model.embedding_norm.weight" => Some("token_embd_norm.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    if let Some(v) = vision_hf_to_gguf_name(hf) {
        return Some(v);
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (idx, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?; // suffix: weight / bias
    if rest == "feed_forward.expert_bias" {
        // LFM2-MoE's routing bias, a buffer (no `.weight`); the converter adds `.bias`
        return Some(format!("blk.{idx}.exp_probs_b.bias"));
    }
    let g = match module {
        "input_layernorm" | "operator_norm" => "attn_norm",
        "post_attention_layernorm" | "ffn_norm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" | "self_attn.out_proj" => "attn_output",
        "self_attn.q_norm" | "self_attn.q_layernorm" => "attn_q_norm",
        "self_attn.k_norm" | "self_attn.k_layernorm" => "attn_k_norm",
        "mlp.gate_proj" | "feed_forward.w1" => "ffn_gate",
        "mlp.up_proj" | "feed_forward.w3" => "ffn_up",
        "mlp.down_proj" | "feed_forward.w2" => "ffn_down",
        // LFM2-MoE: the router, and the experts stacked `[E, rows, cols]` under the names
        // llama.cpp's converter gives them before mapping (`feed_forward.experts.w1`, ...)
        "feed_forward.gate" => "ffn_gate_inp",
        "feed_forward.experts.w1" => "ffn_gate_exps",
        "feed_forward.experts.w3" => "ffn_up_exps",
        "feed_forward.experts.w2" => "ffn_down_exps",
        "conv.in_proj" => "shortconv.in_proj",
        "conv.conv" => "shortconv.conv",
        "conv.out_proj" => "shortconv.out_proj",
        // LFM3 (no llama.cpp arch yet; names as llama.cpp uses them elsewhere, see DEVELOPERS.md):
        // sandwich norms as gemma2/3's, the per-head output gate as bailingmoe3's.
        "post_operator_norm" => "post_attention_norm",
        "post_ffn_norm" => "post_ffw_norm",
        "self_attn.g_proj" | "self_attn.gate_proj" => "attn_gate",
        _ => return None,
    };
    Some(format!("blk.{idx}.{g}.{suffix}"))
}

/// llama.cpp's `mmproj` name for a LFM2-VL vision tower or projector tensor.
fn vision_hf_to_gguf_name(hf: &str) -> Option<String> {
    if let Some(rest) = hf.strip_prefix("model.multi_modal_projector.") {
        let (module, suffix) = rest.rsplit_once('.')?;
        let g = match module {
            "layer_norm" => "mm.input_norm",
            "linear_1" => "mm.1",
            "linear_2" => "mm.2",
            _ => return None,
        };
        return Some(format!("{g}.{suffix}"));
    }
    let rest = hf.strip_prefix("model.vision_tower.")?;
    let rest = rest.strip_prefix("vision_model.").unwrap_or(rest);
    let (module, suffix) = rest.rsplit_once('.')?;
    let fixed = match module {
        "embeddings.patch_embedding" => Some("v.patch_embd"),
        "embeddings.position_embedding" => Some("v.position_embd"),
        "post_layernorm" => Some("v.post_ln"),
        // LFM3-VL (DEVELOPERS.md "LFM3-VL in GGUF"); its patch embedding is two tensors
        "embedding_norm" => Some("v.norm_embd"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(format!("{f}.{suffix}"));
    }
    if let Some((idx, m)) = module
        .strip_prefix("layers.")
        .and_then(|r| r.split_once('.'))
    {
        let g = match m {
            "operator_norm" => "ln1",
            "ffn_norm" => "ln2",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.out_proj" => "attn_out",
            "self_attn.q_layernorm" | "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_layernorm" | "self_attn.k_norm" => "attn_k_norm",
            "conv.in_proj" => "shortconv.in_proj",
            "conv.spatial_conv" => "shortconv.conv",
            "conv.out_proj" => "shortconv.out_proj",
            "feed_forward.w1" => "ffn_gate",
            "feed_forward.w3" => "ffn_up",
            "feed_forward.w2" => "ffn_down",
            _ => return None,
        };
        return Some(format!("v.blk.{idx}.{g}.{suffix}"));
    }
    let (idx, m) = module.strip_prefix("encoder.layers.")?.split_once('.')?;
    let g = match m {
        "layer_norm1" => "ln1",
        "layer_norm2" => "ln2",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.out_proj" => "attn_out",
        "mlp.fc1" => "ffn_up",
        "mlp.fc2" => "ffn_down",
        _ => return None,
    };
    Some(format!("v.blk.{idx}.{g}.{suffix}"))
}

/// Undo convert_hf_to_gguf.py's permutation of llama Q/K rows (interleaved → halves RoPE).
/// GGUF row `h*hd + 2i + j` holds HF row `h*hd + j*hd/2 + i`.
fn unpermute_rows(t: &Tensor, n_head: usize) -> Result<Tensor> {
    let rows = t.n_rows();
    if n_head == 0 || !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
        return Err(Error::Config(format!(
            "cannot undo Q/K permutation: {rows} rows, {n_head} heads"
        )));
    }
    let hd = rows / n_head;
    let half = hd / 2;
    let rb = t.row_bytes();
    let mut out = vec![0u8; t.data().len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let src = h * hd + 2 * i + j;
                let dst = h * hd + j * half + i;
                out[dst * rb..(dst + 1) * rb].copy_from_slice(t.row(src));
            }
        }
    }
    // The file's copy is not read again: hand its pages back.
    t.release_pages();
    Ok(Tensor::from_bytes(t.dtype, t.shape.clone(), out))
}

impl Weights {
    pub fn open(path: &Path, cfg: &ModelConfig, files: WeightFiles) -> Weights {
        Weights {
            files,
            path: path.to_path_buf(),
            arch: cfg.arch,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
        }
    }

    /// The tensor with this HF name, if present.
    pub fn get_opt(&self, name: &str) -> Result<Option<Tensor>> {
        match &self.files {
            // A vision-language checkpoint keeps its language model under
            // `model.language_model.`.
            WeightFiles::Safetensors(st) => Ok(st
                .get(name)
                .or_else(|| {
                    let rest = name.strip_prefix("model.")?;
                    st.get(&format!("model.language_model.{rest}"))
                })
                .cloned()),
            WeightFiles::Gguf(g) => {
                let Some(gname) = hf_to_gguf_name(name) else {
                    return Ok(None);
                };
                let Some(t) = g.tensor(&gname) else {
                    return Ok(None);
                };
                if self.arch == Arch::Llama && t.shape.len() == 2 {
                    if name.ends_with("self_attn.q_proj.weight") {
                        return unpermute_rows(&t, self.n_heads).map(Some);
                    }
                    if name.ends_with("self_attn.k_proj.weight") {
                        return unpermute_rows(&t, self.n_kv_heads).map(Some);
                    }
                }
                Ok(Some(t))
            }
        }
    }

    /// The tensor with this HF name; an error naming the tensor and the file if it is missing
    /// or has the wrong number of elements.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.get_opt(name)?.ok_or_else(|| self.missing(name))?;
        let n: usize = shape.iter().product();
        if t.numel() != n || t.row_len() != *shape.last().unwrap_or(&1) {
            return Err(Error::BadShape {
                name: self.display_name(name),
                got: t.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        Ok(t)
    }

    /// A small tensor (norm weight, bias, conv taps) as f32.
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.get(name, shape)?.to_f32_vec())
    }

    fn display_name(&self, name: &str) -> String {
        match &self.files {
            WeightFiles::Safetensors(_) => name.to_string(),
            WeightFiles::Gguf(_) => hf_to_gguf_name(name).unwrap_or_else(|| name.to_string()),
        }
    }

    fn missing(&self, name: &str) -> Error {
        Error::MissingTensor {
            name: self.display_name(name),
            source_desc: self.path.display().to_string(),
        }
    }
}
