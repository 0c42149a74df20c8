"""deploy/nginx.conf with 3 `lone serve` replicas on loopback, under concurrent streaming
clients: one replica is killed (SIGKILL) mid-run and restarted. Checked: no request that started
after the kill fails (connect errors are retried on another replica), the requests in flight on
the killed replica end promptly with an error (never a hang or a stream that looks complete),
sessions (X-Session-Id, or the `user` field) stay on their replica when it survives, and the
restarted replica rejoins (deploy/lone-upstreams.sh keeps it out until its /health is 200).
Run by scripts/test-deploy.sh (which installs nginx)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from conftest import LONE, ROOT, TINY, free_port, httpx  # noqa: E402

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
SESSIONS = 12


class Replica:
    def __init__(self, port, log_dir):
        self.port, self.addr = port, f"127.0.0.1:{port}"
        self.log_path = log_dir / f"replica-{port}.log"
        self.proc = None

    def start(self):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(LONE), "serve", "--model", str(TINY), "--port", str(self.port), "-np", "4", "-c", "1024"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def wait(what, cond, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture()
def cluster(tmp_path):
    if not Path(NGINX).exists():
        if os.environ.get("LONE_REQUIRE_NGINX") == "1":
            pytest.fail("nginx is not installed (scripts/test-deploy.sh installs it)")
        pytest.skip("nginx is not installed (scripts/test-deploy.sh installs it)")
    replicas = [Replica(free_port(), tmp_path) for _ in range(3)]
    for r in replicas:
        r.start()
    port = free_port()
    conf = (ROOT / "deploy" / "nginx.conf").read_text().replace("listen 8080;", f"listen 127.0.0.1:{port};")
    (tmp_path / "lone.conf").write_text(conf)
    for d in ["body", "proxy", "fastcgi", "uwsgi", "scgi"]:
        (tmp_path / d).mkdir()
    user = "user root;\n" if os.geteuid() == 0 else ""
    (tmp_path / "nginx.conf").write_text(f"""{user}daemon off;
