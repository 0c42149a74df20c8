"""Several models from one `lone serve`: `--model A --model B` and `--models-dir`; the request's
`model` selects; a model loads on first use (requests wait for it, bounded) and the least
recently used idle one is unloaded past `--max-loaded` / `--mem-budget`; /v1/models,
/api/tags and /api/ps list them with their state; each has its own slots and metrics labels."""

import concurrent.futures as cf
import time


import pytest

from conftest import ROOT, TINY, Server, httpx

FIX = ROOT / "tests" / "reference" / "fixtures"
LLAMA = FIX / "llama" / "model-q8_0.gguf"
QWEN = FIX / "qwen2" / "model-q8_0.gguf"
MOE = FIX / "lfm2_moe" / "model-q4_0.gguf"


def complete(s, model, n=8, **kw):
    body = {"prompt": "Hello there", "max_tokens": n, "temperature": 0, **kw}
    if model is not None:
        body["model"] = model
    return s.post("/v1/completions", json=body)


def states(s):
    return {m["id"]: m["status"]["value"] for m in s.get("/v1/models").json()["data"]}


@pytest.fixture()
def models_dir(tmp_path):
    """Three tiny models under distinct names, plus files that are not models."""
    d = tmp_path / "models"
    d.mkdir()
    (d / "a-lfm2").symlink_to(TINY)
    (d / "b-llama.gguf").symlink_to(LLAMA)
    (d / "c-qwen2.gguf").symlink_to(QWEN)
    (d / "notes.txt").write_text("not a model")
    (d / "empty-dir").mkdir()
    return d


def test_two_models_select_load_on_first_use_and_unload_past_max_loaded():
    s = Server(TINY, "--model", str(LLAMA), "--max-loaded", "1", "-np", "2", "-c", "256")
    try:
        assert s.get("/health").json() == {
            "status": "ok", "models": {"lfm2_a": "unloaded", "model-q8_0.gguf": "unloaded"}}
        assert states(s) == {"lfm2_a": "unloaded", "model-q8_0.gguf": "unloaded"}

        r = complete(s, "lfm2_a")
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "lfm2_a"
        first = r.json()["choices"][0]["text"]
        assert states(s) == {"lfm2_a": "loaded", "model-q8_0.gguf": "unloaded"}

        # The stem selects too; loading it unloads the other (--max-loaded 1).
        r = complete(s, "model-q8_0")
        assert r.status_code == 200 and r.json()["model"] == "model-q8_0.gguf"
        assert states(s) == {"lfm2_a": "unloaded", "model-q8_0.gguf": "loaded"}
        assert [m["name"] for m in s.get("/api/ps").json()["models"]] == ["model-q8_0.gguf"]
        assert {m["name"] for m in s.get("/api/tags").json()["models"]} == {"lfm2_a", "model-q8_0.gguf"}
        assert "unloaded lfm2_a (least recently used) to load model-q8_0.gguf" in s.logs()

        # Back to the first: loaded again, same greedy text.
        r = complete(s, "lfm2_a")
        assert r.json()["choices"][0]["text"] == first

        # No `model`: the first one. An unknown one: 404 naming what is served.
        assert complete(s, None).json()["model"] == "lfm2_a"
        r = complete(s, "gpt-4o-mini")
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and "lfm2_a, model-q8_0.gguf" in err["message"]

        # Each model's engine metrics carry its label.
        m = s.metrics()
        assert m['lone_slots{model="lfm2_a"}'] == 2 and m['lone_slots{model="model-q8_0.gguf"}'] == 2
        assert m['lone_generated_tokens_total{model="lfm2_a"}'] >= 16
        assert m['lone_generated_tokens_total{model="model-q8_0.gguf"}'] >= 8
        # Other endpoints select too.
        t = s.post("/tokenize", json={"model": "model-q8_0.gguf", "content": "hi"}).json()["tokens"]
        assert t and s.post("/detokenize", json={"model": "model-q8_0.gguf", "tokens": t}).json()["content"] == "hi"
        assert s.get("/props", params={"model": "model-q8_0.gguf"}).json()["model_alias"] == "model-q8_0.gguf"
    finally:
        s.stop()


def test_a_mixture_of_experts_model_serves_concurrent_requests_as_each_alone():
    """LFM2-MoE through the server unchanged: concurrent greedy requests, whose rows share
    steps (grouped by expert), get the very text each gets alone; /v1/models lists it."""
    s = Server(MOE, "-np", "4", "-c", "256")
    try:
        prompts = ["Hello there", "The quick brown fox", "Rust is a language", "How are you today"]

        def text(p):
            r = complete(s, None, n=12, prompt=p)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        alone = [text(p) for p in prompts]
        with cf.ThreadPoolExecutor(len(prompts)) as ex:
            together = list(ex.map(text, prompts))
        assert together == alone
        assert [m["id"] for m in s.get("/v1/models").json()["data"]] == ["model-q4_0.gguf"]
    finally:
        s.stop()


