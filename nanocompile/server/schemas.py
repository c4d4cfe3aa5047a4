"""The request bodies the server accepts, as pydantic models of OpenAI's fields, and the bodies it
answers with (these only describe them in the OpenAPI document, /openapi.json).

Types are strict (a string where a number belongs is refused, not converted). Fields this server
does not know are ignored, as llama.cpp's server and Ollama ignore them: editor plugins send
extensions of their own. Fields it knows but cannot honour (echo, best_of, logit_bias, tools) are
refused when set to anything but their neutral value.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

# an integer is a number too (strict floats take ints, not strings); NaN and infinities, which
# Python's JSON reader takes, are refused. One type, not a union, so that bounds set on it appear
# in the OpenAPI document as minimum and maximum.
Number = Annotated[StrictFloat, Field(allow_inf_nan=False)]


def _characters(text: str) -> str:
    """Python's JSON reader takes a lone surrogate ("\\ud800"), which is not a character and which
    the tokenizer cannot take: refused here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError("lone_surrogate", "the character at {at} is a lone surrogate, not text",
                                  {"at": e.start}) from None
    return text


Text = Annotated[StrictStr, AfterValidator(_characters)]  # what is tokenized
Prompt = Annotated[StrictStr, Field(min_length=1), AfterValidator(_characters)]  # not empty
Stop = StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None
MAX_CHOICES = 8  # n: the choices of one request, run one after another on the prompt's cache
TopLogprobs = Annotated[StrictInt, Field(ge=0, le=20)]  # OpenAI's bound


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
    n: Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)] = 1  # choices, each with its own seed (seed + index)
    user: StrictStr | None = None
    logit_bias: dict[str, Number] | None = None
    # constrained decoding (engine/constrain.py): llama.cpp's fields and Ollama's
    json_schema: dict | None = None      # a JSON schema the output matches
    grammar: StrictStr | None = None     # llama.cpp's GBNF
    format: StrictStr | dict | None = None  # Ollama's: "json" or a JSON schema

    def constraint(self) -> dict:
        return {"json_schema": self.json_schema, "grammar": self.grammar, "format": self.format}

    def unsupported(self) -> str | None:
        if self.logit_bias:
            return "logit_bias is not supported"
        return None


class CompletionRequest(Sampling):
    prompt: Prompt | Annotated[list[Prompt], Field(min_length=1, max_length=1)] | \
        Annotated[list[StrictInt], Field(min_length=1)]
    suffix: Text | None = None  # fill in the middle between prompt and suffix
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = 16
    echo: StrictBool = False
    logprobs: TopLogprobs | None = None  # each token's, and this many of the most likely beside it
    best_of: Annotated[StrictInt, Field(ge=1, le=1)] | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo is not supported"
        return super().unsupported()

    def top(self) -> int | None:
        return self.logprobs

    def prompt_value(self) -> str | list[int]:
        return self.prompt[0] if isinstance(self.prompt, list) and isinstance(self.prompt[0], str) else self.prompt


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    arguments: Text  # JSON text, as OpenAI sends it


class ToolCallIn(BaseModel):
    """An assistant's earlier call, sent back in the conversation."""
    model_config = ConfigDict(extra="ignore")
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's
    tool_call_id: StrictStr | None = None       # a tool's answer: the call it answers

    def as_dict(self) -> dict:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        # OpenAI's newer name for the system message
        out = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                               "arguments": c.function.arguments}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=0)] | None = None  # OpenAI's newer name
    logprobs: StrictBool = False
    top_logprobs: TopLogprobs | None = None
    tools: list | None = None               # OpenAI's function tools (engine/tools.py)
    tool_choice: StrictStr | dict | None = None
    response_format: dict | None = None

    def unsupported(self) -> str | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs needs logprobs: true"
        return super().unsupported()

    def constraint(self) -> dict:
        return {**super().constraint(), "response_format": self.response_format}

    def top(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(BaseModel):
    """llama-server's /tokenize: control tokens written in the text are read as such."""
    model_config = ConfigDict(extra="ignore")
    content: Text
    with_pieces: StrictBool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[StrictInt]


# what the server answers, for the OpenAPI document (the handlers build these bodies as dicts:
# openai_format.py, app.py)

class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error, the body of every 4xx and 5xx."""
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Timings(BaseModel):
    """llama.cpp server's `timings`."""
    prompt_n: int
    prompt_ms: float
    prompt_per_second: float
    cache_n: int
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    grammar_ms: float | None = None


FinishReason = Literal["stop", "length", "interrupted", "tool_calls"]


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy shape: per token its text, log-probability, the most likely tokens there
    (text -> log-probability) and its character offset in the completion's text."""
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Answer(BaseModel):
    """What a completion and a chat completion share."""
    id: str
    created: int
    model: str
    usage: Usage
    timings: Timings


class Completion(Answer):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(Answer):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]


class TokenPiece(BaseModel):
    id: int
    piece: str


class Tokens(BaseModel):
    tokens: list[int] | list[TokenPiece]


class Detokenized(BaseModel):
    content: str


class ModelMeta(BaseModel):
    n_ctx: int
    n_vocab: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    meta: ModelMeta


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class RequestCounts(BaseModel):
    done: int
    cancelled: int
    failed: int
    rejected: int


class BatchCounts(BaseModel):
    """The batcher's counts since the start (serve --parallel N > 1)."""
    batched_steps: int     # rounds that ran steps together
    batched_rows: int      # their rows
    sequences: int         # the sequences' steps in them
    alone: int             # steps of more rows than a pass takes, run alone
    step_seconds: float    # in the batched steps
    between_seconds: float  # from a batched step's end to the next one's start, while sequences generate


class Health(BaseModel):
    status: Literal["ok"]
    model: str
    n_ctx: int
    queued: int
    busy: bool
    slots: int       # requests answered at once (--parallel)
    slots_busy: int  # of them, answering now
    max_queue: int
    requests: RequestCounts
    tokens_generated: int
    batch: BatchCounts | None = None
