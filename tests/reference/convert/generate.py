#!/usr/bin/env python3
"""Record what llama-quantize writes for the fixture checkpoints, so that `lone convert` can be
checked against it without llama.cpp installed.

For every fixture family converted by llama.cpp's convert_hf_to_gguf.py (the committed
`tests/reference/fixtures/<name>/model-f32.gguf`) and every file type below, this runs
`llama-quantize model-f32.gguf OUT TYPE` and records OUT's size, sha256 and per-tensor types
in `llama-quantize.json`. crates/lone/tests/convert.rs converts the same inputs (the GGUF, and
the HF checkpoint directly) and compares.

Importance matrices: `llama-imatrix` over the LFM license text (`-c 128 --chunks 8`) of the
llama, lfm2_a and lfm2_moe fixtures writes `<name>.imatrix.gguf` (and `<name>.imatrix.dat`, the legacy
format) here, committed; llama-quantize then runs with `--imatrix <file>` (from this
directory, so the file name it records is the bare name) for IMATRIX_TYPES, recorded in the
same JSON with `"imatrix": <file>`.

    python3 tests/reference/convert/generate.py [--llama-quantize PATH]

Default llama-quantize: ~/.cache/llama.cpp-0c1e570/bin/llama-quantize, llama-imatrix next to
it or in ../build/bin (built by ../shared/scripts/build-llama-cpp.sh; llama-imatrix with
`cmake --build build --target llama-imatrix`). gguf-py (from the same llama.cpp checkout)
reads the tensor types.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
FAMILIES = ["lfm2_a", "lfm2_b", "qwen2", "qwen3", "llama", "lfm2_moe"]
IMATRIX_FAMILIES = ["llama", "lfm2_a", "lfm2_moe"]
IMATRIX_TYPES = ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "Q4_0", "Q4_1",
                 "Q5_0", "Q5_1"]
TEXT = HERE.parent / "tokenizer" / "assets" / "lfm2" / "LICENSE.lfm1.0.txt"
# The i-quant and ternary mixes, without an importance matrix for every family (llama-quantize
# refuses those that need one: recorded as an "error" case) and with one for IMATRIX_FAMILIES.
# `--iquants` (re)records only these, keeping the other cases and the committed imatrix files.
IQ_TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_M", "IQ3_S", "IQ3_XS", "IQ3_XXS", "IQ2_M", "IQ2_S",
            "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S", "TQ2_0", "TQ1_0"]
TYPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
         "Q4_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "F16", "BF16"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-quantize", type=Path,
                    default=Path.home() / ".cache/llama.cpp-0c1e570/bin/llama-quantize")
    ap.add_argument("--iquants", action="store_true",
                    help="only (re)record the IQ_TYPES cases, with the committed imatrix files")
    args = ap.parse_args()
    src = args.llama_quantize.resolve().parent.parent / "src"
    sys.path.insert(0, str(src / "gguf-py"))
    from gguf import GGUFReader

    out = {"tool": "llama-quantize (llama.cpp 0c1e570)", "cases": []}
    bindir = args.llama_quantize.resolve().parent
    imatrix_bin = next((p for p in [bindir / "llama-imatrix", bindir.parent / "build/bin/llama-imatrix"]
                        if p.exists()), None)

    def record(fam, t, dst, imatrix=None):
        data = dst.read_bytes()
        reader = GGUFReader(str(dst))
        case = {"family": fam, "type": t, "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "tensor_types": {x.name: x.tensor_type.name for x in reader.tensors}}
        if imatrix:
            case["imatrix"] = imatrix
        out["cases"].append(case)
        print(f"{fam} {t} {imatrix or ''}: {len(data)} bytes", file=sys.stderr)

    if args.iquants:
        old = json.loads((HERE / "llama-quantize.json").read_text())
        out["cases"] = [c for c in old["cases"] if c["type"] not in IQ_TYPES]
        with tempfile.TemporaryDirectory() as tmp:
            for fam in FAMILIES:
                inp = FIXTURES / fam / "model-f32.gguf"
                for imatrix in [None, f"{fam}.imatrix.gguf"] if fam in IMATRIX_FAMILIES else [None]:
                    for t in IQ_TYPES:
                        dst = Path(tmp) / f"{fam}-{t}.gguf"
                        cmd = [str(args.llama_quantize)] + (["--imatrix", imatrix] if imatrix else [])
                        r = subprocess.run(cmd + [str(inp), str(dst), t], cwd=HERE,
                                           capture_output=True, text=True)
                        if r.returncode == 0:
                            record(fam, t, dst, imatrix)
                            continue
                        why = [l for l in r.stderr.splitlines() if "imatrix" in l or "importance" in l]
                        if not why:
                            sys.exit(f"{fam} {t}: llama-quantize failed:\n{r.stderr[-2000:]}")
                        case = {"family": fam, "type": t, "error": why[-1].strip()}
                        if imatrix:
                            case["imatrix"] = imatrix
                        out["cases"].append(case)
                        print(f"{fam} {t} {imatrix or ''}: refused ({why[-1].strip()})", file=sys.stderr)
        (HERE / "llama-quantize.json").write_text(json.dumps(out, indent=1) + "\n")
        return

    with tempfile.TemporaryDirectory() as tmp:
        for fam in IMATRIX_FAMILIES:
            inp = FIXTURES / fam / "model-f32.gguf"
            for fmt in ["gguf", "dat"]:
                name = f"{fam}.imatrix.{fmt}"
                subprocess.run([str(imatrix_bin), "-m", str(inp), "-f", str(TEXT), "-o", name,
                                "-c", "128", "--chunks", "8", "-t", "2", "--no-ppl",
                                "--output-format", fmt],
                               cwd=HERE, check=True, capture_output=True)
            for t in IMATRIX_TYPES:
                for fmt in ["gguf", "dat"] if t == "Q4_K_M" else ["gguf"]:
                    name = f"{fam}.imatrix.{fmt}"
                    dst = Path(tmp) / f"{fam}-{t}-imatrix.gguf"
                    subprocess.run([str(args.llama_quantize), "--imatrix", name, str(inp),
                                    str(dst), t], cwd=HERE, check=True, capture_output=True)
                    record(fam, t, dst, name)
        for fam in FAMILIES:
            inp = FIXTURES / fam / "model-f32.gguf"
            for t in TYPES:
                dst = Path(tmp) / f"{fam}-{t}.gguf"
                r = subprocess.run([str(args.llama_quantize), str(inp), str(dst), t],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"{fam} {t}: llama-quantize failed:\n{r.stderr[-2000:]}")
                record(fam, t, dst)
    (HERE / "llama-quantize.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
