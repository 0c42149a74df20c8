#!/usr/bin/env python3
"""Generate the committed expected outputs for lone-core's tokenizer and chat-template tests.

Ground truth is Hugging Face: the Python `tokenizers` library for encode/decode, and
`transformers.AutoTokenizer.from_pretrained(local_dir).apply_chat_template(tokenize=False)`
for chat templates. Everything is loaded from the local copies in ./assets (no Hub access).

Run from anywhere:  python3 tests/reference/tokenizer/generate.py
Writes: expected/encode_<model>.json, expected/chat_<case-set>.json
"""
import json
import os
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ASSETS = os.path.join(HERE, "assets")
OUT = os.path.join(HERE, "expected")

TEXTS = [
    "",
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's fine; they'll say we've done what you'd LIKE. DON'T",
    "12345678",
    "pi = 3.14159, e = 2.71828, 1,000,000 and 0.5%",
    "Year 2024: 365 days, 8760 hours",
    "   leading spaces and trailing spaces   ",
    "multiple\n\nnewlines\n\n\n\nand\r\nwindows\rreturns",
    "\t\ttabs\tand\t\tmore\ttabs",
    "def f(x):\n    if x > 0:\n        return x * 2\n\treturn -x\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "python",
    "I love python programming",
    "pythonic code in cpython",
    "Mathias",
    "Mathias and mathias met MathiasX and xMathias",
    "python Mathias pythonMathias",
    "日本語のテキストです。東京は大きい都市です。",
    "中文测试：你好，世界！我想在apple工作1314151天～",
    "Ελληνικά, русский язык, العربية, עברית",
    "Cửa Việt, Äpfel, naïve café, Ångström",
    "emoji: 🦙🚀😶‍🌫️ 👨‍👩‍👧‍👦 ✅ 🇫🇷",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more text <|endoftext|>",
    "<|startoftext|>bos in text",
    "mixed 🤖 code `x = 42` and **markdown** _here_",
    "  \n  \t \n",
    "a" * 50 + " " + "ab" * 20,
    "https://example.com/path?query=1&x=y#frag",
    "\u00e9 vs e\u0301 (NFC vs NFD)",
    "zero\u200bwidth and\u00a0nbsp",
    "!!!!!! ??? ... --- ***",
]

MODELS = {
    "lfm2": os.path.join(ASSETS, "lfm2"),
    "qwen2.5": os.path.join(ASSETS, "qwen2.5"),
}


def encode_cases(name, model_dir):
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(model_dir)
    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        # transformers must agree with the raw tokenizers library, otherwise the
        # ground truth itself is ambiguous.
        hf_ids = hf.encode(text, add_special_tokens=True)
        if hf_ids != ids_special:
            sys.exit(f"{name}: transformers and tokenizers disagree on {text!r}")
        decoded = tok.decode(ids_special, skip_special_tokens=False)
        decoded_skip = tok.decode(ids_special, skip_special_tokens=True)
        if hf.decode(ids_special) != decoded:
            sys.exit(f"{name}: transformers and tokenizers decode differ on {text!r}")
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_with_special": ids_special,
                "decoded": decoded,
                "decoded_skip_special": decoded_skip,
            }
        )
    return {
        "model": name,
        "tokenizers_version": tokenizers.__version__,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "cases": cases,
    }


SYSTEM = "You are a helpful assistant. Réponds en français si besoin."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather — in °C — for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
                "ratio": {"type": "number", "default": 0.5},
                "verbose": {"type": "boolean", "default": False},
                "tags": {"type": "array", "items": {"type": "string"}},
                "note": {"type": ["string", "null"]},
            },
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_multi_turn": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 = 4."},
        {"role": "user", "content": "And in words?\n  Please be brief.  "},
    ],
    "assistant_last": [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Hi! 👋"},
    ],
    "non_ascii": [
        {"role": "system", "content": "日本語で答えてください。"},
        {"role": "user", "content": "東京の天気は？ 🌦️ Ça va? \"quotes\" & <tags> \\ back\tslash"},
    ],
    "thinking_history": [
        {"role": "user", "content": "First?"},
        {"role": "assistant", "content": "<think>reasoning one</think>\n\nAnswer one."},
        {"role": "user", "content": "Second?"},
        {"role": "assistant", "content": "<think>reasoning two</think>Answer two."},
    ],
    "empty_content": [
        {"role": "user", "content": ""},
    ],
}

