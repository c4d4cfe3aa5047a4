"""Prompt-lookup speculative decoding (engine/lookup.py, the loop in engine/stream.py).

Drafting may change how many rows a step feeds, never what is generated: greedy tokens equal
plain greedy tokens and the cache ends bitwise as plain decoding leaves it, whatever the drafts
(right, wrong at the first token, wrong later), because a verify step's rows are bitwise the
rows of single steps; rolling back after a rejected draft leaves no trace, at every precision
and thread count. Sampled tokens keep the model's distribution (a two-sample test against
plain sampling, which a loop that kept every draft fails).
"""
import math

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config
from helpers import real_prompt_ids

from nanocompile.engine import lookup as lookup_module
from nanocompile.engine.compiled import CompiledSession
from nanocompile.engine.lookup import Acceptance, DraftLength, LookupParams, NgramIndex, StepCosts, spend
from nanocompile.engine.open import open_session
from nanocompile.engine.sampling import Sampler, SamplingParams
from nanocompile.engine.stream import stream
from nanocompile.errors import InputError


class Recording:
    """A session that records, per step, its rows and how many of them were rolled back after it,
    delegating the rest."""

    def __init__(self, session):
        self.session, self.steps = session, []  # [rows, rolled back]

    def __getattr__(self, name):
        return getattr(self.session, name)

    def step(self, tokens, all_logits=False):
        self.steps.append([len(tokens), 0])
        return self.session.step(tokens, all_logits)

    def truncate(self, n_past):
        if self.steps:
            self.steps[-1][1] += self.session.past - n_past
        self.session.truncate(n_past)

    def verify_steps(self):
        return self.steps[1:]  # after the prompt

def run(session, prompt, n, lookup=None, choose=None):
    session.reset()
    tokens, result = [], None
    kwargs = {"choose": choose} if choose is not None else {}
    for piece in stream(session, prompt, n, lookup=lookup, **kwargs):
        tokens += piece.tokens
        result = piece.result or result
    return tokens, result


# the index and the draft length ------------------------------------------------------------------

def test_the_index_drafts_what_followed_the_latest_longest_match():
    index = NgramIndex([1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3], 1, 4)
    assert index.draft(3) == ([5, 6, 7], 2)  # "2 3" last seen before 5, not before 4
    index.append(5)
    assert index.draft(8) == ([6, 7, 2, 3, 5], 3)  # "2 3 5": what followed, up to the context's end
    assert NgramIndex([1, 2, 3], 1, 4).draft(4) == ([], 0)  # nothing repeats
    assert NgramIndex([1, 2, 3], 2, 4).draft(4) == ([], 0)
    assert NgramIndex([7, 8, 7], 1, 2).draft(4) == ([8, 7], 1)


def test_the_draft_length_follows_acceptance_and_cost():
    length = DraftLength(16)
    assert length.choose(10, 0) == 0 and length.choose(0, 3) == 0  # nothing matched
    for _ in range(20):
        length.record(3, 8, 8)  # every draft kept
    assert length.choose(16, 3) >= 8
    length.timed(1, 0.010)
    length.timed(9, 0.100)  # nine rows cost ten times one: not worth it
    assert length.choose(8, 3) < 8
    assert length.cost(9) == pytest.approx(10.0) and length.cost(5) == pytest.approx(1 + 9 / 8 * 4)  # as 9 rows
    length.timed(3, 0.011)
    assert length.cost(2) == pytest.approx(1.05) and length.cost(9) == pytest.approx(10.0)  # 3 rows' 0.05 a row
    for _ in range(20):
        length.record(1, 4, 0)  # single-token matches always rejected
    assert length.choose(16, 1) == 0


