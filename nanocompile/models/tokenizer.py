"""The tokenizer (the `tokenizers` library) and the chat template (jinja2).

Built from a Hugging Face tokenizer.json, or from a GGUF file's vocabulary and merges the
way transformers converts a Qwen2 tokenizer: byte-level BPE, NFC, and Qwen2's split regex.
"""
from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path

from ..errors import InputError, ModelError

QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# GGUF token types (llama.cpp's llama_token_type)
CONTROL, USER_DEFINED = 3, 4


def builder_digest() -> str:
    """What a cached tokenizer was built by: this module's code and the tokenizers library's
    version (either changed: the cached one is built again)."""
    import hashlib

    import tokenizers

    return hashlib.sha256(Path(__file__).read_bytes() + tokenizers.__version__.encode()).hexdigest()[:20]


class Tokenizer:
    def __init__(self, backend, eos_ids: list[int], bos_id: int | None, chat_template: str | None):
        self.backend = backend
        self.eos_ids = sorted(set(eos_ids))
        self.bos_id = bos_id
        self.chat_template = chat_template
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._added_ids = set(backend.get_added_tokens_decoder())
        self._bytes: dict[int, bytes] = {}  # token_bytes, as tokens are streamed
        self._plain = None  # the backend that reads control tokens as text, made when first needed

    # construction ---------------------------------------------------------------------------
    @staticmethod
    def from_gguf_data(data) -> "Tokenizer":
        from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
        from tokenizers import Tokenizer as Backend

        if data.pre not in (None, "qwen2"):
            raise ModelError(f"tokenizer pre-tokenizer {data.pre!r} is not supported (qwen2)")
        vocab = {tok: i for i, tok in enumerate(data.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in data.merges]
        try:
            backend = Backend(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                                         continuing_subword_prefix="", end_of_word_suffix="",
                                         fuse_unk=False, byte_fallback=False))
        except Exception as e:  # tokenizers raises a bare Exception for an inconsistent vocabulary
            raise ModelError(f"the tokenizer's vocabulary and merges disagree ({e})") from None
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        backend.decoder = decoders.ByteLevel()
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
        added = [AddedToken(tok, special=(kind == CONTROL), normalized=False)
                 for tok, kind in zip(data.tokens, data.token_types) if kind in (CONTROL, USER_DEFINED)]
        backend.add_tokens(added)
        eos = [data.eos_id] if data.eos_id is not None else []
        eos += _end_of_turn_ids(vocab)
        return Tokenizer(backend, eos, data.bos_id, data.chat_template)

    @staticmethod
    def from_hf_dir(path: Path) -> "Tokenizer | None":
        from tokenizers import Tokenizer as Backend

        file = path / "tokenizer.json"
        if not file.exists():
            return None
        try:
            backend = Backend.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception for a bad file
            raise ModelError(f"{file}: cannot be read as a tokenizer ({e})") from None
        config = {}
        if (path / "tokenizer_config.json").exists():
            config = _read_json(path / "tokenizer_config.json")
        template = _chat_template(config.get("chat_template"), path / "tokenizer_config.json")
        if template is None and (path / "chat_template.jinja").exists():
            try:
                template = (path / "chat_template.jinja").read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise ModelError(f"{path / 'chat_template.jinja'}: cannot be read as text ({e})") from None
        vocab = backend.get_vocab(with_added_tokens=True)
        eos = []
        generation = path / "generation_config.json"
        for file, source in ((path / "tokenizer_config.json", config),
                             (generation, _read_json(generation) if generation.exists() else {})):
            for key in ("eos_token", "eos_token_id"):
                eos += _token_ids(source.get(key), vocab, file, key)
        eos += _end_of_turn_ids(vocab)
        bos = config.get("bos_token")
        bos_id = vocab.get(bos) if isinstance(bos, str) else None
        return Tokenizer(backend, eos, bos_id, template)

    def backend_json(self) -> str:
        """The tokenizers library's own JSON of this tokenizer, which the cache keeps for a GGUF file
        (read back by from_cached instead of building it from the vocabulary). The merges are in
        the library's one-string form ("a b", 20% faster to read than pairs) where no token holds a
        space (a byte-level vocabulary has none)."""
        backend = json.loads(self.backend.to_str())
        merges = backend["model"].get("merges") or []
        if merges and not isinstance(merges[0], str) and not any(" " in a or " " in b for a, b in merges):
            backend["model"]["merges"] = [f"{a} {b}" for a, b in merges]
        return json.dumps(backend, ensure_ascii=False)

    @property
    def facts(self) -> dict:
        """What a Tokenizer holds besides the backend (kept in the cached file's sidecar)."""
        return {"eos_ids": self.eos_ids, "bos_id": self.bos_id, "chat_template": self.chat_template}

    @staticmethod
    def from_cached(path: Path, facts: dict) -> "Tokenizer":
        from tokenizers import Tokenizer as Backend

        return Tokenizer(Backend.from_file(str(path)), facts["eos_ids"], facts["bos_id"], facts["chat_template"])

    # use ----------------------------------------------------------------------------------------
    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of text. special: control tokens written in the text (<|im_start|>) are
        recognized as such; without, they are tokenized as the plain text they are."""
        if special:
            return self.backend.encode(text, add_special_tokens=False).ids
        if self._plain is None:
            from tokenizers import Tokenizer as Backend

            plain = Backend.from_str(self.backend.to_str())  # a copy: the flag is the backend's state
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain.encode(text, add_special_tokens=False).ids

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled text (e.g. "<|fim_prefix|>"), or None if there is none."""
        return self.backend.token_to_id(text)

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, so streamed output can be decoded incrementally."""
        known = self._bytes.get(token_id)
        if known is None:
            known = self._bytes[token_id] = self._token_bytes(token_id)
        return known

    def _token_bytes(self, token_id: int) -> bytes:
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            raise InputError(f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        if token_id in self._added_ids:
            return piece.encode("utf-8")
        # a character outside the byte-level alphabet (a damaged vocabulary) stands for itself
        return b"".join(bytes([_BYTE_DECODER[c]]) if c in _BYTE_DECODER else c.encode("utf-8") for c in piece)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> str:
        """tools: OpenAI's function tools, as transformers hands them to the template."""
        if not self.chat_template:
            raise ModelError("this model has no chat template")
        return render_template(self.chat_template, messages, add_generation_prompt, tools=tools,
                               bos_token=self._token_text(self.bos_id),
                               eos_token=self._token_text(self.eos_ids[0] if self.eos_ids else None))

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self.backend.id_to_token(token_id) or ""


