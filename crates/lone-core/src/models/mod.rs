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
use crate::kernels::Pass;
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::SafetensorsFiles;
use crate::loader::{WeightFiles, Weights};
use crate::nn::{Embedding, Head, Linear, RmsNorm, Row};

/// Rows to run through the model: each is (sequence, position, token). Rows of one sequence
/// must be in position order and continue that sequence's cache.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub rows: Vec<Row>,
    /// Which rows need logits (prefill usually only wants the last).
    pub logits: Vec<bool>,
    /// The rows are known tokens (a prompt), not sampled ones: outside fast mode they are
    /// processed exactly, the same way whatever their number ([`crate::kernels::Compute::enter`]).
    pub prompt: bool,
    /// Every row's logits are wanted (perplexity, importance matrices, verify): the head may
    /// take the many-row GEMM. Otherwise a prompt pass's logit rows take the exact
    /// matrix-vector head, each the same whatever the pass holds.
    pub score_all: bool,
    /// Rows whose input is this embedding (`hidden` wide) instead of their token's: an
    /// image's rows, in place of its image tokens. Row indices ascend.
    pub embeds: Vec<(usize, Vec<f32>)>,
}

impl Batch {
    /// Known `tokens` of sequence `seq` (a prompt, or a reply being fed back) starting at
    /// position `start`.
    pub fn for_sequence(seq: usize, start: usize, tokens: &[u32], all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            prompt: true,
            score_all: all_logits && n > 1,
            tokens: tokens.to_vec(),
            rows: (0..n)
                .map(|i| Row {
                    seq,
                    pos: start + i,
                })
                .collect(),
            logits: (0..n).map(|i| all_logits || i + 1 == n).collect(),
            embeds: Vec::new(),
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

/// One decoder layer: updates the residual stream `x` (`[n, hidden]`) in place, its rows
/// computed as `pass` says.
pub trait Layer: Send + Sync {
    fn forward(
        &self,
        x: &mut [f32],
        rows: &[Row],
        pass: &Pass,
        caches: &mut [SeqCache],
        layer: usize,
    );
    /// Every weight matrix of the layer (to swap a tensor's format, `lone convert
    /// --target-bpw`).
    fn linears_mut(&mut self) -> Vec<&mut Linear>;
}

/// A loaded model.
pub struct Model {
    pub cfg: ModelConfig,
    pub embed: Embedding,
    pub layers: Vec<Box<dyn Layer>>,
    pub final_norm: RmsNorm,
    pub lm_head: Head,
    /// Where the weights came from (for messages and `inspect`).
    pub weights: Weights,
    /// How [`Model::new_cache`] stores attention keys and values (default f32, exact).
    pub kv_type: KvType,
    /// Numeric mode and threads of this model's forward passes.
    pub compute: crate::kernels::Compute,
    /// The vision encoder and projector of a vision-language model.
    pub vision: Option<crate::vision::Vision>,
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
        if path.is_dir() {
            let cfg = ModelConfig::from_hf_dir(path)?;
            let hidden = cfg.hidden_size;
            let files = WeightFiles::Safetensors(SafetensorsFiles::open_dir(path)?);
            let mut model = Self::from_files(path, cfg, files)?;
            model.vision = crate::vision::Vision::load_hf(&model.weights, path, hidden)?;
            Ok(model)
        } else {
            let g = GgufFile::open(path)?;
            Self::from_files(path, ModelConfig::from_gguf(&g)?, WeightFiles::Gguf(g))
        }
    }

    /// A model from a GGUF file already read (in memory, say; `path` names it in errors).
    pub fn from_gguf(path: &Path, g: GgufFile) -> Result<Model> {
        let cfg = ModelConfig::from_gguf(&g)?;
        Self::from_files(path, cfg, WeightFiles::Gguf(g))
    }

    fn from_files(path: &Path, cfg: ModelConfig, files: WeightFiles) -> Result<Model> {
        cfg.validate()?;
        let ws = Weights::open(path, &cfg, files);
        let layers = match cfg.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => llama::layers(&cfg, &ws)?,
            Arch::Lfm2 | Arch::Lfm2Moe => lfm2::layers(&cfg, &ws)?,
            Arch::Lfm3 => lfm3::layers(&cfg, &ws)?,
        };
        let (embed_name, norm_name) = match cfg.arch {
            a if a.is_hybrid() => ("model.embed_tokens.weight", "model.embedding_norm"),
            _ => ("model.embed_tokens.weight", "model.norm"),
        };
        let embed = Embedding::load(&ws, embed_name, cfg.vocab_size, cfg.hidden_size)?;
        let final_norm = RmsNorm::load(&ws, norm_name, cfg.hidden_size, cfg.norm_eps)?;
        let lm_head = match ws.get_opt("lm_head.weight")? {
            Some(_) if !cfg.tie_embeddings => {
                Linear::load(&ws, "lm_head", cfg.hidden_size, cfg.vocab_size, false)?
            }
            _ => {
                let mut head = Linear::from_tensor(embed.t.clone());
                head.name = Some("token_embd.weight".into());
                head
            }
        };
        Ok(Model {
            cfg,
            embed,
            layers,
            final_norm,
            lm_head: Head::new(lm_head),
            weights: ws,
            kv_type: KvType::F32,
            compute: Default::default(),
            vision: None,
        })
    }

