"""Constrained decoding through llguidance (the library llama.cpp itself uses for its grammars): a
Grammar (a JSON schema, any JSON object, llama.cpp's GBNF, Lark or a regular expression) is
checked and compiled when it is made, and each step's logits are masked to the tokens the grammar
allows before the sampler sees them, for every sampler setting, drafts of prompt lookup included.

The mask of the next token is computed in a thread while the model's step runs (llguidance and
the compiled library both release the GIL), so its cost hides behind the step where it can:
Constrained.prefetch starts it as soon as the token is chosen. The end-of-text tokens are the
grammar's end: where the grammar is complete, they are allowed, and where it can go no further,
they are all that is."""
from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ..errors import InputError

# JSON as llama.cpp's json-schema-to-grammar writes it: ", " and ": " between items, at most one
# space or newline run elsewhere, so that sampling cannot wander into endless whitespace
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "coerce_one_of": True}
KINDS = ("json_schema", "json_object", "gbnf", "lark", "regex")


def _llguidance():
    try:
        import llguidance
    except ImportError as e:  # a dependency: only a broken install lacks it
        raise InputError(f"constrained decoding needs llguidance ({e}); pip install llguidance") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """What the output must match. kind: one of KINDS; source: the schema (a dict) or the text.
    Make one with Grammar.json_schema(...), Grammar.json_object(), Grammar.gbnf(...),
    Grammar.lark(...) or Grammar.regex(...): each refuses what llguidance cannot compile."""
    kind: str
    source: Any
    compiled: str  # llguidance's form

    @classmethod
    def json_schema(cls, schema: dict | str, field: str = "json_schema") -> "Grammar":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise InputError(f"{field}: not JSON ({e})") from None
        if not isinstance(schema, dict):
            raise InputError(f"{field}: a JSON schema is an object, got {type(schema).__name__}")
        llg = _llguidance()
        try:
            compiled = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as e:
            raise InputError(f"{field}: {e}") from None
        return cls._checked("json_schema", schema, compiled, field)

    @classmethod
    def json_object(cls, field: str = "response_format") -> "Grammar":
        return cls.json_schema({"type": "object"}, field)

    @classmethod
    def gbnf(cls, text: str, field: str = "grammar") -> "Grammar":
        """llama.cpp's GBNF (root is the start rule), through llguidance's converter to Lark."""
        cls._text(text, field)
        llg = _llguidance()
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            lark = gbnf_to_lark(text)
        except Exception as e:  # the converter raises its parser's own errors
            raise InputError(f"{field}: the GBNF grammar does not parse: {e}") from None
        return cls._checked("gbnf", text, llg.LLMatcher.grammar_from_lark(lark), field)

    @classmethod
    def lark(cls, text: str, field: str = "grammar") -> "Grammar":
        cls._text(text, field)
        return cls._checked("lark", text, _llguidance().LLMatcher.grammar_from_lark(text), field)

    @classmethod
    def regex(cls, text: str, field: str = "regex") -> "Grammar":
        cls._text(text, field)
        return cls._checked("regex", text, _llguidance().LLMatcher.grammar_from_regex(text), field)

    @staticmethod
    def _text(text, field: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{field}: a grammar is text that is not empty, got {text!r}")

    @classmethod
    def _checked(cls, kind: str, source, compiled: str, field: str) -> "Grammar":
        error = _llguidance().LLMatcher.validate_grammar(compiled)
        if error:
            raise InputError(f"{field}: {error.strip()}")
        return cls(kind, source, compiled)


def from_request(response_format=None, json_schema=None, grammar=None, format=None) -> Grammar | None:
    """The grammar of a request, from whichever field names it: OpenAI's response_format
    ({"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}};
    llama.cpp also reads a "schema" beside json_object), llama.cpp's json_schema (a schema) and
    grammar (GBNF), or Ollama's format ("json" or a schema). None: unconstrained. Two at once are
    refused: which one would win is not obvious."""
    given = [name for name, v in (("response_format", response_format), ("json_schema", json_schema),
                                  ("grammar", grammar), ("format", format)) if v is not None]
    plain_text = response_format is not None and response_format.get("type", "text") == "text"
    if plain_text and "schema" not in response_format:
        given.remove("response_format")
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)}: give one of them, not both")
    if json_schema is not None:
        return Grammar.json_schema(json_schema, "json_schema")
    if grammar is not None:
        return Grammar.gbnf(grammar, "grammar")
    if format is not None:
        if format == "json":
            return Grammar.json_object("format")
        if isinstance(format, dict):
            return Grammar.json_schema(format, "format")
        raise InputError(f"format: \"json\" or a JSON schema, got {format!r}")
    if not given:
        return None
    kind = response_format.get("type", "text")
    if kind == "json_object":
        schema = response_format.get("schema")
        return Grammar.json_object() if schema is None else Grammar.json_schema(schema, "response_format.schema")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InputError("response_format.json_schema: an object with the schema in \"schema\" (and a \"name\")")
        return Grammar.json_schema(spec["schema"], "response_format.json_schema.schema")
    raise InputError(f"response_format.type: one of text, json_object, json_schema; got {kind!r}")


