//! `lone bench`: how fast the engine runs a model, measured the way llama-bench does.
//!
//! - `ppN`: prefill of N random valid token ids into a fresh cache (one `prefill` call, the
//!   engine's own chunking), N / seconds.
//! - `tgN`: decode: after a 1-token prompt (not timed), N steps of greedy pick + a 1-token
//!   forward pass, N / seconds (llama-bench's `tg` also times N single-token decodes).
//! - each test: a short warm-up run of the same kind (at most 32 prompt tokens / 4 decode
//!   steps), then `--reps` timed runs; mean ± sample stddev of the per-run rates.
//! - cold start, measured once before the tests: `lone bench` start → weights ready
//!   (`Model::load`, memory-mapped; the page cache is left as it is) → tokenizer ready →
//!   first token of a short chat prompt.
//! - `--suite`: real chat prompts (`bench_suite.rs`), templated, greedy, up to
//!   `--suite-max-tokens` new tokens each, stopping at EOS.
//! - `--membw`: the machine's read bandwidth (no model): sums a buffer with N threads.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use lone_core::generate::{generate, prefill, GenerateOptions};
use lone_core::sampler::{Sampler, SamplingParams};
use lone_core::text::TextIo;
use lone_core::{Batch, Model};
use serde_json::{json, Value};

use super::bench_suite;
use super::common;
use super::model_info::{cpu_model, fmt_bytes, fmt_params, measure_membw, model_info, Info};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// HF checkpoint directory or GGUF file (default: the default model from the setup step).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// Prefill tests: prompt lengths, comma-separated (0 = none).
    #[arg(long = "prompt-tokens", short = 'p', value_delimiter = ',', default_values_t = vec![128usize, 512])]
    pub prompt_tokens: Vec<usize>,
    /// Decode tests: tokens to generate, comma-separated (0 = none).
    #[arg(long = "gen-tokens", short = 'n', value_delimiter = ',', default_values_t = vec![64usize])]
    pub gen_tokens: Vec<usize>,
    /// Worker threads for the matrix kernels (default: the CPU's cores).
    #[arg(long, short)]
    pub threads: Option<usize>,
    /// Timed runs per test (default 3; 1 with --suite).
    #[arg(long, short)]
    pub reps: Option<usize>,
    /// Skip the warm-up run before each test.
    #[arg(long)]
    pub no_warmup: bool,
    /// One JSON object per line (per test) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Run the chat prompt suite instead of the pp/tg tests.
    #[arg(long)]
    pub suite: bool,
    /// New tokens per suite prompt (greedy, stops at EOS).
    #[arg(long, default_value_t = 128)]
    pub suite_max_tokens: usize,
    /// Measure the machine's memory read bandwidth instead (no model needed).
    #[arg(long)]
    pub membw: bool,
    /// Buffer size for --membw, MiB.
    #[arg(long, default_value_t = 1024)]
    pub membw_mib: usize,
    /// Seed of the random prompt token ids.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Context already in the cache before each pp/tg test (random tokens, not timed), like
    /// llama-bench's -d: `pp512 @ d3000` prefills 512 tokens after 3000.
    #[arg(long, short = 'd', default_value_t = 0)]
    pub depth: usize,
    /// Speculative decoding workloads (copy, edit, summarise, prose; chat-templated, greedy):
    /// plain and speculative decode interleaved, with the speculation flags given.
    #[arg(long)]
    pub spec_workloads: bool,
    /// New tokens per workload (stops at EOS).
    #[arg(long, default_value_t = 400)]
    pub workload_max_tokens: usize,
    /// Only these workloads (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Option<Vec<String>>,
    #[command(flatten)]
    pub spec: common::SpecArgs,
}

/// The warm-up before each test is a short run of the same kind: it touches every weight
/// (page faults, caches, thread pool start) without doubling the cost of slow tests.
const WARMUP_PROMPT: usize = 32;
const WARMUP_GEN: usize = 4;

