"""The Python API (nanocompile.Model): each call against a lower layer that defines what it must
give (the session's own logits, the tokenizer), on a tiny model with the NumPy interpreter where
speed matters and on the real model where the text matters."""
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from session_wrappers import FaultySession, WrappedSession

import nanocompile
from nanocompile import Model
from nanocompile.engine.interpreted import InterpreterSession
from nanocompile.engine.stops import StopScanner
from nanocompile.errors import ContextFullError, InputError, ModelError, NanocompileError, NonFiniteLogitsError

GREEDY = dict(temperature=0)


def tiny_model(loaded, wrap=None, seed=-1, n_ctx=256):
    session = InterpreterSession.from_weights(loaded.config, loaded.weights, n_ctx=n_ctx)
    return Model.from_session(loaded, wrap(session) if wrap else session, seed=seed)


@pytest.fixture()
def tiny(tiny_chat_model):
    return tiny_model(tiny_chat_model)


def manual_greedy(model, ids, n):
    """Greedy decoding written out with eval(): the session's logits, argmax, feed, repeat."""
    model.reset()
    logits, out = model.eval(ids), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        if out[-1] in model.eos_token_ids:
            break
        logits = model.eval([out[-1]])
    model.reset()
    return out


# the package --------------------------------------------------------------------------------------

def test_import_is_light_and_exports_the_api():
    code = "import sys, nanocompile; print('numpy' in sys.modules, nanocompile.Model.__name__, nanocompile.load)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("False Model <function load")  # NumPy loads with the API, not with the package
    assert {"Model", "load", "Completion", "ChatCompletion", "Timings", "Usage"} <= set(nanocompile.__all__)


# generation against the session's logits -------------------------------------------------------------

def test_generate_is_greedy_decoding_of_the_sessions_logits(tiny):
    ids = tiny.tokenize("hello there")
    want = manual_greedy(tiny, ids, 12)
    assert list(tiny.generate(ids, max_tokens=12, **GREEDY)) == want
    assert tiny.timings.generated_tokens == len(want) and tiny.timings.prompt_tokens == len(ids)
    assert tiny.n_tokens == len(ids) + len(want) - 1  # the last token is chosen, not fed


def test_completion_text_is_the_detokenized_tokens_and_streams_the_same(tiny):
    whole = tiny.create_completion("hello there", max_tokens=20, **GREEDY)
    shown = [t for t in whole.tokens if t not in tiny.eos_token_ids]
    assert whole.text == tiny.detokenize(shown)
    assert whole.tokens == manual_greedy(tiny, tiny.tokenize("hello there"), 20)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(tiny.tokenize("hello there")),
                                                                           len(whole.tokens))
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    tiny.reset()
    chunks = list(tiny.create_completion("hello there", max_tokens=20, stream=True, **GREEDY))
    assert "".join(c.text for c in chunks) == whole.text and sum((c.tokens for c in chunks), []) == whole.tokens
    assert [c.stop_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].stop_reason == whole.stop_reason and chunks[-1].usage == whole.usage
    assert whole.finish_reason == {"eos": "stop", "length": "length"}[whole.stop_reason]


def test_chat_completion_is_a_completion_of_the_rendered_conversation(tiny):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    answer = tiny.create_chat_completion(messages, max_tokens=10, **GREEDY)
    tiny.reset()
    plain = tiny.create_completion(tiny.chat_prompt(messages), max_tokens=10, **GREEDY)
    assert answer.message.content == plain.text and answer.tokens == plain.tokens
    assert answer.message.role == "assistant" and answer.id.startswith("chatcmpl-")
    assert tiny.chat_prompt(messages) == tiny.tokenize(tiny.tokenizer.render_chat(messages))
    tiny.reset()
    streamed = list(tiny.create_chat_completion(messages, max_tokens=10, stream=True, **GREEDY))
    assert "".join(c.content for c in streamed) == answer.message.content