def test_models_dir_least_recently_used_goes_first(models_dir):
    s = Server(None, "--models-dir", str(models_dir), "--max-loaded", "2", "-np", "1", "-c", "256")
    try:
        assert states(s) == {"a-lfm2": "unloaded", "b-llama.gguf": "unloaded", "c-qwen2.gguf": "unloaded"}
        for m in ["a-lfm2", "b-llama.gguf", "a-lfm2"]:
            assert complete(s, m).status_code == 200
        assert complete(s, "c-qwen2.gguf").status_code == 200
        # b was used less recently than a: b goes.
        assert states(s) == {"a-lfm2": "loaded", "b-llama.gguf": "unloaded", "c-qwen2.gguf": "loaded"}
        # ollama's `:latest` tag names the same model.
        r = s.post("/api/generate", json={"model": "b-llama.gguf:latest", "prompt": "hi", "stream": False,
                                          "options": {"num_predict": 3, "temperature": 0}})
        assert r.status_code == 200 and r.json()["model"] == "b-llama.gguf"
        assert states(s)["b-llama.gguf"] == "loaded" and states(s)["a-lfm2"] == "unloaded"
    finally:
        s.stop()


def test_mem_budget_keeps_one_loaded(models_dir):
    # Each model is ~100 KB on disk plus its KV cache: a 0.0002 GiB (~210 KB) budget holds one.
    s = Server(None, "--models-dir", str(models_dir), "--mem-budget", "0.0002", "-np", "1", "-c", "64")
    try:
        for m in ["a-lfm2", "b-llama.gguf", "c-qwen2.gguf"]:
            assert complete(s, m).status_code == 200
            loaded = [k for k, v in states(s).items() if v == "loaded"]
            assert loaded == [m]
    finally:
        s.stop()


def test_requests_wait_for_a_loading_model_bounded():
    env = {"LONE_SERVE_TEST_LOAD_DELAY_MS": "1500"}
    s = Server(TINY, "--model", str(LLAMA), "-c", "256", env=env)
    try:
        t0 = time.time()
        with cf.ThreadPoolExecutor(3) as ex:
            rs = list(ex.map(lambda _: complete(s, "model-q8_0.gguf"), range(3)))
        assert [r.status_code for r in rs] == [200] * 3
        assert time.time() - t0 >= 1.4
        assert all(r.json()["model"] == "model-q8_0.gguf" for r in rs)
    finally:
        s.stop()
    s = Server(TINY, "--model", str(LLAMA), "-c", "256", "--load-timeout", "0.3", env=env)
    try:
        r = complete(s, "lfm2_a")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert r.headers["retry-after"] == "1"
        assert states(s)["lfm2_a"] == "loading"
    finally:
        s.stop()


def test_a_busy_model_is_not_unloaded_and_a_broken_one_fails_alone(models_dir):
    (models_dir / "d-broken.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    s = Server(None, "--models-dir", str(models_dir), "--max-loaded", "1", "-np", "1", "-c", "2048")
    try:
        assert complete(s, "a-lfm2").status_code == 200
        body = {"model": "a-lfm2", "prompt": "Hello", "max_tokens": 1500, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.base + "/v1/completions", json=body, timeout=120) as stream:
            lines = stream.iter_lines()
            next(l for l in lines if l.startswith("data: "))
            # a-lfm2 is busy: b loads beside it, past --max-loaded.
            assert complete(s, "b-llama.gguf").status_code == 200
            assert states(s)["a-lfm2"] == "loaded"
            rest = [l for l in lines if l.startswith("data: ")]
            assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in "".join(rest)
        assert "every loaded model is busy" in s.logs()
        r = complete(s, "d-broken.gguf")
        assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
        assert "d-broken.gguf" in r.json()["error"]["message"]
        assert states(s)["d-broken.gguf"] == "failed"
        assert complete(s, "c-qwen2.gguf").status_code == 200
    finally:
        s.stop()


def test_bad_model_sets_are_refused(tmp_path):
    import subprocess
    from conftest import LONE
    def serve(*args):
        return subprocess.run([str(LONE), "serve", *args], capture_output=True, text=True, timeout=30)
    r = serve("--model", str(LLAMA), "--model", str(QWEN))
    assert r.returncode != 0 and "two models would both be called 'model-q8_0.gguf'" in r.stderr
    (tmp_path / "x.txt").write_text("")
    r = serve("--models-dir", str(tmp_path))
    assert r.returncode != 0 and "holds no model" in r.stderr
    r = serve("--model", str(TINY), "--model", str(LLAMA), "--alias", "x")
    assert r.returncode != 0 and "--alias" in r.stderr
    r = serve("--model", str(TINY), "--model", str(LLAMA), "--max-loaded", "0")
    assert r.returncode != 0 and "--max-loaded must be at least 1" in r.stderr