/// Human or JSON-lines output.
struct Out {
    json: bool,
    header_done: bool,
}

impl Out {
    fn line(&mut self, s: &str) -> Result<()> {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{s}")?;
        o.flush()?;
        Ok(())
    }

    fn record(&mut self, info: &Info, extra: Value) -> Result<()> {
        let mut obj = info.json();
        if let (Some(o), Value::Object(e)) = (obj.as_object_mut(), extra) {
            o.extend(e);
            o.insert("peak_rss_bytes".into(), json!(common::peak_rss_bytes()));
        }
        self.line(&obj.to_string())
    }

    fn test_row(&mut self, info: &Info, test: &str, rates: &Stats) -> Result<()> {
        if !self.header_done {
            self.line("| model | size | params | backend | threads | test | t/s |")?;
            self.line("| --- | ---: | ---: | --- | ---: | ---: | ---: |")?;
            self.header_done = true;
        }
        self.line(&format!(
            "| {} | {} | {} | CPU {} {} | {} | {} | {:.2} ± {:.2} |",
            info.name,
            fmt_bytes(info.size_bytes),
            fmt_params(info.params),
            lone_core::kernels::isa().name(),
            lone_core::kernels::mode().resolved(),
            info.threads,
            test,
            rates.mean,
            rates.stddev
        ))
    }
}

struct Stats {
    mean: f64,
    stddev: f64,
}

fn stats(xs: &[f64]) -> Stats {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let stddev = if xs.len() > 1 {
        (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Stats { mean, stddev }
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat (USER_HZ = 100 on
/// Linux); 0 elsewhere. With the wall time it shows how much of the machine a test got.
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After the command name: state is field 3; utime, stime are fields 14, 15.
            let ut: f64 = f.get(11)?.parse().ok()?;
            let st: f64 = f.get(12)?.parse().ok()?;
            Some((ut + st) / 100.0)
        })
        .unwrap_or(0.0)
}

/// The 1-minute load average (others' work on a shared machine skews every timing).
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// splitmix64: reproducible random token ids without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn tokens(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next() % vocab.max(1) as u64) as u32)
            .collect()
    }
}

/// A fresh cache holding `context` (not timed).
fn cache_at(model: &Model, context: &[u32]) -> Result<lone_core::cache::SeqCache> {
    let mut cache = model.new_cache();
    if !context.is_empty() {
        prefill(model, &mut cache, context, false)?;
    }
    Ok(cache)
}

/// Seconds to prefill `tokens` into a cache holding `context`.
fn time_prefill(model: &Model, context: &[u32], tokens: &[u32]) -> Result<f64> {
    let mut cache = cache_at(model, context)?;
    let t = Instant::now();
    let logits = prefill(model, &mut cache, tokens, false)?;
    let s = t.elapsed().as_secs_f64();
    std::hint::black_box(logits);
    Ok(s)
}

/// Seconds for `n` decode steps (greedy pick + 1-token forward) after `context` and a
/// 1-token prompt.
fn time_decode(model: &Model, context: &[u32], first: u32, n: usize) -> Result<f64> {
    let mut cache = cache_at(model, context)?;
    let mut logits = prefill(model, &mut cache, &[first], false)?;
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let mut history = vec![first];
    let t = Instant::now();
    for _ in 0..n {
        let tok = sampler.sample(&logits, &history);
        history.push(tok);
        let mut batch = Batch::default();
        batch.push(0, cache.len(), tok, true);
        logits = model
            .forward(&batch, std::slice::from_mut(&mut cache))?
            .logits;
    }
    Ok(t.elapsed().as_secs_f64())
}

