"""`nanocompile run` as a user runs it: a subprocess, on the real model and on a tiny GGUF."""
import subprocess
import sys

import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf


def _run(*args):
    r = subprocess.run([sys.executable, "-m", "nanocompile", "run", "-q", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def test_ids_match_greedy_interpreter_on_real_model(real_model, real_session):
    from nanocompile.engine.stream import generate

    ids = real_model.tokenizer.encode("def add(a, b):")
    real_session.reset()
    want = generate(real_session, ids, 8, set(real_model.tokenizer.eos_ids)).tokens
    r = _run("-p", "def add(a, b):", "-n", "8", "--ids", "--temp", "0", "--precision", "f32")
    assert [int(t) for t in r.stdout.split()] == want
    assert "backend compiled" in r.stderr  # the default
    r = _run("--prompt-ids", " ".join(map(str, ids)), "-n", "8", "--ids", "--backend", "interp", "--temp", "0",
             "--precision", "f32")
    assert [int(t) for t in r.stdout.split()] == want
    assert "tok/s" in r.stderr and "prompt:" in r.stderr and "backend interp" in r.stderr


def test_text_streams_and_matches_decode(real_model, real_session):
    from nanocompile.engine.stream import generate

    tok = real_model.tokenizer
    text = tok.render_chat([{"role": "user", "content": "Say hello in French."}])
    real_session.reset()
    want = generate(real_session, tok.encode(text), 12, set(tok.eos_ids)).tokens
    r = _run("--chat", "-p", "Say hello in French.", "-n", "12", "--temp", "0", "--precision", "f32")
    expected = tok.decode([t for t in want if t not in tok.eos_ids])
    assert r.stdout.rstrip("\n") == expected


def test_a_quantized_gguf_runs_native_by_default(real_model):
    """No --precision: the default model's file stores every matrix in blocks native runs as
    stored (Q5_0, Q8_0, Q4_K, Q6_K), so it runs native; a GGUF of float matrices or a Hugging
    Face directory runs f32 (test_api.py)."""
    r = _run("-p", "def add(a, b):", "-n", "2", "--temp", "0")
    assert "precision native" in r.stderr and "requantized" not in r.stderr


@pytest.mark.slow
def test_bad_sampling_flags_are_refused_before_loading():
    for flags, message in ((("--top-p", "0"), "--top-p must be in (0, 1]"), (("--min-p", "2"), "--min-p must be"),
                           (("--top-k", "-1"), "--top-k must be >= 0"),
                           (("--repeat-penalty", "0"), "--repeat-penalty must be > 0"),
                           (("-s", "-5"), "--seed must be -1")):
        r = subprocess.run([sys.executable, "-m", "nanocompile", "run", "-q", "-m", "/nonexistent.gguf", "-p", "x",
                            *flags], capture_output=True, text=True)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, (flags, r.stderr)


@pytest.mark.c
def test_prompt_file_and_tiny_gguf(tmp_path, isolated_cache):
    import os
    cfg = tiny_config(vocab=300)
    path = write_gguf(tmp_path / "tiny.gguf", cfg, random_weights(cfg), quantize=False)
    (tmp_path / "prompt.txt").write_text("hello there")
    env = {**os.environ, "NANOCOMPILE_CACHE": str(isolated_cache)}
    r = subprocess.run([sys.executable, "-m", "nanocompile", "run", "-q", "-m", str(path), "-f",
                        str(tmp_path / "prompt.txt"), "-n", "5", "--ids"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) <= 5 and all(0 <= int(t) < 300 for t in r.stdout.split())


@pytest.mark.model
def test_same_seed_same_text_at_any_thread_count(real_model):
    """README's claim: sampled text depends on the seed alone, not on the thread count (the
    compiled logits are bitwise equal at every thread count)."""
    args = ("-p", "Once upon a time", "-n", "16", "--ids", "--temp", "1.0", "--top-k", "0", "--top-p", "1.0",
            "--min-p", "0")
    runs = [_run(*args, "-s", "1234", "-t", str(t)) for t in (2, 1, 3)]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout
    assert "seed 1234" in runs[0].stderr
    others = {_run(*args, "-s", str(seed)).stdout for seed in (1, 2, 3)}
    assert len(others | {runs[0].stdout}) > 1, "four seeds gave the same 16 tokens at temperature 1"
