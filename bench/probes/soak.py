"""A soak of `nanocompile serve` over the loopback: many clients for a bounded time, mixing every
kind of request a real deployment sees, and what the server looks like at the end.

    python -m bench.probes.soak [-m default] [--clients 16] [--minutes 10] [--max-tokens 24]

The mix: streamed and blocking chat completions and completions, fill-in-the-middle (where the
model has its tokens), seeded sampled requests, clients that disconnect mid-stream, malformed and
oversized bodies, wrong API keys. Before the soak every distinct valid request is answered once
alone (its solo answer); a warm-up with the same mix follows, then the server's resident memory,
file descriptors and threads are read (after WORKERS_IDLE seconds without requests, when the
idle worker threads of the request handlers have exited). After the soak the same reading again.

It holds when: every valid request got one answer (one 200, one stream with one finish reason
and one [DONE]) equal to its solo answer; every bad request got its 4xx in OpenAI's error shape;
/health's counts add up to what the clients sent (done + cancelled = answered + disconnected,
nothing failed, nothing rejected); resident memory at the end is within 5% of after the warm-up;
no file descriptor or thread more. Appends to bench/results.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from ..support.measure import append
from ..support.server import ServerProcess

KEY = "sk-soak"
WORKERS_IDLE = 12.0  # anyio's idle worker threads exit after 10 s
MEMORY_TOLERANCE = 0.05
CHAT = ["Write a Python function that reverses a string.", "What does HTTP status 503 mean?",
        "Explain a binary search in two sentences.", "Name three sorting algorithms.",
        "def add(a, b):\n    return a + b\n\nRewrite this function with type hints."]
COMPLETE = ["def fibonacci(n):\n", "# Read a CSV file with pandas\nimport", "The capital of France is"]
FIM = [("def area(radius):\n    ", "\n    return result\n")]
BAD = [  # (body, status): what a confused or hostile client sends
    (b'{"prompt": "x", ', 400), (b"[1, 2]", 400), (b"", 400), (b'{"prompt": 5}', 400),
    (b'{"prompt": "x", "max_tokens": -1}', 400), (b'{"prompt": "x", "temperature": "hot"}', 400),
    (b'{"messages": []}', 400), (b'{"prompt": [1, 99999999]}', 400), (b'{"prompt": "x", "n": 9}', 400),
    (b'\xff\xfe{"prompt": "x"}', 400), (b'{"prompt": "x", "stream": "yes"}', 400),
    (b'{"prompt": "x", "grammar": "root ::= ("}', 400), (b'{"prompt": "x", "json_schema": {"type": "objectx"}}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": '
     b'{"name": "f", "parameters": {"type": "string"}}}]}', 400),
]


@dataclass(frozen=True)
class Request:
    path: str
    body: str  # JSON, so that a request is a dictionary key

    def json(self, stream: bool) -> dict:
        return {**json.loads(self.body), "stream": stream}


def valid_requests(max_tokens: int, fim: bool) -> list[Request]:
    chat, complete = "/v1/chat/completions", "/v1/completions"
    bodies = [(chat, {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens - 8 * (i % 2),
                      "temperature": 0}) for i, text in enumerate(CHAT)]
    bodies += [(complete, {"prompt": text, "max_tokens": max_tokens - 4 * i, "temperature": 0})
               for i, text in enumerate(COMPLETE)]
    # sampled with a seed: the same tokens every time
    bodies += [(complete, {"prompt": COMPLETE[0], "max_tokens": max_tokens, "temperature": 0.8, "seed": seed})
               for seed in (1, 2)]
    if fim:
        bodies += [(complete, {"prompt": prefix, "suffix": suffix, "max_tokens": max_tokens, "temperature": 0})
                   for prefix, suffix in FIM]
    return [Request(path, json.dumps(body, sort_keys=True)) for path, body in bodies]


def _text(choice: dict, chat: bool, stream: bool) -> str:
    if chat:
        part = choice["delta"] if stream else choice["message"]
        return part.get("content") or ""
    return choice.get("text") or ""


def ask(http, url: str, request: Request, stream: bool) -> tuple[str | None, str]:
    """(the answer's text, or None; what went wrong, or ''): one whole answer, checked for shape."""
    chat = request.path.endswith("chat/completions")
    if not stream:
        r = http.post(url + request.path, json=request.json(False))
        if r.status_code != 200:
            return None, f"status {r.status_code}: {r.text[:200]}"
        body = r.json()
        return _text(body["choices"][0], chat, False), ""
    text, finishes, done, ids = [], 0, 0, set()
    with http.stream("POST", url + request.path, json=request.json(True)) as r:
        if r.status_code != 200:
            return None, f"status {r.status_code}"
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return None, f"error event {event['error']}"
            ids.add(event["id"])
            for choice in event["choices"]:
                text.append(_text(choice, chat, True))
                finishes += bool(choice.get("finish_reason"))
    if (done, finishes, len(ids)) != (1, 1, 1):
        return None, f"{done} [DONE], {finishes} finish reasons, {len(ids)} ids"
    return "".join(text), ""


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)
    problems: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, problem: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            if problem:
                self.problems.append(f"{kind}: {problem}")


