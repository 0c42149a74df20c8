"""Fixtures for the Python API tests: they run against the installed `lone` wheel (a fresh
venv made by scripts/test-python.sh), never the source tree."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "reference" / "fixtures"
MODELS = Path(
    os.environ.get("LONE_MODELS")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lone" / "models"
)
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smol():
    import lone

    assert SMOL.exists(), f"run scripts/fetch-default-model.sh first ({SMOL})"
    m = lone.Model(SMOL, threads=2, ctx=2048, parallel=2)
    yield m
    m.close()
