//! Counters and gauges for `GET /metrics` (Prometheus text format 0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Metrics {
    /// (endpoint, status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Prompt tokens of admitted sequences.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens taken from a slot's cache instead of being prefilled.
    pub cached_prompt_tokens: AtomicU64,
    /// Prompt tokens run through the model.
    pub prefill_tokens: AtomicU64,
    /// Tokens sampled (EOS excluded).
    pub generated_tokens: AtomicU64,
    /// Decode rows run through the model.
    pub decode_tokens: AtomicU64,
    /// Forward time attributed to prefill / decode rows (split by row count), nanoseconds.
    pub prefill_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub queue_depth: AtomicU64,
    pub active_slots: AtomicU64,
    pub slots: AtomicU64,
    pub cancelled: AtomicU64,
    pub steps: AtomicU64,
    /// Speculative decoding: tokens drafted, and those the target accepted.
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// The prompt cache across conversations (`--cache-ram`): bytes and snapshots held,
    /// prompts that started from a snapshot.
    pub prompt_cache_bytes: AtomicU64,
    pub prompt_cache_entries: AtomicU64,
    pub prompt_cache_hits: AtomicU64,
    /// Requests that produced a first token, and the time from their arrival to it summed
    /// (nanoseconds).
    pub first_tokens: AtomicU64,
    pub ttft_ns: AtomicU64,
    /// Images in prompts, those whose encoding was reused, and the processing + encoding time
    /// (nanoseconds).
    pub images: AtomicU64,
    pub images_reused: AtomicU64,
    pub image_encode_ns: AtomicU64,
}

impl Metrics {
    pub fn record_request(&self, endpoint: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint.to_string(), status)).or_insert(0) += 1;
        }
    }

    /// This one set of counters as the Prometheus text of a one-model server.
    #[cfg(test)]
    pub fn render(&self) -> String {
        render(self, &[("", self)], false)
    }
}

