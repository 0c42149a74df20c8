//! `lone chat`: an interactive conversation that keeps the model and its cache loaded.
//!
//! Each turn renders the chat template over the whole conversation and prefills only what the
//! cache does not already hold. The cache holds the previous prompt and the reply tokens the
//! model generated; the template re-renders that reply as text (and may close it differently,
//! e.g. with an `<|im_end|>` the model emitted as EOS, which is never fed back). So the new
//! prompt is not re-tokenized from scratch: the conversation keeps the text its tokens stand
//! for, with checkpoints where text and tokens line up, and the new prompt reuses the tokens up
//! to the last checkpoint whose text the new rendering still starts with, tokenizing only the
//! rest. Everything the template added since the previous turn is prefilled, nothing more.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use lone_core::cache::SeqCache;
use lone_core::engine::Event;
use lone_core::generate::{generate_text, FinishReason, GenerateOptions};
use lone_core::sampler::Sampler;
use lone_core::text::TextIo;
use lone_core::{Batch, Model};
use serde_json::{json, Value as Json};

use super::common::{self, SamplingArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// HF checkpoint directory or GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the setup step).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub vision: common::MmprojArgs,
    /// System prompt (change it later with /system).
    #[arg(long)]
    pub system: Option<String>,
    /// Worker threads for the matrix kernels (default: the CPU's cores).
    #[arg(long, short)]
    pub threads: Option<usize>,
    /// Context size in tokens (default and maximum: the model's context length).
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Most tokens per reply.
    #[arg(long, short = 'n', default_value_t = 512)]
    pub max_new_tokens: usize,
    /// Keep generating past end-of-sequence tokens (replies then run to -n or the context).
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: common::SpecArgs,
}

const HELP: &str = "\
Type a message and press Enter. Commands:
  /reset         clear the conversation (the model stays loaded)
  /system TEXT   set the system prompt and start over (/system alone removes it)
  /image FILE    attach an image to your next message (a vision-language model)
  /stats         statistics of the session so far
  /help          this help
  /quit          leave (also Ctrl-D)
Ctrl-C stops a reply that is being generated.";

/// The conversation so far, as messages and as the tokens the cache holds for it.
#[derive(Default)]
pub struct Conversation {
    pub system: Option<String>,
    /// User and assistant messages (the system message is added when rendering).
    pub messages: Vec<Json>,
    /// Prompt and reply tokens of the last turn, as fed to the model.
    tokens: Vec<u32>,
    /// The text `tokens` stand for.
    text: String,
    /// `(text offset, token count)` pairs where `text[..offset]` is exactly what
    /// `tokens[..count]` stand for, in increasing order.
    checkpoints: Vec<(usize, usize)>,
    /// The images of the turns so far, in order.
    pub images: Vec<lone_core::vision::image::Rgb8>,
    /// Images attached to the next user message (`/image`).
    pub pending: Vec<lone_core::vision::image::Rgb8>,
}

impl Conversation {
    pub fn new(system: Option<String>) -> Conversation {
        Conversation {
            system,
            ..Default::default()
        }
    }

    /// Forget the turns (the system prompt stays).
    pub fn reset(&mut self) {
        let system = self.system.take();
        *self = Conversation::new(system);
    }

    /// The messages to render for a new user turn.
    pub fn messages_with(&self, user: &str) -> Vec<Json> {
        let mut m = Vec::with_capacity(self.messages.len() + 2);
        if let Some(s) = &self.system {
            m.push(json!({"role": "system", "content": s}));
        }
        m.extend(self.messages.iter().cloned());
        m.push(self.user_message(user));
        m
    }

    /// The user's message, its pending images before its text.
    fn user_message(&self, user: &str) -> Json {
        if self.pending.is_empty() {
            return json!({"role": "user", "content": user});
        }
        let mut parts = vec![json!({"type": "image"}); self.pending.len()];
        parts.push(json!({"type": "text", "text": user}));
        json!({"role": "user", "content": parts})
    }