@lru_cache(maxsize=4)
def _vocabulary(tokenizer_json: str, n_vocab: int, eos: tuple[int, ...]):
    """llguidance's view of the vocabulary (about a second to build: kept)."""
    return _llguidance().LLTokenizer(tokenizer_json, n_vocab=n_vocab, eos_token=list(eos))


def vocabulary_of(tokenizer, n_vocab: int):
    if getattr(tokenizer, "_llguidance_json", None) is None:
        tokenizer._llguidance_json = tokenizer.backend.to_str()
    return _vocabulary(tokenizer._llguidance_json, n_vocab, tuple(tokenizer.eos_ids))


def check_satisfiable(grammar: Grammar, tokenizer, n_vocab: int) -> None:
    """Refuses a grammar that allows no first token (a schema no value satisfies: a minimum above
    its maximum, say), before anything is queued."""
    chooser = Constrained(lambda row: 0, grammar, tokenizer, n_vocab)
    try:
        if not chooser.allowed().any():
            raise InputError(f"{grammar.kind}: nothing can match it (the grammar allows no first token)")
    finally:
        chooser.close()


class Constrained:
    """A token chooser that obeys a grammar: choose(masked row) with the tokens the grammar does not
    allow at -inf, then the token is consumed. mask_seconds: time spent waiting for masks (what
    the mask costs the step, beyond what ran beside it)."""

    def __init__(self, choose: Callable[[np.ndarray], int], grammar: Grammar, tokenizer, n_vocab: int):
        llg = _llguidance()
        self.choose, self.n_vocab = choose, n_vocab
        self.matcher = llg.LLMatcher(vocabulary_of(tokenizer, n_vocab), grammar.compiled, log_level=0)
        if self.matcher.is_error():
            raise InputError(f"the grammar: {self.matcher.get_error()}")
        self.words = (n_vocab + 31) // 32
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="nanocompile-grammar")
        self._next: Future | None = None  # the next mask, computing; the matcher is never used by two threads at once
        self.mask_seconds = 0.0
        self.masks = 0

    def _compute(self) -> np.ndarray:
        bits = np.empty(self.words, np.uint32)
        self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        return np.unpackbits(bits.view(np.uint8), bitorder="little")[:self.n_vocab].astype(bool)

    def prefetch(self) -> None:
        """Starts the next mask now (the caller is about to run the model's step)."""
        if self._next is None:
            self._next = self._pool.submit(self._compute)

    def allowed(self) -> np.ndarray:
        t0 = time.perf_counter()
        future, self._next = self._next, None
        mask = future.result() if future is not None else self._compute()
        self.mask_seconds += time.perf_counter() - t0
        self.masks += 1
        return mask

    def __call__(self, row: np.ndarray) -> int:
        allowed = self.allowed()
        if not allowed.any():
            raise InputError(f"the grammar allows no token here ({self.matcher.get_error() or 'a dead end'})")
        token = self.choose(np.where(allowed, row, -np.inf).astype(np.float32))
        if not self.matcher.consume_token(token):  # the mask it waited for has been computed
            raise InputError(f"the grammar refused token {token}: {self.matcher.get_error()}")
        self.prefetch()
        return token

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
