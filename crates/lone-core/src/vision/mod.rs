//! Vision-language models: images → patches → a vision tower → a projector → embeddings that
//! take the place of the prompt's image tokens ([`crate::models::Batch::embeds`]).
//!
//! - LFM2-VL ([`image`], [`encoder`], [`Projector`]): tiles of a SigLIP2 NaFlex encoder and a
//!   pixel-unshuffle projector, as transformers' `modeling_lfm2_vl.py` and
//!   `modeling_siglip2.py`;
//! - LFM3-VL ([`lfm3`]): a convolution + attention tower over the whole image's patch grid.
//!
//! The f32 path matches transformers within 1e-4 (tests/vision.rs).

pub mod encoder;
pub mod image;
pub mod lfm3;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::kernels::{Compute, Mode, Pass, PassKind};
use crate::loader::Weights;
use crate::nn::Linear;
use crate::tensor::Tensor;

pub use encoder::Encoder;

/// The vision tower and projector of a vision-language checkpoint (`config.json`'s
/// `vision_config` and the projector fields around it).
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub patch_size: usize,
    /// Positions of the learned position-embedding grid (a square).
    pub num_patches: usize,
    pub layer_norm_eps: f32,
    /// The token the processor repeats once per image embedding.
    pub image_token_id: u32,
    pub downsample_factor: usize,
    pub projector_hidden_size: usize,
    pub projector_bias: bool,
    pub projector_layernorm: bool,
    /// The language model's hidden size (the projector's output).
    pub text_hidden_size: usize,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

pub(crate) fn usize_of(v: &Value, key: &str, default: Option<usize>) -> Result<usize> {
    match v.get(key) {
        Some(x) => x
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| bad(format!("config.json: {key} must be a non-negative integer"))),
        None => default.ok_or_else(|| bad(format!("config.json: {key} is missing"))),
    }
}

impl VisionConfig {
    /// Whether `model_type` names a vision-language checkpoint lone reads.
    pub fn is_vl_model_type(model_type: &str) -> bool {
        matches!(model_type, "lfm2_vl" | "lfm3_vl")
    }

    /// The vision part of a HF `config.json` (`None` for a text-only model).
    pub fn from_hf_json(v: &Value, text_hidden_size: usize) -> Result<Option<VisionConfig>> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "lfm2_vl" {
            return Ok(None);
        }
        let vc = v
            .get("vision_config")
            .filter(|x| x.is_object())
            .ok_or_else(|| {
                bad(format!(
                    "config.json: a {model_type} model needs a vision_config"
                ))
            })?;
        let act = vc
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu_pytorch_tanh");
        let pact = v
            .get("projector_hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        if act != "gelu_pytorch_tanh" || pact != "gelu" {
            return Err(Error::Unsupported(format!(
                "vision activations {act}/{pact}: lone runs gelu_pytorch_tanh in the encoder and \
                 gelu in the projector"
            )));
        }
        let cfg = VisionConfig {
            model_type: model_type.to_string(),
            hidden_size: usize_of(vc, "hidden_size", Some(768))?,
            intermediate_size: usize_of(vc, "intermediate_size", Some(3072))?,
            n_layers: usize_of(vc, "num_hidden_layers", Some(12))?,
            n_heads: usize_of(vc, "num_attention_heads", Some(12))?,
            patch_size: usize_of(vc, "patch_size", Some(16))?,
            num_patches: usize_of(vc, "num_patches", Some(256))?,
            layer_norm_eps: vc
                .get("layer_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            image_token_id: usize_of(v, "image_token_id", Some(396))? as u32,
            downsample_factor: usize_of(v, "downsample_factor", Some(2))?,
            projector_hidden_size: usize_of(v, "projector_hidden_size", Some(2560))?,
            projector_bias: v
                .get("projector_bias")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            projector_layernorm: v
                .get("projector_use_layernorm")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            text_hidden_size,
        };
        cfg.validate()?;
        Ok(Some(cfg))
    }

