#!/usr/bin/env python3
"""Write the fuzz targets' seed corpora (fuzz/seeds/<target>/, committed) from the repository's
fixtures and ../shared's real configs and templates. Needs gguf-py (llama.cpp's, on PYTHONPATH),
numpy and safetensors. The whole fixture GGUFs are not copied: scripts/fuzz.sh and
crates/lone/tests/fuzz.rs add tests/reference/fixtures/*/model-*.gguf at run time."""

import base64
import json
import shutil
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "reference" / "fixtures"
SHARED = ROOT.parent / "shared" / "assets"
OUT = ROOT / "fuzz" / "seeds"


def fresh(name):
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def gguf_seeds():
    """Each fixture's header (metadata + tensor table, no data) and its metadata alone as a
    valid tensor-less file (what the tokenizer target parses)."""
    g, t = fresh("gguf"), fresh("gguf_tokenizer")
    for fam in sorted(p.name for p in FIX.iterdir() if (p / "model-q8_0.gguf").exists()):
        src = FIX / fam / "model-q8_0.gguf"
        r = GGUFReader(src)
        (g / f"{fam}-header.gguf").write_bytes(src.read_bytes()[: r.data_offset])
        w = GGUFWriter(t / f"{fam}-meta.gguf", arch="placeholder")
        w.kv_data = [{}]
        for f in r.fields.values():
            if f.name.startswith("GGUF."):
                continue
            vt = f.types[0]
            if vt == GGUFValueType.ARRAY:
                w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1])
            else:
                w.add_key_value(f.name, f.contents(), vt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        shutil.copy(t / f"{fam}-meta.gguf", g / f"{fam}-meta.gguf")


def safetensors_seeds():
    d = fresh("safetensors")
    save_file({"a": np.zeros((2, 3), np.float32), "b": np.ones(4, np.float16)}, d / "small.safetensors",
              metadata={"format": "pt"})
    save_file({"model.embed_tokens.weight": np.arange(12, dtype=np.float32).reshape(3, 4)}, d / "embed.safetensors")
    save_file({}, d / "empty.safetensors")


def config_seeds():
    d = fresh("config")
    for p in sorted(FIX.glob("*/config.json")):
        shutil.copy(p, d / f"{p.parent.name}.json")
    for p in sorted(SHARED.glob("*/config*.json")):
        shutil.copy(p, d / p.name)


MESSAGES = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]


def template_seeds():
    d = fresh("chat_template")
    srcs = sorted(FIX.glob("*/chat_template.jinja")) + sorted(SHARED.glob("chat-templates/*.jinja")) + [
        SHARED / "lfm2" / "chat_template.jinja"]
    for p in srcs:
        name = (p.parent.name + "-" + p.stem).replace(".", "_")
        src = p.read_bytes()
        (d / f"{name}.plain").write_bytes(src + b"\0" + json.dumps(MESSAGES[:2]).encode())
        (d / f"{name}.tools").write_bytes(src + b"\0" + json.dumps({"messages": MESSAGES, "tools": TOOLS}).encode())


def request_seeds():
    d = fresh("openai_request")
    chat = [{"role": "user", "content": "Hi"}]
    reqs = {
        "chat": {"model": "x", "messages": chat, "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "stop": ["\n"]},
        "chat-logprobs": {"messages": chat, "logprobs": True, "top_logprobs": 3, "n": 2, "seed": 1,
                          "logit_bias": {"5": -100}, "presence_penalty": 0.5, "stream": True,
                          "stream_options": {"include_usage": True}},
        "chat-tools": {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": True},
        "chat-tool-required": {"messages": chat, "tools": TOOLS, "tool_choice": {"type": "function",
                                                                                  "function": {"name": "get_weather"}}},
        "chat-json-schema": {"messages": chat, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0},
                                                                     "b": {"type": "array", "items": {"type": "string"}}},
                                    "required": ["a"]}}}},
        "chat-json-object": {"messages": chat, "response_format": {"type": "json_object"}},
        "chat-grammar": {"messages": chat, "grammar": "root ::= \"yes\" | \"no\""},
        "chat-developer": {"messages": [{"role": "developer", "content": "Be brief."}, *chat],
                           "reasoning_effort": "low", "speculative.n_max": 8, "speculative.type": "ngram-simple"},
        "completion": {"prompt": "Once upon a time", "max_tokens": 8, "logprobs": 2, "echo": False},
        "completion-ids": {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 4, "ignore_eos": True},
        "anthropic": {"model": "claude", "max_tokens": 32, "system": [{"type": "text", "text": "Be brief."}],
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                      "stop_sequences": ["END"], "top_k": 5},
        "ollama": {"model": "llama3:latest", "messages": chat, "options": {"num_predict": 8, "temperature": 0.2,
                                                                          "stop": ["x"], "repeat_penalty": 1.1},
                   "format": {"type": "object", "properties": {"a": {"type": "string"}}}, "stream": False},
    }
    # Images as each front end sends them: OpenAI image_url data URLs, ollama base64
    # `images`, Anthropic base64 `image` blocks (a 1×1 PNG).
    png = base64.b64encode((ROOT / "tests" / "reference" / "vision" / "images" / "one_1x1.png").read_bytes()).decode()
    reqs["chat-image"] = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "text", "text": "What is this?"}]}], "max_tokens": 4}
    reqs["ollama-image"] = {"model": "m", "messages": [{"role": "user", "content": "x", "images": [png]}]}
    reqs["anthropic-image"] = {"model": "c", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "text", "text": "x"}]}]}
    for k, v in reqs.items():
        (d / f"{k}.json").write_text(json.dumps(v))


def embed_options_seeds():
    """The C API's options object, a NUL, then the Python API's flags split by NULs."""
    d = fresh("embed_options")
    seeds = {
        "c-full": ({"threads": 2, "ctx": 2048, "parallel": 2, "mode": "exact", "cache_type": "f32",
                    "chat_template_file": "t.jinja", "cache_ram": 0, "log_format": "json"}, []),
        "c-empty": ({}, []),
        "py-flags": (None, ["--model", "m.gguf", "--ctx", "4096", "--parallel", "1", "--log-format", "off",
                            "--model-draft", "d.gguf", "--draft-max", "8", "--spec-type", "ngram-simple"]),
        "both": ({"threads": 1, "mode": "fast"}, ["--threads", "1", "--cache-ram", "-1", "--log-prompts"]),
    }
    for k, (opts, flags) in seeds.items():
        head = b"" if opts is None else json.dumps(opts).encode()
        (d / f"{k}.bin").write_bytes(b"\0".join([head, *[f.encode() for f in flags]]))


def image_seeds():
    """Image files of every kind the decoder reads (tests/reference/vision/gen_image_refs.py
    made them): PNG (8/16-bit, gray + alpha, palette), JPEG with EXIF orientation, WebP
    lossless and lossy, GIF."""
    d = fresh("image")
    src = ROOT / "tests" / "reference" / "vision" / "images"
    for name in ["exif6_64x48.jpg", "gray_alpha_20x14.png", "lossless_33x21.webp", "lossy_40x30.webp",
                 "palette_41x29.gif", "rgb16_11x9.png", "one_1x1.png"]:
        shutil.copy(src / name, d / name)


if __name__ == "__main__":
    gguf_seeds()
    safetensors_seeds()
    config_seeds()
    template_seeds()
    request_seeds()
    embed_options_seeds()
    image_seeds()
    for p in sorted(OUT.iterdir()):
        files = list(p.iterdir())
        print(p.name, len(files), sum(f.stat().st_size for f in files), "bytes")