def test_same_seed_same_tokens_and_the_models_generator_continues(tiny_chat_model):
    sampled = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=12)
    a = tiny_model(tiny_chat_model, seed=7)
    b = tiny_model(tiny_chat_model, seed=7)
    runs_a = [a.create_completion("abc", **sampled).tokens for _ in range(2)]
    runs_b = [b.create_completion("abc", **sampled).tokens for _ in range(2)]
    assert runs_a == runs_b and a.seed == 7
    assert runs_a[0] != runs_a[1]  # one generator, continued: 12 draws at temperature 1.5 differ
    own = [a.create_completion("abc", seed=3, **sampled).tokens for _ in range(2)]
    assert own[0] == own[1] == b.create_completion("abc", seed=3, **sampled).tokens


def test_logprobs_are_the_log_softmax_of_the_logits_the_sampler_was_given(tiny):
    """Each chosen token's log-probability and its top alternatives, against the session's logits
    fed the same tokens (eval), sampled and greedy, whole and streamed."""
    ids = tiny.tokenize("hello there")
    sampled = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, max_tokens=10)
    got = tiny.create_completion(ids, logprobs=3, **sampled)
    assert len(got.logprobs) == len(got.tokens) == 10
    tiny.reset()
    rows = [tiny.eval(ids)] + [tiny.eval([t]) for t in got.tokens[:-1]]  # as the loop fed them
    for lp, row, token in zip(got.logprobs, rows, got.tokens):
        want = row.astype(np.float64) - row.max() - np.log(np.exp(row.astype(np.float64) - row.max()).sum())
        assert lp.token == token and abs(lp.logprob - want[token]) < 1e-9
        assert [t for t, _ in lp.top] == list(np.argsort(-want, kind="stable")[:3])
        assert all(abs(v - want[t]) < 1e-9 for t, v in lp.top)
    tiny.reset()  # the interpreter's rows round by the rows of their step: the prompt fed whole again
    streamed = [x for c in tiny.create_completion(ids, logprobs=3, stream=True, **sampled) for x in c.logprobs]
    assert streamed == got.logprobs  # the same seed: the same tokens, the same numbers
    assert tiny.create_completion(ids, max_tokens=4, **GREEDY).logprobs is None  # not asked for
    greedy = tiny.create_completion(ids, max_tokens=4, logprobs=0, **GREEDY).logprobs
    assert all(lp.top == () and lp.logprob <= 0 for lp in greedy)
    chat = tiny.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, logprobs=True,
                                       top_logprobs=2, **GREEDY)
    assert len(chat.logprobs) == len(chat.tokens) and all(len(lp.top) == 2 for lp in chat.logprobs)
    assert all(lp.top[0][0] == lp.token for lp in chat.logprobs)  # greedy chooses the most likely


def test_a_prompt_that_extends_the_cache_feeds_only_the_rest(tiny):
    first = tiny.create_completion("hello there", max_tokens=5, **GREEDY)
    cached = tiny.input_ids
    assert cached == tiny.tokenize("hello there") + first.tokens[:-1]
    longer = cached + tiny.tokenize(" and more")
    again = tiny.create_completion(longer, max_tokens=3, **GREEDY)
    assert (again.timings.cached_tokens, again.timings.prompt_tokens) == (len(cached), len(longer) - len(cached))
    assert again.usage.prompt_tokens == len(longer)
    fresh = tiny_model(tiny.loaded)
    want = fresh.eval(longer)
    tiny.reset()
    tiny.eval(cached)
    np.testing.assert_allclose(tiny.eval(longer[len(cached):]), want, rtol=0, atol=1e-5)
    assert again.tokens[0] == int(np.argmax(want))
    # a prompt that shares only a start keeps that start and drops the rest of the cache
    other = cached[:4] + tiny.tokenize("xyz")
    tiny.create_completion(other, max_tokens=1, **GREEDY)
    assert tiny.timings.cached_tokens == 4 and tiny.input_ids == other


