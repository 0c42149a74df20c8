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
use crate::tensor::DType;

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
    pub lm_head: Linear,
    /// Where the weights came from (for messages and `inspect`).
    pub weights: Weights,
    /// How [`Model::new_cache`] stores attention keys and values (default f32, exact).
    pub kv_type: KvType,
    /// Numeric mode and threads of this model's forward passes.
    pub compute: crate::kernels::Compute,
    /// An F16/BF16 head's Q8_0 copy for decode in [`crate::kernels::Mode::Auto`] (see
    /// [`Model::decode_head`]), built on first use, with the address of the head's bytes it
    /// was made from (a head swapped since is not read through it).
    head_8bit: std::sync::OnceLock<(usize, Linear)>,
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
        Self::from_files(path, cfg, files)
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
            lm_head,
            weights: ws,
            kv_type: KvType::F32,
            compute: Default::default(),
            head_8bit: Default::default(),
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
        let _compute = self.compute.enter(batch.prompt);
        let mut out = ForwardOutput::default();
        if batch.is_empty() {
            return Ok(out);
        }
        let x = self.embed.forward(&batch.tokens);
        if capture_hidden {
            out.hidden.push(x.clone());
        }
        self.layers_and_head(batch, caches, 0, x, capture_hidden, out)
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
        let _compute = self.compute.enter(batch.prompt);
        if batch.is_empty() {
            return Ok(ForwardOutput::default());
        }
        self.layers_and_head(batch, caches, start, x, false, ForwardOutput::default())
    }

    fn layers_and_head(
        &self,
        batch: &Batch,
        caches: &mut [SeqCache],
        start: usize,
        mut x: Vec<f32>,
        capture_hidden: bool,
        mut out: ForwardOutput,
    ) -> Result<ForwardOutput> {
        let h = self.cfg.hidden_size;
        for (l, layer) in self.layers.iter().enumerate().skip(start) {
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
        // Exact mode's prompt passes multiply their logit rows (each sequence's last) on the
        // exact matrix-vector kernel, not the prompt GEMM, which would dequantize the whole
        // head for a row; scoring every row (perplexity) takes the GEMM. In the default mode
        // every logit row of every pass takes the same kernel (the 8-bit one where the
        // head's format has it; an F16/BF16 head through its Q8_0 copy, `decode_head`), and
        // each row's top `RESCORE_TOP` logits are recomputed exactly after, so the token
        // picked (and the top of a sampled distribution) is the exact head's. (A finite
        // `row_invariant_rows` means the head is on 8-bit kernels.)
        let exact_rows = crate::kernels::Compute {
            mode: Some(crate::kernels::Mode::Exact),
            threads: None,
        };
        let head = self.decode_head(batch.score_all);
        let copy = !std::ptr::eq(head, &self.lm_head);
        let lim = crate::kernels::row_invariant_rows(head.w.dtype);
        let rescore = copy
            || (crate::kernels::mode() == crate::kernels::Mode::Auto
                && !crate::kernels::exact()
                && lim != usize::MAX);
        let _head =
            (crate::kernels::prompt_rows() && !batch.score_all).then(|| exact_rows.enter(false));
        out.logits = head.forward(&xs, sel.len());
        drop(_head);
        if rescore {
            rescore_top(&self.lm_head, &xs, &mut out.logits, RESCORE_TOP);
        }
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

/// Candidates per row that [`Model::forward`] recomputes exactly in [`crate::kernels::Mode::Auto`]
/// on 8-bit kernels. The 8-bit head moves logits by well under one unit (measured on SmolLM2
/// against llama.cpp: ≤ 1.2 nats in the top 10), so the exact argmax is among the 8-bit top 32.
const RESCORE_TOP: usize = 32;

impl Model {
    /// The head a pass's logit rows are multiplied by: the model's own, or on x86 an
    /// F16/BF16 head's Q8_0 copy — in [`crate::kernels::Mode::Auto`] and fast mode, for any
    /// pass that does not score every row (perplexity wants each row's logit of its next
    /// token, not the top). Decode reads the whole head once per token (a
    /// fifth of LFM2-350M F16's bytes, over a quarter of Qwen2.5-0.5B's), and the copy is
    /// 53 % of those bytes on the 8-bit kernels every quantized head takes in these modes;
    /// `forward` then rescores each row's top [`RESCORE_TOP`] logits with the model's own
    /// head, so the token picked (and the top of a sampled distribution) is the F16/BF16
    /// head's. The copy is built on first use and kept beside the head (the embedding rows
    /// still come from the head's tensor).
    fn decode_head(&self, score_all: bool) -> &Linear {
        let head = &self.lm_head;
        let mode = crate::kernels::mode();
        let here = match mode {
            crate::kernels::Mode::Fast => !score_all,
            _ => crate::kernels::decode_rows() && !score_all,
        };
        if !(here && self.head_copy_in(mode)) {
            return head;
        }
        let at = head.w.data().as_ptr() as usize;
        let (from, copy) = self.head_8bit.get_or_init(|| {
            let w = crate::kernels::q8_0_copy_for_fast_rows(&head.w);
            let copy = Linear {
                b: head.b.clone(),
                ..Linear::from_tensor(w)
            };
            (at, copy)
        });
        if *from == at {
            copy
        } else {
            head
        }
    }

    /// Whether decode passes in `mode` read the head through its Q8_0 copy
    /// ([`Model::decode_head`]): an F16/BF16 head of whole Q8_0 blocks, `Auto` or `Fast` on
    /// a family with 8-bit kernels.
    fn head_copy_in(&self, mode: crate::kernels::Mode) -> bool {
        matches!(self.lm_head.w.dtype, DType::F16 | DType::BF16)
            && mode != crate::kernels::Mode::Exact
            && crate::kernels::isa().has_8bit()
            && self.lm_head.in_dim.is_multiple_of(DType::Q8_0.block_size())
    }

    /// The bytes of the head's Q8_0 copy when this model's decode reads the head through it
    /// (in its [`crate::kernels::Compute`] mode): what a decoded token reads of the head then.
    pub fn decode_head_copy_bytes(&self) -> Option<u64> {
        self.head_copy_in(self.compute.mode()).then(|| {
            let rb = DType::Q8_0.bytes_for(self.lm_head.in_dim).unwrap_or(0);
            (rb * self.lm_head.out_dim) as u64
        })
    }
}

/// Replace each row's `k` largest logits by the exact dot products of the head's rows with
/// the activations (the scalar reference: dequantized weights, f32 activations). The rows
/// come from the head's packed copy where it has one, as every other read of it.
fn rescore_top(head: &Linear, xs: &[f32], logits: &mut [f32], k: usize) {
    let v = head.out_dim;
    let h = head.in_dim;
    if v == 0 || h == 0 {
        return;
    }
    let k = k.min(v);
    let mut top: Vec<(f32, usize)> = Vec::with_capacity(k);
    let mut buf = Vec::new();
    for (x, row) in xs.chunks_exact(h).zip(logits.chunks_exact_mut(v)) {
        top_k(row, k, &mut top);
        for &(_, i) in &top {
            let w = crate::kernels::stored_row(&head.w, i, &mut buf);
            let dot = crate::quant::reference::dot_row(head.w.dtype, w, x)
                .expect("head rows are whole blocks (checked at load)");
            row[i] = dot + head.b.as_ref().map_or(0.0, |b| b[i]);
        }
    }
}

/// The `k` largest values of `row` (NaN never counts) with their indices, in no order: one pass
/// that only touches the small set when a value beats its smallest.
fn top_k(row: &[f32], k: usize, top: &mut Vec<(f32, usize)>) {
    top.clear();
    let mut min = (f32::NEG_INFINITY, 0usize);
    for (i, &l) in row.iter().enumerate() {
        if top.len() < k {
            top.push((if l.is_nan() { f32::NEG_INFINITY } else { l }, i));
            if top.len() == k {
                min = smallest(top);
            }
        } else if l > min.0 {
            top[min.1] = (l, i);
            min = smallest(top);
        }
    }
}

/// (value, position in `top`) of the smallest entry.
fn smallest(top: &[(f32, usize)]) -> (f32, usize) {
    top.iter().enumerate().fold(
        (f32::INFINITY, 0),
        |m, (j, &(l, _))| if l < m.0 { (l, j) } else { m },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;
    use crate::test_rng::Rng;

    /// `top_k` against a full sort, over odd lengths, ties and NaN.
    #[test]
    fn top_k_matches_a_sort() {
        let mut rng = Rng(9);
        let mut top = Vec::new();
        for (n, k) in [(1, 1), (5, 3), (33, 32), (100, 32), (1001, 7), (50, 50)] {
            let mut row: Vec<f32> = (0..n).map(|_| (rng.f32() * 20.0).round()).collect();
            if n > 4 {
                row[3] = f32::NAN;
            }
            top_k(&row, k, &mut top);
            let mut got: Vec<f32> = top
                .iter()
                .map(|&(l, i)| {
                    assert!(row[i] == l || (row[i].is_nan() && l == f32::NEG_INFINITY));
                    l
                })
                .collect();
            let mut want: Vec<f32> = row
                .iter()
                .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
                .collect();
            want.sort_by(|a, b| b.total_cmp(a));
            want.truncate(k);
            got.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(got, want, "n {n} k {k}");
            let mut idx: Vec<usize> = top.iter().map(|t| t.1).collect();
            idx.sort();
            idx.dedup();
            assert_eq!(idx.len(), k);
        }
    }

    /// The k largest (perturbed) logits of each row become the exact ones; the rest stay.
    #[test]
    fn rescore_top_replaces_exactly_the_top_candidates() {
        let mut rng = Rng(5);
        let (v, h, n, k) = (50, 24, 3, 4);
        let w: Vec<f32> = (0..v * h).map(|_| rng.f32()).collect();
        let b: Vec<f32> = (0..v).map(|_| rng.f32()).collect();
        let head = Linear {
            w: Tensor::from_f32(vec![v, h], &w),
            b: Some(b.clone()),
            in_dim: h,
            out_dim: v,
            name: None,
            expert: None,
        };
        let xs: Vec<f32> = (0..n * h).map(|_| rng.f32()).collect();
        let exact: Vec<f32> = (0..n * v)
            .map(|j| {
                let (t, i) = (j / v, j % v);
                (0..h).map(|c| w[i * h + c] * xs[t * h + c]).sum::<f32>() + b[i]
            })
            .collect();
        let noisy: Vec<f32> = exact.iter().map(|&e| e + 0.5 * rng.f32()).collect();
        let mut got = noisy.clone();
        rescore_top(&head, &xs, &mut got, k);
        for t in 0..n {
            let row = &noisy[t * v..(t + 1) * v];
            let mut order: Vec<usize> = (0..v).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            for (rank, &i) in order.iter().enumerate() {
                let (g, want) = (
                    got[t * v + i],
                    if rank < k { exact[t * v + i] } else { row[i] },
                );
                assert!(
                    (g - want).abs() <= 1e-5,
                    "row {t} logit {i} (rank {rank}): {g} vs {want}"
                );
            }
        }
    }
}