    /// The vision part of a llama.cpp `mmproj` GGUF (`clip.projector_type` `lfm2`, as
    /// `convert_hf_to_gguf.py --mmproj` writes LFM2-VL); `image_token_id` comes from the
    /// language model's vocabulary.
    pub fn from_mmproj(
        g: &crate::loader::gguf::GgufFile,
        text_hidden_size: usize,
        image_token_id: u32,
    ) -> Result<VisionConfig> {
        let s = |k: &str| g.meta(k).and_then(|v| v.as_str());
        let n = |k: &str| -> Result<usize> {
            g.meta(k)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("mmproj: {k} is missing")))
        };
        if s("general.architecture") != Some("clip") || s("clip.projector_type") != Some("lfm2") {
            return Err(Error::Unsupported(format!(
                "mmproj: architecture {:?}, projector {:?}; lone reads LFM2-VL's (clip, lfm2)",
                s("general.architecture").unwrap_or("none"),
                s("clip.projector_type").unwrap_or("none")
            )));
        }
        let hidden = n("clip.vision.embedding_length")?;
        let pos = g
            .tensor("v.position_embd.weight")
            .ok_or_else(|| bad("mmproj: v.position_embd.weight is missing"))?;
        let mm1 = g
            .tensor("mm.1.weight")
            .ok_or_else(|| bad("mmproj: mm.1.weight is missing"))?;
        let cfg = VisionConfig {
            model_type: "lfm2_vl".into(),
            hidden_size: hidden,
            intermediate_size: n("clip.vision.feed_forward_length")?,
            n_layers: n("clip.vision.block_count")?,
            n_heads: n("clip.vision.attention.head_count")?,
            patch_size: n("clip.vision.patch_size")?,
            num_patches: pos.numel() / hidden.max(1),
            layer_norm_eps: g
                .meta("clip.vision.attention.layer_norm_epsilon")
                .and_then(|v| v.as_f64())
                .unwrap_or(1e-6) as f32,
            image_token_id,
            downsample_factor: n("clip.vision.projector.scale_factor").unwrap_or(2),
            projector_hidden_size: mm1.n_rows(),
            projector_bias: g.tensor("mm.1.bias").is_some(),
            projector_layernorm: g.tensor("mm.input_norm.weight").is_some(),
            text_hidden_size,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let grid = (self.num_patches as f64).sqrt() as usize;
        let dims = [
            self.hidden_size,
            self.intermediate_size,
            self.n_layers,
            self.n_heads,
            self.patch_size,
            self.downsample_factor,
            self.projector_hidden_size,
        ];
        if dims.iter().any(|&d| d == 0 || d > crate::config::MAX_DIM)
            || grid * grid != self.num_patches
            || !self.hidden_size.is_multiple_of(self.n_heads)
            || self.n_layers > crate::config::MAX_LAYERS
        {
            return Err(bad(format!(
                "config.json: vision_config is inconsistent (hidden {} with {} heads, {} layers, \
                 patch {}, {} position patches (a square), downsample {})",
                self.hidden_size,
                self.n_heads,
                self.n_layers,
                self.patch_size,
                self.num_patches,
                self.downsample_factor
            )));
        }
        Ok(())
    }
}

/// Whether the model at `path` takes images (a checkpoint directory whose `config.json`
/// names a vision-language model), without loading it.
pub fn takes_images(path: &std::path::Path) -> bool {
    std::fs::read_to_string(path.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| {
            v.get("model_type")?
                .as_str()
                .map(VisionConfig::is_vl_model_type)
        })
        .unwrap_or(false)
}

/// Layer norm with weight and bias (torch's `nn.LayerNorm`), over each `w.len()`-wide row.
pub struct LayerNorm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub eps: f32,
}

impl LayerNorm {
    pub fn load(ws: &Weights, name: &str, dim: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            w: ws.get_f32(&format!("{name}.weight"), &[dim])?,
            b: ws.get_f32(&format!("{name}.bias"), &[dim])?,
            eps,
        })
    }

    pub fn forward(&self, x: &mut [f32]) {
        let d = self.w.len();
        for row in x.chunks_exact_mut(d) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = row
                .iter()
                .map(|&v| (v as f64 - mean) * (v as f64 - mean))
                .sum::<f64>()
                / d as f64;
            let inv = 1.0 / (var + self.eps as f64).sqrt();
            for ((v, &w), &b) in row.iter_mut().zip(&self.w).zip(&self.b) {
                *v = ((*v as f64 - mean) * inv) as f32 * w + b;
            }
        }
    }
}

/// The error function in f64: its Maclaurin series below 2.5, erfc's continued fraction
/// above (both to about 1e-13, far below f32's rounding).
fn erf(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Maclaurin series: erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)).
        let (mut term, mut sum, x2) = (ax, ax, ax * ax);
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(x) = e^{-x²}/(x√π) · 1/(1 + 1/(2x²)/(1 + 2/(2x²)/(1 + ...))) (Lentz).
        let x2 = ax * ax;
        let mut f = ax;
        let (mut c, mut d) = (ax, 0.0);
        for k in 1..200 {
            let a = k as f64 / 2.0;
            d = ax + a * d;
            d = if d == 0.0 { 1e-300 } else { 1.0 / d };
            c = ax + a / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-x2).exp() / (f * std::f64::consts::PI.sqrt())
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// torch's exact GELU: x·Φ(x).
pub fn gelu_erf(x: &mut [f32]) {
    for v in x {
        let t = *v as f64;
        *v = (0.5 * t * (1.0 + erf(t / std::f64::consts::SQRT_2))) as f32;
    }
}

