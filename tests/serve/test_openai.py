"""`lone serve` against the official `openai` client (and raw HTTP where the wire format matters)."""

import json
import re
import signal
import threading
import time

try:
    import httpx
except ImportError:  # newer openai releases ship it as httpx2
    import httpx2 as httpx
import openai
import pytest

from conftest import SMOL, TINY, Server, need_smol

CHAT = [{"role": "user", "content": "Tell me a story about a fox."}]


def greedy_chat(c, messages=CHAT, **kw):
    kw.setdefault("max_tokens", 16)
    return c.chat.completions.create(model="lfm2_a", messages=messages, temperature=0, **kw)


def stream_text(stream):
    """Content of a chat stream, checking the chunk sequence on the way."""
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    for ch in chunks:
        assert ch.object == "chat.completion.chunk"
    fins = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert fins[-1] in ("stop", "length") and all(f is None for f in fins[:-1])
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices), chunks


def assert_error(r: httpx.Response, status: int, param=None, code=None):
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


# ---------------------------------------------------------------- basics


def test_health_models_and_loading_state():
    s = Server(TINY, env={"LONE_SERVE_TEST_LOAD_DELAY_MS": "1500"}, wait=False)
    try:
        deadline = time.time() + 10
        while True:
            try:
                r = s.get("/health")
                break
            except httpx.HTTPError:
                assert time.time() < deadline
                time.sleep(0.02)
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        assert_error(s.post("/v1/completions", json={"prompt": "x"}), 503, code="model_loading")
        s.wait_ready()
        assert s.get("/health").json() == {"status": "ok"}
    finally:
        s.stop()


def test_models(tiny):
    models = tiny.client().models.list()
    assert [m.id for m in models.data] == ["lfm2_a"]
    assert models.data[0].object == "model"
    assert tiny.client().models.retrieve("lfm2_a").id == "lfm2_a"


def test_chat_non_streaming(tiny):
    r = greedy_chat(tiny.client())
    assert r.object == "chat.completion"
    assert r.model == "lfm2_a"
    ch = r.choices[0]
    assert ch.index == 0 and ch.message.role == "assistant"
    assert ch.finish_reason == "length" and ch.logprobs is None
    assert r.usage.completion_tokens == 16
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 16


def test_chat_streaming_equals_non_streaming(tiny):
    c = tiny.client()
    full = greedy_chat(c).choices[0].message.content
    text, chunks = stream_text(greedy_chat(c, stream=True))
    assert text == full
    assert all(ch.usage is None for ch in chunks)
    text, chunks = stream_text(greedy_chat(c, stream=True, stream_options={"include_usage": True}))
    assert text == full
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 16
    assert len({ch.id for ch in chunks}) == 1


def test_sse_wire_format(tiny):
    body = {"model": "lfm2_a", "messages": CHAT, "temperature": 0, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", tiny.base + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    objs = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert objs[-2]["choices"][0]["finish_reason"] == "length"
    assert objs[-2]["choices"][0]["delta"] == {}
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 5
    for o in objs[1:-2]:
        assert set(o["choices"][0]["delta"]) == {"content"}


def test_completions(tiny):
    c = tiny.client()
    r = c.completions.create(model="lfm2_a", prompt="The quick brown fox", max_tokens=12, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    # The same prompt as token ids gives the same text.
    ids = json.loads((TINY / "prompt_ids.json").read_text())
    greedy = json.loads((TINY / "greedy.json").read_text())
    r1 = c.completions.create(model="lfm2_a", prompt=ids, max_tokens=24, temperature=0,
                              extra_body={"ignore_eos": True})
    assert r1.usage.prompt_tokens == len(ids)
    # transformers' greedy tokens, as text (logprobs give the ids' text pieces).
    r2 = c.completions.create(model="lfm2_a", prompt=ids, max_tokens=24, temperature=0, logprobs=2,
                              extra_body={"ignore_eos": True})
    assert r2.choices[0].text == r1.choices[0].text
    lp = r2.choices[0].logprobs
    assert len(lp.tokens) == len(greedy) == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # Several prompts: one choice each.
    r3 = c.completions.create(model="lfm2_a", prompt=["a b", "c d e"], max_tokens=3, temperature=0)
    assert [ch.index for ch in r3.choices] == [0, 1]
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="lfm2_a", prompt="The quick brown fox", max_tokens=12, temperature=0, stream=True) if ch.choices)
    assert streamed == r.choices[0].text


