#!/usr/bin/env python3
"""Generate the quantization fixtures that crates/lone-core/tests/quant_formats.rs checks.

The expected values come from outside lone's Rust code:

* gguf-py (`gguf.quants`, numpy) quantizes F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 and
  dequantizes every format it knows (all of the above plus Q2_K..Q6_K).
* Q8_1 and Q8_K are not in gguf-py (they are ggml's activation formats); this script has its
  own numpy ports of ggml's `quantize_row_q8_1_ref` / `quantize_row_q8_K_ref` and of the
  obvious dequantization `q * d`.
* The i-quants and ternary formats have dequantization cases (random blocks with finite
  scales, and the first rows of a tensor llama-quantize wrote into
  tests/reference/fixtures/llama/model-<type>.gguf) and quantization cases from ggml's own
  `quantize_<type>` with and without importances (`IQ_QUANTIZE`, C compiled as below).
* gguf-py cannot quantize the K-quants: their dequantization cases are random bytes with
  the f16 scale fields replaced by finite values (every other bit pattern is a valid block),
  and their quantization cases (`*_quant_*.bin`) are ggml's own `quantize_row_*_ref`,
  compiled here from llama.cpp's ggml-quants.c with -ffp-contract=off (`--ggml DIR`,
  default ~/.cache/llama.cpp-0c1e570/src).

Optionally (`--check-ggml LLAMA_CPP_SRC`), the script compiles ggml's own ggml-quants.c
(with -ffp-contract=off, i.e. no fused multiply-add) and asserts that the C reference agrees
with every fixture: dequantization bit for bit, quantization byte for byte. That is a check of
the fixtures, not needed to produce them.

Each case is one little-endian binary file `<case>.bin`, sections described in
`manifest.json` as [byte offset, byte length]:

  src    f32[rows*n]  input of the quantizer (only when `quantize` is true)
  blocks u8           the stored rows (what the quantizer produced, or random blocks)
  deq    f32[rows*n]  expected dequantization
  x      f32[n]       activations for the dot products
  dots   f64[rows]    sum(deq[r] * x) in float64
  mags   f64[rows]    sum(|deq[r] * x|) in float64 (scales the dot tolerance)

Run from anywhere: `python3 tests/reference/quant/generate.py [--check-ggml DIR]`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

OUT = Path(__file__).resolve().parent
QK_K = 256

# name -> (ggml type id, block size, bytes per block). Written out here rather than taken
# from gguf.constants: the gguf 0.19.0 wheel on PyPI still lists Q8_1 as 40 bytes (its old
# f32 layout); ggml's block_q8_1 is 36 bytes (two halves + 32 quants).
FORMATS = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "BF16": (30, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q8_1": (9, 32, 36),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "Q8_K": (15, 256, 292),
    "IQ4_NL": (20, 32, 18),
    "IQ4_XS": (23, 256, 136),
    "IQ2_XXS": (16, 256, 66),
    "IQ2_XS": (17, 256, 74),
    "IQ3_XXS": (18, 256, 98),
    "IQ1_S": (19, 256, 50),
    "IQ3_S": (21, 256, 110),
    "IQ2_S": (22, 256, 82),
    "IQ1_M": (29, 256, 56),
    "TQ1_0": (34, 256, 54),
    "TQ2_0": (35, 256, 66),
}

GGUF_PY_QUANTIZE = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# Where each K-quant keeps its f16 super-block scales (byte offsets).
K_SCALE_FIELDS = {
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}


# ------------------------------------------------------------------ numpy ports (Q8_1, Q8_K)


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_1_ref: d = amax/127, q = roundf(x/d), s = f16(sum(q)*d)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    out = []
    for b in blocks:
        amax = np.float32(np.abs(b).max())
        d = np.float32(amax / np.float32(127))
        idv = np.float32(0) if d == 0 else np.float32(np.float32(1) / d)
        q = quants.np_roundf(b * idv).astype(np.int8)  # round half away from zero
        s = np.float32(np.float32(int(q.astype(np.int32).sum())) * d)
        out.append(
            np.concatenate(
                [
                    np.array([d], np.float16).view(np.uint8),
                    np.array([s], np.float16).view(np.uint8),
                    q.view(np.uint8),
                ]
            )
        )
    return np.concatenate(out)


def dequantize_q8_1(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 36)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 4:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(-1)


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref: the largest-magnitude element maps to -127, nearest_int
    rounds half to even, bsums are sums of 16 quants. (ggml leaves bsums uninitialized for an
    all-zero block; they are zero here.)"""
    blocks = x.reshape(-1, QK_K).astype(np.float32)
    out = []
    for b in blocks:
        a = np.abs(b)
        i = int(np.argmax(a))  # first index of the maximum, like ggml's strict `>`
        if a[i] == 0:
            out.append(np.zeros(292, np.uint8))
            continue
        iscale = np.float32(np.float32(-127) / b[i])
        v = (iscale * b).astype(np.float32)
        q = np.minimum(np.rint(v), 127).astype(np.int8)  # rint: ties to even, like nearest_int
        bsums = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype(np.int16)
        d = np.float32(np.float32(1) / iscale)
        out.append(
            np.concatenate(
                [
                    np.array([d], np.float32).view(np.uint8),
                    q.view(np.uint8),
                    bsums.view(np.uint8),
                ]
            )
        )
    return np.concatenate(out)


