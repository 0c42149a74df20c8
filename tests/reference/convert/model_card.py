#!/usr/bin/env python3
"""Record what llama.cpp's converter writes for checkpoints with a model card (and with named
chat templates), so that `lone convert` can be checked against it (crates/lone/tests/convert.rs).

Each case copies the llama fixture checkpoint (tests/reference/fixtures/llama) into a
directory named `case["dir"]`, with `case["readme"]` as its README.md and `case["config"]`
merged into its config.json, `case["tokenizer_config"]` (if any) merged into its
tokenizer_config.json, the files of `case["remove"]` deleted and those of `case["files"]`
({path: text}) written, runs convert_hf_to_gguf.py --outtype f32 on it (with the one
patch tests/reference/generate.py applies: the fixture tokenizer's pre-tokenizer is "gpt-2")
and records the output's size, sha256 and `general.*` metadata in `model-card.json`. The
cases themselves are in that file too, so the test rebuilds the same directories.

    python3 tests/reference/convert/model_card.py

Needs the llama.cpp tree of ../shared/scripts/build-llama-cpp.sh ($LLAMA_CPP_SRC).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import generate  # noqa: E402  (tests/reference/generate.py)

SOURCE = generate.FIXTURES / "llama"
FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "chat_template.jinja"]

CASES = [
    {
        # The Hub's usual front matter: licence, tags + pipeline tag, languages (with the
        # "Norway problem" entry), a base model by id and by URL, datasets by id and by URL,
        # the author as model_creator; the name from the directory.
        "dir": "ExampleOrg-Tiny-Llama-1.5B-Instruct-v0.2",
        "readme": """---
license: apache-2.0
license_link: https://www.apache.org/licenses/LICENSE-2.0
tags:
- text-generation
- tiny
pipeline_tag: text-generation
language:
- en
- no
- fr
base_model:
- ExampleOrg/Tiny-Llama-1.5B-v0.2
- https://huggingface.co/OtherOrg/Base-Model-3B
model_creator: Example Author
datasets:
- HuggingFaceTB/smoltalk
- https://example.com/data/set
---

# Tiny Llama

Some prose the converter does not read.
""",
        "config": {},
    },
    {
        # Names from the card and from config.json's _name_or_path, a licence list, base
        # models as a mapping and as a URL that is no model id, the llama.cpp-style keys; a
        # bare language string.
        "dir": "checkpoint",
        "readme": """---
model_name: Card Given Name
license:
- mit
- other
license_name: lfm1.0
version: "3.1"
description: A model card that names things itself.
url: https://example.com/model
repo_url: https://example.com/repo
base_model:
- name: Parent
  organization: Parent Org
  version: "2"
  repo_url: https://example.com/parent
- https://huggingface.co/datasets/not/a-model
language: de
dataset: OrgX/Some-Data-v1.1
---
""",
        "config": {"_name_or_path": "SomeOrg/Cool-Model-7B-v1.0-Chat"},
    },
    {
        # A base model given as one mapping (not a list: the converter records none), a tag
        # as one string, both language keys, author and basename keys, a tab-indented list.
        "dir": "Qwen2.5-0.5B",
        "readme": "---\nbase_model:\n  name: Lonely\ntags: solo\npipeline_tag: text-generation\n"
                  "languages:\n- zh\nlanguage:\n\t- en\nauthor: Someone\nmodel_basename: Base\n"
                  "finetune: Tuned\nsize_label: 9X\n---\nbody\n",
        "config": {"_name_or_path": "/home/user/checkpoints/run-7"},
    },
    {
        # No front matter (the file does not start with ---): only the config's id counts.
        "dir": "plain",
        "readme": "# Just a title\n\n---\nlicense: mit\n---\n",
        "config": {"_name_or_path": "AnOrg/Plain-Model-350M"},
    },
    {
        # Named chat templates in tokenizer_config.json (no chat_template.jinja): a default
        # and a tool_use one, as Hermes/Command-R style checkpoints ship them.
        "dir": "tool-templates",
        "readme": "# t\n",
        "config": {},
        "remove": ["chat_template.jinja"],
        "tokenizer_config": {"chat_template": [
            {"name": "default", "template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
            {"name": "tool_use", "template":
                "{{ tools | tojson }}{% for m in messages %}{{ m['content'] }}{% endfor %}"},
        ]},
    },
    {
        # chat_template.jinja with additional_chat_templates/ (transformers' save layout); the
        # name's '-' becomes '_'.
        "dir": "jinja-templates",
        "readme": "# t\n",
        "config": {},
        "files": {"additional_chat_templates/rag-v1.jinja":
                  "RAG {% for m in messages %}{{ m['content'] }}{% endfor %}"},
    },
    {
        # A list with no default (only a tool_use template and a nameless entry): no
        # tokenizer.chat_template at all.
        "dir": "no-default",
        "readme": "# t\n",
        "config": {},
        "remove": ["chat_template.jinja"],
        "tokenizer_config": {"chat_template": [
            {"name": "tool_use", "template": "TOOLS {{ tools | tojson }}"},
            {"name": "", "template": "ignored"},
        ]},
    },
]


def build(case: dict, root: Path) -> Path:
    d = root / case["dir"]
    d.mkdir()
    for f in FILES:
        if (SOURCE / f).exists():
            shutil.copy(SOURCE / f, d / f)
    cfg = json.loads((SOURCE / "config.json").read_text())
    cfg.update(case["config"])
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    (d / "README.md").write_text(case["readme"])
    if "tokenizer_config" in case:
        tc = json.loads((d / "tokenizer_config.json").read_text())
        tc.update(case["tokenizer_config"])
        (d / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    for f in case.get("remove", []):
        (d / f).unlink()
    for f, text in case.get("files", {}).items():
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_text(text)
    return d


def main() -> None:
    sys.path.insert(0, str(generate.LLAMA_CPP_SRC / "gguf-py"))
    from gguf import GGUFReader

    out = {"tool": "convert_hf_to_gguf.py (llama.cpp 0c1e570) --outtype f32", "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            d = build(case, Path(tmp))
            dst = Path(tmp) / f"{case['dir']}.gguf"
            p = multiprocessing.Process(target=generate._convert_main,
                                        args=(str(d), [("f32", str(dst))]))
            p.start()
            p.join()
            assert p.exitcode == 0, case["dir"]
            data = dst.read_bytes()
            general = {}
            for f in GGUFReader(dst).fields.values():
                if f.name.startswith("general.") or f.name.startswith("tokenizer.chat_template"):
                    general[f.name] = f.contents()
            out["cases"].append({**case, "size": len(data),
                                 "sha256": hashlib.sha256(data).hexdigest(),
                                 "general": general})
    (HERE / "model-card.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps([c["general"] for c in out["cases"]], indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