def test_stop_sequences_cut_the_text_where_they_begin(tiny):
    full = tiny.create_completion("hello there", max_tokens=30, **GREEDY)
    stop = full.text[6:9]
    assert len(full.text) > 12 and stop
    cut = full.text[:full.text.find(stop)]
    tiny.reset()
    stopped = tiny.create_completion("hello there", max_tokens=30, stop=[stop, "never seen"], **GREEDY)
    assert stopped.text == cut and stopped.stop_reason == "stop" and stopped.finish_reason == "stop"
    assert len(stopped.tokens) < len(full.tokens)
    tiny.reset()
    chunks = list(tiny.create_completion("hello there", max_tokens=30, stop=stop, stream=True, **GREEDY))
    assert "".join(c.text for c in chunks) == cut


def test_stop_scanner_holds_back_only_what_may_become_a_stop_sequence():
    s = StopScanner(["END", "xy"])
    assert [s.push(t) for t in ("ab", "cE", "N", "x", "q")] == ["ab", "c", "", "EN", "xq"]
    assert s.flush() == ""
    s = StopScanner(["END"])
    assert s.push("abE") == "ab" and s.push("NDzz") == "" and s.hit and s.flush() == ""
    s = StopScanner([])
    assert s.push("anything") == "anything"


# stopping, faults, state ------------------------------------------------------------------------------

