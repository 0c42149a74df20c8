"""The `lone` Python API from the installed wheel: generation, streaming, chat with tools and
response_format, embeddings, logits and perplexity against transformers' reference values,
the in-process server against the same model, errors, threads, Ctrl-C, leaks, and the `lone`
command the wheel installs."""

import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import lone
from conftest import FIX, ROOT, SMOL

EXACT = dict(mode="exact", cache_type="f32", threads=2, ctx=512)


def test_imported_from_the_installed_wheel():
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(lone.__file__).resolve().is_relative_to(site), lone.__file__
    assert lone.__version__.count(".") == 2


# -- exact against transformers ------------------------------------------------------------
@pytest.mark.parametrize("name", ["lfm2_a", "qwen2", "llama", "lfm3", "lfm2_moe"])
def test_logits_and_greedy_match_transformers(name):
    d = FIX / name
    ids = json.loads((d / "prompt_ids.json").read_text())
    greedy = json.loads((d / "greedy.json").read_text())
    # transformers' logits at every position of the prompt and the greedy reply fed back.
    want = np.load(d / "logits.npy")
    with lone.Model(d, **EXACT) as m:
        got = np.array(m.logits(ids + greedy, all_positions=True), dtype=np.float32)
        assert got.shape == want.shape
        assert np.abs(got - want).max() < 1e-4
        last = np.array(m.logits(ids), dtype=np.float32)
        assert np.abs(last - want[len(ids) - 1]).max() < 1e-4
        text = m.generate(ids, max_tokens=len(greedy), ignore_eos=True)
        assert text == m.detokenize(greedy)
        # The same through the stream, piece by piece.
        assert "".join(m.generate(ids, max_tokens=len(greedy), ignore_eos=True, stream=True)) == text


def test_embeddings_match_transformers():
    ref = json.loads((ROOT / "tests" / "reference" / "embeddings" / "expected.json").read_text())
    for name, items in ref["models"].items():
        with lone.Model(FIX / name, **EXACT) as m:
            got = m.embed([x["input"] for x in items])
            for g, x in zip(got, items):
                assert m.tokenize(x["input"], add_special=True) == x["ids"]
                assert max(abs(a - b) for a, b in zip(g, x["embedding"])) < 1e-4
                assert abs(math.sqrt(sum(v * v for v in g)) - 1) < 1e-5


def test_perplexity_matches_transformers():
    ref = json.loads((ROOT / "tests" / "reference" / "perplexity" / "expected.json").read_text())
    text = (ROOT / ref["text"]).read_bytes().decode()  # as lone perplexity reads it: no newline translation
    for name, w in list(ref["models"].items())[:2]:
        with lone.Model(FIX / name, **EXACT) as m:
            r = m.perplexity(text, ctx=ref["ctx"])
            assert r["scored"] == w["scored"] and r["chunks"] == w["chunks"]
            assert abs(r["ppl"] / w["ppl"] - 1) < 1e-4, (name, r["ppl"], w["ppl"])


# -- the default model ---------------------------------------------------------------------
PROMPT = "The capital of France is"


def lone_cmd(*args, **kw):
    exe = Path(sys.executable).with_name("lone")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, **kw)


def test_generate_equals_lone_run(smol):
    r = lone_cmd("run", "--model", str(SMOL), "-t", "2", "--prompt", PROMPT, "-n", "24", "--json")
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert smol.tokenize(PROMPT, add_special=True) == want["prompt_ids"]
    assert smol.generate(PROMPT, max_tokens=24) == want["text"]
    pieces = list(smol.generate(PROMPT, max_tokens=24, stream=True))
    assert len(pieces) > 3 and "".join(pieces) == want["text"]
    assert smol.detokenize(want["generated_ids"]) == want["text"]


