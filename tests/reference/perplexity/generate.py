"""Perplexity references from transformers, with llama-perplexity's method: the text tokenized
by its tokenizer.json (special-token text read as text), chunks of CTX tokens, each chunk's first
token replaced by BOS when the tokenizer adds one, the second half of each chunk scored.

  python tests/reference/perplexity/generate.py   (writes expected.json next to this file)
"""
import json
import math
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
TEXT = HERE.parent / "tokenizer" / "assets" / "lfm2" / "LICENSE.lfm1.0.txt"
CTX = 64


def ppl(name):
    d = FIXTURES / name
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    text = TEXT.read_bytes().decode("utf-8")  # as the file is: CRLF kept, as llama-perplexity reads it
    # The tokenizer.json itself (transformers 5 replaces some pre-tokenizers, e.g. Qwen2's).
    raw = Tokenizer.from_file(str(d / "tokenizer.json"))
    raw.encode_special_tokens = True
    ids = raw.encode(text).ids
    add_bos = tok.bos_token_id is not None and raw.encode("").ids[:1] == [tok.bos_token_id]
    n_chunks = len(ids) // CTX
    first = CTX // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for i in range(n_chunks):
        chunk = ids[i * CTX:(i + 1) * CTX]
        inp = list(chunk)
        if add_bos:
            inp[0] = tok.bos_token_id
        with torch.no_grad():
            logits = model(torch.tensor([inp])).logits[0].double()
        lp = torch.log_softmax(logits, dim=-1)
        for j in range(CTX - 1 - first):
            v = lp[first + j, chunk[first + j + 1]].item()
            nll -= v
            nll2 += v * v
        count += CTX - 1 - first
        running.append(math.exp(nll / count))
    mean = nll / count
    var = nll2 / count - mean * mean
    p = math.exp(mean)
    return {"tokens": len(ids), "chunks": n_chunks, "scored": count, "ppl": p,
            "stderr": math.sqrt(var / (count - 1)) * p, "running": running, "add_bos": add_bos}


if __name__ == "__main__":
    out = {"text": str(TEXT.relative_to(HERE.parent.parent.parent)), "ctx": CTX,
           "models": {n: ppl(n) for n in ["lfm2_a", "lfm3", "llama", "qwen2", "qwen3"]}}
    (HERE / "expected.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: (v["ppl"], v["tokens"]) for k, v in out["models"].items()}))
