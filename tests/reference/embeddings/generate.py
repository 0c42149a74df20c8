"""Embedding references from transformers: the base model's last_hidden_state (after the final
norm), mean-pooled over the tokens and L2-normalised — what llama-server's `--embeddings
--pooling mean` returns. Tokens from each fixture's tokenizer.json (its post-processor adds what
it adds).

  python tests/reference/embeddings/generate.py   (writes expected.json next to this file)
"""
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
INPUTS = ["Hello world", "The capital of France is Paris.", "日本語のテキスト 🌸", "a"]


def embed(name):
    d = FIXTURES / name
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    out = []
    for text in INPUTS:
        ids = tok.encode(text).ids
        with torch.no_grad():
            h = model.model(torch.tensor([ids])).last_hidden_state[0].double()
        v = h.mean(0)
        v = v / v.norm()
        out.append({"input": text, "ids": ids, "embedding": v.tolist()})
    return out


if __name__ == "__main__":
    res = {n: embed(n) for n in ["lfm2_a", "llama", "qwen3"]}
    (HERE / "expected.json").write_text(json.dumps({"inputs": INPUTS, "models": res}) + "\n")
    print({k: len(v) for k, v in res.items()})