def pick_stop(text):
    """A short ASCII word-ish substring well inside `text`."""
    for i in range(4, len(text) - 3):
        cand = text[i:i + 3]
        if re.fullmatch(r"[A-Za-z0-9 ]{3}", cand) and text.find(cand) >= 2:
            return cand
    pytest.skip(f"no usable stop string in {text!r}")


def test_stop_strings_never_leak(tiny):
    c = tiny.client()
    full = greedy_chat(c, max_tokens=40).choices[0].message.content
    stop = pick_stop(full)
    cut = full[: full.find(stop)]
    r = greedy_chat(c, max_tokens=40, stop=[stop, "zzzzzzzz"])
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 40
    text, chunks = stream_text(greedy_chat(c, max_tokens=40, stop=stop, stream=True))
    assert text == cut
    sent = ""
    for ch in chunks:
        if ch.choices and ch.choices[0].delta.content:
            sent += ch.choices[0].delta.content
            assert stop not in sent and cut.startswith(sent)
    # Completions too.
    r = c.completions.create(model="lfm2_a", prompt="hello", max_tokens=40, temperature=0)
    t = r.choices[0].text
    stop = pick_stop(t)
    r = c.completions.create(model="lfm2_a", prompt="hello", max_tokens=40, temperature=0, stop=stop, stream=True)
    assert "".join(ch.choices[0].text for ch in r if ch.choices) == t[: t.find(stop)]


def test_chat_logprobs(tiny):
    r = greedy_chat(tiny.client(), logprobs=True, top_logprobs=3, max_tokens=8)
    content = r.choices[0].logprobs.content
    assert len(content) == 8
    for e in content:
        assert e.logprob <= 0 and isinstance(e.bytes, list)
        assert len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    # Streaming carries them per chunk.
    chunks = list(greedy_chat(tiny.client(), logprobs=True, top_logprobs=1, max_tokens=8, stream=True))
    lps = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in lps] == [e.token for e in content]


def test_n_choices_and_seeds(tiny):
    c = tiny.client()
    kw = dict(model="lfm2_a", messages=CHAT, max_tokens=12, temperature=1.0)
    r = c.chat.completions.create(n=2, seed=7, **kw)
    assert [ch.index for ch in r.choices] == [0, 1]
    assert 0 < r.usage.completion_tokens <= 24
    a, b = (ch.message.content for ch in r.choices)
    assert a != b, "each choice is its own sequence"
    again = c.chat.completions.create(n=2, seed=7, **kw)
    assert [ch.message.content for ch in again.choices] == [a, b]
    one = c.chat.completions.create(seed=7, **kw)
    assert one.choices[0].message.content == a
    other = c.chat.completions.create(seed=8, **kw)
    assert other.choices[0].message.content != a
    # Streaming n=2: chunks of both indices, each ending with a finish reason.
    chunks = list(c.chat.completions.create(n=2, seed=7, stream=True, **kw))
    texts = ["", ""]
    fin = [None, None]
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] += choice.delta.content or ""
            fin[choice.index] = choice.finish_reason or fin[choice.index]
    assert texts == [a, b] and None not in fin
    # Greedy choices are identical.
    g = c.chat.completions.create(model="lfm2_a", messages=CHAT, max_tokens=8, temperature=0, n=3)
    assert len({ch.message.content for ch in g.choices}) == 1


