//! `--target-bpw B`: the type of each weight matrix chosen to minimise measured output error
//! within B bits per weight (a per-tensor sensitivity search).
//!
//! 1. Reference: the source model's log-probabilities on calibration chunks (every position).
//! 2. Sensitivity: for each weight matrix t and each candidate type q (Q2_K…Q6_K, IQ3_S, IQ4_XS,
//!    Q8_0 and, with the imatrix, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS for rows of whole 256-blocks;
//!    Q4_0, IQ4_NL, Q4_1, Q5_0, Q5_1 and Q8_0 otherwise), only t is quantized to q
//!    (with the imatrix, when given) and the mean KL divergence of the logits from the
//!    reference is measured: KL(t, q).
//! 3. Allocation: with the errors taken as additive, every tensor starts at its cheapest
//!    type and the upgrade with the largest KL decrease per added bit is applied while the
//!    file stays within B × (all weights), until no upgrade fits or helps.
//! 4. The chosen mix is measured once more as a whole (reported as the final KL).
//!
//! Tensors that are not weight matrices of a layer or the LM head (norms, the conv kernel,
//! an untied embedding table) keep the type llama-quantize's Q4_K_M mix gives them, and count
//! toward the budget.

use std::collections::BTreeMap;

use super::Plan;
use crate::error::{Error, Result};
use crate::imatrix::Imatrix;
use crate::models::{Batch, Model};
use crate::quant;
use crate::tensor::{DType, Tensor};

/// Where and how much to measure.
pub struct SearchOptions<'a> {
    pub target_bpw: f64,
    /// Calibration tokens, cut into `chunks` chunks of `ctx`.
    pub tokens: &'a [u32],
    pub ctx: usize,
    pub chunks: usize,
    pub imatrix: Option<&'a Imatrix>,
    /// A [`SensitivityTable`] file to reuse and extend (`--sensitivity FILE`): entries
    /// already there are not measured again; new ones are written to it after each tensor.
    pub sensitivity: Option<&'a std::path::Path>,
}

/// The measured KL(t, q) of a search, kept so that another `--target-bpw` on the same source,
/// calibration and imatrix costs no new measurement (and an interrupted search resumes).
/// `fingerprint` names what the numbers depend on: the weight matrices and the embedding
/// (bytes and shapes), the calibration tokens and chunking, and the importance vectors.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SensitivityTable {
    pub fingerprint: String,
    /// Tensor name → type name → mean KL divergence with only that tensor at that type.
    pub kl: BTreeMap<String, BTreeMap<String, f64>>,
}

impl SensitivityTable {
    pub const FORMAT: &'static str = "lone-sensitivity-1";

