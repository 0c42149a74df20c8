//! LFM3-VL's vision side, as transformers 5.24's `modeling_lfm3_vl.py` and its image processor
//! (`Qwen2VLImageProcessor`, torchvision backend):
//!
//! - [`PatchProcessor`]: `smart_resize` to multiples of `patch · merge` within the pixel
//!   limits, torch's uint8 antialiased bicubic resize, fused rescale + normalize, and patches
//!   in merge-block order (each `merge × merge` block of patches consecutive). The processor
//!   repeats each image `temporal_patch_size` times along time; the copies are identical, so
//!   lone keeps one and sums the patch embedding's two temporal halves instead.
//! - [`Tower`]: a linear patch embedding and RMSNorm, then layers of gated 3×3 depthwise
//!   convolutions over the patch grid and bidirectional grouped-query attention (RMSNorm on
//!   each query and key head, 2D rotary positions), each followed by a SwiGLU MLP; the
//!   projector normalizes each patch, concatenates each block's patches and maps them through
//!   a GELU MLP to one language-model embedding per block.

use serde_json::Value;

use super::image::{self, Filter, Normalize, Rgb8};
use super::{bidirectional_attention, gelu_erf, LayerNorm};
use crate::error::{Error, Result};
use crate::kernels::{self, Pass};
use crate::loader::gguf::{GgufFile, MetaValue};
use crate::loader::{WeightFiles, Weights};
use crate::nn::{Linear, RmsNorm};
use crate::tensor::Tensor;

fn bad(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

/// The vision tower and projector of an `lfm3_vl` checkpoint (`vision_config` and the
/// projector fields of `config.json`).
#[derive(Clone, Debug, PartialEq)]
pub struct Lfm3VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub conv_kernel_size: usize,
    pub norm_eps: f32,
    pub rope_theta: f64,
    /// Per layer: attention (`true`) or convolution.
    pub attention: Vec<bool>,
    pub image_token_id: u32,
    pub projector_hidden_size: usize,
    pub projector_bias: bool,
    pub text_hidden_size: usize,
}

impl Lfm3VisionConfig {
    pub fn from_hf_json(v: &Value, text_hidden_size: usize) -> Result<Lfm3VisionConfig> {
        let vc = v
            .get("vision_config")
            .filter(|x| x.is_object())
            .ok_or_else(|| bad("config.json: an lfm3_vl model needs a vision_config"))?;
        let u = |o: &Value, k: &str, d: usize| super::usize_of(o, k, Some(d));
        let n_layers = u(vc, "num_hidden_layers", 14)?;
        let attention = match vc.get("layer_types") {
            None | Some(Value::Null) => (0..n_layers).map(|i| !(i < 2 || i % 2 == 1)).collect(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|t| match t.as_str() {
                    Some("conv") => Ok(false),
                    Some("full_attention") => Ok(true),
                    _ => Err(bad(format!(
                        "config.json: vision_config.layer_types holds {t}; lone reads \"conv\" \
                         and \"full_attention\""
                    ))),
                })
                .collect::<Result<Vec<bool>>>()?,
            Some(_) => return Err(bad("config.json: vision_config.layer_types must be a list")),
        };
        let rope = vc.get("rope_parameters");
        let rope_type = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
            .unwrap_or("axial");
        let act = v
            .get("projector_hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        if rope_type != "axial" || act != "gelu" {
            return Err(Error::Unsupported(format!(
                "LFM3-VL vision rope {rope_type:?} / projector activation {act:?}: lone runs \
                 axial rope and gelu"
            )));
        }
        let cfg = Lfm3VisionConfig {
            hidden_size: u(vc, "hidden_size", 1024)?,
            intermediate_size: u(vc, "intermediate_size", 2560)?,
            n_heads: u(vc, "num_attention_heads", 16)?,
            n_kv_heads: u(vc, "num_key_value_heads", 8)?,
            patch_size: u(vc, "patch_size", 16)?,
            temporal_patch_size: u(vc, "temporal_patch_size", 2)?,
            merge_size: u(vc, "spatial_merge_size", 2)?,
            conv_kernel_size: u(vc, "conv_kernel_size", 3)?,
            norm_eps: vc.get("norm_eps").and_then(Value::as_f64).unwrap_or(1e-5) as f32,
            rope_theta: rope
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .unwrap_or(1e6),
            image_token_id: u(v, "image_token_id", 125_030)? as u32,
            projector_hidden_size: u(v, "projector_hidden_size", 4096)?,
            projector_bias: v
                .get("projector_bias")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            text_hidden_size,
            attention,
        };
        cfg.validate(n_layers)?;
        Ok(cfg)
    }

