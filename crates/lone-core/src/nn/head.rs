//! The LM head and its numeric policy: which copy of the head a pass's logit rows are
//! multiplied by, and the exact rescoring of each row's top logits.
//!
//! In the default mode every logit row of every pass takes the same kernel — the 8-bit one
//! where the head's format has it, an F16/BF16 head through its Q8_0 copy — and each row's
//! top [`RESCORE_TOP`] logits are then recomputed exactly, so the token picked (and the top of
//! a sampled distribution) is the exact head's, whatever the pass. Exact mode's prompt passes
//! multiply their logit rows (each sequence's last) on the exact matrix-vector kernel, not
//! the prompt GEMM, which would dequantize the whole head for a row; scoring every row
//! (perplexity) takes the GEMM.

use std::sync::OnceLock;

use super::Linear;
use crate::kernels::{self, Mode, Pass};
use crate::tensor::DType;

/// Candidates per row that [`Head::logits`] recomputes exactly in [`crate::kernels::Mode::Auto`]
/// on 8-bit kernels. The 8-bit head moves logits by well under one unit (measured on SmolLM2
/// against llama.cpp: ≤ 1.2 nats in the top 10), so the exact argmax is among the 8-bit top 32.
const RESCORE_TOP: usize = 32;

/// The output projection to the vocabulary.
pub struct Head {
    pub linear: Linear,
    /// An F16/BF16 head's Q8_0 copy ([`Head::for_pass`]), built on first use, with the
    /// address of the head's bytes it was made from (a head swapped since is not read
    /// through it).
    copy_8bit: OnceLock<(usize, Linear)>,
}

impl Head {
    pub fn new(linear: Linear) -> Head {
        Head {
            linear,
            copy_8bit: OnceLock::new(),
        }
    }

    /// The logits of `n` final-normed rows `xs` in `pass` (`score_all`: every row of the
    /// pass is scored, as perplexity does).
    pub fn logits(&self, xs: &[f32], n: usize, pass: &Pass, score_all: bool) -> Vec<f32> {
        let head = self.for_pass(pass, score_all);
        let copy = !std::ptr::eq(head, &self.linear);
        // A finite `row_invariant_rows` means the head is on 8-bit kernels.
        let lim = kernels::row_invariant_rows(head.w.dtype);
        let rescore = copy || (pass.mode == Mode::Auto && !pass.exact() && lim != usize::MAX);
        let _rows = (pass.exact_prompt() && !score_all).then(|| pass.exact_rows().enter());
        let mut logits = head.forward(xs, n);
        drop(_rows);
        if rescore {
            rescore_top(&self.linear, xs, &mut logits, RESCORE_TOP);
        }
        logits
    }

    /// The head a pass's logit rows are multiplied by: the model's own, or an F16/BF16
    /// head's Q8_0 copy — in [`Mode::Auto`] and fast mode, for any pass that does not score
    /// every row (perplexity wants each row's logit of its next token, not the top). Decode
    /// reads the whole head once per token (a fifth of LFM2-350M F16's bytes, over a quarter
    /// of Qwen2.5-0.5B's), and the copy is 53 % of those bytes on the 8-bit kernels every
    /// quantized head takes in these modes; [`Head::logits`] then rescores each row's top
    /// [`RESCORE_TOP`] logits with the head itself, so the token picked is the F16/BF16
    /// head's. The copy is built on first use and kept beside the head (the embedding rows
    /// still come from the head's tensor).
    fn for_pass(&self, pass: &Pass, score_all: bool) -> &Linear {
        let head = &self.linear;
        let here = match pass.mode {
            Mode::Fast => !score_all,
            _ => pass.rows_alone() && !score_all,
        };
        if !(here && self.copy_in(pass.mode)) {
            return head;
        }
        let at = head.w.data().as_ptr() as usize;
        let (from, copy) = self.copy_8bit.get_or_init(|| {
            let w = kernels::q8_0_copy_for_fast_rows(&head.w);
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

    /// Whether decode passes in `mode` read the head through its Q8_0 copy: an F16/BF16
    /// head of whole Q8_0 blocks, `Auto` or `Fast` on a family with 8-bit kernels.
    fn copy_in(&self, mode: Mode) -> bool {
        matches!(self.linear.w.dtype, DType::F16 | DType::BF16)
            && mode != Mode::Exact
            && kernels::isa().has_8bit()
            && self.linear.in_dim.is_multiple_of(DType::Q8_0.block_size())
    }

    /// The bytes of the Q8_0 copy when decode in `mode` reads the head through it: what a
    /// decoded token reads of the head then.
    pub fn copy_bytes(&self, mode: Mode) -> Option<u64> {
        self.copy_in(mode).then(|| {
            let rb = DType::Q8_0.bytes_for(self.linear.in_dim).unwrap_or(0);
            (rb * self.linear.out_dim) as u64
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
