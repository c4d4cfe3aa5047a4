"""`nanocompile chat`: a multi-turn conversation in the model's own chat template.

The KV cache is kept between turns: each turn feeds only the tokens the cache does not hold yet
(the new user message, in the template), when the conversation re-renders to the tokens already
cached followed by new ones; otherwise (a reply that re-tokenizes differently) it starts the
cache over from the whole conversation. Ctrl-C during an answer stops it after the current
token and keeps the conversation (the partial answer is part of it); at the prompt, it drops
the line. /exit or end of input leaves, /reset starts over.
"""
from __future__ import annotations

import sys

from ..errors import ContextFullError, NanocompileError
from .common import add_model_flags, add_sampling_flags, open_model_session, sampler_from, set_blas_threads
from .run import Interrupted, StopOnInterrupt, write_out

HELP = "/exit or Ctrl-D leaves, /reset starts over, Ctrl-C stops an answer"


class Conversation:
    def __init__(self, tokenizer, session, system: str | None):
        self.tok, self.session, self.system = tokenizer, session, system
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.cached: list[int] = []  # the tokens in the session's KV cache, in order
        self.session.reset()

    def pending(self) -> list[int]:
        """Tokens to feed for the conversation so far (ending in the assistant's turn)."""
        ids = self.tok.encode(self.tok.render_chat(self.messages))
        n = len(self.cached)
        if n and ids[:n] == self.cached and len(ids) > n:
            return ids[n:]
        self.session.reset()
        self.cached = []
        return ids

    def answered(self, fed: list[int], answer: list[int], stop) -> None:
        """Records a turn: the tokens fed, and the answer (its last token is chosen but not yet
        fed: the next turn's tokens begin with it)."""
        self.cached += fed + answer[:-1]
        self.messages.append({"role": "assistant", "content": self.tok.decode([t for t in answer if t not in stop])})


def cmd_chat(args) -> int:
    from ..generate_text import TextStream, generate

    set_blas_threads(args.threads)
    sampler = sampler_from(args)
    if args.n_predict < -1:
        raise NanocompileError(f"-n must be -1 (until end of text) or >= 0, got {args.n_predict}")
    model, session = open_model_session(args, args.ctx_size)
    tok = model.tokenizer
    if tok is None or not tok.chat_template:
        raise NanocompileError(f"{model.source} has no chat template; use nanocompile run")
    chat = Conversation(tok, session, args.system)
    stop = set(tok.eos_ids)
    terminal = sys.stdin.isatty()
    print(f"chat: {HELP}", file=sys.stderr)
    while True:
        try:
            line = input("> ") if terminal else sys.stdin.readline()
        except KeyboardInterrupt:
            print("", file=sys.stderr)
            continue
        except EOFError:
            line = ""
            if terminal:
                print("", file=sys.stderr)
            break
        if not terminal and line == "":
            break
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            break
        if text == "/reset":
            chat.reset()
            print("(the conversation starts over)", file=sys.stderr)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}: {HELP}", file=sys.stderr)
            continue
        chat.messages.append({"role": "user", "content": text})
        feed = chat.pending()
        if session.past + len(feed) >= session.n_ctx:
            chat.messages.pop()
            print(f"(this message does not fit in what is left of the context of {session.n_ctx} tokens: "
                  f"/reset to start over, or a larger -c)", file=sys.stderr)
            continue
        answer: list[int] = []
        stream = TextStream(tok, write_out)
        with StopOnInterrupt() as interrupt:
            def on_token(token):
                answer.append(token)
                if token not in stop:
                    stream(token)
                interrupt.check()

            sampler.accept(feed)
            reason = ""
            try:
                reason = generate(session, feed, args.n_predict, stop, on_token, sampler).stop_reason
            except Interrupted:
                reason = "interrupted"
            except ContextFullError as e:
                reason = str(e)
        stream.flush()
        write_out("\n")
        chat.answered(feed, answer, stop)
        if reason == "interrupted":
            print("(answer stopped)", file=sys.stderr)
        elif reason == "context":
            print(f"(the context of {session.n_ctx} tokens is full: /reset to start over)", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    chat = sub.add_parser("chat", help="talk with the model, turn by turn")
    add_model_flags(chat)
    chat.add_argument("-n", "--n-predict", type=int, default=-1,
                      help="most tokens per answer (-1: until the end of the turn or a full context)")
    chat.add_argument("-c", "--ctx-size", type=int, help="context size in tokens (default: 4096 or the model's maximum)")
    chat.add_argument("--system", help="system message")
    add_sampling_flags(chat)
    chat.set_defaults(func=cmd_chat)
