//! Constrained decoding: a grammar (JSON schema, Lark, regex, GBNF) compiled by llguidance
//! over the model's tokenizer gives, at each step, the set of tokens that keep the output
//! inside the grammar; the others get a logit of -inf before sampling. One [`Grammars`] per
//! tokenizer (it builds llguidance's token trie once); one [`Constraint`] per request
//! (compiled, so a bad grammar is an error before generation starts); one matcher per
//! sequence, cloned from it.
//!
//! A lazy constraint (tools with `tool_choice: auto`) lets the model write freely until it
//! writes the trigger (a call-start marker), then constrains the rest of that block.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// A grammar as a request gives it.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    JsonSchema(Json),
    Lark(String),
    Regex(String),
    /// llama.cpp's GBNF (converted to Lark).
    Gbnf(String),
}

impl GrammarSpec {
    fn top_level(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(bounded_ws(s)),
            GrammarSpec::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Gbnf(g) => TopLevelGrammar::from_lark(super::gbnf::to_lark(g)?),
        })
    }
}

/// Whitespace between JSON tokens, bounded (llguidance's default is unbounded, which lets a
/// model that has lost its way emit spaces until the budget runs out).
pub const JSON_WS: &str = r"[\x20\x0A\x0D\x09]{1,64}";

/// Whitespace between the JSON tokens of a tool call (models write them on one line).
pub const CALL_WS: &str = r"[\x20\x0A\x09]{1,8}";

/// `schema` with [`JSON_WS`] unless it sets llguidance's options (`x-guidance`) itself.
pub fn bounded_ws(schema: &Json) -> Json {
    with_ws(schema, JSON_WS)
}

/// `schema` with whitespace `pattern` unless it sets llguidance's options itself.
pub fn with_ws(schema: &Json, pattern: &str) -> Json {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_pattern": pattern}));
    }
    s
}

/// Our tokenizer as llguidance sees it.
struct Env {
    tok: tokenizers::Tokenizer,
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.tok
                .encode(s, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// The grammar compiler for one tokenizer.
pub struct Grammars {
    factory: ParserFactory,
    env: TokEnv,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grammars(vocab {})", self.env.tok_trie().vocab_size())
    }
}

fn grammar_err(e: impl std::fmt::Display) -> Error {
    Error::Input(format!("invalid grammar: {e}"))
}

impl Grammars {
    /// For `tok`, whose model has `vocab` logits (at least the tokenizer's size) and stops at
    /// `eos`.
    pub fn new(tok: &Tokenizer, vocab: usize, eos: &[u32]) -> Result<Grammars> {
        let mut words = tok.all_token_bytes(TokTrie::SPECIAL_TOKEN_MARKER);
        if words.len() > vocab {
            return Err(Error::Tokenizer(format!(
                "the tokenizer has {} tokens but the model only {vocab} logits",
                words.len()
            )));
        }
        // Logits past the tokenizer (padding rows) and ids without text are tokens that
        // never match.
        let placeholder = |id: usize| {
            let mut name = format!(".<[{id}]>").into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            name
        };
        for (id, w) in words.iter_mut().enumerate() {
            if w.is_empty() {
                *w = placeholder(id);
            }
        }
        while words.len() < vocab {
            words.push(placeholder(words.len()));
        }
        let first_eos = eos
            .first()
            .copied()
            .or(tok.eos_ids().first().copied())
            .unwrap_or(0);
        let mut info = TokRxInfo::new(vocab as u32, first_eos);
        info.tok_bos = tok.bos_id();
        info.tok_pad = tok.pad_id();
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(eos);
        }
        let env: TokEnv = Arc::new(Env {
            tok: tok.inner().clone(),
            trie,
        });
        let mut factory = ParserFactory::new(
            &env,
            toktrie::InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| Error::Msg(format!("cannot set up constrained decoding: {e}")))?;
        factory.quiet();
        Ok(Grammars { factory, env })
    }

