//! Per-sequence, per-layer caches: full-attention KV, sliding-window ring, conv state.
//!
//! All three keep `slack` extra rows of history so a sequence can be truncated back by up
//! to `slack` positions (speculative decoding, chat edits). Truncating further than that is
//! refused; the caller then clears the cache and prefills again.

use crate::config::{LayerKind, ModelConfig};
pub use crate::kernels::KvSlice;
use crate::tensor::DType;

/// Default number of positions a ring or conv cache can be rolled back.
pub const DEFAULT_ROLLBACK: usize = 64;

/// How attention keys and values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// f32: exact (the parity tests' setting and the library default).
    #[default]
    F32,
    /// IEEE half precision, rounded to nearest even: half the bytes per position, as
    /// llama.cpp's default. Attention reads the f16 rows directly.
    F16,
    /// ggml's Q8_0 blocks (32 values, one f16 scale: 8.5 bits each), per head: needs a
    /// head_dim that is a multiple of 32 (as llama.cpp's).
    Q8_0,
}

impl KvType {
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// `f32`, `f16` or `q8_0`.
    pub fn parse(s: &str) -> Option<KvType> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            _ => None,
        }
    }

    /// Whether heads of `head_dim` can be stored (Q8_0: whole blocks of 32 per head).
    pub fn supports(self, head_dim: usize) -> bool {
        self != KvType::Q8_0 || head_dim.is_multiple_of(32)
    }

    /// Bytes per stored row of `dim` elements.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            KvType::F32 => 4 * dim,
            KvType::F16 => 2 * dim,
            KvType::Q8_0 => dim / 32 * 34,
        }
    }
}

/// Rows of `dim` keys or values in the cache's [`KvType`]: the cache owns the layout,
/// attention appends, overwrites and reads rows through it.
#[derive(Clone, Debug)]
pub enum KvRows {
    F32 {
        data: Vec<f32>,
        dim: usize,
    },
    F16 {
        data: Vec<u16>,
        dim: usize,
    },
    /// Rows of `dim / 32` Q8_0 blocks.
    Q8_0 {
        data: Vec<u8>,
        dim: usize,
    },
}

impl KvRows {
    pub fn new(ty: KvType, dim: usize, rows: usize) -> KvRows {
        match ty {
            KvType::F32 => KvRows::F32 {
                data: vec![0.0; rows * dim],
                dim,
            },
            KvType::F16 => KvRows::F16 {
                data: vec![0; rows * dim],
                dim,
            },
            KvType::Q8_0 => KvRows::Q8_0 {
                data: vec![0; rows * KvType::Q8_0.row_bytes(dim)],
                dim,
            },
        }
    }

    pub fn dim(&self) -> usize {
        match self {
            KvRows::F32 { dim, .. } | KvRows::F16 { dim, .. } | KvRows::Q8_0 { dim, .. } => *dim,
        }
    }

    /// Rows stored.
    pub fn rows(&self) -> usize {
        let d = self.dim().max(1);
        match self {
            KvRows::F32 { data, .. } => data.len() / d,
            KvRows::F16 { data, .. } => data.len() / d,
            KvRows::Q8_0 { data, dim } => data.len() / KvType::Q8_0.row_bytes(*dim).max(1),
        }
    }

