"""The aarch64 wheel's module under qemu (scripts/test-python-aarch64.sh): no pip or numpy
there, so only the standard library. Checks the module imports, the command answers, and a
tiny fixture's f32 path equals transformers' logits and greedy tokens."""

import ast
import json
import platform
import sys
from array import array
from pathlib import Path

import lone
from lone import _lone

assert platform.machine() == "aarch64", platform.machine()
print("lone", lone.__version__, "from", lone.__file__)


def load_npy(path: Path):
    """A little-endian f32 .npy as (shape, flat array)."""
    raw = path.read_bytes()
    assert raw[:6] == b"\x93NUMPY"
    hlen = int.from_bytes(raw[8:10], "little")
    header = ast.literal_eval(raw[10 : 10 + hlen].decode("latin1"))
    assert header["descr"] == "<f4" and not header["fortran_order"], header
    data = array("f")
    data.frombytes(raw[10 + hlen :])
    return header["shape"], data


fixtures = Path(sys.argv[1])
for name in sys.argv[2:]:
    d = fixtures / name
    ids = json.loads((d / "prompt_ids.json").read_text())
    greedy = json.loads((d / "greedy.json").read_text())
    shape, want = load_npy(d / "logits.npy")
    with lone.Model(d, mode="exact", cache_type="f32", threads=2, ctx=256) as m:
        rows = m.logits(ids + greedy, all_positions=True)
        assert (len(rows), len(rows[0])) == tuple(shape), (len(rows), shape)
        worst = max(abs(a - b) for a, b in zip((x for r in rows for x in r), want))
        assert worst < 1e-4, (name, worst)
        text = m.generate(ids, max_tokens=len(greedy), ignore_eos=True)
        assert text == m.detokenize(greedy), name
        chat = m.chat([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
        assert chat["choices"][0]["finish_reason"] in ("stop", "length")
    print(f"{name}: logits within {worst:.1e} of transformers, greedy equal")
print("ok")
# Last: `--version` prints and exits the process, as the command does (the script's caller
# checks for both lines).
sys.exit(_lone.cli(["lone", "--version"]))
