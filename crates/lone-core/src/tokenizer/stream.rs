//! Incremental detokenization for generation.
//!
//! Byte-level BPE and byte-fallback tokens can end in the middle of a multi-byte UTF-8
//! character; decoding such a prefix gives U+FFFD. [`StreamDecoder`] holds text back until it
//! is complete, and decodes a small window of ids (with one already-emitted token of context)
//! so decoders that treat the first token specially (SentencePiece's leading space) stay
//! consistent. The concatenation of all pieces (including [`StreamDecoder::finish`]) equals
//! `decode(all ids)`.

use super::Tokenizer;
use crate::error::Result;

const REPLACEMENT: char = '\u{FFFD}';

/// Turns ids into text pieces as soon as they are complete, valid UTF-8.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the decoding window (context already emitted).
    prefix: usize,
    /// End of what has been emitted; `ids[prefix..read]` decodes to `read_text`.
    read: usize,
    read_text: String,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer, skip_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tok,
            skip_special,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            read_text: String::new(),
        }
    }

    /// Adds one id; returns the newly completed text, if any. Unknown ids are an error (and
    /// are not added).
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.tok.check_ids(&[id])?;
        self.ids.push(id);
        let text = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        if text.len() <= self.read_text.len()
            || !text.starts_with(&self.read_text)
            || text.ends_with(REPLACEMENT)
        {
            return Ok(None);
        }
        let piece = text[self.read_text.len()..].to_string();
        // Slide the window: the tokens just emitted become the context for the next ones.
        self.prefix = self.read;
        self.read = self.ids.len();
        self.read_text = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        Ok(Some(piece))
    }

    /// Flushes what is held back (e.g. an incomplete character at the end of generation,
    /// which becomes U+FFFD exactly as in a full decode).
    pub fn finish(&mut self) -> Result<Option<String>> {
        if self.read == self.ids.len() {
            return Ok(None);
        }
        let text = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        let start = if text.starts_with(&self.read_text) {
            self.read_text.len()
        } else {
            common_prefix_len(&text, &self.read_text)
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        self.read_text = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        let piece = text[start..].to_string();
        Ok((!piece.is_empty()).then_some(piece))
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Forgets all state (for a new generation).
    pub fn reset(&mut self) {
        self.ids.clear();
        self.prefix = 0;
        self.read = 0;
        self.read_text.clear();
    }
}

/// Byte length of the longest common prefix that ends on a char boundary of both.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}