    /// Attach the vision tower and projector of a llama.cpp `mmproj` GGUF (LFM2-VL's, as
    /// `convert_hf_to_gguf.py --mmproj` writes it): the model then takes images.
    pub fn load_mmproj(&mut self, path: &Path) -> Result<()> {
        let tok = match &self.weights.files {
            WeightFiles::Gguf(g) => crate::tokenizer::Tokenizer::from_gguf(g)?,
            WeightFiles::Safetensors(_) => {
                crate::tokenizer::Tokenizer::from_dir(&self.weights.path)?
            }
        };
        let marker = crate::vision::Vision::mmproj_marker(path)?;
        let id = tok.token_to_id(marker).ok_or_else(|| {
            Error::Input(format!(
                "{}: the language model's vocabulary has no {marker} token, so it cannot take \
                 images; use the language model converted with this mmproj",
                path.display()
            ))
        })?;
        self.vision = Some(crate::vision::Vision::load_mmproj(path, &self.cfg, id)?);
        Ok(())
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

    /// Most rows of one sequence a forward pass can take with each row's hidden states equal
    /// to those of decoding it alone (see [`crate::kernels::row_invariant_rows`]). The head
    /// is left out: `forward` recomputes each row's top logits exactly whatever its kernel,
    /// so the greedy token does not depend on it.
    pub fn row_invariant_rows(&self) -> usize {
        use crate::loader::WeightFiles;
        let _compute = self.compute.enter(false);
        const HEAD: [&str; 4] = [
            "token_embd.weight",
            "output.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
        ];
        let limit = |name: &str, d| {
            if HEAD.contains(&name) {
                usize::MAX
            } else {
                crate::kernels::row_invariant_rows(d)
            }
        };
        match &self.weights.files {
            WeightFiles::Gguf(g) => g.tensors.iter().map(|t| limit(&t.name, t.dtype)).min(),
            WeightFiles::Safetensors(st) => st
                .names()
                .filter_map(|n| st.get(n).map(|t| limit(n, t.dtype)))
                .min(),
        }
        .unwrap_or(usize::MAX)
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
        for (i, e) in &batch.embeds {
            if *i >= batch.len() || e.len() != self.cfg.hidden_size {
                return Err(Error::Input(format!(
                    "an embedding of {} values for row {i} of {} (the model's width is {})",
                    e.len(),
                    batch.len(),
                    self.cfg.hidden_size
                )));
            }
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
        let pass = self.compute.pass(batch.prompt);
        let _scope = pass.enter();
        let mut out = ForwardOutput::default();
        if batch.is_empty() {
            return Ok(out);
        }
        let mut x = self.embed.forward(&batch.tokens);
        let h = self.cfg.hidden_size;
        for (i, e) in &batch.embeds {
            x[i * h..(i + 1) * h].copy_from_slice(e);
        }
        if capture_hidden {
            out.hidden.push(x.clone());
        }
        self.layers_and_head(batch, &pass, caches, 0, x, capture_hidden, out)
    }

    /// Run `batch` from layer `start` on, its hidden states entering that layer being `x`
    /// (as `forward_opts(.., true)` captured them: `hidden[start]`), on caches that hold
    /// nothing for the layers before `start` (fresh ones). The logits are those of the whole
    /// forward pass whose layers before `start` produced `x` — what the `--target-bpw`
    /// search uses to measure a change to one layer without running the layers before it.
    pub fn forward_from_layer(
        &self,
        batch: &Batch,
        caches: &mut [SeqCache],
        start: usize,
        x: Vec<f32>,
    ) -> Result<ForwardOutput> {
        self.check_batch(batch, caches)?;
        if start > self.layers.len() || x.len() != batch.len() * self.cfg.hidden_size {
            return Err(Error::Input(format!(
                "forward from layer {start} of {} with {} hidden values for {} rows of {}",
                self.layers.len(),
                x.len(),
                batch.len(),
                self.cfg.hidden_size
            )));
        }
        let pass = self.compute.pass(batch.prompt);
        let _scope = pass.enter();
        if batch.is_empty() {
            return Ok(ForwardOutput::default());
        }
        self.layers_and_head(
            batch,
            &pass,
            caches,
            start,
            x,
            false,
            ForwardOutput::default(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn layers_and_head(
        &self,
        batch: &Batch,
        pass: &Pass,
        caches: &mut [SeqCache],
        start: usize,
        mut x: Vec<f32>,
        capture_hidden: bool,
        mut out: ForwardOutput,
    ) -> Result<ForwardOutput> {
        let h = self.cfg.hidden_size;
        for (l, layer) in self.layers.iter().enumerate().skip(start) {
            layer.forward(&mut x, &batch.rows, pass, caches, l);
            if capture_hidden {
                out.hidden.push(x.clone());
            }
        }
        let mut embeds = batch.embeds.iter().peekable();
        for (i, (r, &t)) in batch.rows.iter().zip(&batch.tokens).enumerate() {
            match embeds.next_if(|(row, _)| *row == i) {
                Some((_, e)) => {
                    caches[r.seq].advance_embedded(t, crate::cache::embedding_digest(e))
                }
                None => caches[r.seq].advance(&[t]),
            }
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
        out.logits = self.lm_head.logits(&xs, sel.len(), pass, batch.score_all);
        Ok(out)
    }
}

impl Model {
    /// The embedding of `tokens`: the final (normed) hidden states, mean-pooled over the
    /// tokens and L2-normalised — llama.cpp's `--embeddings --pooling mean`. Runs from an
    /// empty cache, in chunks.
    pub fn embed_mean(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let h = self.cfg.hidden_size;
        if tokens.is_empty() {
            return Err(crate::Error::Input("nothing to embed (0 tokens)".into()));
        }
        let mut cache = self.new_cache();
        let mut sum = vec![0f64; h];
        for chunk in tokens.chunks(256) {
            let batch = Batch::for_sequence(0, cache.len(), chunk, false);
            let mut out = self.forward_opts(&batch, std::slice::from_mut(&mut cache), true)?;
            let mut x = out.hidden.pop().unwrap_or_default();
            self.final_norm.forward(&mut x);
            for row in x.chunks(h) {
                for (s, &v) in sum.iter_mut().zip(row) {
                    *s += v as f64;
                }
            }
        }
        let n = tokens.len() as f64;
        let norm = sum.iter().map(|s| (s / n) * (s / n)).sum::<f64>().sqrt();
        Ok(sum
            .iter()
            .map(|s| {
                if norm > 0.0 {
                    (s / n / norm) as f32
                } else {
                    0.0
                }
            })
            .collect())
    }
}

impl Model {
    /// The bytes of the head's Q8_0 copy when this model's decode reads the head through it
    /// (in its [`crate::kernels::Compute`] mode): what a decoded token reads of the head then.
    pub fn decode_head_copy_bytes(&self) -> Option<u64> {
        self.lm_head.copy_bytes(self.compute.mode())
    }
}
