#!/usr/bin/env python3
"""Independent NumPy re-implementation of the fixture models (an executable spec).

    python tests/reference/check_numpy.py [fixture ...]

Reads ``fixtures/<name>/{config.json,model.safetensors,meta.json,prompt_ids.json,
greedy.json}`` (and ``f16/``, ``bf16/``), recomputes logits and hidden states with
plain NumPy in float32 (float64 accumulation is not used on purpose) and compares
with ``logits.npy`` / ``hidden.npy``.  It does not import torch or transformers,
so it documents exactly the math a Rust implementation has to do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

HERE = Path(__file__).resolve().parent
FIX = HERE / "fixtures"


def rms(x, w, eps):
    x = x.astype(np.float32)
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def lin(x, W, b=None):
    y = x @ W.T
    return y if b is None else y + b


def rope_neox(x, pos, inv_freq):
    # x: [T, nh, hd]; rotate pairs (i, i + hd/2) by pos * inv_freq[i]
    hd = x.shape[-1]
    ang = pos[:, None].astype(np.float32) * inv_freq[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def inv_freq_default(theta, hd):
    return 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd)


def inv_freq_proportional(theta, hd, prf):
    n_rot = int(prf * hd // 2)  # number of rotated pairs
    f = 1.0 / theta ** (np.arange(0, 2 * n_rot, 2, dtype=np.float32) / hd)  # note: / hd, not / rotary dim
    return np.concatenate([f, np.zeros(hd // 2 - n_rot, np.float32)]).astype(np.float32)


def attention(q, k, v, window=None):
    # q [T, nh, hd], k/v [T, nkv, hd]; causal, optional sliding window (keys j with i - W < j <= i)
    T, nh, hd = q.shape
    rep = nh // k.shape[1]
    k = np.repeat(k, rep, axis=1)
    v = np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    mask = j <= i
    if window is not None:
        mask &= j > i - window
    s = np.where(mask[None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v)


def short_conv(x, W, pre):
    # x [T, H]; in_proj rows are [B; C; x] (each H rows); depthwise causal conv over B*x
    T, H = x.shape
    bcx = lin(x, W[pre + "in_proj.weight"], W.get(pre + "in_proj.bias"))
    B, C, xx = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
    bx = B * xx
    w = W[pre + "conv.weight"][:, 0, :]  # [H, K]
    K = w.shape[1]
    pad = np.concatenate([np.zeros((K - 1, H), np.float32), bx], axis=0)
    y = np.zeros_like(bx)
    for k in range(K):
        y += w[:, k] * pad[k:k + T]  # tap k multiplies x[t - (K-1) + k]
    if pre + "conv.bias" in W:
        y += W[pre + "conv.bias"]
    return lin(C * y, W[pre + "out_proj.weight"], W.get(pre + "out_proj.bias"))


def moe(h, W, f, cfg):
    """LFM2-MoE's sparse block (Hub layout: experts.J.w1/w2/w3): sigmoid scores, top-k of
    scores + expert_bias, weights = chosen scores / (sum + 1e-6) * routed_scaling_factor."""
    scores = 1.0 / (1.0 + np.exp(-lin(h, W[f + "gate.weight"])))  # [T, E]
    k = cfg["num_experts_per_tok"]
    key = scores + (W[f + "expert_bias"] if cfg.get("use_expert_bias", True) else 0.0)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-key[t], kind="stable")[:k]
        w = scores[t, chosen]
        if cfg.get("norm_topk_prob", True):
            w = w / (w.sum() + 1e-6)
        w = w * cfg.get("routed_scaling_factor", 1.0)
        for e, we in sorted(zip(chosen, w)):
            g = f"{f}experts.{e}."
            y = lin(silu(lin(h[t], W[g + "w1.weight"])) * lin(h[t], W[g + "w3.weight"]), W[g + "w2.weight"])
            out[t] += we * y
    return out


def forward(name, W, cfg, meta, ids):
    eps = meta["norm_eps"]
    H, nh, nkv, hd = meta["hidden_size"], meta["n_heads"], meta["n_kv_heads"], meta["head_dim"]
    kinds = meta["layer_kinds"]
    fam = meta["model_type"]
    moe_layers = set()
    if fam == "lfm2_moe":
        fam = "lfm2"
        moe_layers = set(range(cfg["num_dense_layers"], meta["n_layers"]))
    T = len(ids)
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][ids]
    hidden = [x]
    rp = meta["rope_parameters"]
    for L, kind in enumerate(kinds):
        p = f"model.layers.{L}."
        if fam in ("lfm2", "lfm3"):
            h = rms(x, W[p + "operator_norm.weight"], eps)
            if kind == "conv":
                o = short_conv(h, W, p + "conv.")
            else:
                a = "self_attn."
                q = lin(h, W[p + a + "q_proj.weight"]).reshape(T, nh, hd)
                k = lin(h, W[p + a + "k_proj.weight"]).reshape(T, nkv, hd)
                v = lin(h, W[p + a + "v_proj.weight"]).reshape(T, nkv, hd)
                qn, kn = ("q_layernorm", "k_layernorm") if fam == "lfm2" else ("q_norm", "k_norm")
                q = rms(q, W[p + a + qn + ".weight"], eps)
                k = rms(k, W[p + a + kn + ".weight"], eps)
                if fam == "lfm2":
                    inv = inv_freq_default(rp["rope_theta"], hd)
                    window = None
                else:
                    r = rp[kind]
                    if r["rope_type"] == "proportional":
                        inv = inv_freq_proportional(r["rope_theta"], hd, r.get("partial_rotary_factor", 1.0))
                    else:
                        inv = inv_freq_default(r["rope_theta"], hd)
                    window = meta["sliding_window"] if kind == "sliding_attention" else None
                q, k = rope_neox(q, pos, inv), rope_neox(k, pos, inv)
                o = attention(q, k, v, window)  # [T, nh, hd]
                if fam == "lfm3":
                    gate = 1.0 / (1.0 + np.exp(-lin(h, W[p + a + "gate_proj.weight"])))  # [T, nh]; module g_proj, stored as gate_proj
                    o = o * gate[:, :, None]
                o = lin(o.reshape(T, nh * hd), W[p + a + ("out_proj" if fam == "lfm2" else "o_proj") + ".weight"])
            if fam == "lfm3":
                o = rms(o, W[p + "post_operator_norm.weight"], eps)
            x = x + o
            h = rms(x, W[p + "ffn_norm.weight"], eps)
            f = p + "feed_forward."
            if L in moe_layers:
                m = moe(h, W, f, cfg)
            else:
                m = lin(silu(lin(h, W[f + "w1.weight"])) * lin(h, W[f + "w3.weight"]), W[f + "w2.weight"])
            if fam == "lfm3":
                m = rms(m, W[p + "post_ffn_norm.weight"], eps)
            x = x + m
        else:  # llama / qwen2 / qwen3
            h = rms(x, W[p + "input_layernorm.weight"], eps)
            a = p + "self_attn."
            q = lin(h, W[a + "q_proj.weight"], W.get(a + "q_proj.bias")).reshape(T, nh, hd)
            k = lin(h, W[a + "k_proj.weight"], W.get(a + "k_proj.bias")).reshape(T, nkv, hd)
            v = lin(h, W[a + "v_proj.weight"], W.get(a + "v_proj.bias")).reshape(T, nkv, hd)
            if fam == "qwen3":
                q = rms(q, W[a + "q_norm.weight"], eps)
                k = rms(k, W[a + "k_norm.weight"], eps)
            inv = inv_freq_default(rp["rope_theta"], hd)
            q, k = rope_neox(q, pos, inv), rope_neox(k, pos, inv)
            o = attention(q, k, v)
            x = x + lin(o.reshape(T, nh * hd), W[a + "o_proj.weight"], W.get(a + "o_proj.bias"))
            h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
            m = p + "mlp."
            x = x + lin(silu(lin(h, W[m + "gate_proj.weight"])) * lin(h, W[m + "up_proj.weight"]),
                        W[m + "down_proj.weight"])
        hidden.append(x)
    final = "model.embedding_norm.weight" if fam in ("lfm2", "lfm3") else "model.norm.weight"
    x = rms(x, W[final], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return lin(x, head), np.stack(hidden)


def load_f32(path):
    W = load_file(str(path))
    out = {}
    for k, v in W.items():
        if v.dtype == np.uint16:  # safetensors.numpy has no bf16; not hit for F32/F16
            raise TypeError(k)
        out[k] = v.astype(np.float32)
    return out


def load_bf16_as_f32(path):
    # safetensors.numpy cannot read BF16; parse the file by hand.
    import struct
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for k, info in header.items():
        if k == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = np.frombuffer(raw[base + a:base + b], dtype=np.uint16).astype(np.uint32) << 16
        out[k] = buf.view(np.float32).reshape(info["shape"])
    return out


def check(name):
    d = FIX / name
    meta = json.loads((d / "meta.json").read_text())
    cfg = json.loads((d / "config.json").read_text())
    ids = json.loads((d / "prompt_ids.json").read_text()) + json.loads((d / "greedy.json").read_text())
    P = meta["prompt_len"]
    res = {}
    for sub, loader in (("", load_f32), ("f16", load_f32), ("bf16", load_bf16_as_f32)):
        dd = d / sub if sub else d
        W = loader(dd / "model.safetensors")
        logits, hidden = forward(name, W, cfg, meta, ids)
        ref = np.load(dd / "logits.npy")
        err = float(np.abs(logits - ref).max())
        res[sub or "f32"] = err
        if not sub:
            href = np.load(d / "hidden.npy")
            res["hidden"] = float(np.abs(hidden[:, :P] - href).max())
            res["greedy_ok"] = bool((logits[P - 1:-1].argmax(-1) == np.array(ids[P:])).all())
    ok = all(v < 2e-3 for k, v in res.items() if k != "greedy_ok") and res["greedy_ok"]
    print(f"{name:8s} {'OK ' if ok else 'BAD'} {res}")
    return ok


if __name__ == "__main__":
    names = sys.argv[1:] or ["lfm2_a", "lfm2_b", "lfm3", "qwen2", "qwen3", "llama", "lfm2_moe"]
    sys.exit(0 if all([check(n) for n in names]) else 1)