pub fn run(a: BenchArgs) -> Result<()> {
    let t_start = Instant::now();
    if let Some(0) = a.reps {
        bail!("--reps must be at least 1");
    }
    if a.membw {
        return membw(&a);
    }
    let path = common::resolve_model(a.model.as_deref())?;
    let model = common::load_model(&path, a.threads)?;
    let t_weights = t_start.elapsed().as_secs_f64();
    let rss_after_load = common::rss_bytes();
    let text = match TextIo::load(&model, &path) {
        Ok(t) => Some(t),
        Err(e) if !a.suite => {
            eprintln!("warning: no tokenizer ({e}); cold start uses a token id");
            None
        }
        Err(e) => return Err(e).context("cannot load the tokenizer (needed by --suite)"),
    };
    let t_text = t_start.elapsed().as_secs_f64();
    let vocab = model.cfg.vocab_size;
    let ctx = model.cfg.max_position_embeddings;
    let first_id = model.cfg.bos_token_id.filter(|&b| (b as usize) < vocab);

    // First token of a short chat prompt.
    let first_prompt: Vec<u32> = match &text {
        Some(t) if t.template.is_some() => t.chat_prompt(None, "Hello!")?,
        Some(t) => t.encode_raw("Hello!")?,
        None => vec![first_id.unwrap_or(0)],
    };
    if first_prompt.is_empty() {
        bail!("the cold-start prompt encodes to no tokens");
    }
    let t_pf = Instant::now();
    let mut cache = model.new_cache();
    let logits = prefill(&model, &mut cache, &first_prompt, false)?;
    let first_tok = Sampler::new(SamplingParams::greedy()).sample(&logits, &first_prompt);
    let first_token_s = t_pf.elapsed().as_secs_f64();
    let t_first = t_start.elapsed().as_secs_f64();
    std::hint::black_box(first_tok);
    drop(cache);

    let info = model_info(&model, &path);
    let mut out = Out {
        json: a.json,
        header_done: false,
    };
    let cold = json!({
        "test": "cold_start",
        "load_s": t_weights,
        "tokenizer_s": t_text - t_weights,
        "first_token_s": first_token_s,
        "start_to_first_token_s": t_first,
        "first_prompt_tokens": first_prompt.len(),
        "rss_after_load_bytes": rss_after_load,
        "loadavg_1m": loadavg(),
    });
    if out.json {
        out.record(&info, cold)?;
    }

    let warmup = !a.no_warmup;
    let mut rng = Rng(a.seed);
    if a.spec_workloads {
        let Some(text) = &text else {
            bail!("--spec-workloads needs a tokenizer");
        };
        spec_workloads(&model, text, &info, &a, &mut out)?;
    } else if a.suite {
        let Some(text) = &text else {
            bail!("--suite needs a tokenizer");
        };
        suite(&model, text, &info, &a, &mut out)?;
    } else {
        let reps = a.reps.unwrap_or(3);
        let d = a.depth;
        let context = rng.tokens(d, vocab);
        let at = |t: String| if d > 0 { format!("{t} @ d{d}") } else { t };
        for &n in a.prompt_tokens.iter().filter(|&&n| n > 0) {
            if d + n >= ctx {
                bail!("pp{n} at depth {d}: the model's context holds {ctx} tokens");
            }
            let tokens = rng.tokens(n, vocab);
            if warmup {
                time_prefill(&model, &[], &tokens[..n.min(WARMUP_PROMPT)])?;
            }
            let mut secs = Vec::with_capacity(reps);
            let cpu0 = cpu_seconds();
            for _ in 0..reps {
                secs.push(time_prefill(&model, &context, &tokens)?);
            }
            let cpu = cpu_seconds() - cpu0;
            report(&mut out, &info, &at(format!("pp{n}")), n, 0, &secs, cpu)?;
        }
        for &n in a.gen_tokens.iter().filter(|&&n| n > 0) {
            if d + n + 1 >= ctx {
                bail!("tg{n} at depth {d}: the model's context holds {ctx} tokens");
            }
            let first = first_id.unwrap_or_else(|| rng.tokens(1, vocab)[0]);
            if warmup {
                time_decode(&model, &[], first, n.min(WARMUP_GEN))?;
            }
            let mut secs = Vec::with_capacity(reps);
            let cpu0 = cpu_seconds();
            for _ in 0..reps {
                secs.push(time_decode(&model, &context, first, n)?);
            }
            let cpu = cpu_seconds() - cpu0;
            report(&mut out, &info, &at(format!("tg{n}")), 0, n, &secs, cpu)?;
        }
    }

    if !out.json {
        out.line("")?;
        out.line(&format!(
            "cold start: weights ready {:.3} s (mmap, page cache as it was), tokenizer {:.3} s, \
             first token {:.3} s ({} prompt tokens) → {:.3} s from start",
            t_weights,
            t_text - t_weights,
            first_token_s,
            first_prompt.len(),
            t_first
        ))?;
        out.line(&format!(
            "memory: RSS after load {}, peak RSS {}; {} ({} threads); {} weight bytes read per token",
            fmt_bytes(rss_after_load),
            fmt_bytes(common::peak_rss_bytes()),
            info.cpu,
            info.threads,
            fmt_bytes(info.bytes_per_token)
        ))?;
    }
    Ok(())
}

