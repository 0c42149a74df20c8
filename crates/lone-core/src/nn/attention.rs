//! Grouped-query causal attention with RoPE, optional per-head q/k RMSNorm, optional
//! sliding window, over the per-sequence KV cache.

use super::{Linear, RmsNorm, Row};
use crate::cache::{KvView, LayerCache, SeqCache};
use crate::error::Result;
use crate::kernels::{self, Rope};
use crate::loader::Weights;

/// How one attention layer is named and shaped.
pub struct AttentionSpec<'a> {
    pub prefix: &'a str,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub bias: bool,
    /// Output projection module name (`o_proj` or `out_proj`).
    pub out_name: &'a str,
    /// Per-head q/k norm module names (e.g. `q_norm`, `k_norm`), if any.
    pub qk_norm: Option<(&'a str, &'a str)>,
    pub norm_eps: f32,
    pub rope: Rope,
    /// Keys visible to position i: i - window < j <= i.
    pub window: Option<usize>,
    /// Per-head sigmoid output gate module name (LFM3's `g_proj`), if any.
    pub gate: Option<&'a str>,
}

pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope: Rope,
    pub window: Option<usize>,
    /// `[n_heads, hidden]`: each head's output is scaled by sigmoid(gate · x).
    pub gate: Option<Linear>,
}

impl Attention {
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = vec![&mut self.q, &mut self.k, &mut self.v, &mut self.o];
        if let Some(g) = self.gate.as_mut() {
            v.push(g);
        }
        v
    }
}

