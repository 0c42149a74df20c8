//! Snapshots of sequence caches kept in host memory, so a conversation that lost its slot to
//! others resumes without prefilling again. A hybrid model's conv state (and a sliding
//! window's ring) cannot be rebuilt from a KV prefix, so what is kept is whole caches at two
//! points of each sequence: the end of its prompt and the end of its reply (when the slot is
//! given to another sequence). A new sequence starts from the snapshot that covers the longest
//! prefix of its prompt ([`SeqCache::reusable`]: exact rows only), if that beats its slot's
//! own cache. Least recently used snapshots go first when the byte budget is exceeded.

use crate::cache::SeqCache;

struct Entry {
    cache: SeqCache,
    bytes: usize,
    used: u64,
}

/// The snapshots and their budget.
pub struct PromptCache {
    budget: usize,
    used: usize,
    clock: u64,
    entries: Vec<Entry>,
    /// Prompts that started from a snapshot, and the prompt tokens those covered.
    pub hits: u64,
    pub hit_tokens: u64,
}

impl PromptCache {
    /// At most `budget` bytes of snapshots.
    pub fn new(budget: usize) -> PromptCache {
        PromptCache {
            budget,
            used: 0,
            clock: 0,
            entries: Vec::new(),
            hits: 0,
            hit_tokens: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keep a copy of `cache` (nothing if it is empty or larger than the whole budget). A
    /// snapshot of the same tokens replaces the older one; one whose tokens `cache` extends
    /// is dropped when `cache` can be truncated back to it (it adds nothing).
    pub fn insert(&mut self, cache: &SeqCache) {
        let bytes = cache.bytes();
        if cache.is_empty() || bytes > self.budget {
            return;
        }
        let toks = cache.tokens();
        let mut i = 0;
        while i < self.entries.len() {
            let e = &self.entries[i].cache;
            let covered = toks.starts_with(e.tokens()) && cache.can_truncate(e.len());
            if e.tokens() == toks || covered {
                self.used -= self.entries[i].bytes;
                self.entries.swap_remove(i);
            } else {
                i += 1;
            }
        }
        self.clock += 1;
        self.used += bytes;
        self.entries.push(Entry {
            cache: cache.clone(),
            bytes,
            used: self.clock,
        });
        while self.used > self.budget {
            let Some((lru, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) else {
                break;
            };
            self.used -= self.entries[lru].bytes;
            self.entries.swap_remove(lru);
        }
    }

    /// The snapshot that covers the longest prefix of `prompt` (at most `max` tokens; its
    /// embedded rows `embeds` only where the snapshot holds the same), if it covers more than
    /// `than`: a copy of it, and how many tokens it covers.
    pub fn lookup(
        &mut self,
        prompt: &[u32],
        embeds: &[(usize, u64)],
        max: usize,
        than: usize,
    ) -> Option<(SeqCache, usize)> {
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.cache.reusable_embedded(prompt, embeds, max)))
            .max_by_key(|&(i, n)| (n, self.entries[i].used))?;
        if n <= than {
            return None;
        }
        self.clock += 1;
        self.entries[i].used = self.clock;
        self.hits += 1;
        self.hit_tokens += n as u64;
        Some((self.entries[i].cache.clone(), n))
    }
}