/// Pixel-unshuffle, layer norm and the two-layer MLP mapping the encoder's patches to the
/// language model's embeddings (`Lfm2VlMultiModalProjector`).
pub struct Projector {
    pub norm: Option<LayerNorm>,
    pub linear_1: Linear,
    pub linear_2: Linear,
    pub factor: usize,
}

impl Projector {
    pub fn load(ws: &Weights, cfg: &VisionConfig) -> Result<Projector> {
        let f = cfg.downsample_factor;
        let inner = cfg.hidden_size * f * f;
        let p = "model.multi_modal_projector";
        Ok(Projector {
            norm: if cfg.projector_layernorm {
                Some(LayerNorm::load(
                    ws,
                    &format!("{p}.layer_norm"),
                    inner,
                    1e-5,
                )?)
            } else {
                None
            },
            linear_1: Linear::load(
                ws,
                &format!("{p}.linear_1"),
                inner,
                cfg.projector_hidden_size,
                cfg.projector_bias,
            )?,
            linear_2: Linear::load(
                ws,
                &format!("{p}.linear_2"),
                cfg.projector_hidden_size,
                cfg.text_hidden_size,
                cfg.projector_bias,
            )?,
            factor: f,
        })
    }

    /// One tile's encoder output `x` (`[h·w, c]`, patch rows of `w`) → `[(h/f)·(w/f), text
    /// hidden]`: each output gathers its f×f block of patches, row by row.
    pub fn forward(&self, x: &[f32], h: usize, w: usize) -> Vec<f32> {
        let f = self.factor;
        let c = x.len() / (h * w).max(1);
        let (bh, bw) = (h / f, w / f);
        let mut u = Vec::with_capacity(bh * bw * c * f * f);
        for br in 0..bh {
            for bc in 0..bw {
                for i in 0..f {
                    for j in 0..f {
                        let p = (br * f + i) * w + bc * f + j;
                        u.extend_from_slice(&x[p * c..(p + 1) * c]);
                    }
                }
            }
        }
        if let Some(n) = &self.norm {
            n.forward(&mut u);
        }
        let mut y = self.linear_1.forward(&u, bh * bw);
        gelu_erf(&mut y);
        self.linear_2.forward(&y, bh * bw)
    }
}

/// Bidirectional multi-head attention over `n` rows (`q`: `[n, heads·hd]`, `k` and `v`:
/// `[n, kv_heads·hd]`, each key/value head shared by `heads / kv_heads` query heads), the
/// heads spread over the pool (each head's products then run on its thread alone).
#[allow(clippy::too_many_arguments)]
pub fn bidirectional_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    pass: &Pass,
) -> Vec<f32> {
    let scale = (hd as f32).powf(-0.5);
    let group = heads / kv_heads;
    let head_of = |m: &[f32], width: usize, h: usize| -> Vec<f32> {
        m.chunks_exact(width)
            .flat_map(|row| row[h * hd..(h + 1) * hd].iter().copied())
            .collect()
    };
    let done: Vec<std::sync::Mutex<Vec<f32>>> = (0..heads)
        .map(|_| std::sync::Mutex::new(Vec::new()))
        .collect();
    crate::kernels::parallel_for(heads, 1, &|range| {
        let _scope = pass.enter();
        for h in range {
            let kvh = h / group;
            let qh = head_of(q, heads * hd, h);
            let (kh, vh) = (
                head_of(k, kv_heads * hd, kvh),
                head_of(v, kv_heads * hd, kvh),
            );
            // scores[i][j] = q_i · k_j: K as the "weight" of a GEMM over Q's rows.
            let mut scores = vec![0f32; n * n];
            crate::kernels::matmul(&Tensor::from_f32(vec![n, hd], &kh), &qh, n, &mut scores);
            for row in scores.chunks_exact_mut(n) {
                row.iter_mut().for_each(|s| *s *= scale);
                crate::kernels::softmax(row);
            }
            // out_i = Σ_j p_ij v_j: Vᵀ (`[hd, n]`) as the weight over the probability rows.
            let mut vt = vec![0f32; hd * n];
            for (j, row) in vh.chunks_exact(hd).enumerate() {
                for (c, &val) in row.iter().enumerate() {
                    vt[c * n + j] = val;
                }
            }
            let mut oh = vec![0f32; n * hd];
            crate::kernels::matmul(&Tensor::from_f32(vec![hd, n], &vt), &scores, n, &mut oh);
            *done[h].lock().unwrap_or_else(|e| e.into_inner()) = oh;
        }
    });
    let d = heads * hd;
    let mut out = vec![0f32; n * d];
    for (h, oh) in done.into_iter().enumerate() {
        let oh = oh.into_inner().unwrap_or_else(|e| e.into_inner());
        for (dst, src) in out.chunks_exact_mut(d).zip(oh.chunks_exact(hd)) {
            dst[h * hd..(h + 1) * hd].copy_from_slice(src);
        }
    }
    out
}