def test_stopping_during_the_prompt_leaves_the_cache_as_it_was(tiny):
    ids = tiny.tokenize("hello there, " * 20)[:200]  # n_ctx 256
    tiny.eval(ids[:10])
    before = tiny.input_ids
    chunks = -(-190 // tiny.session.max_chunk)  # the 190 new tokens go in this many chunks
    assert chunks >= 2
    asked = []

    def stop_before_the_last_chunk():
        asked.append(1)
        return len(asked) == chunks

    result = tiny.create_completion(ids, max_tokens=5, should_stop=stop_before_the_last_chunk, **GREEDY)
    assert len(asked) == chunks
    assert result.stop_reason == "interrupted" and result.tokens == [] and result.text == ""
    assert tiny.input_ids == before and tiny.timings.prompt_tokens == 0

    asked.clear()

    def ctrl_c_before_the_last_chunk():
        asked.append(1)
        if len(asked) == chunks:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        tiny.create_completion(ids, max_tokens=5, should_stop=ctrl_c_before_the_last_chunk, **GREEDY)
    assert tiny.input_ids == before
    # stopping while decoding keeps what was generated
    n = [0]

    def after_three_tokens():
        n[0] += 1
        return n[0] > chunks + 2  # one check before each prompt chunk, then one after each token

    result = tiny.create_completion(ids, max_tokens=50, should_stop=after_three_tokens, **GREEDY)
    assert result.stop_reason == "interrupted" and len(result.tokens) == 3
    assert tiny.input_ids == ids + result.tokens[:-1]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_logits_stop_with_an_error_naming_the_step(tiny_chat_model, value):
    model = tiny_model(tiny_chat_model, wrap=lambda s: FaultySession(s, at=3, value=value))
    ids = model.tokenize("hello")
    with pytest.raises(NonFiniteLogitsError, match=r"step 3 \(after generated token 2\) are not finite"):
        model.create_completion(ids, max_tokens=10, **GREEDY)
    assert model.n_tokens == 0  # taken back out: the cache is as before the call
    good = model.create_completion(ids, max_tokens=10, **GREEDY)  # the next call works (step 3 is past)
    assert good.tokens == manual_greedy(tiny_model(tiny_chat_model), ids, 10)
    model = tiny_model(tiny_chat_model, wrap=lambda s: FaultySession(s, at=3, value=value))
    stream = model.create_completion(ids, max_tokens=10, stream=True, **GREEDY)
    got = [next(stream).tokens, next(stream).tokens]
    assert got == [[good.tokens[0]], [good.tokens[1]]]
    with pytest.raises(NonFiniteLogitsError, match="step 3"):
        next(stream)
    model = tiny_model(tiny_chat_model, wrap=lambda s: FaultySession(s, at=1, value=value))
    with pytest.raises(NonFiniteLogitsError, match=r"step 1 \(the prompt of 5 tokens\)"):
        list(model.generate(ids, max_tokens=3))


def test_starting_a_generation_ends_an_unfinished_stream(tiny):
    first = tiny.create_completion("hello", max_tokens=20, stream=True, **GREEDY)
    next(first)
    second = tiny.create_completion("other", max_tokens=3, **GREEDY)
    assert list(first) == [] and len(second.tokens) <= 3
    assert tiny.input_ids[:len(tiny.tokenize("other"))] == tiny.tokenize("other")


def test_a_stream_running_in_another_thread_is_not_taken_over(tiny_chat_model):
    entered, release = threading.Event(), threading.Event()

    class Blocking(WrappedSession):
        def step(self, tokens, all_logits=False):
            if self.calls == 1:
                entered.set()
                release.wait(30)
            return super().step(tokens, all_logits)

    model = tiny_model(tiny_chat_model, wrap=Blocking)
    stream = model.create_completion("hello", max_tokens=5, stream=True, **GREEDY)
    worker = threading.Thread(target=lambda: list(stream))
    worker.start()
    entered.wait(30)
    try:
        with pytest.raises(NanocompileError, match="generating in another thread"):
            model.create_completion("hi", max_tokens=2)
    finally:
        release.set()
        worker.join(30)
    assert model.create_completion("hi", max_tokens=2, **GREEDY).tokens


# input ----------------------------------------------------------------------------------------------

def test_tokenize_and_detokenize(tiny, real_model, real_compiled):
    assert tiny.detokenize(tiny.tokenize("héllo wörld")) == "héllo wörld"
    assert tiny.tokenize(b"abc") == tiny.tokenize("abc")
    end = "<|im_end|>"
    assert tiny.tokenize(end) == [tiny.tokenizer.token_id(end)]
    assert tiny.tokenize(end, special=False) == tiny.tokenize("<|im_end") + tiny.tokenize("|>")
    assert tiny.detokenize(tiny.tokenize("a" + end), special=False) == "a"
    model = Model.from_session(real_model, real_compiled)
    assert model.tokenize("def f(): pass") == real_model.tokenizer.encode("def f(): pass")
    with pytest.raises(InputError, match="not UTF-8"):
        tiny.tokenize(b"\xff\xfe")
    with pytest.raises(InputError, match="outside the vocabulary"):
        tiny.detokenize([1, 300])


@pytest.mark.parametrize("call, error, message", [
    (lambda m: m.create_completion(""), InputError, "the prompt is empty"),
    (lambda m: m.create_completion([1, 2, 300]), InputError, "token id 300 at position 2 is outside"),
    (lambda m: m.create_completion([5] * 257), ContextFullError, "257 tokens, more than the context of 256"),
    (lambda m: m.create_completion("x", temperature="hot"), InputError, "temperature must be a number"),
    (lambda m: m.create_completion("x", top_p=0), InputError, r"^top_p must be in \(0, 1\]"),
    (lambda m: m.create_completion("x", max_tokens=2.5), InputError, "max_tokens must be an integer"),
    (lambda m: m.create_completion("x", stop=[3]), InputError, "stop must be a string or a list of strings"),
    (lambda m: m.create_completion("x", suffix="y"), InputError, "has no fill-in-the-middle tokens"),
    (lambda m: m.create_completion("x", logprobs=21), InputError, "logprobs must be an integer from 0 to 20"),
    (lambda m: m.create_completion("x", logprobs=True), InputError, "logprobs must be an integer from 0 to 20"),
    (lambda m: m.create_chat_completion([{"role": "user", "content": "x"}], top_logprobs=2), InputError,
     "top_logprobs needs logprobs=True"),
    (lambda m: m.create_chat_completion([{"role": "user", "content": "x"}], logprobs=True, top_logprobs=-1),
     InputError, "top_logprobs must be an integer from 0 to 20"),
    (lambda m: m.create_chat_completion([]), InputError, "no messages"),
    (lambda m: m.create_chat_completion([{"role": "user"}]), InputError, "message 0 must have a role and a content"),
])
def test_bad_input_is_refused_with_a_clear_message(tiny, call, error, message):
    tiny.eval([1, 2, 3])
    with pytest.raises(error, match=message):
        call(tiny)
    assert tiny.input_ids == [1, 2, 3]  # nothing changed


def test_bad_arguments_when_loading(tmp_path):
    with pytest.raises(InputError, match=r"precision 'f16' is not supported \(choose from auto, f32"):
        Model("default", precision="f16")
    with pytest.raises(InputError, match="n_threads must be an integer of at least 1"):
        Model("default", n_threads=0)
    with pytest.raises(ModelError, match="no such file or directory"):
        nanocompile.load(tmp_path / "missing.gguf")


def test_the_default_precision_follows_the_file(tmp_path, capsys):
    """precision "auto" (the default): native for a GGUF storing any matrix in blocks (a tensor of a
    type native does not run as stored, IQ4_NL here, alone requantized to Q8_0, with one note), f32
    for a GGUF with float matrices only and for a Hugging Face directory."""
    from bench.support.tiny import random_weights, tiny_config, write_gguf, write_hf_dir

    cfg = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=300)
    w = random_weights(cfg)
    types = {n: "Q8_0" for n, a in w.items() if a.ndim == 2}
    blocks = write_gguf(tmp_path / "q8.gguf", cfg, w, tensor_types=types)
    mixed = write_gguf(tmp_path / "mixed.gguf", cfg, w,
                       tensor_types=dict(types, **{"model.layers.1.mlp.up_proj.weight": "IQ4_NL"}))
    floats = write_gguf(tmp_path / "f32.gguf", cfg, w, quantize=False)
    hf = write_hf_dir(tmp_path / "hf", cfg, w)
    for path, want in ((blocks, "native"), (mixed, "native"), (floats, "f32"), (hf, "f32")):
        assert Model(path, backend="interp", progress=False).precision == want, path
    notes = [line for line in capsys.readouterr().err.splitlines() if "requantized to Q8_0" in line]
    assert notes == ["nanocompile: native: 1 tensor(s) of a type with no exact native form are requantized to Q8_0 "
                     "(IQ4_NL: model.layers.1.mlp.up_proj.weight)"], notes
    assert Model(blocks, backend="interp", progress=False, precision="int8").precision == "int8"


