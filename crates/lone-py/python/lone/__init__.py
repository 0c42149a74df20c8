"""lone: run small language models (LFM2, LFM2.5, LFM3, Qwen2/3, Llama) locally.

The same engine as the ``lone`` command (installed with this package) and ``lone serve``:
requests take the fields of the OpenAI API's bodies and answer with its shapes (dicts), so the
chat templates, tool calls, structured output, sampling options and validation are the
server's. Calls that compute release the GIL; Ctrl-C stops a generation.

    >>> import lone
    >>> m = lone.Model("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> m.generate("The capital of France is", max_tokens=8)
    >>> m.chat([{"role": "user", "content": "Hi!"}])["choices"][0]["message"]["content"]
"""

from __future__ import annotations

import json
import math
import os
import sys
from array import array
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _lone
from ._lone import LoneError

__version__: str = _lone.__version__
__all__ = ["Model", "Server", "LoneError", "serve", "__version__"]

Prompt = Union[str, Sequence[int]]

# How long one wait for the engine lasts before Python gets to check for Ctrl-C.
_POLL_MS = 100


def _flags(options: Dict[str, Any]) -> List[str]:
    """``lone serve``'s flags from keyword arguments: ``ctx=4096`` -> ``--ctx 4096``,
    ``log_prompts=True`` -> ``--log-prompts``, a list repeats the flag."""
    out: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
        else:
            out += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return out


def _prompt_field(prompt: Prompt) -> Union[str, List[int]]:
    if isinstance(prompt, str):
        return prompt
    return [int(t) for t in prompt]


