#!/usr/bin/env python3
"""Generate reference fixtures for the `lone` Rust tests.

Run from anywhere:

    python tests/reference/generate.py            # regenerate everything
    python tests/reference/generate.py llama qwen3  # only some fixtures
    python tests/reference/generate.py --gguf-refs-only [name[:kind,kind] ...]
        # only (re)compute gguf-<kind>.logits.npy from the existing GGUF files (all kinds,
        # or the listed ones: llama:iq4_nl,iq4_xs)
    python tests/reference/generate.py --lfm3-gguf
        # only (re)write lfm3's GGUFs from its committed checkpoint, then their references
    python tests/reference/generate.py --quantize-only llama [IQ4_NL IQ4_XS ...]
        # only (re)make a fixture's llama-quantize files (QUANTIZED) from its model-f32.gguf

Everything is written under ``tests/reference/fixtures/<name>/`` and is fully
deterministic (fixed seeds, CPU, eager attention, float32 math).

What it makes
-------------
Tiny random-init checkpoints (vocab 512, hidden 64, 4 heads / 2 kv heads,
head_dim 16 unless stated) for six fixtures:

* ``lfm2_a`` -- model_type ``lfm2`` whose ``config.json`` is written in the
  *4.x Hub style* (``full_attn_idxs``, ``block_ff_dim``,
  ``block_auto_adjust_ff_dim: true``, ``block_ffn_dim_multiplier`` 1.5,
  ``block_multiple_of`` 16, ``rope_theta``, ``torch_dtype``, ...); layers
  conv,conv,attn,conv,attn.  block_ff_dim 60 -> int(2*60/3)=40 ->
  int(1.5*40)=60 -> rounded up to a multiple of 16 = 64 (checked against the
  instantiated module and recorded in meta.json as ``ffn_width``).
* ``lfm2_b`` -- ``lfm2`` with a 5.x-style config (``layer_types``,
  ``rope_parameters``, ``dtype``), ``block_auto_adjust_ff_dim: false``
  (FFN width = intermediate_size = 64), layers attn,conv,attn.
* ``lfm3``   -- ``lfm3`` (transformers' Lfm3Config): 4 layers conv, sliding,
  full, sliding; sliding_window 8, a 23-token prompt, conv_L_cache 7, proportional
  partial rotary (0.5) on full layers with theta 1e6, default rope theta 1e4 on
  sliding layers, sigmoid attention output gate, sandwich (post) norms.
* ``qwen2``  -- 2 layers, q/k/v biases, untied lm_head.
* ``qwen3``  -- 2 layers, q/k norm, explicit head_dim 32 (!= hidden/heads = 16), tied.
* ``llama``  -- 2 layers, SmolLM2-like (tied embeddings, GQA); intermediate 256 so that
  the ffn_down rows can take a real K-quant.

Weights are random (std 0.1; qwen3's tied embedding 0.03; short-conv kernels
0.3), every norm weight is ``1 + 0.3*randn`` and every bias ``0.1*randn``, so
that greedy decoding does not collapse to one repeated token (seeds were
picked for >= 15 distinct greedy tokens).

Files per fixture (see README.md next to this script):

* ``config.json``, ``model.safetensors``, ``generation_config.json`` -- f32
  checkpoint as ``save_pretrained`` writes it (lfm2_a: config.json then
  overwritten with the Hub 4.x style config, and reloading is verified).
* ``tokenizer.json``, ``tokenizer_config.json`` -- a shared byte-level BPE
  tokenizer with exactly 512 ids (3 specials, 256 byte tokens, 253 merges).
* ``prompt_ids.json``, ``greedy.json`` (24 ids; repeated full-sequence
  forward without cache, argmax of the last row).
* ``logits.npy``  f32 [P+24, vocab]: one full-sequence forward over
  prompt+greedy.
* ``hidden.npy``  f32 [n_layers+1, P, hidden]: forward hooks; row 0 = output
  of embed_tokens, row i+1 = output of decoder layer i (before the final norm).
* ``f16/`` and ``bf16/``: the same weights saved in that dtype (config dtype
  updated), ``logits.npy`` computed by loading those weights, upcasting to f32
  and running in f32 over the same token sequence, plus ``greedy.json`` of that
  upcast model.
* ``model-{f32,f16,bf16,q8_0}.gguf`` -- llama.cpp's convert_hf_to_gguf.py;
  lfm3: llama.cpp has no LFM3 architecture, so ``write_lfm3_ggufs`` writes
  them with gguf-py's GGUFWriter in the layout DEVELOPERS.md describes
  ("LFM3 in GGUF"), the converter's tensor-type rules and its tokenizer
  metadata (asserted equal to the converter's lfm2_b file).  ``llama/model-q4_0.gguf``,
  ``llama/model-q4_k.gguf`` (Q4_K_M; tensors whose rows are not a multiple of 256 get
  llama-quantize's fallback types), ``llama/model-iq4_nl.gguf`` and ``llama/model-iq4_xs.gguf``
  (IQ4_XS on the 256-wide ffn_down rows, IQ4_NL elsewhere) and ``lfm2_moe/model-q4_0.gguf``
  come from ``llama-quantize`` when the binary exists (``QUANTIZED``).

* ``gguf-<kind>.logits.npy`` (one per ``model-<kind>.gguf``) f32 [P+24, vocab]:
  the exact reference for that GGUF -- every tensor dequantized to f32 by
  llama.cpp's gguf-py (``gguf.quants.dequantize``, what ggml's dequantize
  gives), mapped back to its HF name (llama's Q/K row permutation undone),
  loaded into the f32 transformers model, one full-sequence forward over
  prompt+greedy (see ``gguf_refs``).  gguf-f32 equals logits.npy exactly.

``check_numpy.py`` (next to this file) re-implements all six models in plain
NumPy and checks every logits.npy / hidden.npy against it.
* ``meta.json`` -- sizes, layer kinds, versions, tensor lists, GGUF tensor
  types, etc.

GGUF conversion
---------------
The converter is run in a subprocess (``generate.py --convert DIR``) that
imports ``convert_hf_to_gguf`` from ``$LLAMA_CPP_SRC`` (default
``~/.cache/llama.cpp-0c1e570/src``) and monkeypatches exactly one thing:
``TextModel.get_vocab_base_pre`` (the hash table that recognises known
pre-tokenizers) is replaced by a function returning ``"gpt-2"``, which is the
truth for our tokenizer (plain GPT-2 ByteLevel pre-tokenizer).  Nothing else
is patched, except that when the ``sentencepiece`` package is missing,
``TextModel._set_vocab_sentencepiece`` raises FileNotFoundError (what it does
anyway when there is no tokenizer.model) so that LlamaModel.set_vocab falls
back to the GPT-2 BPE path instead of dying on the import.  ``llama-quantize``
is looked up in ``$LLAMA_CPP_BIN`` (default
``~/.cache/llama.cpp-0c1e570/bin``, then ``.../build/bin``).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
LLAMA_CPP_SRC = Path(os.environ.get("LLAMA_CPP_SRC", "~/.cache/llama.cpp-0c1e570/src")).expanduser()
LLAMA_CPP_BIN = Path(os.environ.get("LLAMA_CPP_BIN", "~/.cache/llama.cpp-0c1e570/bin")).expanduser()
GGUF_PRE = "gpt-2"
GGUF_OUTTYPES = ["f32", "f16", "bf16", "q8_0"]

VOCAB = 512
N_GREEDY = 24
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Training text for the tiny tokenizer (any fixed text works; it only has to
# yield >= 253 merges).
CORPUS = """
The quick brown fox jumps over the lazy dog. A small language model reads tokens one at a time,
keeps a cache of keys and values, and predicts the next token. Short convolutions mix nearby
positions cheaply, while attention layers look back over the whole context or over a sliding
window of recent tokens. Rotary position embeddings rotate pairs of query and key channels by an
angle that grows with the position. Root mean square normalization rescales every vector so that
its mean square equals one, then multiplies by a learned weight. The feed forward block uses a
gated linear unit with the SiLU activation: the gate and the up projection are multiplied, and the
down projection brings the result back to the hidden size. Quantization stores weights in blocks
of thirty two values with one scale per block; the k-quants use super blocks of two hundred and
fifty six values. Tests compare logits, hidden states and greedy tokens against this reference.
Hello world! How are you today? I am fine, thank you. What is the capital of France? It is Paris.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 512 1024 2048 65536. Rust is a systems language.
def main():\n    print("hello")\n    return 0\nfn main() { println!("hello"); }
""" * 3


# ----------------------------------------------------------------------------
# GGUF conversion subprocess
# ----------------------------------------------------------------------------

def _convert_main(model_dir: str, jobs: list[tuple[str, str]]) -> None:
    sys.path.insert(0, str(LLAMA_CPP_SRC / "gguf-py"))
    sys.path.insert(0, str(LLAMA_CPP_SRC))
    import convert_hf_to_gguf  # noqa: F401  (registers the model classes)
    from conversion import base as conv_base

    # The only patch: our tokenizer's pre-tokenizer hash is unknown to the
    # converter; it is a plain GPT-2 ByteLevel pre-tokenizer.
    def get_vocab_base_pre(self, tokenizer) -> str:
        return GGUF_PRE

    conv_base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    # LlamaModel.set_vocab tries SentencePiece first and only falls back to the
    # GPT-2 BPE path on FileNotFoundError.  Without the `sentencepiece` package
    # the import fails with ModuleNotFoundError before the tokenizer.model
    # existence check; emulate that check instead (no tokenizer.model here).
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        def _no_sentencepiece(self, *a, **k):
            raise FileNotFoundError("no tokenizer.model (sentencepiece not installed)")

        conv_base.TextModel._set_vocab_sentencepiece = _no_sentencepiece

    for outtype, outfile in jobs:
        sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", outtype, "--outfile", outfile]
        convert_hf_to_gguf.main()


# ----------------------------------------------------------------------------
# Everything below runs in the main process
# ----------------------------------------------------------------------------

def make_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([line for line in CORPUS.split("\n") if line], trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIALS[BOS_ID],
        eos_token=SPECIALS[EOS_ID],
        pad_token=SPECIALS[PAD_ID],
        unk_token=None,
        model_max_length=2048,
        chat_template=CHAT_TEMPLATE,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))


def randomize_(model, seed: int, embed_std: float = 0.1) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "conv.conv" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(embed_std * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def full_logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(full_logits(model, seq)[-1].argmax()))
    return seq[len(prompt):]


def hidden_states(model, prompt: list[int]):
    import torch

    inner = model.model
    caps: dict[int, torch.Tensor] = {}

    def hook(idx):
        def fn(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            caps[idx] = t.detach()[0].float().clone()
        return fn

    handles = [inner.embed_tokens.register_forward_hook(hook(0))]
    for i, layer in enumerate(inner.layers):
        handles.append(layer.register_forward_hook(hook(i + 1)))
    try:
        full_logits(model, prompt)
    finally:
        for h in handles:
            h.remove()
    n = len(inner.layers) + 1
    assert sorted(caps) == list(range(n))
    return torch.stack([caps[i] for i in range(n)])


def ffn_width(model) -> int:
    return int(model.model.layers[0].feed_forward.w1.weight.shape[0]) if hasattr(
        model.model.layers[0], "feed_forward") else int(model.model.layers[0].mlp.gate_proj.weight.shape[0])


def safetensors_index(path: Path) -> dict:
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), "pt") as f:
        for k in sorted(f.keys()):
            sl = f.get_slice(k)
            out[k] = {"dtype": sl.get_dtype(), "shape": list(sl.get_shape())}
    return out


def gguf_index(path: Path) -> dict:
    sys.path.insert(0, str(LLAMA_CPP_SRC / "gguf-py"))
    import gguf

    r = gguf.GGUFReader(str(path))
    tensors = {t.name: {"type": t.tensor_type.name, "shape": [int(x) for x in t.shape]} for t in r.tensors}
    kv = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name.startswith("tokenizer.ggml.") and f.name not in (
                "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_eos_token"):
            continue
        try:
            v = f.contents()
        except Exception:  # pragma: no cover
            v = "?"
        if isinstance(v, str) and len(v) > 200:
            v = v[:200] + "..."
        kv[f.name] = v
    return {"kv": kv, "tensors": tensors}


# ----------------------------------------------------------------------------
# Fixture specs
# ----------------------------------------------------------------------------

PROMPT_TEXT = "The quick brown fox jumps over the lazy dog"
PROMPT_TEXT_LONG = "Hello world! How are you today? Rust is a systems language."


def lfm2_a_hub_config(dtype: str = "float32") -> dict:
    return {
        "architectures": ["Lfm2ForCausalLM"],
        "block_auto_adjust_ff_dim": True,
        "block_dim": 64,
        "block_ff_dim": 60,
        "block_ffn_dim_multiplier": 1.5,
        "block_mlp_init_scale": 1.0,
        "block_multiple_of": 16,
        "block_norm_eps": 1e-05,
        "block_out_init_scale": 1.0,
        "block_use_swiglu": True,
        "block_use_xavier_init": True,
        "bos_token_id": BOS_ID,
        "conv_L_cache": 3,
        "conv_bias": False,
        "conv_dim": 64,
        "conv_dim_out": 64,
        "conv_use_xavier_init": True,
        "eos_token_id": EOS_ID,
        "full_attn_idxs": [2, 4],
        "hidden_size": 64,
        "initializer_range": 0.1,
        "max_position_embeddings": 2048,
        "model_type": "lfm2",
        "norm_eps": 1e-05,
        "num_attention_heads": 4,
        "num_heads": 4,
        "num_hidden_layers": 5,
        "num_key_value_heads": 2,
        "pad_token_id": PAD_ID,
        "rope_theta": 1000000.0,
        "torch_dtype": dtype,
        "transformers_version": "4.54.0.dev0",
        "use_cache": True,
        "use_pos_enc": True,
        "vocab_size": VOCAB,
    }


def lfm2_moe_hub_config(dtype: str = "float32") -> dict:
    """An LFM2-8B-A1B-style config.json (the Hub's 4.x spelling: top-level rope_theta,
    torch_dtype), shrunk: 4 layers of which the first is dense, 8 experts of width 32, top 3,
    a routed scaling factor of 1.7 (not 1, so ignoring it cannot pass)."""
    return {
        "architectures": ["Lfm2MoeForCausalLM"],
        "bos_token_id": BOS_ID,
        "conv_L_cache": 3,
        "conv_bias": False,
        "eos_token_id": EOS_ID,
        "hidden_size": 64,
        "initializer_range": 0.1,
        "intermediate_size": 64,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "max_position_embeddings": 2048,
        "model_type": "lfm2_moe",
        "moe_intermediate_size": 32,
        "norm_eps": 1e-05,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_dense_layers": 1,
        "num_experts": 8,
        "num_experts_per_tok": 3,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "pad_token_id": PAD_ID,
        "rope_theta": 1000000.0,
        "routed_scaling_factor": 1.7,
        "tie_embedding": True,
        "torch_dtype": dtype,
        "transformers_version": "4.57.0.dev0",
        "use_cache": True,
        "use_expert_bias": True,
        "vocab_size": VOCAB,
    }


def build(name: str):
    """Return (model, hub_config_or_None, prompt_text, expected_ffn)."""
    import torch
    from transformers import (AutoConfig, Lfm2Config, Lfm2ForCausalLM, Lfm2MoeConfig, Lfm2MoeForCausalLM,
                              Lfm3Config, Lfm3ForCausalLM, LlamaConfig,
                              LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048, initializer_range=0.1, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
                  eos_token_id=EOS_ID)
    torch.manual_seed(0)
    hub = None
    prompt = PROMPT_TEXT
    def from_hub(hub: dict):
        """The config transformers reads from `hub` written as the fixture's config.json."""
        tmp = FIXTURES / name
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.json").write_text(json.dumps(hub, indent=2) + "\n")
        return AutoConfig.from_pretrained(str(tmp))

    if name == "lfm2_a":
        hub = lfm2_a_hub_config()
        cfg = from_hub(hub)
        assert isinstance(cfg, Lfm2Config)
        assert cfg.layer_types == ["conv", "conv", "full_attention", "conv", "full_attention"], cfg.layer_types
        assert cfg.intermediate_size == 60
        model = Lfm2ForCausalLM(cfg)
        expected_ffn = 64  # int(2*60/3)=40; int(1.5*40)=60; ceil to 16 -> 64
    elif name == "lfm2_b":
        cfg = Lfm2Config(**common, num_hidden_layers=3, intermediate_size=64, block_auto_adjust_ff_dim=False,
                         layer_types=["full_attention", "conv", "full_attention"], conv_L_cache=3,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, norm_eps=1e-5,
                         tie_word_embeddings=True)
        model = Lfm2ForCausalLM(cfg)
        expected_ffn = 64
    elif name == "lfm3":
        cfg = Lfm3Config(**common, num_hidden_layers=4, intermediate_size=64, head_dim=16,
                         layer_types=["conv", "sliding_attention", "full_attention", "sliding_attention"],
                         sliding_window=8, conv_L_cache=7, norm_eps=1e-5, tie_word_embeddings=True,
                         rope_parameters={
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                                                "partial_rotary_factor": 0.5},
                         })
        model = Lfm3ForCausalLM(cfg)
        expected_ffn = 64
        prompt = PROMPT_TEXT_LONG
    elif name == "lfm2_moe":
        # Saved in the Hub's layout (per-expert w1/w2/w3, a 4.x-spelled config.json); `fused/`
        # holds the same weights in transformers 5.x's fused layout (gate_up_proj, down_proj).
        hub = lfm2_moe_hub_config()
        cfg = from_hub(hub)
        assert isinstance(cfg, Lfm2MoeConfig)
        assert cfg.rope_parameters["rope_theta"] == 1000000.0, cfg.rope_parameters
        model = Lfm2MoeForCausalLM(cfg)
        expected_ffn = 64
    elif name == "qwen2":
        cfg = Qwen2Config(**common, num_hidden_layers=2, intermediate_size=64, tie_word_embeddings=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6)
        model = Qwen2ForCausalLM(cfg)
        expected_ffn = 64
    elif name == "qwen3":
        cfg = Qwen3Config(**common, num_hidden_layers=2, intermediate_size=64, head_dim=32, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6)
        model = Qwen3ForCausalLM(cfg)
        expected_ffn = 64
    elif name == "llama":
        cfg = LlamaConfig(**common, num_hidden_layers=2, intermediate_size=256, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, rms_norm_eps=1e-5)
        model = LlamaForCausalLM(cfg)
        expected_ffn = 256
    else:
        raise KeyError(name)
    model = model.float().eval()
    model.config._attn_implementation = "eager"
    return model, hub, prompt, expected_ffn