/// LFM2-VL's vision side: image processor, SigLIP2 encoder and projector.
pub struct Lfm2Tower {
    pub cfg: VisionConfig,
    pub processor: image::ProcessorConfig,
    pub encoder: Encoder,
    pub projector: Projector,
}

/// The vision tower of a vision-language model, with its image processor.
pub enum Tower {
    Lfm2(Lfm2Tower),
    Lfm3(lfm3::Tower),
}

/// The vision side of a vision-language model.
pub struct Vision {
    /// The token the processor repeats once per image embedding.
    pub image_token_id: u32,
    /// The language model's hidden size (an embedding's width).
    pub text_hidden_size: usize,
    pub tower: Tower,
    /// Recently encoded images by content (a conversation sends its images again each turn).
    encoded: std::sync::Mutex<EncodedImages>,
}

/// One encoded image: its placeholder text, tiles and embeddings.
#[derive(Clone)]
struct Encoded {
    placeholder: String,
    tiles: usize,
    embeds: std::sync::Arc<Vec<f32>>,
}

/// The most embedding bytes [`EncodedImages`] keeps.
const ENCODED_BYTES: usize = 64 << 20;

/// Encoded images keyed by a digest of their pixels, the image processor's settings and the
/// numeric mode; the least recently used go first past [`ENCODED_BYTES`].
#[derive(Default)]
struct EncodedImages {
    entries: std::collections::VecDeque<([u8; 32], Encoded)>,
    bytes: usize,
}

impl EncodedImages {
    fn get(&mut self, key: &[u8; 32]) -> Option<Encoded> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        let e = self.entries.remove(i)?;
        let out = e.1.clone();
        self.entries.push_back(e);
        Some(out)
    }

    fn insert(&mut self, key: [u8; 32], e: Encoded) {
        let size = e.embeds.len() * 4;
        if size > ENCODED_BYTES {
            return;
        }
        self.bytes += size;
        self.entries.push_back((key, e));
        while self.bytes > ENCODED_BYTES {
            match self.entries.pop_front() {
                Some((_, old)) => self.bytes -= old.embeds.len() * 4,
                None => break,
            }
        }
    }
}

/// The most pixels an image may declare before it is decoded (PIL's decompression-bomb
/// error threshold is about 179 M; a phone photo has 12–50 M).
pub const MAX_IMAGE_PIXELS: u64 = 1 << 27;

/// What LFM2-VL's chat template (or a raw prompt) writes where an image goes; the processor
/// expands each into the image's placeholder tokens.
pub const IMAGE_MARKER: &str = "<image>";

/// LFM3-VL's image token: the chat template writes one between `<|vision_start|>` and
/// `<|vision_end|>`; the processor repeats it once per embedding.
pub const IMAGE_PAD: &str = "<|image_pad|>";

/// A prompt with images: its tokens and the embeddings of its image rows.
pub struct ImagePrompt {
    pub ids: Vec<u32>,
    pub embeds: crate::engine::PromptEmbeds,
    /// Encoder inputs per image: tiles and image tokens (for logs and `--json`).
    pub images: Vec<(usize, usize)>,
    /// Time spent processing and encoding the images.
    pub encode_time: std::time::Duration,
    /// Images whose encoding came from an earlier prompt (the same pixels, settings and mode).
    pub reused: usize,
}

/// The vision models an mmproj can hold.
enum MmprojKind {
    Lfm2,
    Lfm3,
}

/// An mmproj's model, from `general.architecture` and `clip.projector_type`.
fn mmproj_projector(g: &crate::loader::gguf::GgufFile) -> Result<MmprojKind> {
    let s = |k: &str| g.meta(k).and_then(|v| v.as_str());
    match (s("general.architecture"), s("clip.projector_type")) {
        (Some("clip"), Some("lfm2")) => Ok(MmprojKind::Lfm2),
        (Some("clip"), Some("lfm3")) => Ok(MmprojKind::Lfm3),
        (arch, proj) => Err(Error::Unsupported(format!(
            "mmproj: architecture {:?}, projector {:?}; lone reads LFM2-VL's (clip, lfm2) and \
             LFM3-VL's (clip, lfm3)",
            arch.unwrap_or("none"),
            proj.unwrap_or("none")
        ))),
    }
}

