"""Load test of `nanocompile serve` over the loopback: requests per second and time to first token
at 1, 4 and 16 concurrent clients, and that every request was answered exactly once.

    python -m bench.probes.serve_load [-m default] [--clients 1,4,16] [--per-client 2] [--max-tokens 32]

Starts the server (127.0.0.1, a free port, two threads), warms it up with one request, then for
each level C runs C clients at once, each sending --per-client streaming chat requests one after
the other (bounded: C x per-client requests, and --time-limit seconds for the whole run). Every
request has a prompt of its own (its number first, so no two share more than the chat template's
start in the KV cache), temperature 0 and max_tokens fixed.

Exactly once: each request must get status 200, one stream with one id, one finish reason, one
[DONE] and its usage; the ids of all requests must differ; and the server's own count of requests
done and tokens generated (/health) must grow by exactly the requests sent and the tokens the
clients received. Appends to bench/results.jsonl.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

from ..support.measure import append, summary
from ..support.server import ServerProcess

TOPICS = ["sorting a list", "parsing a date", "reading a CSV file", "merging two dicts", "a binary search",
          "counting words", "reversing a string", "checking for a prime", "flattening a list", "a stack class"]


async def one_request(client, base: str, number: int, max_tokens: int) -> dict:
    topic = TOPICS[number % len(TOPICS)]
    body = {"model": "nanocompile", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Request {number}: write a Python function for {topic}."}]}
    t0 = time.perf_counter()
    first = None
    ids, finishes, done, usage, errors = set(), [], 0, None, []
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        status = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            event = json.loads(line[6:])
            if "error" in event:
                errors.append(event["error"]["message"])
                continue
            ids.add(event["id"])
            for choice in event["choices"]:
                if choice["delta"].get("content") and first is None:
                    first = time.perf_counter() - t0
                if choice["finish_reason"]:
                    finishes.append(choice["finish_reason"])
            usage = event.get("usage") or usage
    return {"number": number, "status": status, "ttft": first, "latency": time.perf_counter() - t0, "ids": ids,
            "finishes": finishes, "done": done, "usage": usage, "errors": errors}


async def level(base: str, clients: int, per_client: int, max_tokens: int, first_number: int) -> tuple[list, float]:
    import httpx

    async def client_loop(c: int, http) -> list[dict]:
        return [await one_request(http, base, first_number + c * per_client + k, max_tokens)
                for k in range(per_client)]

    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900), limits=limits) as http:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*(client_loop(c, http) for c in range(clients)))
        wall = time.perf_counter() - t0
    return [r for run in runs for r in run], wall


def health(base: str) -> dict:
    import httpx
    return httpx.get(base + "/health", timeout=30).json()


def check_once(results: list[dict]) -> list[str]:
    """What went wrong with 'answered exactly once', request by request."""
    problems = []
    for r in results:
        if r["status"] != 200 or r["errors"]:
            problems.append(f"request {r['number']}: status {r['status']}, errors {r['errors']}")
        elif len(r["ids"]) != 1 or len(r["finishes"]) != 1 or r["done"] != 1 or r["usage"] is None:
            problems.append(f"request {r['number']}: {len(r['ids'])} ids, {len(r['finishes'])} finish reasons, "
                            f"{r['done']} [DONE], usage {r['usage']}")
    all_ids = [i for r in results for i in r["ids"]]
    if len(set(all_ids)) != len(all_ids):
        problems.append("two requests were answered with the same id")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("--clients", default="1,4,16", help="concurrency levels")
    ap.add_argument("--per-client", type=int, default=2, help="requests each client sends, one after the other")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--time-limit", type=float, default=1800, help="seconds for the whole run")
    ap.add_argument("--no-append", action="store_true", help="do not append to bench/results.jsonl")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    server = ServerProcess(args.model, ["-q", "-c", "2048", "--queue", str(max(levels) * 2)])
    base = server.url
    started = time.time()
    load_before = os.getloadavg()  # other work on the machine shows here: two cores are shared
    rows, problems = [], []
    try:
        asyncio.run(level(base, 1, 1, 4, -1))  # warm-up
        number = 0
        for clients in levels:
            if time.time() - started > args.time_limit:
                problems.append(f"time limit reached before {clients} clients")
                break
            before = health(base)
            results, wall = asyncio.run(level(base, clients, args.per_client, args.max_tokens, number))
            number += len(results)
            after = health(base)
            trouble = check_once(results)
            tokens = sum(r["usage"]["completion_tokens"] for r in results if r["usage"])
            served = after["requests"]["done"] - before["requests"]["done"]
            generated = after["tokens_generated"] - before["tokens_generated"]
            if served != len(results) or generated != tokens:
                trouble.append(f"the server counted {served} requests and {generated} tokens; the clients sent "
                               f"{len(results)} and received {tokens}")
            problems += trouble
            ttft = [r["ttft"] for r in results if r["ttft"] is not None]
            # each answer's own decode speed, after its first token: what the machine gave it
            speed = [(r["usage"]["completion_tokens"] - 1) / (r["latency"] - r["ttft"]) for r in results
                     if r["usage"] and r["ttft"] is not None and r["usage"]["completion_tokens"] > 1]
            row = {"clients": clients, "requests": len(results), "wall_s": wall,
                   "requests_per_s": len(results) / wall, "tokens": tokens, "tokens_per_s": tokens / wall,
                   "ttft_s": summary(ttft), "latency_s": summary([r["latency"] for r in results]),
                   "decode_tok_s_per_request": summary(speed),
                   "lost_or_twice": len(trouble)}
            rows.append(row)
            print(f"{clients:3d} clients: {len(results):3d} requests in {wall:6.1f} s = {row['requests_per_s']:.3f} "
                  f"req/s, {row['tokens_per_s']:.1f} tok/s | time to first token median "
                  f"{row['ttft_s']['median']:.2f} s (min {row['ttft_s']['min']:.2f}, max {row['ttft_s']['max']:.2f}) "
                  f"| decode {row['decode_tok_s_per_request']['median']:.1f} tok/s per answer "
                  f"| lost or answered twice: {len(trouble)}", flush=True)
    finally:
        server.stop()
    for p in problems:
        print("PROBLEM:", p)
    if not args.no_append:
        append({"bench": "serve_load", "model": args.model, "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(), "max_tokens": args.max_tokens,
                "per_client": args.per_client, "n_ctx": 2048, "levels": rows, "problems": problems,
                "note": "one model, one KV cache: requests are answered one at a time, in order of arrival"})
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
