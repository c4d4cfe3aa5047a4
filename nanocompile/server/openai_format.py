"""The API's results as OpenAI's JSON: completions, chat completions and their stream chunks (one
choice or several, each with its index), log-probabilities in the shape of each endpoint, usage,
and llama.cpp's `timings` extension. piece(token) -> bytes names a token (the tokenizer's
token_bytes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..engine.tools import CallStream, parse_calls
from ..results import Completion, CompletionChunk, Timings, TokenLogprob, ToolCall, Usage

Piece = Callable[[int], bytes]


@dataclass(frozen=True)
class Choice:
    """An item of a request's job: a result or a stream chunk of choice `index`."""
    index: int
    item: Any

    @property
    def tokens(self) -> list[int]:
        return self.item.tokens


def usage_json(u: Usage) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens}


def total_usage(usages: Sequence[Usage]) -> Usage:
    """The prompt is counted once: the choices after the first find it in the cache."""
    completion = sum(u.completion_tokens for u in usages)
    return Usage(usages[0].prompt_tokens, completion, usages[0].prompt_tokens + completion)


def timings_json(t: Timings) -> dict:
    """llama.cpp server's names: prompt_n counts the tokens fed (not those reused from the cache);
    grammar_ms (ours): the time generation waited for a grammar's masks."""
    return {"prompt_n": t.prompt_tokens, "prompt_ms": t.prompt_seconds * 1e3, "prompt_per_second": t.prompt_tps,
            "cache_n": t.cached_tokens, "predicted_n": t.generated_tokens, "predicted_ms": t.decode_seconds * 1e3,
            "predicted_per_second": t.decode_tps,
            **({"draft_n": t.drafted_tokens, "draft_n_accepted": t.accepted_tokens} if t.drafted_tokens else {}),
            **({"grammar_ms": t.mask_seconds * 1e3} if t.mask_seconds else {})}


def chat_id(completion_id: str) -> str:
    return completion_id.replace("cmpl-", "chatcmpl-", 1)


# log-probabilities --------------------------------------------------------------------------------

def _text(piece: Piece, token: int) -> str:
    return piece(token).decode("utf-8", errors="replace")


def completion_logprobs(logprobs: list[TokenLogprob] | None, piece: Piece, offset: int = 0) -> dict | None:
    """The completions endpoint's shape; offset: characters of the completion before these tokens."""
    if logprobs is None:
        return None
    texts = [_text(piece, lp.token) for lp in logprobs]
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": texts, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{_text(piece, t): v for t, v in lp.top} for lp in logprobs], "text_offset": offsets}


def chat_logprobs(logprobs: list[TokenLogprob] | None, piece: Piece) -> dict | None:
    """The chat endpoint's shape: each token with its bytes, and its alternatives likewise."""
    if logprobs is None:
        return None

    def entry(token: int, value: float) -> dict:
        raw = piece(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}

    return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in logprobs]}


# whole answers ------------------------------------------------------------------------------------

def _answer_head(results: Sequence[Completion]) -> dict:
    first = results[0]
    return {"id": first.id, "created": first.created, "model": first.model,
            "usage": usage_json(total_usage([r.usage for r in results])), "timings": timings_json(first.timings)}


def completion_body(results: Sequence[Completion], piece: Piece) -> dict:
    """One choice per result; llama.cpp's timings are the first choice's (it pays for the prompt)."""
    choices = [{"index": i, "text": r.text, "logprobs": completion_logprobs(r.logprobs, piece),
                "finish_reason": r.finish_reason} for i, r in enumerate(results)]
    return {"object": "text_completion", "choices": choices, **_answer_head(results)}