    /// Keep the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        let d = self.dim();
        match self {
            KvRows::F32 { data, .. } => data.truncate(rows * d),
            KvRows::F16 { data, .. } => data.truncate(rows * d),
            KvRows::Q8_0 { data, .. } => data.truncate(rows * KvType::Q8_0.row_bytes(d)),
        }
    }

    /// Store `x` (`dim` values) as row `row`: overwritten if it exists, appended if it is the
    /// next one.
    ///
    /// Panics if `row` is past the end or `x` is not `dim` long.
    pub fn set(&mut self, row: usize, x: &[f32]) {
        let d = self.dim();
        assert_eq!(x.len(), d, "KvRows::set: row length");
        let n = self.rows();
        assert!(row <= n, "KvRows::set: row {row} past the end ({n})");
        match self {
            KvRows::F32 { data, .. } => {
                if row == n {
                    data.extend_from_slice(x);
                } else {
                    data[row * d..(row + 1) * d].copy_from_slice(x);
                }
            }
            KvRows::F16 { data, .. } => {
                if row == n {
                    data.resize((n + 1) * d, 0);
                }
                for (o, &v) in data[row * d..(row + 1) * d].iter_mut().zip(x) {
                    *o = half::f16::from_f32(v).to_bits();
                }
            }
            KvRows::Q8_0 { data, .. } => {
                let rb = KvType::Q8_0.row_bytes(d);
                if row == n {
                    data.resize((n + 1) * rb, 0);
                }
                crate::quant::quantize_row(DType::Q8_0, x, &mut data[row * rb..(row + 1) * rb])
                    .expect("dim is a multiple of 32 (checked by SeqCache::with_kv_type)");
            }
        }
    }

    /// Elements `off..off + out.len()` of row `row` as f32.
    pub fn read(&self, row: usize, off: usize, out: &mut [f32]) {
        let s = row * self.dim() + off;
        let n = out.len();
        match self {
            KvRows::F32 { data, .. } => out.copy_from_slice(&data[s..s + n]),
            KvRows::F16 { data, .. } => {
                for (o, &h) in out.iter_mut().zip(&data[s..s + n]) {
                    *o = half::f16::from_bits(h).to_f32();
                }
            }
            KvRows::Q8_0 { data, .. } => {
                // Whole blocks: `off` and `out.len()` are multiples of 32 (head offsets).
                let (b0, b1) = (s / 32, (s + n) / 32);
                crate::quant::dequantize_row(DType::Q8_0, &data[b0 * 34..b1 * 34], out)
                    .expect("reads cover whole Q8_0 blocks of a head");
            }
        }
    }

    /// The stored elements from element `first` on (rows `dim` elements apart), for the
    /// attention kernels. Q8_0: `first` is a multiple of 32.
    pub fn view(&self, first: usize) -> KvSlice<'_> {
        match self {
            KvRows::F32 { data, .. } => KvSlice::F32(&data[first..]),
            KvRows::F16 { data, .. } => KvSlice::F16(&data[first..]),
            KvRows::Q8_0 { data, .. } => KvSlice::Q8_0(&data[first / 32 * 34..]),
        }
    }
}

#[derive(Clone, Debug)]
pub enum LayerCache {
    /// Keys and values of every position: `[len, kv_dim]` each.
    Attention { k: KvRows, v: KvRows },
    /// The last `cap` positions' keys and values; position `p` is stored in row `p % cap`.
    SlidingRing {
        k: KvRows,
        v: KvRows,
        window: usize,
        cap: usize,
    },
    /// The last `cap` conv inputs (B⊙x rows of `dim`); position `p` in row `p % cap`.
    Conv {
        hist: Vec<f32>,
        dim: usize,
        cap: usize,
    },
}

/// Where keys of consecutive positions lie in an attention layer's cache: up to two runs of
/// consecutive rows (a ring wraps at most once), each `(first row, count, offset among the
/// keys)`; the second's count is 0 when one run holds them all.
pub type KeySegments = [(usize, usize, usize); 2];

/// An attention layer's keys and values as the layer reads them, whatever the layout.
pub struct KvView<'a> {
    pub k: &'a KvRows,
    pub v: &'a KvRows,
    /// Rows of a sliding ring (None: one row per position).
    cap: Option<usize>,
}

impl KvView<'_> {
    /// The rows holding positions `first..first + n`.
    pub fn segments(&self, first: usize, n: usize) -> KeySegments {
        match self.cap {
            None => [(first, n, 0), (0, 0, n)],
            Some(cap) => {
                let s0 = first % cap;
                let len = n.min(cap - s0);
                [(s0, len, 0), (0, n - len, len)]
            }
        }
    }

    /// Whether every position has its own row from 0 on (a full-attention cache).
    pub fn is_full(&self) -> bool {
        self.cap.is_none()
    }
}