/// A model's series: name, type, help, value.
type Series = (&'static str, &'static str, &'static str, String);

/// One model's engine counters and gauges.
fn model_series(m: &Metrics) -> Vec<Series> {
    let g = |a: &AtomicU64| a.load(Relaxed);
    let secs = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e9;
    let rate = |n: u64, t: f64| if t > 0.0 { n as f64 / t } else { 0.0 };
    let (d, a) = (g(&m.drafted_tokens), g(&m.accepted_tokens));
    vec![
        (
            "lone_prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted sequences.",
            g(&m.prompt_tokens).to_string(),
        ),
        (
            "lone_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache (not prefilled).",
            g(&m.cached_prompt_tokens).to_string(),
        ),
        (
            "lone_generated_tokens_total",
            "counter",
            "Tokens generated.",
            g(&m.generated_tokens).to_string(),
        ),
        (
            "lone_prefill_seconds_total",
            "counter",
            "Forward-pass time spent on prompt rows.",
            format!("{:.6}", secs(&m.prefill_ns)),
        ),
        (
            "lone_decode_seconds_total",
            "counter",
            "Forward-pass time spent on decode rows.",
            format!("{:.6}", secs(&m.decode_ns)),
        ),
        (
            "lone_prefill_tokens_per_second",
            "gauge",
            "Average prefill rate (prompt rows per prefill second).",
            format!("{:.3}", rate(g(&m.prefill_tokens), secs(&m.prefill_ns))),
        ),
        (
            "lone_decode_tokens_per_second",
            "gauge",
            "Average decode rate (decode rows per decode second, all slots together).",
            format!("{:.3}", rate(g(&m.decode_tokens), secs(&m.decode_ns))),
        ),
        (
            "lone_queue_depth",
            "gauge",
            "Sequences waiting for a slot.",
            g(&m.queue_depth).to_string(),
        ),
        (
            "lone_prompt_cache_bytes",
            "gauge",
            "Host memory held by prompt-cache snapshots (--cache-ram).",
            g(&m.prompt_cache_bytes).to_string(),
        ),
        (
            "lone_prompt_cache_entries",
            "gauge",
            "Prompt-cache snapshots held.",
            g(&m.prompt_cache_entries).to_string(),
        ),
        (
            "lone_prompt_cache_hits_total",
            "counter",
            "Prompts that started from a prompt-cache snapshot instead of their slot's cache.",
            g(&m.prompt_cache_hits).to_string(),
        ),
        (
            "lone_active_slots",
            "gauge",
            "Slots running a sequence.",
            g(&m.active_slots).to_string(),
        ),
        (
            "lone_slots",
            "gauge",
            "Slots (--parallel).",
            g(&m.slots).to_string(),
        ),
        (
            "lone_cancelled_total",
            "counter",
            "Sequences cancelled because the client went away.",
            g(&m.cancelled).to_string(),
        ),
        (
            "lone_engine_steps_total",
            "counter",
            "Batched forward passes.",
            g(&m.steps).to_string(),
        ),
        (
            "lone_draft_tokens_total",
            "counter",
            "Tokens drafted by speculative decoding.",
            d.to_string(),
        ),
        (
            "lone_draft_tokens_accepted_total",
            "counter",
            "Drafted tokens the model accepted.",
            a.to_string(),
        ),
        (
            "lone_time_to_first_token_seconds_total",
            "counter",
            "Seconds from a request's arrival to its first token, summed over the requests that got one.",
            format!("{:.6}", secs(&m.ttft_ns)),
        ),
        (
            "lone_first_tokens_total",
            "counter",
            "Requests that got a first token (the mean time to first token is the sum above over this).",
            g(&m.first_tokens).to_string(),
        ),
        (
            "lone_images_total",
            "counter",
            "Images in prompts.",
            g(&m.images).to_string(),
        ),
        (
            "lone_images_reused_total",
            "counter",
            "Images whose encoding came from an earlier prompt.",
            g(&m.images_reused).to_string(),
        ),
        (
            "lone_image_encode_seconds_total",
            "counter",
            "Seconds spent processing and encoding images.",
            format!("{:.6}", secs(&m.image_encode_ns)),
        ),
        (
            "lone_draft_acceptance_rate",
            "gauge",
            "Accepted / drafted tokens (0 before any draft).",
            format!("{:.4}", if d > 0 { a as f64 / d as f64 } else { 0.0 }),
        ),
    ]
}

/// The Prometheus text: the server's request counts, then each model's series, with a
/// `model` label when `labelled` (several models served).
pub fn render(server: &Metrics, models: &[(&str, &Metrics)], labelled: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# HELP lone_requests_total HTTP requests by endpoint and status code."
    );
    let _ = writeln!(s, "# TYPE lone_requests_total counter");
    if let Ok(m) = server.requests.lock() {
        for ((ep, st), n) in m.iter() {
            let _ = writeln!(
                s,
                "lone_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}"
            );
        }
    }
    let per_model: Vec<(&str, Vec<Series>)> = models
        .iter()
        .map(|(id, m)| (*id, model_series(m)))
        .collect();
    let Some((_, first)) = per_model.first() else {
        return s;
    };
    for (i, (name, kind, help, _)) in first.iter().enumerate() {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for (id, series) in &per_model {
            let v = &series[i].3;
            if labelled {
                let id = id.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(s, "{name}{{model=\"{id}\"}} {v}");
            } else {
                let _ = writeln!(s, "{name} {v}");
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.record_request("/v1/completions", 200);
        m.record_request("/v1/completions", 200);
        m.record_request("/v1/chat/completions", 400);
        m.prefill_tokens.store(100, Relaxed);
        m.prefill_ns.store(2_000_000_000, Relaxed);
        let s = m.render();
        assert!(s.contains("lone_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"));
        assert!(
            s.contains("lone_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n")
        );
        assert!(s.contains("lone_prefill_tokens_per_second 50.000\n"));
        assert!(s.contains("# TYPE lone_queue_depth gauge\n"));
        for line in s.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap();
            v.parse::<f64>().unwrap();
        }
    }

    #[test]
    fn several_models_are_labelled_under_one_help_line() {
        let (server, a, b) = (Metrics::default(), Metrics::default(), Metrics::default());
        a.slots.store(4, Relaxed);
        b.slots.store(2, Relaxed);
        let s = render(&server, &[("a.gguf", &a), ("b\"x", &b)], true);
        assert!(s.contains("lone_slots{model=\"a.gguf\"} 4\n"));
        assert!(s.contains("lone_slots{model=\"b\\\"x\"} 2\n"));
        assert_eq!(s.matches("# TYPE lone_slots gauge").count(), 1);
    }
}