def dequantize_q8_k(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 292)
    d = blocks[:, 0:4].copy().view(np.float32)
    q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


# The i-quants (read-only formats in lone): dequantization cases only, from random blocks
# with a finite f16 `d` (every other bit pattern is a valid block) and from the blocks
# llama-quantize wrote into the llama fixture's GGUFs. Their own random generator, so the
# cases above do not change when these do.
IQ_SCALE_FIELDS = {"IQ4_NL": [0], "IQ4_XS": [0]}
# The codebook i-quants and the ternary formats: where their f16 scale is. IQ1_M has none of
# its own: its f16 is spread over the top nibbles of its four scale words (bytes 48..56).
IQ_GRID_SCALE_FIELDS = {"IQ2_XXS": [0], "IQ2_XS": [0], "IQ3_XXS": [0], "IQ1_S": [0],
                        "IQ3_S": [0], "IQ2_S": [0], "IQ1_M": [], "TQ1_0": [52], "TQ2_0": [64]}
FIXTURES = OUT.parent / "fixtures"
# (type, file, tensor, rows): the first rows of a tensor of that type in that file.
IQ_FILE_CASES = [
    ("IQ4_NL", "llama/model-iq4_nl.gguf", "blk.0.attn_q.weight", 5),
    ("IQ4_XS", "llama/model-iq4_xs.gguf", "blk.1.ffn_down.weight", 5),
]


# ------------------------------------------------------------------ data


def activation_like(rng: np.random.Generator, rows: int, n: int, block: int) -> np.ndarray:
    """Normal data with per-row scales spanning a few decades, plus edge-case blocks."""
    scale = 10.0 ** rng.uniform(-3, 1, size=(rows, 1))
    x = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    blk = max(block, 32)
    # An all-zero block (scale 0 paths).
    x[0, :blk] = 0
    if rows > 1:
        # A block whose extremes are +a and -a: ggml picks the first one.
        x[1, :blk] = rng.uniform(-1, 1, blk).astype(np.float32)
        x[1, 3], x[1, 9] = -2.0, 2.0
    if rows > 2 and n >= 2 * blk:
        # Halfway cases: amax 127 makes Q8 scales exactly 1, so x.5 values test the rounding
        # rule (roundf away from zero for Q8_0/Q8_1, ties to even for Q8_K).
        h = np.zeros(blk, np.float32)
        h[:8] = [127, 2.5, -3.5, 0.5, -0.5, 1.5, -126.5, 64.5]
        h[8:] = rng.integers(-126, 127, blk - 8) + 0.5
        x[2, blk : 2 * blk] = h
        # Q4/Q5 halfway cases: max = -8 (resp. -16) makes d = 1.
        if rows > 3:
            h = rng.integers(-8, 8, blk).astype(np.float32) + 0.5
            h[0] = -8
            x[3, blk : 2 * blk] = h
    return x


