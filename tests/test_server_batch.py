"""`nanocompile serve --parallel N` (issue 28, points 2 and 3): N requests answered at once, each in a
sequence of its own (a slot of the compiled library), their decoding steps run as one batched step
(engine/batcher.py); a newcomer's prompt runs between them a chunk at a time.

Exact under load: every answer equals what the same request gets alone (greedy, and sampled with
its seed), because each sequence's logits in a batched step are bitwise its own step's
(tests/test_batch.py). The queue, 503, 400, 401 and a client that leaves behave as with one slot.
"""
import json
import threading
import time

import httpx
import numpy as np
import pytest
from helpers import LiveServer, real_prompt_ids
from bench.probes.serve_load import batch_delta
from session_wrappers import WrappedSession

from nanocompile import Model
from nanocompile.engine.batcher import Batcher, _Request
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.lookup import Acceptance, LookupParams, StepCosts
from nanocompile.engine.stream import generate, stream
from nanocompile.errors import InputError
from nanocompile.server import create_app

pytestmark = pytest.mark.c

KEY = "sk-batch"


def compiled(model, n_ctx=256):
    return CompiledSession.from_weights(model.config, model.weights, n_ctx=n_ctx, threads=2, precision="f32")


class SlowBatches(WrappedSession):
    """A compiled session whose batched steps take at least `seconds`: generation slow enough to
    be caught running."""

    def __init__(self, inner, seconds: float):
        super().__init__(inner)
        self.seconds = seconds

    def step_batch(self, parts):
        time.sleep(self.seconds)
        return self.inner.step_batch(parts)


def requests_of_mixed_lengths(n: int) -> list[dict]:
    """Prompts of 1 to 40 words, answers of 3 to 45 tokens; greedy and seeded sampling; some
    streamed; one with several choices and one chat."""
    out = []
    for i in range(n):
        body = {"prompt": " ".join(["word"] * (1 + 5 * i)) + f" number {i}", "max_tokens": 3 + 6 * i,
                "temperature": 0 if i % 2 else 0.9, "seed": 1000 + i, "stream": i % 3 == 0}
        if i == 5:
            body["n"] = 2
        out.append(body)
    out.append({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12, "seed": 7})
    return out


def ask(url: str, body: dict, headers: dict | None = None) -> dict:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if not body.get("stream"):
        r = httpx.post(url + path, json=body, headers=headers, timeout=300)
        assert r.status_code == 200, r.text
        return {c["index"]: c.get("text", c.get("message", {}).get("content")) for c in r.json()["choices"]}
    texts: dict[int, str] = {}
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    texts[c["index"]] = texts.get(c["index"], "") + (c.get("text") or "")
    return texts


