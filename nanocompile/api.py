"""The Python API: a model with its KV cache, tokenizer and sampler, named after llama-cpp-python's
`Llama` (create_completion, create_chat_completion, tokenize, detokenize, eval, generate) and
returning the typed results of nanocompile.results. The command line and the server are built on it.

One Model holds one KV cache and runs one generation at a time. A prompt that begins with tokens
already in the cache (the previous turn of a chat, the unchanged start of a file) feeds only the
rest. Starting a generation ends any stream left unfinished; a stream in use by another thread is
refused.
"""
from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, Literal, Mapping, Sequence, overload

import numpy as np

from .engine import constrain
from .engine import tools as tool_calls
from .engine.checks import check_n_ctx, check_precision, check_tokens
from .engine.constrain import Constrained, Grammar
from .engine.logprobs import Scored, check_top
from .engine.lookup import LookupParams
from .engine.sampling import Sampler, SamplingParams
from .engine.stream import GenerationResult, stream
from .errors import ContextFullError, InputError, NanocompileError, NonFiniteLogitsError
from .results import ChatCompletion, ChatCompletionChunk, ChatMessage, Completion, CompletionChunk, Timings, Usage

DEFAULT_CTX = 4096
# Qwen2.5-Coder's fill-in-the-middle tokens; generation also ends at the ones that close a file
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
FIM_ENDS = ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")

Message = Mapping[str, str] | ChatMessage