SEEDS = {"lfm2_a": 11, "lfm2_b": 29, "lfm3": 13, "qwen2": 22, "qwen3": 20, "llama": 17, "lfm2_moe": 31}
# Tied 2-layer qwen3 repeats its last token under greedy decoding unless the
# (tied) embedding is small relative to the layer outputs.
EMBED_STD = {"qwen3": 0.03}
ALL = list(SEEDS)
GGUF_FIXTURES = ["lfm2_a", "lfm2_b", "qwen2", "qwen3", "llama", "lfm2_moe"]  # converted by llama.cpp's converter
# llama.cpp has no LFM3 architecture: write_lfm3_ggufs writes these with gguf-py's GGUFWriter.
OWN_GGUF_FIXTURES = ["lfm3"]


def load(dir_: Path):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(dir_), dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def layer_kinds(cfg) -> list[str]:
    lt = getattr(cfg, "layer_types", None)
    if lt is None:
        return ["full_attention"] * cfg.num_hidden_layers
    return list(lt)


def save_np(path: Path, t) -> None:
    import numpy as np

    np.save(str(path), t.detach().cpu().numpy().astype(np.float32))


def gen_fixture(name: str, tok_dir: Path) -> dict:
    import numpy as np
    import safetensors
    import tokenizers
    import torch
    import transformers

    out = FIXTURES / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    model, hub, prompt_text, expected_ffn = build(name)
    randomize_(model, SEEDS[name], EMBED_STD.get(name, 0.1))
    if name == "lfm2_moe":
        randomize_expert_bias_(model, SEEDS[name])
    assert ffn_width(model) == expected_ffn, (ffn_width(model), expected_ffn)

    tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    prompt = tok.encode(prompt_text).ids
    if name == "lfm3":
        assert len(prompt) > model.config.sliding_window
    assert 12 <= len(prompt) <= 24, len(prompt)

    # f32 checkpoint
    model.save_pretrained(str(out))
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)
    if hub is not None:
        (out / "config.json").write_text(json.dumps(hub, indent=2) + "\n")

    # Reload from disk: the fixture must be what the references are computed from.
    ref = load(out)
    assert ffn_width(ref) == expected_ffn
    sd_a, sd_b = model.state_dict(), ref.state_dict()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k

    gen = greedy(ref, prompt, N_GREEDY)
    seq = prompt + gen
    logits = full_logits(ref, seq)
    hid = hidden_states(ref, prompt)
    # sanity: the full-sequence rows reproduce the greedy choices
    assert [int(x) for x in logits[len(prompt) - 1:-1].argmax(-1)] == gen
    top2 = logits[len(prompt) - 1:-1].topk(2, dim=-1).values
    min_margin = float((top2[:, 0] - top2[:, 1]).min())
    if name == "lfm2_moe":
        moe_meta = check_moe_routing(ref, seq)
        write_fused_layout(ref, out)
    (out / "prompt_ids.json").write_text(json.dumps(prompt) + "\n")
    (out / "greedy.json").write_text(json.dumps(gen) + "\n")
    save_np(out / "logits.npy", logits)
    save_np(out / "hidden.npy", hid)

    # half-precision copies: stored in f16/bf16, evaluated after upcast to f32
    half = {}
    for dname, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        sub = out / dname
        m = copy.deepcopy(ref).to(dt)
        m.config.dtype = dt
        m.save_pretrained(str(sub))
        if hub is not None:
            hub_cfg = lfm2_moe_hub_config if name == "lfm2_moe" else lfm2_a_hub_config
            (sub / "config.json").write_text(json.dumps(hub_cfg(
                "float16" if dt == torch.float16 else "bfloat16"), indent=2) + "\n")
        st = safetensors_index(sub / "model.safetensors")
        want = "F16" if dt == torch.float16 else "BF16"
        assert all(v["dtype"] == want for v in st.values()), st
        hm = load(sub)
        assert all(p.dtype == torch.float32 for p in hm.parameters())
        save_np(sub / "logits.npy", full_logits(hm, seq))
        hg = greedy(hm, prompt, N_GREEDY)
        (sub / "greedy.json").write_text(json.dumps(hg) + "\n")
        half[dname] = {"greedy_matches_f32": hg == gen,
                       "max_abs_logit_diff_vs_f32": float((full_logits(hm, seq) - logits).abs().max())}

    cfg = ref.config
    kinds = layer_kinds(cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = {
        "name": name,
        "family": {"lfm2_a": "lfm2", "lfm2_b": "lfm2"}.get(name, name),
        "model_type": cfg.model_type,
        "architecture": type(ref).__name__,
        "config_style": "hub-4.x" if hub is not None else "transformers-5.x",
        "n_layers": cfg.num_hidden_layers,
        "layer_kinds": kinds,
        "hidden_size": cfg.hidden_size,
        "ffn_width": ffn_width(ref),
        "intermediate_size_config": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "n_heads": cfg.num_attention_heads,
        "n_kv_heads": cfg.num_key_value_heads,
        "head_dim": head_dim,
        "norm_eps": getattr(cfg, "norm_eps", None) or getattr(cfg, "rms_norm_eps", None),
        "rope_parameters": cfg.rope_parameters,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "conv_L_cache": getattr(cfg, "conv_L_cache", None),
        "sliding_window": getattr(cfg, "sliding_window", None) if "sliding_attention" in kinds else None,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "prompt_text": prompt_text,
        "prompt_len": len(prompt),
        "n_greedy": N_GREEDY,
        "greedy_distinct_tokens": len(set(gen)),
        "greedy_min_top1_top2_margin": min_margin,
        "logits_shape": list(logits.shape),
        "hidden_shape": list(hid.shape),
        "hidden_rows": "row 0 = embed_tokens output; row i+1 = decoder layer i output (before final norm)",
        "half_precision": half,
        "safetensors": safetensors_index(out / "model.safetensors"),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "numpy": np.__version__, "safetensors": safetensors.__version__,
                     "tokenizers": tokenizers.__version__},
        "seed": SEEDS[name],
        "init": {"weights_std": 0.1, "embed_std": EMBED_STD.get(name, 0.1), "conv_kernel_std": 0.3,
                 "norm_weights": "1 + 0.3*randn", "biases": "0.1*randn"},
    }
    if name == "lfm2_moe":
        meta["moe"] = moe_meta
    if name == "lfm2_a":
        meta["ffn_width_rule"] = "int(2*60/3)=40 -> int(1.5*40)=60 -> 16*ceil(60/16)=64"
    return meta


