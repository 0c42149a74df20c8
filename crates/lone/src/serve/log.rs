//! One log line per request on stderr (as llama-server prints each slot's timings): request id,
//! endpoint, model, status, prompt / cached / generated tokens, time to first token, decode
//! rate, finish reasons, whether the client went away. Text by default, `--log-format json`
//! for collectors. Prompt text only with `--log-prompts`.

use std::time::Instant;

use serde_json::{json, Value};

use super::engine::Event;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
    /// No request log lines (the Python and C APIs' default).
    Off,
}

/// Logging settings.
#[derive(Clone, Debug, Default)]
pub struct LogConfig {
    pub format: LogFormat,
    pub prompts: bool,
}

impl LogConfig {
    /// Print a line: `fields` as JSON, or `key=value` pairs after `what`.
    pub fn line(&self, what: &str, fields: Value) {
        match self.format {
            LogFormat::Off => {}
            LogFormat::Json => {
                let mut v = fields;
                v["event"] = json!(what);
                eprintln!("{v}");
            }
            LogFormat::Text => {
                let mut s = format!("lone serve: {what}");
                if let Value::Object(m) = fields {
                    for (k, v) in m {
                        match v {
                            Value::Null => {}
                            Value::String(t) => s.push_str(&format!(" {k}={t:?}")),
                            v => s.push_str(&format!(" {k}={v}")),
                        }
                    }
                }
                eprintln!("{s}");
            }
        }
    }
}

/// The running record of one generation request; logged once, when done or dropped (a client
/// that disconnects drops its stream).
pub struct RequestLog {
    cfg: LogConfig,
    id: String,
    endpoint: &'static str,
    model: String,
    prompt: Option<String>,
    start: Instant,
    first: Option<Instant>,
    prompt_tokens: usize,
    cached: usize,
    generated: usize,
    finish: Vec<&'static str>,
    choices: usize,
    error: Option<String>,
    logged: bool,
    /// Images in the prompt and the time their processing and encoding took.
    /// Images, how many of them reused an earlier encoding, and the encoding time.
    images: Option<(usize, usize, std::time::Duration)>,
    /// The model's counters, which the request adds to when logged.
    metrics: Option<std::sync::Arc<super::metrics::Metrics>>,
}

impl RequestLog {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &LogConfig,
        id: &str,
        endpoint: &'static str,
        model: &str,
        prompt_tokens: usize,
        choices: usize,
        prompt: Option<String>,
        start: Instant,
    ) -> RequestLog {
        RequestLog {
            cfg: cfg.clone(),
            id: id.to_string(),
            endpoint,
            model: model.to_string(),
            prompt: prompt.filter(|_| cfg.prompts),
            start,
            first: None,
            prompt_tokens,
            cached: 0,
            generated: 0,
            finish: Vec::new(),
            choices,
            error: None,
            logged: false,
            images: None,
            metrics: None,
        }
    }

    pub fn on_event(&mut self, ev: &Event) {
        match ev {
            Event::Delta { tokens, .. } => {
                if self.first.is_none() && !tokens.is_empty() {
                    self.first = Some(Instant::now());
                }
            }
            Event::Done {
                finish,
                completion_tokens,
                cached_tokens,
                ..
            } => {
                self.generated += completion_tokens;
                self.cached += cached_tokens;
                self.finish.push(finish.as_str());
            }
            Event::Error { message, .. } => self.error = Some(message.clone()),
        }
    }

    /// Log now (`finish` entries `tool_calls` etc. may replace the engine's).
    pub fn done(&mut self, finish: Option<Vec<&'static str>>) {
        if let Some(f) = finish {
            self.finish = f;
        }
        self.emit();
    }

    fn emit(&mut self) {
        if self.logged {
            return;
        }
        self.logged = true;
        let total = self.start.elapsed().as_secs_f64();
        let ttft = self.first.map(|f| (f - self.start).as_secs_f64());
        let decode = self.first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
        let rate = (decode > 0.0 && self.generated > self.choices)
            .then(|| (self.generated - self.choices) as f64 / decode);
        let incomplete = self.finish.len() < self.choices && self.error.is_none();
        let status = if self.error.is_some() { 500 } else { 200 };
        let mut line = json!({
            "id": self.id,
            "endpoint": self.endpoint,
            "model": self.model,
            "status": status,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached,
            "generated_tokens": self.generated,
            "ttft_ms": ttft.map(|t| (t * 1e4).round() / 10.0),
            "decode_tok_s": rate.map(|r| (r * 10.0).round() / 10.0),
            "total_ms": (total * 1e4).round() / 10.0,
            "finish": self.finish.join(","),
            "disconnected": incomplete.then_some(true),
            "error": self.error,
            "prompt": self.prompt,
        });
        if let Some(m) = &self.metrics {
            use std::sync::atomic::Ordering::Relaxed;
            if let Some(t) = ttft {
                m.first_tokens.fetch_add(1, Relaxed);
                m.ttft_ns.fetch_add((t * 1e9) as u64, Relaxed);
            }
            if let Some((n, reused, t)) = self.images {
                m.images.fetch_add(n as u64, Relaxed);
                m.images_reused.fetch_add(reused as u64, Relaxed);
                m.image_encode_ns.fetch_add(t.as_nanos() as u64, Relaxed);
            }
        }
        if let Some((n, reused, t)) = self.images {
            line["images"] = json!(n);
            if reused > 0 {
                line["images_reused"] = json!(reused);
            }
            line["encode_ms"] = json!((t.as_secs_f64() * 1e4).round() / 10.0);
        }
        self.cfg.line("request", line);
    }

    /// The request's prompt held `n` images (`reused` of them encoded before), processed and
    /// encoded in `t`.
    pub fn set_images(&mut self, n: usize, reused: usize, t: std::time::Duration) {
        self.images = Some((n, reused, t));
    }

    /// Add this request's time to first token and images to `metrics` when it is logged.
    pub fn count_in(&mut self, metrics: std::sync::Arc<super::metrics::Metrics>) {
        self.metrics = Some(metrics);
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        self.emit();
    }
}