/// A three-float array of an mmproj's metadata (the image mean and std).
fn meta_triple(g: &crate::loader::gguf::GgufFile, key: &str) -> Option<[f32; 3]> {
    let a = g.meta(key)?.as_array()?;
    let v: Vec<f32> = a
        .iter()
        .filter_map(|x| x.as_f64())
        .map(|x| x as f32)
        .collect();
    v.try_into().ok()
}

/// The image processor's settings in `dir` (`processor_config.json`, then
/// `preprocessor_config.json`), if either is there.
pub(crate) fn processor_json(dir: &std::path::Path) -> Result<Option<Value>> {
    for name in ["processor_config.json", "preprocessor_config.json"] {
        let path = dir.join(name);
        if path.is_file() {
            return crate::error::read_json(&path).map(Some);
        }
    }
    Ok(None)
}

impl Vision {
    /// The vision side of the HF checkpoint in `dir` (`None` for a text-only model);
    /// `processor_config.json` or `preprocessor_config.json` configures the image processor
    /// (transformers' defaults without either).
    pub fn load_hf(
        ws: &Weights,
        dir: &std::path::Path,
        text_hidden_size: usize,
    ) -> Result<Option<Vision>> {
        let v = crate::error::read_json(&dir.join("config.json"))?;
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let pj = || processor_json(dir);
        let (image_token_id, tower) = match model_type {
            "lfm2_vl" => {
                let Some(cfg) = VisionConfig::from_hf_json(&v, text_hidden_size)? else {
                    return Ok(None);
                };
                let processor = match pj()? {
                    Some(j) => image::ProcessorConfig::from_json(&j)?,
                    None => image::ProcessorConfig::default(),
                };
                (
                    cfg.image_token_id,
                    Tower::Lfm2(Lfm2Tower::load(ws, cfg, processor)?),
                )
            }
            "lfm3_vl" => {
                let cfg = lfm3::Lfm3VisionConfig::from_hf_json(&v, text_hidden_size)?;
                let processor = match pj()? {
                    Some(j) => lfm3::PatchProcessor::from_json(&j)?,
                    None => lfm3::PatchProcessor::default(),
                };
                (
                    cfg.image_token_id,
                    Tower::Lfm3(lfm3::Tower::load(ws, cfg, processor)?),
                )
            }
            _ => return Ok(None),
        };
        Ok(Some(Vision {
            image_token_id,
            text_hidden_size,
            tower,
            encoded: Default::default(),
        }))
    }

    /// The vision side from a llama.cpp `mmproj` GGUF beside a language model whose
    /// vocabulary has `<image>`; the image processor from a `processor_config.json` or
    /// `preprocessor_config.json` next to the mmproj, else transformers' LFM2-VL defaults
    /// (llama.cpp's too), with the mean and std the mmproj records.
    pub fn load_mmproj(
        path: &std::path::Path,
        text_cfg: &crate::config::ModelConfig,
        image_token_id: u32,
    ) -> Result<Vision> {
        let g = crate::loader::gguf::GgufFile::open(path)?;
        let json = path.parent().map(processor_json).transpose()?.flatten();
        let tower = match mmproj_projector(&g)? {
            MmprojKind::Lfm2 => {
                let cfg = VisionConfig::from_mmproj(&g, text_cfg.hidden_size, image_token_id)?;
                let mut processor = match json {
                    Some(j) => image::ProcessorConfig::from_json(&j)?,
                    None => image::ProcessorConfig::default(),
                };
                if let Some(m) = meta_triple(&g, "clip.vision.image_mean") {
                    processor.image_mean = m;
                }
                if let Some(s) = meta_triple(&g, "clip.vision.image_std") {
                    processor.image_std = s;
                }
                let ws = Weights::open(path, text_cfg, crate::loader::WeightFiles::Gguf(g));
                Tower::Lfm2(Lfm2Tower::load(&ws, cfg, processor)?)
            }
            MmprojKind::Lfm3 => {
                let cfg =
                    lfm3::Lfm3VisionConfig::from_mmproj(&g, text_cfg.hidden_size, image_token_id)?;
                let processor = match json {
                    Some(j) => lfm3::PatchProcessor::from_json(&j)?,
                    None => lfm3::PatchProcessor::from_mmproj(&g, &cfg),
                };
                let ws = Weights::open(path, text_cfg, crate::loader::WeightFiles::Gguf(g));
                Tower::Lfm3(lfm3::Tower::load(&ws, cfg, processor)?)
            }
        };
        Ok(Vision {
            image_token_id,
            text_hidden_size: text_cfg.hidden_size,
            tower,
            encoded: Default::default(),
        })
    }

