# lone verify's reference: transformers runs the checkpoint on the prompt; writes the logits,
# the hidden states (embedding output and each decoder layer's, by forward hooks) and the
# greedy continuation. Usage: python3 reference.py MODEL_DIR IDS_JSON OUT_DIR N_NEW
import json
import struct
import sys

import torch
from transformers import AutoModelForCausalLM


def save_npy(path, t):
    t = t.detach().float().contiguous().cpu()
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join(f"{d}, " for d in t.shape)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(t.numpy().tobytes() if hasattr(t, "numpy") else bytes(t.untyped_storage()))


def main():
    model_dir, ids_path, out, n_new = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ids = json.load(open(ids_path))
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    inner = model.model
    caps = {}

    def hook(i):
        def fn(_m, _inp, o):
            caps[i] = (o[0] if isinstance(o, tuple) else o).detach()[0].float().clone()
        return fn

    hs = [inner.embed_tokens.register_forward_hook(hook(0))]
    hs += [l.register_forward_hook(hook(i + 1)) for i, l in enumerate(inner.layers)]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    for h in hs:
        h.remove()
    save_npy(f"{out}/logits.npy", logits)
    save_npy(f"{out}/hidden.npy", torch.stack([caps[i] for i in range(len(caps))]))
    toks, margins, seq = [], [], list(ids)
    last = logits[-1]
    with torch.no_grad():
        for _ in range(n_new):
            top = torch.topk(last, 2)
            t = int(top.indices[0])
            toks.append(t)
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(t)
            last = model(torch.tensor([seq])).logits[0, -1]
    json.dump({"tokens": toks, "margins": margins}, open(f"{out}/greedy.json", "w"))


main()
