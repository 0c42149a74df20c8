#!/usr/bin/env python3
"""Collect the raw outputs of scripts/compare-llamacpp.sh into one results JSON, a markdown
table and an SVG chart (hand-written SVG: no matplotlib needed).

    python scripts/perf_report.py collect RAW_DIR OUT.json     # raw lone/llama outputs -> results
    python scripts/perf_report.py table   RESULTS.json         # markdown table on stdout
    python scripts/perf_report.py chart   RESULTS.json OUT.svg # both engines per quant + ceiling

RAW_DIR holds (written by compare-llamacpp.sh):
  machine.json                       lscpu summary, versions, settings
  membw-*.jsonl                      `lone bench --membw --json` (one line each)
  <model>__<quant>.lone.<round>.jsonl   `lone bench --json` (JSON lines)
  <model>__<quant>.llama.<round>.json   `llama-bench -o json` (a JSON array)
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def mean_sd(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def test_name(n_prompt: int, n_gen: int, n_depth: int = 0) -> str:
    name = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}" if n_prompt == 0 else f"pp{n_prompt}+tg{n_gen}"
    return f"{name} @ d{n_depth}" if n_depth else name


def collect(raw: Path, out: Path) -> None:
    machine = json.loads((raw / "machine.json").read_text())
    bw = []
    for f in sorted(raw.glob("membw-*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                bw.append(json.loads(line))
    best_bw = max((b["best_gbs"] for b in bw), default=float("nan"))
    rows: dict[tuple[str, str, str], dict] = {}
    cold: dict[tuple[str, str], list[dict]] = {}
    files: dict[tuple[str, str], dict] = {}

    def row(model: str, quant: str, test: str) -> dict:
        return rows.setdefault((model, quant, test), {"model": model, "quant": quant, "test": test,
                                                      "lone_samples_ts": [], "llama_samples_ts": []})

    for f in sorted(raw.glob("*.lone.*.jsonl")):
        model, quant = f.name.split(".lone.")[0].split("__")
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            files[(model, quant)] = {k: r[k] for k in ("model", "size_bytes", "params", "weight_bytes_per_token",
                                                       "arch", "model_name") if k in r}
            if r["test"] == "cold_start":
                cold.setdefault((model, quant), []).append(r)
            elif "samples_ts" in r:
                x = row(model, quant, r["test"])
                x["lone_samples_ts"] += r["samples_ts"]
                if r.get("wall_s"):
                    x.setdefault("lone_cpu_share", []).append(r["cpu_s"] / r["wall_s"])
                    x.setdefault("loadavg_1m", []).append(r.get("loadavg_1m"))
                x["lone_peak_rss_bytes"] = max(x.get("lone_peak_rss_bytes", 0), r.get("peak_rss_bytes", 0))
    for f in sorted(raw.glob("*.llama.*.json")):
        model, quant = f.name.split(".llama.")[0].split("__")
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError:
            print(f"warning: cannot parse {f}", file=sys.stderr)
            continue
        # CPU share of the whole llama-bench process (from /usr/bin/time, if it ran under it).
        share = None
        err = f.with_suffix(".err")
        if err.exists():
            for line in err.read_text(errors="replace").splitlines():
                if line.startswith("LLAMA_TIME_WALL="):
                    wall, cpu = line.split("=", 1)[1].split(",CPU=")
                    u, sy = cpu.split("+")
                    share = (float(u) + float(sy)) / max(float(wall), 1e-9)
        load = f.with_suffix(".load")
        for r in data:
            x = row(model, quant, test_name(r["n_prompt"], r["n_gen"], r.get("n_depth", 0)))
            if share is not None:
                x.setdefault("llama_process_cpu_share", []).append(share)
            if load.exists():
                x.setdefault("loadavg_1m", []).append(float(load.read_text().split()[0]))
            x["llama_samples_ts"] += r["samples_ts"]
            x["llama_model_type"] = r.get("model_type")
            x["llama_build"] = r.get("build_commit")
    results = []
    for (model, quant, test), x in sorted(rows.items(), key=lambda kv: (kv[0][0], quant_order(kv[0][1]),
                                                                         test_order(kv[0][2]))):
        x["lone_ts"], x["lone_sd"] = mean_sd(x["lone_samples_ts"])
        x["llama_ts"], x["llama_sd"] = mean_sd(x["llama_samples_ts"])
        x["ratio"] = x["lone_ts"] / x["llama_ts"] if x["llama_ts"] else float("nan")
        # Best of the runs: on a shared machine, interference only ever slows a run down, so the
        # fastest run is the best estimate of the engine's own speed.
        x["lone_best_ts"] = max(x["lone_samples_ts"], default=float("nan"))
        x["llama_best_ts"] = max(x["llama_samples_ts"], default=float("nan"))
        x["ratio_best"] = x["lone_best_ts"] / x["llama_best_ts"] if x["llama_samples_ts"] else float("nan")
        info = files.get((model, quant), {})
        x.update({k: info.get(k) for k in ("size_bytes", "params", "weight_bytes_per_token")})
        if test.startswith("tg") and info.get("weight_bytes_per_token"):
            x["ceiling_ts"] = best_bw * 1e9 / info["weight_bytes_per_token"]
        c = cold.get((model, quant))
        if c:
            x["lone_cold_start"] = {k: statistics.fmean(r[k] for r in c)
                                    for k in ("load_s", "tokenizer_s", "first_token_s", "start_to_first_token_s")}
        results.append(x)
    doc = {"machine": machine, "membw": bw, "membw_best_gbs": best_bw, "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=nan_none) + "\n")
    print(f"wrote {out} ({len(results)} rows)")


def nan_none(o):
    return None


QUANTS = ["F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0"]


def quant_order(q: str) -> int:
    return QUANTS.index(q) if q in QUANTS else len(QUANTS)


def test_order(t: str) -> tuple[int, int]:
    base = t.split(" @ ")[0]
    return (0 if base.startswith("pp") else 1, int("".join(c for c in base[2:] if c.isdigit()) or 0))


def fmt(x, nd=2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}"


def table(path: Path) -> None:
    doc = json.loads(path.read_text())
    samples = sorted(x for b in doc["membw"] for x in b["samples_gbs"])
    med = statistics.median(samples) if samples else None
    print(f"Read bandwidth (lone bench --membw, {len(samples)} passes): best {fmt(doc['membw_best_gbs'])} GB/s, "
          f"median {fmt(med)} GB/s. Ceiling = best ÷ weight bytes per token.\n")
    print("| model | quant | size MiB | test | lone t/s | llama.cpp t/s | lone / llama.cpp | best: lone / llama.cpp "
          "| decode ceiling t/s | CPUs used lone / llama.cpp | load avg |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def avg(xs):
        xs = [x for x in xs or [] if x is not None]
        return statistics.fmean(xs) if xs else None

    for r in doc["results"]:
        size = r.get("size_bytes")
        print(f"| {r['model']} | {r['quant']} | {fmt(size / 2**20 if size else None, 0)} | {r['test']} | "
              f"{fmt(r['lone_ts'])} ± {fmt(r['lone_sd'])} | {fmt(r['llama_ts'])} ± {fmt(r['llama_sd'])} | "
              f"{fmt(r['ratio'], 3)} | {fmt(r['lone_best_ts'])} / {fmt(r['llama_best_ts'])} = "
              f"{fmt(r['ratio_best'], 3)} | {fmt(r.get('ceiling_ts'), 1)} | "
              f"{fmt(avg(r.get('lone_cpu_share')), 1)} / {fmt(avg(r.get('llama_process_cpu_share')), 1)} | "
              f"{fmt(avg(r.get('loadavg_1m')), 1)} |")
    cold = [r for r in doc["results"] if r.get("lone_cold_start") and r["test"].startswith("tg")]
    if cold:
        print("\nlone cold start (page cache warm: the file was just read by the previous run):\n")
        print("| model | quant | weights ready s | tokenizer s | first token s | start → first token s |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for r in cold:
            c = r["lone_cold_start"]
            print(f"| {r['model']} | {r['quant']} | {fmt(c['load_s'], 3)} | {fmt(c['tokenizer_s'], 3)} | "
                  f"{fmt(c['first_token_s'], 3)} | {fmt(c['start_to_first_token_s'], 3)} |")


# ---------------------------------------------------------------------------------------------
# SVG chart
# ---------------------------------------------------------------------------------------------

LONE_C, LLAMA_C, CEIL_C = "#d95f02", "#1b9e77", "#7570b3"


def esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chart(path: Path, out: Path) -> None:
    doc = json.loads(path.read_text())
    res = doc["results"]
    models = sorted({r["model"] for r in res})
    tests = sorted({r["test"] for r in res}, key=test_order)
    # Panels: one row per test, one column per model.
    pw, ph, ml, mt, gap = 360, 230, 60, 40, 30
    W = ml + len(models) * (pw + gap) + 10
    H = mt + len(tests) * (ph + 70) + 40
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
         f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
         f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14" font-weight="bold">'
         f'lone vs llama.cpp, tokens/s (log scale), {esc(doc["machine"].get("cpu", ""))}, '
         f'{doc["machine"].get("threads", "?")} threads</text>']
    # legend
    lx = ml
    for label, color, dash in (("lone", LONE_C, None), ("llama.cpp", LLAMA_C, None),
                               (f"decode ceiling ({fmt(doc['membw_best_gbs'], 1)} GB/s ÷ bytes/token)", CEIL_C, "4,3")):
        if dash:
            s.append(f'<line x1="{lx}" y1="30" x2="{lx + 18}" y2="30" stroke="{color}" stroke-width="2" '
                     f'stroke-dasharray="{dash}"/>')
        else:
            s.append(f'<rect x="{lx}" y="24" width="14" height="11" fill="{color}"/>')
        s.append(f'<text x="{lx + 22}" y="34">{esc(label)}</text>')
        lx += 30 + 7 * len(label)
    for ti, test in enumerate(tests):
        for mi, model in enumerate(models):
            rows = sorted([r for r in res if r["model"] == model and r["test"] == test],
                          key=lambda r: quant_order(r["quant"]))
            x0, y0 = ml + mi * (pw + gap), mt + 20 + ti * (ph + 70)
            vals = [v for r in rows for v in (r["lone_ts"], r["llama_ts"], r.get("ceiling_ts")) if v and v > 0]
            if not vals:
                continue
            lo = 10 ** math.floor(math.log10(min(vals)))
            hi = 10 ** math.ceil(math.log10(max(vals) * 1.05))

            def y(v: float) -> float:
                return y0 + ph - (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * ph

            s.append(f'<text x="{x0 + pw / 2}" y="{y0 - 6}" text-anchor="middle" font-weight="bold">'
                     f'{esc(model)} — {esc(test)}</text>')
            s.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
            d = lo
            while d <= hi * 1.0001:
                s.append(f'<line x1="{x0}" y1="{y(d):.1f}" x2="{x0 + pw}" y2="{y(d):.1f}" stroke="#ddd"/>')
                s.append(f'<text x="{x0 - 4}" y="{y(d) + 4:.1f}" text-anchor="end">{d:g}</text>')
                d *= 10
            n = max(len(rows), 1)
            cw = pw / n
            for qi, r in enumerate(rows):
                cx = x0 + qi * cw
                bw = cw * 0.32
                for bi, (v, color) in enumerate(((r["lone_ts"], LONE_C), (r["llama_ts"], LLAMA_C))):
                    if not v or v <= 0 or math.isnan(v):
                        continue
                    bx = cx + cw * 0.15 + bi * (bw + 2)
                    s.append(f'<rect x="{bx:.1f}" y="{y(v):.1f}" width="{bw:.1f}" height="{y0 + ph - y(v):.1f}" '
                             f'fill="{color}"><title>{esc(r["quant"])} {"lone" if bi == 0 else "llama.cpp"}: '
                             f'{v:.2f} t/s</title></rect>')
                    s.append(f'<text x="{bx + bw / 2:.1f}" y="{y(v) - 3:.1f}" text-anchor="middle" '
                             f'font-size="9">{v:.3g}</text>')
                c = r.get("ceiling_ts")
                if c:
                    s.append(f'<line x1="{cx + 4:.1f}" y1="{y(c):.1f}" x2="{cx + cw - 4:.1f}" y2="{y(c):.1f}" '
                             f'stroke="{CEIL_C}" stroke-width="2" stroke-dasharray="4,3"/>')
                    s.append(f'<text x="{cx + cw / 2:.1f}" y="{y(c) - 3:.1f}" text-anchor="middle" font-size="9" '
                             f'fill="{CEIL_C}">{c:.3g}</text>')
                s.append(f'<text x="{cx + cw / 2:.1f}" y="{y0 + ph + 14}" text-anchor="middle">'
                         f'{esc(r["quant"])}</text>')
                if r.get("ratio") and not math.isnan(r["ratio"]):
                    s.append(f'<text x="{cx + cw / 2:.1f}" y="{y0 + ph + 27}" text-anchor="middle" '
                             f'font-size="9" fill="#555">×{r["ratio"]:.2f}</text>')
    s.append(f'<text x="{ml}" y="{H - 10}" fill="#555">×r = lone ÷ llama.cpp. Same GGUF file, same threads, '
             f'runs interleaved. {esc(doc["machine"].get("date", ""))}</text>')
    s.append("</svg>")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(s) + "\n")
    print(f"wrote {out}")


def main() -> None:
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "collect":
        collect(Path(a[1]), Path(a[2]))
    elif len(a) == 2 and a[0] == "table":
        table(Path(a[1]))
    elif len(a) == 3 and a[0] == "chart":
        chart(Path(a[1]), Path(a[2]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