    /// Compile `spec`; `lazy`: the text that starts the constrained part (the grammar itself
    /// starts with it), `None`: constrain from the first token.
    pub fn compile(&self, spec: &GrammarSpec, lazy: Option<&str>) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(spec.top_level()?)
            .map_err(grammar_err)?;
        let mut check = Matcher::new(Ok(parser.deep_clone()));
        if let Some(e) = check.get_error() {
            return Err(grammar_err(e));
        }
        if check.compute_mask().is_err() {
            return Err(grammar_err(check.get_error().unwrap_or_default()));
        }
        let trigger = match lazy {
            None => None,
            Some(t) => {
                let ids = self.env.tokenize_bytes(t.as_bytes());
                if ids.is_empty() {
                    return Err(grammar_err("the trigger is empty"));
                }
                Some(ids)
            }
        };
        Ok(Constraint {
            inner: Arc::new(Compiled { parser, trigger }),
        })
    }

    pub fn vocab(&self) -> usize {
        self.env.tok_trie().vocab_size()
    }
}

struct Compiled {
    parser: TokenParser,
    trigger: Option<Vec<u32>>,
}

/// A compiled grammar for a request (cheap to clone; each sequence starts its own matcher).
#[derive(Clone)]
pub struct Constraint {
    inner: Arc<Compiled>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint(lazy: {})", self.inner.trigger.is_some())
    }
}

impl PartialEq for Constraint {
    fn eq(&self, o: &Constraint) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
    }
}

impl Constraint {
    pub fn start(&self) -> ConstraintState {
        let active = self.inner.trigger.is_none();
        ConstraintState {
            c: self.clone(),
            matcher: active.then(|| Matcher::new(Ok(self.inner.parser.deep_clone()))),
            failed: None,
        }
    }
}

/// One sequence's position in its grammar.
pub struct ConstraintState {
    c: Constraint,
    /// `None` while a lazy constraint waits for its trigger.
    matcher: Option<Matcher>,
    failed: Option<String>,
}

impl ConstraintState {
    /// Set the logits of tokens the grammar does not allow here to -inf (nothing while a lazy
    /// constraint waits). Returns false if the grammar failed (the message is in `error`).
    pub fn mask(&mut self, logits: &mut [f32]) -> bool {
        let Some(m) = &mut self.matcher else {
            return true;
        };
        match m.compute_mask_or_eos() {
            Ok(mask) => {
                for (i, l) in logits.iter_mut().enumerate() {
                    if !mask.is_allowed(i as TokenId) {
                        *l = f32::NEG_INFINITY;
                    }
                }
                true
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                false
            }
        }
    }

    /// Whether a grammar is being enforced now.
    pub fn active(&self) -> bool {
        self.matcher.is_some()
    }

    /// The grammar is complete: only EOS may follow.
    pub fn finished(&self) -> bool {
        self.matcher.as_ref().is_some_and(Matcher::is_stopped)
    }

    /// Advance past `tok` (`history` already ends with it). A lazy constraint starts when
    /// `history` ends with its trigger, and stops again when its block is complete.
    pub fn consume(&mut self, tok: u32, history: &[u32]) {
        if let Some(m) = &mut self.matcher {
            if m.is_stopped() {
                return;
            }
            if let Err(e) = m.consume_token(tok) {
                self.failed = Some(e.to_string());
                return;
            }
            // A lazy block that is complete hands back to free text.
            if self.c.inner.trigger.is_some()
                && (m.is_stopped() || m.is_accepting().unwrap_or(false))
            {
                self.matcher = None;
            }
            return;
        }
        let Some(trig) = &self.c.inner.trigger else {
            return;
        };
        if history.ends_with(trig) {
            let mut m = Matcher::new(Ok(self.c.inner.parser.deep_clone()));
            if let Err(e) = m.consume_tokens(trig) {
                self.failed = Some(format!("the trigger does not start the grammar: {e}"));
                return;
            }
            self.matcher = Some(m);
        }
    }

    pub fn error(&self) -> Option<&str> {
        self.failed.as_deref()
    }
}
