"""The API's results as OpenAI's JSON: completions, chat completions and their stream chunks,
usage, and llama.cpp's `timings` extension."""
from __future__ import annotations

from ..results import Completion, CompletionChunk, Timings, Usage


def usage_json(u: Usage) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens}


def timings_json(t: Timings) -> dict:
    """llama.cpp server's names: prompt_n counts the tokens fed (not those reused from the cache)."""
    return {"prompt_n": t.prompt_tokens, "prompt_ms": t.prompt_seconds * 1e3, "prompt_per_second": t.prompt_tps,
            "cache_n": t.cached_tokens, "predicted_n": t.generated_tokens, "predicted_ms": t.decode_seconds * 1e3,
            "predicted_per_second": t.decode_tps,
            **({"draft_n": t.drafted_tokens, "draft_n_accepted": t.accepted_tokens} if t.drafted_tokens else {})}


def chat_id(completion_id: str) -> str:
    return completion_id.replace("cmpl-", "chatcmpl-", 1)


def completion_body(c: Completion) -> dict:
    return {"id": c.id, "object": "text_completion", "created": c.created, "model": c.model,
            "choices": [{"index": 0, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}],
            "usage": usage_json(c.usage), "timings": timings_json(c.timings)}


def chat_body(c: Completion) -> dict:
    return {"id": chat_id(c.id), "object": "chat.completion", "created": c.created, "model": c.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                         "finish_reason": c.finish_reason}],
            "usage": usage_json(c.usage), "timings": timings_json(c.timings)}


def completion_events(c: CompletionChunk, include_usage: bool) -> list[dict]:
    """What one chunk sends: nothing for a token whose text is still held back."""
    if not c.text and c.stop_reason is None:
        return []
    head = {"id": c.id, "object": "text_completion", "created": c.created, "model": c.model}
    event = {**head, "choices": [{"index": 0, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}]}
    if c.stop_reason is None:
        return [event]
    return [{**event, "timings": timings_json(c.timings)}] + (
        [{**head, "choices": [], "usage": usage_json(c.usage)}] if include_usage else [])


def chat_events(c: CompletionChunk, first: bool, include_usage: bool) -> list[dict]:
    """OpenAI's chunk order: the role first, then the content, then the finish reason (and usage
    in a chunk of its own if asked for)."""
    head = {"id": chat_id(c.id), "object": "chat.completion.chunk", "created": c.created, "model": c.model}

    def choice(delta: dict, finish=None) -> dict:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    events = [choice({"role": "assistant", "content": ""})] if first else []
    if c.text:
        events.append(choice({"content": c.text}))
    if c.stop_reason is not None:
        events.append({**choice({}, c.finish_reason), "timings": timings_json(c.timings)})
        if include_usage:
            events.append({**head, "choices": [], "usage": usage_json(c.usage)})
    return events