class _Stream:
    """The chunks of a streamed request; closing it (or letting it go) cancels the request."""

    def __init__(self, req: Any, pick: Any) -> None:
        self._req = req
        self._pick = pick

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self) -> Any:
        if self._req is None:
            raise StopIteration
        try:
            while True:
                kind, payload = self._req.next(_POLL_MS)
                if kind == "chunk":
                    out = self._pick(json.loads(payload))
                    if out is None:
                        continue
                    return out
                if kind == "end":
                    self._req = None
                    raise StopIteration
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop generating."""
        if self._req is not None:
            self._req.cancel()
            self._req = None

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _wait(req: Any) -> Dict[str, Any]:
    """The whole answer of a request that does not stream (Ctrl-C cancels it)."""
    try:
        while True:
            kind, payload = req.next(_POLL_MS)
            if kind == "response":
                return json.loads(payload)
            if kind == "end":
                raise LoneError("the request ended without an answer")
    finally:
        req.cancel()


class Model:
    """A model loaded for this process: a Hugging Face checkpoint directory or a GGUF file
    (``None``: the default model of ``scripts/quickstart.sh``).

    ``threads``: kernel threads (default: the CPU's cores); ``ctx``: positions per sequence
    (default: the model's, at most 4096); ``parallel``: sequences decoded together when
    several threads call the model at once (each has its own cache); ``cache_type``:
    ``"f16"`` (default), ``"q8_0"`` or ``"f32"``; ``mode``: ``"auto"`` (default), ``"exact"``
    (the f32 path, equal to transformers) or ``"fast"``. Other keyword arguments are ``lone
    serve``'s flags (``chat_template_file=``, ``model_draft=``, ``spec_type=``,
    ``draft_max=``, ``alias=``, ``cache_ram=``, ...).
    """

    def __init__(
        self,
        model: Union[str, "os.PathLike[str]", None] = None,
        *,
        threads: Optional[int] = None,
        ctx: Optional[int] = None,
        parallel: int = 1,
        cache_type: Optional[str] = None,
        mode: Optional[str] = None,
        **flags: Any,
    ) -> None:
        flags.setdefault("log_format", "off")
        args = _flags(
            dict(model=model, threads=threads, ctx=ctx, parallel=parallel, **flags)
        )
        self._m = _lone.NativeModel(args, mode, cache_type)
        self._info: Dict[str, Any] = json.loads(self._m.info())

    # -- what it is -------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The id responses carry (the file or directory name, or ``alias``)."""
        return self._info["id"]

    @property
    def path(self) -> str:
        return self._info["path"]

    @property
    def n_ctx(self) -> int:
        """Positions per sequence."""
        return self._info["context"]

    @property
    def n_vocab(self) -> int:
        return self._info["vocab_size"]

    @property
    def n_embd(self) -> int:
        """Embedding width."""
        return self._info["embedding_size"]

    @property
    def info(self) -> Dict[str, Any]:
        """Architecture, quantization, parameters, sizes."""
        return dict(self._info)

    # -- text ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> List[int]:
        """Token ids of ``text``; ``add_special``: with the BOS/EOS the tokenizer adds."""
        return self._m.tokenize(text, add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._m.detokenize([int(t) for t in ids])

    def apply_chat_template(
        self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None
    ) -> str:
        """The prompt ``messages`` (and ``tools``) render to, with the generation prompt."""
        body: Dict[str, Any] = {"messages": messages}
        if tools is not None:
            body["tools"] = tools
        return self._m.apply_template(json.dumps(body))

    # -- generation ---------------------------------------------------------------------
    def create_completion(
        self, prompt: Prompt, *, stream: bool = False, **options: Any
    ) -> Any:
        """``POST /v1/completions`` in process: ``options`` are its fields (``max_tokens``,
        ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, ``n``,
        ``logprobs``, ``repeat_penalty``, ``grammar``, ``json_schema``, ``response_format``,
        ...). The response dict, or with ``stream=True`` an iterator of chunk dicts."""
        body = dict(options, prompt=_prompt_field(prompt), stream=stream)
        req = self._m.request("completion", json.dumps(body))
        return _Stream(req, lambda c: c) if stream else _wait(req)

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: Optional[int] = 128,
        stream: bool = False,
        **options: Any,
    ) -> Any:
        """The text ``prompt`` (text, or token ids) continues with, or with ``stream=True``
        an iterator of its pieces. Greedy unless ``temperature`` says otherwise; ``options``
        as :meth:`create_completion`."""
        options.setdefault("temperature", 0.0)
        if stream:
            return _Stream(
                self._m.request(
                    "completion",
                    json.dumps(
                        dict(
                            options,
                            prompt=_prompt_field(prompt),
                            max_tokens=max_tokens,
                            stream=True,
                        )
                    ),
                ),
                lambda c: (c["choices"][0].get("text") or None) if c.get("choices") else None,
            )
        r = self.create_completion(prompt, max_tokens=max_tokens, **options)
        return r["choices"][0]["text"]

    def chat(
        self,
        messages: List[Dict[str, Any]],
        *,
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Any = None,
        response_format: Optional[Dict[str, Any]] = None,
        stream: bool = False,
        **options: Any,
    ) -> Any:
        """``POST /v1/chat/completions`` in process: the response dict (``choices[0]
        ["message"]`` with ``content``, ``tool_calls``, ``reasoning_content``), or with
        ``stream=True`` an iterator of ``chat.completion.chunk`` dicts. ``options`` are the
        request's other fields (``max_tokens``, ``temperature``, ``seed``, ``stop``, ``n``,
        ``logprobs``, ``top_logprobs``, ``parallel_tool_calls``, ...)."""
        body: Dict[str, Any] = dict(options, messages=messages, stream=stream)
        if tools is not None:
            body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        if response_format is not None:
            body["response_format"] = response_format
        req = self._m.request("chat", json.dumps(body))
        return _Stream(req, lambda c: c) if stream else _wait(req)

    create_chat_completion = chat

    # -- scores -------------------------------------------------------------------------
    def create_embedding(self, input: Union[str, List[str], List[int], List[List[int]]], **options: Any) -> Dict[str, Any]:
        """``POST /v1/embeddings`` in process (mean-pooled, L2-normalised)."""
        return json.loads(self._m.embeddings(json.dumps(dict(options, input=input))))

    def embed(self, input: Union[str, List[str]]) -> Union[List[float], List[List[float]]]:
        """The embedding of a text, or one per text of a list."""
        data = self.create_embedding(input)["data"]
        vecs = [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]
        return vecs[0] if isinstance(input, str) else vecs

    def logits(self, prompt: Prompt, *, all_positions: bool = False) -> Union[List[float], List[List[float]]]:
        """The logits after ``prompt`` (text as :meth:`tokenize` makes it, or ids): the last
        position's, or each position's with ``all_positions``."""
        ids = self._ids(prompt)
        flat = array("f")
        flat.frombytes(self._m.logits(ids, all_positions))
        if sys.byteorder != "little":
            flat.byteswap()
        v = self.n_vocab
        rows = [flat[i * v : (i + 1) * v].tolist() for i in range(len(flat) // v)]
        return rows if all_positions else rows[-1]

    def logprobs(self, prompt: Prompt) -> List[float]:
        """The log-probability of each token of ``prompt`` after the ones before it (one per
        token from the second on): how likely the model finds the text."""
        ids = self._ids(prompt)
        if len(ids) < 2:
            return []
        rows = self.logits(ids, all_positions=True)
        out = []
        for row, nxt in zip(rows, ids[1:]):
            top = max(row)
            lse = top + math.log(sum(math.exp(x - top) for x in row))
            out.append(row[nxt] - lse)
        return out

    def perplexity(self, text: str, *, ctx: int = 512, chunks: Optional[int] = None) -> Dict[str, Any]:
        """Perplexity of ``text`` as ``lone perplexity`` (and llama-perplexity) compute it:
        ``{"ppl", "stderr", "scored", "chunks", "running"}``. The text needs at least
        ``2 * ctx`` tokens."""
        return json.loads(self._m.perplexity(text, ctx, chunks))

    def _ids(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, add_special=True)
        return [int(t) for t in prompt]

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Free the model (also done when it is garbage-collected)."""
        self._m.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        i = self._info
        return f"lone.Model({i['path']!r}, arch={i['architecture']!r}, quant={i['quantization']!r}, ctx={i['context']})"


class Server:
    """``lone serve`` running in this process (see :func:`serve`)."""

    def __init__(self, native: Any) -> None:
        self._s = native
        host, _, port = native.address.rpartition(":")
        self.host: str = host.strip("[]")
        self.port: int = int(port)
        self.url: str = f"http://{native.address}"
        """The base URL (``url + "/v1"`` for the openai client)."""

    def stop(self) -> None:
        """Stop serving (open connections get 2 s to finish) and unload the models."""
        self._s.stop()

    def wait(self) -> None:
        """Block until Ctrl-C, then stop."""
        import time

        try:
            while True:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"lone.Server({self.url!r})"


def serve(
    model: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]], None] = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    cache_type: Optional[str] = None,
    mode: Optional[str] = None,
    **flags: Any,
) -> Server:
    """Start ``lone serve`` on a thread of this process and return once it listens (``port=0``
    picks a free port: see ``Server.url``). ``model``: one path or several; other keyword
    arguments are ``lone serve``'s flags (``parallel=``, ``ctx=``, ``api_key=``, ...)."""
    models = [] if model is None else [model] if isinstance(model, (str, os.PathLike)) else list(model)
    args = _flags(dict(model=models, host=host, port=port, **flags))
    return Server(_lone.NativeServer(args, mode, cache_type))
