#!/usr/bin/env python3
"""Bar charts of the results in docs/perf/*.csv, written as docs/perf/*.svg.

    scripts/perf-charts.py [DIR]        (default: docs/perf)

Standard library only. Each CSV named in CHARTS holds one row per bar: the label columns name
a group of bars, the series column picks the bar's colour within its group, and the value
column is its length (a ratio: a vertical line marks 1.0, where both sides are equal). Rows
whose value is empty are skipped. Groups and series keep the order of the file.
"""

import csv
import html
import math
import sys
from pathlib import Path

# CSV stem: (title, label columns, series column, value column)
CHARTS = {
    "xeon-default": ("Intel Xeon, default mode (every row alike): lone ÷ llama.cpp tok/s",
                     ["model", "quant", "test"], "round", "ratio"),
    "zen4-default": ("AMD Zen 4, default mode: lone ÷ llama.cpp tok/s (higher is better)",
                     ["model", "quant", "test"], "family", "ratio"),
    "zen4-fast": ("AMD Zen 4, --fast: lone ÷ llama.cpp tok/s (higher is better)",
                  ["model", "quant", "test"], "family", "ratio"),
    "intel-xeon-decode": ("Intel Xeon, decode tg64, default mode: lone ÷ llama.cpp tok/s",
                          ["model", "quant"], "family", "ratio"),
    "serve": ("lone serve ÷ llama-server, aggregate tok/s by concurrent clients",
              ["machine", "family", "model", "quant"], "clients", "ratio"),
    "speculation": ("SmolLM2-135M Q4_1 on AMD Zen 4: speculative ÷ plain decode tok/s",
                    ["spec_type", "workload"], "engine", "speedup"),
    "aarch64": ("aarch64 under qemu: lone ÷ llama.cpp instructions per token (lower is better)",
                ["class", "model"], "test", "ratio"),
}

COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1"]
LABEL_W, BAR_W, RIGHT = 300, 400, 60   # label column, bar area, room for the values
BAR_H, GROUP_GAP, TOP = 11, 7, 62


def read(path, labels, series, value):
    """[(group label, [(series, value)])] in file order."""
    groups = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if not row[value].strip():
                continue
            label = " ".join(row[c] for c in labels)
            groups.setdefault(label, []).append((row[series], float(row[value])))
    return list(groups.items())


def text(x, y, s, anchor="start", size=11, weight="normal"):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}" '
            f'text-anchor="{anchor}">{html.escape(s)}</text>')


def svg(title, series, groups):
    names = []
    for _, bars in groups:
        names += [s for s, _ in bars if s not in names]
    colour = {s: COLOURS[i % len(COLOURS)] for i, s in enumerate(names)}
    top = max(v for _, bars in groups for _, v in bars)
    xmax = max(1.5, math.ceil(top * 2) / 2)            # ticks every 0.5
    x = lambda v: LABEL_W + v / xmax * BAR_W
    height = TOP + sum(len(b) * (BAR_H + 1) + GROUP_GAP for _, b in groups) + 30
    width = LABEL_W + BAR_W + RIGHT
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           text(10, 20, title, size=13, weight="bold")]
    lx = 10                                             # legend
    for s in names:
        out.append(f'<rect x="{lx}" y="32" width="12" height="12" fill="{colour[s]}"/>')
        name = f"{series} {s}" if s.isdigit() else s     # "clients 8", not "8"
        out.append(text(lx + 16, 42, name))
        lx += 26 + 7 * len(name)
    bottom = height - 30
    for i in range(int(xmax * 2) + 1):                  # grid and axis labels
        v = i / 2
        out.append(f'<line x1="{x(v):.1f}" y1="{TOP - 6}" x2="{x(v):.1f}" y2="{bottom}" '
                   f'stroke="#ddd"/>')
        out.append(text(x(v), bottom + 14, f"{v:g}", anchor="middle", size=10))
    y, words = TOP, []                                  # words go over the 1.0 line
    for label, bars in groups:
        h = len(bars) * (BAR_H + 1)
        words.append(text(LABEL_W - 8, y + h / 2 + 4, label, anchor="end"))
        for s, v in bars:
            out.append(f'<rect x="{LABEL_W}" y="{y:.1f}" width="{x(v) - LABEL_W:.1f}" '
                       f'height="{BAR_H}" fill="{colour[s]}"><title>{html.escape(label)}, '
                       f'{html.escape(s)}: {v:.2f}</title></rect>')
            words.append(text(x(v) + 3, y + BAR_H - 2, f"{v:.2f}", size=9))
            y += BAR_H + 1
        y += GROUP_GAP
    out.append(f'<line x1="{x(1):.1f}" y1="{TOP - 6}" x2="{x(1):.1f}" y2="{bottom}" '
               f'stroke="#c00" stroke-width="1.5"/>')
    out += words + ["</svg>"]
    return "\n".join(out) + "\n"


def main():
    root = Path(__file__).resolve().parent.parent
    d = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "docs/perf"
    for stem, (title, labels, series, value) in CHARTS.items():
        src = d / f"{stem}.csv"
        if not src.exists():
            print(f"skipped {src}: missing", file=sys.stderr)
            continue
        (d / f"{stem}.svg").write_text(svg(title, series, read(src, labels, series, value)))
        print(f"wrote {d / stem}.svg")


if __name__ == "__main__":
    main()
