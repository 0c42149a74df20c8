//! The SigLIP2 NaFlex vision encoder (transformers' `Siglip2VisionModel` without its pooling
//! head): patch embedding, learned position embeddings resized to the tile's patch grid,
//! pre-norm transformer layers with bidirectional attention, a final layer norm.

use super::{bidirectional_attention, LayerNorm, VisionConfig};
use crate::error::{Error, Result};
use crate::kernels::{self, Pass};
use crate::loader::Weights;
use crate::nn::Linear;
use crate::tensor::Tensor;

struct EncoderLayer {
    norm1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

pub struct Encoder {
    patch: Linear,
    /// The position grid, `[grid·grid, hidden]`, row-major.
    pos: Vec<f32>,
    grid: usize,
    layers: Vec<EncoderLayer>,
    post_norm: LayerNorm,
    hidden: usize,
    heads: usize,
    patch_dim: usize,
}

/// The weights of `F.interpolate(mode="bilinear", align_corners=False, antialias=True)`
/// from `src` positions to `dst` along one axis: `[dst, src]`, each row summing to 1.
fn aa_weights(src: usize, dst: usize) -> Vec<f32> {
    let scale = src as f32 / dst as f32;
    let support = scale.max(1.0);
    let mut w = vec![0f32; dst * src];
    for (o, row) in w.chunks_exact_mut(src).enumerate() {
        let center = (o as f32 + 0.5) * scale - 0.5;
        for (s, v) in row.iter_mut().enumerate() {
            *v = (1.0 - (s as f32 - center).abs() / support).max(0.0);
        }
        let sum: f32 = row.iter().sum();
        row.iter_mut().for_each(|v| *v /= sum);
    }
    w
}

/// The patch embedding as a linear map over patches in the processor's (y, x, channel)
/// order: a checkpoint's `nn.Linear` as it is, an mmproj's convolution kernel
/// (`[hidden, 3, p, p]`, channel first) reordered.
fn patch_embedding(ws: &Weights, name: &str, cfg: &VisionConfig) -> Result<Linear> {
    let (d, p) = (cfg.hidden_size, cfg.patch_size);
    let wname = format!("{name}.weight");
    let t = ws.get_opt(&wname)?;
    let Some(t) = t.filter(|t| t.shape.len() == 4) else {
        return Linear::load(ws, name, 3 * p * p, d, true);
    };
    if t.shape != [d, 3, p, p] {
        return Err(Error::BadShape {
            name: wname,
            got: t.shape.clone(),
            expected: vec![d, 3, p, p],
        });
    }
    let src = t.to_f32_vec();
    let mut w = vec![0f32; src.len()];
    for o in 0..d {
        for c in 0..3 {
            for y in 0..p {
                for x in 0..p {
                    w[o * 3 * p * p + (y * p + x) * 3 + c] = src[((o * 3 + c) * p + y) * p + x];
                }
            }
        }
    }
    let mut l = Linear::from_tensor(Tensor::from_f32(vec![d, 3 * p * p], &w));
    l.b = Some(ws.get_f32(&format!("{name}.bias"), &[d])?);
    Ok(l)
}

impl Encoder {
    pub fn load(ws: &Weights, cfg: &VisionConfig) -> Result<Encoder> {
        // transformers 5 saves the tower's modules directly under `vision_tower.`; earlier
        // checkpoints (the Hub's LFM2-VL) under `vision_tower.vision_model.`.
        let nested = "model.vision_tower.vision_model";
        let p = if ws
            .get_opt(&format!("{nested}.embeddings.patch_embedding.weight"))?
            .is_some()
        {
            nested.to_string()
        } else {
            "model.vision_tower".to_string()
        };
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let patch_dim = 3 * cfg.patch_size * cfg.patch_size;
        let lin = |name: &str, i, o| Linear::load(ws, name, i, o, true);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let q = format!("{p}.encoder.layers.{l}");
            layers.push(EncoderLayer {
                norm1: LayerNorm::load(ws, &format!("{q}.layer_norm1"), d, eps)?,
                q: lin(&format!("{q}.self_attn.q_proj"), d, d)?,
                k: lin(&format!("{q}.self_attn.k_proj"), d, d)?,
                v: lin(&format!("{q}.self_attn.v_proj"), d, d)?,
                o: lin(&format!("{q}.self_attn.out_proj"), d, d)?,
                norm2: LayerNorm::load(ws, &format!("{q}.layer_norm2"), d, eps)?,
                fc1: lin(&format!("{q}.mlp.fc1"), d, cfg.intermediate_size)?,
                fc2: lin(&format!("{q}.mlp.fc2"), cfg.intermediate_size, d)?,
            });
        }
        Ok(Encoder {
            patch: patch_embedding(ws, &format!("{p}.embeddings.patch_embedding"), cfg)?,
            pos: ws.get_f32(
                &format!("{p}.embeddings.position_embedding.weight"),
                &[cfg.num_patches, d],
            )?,
            grid: (cfg.num_patches as f64).sqrt() as usize,
            layers,
            post_norm: LayerNorm::load(ws, &format!("{p}.post_layernorm"), d, eps)?,
            hidden: d,
            heads: cfg.n_heads,
            patch_dim,
        })
    }

