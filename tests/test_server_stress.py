"""A server killed with SIGKILL in the middle of an answer restarts on the same cache with nothing
to rebuild or repair (at most a note), and answers the same request identically; and a short soak
(bench/probes/soak.py: many clients mixing streamed and blocking chat and completions,
fill-in-the-middle, disconnects, malformed and oversized bodies, wrong keys) finds nothing wrong.
Both on the real default model in `nanocompile serve` processes of their own."""
from __future__ import annotations

import signal
from pathlib import Path

import httpx
from bench.probes.soak import soak
from bench.support.server import ServerProcess

from nanocompile.cache.files import temporary_writer
from nanocompile.cache.location import cache_root

SERVE = ["-c", "512"]
CHAT = {"messages": [{"role": "user", "content": "Write a Python function that checks for a prime."}],
        "max_tokens": 24, "temperature": 0}
# what a start that finds everything in the cache may print, besides its one-line notes
PREPARING = ("compil", "packing", "building", "quantiz", "convert", "repair", "rebuil")


def chat(server: ServerProcess) -> str:
    r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def cache_temporaries() -> list[Path]:
    """Files the cache holds under a writer's temporary name."""
    return [p for p in cache_root().path.rglob("*") if temporary_writer(p) is not None]


def test_a_server_killed_mid_answer_restarts_on_its_cache_and_answers_the_same(real_compiled):
    first = ServerProcess("default", SERVE)
    try:
        want = chat(first)
        long = {**CHAT, "max_tokens": 400, "stream": True}
        events = 0
        try:
            with httpx.stream("POST", first.url + "/v1/chat/completions", json=long, timeout=300) as r:
                for line in r.iter_lines():
                    events += line.startswith("data: ")
                    if events == 3:
                        assert first.kill() == -signal.SIGKILL
        except httpx.HTTPError:
            pass  # the answer was cut off: the server is gone
        assert events == 3 and first.process.returncode == -signal.SIGKILL
    finally:
        if first.process.poll() is None:
            first.kill()
    second = ServerProcess("default", SERVE)
    try:
        assert chat(second) == want
        # besides the serving line and uvicorn's INFO lines
        started = [line for line in second.lines if "serving" not in line and not line.startswith("INFO:")]
        prepared = [line for line in started if any(word in line.lower() for word in PREPARING)]
        assert not prepared, second.log
        assert all(line.startswith("nanocompile: ") for line in started), second.log  # notes only
        assert not cache_temporaries()
    finally:
        assert second.stop() == 0, second.log


def test_a_short_soak_finds_nothing_wrong(real_compiled):
    report = soak("default", clients=8, seconds=20, max_tokens=16, warmup_seconds=5, serve_args=SERVE)
    assert not report["problems"], "\n".join(report["problems"][:20])
    counts = report["counts"]
    # not vacuous: every kind of client ran, and the model answered fill-in-the-middle
    assert report["fim"] and all(counts.get(k, 0) >= 1 for k in ("answered", "disconnected", "malformed",
                                                                  "oversized", "wrong_key")), counts