    /// The image token an mmproj's language model must have: `<image>` for LFM2-VL,
    /// `<|image_pad|>` for LFM3-VL.
    pub fn mmproj_marker(path: &std::path::Path) -> Result<&'static str> {
        let g = crate::loader::gguf::GgufFile::open(path)?;
        Ok(match mmproj_projector(&g)? {
            MmprojKind::Lfm2 => IMAGE_MARKER,
            MmprojKind::Lfm3 => IMAGE_PAD,
        })
    }

    /// LFM2-VL's tower, if this is one.
    pub fn lfm2(&self) -> Option<&Lfm2Tower> {
        match &self.tower {
            Tower::Lfm2(t) => Some(t),
            Tower::Lfm3(_) => None,
        }
    }

    /// LFM2-VL's tower, if this is one, to change (its processor settings, say).
    pub fn lfm2_mut(&mut self) -> Option<&mut Lfm2Tower> {
        match &mut self.tower {
            Tower::Lfm2(t) => Some(t),
            Tower::Lfm3(_) => None,
        }
    }

    /// LFM3-VL's tower, if this is one.
    pub fn lfm3(&self) -> Option<&lfm3::Tower> {
        match &self.tower {
            Tower::Lfm3(t) => Some(t),
            Tower::Lfm2(_) => None,
        }
    }

    /// The tower, projector and image processor in one line (`lone inspect`).
    pub fn describe(&self) -> String {
        match &self.tower {
            Tower::Lfm2(t) => {
                let (c, p) = (&t.cfg, &t.processor);
                let grid = (c.num_patches as f64).sqrt() as usize;
                let f = c.downsample_factor;
                format!(
                    "SigLIP2 encoder {} layers × {} wide ({} heads), {}px patches, {grid}×{grid} \
                     position grid; projector {}→{}→{} after a {f}×{f} pixel-unshuffle; images of \
                     {}–{} tokens, tiles of {}px ({}–{} tiles{})",
                    c.n_layers,
                    c.hidden_size,
                    c.n_heads,
                    c.patch_size,
                    c.hidden_size * f * f,
                    c.projector_hidden_size,
                    c.text_hidden_size,
                    p.min_image_tokens,
                    p.max_image_tokens,
                    p.tile_size,
                    p.min_tiles,
                    p.max_tiles,
                    if p.use_thumbnail {
                        " + a thumbnail"
                    } else {
                        ""
                    },
                )
            }
            Tower::Lfm3(t) => {
                let (c, p) = (&t.cfg, &t.processor);
                let attn = c.attention.iter().filter(|&&a| a).count();
                let m = c.merge_size;
                let f = p.patch_size * m;
                format!(
                    "LFM3-VL tower {} layers ({} convolution, {attn} attention) × {} wide ({} \
                     heads, {} key/value), {}px patches; projector {}→{}→{} per {m}×{m} block; \
                     images resized to multiples of {f}px, {}–{} tokens",
                    c.attention.len(),
                    c.attention.len() - attn,
                    c.hidden_size,
                    c.n_heads,
                    c.n_kv_heads,
                    c.patch_size,
                    c.hidden_size * m * m,
                    c.projector_hidden_size,
                    c.text_hidden_size,
                    p.min_pixels.div_ceil(f * f),
                    p.max_pixels / (f * f),
                )
            }
        }
    }

    /// What the model's chat template writes for an image, which [`Vision::prompt`] expands.
    pub fn marker(&self) -> &'static str {
        match self.tower {
            Tower::Lfm2(_) => IMAGE_MARKER,
            Tower::Lfm3(_) => IMAGE_PAD,
        }
    }

    /// What a raw (template-less) prompt gets for an image placed before its text.
    pub fn raw_marker(&self) -> &'static str {
        match self.tower {
            Tower::Lfm2(_) => IMAGE_MARKER,
            Tower::Lfm3(_) => "<|vision_start|><|image_pad|><|vision_end|>",
        }
    }

    /// Tokenize `text`, whose [`Vision::marker`]s stand for `images` in order, with each
    /// marker expanded into its image's placeholder tokens, and encode the images: the
    /// prompt's tokens and the embeddings of its image rows.
    pub fn prompt(
        &self,
        tokenizer: &crate::tokenizer::Tokenizer,
        text: &str,
        add_special_tokens: bool,
        images: &[image::Rgb8],
        compute: &Compute,
    ) -> Result<ImagePrompt> {
        let mut e = self.begin(text, add_special_tokens, images.to_vec())?;
        while !e.step(self, compute)? {}
        e.finish(self, tokenizer)
    }

    /// [`Vision::prompt`] a piece at a time ([`Encoding::step`]), so that a server can run
    /// other sequences' steps between the pieces.
    pub fn begin(
        &self,
        text: &str,
        add_special_tokens: bool,
        images: Vec<image::Rgb8>,
    ) -> Result<Encoding> {
        let marker = self.marker();
        let markers = text.matches(marker).count();
        if markers != images.len() {
            return Err(Error::Input(format!(
                "the prompt has {markers} image placeholders ({marker}) for {} images",
                images.len()
            )));
        }
        Ok(Encoding {
            text: text.to_string(),
            add_special_tokens,
            images,
            done: Vec::new(),
            partial: None,
            partial3: None,
            reused: 0,
            time: std::time::Duration::ZERO,
        })
    }

    /// What an image's encoding depends on: its pixels, the processor's settings and the
    /// numeric mode (a SHA-256 over them).
    fn key(&self, img: &image::Rgb8, compute: &Compute) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update((img.width as u64).to_le_bytes());
        h.update((img.height as u64).to_le_bytes());
        h.update(&img.data);
        let settings = match &self.tower {
            Tower::Lfm2(t) => format!("{:?}", t.processor),
            Tower::Lfm3(t) => format!("{:?}", t.processor),
        };
        h.update(settings.as_bytes());
        h.update([Self::pass(compute).mode as u8]);
        h.finalize().into()
    }

    /// The pass an image is encoded in: exact mode's f32 products (transformers' numbers), else
    /// fast mode's many-row kernels. Each tile (LFM2-VL) or image (LFM3-VL) is encoded alone,
    /// so either way an image's embeddings never depend on what else is being encoded or
    /// generated.
    pub fn pass(compute: &Compute) -> Pass {
        match compute.mode() {
            Mode::Exact => Pass {
                kind: PassKind::ExactPrompt,
                mode: Mode::Exact,
                threads: compute.threads,
            },
            _ => Pass {
                kind: PassKind::ByRowCount,
                mode: Mode::Fast,
                threads: compute.threads,
            },
        }
    }
}

