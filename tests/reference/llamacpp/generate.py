#!/usr/bin/env python3
"""llama.cpp reference outputs for the default model (SmolLM2-135M-Instruct Q4_1 GGUF).

Starts llama-server on 127.0.0.1 with the model and records into smollm2.json:
  * /tokenize ids (add_special false, parse_special true) for a set of varied texts,
  * /apply-template renderings (the GGUF's embedded template, llama.cpp's jinja engine),
  * for each prompt (given to /completion as a token id list, so nothing is re-tokenized), twice:
    on the Q4_1 file ("q4_1") and on its F32 requantization ("f32": the same weights, no 8-bit
    activation quantization in the matmuls; made with llama-quantize in a temp dir):
    the prompt ids, 32 greedy tokens and, per step, the top-10 (id, logprob) of the full
    softmax over the raw logits (n_probs 10, post_sampling_probs false = pre-sampling).

    python3 tests/reference/llamacpp/generate.py      (~1 min on 2 idle cores)

Env: LLAMA_CPP_BIN (default ~/.cache/llama.cpp-0c1e570/bin, from ../shared/scripts/build-llama-cpp.sh),
LONE_MODELS (default ${XDG_CACHE_HOME:-~/.cache}/lone/models, from scripts/fetch-default-model.sh).
Diagnostics: LLAMA_EXTRA_ARGS (appended to the server args), OUT_JSON (write elsewhere).
Standard library only.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
LLAMA_COMMIT = "0c1e570"
BIN = Path(os.environ.get("LLAMA_CPP_BIN", Path.home() / f".cache/llama.cpp-{LLAMA_COMMIT}/bin"))
MODELS = Path(
    os.environ.get("LONE_MODELS")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lone" / "models"
)
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
THREADS = 2
N_PREDICT = 32
N_PROBS = 10
SERVER_ARGS = "-t 2 -tb 2 -c 2048 -np 1 --jinja --no-cache-prompt --no-webui"

CHAT_QUESTION = "What is the capital of France?"
RAW_PROMPTS = {
    "fox": "The quick brown fox",
    "fibonacci": "def fibonacci(n):",
    "paragraph": (
        "The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based ink and a wooden screw press into a "
        "system that could produce books far faster than scribes. Within fifty years, presses "
        "were operating in more than two hundred cities across Europe, and the price of books "
        "fell sharply. Scholars began to share their work widely, and literacy spread beyond "
        "the clergy and the nobility. The most important consequence of this change was"
    ),
}
MULTI_TURN = [
    {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
    {"role": "user", "content": "Name a prime number greater than 10."},
    {"role": "assistant", "content": "11 is a prime number greater than 10."},
    {"role": "user", "content": "And one greater than 100?"},
]
TOKENIZE_TEXTS = [
    "Hello, world!",
    " leading space and trailing space ",
    "   three leading spaces",
    "line one\nline two\n\n\nafter three newlines\r\n",
    "tabs\tand\t\tmore tabs",
    "1234567890 3.14159 -42 1e-9 $1,000,000",
    "I'm sure they'll say we've done it, don't you?",
    "héllo wörld — naïve café, Ærøskøbing, ½ ≠ ∞",
    "日本語のテキストと中文文本",
    "Emoji: 🦙🚀👍🏽 and a flag 🇫🇷",
    "Привет, мир! مرحبا بالعالم नमस्ते दुनिया",
    "def f(x):\n    return {'a': [x**2, x // 3]}  # comment\n",
    "fn main() { println!(\"{}\", a.iter().map(|x| x + 1).sum::<u32>()); }",
    "https://example.com/path?q=1&r=two#frag <b>bold</b>",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after special",
]


def post(port, path, body, timeout=120):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, deadline=120):
    t0 = time.time()
    while time.time() - t0 < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    sys.exit("llama-server did not become ready")


def tokenize(port, text):
    r = post(port, "/tokenize", {"content": text, "add_special": False, "parse_special": True})
    return r["tokens"]


def complete(port, ids):
    r = post(
        port,
        "/completion",
        {
            "prompt": ids,
            "n_predict": N_PREDICT,
            "temperature": 0.0,  # greedy (argmax of the raw logits)
            "n_probs": N_PROBS,
            "post_sampling_probs": False,  # full-softmax probs of the raw logits
            "cache_prompt": False,
            "return_tokens": True,
            "seed": 0,
        },
    )
    steps = r["completion_probabilities"]
    tokens = r["tokens"]
    assert len(tokens) == len(steps) <= N_PREDICT, (len(tokens), len(steps))
    top = []
    for tok, s in zip(tokens, steps):
        assert s["id"] == tok
        assert s["top_logprobs"][0]["id"] == tok, "greedy token is not the top-1"
        top.append([[t["id"], round(t["logprob"], 5)] for t in s["top_logprobs"]])
    return {"tokens": tokens, "stop_type": r["stop_type"], "content": r["content"], "top_logprobs": top}


def dump(obj):
    """JSON with one line per innermost list / per step, to keep diffs readable."""

    def enc(v, ind):
        pad = " " * ind
        if isinstance(v, dict):
            items = [f"{pad} {json.dumps(k)}: {enc(x, ind + 1).lstrip()}" for k, x in v.items()]
            return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(v, list) and v and isinstance(v[0], list) and isinstance(v[0][0], list):
            rows = [pad + " " + json.dumps(x, separators=(",", ":")) for x in v]
            return pad + "[\n" + ",\n".join(rows) + "\n" + pad + "]"
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return pad + "[\n" + ",\n".join(enc(x, ind + 1) for x in v) + "\n" + pad + "]"
        return pad + json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    return enc(obj, 0) + "\n"


class Server:
    """llama-server on 127.0.0.1 for the duration of a `with` block."""

    def __init__(self, model, log_name):
        self.port = free_port()
        self.cmd = [
            str(BIN / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
            "--port", str(self.port), *SERVER_ARGS.split(),
        ] + os.environ.get("LLAMA_EXTRA_ARGS", "").split()  # diagnostics only
        self.log_path = HERE / log_name

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.port, self.proc)
        return self.port

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def main():
    model = MODELS / MODEL_FILE
    if not model.exists():
        sys.exit(f"{model} is missing: run scripts/fetch-default-model.sh")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    assert sha == MODEL_SHA256, f"unexpected model sha256 {sha}"
    out = {
        "note": "written by tests/reference/llamacpp/generate.py; see README.md there",
        "llama_cpp": {
            "commit": LLAMA_COMMIT,
            "server_args": SERVER_ARGS,
            "completion": {
                "n_predict": N_PREDICT, "temperature": 0.0, "n_probs": N_PROBS,
                "post_sampling_probs": False, "cache_prompt": False,
            },
            "tokenize": {"add_special": False, "parse_special": True},
            "runs": {
                "q4_1": "the Q4_1 file as is (CPU Q4_1/Q8_0 matmuls quantize activations to 8 bits)",
                "f32": "the same weights: llama-quantize --allow-requantize <file> F32 (f32 activations)",
            },
        },
        "model": {"file": MODEL_FILE, "sha256": MODEL_SHA256},
    }
    prompts = []
    with Server(model, ".server-q4_1.log") as port:
        out["tokenize"] = [{"text": t, "ids": tokenize(port, t)} for t in TOKENIZE_TEXTS]
        # add_special true: the GGUF says add_bos_token false, so nothing is added
        text0 = TOKENIZE_TEXTS[0]
        out["tokenize_add_special"] = {
            "text": text0,
            "ids": post(port, "/tokenize", {"content": text0, "add_special": True})["tokens"],
        }
        chat = [{"role": "user", "content": CHAT_QUESTION}]
        chat_text = post(port, "/apply-template", {"messages": chat})["prompt"]
        multi_text = post(port, "/apply-template", {"messages": MULTI_TURN})["prompt"]
        out["templates"] = [
            {"name": "chat", "messages": chat, "prompt": chat_text},
            {"name": "multi_turn", "messages": MULTI_TURN, "prompt": multi_text},
        ]
        out["generations"] = []
        texts = [("chat", chat_text, True)] + [(k, v, False) for k, v in RAW_PROMPTS.items()]
        for name, text, is_chat in texts:
            ids = tokenize(port, text)
            g = {"name": name, "chat": is_chat, "text": text, "prompt_ids": ids}
            g["q4_1"] = complete(port, ids)
            out["generations"].append(g)
            print(f"q4_1 {name}: {len(ids)} prompt tokens -> {g['q4_1']['content']!r}")
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "model-f32.gguf"
        subprocess.run(
            [str(BIN / "llama-quantize"), "--allow-requantize", str(model), str(f32), "F32"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        with Server(f32, ".server-f32.log") as port:
            for g in out["generations"]:
                g["f32"] = complete(port, g["prompt_ids"])
                print(f"f32  {g['name']}: -> {g['f32']['content']!r}")
    dest = Path(os.environ.get("OUT_JSON", HERE / "smollm2.json"))
    dest.write_text(dump(out))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