    /// Tokens for `rendered` (the whole conversation as the template renders it): the tokens
    /// of the longest checkpointed prefix whose text `rendered` starts with, then the rest
    /// tokenized. Returns the tokens and how many of them came from the conversation.
    pub fn prompt_tokens(&self, text: &TextIo, rendered: &str) -> Result<(Vec<u32>, usize)> {
        let common = common_prefix_len(&self.text, rendered);
        let (off, n) = self
            .checkpoints
            .iter()
            .rev()
            .find(|&&(off, _)| off <= common)
            .copied()
            .unwrap_or((0, 0));
        // `off` is a character boundary of `rendered` (it is one of `self.text`, and the two
        // agree up to `common`); fall back to tokenizing everything if that ever fails.
        let (rest, n) = match rendered.get(off..) {
            Some(rest) => (rest, n),
            None => (rendered, 0),
        };
        let mut ids = self.tokens[..n].to_vec();
        if !rest.is_empty() {
            ids.extend(text.tokenizer.encode(rest, false)?);
        }
        Ok((ids, n))
    }

    /// Record a finished turn: the user message, the prompt it was rendered to, and the reply
    /// (its tokens, its text and the `(text length, token count)` points where the streamed
    /// text was complete).
    pub fn commit(&mut self, user: &str, rendered: String, prompt: Vec<u32>, reply: &Reply) {
        let common = common_prefix_len(&self.text, &rendered);
        let reused = common_prefix_len_u32(&self.tokens, &prompt);
        self.checkpoints
            .retain(|&(off, n)| off <= common && n <= reused);
        let base_text = rendered.len();
        let base_tok = prompt.len();
        self.checkpoints.push((base_text, base_tok));
        for &(off, n) in &reply.checkpoints {
            self.checkpoints.push((base_text + off, base_tok + n));
        }
        self.text = rendered;
        self.text.push_str(&reply.text);
        self.tokens = prompt;
        self.tokens.extend_from_slice(&reply.tokens);
        self.messages.push(self.user_message(user));
        self.messages
            .push(json!({"role": "assistant", "content": reply.text}));
        let pending = std::mem::take(&mut self.pending);
        self.images.extend(pending);
    }
}

/// A generated reply as text and tokens.
#[derive(Default)]
pub struct Reply {
    pub tokens: Vec<u32>,
    pub text: String,
    /// `(text length, token count)` after each token whose text was complete.
    pub checkpoints: Vec<(usize, usize)>,
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let n = a
        .as_bytes()
        .iter()
        .zip(b.as_bytes())
        .take_while(|(x, y)| x == y)
        .count();
    // Back off to a character boundary of both.
    (0..=n)
        .rev()
        .find(|&i| a.is_char_boundary(i) && b.is_char_boundary(i))
        .unwrap_or(0)
}

