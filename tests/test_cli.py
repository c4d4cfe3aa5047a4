"""`nanocompile run` as a user runs it: a subprocess, on the real model and on a tiny GGUF."""
import subprocess
import sys

from model_files import random_weights, tiny_config, write_gguf


def _run(*args):
    r = subprocess.run([sys.executable, "-m", "nanocompile", "run", "-q", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def test_ids_match_greedy_interpreter_on_real_model(real_model, real_session):
    from nanocompile.generate_text import generate

    ids = real_model.tokenizer.encode("def add(a, b):")
    real_session.reset()
    want = generate(real_session, ids, 8, set(real_model.tokenizer.eos_ids)).tokens
    r = _run("-p", "def add(a, b):", "-n", "8", "--ids")
    assert [int(t) for t in r.stdout.split()] == want
    assert "backend compiled" in r.stderr  # the default
    r = _run("--prompt-ids", " ".join(map(str, ids)), "-n", "8", "--ids", "--backend", "interp")
    assert [int(t) for t in r.stdout.split()] == want
    assert "tok/s" in r.stderr and "prompt:" in r.stderr and "backend interp" in r.stderr


def test_text_streams_and_matches_decode(real_model, real_session):
    from nanocompile.generate_text import generate

    tok = real_model.tokenizer
    text = tok.render_chat([{"role": "user", "content": "Say hello in French."}])
    real_session.reset()
    want = generate(real_session, tok.encode(text), 12, set(tok.eos_ids)).tokens
    r = _run("--chat", "-p", "Say hello in French.", "-n", "12")
    expected = tok.decode([t for t in want if t not in tok.eos_ids])
    assert r.stdout.rstrip("\n") == expected


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
