//! Per-sequence, per-layer caches: full-attention KV, sliding-window ring, conv state.
//!
//! All three keep `slack` extra rows of history so a sequence can be truncated back by up
//! to `slack` positions (speculative decoding, chat edits). Truncating further than that is
//! refused; the caller then clears the cache and prefills again.

use crate::config::{LayerKind, ModelConfig};

/// Default number of positions a ring or conv cache can be rolled back.
pub const DEFAULT_ROLLBACK: usize = 64;

#[derive(Clone, Debug)]
pub enum LayerCache {
    /// Keys and values of every position: `[len, kv_dim]` each.
    Attention { k: Vec<f32>, v: Vec<f32> },
    /// The last `cap` positions' keys and values; position `p` is stored in row `p % cap`.
    SlidingRing {
        k: Vec<f32>,
        v: Vec<f32>,
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

/// The cache of one sequence: one entry per layer plus the number of positions it holds.
#[derive(Clone, Debug)]
pub struct SeqCache {
    pub layers: Vec<LayerCache>,
    /// The tokens whose state the cache holds, in position order.
    tokens: Vec<u32>,
    kv_dim: usize,
    rollback: usize,
}

impl SeqCache {
    pub fn new(cfg: &ModelConfig, rollback: usize) -> SeqCache {
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|k| match k {
                LayerKind::Attention => LayerCache::Attention {
                    k: Vec::new(),
                    v: Vec::new(),
                },
                LayerKind::SlidingAttention => {
                    let cap = cfg.sliding_window + rollback;
                    LayerCache::SlidingRing {
                        k: vec![0.0; cap * kv_dim],
                        v: vec![0.0; cap * kv_dim],
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
            kv_dim,
            rollback,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.tokens.len()
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

    /// Forget everything.
    pub fn clear(&mut self) {
        self.tokens.clear();
        for l in &mut self.layers {
            if let LayerCache::Attention { k, v } = l {
                k.clear();
                v.clear();
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
        let kv = self.kv_dim;
        for l in &mut self.layers {
            if let LayerCache::Attention { k, v } = l {
                k.truncate(len * kv);
                v.truncate(len * kv);
            }
        }
        self.tokens.truncate(len);
        true
    }
}