def in_threads(run, n: int, timeout: float) -> None:
    """run(0), ..., run(n - 1), each in a thread of its own, all at once."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def all_at_once(url: str, bodies: list[dict], headers=None) -> list[dict]:
    answers: list = [None] * len(bodies)

    def one(i):
        answers[i] = ask(url, bodies[i], headers)

    in_threads(one, len(bodies), 300)
    return answers


def test_eight_concurrent_clients_get_their_answers_alone(tiny_chat_model):
    """8 clients (and a chat) at once against 4 slots: each answer equals the same request sent
    alone to a server of one slot, greedy and seeded sampling, streamed or not, n choices; every
    request answered once; decoding steps ran batched."""
    bodies = requests_of_mixed_lengths(8)
    alone = LiveServer(create_app(Model.from_session(tiny_chat_model, compiled(tiny_chat_model))))
    want = [ask(alone.url, body) for body in bodies]
    alone.stop()
    model = Model.from_session(tiny_chat_model, compiled(tiny_chat_model))
    app = create_app(model, parallel=4, api_key=KEY)
    server = LiveServer(app)
    headers = {"Authorization": f"Bearer {KEY}"}
    before = server.health()
    got = all_at_once(server.url, bodies, headers)
    assert got == want
    health = server.health()
    assert health["slots"] == 4 and health["slots_busy"] == 0
    assert health["requests"] == {"done": len(bodies), "cancelled": 0, "failed": 0, "rejected": 0}
    # the batcher's counts, as serve_load reads them: several sequences a step, time in and between
    batch = health["batch"]
    assert batch["sequences"] > batch["batched_steps"] > 0 and batch["batched_rows"] >= batch["sequences"]
    assert batch["step_seconds"] > 0 and batch["between_seconds"] >= 0
    level = batch_delta(before, health)  # what serve_load prints per level
    assert level["batched_steps"] == batch["batched_steps"] - before["batch"]["batched_steps"]
    assert level["sequences_per_step"] > 1 and level["ms_per_step"] > 0
    assert batch_delta({}, {"status": "ok"}) is None  # a server of one slot has no batcher
    server.stop()


def test_the_batcher_runs_decoding_steps_together_and_prompts_between(tiny_chat_model):
    """Four generations in four threads on one batcher: the tokens each gets alone; their steps,
    prompt chunks (32 tokens) and decoding alike, ran as batched steps of several sequences."""
    session = compiled(tiny_chat_model)
    batcher = Batcher(session, 4)
    reference = compiled(tiny_chat_model)
    prompts = [[int(t) for t in np.random.default_rng(i).integers(0, 300, 3 + 40 * i)] for i in range(4)]
    want = []
    for p in prompts:
        reference.reset()
        want.append(generate(reference, p, 20).tokens)
    got: list = [None] * 4

    def run(i):
        seq = batcher.sequences[i]
        with seq.generating():
            got[i] = generate(seq, prompts[i], 20).tokens

    in_threads(run, 4, 120)
    batcher.close()
    assert got == want
    s = batcher.stats
    assert s.batched_rows > s.sequences > s.batched_steps > 0 and s.alone == 0
    assert s.batched_steps < 4 * 20  # steps of several sequences, not one each
    # the batched steps' times by their rows in all, the table the sequences' drafts are priced by
    # the batched steps' times by their rows in all, every row reaching the head (not the prompts')
    assert batcher.sequences[2].step_costs is batcher.costs and 0 < max(batcher.costs.fastest) <= 4
    assert s.step_seconds > 0 and s.between_seconds > 0  # four sequences generated between steps


class EveryRowAStep(StepCosts):
    """Step costs that say each row costs as much as a step of one, whatever is timed: no draft
    is worth its rows."""

    def timed(self, rows, seconds):
        pass

    def seconds(self, rows):
        return float(rows)


def test_drafts_in_a_batch_keep_every_sequence_its_tokens_alone(tiny_chat_model):
    """Prompt lookup on sequences decoding together (issue 28, point 5): each sequence offers its
    draft to the batched step, which verifies as much of it as it spends rows on; the tokens are
    still the ones each prompt gets alone without drafts, whether the step spends rows on drafts
    or gives each offer none."""
    reference = compiled(tiny_chat_model)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in np.tile(rng.integers(0, 300, 6 + i), 5)] for i in range(3)]  # repeating: drafts
    want = []
    for p in prompts:
        reference.reset()
        want.append(generate(reference, p, 24).tokens)
    for dear in (False, True):
        batcher = Batcher(compiled(tiny_chat_model), 3)
        if dear:
            batcher.costs = EveryRowAStep()
        got: list = [None] * 3
        drafted: list = [0] * 3

        def run(i):
            seq = batcher.sequences[i]
            with seq.generating():
                for piece in stream(seq, prompts[i], 24, lookup=LookupParams()):
                    pass
                got[i], drafted[i] = piece.result.tokens, piece.result.drafted

        in_threads(run, 3, 120)
        batcher.close()
        assert got == want
        assert (sum(drafted) == 0) if dear else (sum(drafted) > 0)
        pooled = [batcher.acceptance.rate(n) != Acceptance().rate(n) for n in (1, 2, 3)]
        assert any(pooled) != dear  # the drafts verified were pooled (none where none was)


def test_the_batcher_trims_each_offered_draft_to_the_rows_it_spends(tiny_chat_model):
    """A round's rows go to the likeliest drafted tokens while the step's expected tokens per
    second rise by the batched steps' costs; a draft given no rows is a plain decoding step (its
    first token alone, only the last row's logits)."""
    batcher = Batcher(compiled(tiny_chat_model), 2)
    try:
        cheap, dear = StepCosts(), StepCosts()
        for rows, seconds in ((1, 0.010), (2, 0.0105), (16, 0.040)):
            cheap.timed(rows, seconds)
        for rows in (1, 2, 4):
            dear.timed(rows, 0.010 * rows)  # each row a whole step's cost
        for costs, kept in ((cheap, 3), (dear, 0)):
            batcher.costs = costs
            offer = _Request([5, 6, 7, 8], True, True, [0.9, 0.8, 0.7])
            plain = _Request([9], False, True)
            batcher._spend([offer, plain], 2)
            assert offer.ids == [5, 6, 7, 8][:1 + kept] and offer.all_logits == (kept > 0)
            assert plain.ids == [9] and not plain.all_logits
        with pytest.raises(InputError, match="a draft of 2 tokens was offered with 3 chances"):
            batcher.sequences[0].step([1, 2, 3], all_logits=True, chances=[0.5, 0.2, 0.1])
    finally:
        batcher.close()