# the real model ---------------------------------------------------------------------------------------

def test_fill_in_the_middle_on_the_real_model(real_model, real_compiled):
    model = Model.from_session(real_model, real_compiled)
    tok = real_model.tokenizer
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    ids = model.fim_prompt(prefix, suffix)
    assert ids == ([tok.token_id("<|fim_prefix|>")] + tok.encode(prefix) + [tok.token_id("<|fim_suffix|>")]
                   + tok.encode(suffix) + [tok.token_id("<|fim_middle|>")])
    middle = model.create_completion(prefix, suffix=suffix, max_tokens=6, **GREEDY)
    assert middle.text.startswith("return a + b")
    assert middle.tokens == manual_greedy(model, ids, 6)


def test_the_example_in_the_api_docs_runs(real_model, tmp_path):
    doc = Path(__file__).parent.parent / "docs" / "API.md"
    code = re.search(r"```python\n(.*?)```", doc.read_text(), re.S).group(1)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "'return a + b" in r.stdout and "def quicksort" not in r.stderr


def test_truncating_the_compiled_kv_cache_is_exact(real_model, real_compiled):
    """What prefix reuse stands on: after truncate(n), the cache is bitwise what feeding the first
    n tokens alone leaves, and a refused truncate changes nothing."""
    tok = real_model.tokenizer
    common, first, second = (tok.encode(t) for t in ("def area(r):\n", "    return 3.14 * r * r", "    import math"))
    s = real_compiled
    s.reset()
    s.step(common + first)
    s.truncate(len(common))
    assert s.past == len(common) and s.tokens == common
    reused = s.step(second)
    s.reset()
    assert np.array_equal(reused, s.step(common + second))
    with pytest.raises(InputError, match=r"truncate: 99 is outside 0\.\.%d" % s.past):
        s.truncate(99)
    assert s.tokens == common + second
    s.reset()