impl Attention {
    pub fn load(ws: &Weights, s: &AttentionSpec) -> Result<Attention> {
        let p = s.prefix;
        let (qd, kvd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let (q_norm, k_norm) = match s.qk_norm {
            Some((qn, kn)) => (
                Some(RmsNorm::load(
                    ws,
                    &format!("{p}.{qn}"),
                    s.head_dim,
                    s.norm_eps,
                )?),
                Some(RmsNorm::load(
                    ws,
                    &format!("{p}.{kn}"),
                    s.head_dim,
                    s.norm_eps,
                )?),
            ),
            None => (None, None),
        };
        Ok(Attention {
            q: Linear::load(ws, &format!("{p}.q_proj"), s.hidden, qd, s.bias)?,
            k: Linear::load(ws, &format!("{p}.k_proj"), s.hidden, kvd, s.bias)?,
            v: Linear::load(ws, &format!("{p}.v_proj"), s.hidden, kvd, s.bias)?,
            o: Linear::load(ws, &format!("{p}.{}", s.out_name), qd, s.hidden, false)?,
            q_norm,
            k_norm,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
            rope: s.rope.clone(),
            window: s.window,
            gate: match s.gate {
                Some(g) => Some(Linear::load(
                    ws,
                    &format!("{p}.{g}"),
                    s.hidden,
                    s.n_heads,
                    false,
                )?),
                None => None,
            },
        })
    }

    /// Project, rotate and cache q/k/v for `rows`, then attend. Returns the per-head context
    /// `[n, n_heads * head_dim]` (before the output projection).
    pub fn context(
        &self,
        x: &[f32],
        rows: &[Row],
        pass: &kernels::Pass,
        caches: &mut [SeqCache],
        layer: usize,
    ) -> Vec<f32> {
        let n = rows.len();
        let hd = self.head_dim;
        let (qd, kvd) = (self.n_heads * hd, self.n_kv_heads * hd);
        // The output gate (LFM3) reads the same input: projected in the same pass.
        let (mut q, mut k, v, gates) = match &self.gate {
            Some(g) => {
                let [q, k, v, gt] = Linear::forward_many([&self.q, &self.k, &self.v, g], x, n);
                (q, k, v, Some(gt))
            }
            None => {
                let [q, k, v] = Linear::forward_many([&self.q, &self.k, &self.v], x, n);
                (q, k, v, None)
            }
        };
        if let Some(qn) = &self.q_norm {
            qn.forward(&mut q);
        }
        if let Some(kn) = &self.k_norm {
            kn.forward(&mut k);
        }
        for (i, r) in rows.iter().enumerate() {
            self.rope.apply(
                &mut q[i * qd..(i + 1) * qd],
                &mut k[i * kvd..(i + 1) * kvd],
                hd,
                r.pos,
            );
        }
        let mut ctx = vec![0.0; n * qd];
        // Runs of rows that attend as matrix products (`chunk` is then n): see `gemm_runs`.
        let gemm_runs = self.gemm_runs(rows, pass, caches, layer);
        // A ring of `cap` rows can take `cap - window` new rows before one still needed by an
        // earlier row of this batch is overwritten: attend in chunks of that size.
        let chunk = caches
            .first()
            .map_or(usize::MAX, |c| c.layers[layer].appendable())
            .min(n.max(1));
        let mut start = 0;
        while start < n {
            let end = (start + chunk).min(n);
            for i in start..end {
                let r = rows[i];
                caches[r.seq].layers[layer].append_kv(
                    r.pos,
                    &k[i * kvd..(i + 1) * kvd],
                    &v[i * kvd..(i + 1) * kvd],
                );
            }
            if let Some(runs) = &gemm_runs {
                for &(s, e) in runs {
                    self.attend_gemm(
                        &q[s * qd..e * qd],
                        &caches[rows[s].seq].layers[layer],
                        rows[s].pos,
                        e - s,
                        &mut ctx[s * qd..e * qd],
                    );
                }
                break;
            }
            let caches_ro: &[SeqCache] = caches;
            let layers: Vec<&LayerCache> = rows[start..end]
                .iter()
                .map(|r| &caches_ro[r.seq].layers[layer])
                .collect();
            self.attend_rows(
                &q[start * qd..end * qd],
                &rows[start..end],
                &layers,
                &mut ctx[start * qd..end * qd],
            );
            start = end;
        }
        self.apply_gate(gates.as_deref(), &mut ctx);
        ctx
    }

    /// LFM3's per-head sigmoid output gate (`gates`: `[n, n_heads]` pre-activations), if any.
    fn apply_gate(&self, gates: Option<&[f32]>, ctx: &mut [f32]) {
        let hd = self.head_dim;
        if let Some(gates) = gates {
            for (row, gr) in ctx
                .chunks_mut(self.n_heads * hd)
                .zip(gates.chunks(self.n_heads))
            {
                for (head, &gv) in row.chunks_mut(hd).zip(gr) {
                    let s = 1.0 / (1.0 + (-gv).exp());
                    head.iter_mut().for_each(|v| *v *= s);
                }
            }
        }
    }

    /// The runs of rows (`sequence_runs`) that attend as matrix products
    /// ([`Attention::attend_gemm`]), if the rows do; all need a full-attention cache.
    /// - Prompt rows: each sequence's run, however short. A row's result is then the same
    ///   whatever rows share its pass (prompts give the same logits whole, chunked or after a
    ///   cached prefix).
    /// - Decode rows (speculation's verify rows too): never. They attend as a lone decode row
    ///   does, so accepting a draft changes nothing.
    /// - Otherwise (fast mode): one sequence's run of enough rows for the products to pay.
    fn gemm_runs(
        &self,
        rows: &[Row],
        pass: &kernels::Pass,
        caches: &[SeqCache],
        layer: usize,
    ) -> Option<Vec<(usize, usize)>> {
        const MIN_ROWS: usize = 16;
        if self.window.is_some() || pass.rows_alone() {
            return None;
        }
        let runs = sequence_runs(rows, caches, layer)?;
        (pass.exact_prompt() || (runs.len() == 1 && rows.len() >= MIN_ROWS)).then_some(runs)
    }

    /// Attention of `n` consecutive rows from `pos0` of one sequence as two matrix products
    /// per KV head (scores = K·q for all the group's query heads, then V^T·p), so that long
    /// prompts run on the GEMM kernels. Keys after a row's position are masked out of its
    /// softmax (their scores are computed and dropped).
    fn attend_gemm(&self, q: &[f32], cache: &LayerCache, pos0: usize, n: usize, ctx: &mut [f32]) {
        let hd = self.head_dim;
        let qd = self.n_heads * hd;
        let group = self.n_heads / self.n_kv_heads;
        // Query rows per chunk: a chunk multiplies only the keys up to its last position, so
        // the causal mask costs at most one chunk's worth of dropped scores per row. At long
        // contexts fewer rows, so that a chunk's scores stay within ~64 MiB.
        const SCORES_BUDGET: usize = 16 << 20;
        let chunk = (SCORES_BUDGET / (group * (pos0 + n))).clamp(16, 128);
        let Some(KvView { k: kc, v: vc, .. }) = cache.kv().filter(|kv| kv.is_full()) else {
            unreachable!("checked by gemm_runs")
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let (mut kh, mut vt, mut qg, mut scores, mut out) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i0 in (0..n).step_by(chunk) {
            let i1 = (i0 + chunk).min(n);
            let nk = pos0 + i1;
            let nq = (i1 - i0) * group;
            for kvh in 0..self.n_kv_heads {
                kh.clear();
                vt.clear();
                vt.resize(hd * nk, 0.0);
                kh.resize(nk * hd, 0.0);
                let mut vrow = vec![0.0f32; hd];
                for j in 0..nk {
                    kc.read(j, kvh * hd, &mut kh[j * hd..(j + 1) * hd]);
                    vc.read(j, kvh * hd, &mut vrow);
                    for (d, &val) in vrow.iter().enumerate() {
                        vt[d * nk + j] = val;
                    }
                }
                qg.clear();
                for i in i0..i1 {
                    for g in 0..group {
                        let src = i * qd + (kvh * group + g) * hd;
                        qg.extend_from_slice(&q[src..src + hd]);
                    }
                }
                scores.resize(nq * nk, 0.0);
                let kt = crate::tensor::Tensor::from_f32(vec![nk, hd], &kh);
                kernels::matmul(&kt, &qg, nq, &mut scores[..nq * nk]);
                let slots: Vec<std::sync::Mutex<&mut [f32]>> = scores[..nq * nk]
                    .chunks_mut(nk)
                    .map(std::sync::Mutex::new)
                    .collect();
                kernels::parallel_for(nq, 16, &|range| {
                    for row in range {
                        let visible = pos0 + i0 + row / group + 1;
                        let mut s = slots[row].lock().unwrap();
                        s[..visible].iter_mut().for_each(|v| *v *= scale);
                        kernels::softmax(&mut s[..visible]);
                        s[visible..].fill(0.0);
                    }
                });
                drop(slots);
                out.resize(nq * hd, 0.0);
                let vtt = crate::tensor::Tensor::from_f32(vec![hd, nk], &vt);
                kernels::matmul(&vtt, &scores[..nq * nk], nq, &mut out[..nq * hd]);
                for i in i0..i1 {
                    for g in 0..group {
                        let dst = i * qd + (kvh * group + g) * hd;
                        let src = ((i - i0) * group + g) * hd;
                        ctx[dst..dst + hd].copy_from_slice(&out[src..src + hd]);
                    }
                }
            }
        }
    }

    /// Decode-style attention of `rows` (each attending to its own cache `layers[i]`, which
    /// already holds its key and value): `q` and `ctx` are the rows' queries and outputs.
    ///
    /// One task per (row, KV head, run of SPLIT_KEYS keys): a single decode row still uses
    /// every thread, evenly at long contexts. A row that sees more keys than one run has its
    /// runs' unnormalised outputs combined after the parallel part. The runs depend on the
    /// row's position alone, so the row's result does not depend on what else the step holds.
    fn attend_rows(&self, q: &[f32], rows: &[Row], layers: &[&LayerCache], ctx: &mut [f32]) {
        let qd = self.n_heads * self.head_dim;
        let nkv = self.n_kv_heads;
        let gd = qd / nkv;
        let group = self.n_heads / nkv;
        let runs_of = |i: usize| self.visible(rows[i].pos).div_ceil(SPLIT_KEYS);
        // (row, kvh, run, partial slot; usize::MAX for a row of one run)
        let mut tasks = Vec::new();
        let mut n_parts = 0;
        for i in 0..rows.len() {
            let nr = runs_of(i);
            for kvh in 0..nkv {
                if nr == 1 {
                    tasks.push((i, kvh, 0, usize::MAX));
                } else {
                    tasks.extend((0..nr).map(|c| (i, kvh, c, n_parts + c)));
                    n_parts += nr;
                }
            }
        }
        let slots: Vec<std::sync::Mutex<&mut [f32]>> =
            ctx.chunks_mut(gd).map(std::sync::Mutex::new).collect();
        let mut part_out = vec![0f32; n_parts * gd];
        let mut part_stats = vec![(0f32, 0f32); n_parts * group];
        let part_slots: Vec<std::sync::Mutex<PartSlot>> = part_out
            .chunks_mut(gd)
            .zip(part_stats.chunks_mut(group))
            .map(std::sync::Mutex::new)
            .collect();
        kernels::parallel_for(tasks.len(), 1, &|range| {
            for &(i, kvh, c, slot) in &tasks[range] {
                let pos = rows[i].pos;
                let qi = &q[i * qd..(i + 1) * qd];
                if slot == usize::MAX {
                    let mut out = slots[i * nkv + kvh].lock().unwrap();
                    self.attend(qi, layers[i], pos, kvh, &mut out);
                } else {
                    let keys = c * SPLIT_KEYS..((c + 1) * SPLIT_KEYS).min(self.visible(pos));
                    let mut p = part_slots[slot].lock().unwrap();
                    let (o, st) = &mut *p;
                    self.attend_keys(qi, layers[i], pos, kvh, keys, o, Some(st));
                }
            }
        });
        drop((slots, part_slots));
        let mut slot = 0;
        for i in 0..rows.len() {
            let nr = runs_of(i);
            if nr == 1 {
                continue;
            }
            for kvh in 0..nkv {
                combine_parts(
                    &part_out[slot * gd..(slot + nr) * gd],
                    &part_stats[slot * group..(slot + nr) * group],
                    nr,
                    group,
                    &mut ctx[i * qd + kvh * gd..i * qd + (kvh + 1) * gd],
                );
                slot += nr;
            }
        }
    }

    /// One row's attention for the query heads of KV head `kvh` (`group` heads): `q` is the
    /// whole row, `out` the group's `group · head_dim` outputs. The group's heads share every
    /// key and value row they read (`kernels::dot_rows`, `kernels::mix_rows`).
    fn attend(&self, q: &[f32], cache: &LayerCache, pos: usize, kvh: usize, out: &mut [f32]) {
        let nk = self.visible(pos);
        self.attend_keys(q, cache, pos, kvh, 0..nk, out, None);
    }

    /// How many keys the row at `pos` attends to.
    fn visible(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).min(w),
            None => pos + 1,
        }
    }

