"""More than one replica (issue 28, point 6): two `nanocompile serve` processes behind HAProxy (from
Debian's packages) on the loopback, with the configuration docs/SERVER.md gives: least connections
for new conversations, a conversation's later turns to the replica that holds its KV cache, the
balancer's health check on /health, and requests retried on the other replica when one is gone.

One replica is killed (SIGKILL) while requests run: every request that had not started streaming
is answered by the other replica, each exactly once; those that were streaming from the dead one
end without their [DONE] (the client sees the stream cut), and none is answered twice.
"""
import json
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from bench.support.server import ServerProcess, free_port
from bench.support.tiny import random_weights, tiny_config, write_gguf

pytestmark = pytest.mark.slow

HAPROXY = shutil.which("haproxy") or (Path("/usr/sbin/haproxy") if Path("/usr/sbin/haproxy").exists() else None)

CONFIG = """
global
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response 503
frontend nanocompile
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance leastconn
    option http-buffer-request
    stick-table type string len 64 size 100k expire 30m
    stick on req.hdr(X-Conversation)
    option httpchk GET /health
    http-check expect status 200
{servers}
"""


def haproxy_config(port: int, replicas: list[str]) -> str:
    servers = "\n".join(f"    server r{i} {url.removeprefix('http://')} check inter 300ms fall 2 rise 1"
                        for i, url in enumerate(replicas))
    return CONFIG.format(port=port, servers=servers)


@pytest.fixture()
def replicas(tmp_path):
    if HAPROXY is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy; .ci/run installs it)")
    cfg = tiny_config(vocab=300, max_pos=512)
    model = write_gguf(tmp_path / "tiny.gguf", cfg, random_weights(cfg, seed=1), quantize=False)
    env = {**__import__("os").environ, "NANOCOMPILE_CACHE": str(tmp_path / "cache")}
    servers = [ServerProcess(model, ["--backend", "interp", "-q", "-c", "512"], env=env) for _ in range(2)]
    port = free_port()
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(haproxy_config(port, [s.url for s in servers]))
    balancer = subprocess.Popen([str(HAPROXY), "-f", str(conf), "-db"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 30
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert balancer.poll() is None and time.time() < end, balancer.stderr.read()
        time.sleep(0.1)
    yield url, servers
    balancer.send_signal(signal.SIGTERM)
    balancer.wait(10)
    for s in servers:
        s.stop()


def done(server: ServerProcess) -> int:
    return httpx.get(server.url + "/health", timeout=10).json()["requests"]["done"]


def stream(url: str, body: dict, headers=None, started: threading.Event | None = None) -> dict:
    """A streamed completion through the balancer: its ids, text, [DONE]s, and the error if the
    stream broke."""
    out = {"ids": set(), "text": "", "done": 0, "error": None}
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, headers=headers,
                          timeout=120) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    out["done"] += 1
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    out["ids"].add(event["id"])
                    out["text"] += "".join(c.get("text") or "" for c in event["choices"])
                    if started is not None:
                        started.set()
    except httpx.HTTPError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def test_the_load_spreads_a_conversation_stays_and_a_dead_replica_loses_no_waiting_request(replicas):
    url, servers = replicas
    # the load spreads: eight requests at once land on both replicas
    before = [done(s) for s in servers]
    results = [None] * 8
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, stream(url, {"prompt": f"request {i}", "max_tokens": 40, "temperature": 0}))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r["done"] == 1 and r["error"] is None and len(r["ids"]) == 1 for r in results)
    spread = [done(s) - b for s, b in zip(servers, before)]
    assert sum(spread) == 8 and min(spread) >= 2, spread
    # a conversation's turns go to one replica (whose cache holds its start)
    before = [done(s) for s in servers]
    for turn in range(4):
        r = stream(url, {"prompt": "the same conversation " * (turn + 1), "max_tokens": 3},
                   headers={"X-Conversation": "chat-42"})
        assert r["done"] == 1
    assert sorted(done(s) - b for s, b in zip(servers, before)) == [0, 4]
    # one replica dies while 12 requests run or wait
    body = {"prompt": "a long answer please", "max_tokens": 300, "temperature": 0}
    results = [None] * 12
    started = threading.Event()
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, stream(url, body, started=started)))
               for i in range(12)]
    for t in threads:
        t.start()
    assert started.wait(60)
    time.sleep(0.3)
    servers[0].kill()
    for t in threads:
        t.join(180)
    finished = [r for r in results if r["done"]]
    cut = [r for r in results if not r["done"]]
    assert all(r["done"] == 1 and len(r["ids"]) == 1 for r in finished)  # none twice
    assert len({i for r in finished for i in r["ids"]}) == len(finished)
    assert len(cut) <= 1  # the one the dead replica (one slot) was streaming, cut with the connection
    assert all("incomplete" in (r["error"] or "") for r in cut)
    assert done(servers[1]) >= len(finished)
    print(f"{len(finished)} of 12 answered, {len(cut)} cut: {[r['error'] for r in cut]}")