def random_kquant_blocks(rng: np.random.Generator, name: str, nblocks: int) -> np.ndarray:
    _, _, bb = FORMATS[name]
    raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    for off in {**K_SCALE_FIELDS, **IQ_SCALE_FIELDS, **IQ_GRID_SCALE_FIELDS}[name]:
        v = (rng.uniform(1e-4, 2e-2, nblocks) * rng.choice([-1, 1], nblocks)).astype(np.float16)
        raw[:, off : off + 2] = v.view(np.uint8).reshape(nblocks, 2)
    if name == "IQ1_M":
        v = (rng.uniform(1e-4, 2e-2, nblocks) * rng.choice([-1, 1], nblocks)).astype(np.float16)
        bits = v.view(np.uint16).astype(np.uint32)
        for i in range(4):
            nib = (bits >> (4 * i)) & 0xF
            hi = raw[:, 48 + 2 * i + 1].astype(np.uint32)
            raw[:, 48 + 2 * i + 1] = ((hi & 0x0F) | (nib << 4)).astype(np.uint8)
    return raw.reshape(-1)


def dequantize(name: str, raw: np.ndarray, rows: int, n: int) -> np.ndarray:
    if name == "Q8_1":
        return dequantize_q8_1(raw).reshape(rows, n)
    if name == "Q8_K":
        return dequantize_q8_k(raw).reshape(rows, n)
    return quants.dequantize(raw.reshape(rows, -1), T[name]).astype(np.float32).reshape(rows, n)


def quantize(name: str, src: np.ndarray) -> np.ndarray:
    if name == "Q8_1":
        return quantize_q8_1(src)
    if name == "Q8_K":
        return quantize_q8_k(src)
    return quants.quantize(src, T[name]).view(np.uint8).reshape(-1)


def finish_case(rng: np.random.Generator, case: dict, src, raw: np.ndarray, qw=None) -> dict:
    """The sections every case has: dequantization (gguf-py), activations, dots, magnitudes."""
    name, rows, n = case["type"], case["rows"], case["n"]
    deq = dequantize(name, raw, rows, n)
    x = rng.standard_normal(n).astype(np.float32)
    prod = deq.astype(np.float64) * x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        dots = prod.sum(axis=1)
        mags = np.abs(prod).sum(axis=1)
    sections: dict[str, bytes] = {}
    if src is not None:
        sections["src"] = src.astype("<f4").tobytes()
    if qw is not None:
        sections["qw"] = qw.astype("<f4").tobytes()
    sections["blocks"] = raw.tobytes()
    sections["deq"] = deq.astype("<f4").tobytes()
    sections["x"] = x.astype("<f4").tobytes()
    sections["dots"] = dots.astype("<f8").tobytes()
    sections["mags"] = mags.astype("<f8").tobytes()
    blob = b""
    for key, data in sections.items():
        case[key] = [len(blob), len(data)]
        blob += data
    case["_blob"] = blob
    case["_arrays"] = (src, raw, deq)
    return case