class Model:
    """A Qwen2 model ready to generate: Model("default"), a .gguf file or a Hugging Face directory.

    n_ctx: the context in tokens (default 4096, or the model's maximum if smaller); n_threads: the
    compiled library's threads; precision: "auto" (native for a GGUF that stores every matrix in
    blocks, f32 otherwise; .precision says which), "f32", "int8" (Q8_0-style blocks, see
    docs/PRIMITIVES.md) or "native" (the GGUF's own Q8_0/Q5_0/Q4_0 blocks and K-format super-blocks
    as stored, other types requantized; docs/FORMATS.md); backend: "compiled" or
    "interp" (the NumPy interpreter, the reference); seed: the sampler's seed for calls that give
    none (-1: a random one, then in .seed); progress: bars on stderr while loading, converting and
    feeding a long prompt; lookup: prompt-lookup drafting by default in every call (True, or a
    engine.lookup.LookupParams), which verifies tokens copied from the context several to a
    step and yields the same tokens as without (docs/LOOKUP.md).
    """

    def __init__(self, model_path: str | Path = "default", *, n_ctx: int | None = None, n_threads: int = 2,
                 precision: str = "auto", backend: str = "compiled", seed: int = -1, progress: bool = True,
                 lookup: "bool | LookupParams" = False):
        from .engine.open import open_model, open_session
        from .models import load_model

        check_precision(precision, auto=True)
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise InputError(f"n_threads must be an integer of at least 1, got {n_threads!r}")
        SamplingParams(seed=seed).check(flag_names=False)  # before the model loads
        lookup = _lookup(lookup)
        loaded = load_model(model_path, progress=progress)
        opened = open_model(loaded, precision)
        if n_ctx is None:
            n_ctx = min(DEFAULT_CTX, loaded.config.max_position_embeddings)
        check_n_ctx(n_ctx, loaded.config, loaded.source)
        session = open_session(opened, backend, n_ctx=n_ctx, threads=n_threads, progress=progress)
        self._setup(loaded, session, seed, progress, opened.precision, n_threads, lookup)

    @classmethod
    def from_session(cls, loaded, session, *, seed: int = -1, progress: bool = False, precision: str = "f32",
                     n_threads: int = 1, lookup: "bool | LookupParams" = False) -> "Model":
        """A Model on a model already loaded (models.load_model) and a session already open on it
        (session.open_session, or anything with the same interface): to share one load."""
        model = cls.__new__(cls)
        model._setup(loaded, session, seed, progress, precision, n_threads, _lookup(lookup))
        return model

    def view(self, session) -> "Model":
        """This model on another session of the same weights (a sequence of a batcher): its own KV
        cache and generation, this one's settings and its own sampling generator."""
        return Model.from_session(self.loaded, session, progress=self.progress, precision=self.precision,
                                  n_threads=self.n_threads, lookup=self.lookup or False)

    def _setup(self, loaded, session, seed: int, progress: bool, precision: str, n_threads: int,
               lookup: LookupParams | None) -> None:
        self.loaded, self.session = loaded, session
        if lookup is not None and not getattr(session, "rows_exact", False):
            raise InputError(f"lookup needs the compiled backend, not {getattr(session, 'backend_name', 'this one')}: "
                             f"the interpreter's rows depend on the step they come in, so drafts could change tokens")
        self.lookup = lookup  # the calls' default: prompt-lookup drafting's parameters, or None (off)
        self.progress, self.precision, self.n_threads = progress, precision, n_threads
        SamplingParams(seed=seed).check(flag_names=False)
        self.seed = Sampler(SamplingParams(seed=seed)).seed  # -1 becomes a random seed, kept here
        self._rng = np.random.default_rng(self.seed)
        self._lock = threading.RLock()  # _take_over closes a stream, which releases the model
        self._active: _Stream | None = None
        self.timings: Timings | None = None  # of the last generation

    # what the model is ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.loaded.name

    @property
    def config(self):
        return self.loaded.config

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def backend(self) -> str:
        return self.session.backend_name

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.config.vocab_size

    @property
    def n_tokens(self) -> int:
        """Tokens in the KV cache."""
        return self.session.past

    @property
    def input_ids(self) -> list[int]:
        """The tokens in the KV cache, in order."""
        return list(self.session.tokens)

    @property
    def eos_token_ids(self) -> list[int]:
        """The tokens that end a text or a turn (generation stops at them)."""
        return list(self.tokenizer.eos_ids) if self.tokenizer else []

    # tokens -----------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, special: bool = True) -> list[int]:
        """Token ids of text. special: control tokens written in it (<|im_start|>) are read as
        such; otherwise as plain text. Qwen2 adds no BOS token."""
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"the text is not UTF-8 ({e.reason} at byte {e.start})") from None
        return self._need_tokenizer().encode(text, special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = True) -> str:
        """The text of token ids; special: control tokens are written out, else left out."""
        ids = check_tokens(list(tokens), self.n_vocab) if len(tokens) else np.zeros(0, np.int32)
        return self._need_tokenizer().decode(ids.tolist(), skip_special=not special)

    def chat_prompt(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
        """The token ids of a conversation in the model's chat template, ending where the
        assistant's answer begins; tools: OpenAI's function tools, listed as the template lists them."""
        return self._chat_ids(messages, tool_calls.check_tools(list(tools)) if tools is not None else None)

    def _chat_ids(self, messages: Sequence[Message], checked_tools: list[dict] | None) -> list[int]:
        tok = self._need_tokenizer()
        if not tok.chat_template:
            raise InputError(f"{self.name} has no chat template; use create_completion")
        return tok.encode(tok.render_chat(tool_calls.template_messages(_message_dicts(messages)), tools=checked_tools))

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        """The token ids that ask the model for the text between prefix and suffix (fill in the
        middle). The code is tokenized as plain text: control tokens in it are not obeyed."""
        tok = self._need_tokenizer()
        ids = [tok.token_id(t) for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)]
        if None in ids:
            raise InputError(f"{self.name} has no fill-in-the-middle tokens ({FIM_PREFIX}, {FIM_SUFFIX}, "
                             f"{FIM_MIDDLE})")
        return [ids[0], *tok.encode(prefix, special=False), ids[1], *tok.encode(suffix, special=False), ids[2]]

    def fim_stop_token_ids(self) -> list[int]:
        """Tokens besides end-of-text that end an infill (a padding or file separator token)."""
        tok = self._need_tokenizer()
        return [i for i in (tok.token_id(t) for t in FIM_ENDS) if i is not None]

    # the KV cache and logits ------------------------------------------------------------------
    def reset(self) -> None:
        """Empties the KV cache."""
        self._take_over(None)
        self.session.reset()

    def eval(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Feeds tokens after those in the KV cache; returns the logits of the last one [n_vocab]
        (all_logits: of each, [len(tokens), n_vocab]) as the model computed them, unchecked."""
        self._take_over(None)
        return np.array(self.session.step(list(tokens), all_logits=all_logits))

    # generation -------------------------------------------------------------------------------
    def generate(self, tokens: Sequence[int], *, max_tokens: int | None = None, temperature: float = 0.8,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                 repeat_last_n: int = 64, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 seed: int | None = None, stop_token_ids: Sequence[int] = (),
                 should_stop: Callable[[], bool] | None = None, lookup: "bool | LookupParams | None" = None
                 ) -> Iterator[int]:
        """Token ids, each as soon as it is chosen, after the prompt tokens: up to max_tokens (None:
        until end of text or a full context). The end-of-text token (or one of stop_token_ids)
        that ends it is yielded too. Timings afterwards in .timings."""
        params = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, frequency_penalty,
                           presence_penalty, seed)
        chunks = self._run(list(tokens), max_tokens, params, seed, [], stop_token_ids, should_stop, lookup, text=False)
        return _Stream(self, _token_ids(chunks))

    @overload
    def create_completion(self, prompt: str | Sequence[int], suffix: str | None = ..., max_tokens: int | None = ...,
                          temperature: float = ..., top_p: float = ..., top_k: int = ..., min_p: float = ...,
                          repeat_penalty: float = ..., repeat_last_n: int = ..., frequency_penalty: float = ...,
                          presence_penalty: float = ..., stop: str | Sequence[str] | None = ...,
                          stop_token_ids: Sequence[int] = ..., seed: int | None = ...,
                          stream: Literal[False] = ..., should_stop: Callable[[], bool] | None = ...,
                          lookup: "bool | LookupParams | None" = ..., logprobs: int | None = ...,
                          grammar: Grammar | None = ...) -> Completion: ...

    @overload
    def create_completion(self, prompt: str | Sequence[int], suffix: str | None = ..., max_tokens: int | None = ...,
                          temperature: float = ..., top_p: float = ..., top_k: int = ..., min_p: float = ...,
                          repeat_penalty: float = ..., repeat_last_n: int = ..., frequency_penalty: float = ...,
                          presence_penalty: float = ..., stop: str | Sequence[str] | None = ...,
                          stop_token_ids: Sequence[int] = ..., seed: int | None = ...,
                          stream: Literal[True] = ..., should_stop: Callable[[], bool] | None = ...,
                          lookup: "bool | LookupParams | None" = ..., logprobs: int | None = ...,
                          grammar: Grammar | None = ...) -> Iterator[CompletionChunk]: ...

    def create_completion(self, prompt, suffix=None, max_tokens=16, temperature=0.8, top_p=0.95, top_k=40,
                          min_p=0.05, repeat_penalty=1.0, repeat_last_n=64, frequency_penalty=0.0,
                          presence_penalty=0.0, stop=None, stop_token_ids=(), seed=None, stream=False,
                          should_stop=None, lookup=None, logprobs=None, grammar=None):
        """Continues prompt (text, or token ids); with suffix, fills in the middle between prompt
        and suffix. max_tokens None: until end of text or a full context. stop: strings that end
        the text (left out of it). seed: this call's own; None continues the model's generator.
        should_stop() is asked between prompt chunks and between tokens. stream: an iterator of
        CompletionChunk, else one Completion. lookup: prompt-lookup drafting for this call (True,
        False or a LookupParams; None: the model's default), the same tokens either way.
        logprobs: each token's log-probability and that many of the most likely tokens beside it
        (0 to 20; engine/logprobs.py), in .logprobs; None: none. grammar: a Grammar the output
        must match (engine/constrain.py: a JSON schema, any JSON object, GBNF, Lark, a regex)."""
        params = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, frequency_penalty,
                           presence_penalty, seed)
        top = None if logprobs is None else check_top(logprobs, "logprobs")
        stop_token_ids = list(stop_token_ids)
        if suffix is not None:
            if not isinstance(prompt, str):
                raise InputError("fill in the middle takes the prompt as text")
            ids = self.fim_prompt(prompt, suffix)
            stop_token_ids += self.fim_stop_token_ids()
        elif isinstance(prompt, str):
            ids = self.tokenize(prompt)
        else:
            ids = list(prompt)
        chunks = self._run(ids, max_tokens, params, seed, _stops(stop), stop_token_ids, should_stop, lookup, top=top,
                           grammar=_grammar(grammar))
        if stream:
            return _Stream(self, chunks)
        return _collect(_Stream(self, chunks))

    __call__ = create_completion

    @overload
    def create_chat_completion(self, messages: Sequence[Message], max_tokens: int | None = ...,
                               temperature: float = ..., top_p: float = ..., top_k: int = ..., min_p: float = ...,
                               repeat_penalty: float = ..., repeat_last_n: int = ..., frequency_penalty: float = ...,
                               presence_penalty: float = ..., stop: str | Sequence[str] | None = ...,
                               seed: int | None = ..., stream: Literal[False] = ...,
                               should_stop: Callable[[], bool] | None = ...,
                               lookup: "bool | LookupParams | None" = ..., logprobs: bool = ...,
                               top_logprobs: int | None = ..., grammar: Grammar | None = ...,
                               response_format: dict | None = ..., tools: Sequence[dict] | None = ...,
                               tool_choice: str | dict | None = ...) -> ChatCompletion: ...

    @overload
    def create_chat_completion(self, messages: Sequence[Message], max_tokens: int | None = ...,
                               temperature: float = ..., top_p: float = ..., top_k: int = ..., min_p: float = ...,
                               repeat_penalty: float = ..., repeat_last_n: int = ..., frequency_penalty: float = ...,
                               presence_penalty: float = ..., stop: str | Sequence[str] | None = ...,
                               seed: int | None = ..., stream: Literal[True] = ...,
                               should_stop: Callable[[], bool] | None = ...,
                               lookup: "bool | LookupParams | None" = ..., logprobs: bool = ...,
                               top_logprobs: int | None = ..., grammar: Grammar | None = ...,
                               response_format: dict | None = ..., tools: Sequence[dict] | None = ...,
                               tool_choice: str | dict | None = ...) -> Iterator[ChatCompletionChunk]: ...

    def create_chat_completion(self, messages, max_tokens=None, temperature=0.2, top_p=0.95, top_k=40, min_p=0.05,
                               repeat_penalty=1.0, repeat_last_n=64, frequency_penalty=0.0, presence_penalty=0.0,
                               stop=None, seed=None, stream=False, should_stop=None, lookup=None, logprobs=False,
                               top_logprobs=None, grammar=None, response_format=None, tools=None, tool_choice=None):
        """The assistant's answer to messages ([{"role": "user", "content": "..."}, ...]) in the
        model's chat template. The defaults are llama-cpp-python's; the rest as create_completion.
        The KV cache keeps the conversation: the next turn feeds only what is new. logprobs,
        top_logprobs: OpenAI's (top_logprobs, 0 to 20, needs logprobs). response_format: OpenAI's
        ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": ...}}), or grammar.
        tools, tool_choice: OpenAI's function tools (engine/tools.py); calls the answer makes are in
        message.tool_calls (finish_reason "tool_calls"); "required" or a named function constrains
        the answer to such a call."""
        params = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, frequency_penalty,
                           presence_penalty, seed)
        if not isinstance(logprobs, bool):
            raise InputError(f"logprobs must be True or False, got {logprobs!r}")
        if top_logprobs is not None and not logprobs:
            raise InputError("top_logprobs needs logprobs=True")
        top = (0 if top_logprobs is None else check_top(top_logprobs, "top_logprobs")) if logprobs else None
        constraint = _grammar(grammar)
        if response_format is not None:
            if not isinstance(response_format, Mapping):
                raise InputError(f"response_format must be a dict, got {response_format!r}")
            asked = constrain.from_request(response_format=dict(response_format))
            if asked is not None and constraint is not None:
                raise InputError("response_format and grammar: give one of them, not both")
            constraint = constraint or asked
        tools_plan = tool_calls.plan(list(tools) if tools is not None else None, tool_choice,
                                     self._need_tokenizer())
        if tools_plan.grammar is not None:
            if constraint is not None:
                raise InputError(f"tool_choice {tools_plan.choice!r} constrains the answer to a call: give no "
                                 "response_format or grammar with it")
            constraint = tools_plan.grammar
        prompt = self._chat_ids(messages, tools_plan.listed)
        chunks = self._run(prompt, max_tokens, params, seed, _stops(stop), (), should_stop, lookup, top=top,
                           grammar=constraint)
        answer = _as_chat(chunks, tools_plan.names)
        if stream:
            return _Stream(self, answer)
        return _collect_chat(_Stream(self, answer))

    # the loop ---------------------------------------------------------------------------------
    def _run(self, prompt_ids: list[int], max_tokens: int | None, params: SamplingParams, seed: int | None,
             stops: list[str], stop_token_ids: Sequence[int], should_stop, lookup=None, text: bool = True,
             top: int | None = None, grammar: Grammar | None = None) -> Iterator[CompletionChunk]:
        """Checks what it is given now, and returns the generation (which touches the KV cache
        only when it is first iterated)."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, type(None))):
            raise InputError(f"max_tokens must be an integer or None, got {max_tokens!r}")
        if not prompt_ids:
            raise InputError("the prompt is empty")
        ids = check_tokens(prompt_ids, self.n_vocab).tolist()
        if len(ids) > self.n_ctx:
            raise ContextFullError(f"the prompt has {len(ids)} tokens, more than the context of {self.n_ctx}")
        stop_ids = set(self.eos_token_ids) | {int(t) for t in stop_token_ids}
        drafting = self.lookup if lookup is None else _lookup(lookup)
        return self._chunks(ids, -1 if max_tokens is None else max_tokens, params, seed, stops, stop_ids, should_stop,
                            self.tokenizer if text else None, drafting, top, grammar)

    def _chunks(self, ids: list[int], max_tokens: int, params: SamplingParams, seed: int | None, stops: list[str],
                stop_ids: set[int], should_stop, tok, lookup: LookupParams | None = None, top: int | None = None,
                grammar: Grammar | None = None) -> Iterator[CompletionChunk]:
        """One CompletionChunk per token chosen (its text may be empty while a character or a
        possible stop sequence is incomplete), then a last one with the rest of the text, why it
        stopped, usage and timings. top: with each token its log-probability and top alternatives."""
        sampler = Sampler(params, rng=None if seed is not None else self._rng)
        sampler.accept(ids)
        scored = Scored(sampler, top) if top is not None else None
        constrained = None
        if grammar is not None:  # masks before the sampler (and before the scores: what the sampler sees)
            constrained = Constrained(scored or sampler, grammar, self._need_tokenizer(), self.n_vocab)
            constrained.prefetch()  # the first mask while the prompt runs
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        result = GenerationResult(0)
        bar = _PromptBar(result, getattr(self.session, "max_chunk", 0), self.progress)
        pieces = stream(self.session, ids, max_tokens, choose=constrained or scored or sampler, stop_ids=stop_ids,
                        stops=stops, tokenizer=tok, reuse_cache=True, should_stop=should_stop,
                        on_prompt_chunk=bar.update, result=result, lookup=lookup)
        try:
            for piece in pieces:
                bar.close()
                logprobs = scored.take() if scored is not None else None
                if piece.result is None:
                    yield CompletionChunk(cid, created, self.name, piece.text, piece.tokens, logprobs=logprobs)
                    continue
                if constrained is not None:
                    result.mask_seconds = constrained.mask_seconds
                self.timings = result.timings
                usage = Usage(len(ids), len(result.tokens), len(ids) + len(result.tokens))
                yield CompletionChunk(cid, created, self.name, piece.text, [], stop_reason=result.stop_reason,
                                      usage=usage, timings=self.timings, logprobs=logprobs)
        except NonFiniteLogitsError as e:  # weights or a configuration out of float32's range
            raise NonFiniteLogitsError(f"{e} (model {self.loaded.source})") from None
        finally:
            pieces.close()
            bar.close()
            if constrained is not None:
                constrained.close()
            self.timings = result.timings

    def _take_over(self, stream: "_Stream | None") -> None:
        """Makes stream the model's one generation, ending any other that is unfinished."""
        with self._lock:
            active = self._active
            if active is not None and active is not stream:
                try:
                    active.close()
                except ValueError:  # a generator running in another thread cannot be closed
                    raise NanocompileError("this model is generating in another thread; it runs one generation "
                                           "at a time (nanocompile serve queues requests)") from None
            self._active = stream

    def _release(self, stream: "_Stream") -> None:
        with self._lock:
            if self._active is stream:
                self._active = None

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise InputError(f"{self.name} has no tokenizer; give token ids")
        return self.tokenizer

    def close(self) -> None:
        """Frees the compiled library's memory now rather than when the Model is collected."""
        self._take_over(None)
        if hasattr(self.session, "close"):
            self.session.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Model({self.name!r}, n_ctx={self.n_ctx}, backend={self.backend!r}, precision={self.precision!r}, "
                f"n_tokens={self.n_tokens})")


def load(model_path: str | Path = "default", **kwargs) -> Model:
    """Model(model_path, **kwargs): the default model, a .gguf file or a Hugging Face directory."""
    return Model(model_path, **kwargs)


class _Stream(Iterator):
    """An iterator over a generation that owns the model while it runs: its first step ends any
    other unfinished generation on the model, and closing it (or reaching its end) frees it."""

    def __init__(self, model: Model, inner: Iterator):
        self.model, self.inner, self.started = model, inner, False

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self):
        if not self.started:
            self.model._take_over(self)
            self.started = True
        try:
            return next(self.inner)
        except BaseException:
            self.model._release(self)
            raise

    def close(self) -> None:
        self.inner.close()  # ValueError if it is running in another thread: then it keeps the model
        self.model._release(self)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _PromptBar:
    """A progress bar on stderr for a prompt of several chunks that takes more than a second; sized
    when the first chunk is fed, by the tokens the generation loop feeds (result.prompt_tokens)."""

    def __init__(self, result: GenerationResult, chunk: int, enabled: bool):
        self.result, self.chunk, self.enabled = result, chunk, enabled
        self.bar, self.done = None, False

    def update(self, n: int) -> None:
        if self.bar is None and not self.done and self.enabled and self.chunk and self.result.prompt_tokens > self.chunk:
            from tqdm import tqdm
            self.bar = tqdm(total=self.result.prompt_tokens, desc="prompt", unit="tok", delay=1.0, leave=False,
                            file=sys.stderr)
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        self.done = True
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, frequency_penalty, presence_penalty,
              seed) -> SamplingParams:
    values = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                  repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                  seed=-1 if seed is None else seed)
    for name, value in values.items():
        kind = int if name in ("top_k", "repeat_last_n", "seed") else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise InputError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return SamplingParams(**values).check(flag_names=False)