TOOL_CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Weather in Tokyo and Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {"city": "東京", "unit": "celsius", "days": 2, "ratio": 1.5, "verbose": True, "note": None},
                },
            },
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "tags": ["a", "b"]}},
            },
        ],
    },
    {"role": "tool", "name": "get_weather", "content": '{"temp": 21, "sky": "晴れ"}'},
    {"role": "tool", "name": "get_weather", "content": '{"temp": 15, "sky": "cloudy"}'},
    {"role": "assistant", "content": "Tokyo: 21°C, sunny. Paris: 15°C, cloudy."},
    {"role": "user", "content": "Thanks"},
]


def render(tok, messages, add_generation_prompt, tools=None, template=None, kwargs=None):
    return tok.apply_chat_template(
        messages,
        tools=tools,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **(kwargs or {}),
    )


def chat_cases():
    out = []
    lfm2 = AutoTokenizer.from_pretrained(MODELS["lfm2"])
    qwen = AutoTokenizer.from_pretrained(MODELS["qwen2.5"])

    def add(set_name, tok, template_file, messages, agp, tools=None, kwargs=None, conv_name=""):
        template = None
        if template_file is not None:
            with open(os.path.join(ASSETS, "chat-templates", template_file), encoding="utf-8") as f:
                template = f.read()
        try:
            text = render(tok, messages, agp, tools, template, kwargs)
            expected = {"ok": text}
        except Exception as e:  # record template errors too (raise_exception)
            expected = {"error": f"{type(e).__name__}: {e}"}
        out.append(
            {
                "name": f"{set_name}/{conv_name}/agp={agp}" + ("/tools" if tools else "") + (f"/{kwargs}" if kwargs else ""),
                "model_dir": set_name if template_file is None else None,
                "tokenizer": "lfm2" if tok is lfm2 else "qwen2.5",
                "template_file": template_file,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": agp,
                "kwargs": kwargs or {},
                "expected": expected,
            }
        )

    for conv_name, conv in CONVERSATIONS.items():
        for agp in (False, True):
            add("lfm2", lfm2, None, conv, agp, conv_name=conv_name)
            add("qwen2.5", qwen, None, conv, agp, conv_name=conv_name)
            for tf in ("LFM2.5-Instruct.jinja", "LFM2.5-8B-A1B.jinja", "LFM2-8B-A1B.jinja"):
                add(tf, lfm2, tf, conv, agp, conv_name=conv_name)
            add("Qwen2.5-Instruct.jinja", qwen, "Qwen2.5-Instruct.jinja", conv, agp, conv_name=conv_name)
    # tools
    for agp in (False, True):
        add("qwen2.5", qwen, None, TOOL_CONVERSATION, agp, tools=[WEATHER_TOOL], conv_name="tools")
        add("qwen2.5", qwen, None, CONVERSATIONS["single_user"], agp, tools=[WEATHER_TOOL], conv_name="tools_no_system")
        for tf in ("LFM2.5-8B-A1B.jinja", "LFM2-8B-A1B.jinja", "LFM2.5-Instruct.jinja"):
            add(tf, lfm2, tf, CONVERSATIONS["system_multi_turn"], agp, tools=[WEATHER_TOOL], conv_name="tools_list")
    # the LFM2.5-8B template renders tool calls with python-style argument values
    add("LFM2.5-8B-A1B.jinja", lfm2, "LFM2.5-8B-A1B.jinja", TOOL_CONVERSATION, True, tools=[WEATHER_TOOL], conv_name="tools")
    # extra kwargs
    add("LFM2.5-Instruct.jinja", lfm2, "LFM2.5-Instruct.jinja", CONVERSATIONS["thinking_history"], True,
        kwargs={"keep_past_thinking": True}, conv_name="thinking_history")
    add("LFM2.5-8B-A1B.jinja", lfm2, "LFM2.5-8B-A1B.jinja", CONVERSATIONS["thinking_history"], False,
        kwargs={"preserve_thinking": True}, conv_name="thinking_history")
    return out