def test_a_step_spends_its_rows_on_the_likeliest_drafted_tokens():
    """Where several sequences' steps run together (engine/batcher.py) each offers its draft with
    each token's chance of being kept; the step's rows go to the likeliest drafted tokens while
    its expected tokens in all per second rise, so one sequence's rows go to its draft and with
    many sequences decoding they go to one token each."""
    costs = StepCosts()
    for rows in (1, 2, 4, 8, 16, 24):
        costs.timed(rows, 0.020 * (1 + 0.25 * (rows - 1)))  # each extra row a quarter of one
    costs.timed(4, 1.0)  # slower than the fastest 4-row step seen: not kept
    assert costs.seconds(4) == pytest.approx(0.020 * 1.75) and costs.seconds(3) == pytest.approx(0.020 * 1.5)
    assert costs.seconds(12) == pytest.approx(0.020 * (1 + 0.25 * 11))
    likely = [0.8 ** j for j in range(1, 17)]
    alone, beside_3, beside_15 = (spend(costs, 1 + b, 1 + b, [likely], 32)[0] for b in (0, 3, 15))
    assert alone > beside_3 > beside_15 == 0
    assert spend(costs, 16, 16, [[1.0] * 8], 32) == [8]  # every draft kept: worth its rows beside any number
    assert spend(costs, 1, 1, [[1.0] * 16], 8) == [7]  # no more rows than a step takes
    unlikely = [0.3 ** j for j in range(1, 17)]
    two = spend(costs, 2, 2, [unlikely, likely], 32)
    assert two[0] == 0 < two[1] <= alone  # the likelier draft gets the rows, no more of them than alone
    assert spend(costs, 3, 3, [[], likely[:2]], 32) == [0, 2] and spend(costs, 1, 1, [], 32) == []
    coarse = StepCosts()
    for rows in (1, 2):
        coarse.timed(rows, 0.0)  # a clock too coarse to time a step: no division by zero
    assert spend(coarse, 1, 1, [[0.9]], 8) in ([0], [1])
    large = StepCosts()
    large.timed(40, 0.200)  # a batch whose steps were all large: fewer rows at the prior's shape
    assert 0 < large.seconds(1) < large.seconds(2) < large.seconds(40) < large.seconds(41) and large.cost(5) > 1.0


def test_a_sequence_starts_from_the_batch_acceptance_and_adds_to_it():
    """A sequence decoding beside others starts from their drafts' acceptance (pooled, per n-gram
    length) instead of the prior, and what it sees is added to the pool."""
    pool = Acceptance()
    for _ in range(20):
        pool.record(1, 4, 0)  # single-token matches always rejected in the batch so far
    fresh, beside = DraftLength(16), DraftLength(16, pool=pool)
    assert fresh.acceptance(1) == pytest.approx(0.25) and fresh.chances(8, 1)[:2] == pytest.approx([0.25, 0.0625])
    assert beside.acceptance(1) < 0.01 and beside.chances(8, 1) == [] and beside.chances(8, 0) == []
    assert beside.acceptance(3) == pytest.approx(fresh.acceptance(3))  # lengths the pool has not seen: the prior
    for _ in range(3):
        beside.record(1, 2, 2)  # this sequence's own single-token matches are kept
    assert beside.acceptance(1) > 0.5 and 0.2 < pool.rate(1) < beside.acceptance(1)
    chances = DraftLength(4).chances(16, 3)
    assert len(chances) == 4 and all(a > b for a, b in zip(chances, chances[1:]))  # at most draft_max, falling


@pytest.mark.parametrize("field, value", [("draft_max", 0), ("ngram_min", -1), ("ngram_max", 1.5),
                                          ("draft_max", True)])
def test_bad_lookup_parameters_are_refused_by_name(field, value):
    with pytest.raises(InputError, match=field.replace("_", "-")):
        LookupParams(**{field: value}).check()
    with pytest.raises(InputError, match="must not exceed"):
        LookupParams(ngram_min=3, ngram_max=2).check()


# exact on a tiny model, with drafts forced right and wrong ----------------------------------------

@pytest.fixture(scope="module")
def tiny():  # the tests that use it compile the tiny model's library: tier c
    cfg = tiny_config(max_pos=512, vocab=211)
    return cfg, random_weights(cfg, seed=5)


def oracle_drafts(monkeypatch, plain: list[int], prompt_len: int, right: int):
    """Drafts that continue plain decoding for `right` tokens, then go wrong (right=0: wrong at
    the first token), whatever the context holds."""
    def draft(self, limit):
        done = len(self.tokens) - prompt_len  # tokens generated so far
        truth = plain[done:done + limit]
        guess = truth[:right] + [(t + 1) % 211 for t in truth[right:]]
        return guess[:limit], 3

    monkeypatch.setattr(lookup_module.NgramIndex, "draft", draft)