def _grammar(grammar) -> Grammar | None:
    if grammar is not None and not isinstance(grammar, Grammar):
        raise InputError(f"grammar must be a Grammar (Grammar.json_schema(...), .gbnf(...), ...), got {grammar!r}")
    return grammar


def _lookup(lookup) -> LookupParams | None:
    """True: drafting with the default parameters; False: off; or LookupParams as they are."""
    if isinstance(lookup, LookupParams):
        return lookup.check(flag_names=False)
    if not isinstance(lookup, bool):
        raise InputError(f"lookup must be True, False or a LookupParams, got {lookup!r}")
    return LookupParams() if lookup else None


def _stops(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if not all(isinstance(s, str) for s in stops):
        raise InputError(f"stop must be a string or a list of strings, got {stop!r}")
    return stops


def _message_dicts(messages: Sequence[Message]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, ChatMessage):
            m = {"role": m.role, "content": m.content, **({"tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls]} if m.tool_calls else {})}
        calls = isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("tool_calls")
        if calls and m.get("content") is None:  # an assistant's turn of tool calls alone
            m = {**m, "content": ""}
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InputError(f"message {i} must have a role and a content, both strings; got {m!r}")
        if calls and (not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls)):
            raise InputError(f"message {i}: tool_calls must be a list of calls, got {calls!r}")
        out.append(dict(m))
    if not out:
        raise InputError("the conversation has no messages")
    return out


def _token_ids(chunks: Iterator[CompletionChunk]) -> Iterator[int]:
    try:
        for c in chunks:
            yield from c.tokens
    finally:
        chunks.close()


def _as_chat(chunks: Iterator[CompletionChunk], tool_names=None) -> Iterator[ChatCompletionChunk]:
    """tool_names: the answer may call these tools: text from the first call on is held back and
    parsed at the end, into the last chunk's tool_calls."""
    held = tool_calls.CallStream(tool_names) if tool_names is not None else None
    try:
        for c in chunks:
            text, made, reason = c.text, None, c.stop_reason
            if held is not None:
                text = held.feed(c.text)
                if c.stop_reason is not None:
                    rest, made = held.finish()
                    text += rest
                    made = made or None
                    reason = "tool_calls" if made and c.stop_reason in ("eos", "stop") else reason
            yield ChatCompletionChunk(c.id.replace("cmpl-", "chatcmpl-", 1), c.created, c.model, text, c.tokens,
                                      reason, c.usage, c.timings, c.logprobs, made)
    finally:
        chunks.close()


def _collect(chunks: Iterator[CompletionChunk]) -> Completion:
    text, tokens, logprobs = [], [], None
    for c in chunks:
        text.append(c.text)
        tokens += c.tokens
        if c.logprobs is not None:
            logprobs = [] if logprobs is None else logprobs
            logprobs += c.logprobs
    return Completion(c.id, c.created, c.model, "".join(text), tokens, c.stop_reason, c.usage, c.timings, logprobs)


def _collect_chat(chunks: Iterator[ChatCompletionChunk]) -> ChatCompletion:
    text, tokens, logprobs = [], [], None
    for c in chunks:
        text.append(c.content)
        tokens += c.tokens
        if c.logprobs is not None:
            logprobs = [] if logprobs is None else logprobs
            logprobs += c.logprobs
    content = "".join(text)
    message = (ChatMessage("assistant", content or None, c.tool_calls) if c.tool_calls
               else ChatMessage("assistant", content))
    return ChatCompletion(c.id, c.created, c.model, message, tokens, c.stop_reason, c.usage, c.timings, logprobs)
