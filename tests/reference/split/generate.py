#!/usr/bin/env python3
"""Record what llama.cpp's llama-gguf-split writes, so that `lone gguf-split` and
`lone convert --split-max-*` can be checked against it without llama.cpp installed.

Cases (sha256 and size of every part, in `llama-gguf-split.json`):
- the llama fixture's converter output (`tests/reference/fixtures/llama/model-f32.gguf`) split
  by `--split-max-tensors 5`, and by `--split-max-tensors 7 --no-tensor-first-split`;
- llama-quantize's Q4_K_M of the lfm2_a fixture, split by `--split-max-tensors 9` (what
  `lone convert … -t Q4_K_M --split-max-tensors 9` must write);
- the default model (SmolLM2-135M-Instruct Q4_1, scripts/fetch-default-model.sh) split by
  `--split-max-size 40M`, and those parts merged back with `--merge`;
- `llama-quantize --keep-split` (in `keep_split`): the two llama-f32 splits above requantized
  to Q4_K_M and Q8_0 part by part (the second with a tensorless first part), and the one-file
  llama fixture to Q8_0 (one part, named `-00001-of-00001`).

    python3 tests/reference/split/generate.py [--llama-bin DIR]

Default DIR: ~/.cache/llama.cpp-0c1e570/bin (built by ../shared/scripts/build-llama-cpp.sh;
llama-gguf-split with `cmake --build build --target llama-gguf-split`, then copied there).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", type=Path, default=Path.home() / ".cache/llama.cpp-0c1e570/bin")
    args = ap.parse_args()
    split_bin = args.llama_bin / "llama-gguf-split"
    models = Path(os.environ.get("LONE_MODELS", Path.home() / ".cache/lone/models"))
    smollm2 = models / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = {"tool": "llama-gguf-split (llama.cpp 0c1e570)", "cases": []}

    def parts(prefix: Path) -> list[dict]:
        files = sorted(prefix.parent.glob(prefix.name + "-*-of-*.gguf"))
        return [{"name": f.name[len(prefix.name):], "bytes": f.stat().st_size, "sha256": sha256(f)}
                for f in files]

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        q4 = t / "lfm2_a-q4_k_m.gguf"
        subprocess.run([args.llama_bin / "llama-quantize", FIXTURES / "lfm2_a/model-f32.gguf", q4,
                        "Q4_K_M"], check=True, capture_output=True)
        cases = [
            ("llama-f32-t5", "fixtures/llama/model-f32.gguf", FIXTURES / "llama/model-f32.gguf",
             ["--split-max-tensors", "5"]),
            ("llama-f32-t7-nofirst", "fixtures/llama/model-f32.gguf",
             FIXTURES / "llama/model-f32.gguf",
             ["--split-max-tensors", "7", "--no-tensor-first-split"]),
            ("lfm2_a-q4_k_m-t9", "llama-quantize fixtures/lfm2_a/model-f32.gguf Q4_K_M", q4,
             ["--split-max-tensors", "9"]),
            ("smollm2-40M", "SmolLM2-135M-Instruct.Q4_1.gguf", smollm2,
             ["--split-max-size", "40M"]),
        ]
        for name, source, path, opts in cases:
            prefix = t / name
            subprocess.run([split_bin, "--split", *opts, path, prefix], check=True,
                           capture_output=True)
            out["cases"].append({"name": name, "source": source, "args": opts,
                                 "parts": parts(prefix)})
        merged = t / "merged.gguf"
        subprocess.run([split_bin, "--merge", t / "smollm2-40M-00001-of-00003.gguf", merged],
                       check=True, capture_output=True)
        out["merged"] = {"from": "smollm2-40M", "bytes": merged.stat().st_size,
                         "sha256": sha256(merged)}
        out["keep_split"] = []
        for name, source, first, ty in [
            ("llama-f32-t5-q4_k_m", "llama-f32-t5", t / "llama-f32-t5-00001-of-00004.gguf", "Q4_K_M"),
            ("llama-f32-t7-nofirst-q8_0", "llama-f32-t7-nofirst",
             t / "llama-f32-t7-nofirst-00001-of-00004.gguf", "Q8_0"),
            ("llama-f32-q8_0", "fixtures/llama/model-f32.gguf", FIXTURES / "llama/model-f32.gguf", "Q8_0"),
        ]:
            subprocess.run([args.llama_bin / "llama-quantize", "--keep-split", first, t / f"{name}.gguf", ty],
                           check=True, capture_output=True)
            out["keep_split"].append({"name": name, "source": source, "type": ty, "parts": parts(t / name)})
    (HERE / "llama-gguf-split.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {HERE / 'llama-gguf-split.json'}")


if __name__ == "__main__":
    main()
