"""Images through `lone serve` with the official clients: OpenAI `image_url` data URLs, ollama
`images`, Anthropic `image` blocks, on the tiny LFM2-VL and LFM3-VL fixtures (transformers'
greedy replies in tests/reference/fixtures/{lfm2_vl,lfm3_vl}/cases); bad images get 400s."""

import base64
import json

import anthropic
import ollama
import openai
import pytest

from conftest import ROOT, TINY, Server

FIXTURES = ROOT / "tests" / "reference" / "fixtures"
VL = FIXTURES / "lfm2_vl"
CASES = VL / "cases"


def b64(name: str, d=VL) -> str:
    return base64.b64encode((d / "images" / f"{name}.png").read_bytes()).decode()


def data_url(name: str, d=VL) -> str:
    return "data:image/png;base64," + b64(name, d)


def want(case: str, d=VL) -> str:
    return json.loads((d / "cases" / case / "greedy_text.json").read_text())


GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module", params=["lfm2_vl", "lfm3_vl"])
def vl(request):
    s = Server(FIXTURES / request.param, "-np", "2")
    s.dir = FIXTURES / request.param
    yield s
    s.stop()


def test_openai_image_url_parts(vl):
    c = vl.client()
    r = c.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url("small", vl.dir)}},
            {"type": "text", "text": "What is this?"},
        ]}],
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    assert r.choices[0].message.content == want("one", vl.dir)
    assert "vision" in vl.get("/v1/models").json()["data"][0]["capabilities"]
    assert r.usage.prompt_tokens == len(json.loads((vl.dir / "cases" / "one" / "input_ids.json").read_text()))
    # Two images in one message, streamed.
    parts = [{"type": "image_url", "image_url": {"url": data_url(n, vl.dir)}} for n in ("small", "wide")]
    stream = c.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "Compare them."}]}],
        stream=True,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == want("two", vl.dir)


def test_ollama_images(vl):
    c = ollama.Client(host=vl.base)
    r = c.chat(model="m", messages=[{"role": "user", "content": "What is this?", "images": [b64("small", vl.dir)]}],
               options={"temperature": 0, "num_predict": 12}, stream=False)
    assert r.message.content == want("one", vl.dir)
    g = vl.post("/api/generate", json={"model": "m", "prompt": "What is this?", "images": [b64("small", vl.dir)],
                                       "stream": False, "options": {"temperature": 0, "num_predict": 12}})
    assert g.status_code == 200 and g.json()["response"] == want("one", vl.dir), g.text


def test_anthropic_image_blocks(vl):
    c = anthropic.Anthropic(base_url=vl.base, api_key="x", max_retries=0)
    r = c.messages.create(model="m", max_tokens=12, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64("small", vl.dir)}},
        {"type": "text", "text": "What is this?"},
    ]}], extra_body={"ignore_eos": True, "temperature": 0})
    assert r.content[0].text == want("one", vl.dir)


def test_bad_images_are_400s(vl):
    c = vl.client()

    def ask(url, n=1):
        parts = [{"type": "image_url", "image_url": {"url": url}}] * n
        return c.chat.completions.create(model="m", messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "x"}]}], max_tokens=1)

    for url, msg in [
        ("data:image/png;base64,@@@", "base64"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "image"),
        ("data:image/png;base64," + b64("small")[:200], "image"),
        ("https://example.com/cat.png", "data: URL"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            ask(url)
        assert msg in str(e.value), e.value
    with pytest.raises(openai.BadRequestError) as e:
        ask(data_url("small"), n=17)
    assert "at most" in str(e.value)
    # The server still answers after them.
    assert vl.get("/health").status_code == 200


def test_images_to_a_text_model_are_400s():
    s = Server(TINY, "-np", "1")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            s.client().chat.completions.create(model="m", max_tokens=1, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url("small")}}, {"type": "text", "text": "x"}]}])
        assert "takes no images" in str(e.value)
        r = s.post("/api/chat", json={"model": "m", "stream": False,
                                      "messages": [{"role": "user", "content": "x", "images": [b64("small")]}]})
        assert r.status_code == 400 and "takes no images" in r.text
    finally:
        s.stop()