@pytest.mark.c
@pytest.mark.parametrize("right", [0, 1, 3, 16])
@pytest.mark.parametrize("threads", [1, 3])
def test_greedy_tokens_and_cache_are_plain_decodings_whatever_the_drafts(tiny, monkeypatch, right, threads):
    cfg, w = tiny
    session = CompiledSession.from_weights(cfg, w, n_ctx=200, threads=threads)
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    plain, _ = run(session, prompt, 40)
    plain_cache = [session.read_cache(layer) for layer in range(cfg.num_hidden_layers)]
    plain_tokens = session.tokens
    oracle_drafts(monkeypatch, plain, len(prompt), right)
    recording = Recording(session)
    spec, result = run(recording, prompt, 40, LookupParams(draft_max=8))
    assert spec == plain
    assert session.tokens == plain_tokens
    for layer, (k, v) in enumerate(plain_cache):
        got_k, got_v = session.read_cache(layer)
        assert np.array_equal(got_k, k) and np.array_equal(got_v, v)
    assert result.verify_steps > 0 and max(rows for rows, _ in recording.verify_steps()) > 1
    if right == 0:  # every draft rolled back whole
        assert result.accepted == 0
        assert all(back == rows - 1 for rows, back in recording.verify_steps() if rows > 1)
    if right == 16:
        assert result.accepted >= 20 and len(recording.steps) < 20


@pytest.mark.c
def test_a_stop_inside_a_verified_draft_leaves_the_cache_as_plain_decoding(tiny, monkeypatch):
    cfg, w = tiny
    session = CompiledSession.from_weights(cfg, w, n_ctx=200, threads=2)
    prompt = [3, 14, 15, 92, 65]
    plain, _ = run(session, prompt, 30)
    stop = plain[12]
    session.reset()
    want = [p.tokens for p in stream(session, prompt, 30, stop_ids={stop})]
    want_cache = session.tokens
    oracle_drafts(monkeypatch, plain, len(prompt), 16)
    session.reset()
    got = [p.tokens for p in stream(session, prompt, 30, stop_ids={stop}, lookup=LookupParams())]
    assert got == want and session.tokens == want_cache
    for limit in (1, 7, 13):  # the token limit inside a draft
        assert run(session, prompt, limit, LookupParams())[0] == plain[:limit]
        assert session.past == len(prompt) + limit - 1


@pytest.mark.c
def test_a_full_context_ends_inside_a_draft_as_plain_decoding_does(tiny, monkeypatch):
    cfg, w = tiny
    session = CompiledSession.from_weights(cfg, w, n_ctx=24, threads=2)
    prompt = [3, 14, 15, 92, 65]
    plain, plain_result = run(session, prompt, -1)
    oracle_drafts(monkeypatch, plain, len(prompt), 16)
    spec, result = run(session, prompt, -1, LookupParams())
    assert spec == plain and result.stop_reason == plain_result.stop_reason == "context"