    /// [`Self::attend`] over the visible keys `keys` (indices among the `visible(pos)` keys,
    /// oldest first). With `parts` (one `(max, Σ)` pair per head of the group), the
    /// exponentials are left unnormalised: `out` is `Σ e^(s - max) · v` and `parts` says how to
    /// combine it with the other ranges' ([`combine_parts`]); without, `out` is the attention
    /// output (the softmax over these keys).
    #[allow(clippy::too_many_arguments)]
    fn attend_keys(
        &self,
        q: &[f32],
        cache: &LayerCache,
        pos: usize,
        kvh: usize,
        keys: std::ops::Range<usize>,
        out: &mut [f32],
        parts: Option<&mut [(f32, f32)]>,
    ) {
        let hd = self.head_dim;
        let kvd = self.n_kv_heads * hd;
        let group = self.n_heads / self.n_kv_heads;
        let first = pos + 1 - self.visible(pos) + keys.start;
        let kv = cache.kv().expect("an attention layer's cache holds keys");
        let (kc, vc) = (kv.k, kv.v);
        let nk = keys.len();
        // Positions first..first+nk as runs of consecutive cache rows.
        let segs = kv.segments(first, nk);
        let qg = &q[kvh * group * hd..(kvh + 1) * group * hd];
        let mut scores = vec![0f32; group * nk];
        if segs[1].1 == 0 {
            kernels::dot_rows(
                qg,
                group,
                kc.view(first_row(segs[0].0, kvd, kvh, hd)),
                kvd,
                nk,
                hd,
                &mut scores,
            );
        } else {
            for &(row, len, off) in &segs {
                let mut part = vec![0f32; group * len];
                kernels::dot_rows(
                    qg,
                    group,
                    kc.view(first_row(row, kvd, kvh, hd)),
                    kvd,
                    len,
                    hd,
                    &mut part,
                );
                for g in 0..group {
                    scores[g * nk + off..][..len].copy_from_slice(&part[g * len..(g + 1) * len]);
                }
            }
        }
        let scale = 1.0 / (hd as f32).sqrt();
        match parts {
            None => {
                for row in scores.chunks_mut(nk) {
                    row.iter_mut().for_each(|v| *v *= scale);
                    kernels::softmax(row);
                }
            }
            Some(parts) => {
                for (row, p) in scores.chunks_mut(nk).zip(parts.iter_mut()) {
                    row.iter_mut().for_each(|v| *v *= scale);
                    *p = kernels::softmax_unnormalized(row);
                }
            }
        }
        out.fill(0.0);
        for &(row, len, off) in segs.iter().filter(|s| s.1 > 0) {
            kernels::mix_rows(
                &scores[off..],
                nk,
                group,
                vc.view(first_row(row, kvd, kvh, hd)),
                kvd,
                len,
                hd,
                out,
            );
        }
    }

