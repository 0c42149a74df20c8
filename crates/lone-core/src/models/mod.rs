//! Model families and the one forward path they share:
//! tokens → embed → layers (+cache) → final norm → lm_head → logits.
//!
//! Each family file (`llama.rs` for llama/qwen2/qwen3, `lfm2.rs`, `lfm3.rs`) builds its
//! decoder layers from named weights and reads like its transformers modeling file.

pub mod lfm2;
pub mod lfm3;
pub mod llama;

use std::path::Path;

use crate::cache::{KvType, SeqCache, DEFAULT_ROLLBACK};
use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::SafetensorsFiles;
use crate::loader::{WeightFiles, Weights};
use crate::nn::{Embedding, Linear, RmsNorm, Row};

/// Rows to run through the model: each is (sequence, position, token). Rows of one sequence
/// must be in position order and continue that sequence's cache.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub rows: Vec<Row>,
    /// Which rows need logits (prefill usually only wants the last).
    pub logits: Vec<bool>,
}

impl Batch {
    /// `tokens` of sequence `seq` starting at position `start`.
    pub fn for_sequence(seq: usize, start: usize, tokens: &[u32], all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens.to_vec(),
            rows: (0..n)
                .map(|i| Row {
                    seq,
                    pos: start + i,
                })
                .collect(),
            logits: (0..n).map(|i| all_logits || i + 1 == n).collect(),
        }
    }

    pub fn push(&mut self, seq: usize, pos: usize, token: u32, logits: bool) {
        self.tokens.push(token);
        self.rows.push(Row { seq, pos });
        self.logits.push(logits);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// What a forward pass returns.
#[derive(Debug, Default)]
pub struct ForwardOutput {
    /// `[rows with logits, vocab]`, in batch order.
    pub logits: Vec<f32>,
    /// With `capture_hidden`: the embedding output and each layer's output, `[n, hidden]` each.
    pub hidden: Vec<Vec<f32>>,
}

/// One decoder layer: updates the residual stream `x` (`[n, hidden]`) in place.
pub trait Layer: Send + Sync {
    fn forward(&self, x: &mut [f32], rows: &[Row], caches: &mut [SeqCache], layer: usize);
}

/// A loaded model.
pub struct Model {
    pub cfg: ModelConfig,
    pub embed: Embedding,
    pub layers: Vec<Box<dyn Layer>>,
    pub final_norm: RmsNorm,
    pub lm_head: Linear,
    /// Where the weights came from (for messages and `inspect`).
    pub weights: Weights,
    /// How [`Model::new_cache`] stores attention keys and values (default f32, exact).
    pub kv_type: KvType,
}

impl Model {
    /// Load a HF checkpoint directory or a GGUF file.
    pub fn load(path: &Path) -> Result<Model> {
        if !path.exists() {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such file or directory",
                ),
            });
        }
        let (cfg, files) = if path.is_dir() {
            let cfg = ModelConfig::from_hf_dir(path)?;
            (
                cfg,
                WeightFiles::Safetensors(SafetensorsFiles::open_dir(path)?),
            )
        } else {
            let g = GgufFile::open(path)?;
            (ModelConfig::from_gguf(&g)?, WeightFiles::Gguf(g))
        };
        cfg.validate()?;
        let ws = Weights::open(path, &cfg, files);
        let layers = match cfg.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => llama::layers(&cfg, &ws)?,
            Arch::Lfm2 => lfm2::layers(&cfg, &ws)?,
            Arch::Lfm3 => lfm3::layers(&cfg, &ws)?,
        };
        let (embed_name, norm_name) = match cfg.arch {
            Arch::Lfm2 | Arch::Lfm3 => ("model.embed_tokens.weight", "model.embedding_norm"),
            _ => ("model.embed_tokens.weight", "model.norm"),
        };
        let embed = Embedding::load(&ws, embed_name, cfg.vocab_size, cfg.hidden_size)?;
        let final_norm = RmsNorm::load(&ws, norm_name, cfg.hidden_size, cfg.norm_eps)?;
        let lm_head = match ws.get_opt("lm_head.weight")? {
            Some(_) if !cfg.tie_embeddings => {
                Linear::load(&ws, "lm_head", cfg.hidden_size, cfg.vocab_size, false)?
            }
            _ => Linear::from_tensor(embed.t.clone()),
        };
        Ok(Model {
            cfg,
            embed,
            layers,
            final_norm,
            lm_head,
            weights: ws,
            kv_type: KvType::F32,
        })
    }

    /// Choose how [`Model::new_cache`] stores keys and values; Q8_0 needs a head_dim that
    /// is a multiple of 32.
    pub fn set_kv_type(&mut self, t: KvType) -> Result<()> {
        if !t.supports(self.cfg.head_dim) {
            return Err(Error::Unsupported(format!(
                "a {} KV cache needs a head_dim that is a multiple of 32, this model's is {}: \
                 use --cache-type f16 or f32",
                t.name(),
                self.cfg.head_dim
            )));
        }
        self.kv_type = t;
        Ok(())
    }

    /// A fresh cache for one sequence.
    pub fn new_cache(&self) -> SeqCache {
        SeqCache::with_kv_type(&self.cfg, DEFAULT_ROLLBACK, self.kv_type)
    }

    /// Check a batch against the caches it continues.
    pub fn check_batch(&self, batch: &Batch, caches: &[SeqCache]) -> Result<()> {
        if batch.tokens.len() != batch.rows.len() || batch.logits.len() != batch.rows.len() {
            return Err(Error::Input(
                "batch tokens/rows/logits lengths differ".into(),
            ));
        }
        let mut next: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        for (&t, r) in batch.tokens.iter().zip(&batch.rows) {
            if t as usize >= self.cfg.vocab_size {
                return Err(Error::Input(format!(
                    "token id {t} is out of range (vocabulary size {})",
                    self.cfg.vocab_size
                )));
            }
            let Some(nx) = next.get_mut(r.seq) else {
                return Err(Error::Input(format!(
                    "batch row names sequence {} but only {} caches were given",
                    r.seq,
                    caches.len()
                )));
            };
            if r.pos != *nx {
                return Err(Error::Input(format!(
                    "sequence {} expects position {} next, batch has {}",
                    r.seq, nx, r.pos
                )));
            }
            *nx += 1;
        }
        Ok(())
    }

    /// Run the batch, appending its positions to the caches.
    pub fn forward(&self, batch: &Batch, caches: &mut [SeqCache]) -> Result<ForwardOutput> {
        self.forward_opts(batch, caches, false)
    }

    pub fn forward_opts(
        &self,
        batch: &Batch,
        caches: &mut [SeqCache],
        capture_hidden: bool,
    ) -> Result<ForwardOutput> {
        self.check_batch(batch, caches)?;
        let mut out = ForwardOutput::default();
        if batch.is_empty() {
            return Ok(out);
        }
        let h = self.cfg.hidden_size;
        let mut x = self.embed.forward(&batch.tokens);
        if capture_hidden {
            out.hidden.push(x.clone());
        }
        for (l, layer) in self.layers.iter().enumerate() {
            layer.forward(&mut x, &batch.rows, caches, l);
            if capture_hidden {
                out.hidden.push(x.clone());
            }
        }
        for (r, &t) in batch.rows.iter().zip(&batch.tokens) {
            caches[r.seq].advance(&[t]);
        }
        let sel: Vec<usize> = (0..batch.len()).filter(|&i| batch.logits[i]).collect();
        if sel.is_empty() {
            return Ok(out);
        }
        let mut xs = Vec::with_capacity(sel.len() * h);
        for &i in &sel {
            xs.extend_from_slice(&x[i * h..(i + 1) * h]);
        }
        self.final_norm.forward(&mut xs);
        // Mode::Auto takes 8-bit activations only inside the layers: the output head, which
        // picks the token, stays exact.
        let _head_mode = (crate::kernels::mode() == crate::kernels::Mode::Auto)
            .then(|| crate::kernels::exact_scope(true));
        out.logits = self.lm_head.forward(&xs, sel.len());
        Ok(out)
    }
}
