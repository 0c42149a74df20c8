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

MODELS = ["LFM2-350M", "LFM2-1.2B", "LFM3-1.7B", "Qwen2.5-0.5B", "Llama-350M"]


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
    meta = {"name": name, "params": n, "random_init_std": 0.02, "dtype": "bfloat16",
            "note": "random weights, real shapes; for speed measurements only"}
    (tmp / "bench_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"[{name}] {n / 1e6:.1f} M params -> {out} ({time.time() - t0:.0f} s)")


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