    /// Read `path` (a missing file is an empty table).
    pub fn load(path: &std::path::Path) -> Result<SensitivityTable> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => {
                return Err(Error::Io {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
        };
        #[derive(serde::Deserialize)]
        struct File {
            format: String,
            #[serde(flatten)]
            table: SensitivityTable,
        }
        let f: File = serde_json::from_str(&text).map_err(|e| {
            Error::Input(format!(
                "{} is not a sensitivity table written by lone convert --sensitivity: {e}",
                path.display()
            ))
        })?;
        if f.format != Self::FORMAT {
            return Err(Error::Input(format!(
                "{}: sensitivity table format {:?}, this lone reads {:?}",
                path.display(),
                f.format,
                Self::FORMAT
            )));
        }
        Ok(f.table)
    }

    /// Write the table to `path` (whole, through a temporary file).
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        let v = serde_json::json!({
            "format": Self::FORMAT,
            "fingerprint": self.fingerprint,
            "kl": self.kl,
        });
        let tmp = path.with_extension("partial");
        let io = |e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        };
        std::fs::write(&tmp, serde_json::to_string_pretty(&v).unwrap_or_default()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    fn get(&self, name: &str, q: DType) -> Option<f64> {
        self.kl.get(name)?.get(q.name()).copied()
    }
}

/// What the search chose and measured.
#[derive(Clone, Debug, Default)]
pub struct SearchReport {
    pub chosen: BTreeMap<String, DType>,
    /// Bits per weight of the whole file's tensors.
    pub bpw: f64,
    /// Σ of the per-tensor KLs of the chosen types (the additive estimate).
    pub kl_estimate: f64,
    /// The KL of the chosen mix, measured.
    pub kl_measured: f64,
    pub measurements: usize,
    /// Measurements taken from the `--sensitivity` table instead.
    pub reused: usize,
}

fn bits(dtype: DType, numel: usize) -> f64 {
    (dtype.bytes_for(numel).unwrap_or(0) * 8) as f64
}

/// The types tried for a matrix of rows of `row_len`, cheapest first: the K-quants and
/// i-quants for rows of whole 256-blocks (those llama-quantize makes only with importances,
/// IQ2_* and IQ3_XXS, when the matrix has them), the legacy formats and IQ4_NL otherwise.
fn candidates(row_len: usize, importance: bool) -> Vec<DType> {
    let k = [
        DType::IQ2XXS,
        DType::IQ2XS,
        DType::IQ2S,
        DType::Q2K,
        DType::IQ3XXS,
        DType::Q3K,
        DType::IQ3S,
        DType::IQ4XS,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8_0,
    ];
    let legacy = [
        DType::Q4_0,
        DType::IQ4NL,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ];
    let list: &[DType] = if row_len.is_multiple_of(256) {
        &k
    } else {
        &legacy
    };
    let needs = [DType::IQ2XXS, DType::IQ2XS, DType::IQ2S, DType::IQ3XXS];
    list.iter()
        .copied()
        .filter(|t| row_len.is_multiple_of(t.block_size()))
        .filter(|t| importance || !needs.contains(t))
        .collect()
}

fn log_softmax(row: &[f32], out: &mut [f32]) {
    for (o, l) in out.iter_mut().zip(crate::perplexity::log_probs(row)) {
        *o = l as f32;
    }
}

struct Calibration {
    chunks: Vec<Vec<u32>>,
    /// Reference log-probabilities, every position of every chunk.
    reference: Vec<Vec<f32>>,
    /// The source's hidden states entering each layer (and the head, last), per chunk: a
    /// change to layer l is measured from `hidden[c][l]` on, without the layers before it.
    hidden: Vec<Vec<Vec<f32>>>,
    vocab: usize,
}

fn chunk_batch(chunk: &[u32]) -> Batch {
    let mut b = Batch::default();
    for (pos, &t) in chunk.iter().enumerate() {
        b.push(0, pos, t, true);
    }
    b
}

impl Calibration {
    fn new(model: &Model, opts: &SearchOptions) -> Result<Calibration> {
        let ctx = opts.ctx.clamp(2, model.cfg.max_position_embeddings);
        let n = (opts.tokens.len() / ctx).min(opts.chunks.max(1));
        if n == 0 {
            return Err(Error::Input(format!(
                "--target-bpw needs at least {ctx} calibration tokens, the text has {}",
                opts.tokens.len()
            )));
        }
        let vocab = model.cfg.vocab_size;
        let chunks: Vec<Vec<u32>> = (0..n)
            .map(|i| opts.tokens[i * ctx..(i + 1) * ctx].to_vec())
            .collect();
        let (mut reference, mut hidden) = (Vec::new(), Vec::new());
        for c in &chunks {
            let mut cache = model.new_cache();
            let out =
                model.forward_opts(&chunk_batch(c), std::slice::from_mut(&mut cache), true)?;
            let mut lp = vec![0f32; out.logits.len()];
            for (r, o) in out.logits.chunks(vocab).zip(lp.chunks_mut(vocab)) {
                log_softmax(r, o);
            }
            reference.push(lp);
            hidden.push(out.hidden);
        }
        Ok(Calibration {
            chunks,
            reference,
            hidden,
            vocab,
        })
    }

