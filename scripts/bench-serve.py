#!/usr/bin/env python3
"""Aggregate generation throughput of OpenAI-compatible servers under concurrent streaming load.

    python scripts/bench-serve.py --server NAME PORT 'COMMAND …' [--server NAME PORT 'COMMAND …'] \
        [--concurrency 1,2,4,8] [--reps 2] [--max-tokens 64] [--json OUT.json] [--log-dir DIR]

Standard library only (http.client + threading). Every server is started from its command line
(split with shlex, run without a shell, stdout/stderr to --log-dir), waited for on
`GET http://127.0.0.1:PORT/health` (200), warmed up with one short request, and stopped
(SIGTERM, then SIGKILL) at the end. Then, for each concurrency level C and each repetition, each
server in turn (the order alternates between repetitions: A B, then B A, so a drift in the
machine's load does not favour one of them) gets C threads that each send one streaming
`POST /v1/chat/completions` at the same moment (a barrier) with

    {"messages": [{"role": "user", "content": <a short prompt, distinct per request>}],
     "max_tokens": N, "temperature": 0, "ignore_eos": true, "stream": true,
     "stream_options": {"include_usage": true}}

and reads the SSE stream to `data: [DONE]`. Per run:
  aggregate tok/s     sum of generated tokens / (last [DONE] - first send)
  TTFT                send -> first chunk carrying content (mean over the C requests)
  per-client decode   (tokens - 1) / (last content chunk - first content chunk), mean over requests
  server CPU          utime+stime of the server process during the run / wall (in CPUs); the
                      same for the other (idle) servers is recorded as idle_servers_cpus
Generated tokens are the usage chunk's completion_tokens (content chunks counted as a fallback);
a request that did not generate exactly N tokens is reported (`short`) and makes the exit status 1.
Each (server, C) keeps the best and the mean of its repetitions. Prompts differ per request
(a serial number up front) so no request finds its whole prompt in a slot's prefix cache.

The markdown table goes to stdout (with two servers: the first's rate over the second's), the JSON
(settings, machine, every request) to --json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

TOPICS = [
    "the ocean", "a lighthouse", "autumn leaves", "a small robot", "mountain trains", "the moon",
    "a quiet library", "city rain", "bees", "an old clock", "desert stars", "a paper boat",
]


def prompt(serial: int) -> str:
    return f"#{serial}. Write a short story about {TOPICS[serial % len(TOPICS)]}."


class Server:
    def __init__(self, name: str, port: int, cmd: str, log_dir: Path):
        self.name, self.port, self.cmd = name, port, cmd
        self.argv = shlex.split(cmd)
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.load_s = float("nan")

    def start(self, timeout: float) -> None:
        log = open(self.log_path, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name}: server exited with {self.proc.returncode} (see {self.log_path})")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    break
            except OSError:
                pass
            if time.perf_counter() - t0 > timeout:
                self.stop()
                raise SystemExit(f"{self.name}: /health not 200 after {timeout:.0f} s (see {self.log_path})")
            time.sleep(0.2)
        self.load_s = time.perf_counter() - t0

    def cpu_seconds(self) -> float:
        """utime + stime of the server process (all its threads) from /proc."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError, AttributeError):
            return float("nan")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stream_request(port: int, body: dict, barrier: threading.Barrier | None, timeout: float) -> dict:
    """One streaming chat completion; returns timings (perf_counter seconds) and token counts."""
    out = {"ok": False, "error": None, "content_chunks": 0, "usage": None, "finish_reason": None,
           "t_send": None, "t_first": None, "t_last_content": None, "t_done": None, "timings": None}
    data = json.dumps(body).encode()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.connect()
        if barrier is not None:
            barrier.wait()
        out["t_send"] = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=data,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return out
        while True:
            line = resp.readline()
            if not line:
                out["error"] = "stream ended without [DONE]"
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            now = time.perf_counter()
            if payload == b"[DONE]":
                out["t_done"] = now
                out["ok"] = True
                break
            chunk = json.loads(payload)
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            if chunk.get("timings"):
                out["timings"] = chunk["timings"]
            for ch in chunk.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    out["content_chunks"] += 1
                    if out["t_first"] is None:
                        out["t_first"] = now
                    out["t_last_content"] = now
                if ch.get("finish_reason"):
                    out["finish_reason"] = ch["finish_reason"]
        conn.close()
    except Exception as e:  # noqa: BLE001 - reported per request
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def run_level(srv: Server, others: list[Server], c: int, serial0: int, max_tokens: int, timeout: float) -> dict:
    barrier = threading.Barrier(c)
    results: list[dict | None] = [None] * c
    bodies = [{
        "messages": [{"role": "user", "content": prompt(serial0 + i)}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    } for i in range(c)]

    def work(i: int) -> None:
        results[i] = stream_request(srv.port, bodies[i], barrier, timeout)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(c)]
    cpu0, load0 = srv.cpu_seconds(), os.getloadavg()[0]
    other0 = sum(o.cpu_seconds() for o in others)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = srv.cpu_seconds()
    other1 = sum(o.cpu_seconds() for o in others)
    reqs = []
    for i, r in enumerate(results):
        usage = r["usage"] or {}
        toks = usage.get("completion_tokens", r["content_chunks"])
        ttft = (r["t_first"] - r["t_send"]) if r["t_first"] and r["t_send"] else None
        dec = None
        if r["t_first"] and r["t_last_content"] and r["t_last_content"] > r["t_first"] and toks > 1:
            dec = (toks - 1) / (r["t_last_content"] - r["t_first"])
        reqs.append({"prompt": bodies[i]["messages"][0]["content"], "ok": r["ok"], "error": r["error"],
                     "completion_tokens": toks, "usage": r["usage"], "content_chunks": r["content_chunks"],
                     "finish_reason": r["finish_reason"], "ttft_s": ttft, "decode_tps": dec,
                     "latency_s": (r["t_done"] - r["t_send"]) if r["t_done"] and r["t_send"] else None,
                     "server_timings": r["timings"]})
    sends = [r["t_send"] for r in results if r["t_send"]]
    dones = [r["t_done"] for r in results if r["t_done"]]
    wall = (max(dones) - min(sends)) if sends and dones else float("nan")
    total = sum(q["completion_tokens"] for q in reqs if q["ok"])
    ttfts = [q["ttft_s"] for q in reqs if q["ttft_s"] is not None]
    decs = [q["decode_tps"] for q in reqs if q["decode_tps"] is not None]
    short = [q for q in reqs if not q["ok"] or q["completion_tokens"] != max_tokens]
    return {"server": srv.name, "concurrency": c, "wall_s": wall, "generated_tokens": total,
            "aggregate_tps": total / wall if wall == wall and wall > 0 else float("nan"),
            "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
            "ttft_max_s": max(ttfts) if ttfts else float("nan"),
            "client_decode_tps_mean": statistics.fmean(decs) if decs else float("nan"),
            "server_cpus": (cpu1 - cpu0) / wall if wall == wall and wall > 0 else float("nan"),
            "idle_servers_cpus": (other1 - other0) / wall if wall == wall and wall > 0 else float("nan"),
            "loadavg_1m_before": load0, "short": len(short), "requests": reqs}