def make_case(rng: np.random.Generator, name: str, rows: int, n: int) -> dict:
    _, bs, bb = FORMATS[name]
    assert n % bs == 0
    case = {"type": name, "rows": rows, "n": n}
    if name == "F32":
        src = activation_like(rng, rows, n, bs)
        raw = src.reshape(-1).view(np.uint8)
        case["source"] = "f32 bytes"
        case["quantize"] = True
    elif name in K_SCALE_FIELDS or name in IQ_SCALE_FIELDS or name in IQ_GRID_SCALE_FIELDS:
        src = None
        raw = random_kquant_blocks(rng, name, rows * n // bs)
        case["source"] = "random blocks, finite f16 scales; dequantized by gguf-py"
        case["quantize"] = False
    else:
        src = activation_like(rng, rows, n, bs)
        if name in ("F16", "BF16"):
            # Values that exercise the float conversions: signed zero, subnormals,
            # overflow to inf, exact ties.
            special = [0.0, -0.0, 6e-8, -3e-5, 65504.0, 65520.0, 1e30, 1.00390625, 1.01171875]
            src[0, : len(special)] = special
        with np.errstate(over="ignore"):  # 65520 and 1e30 overflow f16 on purpose
            raw = quantize(name, src)
        origin = "gguf-py" if name in GGUF_PY_QUANTIZE else "numpy port of ggml C"
        case["source"] = f"quantized by {origin}; dequantized by {origin}"
        case["quantize"] = True
    assert raw.size == rows * n // bs * bb, (name, raw.size)
    case["file"] = f"{name.lower()}_{rows}x{n}.bin"
    return finish_case(rng, case, src, raw)


def make_file_case(rng: np.random.Generator, name: str, file: str, tensor: str,
                   rows: int) -> dict:
    """The first `rows` rows of a tensor llama-quantize wrote (read with gguf-py)."""
    from gguf import GGUFReader

    t = next(t for t in GGUFReader(str(FIXTURES / file)).tensors if t.name == tensor)
    assert t.tensor_type.name == name, (file, tensor, t.tensor_type.name)
    n = int(t.shape[0])
    raw = np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8)[:rows]).reshape(-1)
    case = {"type": name, "rows": rows, "n": n,
            "source": f"{file} {tensor} (llama-quantize), first {rows} rows; dequantized by gguf-py",
            "quantize": False, "file": f"{name.lower()}_file_{rows}x{n}.bin"}
    return finish_case(rng, case, None, raw)


# ------------------------------------------------------------------ optional ggml C check

STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort();
}
size_t ggml_row_size(int type, long long n) {
    /* block size and bytes of the types quantize_* asks about (ggml type ids) */
    switch (type) {
        case 2: return n / 32 * 18;   /* Q4_0 */
        case 3: return n / 32 * 20;   /* Q4_1 */
        case 6: return n / 32 * 22;   /* Q5_0 */
        case 7: return n / 32 * 24;   /* Q5_1 */
        case 8: return n / 32 * 34;   /* Q8_0 */
        case 10: return n / 256 * 84;  /* Q2_K */
        case 11: return n / 256 * 110; /* Q3_K */
        case 12: return n / 256 * 144; /* Q4_K */
        case 13: return n / 256 * 176; /* Q5_K */
        case 14: return n / 256 * 210; /* Q6_K */
        case 16: return n / 256 * 66;  /* IQ2_XXS */
        case 17: return n / 256 * 74;  /* IQ2_XS */
        case 18: return n / 256 * 98;  /* IQ3_XXS */
        case 19: return n / 256 * 50;  /* IQ1_S */
        case 20: return n / 32 * 18;   /* IQ4_NL */
        case 21: return n / 256 * 110; /* IQ3_S */
        case 22: return n / 256 * 82;  /* IQ2_S */
        case 23: return n / 256 * 136; /* IQ4_XS */
        case 29: return n / 256 * 56;  /* IQ1_M */
        case 34: return n / 256 * 54;  /* TQ1_0 */
        case 35: return n / 256 * 66;  /* TQ2_0 */
    }
    abort();
}
const char * ggml_type_name(int type) { (void)type; return "?"; }
size_t ggml_type_size(int type) { (void)type; abort(); }
"""


def ggml_library(src_dir: Path, tmp: str) -> ctypes.CDLL:
    """ggml-quants.c from a llama.cpp checkout, compiled without fused multiply-adds."""
    ggml = src_dir / "ggml"
    if not (ggml / "src" / "ggml-quants.c").is_file():
        sys.exit(f"{src_dir}: no ggml/src/ggml-quants.c (pass --ggml LLAMA_CPP_SRC)")
    stub = Path(tmp) / "stubs.c"
    stub.write_text(STUBS)
    lib = Path(tmp) / "libggmlq.so"
    subprocess.run(
        ["cc", "-O2", "-ffp-contract=off", "-shared", "-fPIC",
         "-I", str(ggml / "include"), "-I", str(ggml / "src"),
         str(ggml / "src" / "ggml-quants.c"), str(stub), "-lm", "-o", str(lib)],
        check=True,
    )
    return ctypes.CDLL(str(lib))


def make_kquant_quantize_case(rng: np.random.Generator, c: ctypes.CDLL, name: str,
                              rows: int, n: int) -> dict:
    """A K-quant case whose blocks are ggml's own `quantize_row_<type>_ref` (C, no FMA) of
    weight-like data: gguf-py cannot quantize the K formats."""
    _, bs, bb = FORMATS[name]
    src = activation_like(rng, rows, n, bs)
    if rows > 4:
        # A block of one repeated value (max == min) and a block of tiny values.
        src[4, :bs] = 0.25
        src[4, bs:2 * bs] *= 1e-12
    x = np.ascontiguousarray(src.reshape(-1), dtype=np.float32)
    raw = np.zeros(rows * n // bs * bb, np.uint8)
    getattr(c, f"quantize_row_{name.lower().replace('_k', '_K')}_ref")(
        x.ctypes.data_as(ctypes.c_void_p), raw.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int64(rows * n))
    case = {"type": name, "rows": rows, "n": n,
            "source": "quantized by ggml's quantize_row_*_ref (C, -ffp-contract=off); "
                      "dequantized by gguf-py",
            "quantize": True, "file": f"{name.lower()}_quant_{rows}x{n}.bin"}
    return finish_case(rng, case, src, raw)


WEIGHTED = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def make_weighted_case(rng: np.random.Generator, c: ctypes.CDLL, name: str,
                       rows: int, n: int) -> dict:
    """Importance-weighted quantization (what llama-quantize does with --imatrix): ggml's
    `quantize_<type>(src, dst, nrow, n_per_row, quant_weights)`. The importances `qw` (one
    per column, shared by the rows) are log-normal, with a few zero columns."""
    _, bs, bb = FORMATS[name]
    src = activation_like(rng, rows, n, bs)
    qw = np.exp(rng.standard_normal(n) * 1.5).astype(np.float32)
    qw[rng.choice(n, size=n // 64, replace=False)] = 0
    x = np.ascontiguousarray(src.reshape(-1), dtype=np.float32)
    raw = np.zeros(rows * n // bs * bb, np.uint8)
    fn = getattr(c, f"quantize_{name.lower().replace('_k', '_K')}")
    fn.restype = ctypes.c_size_t
    got = fn(x.ctypes.data_as(ctypes.c_void_p), raw.ctypes.data_as(ctypes.c_void_p),
             ctypes.c_int64(rows), ctypes.c_int64(n), qw.ctypes.data_as(ctypes.c_void_p))
    assert got == raw.size, (name, got, raw.size)
    case = {"type": name, "rows": rows, "n": n,
            "source": "quantized by ggml's quantize_* with quant_weights (C, "
                      "-ffp-contract=off); dequantized by gguf-py",
            "quantize": False, "weighted": True, "file": f"{name.lower()}_imatrix_{rows}x{n}.bin"}
    return finish_case(rng, case, src, raw, qw)


# The i-quant and ternary formats lone writes, as ggml's `quantize_<type>` makes them: with
# importances (llama-quantize --imatrix) and, unless ggml requires them (IQ_NEEDS_WEIGHTS),
# without. Each name maps to ggml's table set-up (`ggml_quantize_init`): None, or
# ("iq2xs_init_impl", ggml type id) / ("iq3xs_init_impl", grid size).
IQ_QUANTIZE = {"IQ4_NL": None, "IQ4_XS": None, "TQ1_0": None, "TQ2_0": None,
               "IQ3_XXS": ("iq3xs_init_impl", 256), "IQ3_S": ("iq3xs_init_impl", 512),
               "IQ2_XXS": ("iq2xs_init_impl", 16), "IQ2_XS": ("iq2xs_init_impl", 17),
               "IQ2_S": ("iq2xs_init_impl", 22), "IQ1_S": ("iq2xs_init_impl", 19),
               "IQ1_M": ("iq2xs_init_impl", 29)}
IQ_NEEDS_WEIGHTS = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
# Formats whose cases also hold an all-zero 32-element sub-block inside a block (IQ3_S skips
# it without advancing its index and sign slots).
IQ_ZERO_SUB_BLOCK = {"IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"}

# Formats with more rows than 4: IQ3's scale search takes its ends (is = ±15, ±9) on a few
# sub-blocks only, with importances; 8 rows of 4 blocks hold some.
IQ_ROWS = {"IQ3_XXS": 8, "IQ3_S": 8}


def make_iquant_cases(rng: np.random.Generator, c: ctypes.CDLL, name: str) -> list[dict]:
    """ggml's `quantize_<type>(src, dst, nrow, n_per_row, quant_weights)` of weight-like rows,
    once with log-normal importances (a few zero columns) and once with none."""
    _, bs, bb = FORMATS[name]
    init = IQ_QUANTIZE[name]
    if init is not None:
        getattr(c, init[0])(ctypes.c_int(init[1]))
    rows, n = IQ_ROWS.get(name, 4), 4 * max(bs, QK_K)
    cases = []
    for weighted in [True, False]:
        if not weighted and name in IQ_NEEDS_WEIGHTS:
            continue
        src = activation_like(rng, rows, n, bs)
        # One block of a repeated value and one of tiny values.
        src[1, :bs] = 0.25
        src[2, bs:2 * bs] *= 1e-12
        if name in IQ_ZERO_SUB_BLOCK:
            src[3, 2 * bs + 64:2 * bs + 96] = 0
        x = np.ascontiguousarray(src.reshape(-1), dtype=np.float32)
        qw = None
        if weighted:
            qw = np.exp(rng.standard_normal(n) * 1.5).astype(np.float32)
            qw[rng.choice(n, size=n // 64, replace=False)] = 0
        raw = np.zeros(rows * n // bs * bb, np.uint8)
        fn = getattr(c, f"quantize_{name.lower()}")
        fn.restype = ctypes.c_size_t
        got = fn(x.ctypes.data_as(ctypes.c_void_p), raw.ctypes.data_as(ctypes.c_void_p),
                 ctypes.c_int64(rows), ctypes.c_int64(n),
                 qw.ctypes.data_as(ctypes.c_void_p) if weighted else None)
        assert got == raw.size, (name, got, raw.size)
        kind = "imatrix" if weighted else "quant"
        case = {"type": name, "rows": rows, "n": n,
                "source": f"quantized by ggml's quantize_{name.lower()} "
                          f"({'with' if weighted else 'without'} quant_weights; C, "
                          "-ffp-contract=off); dequantized by gguf-py",
                "quantize": not weighted, "file": f"{name.lower()}_{kind}_{rows}x{n}.bin"}
        if weighted:
            case["weighted"] = True
        cases.append(finish_case(rng, case, src, raw, qw))
    return cases


def check_with_ggml(src_dir: Path, cases: list[dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        c = ggml_library(src_dir, tmp)
        checked = 0
        for case in cases:
            name = case["type"]
            src, raw, deq = case["_arrays"]
            rows, n = case["rows"], case["n"]
            if name in ("F32", "F16", "BF16"):
                continue  # plain conversions; not in ggml-quants.c
            lname = name.lower().replace("_k", "_K")  # ggml spells it dequantize_row_q4_K
            k = rows * n
            raw_c = np.ascontiguousarray(raw, dtype=np.uint8)
            if name != "Q8_1":  # ggml has no dequantize_row_q8_1
                out = np.empty(k, np.float32)
                getattr(c, f"dequantize_row_{lname}")(
                    raw_c.ctypes.data_as(ctypes.c_void_p),
                    out.ctypes.data_as(ctypes.c_void_p),
                    ctypes.c_int64(k),
                )
                a = out.view(np.uint32)
                b = deq.reshape(-1).astype(np.float32).view(np.uint32)
                assert np.array_equal(a, b), f"{case['file']}: ggml dequantization differs"
                checked += 1
            if case["quantize"] and name != "F32" and name not in IQ_QUANTIZE:
                x = np.ascontiguousarray(src.reshape(-1), dtype=np.float32)
                out = np.zeros(raw.size, np.uint8)
                getattr(c, f"quantize_row_{lname}_ref")(
                    x.ctypes.data_as(ctypes.c_void_p),
                    out.ctypes.data_as(ctypes.c_void_p),
                    ctypes.c_int64(k),
                )
                if name == "Q8_K":
                    # ggml leaves bsums of an all-zero block uninitialized: compare the rest.
                    blocks = raw.reshape(-1, 292)
                    zero = np.all(blocks[:, :260] == 0, axis=1)
                    out.reshape(-1, 292)[zero, 260:] = 0
                assert np.array_equal(out, raw), f"{case['file']}: ggml quantization differs"
                checked += 1
        print(f"ggml C reference agrees on {checked} checks", file=sys.stderr)


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-ggml", type=Path, metavar="LLAMA_CPP_SRC",
                    help="also compile ggml-quants.c from this llama.cpp checkout and compare")
    ap.add_argument("--ggml", type=Path, metavar="LLAMA_CPP_SRC",
                    default=Path.home() / ".cache/llama.cpp-0c1e570/src",
                    help="llama.cpp checkout whose ggml-quants.c quantizes the K-quant cases")
    args = ap.parse_args()

    rng = np.random.default_rng(0x10E)
    cases = []
    for name, (_, bs, _) in FORMATS.items():
        if name in IQ_SCALE_FIELDS or name in IQ_GRID_SCALE_FIELDS:
            continue
        if bs == 1:
            shapes = [(3, 97), (5, 64)]
        elif bs == 32:
            shapes = [(3, 96), (5, 160)]
        else:
            shapes = [(3, 256), (5, 512)]
        for rows, n in shapes:
            cases.append(make_case(rng, name, rows, n))
    # K-quant quantization cases come from ggml's C reference (their own generator, so the
    # cases above do not change when these do).
    krng = np.random.default_rng(0x10F)
    with tempfile.TemporaryDirectory() as tmp:
        c = ggml_library(args.ggml, tmp)
        for name in K_SCALE_FIELDS:
            for rows, n in [(5, 512), (2, 1024)]:
                cases.append(make_kquant_quantize_case(krng, c, name, rows, n))
        wrng = np.random.default_rng(0x110)
        for name in WEIGHTED:
            for rows, n in [(5, 512), (3, 1024)]:
                cases.append(make_weighted_case(wrng, c, name, rows, n))
    irng = np.random.default_rng(0x111)
    for name in IQ_SCALE_FIELDS:
        bs = FORMATS[name][1]
        cases.append(make_case(irng, name, 3, 3 * bs))
    for name, file, tensor, rows in IQ_FILE_CASES:
        cases.append(make_file_case(irng, name, file, tensor, rows))
    grng = np.random.default_rng(0x112)
    for name in IQ_GRID_SCALE_FIELDS:
        # Enough blocks that every grid entry is likely drawn (IQ1's 2048 at 8 indices a
        # 32-element group).
        cases.append(make_case(grng, name, 4, 24 * QK_K))
        # The first rows of the llama fixture's ffn_down, which llama-quantize wrote in it.
        cases.append(make_file_case(grng, name, f"llama/model-{name.lower()}.gguf",
                                    "blk.1.ffn_down.weight", 5))
    # Each written i-quant with its own generator, so adding one leaves the others' cases.
    with tempfile.TemporaryDirectory() as tmp:
        c = ggml_library(args.ggml, tmp)
        for i, name in enumerate(FORMATS):
            if name in IQ_QUANTIZE:
                cases += make_iquant_cases(np.random.default_rng(0x200 + i), c, name)

    for old in OUT.glob("*.bin"):
        old.unlink()
    manifest = []
    for case in cases:
        (OUT / case["file"]).write_bytes(case["_blob"])
        manifest.append({k: v for k, v in case.items() if not k.startswith("_")})
    lines = ",\n  ".join(json.dumps(c) for c in manifest)
    (OUT / "manifest.json").write_text('{"cases": [\n  ' + lines + "\n]}\n")
    total = sum(len(c["_blob"]) for c in cases)
    print(f"wrote {len(cases)} cases, {total} bytes", file=sys.stderr)

    if args.check_ggml:
        check_with_ggml(args.check_ggml, cases)


if __name__ == "__main__":
    main()