    /// Mean KL(reference ‖ model) over every calibration position, the layers before
    /// `from` (when given) taken as the source's.
    fn kl(&self, model: &Model, from: Option<usize>) -> Result<f64> {
        let (mut sum, mut n) = (0.0f64, 0usize);
        let mut lp = vec![0f32; self.vocab];
        for (k, (c, reference)) in self.chunks.iter().zip(&self.reference).enumerate() {
            let mut cache = model.new_cache();
            let caches = std::slice::from_mut(&mut cache);
            let b = chunk_batch(c);
            let logits = match from {
                Some(l) => model.forward_from_layer(&b, caches, l, self.hidden[k][l].clone())?,
                None => model.forward(&b, caches)?,
            }
            .logits;
            for (row, lr) in logits.chunks(self.vocab).zip(reference.chunks(self.vocab)) {
                log_softmax(row, &mut lp);
                let kl: f64 = lr
                    .iter()
                    .zip(&lp)
                    .map(|(&q, &p)| (q as f64).exp() * (q as f64 - p as f64))
                    .sum();
                sum += kl.max(0.0);
                n += 1;
            }
        }
        if !sum.is_finite() {
            return Err(Error::Msg("the KL divergence is not finite".into()));
        }
        Ok(sum / n.max(1) as f64)
    }
}

/// Set the weight named `name` (a layer's matrix or the LM head; a tied embedding is both
/// the head and the lookup table) to `t`.
fn swap(model: &mut Model, name: &str, t: Tensor) {
    if model.lm_head.linear.name.as_deref() == Some(name) {
        if name == "token_embd.weight" {
            model.embed.t = t.clone();
        }
        model.lm_head.linear.w = t;
        return;
    }
    for layer in model.layers.iter_mut() {
        for l in layer.linears_mut() {
            if l.name.as_deref() == Some(name) {
                l.w = t;
                return;
            }
        }
    }
}

/// The weight named `name`, as the model holds it.
fn weight(model: &mut Model, name: &str) -> Result<Tensor> {
    if model.lm_head.linear.name.as_deref() == Some(name) {
        return Ok(model.lm_head.linear.w.clone());
    }
    for layer in model.layers.iter_mut() {
        for l in layer.linears_mut() {
            if l.name.as_deref() == Some(name) {
                return Ok(l.w.clone());
            }
        }
    }
    Err(Error::Config(format!("no weight {name} in the model")))
}

/// Every weight matrix's name and the first layer its change reaches: its own layer, the
/// head (`layers.len()`) for an untied LM head, `None` (the whole model) for a tied embedding.
fn weight_names(model: &mut Model) -> Vec<(String, Option<usize>)> {
    let mut names = Vec::new();
    for (i, layer) in model.layers.iter_mut().enumerate() {
        for l in layer.linears_mut() {
            names.extend(l.name.clone().map(|n| (n, Some(i))));
        }
    }
    let head = model.layers.len();
    if let Some(n) = model.lm_head.linear.name.clone() {
        let from = (n != "token_embd.weight").then_some(head);
        names.push((n, from));
    }
    names
}

/// What the measurements depend on (see [`SensitivityTable`]).
fn fingerprint(
    model: &mut Model,
    eligible: &[(String, usize, Option<usize>)],
    opts: &SearchOptions,
    ctx: usize,
    chunks: usize,
) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let tensor = |h: &mut Sha256, name: &str, t: &Tensor| {
        h.update(name.as_bytes());
        h.update(t.dtype.name().as_bytes());
        for d in &t.shape {
            h.update((*d as u64).to_le_bytes());
        }
        h.update(t.data());
    };
    tensor(&mut h, "token_embd.weight", &model.embed.t.clone());
    for (name, _, _) in eligible {
        let w = weight(model, name)?;
        tensor(&mut h, name, &w);
        if let Some(q) = opts.imatrix.and_then(|im| im.importance(name)) {
            for v in q {
                h.update(v.to_le_bytes());
            }
        }
    }
    h.update((ctx as u64).to_le_bytes());
    h.update((chunks as u64).to_le_bytes());
    for &t in &opts.tokens[..(ctx * chunks).min(opts.tokens.len())] {
        h.update(t.to_le_bytes());
    }
    Ok(format!("{:x}", h.finalize()))
}