/// A prompt's images being encoded a piece at a time ([`Vision::begin`]).
pub struct Encoding {
    text: String,
    add_special_tokens: bool,
    images: Vec<image::Rgb8>,
    /// The encoded images, in order.
    done: Vec<Encoded>,
    /// The LFM2-VL image being encoded tile by tile: its key, processing, the embeddings of
    /// its tiles so far and how many tiles that is.
    partial: Option<([u8; 32], image::Processed, Vec<f32>, usize)>,
    /// The LFM3-VL image being encoded layer by layer: its key, patches and tower state.
    partial3: Option<([u8; 32], lfm3::Patches, lfm3::TowerRun)>,
    reused: usize,
    time: std::time::Duration,
}

impl Encoding {
    /// Encode the next piece — an LFM2-VL tile; an LFM3-VL image's patch embedding, or one
    /// of its tower's layers; or an image whose encoding is remembered — of the images `begin`
    /// was given, with `vision`, the model that began
    /// it. True when every image is encoded.
    pub fn step(&mut self, vision: &Vision, compute: &Compute) -> Result<bool> {
        let t0 = std::time::Instant::now();
        let r = self.piece(vision, compute);
        self.time += t0.elapsed();
        r.map(|()| self.done.len() == self.images.len())
    }

    fn piece(&mut self, vision: &Vision, compute: &Compute) -> Result<()> {
        let Some(img) = self.images.get(self.done.len()) else {
            return Ok(());
        };
        if let Some((key, p, mut run)) = self.partial3.take() {
            let t = vision.lfm3().expect("a partial image is LFM3-VL's");
            let pass = Vision::pass(compute);
            t.run_layer(&mut run, &p, &pass);
            if run.next_layer < t.n_layers() {
                self.partial3 = Some((key, p, run));
                return Ok(());
            }
            let e = Encoded {
                placeholder: IMAGE_PAD.repeat(p.n_tokens()),
                tiles: 1,
                embeds: std::sync::Arc::new(t.project(&run.x, &pass)),
            };
            self.image_done(vision, key, e);
            return Ok(());
        }
        if let Some((key, p, mut embeds, tiles)) = self.partial.take() {
            let t = vision.lfm2().expect("a partial image is LFM2-VL's");
            let tile = &p.tiles[tiles];
            embeds.extend(t.embed_tile(&tile.pixels, tile.h_patches, tile.w_patches, compute)?);
            self.lfm2_tile_done(vision, t, key, p, embeds, tiles + 1);
            return Ok(());
        }
        let key = vision.key(img, compute);
        let cached = vision
            .encoded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key);
        if let Some(e) = cached {
            self.reused += 1;
            self.done.push(e);
            return Ok(());
        }
        match &vision.tower {
            Tower::Lfm2(t) => {
                let p = image::preprocess(img, &t.processor)?;
                let first = &p.tiles[0];
                let embeds =
                    t.embed_tile(&first.pixels, first.h_patches, first.w_patches, compute)?;
                self.lfm2_tile_done(vision, t, key, p, embeds, 1);
                Ok(())
            }
            Tower::Lfm3(t) => {
                // The patch embedding now, then a layer a step (the projector with the last).
                let p = t.processor.preprocess(img)?;
                let run = t.start(&p, &Vision::pass(compute))?;
                self.partial3 = Some((key, p, run));
                Ok(())
            }
        }
    }

    /// After an LFM2-VL image's first `tiles` tiles: the image is done when every tile is,
    /// else it waits for the next piece.
    fn lfm2_tile_done(
        &mut self,
        vision: &Vision,
        t: &Lfm2Tower,
        key: [u8; 32],
        p: image::Processed,
        embeds: Vec<f32>,
        tiles: usize,
    ) {
        if tiles < p.tiles.len() {
            self.partial = Some((key, p, embeds, tiles));
            return;
        }
        let e = Encoded {
            placeholder: p.placeholder(&t.processor),
            tiles: p.tiles.len(),
            embeds: std::sync::Arc::new(embeds),
        };
        self.image_done(vision, key, e);
    }

    /// An image encoded: remembered by `vision` under `key`, and the prompt's next.
    fn image_done(&mut self, vision: &Vision, key: [u8; 32], e: Encoded) {
        vision
            .encoded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, e.clone());
        self.done.push(e);
    }

    /// The prompt: its text's markers expanded, tokenized, with the images' embeddings.
    pub fn finish(
        self,
        vision: &Vision,
        tokenizer: &crate::tokenizer::Tokenizer,
    ) -> Result<ImagePrompt> {
        if self.done.len() != self.images.len() {
            return Err(Error::Input(
                "the prompt's images are not all encoded yet".into(),
            ));
        }
        let mut expanded = String::with_capacity(self.text.len());
        let mut data = Vec::new();
        let mut info = Vec::new();
        let mut pieces = self.text.split(vision.marker());
        expanded.push_str(pieces.next().unwrap_or_default());
        for (e, rest) in self.done.iter().zip(pieces) {
            expanded.push_str(&e.placeholder);
            expanded.push_str(rest);
            info.push((e.tiles, e.embeds.len() / vision.text_hidden_size));
            data.extend_from_slice(&e.embeds);
        }
        let ids = tokenizer.encode(&expanded, self.add_special_tokens)?;
        let embeds = crate::engine::PromptEmbeds::at_token(
            &ids,
            vision.image_token_id,
            data,
            vision.text_hidden_size,
        )?;
        Ok(ImagePrompt {
            ids,
            embeds,
            images: info,
            encode_time: self.time,
            reused: self.reused,
        })
    }
}

