"""Tool calling and structured output through the official openai client (and langchain-openai):
tools / tool_choice / parallel_tool_calls, streamed tool calls, the tool round trip rendered by the
real templates, response_format json_object / json_schema, client.chat.completions.parse with a
pydantic model, llama-server's grammar / json_schema fields, and bad requests as 400s."""

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel

from conftest import LONE, ROOT, SMOL, TINY, Server, need_smol

REF = ROOT / "tests" / "reference" / "tokenizer"
TEMPLATES = REF / "assets" / "chat-templates"
CHAT = json.loads((REF / "expected" / "chat.json").read_text())

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
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
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def accumulate(stream):
    """Accumulated streamed deltas: content, reasoning, calls by index, finish reasons."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        for c in chunk.choices:
            d = c.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                a = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    assert a["id"] is None, "the id comes once, in the first chunk of a call"
                    a["id"] = tc.id
                if tc.function and tc.function.name:
                    a["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    a["arguments"] += tc.function.arguments
            if c.finish_reason:
                finish = c.finish_reason
    return content, reasoning, calls, finish


@pytest.fixture(scope="module")
def tiny_tools():
    s = Server(TINY, "--parallel", "2", "--ctx", "2048")
    yield s
    s.stop()


def test_required_tool_call_non_streaming_and_streaming(smol):
    c = smol.client()
    kw = dict(model=smol.model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
              parallel_tool_calls=False, temperature=0, max_tokens=80)
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    assert len(ch.message.tool_calls) == 1
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    params = WEATHER if call.function.name == "get_weather" else TIME
    jsonschema.validate(args, params["function"]["parameters"])
    content, _, calls, finish = accumulate(c.chat.completions.create(**kw, stream=True))
    assert finish == "tool_calls" and content == ""
    assert [(v["name"], json.loads(v["arguments"])) for v in calls.values()] == [(call.function.name, args)]
    assert calls[0]["id"].startswith("call_")


def test_named_tool_choice_and_none(smol):
    c = smol.client()
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        r = c.chat.completions.create(model=smol.model, messages=ASK, tools=[WEATHER, TIME], tool_choice=named,
                                      temperature=1, seed=seed, max_tokens=60, parallel_tool_calls=False)
        assert r.choices[0].finish_reason == "tool_calls"
        assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_time"]
        assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {}
    r = c.chat.completions.create(model=smol.model, messages=ASK, tools=[WEATHER], tool_choice="none",
                                  temperature=0, max_tokens=20)
    assert r.choices[0].message.tool_calls is None
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content


def test_forced_calls_are_valid_at_temperature_one(smol):
    c = smol.client()
    for seed in range(6):
        r = c.chat.completions.create(model=smol.model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                      temperature=1, seed=seed, max_tokens=120)
        ch = r.choices[0]
        if ch.finish_reason == "length":
            continue  # a budget cut is allowed to leave a call unfinished; none may be malformed
        assert ch.finish_reason == "tool_calls", ch
        for t in ch.message.tool_calls:
            jsonschema.validate(json.loads(t.function.arguments), WEATHER["function"]["parameters"])


def test_forced_calls_cut_by_max_tokens_are_calls_or_nothing(smol):
    """A budget that ends inside a forced call: `finish_reason: "length"`, the complete calls
    alone (valid arguments), and no half-call text in `content` — streamed or not."""
    c = smol.client()
    ask = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
    for max_tokens in (4, 12, 20, 30, 45, 60, 75):
        kw = dict(model=smol.model, messages=ask, tools=[WEATHER], tool_choice="required",
                  temperature=0, max_tokens=max_tokens)
        ch = c.chat.completions.create(**kw).choices[0]
        assert ch.finish_reason == "length", (max_tokens, ch)
        assert not ch.message.content, (max_tokens, ch.message)
        for t in ch.message.tool_calls or []:
            jsonschema.validate(json.loads(t.function.arguments), WEATHER["function"]["parameters"])
        content, finish = "", None
        for chunk in c.chat.completions.create(stream=True, **kw):
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        assert finish == "length" and content == "", (max_tokens, content)


def test_tool_round_trip(smol):
    c = smol.client()
    r = c.chat.completions.create(model=smol.model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                  parallel_tool_calls=False, temperature=0, max_tokens=60)
    call = r.choices[0].message.tool_calls[0]
    msgs = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21, "sky": "sunny"})},
    ]
    r2 = c.chat.completions.create(model=smol.model, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=30)
    assert r2.choices[0].message.content
    # The call and the result are in the prompt the model saw.
    p = smol.post("/apply-template", json={"messages": msgs, "tools": [WEATHER]}).json()["prompt"]
    assert '"get_weather"' in p and '"temp": 21' in p and "get_weather" in p.split("<|im_start|>assistant")[1]


def expected(name):
    (case,) = [c for c in CHAT["cases"] if c["name"] == name]
    return case


def openai_messages(msgs):
    """The messages as an OpenAI client sends them: tool-call arguments as JSON strings."""
    out = []
    for m in msgs:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [
                {**tc, "function": {**tc["function"], "arguments": json.dumps(tc["function"]["arguments"], ensure_ascii=False)}}
                for tc in m["tool_calls"]
            ]
        out.append(m)
    return out


@pytest.mark.parametrize("template,case,bos", [
    ("Qwen2.5-Instruct.jinja", "qwen2.5/tools/agp=True/tools", ""),
    ("LFM2.5-8B-A1B.jinja", "LFM2.5-8B-A1B.jinja/tools/agp=True/tools", "<|startoftext|>"),
    ("LFM2.5-Instruct.jinja", "LFM2.5-Instruct.jinja/tools_list/agp=True/tools", "<|startoftext|>"),
])
def test_real_templates_render_tools_as_transformers(template, case, bos):
    """The tools and the tool round trip rendered by the real templates, byte for byte as
    transformers' apply_chat_template (the fixture's BOS differs from the real one)."""
    s = Server(TINY, "--chat-template-file", str(TEMPLATES / template), "--ctx", "2048")
    try:
        c = expected(case)
        body = {"messages": openai_messages(c["messages"]), "tools": c["tools"]}
        got = s.post("/apply-template", json=body).json()["prompt"]
        want = c["expected"]["ok"]
        assert want.startswith(bos)
        tiny_bos = "<|im_start|>" if bos else ""
        assert got.startswith(tiny_bos)
        assert got[len(tiny_bos):] == want[len(bos):]
        # And a chat request with them runs.
        r = s.client().chat.completions.create(model=s.model, messages=body["messages"], tools=c["tools"], max_tokens=5)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        s.stop()


def forced_calls_stream_as_they_return(server, seeds, max_tokens):
    """Forced calls at temperature 1: each seed gives calls that follow the tools' schemas, and
    the accumulated stream equals the non-streamed message."""
    c = server.client()
    for seed in seeds:
        kw = dict(model=server.model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                  temperature=1, seed=seed, max_tokens=max_tokens)
        ch = c.chat.completions.create(**kw).choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert ch.message.content is None
        content, _, calls, finish = accumulate(c.chat.completions.create(**kw, stream=True))
        assert finish == "tool_calls" and content == ""
        got = [(v["name"], json.loads(v["arguments"])) for v in calls.values()]
        assert got == [(t.function.name, json.loads(t.function.arguments)) for t in ch.message.tool_calls]
        for name, args in got:
            jsonschema.validate(args, (WEATHER if name == "get_weather" else TIME)["function"]["parameters"])


def test_streamed_tool_calls_equal_non_streamed_on_random_weights(tiny_tools):
    """A model that knows nothing, forced to call."""
    forced_calls_stream_as_they_return(tiny_tools, range(6), 1500)


class Person(BaseModel):
    name: str
    age: int


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_response_format_json_schema_and_json_object(smol):
    c = smol.client()
    msgs = [{"role": "user", "content": "Describe a person named Ada who is 36 as JSON."}]
    for stream in (False, True):
        kw = dict(model=smol.model, messages=msgs, temperature=0, max_tokens=80,
                  response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}})
        if stream:
            text = accumulate(c.chat.completions.create(**kw, stream=True))[0]
        else:
            r = c.chat.completions.create(**kw)
            assert r.choices[0].finish_reason == "stop"
            text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    r = c.chat.completions.create(model=smol.model, messages=msgs, temperature=0, max_tokens=150,
                                  response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_parse_with_pydantic(smol):
    c = smol.client()
    parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    r = parse(model=smol.model, messages=[{"role": "user", "content": "Ada is 36. Give her as JSON."}],
              response_format=Person, temperature=0, max_tokens=60)
    p = r.choices[0].message.parsed
    assert isinstance(p, Person) and isinstance(p.age, int)


def test_llama_server_grammar_and_json_schema_fields(tiny_tools):
    for seed in range(4):
        r = tiny_tools.post("/v1/chat/completions", json={
            "messages": ASK, "temperature": 1, "seed": seed, "max_tokens": 200,
            "grammar": 'root ::= ("yes" | "no") ", " [0-9]{1,3}'}).json()
        text = r["choices"][0]["message"]["content"]
        a, b = text.split(", ")
        assert a in ("yes", "no") and b.isdigit() and len(b) <= 3
        r = tiny_tools.post("/v1/completions", json={
            "prompt": "x", "temperature": 1, "seed": seed, "max_tokens": 400, "json_schema": PERSON_SCHEMA}).json()
        jsonschema.validate(json.loads(r["choices"][0]["text"]), PERSON_SCHEMA)


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}, "response_format"),
    ({"grammar": "root ::= [a-"}, "grammar"),
    ({"grammar": "start: undefined_rule"}, "grammar"),
    ({"json_schema": [1]}, "json_schema"),
]


@pytest.mark.parametrize("extra,param", BAD)
def test_bad_tool_requests_are_400(tiny_tools, extra, param):
    r = tiny_tools.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_langchain_bind_tools_and_structured_output(smol):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return "sunny"

    llm = lc.ChatOpenAI(base_url=smol.base + "/v1", api_key="none", model=smol.model,
                        temperature=0, max_tokens=80)
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str)
    p = llm.with_structured_output(Person, method="json_schema").invoke("Ada is 36. Give her as JSON.")
    assert isinstance(p, Person)


def prompt_cache_turns(model, n_convs=3, turns=3, max_tokens=16):
    """Conversations taking turns through one slot, on a server with the prompt cache and one
    without: the replies must be equal; returns (prompt tokens, cached tokens, previous
    prompt+reply tokens) per returning turn."""
    cached = Server(model, "--parallel", "1", "--ctx", "2048")
    plain = Server(model, "--parallel", "1", "--ctx", "2048", "--cache-ram", "0")
    out = []
    try:
        convs = [[{"role": "user", "content": f"Conversation {i}: tell me about the number {i * 7}."}] for i in range(n_convs)]
        before = [0] * n_convs
        for turn in range(turns):
            for i, msgs in enumerate(convs):
                kw = dict(messages=msgs, temperature=0, max_tokens=max_tokens)
                r = cached.client().chat.completions.create(model=cached.model, **kw)
                want = plain.client().chat.completions.create(model=plain.model, **kw)
                assert r.choices[0].message.content == want.choices[0].message.content
                u = r.usage
                if turn > 0:
                    out.append((u.prompt_tokens, u.prompt_tokens_details.cached_tokens, before[i]))
                    assert want.usage.prompt_tokens_details.cached_tokens < u.prompt_tokens_details.cached_tokens
                before[i] = u.prompt_tokens + u.completion_tokens
                msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": f"And turn {turn + 1}?"}]
        m = cached.metrics()
        assert m["lone_prompt_cache_hits_total"] >= n_convs * (turns - 1) and m["lone_prompt_cache_bytes"] > 0
    finally:
        cached.stop()
        plain.stop()
    return out


def test_prompt_cache_resumes_conversations_evicted_from_their_slot():
    """Random weights (a hybrid LFM2): replies re-tokenize differently from how they were
    generated, so at least the previous prompt comes from its snapshot."""
    for prompt, cached, prev in prompt_cache_turns(TINY):
        assert cached >= prev - 16 - 1 and cached < prompt, (prompt, cached, prev)


def test_prompt_cache_real_model_prefills_only_the_new_turn():
    need_smol()
    for prompt, cached, prev in prompt_cache_turns(SMOL, max_tokens=24):
        # All of the previous prompt and reply (but the reply's last token, never fed).
        assert cached >= prev - 1 and prompt - cached <= 20, (prompt, cached, prev)


def lfm2_real_vocab_model(tmp: Path) -> Path:
    """The tiny LFM2 fixture widened to the real LFM2 tokenizer (65 536 logits; the embedding
    rows tiled), with the LFM2.5 template that renders tools and tool calls: LFM2's own
    tool-call format, markers as special tokens."""
    import struct

    src = TINY / "model.safetensors"
    raw = src.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    vocab = 65536
    out, tensors, off = {}, [], 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b = data[t["data_offsets"][0]:t["data_offsets"][1]]
        shape = t["shape"]
        if name == "model.embed_tokens.weight":
            b = b * (vocab // shape[0])
            shape = [vocab, shape[1]]
        out[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + len(b)]}
        tensors.append(b)
        off += len(b)
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    d = tmp / "lfm2-real-vocab"
    d.mkdir()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(tensors))
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(vocab_size=vocab, bos_token_id=1, eos_token_id=7, pad_token_id=0)
    (d / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(REF / "assets" / "lfm2" / f, d / f)
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    shutil.copy(TEMPLATES / "LFM2.5-8B-A1B.jinja", d / "chat_template.jinja")
    return d


def test_lfm2_format_end_to_end(tmp_path):
    """LFM2's `<|tool_call_start|>[f(a=1)]<|tool_call_end|>` with special-token markers:
    forced calls parse, stream as OpenAI does, never leak a marker; with `auto`, a call the
    model starts by itself (pushed by logit_bias on the marker) is constrained from there."""
    s = Server(lfm2_real_vocab_model(tmp_path), "--parallel", "2", "--ctx", "2048")
    try:
        p = s.post("/apply-template", json={"messages": ASK, "tools": [WEATHER]}).json()["prompt"]
        assert p.startswith("<|startoftext|><|im_start|>system\nList of tools: [")
        forced_calls_stream_as_they_return(s, range(4), 800)
        # auto: free text until the marker, then a constrained call.
        r = s.client().chat.completions.create(model=s.model, messages=ASK, tools=[WEATHER], temperature=1, seed=1,
                                      max_tokens=300, logit_bias={"10": 100}, parallel_tool_calls=False)
        ch = r.choices[0]
        assert ch.message.tool_calls, ch
        assert "<|tool_call" not in (ch.message.content or "")
        jsonschema.validate(json.loads(ch.message.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])
        # The round trip renders the call as LFM2 writes it.
        msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [ch.message.tool_calls[0].model_dump()]},
                      {"role": "tool", "tool_call_id": ch.message.tool_calls[0].id, "content": "sunny"}]
        p = s.post("/apply-template", json={"messages": msgs, "tools": [WEATHER]}).json()["prompt"]
        assert "<|tool_call_start|>[get_weather(city=" in p
    finally:
        s.stop()


def test_reasoning_split_when_the_template_opens_think(tmp_path):
    """A template whose generation prompt ends in `<think>` (Qwen3/LFM2.5-thinking style): the
    reply starts in reasoning; `</think>` ends it (forced here by a grammar)."""
    tpl = tmp_path / "think.jinja"
    tpl.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    s = Server(TINY, "--chat-template-file", str(tpl), "--ctx", "1024")
    try:
        body = {"messages": ASK, "max_tokens": 60, "grammar": 'root ::= "First, the city." "\\n</think>\\n\\n" "It is sunny."'}
        m = s.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert m["reasoning_content"] == "First, the city." and m["content"] == "It is sunny."
        content, reasoning, _, _ = accumulate(s.client().chat.completions.create(
            model=s.model, messages=ASK, max_tokens=60, stream=True, extra_body={"grammar": body["grammar"]}))
        assert (reasoning, content) == ("First, the city.", "It is sunny.")
    finally:
        s.stop()


def test_constrained_choices_batched(tiny_tools):
    """n choices decode together (one grammar matcher each, masks in the same steps)."""
    r = tiny_tools.client().chat.completions.create(
        model=tiny_tools.model, messages=ASK, n=4, temperature=1, seed=3, max_tokens=400,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA}})
    assert len(r.choices) == 4
    texts = [c.message.content for c in r.choices]
    for t in texts:
        jsonschema.validate(json.loads(t), PERSON_SCHEMA)
    assert len(set(texts)) > 1


def test_strict_tools_are_validated_after_parsing(tiny_tools):
    """A call that does not follow a strict tool's schema (here forced by a grammar, as a call
    the lazy constraint missed would be) is content, not a call; without strict it is a call."""
    bad_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5}}\n</tool_call>'
    grammar = 'root ::= "' + bad_call.replace('\\', '\\\\').replace('"', '\\"').replace("\n", "\\n") + '"'
    for strict in (False, True):
        tool = {"type": "function", "function": {**WEATHER["function"], "strict": strict}}
        r = tiny_tools.post("/v1/chat/completions", json={
            "messages": ASK, "tools": [tool], "grammar": grammar, "max_tokens": 80}).json()
        ch = r["choices"][0]
        if strict:
            assert "tool_calls" not in ch["message"] and ch["finish_reason"] == "stop"
            assert ch["message"]["content"] == bad_call.split("\n", 1)[1].rsplit("\n", 1)[0]
        else:
            assert ch["finish_reason"] == "tool_calls"
            assert json.loads(ch["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": 5}
    bad_schema = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {"type": 12}}}}}
    r = tiny_tools.post("/v1/chat/completions", json={"messages": ASK, "tools": [bad_schema]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_a_tool_use_template_serves_the_requests_with_tools(tmp_path):
    """A checkpoint with named chat templates (tokenizer_config.json's list: default +
    tool_use), as a directory and converted to GGUF (`tokenizer.chat_template.tool_use`):
    requests with tools render with the tool_use template, the others with the default, as
    transformers' apply_chat_template and llama-server choose; --chat-template-file replaces
    both."""
    qwen = (TEMPLATES / "Qwen2.5-Instruct.jinja").read_text()
    chatml = (TINY / "chat_template.jinja").read_text()
    d = tmp_path / "named-templates"
    d.mkdir()
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / f, d / f)
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["chat_template"] = [{"name": "default", "template": chatml}, {"name": "tool_use", "template": qwen}]
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    gguf = tmp_path / "named-templates.gguf"  # the fixture tokenizer's pre-tokenizer is named as generate.py does
    subprocess.run([str(LONE), "convert", str(d), "-o", str(gguf), "-t", "F32", "--tokenizer-pre", "gpt-2"], check=True, capture_output=True)
    with_tools = {"messages": ASK, "tools": [WEATHER]}

    def prompts(*args):
        s = Server(*args)
        try:
            return (s.post("/apply-template", json={"messages": ASK}).json()["prompt"],
                    s.post("/apply-template", json=with_tools).json()["prompt"])
        finally:
            s.stop()

    plain, _ = prompts(TINY)
    _, tools = prompts(TINY, "--chat-template-file", str(TEMPLATES / "Qwen2.5-Instruct.jinja"))
    assert "<tools>" in tools and "<tools>" not in plain
    for model in (d, gguf):
        assert prompts(model) == (plain, tools), model
    # An explicit template serves every request.
    over_plain, over_tools = prompts(gguf, "--chat-template-file", str(TINY / "chat_template.jinja"))
    assert over_plain == plain and "<tools>" not in over_tools