impl LayerCache {
    /// The keys and values of an attention layer (None for a conv layer).
    pub fn kv(&self) -> Option<KvView<'_>> {
        match self {
            LayerCache::Attention { k, v } => Some(KvView { k, v, cap: None }),
            LayerCache::SlidingRing { k, v, cap, .. } => Some(KvView {
                k,
                v,
                cap: Some(*cap),
            }),
            LayerCache::Conv { .. } => None,
        }
    }

    /// Store the key and value of position `pos` (positions arrive in order; a full cache
    /// longer than `pos` was truncated logically and is cut there). A conv layer has none.
    pub fn append_kv(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        match self {
            LayerCache::Attention { k: kc, v: vc } => {
                kc.truncate(pos);
                vc.truncate(pos);
                kc.set(pos, k);
                vc.set(pos, v);
            }
            LayerCache::SlidingRing {
                k: kc, v: vc, cap, ..
            } => {
                kc.set(pos % *cap, k);
                vc.set(pos % *cap, v);
            }
            LayerCache::Conv { .. } => debug_assert!(false, "keys appended to a conv cache"),
        }
    }

    /// How many new positions can be appended before a row that the oldest of them still
    /// attends to is overwritten (a ring of `cap` rows for a window of `window`: `cap -
    /// window`); unbounded for a full cache.
    pub fn appendable(&self) -> usize {
        match self {
            LayerCache::SlidingRing { window, cap, .. } => (cap - window).max(1),
            _ => usize::MAX,
        }
    }
}

/// The cache of one sequence: one entry per layer plus the number of positions it holds.
#[derive(Clone, Debug)]
pub struct SeqCache {
    pub layers: Vec<LayerCache>,
    /// The tokens whose state the cache holds, in position order.
    tokens: Vec<u32>,
    /// The positions whose input was an embedding (an image's rows), ascending, with the
    /// embedding's digest ([`embedding_digest`]): a token alone does not say what was there.
    embedded: Vec<(usize, u64)>,
    rollback: usize,
    /// The draft model's cache for the same sequence (speculative decoding), created by the
    /// draft proposer; it holds a prefix of this sequence's tokens and is rolled back with it.
    pub draft: Option<Box<SeqCache>>,
}

impl SeqCache {
    /// A cache with f32 keys and values.
    pub fn new(cfg: &ModelConfig, rollback: usize) -> SeqCache {
        SeqCache::with_kv_type(cfg, rollback, KvType::F32)
    }