def tool_calls_json(calls: Sequence[ToolCall], indexed: bool = False) -> list[dict]:
    return [{**({"index": i} if indexed else {}), "id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]


def _finish(reason: str, calls) -> str:
    return "tool_calls" if calls and reason == "stop" else reason


def chat_body(results: Sequence[Completion], piece: Piece, tool_names=None) -> dict:
    """tool_names: the request's tools; each answer's calls of them become its tool_calls."""
    choices = []
    for i, r in enumerate(results):
        content, calls = parse_calls(r.text, tool_names) if tool_names else (r.text, [])
        message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls_json(calls)} if calls else {})}
        choices.append({"index": i, "message": message, "logprobs": chat_logprobs(r.logprobs, piece),
                        "finish_reason": _finish(r.finish_reason, calls)})
    head = _answer_head(results)
    return {**head, "id": chat_id(head["id"]), "object": "chat.completion", "choices": choices}


# stream chunks ------------------------------------------------------------------------------------

class StreamState:
    """What a stream remembers between chunks: which choices have begun, each one's characters so
    far (for text_offset), and the usage of those that have ended."""

    def __init__(self, tool_names=None):
        self.begun: set[int] = set()
        self.offsets: dict[int, int] = {}
        self.usages: list[Usage] = []
        self.tool_names = tool_names
        self.calls: dict[int, CallStream] = {}  # per choice, where the answer may call tools

    def usage_event(self, head: dict) -> dict:
        return {**head, "choices": [], "usage": usage_json(total_usage(self.usages))}


def _has_news(c: CompletionChunk) -> bool:
    """A token whose text is still held back sends nothing, unless its log-probability is asked for."""
    return bool(c.text) or c.stop_reason is not None or bool(c.logprobs)


def completion_events(choice: Choice, state: StreamState, piece: Piece) -> list[dict]:
    c: CompletionChunk = choice.item
    if not _has_news(c):
        return []
    offset = state.offsets.get(choice.index, 0)
    logprobs = completion_logprobs(c.logprobs, piece, offset)
    state.offsets[choice.index] = offset + len(c.text)
    event = {**chunk_head(c, chat=False), "choices": [{"index": choice.index, "text": c.text, "logprobs": logprobs,
                                  "finish_reason": c.finish_reason}]}
    if c.stop_reason is None:
        return [event]
    state.usages.append(c.usage)
    return [{**event, "timings": timings_json(c.timings)}]


def chat_events(choice: Choice, state: StreamState, piece: Piece) -> list[dict]:
    """OpenAI's chunk order for each choice: the role first, then the content (with its tokens'
    log-probabilities, if asked for), then the finish reason."""
    c: CompletionChunk = choice.item
    head = chunk_head(c, chat=True)

    def event(delta: dict, logprobs=None, finish=None) -> dict:
        return {**head, "choices": [{"index": choice.index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish}]}

    events = []
    if choice.index not in state.begun:
        state.begun.add(choice.index)
        events.append(event({"role": "assistant", "content": ""}))
    text, calls = c.text, []
    if state.tool_names:  # text that may be a call waits until the end
        held = state.calls.setdefault(choice.index, CallStream(state.tool_names))
        text = held.feed(c.text)
        if c.stop_reason is not None:
            rest, calls = held.finish()
            text += rest
    if text or c.logprobs:
        events.append(event({"content": text}, chat_logprobs(c.logprobs, piece)))
    if calls:  # each call whole in one delta: OpenAI's clients join the argument pieces they get
        events.append(event({"tool_calls": tool_calls_json(calls, indexed=True)}))
    if c.stop_reason is not None:
        state.usages.append(c.usage)
        events.append({**event({}, finish=_finish(c.finish_reason, calls)), "timings": timings_json(c.timings)})
    return events


def chunk_head(c: CompletionChunk, chat: bool) -> dict:
    """A stream chunk's id, object, created and model (the last chunk, with the usage of every
    choice for stream_options.include_usage, has the same)."""
    if chat:
        return {"id": chat_id(c.id), "object": "chat.completion.chunk", "created": c.created, "model": c.model}
    return {"id": c.id, "object": "text_completion", "created": c.created, "model": c.model}
