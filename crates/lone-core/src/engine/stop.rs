//! Stop strings applied to streamed text: text is released only once it can no longer be
//! the start of a stop string, so nothing at or past a stop string is ever sent.

/// Holds back streamed text that could still turn into a stop string.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Adds a decoded piece; returns the text that is now safe to send and whether a stop
    /// string was reached (the returned text then ends right before it, and the rest is
    /// dropped).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        // The earliest stop string occurrence wins.
        if let Some((pos, i)) = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s).map(|p| (p, i)))
            .min()
        {
            self.matched = Some(self.stops[i].clone());
            let out = self.held[..pos].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// The stop string that ended generation, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// End of generation: everything held back is released.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn partial_suffix_len(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for len in (best + 1..=max).rev() {
                let start = h.len() - len;
                if h.is_char_boundary(start) && s.starts_with(&h[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let (t, stop) = m.push(p);
            out.push(t);
            if stop {
                return (out, true);
            }
        }
        out.push(m.finish());
        (out, false)
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]).0, ["a", "b", ""]);
    }

    #[test]
    fn holds_back_prefixes_and_cuts_at_the_stop() {
        let (out, stopped) = run(&["END"], &["abc E", "N", "D tail"]);
        assert!(stopped);
        assert_eq!(out, ["abc ", "", ""]);
        assert_eq!(out.concat(), "abc ");
    }

    #[test]
    fn releases_a_false_alarm() {
        let (out, stopped) = run(&["END"], &["x E", "NX", "y"]);
        assert!(!stopped);
        assert_eq!(out, ["x ", "ENX", "y", ""]);
    }

    #[test]
    fn earliest_of_several_stops() {
        let (out, stopped) = run(&["world", "lo"], &["hello world"]);
        assert!(stopped);
        assert_eq!(out.concat(), "hel");
    }

    #[test]
    fn stop_inside_one_piece_and_multibyte() {
        let (out, stopped) = run(&["é!"], &["café", "!x"]);
        assert!(stopped);
        assert_eq!(out.concat(), "caf");
        let (out, stopped) = run(&["\n\n"], &["a\n", "b\n", "\n", "c"]);
        assert!(stopped);
        assert_eq!(out.concat(), "a\nb");
    }

    #[test]
    fn held_text_is_flushed_at_the_end() {
        let (out, stopped) = run(&["STOP"], &["go ST"]);
        assert!(!stopped);
        assert_eq!(out, ["go ", "ST"]);
    }
}
