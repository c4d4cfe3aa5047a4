"""The command line as a llama-cli / llama-bench user meets it: every command run as a
subprocess, chat through a pseudo-terminal, and each kind of bad input."""
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf

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
    (["run", "-p", "x", "--precision", "int4"], 2, "invalid choice: 'int4'"),
    (["run", "-p", "x", "-n", "-5"], 1, "-n must be -1"),
])
def test_bad_flags_get_a_clear_message(args, status, message):
    r = nc(*args, check=False)
    assert r.returncode == status and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_command_line_loads_numpy_only_after_setting_blas_threads():
    # OpenBLAS reads OPENBLAS_NUM_THREADS once, when NumPy loads: -t must come first
    code = "import sys, nanocompile.cli; print('numpy' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


@pytest.mark.c
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


@pytest.mark.c
def test_a_context_that_fills_stops_cleanly_and_says_so(tiny):
    path, env = tiny
    r = nc("run", "-q", "-m", path, "-c", "16", "-n", "-1", "--prompt-ids", "5 6 7 8", "--ids", "--temp", "0",
           env=env)
    assert "stopped: the context of 16 tokens is full" in r.stderr
    assert len(r.stdout.split()) == 16 - 4 + 1  # the last token is chosen, never fed


@pytest.mark.model
def test_ctrl_c_stops_generation_cleanly(real_model):
    p = subprocess.Popen([*NC, "run", "-q", "-p", "Count from 1 to 1000:", "-n", "2000", "--temp", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.read(8)  # generation has started
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert first and p.returncode == 130, err
    assert "stopped: interrupted" in err and "generation:" in err and "Traceback" not in err


@pytest.mark.slow
def test_non_finite_logits_stop_with_an_error_naming_the_step(tiny, tmp_path):
    """Finite weights whose attention scores overflow float32 (each q.k term is 1e20 x 1e20): the
    logits are NaN, and no token (least of all token 0) is printed as an answer."""
    _, env = tiny
    cfg = tiny_config(vocab=300, max_pos=256)
    weights = random_weights(cfg)
    weights["model.layers.0.self_attn.q_proj.bias"][:] = 1e20
    weights["model.layers.0.self_attn.k_proj.bias"][:] = 1e20
    path = write_gguf(tmp_path / "overflow.gguf", cfg, weights, quantize=False)
    for backend in ("compiled", "interp"):
        r = nc("run", "-q", "-m", str(path), "--backend", backend, "--prompt-ids", "5 6 7", "-n", "4", "--ids",
               "--temp", "0", env=env, check=False)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "error: the logits of step 1 (the prompt of 3 tokens) are not finite" in r.stderr, r.stderr
        assert r.stdout.strip() == "", r.stdout


@pytest.mark.slow
def test_chat_ends_cleanly_when_standard_input_is_closed_or_empty(tiny):
    path, env = tiny
    closed = subprocess.run([*NC, "chat", "-q", "-m", path], env=env, capture_output=True, text=True, timeout=300,
                            preexec_fn=lambda: os.close(0))
    assert closed.returncode == 0 and "standard input is closed" in closed.stderr, closed.stderr
    assert "Traceback" not in closed.stderr
    empty = nc("chat", "-q", "-m", path, env=env, stdin="")
    assert empty.stdout == "" and "Traceback" not in empty.stderr


# bench, compile, info ----------------------------------------------------------------------------

@pytest.mark.c
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


@pytest.mark.c
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

@pytest.mark.c
def test_same_seed_same_text_on_a_tiny_model(tiny):
    path, env = tiny
    args = ("run", "-q", "-m", path, "-p", "hello there", "-n", "12", "--ids", "--temp", "1.5", "--top-k", "0",
            "--top-p", "1", "--min-p", "0", "-s", "7")
    a, b = nc(*args, env=env), nc(*args, "-t", "3", env=env)
    assert a.stdout == b.stdout and "seed 7" in a.stderr


@pytest.mark.slow
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

@pytest.mark.c
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
        # a terminal of 24 x 80, as a user's would be (a pseudo-terminal starts at 0 x 0, where
        # progress bars draw nothing)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
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


@pytest.mark.model
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
    and the logits after them are those of feeding the whole conversation at once (bitwise)."""
    import numpy as np

    from nanocompile import Model

    model = Model.from_session(real_model, real_compiled)
    model.reset()
    messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
    first_prompt = model.chat_prompt(messages)
    first = model.create_chat_completion(messages, max_tokens=12, temperature=0)
    assert (first.timings.cached_tokens, first.timings.prompt_tokens) == (0, len(first_prompt))
    cached = model.input_ids
    assert cached == first_prompt + first.tokens[:-1]  # the last token is chosen, not fed
    messages += [{"role": "assistant", "content": first.message.content}, {"role": "user", "content": "Another one."}]
    whole = model.chat_prompt(messages)
    second = model.create_chat_completion(messages, max_tokens=1, temperature=0)
    assert whole[:len(cached)] == cached and second.timings.cached_tokens == len(cached)
    assert second.timings.prompt_tokens == len(whole) - len(cached) < 20
    model.reset()
    model.eval(cached)
    reused = model.eval(whole[len(cached):])
    model.reset()
    assert np.array_equal(reused, model.eval(whole))
    assert second.tokens[0] == int(np.argmax(reused))


def digits(n: int) -> str:
    """n digits, each one token for Qwen2's tokenizer: a prompt of known length that takes a while."""
    return "".join(str(i * 7919 % 10) for i in range(n))


def test_ctrl_c_while_a_long_prompt_is_read(real_model, tmp_path):
    """The prompt goes in chunks with a progress bar (on stderr, after a second); Ctrl-C stops it
    between two chunks: nothing generated, exit status 130."""
    prompt = tmp_path / "long.txt"
    prompt.write_text(digits(2000))
    assert len(real_model.tokenizer.encode(prompt.read_text())) == 2000
    t = Terminal([*NC, "run", "-f", str(prompt), "-n", "8", "--temp", "0"])
    t.read_until(b"tok/s]")  # the bar: "prompt:  22%|...| 448/2000 [00:01<00:04, 310.2tok/s]"
    t.type(b"\x03")
    screen = t.read_until(b"stopped: interrupted while reading the prompt")
    assert b"prompt:" in screen and t.wait() == 130


def test_chat_ctrl_c_while_a_long_message_is_read_keeps_the_conversation(real_model, real_compiled):
    """Ctrl-C while a long message's prompt is processed drops the message and leaves the KV cache
    as it was: the next question is answered as in a fresh conversation (as the API answers it)."""
    from nanocompile import Model

    question = "What is the capital of France?"
    want = Model.from_session(real_model, real_compiled).create_chat_completion(
        [{"role": "user", "content": question}], max_tokens=10, temperature=0).message.content
    t = Terminal([*NC, "chat", "-n", "10", "--temp", "0"])
    t.read_until(b"> ")
    t.type(digits(2000).encode() + b"\r")
    t.read_until(b"tok/s]")
    t.type(b"\x03")
    t.read_until(b"the message is dropped)\r\n> ")
    t.screen = b""
    t.type(question.encode() + b"\r")
    screen = t.read_until(b"\r\n> ")
    answer = screen.split(question.encode(), 1)[1].rsplit(b"> ", 1)[0]
    assert want.encode() in answer.replace(b"\r\n", b"\n"), (want, answer)
    t.type(b"/exit\r")
    assert t.wait() == 0