def test_speculation_options_give_the_plain_answer(smol):
    # A sentence longer than ngram-simple's 12-token key, repeated: the reply copies it.
    prompt = "The quick brown fox jumps over the lazy dog while the old cat sleeps on the warm mat by the red door. " * 4
    prompt += "The quick brown fox"
    with lone.Model(SMOL, threads=2, ctx=2048, spec_type="ngram-simple", draft_max=8) as spec:
        r = spec.create_completion(prompt, max_tokens=40, temperature=0)
        assert r["choices"][0]["text"] == smol.generate(prompt, max_tokens=40)
        # Drafts were made and accepted (reported as OpenAI reports predicted outputs).
        assert r["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_completion_shape_and_logprobs(smol):
    r = smol.create_completion(PROMPT, max_tokens=5, temperature=0, logprobs=2)
    assert r["object"] == "text_completion"
    c = r["choices"][0]
    assert c["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 5
    assert len(c["logprobs"]["tokens"]) == 5 and all(len(t) == 2 for t in c["logprobs"]["top_logprobs"])
    # The chosen token's logprob is the top one's (greedy), and logprobs() agrees with logits().
    lp = smol.logprobs(PROMPT)
    assert len(lp) == len(smol.tokenize(PROMPT, add_special=True)) - 1
    assert all(x <= 0 for x in lp)


def test_chat_plain_and_streamed(smol):
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    r = smol.chat(msgs, max_tokens=24, temperature=0)
    assert r["object"] == "chat.completion"
    content = r["choices"][0]["message"]["content"]
    assert content
    chunks = list(smol.chat(msgs, max_tokens=24, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == content
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    # The prompt the template makes, as transformers renders SmolLM2's.
    p = smol.apply_chat_template(msgs)
    assert p.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def test_chat_tools(smol):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = smol.chat(msgs, tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0,
                 parallel_tool_calls=False)
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls"
    call = c["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # Streamed: the same call, in tool-call deltas.
    chunks = list(smol.chat(msgs, tools=[WEATHER], tool_choice="required", max_tokens=80, temperature=0,
                         parallel_tool_calls=False, stream=True))
    deltas = [tc for ch in chunks if ch["choices"] for tc in ch["choices"][0]["delta"].get("tool_calls") or []]
    assert "".join(d["function"].get("arguments") or "" for d in deltas) == call["function"]["arguments"]


def test_chat_response_format_json_schema(smol):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    msgs = [{"role": "user", "content": "Invent a person; answer in JSON."}]
    for seed in range(3):
        r = smol.chat(msgs, response_format=rf, max_tokens=96, temperature=0.8, seed=seed)
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)


def test_bad_requests_raise_lone_error(smol):
    with pytest.raises(lone.LoneError) as e:
        smol.chat([], max_tokens=3)
    assert e.value.status == 400 and e.value.param == "messages"
    with pytest.raises(lone.LoneError) as e:
        smol.generate(PROMPT, max_tokens=4, temperature=-1)
    assert e.value.status == 400 and "temperature" in str(e.value)
    with pytest.raises(lone.LoneError, match="context"):
        smol.generate(PROMPT, max_tokens=10_000)
    with pytest.raises(lone.LoneError, match="vocabulary"):
        smol.generate([1, 10**8], max_tokens=2)
    with pytest.raises(lone.LoneError, match="vocabulary"):
        smol.detokenize([10**8])
    with pytest.raises(lone.LoneError, match="cannot load model|No such file|not found|does not exist"):
        lone.Model("/nonexistent/model.gguf")
    with pytest.raises(lone.LoneError, match="--no-such-flag"):
        lone.Model(SMOL, no_such_flag=1)
    with pytest.raises(ValueError, match="mode"):
        lone.Model(SMOL, mode="turbo")


def test_threads_share_one_model(smol):
    prompts = [f"Story {i}: once upon a time" for i in range(6)]
    alone = [smol.generate(p, max_tokens=12) for p in prompts]
    got = [None] * len(prompts)

    def run(i):
        got[i] = smol.generate(prompts[i], max_tokens=12)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # The default mode's output does not depend on batching.
    assert got == alone


def test_many_threads_calling_at_once_never_deadlock(smol):
    """Short calls from many threads at once (each takes the model's handle and releases the
    GIL): none may wait for the GIL while holding what another thread needs to return."""
    errors = []

    def run(i):
        try:
            for _ in range(300):
                assert smol.tokenize(f"thread {i}") == smol.tokenize(f"thread {i}")
            smol.generate(f"Thread {i} says", max_tokens=2)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "threads still running: a deadlock"
    assert not errors, errors


def test_two_models_in_one_process(smol):
    d = FIX / "qwen2"
    ids = json.loads((d / "prompt_ids.json").read_text())
    greedy = json.loads((d / "greedy.json").read_text())
    with lone.Model(d, **EXACT) as tiny:
        a = smol.generate(PROMPT, max_tokens=8)
        b = tiny.generate(ids, max_tokens=len(greedy), ignore_eos=True)
        assert b == tiny.detokenize(greedy)
        assert smol.generate(PROMPT, max_tokens=8) == a


def test_embeddings_equal_the_servers(smol):
    import httpx

    with lone.serve(SMOL, port=0, threads=2, parallel=1, ctx=2048) as srv:
        for _ in range(600):
            if httpx.get(srv.url + "/health").status_code == 200:
                break
            time.sleep(0.1)
        texts = ["Hello world", "The capital of France is Paris."]
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": texts}, timeout=60).json()
        served = [d["embedding"] for d in r["data"]]
        import openai

        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        chat = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                         max_tokens=16, temperature=0)
    assert smol.embed(texts) == served
    mine = smol.chat([{"role": "user", "content": "What is 2 + 2?"}], max_tokens=16, temperature=0)
    assert chat.choices[0].message.content == mine["choices"][0]["message"]["content"]


def test_ctrl_c_stops_a_generation():
    code = f"""
import lone, sys, time
m = lone.Model({str(SMOL)!r}, threads=2)
print("ready", flush=True)
t = time.time()
try:
    # Sampled, so that no repetition lets speculation race through the tokens: thousands of
    # them take seconds, and the interrupt comes 1 s in.
    m.generate("Once upon a time", max_tokens=4000, ignore_eos=True, temperature=1.0, seed=1)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted %.2f" % (time.time() - t), flush=True)
    # The model still answers after the interrupt.
    print("after", repr(m.generate("Hi", max_tokens=2)), flush=True)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert "interrupted" in out and "after" in out, out
    # The interrupt comes 1 s in; the module polls every 100 ms however fast tokens come
    # (a poll that waited for the whole answer saw it only when 4000 tokens were done).
    assert float(out.split("interrupted ")[1].split()[0]) < 10, out


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_open_generate_free_cycles_keep_rss_flat():
    d = FIX / "lfm2_a"
    ids = json.loads((d / "prompt_ids.json").read_text())

    def cycle():
        with lone.Model(d, threads=1, ctx=64) as m:
            m.generate(ids, max_tokens=2, ignore_eos=True)

    for _ in range(100):
        cycle()
    base = rss_mib()
    for _ in range(900):
        cycle()
    assert rss_mib() - base < 24, (base, rss_mib())


# -- the command the wheel installs --------------------------------------------------------
def test_lone_command_from_the_wheel():
    r = lone_cmd("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"lone {lone.__version__}"
    r = lone_cmd("run", "-t", "2", "--prompt", "What is the capital of France?", "--chat", "-n", "8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    r = lone_cmd("run", "--model", "/nonexistent.gguf", "--prompt", "x")
    assert r.returncode == 1 and "error:" in r.stderr
