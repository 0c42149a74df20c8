#!/usr/bin/env python3
"""The quantization quality table (docs/quantization.md): for each type, with and without an
importance matrix, and for `--target-bpw`, lone's file beside llama-quantize's file of the
same type from the same source, measured against the source with `lone perplexity
--kl-divergence` (mean logits cosine, mean KL divergence, same top token, perplexity ratio) on
an evaluation text that is not the calibration text.

    python3 scripts/quant_quality.py NAME SOURCE.gguf OUTDIR [--types T,T,...] [--bpw 4.5,5.5]

SOURCE is an F32/F16/BF16 GGUF. Calibration text: the LFM license
(tests/reference/tokenizer/assets/lfm2/LICENSE.lfm1.0.txt); evaluation text: CPython's
LICENSE.txt ($EVAL_TEXT, default /usr/lib/python3.11/LICENSE.txt). lone's imatrix comes from
`lone imatrix`, llama.cpp's from `llama-imatrix` (both -c 256 on the calibration text).
Writes OUTDIR/NAME.jsonl (one row per file) and prints a markdown table.
"""

import argparse
import hashlib
import json
import re
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONE = Path(os.environ.get("LONE_BIN", ROOT / "target" / "release" / "lone"))
LLAMA = Path.home() / ".cache/llama.cpp-0c1e570"
QUANTIZE = LLAMA / "bin" / "llama-quantize"
IMATRIX = LLAMA / "build" / "bin" / "llama-imatrix"
# A build without AMX where the guest has no AMX state (LLAMA_CPU=avx2's, say).
PERPLEXITY = Path(os.environ.get("LLAMA_PERPLEXITY", LLAMA / "build" / "bin" / "llama-perplexity"))
CALIB = ROOT / "tests/reference/tokenizer/assets/lfm2/LICENSE.lfm1.0.txt"
EVAL = Path(os.environ.get("EVAL_TEXT", "/usr/lib/python3.11/LICENSE.txt"))
TYPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_0", "Q3_K_M", "Q2_K"]
# The i-quant mixes llama-quantize makes only with an importance matrix.
NEEDS_IMATRIX = {"IQ3_XS", "IQ3_XXS", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S"}


def run(*args, cwd=None):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, errors="replace", cwd=cwd)
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed:\n{r.stderr[-3000:]}")
    return r


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def measure(path: Path, source: Path, params: int) -> dict:
    r = run(LONE, "perplexity", "-m", path, "-r", source, "--kl-divergence", "-f", EVAL,
            "-c", "256", "--json")
    m = json.loads(r.stdout)
    size = path.stat().st_size
    return {"bytes": size, "bpw": size * 8 / params, "cos": m["cos_mean"], "kld": m["kld_mean"],
            "same_top": m["same_top"], "ppl_ratio": m["ppl_ratio"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--bpw", default="4.5,5.5")
    # llama-quantize's files alone (with llama-imatrix's matrix), measured by lone, and their
    # perplexity by llama-perplexity beside lone's.
    ap.add_argument("--read-only", default="")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    src = a.source.resolve()
    params = json.loads(run(LONE, "inspect", src, "--json", "--no-tensors").stdout)["params"]
    rows = []
    # --types '' (only the --target-bpw rows) adds to an earlier run's rows.
    jl = (a.out / f"{a.name}.jsonl").open("w" if a.types else "a")

    def emit(row):
        rows.append(row)
        jl.write(json.dumps(row) + "\n")
        jl.flush()
        print(json.dumps(row), file=sys.stderr)

    # The two importance matrices, each written into OUTDIR under a bare name (the name is
    # recorded in the quantized files, so lone and llama-quantize must be given the same).
    run(LONE, "imatrix", "-m", src, "-f", CALIB, "-o", "lone.imatrix.gguf", "-c", "256",
        cwd=a.out)
    if IMATRIX.exists():
        run(IMATRIX, "-m", src, "-f", CALIB, "-o", "llama.imatrix.gguf", "-c", "256",
            "--no-ppl", "-t", "2", cwd=a.out)
    for t in [x for x in a.types.split(",") if x]:
        for im in [None, "lone.imatrix.gguf", "llama.imatrix.gguf"]:
            if im == "llama.imatrix.gguf" and (
                    t not in ("Q4_K_M", "Q3_K_M", "Q2_K", "Q4_0") or not IMATRIX.exists()):
                continue
            if im is None and t in NEEDS_IMATRIX:
                continue
            tag = {None: "", "lone.imatrix.gguf": "-imat", "llama.imatrix.gguf": "-llimat"}[im]
            lone_f = a.out / f"lone-{t}{tag}.gguf"
            ll_f = a.out / f"llama-{t}{tag}.gguf"
            extra = ["--imatrix", im] if im else []
            run(LONE, "convert", src, "-o", lone_f.name, "-t", t, "--force", *extra, cwd=a.out)
            run(QUANTIZE, *extra, src, ll_f.name, t, cwd=a.out)
            row = {"model": a.name, "type": t, "imatrix": im or "none",
                   "identical_to_llama_quantize": sha(lone_f) == sha(ll_f)}
            row.update(measure(lone_f, src, params))
            if t.startswith(("IQ", "TQ")):
                # The check: lone's perplexity of the file beside llama-perplexity's.
                row["lone_ppl"] = json.loads(run(LONE, "perplexity", "-m", lone_f, "-f", EVAL,
                                                 "-c", "256", "--json").stdout)["ppl"]
                r = run(PERPLEXITY, "-m", lone_f, "-f", EVAL, "-c", "256", "-t", "2")
                row["llama_ppl"] = float(re.search(r"Final estimate: PPL = ([0-9.]+)",
                                                   r.stdout + r.stderr).group(1))
            if not row["identical_to_llama_quantize"]:
                row["llama"] = measure(ll_f, src, params)
            emit(row)
            ll_f.unlink()
            lone_f.unlink()
    for t in [x for x in a.read_only.split(",") if x]:
        f = a.out / f"llama-{t}.gguf"
        run(QUANTIZE, "--imatrix", "llama.imatrix.gguf", src, f.name, t, cwd=a.out)
        row = {"model": a.name, "type": t, "imatrix": "llama.imatrix.gguf", "read_only": True}
        row.update(measure(f, src, params))
        row["lone_ppl"] = json.loads(run(LONE, "perplexity", "-m", f, "-f", EVAL, "-c", "256",
                                         "--json").stdout)["ppl"]
        r = run(PERPLEXITY, "-m", f, "-f", EVAL, "-c", "256", "-t", "2")
        row["llama_ppl"] = float(re.search(r"Final estimate: PPL = ([0-9.]+)",
                                           r.stdout + r.stderr).group(1))
        emit(row)
        f.unlink()
    for b in [x for x in a.bpw.split(",") if x]:
        f = a.out / f"lone-bpw{b}.gguf"
        r = run(LONE, "convert", src, "-o", f.name, "--target-bpw", b, "--calibration", CALIB,
                "--imatrix", "lone.imatrix.gguf", "--sensitivity", "sensitivity.json", "--force",
                cwd=a.out)
        row = {"model": a.name, "type": f"target-bpw {b}", "imatrix": "lone.imatrix.gguf",
               "search": [line for line in r.stderr.splitlines() if line.startswith("target ")][-1:]}
        row.update(measure(f, src, params))
        emit(row)
        f.unlink()
    print(f"| {a.name} | bpw | MiB | cos | KL | top-1 | PPL ratio | = llama-quantize |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        im = {"none": "", "lone.imatrix.gguf": " + imatrix", "llama.imatrix.gguf":
              " + llama-imatrix"}[r["imatrix"]]
        if r.get("read_only"):
            print(f"| {r['type']} (llama-quantize) + llama-imatrix | {r['bpw']:.2f} | "
                  f"{r['bytes'] / 2**20:.1f} | {r['cos']:.5f} | {r['kld']:.5f} | "
                  f"{100 * r['same_top']:.1f} % | {r['ppl_ratio']:.4f} | PPL lone "
                  f"{r['lone_ppl']:.4f}, llama-perplexity {r['llama_ppl']:.4f} |")
            continue
        same = r.get("identical_to_llama_quantize")
        ppl = ""
        if "lone_ppl" in r:
            d = 100 * (r["lone_ppl"] / r["llama_ppl"] - 1)
            ppl = f" {r['lone_ppl']:.3f} / {r['llama_ppl']:.3f} ({d:+.2f} %) |"
        print(f"| {r['type']}{im} | {r['bpw']:.2f} | {r['bytes'] / 2**20:.1f} | {r['cos']:.5f} | "
              f"{r['kld']:.5f} | {100 * r['same_top']:.1f} % | {r['ppl_ratio']:.4f} | "
              f"{'identical' if same else ('—' if same is None else 'differs')} |{ppl}")


if __name__ == "__main__":
    main()