def machine() -> dict:
    info = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Hypervisor vendor", "L3 cache"):
                info[k.strip()] = v.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def fmt(x: float, nd: int = 1) -> str:
    return "–" if x != x else f"{x:.{nd}f}"


def table(summary: dict, names: list[str], levels: list[int]) -> str:
    two = len(names) == 2
    head = ["C"]
    for n in names:
        head += [f"{n} tok/s best (mean)"]
    if two:
        head += [f"{names[0]} / {names[1]}"]
    for n in names:
        head += [f"TTFT {n} s"]
    for n in names:
        head += [f"per-client decode {n} tok/s"]
    for n in names:
        head += [f"CPUs {n}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in levels:
        row = [str(c)]
        s = {n: summary[n][str(c)] for n in names}
        for n in names:
            row.append(f"{fmt(s[n]['aggregate_tps_best'])} ({fmt(s[n]['aggregate_tps_mean'])})")
        if two:
            a, b = s[names[0]]["aggregate_tps_best"], s[names[1]]["aggregate_tps_best"]
            row.append(f"**{a / b:.2f}**" if b and b == b and a == a else "–")
        for n in names:
            row.append(fmt(s[n]["ttft_mean_s"], 2))
        for n in names:
            row.append(fmt(s[n]["client_decode_tps_mean"]))
        for n in names:
            row.append(fmt(s[n]["server_cpus"], 2))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", nargs=3, action="append", metavar=("NAME", "PORT", "COMMAND"), required=True)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/bench-serve-logs"))
    ap.add_argument("--load-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    servers = [Server(n, int(p), cmd, args.log_dir) for n, p, cmd in args.server]
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise SystemExit("server names must differ")

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    runs: list[dict] = []
    t_start = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        for s in servers:
            s.start(args.load_timeout)
            log(f"{s.name}: ready in {s.load_s:.1f} s (pid {s.proc.pid})")
            if not args.no_warmup:
                w = stream_request(s.port, {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
                                            "temperature": 0, "ignore_eos": True, "stream": True,
                                            "stream_options": {"include_usage": True}}, None, args.request_timeout)
                if not w["ok"]:
                    raise SystemExit(f"{s.name}: warm-up request failed: {w['error']}")
        serial = 0
        for c in levels:
            for rep in range(args.reps):
                order = servers if rep % 2 == 0 else servers[::-1]
                for s in order:
                    r = run_level(s, [o for o in servers if o is not s], c, serial, args.max_tokens, args.request_timeout)
                    serial += c
                    r["rep"] = rep
                    runs.append(r)
                    log(f"{s.name} C={c} rep {rep + 1}: {r['generated_tokens']} tok in {r['wall_s']:.2f} s = "
                        f"{r['aggregate_tps']:.2f} tok/s, TTFT {r['ttft_mean_s']:.2f} s, per-client "
                        f"{r['client_decode_tps_mean']:.2f} tok/s, {r['server_cpus']:.2f} CPUs (idle other: "
                        f"{r['idle_servers_cpus']:.2f})"
                        + (f", {r['short']} SHORT/FAILED" if r["short"] else ""))
                    for q in r["requests"]:
                        if q["error"]:
                            log(f"  error: {q['error']}")
    finally:
        for s in servers:
            s.stop()

    summary: dict = {}
    for s in servers:
        summary[s.name] = {}
        for c in levels:
            rs = [r for r in runs if r["server"] == s.name and r["concurrency"] == c]
            tps = [r["aggregate_tps"] for r in rs]
            summary[s.name][str(c)] = {
                "aggregate_tps_best": max(tps), "aggregate_tps_mean": statistics.fmean(tps),
                "aggregate_tps_runs": tps,
                "ttft_mean_s": statistics.fmean(r["ttft_mean_s"] for r in rs),
                "client_decode_tps_mean": statistics.fmean(r["client_decode_tps_mean"] for r in rs),
                "server_cpus": statistics.fmean(r["server_cpus"] for r in rs),
                "idle_servers_cpus": statistics.fmean(r["idle_servers_cpus"] for r in rs),
                "short": sum(r["short"] for r in rs),
            }
    md = table(summary, names, levels)
    print(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "started": t_start, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
            "settings": {"concurrency": levels, "reps": args.reps, "max_tokens": args.max_tokens,
                         "temperature": 0, "ignore_eos": True, "prompt_example": prompt(0),
                         "order": "servers alternate per repetition (A B, then B A)"},
            "servers": [{"name": s.name, "port": s.port, "command": s.cmd, "load_s": s.load_s} for s in servers],
            "summary": summary, "table_md": md, "runs": runs,
        }, indent=1, default=str) + "\n")
        log(f"wrote {args.json}")
    bad = sum(r["short"] for r in runs)
    if bad:
        log(f"{bad} request(s) did not generate exactly {args.max_tokens} tokens")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