def test_concurrent_streams_equal_single_greedy(tiny):
    c = tiny.client()
    prompts = [[{"role": "user", "content": f"Question number {i}: " + "why? " * i}] for i in range(6)]
    single = [greedy_chat(c, messages=p, max_tokens=30).choices[0].message.content for p in prompts]
    results = [None] * len(prompts)
    errors = []
    barrier = threading.Barrier(len(prompts))

    def worker(i):
        try:
            cl = tiny.client()
            barrier.wait()
            results[i], _ = stream_text(greedy_chat(cl, messages=prompts[i], max_tokens=30, stream=True))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert results == single


# ---------------------------------------------------------------- errors


BAD_CHAT = [
    (b"{", 400, None),
    (b"[1, 2]", 400, None),
    (b'"just a string"', 400, None),
    ({"model": "lfm2_a"}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ({"messages": CHAT, "max_tokens": 2 ** 64 - 1}, 400, "messages"),
    ({"messages": CHAT, "max_tokens": 2 ** 63}, 400, "messages"),
    ({"messages": [{"content": "no role"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": 42}]}, 400, "messages"),
    ({"messages": CHAT, "temperature": "hot"}, 400, "temperature"),
    ({"messages": CHAT, "temperature": -1}, 400, "temperature"),
    ({"messages": CHAT, "temperature": 3}, 400, "temperature"),
    ({"messages": CHAT, "top_p": 1.5}, 400, "top_p"),
    ({"messages": CHAT, "top_p": 0}, 400, "top_p"),
    ({"messages": CHAT, "min_p": 2}, 400, "min_p"),
    ({"messages": CHAT, "top_k": -3}, 400, "top_k"),
    ({"messages": CHAT, "n": 0}, 400, "n"),
    ({"messages": CHAT, "n": 1000}, 400, "n"),
    ({"messages": CHAT, "n": "two"}, 400, "n"),
    ({"messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": CHAT, "max_tokens": -5}, 400, "max_tokens"),
    ({"messages": CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ({"messages": CHAT, "max_tokens": 10**9}, 400, "messages"),
    ({"messages": CHAT, "stop": 5}, 400, "stop"),
    ({"messages": CHAT, "stop": [""]}, 400, "stop"),
    ({"messages": CHAT, "presence_penalty": 5}, 400, "presence_penalty"),
    ({"messages": CHAT, "frequency_penalty": "x"}, 400, "frequency_penalty"),
    ({"messages": CHAT, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"messages": CHAT, "logit_bias": {"99999": 1}}, 400, "logit_bias"),
    ({"messages": CHAT, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ({"messages": CHAT, "logit_bias": {"5": 500}}, 400, "logit_bias"),
    ({"messages": CHAT, "logit_bias": [1, 2]}, 400, "logit_bias"),
    ({"messages": CHAT, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ({"messages": CHAT, "logprobs": "yes"}, 400, "logprobs"),
    ({"messages": CHAT, "stream": "yes"}, 400, "stream"),
    ({"messages": CHAT, "seed": "abc"}, 400, "seed"),
    ({"messages": CHAT, "user": 5}, 400, "user"),
]


@pytest.mark.parametrize("body,status,param", BAD_CHAT)
def test_bad_chat_requests(tiny, body, status, param):
    if isinstance(body, bytes):
        r = tiny.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = tiny.post("/v1/chat/completions", json=body)
    assert_error(r, status, param)


def test_bad_completion_requests(tiny):
    assert_error(tiny.post("/v1/completions", json={"max_tokens": 3}), 400, "prompt")
    assert_error(tiny.post("/v1/completions", json={"prompt": 5}), 400, "prompt")
    assert_error(tiny.post("/v1/completions", json={"prompt": [1, 99999]}), 400, "prompt")
    assert_error(tiny.post("/v1/completions", json={"prompt": []}), 400, "prompt")
    assert_error(tiny.post("/v1/completions", json={"prompt": "x", "logprobs": 99}), 400, "logprobs")
    # The prompt alone does not fit the context (--ctx 1024).
    err = assert_error(tiny.post("/v1/completions", json={"prompt": [5] * 1100}), 400, "prompt",
                       "context_length_exceeded")
    assert "1024" in err["message"]
    # Prompt + max_tokens must fit; without max_tokens the completion may fill the context.
    assert_error(tiny.post("/v1/completions", json={"prompt": [5] * 1000, "max_tokens": 100}), 400, "prompt",
                 "context_length_exceeded")
    r = tiny.post("/v1/completions", json={"prompt": [5] * 1000, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 24 and r.json()["choices"][0]["finish_reason"] == "length"


def test_unknown_fields_are_ignored_and_client_errors(tiny):
    r = tiny.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, "temperature": 0,
                                                "frobnicate": {"x": [1]}, "tools_extra": None})
    assert r.status_code == 200, r.text
    with pytest.raises(openai.BadRequestError) as e:
        tiny.client().chat.completions.create(model="lfm2_a", messages=CHAT, temperature=-1)
    assert e.value.body["param"] == "temperature"


def test_body_size_limit_and_unknown_route(tiny):
    big = b'{"prompt": "' + b"a" * (3 << 20) + b'"}'
    assert_error(tiny.post("/v1/completions", content=big), 413)
    assert_error(tiny.post("/v1/nothing-here", json={}), 404)
    assert_error(tiny.get("/v1/chat/completions"), 405)
    # A path that is not UTF-8 once percent-decoded: OpenAI's error JSON, not a plain-text 400.
    r = tiny.get("/v1/models/%ff%fe")
    assert r.headers["content-type"].startswith("application/json"), r.headers
    assert_error(r, 400, "model")


def test_metrics_format(tiny):
    greedy_chat(tiny.client(), max_tokens=2)
    tiny.post("/v1/chat/completions", content=b"{")
    text = tiny.get("/metrics").text
    assert tiny.get("/metrics").headers["content-type"].startswith("text/plain")
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)+\})? -?[0-9.]+(e[+-]?[0-9]+)?$')
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif not line.startswith("#"):
            assert sample.match(line), line
    for name, kind in {
        "lone_requests_total": "counter", "lone_prompt_tokens_total": "counter",
        "lone_generated_tokens_total": "counter", "lone_prefill_seconds_total": "counter",
        "lone_decode_seconds_total": "counter", "lone_prefill_tokens_per_second": "gauge",
        "lone_decode_tokens_per_second": "gauge", "lone_queue_depth": "gauge", "lone_active_slots": "gauge",
    }.items():
        assert types.get(name) == kind, name
    m = tiny.metrics()
    assert m['lone_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert m['lone_requests_total{endpoint="/v1/chat/completions",status="400"}'] >= 1
    assert m["lone_generated_tokens_total"] > 0 and m["lone_prefill_seconds_total"] > 0
    assert m["lone_slots"] == 4


def test_api_key():
    s = Server(TINY, "--api-key", "s3cret", "--alias", "tiny-model")
    try:
        assert [m.id for m in s.client(api_key="s3cret").models.list().data] == ["tiny-model"]
        with pytest.raises(openai.AuthenticationError):
            s.client().models.list()
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").chat.completions.create(model="lfm2_a", messages=CHAT, max_tokens=2)
        assert_error(s.post("/v1/completions", json={"prompt": "x"}), 401, code="invalid_api_key")
        r = s.client(api_key="s3cret").chat.completions.create(
            model="lfm2_a", messages=CHAT, max_tokens=2, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 2
        assert s.get("/health").status_code == 200
    finally:
        s.stop()


def test_graceful_shutdown_on_sigterm():
    s = Server(TINY)
    assert s.get("/health").status_code == 200
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) == 0
    assert "shutting down" in s.logs()
    s.stop()


# ---------------------------------------------------------------- the real model


# With a system prompt: SmolLM2-135M Q4_1's answer without one is a close call (0.24 nats on the
# f32 path) that 8-bit activations flip, in lone's default mode as in llama.cpp.
FRANCE = [{"role": "system", "content": "You answer in one short sentence."},
          {"role": "user", "content": "What is the capital of France?"}]


def test_real_model_knows_paris(smol):
    c = smol.client()
    r = c.chat.completions.create(model=SMOL.name, messages=FRANCE, temperature=0, max_tokens=24,
                                  logprobs=True, top_logprobs=2)
    text = r.choices[0].message.content
    assert "Paris" in text
    content = r.choices[0].logprobs.content
    assert bytes(b for e in content for b in e.bytes).decode() == text
    streamed, _ = stream_text(c.chat.completions.create(model=SMOL.name, messages=FRANCE, temperature=0,
                                                         max_tokens=24, stream=True))
    assert streamed == text
    # The second request reused the first one's prompt from the slot's cache.
    assert smol.metrics()["lone_prompt_tokens_cached_total"] > 0
    stopped, _ = stream_text(c.chat.completions.create(model=SMOL.name, messages=FRANCE, temperature=0,
                                                        max_tokens=24, stop=["Paris"], stream=True))
    assert "Paris" not in stopped and text.startswith(stopped)


def test_real_model_two_clients_batched(smol):
    c = smol.client()
    prompts = ["Once upon a time", "The best way to learn"]
    single = [c.completions.create(model=SMOL.name, prompt=p, max_tokens=10, temperature=0).choices[0].text
              for p in prompts]
    out = [None, None]

    def go(i):
        out[i] = "".join(ch.choices[0].text for ch in smol.client().completions.create(
            model=SMOL.name, prompt=prompts[i], max_tokens=10, temperature=0, stream=True) if ch.choices)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert out == single


def wait_metric(server, name, pred, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = server.metrics().get(name)
        if v is not None and pred(v):
            return v
        time.sleep(0.05)
    raise AssertionError(f"{name} = {server.metrics().get(name)}")


def test_disconnect_mid_stream_frees_the_slot(smol):
    c = smol.client()
    before = smol.metrics()
    stream = c.completions.create(model=SMOL.name, prompt="Write a long essay about the sea.", max_tokens=3000,
                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
    got = 0
    for ch in stream:
        got += 1
        if got == 3:
            break
    assert smol.metrics()["lone_active_slots"] == 1
    stream.close()
    wait_metric(smol, "lone_active_slots", lambda v: v == 0)
    after = wait_metric(smol, "lone_cancelled_total", lambda v: v == before["lone_cancelled_total"] + 1)
    assert after
    assert smol.metrics()["lone_generated_tokens_total"] - before["lone_generated_tokens_total"] < 100
    r = c.completions.create(model=SMOL.name, prompt="Hello", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
    # A non-streaming client that gives up is cancelled too.
    with pytest.raises(httpx.TimeoutException):
        smol.post("/v1/completions", json={"prompt": "Write a long essay about the sky.", "max_tokens": 3000,
                                           "temperature": 0, "ignore_eos": True}, timeout=1.5)
    wait_metric(smol, "lone_cancelled_total", lambda v: v == before["lone_cancelled_total"] + 2)
    wait_metric(smol, "lone_active_slots", lambda v: v == 0)


def test_queue_full_gives_503():
    need_smol()
    s = Server(SMOL, "--parallel", "1", "--queue", "1")
    try:
        # Long enough to still be running however fast the kernels get; closed early.
        body = {"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.Client(timeout=60) as h:
            with h.stream("POST", s.base + "/v1/completions", json=body) as a:
                assert a.status_code == 200
                lines_a = a.iter_lines()  # (kept referenced: a dropped iterator may close the stream)
                next(lines_a)  # A runs in the only slot
                with h.stream("POST", s.base + "/v1/completions", json=body) as b:
                    assert b.status_code == 200  # B waits in the queue
                    m = s.metrics()
                    assert (m["lone_queue_depth"], m["lone_active_slots"]) == (1, 1), m
                    r = s.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
                    assert_error(r, 503, code="queue_full")
                    assert r.headers["retry-after"] == "1"
                    with pytest.raises(openai.InternalServerError) as e:
                        s.client().completions.create(model=SMOL.name, prompt="x", max_tokens=2)
                    assert e.value.status_code == 503
        wait_metric(s, "lone_active_slots", lambda v: v == 0)
        r = s.client().completions.create(model=SMOL.name, prompt="Hi", max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2
        assert s.metrics()['lone_requests_total{endpoint="/v1/completions",status="503"}'] == 2
    finally:
        s.stop()


COPY = [{"role": "user", "content": "Print the following Python code again, exactly as it is:\n\n```python\n"
         "def area(width, height):\n    return width * height\n\n\n"
         "def perimeter(width, height):\n    return 2 * (width + height)\n\n\n"
         "for w, h in [(1, 2), (3, 4), (5, 6)]:\n    print(area(w, h), perimeter(w, h))\n```"}]


def test_speculating_server_gives_the_plain_greedy_output(smol):
    """A server speculating with ngram-simple (small n so it drafts) answers token for token as the
    plain one, streamed too, with two clients at once; /metrics counts drafts; a request can switch
    speculation off with llama-server's `speculative.type`, and a `draft` request without a draft
    model is a 400."""
    need_smol()
    spec = Server(SMOL, "--parallel", "2", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3")
    try:
        want = smol.client().chat.completions.create(model=SMOL.name, messages=COPY, temperature=0,
                                                     max_tokens=80).choices[0].message.content
        c = spec.client()
        got = c.chat.completions.create(model=SMOL.name, messages=COPY, temperature=0, max_tokens=80)
        assert got.choices[0].message.content == want
        # Drafts are reported as OpenAI reports predicted outputs.
        d = got.usage.completion_tokens_details
        assert d.accepted_prediction_tokens > 0 and d.rejected_prediction_tokens >= 0
        m = spec.metrics()
        assert m["lone_draft_tokens_total"] > 0
        assert 0 < m["lone_draft_tokens_accepted_total"] <= m["lone_draft_tokens_total"]
        assert m["lone_draft_acceptance_rate"] > 0
        out = [None, None]

        def go(i):
            out[i], _ = stream_text(spec.client().chat.completions.create(
                model=SMOL.name, messages=COPY, temperature=0, max_tokens=80, stream=True))

        ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert out == [want, want]
        before = spec.metrics()["lone_draft_tokens_total"]
        off = c.chat.completions.create(model=SMOL.name, messages=COPY, temperature=0, max_tokens=80,
                                        extra_body={"speculative.type": "none"})
        assert off.choices[0].message.content == want
        assert off.usage.completion_tokens_details is None
        assert spec.metrics()["lone_draft_tokens_total"] == before
        r = spec.post("/v1/chat/completions", json={"messages": COPY, "speculative.type": "draft"})
        assert r.status_code == 400 and "draft model" in r.json()["error"]["message"]
    finally:
        spec.stop()


def test_cache_prompt_false_prefills_the_whole_prompt(tiny):
    """llama-server's `cache_prompt: false`: nothing is taken from a slot's cache or the prompt
    cache (the default reuses the shared prefix)."""
    body = {"prompt": "The same prompt, several times over.", "max_tokens": 2, "temperature": 0}
    c = tiny.client()
    c.completions.create(model="x", **body)
    again = c.completions.create(model="x", **body)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    fresh = c.completions.create(model="x", **body, extra_body={"cache_prompt": False})
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.choices[0].text == again.choices[0].text