def error_shaped(r) -> bool:
    try:
        e = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(e, dict) and isinstance(e.get("message"), str) and isinstance(e.get("type"), str)


def client_loop(url: str, requests: list[Request], solo: dict, deadline: float, seed: int, tally: Tally,
                max_body: int) -> None:
    import httpx

    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(timeout=httpx.Timeout(600), headers=headers) as http:
        while time.time() < deadline:
            roll = rng.random()
            try:
                if roll < 0.55:  # a valid request, streamed or not
                    request, stream = rng.choice(requests), rng.random() < 0.5
                    text, problem = ask(http, url, request, stream)
                    if not problem and text != solo[request]:
                        problem = f"answer differs from its solo answer: {text!r} != {solo[request]!r}"
                    tally.add("answered" if not problem else "wrong answer", problem)
                elif roll < 0.70:  # a client that leaves mid-stream
                    with http.stream("POST", url + "/v1/completions",
                                     json={"prompt": rng.choice(COMPLETE), "max_tokens": 200, "stream": True,
                                           "temperature": 0}) as r:
                        for line in r.iter_lines():
                            if line.startswith("data: ") and line != "data: [DONE]":
                                break  # the first event: hang up
                    tally.add("disconnected" if r.status_code == 200 else "wrong answer",
                              "" if r.status_code == 200 else f"status {r.status_code}")
                elif roll < 0.88:  # malformed
                    body, status = rng.choice(BAD)
                    r = http.post(url + rng.choice(["/v1/completions", "/v1/chat/completions"]), content=body,
                                  headers={"Content-Type": "application/json"})
                    ok = r.status_code == status
                    tally.add("malformed" if ok and error_shaped(r) else "wrong",
                              "" if ok and error_shaped(r) else f"{body[:40]!r}: {r.status_code} {r.text[:120]}")
                elif roll < 0.94:  # oversized
                    r = http.post(url + "/v1/completions", content=b'{"prompt": "' + b"x" * (max_body + 1) + b'"}',
                                  headers={"Content-Type": "application/json"})
                    tally.add("oversized" if r.status_code == 413 and error_shaped(r) else "wrong",
                              "" if r.status_code == 413 else f"oversized: {r.status_code}")
                else:  # a wrong key
                    r = httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=60,
                                   headers={"Authorization": "Bearer sk-wrong"})
                    tally.add("wrong_key" if r.status_code == 401 and error_shaped(r) else "wrong",
                              "" if r.status_code == 401 else f"wrong key: {r.status_code}")
            except httpx.HTTPError as e:
                tally.add("wrong", f"{type(e).__name__}: {e}")


