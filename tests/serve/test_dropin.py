"""What llama-server and ollama users expect: any model name answered by the one model served
(404s with --strict-model-name), the `developer` role, llama-server's /tokenize, /detokenize,
/props, llama.cpp's flag forms, and one log line per request."""

import json

import openai
import pytest

from conftest import ROOT, TINY, Server
from test_tools import lfm2_real_vocab_model

CHAT = [{"role": "user", "content": "Hello"}]
ENCODE = json.loads((ROOT / "tests" / "reference" / "tokenizer" / "expected" / "encode_lfm2.json").read_text())


def test_any_model_name_and_the_developer_role(tiny):
    c = tiny.client()
    r = c.chat.completions.create(model="gpt-4o-mini", messages=CHAT, max_tokens=3, temperature=0)
    assert r.model == "lfm2_a"
    assert c.models.retrieve("gpt-4o-mini").id == "lfm2_a"
    dev = [{"role": "developer", "content": "Be brief."}, *CHAT]
    sysm = [{"role": "system", "content": "Be brief."}, *CHAT]
    p_dev = tiny.post("/apply-template", json={"messages": dev}).json()["prompt"]
    assert p_dev == tiny.post("/apply-template", json={"messages": sysm}).json()["prompt"]
    assert "<|im_start|>system\nBe brief." in p_dev
    a = c.chat.completions.create(model="x", messages=dev, max_tokens=6, temperature=0)
    b = c.chat.completions.create(model="x", messages=sysm, max_tokens=6, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_strict_model_name():
    s = Server(TINY, "--strict-model-name", "-c", "512", "-np", "1")
    try:
        with pytest.raises(openai.NotFoundError):
            s.client().chat.completions.create(model="gpt-4o-mini", messages=CHAT, max_tokens=2)
        assert s.client().chat.completions.create(model="lfm2_a", messages=CHAT, max_tokens=2).choices
    finally:
        s.stop()


def test_tokenize_detokenize_props_against_the_reference_ids(tmp_path):
    """The real LFM2 tokenizer's reference ids (Python `tokenizers`), through llama-server's
    endpoints and shapes."""
    s = Server(lfm2_real_vocab_model(tmp_path), "-c", "1024", "-np", "1", "--log-format", "json", "--log-prompts")
    try:
        cases = [c for c in ENCODE["cases"] if c["text"]][:40]
        assert len(cases) > 10
        for c in cases:
            toks = s.post("/tokenize", json={"content": c["text"]}).json()["tokens"]
            assert toks == c["ids"], c["text"]
            with_bos = s.post("/tokenize", json={"content": c["text"], "add_special": True}).json()["tokens"]
            assert with_bos == c["ids_with_special"], c["text"]
            pieces = s.post("/tokenize", json={"content": c["text"], "with_pieces": True}).json()["tokens"]
            assert [p["id"] for p in pieces] == c["ids"]
            got = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
            assert got.decode("utf-8", errors="replace") == c["text"] or not c["text"].isascii()
            assert s.post("/detokenize", json={"tokens": c["ids_with_special"]}).json()["content"] == c["decoded"]
        props = s.get("/props").json()
        assert props["total_slots"] == 1 and props["default_generation_settings"]["n_ctx"] == 1024
        assert props["bos_token"] == "<|startoftext|>" and props["eos_token"] == "<|im_end|>"
        assert "tool" in props["chat_template"]
        for bad in [{"content": 5}, {}, {"tokens": "x"}]:
            assert s.post("/tokenize", json=bad).status_code == 400
        assert s.post("/detokenize", json={"tokens": [10 ** 9]}).status_code == 400
        # One JSON log line per generation request, with the prompt only because --log-prompts.
        s.client().chat.completions.create(model="m", messages=CHAT, max_tokens=3)
        lines = [json.loads(l) for l in s.logs().splitlines() if l.startswith("{")]
        req = [l for l in lines if l.get("endpoint") == "/v1/chat/completions"]
        assert len(req) == 1 and req[0]["status"] == 200 and req[0]["generated_tokens"] <= 3
        assert req[0]["prompt_tokens"] > 0 and "Hello" in req[0]["prompt"] and req[0]["ttft_ms"] >= 0
        assert any(l.get("endpoint") == "/detokenize" and l["status"] == 400 for l in lines)
    finally:
        s.stop()


def test_text_log_lines_and_llama_cpp_flags():
    s = Server(TINY, "-c", "512", "-np", "1", "-ngl", "99", "-fa", "on", "-t", "2")
    try:
        c = s.client()
        c.chat.completions.create(model="m", messages=CHAT, max_tokens=2)
        for _ in c.chat.completions.create(model="m", messages=CHAT, max_tokens=2, stream=True):
            pass
        log = s.logs()
        assert "ignoring -ngl" in log and "ignoring -fa" in log
        lines = [l for l in log.splitlines() if "lone serve: request" in l and "/v1/chat/completions" in l]
        assert len(lines) == 2, log
        assert all("prompt_tokens=" in l and "generated_tokens=" in l and "ttft_ms=" in l for l in lines)
        assert "Hello" not in log
        assert s.get("/props").json()["default_generation_settings"]["n_ctx"] == 512
    finally:
        s.stop()


def test_verbose_logs_each_scheduler_step():
    s = Server(TINY, "-np", "2", "--verbose", "--log-format", "json")
    try:
        # Greedy and past EOS: a sampled first token may be the random model's EOS (no decode steps).
        s.client().chat.completions.create(
            model="m", messages=CHAT, max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
        )
        steps = [json.loads(l) for l in s.logs().splitlines() if l.startswith("{") and '"event":"step"' in l]
        # One prompt step (its rows exact), then a decode row per further token.
        assert len(steps) >= 3, s.logs()
        assert steps[0]["prefill_rows"] > 0 and steps[0]["generated"] == 1
        assert all(st["decode_rows"] == 1 and st["prefill_rows"] == 0 for st in steps[1:3])
        assert all(st["forward_ms"] > 0 and st["active"] >= 0 for st in steps)
        assert [st["step"] for st in steps] == list(range(1, len(steps) + 1))
    finally:
        s.stop()
    quiet = Server(TINY, "-np", "1")
    try:
        quiet.client().chat.completions.create(model="m", messages=CHAT, max_tokens=2)
        assert "lone serve: step" not in quiet.logs()
    finally:
        quiet.stop()