/// `t`'s rows (in the model's order) stored as `dtype`, fitted with `importance`.
fn requantize(t: &Tensor, dtype: DType, importance: Option<&[f32]>) -> Result<Tensor> {
    let n = t.row_len();
    let rb = dtype.bytes_for(n).unwrap_or(0);
    let mut out = vec![0u8; t.n_rows() * rb];
    let mut row = vec![0f32; n];
    for (r, dst) in out.chunks_mut(rb.max(1)).enumerate() {
        t.row_to_f32(r, &mut row);
        match importance {
            Some(qw) => quant::quantize_row_weighted(dtype, &row, qw, dst),
            None => quant::quantize_row(dtype, &row, dst),
        }
        .map_err(|e| Error::Config(format!("{dtype}: {e}")))?;
    }
    Ok(Tensor::from_bytes(dtype, t.shape.clone(), out))
}

/// Choose the types of `plan`'s weight matrices for `opts.target_bpw`, measuring on `model`
/// (the source). `progress(done, total)` after each measurement.
pub fn target_bpw(
    model: &mut Model,
    mut plan: Plan,
    opts: &SearchOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Plan, SearchReport)> {
    let cal = Calibration::new(model, opts)?;
    let names = weight_names(model);
    let index: BTreeMap<&str, usize> = plan
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let eligible: Vec<(String, usize, Option<usize>)> = names
        .iter()
        .filter_map(|(n, from)| index.get(n.as_str()).map(|&i| (n.clone(), i, *from)))
        .filter(|(_, i, _)| plan.tensors[*i].shape.len() == 2)
        .collect();
    if eligible.is_empty() {
        return Err(Error::Config(
            "no weight matrices to choose types for".into(),
        ));
    }
    let total_params: usize = plan.tensors.iter().map(|t| t.numel()).sum();
    let fixed_bits: f64 = plan
        .tensors
        .iter()
        .enumerate()
        .filter(|(i, _)| !eligible.iter().any(|(_, j, _)| j == i))
        .map(|(_, t)| bits(t.dtype, t.numel()))
        .sum();
    let budget = opts.target_bpw * total_params as f64 - fixed_bits;

    // Sensitivities (those in the table kept, the others measured and added to it).
    let mut saved = match opts.sensitivity {
        Some(path) => {
            let mut t = SensitivityTable::load(path)?;
            let print = fingerprint(
                model,
                &eligible,
                opts,
                cal.chunks[0].len(),
                cal.chunks.len(),
            )?;
            if t.kl.is_empty() {
                t.fingerprint = print;
            } else if t.fingerprint != print {
                return Err(Error::Input(format!(
                    "{} was measured on another source, calibration text or imatrix (its \
                     fingerprint differs): give another --sensitivity file or delete it",
                    path.display()
                )));
            }
            Some((t, path))
        }
        None => None,
    };
    let importance_of = |name: &str, row_len: usize| {
        opts.imatrix
            .and_then(|im| im.importance(name))
            .filter(|q| q.len() == row_len)
    };
    let total: usize = eligible
        .iter()
        .map(|(name, i, _)| {
            let row_len = plan.tensors[*i].row_len();
            candidates(row_len, importance_of(name, row_len).is_some()).len()
        })
        .sum();
    let mut done = 0;
    let mut measured = 0;
    let mut table: Vec<Vec<(DType, f64)>> = Vec::new();
    for (name, i, from) in &eligible {
        let row_len = plan.tensors[*i].row_len();
        let importance = importance_of(name, row_len);
        let mut row = Vec::new();
        let before = measured;
        for q in candidates(row_len, importance.is_some()) {
            let known = saved.as_ref().and_then(|(t, _)| t.get(name, q));
            let kl = match known {
                Some(kl) => kl,
                None => {
                    let original = weight(model, name)?;
                    let trial = requantize(&original, q, importance.as_deref())?;
                    swap(model, name, trial);
                    let kl = cal.kl(model, *from);
                    swap(model, name, original);
                    measured += 1;
                    let kl = kl?;
                    if let Some((t, _)) = saved.as_mut() {
                        t.kl.entry(name.clone())
                            .or_default()
                            .insert(q.name().to_string(), kl);
                    }
                    kl
                }
            };
            row.push((q, kl));
            done += 1;
            progress(done, total);
        }
        if let Some((t, path)) = saved.as_ref().filter(|_| measured > before) {
            t.save(path)?;
        }
        table.push(row);
    }

    // Allocation: cheapest first, then the best KL-per-bit upgrades that fit.
    let numel: Vec<usize> = eligible
        .iter()
        .map(|(_, i, _)| plan.tensors[*i].numel())
        .collect();
    let mut choice: Vec<usize> = table
        .iter()
        .zip(&numel)
        .map(|(r, &n)| {
            (0..r.len())
                .min_by(|&a, &b| bits(r[a].0, n).total_cmp(&bits(r[b].0, n)))
                .unwrap_or(0)
        })
        .collect();
    let used = |choice: &[usize]| -> f64 {
        choice
            .iter()
            .enumerate()
            .map(|(k, &c)| bits(table[k][c].0, numel[k]))
            .sum()
    };
    if used(&choice) > budget {
        let min_bpw = (used(&choice) + fixed_bits) / total_params as f64;
        return Err(Error::Input(format!(
            "--target-bpw {} is below what the smallest types give ({min_bpw:.2} bits per weight)",
            opts.target_bpw
        )));
    }
    loop {
        let room = budget - used(&choice);
        let mut best: Option<(usize, usize, f64)> = None;
        for (k, r) in table.iter().enumerate() {
            let (cur_t, cur_kl) = r[choice[k]];
            for (c, &(t, kl)) in r.iter().enumerate() {
                let cost = bits(t, numel[k]) - bits(cur_t, numel[k]);
                let gain = cur_kl - kl;
                if cost <= 0.0 || gain <= 0.0 || cost > room {
                    continue;
                }
                let ratio = gain / cost;
                if best.is_none_or(|b| ratio > b.2) {
                    best = Some((k, c, ratio));
                }
            }
        }
        match best {
            Some((k, c, _)) => choice[k] = c,
            None => break,
        }
    }

    // Apply, measure the whole mix, restore the model.
    let mut report = SearchReport {
        measurements: measured,
        reused: done - measured,
        ..Default::default()
    };
    let mut originals = Vec::new();
    for (k, (name, i, _)) in eligible.iter().enumerate() {
        let (t, kl) = table[k][choice[k]];
        report.kl_estimate += kl;
        report.chosen.insert(name.clone(), t);
        let p = &mut plan.tensors[*i];
        p.dtype = t;
        p.importance = opts
            .imatrix
            .and_then(|im| im.importance(name))
            .filter(|q| q.len() == p.row_len())
            .map(std::sync::Arc::new);
        let original = weight(model, name)?;
        let trial = requantize(&original, t, p.importance.as_deref().map(|v| v.as_slice()))?;
        swap(model, name, trial);
        originals.push((name.clone(), original));
    }
    report.kl_measured = cal.kl(model, None)?;
    for (name, t) in originals {
        swap(model, &name, t);
    }
    report.bpw = plan
        .tensors
        .iter()
        .map(|t| bits(t.dtype, t.numel()))
        .sum::<f64>()
        / total_params as f64;
    Ok((plan, report))
}
