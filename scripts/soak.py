#!/usr/bin/env python3
"""Soak `lone serve`: N clients for M minutes with random sampling parameters, stop strings,
streaming and not, several endpoints, and clients that disconnect mid-stream. Checks: no 5xx
(nor any other failure: every request sent is valid), resident memory after the warm-up grows
less than 5 %, slots and queue back to 0 at the end, the same greedy output before and after,
no panic in the server's log. Prints one JSON summary; exit 1 on a failed check.

    scripts/soak.sh --minutes 5 [--clients 8] [--model FILE.gguf]
"""

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

try:
    import httpx
except ImportError:
    import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("LONE_MODELS") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lone" / "models")
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
           "Explain what a CPU cache is.", "Tell me a story about a fox.", "How do I sort a list in Python?",
           "Translate 'good morning' into Spanish.", "What is 17 times 23?"]
STOPS = [".", "\n", " the ", "Paris", "```", "!", ","]
# Greedy prompts, prefilled whole each time (`cache_prompt: false`): a prompt continued from a
# cached prefix takes another path through the numbers (chunk sizes, kernels), which can flip
# a near-tie; this check is after a slot or cache left in a bad state, not that.
GREEDY = [{"messages": [{"role": "user", "content": c}], "max_tokens": 32, "temperature": 0, "cache_prompt": False}
          for c in ["What is the capital of France?", "What is 2 + 2?", "Name the planets of the solar system."]]


def rss_kb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metrics(base):
    out = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.n = {}
        self.failures = []

    def add(self, what, ok, detail=None):
        with self.lock:
            self.n[what] = self.n.get(what, 0) + 1
            if not ok:
                self.failures.append(f"{what}: {detail}")


def random_request(rng):
    msg = rng.choice(PROMPTS)
    body = {"max_tokens": rng.randint(1, 128)}
    t = rng.random()
    if t < 0.25:
        body["temperature"] = 0
    else:
        body["temperature"] = round(rng.uniform(0.1, 1.5), 2)
        if rng.random() < 0.5:
            body["top_p"] = round(rng.uniform(0.5, 1.0), 2)
        if rng.random() < 0.3:
            body["top_k"] = rng.randint(1, 80)
        if rng.random() < 0.3:
            body["min_p"] = round(rng.uniform(0.0, 0.2), 2)
        if rng.random() < 0.5:
            body["seed"] = rng.randint(0, 2**31)
    if rng.random() < 0.4:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 3))
    if rng.random() < 0.2:
        body["presence_penalty"] = round(rng.uniform(-1, 1), 2)
    if rng.random() < 0.2:
        body["frequency_penalty"] = round(rng.uniform(-1, 1), 2)
    kind = rng.choices(["chat", "completion", "ollama"], [0.6, 0.3, 0.1])[0]
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": msg}]
        if rng.random() < 0.2:
            body["messages"].insert(0, {"role": "system", "content": "Be brief."})
        if rng.random() < 0.15:
            body["logprobs"], body["top_logprobs"] = True, rng.randint(0, 5)
        if rng.random() < 0.1:
            body["n"] = 2
        return "/v1/chat/completions", body
    if kind == "completion":
        body["prompt"] = msg
        return "/v1/completions", body
    opts = {"num_predict": body.pop("max_tokens"), "temperature": body.pop("temperature")}
    if "stop" in body:
        opts["stop"] = body.pop("stop")
    return "/api/chat", {"messages": [{"role": "user", "content": msg}], "options": opts,
                         "stream": rng.random() < 0.5}


