"""The request bodies the server accepts, as pydantic models of OpenAI's fields.

Types are strict (a string where a number belongs is refused, not converted). Fields this server
does not know are ignored, as llama.cpp's server and Ollama ignore them: editor plugins send
extensions of their own. Fields it knows but cannot honour (several choices, log-probabilities,
tools, JSON mode) are refused when set to anything but their neutral value.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Number = StrictFloat | StrictInt
Stop = StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class Sampling(BaseModel):
    """What completions and chat completions share. None: the server's default (its flags)."""
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None  # any name is accepted: the server has one model
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None          # llama.cpp's extension
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None       # llama.cpp's extension
    repeat_penalty: Annotated[Number, Field(gt=0)] | None = None    # llama.cpp's extension
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    stop: Stop = None
    seed: Annotated[StrictInt, Field(ge=0, lt=2 ** 64)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1  # one choice per request
    user: StrictStr | None = None
    logit_bias: dict[str, Number] | None = None

    def unsupported(self) -> str | None:
        if self.logit_bias:
            return "logit_bias is not supported"
        return None


class CompletionRequest(Sampling):
    prompt: StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=1)] | \
        Annotated[list[StrictInt], Field(min_length=1)]
    suffix: StrictStr | None = None  # fill in the middle between prompt and suffix
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = 16
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=1)] | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo is not supported"
        if self.logprobs is not None:
            return "logprobs is not supported"
        return super().unsupported()

    def prompt_value(self) -> str | list[int]:
        return self.prompt[0] if isinstance(self.prompt, list) and isinstance(self.prompt[0], str) else self.prompt


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart] | None = None

    def as_dict(self) -> dict:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        # OpenAI's newer name for the system message
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=0)] | None = None  # OpenAI's newer name
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list | None = None
    response_format: dict | None = None

    def unsupported(self) -> str | None:
        if self.logprobs or self.top_logprobs:
            return "logprobs is not supported"
        if self.tools:
            return "tools are not supported"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return f"response_format {self.response_format.get('type')!r} is not supported (only text)"
        return super().unsupported()

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
