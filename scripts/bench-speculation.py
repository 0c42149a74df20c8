#!/usr/bin/env python3
"""lone vs llama-server speculative decoding on the same GGUFs, prompts and threads.

    scripts/bench-speculation.py [--rounds R] [--threads T] [--out docs/perf/spec-DATE.json]
        [--config NAME ...]
    scripts/bench-speculation.py chart OUT.svg RESULTS.json...   (the chart again, merged)

Each config is a target GGUF plus a speculation setting (ngram-simple with llama.cpp's
defaults, or a draft model). For every round: `lone bench --spec-workloads --json -r 1`
(plain and speculative decode of each workload, interleaved), then the same workloads through
llama-server, started plain and then speculating (same flags: `--spec-type`, `-md` with
`--spec-type draft-simple`, `--spec-draft-n-max`), one server at a time, each request greedy
with the prompt cache off after a 4-token warm-up.
Rates are decode tokens per second (lone: tokens after the first / decode time; llama-server:
its `timings.predicted_per_second`). Writes the raw records (JSON) and prints a markdown table
of means over the rounds.

Needs: target/release/lone (built), llama-server (../shared/scripts/build-llama-cpp.sh, or
LLAMA_SERVER=path), the default SmolLM2 GGUF, and for the draft config an F16 copy made with
`llama-quantize --allow-requantize Q4_1.gguf F16.gguf F16` (made here when missing).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = Path.home()
LLAMA = Path(os.environ.get("LLAMA_PREFIX", HOME / ".cache/llama.cpp-0c1e570"))
LLAMA_SERVER = Path(os.environ.get("LLAMA_SERVER", LLAMA / "build/bin/llama-server"))
LLAMA_QUANTIZE = LLAMA / "bin/llama-quantize"
MODELS = Path(os.environ.get("LONE_MODELS", HOME / ".cache/lone/models"))
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
SPEC = HOME / ".cache/lone/spec"
BENCH = Path(os.environ.get("LONE_BENCH_MODELS", HOME / ".cache/lone/bench"))
LONE = Path(os.environ.get("LONE", ROOT / "target/release/lone"))


def configs():
    f16 = SPEC / "SmolLM2-135M-Instruct.F16.gguf"
    return {
        "smollm2-ngram": dict(model=SMOL, lone=["--spec-type", "ngram-simple"],
                              llama=["--spec-type", "ngram-simple"]),
        "smollm2-ngram-cache": dict(model=SMOL, lone=["--spec-type", "ngram-simple,ngram-cache"],
                                    llama=["--spec-type", "ngram-simple,ngram-cache"]),
        "smollm2-ngram-noramp": dict(model=SMOL, lone=["--spec-type", "ngram-simple", "--spec-ramp", "0"],
                                     llama=None),
        "smollm2-f16-draft-q4_1": dict(model=f16, make_f16=True,
                                       lone=["--model-draft", str(SMOL), "--draft-max", "3"],
                                       llama=["-md", str(SMOL), "--spec-type", "draft-simple",
                                              "--spec-draft-n-max", "3"]),
        "lfm2-350m-q4_k_m-ngram": dict(model=BENCH / "LFM2-350M/LFM2-350M-Q4_K_M.gguf",
                                       lone=["--spec-type", "ngram-simple"],
                                       llama=["--spec-type", "ngram-simple"]),
        # Random weights: acceptance is whatever a Q4_0 copy's greedy argmax agrees with (the
        # rejections roll back the hybrid's conv state); the hybrid against the non-hybrid of
        # its size (Llama-350M: LFM2-350M's shape with attention in every layer). `--spec-ramp
        # 0` keeps lone drafting every step (no back-off), as llama-server does: the worst case
        # of rollback.
        **{f"{m.lower()}-q8_0-draft-q4_0": dict(
            model=BENCH / m / f"{m}-Q8_0.gguf",
            lone=["--model-draft", str(BENCH / m / f"{m}-Q4_0.gguf"), "--draft-max", "3",
                  "--spec-ramp", "0"],
            llama=["-md", str(BENCH / m / f"{m}-Q4_0.gguf"), "--spec-type", "draft-simple",
                   "--spec-draft-n-max", "3"]) for m in ("LFM2-350M", "Llama-350M", "LFM2-1.2B")},
        "qwen2.5-0.5b-q4_k_m-ngram": dict(model=BENCH / "Qwen2.5-0.5B/Qwen2.5-0.5B-Q4_K_M.gguf",
                                          lone=["--spec-type", "ngram-simple"],
                                          llama=["--spec-type", "ngram-simple"]),
    }


def post(port, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def wait_ready(port, proc):
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server on {port} exited")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"llama-server on {port} not ready")


def lone_round(cfg, threads, max_tokens):
    cmd = [str(LONE), "bench", "-m", str(cfg["model"]), "--spec-workloads", "--json", "-r", "1",
           "-t", str(threads), "--workload-max-tokens", str(max_tokens)] + cfg["lone"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    recs = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return [r for r in recs if r.get("test", "").startswith("spec:")]


def chart(records, path):
    """Grouped bars: speculative ÷ plain decode rate per (config, workload), lone vs llama.cpp."""
    groups = []
    for r in records:
        k = (r["config"], r["workload"])
        if k not in groups:
            groups.append(k)
    eng = ["lone", "llama.cpp"]
    colors = {"lone": "#2b6cb0", "llama.cpp": "#c05621"}
    val = {}
    for k in groups:
        for e in eng:
            rs = [r for r in records if (r["config"], r["workload"]) == k and r["engine"] == e]
            if rs:
                val[(k, e)] = statistics.mean(r["spec_ts"] for r in rs) / statistics.mean(r["plain_ts"] for r in rs)
    top = max([3.0] + [v for v in val.values()])
    w, h, left, bottom, bw = max(520, 60 + 46 * len(groups)), 330, 50, 120, 18
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">',
           f'<text x="{left}" y="14" font-size="12">speculative ÷ plain decode tok/s (greedy, same GGUF and prompt)</text>']
    y = lambda v: h - bottom - (h - bottom - 30) * v / top
    for t in range(0, int(top) + 1):
        out.append(f'<line x1="{left}" x2="{w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y(t) + 3:.1f}" text-anchor="end">{t}×</text>')
    for i, k in enumerate(groups):
        x0 = left + 8 + 46 * i
        for j, e in enumerate(eng):
            v = val.get((k, e))
            if v is None:
                continue
            x = x0 + j * bw
            out.append(f'<rect x="{x}" y="{y(v):.1f}" width="{bw - 2}" height="{y(0) - y(v):.1f}" fill="{colors[e]}"/>'
                       f'<text x="{x + bw / 2 - 1}" y="{y(v) - 2:.1f}" text-anchor="middle" font-size="8">{v:.2f}</text>')
        out.append(f'<text transform="translate({x0 + 14},{h - bottom + 8}) rotate(60)" font-size="9">'
                   f'{k[0]} · {k[1]}</text>')
    for j, e in enumerate(eng):
        out.append(f'<rect x="{w - 110}" y="{24 + 14 * j}" width="10" height="10" fill="{colors[e]}"/>'
                   f'<text x="{w - 96}" y="{33 + 14 * j}">{e}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "chart":
        # scripts/bench-speculation.py chart OUT.svg RESULTS.json...
        recs = [r for f in sys.argv[3:] for r in json.loads(Path(f).read_text())["records"]]
        chart(recs, sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--config", action="append")
    ap.add_argument("--out", default=str(ROOT / f"docs/perf/spec-{datetime.date.today()}.json"))
    a = ap.parse_args()
    cfgs = configs()
    names = a.config or list(cfgs)
    records = []
    for name in names:
        cfg = cfgs[name]
        if cfg.get("make_f16") and not Path(cfg["model"]).exists():
            SPEC.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(LLAMA_QUANTIZE), "--allow-requantize", str(SMOL), str(cfg["model"]), "F16"],
                           check=True, capture_output=True)
        if not Path(cfg["model"]).exists():
            print(f"skip {name}: no {cfg['model']}", file=sys.stderr)
            continue
        for rnd in range(a.rounds):
            lone_recs = []
            for r in lone_round(cfg, a.threads, a.max_tokens):
                lone_recs.append(dict(engine="lone", config=name, round=rnd, workload=r["test"][5:],
                                      plain_ts=r["plain_decode_ts"], spec_ts=r["spec_decode_ts"],
                                      drafted=r["drafted"], accepted=r["accepted"],
                                      new_tokens=r["new_tokens"], same_output=r["same_output"],
                                      prompt_tokens=r["prompt_tokens"], message=r["message"],
                                      text=r["text"]))
            records += lone_recs
            if cfg["llama"] is not None:
                # One llama-server at a time (an idle one's threads still spin for a while):
                # plain, then speculating, each over every workload.
                res = {}
                for kind, extra in [("plain", []), ("spec", cfg["llama"])]:
                    port = 8391
                    log = open(f"/tmp/bench-spec-{name}-{kind}.log", "w")
                    p = subprocess.Popen([str(LLAMA_SERVER), "-m", str(cfg["model"]), "-t", str(a.threads),
                                          "--port", str(port), "-c", "4096", "-np", "1"] + extra,
                                         stdout=log, stderr=subprocess.STDOUT)
                    try:
                        wait_ready(port, p)
                        for r in lone_recs:
                            body = {"messages": [{"role": "user", "content": r["message"]}], "temperature": 0,
                                    "max_tokens": a.max_tokens, "cache_prompt": False}
                            post(port, {**body, "max_tokens": 4})  # warm-up
                            res[(kind, r["workload"])] = post(port, body)
                    finally:
                        p.terminate()
                        p.wait()
                for r in lone_recs:
                    j0, j1 = res[("plain", r["workload"])], res[("spec", r["workload"])]
                    t0, t1 = j0["timings"], j1["timings"]
                    records.append(dict(engine="llama.cpp", config=name, round=rnd, workload=r["workload"],
                                        plain_ts=t0["predicted_per_second"], spec_ts=t1["predicted_per_second"],
                                        drafted=t1.get("draft_n", 0), accepted=t1.get("draft_n_accepted", 0),
                                        new_tokens=t1["predicted_n"], prompt_tokens=t1["prompt_n"],
                                        same_output=j0["choices"][0]["message"]["content"]
                                        == j1["choices"][0]["message"]["content"],
                                        text=j1["choices"][0]["message"]["content"]))
            print(f"{name}: round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    meta = dict(date=str(datetime.date.today()), threads=a.threads, rounds=a.rounds,
                cpu=open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t")
                if Path("/proc/cpuinfo").exists() else "")
    Path(a.out).write_text(json.dumps(dict(meta=meta, records=records), indent=1))
    chart(records, str(Path(a.out).with_suffix(".svg")))
    print("| config | workload | engine | plain t/s | spec t/s | speedup | accepted/drafted | same output |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    keys = []
    for r in records:
        k = (r["config"], r["workload"], r["engine"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        rs = [r for r in records if (r["config"], r["workload"], r["engine"]) == k]
        p = statistics.mean(r["plain_ts"] for r in rs)
        s = statistics.mean(r["spec_ts"] for r in rs)
        last = rs[-1]
        print(f"| {k[0]} | {k[1]} | {k[2]} | {p:.1f} | {s:.1f} | {s / p:.2f}× | "
              f"{last['accepted']}/{last['drafted']} | {'yes' if all(r['same_output'] for r in rs) else 'no'} |")


if __name__ == "__main__":
    main()