def client(base, seed, until, stats):
    rng = random.Random(seed)
    with httpx.Client(base_url=base, timeout=120) as c:
        while time.time() < until:
            path, body = random_request(rng)
            stream = body.get("stream", path == "/api/chat") if path == "/api/chat" else rng.random() < 0.6
            if path != "/api/chat":
                body["stream"] = stream
            drop_after = rng.randint(1, 8) if stream and rng.random() < 0.2 else None
            what = path + (" stream" if stream else "") + (" drop" if drop_after else "")
            try:
                if not stream:
                    r = c.post(path, json=body)
                    stats.add(what, r.status_code == 200, f"{r.status_code} {r.text[:300]} for {body}")
                    continue
                with c.stream("POST", path, json=body) as r:
                    if r.status_code != 200:
                        stats.add(what, False, f"{r.status_code} {r.read()[:300]!r} for {body}")
                        continue
                    n, ended = 0, False
                    for line in r.iter_lines():
                        if not line:
                            continue
                        n += 1
                        if line.startswith(('data: {"error"', '{"error"')):
                            stats.add(what, False, f"stream error {line[:300]} for {body}")
                            ended = True
                            break
                        if line == "data: [DONE]" or '"done":true' in line:
                            ended = True
                        if drop_after and n >= drop_after:
                            break  # the client goes away mid-stream
                    if drop_after and not ended:
                        stats.add(what, True)
                    else:
                        stats.add(what, ended, f"stream ended early after {n} lines for {body}")
            except httpx.HTTPError as e:
                stats.add(what, False, f"{type(e).__name__}: {e} for {body}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--model", default=str(MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--lone", default=str(Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "lone"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="lone-soak-", suffix=".log", delete=False)
    # A small prompt cache (its bytes are subtracted from the resident size: it is meant to
    # grow to its limit).
    proc = subprocess.Popen([a.lone, "serve", "--model", a.model, "--port", str(port), "--parallel", str(a.parallel),
                             "--cache-ram", "32"], stdout=log, stderr=subprocess.STDOUT)
    checks = {}
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        def greedy():
            return [httpx.post(base + "/v1/chat/completions", json=g, timeout=60).json()["choices"][0]["message"]["content"]
                    for g in GREEDY]
        greedy_before = greedy()

        total = a.minutes * 60
        # The first minute fills allocator arenas, slot caches and the prompt cache.
        warmup = max(60.0, total * 0.2) if total > 60 else total / 2
        t0 = time.time()
        until = t0 + total
        stats = Stats()
        threads = [threading.Thread(target=client, args=(base, a.seed * 1000 + i, until, stats), daemon=True)
                   for i in range(a.clients)]
        for t in threads:
            t.start()
        samples = []
        while time.time() < until:
            time.sleep(1)
            held = metrics(base).get("lone_prompt_cache_bytes", 0) / 1024
            samples.append((time.time() - t0, rss_kb(proc.pid) - held))
        for t in threads:
            t.join(180)
        hung = sum(t.is_alive() for t in threads)

        # Slots and queue back to 0.
        deadline = time.time() + 15
        while time.time() < deadline:
            m = metrics(base)
            if m["lone_active_slots"] == 0 and m["lone_queue_depth"] == 0:
                break
            time.sleep(0.2)
        greedy_after = greedy()
        after_warm = [kb for t, kb in samples if t >= warmup]
        base_kb = after_warm[0] if after_warm else samples[0][1]
        end_kb = samples[-1][1]
        growth = (end_kb - base_kb) / base_kb if base_kb else 0.0
        # /health answers 503 while the model loads: that one is expected.
        five = {k: v for k, v in m.items() if k.startswith("lone_requests_total") and re.search(r'status="5\d\d"', k)
                and "/health" not in k}
        server_log = Path(log.name).read_text(errors="replace")
        checks = {
            "no failed request": not stats.failures,
            "no 5xx in the server's counters": not five,
            "no client hung": hung == 0,
            "rss growth after warm-up < 5%": growth < 0.05,
            "slots and queue back to 0": m["lone_active_slots"] == 0 and m["lone_queue_depth"] == 0,
            "greedy output unchanged": greedy_before == greedy_after,
            "no panic in the log": "panicked" not in server_log,
            "server alive": proc.poll() is None,
        }
        summary = {
            "minutes": a.minutes, "clients": a.clients, "requests": sum(stats.n.values()), "by_kind": stats.n,
            "failures": stats.failures[:20], "rss_mib_after_warmup": round(base_kb / 1024, 1),
            "rss_mib_end": round(end_kb / 1024, 1), "rss_growth": round(growth, 4),
            "rss_note": "resident size minus the prompt cache's bytes",
            "rss_mib_by_minute": [round(kb / 1024, 1) for t, kb in samples if int(t) % 60 == 0 or t == samples[-1][0]],
            "greedy": [greedy_before, greedy_after],
            "cancelled": m.get("lone_cancelled_total"), "generated_tokens": m.get("lone_generated_tokens_total"),
            "checks": checks,
        }
        print(json.dumps(summary, indent=1))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    bad = [k for k, ok in checks.items() if not ok]
    if bad or not checks:
        print("soak FAILED: " + ", ".join(bad) + f" (server log: {log.name})", file=sys.stderr)
        sys.exit(1)
    os.unlink(log.name)
    print("soak ok", file=sys.stderr)


if __name__ == "__main__":
    main()
