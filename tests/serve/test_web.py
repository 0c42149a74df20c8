"""The web chat page at `/` in a real browser (Debian's Chromium driven by Playwright,
tests/web/chat.test.mjs): a model picked, a reply streamed with its stats, stop pressed. The
server side is checked here: the stopped sequence was cancelled and its slot freed."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, SMOL, TINY, Server, need_smol

WEB = ROOT / "tests" / "web"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))


def need_browser():
    missing = [str(p) for p in [CHROMIUM, WEB / "node_modules" / "playwright-core"] if not p.exists()]
    if shutil.which("node") is None:
        missing.append("node")
    if missing:
        # scripts/test.sh installs them and sets this: there a missing browser is a failure.
        if os.environ.get("LONE_REQUIRE_BROWSER") == "1":
            pytest.fail("browser test needs: " + ", ".join(missing))
        pytest.skip("browser test needs: " + ", ".join(missing) + " (scripts/test.sh installs them)")


def test_page_is_served_offline_and_open_without_the_key():
    s = Server(TINY, "--api-key", "k", "-c", "256", "-np", "1")
    try:
        r = s.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "<title>lone chat</title>" in r.text
        # No outside scripts, styles or fonts.
        assert 'src="http' not in r.text and 'href="http' not in r.text and "@import" not in r.text
        assert s.get("/v1/models").status_code == 401
    finally:
        s.stop()


def test_chat_page_in_chromium(tmp_path):
    need_smol()
    need_browser()
    s = Server(SMOL, "--model", str(TINY), "-np", "2")
    try:
        shot = tmp_path / "chat.png"
        env = {**os.environ, "LONE_URL": s.base, "LONE_CHAT_MODEL": SMOL.name, "LONE_SCREENSHOT": str(shot)}
        r = subprocess.run(["node", str(WEB / "chat.test.mjs")], env=env, capture_output=True, text=True, timeout=240)
        print(r.stdout)
        assert r.returncode == 0, r.stdout + r.stderr + "\n--- server log ---\n" + s.logs()
        assert shot.stat().st_size > 10_000
        if os.environ.get("LONE_KEEP_SCREENSHOT"):
            shutil.copy(shot, os.environ["LONE_KEEP_SCREENSHOT"])
        label = f'{{model="{SMOL.name}"}}'
        deadline = time.time() + 10
        while time.time() < deadline:
            m = s.metrics()
            if m["lone_active_slots" + label] == 0:
                break
            time.sleep(0.1)
        assert m["lone_active_slots" + label] == 0
        assert m["lone_cancelled_total" + label] >= 1
        assert m["lone_generated_tokens_total" + label] < 1500
    finally:
        s.stop()


def test_image_attachments_in_chromium():
    need_browser()
    vl = ROOT / "tests" / "reference" / "fixtures" / "lfm2_vl"
    s = Server(vl, "--model", str(TINY), "-np", "1")
    try:
        case = vl / "cases" / "one"
        env = {**os.environ, "LONE_URL": s.base, "LONE_VL_MODEL": vl.name, "LONE_TEXT_MODEL": TINY.name,
               "LONE_IMAGE": str(vl / "images" / "small.png"),
               "LONE_PROMPT_TOKENS": str(len(json.loads((case / "input_ids.json").read_text())))}
        r = subprocess.run(["node", str(WEB / "vision.test.mjs")], env=env, capture_output=True, text=True, timeout=240)
        print(r.stdout)
        assert r.returncode == 0, r.stdout + r.stderr + "\n--- server log ---\n" + s.logs()
    finally:
        s.stop()
