"""`nanocompile run`: generate from a prompt, streaming, as llama-cli does."""
from __future__ import annotations

import signal
import sys

from ..errors import NanocompileError
from .common import add_model_flags, add_sampling_flags, open_model_session, sampler_from, set_blas_threads


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise NanocompileError(f"--prompt-ids wants integers separated by spaces, got {text!r}") from None


def read_prompt(args) -> str:
    if args.prompt is None and args.file is None:
        raise NanocompileError("no prompt: give -p TEXT, -f FILE or --prompt-ids")
    if args.file is None:
        return args.prompt
    try:
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise NanocompileError(f"{args.file}: cannot read prompt file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise NanocompileError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from None


class Interrupted(Exception):
    """Ctrl-C between two tokens: the step in flight finishes, then generation stops."""


class StopOnInterrupt:
    """While active, SIGINT sets a flag that check() turns into Interrupted at the next token,
    so a step of the library is never cut in half."""

    def __init__(self):
        self.hit = False

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.hit = True

    def check(self) -> None:
        if self.hit:
            self.hit = False
            raise Interrupted()

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)
        return False


def write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def report(result, session, sampler) -> None:
    print(f"prompt: {result.prompt_tokens} tokens, {result.prompt_seconds * 1000:.1f} ms, "
          f"{result.prompt_tps:.2f} tok/s | generation: {len(result.tokens)} tokens, "
          f"{result.decode_tps:.2f} tok/s | backend {session.backend_name} | seed {sampler.seed}", file=sys.stderr)


def cmd_run(args) -> int:
    from ..generate_text import GenerationResult, TextStream, generate

    set_blas_threads(args.threads)
    sampler = sampler_from(args)  # bad flags are refused before the model loads
    if args.n_predict < -1:
        raise NanocompileError(f"-n must be -1 (until end of text) or >= 0, got {args.n_predict}")
    if args.prompt_ids is None:
        text = read_prompt(args)
    model, session = open_model_session(args, args.ctx_size)
    tok = model.tokenizer
    if args.prompt_ids is not None:
        prompt_ids = parse_ids(args.prompt_ids)
    else:
        if tok is None:
            raise NanocompileError(f"{model.source} has no tokenizer; use --prompt-ids")
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": text})
            text = tok.render_chat(messages)
        prompt_ids = tok.encode(text)
    if not prompt_ids:
        raise NanocompileError("the prompt is empty")

    stop = set(tok.eos_ids) if tok else set()
    stream = None if args.ids or tok is None else TextStream(tok, write_out)
    produced: list[int] = []
    with StopOnInterrupt() as interrupt:
        def on_token(token):
            produced.append(token)
            if stream is not None and token not in stop:  # like llama-cli: end of text is not printed
                stream(token)
            interrupt.check()

        sampler.accept(prompt_ids)
        try:
            result = generate(session, prompt_ids, args.n_predict, stop, on_token, sampler)
        except Interrupted:
            result = GenerationResult(prompt_tokens=len(prompt_ids), tokens=produced, stop_reason="interrupted")
    if args.ids:
        write_out(" ".join(str(t) for t in result.tokens) + "\n")
    else:
        if stream is not None:
            stream.flush()
        write_out("\n")
    if result.stop_reason == "context":
        print(f"stopped: the context of {session.n_ctx} tokens is full (-c sets its size)", file=sys.stderr)
    if result.stop_reason == "interrupted":
        print("stopped: interrupted", file=sys.stderr)
    report(result, session, sampler)
    return 130 if result.stop_reason == "interrupted" else 0


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="generate text from a prompt")
    add_model_flags(run)
    run.add_argument("-p", "--prompt", help="prompt text")
    run.add_argument("-f", "--file", help="read the prompt from this file")
    run.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate (-1: until end of text "
                                                                     "or a full context)")
    run.add_argument("-c", "--ctx-size", type=int, help="context size in tokens (default: 4096 or the model's maximum)")
    add_sampling_flags(run)
    run.add_argument("--chat", action="store_true", help="apply the model's chat template")
    run.add_argument("--system", help="system message (with --chat)")
    run.add_argument("--prompt-ids", help="token ids instead of a prompt, e.g. '1 2 3'")
    run.add_argument("--ids", action="store_true", help="print generated token ids instead of text")
    run.set_defaults(func=cmd_run)
