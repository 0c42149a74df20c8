#!/usr/bin/env python3
"""Random-weight checkpoints of real model shapes, for speed measurements only.

    python scripts/bench_models.py OUT_ROOT NAME        # writes OUT_ROOT/NAME/hf/
    python scripts/bench_models.py --list               # the names it knows
    python scripts/bench_models.py --convert HF_DIR OUTTYPE OUT.gguf   # llama.cpp's converter

The weights are random (normal, std 0.02 = initializer_range; norms 1), saved as bf16
safetensors by transformers' save_pretrained, next to the REAL tokenizer, chat template and
generation config of the family. The text such a model writes is noise; its speed is the
real model's speed, because every matrix has the real shape.

Shapes:
  LFM2-350M, LFM2-1.2B  /work/shared/assets/lfm2/config.<name>.json (Hub 4.x-style config)
  LFM3-1.7B             transformers' Lfm3Config() defaults, except vocab_size 65536 and the
                        bos/eos/pad ids of the LFM2 tokenizer that it is paired with (the
                        default vocab of 128000 does not match any tokenizer we have)
  Qwen2.5-0.5B          hidden 896, 24 layers, 14/2 heads, FFN 4864, vocab 151936, tied,
                        rope_theta 1e6 (the published Qwen2.5-0.5B-Instruct config)
  Llama-350M            LFM2-350M's shape (hidden 1024, 16 layers, 16/8 heads, FFN 4608, vocab
                        65536, tied, LFM2 tokenizer) with attention in every layer: the
                        non-hybrid of the same size (speculation's verify passes, hybrid vs not)
  LFM2-8B-A1B           LiquidAI/LFM2-8B-A1B's published shape: vocab 65536, hidden 2048, 24
                        layers (attention at 2, 6, 10, 14, 18, 21; conv elsewhere), 32/8 heads,
                        2 leading dense layers of FFN 7168, then 32 experts of width 1792, top 4,
                        expert bias, normalised weights, scaling 1: 8.34 B parameters, 1.56 B
                        active. Too big for transformers' in-memory init here (16.7 GB bf16):
                        written tensor by tensor with NumPy (normal std 0.02 drawn from a
                        shared pool at random offsets, norms 1, expert bias 0.01·normal) in the
                        Hub's per-expert layout, sharded at 2 GB.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

ASSETS = Path(os.environ.get("LONE_ASSETS", "/work/shared/assets"))
LFM2 = ASSETS / "lfm2"
QWEN = ASSETS / "qwen2.5"

MODELS = ["LFM2-350M", "LFM2-1.2B", "LFM3-1.7B", "Qwen2.5-0.5B", "Llama-350M", "LFM2-8B-A1B"]
# Written by make_streamed (no transformers model in memory).
STREAMED = {"LFM2-8B-A1B"}

LFM2_8B_A1B = {
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": 65536,
    "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4, "norm_topk_prob": True,
    "routed_scaling_factor": 1.0, "use_expert_bias": True, "conv_L_cache": 3, "conv_bias": False,
    "layer_types": ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)],
    "max_position_embeddings": 128000, "norm_eps": 1e-5, "rope_theta": 1000000.0,
    "tie_embedding": True, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0,
    "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True,
}


def make_streamed(root: Path, name: str) -> None:
    """An LFM2-MoE checkpoint written tensor by tensor (bf16, the Hub's layout), never whole
    in memory."""
    import numpy as np

    out = root / name / "hf"
    if (out / "model.safetensors.index.json").exists():
        print(f"[{name}] checkpoint exists: {out}")
        return
    t0 = time.time()
    c = LFM2_8B_A1B
    d, v, ff, eff = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["moe_intermediate_size"]
    nh, nkv, ne = c["num_attention_heads"], c["num_key_value_heads"], c["num_experts"]
    hd = d // nh
    specs: list[tuple[str, tuple, str]] = [("model.embed_tokens.weight", (v, d), "w"),
                                           ("model.embedding_norm.weight", (d,), "norm")]
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}"
        specs += [(f"{p}.operator_norm.weight", (d,), "norm"), (f"{p}.ffn_norm.weight", (d,), "norm")]
        if kind == "conv":
            specs += [(f"{p}.conv.in_proj.weight", (3 * d, d), "w"), (f"{p}.conv.conv.weight", (d, 1, 3), "w"),
                      (f"{p}.conv.out_proj.weight", (d, d), "w")]
        else:
            specs += [(f"{p}.self_attn.q_proj.weight", (nh * hd, d), "w"),
                      (f"{p}.self_attn.k_proj.weight", (nkv * hd, d), "w"),
                      (f"{p}.self_attn.v_proj.weight", (nkv * hd, d), "w"),
                      (f"{p}.self_attn.out_proj.weight", (d, nh * hd), "w"),
                      (f"{p}.self_attn.q_layernorm.weight", (hd,), "norm"),
                      (f"{p}.self_attn.k_layernorm.weight", (hd,), "norm")]
        if i < c["num_dense_layers"]:
            specs += [(f"{p}.feed_forward.w1.weight", (ff, d), "w"), (f"{p}.feed_forward.w3.weight", (ff, d), "w"),
                      (f"{p}.feed_forward.w2.weight", (d, ff), "w")]
        else:
            specs += [(f"{p}.feed_forward.gate.weight", (ne, d), "w"),
                      (f"{p}.feed_forward.expert_bias", (ne,), "bias")]
            for j in range(ne):
                specs += [(f"{p}.feed_forward.experts.{j}.w1.weight", (eff, d), "w"),
                          (f"{p}.feed_forward.experts.{j}.w3.weight", (eff, d), "w"),
                          (f"{p}.feed_forward.experts.{j}.w2.weight", (d, eff), "w")]
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02).view(np.uint32) >> 16
    pool = np.concatenate([pool, pool]).astype(np.uint16)

    def data(shape: tuple, kind: str) -> bytes:
        n = int(np.prod(shape))
        if kind == "norm":
            return np.full(n, 0x3F80, dtype=np.uint16).tobytes()  # bf16 1.0
        if kind == "bias":
            b = (rng.standard_normal(n, dtype=np.float32) * 0.01).view(np.uint32) >> 16
            return b.astype(np.uint16).tobytes()
        parts, left = [], n
        while left:
            take = min(left, 1 << 24)
            o = int(rng.integers(0, 1 << 24))
            parts.append(pool[o:o + take])
            left -= take
        return np.concatenate(parts).tobytes()

    tmp = root / name / "hf.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shards: list[list[tuple[str, tuple, str]]] = [[]]
    size = 0
    for s in specs:
        nbytes = 2 * int(np.prod(s[1]))
        if size + nbytes > 2 << 30 and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += nbytes
    index, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        hdr, off = {}, 0
        for n_, shape, _ in shard:
            nb = 2 * int(np.prod(shape))
            hdr[n_] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
            index[n_] = fname
            total += nb // 2
        h = json.dumps(hdr).encode()
        h += b" " * (-len(h) % 8)
        with open(tmp / fname, "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for _, shape, kind in shard:
                f.write(data(shape, kind))
        print(f"[{name}] {fname} ({time.time() - t0:.0f} s)", flush=True)
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 2 * total}, "weight_map": index}, indent=1) + "\n")
    (tmp / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    for src, dst in tokenizer_files(name):
        if src.exists():
            shutil.copy(src, tmp / dst)
    finish(tmp, out, name, total, t0)


def finish(tmp: Path, out: Path, name: str, params: int, t0: float) -> None:
    """Record what the checkpoint is and move it into place (complete or not there at all)."""
    meta = {"name": name, "params": params, "random_init_std": 0.02, "dtype": "bfloat16",
            "note": "random weights, real shapes; for speed measurements only"}
    (tmp / "bench_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"[{name}] {params / 1e6:.1f} M params -> {out} ({time.time() - t0:.0f} s)")


def tokenizer_files(name: str) -> list[tuple[Path, str]]:
    if name.startswith("Qwen"):
        return [(QWEN / "tokenizer.json", "tokenizer.json"),
                (QWEN / "tokenizer_config.json", "tokenizer_config.json")]
    return [(LFM2 / f, f) for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                    "chat_template.jinja", "generation_config.json")]


def make_config(name: str, tmp: Path):
    from transformers import AutoConfig, Lfm3Config, Qwen2Config

    if name in ("LFM2-350M", "LFM2-1.2B"):
        tmp.mkdir(parents=True, exist_ok=True)
        shutil.copy(LFM2 / f"config.{name}.json", tmp / "config.json")
        cfg = AutoConfig.from_pretrained(str(tmp))
        (tmp / "config.json").unlink()
        return cfg
    if name == "LFM3-1.7B":
        return Lfm3Config(vocab_size=65536, bos_token_id=1, eos_token_id=7, pad_token_id=0,
                          initializer_range=0.02)
    if name == "Qwen2.5-0.5B":
        return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                           num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                           rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                           eos_token_id=151645, initializer_range=0.02, use_sliding_window=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    if name == "Llama-350M":
        # LFM2-350M's shape with attention in all 16 layers (no conv): the non-hybrid of the
        # same size, to compare speculation's verify passes with the hybrid's.
        from transformers import LlamaConfig
        return LlamaConfig(vocab_size=65536, hidden_size=1024, intermediate_size=4608, num_hidden_layers=16,
                           num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=128000,
                           rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=7,
                           pad_token_id=0, initializer_range=0.02,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def make(root: Path, name: str) -> None:
    if name in STREAMED:
        make_streamed(root, name)
        return
    import torch
    from transformers import AutoModelForCausalLM

    out = root / name / "hf"
    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        print(f"[{name}] checkpoint exists: {out}")
        return
    t0 = time.time()
    tmp = root / name / "hf.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cfg = make_config(name, tmp)
    cfg.initializer_range = 0.02
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # from_config already ran _init_weights (normal(0, initializer_range), norms 1); make sure
    # nothing was left uninitialised (NaN/huge) by a module without an init rule.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if not torch.isfinite(p).all() or p.abs().max() > 100:
                p.normal_(0.0, 0.02)
                print(f"[{name}] re-initialised {pname}")
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(tmp), safe_serialization=True, max_shard_size="20GB")
    for src, dst in tokenizer_files(name):
        if src.exists():
            shutil.copy(src, tmp / dst)
    if name.startswith("Qwen"):
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}, indent=2) + "\n")
    finish(tmp, out, name, n, t0)


def convert(model_dir: str, outtype: str, outfile: str) -> None:
    """llama.cpp's convert_hf_to_gguf.py, in process. The only change: without the
    `sentencepiece` package, `_set_vocab_sentencepiece` raises FileNotFoundError (what it does
    anyway when there is no tokenizer.model, as here) so that Qwen2's set_vocab falls back to
    the BPE path instead of dying on the import (same as tests/reference/generate.py). The real
    tokenizers' pre-tokenizers are recognised by the converter: nothing else is patched."""
    src = Path(os.environ.get("LLAMA_CPP_SRC", "~/.cache/llama.cpp-0c1e570/src")).expanduser()
    sys.path.insert(0, str(src / "gguf-py"))
    sys.path.insert(0, str(src))
    import convert_hf_to_gguf  # noqa: F401

    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        from conversion import base as conv_base

        def _no_sentencepiece(self, *a, **k):
            raise FileNotFoundError("no tokenizer.model (sentencepiece not installed)")

        conv_base.TextModel._set_vocab_sentencepiece = _no_sentencepiece
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", outtype, "--outfile", outfile]
    convert_hf_to_gguf.main()


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--convert":
        convert(*sys.argv[2:])
        return
    if sys.argv[1:] == ["--list"]:
        print("\n".join(MODELS))
        return
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    make(Path(sys.argv[1]).expanduser(), sys.argv[2])


if __name__ == "__main__":
    main()
