//! The bytes each token stands for (for grammars and logprobs `bytes`): byte-level BPE pieces
//! mapped back through GPT-2's byte alphabet, SentencePiece pieces with `▁` as a space and
//! `<0xNN>` byte-fallback tokens as their byte, added tokens as their text.

use super::Tokenizer;

/// Undo GPT-2's byte-to-unicode mapping; `None` if `s` has characters outside it.
pub fn byte_level_inverse(s: &str) -> Option<Vec<u8>> {
    let direct =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let shifted: Vec<u8> = (0u32..256)
        .filter(|&b| !direct(b))
        .map(|b| b as u8)
        .collect();
    s.chars()
        .map(|c| {
            let c = c as u32;
            if direct(c) {
                Some(c as u8)
            } else if (256..256 + shifted.len() as u32).contains(&c) {
                Some(shifted[(c - 256) as usize])
            } else {
                None
            }
        })
        .collect()
}

fn byte_fallback(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

impl Tokenizer {
    /// Whether the decoder maps bytes through GPT-2's alphabet (byte-level BPE).
    fn byte_level(&self) -> bool {
        self.inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|s| s.contains("\"ByteLevel\""))
    }

    fn bytes_of(&self, id: u32, byte_level: bool) -> Vec<u8> {
        let Some(piece) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
        if let Some(b) = byte_fallback(&piece) {
            return vec![b];
        }
        if byte_level {
            if let Some(b) = byte_level_inverse(&piece) {
                return b;
            }
        }
        piece.replace('\u{2581}', " ").into_bytes()
    }

    /// The raw bytes token `id` stands for (empty for an unknown id).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if let Some(t) = self.inner.get_added_tokens_decoder().get(&id) {
            return t.content.clone().into_bytes();
        }
        self.bytes_of(id, self.byte_level())
    }

    /// Every token's bytes, special tokens as `marker` + their text (llguidance's convention).
    pub fn all_token_bytes(&self, marker: u8) -> Vec<Vec<u8>> {
        let byte_level = self.byte_level();
        let added = self.inner.get_added_tokens_decoder();
        (0..self.vocab_size() as u32)
            .map(|id| match added.get(&id) {
                Some(t) if t.special => {
                    let mut b = vec![marker];
                    b.extend_from_slice(t.content.as_bytes());
                    b
                }
                Some(t) => t.content.clone().into_bytes(),
                None => self.bytes_of(id, byte_level),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_inverse_maps_gpt2_alphabet() {
        assert_eq!(byte_level_inverse("\u{120}the").unwrap(), b" the");
        assert_eq!(byte_level_inverse("\u{10a}").unwrap(), b"\n");
        assert_eq!(
            byte_level_inverse("\u{e2}\u{122}").unwrap(),
            vec![0xe2, 0x80]
        );
        assert!(byte_level_inverse("\u{80}").is_none());
        assert!(byte_level_inverse("\u{2581}the").is_none());
        assert_eq!(byte_fallback("<0x0A>"), Some(10));
        assert_eq!(byte_fallback("<0x0>"), None);
    }
}