worker_processes 2;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log notice;
events {{ worker_connections 1024; }}
http {{
    access_log {tmp_path}/access.log;
    client_body_temp_path {tmp_path}/body;
    proxy_temp_path {tmp_path}/proxy;
    fastcgi_temp_path {tmp_path}/fastcgi;
    uwsgi_temp_path {tmp_path}/uwsgi;
    scgi_temp_path {tmp_path}/scgi;
    include {tmp_path}/lone.conf;
}}
""")
    nginx = [NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")]
    env = {**os.environ,
           "LONE_REPLICAS": " ".join(r.addr for r in replicas),
           "LONE_UPSTREAM_FILE": str(tmp_path / "lone-upstream.conf"),
           "LONE_NGINX_RELOAD": " ".join(nginx + ["-s", "reload"]),
           "LONE_HEALTH_INTERVAL": "0.2"}
    upstreams = ROOT / "deploy" / "lone-upstreams.sh"
    up_file = tmp_path / "lone-upstream.conf"
    # The first pass before nginx starts (it needs the file); replicas may still be loading.
    subprocess.run([str(upstreams), "--once"], env=env, check=True)
    ngx = subprocess.Popen(nginx, stderr=open(tmp_path / "nginx.stderr", "wb"))
    health = subprocess.Popen([str(upstreams)], env=env, stderr=open(tmp_path / "health.log", "wb"))
    base = f"http://127.0.0.1:{port}"
    wait("every replica up in the upstream", lambda: up_file.read_text().count(" down;") == 0)
    wait("nginx", lambda: _ok(base + "/health"))
    c = type("Cluster", (), {})()
    c.base, c.replicas, c.up_file, c.dir = base, replicas, up_file, tmp_path
    try:
        yield c
    finally:
        health.terminate()
        ngx.terminate()
        ngx.wait(10)
        for r in replicas:
            r.stop()


def _ok(url):
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Log:
    def __init__(self):
        self.rows, self.lock = [], threading.Lock()
        # Streams whose headers came, by session: the replica answering.
        self.active = {}

    def add(self, **row):
        with self.lock:
            self.rows.append(row)


def served(upstream):
    """The replica that answered: the last of `$upstream_addr` (earlier ones refused)."""
    return upstream.split(", ")[-1] if upstream else None


def stream_chat(base, session, log, stop, n_tokens=600):
    body = {"messages": [{"role": "user", "content": f"Tell me about {session}."}],
            "max_tokens": n_tokens, "temperature": 0.7, "ignore_eos": True, "stream": True}
    while not stop.is_set():
        t0, upstream, done, err = time.time(), None, None, None
        try:
            with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30,
                              headers={"X-Session-Id": session}) as r:
                upstream = r.headers.get("x-lone-upstream")
                if r.status_code != 200:
                    err = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                else:
                    log.active[session] = served(upstream)
                    for line in r.iter_lines():
                        if line == "data: [DONE]":
                            done = time.time()
        except httpx.HTTPError as e:
            err = f"{type(e).__name__}: {e}"
        finally:
            log.active.pop(session, None)
        if not done and err is None:
            err = "the stream ended without [DONE]"
        log.add(session=session, start=t0, end=time.time(), upstream=served(upstream), ok=bool(done),
                done_at=done, err=err)


def user_chat(base, user, log, stop):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "user": user}
    while not stop.is_set():
        t0 = time.time()
        try:
            r = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
            ok = r.status_code == 200
            log.add(session="user:" + user, start=t0, end=time.time(),
                    upstream=served(r.headers.get("x-lone-upstream")), ok=ok, done_at=time.time() if ok else None,
                    err=None if ok else f"HTTP {r.status_code}: {r.text[:200]}")
        except httpx.HTTPError as e:
            log.add(session="user:" + user, start=t0, end=time.time(), upstream=None, ok=False, done_at=None,
                    err=str(e))
        time.sleep(0.02)


def test_kill_and_restart_a_replica_under_streaming_load(cluster):
    c = cluster
    log, stop = Log(), threading.Event()
    threads = [threading.Thread(target=stream_chat, args=(c.base, f"s{i}", log, stop)) for i in range(SESSIONS)]
    threads += [threading.Thread(target=user_chat, args=(c.base, u, log, stop)) for u in ["alice", "bob"]]
    for t in threads:
        t.start()
    try:
        time.sleep(4)
        before = list(log.rows)
        home = {}
        for row in before:
            assert row["ok"], (row["session"], row["err"])
            home.setdefault(row["session"], set()).add(row["upstream"])
        # Affinity before anything happens: every session on one replica.
        assert all(len(v) == 1 for v in home.values()), home
        home = {s: next(iter(v)) for s, v in home.items()}
        assert len(home) == SESSIONS + 2, home
        # Kill the replica that holds the most sessions.
        counts = {r.addr: sum(1 for u in home.values() if u == r.addr) for r in c.replicas}
        victim = next(r for r in c.replicas if r.addr == max(counts, key=counts.get))
        assert counts[victim.addr] >= 1
        # Kill it while one of its streams is running.
        wait("a stream on the victim", lambda: victim.addr in log.active.values(), timeout=10)
        t_kill = time.time()
        victim.kill()
        time.sleep(3)
        t_restart = time.time()
        victim.start()
        wait("the restarted replica back in the upstream", lambda: " down;" not in c.up_file.read_text())
        t_rejoined = time.time()
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads), "a client hung"
    rows = log.rows

    # No request that started after the kill failed.
    late = [r for r in rows if r["start"] > t_kill]
    failed = [r for r in late if not r["ok"]]
    assert not failed, [(r["session"], r["start"] - t_kill, r["err"]) for r in failed[:5]]
    assert len(late) > 50
    # Requests in flight on the killed replica ended promptly with an error (a cut stream, or
    # nginx's 503 JSON when no header had come yet); the others finished.
    inflight = [r for r in rows if r["start"] < t_kill and not (r["ok"] and r["done_at"] < t_kill + 0.2)]
    on_victim = [r for r in inflight if r["upstream"] == victim.addr]
    assert any(not r["ok"] for r in on_victim), "nothing was cut on the killed replica"
    for r in inflight:
        if r["upstream"] == victim.addr:
            assert not r["ok"] and r["err"] and r["end"] - t_kill < 5, r
        else:
            assert r["ok"], r
    # Sessions on surviving replicas never moved; the victim's moved while it was down and came
    # back once it rejoined.
    for s, u in home.items():
        mine = [r for r in rows if r["session"] == s]
        if u != victim.addr:
            assert {r["upstream"] for r in mine} == {u}, (s, u, {r["upstream"] for r in mine})
        else:
            during = {r["upstream"] for r in mine if t_kill + 0.5 < r["start"] < t_restart}
            assert during and victim.addr not in during, (s, during)
            after = [r for r in mine if r["start"] > t_rejoined + 0.5]
            assert after and all(r["upstream"] == victim.addr for r in after), (s, after[:3])
    # Each replica's own /metrics (what Prometheus scrapes, deploy/prometheus.yml).
    for r in c.replicas:
        m = httpx.get(f"http://{r.addr}/metrics", timeout=5).text
        assert 'lone_requests_total{endpoint="/v1/chat/completions",status="200"}' in m
    # nginx's own failure page is OpenAI's error JSON.
    print(json.dumps({"requests": len(rows), "after_kill": len(late), "in_flight_on_victim": len(on_victim)}))


def test_no_replica_up_is_an_openai_error(cluster):
    for r in cluster.replicas:
        r.kill()
    wait("every replica out", lambda: cluster.up_file.read_text().count(" down;") == 3)
    time.sleep(0.5)
    r = httpx.post(cluster.base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                   timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "replica_unavailable"
