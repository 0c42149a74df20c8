//! `lone run`: generate from a prompt, raw or chat-templated, streaming.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use lone_core::engine::Event;
use lone_core::generate::{generate_text, GenerateOptions};
use lone_core::sampler::Sampler;

use super::common;
use lone_core::text::TextIo;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// HF checkpoint directory or GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the setup step).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, short, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids (no template, no special tokens added).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// An image for a vision-language model (repeatable; PNG, JPEG, WebP, GIF). Each goes
    /// where the prompt says `<image>`, or before the text when it does not.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt_ids")]
    pub image: Vec<PathBuf>,
    #[command(flatten)]
    pub vision: common::MmprojArgs,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, short = 'n', visible_alias = "n-predict", default_value_t = 128)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub sampling: common::SamplingArgs,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Stop before this text (repeatable); it is not printed.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub spec: common::SpecArgs,
    #[command(flatten)]
    pub grammar: common::GrammarArgs,
    /// Worker threads for the matrix kernels (default: the CPU's cores).
    #[arg(long, short)]
    pub threads: Option<usize>,
    /// Print one JSON object (token ids, text, stats) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Write f32 logits [positions, vocab] to this .npy file: one row per prompt position,
    /// then one per generated token that was fed back.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
}

pub fn run(a: RunArgs) -> Result<()> {
    if a.prompt.is_none() && a.prompt_ids.is_none() {
        bail!("give a prompt with --prompt TEXT or --prompt-ids 1,2,3");
    }
    let path = common::resolve_model(a.model.as_deref())?;
    let mut model = common::load_model(&path, a.threads)?;
    a.vision.load(&mut model, &path)?;
    let text = TextIo::load(&model, &path).context("cannot load the tokenizer")?;
    let mut embeds = None;
    let mut images: Option<(Vec<(usize, usize)>, f64)> = None;
    let prompt: Vec<u32> = match (&a.prompt_ids, &a.prompt) {
        (None, Some(p)) if !a.image.is_empty() => {
            let ip = common::image_prompt(&model, &text, a.system.as_deref(), p, &a.image, a.chat)?;
            embeds = Some(std::sync::Arc::new(ip.embeds));
            images = Some((ip.images, ip.encode_time.as_secs_f64()));
            ip.ids
        }
        (Some(ids), _) => ids.clone(),
        (None, Some(p)) if a.chat => text.chat_prompt(a.system.as_deref(), p)?,
        (None, Some(p)) => text.encode_raw(p)?,
        (None, None) => unreachable!(),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let params = a.sampling.params();
    params
        .validate(model.cfg.vocab_size)
        .context("bad sampling option")?;
    let mut sampler = Sampler::new(params);
    if a.stop.iter().any(String::is_empty) {
        bail!("--stop needs a non-empty string");
    }
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        eos_ids: text.eos_ids.clone(),
        ignore_eos: a.ignore_eos,
        keep_logits: a.dump_logits.is_some(),
        stop: a.stop.clone(),
        spec: a.spec.build(&model, &text)?,
        spec_params: None,
        constraint: a.grammar.build(&model, &text)?,
        embeds,
    };
    let mut cache = model.new_cache();
    let mut out = std::io::stdout().lock();
    let json = a.json;
    let g = generate_text(
        &model,
        &mut cache,
        &prompt,
        &opts,
        &mut sampler,
        Some(&text.tokenizer),
        |ev| {
            if let (false, Event::Delta { text, .. }) = (json, ev) {
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            true
        },
    )?;
    if let Some(p) = &a.dump_logits {
        let v = model.cfg.vocab_size;
        lone_core::npy::write_f32(p, &[g.logits.len() / v, v], &g.logits)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let generated_text = &g.text;
    let rss = common::peak_rss_bytes();
    if json {
        let obj = serde_json::json!({
            "model": path.display().to_string(),
            "prompt_ids": prompt,
            "generated_ids": g.tokens,
            "text": generated_text,
            "finish_reason": g.finish.as_str(),
            "stats": {
                "prompt_tokens": g.prompt_tokens,
                "generated_tokens": g.tokens.len(),
                "prefill_seconds": g.prefill_time.as_secs_f64(),
                "prefill_tokens_per_second": g.prefill_tok_s(),
                "decode_seconds": g.decode_time.as_secs_f64(),
                "decode_tokens_per_second": g.decode_tok_s(),
                "peak_rss_bytes": rss,
                "images": images.as_ref().map(|(im, secs)| serde_json::json!({
                    "tiles": im.iter().map(|t| t.0).collect::<Vec<_>>(),
                    "image_tokens": im.iter().map(|t| t.1).collect::<Vec<_>>(),
                    "encode_seconds": secs,
                })),
                "threads": lone_core::kernels::threads(),
                "spec_type": opts.spec.as_ref().map(|s| s.params.types.name()),
                "drafted": g.spec.drafted,
                "accepted": g.spec.accepted,
                "passes": g.spec.passes,
            }
        });
        writeln!(out, "{obj}")?;
    } else {
        writeln!(out)?;
        let spec = if opts.spec.is_some() {
            format!(
                " | accepted {}/{} drafts ({:.0}%), {:.2} tok/pass",
                g.spec.accepted,
                g.spec.drafted,
                100.0 * g.acceptance(),
                g.tokens_per_pass()
            )
        } else {
            String::new()
        };
        let imgs = match &images {
            Some((im, secs)) => format!(
                "images {} ({} tiles, {} tokens) encoded in {:.0} ms | ",
                im.len(),
                im.iter().map(|t| t.0).sum::<usize>(),
                im.iter().map(|t| t.1).sum::<usize>(),
                secs * 1e3
            ),
            None => String::new(),
        };
        eprintln!(
            "[{imgs}prefill {} tok, {:.1} tok/s | decode {} tok, {:.1} tok/s{spec} | {} | peak RSS {:.1} MiB]",
            g.prompt_tokens,
            g.prefill_tok_s(),
            g.tokens.len(),
            g.decode_tok_s(),
            g.finish.as_str(),
            rss as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}
