"""Fixtures: real `lone serve` processes on loopback (free port, wait for /health, stop at the end)."""

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

try:
    import httpx
except ImportError:  # newer openai releases ship it as httpx2
    import httpx2 as httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
LONE = Path(os.environ.get("LONE_BIN", TARGET / "release" / "lone"))
TINY = ROOT / "tests" / "reference" / "fixtures" / "lfm2_a"
MODELS = Path(
    os.environ.get("LONE_MODELS")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lone" / "models"
)
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: Path | None, *args: str, env=None, wait=True):
        assert LONE.exists(), f"build the release binary first: {LONE}"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="lone-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(LONE), "serve", *(["--model", str(model)] if model else []), "--port", str(self.port), *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.model = model.name if model else None
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=120.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lone serve exited ({self.proc.returncode}):\n{self.logs()}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"lone serve did not become healthy:\n{self.logs()}")

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def client(self, api_key="none", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def post(self, path, timeout=120, **kw) -> httpx.Response:
        return httpx.post(self.base + path, timeout=timeout, **kw)

    def get(self, path, **kw) -> httpx.Response:
        return httpx.get(self.base + path, timeout=30, **kw)

    def metrics(self) -> dict:
        out = {}
        for line in self.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def tiny():
    """The tiny random-weight LFM2 fixture (byte-level tokenizer, ChatML template): fast."""
    s = Server(TINY, "--parallel", "4", "--ctx", "1024")
    yield s
    s.stop()


def need_smol():
    if not SMOL.exists():
        pytest.skip(f"{SMOL} missing: run scripts/fetch-default-model.sh")


@pytest.fixture(scope="session")
def smol():
    """The real SmolLM2-135M-Instruct Q4_1 GGUF."""
    need_smol()
    s = Server(SMOL, "--parallel", "2")
    yield s
    s.stop()