def randomize_expert_bias_(model, seed: int) -> None:
    """`expert_bias` is a buffer (randomize_ sets parameters only): random and non-zero, the
    size of the sigmoid scores' spread, so that it changes which experts are chosen."""
    import torch

    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for layer in model.model.layers:
            ff = layer.feed_forward
            if hasattr(ff, "expert_bias"):
                ff.expert_bias.copy_(0.15 * torch.randn(ff.expert_bias.shape, generator=g))


def check_moe_routing(model, seq: list[int]) -> dict:
    """How many (token, layer) choices the expert bias changes over the fixture's sequence: a
    model that ignores it (or weighs by the biased scores) must not be able to pass."""
    import torch

    caps = []
    hooks = [layer.feed_forward.gate.register_forward_hook(
        lambda mod, inp, out, ff=layer.feed_forward: caps.append((inp[0].detach().clone(), ff)))
        for layer in model.model.layers if hasattr(layer.feed_forward, "gate")]
    try:
        full_logits(model, seq)
    finally:
        for h in hooks:
            h.remove()
    changed = total = 0
    margin = float("inf")
    for x, ff in caps:
        scores = torch.nn.functional.linear(x, ff.gate.weight).sigmoid()
        k = ff.gate.top_k
        with_bias = (scores + ff.expert_bias).topk(k, dim=-1).indices.sort(-1).values
        without = scores.topk(k, dim=-1).indices.sort(-1).values
        changed += int((with_bias != without).any(-1).sum())
        total += x.shape[0]
        top = (scores + ff.expert_bias).topk(k + 1, dim=-1).values
        margin = min(margin, float((top[:, k - 1] - top[:, k]).min()))
    assert changed > 0, "the expert bias changes no routing choice: make it larger"
    # a choice this close could flip under another order of f32 rounding
    assert margin > 1e-4, f"a routing choice is a near tie ({margin}): pick another seed"
    return {"routing_choices_changed_by_expert_bias": changed, "routing_choices": total,
            "min_kth_score_margin": margin}