    /// A cache storing keys and values as `kv`.
    ///
    /// Panics for [`KvType::Q8_0`] with a head_dim that is not a multiple of 32 (check with
    /// [`KvType::supports`]; `Model::set_kv_type` refuses it with an error).
    pub fn with_kv_type(cfg: &ModelConfig, rollback: usize, kv: KvType) -> SeqCache {
        assert!(
            kv.supports(cfg.head_dim),
            "{} KV cache with head_dim {}",
            kv.name(),
            cfg.head_dim
        );
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|k| match k {
                LayerKind::Attention => LayerCache::Attention {
                    k: KvRows::new(kv, kv_dim, 0),
                    v: KvRows::new(kv, kv_dim, 0),
                },
                LayerKind::SlidingAttention => {
                    let cap = cfg.sliding_window + rollback;
                    LayerCache::SlidingRing {
                        k: KvRows::new(kv, kv_dim, cap),
                        v: KvRows::new(kv, kv_dim, cap),
                        window: cfg.sliding_window,
                        cap,
                    }
                }
                LayerKind::Conv => {
                    let cap = cfg.conv_kernel.saturating_sub(1) + rollback;
                    LayerCache::Conv {
                        hist: vec![0.0; cap * cfg.hidden_size],
                        dim: cfg.hidden_size,
                        cap,
                    }
                }
            })
            .collect();
        SeqCache {
            layers,
            tokens: Vec::new(),
            embedded: Vec::new(),
            rollback,
            draft: None,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Host memory the cache's state takes (rows stored, conv and ring state, the draft's).
    pub fn bytes(&self) -> usize {
        let rows = |r: &KvRows| match r {
            KvRows::F32 { data, .. } => 4 * data.len(),
            KvRows::F16 { data, .. } => 2 * data.len(),
            KvRows::Q8_0 { data, .. } => data.len(),
        };
        let layers: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerCache::Attention { k, v } | LayerCache::SlidingRing { k, v, .. } => {
                    rows(k) + rows(v)
                }
                LayerCache::Conv { hist, .. } => 4 * hist.len(),
            })
            .sum();
        layers + 4 * self.tokens.len() + self.draft.as_ref().map_or(0, |d| d.bytes())
    }

    /// The tokens held.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Length of the longest common prefix of the cached tokens and `tokens`.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Called by the model after a forward pass appended these tokens to every layer.
    pub fn advance(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    /// Called by the model after a forward pass appended a row whose input was an embedding
    /// with this digest (in place of its token) at the next position.
    pub fn advance_embedded(&mut self, token: u32, digest: u64) {
        self.embedded.push((self.tokens.len(), digest));
        self.tokens.push(token);
    }

    /// The embedded positions and their digests.
    pub fn embedded(&self) -> &[(usize, u64)] {
        &self.embedded
    }

    /// The first position where the cache's embedded rows and `embeds` (a prompt's, the same
    /// shape) disagree — one has an embedding there and the other none or another — or
    /// `usize::MAX`.
    fn embeds_agree_until(&self, embeds: &[(usize, u64)]) -> usize {
        let (mut a, mut b) = (self.embedded.iter().peekable(), embeds.iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (None, None) => return usize::MAX,
                (Some(&&(p, _)), None) | (None, Some(&&(p, _))) => return p,
                (Some(&&(p, x)), Some(&&(q, y))) => {
                    if p != q || x != y {
                        return p.min(q);
                    }
                    a.next();
                    b.next();
                }
            }
        }
    }

    /// [`reuse`](Self::reuse) for a prompt whose rows at `embeds`' positions are embeddings
    /// with those digests: an embedded row is reused only where the cache holds the same
    /// embedding at the same position.
    pub fn reuse_embedded(&mut self, tokens: &[u32], embeds: &[(usize, u64)], max: usize) -> usize {
        self.reuse(tokens, max.min(self.embeds_agree_until(embeds)))
    }

    /// What [`reuse_embedded`](Self::reuse_embedded) would keep, without changing anything.
    pub fn reusable_embedded(&self, tokens: &[u32], embeds: &[(usize, u64)], max: usize) -> usize {
        self.reusable(tokens, max.min(self.embeds_agree_until(embeds)))
    }

    /// How many positions ring and conv layers can be rolled back.
    pub fn rollback(&self) -> usize {
        self.rollback
    }

    /// The reuse rule for a sequence continuing with `tokens`: keep the longest common prefix
    /// of the cached tokens and `tokens`, at most `max` positions, rolling back (or, past the
    /// rollback window, clearing). Returns the positions kept.
    pub fn reuse(&mut self, tokens: &[u32], max: usize) -> usize {
        let keep = self.common_prefix(tokens).min(max);
        if !self.truncate(keep) {
            self.clear();
        }
        self.len()
    }

    /// What [`reuse`](Self::reuse) would keep, without changing anything.
    pub fn reusable(&self, tokens: &[u32], max: usize) -> usize {
        let keep = self.common_prefix(tokens).min(max);
        if self.can_truncate(keep) {
            keep
        } else {
            0
        }
    }

    /// Forget everything (the draft cache too).
    pub fn clear(&mut self) {
        if let Some(d) = &mut self.draft {
            d.clear();
        }
        self.tokens.clear();
        self.embedded.clear();
        for l in &mut self.layers {
            if let LayerCache::Attention { k, v } = l {
                k.truncate(0);
                v.truncate(0);
            }
        }
    }

    /// Whether `truncate(len)` would succeed: always for full attention; for ring and conv
    /// layers only within the rollback window.
    pub fn can_truncate(&self, len: usize) -> bool {
        len >= self.len()
            || self.len() - len <= self.rollback
            || self
                .layers
                .iter()
                .all(|l| matches!(l, LayerCache::Attention { .. }))
    }

    /// Roll the sequence back to its first `len` positions. Returns false (and changes
    /// nothing) if the ring or conv history no longer holds what that would need.
    pub fn truncate(&mut self, len: usize) -> bool {
        if len >= self.len() {
            return true;
        }
        if !self.can_truncate(len) {
            return false;
        }
        for l in &mut self.layers {
            if let LayerCache::Attention { k, v } = l {
                k.truncate(len);
                v.truncate(len);
            }
        }
        self.tokens.truncate(len);
        self.embedded.retain(|&(p, _)| p < len);
        true
    }
}

/// A 64-bit digest of an embedding's values (their bits), naming an embedded row's input in
/// [`SeqCache`] and in a prompt's [`crate::engine::PromptEmbeds`].
pub fn embedding_digest(e: &[f32]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    e.len().hash(&mut h);
    for v in e {
        v.to_bits().hash(&mut h);
    }
    h.finish()
}