/// The `@ dN` depth of a test name, 0 without one.
fn depth_of(test: &str) -> usize {
    test.rsplit_once(" @ d")
        .and_then(|(_, d)| d.parse().ok())
        .unwrap_or(0)
}

fn report(
    out: &mut Out,
    info: &Info,
    test: &str,
    n_prompt: usize,
    n_gen: usize,
    secs: &[f64],
    cpu_s: f64,
) -> Result<()> {
    let n = (n_prompt + n_gen) as f64;
    let rates: Vec<f64> = secs.iter().map(|s| n / s.max(1e-12)).collect();
    let st = stats(&rates);
    if out.json {
        out.record(
            info,
            json!({
                "test": test,
                "depth": depth_of(test),
                "n_prompt": n_prompt,
                "n_gen": n_gen,
                "reps": secs.len(),
                "samples_s": secs,
                "samples_ts": rates,
                "avg_ts": st.mean,
                "stddev_ts": st.stddev,
                "cpu_s": cpu_s,
                "wall_s": secs.iter().sum::<f64>(),
                "loadavg_1m": loadavg(),
            }),
        )
    } else {
        out.test_row(info, test, &st)
    }
}

fn suite(model: &Model, text: &TextIo, info: &Info, a: &BenchArgs, out: &mut Out) -> Result<()> {
    let reps = a.reps.unwrap_or(1);
    let opts = GenerateOptions {
        max_new_tokens: a.suite_max_tokens,
        eos_ids: text.eos_ids.clone(),
        ignore_eos: false,
        ..Default::default()
    };
    let prompts: Vec<(&str, Vec<u32>)> = bench_suite::prompts()
        .into_iter()
        .map(|(name, p)| {
            let ids = if text.template.is_some() {
                text.chat_prompt(None, &p)?
            } else {
                text.encode_raw(&p)?
            };
            Ok((name, ids))
        })
        .collect::<Result<_>>()?;
    if !a.no_warmup {
        let mut cache = model.new_cache();
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let w = GenerateOptions {
            max_new_tokens: 4,
            ..opts.clone()
        };
        generate(model, &mut cache, &prompts[0].1, &w, &mut sampler, |_| true)?;
    }
    if !out.json {
        out.line(&format!(
            "{} — chat suite, greedy, up to {} new tokens, {} run(s) each, {} threads\n",
            info.name, a.suite_max_tokens, reps, info.threads
        ))?;
        out.line(
            "| prompt | prompt tokens | new tokens | prefill t/s | decode t/s | TTFT s | total s |",
        )?;
        out.line("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    }
    let ctx = model.cfg.max_position_embeddings;
    for (name, ids) in &prompts {
        if ids.len() + a.suite_max_tokens > ctx {
            let why = format!(
                "{} prompt tokens + {} new tokens exceed the context ({ctx})",
                ids.len(),
                a.suite_max_tokens
            );
            if out.json {
                out.record(
                    info,
                    json!({"test": format!("suite:{name}"), "prompt_tokens": ids.len(), "skipped": why}),
                )?;
            } else {
                out.line(&format!(
                    "| {name} | {} | skipped: {why} | | | | |",
                    ids.len()
                ))?;
            }
            continue;
        }
        let mut runs = Vec::new();
        for _ in 0..reps {
            let mut cache = model.new_cache();
            let mut sampler = Sampler::new(SamplingParams::greedy());
            let t = Instant::now();
            let g = generate(model, &mut cache, ids, &opts, &mut sampler, |_| true)?;
            let total = t.elapsed().as_secs_f64();
            runs.push((g, total));
        }
        let pf: Vec<f64> = runs.iter().map(|r| r.0.prefill_tok_s()).collect();
        let dc: Vec<f64> = runs.iter().map(|r| r.0.decode_tok_s()).collect();
        let ttft: Vec<f64> = runs
            .iter()
            .map(|r| r.0.prefill_time.as_secs_f64())
            .collect();
        let total: Vec<f64> = runs.iter().map(|r| r.1).collect();
        let new_tokens = runs.last().map_or(0, |r| r.0.tokens.len());
        let finish = runs.last().map_or("length", |r| r.0.finish.as_str());
        let (pf, dc, ttft, total) = (stats(&pf), stats(&dc), stats(&ttft), stats(&total));
        if out.json {
            out.record(
                info,
                json!({
                    "test": format!("suite:{name}"),
                    "prompt_tokens": ids.len(),
                    "new_tokens": new_tokens,
                    "finish_reason": finish,
                    "reps": reps,
                    "prefill_ts": pf.mean,
                    "decode_ts": dc.mean,
                    "ttft_s": ttft.mean,
                    "total_s": total.mean,
                    "stddev": {"prefill_ts": pf.stddev, "decode_ts": dc.stddev,
                               "ttft_s": ttft.stddev, "total_s": total.stddev},
                }),
            )?;
        } else {
            out.line(&format!(
                "| {name} | {} | {new_tokens} | {:.2} | {:.2} | {:.3} | {:.3} |",
                ids.len(),
                pf.mean,
                dc.mean,
                ttft.mean,
                total.mean
            ))?;
        }
    }
    Ok(())
}

/// `--spec-workloads`: for each workload, `reps` rounds of (plain, speculative) greedy runs,
/// interleaved, each from a fresh cache.
fn spec_workloads(
    model: &Model,
    text: &TextIo,
    info: &Info,
    a: &BenchArgs,
    out: &mut Out,
) -> Result<()> {
    let Some(spec) = a.spec.build(model, text)? else {
        bail!("--spec-workloads needs speculation: give --spec-type and/or --model-draft");
    };
    let reps = a.reps.unwrap_or(3);
    let plain = GenerateOptions {
        max_new_tokens: a.workload_max_tokens,
        eos_ids: text.eos_ids.clone(),
        ..Default::default()
    };
    let specd = GenerateOptions {
        spec: Some(spec.clone()),
        ..plain.clone()
    };
    let run = |ids: &[u32], o: &GenerateOptions| -> Result<lone_core::generate::Generation> {
        let mut cache = model.new_cache();
        let mut sampler = Sampler::new(SamplingParams::greedy());
        Ok(generate(model, &mut cache, ids, o, &mut sampler, |_| true)?)
    };
    let spec_name = spec.params.types.name();
    if !out.json {
        out.line(&format!(
            "{} — speculative workloads ({spec_name}), greedy, up to {} new tokens, {reps} interleaved round(s), {} threads\n",
            info.name, a.workload_max_tokens, info.threads
        ))?;
        out.line(
            "| workload | prompt tokens | new tokens | plain t/s | spec t/s | speedup | accepted | tok/pass | same output |",
        )?;
        out.line("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")?;
    }
    for (name, msg) in bench_suite::spec_workloads() {
        if a.workloads
            .as_ref()
            .is_some_and(|w| !w.iter().any(|x| x == name))
        {
            continue;
        }
        let ids = if text.template.is_some() {
            text.chat_prompt(None, &msg)?
        } else {
            text.encode_raw(&msg)?
        };
        if !a.no_warmup {
            let w = GenerateOptions {
                max_new_tokens: 4,
                ..specd.clone()
            };
            run(&ids, &w)?;
        }
        let (mut p_ts, mut s_ts) = (Vec::new(), Vec::new());
        let (mut p, mut s) = (None, None);
        for _ in 0..reps {
            let g = run(&ids, &plain)?;
            p_ts.push(g.decode_tok_s());
            p = Some(g);
            let g = run(&ids, &specd)?;
            s_ts.push(g.decode_tok_s());
            s = Some(g);
        }
        let (p, s) = (p.expect("reps ≥ 1"), s.expect("reps ≥ 1"));
        let same = p.tokens == s.tokens;
        let (pt, st) = (stats(&p_ts), stats(&s_ts));
        let speedup = st.mean / pt.mean.max(1e-9);
        if out.json {
            out.record(
                info,
                json!({
                    "test": format!("spec:{name}"),
                    "spec_type": spec_name,
                    "draft_model": a.spec.model_draft.as_ref().map(|p| p.display().to_string()),
                    "draft_max": spec.params.draft_max,
                    "ngram_n": spec.params.ngram_n,
                    "ngram_m": spec.params.ngram_m,
                    "prompt_tokens": ids.len(),
                    "new_tokens": s.tokens.len(),
                    "reps": reps,
                    "plain_decode_ts": pt.mean,
                    "spec_decode_ts": st.mean,
                    "speedup": speedup,
                    "stddev": {"plain_decode_ts": pt.stddev, "spec_decode_ts": st.stddev},
                    "drafted": s.spec.drafted,
                    "accepted": s.spec.accepted,
                    "passes": s.spec.passes,
                    "tokens_per_pass": s.tokens_per_pass(),
                    "same_output": same,
                    "message": msg,
                    "text": text.decode(&s.tokens)?,
                }),
            )?;
        } else {
            out.line(&format!(
                "| {name} | {} | {} | {:.2} ± {:.2} | {:.2} ± {:.2} | {speedup:.2}× | {}/{} | {:.2} | {} |",
                ids.len(),
                s.tokens.len(),
                pt.mean,
                pt.stddev,
                st.mean,
                st.stddev,
                s.spec.accepted,
                s.spec.drafted,
                s.tokens_per_pass(),
                if same { "yes" } else { "NO" }
            ))?;
        }
    }
    Ok(())
}

/// Read bandwidth: each thread sums its share of a buffer (touched first so it is resident);
/// one warm-up pass, then 5 timed passes.
fn membw(a: &BenchArgs) -> Result<()> {
    let threads = match a.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if a.membw_mib == 0 {
        bail!("--membw-mib must be at least 1");
    }
    let reps = a.reps.unwrap_or(5);
    let gbs = measure_membw(a.membw_mib, threads, reps);
    let n = a.membw_mib * (1 << 20) / 8;
    let best = gbs.iter().copied().fold(0.0, f64::max);
    let st = stats(&gbs);
    let cpu = cpu_model();
    let mut o = std::io::stdout().lock();
    if a.json {
        let v = json!({
            "test": "membw",
            "buffer_bytes": n * 8,
            "threads": threads,
            "reps": reps,
            "samples_gbs": gbs,
            "best_gbs": best,
            "avg_gbs": st.mean,
            "stddev_gbs": st.stddev,
            "cpu": cpu,
        });
        writeln!(o, "{v}")?;
    } else {
        writeln!(
            o,
            "memory read bandwidth: {best:.2} GB/s best, {:.2} ± {:.2} GB/s mean ({} MiB, {threads} threads, {reps} passes; {cpu})",
            st.mean, st.stddev, a.membw_mib
        )?;
    }
    Ok(())
}