def chi2_survival(x: float, dof: int) -> float:
    """P(chi-squared with dof degrees of freedom > x): the regularized upper incomplete gamma
    function at dof / 2, in its closed forms for whole and half-whole arguments."""
    y = x / 2
    if dof % 2 == 0:
        term = total = 1.0
        for i in range(1, dof // 2):
            term *= y / i
            total += term
        return math.exp(-y) * total
    total, term = 0.0, math.sqrt(y) / math.gamma(1.5)
    for i in range(1, (dof - 1) // 2 + 1):
        total += term
        term *= y / (i + 0.5)
    return math.erfc(math.sqrt(y)) + math.exp(-y) * total


def two_sample_chi2(a: list[int], b: list[int]) -> float:
    """The p-value of Pearson's chi-squared test that two samples' counts over the same
    categories come from one distribution (scipy's chi2_contingency without Yates' correction)."""
    counts = np.array([a, b], dtype=np.float64)
    expected = counts.sum(1, keepdims=True) * counts.sum(0, keepdims=True) / counts.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return chi2_survival(statistic, counts.shape[1] - 1) if counts.shape[1] > 1 else 1.0


@pytest.mark.slow
def test_the_chi_squared_survival_is_the_integral_of_its_density():
    """The closed forms against the density integrated numerically, for whole and odd degrees
    of freedom (the test suite has no scipy)."""
    for dof in (1, 2, 3, 4, 7, 12):
        for x in (0.5, 3.0, 11.0):
            t = np.linspace(x, x + 400, 2_000_001)
            density = np.exp((dof / 2 - 1) * np.log(t) - t / 2 - (dof / 2) * math.log(2) - math.lgamma(dof / 2))
            integral = float(((density[1:] + density[:-1]) / 2 * np.diff(t)).sum())
            assert chi2_survival(x, dof) == pytest.approx(integral, rel=1e-6)


@pytest.mark.c
def test_sampling_with_lookup_keeps_the_models_distribution(tiny, monkeypatch):
    """Frequencies of the first three sampled tokens (temperature 1, top-k 4), with drafts that
    propose the greedy continuation, against plain sampling: a chi-squared two-sample test per
    position. The test's power: plain sampling at temperature 0.4 fails it."""
    cfg, w = tiny
    session = CompiledSession.from_weights(cfg, w, n_ctx=64, threads=2)
    prompt = [3, 14, 15, 92, 65]
    greedy_tokens, _ = run(session, prompt, 3)
    oracle_drafts(monkeypatch, greedy_tokens + [0] * 8, len(prompt), 16)
    params = SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0)

    def frequencies(lookup, runs=600, seed=0, params=params):
        counts = [dict() for _ in range(3)]
        for r in range(runs):
            tokens, _ = run(session, prompt, 3, lookup, Sampler(params, np.random.default_rng([seed, r])))
            for position, t in enumerate(tokens):
                counts[position][t] = counts[position].get(t, 0) + 1
        return counts

    def p_values(a, b):
        return [two_sample_chi2([x.get(k, 0) for k in sorted(set(x) | set(y))],
                                [y.get(k, 0) for k in sorted(set(x) | set(y))]) for x, y in zip(a, b)]

    plain = frequencies(None, seed=1)
    spec = frequencies(LookupParams(draft_max=4), seed=2)
    assert min(p_values(plain, spec)) > 1e-3, (plain, spec)
    greedy_share = spec[1].get(greedy_tokens[1], 0) / 600
    assert 0.05 < greedy_share < 0.95  # the draft is not simply kept

    cooler = frequencies(None, seed=3, params=SamplingParams(temperature=0.4, top_k=4, top_p=1.0, min_p=0.0))
    assert min(p_values(plain, cooler)) < 1e-3


# the real model ------------------------------------------------------------------------------------

EDIT_PROMPT = ("Add type hints to this function and return the whole function.\n\n"
               "def mean(values):\n    total = 0\n    count = 0\n    for value in values:\n"
               "        total += value\n        count += 1\n    return total / count\n")


@pytest.mark.parametrize("precision", ["f32", "int8", "native"])
def test_rolling_back_a_verified_draft_leaves_no_trace(real_model, precision):
    """A step of one chosen token and five drafted ones, rolled back to the chosen one, then one
    more token: logits and cache bitwise those of a session that never saw the draft, at 1, 2 and
    3 threads."""
    ids = real_prompt_ids(real_model, "code")
    plain = open_session(real_model, "compiled", n_ctx=128, threads=2, precision=precision)
    spec = open_session(real_model, "compiled", n_ctx=128, threads=2, precision=precision)
    for threads in (1, 2, 3):
        plain.set_threads(threads)
        spec.set_threads(threads)
        plain.reset()
        spec.reset()
        first = int(np.argmax(plain.step(ids)))
        spec.step(ids)
        want = plain.step([first])
        rows = spec.step([first, 11, 22, 33, 44, 55], all_logits=True)
        assert np.array_equal(rows[0], want)
        spec.truncate(len(ids) + 1)
        nxt = int(np.argmax(want))
        assert np.array_equal(spec.step([nxt]), plain.step([nxt]))
        assert spec.tokens == plain.tokens
        for layer in (0, 11, 23):
            for a, b in zip(spec.read_cache(layer), plain.read_cache(layer)):
                assert np.array_equal(a, b)
    plain.close()
    spec.close()


def test_real_model_greedy_with_lookup_is_plain_greedy(real_model):
    """The default precision on prompts that repeat their context (an edit), that do not, and a
    chat: tokens identical; drafts were verified and some rejected at the first token."""
    session = open_session(real_model, "compiled", n_ctx=512, threads=2, precision="native")
    tok = real_model.tokenizer
    prompts = [tok.encode(tok.render_chat([{"role": "user", "content": EDIT_PROMPT}])),
               real_prompt_ids(real_model, "code"), real_prompt_ids(real_model, "english"),
               real_prompt_ids(real_model, "chat"),
               tok.encode("1, 1, 2, 3, 5, 8, 13, 21, 34,"), tok.encode("import numpy as np\nimport")]
    verified = first_rejected = accepted = 0
    for prompt in prompts:
        plain, _ = run(session, prompt, 48)
        recording = Recording(session)
        spec, result = run(recording, prompt, 48, LookupParams())
        assert spec == plain, tok.decode(prompt)
        verified += result.verify_steps
        accepted += result.accepted
        first_rejected += sum(1 for rows, back in recording.verify_steps() if rows > 1 and back == rows - 1)
    print(f"verify steps {verified}, accepted {accepted}, rejected at the first drafted token {first_rejected}")
    assert verified and accepted and first_rejected
    session.close()


# where users turn it on ------------------------------------------------------------------------------

REPEATING = "one two three four five six seven eight nine ten. one two three four five six seven eight"


@pytest.mark.c
def test_the_api_and_the_server_take_lookup_and_report_the_drafts(tiny_chat_model):
    from starlette.testclient import TestClient

    from nanocompile import Model
    from nanocompile.server import create_app

    session = CompiledSession.from_weights(tiny_chat_model.config, tiny_chat_model.weights, n_ctx=256, threads=2)
    model = Model.from_session(tiny_chat_model, session)
    plain = model.create_completion(REPEATING, max_tokens=60, temperature=0)
    spec = model.create_completion(REPEATING, max_tokens=60, temperature=0, lookup=True)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert plain.timings.drafted_tokens == 0 and spec.timings.drafted_tokens > 0
    assert 0 <= spec.timings.accepted_tokens <= spec.timings.drafted_tokens
    assert list(model.generate(model.tokenize(REPEATING), max_tokens=60, temperature=0, lookup=True)) == plain.tokens
    with pytest.raises(InputError, match="lookup must be True, False or a LookupParams"):
        model.create_completion("x", lookup="yes")

    served = Model.from_session(tiny_chat_model, session, lookup=True)  # on for every request
    with TestClient(create_app(served)) as client:
        body = client.post("/v1/completions", json={"prompt": REPEATING, "max_tokens": 60, "temperature": 0}).json()
    # how much is drafted follows measured step times, so it is compared with the same request's
    assert body["choices"][0]["text"] == plain.text and served.timings.drafted_tokens > 0
    assert body["timings"]["draft_n"] == served.timings.drafted_tokens
    assert body["timings"]["draft_n_accepted"] == served.timings.accepted_tokens


def test_the_interpreter_refuses_lookup_by_name(tiny_chat_model):
    from nanocompile import Model
    from nanocompile.engine.interpreted import InterpreterSession

    session = InterpreterSession.from_weights(tiny_chat_model.config, tiny_chat_model.weights, n_ctx=64)
    with pytest.raises(InputError, match="lookup needs the compiled backend, not interp"):
        Model.from_session(tiny_chat_model, session, lookup=True)
    with pytest.raises(InputError, match="prompt lookup needs a session whose rows"):
        Model.from_session(tiny_chat_model, session).create_completion("x", lookup=True)


@pytest.mark.c
def test_the_command_line_flags(tmp_path):
    import os
    import subprocess
    import sys

    from bench.support.tiny import write_gguf

    cfg = tiny_config(vocab=300, max_pos=256)
    path = write_gguf(tmp_path / "tiny.gguf", cfg, random_weights(cfg, seed=1), quantize=False)
    env = {**os.environ, "NANOCOMPILE_CACHE": str(tmp_path / "cache")}

    def nc(*args):
        return subprocess.run([sys.executable, "-m", "nanocompile", "run", "-q", "-m", str(path), "-p", REPEATING,
                               "-n", "60", "--temp", "0", "--ids", *args], capture_output=True, text=True, env=env,
                              timeout=600)

    plain, spec = nc(), nc("--lookup", "--draft-max", "6")
    assert plain.returncode == spec.returncode == 0, plain.stderr + spec.stderr
    assert spec.stdout == plain.stdout
    assert "lookup: drafted" in spec.stderr and "lookup:" not in plain.stderr
    bad = nc("--lookup", "--draft-max", "0")
    assert bad.returncode == 1 and "--draft-max must be a whole number of at least 1, got 0" in bad.stderr
    assert "Traceback" not in bad.stderr