def error_cases():
    """Templates that must fail, with the message transformers reports."""
    tok = AutoTokenizer.from_pretrained(MODELS["qwen2.5"])
    cases = []
    for name, tpl in [
        ("raise_exception", "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user message!') }}{% endif %}ok"),
        ("raise_in_loop", "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}"),
    ]:
        try:
            tok.apply_chat_template([{"role": "system", "content": "x"}], chat_template=tpl, tokenize=False)
            sys.exit(f"{name}: expected an error")
        except Exception as e:
            cases.append({"name": name, "template": tpl, "messages": [{"role": "system", "content": "x"}], "message": str(e)})
    return cases


def python_semantics_cases():
    """Small templates checking Python/Jinja2 details (tojson, str(), trim/lstrip blocks)."""
    tok = AutoTokenizer.from_pretrained(MODELS["qwen2.5"])
    value = {
        "b": 1, "a": [1, 2.5, True, None, "x"], "uni": "日本 é \"q\" \\ \n\t\u0001 </script>", "f": 1e-7, "g": 1e20,
        "h": 100.0, "nested": {"z": {}, "y": []},
    }
    templates = {
        "tojson": "{{ v | tojson }}",
        "tojson_indent": "{{ v | tojson(indent=2) }}",
        "tojson_sort": "{{ v | tojson(sort_keys=True) }}",
        "str_values": "{% for k, x in v.items() %}{{ k }}={{ x }};{{ x | string }}|{% endfor %}",
        "bools": "{{ true }} {{ false }} {{ none }} {{ [true, none, 'a'] }} {{ 1.0 }} {{ 3 / 2 }} {{ 7 // 2 }}",
        "blocks": "{% for m in messages %}\n  {% if m.role %}\n    [{{ m.role }}]\n  {% endif %}\n{% endfor %}\n",
        "methods": "{{ '  a b  '.strip() }}|{{ 'a,b,c'.split(',') | join('+') }}|{{ 'hello'.startswith('he') }}|{{ 'x'.upper() }}{{ 'ABC'.lower() }}|{{ 'a-b'.replace('-', '_') }}|{{ 'a b'.title() }}",
        "loop_controls": "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
        "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
        "dict_get": "{{ messages[0].get('content') }}|{{ messages[0].get('missing', 'dflt') }}|{{ messages[0].get('missing') }}",
        "undefined_tools": "{{ tools is none }}|{{ tools is defined }}|{{ documents is none }}|{{ bos_token is defined }}|{{ eos_token }}",
    }
    msgs = [{"role": "user", "content": "c1"}, {"role": "assistant", "content": "c2"}]
    cases = []
    for name, tpl in templates.items():
        text = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False, v=value)
        cases.append({"name": name, "template": tpl, "messages": msgs, "kwargs": {"v": value}, "expected": text})
    return cases


def main():
    os.makedirs(OUT, exist_ok=True)
    meta = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
    for name, d in MODELS.items():
        data = encode_cases(name, d)
        data["generator"] = meta
        with open(os.path.join(OUT, f"encode_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
    chat = {"generator": meta, "cases": chat_cases(), "errors": error_cases(), "python": python_semantics_cases()}
    with open(os.path.join(OUT, "chat.json"), "w", encoding="utf-8") as f:
        json.dump(chat, f, ensure_ascii=False, indent=1)
    print("ok:", len(chat["cases"]), "chat cases,", len(TEXTS), "texts per model")


if __name__ == "__main__":
    main()