    /// The tower and projector of an LFM3-VL mmproj (DEVELOPERS.md "LFM3-VL in GGUF");
    /// the projector's sizes and bias come from its tensors.
    pub fn from_mmproj(
        g: &GgufFile,
        text_hidden_size: usize,
        image_token_id: u32,
    ) -> Result<Lfm3VisionConfig> {
        let meta = |k: &str| g.meta(k);
        let n = |k: &str| -> Result<usize> {
            meta(k)
                .and_then(MetaValue::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("mmproj: {k} is missing")))
        };
        let is_conv = meta("clip.vision.is_conv_layers")
            .and_then(MetaValue::as_array)
            .ok_or_else(|| {
                bad("mmproj: clip.vision.is_conv_layers (one bool per layer) is missing")
            })?;
        let attention = is_conv
            .iter()
            .map(|x| {
                x.as_bool()
                    .map(|c| !c)
                    .ok_or_else(|| bad("mmproj: clip.vision.is_conv_layers must hold booleans"))
            })
            .collect::<Result<Vec<bool>>>()?;
        let tensor = |name: &str| {
            g.tensor(name)
                .ok_or_else(|| bad(format!("mmproj: {name} is missing")))
        };
        let n_heads = n("clip.vision.attention.head_count")?;
        let cfg = Lfm3VisionConfig {
            hidden_size: n("clip.vision.embedding_length")?,
            intermediate_size: n("clip.vision.feed_forward_length")?,
            n_heads,
            n_kv_heads: n("clip.vision.attention.head_count_kv").unwrap_or(n_heads),
            patch_size: n("clip.vision.patch_size")?,
            temporal_patch_size: (1..16)
                .find(|t| g.tensor(&format!("v.patch_embd.weight.{t}")).is_none())
                .unwrap_or(16),
            merge_size: n("clip.vision.spatial_merge_size")?,
            conv_kernel_size: if attention.iter().all(|&a| a) {
                3
            } else {
                n("clip.vision.conv_kernel_size")?
            },
            norm_eps: meta("clip.vision.attention.layer_norm_epsilon")
                .and_then(MetaValue::as_f64)
                .unwrap_or(1e-5) as f32,
            rope_theta: meta("clip.vision.rope.freq_base")
                .and_then(MetaValue::as_f64)
                .ok_or_else(|| bad("mmproj: clip.vision.rope.freq_base is missing"))?,
            image_token_id,
            projector_hidden_size: tensor("mm.1.weight")?.n_rows(),
            projector_bias: g.tensor("mm.1.bias").is_some(),
            text_hidden_size,
            attention,
        };
        cfg.validate(n("clip.vision.block_count")?)?;
        Ok(cfg)
    }

    fn validate(&self, n_layers: usize) -> Result<()> {
        let dims = [
            self.hidden_size,
            self.intermediate_size,
            self.n_heads,
            self.n_kv_heads,
            self.patch_size,
            self.temporal_patch_size,
            self.merge_size,
            self.conv_kernel_size,
            self.projector_hidden_size,
        ];
        let hd = self.hidden_size / self.n_heads.max(1);
        if dims.iter().any(|&d| d == 0 || d > crate::config::MAX_DIM)
            || self.attention.len() != n_layers
            || n_layers > crate::config::MAX_LAYERS
            || !self.hidden_size.is_multiple_of(self.n_heads)
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
            || !hd.is_multiple_of(4)
            || self.conv_kernel_size.is_multiple_of(2)
            || self.patch_size > 1024
            || self.temporal_patch_size > 16
            || self.merge_size > 64
            || !(self.rope_theta.is_finite() && self.rope_theta > 0.0)
        {
            return Err(bad(format!(
                "config.json: vision_config is inconsistent (hidden {} with {} heads / {} \
                 key-value heads (head size a multiple of 4), {} layer types for {n_layers} \
                 layers, patch {}, merge {}, an odd conv kernel {})",
                self.hidden_size,
                self.n_heads,
                self.n_kv_heads,
                self.attention.len(),
                self.patch_size,
                self.merge_size,
                self.conv_kernel_size
            )));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The image processor.

/// `Qwen2VLImageProcessor`'s settings (`preprocessor_config.json`, or `processor_config.json`'s
/// `image_processor`).
#[derive(Clone, Debug, PartialEq)]
pub struct PatchProcessor {
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    /// `size.shortest_edge`: the fewest pixels after resizing.
    pub min_pixels: usize,
    /// `size.longest_edge`: the most pixels after resizing.
    pub max_pixels: usize,
    pub do_resize: bool,
    pub filter: Filter,
    pub norm: Normalize,
}

/// OpenAI CLIP's mean and std (`OPENAI_CLIP_MEAN`, `OPENAI_CLIP_STD`).
const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

impl Default for PatchProcessor {
    /// transformers' class defaults with LFM3-VL's patch size.
    fn default() -> Self {
        PatchProcessor {
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            do_resize: true,
            filter: Filter::Bicubic,
            norm: Normalize {
                do_rescale: true,
                rescale_factor: 1.0 / 255.0,
                do_normalize: true,
                mean: CLIP_MEAN,
                std: CLIP_STD,
            },
        }
    }
}

impl PatchProcessor {
    /// The settings an mmproj records (pixel limits, mean and std), the model's patch sizes.
    pub fn from_mmproj(g: &GgufFile, cfg: &Lfm3VisionConfig) -> PatchProcessor {
        let mut c = PatchProcessor {
            patch_size: cfg.patch_size,
            temporal_patch_size: cfg.temporal_patch_size,
            merge_size: cfg.merge_size,
            ..PatchProcessor::default()
        };
        let pixels = |k: &str| g.meta(k).and_then(MetaValue::as_u64).map(|v| v as usize);
        c.min_pixels = pixels("clip.vision.image_min_pixels").unwrap_or(c.min_pixels);
        c.max_pixels = pixels("clip.vision.image_max_pixels").unwrap_or(c.max_pixels);
        if let Some(m) = super::meta_triple(g, "clip.vision.image_mean") {
            c.norm.mean = m;
        }
        if let Some(s) = super::meta_triple(g, "clip.vision.image_std") {
            c.norm.std = s;
        }
        c
    }

    /// Read `preprocessor_config.json` or `processor_config.json`; fields not given keep
    /// their defaults.
    pub fn from_json(v: &Value) -> Result<PatchProcessor> {
        let top = v
            .as_object()
            .ok_or_else(|| image::cfg_err("not a JSON object"))?;
        let ip = match top.get("image_processor") {
            Some(Value::Object(o)) => o,
            _ => top,
        };
        let mut c = PatchProcessor::default();
        let uint = |k: &str, d: usize| image::json_uint(ip, k, d);
        c.patch_size = uint("patch_size", c.patch_size)?;
        c.temporal_patch_size = uint("temporal_patch_size", c.temporal_patch_size)?;
        c.merge_size = uint("merge_size", c.merge_size)?;
        if let Some(Value::Object(size)) = ip.get("size") {
            c.min_pixels = image::json_uint(size, "shortest_edge", c.min_pixels)?;
            c.max_pixels = image::json_uint(size, "longest_edge", c.max_pixels)?;
        }
        c.min_pixels = uint("min_pixels", c.min_pixels)?;
        c.max_pixels = uint("max_pixels", c.max_pixels)?;
        c.do_resize = image::json_bool(ip, "do_resize", c.do_resize)?;
        c.filter = match ip.get("resample") {
            None | Some(Value::Null) => c.filter,
            Some(x) if x.as_u64() == Some(3) => Filter::Bicubic,
            Some(x) if x.as_u64() == Some(2) => Filter::Bilinear,
            Some(x) => {
                return Err(Error::Unsupported(format!(
                    "image processor resample {x}: lone implements bicubic (3) and bilinear (2)"
                )))
            }
        };
        c.norm.do_rescale = image::json_bool(ip, "do_rescale", c.norm.do_rescale)?;
        c.norm.rescale_factor = image::json_float(ip, "rescale_factor", c.norm.rescale_factor)?;
        c.norm.do_normalize = image::json_bool(ip, "do_normalize", c.norm.do_normalize)?;
        c.norm.mean = image::json_triple(ip, "image_mean", c.norm.mean)?;
        c.norm.std = image::json_triple(ip, "image_std", c.norm.std)?;
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<()> {
        let f = self.patch_size * self.merge_size;
        if !(1..=1024).contains(&self.patch_size)
            || !(1..=64).contains(&self.merge_size)
            || !(1..=16).contains(&self.temporal_patch_size)
        {
            return Err(image::cfg_err(
                "patch_size must be 1..=1024, merge_size 1..=64, temporal_patch_size 1..=16",
            ));
        }
        if self.max_pixels < f * f || self.max_pixels > 1 << 28 || self.min_pixels > self.max_pixels
        {
            return Err(image::cfg_err(format!(
                "size: longest_edge (max pixels) must be from (patch · merge)² = {} to 2^28 and \
                 at least shortest_edge (min pixels)",
                f * f
            )));
        }
        let n = &self.norm;
        if n.do_rescale && !(n.rescale_factor.is_finite() && n.rescale_factor != 0.0) {
            return Err(image::cfg_err(
                "rescale_factor must be a finite non-zero number",
            ));
        }
        if n.do_normalize
            && (n.std.iter().any(|&s| s == 0.0 || !s.is_finite())
                || n.mean.iter().any(|m| !m.is_finite()))
        {
            return Err(image::cfg_err(
                "image_std must be non-zero and image_mean/std finite",
            ));
        }
        Ok(())
    }

    /// `smart_resize(height, width, factor = patch · merge, min_pixels, max_pixels)`: the
    /// size `(height, width)` the image is resized to.
    pub fn target_size(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        let f = self.patch_size * self.merge_size;
        let (h, w) = (height as f64, width as f64);
        if h.max(w) / h.min(w) > 200.0 {
            return Err(Error::Input(format!(
                "an image of {width}×{height} pixels: the aspect ratio must be below 200"
            )));
        }
        let round = |x: f64| (x / f as f64).round_ties_even() as usize * f;
        let (mut hb, mut wb) = (round(h), round(w));
        if hb * wb > self.max_pixels {
            let beta = (h * w / self.max_pixels as f64).sqrt();
            hb = f.max((h / beta / f as f64).floor() as usize * f);
            wb = f.max((w / beta / f as f64).floor() as usize * f);
        } else if hb * wb < self.min_pixels {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            hb = (h * beta / f as f64).ceil() as usize * f;
            wb = (w * beta / f as f64).ceil() as usize * f;
        }
        Ok((hb, wb))
    }

    /// One image's patches: resized, normalized and cut as the processor does.
    pub fn preprocess(&self, img: &Rgb8) -> Result<Patches> {
        self.validate()?;
        img.check()?;
        let (p, m) = (self.patch_size, self.merge_size);
        let resized;
        let img = if self.do_resize {
            let (h, w) = self.target_size(img.height, img.width)?;
            if h.saturating_mul(w) > 1 << 28 {
                return Err(Error::Input(format!(
                    "an image of {}×{} pixels would be resized to {w}×{h}: too large",
                    img.width, img.height
                )));
            }
            resized = image::resize_aa(img, h, w, self.filter);
            &resized
        } else {
            if !img.height.is_multiple_of(p * m) || !img.width.is_multiple_of(p * m) {
                return Err(Error::Input(format!(
                    "an image of {}×{} pixels with do_resize off: both sides must be multiples \
                     of {}",
                    img.width,
                    img.height,
                    p * m
                )));
            }
            img
        };
        let table = self.norm.table();
        let (gh, gw) = (img.height / p, img.width / p);
        let mut pixels = Vec::with_capacity(gh * gw * 3 * p * p);
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for i in 0..m {
                    for j in 0..m {
                        let (py, px) = (bh * m + i, bw * m + j);
                        for (c, tc) in table.iter().enumerate() {
                            for y in 0..p {
                                let row = ((py * p + y) * img.width + px * p) * 3;
                                pixels
                                    .extend((0..p).map(|x| tc[img.data[row + x * 3 + c] as usize]));
                            }
                        }
                    }
                }
            }
        }
        Ok(Patches {
            grid_h: gh,
            grid_w: gw,
            merge: m,
            patch_len: 3 * p * p,
            pixels,
        })
    }
}

/// One image as the tower's input.
#[derive(Clone, Debug, PartialEq)]
pub struct Patches {
    /// Patch rows and columns (`image_grid_thw`'s h and w).
    pub grid_h: usize,
    pub grid_w: usize,
    pub merge: usize,
    /// Values per patch: `3 · p · p`.
    pub patch_len: usize,
    /// `[grid_h · grid_w, 3 · p · p]`: patches in merge-block order, each in (channel, y, x)
    /// order, one temporal copy.
    pub pixels: Vec<f32>,
}

impl Patches {
    /// The image's tokens in the prompt: one per merge block.
    pub fn n_tokens(&self) -> usize {
        self.grid_h * self.grid_w / (self.merge * self.merge)
    }

    /// transformers' `pixel_values` rows: each patch's channels with `temporal` copies of
    /// their `p × p` values (`[n, 3 · temporal · p · p]`).
    pub fn with_time(&self, temporal: usize) -> Vec<f32> {
        let pp = self.patch_len / 3;
        let mut out = Vec::with_capacity(self.pixels.len() * temporal);
        for row in self.pixels.chunks_exact(self.patch_len) {
            for ch in row.chunks_exact(pp) {
                for _ in 0..temporal {
                    out.extend_from_slice(ch);
                }
            }
        }
        out
    }

    /// The row of the patch at grid position `(y, x)`.
    fn row_of(&self, y: usize, x: usize) -> usize {
        let m = self.merge;
        ((y / m) * (self.grid_w / m) + x / m) * m * m + (y % m) * m + x % m
    }
}

// ---------------------------------------------------------------------------------------------
// The tower and projector.

// One per layer, a few dozen at most: the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
enum Mixer {
    /// `in_proj` → (input gate, output gate, values); the depthwise kernel `[hidden, k·k]`.
    Conv {
        in_proj: Linear,
        kernel: Vec<f32>,
        out_proj: Linear,
    },
    Attention {
        q: Linear,
        k: Linear,
        v: Linear,
        o: Linear,
        q_norm: RmsNorm,
        k_norm: RmsNorm,
    },
}

struct Layer {
    mixer: Mixer,
    operator_norm: RmsNorm,
    ffn_norm: RmsNorm,
    w1: Linear,
    w3: Linear,
    w2: Linear,
}

/// One image part-way through the tower ([`Tower::start`], [`Tower::run_layer`]).
pub struct TowerRun {
    /// The hidden state, `[n, hidden]`.
    pub x: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The layer [`Tower::run_layer`] runs next.
    pub next_layer: usize,
}

/// The LFM3-VL vision tower and projector, with the image processor.
pub struct Tower {
    pub cfg: Lfm3VisionConfig,
    pub processor: PatchProcessor,
    /// The patch embedding over one temporal copy (the copies' weights summed).
    patch: Linear,
    embedding_norm: RmsNorm,
    layers: Vec<Layer>,
    /// The rotary inverse frequencies of one axis (`head_dim / 4` of them).
    inv_freq: Vec<f32>,
    proj_norm: LayerNorm,
    linear_1: Linear,
    linear_2: Linear,
}

/// The first of `names` the checkpoint holds (`{name}.weight`); the Hub's and transformers'
/// spellings differ for a few modules.
fn present(ws: &Weights, names: &[String]) -> Result<String> {
    for n in names {
        if ws.get_opt(&format!("{n}.weight"))?.is_some() {
            return Ok(n.clone());
        }
    }
    Ok(names[0].clone())
}

/// An mmproj's patch embedding, one `[hidden, 3, p, p]` kernel per temporal copy
/// (`v.patch_embd.weight`, `.weight.1`, as llama.cpp's Qwen2/3-VL mmprojs), as the
/// checkpoint's `[hidden, 3·t·p·p]` linear map over (channel, time, y, x).
fn mmproj_patch_embedding(g: &GgufFile, d: usize, p: usize, t: usize) -> Result<Vec<f32>> {
    let pp = p * p;
    let mut full = vec![0f32; d * 3 * t * pp];
    for ti in 0..t {
        let name = match ti {
            0 => "v.patch_embd.weight".to_string(),
            _ => format!("v.patch_embd.weight.{ti}"),
        };
        let k = g
            .tensor(&name)
            .ok_or_else(|| bad(format!("mmproj: {name} is missing")))?;
        if k.shape != [d, 3, p, p] {
            return Err(Error::BadShape {
                name,
                got: k.shape.clone(),
                expected: vec![d, 3, p, p],
            });
        }
        let k = k.to_f32_vec();
        for o in 0..d {
            for c in 0..3 {
                let src = &k[(o * 3 + c) * pp..][..pp];
                full[o * 3 * t * pp + (c * t + ti) * pp..][..pp].copy_from_slice(src);
            }
        }
    }
    Ok(full)
}

impl Tower {
    pub fn load(ws: &Weights, cfg: Lfm3VisionConfig, processor: PatchProcessor) -> Result<Tower> {
        if processor.patch_size != cfg.patch_size
            || processor.merge_size != cfg.merge_size
            || processor.temporal_patch_size != cfg.temporal_patch_size
        {
            return Err(bad(format!(
                "the image processor's patch {} / merge {} / temporal {} differ from the \
                 model's {} / {} / {}",
                processor.patch_size,
                processor.merge_size,
                processor.temporal_patch_size,
                cfg.patch_size,
                cfg.merge_size,
                cfg.temporal_patch_size
            )));
        }
        let p = "model.vision_tower";
        let (d, eps) = (cfg.hidden_size, cfg.norm_eps);
        let hd = d / cfg.n_heads;
        let kvd = cfg.n_kv_heads * hd;
        let lin = |name: String, i, o| Linear::load(ws, &name, i, o, false);
        let mut layers = Vec::with_capacity(cfg.attention.len());
        for (l, &attn) in cfg.attention.iter().enumerate() {
            let q = format!("{p}.layers.{l}");
            let mixer = if attn {
                let a = format!("{q}.self_attn");
                let qn = present(ws, &[format!("{a}.q_layernorm"), format!("{a}.q_norm")])?;
                let kn = present(ws, &[format!("{a}.k_layernorm"), format!("{a}.k_norm")])?;
                Mixer::Attention {
                    q: lin(format!("{a}.q_proj"), d, d)?,
                    k: lin(format!("{a}.k_proj"), d, kvd)?,
                    v: lin(format!("{a}.v_proj"), d, kvd)?,
                    o: lin(format!("{a}.out_proj"), d, d)?,
                    q_norm: RmsNorm::load(ws, &qn, hd, eps)?,
                    k_norm: RmsNorm::load(ws, &kn, hd, eps)?,
                }
            } else {
                let k = cfg.conv_kernel_size;
                Mixer::Conv {
                    in_proj: lin(format!("{q}.conv.in_proj"), d, 3 * d)?,
                    kernel: ws.get_f32(&format!("{q}.conv.spatial_conv.weight"), &[d, 1, k, k])?,
                    out_proj: lin(format!("{q}.conv.out_proj"), d, d)?,
                }
            };
            layers.push(Layer {
                mixer,
                operator_norm: RmsNorm::load(ws, &format!("{q}.operator_norm"), d, eps)?,
                ffn_norm: RmsNorm::load(ws, &format!("{q}.ffn_norm"), d, eps)?,
                w1: lin(format!("{q}.feed_forward.w1"), d, cfg.intermediate_size)?,
                w3: lin(format!("{q}.feed_forward.w3"), d, cfg.intermediate_size)?,
                w2: lin(format!("{q}.feed_forward.w2"), cfg.intermediate_size, d)?,
            });
        }
        // The temporal copies of a still image are equal: Σ_t W[·, c, t, ·] · x[c, ·].
        let pp = cfg.patch_size * cfg.patch_size;
        let t = cfg.temporal_patch_size;
        let full = match &ws.files {
            WeightFiles::Gguf(g) => mmproj_patch_embedding(g, d, cfg.patch_size, t)?,
            WeightFiles::Safetensors(_) => {
                let pname = present(ws, &[format!("{p}.patchifier"), format!("{p}.patch_embed")])?;
                ws.get_f32(&format!("{pname}.weight"), &[d, 3 * t * pp])?
            }
        };
        let mut folded = vec![0f32; d * 3 * pp];
        for (o, row) in folded.chunks_exact_mut(3 * pp).enumerate() {
            for c in 0..3 {
                for k in 0..pp {
                    row[c * pp + k] = (0..t)
                        .map(|ti| full[o * 3 * t * pp + (c * t + ti) * pp + k])
                        .sum();
                }
            }
        }
        let spatial = hd / 2;
        let inv_freq = (0..spatial)
            .step_by(2)
            .map(|i| (1.0 / cfg.rope_theta.powf(i as f64 / spatial as f64)) as f32)
            .collect();
        let mp = "model.multi_modal_projector";
        let merged = d * cfg.merge_size * cfg.merge_size;
        Ok(Tower {
            patch: Linear::from_tensor(Tensor::from_f32(vec![d, 3 * pp], &folded)),
            embedding_norm: RmsNorm::load(ws, &format!("{p}.embedding_norm"), d, eps)?,
            layers,
            inv_freq,
            proj_norm: LayerNorm::load(ws, &format!("{mp}.layer_norm"), d, 1e-6)?,
            linear_1: Linear::load(
                ws,
                &format!("{mp}.linear_1"),
                merged,
                cfg.projector_hidden_size,
                cfg.projector_bias,
            )?,
            linear_2: Linear::load(
                ws,
                &format!("{mp}.linear_2"),
                cfg.projector_hidden_size,
                cfg.text_hidden_size,
                cfg.projector_bias,
            )?,
            processor,
            cfg,
        })
    }

    /// The rotary cos and sin of every patch row (`[n, head_dim]` each): the first half of
    /// each head's angles from the patch's grid row, the second from its column
    /// (`Qwen3VLVisionRotaryEmbedding`), in the rows' merge-block order.
    fn rotary(&self, img: &Patches) -> (Vec<f32>, Vec<f32>) {
        let nf = self.inv_freq.len();
        let hd = 4 * nf;
        let n = img.grid_h * img.grid_w;
        let (mut cos, mut sin) = (vec![0f32; n * hd], vec![0f32; n * hd]);
        for y in 0..img.grid_h {
            for x in 0..img.grid_w {
                let r = img.row_of(y, x);
                for (k, &f) in self.inv_freq.iter().enumerate() {
                    for (slot, pos) in [(k, y), (nf + k, x)] {
                        let a = pos as f32 * f;
                        let (s, c) = (a.sin(), a.cos());
                        for half in [0, 2 * nf] {
                            cos[r * hd + half + slot] = c;
                            sin[r * hd + half + slot] = s;
                        }
                    }
                }
            }
        }
        (cos, sin)
    }

    /// The gated depthwise convolution over the patch grid: `(B ⊙ X) ∗ kernel`, gated by `C`.
    fn conv(
        &self,
        in_proj: &Linear,
        kernel: &[f32],
        out_proj: &Linear,
        t: &[f32],
        img: &Patches,
    ) -> Vec<f32> {
        let d = self.cfg.hidden_size;
        let n = img.grid_h * img.grid_w;
        let y = in_proj.forward(t, n);
        let mut gated = vec![0f32; n * d];
        for (g, row) in gated.chunks_exact_mut(d).zip(y.chunks_exact(3 * d)) {
            for (c, g) in g.iter_mut().enumerate() {
                *g = row[c] * row[2 * d + c];
            }
        }
        let k = self.cfg.conv_kernel_size;
        let pad = k / 2;
        let mut out = vec![0f32; n * d];
        for py in 0..img.grid_h {
            for px in 0..img.grid_w {
                let r = img.row_of(py, px);
                let o = &mut out[r * d..(r + 1) * d];
                for dy in 0..k {
                    let Some(sy) = (py + dy).checked_sub(pad).filter(|&v| v < img.grid_h) else {
                        continue;
                    };
                    for dx in 0..k {
                        let Some(sx) = (px + dx).checked_sub(pad).filter(|&v| v < img.grid_w)
                        else {
                            continue;
                        };
                        let s = img.row_of(sy, sx);
                        let src = &gated[s * d..(s + 1) * d];
                        for (c, (ov, &sv)) in o.iter_mut().zip(src).enumerate() {
                            *ov += kernel[c * k * k + dy * k + dx] * sv;
                        }
                    }
                }
                let gate = &y[r * 3 * d + d..r * 3 * d + 2 * d];
                o.iter_mut().zip(gate).for_each(|(v, &g)| *v *= g);
            }
        }
        out_proj.forward(&out, n)
    }

    /// The tower's last hidden state for one image: `[n, hidden]`, rows in merge-block order.
    pub fn encode(&self, img: &Patches, pass: &Pass) -> Result<Vec<f32>> {
        let mut run = self.start(img, pass)?;
        while run.next_layer < self.layers.len() {
            self.run_layer(&mut run, img, pass);
        }
        Ok(run.x)
    }

    /// The layers of the tower (the pieces [`Tower::run_layer`] takes).
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The patch embedding and its norm: the state before the first layer.
    pub fn start(&self, img: &Patches, pass: &Pass) -> Result<TowerRun> {
        let n = img.grid_h * img.grid_w;
        let m = self.cfg.merge_size;
        if n == 0
            || img.merge != m
            || !img.grid_h.is_multiple_of(m)
            || !img.grid_w.is_multiple_of(m)
            || img.patch_len != self.patch.in_dim
            || img.pixels.len() != n * img.patch_len
        {
            return Err(Error::Input(format!(
                "an image of {}×{} patches of {} values (merge {}): the tower takes grids of \
                 multiples of {m} with {} values per patch",
                img.grid_h, img.grid_w, img.patch_len, img.merge, self.patch.in_dim
            )));
        }
        let _scope = pass.enter();
        let mut x = self.patch.forward(&img.pixels, n);
        self.embedding_norm.forward(&mut x);
        let (cos, sin) = self.rotary(img);
        Ok(TowerRun {
            x,
            cos,
            sin,
            next_layer: 0,
        })
    }

    /// Run `run`'s next layer over `img` (the image `start` was given).
    pub fn run_layer(&self, run: &mut TowerRun, img: &Patches, pass: &Pass) {
        let Some(l) = self.layers.get(run.next_layer) else {
            return;
        };
        run.next_layer += 1;
        let _scope = pass.enter();
        let cfg = &self.cfg;
        let n = img.grid_h * img.grid_w;
        let (d, heads, kv) = (cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads);
        let hd = d / heads;
        let x = &mut run.x;
        let t = l.operator_norm.apply(x);
        let y = match &l.mixer {
            Mixer::Conv {
                in_proj,
                kernel,
                out_proj,
            } => self.conv(in_proj, kernel, out_proj, &t, img),
            Mixer::Attention {
                q,
                k,
                v,
                o,
                q_norm,
                k_norm,
            } => {
                let [mut qs, mut ks, vs] = Linear::forward_many([q, k, v], &t, n);
                q_norm.forward(&mut qs);
                k_norm.forward(&mut ks);
                rotate(&mut qs, &run.cos, &run.sin, hd);
                rotate(&mut ks, &run.cos, &run.sin, hd);
                let a = bidirectional_attention(&qs, &ks, &vs, n, heads, kv, hd, pass);
                o.forward(&a, n)
            }
        };
        x.iter_mut().zip(&y).for_each(|(x, &y)| *x += y);
        let t = l.ffn_norm.apply(x);
        let [mut g, u] = Linear::forward_many([&l.w1, &l.w3], &t, n);
        kernels::silu_mul(&mut g, &u);
        let y = l.w2.forward(&g, n);
        x.iter_mut().zip(&y).for_each(|(x, &y)| *x += y);
    }

    /// The projector on the tower's output: one embedding per merge block, `[n / m², text
    /// hidden]`.
    pub fn project(&self, hidden: &[f32], pass: &Pass) -> Vec<f32> {
        let _scope = pass.enter();
        let mut x = hidden.to_vec();
        self.proj_norm.forward(&mut x);
        let rows = x.len() / self.linear_1.in_dim;
        let mut y = self.linear_1.forward(&x, rows);
        gelu_erf(&mut y);
        self.linear_2.forward(&y, rows)
    }
}

/// Rotate each `hd`-wide head of every row by its row's angles (`rotate_half` layout).
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], hd: usize) {
    let half = hd / 2;
    let width = x.len() / (cos.len() / hd);
    for (row, (c, s)) in x
        .chunks_exact_mut(width)
        .zip(cos.chunks_exact(hd).zip(sin.chunks_exact(hd)))
    {
        for head in row.chunks_exact_mut(hd) {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[i] - b * s[i];
                head[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2-VL's `smart_resize` over many sizes and three settings, from transformers
    /// (`tests/reference/vision/gen_image_refs.py`, `qwen_sizes`): the same size, or an error
    /// where it raises.
    #[test]
    fn target_size_matches_smart_resize() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/reference/vision/images/refs.json"
        );
        let refs: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = refs["qwen_sizes"].as_array().unwrap();
        assert!(cases.len() > 1000);
        let n = |v: &Value| v.as_u64().unwrap() as usize;
        for c in cases {
            let c = c.as_array().unwrap();
            let (h, w, f) = (n(&c[0]), n(&c[1]), n(&c[2]));
            let p = PatchProcessor {
                patch_size: f / 2,
                merge_size: 2,
                min_pixels: n(&c[3]),
                max_pixels: n(&c[4]),
                ..PatchProcessor::default()
            };
            let got = p.target_size(h, w).ok();
            let want = c[5].as_u64().map(|oh| (oh as usize, n(&c[6])));
            assert_eq!(got, want, "smart_resize({h}, {w}, {f}, {}, {})", c[3], c[4]);
        }
    }

    /// Bad processor settings are configuration errors, not panics later.
    #[test]
    fn bad_processor_settings_are_errors() {
        let bad = [
            serde_json::json!({"patch_size": 0}),
            serde_json::json!({"merge_size": 0}),
            serde_json::json!({"size": {"shortest_edge": 10, "longest_edge": 100}}),
            serde_json::json!({"size": {"shortest_edge": 1 << 20, "longest_edge": 1 << 19}}),
            serde_json::json!({"resample": 1}),
            serde_json::json!({"image_std": [0.0, 1.0, 1.0]}),
            serde_json::json!({"patch_size": "16"}),
        ];
        for v in bad {
            assert!(PatchProcessor::from_json(&v).is_err(), "{v} was accepted");
        }
        let ok = PatchProcessor::from_json(&serde_json::json!({"image_processor": {
            "patch_size": 14, "size": {"shortest_edge": 3136, "longest_edge": 1003520}, "resample": 3
        }}))
        .unwrap();
        assert_eq!(
            (ok.patch_size, ok.min_pixels, ok.max_pixels),
            (14, 3136, 1_003_520)
        );
    }
}