    /// Full attention sub-block: context then output projection.
    pub fn forward(
        &self,
        x: &[f32],
        rows: &[Row],
        pass: &kernels::Pass,
        caches: &mut [SeqCache],
        layer: usize,
    ) -> Vec<f32> {
        let ctx = self.context(x, rows, pass, caches, layer);
        self.o.forward(&ctx, rows.len())
    }
}

/// One run's unnormalised outputs and its per-head `(max, Σ)` (`Attention::attend_rows`).
type PartSlot<'a> = (&'a mut [f32], &'a mut [(f32, f32)]);

/// Keys per task of a decode row's attention (see `Attention::context`).
const SPLIT_KEYS: usize = 256;

/// The attention output of a KV head's group from `nr` runs of keys attended apart
/// (`Attention::attend_keys` with parts): `outs` holds per run the group's unnormalised
/// outputs (`group · hd`), `stats` per run and head `(max, Σ)`. Each run is rescaled by
/// `e^(max - M)` (M the largest max) and the sum divided by the combined normaliser.
fn combine_parts(outs: &[f32], stats: &[(f32, f32)], nr: usize, group: usize, out: &mut [f32]) {
    let hd = out.len() / group;
    for g in 0..group {
        let m = (0..nr)
            .map(|c| stats[c * group + g].0)
            .fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = (0..nr)
            .map(|c| (stats[c * group + g].0 - m).exp())
            .collect();
        let total: f32 = (0..nr).map(|c| w[c] * stats[c * group + g].1).sum();
        let inv = 1.0 / total;
        let o = &mut out[g * hd..(g + 1) * hd];
        o.fill(0.0);
        for (c, &wc) in w.iter().enumerate() {
            let src = &outs[(c * group + g) * hd..(c * group + g + 1) * hd];
            for (d, &v) in o.iter_mut().zip(src) {
                *d += wc * v;
            }
        }
        o.iter_mut().for_each(|d| *d *= inv);
    }
}

