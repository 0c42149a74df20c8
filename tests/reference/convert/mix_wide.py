#!/usr/bin/env python3
"""Record the per-tensor types llama-quantize chooses for every file type on models wide enough
(rows of 256 and 512) that no type falls back, so that lone's mix rules
(crates/lone-core/src/convert/mix.rs) are checked tensor by tensor — the committed fixtures are
64 wide, where every 256-element type gives way to its fallback.

The models are written here with gguf-py (random weights, the llama fixture's tokenizer),
never committed: `llama-quantize --dry-run` reads only their shapes and metadata and prints
each tensor's type, which `mix-wide.json` records (in the order of the tensors, listed with their
shapes) with the keys the rules read.
With `--imatrix`, an importance matrix of ones for every weight matrix (llama.cpp's GGUF
imatrix layout, written here) makes llama-quantize take its has-imatrix branches.

    python3 tests/reference/convert/mix_wide.py [--llama-quantize PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "fixtures" / "llama" / "model-f32.gguf"
sys.path.insert(0, str(HERE))
from generate import IQ_TYPES, TYPES  # noqa: E402

# name -> (layers, width, ffn, heads, kv heads, tied embedding, experts)
VARIANTS = {
    "llama-gqa2-tied": (8, 256, 512, 4, 2, True, 0),
    "llama-gqa4": (16, 256, 512, 8, 2, False, 0),
}


def write_model(path: Path, variant) -> tuple[dict, list]:
    from gguf import GGUFReader, GGUFWriter, GGUFValueType
    n_layer, n_embd, n_ff, n_head, n_kv, tied, _ = variant
    src = GGUFReader(str(FIXTURE))
    w = GGUFWriter(str(path), "llama")
    kv = {"general.architecture": "llama", "llama.block_count": n_layer,
          "llama.embedding_length": n_embd, "llama.feed_forward_length": n_ff,
          "llama.attention.head_count": n_head, "llama.attention.head_count_kv": n_kv}
    for k, v in kv.items():
        if k != "general.architecture":
            w.add_uint32(k, v)
    hd = n_embd // n_head
    w.add_uint32("llama.attention.key_length", hd)
    w.add_uint32("llama.attention.value_length", hd)
    w.add_uint32("llama.rope.dimension_count", hd)
    w.add_uint32("llama.context_length", 2048)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("general.file_type", 0)
    for k, f in src.fields.items():
        if not k.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        if vtype == GGUFValueType.ARRAY:
            sub = f.types[1]
            vals = [f.parts[i].tobytes().decode() if sub == GGUFValueType.STRING
                    else f.parts[i].item() for i in f.data]
            w.add_key_value(k, vals, vtype, sub)
        elif vtype == GGUFValueType.STRING:
            w.add_key_value(k, f.parts[f.data[0]].tobytes().decode(), vtype)
        else:
            w.add_key_value(k, f.parts[f.data[0]].item(), vtype)
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(0)
    tensors = []

    def add(name, *shape):  # shape row-major (outermost first), as lone reports it
        tensors.append([name, list(shape)])
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    add("token_embd.weight", n_vocab, n_embd)
    add("output_norm.weight", n_embd)
    if not tied:
        add("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", n_embd)
        add(p + "attn_q.weight", n_embd, n_embd)
        add(p + "attn_k.weight", n_kv * hd, n_embd)
        add(p + "attn_v.weight", n_kv * hd, n_embd)
        add(p + "attn_output.weight", n_embd, n_embd)
        add(p + "ffn_norm.weight", n_embd)
        add(p + "ffn_gate.weight", n_ff, n_embd)
        add(p + "ffn_up.weight", n_ff, n_embd)
        add(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kv, tensors


def write_imatrix(path: Path, tensors: list) -> None:
    """llama-imatrix's GGUF layout: `<name>.in_sum2` (one sum per column) and `<name>.counts`."""
    from gguf import GGUFWriter
    w = GGUFWriter(str(path), "imatrix", use_temp_file=False)
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["ones"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 1)
    for name, shape in tensors:
        if len(shape) == 2 and "token_embd" not in name:
            w.add_tensor(name + ".in_sum2", np.ones((1, shape[-1]), np.float32))
            w.add_tensor(name + ".counts", np.ones((1, 1), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


LINE = re.compile(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+), (.*)")


def dry_run(quantize: Path, model: Path, t: str, imatrix: Path | None) -> dict:
    cmd = [str(quantize), "--dry-run"] + (["--imatrix", str(imatrix)] if imatrix else [])
    r = subprocess.run(cmd + [str(model), t], capture_output=True, text=True)
    types = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = LINE.search(line)
        if not m:
            continue
        name, old, rest = m.groups()
        new = re.search(r"\((\w+)\)\s*$", rest)
        types[name] = (new.group(1) if new else old).upper()
    if not types:
        sys.exit(f"{model.name} {t}: no tensor lines from llama-quantize:\n{r.stderr[-2000:]}")
    return types, "will require an imatrix" in r.stdout + r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-quantize", type=Path,
                    default=Path.home() / ".cache/llama.cpp-0c1e570/bin/llama-quantize")
    args = ap.parse_args()
    sys.path.insert(0, str(args.llama_quantize.resolve().parent.parent / "src" / "gguf-py"))
    out = {"tool": "llama-quantize --dry-run (llama.cpp 0c1e570)", "variants": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, variant in VARIANTS.items():
            model = Path(tmp) / f"{name}.gguf"
            kv, tensors = write_model(model, variant)
            imatrix = Path(tmp) / f"{name}.imatrix.gguf"
            write_imatrix(imatrix, tensors)
            cases = []
            for t in [x for x in TYPES if x not in ("F16", "BF16")] + IQ_TYPES:
                for im in [False, True]:
                    types, refused = dry_run(args.llama_quantize, model, t,
                                             imatrix if im else None)
                    # In the order of `tensors`; `needs_imatrix`: the real run would refuse.
                    cases.append({"type": t, "imatrix": im, "needs_imatrix": refused,
                                  "types": [types[n] for n, _ in tensors]})
                    print(f"{name} {t} {'imatrix' if im else ''}: "
                          f"{sorted(set(types.values()))}", file=sys.stderr)
            out["variants"].append({"name": name, "kv": kv, "tensors": tensors, "cases": cases})
    (HERE / "mix-wide.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
