//! `--target-bpw B`: the type of each weight matrix chosen to minimise measured output error
//! within B bits per weight (a per-tensor sensitivity search).
//!
//! 1. Reference: the source model's log-probabilities on calibration chunks (every position).
//! 2. Sensitivity: for each weight matrix t and each candidate type q (Q2_K…Q6_K and Q8_0 for
//!    rows of whole 256-blocks; Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 otherwise), only t is quantized to q
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
}

fn bits(dtype: DType, numel: usize) -> f64 {
    (dtype.bytes_for(numel).unwrap_or(0) * 8) as f64
}

fn candidates(row_len: usize) -> Vec<DType> {
    let k = [
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8_0,
    ];
    let legacy = [
        DType::Q4_0,
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
    list.iter()
        .copied()
        .filter(|t| row_len.is_multiple_of(t.block_size()))
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
    vocab: usize,
}

fn chunk_logits(model: &Model, chunk: &[u32]) -> Result<Vec<f32>> {
    let mut b = Batch::default();
    for (pos, &t) in chunk.iter().enumerate() {
        b.push(0, pos, t, true);
    }
    let mut cache = model.new_cache();
    Ok(model.forward(&b, std::slice::from_mut(&mut cache))?.logits)
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
        let mut reference = Vec::new();
        for c in &chunks {
            let logits = chunk_logits(model, c)?;
            let mut lp = vec![0f32; logits.len()];
            for (r, o) in logits.chunks(vocab).zip(lp.chunks_mut(vocab)) {
                log_softmax(r, o);
            }
            reference.push(lp);
        }
        Ok(Calibration {
            chunks,
            reference,
            vocab,
        })
    }

    /// Mean KL(reference ‖ model) over every calibration position.
    fn kl(&self, model: &Model) -> Result<f64> {
        let (mut sum, mut n) = (0.0f64, 0usize);
        let mut lp = vec![0f32; self.vocab];
        for (c, reference) in self.chunks.iter().zip(&self.reference) {
            let logits = chunk_logits(model, c)?;
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
    if model.lm_head.name.as_deref() == Some(name) {
        if name == "token_embd.weight" {
            model.embed.t = t.clone();
        }
        model.lm_head.w = t;
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
    if model.lm_head.name.as_deref() == Some(name) {
        return Ok(model.lm_head.w.clone());
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

fn weight_names(model: &mut Model) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for layer in model.layers.iter_mut() {
        for l in layer.linears_mut() {
            names.extend(l.name.clone());
        }
    }
    names.extend(model.lm_head.name.clone());
    names
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
    let eligible: Vec<(String, usize)> = names
        .iter()
        .filter_map(|n| index.get(n.as_str()).map(|&i| (n.clone(), i)))
        .filter(|(_, i)| plan.tensors[*i].shape.len() == 2)
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
        .filter(|(i, _)| !eligible.iter().any(|(_, j)| j == i))
        .map(|(_, t)| bits(t.dtype, t.numel()))
        .sum();
    let budget = opts.target_bpw * total_params as f64 - fixed_bits;

    // Sensitivities.
    let total: usize = eligible
        .iter()
        .map(|(_, i)| candidates(plan.tensors[*i].row_len()).len())
        .sum();
    let mut done = 0;
    let mut table: Vec<Vec<(DType, f64)>> = Vec::new();
    for (name, i) in &eligible {
        let importance = opts.imatrix.and_then(|im| im.importance(name));
        let importance = importance.filter(|q| q.len() == plan.tensors[*i].row_len());
        let mut row = Vec::new();
        for q in candidates(plan.tensors[*i].row_len()) {
            let original = weight(model, name)?;
            let trial = requantize(&original, q, importance.as_deref())?;
            swap(model, name, trial);
            let kl = cal.kl(model);
            swap(model, name, original);
            row.push((q, kl?));
            done += 1;
            progress(done, total);
        }
        table.push(row);
    }

    // Allocation: cheapest first, then the best KL-per-bit upgrades that fit.
    let numel: Vec<usize> = eligible
        .iter()
        .map(|(_, i)| plan.tensors[*i].numel())
        .collect();
    let mut choice: Vec<usize> = table
        .iter()
        .map(|r| {
            (0..r.len())
                .min_by(|&a, &b| bits(r[a].0, 1).total_cmp(&bits(r[b].0, 1)))
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
        measurements: done,
        ..Default::default()
    };
    let mut originals = Vec::new();
    for (k, (name, i)) in eligible.iter().enumerate() {
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
    report.kl_measured = cal.kl(model)?;
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