@pytest.mark.parametrize("family", ["lfm2_vl", "lfm3_vl"])
def test_gguf_and_mmproj_pair(family):
    # LFM2-VL's pair as llama.cpp's converter writes it, LFM3-VL's in lone's layout
    # (DEVELOPERS.md). A case whose greedy tokens include the converter's
    # [PAD] ids past the tokenizer where the fixture has one: they add no text, as in
    # transformers' reply.
    d = FIXTURES / family
    meta = json.loads((d / "meta.json").read_text())
    n_tok = len(json.loads((d / "tokenizer.json").read_text())["model"]["vocab"])
    plain = [c for c, m in meta["cases"].items() if not m.get("overrides")]
    padded = [c for c in plain if max(json.loads((d / "cases" / c / "greedy.json").read_text())) >= n_tok]
    case = (padded or plain)[0]
    m = meta["cases"][case]
    s = Server(d / "model-f32.gguf", "--mmproj", str(d / "mmproj-f32.gguf"), "-np", "1")
    try:
        assert "vision" in s.get("/v1/models").json()["data"][0]["capabilities"]
        parts = [{"type": "image_url", "image_url": {"url": data_url(n, d)}} for n in m["images"]]
        r = s.client().chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": [*parts, {"type": "text", "text": m["text"]}]}],
            extra_body={"ignore_eos": True},
            **GREEDY,
        )
        assert r.choices[0].message.content == want(case, d)
    finally:
        s.stop()


def test_request_log_has_the_images_and_their_encoding_time():
    s = Server(VL, "-np", "1", "--log-format", "json")
    try:
        s.client().chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url("small")}}, {"type": "text", "text": "x"}]}])
        s.client().chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}])
        # The same image again (a conversation's next turn): its encoding is reused.
        s.client().chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url("small")}}, {"type": "text", "text": "y"}]}])
        reqs = [json.loads(l) for l in s.logs().splitlines() if l.startswith("{") and '"event":"request"' in l]
        assert len(reqs) == 3, s.logs()
        assert reqs[0]["images"] == 1 and reqs[0]["encode_ms"] > 0 and reqs[0]["ttft_ms"] >= reqs[0]["encode_ms"]
        assert "images_reused" not in reqs[0]
        assert "images" not in reqs[1]
        assert reqs[2]["images"] == 1 and reqs[2]["images_reused"] == 1
        # The same in /metrics: the three requests' times to first token, the images and the
        # time they took (the log line's ms, rounded to 0.1 ms).
        m = {l.split()[0]: float(l.split()[1]) for l in s.get("/metrics").text.splitlines()
             if l and not l.startswith("#") and "{" not in l}
        assert m["lone_first_tokens_total"] == 3
        ttft = sum(r["ttft_ms"] for r in reqs) / 1e3
        assert abs(m["lone_time_to_first_token_seconds_total"] - ttft) < 1e-3, (m, ttft)
        assert m["lone_images_total"] == 2 and m["lone_images_reused_total"] == 1
        enc = (reqs[0]["encode_ms"] + reqs[2]["encode_ms"]) / 1e3
        assert m["lone_image_encode_seconds_total"] > 0
        assert abs(m["lone_image_encode_seconds_total"] - enc) < 1e-3, (m, enc)
    finally:
        s.stop()


def test_image_urls_are_fetched_only_when_allowed():
    import http.server
    import threading

    png = (VL / "images" / "small.png").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/small.png":
                body, code = png, 200
            elif self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/small.png")
                self.end_headers()
                return
            elif self.path == "/big.png":
                body, code = png + b"\0" * (21 << 20), 200
            else:
                body, code = b"no", 404
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"

    def ask(s, url):
        return s.client().chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What is this?"},
            ]}],
            extra_body={"ignore_eos": True},
            **GREEDY,
        )

    s = Server(VL, "-np", "1", "--allow-image-urls")
    try:
        assert ask(s, base + "/small.png").choices[0].message.content == want("one")
        assert ask(s, base + "/moved").choices[0].message.content == want("one")
        for path, msg in [("/missing.png", "HTTP 404"), ("/big.png", "larger than 20 MiB")]:
            with pytest.raises(openai.BadRequestError) as e:
                ask(s, base + path)
            assert msg in str(e.value), e.value
        with pytest.raises(openai.BadRequestError) as e:
            ask(s, "http://127.0.0.1:1/closed.png")
        assert "cannot fetch" in str(e.value), e.value
    finally:
        s.stop()
    s = Server(VL, "-np", "1")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            ask(s, base + "/small.png")
        assert "--allow-image-urls" in str(e.value)
    finally:
        s.stop()
        httpd.shutdown()
