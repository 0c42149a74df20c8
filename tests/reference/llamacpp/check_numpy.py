#!/usr/bin/env python3
"""An independent float64 NumPy forward of the SmolLM2 GGUF (weights dequantized by llama.cpp's
gguf-py, every activation in f64, no activation quantization), teacher-forced on llama.cpp's greedy
tokens from smollm2.json (both runs). Prints, per prompt and run, the max |logprob difference| of
llama.cpp against it over llama.cpp's top-1/5/10 and the steps where the f64 argmax differs, and
writes the f64 top-10 logprobs to $OUT (default /tmp/smollm2_f64.json).

    PYTHONPATH=~/.cache/llama.cpp-0c1e570/src/gguf-py python3 tests/reference/llamacpp/check_numpy.py

Diagnostic only (not used by the Rust tests); needs numpy and gguf-py. ~1-2 min on 2 cores.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

HERE = Path(__file__).resolve().parent
MODELS = Path(
    os.environ.get("LONE_MODELS")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lone" / "models"
)


def load(path):
    r = GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 or len(t.shape) > 1 else a
    return f, w


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope_norm(x, pos, base):
    # llama.cpp LLAMA_ROPE_TYPE_NORM: rotate adjacent pairs (x[2i], x[2i+1])
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None] * inv[None, :]  # [n, d/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def forward(f, w, tokens):
    n_layer = f["llama.block_count"]
    nh, nkv = f["llama.attention.head_count"], f["llama.attention.head_count_kv"]
    eps = f["llama.attention.layer_norm_rms_epsilon"]
    base = f["llama.rope.freq_base"]
    emb = w["token_embd.weight"]
    x = emb[tokens]
    n, d = x.shape
    hd = d // nh
    pos = np.arange(n, dtype=np.float64)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(n_layer):
        p = f"blk.{i}."
        h = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(n, nh, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(n, nkv, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, nkv, hd)
        q, k = rope_norm(q, pos, base), rope_norm(k, pos, base)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(n, d)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
    x = rmsnorm(x, w["output_norm.weight"], eps)
    out = w.get("output.weight", emb)
    return x @ out.T


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def main():
    ref = json.loads((HERE / "smollm2.json").read_text())
    f, w = load(MODELS / ref["model"]["file"])
    result = {}
    for g in ref["generations"]:
        prompt = g["prompt_ids"]
        for run in ("f32", "q4_1"):
            toks = g[run]["tokens"]
            lp = log_softmax(forward(f, w, prompt + toks[:-1]))[len(prompt) - 1 :]
            worst = [0.0, 0.0, 0.0]
            flips = []
            for i, top in enumerate(g[run]["top_logprobs"]):
                for k, (tid, l) in enumerate(top):
                    dlt = abs(lp[i, tid] - l)
                    for j, kk in enumerate((1, 5, 10)):
                        if k < kk:
                            worst[j] = max(worst[j], dlt)
                if int(lp[i].argmax()) != toks[i]:
                    flips.append((i, round(top[0][1] - top[1][1], 3)))
            order = np.argsort(-lp, axis=1)[:, :10]
            result[f"{g['name']}/{run}"] = [
                [[int(t), float(lp[i, t])] for t in order[i]] for i in range(len(toks))
            ]
            print(
                f"{g['name']:9} {run:4}: llama.cpp vs f64 max |dlogprob| top1 {worst[0]:.4f} "
                f"top5 {worst[1]:.4f} top10 {worst[2]:.4f}; f64 argmax != llama.cpp's token at "
                f"(step, llama.cpp top-2 gap) {flips}"
            )
    out = Path(os.environ.get("OUT", "/tmp/smollm2_f64.json"))
    out.write_text(json.dumps(result))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