def test_lookup_in_the_batched_server_keeps_every_answer_alone(tiny_chat_model):
    """`serve --parallel 4 --lookup`: six clients at once with prompts that repeat, greedy and
    seeded sampling, streamed or not: each answer equals the same request sent alone to a server
    of one slot without lookup (issue 28, point 5; that the batched steps verify drafts and trim
    them is shown on the batcher itself, above)."""
    bodies = [{"prompt": " ".join(["alpha beta gamma delta"] * (3 + i)) + f" {i}", "max_tokens": 10 + 8 * i,
               "temperature": 0 if i % 2 else 0.9, "seed": 300 + i, "stream": i % 3 == 0} for i in range(6)]
    alone = LiveServer(create_app(Model.from_session(tiny_chat_model, compiled(tiny_chat_model))))
    want = [ask(alone.url, body) for body in bodies]
    alone.stop()
    model = Model.from_session(tiny_chat_model, compiled(tiny_chat_model), lookup=True)
    server = LiveServer(create_app(model, parallel=4))
    assert model.lookup and all_at_once(server.url, bodies) == want
    server.stop()


def test_queue_full_and_a_client_that_leaves_frees_its_slot(tiny_chat_model):
    """Two slots, one place in the queue: two long answers run, a third waits, a fourth is a 503;
    a running client that hangs up frees its slot for the one waiting; a prompt past the context
    is a 400 and a request without the key a 401, as with one slot."""
    model = Model.from_session(tiny_chat_model, SlowBatches(compiled(tiny_chat_model), 0.05))
    server = LiveServer(create_app(model, parallel=2, max_queue=1, api_key=KEY))
    headers = {"Authorization": f"Bearer {KEY}"}
    long = {"prompt": "hello", "max_tokens": 200, "temperature": 0, "stream": True}  # 10 s or more
    opened = []
    for _ in range(2):
        cm = httpx.stream("POST", server.url + "/v1/completions", json=long, headers=headers, timeout=60)
        lines = cm.__enter__().iter_lines()
        next(line for line in lines if line.startswith("data: "))  # being answered
        opened.append((cm, lines))  # kept: a response collected is a client gone
    assert server.health()["slots_busy"] == 2
    third = {}
    waiting = threading.Thread(target=lambda: third.setdefault("r", httpx.post(
        server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=headers, timeout=60)))
    waiting.start()
    end = time.time() + 30
    while server.health()["queued"] != 1:
        assert time.time() < end
        time.sleep(0.02)
    full = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=headers)
    assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
    too_long = httpx.post(server.url + "/v1/completions", json={"prompt": "word " * 300}, headers=headers)
    assert too_long.status_code == 400
    opened[0][0].__exit__(None, None, None)  # hangs up: its slot goes to the request waiting
    waiting.join(60)
    assert third["r"].status_code == 200 and third["r"].json()["usage"]["completion_tokens"] <= 2
    opened[1][0].__exit__(None, None, None)
    end = time.time() + 30
    while (health := server.health())["slots_busy"]:
        assert time.time() < end
        time.sleep(0.02)
    assert health["requests"] == {"done": 1, "cancelled": 2, "failed": 0, "rejected": 1}
    assert health["tokens_generated"] < 2 * 200  # the long ones did not run to their end
    server.stop()


@pytest.mark.model
def test_real_model_concurrent_answers_are_the_answers_alone(real_model):
    """The default model at its default precision, 4 slots, 6 clients with prompts and answers of
    different lengths, greedy and sampled with seeds: each answer is the one it gets alone."""
    from nanocompile.engine.open import open_session

    session = open_session(real_model, "compiled", n_ctx=512, threads=2, precision="auto")
    model = Model.from_session(real_model, session)
    prompts = [real_model.tokenizer.decode(real_prompt_ids(real_model, p)) for p in ("code", "english", "chat")]
    bodies = [{"prompt": prompts[i % 3], "max_tokens": 6 + 5 * i, "temperature": 0 if i < 3 else 0.8,
               "seed": 50 + i} for i in range(6)]
    want = []
    for body in bodies:
        model.reset()
        out = model.create_completion(body["prompt"], max_tokens=body["max_tokens"], temperature=body["temperature"],
                                      seed=body["seed"])
        want.append({0: out.text})
    server = LiveServer(create_app(model, parallel=4))
    assert all_at_once(server.url, bodies) == want
    server.stop()
    session.close()