def run_clients(url, requests, solo, clients: int, seconds: float, max_body: int, seed: int) -> Tally:
    tally = Tally()
    deadline = time.time() + seconds
    threads = [threading.Thread(target=client_loop, args=(url, requests, solo, deadline, seed * 1000 + c, tally,
                                                          max_body), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally


def health(url: str) -> dict:
    import httpx
    return httpx.get(url + "/health", timeout=60).json()


def settled_resources(server: ServerProcess) -> dict:
    time.sleep(WORKERS_IDLE)
    return server.resources()


def soak(model: str, clients: int, seconds: float, max_tokens: int, warmup_seconds: float, serve_args=(),
         seed: int = 20261201, env: dict | None = None) -> dict:
    """Runs the soak; returns its report ("problems" empty when everything held)."""
    import httpx

    max_body = 64 << 10
    server = ServerProcess(model, ["-q", "--api-key", KEY, "--max-body", str(max_body), "--queue", str(4 * clients),
                                   *serve_args], env=env)
    try:
        fim = not server_refuses_fim(server.url)
        requests = valid_requests(max_tokens, fim)
        with httpx.Client(timeout=600, headers={"Authorization": f"Bearer {KEY}"}) as http:
            solo = {}
            for r in requests:
                text, problem = ask(http, server.url, r, stream=False)
                if problem:
                    raise RuntimeError(f"a solo request failed: {r}: {problem}")
                solo[r] = text
        warm = run_clients(server.url, requests, solo, clients, warmup_seconds, max_body, seed)
        before = settled_resources(server)
        health_before = health(server.url)
        t0 = time.time()
        tally = run_clients(server.url, requests, solo, clients, seconds, max_body, seed + 1)
        wall = time.time() - t0
        after = settled_resources(server)
        health_after = health(server.url)
    finally:
        status = server.stop()
    problems = warm.problems + tally.problems
    counted = {k: health_after["requests"][k] - health_before["requests"][k] for k in health_after["requests"]}
    sent = tally.counts["answered"] + tally.counts["disconnected"]
    # a client that hangs up after its answer's last event may find it done rather than cancelled
    if counted["done"] + counted["cancelled"] != sent or counted["failed"] or counted["rejected"]:
        problems.append(f"/health counted {counted}; the clients sent {sent} requests that reached the queue "
                        f"({dict(tally.counts)})")
    if counted["done"] < tally.counts["answered"]:
        problems.append(f"/health counted {counted['done']} done, fewer than the {tally.counts['answered']} answered")
    growth = after["rss_bytes"] / before["rss_bytes"] - 1
    if growth > MEMORY_TOLERANCE:
        problems.append(f"resident memory grew {100 * growth:.1f}% ({before['rss_bytes']} -> {after['rss_bytes']})")
    for k in ("fds", "threads"):
        if after[k] > before[k]:
            problems.append(f"{k}: {before[k]} after the warm-up, {after[k]} at the end")
    if status != 0:
        problems.append(f"the server exited with status {status} on SIGTERM")
    return {"bench": "soak", "model": model, "clients": clients, "seconds": wall, "max_tokens": max_tokens,
            "warmup_seconds": warmup_seconds, "distinct_valid_requests": len(requests), "fim": fim,
            "counts": dict(tally.counts), "warmup_counts": dict(warm.counts), "health": counted,
            "resources_after_warmup": before, "resources_at_end": after, "rss_growth": growth,
            "requests_per_s": sum(tally.counts.values()) / wall, "problems": problems}


def server_refuses_fim(url: str) -> bool:
    import httpx
    r = httpx.post(url + "/v1/completions", json={"prompt": "a", "suffix": "b", "max_tokens": 1},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=600)
    return r.status_code == 400


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--warmup-minutes", type=float, default=1)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--no-append", action="store_true", help="do not append to bench/results.jsonl")
    args, serve_args = ap.parse_known_args(argv)  # the rest goes to `nanocompile serve`
    load_before = os.getloadavg()
    report = soak(args.model, args.clients, 60 * args.minutes, args.max_tokens, 60 * args.warmup_minutes,
                  serve_args)
    report["loadavg"] = [load_before, os.getloadavg()]
    print(json.dumps({k: v for k, v in report.items() if k != "problems"}, indent=1))
    for p in report["problems"][:50]:
        print("PROBLEM:", p)
    if not args.no_append:
        append(report)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
