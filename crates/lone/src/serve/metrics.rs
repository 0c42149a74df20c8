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
}

impl Metrics {
    pub fn record_request(&self, endpoint: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint.to_string(), status)).or_insert(0) += 1;
        }
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let g = |a: &AtomicU64| a.load(Relaxed);
        let secs = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(
            s,
            "# HELP lone_requests_total HTTP requests by endpoint and status code."
        );
        let _ = writeln!(s, "# TYPE lone_requests_total counter");
        if let Ok(m) = self.requests.lock() {
            for ((ep, st), n) in m.iter() {
                let _ = writeln!(
                    s,
                    "lone_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}"
                );
            }
        }
        let mut metric = |name: &str, kind: &str, help: &str, v: String| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} {kind}");
            let _ = writeln!(s, "{name} {v}");
        };
        metric(
            "lone_prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted sequences.",
            g(&self.prompt_tokens).to_string(),
        );
        metric(
            "lone_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache (not prefilled).",
            g(&self.cached_prompt_tokens).to_string(),
        );
        metric(
            "lone_generated_tokens_total",
            "counter",
            "Tokens generated.",
            g(&self.generated_tokens).to_string(),
        );
        metric(
            "lone_prefill_seconds_total",
            "counter",
            "Forward-pass time spent on prompt rows.",
            format!("{:.6}", secs(&self.prefill_ns)),
        );
        metric(
            "lone_decode_seconds_total",
            "counter",
            "Forward-pass time spent on decode rows.",
            format!("{:.6}", secs(&self.decode_ns)),
        );
        let rate = |n: u64, t: f64| if t > 0.0 { n as f64 / t } else { 0.0 };
        metric(
            "lone_prefill_tokens_per_second",
            "gauge",
            "Average prefill rate (prompt rows per prefill second).",
            format!(
                "{:.3}",
                rate(g(&self.prefill_tokens), secs(&self.prefill_ns))
            ),
        );
        metric(
            "lone_decode_tokens_per_second",
            "gauge",
            "Average decode rate (decode rows per decode second, all slots together).",
            format!("{:.3}", rate(g(&self.decode_tokens), secs(&self.decode_ns))),
        );
        metric(
            "lone_queue_depth",
            "gauge",
            "Sequences waiting for a slot.",
            g(&self.queue_depth).to_string(),
        );
        metric(
            "lone_prompt_cache_bytes",
            "gauge",
            "Host memory held by prompt-cache snapshots (--cache-ram).",
            g(&self.prompt_cache_bytes).to_string(),
        );
        metric(
            "lone_prompt_cache_entries",
            "gauge",
            "Prompt-cache snapshots held.",
            g(&self.prompt_cache_entries).to_string(),
        );
        metric(
            "lone_prompt_cache_hits_total",
            "counter",
            "Prompts that started from a prompt-cache snapshot instead of their slot's cache.",
            g(&self.prompt_cache_hits).to_string(),
        );
        metric(
            "lone_active_slots",
            "gauge",
            "Slots running a sequence.",
            g(&self.active_slots).to_string(),
        );
        metric(
            "lone_slots",
            "gauge",
            "Slots (--parallel).",
            g(&self.slots).to_string(),
        );
        metric(
            "lone_cancelled_total",
            "counter",
            "Sequences cancelled because the client went away.",
            g(&self.cancelled).to_string(),
        );
        metric(
            "lone_engine_steps_total",
            "counter",
            "Batched forward passes.",
            g(&self.steps).to_string(),
        );
        metric(
            "lone_draft_tokens_total",
            "counter",
            "Tokens drafted by speculative decoding.",
            g(&self.drafted_tokens).to_string(),
        );
        metric(
            "lone_draft_tokens_accepted_total",
            "counter",
            "Drafted tokens the model accepted.",
            g(&self.accepted_tokens).to_string(),
        );
        let (d, a) = (g(&self.drafted_tokens), g(&self.accepted_tokens));
        metric(
            "lone_draft_acceptance_rate",
            "gauge",
            "Accepted / drafted tokens (0 before any draft).",
            format!("{:.4}", if d > 0 { a as f64 / d as f64 } else { 0.0 }),
        );
        s
    }
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
}
