#!/usr/bin/env python3
"""Record what llama-quantize writes for the fixture checkpoints, so that `lone convert` can be
checked against it without llama.cpp installed.

For every fixture family converted by llama.cpp's convert_hf_to_gguf.py (the committed
`tests/reference/fixtures/<name>/model-f32.gguf`) and every file type below, this runs
`llama-quantize model-f32.gguf OUT TYPE` and records OUT's size, sha256 and per-tensor types
in `llama-quantize.json`. crates/lone/tests/convert.rs converts the same inputs (the GGUF, and
the HF checkpoint directly) and compares.

    python3 tests/reference/convert/generate.py [--llama-quantize PATH]

Default llama-quantize: ~/.cache/llama.cpp-0c1e570/bin/llama-quantize (built by
../shared/scripts/build-llama-cpp.sh). gguf-py (from the same llama.cpp checkout) reads the
tensor types.
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
FAMILIES = ["lfm2_a", "lfm2_b", "qwen2", "qwen3", "llama"]
TYPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
         "Q4_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "F16", "BF16"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-quantize", type=Path,
                    default=Path.home() / ".cache/llama.cpp-0c1e570/bin/llama-quantize")
    args = ap.parse_args()
    src = args.llama_quantize.resolve().parent.parent / "src"
    sys.path.insert(0, str(src / "gguf-py"))
    from gguf import GGUFReader

    out = {"tool": "llama-quantize (llama.cpp 0c1e570)", "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES:
            inp = FIXTURES / fam / "model-f32.gguf"
            for t in TYPES:
                dst = Path(tmp) / f"{fam}-{t}.gguf"
                r = subprocess.run([str(args.llama_quantize), str(inp), str(dst), t],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"{fam} {t}: llama-quantize failed:\n{r.stderr[-2000:]}")
                data = dst.read_bytes()
                reader = GGUFReader(str(dst))
                out["cases"].append({
                    "family": fam,
                    "type": t,
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "tensor_types": {x.name: x.tensor_type.name for x in reader.tensors},
                })
                print(f"{fam} {t}: {len(data)} bytes", file=sys.stderr)
    (HERE / "llama-quantize.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
