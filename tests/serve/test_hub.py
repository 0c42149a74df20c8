"""`lone pull` / `--model org/name:QUANT` / `lone ls` / `lone rm` against a loopback server that
answers the Hub's file-list and download endpoints from fixture files (tests never reach the
real Hub).

The server implements what lone uses of the Hub, as huggingface_hub's clients see it:
`GET /api/models/{repo}/revision/{rev}?blobs=true` (commit sha, siblings with blobId, size and
LFS sha256) and `GET /{repo}/resolve/{rev}/{file}`, which redirects (302) to a CDN-like URL
that honours `Range`. It can cut a transfer short once, lie about a hash, and refuse a gated
repo without the right token.
"""

import hashlib
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import LONE, ROOT

FIX = ROOT / "tests" / "reference" / "fixtures"
TOKEN = "hf_loopback_secret"


class Hub:
    def __init__(self):
        self.repos = {}
        self.requests = []
        self.cut_once = set()  # file names whose first transfer is cut in half
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo, files, gated=False, lie_about=None):
        commit = hashlib.sha1(repo.encode() + b"".join(sorted(files))).hexdigest()
        self.repos[repo] = {"commit": commit, "files": files, "gated": gated,
                            "lie": lie_about}
        return commit

    def close(self):
        self.server.shutdown()

    def _handler(hub):
        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=()):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _repo(self, repo):
                r = hub.repos.get(repo)
                if r is None:
                    self._send(404, b'{"error": "Repository not found"}')
                    return None
                if r["gated"] and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, b'{"error": "Access to model is restricted"}')
                    return None
                return r

            def do_GET(self):
                hub.requests.append((self.path, self.headers.get("Range")))
                path = self.path.split("?")[0]
                if path.startswith("/api/models/"):
                    repo, _, rev = path[len("/api/models/"):].partition("/revision/")
                    r = self._repo(repo)
                    if r is None:
                        return
                    sib = []
                    for name, data in sorted(r["files"].items()):
                        name = name.decode()
                        e = {"rfilename": name, "size": len(data),
                             "blobId": hashlib.sha1(data).hexdigest()}
                        if name.endswith((".gguf", ".safetensors")):
                            sha = hashlib.sha256(data).hexdigest()
                            if r["lie"] == name:
                                sha = hashlib.sha256(b"something else").hexdigest()
                            e["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
                        sib.append(e)
                    body = json.dumps({"id": repo, "sha": r["commit"], "siblings": sib})
                    self._send(200, body.encode(), [("Content-Type", "application/json")])
                    return
                if path.startswith("/cdn/"):
                    repo, _, name = path[len("/cdn/"):].partition("/@/")
                    data = hub.repos[repo]["files"][name.encode()]
                    start = 0
                    rng = self.headers.get("Range")
                    if rng:
                        start = int(rng.split("=")[1].split("-")[0])
                        if start >= len(data):
                            self._send(416)
                            return
                    part = data[start:]
                    self.send_response(206 if rng else 200)
                    self.send_header("Content-Length", str(len(part)))
                    if rng:
                        self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                    self.end_headers()
                    if name in hub.cut_once:
                        hub.cut_once.discard(name)
                        self.wfile.write(part[: len(part) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    self.wfile.write(part)
                    return
                # /{org}/{name}/resolve/{rev}/{file}
                parts = path.lstrip("/").split("/")
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo = "/".join(parts[:2])
                    r = self._repo(repo)
                    if r is None:
                        return
                    name = "/".join(parts[4:])
                    if name.encode() not in r["files"]:
                        self._send(404, b'{"error": "Entry not found"}')
                        return
                    self._send(302, b"", [("Location", f"{hub.url}/cdn/{repo}/@/{name}"),
                                          ("X-Repo-Commit", r["commit"])])
                    return
                self._send(404)

        return H


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


def lone(hub, cache, *args, env=None, check=True):
    e = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache)}
    e.pop("HF_TOKEN", None)
    e.pop("HF_HUB_OFFLINE", None)
    e.update(env or {})
    p = subprocess.run([str(LONE), *args], capture_output=True, text=True, env=e, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def gguf_repo(hub, repo="org/tiny-GGUF"):
    files = {
        b"tiny-Q8_0.gguf": (FIX / "lfm2_a" / "model-q8_0.gguf").read_bytes(),
        b"tiny-F16.gguf": (FIX / "lfm2_a" / "model-f16.gguf").read_bytes(),
        b"README.md": b"# tiny\n",
    }
    return hub.add(repo, files), files


def test_pull_by_quant_tag_into_the_hf_cache_layout(hub, tmp_path):
    commit, files = gguf_repo(hub)
    p = lone(hub, tmp_path, "pull", "org/tiny-GGUF:Q8_0")
    path = Path(p.stdout.strip())
    assert path == tmp_path / "models--org--tiny-GGUF" / "snapshots" / commit / "tiny-Q8_0.gguf"
    assert path.is_symlink()
    blob = path.resolve()
    assert blob.parent == (tmp_path / "models--org--tiny-GGUF" / "blobs").resolve()
    assert blob.name == hashlib.sha256(files[b"tiny-Q8_0.gguf"]).hexdigest()
    assert path.read_bytes() == files[b"tiny-Q8_0.gguf"]
    assert (tmp_path / "models--org--tiny-GGUF" / "refs" / "main").read_text() == commit
    # Only the chosen file was downloaded.
    assert [q for q, _ in hub.requests if "/resolve/" in q] == [
        f"/org/tiny-GGUF/resolve/{commit}/tiny-Q8_0.gguf"]
    # --model with a repo id runs the cached file, downloading nothing more.
    before = len([q for q, _ in hub.requests if "/cdn/" in q])
    r = lone(hub, tmp_path, "run", "--model", "org/tiny-GGUF:q8_0", "--prompt-ids", "1",
             "-n", "2", "--json")
    assert len(json.loads(r.stdout)["generated_ids"]) == 2
    assert len([q for q, _ in hub.requests if "/cdn/" in q]) == before


def test_several_ggufs_without_a_tag_and_no_q4_k_m_says_which_exist(hub, tmp_path):
    gguf_repo(hub)
    p = lone(hub, tmp_path, "pull", "org/tiny-GGUF", check=False)
    assert p.returncode == 1
    assert "Q4_K_M" in p.stderr and "tiny-F16.gguf" in p.stderr and "tiny-Q8_0.gguf" in p.stderr
    p = lone(hub, tmp_path, "pull", "org/tiny-GGUF:Q2_K", check=False)
    assert p.returncode == 1 and "no GGUF file tagged Q2_K" in p.stderr


def test_a_split_gguf_is_pulled_whole_and_runs_from_its_first_part(hub, tmp_path):
    # The parts as llama-gguf-split writes them (crates/lone/tests/split.rs checks that lone
    # gguf-split writes the same bytes), in a quant folder as Hub repos keep large quants,
    # beside a single-file quant and a multimodal projector that comes along but is not the
    # model (a broken one here: --no-mmproj runs the text model without it).
    whole = FIX / "lfm2_a" / "model-q8_0.gguf"
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([str(LONE), "gguf-split", "--split-max-tensors", "6", str(whole),
                    str(work / "tiny-Q8_0")], check=True, capture_output=True)
    parts = sorted(work.iterdir())
    assert len(parts) > 2
    files = {f"Q8_0/{p.name}".encode(): p.read_bytes() for p in parts}
    files[b"tiny-F16.gguf"] = (FIX / "lfm2_a" / "model-f16.gguf").read_bytes()
    files[b"mmproj-tiny-Q8_0.gguf"] = b"GGUF not a language model"
    commit = hub.add("org/split-GGUF", files)
    cache = tmp_path / "cache"
    p = lone(hub, cache, "pull", "org/split-GGUF:Q8_0")
    path = Path(p.stdout.strip())
    snap = cache / "models--org--split-GGUF" / "snapshots" / commit
    assert path == snap / "Q8_0" / parts[0].name
    assert sorted(q.name for q in (snap / "Q8_0").iterdir()) == [q.name for q in parts]
    assert (snap / "mmproj-tiny-Q8_0.gguf").exists()
    args = ["--prompt-ids", "1,2,3", "-n", "4", "--ignore-eos", "--json"]
    p = lone(hub, cache, "run", "--model", "org/split-GGUF:Q8_0", *args, check=False)
    assert p.returncode == 1 and "mmproj-tiny-Q8_0.gguf" in p.stderr and "--no-mmproj" in p.stderr
    got = lone(hub, cache, "run", "--model", "org/split-GGUF:Q8_0", "--no-mmproj", *args)
    want = lone(hub, cache, "run", "--model", str(whole), *args)
    assert json.loads(got.stdout)["generated_ids"] == json.loads(want.stdout)["generated_ids"]
    # Offline, the cached parts resolve the same way.
    p = lone(hub, cache, "pull", "org/split-GGUF:Q8_0", env={"HF_HUB_OFFLINE": "1"})
    assert Path(p.stdout.strip()) == path


def test_an_interrupted_transfer_resumes_with_a_range_request(hub, tmp_path):
    _, files = gguf_repo(hub)
    hub.cut_once.add("tiny-F16.gguf")
    p = lone(hub, tmp_path, "pull", "org/tiny-GGUF:F16")
    assert Path(p.stdout.strip()).read_bytes() == files[b"tiny-F16.gguf"]
    ranges = [r for q, r in hub.requests if "/cdn/" in q and r]
    half = len(files[b"tiny-F16.gguf"]) // 2
    assert ranges == [f"bytes={half}-"], hub.requests
    assert not list((tmp_path / "models--org--tiny-GGUF" / "blobs").glob("*.incomplete"))


def test_a_wrong_hash_is_refused_and_deleted(hub, tmp_path):
    hub.add("org/bad", {b"m-Q8_0.gguf": (FIX / "qwen2" / "model-q8_0.gguf").read_bytes()},
            lie_about="m-Q8_0.gguf")
    p = lone(hub, tmp_path, "pull", "org/bad", check=False)
    assert p.returncode == 1 and "sha256" in p.stderr and "corrupt" in p.stderr, p.stderr
    blobs = tmp_path / "models--org--bad" / "blobs"
    assert not any(blobs.iterdir())
    assert not (tmp_path / "models--org--bad" / "snapshots").exists()


def test_a_gated_repo_needs_a_token(hub, tmp_path):
    hub.add("org/gated", {b"m.gguf": (FIX / "qwen3" / "model-q8_0.gguf").read_bytes()},
            gated=True)
    p = lone(hub, tmp_path, "pull", "org/gated", check=False)
    assert p.returncode == 1
    assert "gated or private" in p.stderr and "HF_TOKEN" in p.stderr, p.stderr
    p = lone(hub, tmp_path, "pull", "org/gated", env={"HF_TOKEN": TOKEN})
    assert Path(p.stdout.strip()).name == "m.gguf"


def test_offline_mode_uses_only_the_cache(hub, tmp_path):
    gguf_repo(hub)
    path = lone(hub, tmp_path, "pull", "org/tiny-GGUF:Q8_0").stdout.strip()
    n = len(hub.requests)
    p = lone(hub, tmp_path, "pull", "org/tiny-GGUF:Q8_0", env={"HF_HUB_OFFLINE": "1"})
    assert p.stdout.strip() == path
    assert len(hub.requests) == n
    p = lone(hub, tmp_path, "pull", "org/other", env={"HF_HUB_OFFLINE": "1"}, check=False)
    assert p.returncode == 1 and "not in the cache" in p.stderr
    # Not downloaded yet: offline cannot pick it.
    p = lone(hub, tmp_path, "pull", "org/tiny-GGUF:F16", env={"HF_HUB_OFFLINE": "1"},
             check=False)
    assert p.returncode == 1 and "F16" in p.stderr
    assert len(hub.requests) == n


def test_a_vision_repo_gives_its_mmproj_and_takes_images(hub, tmp_path):
    # LFM3-VL's GGUF pair (its mmproj records the processor's settings) as a Hub repo with
    # projectors of three precisions: the one closest to the model's comes along (as with
    # llama.cpp's -hf) and `run --image` gives transformers' greedy reply without --mmproj.
    d = FIX / "lfm3_vl"
    files = {b"vl-F32.gguf": (d / "model-f32.gguf").read_bytes(), b"README.md": b"# vl\n"}
    for t in ["f32", "f16", "q8_0"]:
        files[f"mmproj-vl-{t.upper()}.gguf".encode()] = (d / f"mmproj-{t}.gguf").read_bytes()
    commit = hub.add("org/vl-GGUF", files)
    p = lone(hub, tmp_path, "pull", "org/vl-GGUF:F32")
    snap = tmp_path / "models--org--vl-GGUF" / "snapshots" / commit
    assert Path(p.stdout.strip()) == snap / "vl-F32.gguf"
    assert sorted(q.name for q in snap.iterdir()) == ["mmproj-vl-F32.gguf", "vl-F32.gguf"]
    case = d / "cases" / "one"
    want = json.loads((case / "greedy_text.json").read_text())
    args = ["--exact", "--cache-type", "f32", "run", "--model", "org/vl-GGUF:F32", "--chat",
            "--image", str(d / "images" / "small.png"), "-p", "What is this?", "-n", "12",
            "--ignore-eos", "--json"]
    r = lone(hub, tmp_path, *args)
    assert json.loads(r.stdout)["text"] == want
    assert "mmproj-vl-F32.gguf" in r.stderr
    # Text only, on request.
    p = lone(hub, tmp_path, *args, "--no-mmproj", check=False)
    assert p.returncode == 1 and "image" in p.stderr


def test_a_checkpoint_repo_downloads_what_lone_reads_and_runs(hub, tmp_path):
    d = FIX / "qwen2"
    names = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
             "generation_config.json", "chat_template.jinja"]
    files = {n.encode(): (d / n).read_bytes() for n in names}
    # The model card (convert reads its front matter) and named templates come too.
    files[b"README.md"] = b"---\nlicense: mit\n---\n"
    files[b"additional_chat_templates/tool_use.jinja"] = b"{{ tools | tojson }}"
    files[b"logits.npy"] = b"not needed"
    files[b"additional_chat_templates/deeper/x.jinja"] = b"not needed"
    commit = hub.add("org/qwen2-tiny", files)
    prompt = json.loads((d / "prompt_ids.json").read_text())
    greedy = json.loads((d / "greedy.json").read_text())
    r = lone(hub, tmp_path, "--exact", "--cache-type", "f32", "run", "--model", "org/qwen2-tiny",
             "--prompt-ids", ",".join(map(str, prompt)), "-n", "5", "--ignore-eos", "--json")
    assert json.loads(r.stdout)["generated_ids"] == greedy[:5]
    snap = tmp_path / "models--org--qwen2-tiny" / "snapshots" / commit
    assert sorted(p.name for p in snap.iterdir()) == sorted(names + ["README.md", "additional_chat_templates"])
    assert [p.name for p in (snap / "additional_chat_templates").iterdir()] == ["tool_use.jinja"]


def test_ls_and_rm(hub, tmp_path):
    gguf_repo(hub)
    gguf_repo(hub, "org/second-GGUF")
    lone(hub, tmp_path, "pull", "org/tiny-GGUF:Q8_0")
    lone(hub, tmp_path, "pull", "org/second-GGUF:F16")
    rows = [json.loads(line) for line in lone(hub, tmp_path, "ls", "--json").stdout.splitlines()]
    assert [r["repo"] for r in rows] == ["org/second-GGUF", "org/tiny-GGUF"]
    assert all(r["bytes"] > 100_000 for r in rows)
    lone(hub, tmp_path, "rm", "org/tiny-GGUF")
    assert not (tmp_path / "models--org--tiny-GGUF").exists()
    rows = [json.loads(line) for line in lone(hub, tmp_path, "ls", "--json").stdout.splitlines()]
    assert [r["repo"] for r in rows] == ["org/second-GGUF"]
    p = lone(hub, tmp_path, "rm", "org/tiny-GGUF", check=False)
    assert p.returncode == 1 and "not in the cache" in p.stderr