fn common_prefix_len_u32(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Running totals for `/stats`.
#[derive(Default)]
struct Totals {
    turns: usize,
    prefill_tokens: usize,
    prefill_time: Duration,
    decode_tokens: usize,
    decode_time: Duration,
}

/// What one turn did.
pub struct TurnStats {
    pub prefilled: usize,
    pub prefill_time: Duration,
    pub generated: usize,
    /// Forward passes after the first sampled token.
    pub decode_steps: usize,
    pub decode_time: Duration,
    pub finish: FinishReason,
    pub interrupted: bool,
    /// Speculation counters of this turn.
    pub spec: lone_core::engine::SpecStats,
}

fn rate(n: usize, t: Duration) -> f64 {
    n as f64 / t.as_secs_f64().max(1e-9)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

pub struct Session {
    model: Model,
    text: TextIo,
    cache: SeqCache,
    sampler: Sampler,
    opts: GenerateOptions,
    pub conv: Conversation,
    totals: Totals,
    ctx: usize,
    stop: Arc<AtomicBool>,
    generating: Arc<AtomicBool>,
}

/// Why a turn produced no reply.
pub enum TurnError {
    /// The conversation plus the new message does not fit the context.
    Overflow {
        needed: usize,
    },
    Other(anyhow::Error),
}

impl From<anyhow::Error> for TurnError {
    fn from(e: anyhow::Error) -> Self {
        TurnError::Other(e)
    }
}

impl From<lone_core::Error> for TurnError {
    fn from(e: lone_core::Error) -> Self {
        TurnError::Other(e.into())
    }
}

impl Session {
    /// Run one user turn, streaming the reply to `out`.
    pub fn turn(&mut self, user: &str, out: &mut impl Write) -> Result<TurnStats, TurnError> {
        let msgs = self.conv.messages_with(user);
        let rendered = self.text.render_chat(&msgs, true)?;
        // With images in the conversation, the whole prompt is expanded and its images encoded
        // (the images' rows are reused from the cache where their embeddings are the same).
        let (prompt, embeds) = match &self.model.vision {
            Some(v) if !self.conv.images.is_empty() || !self.conv.pending.is_empty() => {
                let all: Vec<_> = self
                    .conv
                    .images
                    .iter()
                    .chain(&self.conv.pending)
                    .cloned()
                    .collect();
                let p = v.prompt(
                    &self.text.tokenizer,
                    &rendered,
                    false,
                    &all,
                    &self.model.compute,
                )?;
                (p.ids, Some(Arc::new(p.embeds)))
            }
            _ => (self.conv.prompt_tokens(&self.text, &rendered)?.0, None),
        };
        self.opts.embeds = embeds;
        if prompt.len() >= self.ctx {
            return Err(TurnError::Overflow {
                needed: prompt.len(),
            });
        }
        let mut reply = Reply::default();
        let stop = self.stop.clone();
        stop.store(false, Ordering::SeqCst);
        self.generating.store(true, Ordering::SeqCst);
        let res = generate_text(
            &self.model,
            &mut self.cache,
            &prompt,
            &self.opts,
            &mut self.sampler,
            Some(&self.text.tokenizer),
            |ev| {
                if let Event::Delta { text, tokens, .. } = ev {
                    reply.tokens.extend(tokens.iter().map(|t| t.id));
                    if !text.is_empty() {
                        let _ = out.write_all(text.as_bytes());
                        let _ = out.flush();
                        reply.text.push_str(text);
                        reply
                            .checkpoints
                            .push((reply.text.len(), reply.tokens.len()));
                    }
                }
                !stop.load(Ordering::SeqCst)
            },
        );
        self.generating.store(false, Ordering::SeqCst);
        let interrupted = stop.swap(false, Ordering::SeqCst);
        let g = res?;
        let _ = writeln!(out);
        let _ = out.flush();
        // The last token of a reply cut short (budget, context, Ctrl-C) was sampled but not
        // fed back; feed it now so the cache holds the whole conversation and the next turn
        // prefills only what the template adds.
        let t = Instant::now();
        let mut fed = 0;
        let mut all = prompt.clone();
        all.extend_from_slice(&reply.tokens);
        let held = self.cache.len();
        if held < all.len() && self.cache.tokens() == &all[..held] && all.len() <= self.ctx {
            // Sampled tokens: decode rows, as the reply's others were (a prompt pass would
            // run them exactly, where the other reply tokens took the decode kernels).
            let mut batch = Batch::default();
            for (i, &t) in all[held..].iter().enumerate() {
                batch.push(0, held + i, t, i + 1 == all.len() - held);
            }
            self.model
                .forward(&batch, std::slice::from_mut(&mut self.cache))?;
            fed = all.len() - held;
        }
        let decode_time = g.decode_time + t.elapsed();
        let stats = TurnStats {
            prefilled: g.prefilled_tokens,
            prefill_time: g.prefill_time,
            generated: g.tokens.len(),
            decode_steps: g.tokens.len().saturating_sub(1) + fed,
            decode_time,
            spec: g.spec,
            finish: g.finish,
            interrupted,
        };
        self.totals.turns += 1;
        self.totals.prefill_tokens += stats.prefilled;
        self.totals.prefill_time += stats.prefill_time;
        self.totals.decode_tokens += stats.generated;
        self.totals.decode_time += stats.decode_time;
        self.conv.commit(user, rendered, prompt, &reply);
        Ok(stats)
    }

    pub fn reset(&mut self) {
        self.conv.reset();
        self.cache.clear();
    }

    pub fn ctx_used(&self) -> usize {
        self.cache.len()
    }

    fn ctx_line(&self) -> String {
        let used = self.ctx_used();
        format!(
            "ctx {used}/{} ({:.1}%)",
            self.ctx,
            100.0 * used as f64 / self.ctx as f64
        )
    }

    pub fn stats_line(&self, s: &TurnStats) -> String {
        let spec = if self.opts.spec.is_some() {
            format!(
                " | accepted {}/{} drafts, {:.2} tok/pass",
                s.spec.accepted,
                s.spec.drafted,
                s.spec.tokens_per_pass(s.generated)
            )
        } else {
            String::new()
        };
        format!(
            "[prefill {} tok, {:.3} s, {:.1} tok/s | decode {} tok, {:.3} s, {:.1} tok/s{spec} | {} | RSS {:.1} MiB]",
            s.prefilled,
            s.prefill_time.as_secs_f64(),
            rate(s.prefilled, s.prefill_time),
            s.generated,
            s.decode_time.as_secs_f64(),
            rate(s.decode_steps, s.decode_time),
            self.ctx_line(),
            mib(common::rss_bytes()),
        )
    }

    pub fn totals_text(&self) -> String {
        let t = &self.totals;
        format!(
            "turns {} | messages in conversation {}\n\
             prefill {} tok, {:.3} s, {:.1} tok/s\n\
             decode {} tok, {:.3} s, {:.1} tok/s\n\
             {} | RSS {:.1} MiB (peak {:.1} MiB) | threads {}",
            t.turns,
            self.conv.messages.len(),
            t.prefill_tokens,
            t.prefill_time.as_secs_f64(),
            rate(t.prefill_tokens, t.prefill_time),
            t.decode_tokens,
            t.decode_time.as_secs_f64(),
            rate(t.decode_tokens, t.decode_time),
            self.ctx_line(),
            mib(common::rss_bytes()),
            mib(common::peak_rss_bytes()),
            lone_core::kernels::threads(),
        )
    }
}

/// Lines from a terminal (rustyline: editing, history) or from a pipe (plain lines).
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Pipe(std::io::StdinLock<'static>),
}

enum Line {
    Text(String),
    /// Ctrl-C at the prompt: the line was dropped.
    Cleared,
    Eof,
}

impl Input {
    fn read(&mut self) -> Result<Line> {
        match self {
            Input::Editor(ed) => match ed.readline(">>> ") {
                Ok(l) => {
                    if !l.trim().is_empty() {
                        let _ = ed.add_history_entry(l.as_str());
                    }
                    Ok(Line::Text(l))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Line::Cleared),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Line::Eof),
                Err(e) => Err(e).context("cannot read the terminal"),
            },
            Input::Pipe(r) => {
                let mut buf = Vec::new();
                let n = r
                    .read_until(b'\n', &mut buf)
                    .context("cannot read standard input")?;
                if n == 0 {
                    return Ok(Line::Eof);
                }
                while matches!(buf.last(), Some(b'\n' | b'\r')) {
                    buf.pop();
                }
                Ok(Line::Text(String::from_utf8_lossy(&buf).into_owned()))
            }
        }
    }
}

/// `/image FILE`: decode the image and attach it to the next user message.
fn attach_image(s: &mut Session, file: &str) -> Result<String> {
    if s.model.vision.is_none() {
        bail!("this model takes no images (it has no vision tower)");
    }
    if file.is_empty() {
        bail!("/image needs a file: /image photo.jpg");
    }
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {file}"))?;
    let img = lone_core::vision::image::decode(&bytes, lone_core::vision::MAX_IMAGE_PIXELS)
        .with_context(|| format!("cannot use {file} as an image"))?;
    let msg = format!(
        "image {}×{} attached to your next message",
        img.width, img.height
    );
    s.conv.pending.push(img);
    Ok(msg)
}

pub fn chat(a: ChatArgs) -> Result<()> {
    let path = common::resolve_model(a.model.as_deref())?;
    let mut model = common::load_model(&path, a.threads)?;
    a.vision.load(&mut model, &path)?;
    let text = TextIo::load(&model, &path).context("cannot load the tokenizer")?;
    if text.template.is_none() {
        bail!(
            "{} has no chat template; use `lone run --prompt` for raw completion",
            path.display()
        );
    }
    let max_ctx = model.cfg.max_position_embeddings;
    let ctx = match a.ctx {
        None => max_ctx,
        Some(0) => bail!("--ctx must be at least 1"),
        Some(n) if n > max_ctx => {
            bail!("--ctx {n} is more than the model's context length ({max_ctx})")
        }
        Some(n) => n,
    };
    // `generate` stops at the model's context length: make that the chosen context.
    model.cfg.max_position_embeddings = ctx;
    let params = a.sampling.params();
    params
        .validate(model.cfg.vocab_size)
        .context("bad sampling option")?;
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        eos_ids: text.eos_ids.clone(),
        ignore_eos: a.ignore_eos,
        spec: a.spec.build(&model, &text)?,
        ..Default::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let generating = Arc::new(AtomicBool::new(false));
    let interactive = std::io::stdin().is_terminal();
    // The editor first: rustyline installs its own SIGINT handler when it is created (it
    // only needs it in raw mode, where Ctrl-C arrives as a key anyway); ours must replace it.
    let mut input = if interactive {
        let ed = rustyline::DefaultEditor::new().context("cannot set up line editing")?;
        Input::Editor(Box::new(ed))
    } else {
        Input::Pipe(std::io::stdin().lock())
    };
    {
        let stop = stop.clone();
        let generating = generating.clone();
        ctrlc::set_handler(move || {
            if generating.load(Ordering::SeqCst) {
                stop.store(true, Ordering::SeqCst);
            } else if !interactive {
                // Piped input: nothing to stop, so Ctrl-C ends the program as usual.
                std::process::exit(130);
            }
        })
        .context("cannot install the Ctrl-C handler")?;
    }
    let cache = model.new_cache();
    let mut s = Session {
        model,
        text,
        cache,
        sampler: Sampler::new(params),
        opts,
        conv: Conversation::new(a.system.clone()),
        totals: Totals::default(),
        ctx,
        stop,
        generating,
    };
    if interactive {
        eprintln!(
            "lone chat: {} ({} tokens of context). /help for commands, /quit or Ctrl-D to leave.",
            path.display(),
            ctx
        );
    }
    let mut stdout = std::io::stdout();
    loop {
        let line = match input.read()? {
            Line::Eof => break,
            Line::Cleared => continue,
            Line::Text(l) => l,
        };
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(cmd) = trimmed.strip_prefix('/') {
            let (name, arg) = match cmd.split_once(char::is_whitespace) {
                Some((n, r)) => (n, r.trim()),
                None => (cmd, ""),
            };
            match name {
                "quit" | "exit" | "q" => break,
                "help" | "?" => println!("{HELP}"),
                "reset" | "clear" => {
                    s.reset();
                    eprintln!("[conversation cleared]");
                }
                "system" => {
                    s.conv.system = (!arg.is_empty()).then(|| arg.to_string());
                    s.reset();
                    if arg.is_empty() {
                        eprintln!("[system prompt removed; conversation cleared]");
                    } else {
                        eprintln!("[system prompt set; conversation cleared]");
                    }
                }
                "stats" => println!("{}", s.totals_text()),
                "image" => match attach_image(&mut s, arg) {
                    Ok(msg) => eprintln!("[{msg}]"),
                    Err(e) => eprintln!("error: {e:#}"),
                },
                _ => eprintln!("unknown command /{name}; /help lists the commands"),
            }
            continue;
        }
        match s.turn(trimmed, &mut stdout) {
            Ok(st) => {
                if st.interrupted {
                    eprintln!("[stopped]");
                } else if st.finish == FinishReason::Length && s.ctx_used() >= s.ctx {
                    eprintln!("[context full: /reset to start a new conversation]");
                }
                eprintln!("{}", s.stats_line(&st));
            }
            Err(TurnError::Overflow { needed }) => eprintln!(
                "context overflow: this turn needs {needed} tokens but the context holds {} \
                 (--ctx); /reset to start a new conversation",
                s.ctx
            ),
            Err(TurnError::Other(e)) => eprintln!("error: {e:#}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lone_core::tokenizer::ChatTemplate;

    fn fixture_text(template: &str) -> TextIo {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/reference/fixtures/lfm2_a");
        let model = Model::load(&dir).unwrap();
        let mut text = TextIo::load(&model, &dir).unwrap();
        text.set_template(ChatTemplate::new(template, None, None).unwrap());
        text
    }

    /// A reply as `generate` would stream it: tokens, text, checkpoints.
    fn reply_of(text: &TextIo, ids: &[u32]) -> Reply {
        let mut r = Reply::default();
        let mut st = text.stream();
        for &t in ids {
            r.tokens.push(t);
            if let Some(p) = st.push(t).unwrap() {
                r.text.push_str(&p);
                r.checkpoints.push((r.text.len(), r.tokens.len()));
            }
        }
        r
    }

    const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + \
        m['content'] + '<|im_end|>\\n' }}{% endfor %}\
        {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    #[test]
    fn reuses_the_whole_reply_even_when_not_canonically_tokenized() {
        let text = fixture_text(CHATML);
        let mut conv = Conversation::new(None);
        let r1 = conv.messages_with("hi");
        let p1 = text.render_chat(&r1, true).unwrap();
        let (t1, reused) = conv.prompt_tokens(&text, &p1).unwrap();
        assert_eq!(reused, 0);
        assert_eq!(t1, text.tokenizer.encode(&p1, false).unwrap());
        // A reply spelled one byte-token at a time: not how the tokenizer would split it.
        let spelled: Vec<u32> = "hello there"
            .chars()
            .map(|c| text.tokenizer.encode(&c.to_string(), false).unwrap()[0])
            .collect();
        assert_ne!(
            spelled,
            text.tokenizer.encode("hello there", false).unwrap()
        );
        let reply = reply_of(&text, &spelled);
        assert_eq!(reply.text, "hello there");
        conv.commit("hi", p1.clone(), t1.clone(), &reply);
        let p2 = text.render_chat(&conv.messages_with("more"), true).unwrap();
        let (t2, reused) = conv.prompt_tokens(&text, &p2).unwrap();
        assert_eq!(reused, t1.len() + spelled.len());
        assert_eq!(&t2[..t1.len()], &t1[..]);
        assert_eq!(&t2[t1.len()..reused], &spelled[..]);
        let added = &p2[p1.len() + reply.text.len()..];
        assert!(added.starts_with("<|im_end|>"));
        assert_eq!(
            &t2[reused..],
            &text.tokenizer.encode(added, false).unwrap()[..]
        );
    }

    #[test]
    fn a_reply_the_template_trims_is_reused_up_to_where_the_text_matches() {
        let trimming = CHATML.replace("m['content']", "m['content'] | trim");
        let text = fixture_text(&trimming);
        let mut conv = Conversation::new(Some("sys".into()));
        let p1 = text.render_chat(&conv.messages_with("hi"), true).unwrap();
        let (t1, _) = conv.prompt_tokens(&text, &p1).unwrap();
        let ids = text.tokenizer.encode("Paris.  \n", false).unwrap();
        let reply = reply_of(&text, &ids);
        conv.commit("hi", p1.clone(), t1.clone(), &reply);
        let p2 = text.render_chat(&conv.messages_with("more"), true).unwrap();
        assert!(p2.contains("Paris.<|im_end|>"));
        let (t2, reused) = conv.prompt_tokens(&text, &p2).unwrap();
        // Every reply token whose text survives the trim is reused; the rest is re-tokenized.
        let keep = reply
            .checkpoints
            .iter()
            .filter(|&&(off, _)| p2[p1.len()..].starts_with(&reply.text[..off]))
            .map(|&(_, n)| n)
            .max()
            .unwrap();
        assert!(keep >= 1);
        assert_eq!(reused, t1.len() + keep);
        let off = p1.len() + decode_len(&text, &ids[..keep]);
        assert_eq!(
            &t2[reused..],
            &text.tokenizer.encode(&p2[off..], false).unwrap()[..]
        );
        // A template that changes an earlier turn falls back to the last matching point.
        conv.system = Some("other".into());
        let p3 = text.render_chat(&conv.messages_with("more"), true).unwrap();
        let (t3, reused) = conv.prompt_tokens(&text, &p3).unwrap();
        assert_eq!(reused, 0);
        assert_eq!(t3, text.tokenizer.encode(&p3, false).unwrap());
    }

    fn decode_len(text: &TextIo, ids: &[u32]) -> usize {
        text.decode(ids).unwrap().len()
    }

    #[test]
    fn common_prefix_respects_char_boundaries() {
        assert_eq!(common_prefix_len("abc", "abd"), 2);
        assert_eq!(common_prefix_len("", "x"), 0);
        // 'é' = C3 A9, 'è' = C3 A8: one shared byte, not a boundary.
        assert_eq!(common_prefix_len("aé", "aè"), 1);
        assert_eq!(common_prefix_len("same", "same"), 4);
    }
}
