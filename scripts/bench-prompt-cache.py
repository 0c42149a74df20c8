#!/usr/bin/env python3
"""Prompt cache across conversations: N conversations x T turns through 2 slots (greedy,
round robin, so every returning conversation finds its slot taken by others), against lone with
and without --cache-ram and against llama-server on the same GGUF. Reports per server: prompt
tokens, tokens prefilled (prompt - cached), mean and p50 time to first token of returning turns.
One server runs at a time.

  scripts/bench-prompt-cache.py MODEL.gguf [--convs 16] [--turns 4] [--llama-server PATH] [--json OUT]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONE = ROOT / "target" / "release" / "lone"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_stream(url, body):
    """Stream a chat completion: (text, ttft seconds, final usage/timings object)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, last = None, "", {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            for ch in c.get("choices", []):
                piece = ch.get("delta", {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            if c.get("usage") or c.get("timings"):
                last = c
    return text, ttft if ttft is not None else time.perf_counter() - t0, last


def wait(base, proc):
    for _ in range(1200):
        if proc.poll() is not None:
            sys.exit(f"server exited: {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.1)
    sys.exit("server did not start")


def run(name, cmd, port, convs, turns, max_tokens):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait(base, proc)
        msgs = [[{"role": "user", "content": f"Conversation {i}: write two sentences about the number {i * 7}."}] for i in range(convs)]
        prompt = prefilled = 0
        ttfts = []
        for t in range(turns):
            for i in range(convs):
                body = {"messages": msgs[i], "max_tokens": max_tokens, "temperature": 0, "stream": True,
                        "stream_options": {"include_usage": True}}
                text, ttft, last = post_stream(base + "/v1/chat/completions", body)
                u = last.get("usage") or {}
                tm = last.get("timings") or {}
                p = u.get("prompt_tokens", 0)
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
                if tm:  # llama-server: prompt_n tokens were evaluated, cache_n came from its cache
                    p = tm.get("prompt_n", 0) + tm.get("cache_n", 0)
                    cached = tm.get("cache_n", 0)
                prompt += p
                prefilled += p - (cached or 0)
                if t > 0:
                    ttfts.append(ttft)
                msgs[i] += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Now turn {t + 1}: one more sentence."}]
        res = {"server": name, "prompt_tokens": prompt, "prefilled_tokens": prefilled,
               "ttft_mean_s": statistics.mean(ttfts), "ttft_p50_s": statistics.median(ttfts)}
        print(json.dumps(res), flush=True)
        return res
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--convs", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--llama-server", default=os.path.expanduser("~/.cache/llama.cpp-0c1e570/build/bin/llama-server"))
    ap.add_argument("--json")
    a = ap.parse_args()
    out = []
    for name, extra in [("lone --cache-ram 8192", []), ("lone --cache-ram 0", ["--cache-ram", "0"])]:
        port = free_port()
        out.append(run(name, [str(LONE), "serve", "-m", a.model, "--parallel", "2", "--ctx", "4096", "--port", str(port), *extra],
                       port, a.convs, a.turns, a.max_tokens))
    if Path(a.llama_server).exists():
        for name, extra in [("llama-server --cache-ram 8192", []), ("llama-server --cache-ram 0", ["--cache-ram", "0"])]:
            port = free_port()
            out.append(run(name, [a.llama_server, "-m", a.model, "-np", "2", "-c", "8192", "--port", str(port), "-t", "2", *extra],
                           port, a.convs, a.turns, a.max_tokens))
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "convs": a.convs, "turns": a.turns, "results": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