def write_fused_layout(model, out: Path) -> None:
    """`fused/`: the same model in transformers 5.x's fused expert layout (the module's own
    state dict: `experts.gate_up_proj` [E, 2I, H] = w1 rows then w3 rows, `experts.down_proj`)
    with a 5.x config.json; asserted to load to the same weights."""
    import torch
    from safetensors.torch import save_file

    sub = out / "fused"
    sub.mkdir()
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert any(k.endswith("experts.gate_up_proj") for k in sd), sorted(sd)
    save_file(sd, str(sub / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    (sub / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(out / f, sub / f)
    again = load(sub)
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


def run_gguf(name: str, meta: dict) -> None:
    out = FIXTURES / name
    jobs = [(t, str(out / f"model-{t}.gguf")) for t in GGUF_OUTTYPES]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--convert", str(out), json.dumps(jobs)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        meta["gguf_error"] = r.stderr[-4000:]
        print(f"[{name}] GGUF conversion FAILED:\n{r.stderr[-4000:]}", file=sys.stderr)
        return
    meta["gguf"] = {}
    for t in GGUF_OUTTYPES:
        p = out / f"model-{t}.gguf"
        meta["gguf"][p.name] = gguf_index(p)

    if name in QUANTIZED:
        quantize_ggufs(name, meta, QUANTIZED[name])


# llama-quantize's files per fixture: (llama-quantize type, file name). IQ4_NL/IQ4_XS: the
# i-quants lone reads; IQ4_XS's 256-element blocks fit only llama's ffn_down rows (FFN 256),
# the 64-wide rows fall back to IQ4_NL (llama-quantize's fallback), so that file holds both.
# The codebook i-quants and ternary types: `--pure` (so that ffn_down is the named type
# rather than llama-quantize's mix for it), with an importance matrix (required by IQ1/IQ2)
# that llama-imatrix computes from IMATRIX_TEXT on the fixture itself (`imatrix.gguf`).
# (llama-quantize's IQ2_S mix is IQ2_XS at its base; its IQ2_M's base is IQ2_S.)
PURE_IQ = tuple((q, f"model-{t.lower()}.gguf", "--pure", "--imatrix")
                for q, t in (("IQ2_XXS", "IQ2_XXS"), ("IQ2_XS", "IQ2_XS"), ("IQ2_M", "IQ2_S"),
                             ("IQ3_XXS", "IQ3_XXS"), ("IQ3_S", "IQ3_S"), ("IQ1_S", "IQ1_S"),
                             ("IQ1_M", "IQ1_M"), ("TQ1_0", "TQ1_0"), ("TQ2_0", "TQ2_0")))
QUANTIZED = {
    "llama": (("Q4_0", "model-q4_0.gguf"), ("Q4_K_M", "model-q4_k.gguf"),
              ("IQ4_NL", "model-iq4_nl.gguf"), ("IQ4_XS", "model-iq4_xs.gguf")) + PURE_IQ,
    "lfm2_moe": (("Q4_0", "model-q4_0.gguf"),),
}


def quantize_ggufs(name: str, meta: dict, todo) -> None:
    """``llama-quantize`` each of ``todo`` from the fixture's model-f32.gguf, recording the
    files' tensor types in ``meta["gguf"]``."""
    out = FIXTURES / name
    q = None
    for cand in (LLAMA_CPP_BIN / "llama-quantize", LLAMA_CPP_BIN.parent / "build" / "bin" / "llama-quantize"):
        if cand.is_file():
            q = cand
            break
    if q is None:
        meta["quantize"] = "skipped: llama-quantize binary not found"
        print(f"[{name}] llama-quantize not found, skipping {', '.join(t for t, _ in todo)}", file=sys.stderr)
        return
    for qt, fname, *flags in todo:
        args = [a for a in flags if a != "--imatrix"]
        if "--imatrix" in flags:
            tool = next((c for c in (q.parent / "llama-imatrix",
                                     LLAMA_CPP_BIN.parent / "build" / "bin" / "llama-imatrix")
                         if c.is_file()), None)
            if tool is None:
                print(f"[{name}] llama-imatrix not found, skipping {qt}", file=sys.stderr)
                continue
            args += ["--imatrix", str(imatrix_for(name, tool))]
        r = subprocess.run([str(q), *args, str(out / "model-f32.gguf"), str(out / fname), qt, "1"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            meta.setdefault("quantize_errors", {})[fname] = r.stderr[-2000:]
            print(f"[{name}] llama-quantize {qt} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
            continue
        meta["gguf"][fname] = gguf_index(out / fname)
        meta["gguf"][fname]["llama_quantize_type"] = qt
        iq = iq_dequant_digests(out / fname)
        if iq:
            meta["gguf"][fname]["iq_dequant_sha256"] = iq


IMATRIX_TEXT = """The quick brown fox jumps over the lazy dog. A small model runs on a phone, a laptop
or a Raspberry Pi; it reads a prompt, looks at its cache and writes one token at a time.
Importance matrices weigh each column of a weight by how large the activations that meet it
are, so that the quantizer spends its few levels where the products are largest. 1 2 3 4 5
6 7 8 9 10. What is 2 + 2? Four. Where is Paris? In France. def add(a, b): return a + b
""" * 8


def imatrix_for(name: str, tool: Path) -> Path:
    """The fixture's importance matrix (made once by llama-imatrix from IMATRIX_TEXT)."""
    out = FIXTURES / name / "imatrix.gguf"
    if not out.exists():
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(IMATRIX_TEXT)
            f.flush()
            subprocess.run([str(tool), "-m", str(FIXTURES / name / "model-f32.gguf"), "-f", f.name,
                            "-o", str(out), "-c", "64", "-t", "2"], check=True, capture_output=True)
    return out


def iq_dequant_digests(path: Path) -> dict:
    """SHA-256 of gguf-py's dequantization (f32, little endian, row-major) of every i-quant
    tensor of a GGUF: lone's dequantization of each must hash the same (bit for bit)."""
    import hashlib

    import numpy as np

    gguf = _import_gguf()
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type.name.startswith(("IQ", "TQ")):
            deq = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype="<f4")
            out[t.name] = hashlib.sha256(np.ascontiguousarray(deq).tobytes()).hexdigest()
    return out


# ----------------------------------------------------------------------------
# Exact references for the GGUF files
# ----------------------------------------------------------------------------

def _import_gguf():
    sys.path.insert(0, str(LLAMA_CPP_SRC / "gguf-py"))
    import gguf

    # The PyPI gguf package (0.19) has a stale Q8_1 block size; use llama.cpp's copy.
    assert Path(gguf.__file__).resolve().is_relative_to(LLAMA_CPP_SRC.resolve()), gguf.__file__
    return gguf


def gguf_hf_name(family: str, gname: str) -> str:
    """HF state-dict name of a GGUF tensor written by convert_hf_to_gguf.py."""
    lfm2 = family in ("lfm2", "lfm3", "lfm2_moe")
    top = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
           "output_norm.weight": "model.embedding_norm.weight" if lfm2 else "model.norm.weight",
           "token_embd_norm.weight": "model.embedding_norm.weight"}
    if gname in top:
        return top[gname]
    blk, bid, rest = gname.split(".", 2)
    assert blk == "blk", gname
    base, suffix = rest.rsplit(".", 1)
    if family == "lfm3":
        return f"model.layers.{bid}.{LFM3_GGUF_TO_HF[base]}.{suffix}"
    if lfm2:
        table = {"ffn_gate_inp": "feed_forward.gate", "exp_probs_b": "feed_forward.expert_bias",
                 "ffn_down_exps": "feed_forward.experts.down_proj",
                 "attn_norm": "operator_norm", "ffn_norm": "ffn_norm",
                 "ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
                 "attn_output": "self_attn.out_proj", "attn_q_norm": "self_attn.q_layernorm",
                 "attn_k_norm": "self_attn.k_layernorm", "shortconv.conv": "conv.conv",
                 "shortconv.in_proj": "conv.in_proj", "shortconv.out_proj": "conv.out_proj"}
    else:
        table = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
                 "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                 "attn_k_norm": "self_attn.k_norm"}
    table.update({"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj"})
    if base in ("ffn_gate_exps", "ffn_up_exps"):
        # both halves of transformers' fused gate_up_proj (w1 rows, then w3 rows)
        return f"model.layers.{bid}.feed_forward.experts.gate_up_proj"
    if base in ("exp_probs_b", "ffn_down_exps"):
        return f"model.layers.{bid}.{table[base]}"
    return f"model.layers.{bid}.{table[base]}.{suffix}"


def gguf_refs(name: str, kinds: list[str] | None = None) -> None:
    """For every ``model-<kind>.gguf`` of a fixture: dequantize all its tensors to f32 (gguf-py,
    the same values ggml's dequantize gives), load them into the f32 transformers model under
    their HF names (undoing llama's Q/K row permutation), and save one full-sequence forward over
    prompt+greedy as ``gguf-<kind>.logits.npy`` -- the exact reference for that GGUF."""
    import numpy as np
    import torch

    gguf = _import_gguf()
    out = FIXTURES / name
    meta = json.loads((out / "meta.json").read_text())
    family, tied = meta["family"], meta["tie_word_embeddings"]
    seq = json.loads((out / "prompt_ids.json").read_text()) + json.loads((out / "greedy.json").read_text())
    f32_ref = torch.from_numpy(np.load(out / "logits.npy"))
    base = load(out)
    if tied:
        assert base.lm_head.weight is base.model.embed_tokens.weight
    for path in sorted(out.glob("model-*.gguf")):
        kind = path.stem.removeprefix("model-")
        if kinds and kind not in kinds:
            continue
        model = copy.deepcopy(base)
        if family == "lfm2_moe":
            # llama.cpp's converter writes no routed scaling factor (lfm2moe.expert_weights_scale,
            # which llama.cpp's lfm2moe reader ignores anyway): the file means 1.
            reader = gguf.GGUFReader(str(path))
            f = reader.fields.get("lfm2moe.expert_weights_scale")
            scale = float(f.contents()) if f is not None else 1.0
            for layer in model.model.layers:
                if hasattr(layer.feed_forward, "gate"):
                    layer.feed_forward.gate.routed_scaling_factor = scale
        sd = model.state_dict()
        todo = set(sd) - ({"lm_head.weight"} if tied else set())
        pending_halves: dict[str, set] = {}
        types = set()
        for t in gguf.GGUFReader(str(path)).tensors:
            if t.name == "rope_freqs.weight":
                continue  # lfm3: RoPE frequency factors, checked by write_lfm3_ggufs
            w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
            types.add(t.tensor_type.name)
            hf = gguf_hf_name(family, t.name)
            if family == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
                # convert_hf_to_gguf permutes llama's q/k rows so that rope pairs are adjacent:
                # within a head, GGUF row 2i+j is HF row j*hd/2+i.  Undo it.
                n_head = meta["n_heads"] if "q_proj" in hf else meta["n_kv_heads"]
                w = w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
            if hf.endswith("conv.conv.weight"):
                w = w.unsqueeze(1)  # [H, K] -> [H, 1, K]
            if hf.endswith("gate_up_proj"):
                # the GGUF's stacked gate (w1) or up (w3) experts: one half of the fused tensor
                half = sd[hf].shape[1] // 2
                lo = 0 if ".ffn_gate_exps." in t.name else half
                assert tuple(w.shape) == (sd[hf].shape[0], half, sd[hf].shape[2]), (t.name, w.shape)
                with torch.no_grad():
                    sd[hf][:, lo:lo + half].copy_(w)
                halves = pending_halves.setdefault(hf, set())
                halves.add(lo)
                if len(halves) == 2:
                    todo.remove(hf)
                continue
            assert hf in todo, (path.name, t.name, hf)
            todo.remove(hf)
            assert sd[hf].shape == w.shape, (t.name, hf, sd[hf].shape, w.shape)
            with torch.no_grad():
                sd[hf].copy_(w)
        assert not todo, (path.name, sorted(todo))
        if family == "lfm2_moe" and kind == "f32":
            # the name mapping checked with the checkpoint's own scaling factor
            for layer in model.model.layers:
                if hasattr(layer.feed_forward, "gate"):
                    layer.feed_forward.gate.routed_scaling_factor = base.config.routed_scaling_factor
            assert float((full_logits(model, seq) - f32_ref).abs().max()) <= 1e-5
            for layer in model.model.layers:
                if hasattr(layer.feed_forward, "gate"):
                    layer.feed_forward.gate.routed_scaling_factor = scale
        logits = full_logits(model, seq)
        save_np(out / f"gguf-{kind}.logits.npy", logits)
        d = float((logits - f32_ref).abs().max())
        print(f"   gguf-{kind}.logits.npy  max|d| vs f32 reference {d:.3g}  ({'/'.join(sorted(types))})", flush=True)
        if kind == "f32" and family != "lfm2_moe":
            # sanity check of the name mapping / unpermute: same weights, same model
            assert d <= 1e-5, d


# ----------------------------------------------------------------------------
# LFM3 GGUFs (llama.cpp has no LFM3 architecture yet; see DEVELOPERS.md "LFM3 in GGUF")
# ----------------------------------------------------------------------------

LFM3_GGUF_TYPES = ["f32", "f16", "bf16", "q8_0"]

# blk.N.<gguf> <-> model.layers.N.<hf>: llama.cpp's lfm2 names, plus the names llama.cpp uses
# for the same tensors elsewhere (gemma2/3 post norms; bailingmoe3/dots3note per-head gate,
# which llama.cpp's tensor map also takes from `self_attn.gate_proj` / `self_attn.g_proj`).
LFM3_GGUF_TO_HF = {
    "attn_norm": "operator_norm",
    "post_attention_norm": "post_operator_norm",
    "ffn_norm": "ffn_norm",
    "post_ffw_norm": "post_ffn_norm",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2",
    "shortconv.conv": "conv.conv",
    "shortconv.in_proj": "conv.in_proj",
    "shortconv.out_proj": "conv.out_proj",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_gate": "self_attn.g_proj",  # the module (state_dict) name; saved as self_attn.gate_proj
}


def lfm3_gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
           # llama.cpp's lfm2 stores the final `embedding_norm` as token_embd_norm; lfm3 keeps that.
           "model.embedding_norm.weight": "token_embd_norm.weight"}
    if hf in top:
        return top[hf]
    _, _, bid, rest = hf.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    inv = {v: k for k, v in LFM3_GGUF_TO_HF.items()}
    inv["self_attn.gate_proj"] = "attn_gate"  # transformers 5.24 saves g_proj under this name
    return f"blk.{bid}.{inv[module]}.{suffix}"


def _gguf_vocab(gguf, w, model_dir: Path, vocab_size: int) -> None:
    """Tokenizer metadata as convert_hf_to_gguf.py's GPT-2 BPE path writes it: every id's token
    (added special tokens CONTROL, other added tokens USER_DEFINED, the rest NORMAL), merges,
    special ids, add_bos/add_eos and the chat template (gguf-py's SpecialVocab)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rev = {i: t for t, i in tok.vocab.items()}
    added = tok.get_added_vocab()
    tokens, types = [], []
    for i in range(vocab_size):
        t = rev.get(i)
        if t is None:  # a vocabulary padded past the tokenizer, as the converter pads it
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        if t in added:
            types.append(gguf.TokenType.CONTROL if tok.added_tokens_decoder[i].special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(GGUF_PRE)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(str(model_dir), load_merges=True).add_to_gguf(w)


def _tokenizer_fields(gguf, path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {f.name: f.contents() for f in r.fields.values() if f.name.startswith("tokenizer.")}


def write_lfm3_ggufs(name: str, src: Path | None = None, types: list[str] | None = None,
                     display: str = "Lfm3") -> dict:
    """``model-{f32,f16,bf16,q8_0}.gguf`` of the lfm3 fixture (or of the lfm3 checkpoint in
    ``src``, ``types`` of them, written there, ``general.name`` ``display``), written with gguf-py's GGUFWriter
    (llama.cpp has no LFM3 converter). Metadata and tensor names follow llama.cpp's conventions
    (DEVELOPERS.md); tensor types follow convert_hf_to_gguf.py's rules (1-D tensors, norms and
    the short-conv kernel stay F32, the rest takes the output type). The proportional RoPE of
    full-attention layers is gemma4's encoding: rope.dimension_count = head_dim and a
    ``rope_freqs`` tensor of per-pair frequency divisors (1 = rotated, 1e30 = not rotated),
    checked here against transformers' own inverse frequencies. Returns meta.json's ``gguf``."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file

    gguf = _import_gguf()
    out = src or FIXTURES / name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "lfm3"
    sd = load_file(str(out / "model.safetensors"))
    kinds = cfg["layer_types"]
    n_layers, hd = cfg["num_hidden_layers"], cfg["head_dim"]
    assert len(kinds) == n_layers and set(kinds) <= {"conv", "sliding_attention", "full_attention"}
    rp_full = cfg["rope_parameters"]["full_attention"]
    rp_swa = cfg["rope_parameters"]["sliding_attention"]
    assert rp_full["rope_type"] == "proportional" and rp_swa["rope_type"] == "default", cfg["rope_parameters"]
    assert cfg.get("use_attention_gate", True) and cfg.get("use_sandwich_norm", True)
    assert not cfg.get("conv_bias") and not cfg.get("attention_bias")

    # Proportional RoPE as llama.cpp's neox RoPE over all head_dim dims (theta_i = p *
    # base^(-2i/head_dim) / factor_i): factor 1 for the rotated pairs, 1e30 (angle 0) for the rest.
    rope_angles = int(rp_full.get("partial_rotary_factor", 1.0) * hd // 2)
    factors = np.array([1.0] * rope_angles + [1e30] * (hd // 2 - rope_angles), dtype=np.float32)
    rot = load(out).model.rotary_emb
    for lt, theta, f in (("full_attention", rp_full["rope_theta"], factors),
                         ("sliding_attention", rp_swa["rope_theta"], np.ones(hd // 2, np.float32))):
        want = getattr(rot, f"{lt}_inv_freq").numpy()
        ggml = (1.0 / (np.float64(theta) ** (np.arange(0, hd, 2) / hd)) / f.astype(np.float64)).astype(np.float32)
        off = f >= 1e30
        assert ((want == 0) == off).all(), (lt, want, f)
        assert np.allclose(ggml[~off], want[~off], rtol=1e-6, atol=0), (lt, ggml, want)
        # not rotated: angle < 1e-20 rad even at position max_position_embeddings
        assert (ggml[off] * cfg["max_position_embeddings"] < 1e-20).all(), (lt, ggml)

    ftypes = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
    qtypes = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
              "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
    result = {}
    for kind in types or LFM3_GGUF_TYPES:
        path = out / f"model-{kind}.gguf"
        w = gguf.GGUFWriter(str(path), "lfm3")
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(display)
        w.add_block_count(n_layers)
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(int(sd["model.layers.0.feed_forward.w1.weight"].shape[0]))
        w.add_head_count(cfg["num_attention_heads"])
        # as llama.cpp's lfm2: a per-layer kv head count, 0 for conv layers
        w.add_head_count_kv([0 if k == "conv" else cfg["num_key_value_heads"] for k in kinds])
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_layer_norm_rms_eps(cfg["norm_eps"])
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern([k == "sliding_attention" for k in kinds])
        w.add_rope_freq_base(rp_full["rope_theta"])
        w.add_rope_freq_base_swa(rp_swa["rope_theta"])
        w.add_rope_dimension_count(hd)
        w.add_rope_dimension_count_swa(hd)
        w.add_vocab_size(cfg["vocab_size"])
        w.add_shortconv_l_cache(cfg["conv_L_cache"])
        w.add_file_type(ftypes[kind])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _gguf_vocab(gguf, w, out, cfg["vocab_size"])

        w.add_tensor("rope_freqs.weight", factors, raw_dtype=gguf.GGMLQuantizationType.F32)
        for hf in sorted(sd):
            data = sd[hf].astype(np.float32)
            gname = lfm3_gguf_name(hf)
            if hf.endswith("conv.conv.weight"):
                data = data.squeeze(1)  # [H, 1, K] -> [H, K], as llama.cpp's lfm2
            qt = qtypes[kind]
            if data.ndim <= 1 or gname.endswith("_norm.weight") or ".shortconv.conv." in gname:
                qt = gguf.GGMLQuantizationType.F32
            try:
                q = gguf.quants.quantize(data, qt)
            except gguf.QuantError:
                qt = gguf.GGMLQuantizationType.F16
                q = gguf.quants.quantize(data, qt)
            w.add_tensor(gname, q, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        result[path.name] = gguf_index(path)
        print(f"   wrote {path.name}", flush=True)

    # The tokenizer metadata must be what llama.cpp's converter writes for the same tokenizer
    # (lfm2_b was converted by it from identical tokenizer files).
    other = FIXTURES / "lfm2_b"
    if (other / "model-f32.gguf").exists() and all(
            (other / f).read_bytes() == (out / f).read_bytes()
            for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")):
        mine, theirs = _tokenizer_fields(gguf, out / "model-f32.gguf"), _tokenizer_fields(gguf, other / "model-f32.gguf")
        assert mine == theirs, sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        print("   tokenizer metadata == llama.cpp converter's (lfm2_b/model-f32.gguf)", flush=True)
    else:
        print("   (lfm2_b/model-f32.gguf not comparable; tokenizer metadata not cross-checked)", flush=True)
    return result


def main(argv: list[str]) -> None:
    if len(argv) >= 1 and argv[0] == "--convert":
        _convert_main(argv[1], [tuple(j) for j in json.loads(argv[2])])
        return
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True)
    if len(argv) >= 1 and argv[0] == "--gguf-refs-only":
        for arg in argv[1:] or GGUF_FIXTURES + OWN_GGUF_FIXTURES:
            # NAME or NAME:KIND,KIND (only those model-KIND.gguf files)
            name, _, kinds = arg.partition(":")
            print(f"== {name}", flush=True)
            gguf_refs(name, kinds.split(",") if kinds else None)
        return
    if len(argv) >= 2 and argv[0] == "--quantize-only":
        # Only (re)make llama-quantize's files of one fixture from its model-f32.gguf, the
        # named types (llama-quantize type names; default all of QUANTIZED[name]), and record
        # them in meta.json. Their references: --gguf-refs-only NAME.
        name, types = argv[1], argv[2:]
        todo = [e for e in QUANTIZED[name] if not types or e[0] in types]
        meta_path = FIXTURES / name / "meta.json"
        meta = json.loads(meta_path.read_text())
        quantize_ggufs(name, meta, todo)
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        return
    if len(argv) >= 1 and argv[0] == "--lfm3-gguf":
        # (Re)write the LFM3 GGUFs from the committed checkpoint, then their references.
        meta_path = FIXTURES / "lfm3" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta.pop("gguf_note", None)
        meta["gguf"] = write_lfm3_ggufs("lfm3")
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        gguf_refs("lfm3")
        return
    names = argv or ALL
    import tempfile

    # build the shared tokenizer outside the repo, then copy it into each fixture
    tok_dir = Path(tempfile.mkdtemp(prefix="lone_tok_")) / "tokenizer"
    make_tokenizer(tok_dir)
    try:
        for name in names:
            print(f"== {name}", flush=True)
            meta = gen_fixture(name, tok_dir)
            if name in GGUF_FIXTURES:
                run_gguf(name, meta)
            elif name in OWN_GGUF_FIXTURES:
                meta["gguf"] = write_lfm3_ggufs(name)
            else:
                meta["gguf"] = None
            (FIXTURES / name / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            if meta.get("gguf"):
                gguf_refs(name)
            print(f"   prompt {meta['prompt_len']} tok, greedy {json.loads((FIXTURES / name / 'greedy.json').read_text())}",
                  flush=True)
    finally:
        shutil.rmtree(tok_dir.parent, ignore_errors=True)
    shutil.rmtree(FIXTURES / "_tokenizer_tmp", ignore_errors=True)  # left by older versions


if __name__ == "__main__":
    main(sys.argv[1:])
