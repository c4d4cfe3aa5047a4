"""The command line as a llama-cli / llama-bench user meets it: every command run as a
subprocess, chat through a pseudo-terminal, and each kind of bad input."""
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from model_files import random_weights, tiny_config, write_gguf

NC = [sys.executable, "-m", "nanocompile"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny GGUF (with a tokenizer and chat template) and a cache of its own, shared by the
    tests of this module so the tiny library is built once."""
    d = tmp_path_factory.mktemp("cli")
    cfg = tiny_config(vocab=300, max_pos=256)
    path = write_gguf(d / "tiny.gguf", cfg, random_weights(cfg), quantize=False)
    return str(path), {**os.environ, "NANOCOMPILE_CACHE": str(d / "cache")}


def nc(*args, env=None, stdin=None, check=True):
    r = subprocess.run([*NC, *args], capture_output=True, text=True, env=env, input=stdin, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


# bad input ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, status, message", [
    (["run", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["run", "-t", "0", "-p", "x"], 2, "threads must be at least 1, got 0"),
    (["run", "-t", "-3", "-p", "x"], 2, "threads must be at least 1, got -3"),
    (["run", "-t", "two", "-p", "x"], 2, "threads must be an integer"),
    (["bench", "-p", "a,b"], 2, "want integers separated by commas"),
    (["run", "-p", "x", "--precision", "int8"], 1, "only f32 is supported so far"),
    (["run", "-p", "x", "-n", "-5"], 1, "-n must be -1"),
])
def test_bad_flags_get_a_clear_message(args, status, message):
    r = nc(*args, check=False)
    assert r.returncode == status and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_bad_input_on_a_model(tiny, tmp_path):
    path, env = tiny
    cases = [(["-c", "1000", "-p", "hi"], "context size 1000 exceeds the model's maximum of 256"),
             (["-c", "0", "-p", "hi"], "context size must be a positive integer"),
             (["-p", ""], "the prompt is empty"),
             (["-f", str(tmp_path / "missing.txt")], "missing.txt: cannot read prompt file"),
             (["--prompt-ids", "1 x 3"], "--prompt-ids wants integers"),
             (["--prompt-ids", "1 999"], "token id 999 at position 1 is outside the vocabulary")]
    for args, message in cases:
        r = nc("run", "-q", "-m", path, *args, env=env, check=False)
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    r = nc("run", "-q", "-m", str(tmp_path / "nothing.gguf"), "-p", "hi", env=env, check=False)
    assert r.returncode == 1 and "no such file or directory" in r.stderr


def test_a_context_that_fills_stops_cleanly_and_says_so(tiny):
    path, env = tiny
    r = nc("run", "-q", "-m", path, "-c", "16", "-n", "-1", "--prompt-ids", "5 6 7 8", "--ids", "--temp", "0",
           env=env)
    assert "stopped: the context of 16 tokens is full" in r.stderr
    assert len(r.stdout.split()) == 16 - 4 + 1  # the last token is chosen, never fed


def test_ctrl_c_stops_generation_cleanly(real_model):
    p = subprocess.Popen([*NC, "run", "-q", "-p", "Count from 1 to 1000:", "-n", "2000", "--temp", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.read(8)  # generation has started
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert first and p.returncode == 130, err
    assert "stopped: interrupted" in err and "generation:" in err and "Traceback" not in err


# bench, compile, info ----------------------------------------------------------------------------

def test_bench_formats(tiny):
    path, env = tiny
    rows = json.loads(nc("bench", "-q", "-m", path, "-p", "8,16", "-n", "4", "-r", "2", "-t", "1,2", "-o", "json",
                         env=env).stdout)
    assert [(r["test"], r["threads"]) for r in rows] == [("pp8", 1), ("pp16", 1), ("tg4", 1), ("pp8", 2),
                                                         ("pp16", 2), ("tg4", 2)]
    assert all(len(r["samples_ts"]) == 2 and r["avg_ts"] > 0 and r["backend"] == "compiled" for r in rows)
    csv = nc("bench", "-q", "-m", path, "-p", "8", "-n", "0", "-r", "1", "-o", "csv", env=env).stdout.splitlines()
    assert csv[0] == "model,size,params,precision,backend,threads,test,n_prompt,n_gen,avg_ts,stddev_ts" and len(csv) == 2
    md = nc("bench", "-q", "-m", path, "-p", "8", "-n", "2", "-r", "2", env=env).stdout.splitlines()
    assert md[0] == "| model | size | params | precision | backend | threads | test | t/s |" and len(md) == 4
    assert "| pp8 |" in md[2] and " ± " in md[2]


def test_compile_then_info(tiny, tmp_path):
    path, env = tiny
    env = {**env, "NANOCOMPILE_CACHE": str(tmp_path / "fresh")}  # nothing compiled or packed yet
    r = nc("compile", "-m", path, env=env)
    assert "building the library" in r.stderr and "packing weights" in r.stderr
    lib_line = next(line for line in r.stdout.splitlines() if line.startswith("library"))
    lib = lib_line.split()[1]
    assert os.path.exists(lib)
    weights = next(line for line in r.stdout.splitlines() if line.startswith("weights")).split()[1]
    assert os.path.exists(weights)
    again = nc("compile", "-m", path, env=env)
    assert "packed weights: already in the cache" in again.stderr
    info = nc("info", env=env).stdout
    assert "target    x86-64-v" in info and env["NANOCOMPILE_CACHE"] in info
    assert "hidden 40, 2 layers, 4/2 heads, vocab 300" in info and weights.split("/")[-1] in info


# run: sampling, reproducibility ------------------------------------------------------------------

def test_same_seed_same_text_on_a_tiny_model(tiny):
    path, env = tiny
    args = ("run", "-q", "-m", path, "-p", "hello there", "-n", "12", "--ids", "--temp", "1.5", "--top-k", "0",
            "--top-p", "1", "--min-p", "0", "-s", "7")
    a, b = nc(*args, env=env), nc(*args, "-t", "3", env=env)
    assert a.stdout == b.stdout and "seed 7" in a.stderr


def test_more_threads_than_cores_is_allowed_with_a_warning(tiny):
    path, env = tiny
    cores = len(os.sched_getaffinity(0))
    args = ("run", "-q", "-m", path, "--prompt-ids", "5 17 42", "-n", "24", "--ids", "--temp", "0")
    one, many = nc(*args, "-t", "1", env=env), nc(*args, "-t", str(cores + 3), env=env)
    assert many.stdout == one.stdout  # the same tokens, bitwise logits, on a pool that has to share cores
    warnings = [line for line in many.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: -t {cores + 3} is more threads than the {cores} cores this process can use; "
                        f"they will take turns on them"]
    assert not [line for line in one.stderr.splitlines() if line.startswith("warning:")]
    bench = nc("bench", "-m", path, "-p", "8", "-n", "4", "-r", "1", "-t", f"1,{cores + 1}", "-q", env=env)
    assert f"warning: -t {cores + 1} is more threads than the {cores} cores" in bench.stderr


# chat ---------------------------------------------------------------------------------------------

def test_chat_with_piped_input(tiny):
    path, env = tiny
    r = nc("chat", "-q", "-m", path, "--temp", "0", "-n", "4", env=env, stdin="hi\n/reset\nhello\n/nope\n/exit\nnever\n")
    assert "the conversation starts over" in r.stderr and "unknown command /nope" in r.stderr
    assert len(r.stdout.splitlines()) == 2  # two answers, then /exit: the last line is never read


class Terminal:
    """A child process on a pseudo-terminal: what a user types, what the screen shows."""

    def __init__(self, args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvp(args[0], args)
        self.screen = b""

    def read_until(self, text: bytes, timeout: float = 120) -> bytes:
        end = time.time() + timeout
        while text not in self.screen:
            left = end - time.time()
            assert left > 0, f"waited for {text!r}; the screen shows {self.screen[-500:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                assert chunk, f"the process ended; the screen shows {self.screen[-500:]!r}"
                self.screen += chunk
        return self.screen

    def wait_for_more(self, n: int, timeout: float = 120) -> None:
        """Until n more bytes have appeared."""
        want, end = len(self.screen) + n, time.time() + timeout
        while len(self.screen) < want:
            assert time.time() < end, f"no output; the screen shows {self.screen[-500:]!r}"
            if select.select([self.fd], [], [], 1)[0]:
                self.screen += os.read(self.fd, 4096)

    def type(self, text: bytes) -> None:
        os.write(self.fd, text)

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def test_chat_on_a_terminal_answers_as_run_does_and_survives_ctrl_c(real_model):
    question = "What is the capital of France?"
    want = nc("run", "-q", "--chat", "-p", question, "-n", "10", "--temp", "0").stdout.strip()
    t = Terminal([*NC, "chat", "-q", "-n", "400", "--temp", "0"])
    t.read_until(b"> ")
    t.screen = b""
    t.type(question.encode() + b"\r")
    screen = t.read_until(b"\r\n> ")
    answer = screen.split(question.encode(), 1)[1].rsplit(b"> ", 1)[0]
    assert want.encode() in answer.replace(b"\r\n", b"\n"), (want, answer)
    # a long answer, stopped by Ctrl-C: the conversation goes on
    t.type(b"/reset\r")
    t.read_until(b"starts over")
    t.screen = b""
    long = b"Write a long story about a dragon, at least 1000 words."
    t.type(long + b"\r")
    t.read_until(long + b"\r\n")
    t.wait_for_more(40)  # the answer is streaming
    t.type(b"\x03")
    t.read_until(b"(answer stopped)")
    t.read_until(b"> ")
    t.screen = b""
    t.type(b"Thanks.\r")
    t.read_until(b"\r\n> ")
    t.type(b"/exit\r")
    assert t.wait() == 0


def test_chat_feeds_only_the_new_tokens_of_each_turn(real_model, real_compiled):
    """The second turn reuses the KV cache: it feeds the conversation's tokens after those cached,
    and its logits are those of feeding the whole conversation at once."""
    import numpy as np

    from nanocompile.cli.chat import Conversation
    from nanocompile.generate_text import generate

    tok = real_model.tokenizer
    stop = set(tok.eos_ids)
    chat = Conversation(tok, real_compiled, "You are brief.")
    chat.messages.append({"role": "user", "content": "Name a colour."})
    first = chat.pending()
    assert first == tok.encode(tok.render_chat(chat.messages))
    answer = generate(real_compiled, first, 12, stop).tokens
    chat.answered(first, answer, stop)
    assert real_compiled.past == len(chat.cached)
    chat.messages.append({"role": "user", "content": "Another one."})
    second = chat.pending()
    whole = tok.encode(tok.render_chat(chat.messages))
    assert whole == chat.cached + second and len(second) < 20
    reused = real_compiled.step(second)
    real_compiled.reset()
    assert np.array_equal(reused, real_compiled.step(whole))