impl Lfm2Tower {
    pub fn load(
        ws: &Weights,
        cfg: VisionConfig,
        processor: image::ProcessorConfig,
    ) -> Result<Lfm2Tower> {
        if processor.downsample_factor != cfg.downsample_factor
            || processor.encoder_patch_size != cfg.patch_size
        {
            return Err(bad(format!(
                "the image processor's patch {} / downsample {} differ from the model's {} / {}",
                processor.encoder_patch_size,
                processor.downsample_factor,
                cfg.patch_size,
                cfg.downsample_factor
            )));
        }
        Ok(Lfm2Tower {
            encoder: Encoder::load(ws, &cfg)?,
            projector: Projector::load(ws, &cfg)?,
            processor,
            cfg,
        })
    }

    /// The embeddings of one tile's patches (`pixels`: `[h·w, 3·p·p]` in the processor's
    /// order), `(h/f)·(w/f)` rows of the language model's width.
    pub fn embed_tile(
        &self,
        pixels: &[f32],
        h: usize,
        w: usize,
        compute: &Compute,
    ) -> Result<Vec<f32>> {
        let f = self.cfg.downsample_factor;
        if h == 0 || w == 0 || !h.is_multiple_of(f) || !w.is_multiple_of(f) {
            return Err(Error::Input(format!(
                "an image tile of {h}×{w} patches: both must be positive multiples of {f}"
            )));
        }
        let pass = Vision::pass(compute);
        let hidden = self.encoder.forward(pixels, h, w, &pass)?;
        let _scope = pass.enter();
        Ok(self.projector.forward(&hidden, h, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from the definition (e.g. mpmath's erf to 17 digits).
        let cases = [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_89),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.999_977_909_503_001_4),
            (-1.5, -0.966_105_146_475_310_7),
        ];
        for (x, want) in cases {
            assert!(
                (erf(x) - want).abs() < 1e-14,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }
}
