"""`/v1/embeddings` through the openai client: equal to transformers' mean-pooled, normalised
final hidden states (tests/reference/embeddings/expected.json) in exact mode, batches equal
singles, deterministic, base64 = float, token-id inputs, bad inputs are 400s."""

import base64
import json
import math
import struct

import pytest

from conftest import ROOT, Server

REF = json.loads((ROOT / "tests" / "reference" / "embeddings" / "expected.json").read_text())
FIX = ROOT / "tests" / "reference" / "fixtures"


@pytest.mark.parametrize("name", sorted(REF["models"]))
def test_embeddings_match_transformers(name):
    s = Server(FIX / name, "--exact", "--cache-type", "f32", "-c", "512", "-np", "1")
    try:
        c = s.client()
        cases = REF["models"][name]
        batch = c.embeddings.create(model="m", input=[x["input"] for x in cases])
        assert [d.index for d in batch.data] == list(range(len(cases)))
        assert batch.usage.prompt_tokens == sum(len(x["ids"]) for x in cases)
        for x, d in zip(cases, batch.data):
            got, want = d.embedding, x["embedding"]
            assert len(got) == len(want)
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4, x["input"]
            assert abs(math.sqrt(sum(v * v for v in got)) - 1) < 1e-5
            one = c.embeddings.create(model="m", input=x["input"]).data[0].embedding
            assert one == got  # batch = single, and deterministic
            ids = c.embeddings.create(model="m", input=[x["ids"]]).data[0].embedding
            assert ids == got
        raw = s.post("/v1/embeddings", json={"input": "Hello world", "encoding_format": "base64"}).json()
        b = base64.b64decode(raw["data"][0]["embedding"])
        floats = list(struct.unpack(f"<{len(b) // 4}f", b))
        assert floats == batch.data[0].embedding
        for bad in [{"input": []}, {"input": ""}, {"input": "x", "encoding_format": "hex"},
                    {"input": [[10 ** 7]]}, {"input": "x", "dimensions": 3}, {}]:
            r = s.post("/v1/embeddings", json=bad)
            assert r.status_code == 400, (bad, r.text)
    finally:
        s.stop()
