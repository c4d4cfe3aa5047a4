"""`nanocompile chat`: a multi-turn conversation in the model's own chat template.

Built on the API's create_chat_completion, whose KV cache keeps the conversation: each turn feeds
only the tokens after those already cached (the new user message, in the template). Ctrl-C during
an answer stops it after the current token and keeps the conversation (the partial answer is part
of it); during a long message's prompt, it drops the message and leaves the cache as it was; at
the prompt, it drops the line. /exit or end of input (Ctrl-D, a closed or finished standard
input) leaves, /reset starts over.
"""
from __future__ import annotations

import sys

from ..errors import ContextFullError, NanocompileError
from .common import (add_lookup_flags, add_model_flags, add_sampling_flags, open_model,
                     sampling_from, set_blas_threads)
from .run import StopOnInterrupt, write_out

HELP = "/exit or Ctrl-D leaves, /reset starts over, Ctrl-C stops an answer"


def read_line(terminal: bool) -> str | None:
    """The next line typed or piped in; None at the end of input (or a closed or broken one)."""
    try:
        if terminal:
            return input("> ")
        line = sys.stdin.readline()
        return line if line else None
    except EOFError:
        if terminal:
            print("", file=sys.stderr)
        return None
    except (OSError, ValueError):  # the terminal hung up, or the stream was closed under us
        return None


def cmd_chat(args) -> int:
    set_blas_threads(args.threads)
    sampling = sampling_from(args)
    if args.n_predict < -1:
        raise NanocompileError(f"-n must be -1 (until end of text) or >= 0, got {args.n_predict}")
    if sys.stdin is None or sys.stdin.closed:
        print("chat: standard input is closed; nothing to answer", file=sys.stderr)
        return 0
    model = open_model(args, args.ctx_size)
    if model.tokenizer is None or not model.tokenizer.chat_template:
        raise NanocompileError(f"{model.loaded.source} has no chat template; use nanocompile run")
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    terminal = sys.stdin.isatty()
    print(f"chat: {HELP}", file=sys.stderr)
    while True:
        try:
            line = read_line(terminal)
        except KeyboardInterrupt:
            print("", file=sys.stderr)
            continue
        if line is None:
            break
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            break
        if text == "/reset":
            messages = list(start)
            model.reset()
            print("(the conversation starts over)", file=sys.stderr)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}: {HELP}", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": text})
        answer: list[str] = []
        reason = ""
        with StopOnInterrupt() as interrupted:
            try:
                for chunk in model.create_chat_completion(messages, max_tokens=args.n_predict, stream=True,
                                                          should_stop=interrupted, **sampling):
                    answer.append(chunk.content)
                    write_out(chunk.content)
                    reason = chunk.stop_reason or reason
            except ContextFullError:
                messages.pop()
                print(f"(this message does not fit in the context of {model.n_ctx} tokens: /reset to start over, "
                      f"or a larger -c)", file=sys.stderr)
                continue
            except NanocompileError:
                write_out("\n")
                raise
        if reason == "interrupted" and not model.timings.generated_tokens:
            messages.pop()  # stopped while reading the message: the cache is as it was before it
            print("(stopped before the answer; the message is dropped)", file=sys.stderr)
            continue
        write_out("\n")
        messages.append({"role": "assistant", "content": "".join(answer)})
        if reason == "interrupted":
            print("(answer stopped)", file=sys.stderr)
        elif reason == "context":
            print(f"(the context of {model.n_ctx} tokens is full: /reset to start over)", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    chat = sub.add_parser("chat", help="talk with the model, turn by turn")
    add_model_flags(chat)
    chat.add_argument("-n", "--n-predict", type=int, default=-1,
                      help="most tokens per answer (-1: until the end of the turn or a full context)")
    chat.add_argument("-c", "--ctx-size", type=int, help="context size in tokens (default: 4096 or the model's maximum)")
    chat.add_argument("--system", help="system message")
    add_sampling_flags(chat)
    add_lookup_flags(chat)
    chat.set_defaults(func=cmd_chat)
