"""`nanocompile run`: generate from a prompt, streaming, as llama-cli does."""
from __future__ import annotations

import signal
import sys

from ..errors import NanocompileError
from .common import (add_lookup_flags, add_model_flags, add_sampling_flags, open_model,
                     report, sampling_from, set_blas_threads)


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


class StopOnInterrupt:
    """While active, SIGINT sets a flag that the generation loop reads between prompt chunks and
    between tokens, so a step of the library is never cut in half."""

    def __init__(self):
        self.hit = False

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.hit = True

    def __call__(self) -> bool:
        return self.hit

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)
        return False


def write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_run(args) -> int:
    set_blas_threads(args.threads)
    sampling = sampling_from(args)  # bad flags are refused before the model loads
    if args.n_predict < -1:
        raise NanocompileError(f"-n must be -1 (until end of text) or >= 0, got {args.n_predict}")
    if args.prompt_ids is None:
        text = read_prompt(args)
    model = open_model(args, args.ctx_size)
    if args.prompt_ids is not None:
        prompt = parse_ids(args.prompt_ids)
    else:
        if model.tokenizer is None:
            raise NanocompileError(f"{model.loaded.source} has no tokenizer; use --prompt-ids")
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": text})
            prompt = model.chat_prompt(messages)
        else:
            prompt = model.tokenize(text)
    if not prompt:
        raise NanocompileError("the prompt is empty")

    show_text = not args.ids and model.tokenizer is not None
    tokens: list[int] = []
    with StopOnInterrupt() as interrupted:
        try:
            for chunk in model.create_completion(prompt, max_tokens=args.n_predict, stream=True,
                                                 should_stop=interrupted, **sampling):
                tokens += chunk.tokens
                if show_text and chunk.text:  # like llama-cli: end of text is not printed
                    write_out(chunk.text)
        except NanocompileError:  # what was generated before the fault is shown, then the error
            write_out((" ".join(str(t) for t in tokens) if args.ids else "") + "\n")
            raise
    write_out((" ".join(str(t) for t in tokens) if args.ids else "") + "\n")
    if chunk.stop_reason == "context":
        print(f"stopped: the context of {model.n_ctx} tokens is full (-c sets its size)", file=sys.stderr)
    if chunk.stop_reason == "interrupted":
        print("stopped: interrupted" + ("" if tokens else " while reading the prompt"), file=sys.stderr)
    report(model)
    return 130 if chunk.stop_reason == "interrupted" else 0


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="generate text from a prompt")
    add_model_flags(run)
    run.add_argument("-p", "--prompt", help="prompt text")
    run.add_argument("-f", "--file", help="read the prompt from this file")
    run.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate (-1: until end of text "
                                                                     "or a full context)")
    run.add_argument("-c", "--ctx-size", type=int, help="context size in tokens (default: 4096 or the model's maximum)")
    add_sampling_flags(run)
    add_lookup_flags(run)
    run.add_argument("--chat", action="store_true", help="apply the model's chat template")
    run.add_argument("--system", help="system message (with --chat)")
    run.add_argument("--prompt-ids", help="token ids instead of a prompt, e.g. '1 2 3'")
    run.add_argument("--ids", action="store_true", help="print generated token ids instead of text")
    run.set_defaults(func=cmd_run)
