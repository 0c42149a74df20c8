"""The ollama API through the official `ollama` Python client: chat and generate, streaming
(NDJSON) and not, options, format json / schema, tags / show / ps / version."""

import json

import jsonschema
import ollama
import pytest

from conftest import need_smol


@pytest.fixture(scope="module")
def client(smol):
    return ollama.Client(host=smol.base)


def test_chat_streaming_equals_non_streaming(client, smol):
    # A system prompt: without one SmolLM2-135M Q4_1's answer is a close call that 8-bit
    # activations flip (as in llama.cpp).
    msgs = [{"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "What is the capital of France?"}]
    opts = {"temperature": 0, "num_predict": 24}
    r = client.chat(model="smollm2", messages=msgs, options=opts)
    assert r.message.role == "assistant" and "Paris" in r.message.content
    assert r.done and r.done_reason in ("stop", "length")
    assert r.prompt_eval_count > 0 and 0 < r.eval_count <= 24 and r.total_duration > 0
    parts = list(client.chat(model="smollm2", messages=msgs, options=opts, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].eval_count == r.eval_count


def test_generate_and_options(client):
    r = client.generate(model="smollm2", prompt="What is the capital of France?", system="You answer in one short sentence.",
                        options={"temperature": 0, "num_predict": 16})
    assert "Paris" in r.response and r.done
    raw = client.generate(model="smollm2", prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 4, "stop": ["."]})
    assert raw.response and "." not in raw.response
    parts = list(client.generate(model="smollm2", prompt="Hi", options={"num_predict": 5, "seed": 1}, stream=True))
    assert parts[-1].done and parts[-1].eval_count <= 5
    a = client.generate(model="smollm2", prompt="Say a word", options={"seed": 7, "num_predict": 8})
    b = client.generate(model="smollm2", prompt="Say a word", options={"seed": 7, "num_predict": 8})
    assert a.response == b.response


def test_format_json_and_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 130}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat(model="smollm2", messages=[{"role": "user", "content": "Ada is 36. Reply with JSON."}],
                    format=schema, options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(r.message.content), schema)
    r = client.generate(model="smollm2", prompt="A JSON object about Paris", format="json",
                        options={"temperature": 0, "num_predict": 120})
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.response), dict)


def test_tags_show_ps_version(client, smol):
    tags = client.list()
    assert [m.model for m in tags.models] == [smol.model]
    d = tags.models[0].details
    assert d.format == "gguf" and d.family == "llama" and d.quantization_level == "Q4_1" and d.parameter_size == "135M"
    show = client.show(smol.model)
    assert "im_start" in show.template and "completion" in show.capabilities
    assert show.modelinfo["general.architecture"] == "llama"
    assert [m.model for m in client.ps().models] == [smol.model]
    assert smol.get("/api/version").json()["version"]


def test_errors_are_ollama_shaped(smol):
    r = smol.post("/api/chat", json={"messages": "x"})
    assert r.status_code == 400 and "error" in r.json()
    r = smol.post("/api/chat", json={"messages": [{"role": "user", "content": "x"}], "options": {"temperature": "hot"}})
    assert r.status_code == 400 and "temperature" in r.json()["error"]
    r = smol.post("/api/generate", json={"model": "x"})
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
