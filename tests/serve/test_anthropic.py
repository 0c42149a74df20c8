"""Anthropic's Messages API through the official `anthropic` Python client: system prompts,
stop sequences, max_tokens, streaming events (text_stream equals the non-streamed text), usage,
count_tokens, x-api-key auth and Anthropic-shaped errors."""

import anthropic
import pytest

from conftest import SMOL, TINY, Server


@pytest.fixture(scope="module")
def client(smol):
    return anthropic.Anthropic(base_url=smol.base, api_key="none", max_retries=0)


ASK = [{"role": "user", "content": "What is the capital of France?"}]


def test_messages_non_streaming_and_streaming(client):
    kw = dict(model="claude-sonnet-4-5", max_tokens=24, messages=ASK, extra_body={"temperature": 0},
              system="You answer in one short sentence.")
    r = client.messages.create(**kw)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.content[0].type == "text" and "Paris" in r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert r.usage.output_tokens > 0 and r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 10
    with client.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == r.content[0].text == final.content[0].text
    assert final.stop_reason == r.stop_reason and final.usage.output_tokens == r.usage.output_tokens
    events = [e.type for e in client.messages.create(**kw, stream=True)]
    assert events[:3] == ["message_start", "content_block_start", "content_block_delta"] or events[:2] == ["message_start", "content_block_start"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_stop_sequences_and_max_tokens(client):
    r = client.messages.create(model="m", max_tokens=3, messages=ASK, extra_body={"temperature": 0})
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3
    full = client.messages.create(model="m", max_tokens=40, messages=ASK, extra_body={"temperature": 0}).content[0].text
    word = full.split()[2]
    r = client.messages.create(model="m", max_tokens=40, messages=ASK, extra_body={"temperature": 0}, stop_sequences=[word])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word
    assert r.content[0].text == full[: full.index(word)]
    n = client.messages.count_tokens(model="m", messages=ASK, system="Be brief.")
    assert n.input_tokens > 5


def test_errors_and_x_api_key():
    s = Server(TINY, "--api-key", "k3y", "-c", "512", "-np", "1")
    try:
        c = anthropic.Anthropic(base_url=s.base, api_key="k3y", max_retries=0)
        assert c.messages.create(model="m", max_tokens=2, messages=ASK).usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=s.base, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=2, messages=ASK)
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(model="m", max_tokens=2, messages=[{"role": "tool", "content": "x"}])
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
        r = s.post("/v1/messages", json={"messages": ASK}, headers={"x-api-key": "k3y"})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    finally:
        s.stop()
