"""What the Python API returns: completions, chat completions, their streamed chunks, token usage
and timings. Plain frozen dataclasses shaped like the OpenAI responses that llama-cpp-python
returns as dictionaries (the server turns them into exactly those)."""
from __future__ import annotations

from dataclasses import dataclass, field

# why generation stopped -> OpenAI's finish_reason
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length",
                  "interrupted": "interrupted", "tool_calls": "tool_calls"}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int       # the whole prompt, cached or not
    completion_tokens: int   # every token chosen, the end-of-text token included
    total_tokens: int


@dataclass(frozen=True)
class Timings:
    prompt_tokens: int       # prompt tokens fed this time
    cached_tokens: int       # prompt tokens already in the KV cache from an earlier call, not fed again
    prompt_seconds: float
    generated_tokens: int
    decode_seconds: float    # from the first token chosen to the last
    drafted_tokens: int = 0  # prompt lookup: tokens drafted and verified
    accepted_tokens: int = 0  # of them, kept
    verify_steps: int = 0    # steps that verified a draft
    lookup_seconds: float = 0.0  # indexing the context and drafting
    mask_seconds: float = 0.0    # a grammar's masks: the wait for them, beyond what ran beside the step

    @property
    def acceptance(self) -> float:
        """The share of drafted tokens kept (llama.cpp's speculative example prints it as accept)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        # the first token comes from the prompt pass; the rest from one decode step each
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability in the model's distribution at its step, and the most
    likely tokens there (as many as asked for, most likely first)."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Completion:
    id: str
    created: int             # Unix time
    model: str
    text: str
    tokens: list[int]        # the ids chosen, the end-of-text token included (it is not in text)
    stop_reason: str         # "eos", "stop" (a stop sequence), "length", "context" (full), "interrupted"
    usage: Usage
    timings: Timings
    logprobs: list[TokenLogprob] | None = None  # one per token, when asked for

    @property
    def finish_reason(self) -> str:
        """OpenAI's: "stop" (end of text or a stop sequence), "length" (max_tokens or a full
        context), or "interrupted" (should_stop)."""
        return FINISH_REASONS[self.stop_reason]


@dataclass(frozen=True)
class CompletionChunk:
    """A piece of a streamed completion. The last chunk has a stop_reason, usage and timings."""
    id: str
    created: int
    model: str
    text: str
    tokens: list[int] = field(default_factory=list)
    stop_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    logprobs: list[TokenLogprob] | None = None  # of this chunk's tokens, when asked for

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS[self.stop_reason] if self.stop_reason else None


@dataclass(frozen=True)
class ToolCall:
    """A call the model made of one of the request's tools."""
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class ChatMessage:
    role: str       # "system", "user", "assistant" or "tool"
    content: str | None
    tool_calls: list[ToolCall] | None = None  # the assistant's calls (then content may be None)


@dataclass(frozen=True)
class ChatCompletion:
    id: str
    created: int
    model: str
    message: ChatMessage
    tokens: list[int]
    stop_reason: str
    usage: Usage
    timings: Timings
    logprobs: list[TokenLogprob] | None = None

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS[self.stop_reason]


@dataclass(frozen=True)
class ChatCompletionChunk:
    """A piece of a streamed answer: content is the new text (OpenAI's delta)."""
    id: str
    created: int
    model: str
    content: str
    tokens: list[int] = field(default_factory=list)
    stop_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] | None = None  # in the last chunk, the calls the answer made

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS[self.stop_reason] if self.stop_reason else None