    /// The position embeddings resized to an `h`×`w` patch grid: `[h·w, hidden]`.
    fn positions(&self, h: usize, w: usize) -> Vec<f32> {
        let (g, d) = (self.grid, self.hidden);
        let (wr, wc) = (aa_weights(g, h), aa_weights(g, w));
        // Columns first: tmp[a][c] = Σ_b wc[c][b] · pos[a][b].
        let mut tmp = vec![0f32; g * w * d];
        for a in 0..g {
            for c in 0..w {
                let out = &mut tmp[(a * w + c) * d..(a * w + c + 1) * d];
                for b in 0..g {
                    let wt = wc[c * g + b];
                    if wt != 0.0 {
                        let src = &self.pos[(a * g + b) * d..(a * g + b + 1) * d];
                        out.iter_mut().zip(src).for_each(|(o, &s)| *o += wt * s);
                    }
                }
            }
        }
        let mut out = vec![0f32; h * w * d];
        for r in 0..h {
            for a in 0..g {
                let wt = wr[r * g + a];
                if wt != 0.0 {
                    let src = &tmp[a * w * d..(a + 1) * w * d];
                    out[r * w * d..(r + 1) * w * d]
                        .iter_mut()
                        .zip(src)
                        .for_each(|(o, &s)| *o += wt * s);
                }
            }
        }
        out
    }

    /// One tile's patches (`[h·w, 3·p·p]`) → the last hidden state `[h·w, hidden]`, its
    /// products as `pass` says.
    pub fn forward(&self, pixels: &[f32], h: usize, w: usize, pass: &Pass) -> Result<Vec<f32>> {
        let n = h * w;
        if n == 0 || pixels.len() != n * self.patch_dim {
            return Err(Error::Input(format!(
                "an image tile of {h}×{w} patches needs {} pixel values, got {}",
                n * self.patch_dim,
                pixels.len()
            )));
        }
        let _scope = pass.enter();
        let d = self.hidden;
        let mut x = self.patch.forward(pixels, n);
        for (v, p) in x.iter_mut().zip(self.positions(h, w)) {
            *v += p;
        }
        for l in &self.layers {
            let mut t = x.clone();
            l.norm1.forward(&mut t);
            let [q, k, v] = Linear::forward_many([&l.q, &l.k, &l.v], &t, n);
            let hd = d / self.heads;
            let a = bidirectional_attention(&q, &k, &v, n, self.heads, self.heads, hd, pass);
            let o = l.o.forward(&a, n);
            x.iter_mut().zip(&o).for_each(|(x, &o)| *x += o);
            let mut t = x.clone();
            l.norm2.forward(&mut t);
            let mut u = l.fc1.forward(&t, n);
            kernels::gelu_tanh(&mut u);
            let o = l.fc2.forward(&u, n);
            x.iter_mut().zip(&o).for_each(|(x, &o)| *x += o);
        }
        self.post_norm.forward(&mut x);
        debug_assert_eq!(x.len(), n * d);
        Ok(x)
    }
}
