#!/usr/bin/env python3
"""Decode speed through the Python API against `lone run` on the same file, interleaved:
`lone run --json` reports its decode rate; the API's is timed over a streamed generate from
the first piece to the last (the same span: prefill excluded). Also whole calls: a
non-streaming `create_completion`'s tokens per second of wall time against `lone run`'s
tokens over its prefill + decode time. Run with the wheel installed
(scripts/build-wheel.sh; pip install dist/lone-*.whl) and its `lone` command on PATH:

    python scripts/bench-python.py [--model FILE] [--tokens 128] [--rounds 5] [--threads 2]
"""

import argparse
import json
import shutil
import statistics
import subprocess
import time

import lone

ap = argparse.ArgumentParser()
ap.add_argument("--model", default=None)
ap.add_argument("--tokens", type=int, default=128)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--prompt", default="Once upon a time")
a = ap.parse_args()

exe = shutil.which("lone")
m = lone.Model(a.model, threads=a.threads, ctx=1024)
print(f"model {m.path}, {a.tokens} tokens, {a.threads} threads, lone {lone.__version__}")


def run_cli():
    cmd = [exe, "run", "--model", m.path, "-t", str(a.threads), "--prompt", a.prompt,
           "-n", str(a.tokens), "--ignore-eos", "--json"]
    st = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["stats"]
    whole = st["generated_tokens"] / (st["prefill_seconds"] + st["decode_seconds"])
    return st["decode_tokens_per_second"], whole


def run_whole() -> float:
    t = time.perf_counter()
    r = m.create_completion(a.prompt, max_tokens=a.tokens, temperature=0, ignore_eos=True)
    return r["usage"]["completion_tokens"] / (time.perf_counter() - t)


def run_api() -> float:
    first = last = None
    n = 0
    for chunk in m.create_completion(a.prompt, max_tokens=a.tokens, temperature=0, ignore_eos=True,
                                     stream=True, stream_options={"include_usage": True}):
        now = time.perf_counter()
        if chunk.get("usage"):
            n = chunk["usage"]["completion_tokens"]
            continue
        if first is None:
            first = now
        last = now
    return (n - 1) / (last - first)


run_cli(), run_api(), run_whole()  # warm-up (page cache, the engine's first steps)
cli, api, cli_whole, api_whole = [], [], [], []
for r in range(a.rounds):
    d, w = run_cli()
    cli.append(d)
    cli_whole.append(w)
    api.append(run_api())
    api_whole.append(run_whole())
    print(f"round {r + 1}: decode: lone run {d:.1f} tok/s, Python API (stream) {api[-1]:.1f}; "
          f"whole call: lone run {w:.1f}, Python API {api_whole[-1]:.1f}")
med = statistics.median
c, p = med(cli), med(api)
print(f"median decode: lone run {c:.1f} tok/s, Python API streamed {p:.1f} tok/s, API / run {p / c:.3f}")
c, p = med(cli_whole), med(api_whole)
print(f"median whole call: lone run {c:.1f} tok/s, Python API {p:.1f} tok/s, API / run {p / c:.3f}")