/// `rows` as runs `(start, end)` of consecutive positions of one sequence, if every row's
/// cache is a full-attention one.
fn sequence_runs(rows: &[Row], caches: &[SeqCache], layer: usize) -> Option<Vec<(usize, usize)>> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        if !caches.get(r.seq)?.layers.get(layer)?.kv()?.is_full() {
            return None;
        }
        match runs.last_mut() {
            Some((s, e)) if rows[*s].seq == r.seq && rows[*s].pos + (i - *s) == r.pos => *e = i + 1,
            _ => runs.push((i, i + 1)),
        }
    }
    Some(runs)
}

/// Offset of KV head `kvh` in cache row `row` (rows of `kvd`, heads of `hd`).
fn first_row(row: usize, kvd: usize, kvh: usize, hd: usize) -> usize {
    row * kvd + kvh * hd
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{KvRows, KvType};
    use crate::tensor::Tensor;
    use crate::test_rng::Rng;

    fn dummy_linear() -> Linear {
        Linear {
            w: Tensor::from_f32(vec![1, 1], &[0.0]),
            b: None,
            in_dim: 1,
            out_dim: 1,
            name: None,
            expert: None,
        }
    }

    /// The GEMM form of prefill attention (chunked by query rows, causal) against the
    /// row-by-row form, on random data longer than several chunks and after a cached prefix.
    #[test]
    fn gemm_attention_matches_row_attention() {
        let (n_heads, n_kv_heads, hd) = (6, 2, 16);
        let att = test_attention(None);
        let mut rng = Rng(11);
        let (pos0, n) = (37, 300);
        let kvd = n_kv_heads * hd;
        let qd = n_heads * hd;
        let total = pos0 + n;
        let mut k = KvRows::new(KvType::F32, kvd, 0);
        let mut v = KvRows::new(KvType::F32, kvd, 0);
        for j in 0..total {
            k.set(j, &(0..kvd).map(|_| rng.f32()).collect::<Vec<_>>());
            v.set(j, &(0..kvd).map(|_| rng.f32()).collect::<Vec<_>>());
        }
        let cache = LayerCache::Attention { k, v };
        let q: Vec<f32> = (0..n * qd).map(|_| 2.0 * rng.f32()).collect();
        let mut got = vec![0.0; n * qd];
        att.attend_gemm(&q, &cache, pos0, n, &mut got);
        let mut want = vec![0.0; qd];
        let gd = qd / n_kv_heads;
        for i in 0..n {
            for (kvh, w) in want.chunks_mut(gd).enumerate() {
                att.attend(&q[i * qd..(i + 1) * qd], &cache, pos0 + i, kvh, w);
            }
            for (j, (&a, &b)) in got[i * qd..(i + 1) * qd].iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-5, "row {i} element {j}: {a} vs {b}");
            }
        }
    }

    /// 6 query heads of 16 over 2 KV heads, without projections.
    fn test_attention(window: Option<usize>) -> Attention {
        let hd = 16;
        Attention {
            q: dummy_linear(),
            k: dummy_linear(),
            v: dummy_linear(),
            o: dummy_linear(),
            q_norm: None,
            k_norm: None,
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: hd,
            rope: Rope::new(hd, hd, 1e4),
            window,
            gate: None,
        }
    }

    /// A decode row that sees more keys than one task takes (split into runs, softmaxed apart
    /// and combined) against one softmax over all its keys, computed in f64 from the cache:
    /// full attention, and a sliding window whose ring has wrapped.
    #[test]
    fn split_decode_attention_is_one_softmax() {
        let mut rng = Rng(23);
        for (window, cap, pos) in [(None, 0, 3 * SPLIT_KEYS + 36), (Some(600), 700, 1500)] {
            let att = test_attention(window);
            let (hd, qd, kvd) = (16, 96, 32);
            let rows_in_cache = if cap == 0 { pos + 1 } else { cap };
            let mut k = KvRows::new(KvType::F32, kvd, 0);
            let mut v = KvRows::new(KvType::F32, kvd, 0);
            let mut kpos = vec![vec![0f32; kvd]; pos + 1];
            let mut vpos = vec![vec![0f32; kvd]; pos + 1];
            for p in 0..=pos {
                kpos[p] = (0..kvd).map(|_| rng.f32() - 0.5).collect();
                vpos[p] = (0..kvd).map(|_| rng.f32() - 0.5).collect();
                let row = if cap == 0 { p } else { p % cap };
                if row < rows_in_cache {
                    k.set(row, &kpos[p]);
                    v.set(row, &vpos[p]);
                }
            }
            let cache = match window {
                None => LayerCache::Attention { k, v },
                Some(w) => LayerCache::SlidingRing {
                    k,
                    v,
                    window: w,
                    cap,
                },
            };
            // Two rows: the long one, and one that fits in a single run.
            let rows = [Row { seq: 0, pos }, Row { seq: 0, pos: 40 }];
            let q: Vec<f32> = (0..2 * qd).map(|_| 3.0 * (rng.f32() - 0.5)).collect();
            let mut got = vec![0f32; 2 * qd];
            att.attend_rows(&q, &rows[..1], &[&cache], &mut got[..qd]);
            let first = window.map_or(0, |w| pos + 1 - w);
            let group = 3;
            for h in 0..6 {
                let kvh = h / group;
                let qh = &q[h * hd..(h + 1) * hd];
                let s: Vec<f64> = (first..=pos)
                    .map(|p| {
                        let kk = &kpos[p][kvh * hd..(kvh + 1) * hd];
                        let d: f64 = qh.iter().zip(kk).map(|(&a, &b)| a as f64 * b as f64).sum();
                        d / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for dd in 0..hd {
                    let want: f64 = (first..=pos)
                        .zip(&e)
                        .map(|(p, &w)| w * vpos[p][kvh * hd + dd] as f64)
                        .sum::<f64>()
                        / z;
                    let g = got[h * hd + dd] as f64;
                    assert!(
                        (g - want).abs() <= 1e-5,
                        "window {window:?} head {h} dim {dd}: {g} vs {want}"
                    );
                }
            }
            // The short row takes the one-run path, as attend does.
            if cap == 0 {
                let mut alone = vec![0f32; qd];
                att.attend_rows(&q[qd..], &rows[1..], &[&cache], &mut alone);
                let mut want = vec![0f32; qd];
                for (kvh, w) in want.chunks_mut(qd / 2).enumerate() {
                    att.attend(&q[qd..], &cache, 40, kvh, w);
                }
                assert_eq!(alone, want);
            }
        }
    }
}