def render_template(template: str, messages: list[dict], add_generation_prompt: bool, tools=None, **extra) -> str:
    """Renders a chat template the way transformers does: a sandboxed jinja2 environment with
    trim_blocks and lstrip_blocks, a tojson filter and raise_exception."""
    from jinja2 import TemplateError

    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          tools=tools, documents=None, **extra)
    except TemplateError as e:
        raise ModelError(f"chat template failed: {e}") from None


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """A chat template compiled once (about 10 ms), not at every request."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _token_ids(value, vocab: dict[str, int], file: Path, key: str) -> list[int]:
    """The ids an end-of-text entry names: a token's text, its id, an added-token object, or a
    list of those; an id must lie in the vocabulary, a text that is not in it is no id."""
    if value is None:
        return []
    ids = []
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            ids += [vocab[v]] if v in vocab else []
        elif isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(vocab):
            ids.append(v)
        else:
            raise ModelError(f"{file}: {key} is {json.dumps(value)[:60]}, expected token ids from 0 to "
                             f"{len(vocab) - 1} or token texts")
    return ids


def _end_of_turn_ids(vocab: dict[str, int]) -> list[int]:
    # chat models end a turn with these; generation stops at either
    return [vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _chat_template(value, where: Path) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of named templates."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ModelError(f"{where}: chat_template must be a string or a list of named templates with a 'default'")


def bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to 256+
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}
