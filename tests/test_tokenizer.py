"""Tokenizer parity with transformers' tokenizer for the same GGUF, and chat-template parity."""
import unicodedata
import warnings
from pathlib import Path

import pytest

from nanocompile.engine.stream import TextStream
from nanocompile.models.tokenizer import Tokenizer

CORPUS = [
    "Hello, world!",
    "def f(x):\n\treturn x ** 2  # square\n\n\nclass A:\n    pass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "你好，世界！这是一个测试。",
    "こんにちは世界、カタカナとひらがな。",
    "안녕하세요 세계",
    "Привет, мир! Ёлка.",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "emoji: 😀 🎉 👨‍👩‍👧‍👦 🇯🇵 ✨",
    "spaces:     five, then\n\n\n\nfour newlines, then \t\t tabs   \n  ",
    "   leading and trailing   ",
    "I'M SHOUTING, don't you'll we've they'd",
    "numbers 1234567890 3.14159 -42 1e-6",
    "e\u0301 (e + combining acute) and é precomposed",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "",
    "\n",
    "https://example.com/path?q=1&r=2#frag",
]


@pytest.fixture(scope="module")
def hf_tokenizer(real_model):
    """transformers' own tokenizer for the GGUF file (AutoTokenizer with gguf_file=)."""
    from transformers import AutoTokenizer

    path = Path(real_model.source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def hf_qwen2_tokenizer(real_model):
    """transformers' Qwen2Tokenizer class on the GGUF's vocabulary and merges."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    from nanocompile.models.gguf_model import GGUFModel

    data = GGUFModel(real_model.source).tokenizer_data()
    tok = Qwen2Tokenizer(vocab={t: i for i, t in enumerate(data.tokens)},
                         merges=[tuple(m.split(" ", 1)) for m in data.merges])
    tok.add_tokens([AddedToken(t, special=(k == 3), normalized=False)
                    for t, k in zip(data.tokens, data.token_types) if k in (3, 4)])
    return tok


def test_token_ids_identical_to_transformers(real_model, hf_tokenizer, hf_qwen2_tokenizer):
    ours = real_model.tokenizer
    for text in CORPUS:
        want = hf_qwen2_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == want, text
        assert ours.decode(want) == hf_qwen2_tokenizer.decode(want), text
        # transformers' GGUF loader drops Qwen2's NFC normalizer; on text that NFC leaves
        # alone it must agree too
        if unicodedata.normalize("NFC", text) == text:
            assert ours.encode(text) == hf_tokenizer(text, add_special_tokens=False)["input_ids"], text


def test_gguf_loader_of_transformers_differs_only_by_nfc(real_model, hf_tokenizer):
    text = "e\u0301"
    assert real_model.tokenizer.encode(text) == real_model.tokenizer.encode("\u00e9")
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] != real_model.tokenizer.encode(text)


def test_tokenizer_json_path_gives_the_same_ids(real_model, hf_qwen2_tokenizer, tmp_path):
    (tmp_path / "tokenizer.json").write_text(hf_qwen2_tokenizer.backend_tokenizer.to_str())
    from_json = Tokenizer.from_hf_dir(tmp_path)
    for text in CORPUS:
        assert from_json.encode(text) == real_model.tokenizer.encode(text), text


CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about compilers."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! 😀"},
     {"role": "user", "content": "多语言？"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_identical_to_transformers(real_model, hf_tokenizer, messages):
    want = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert real_model.tokenizer.render_chat(messages) == want


def test_streaming_never_splits_a_character(real_model):
    tok = real_model.tokenizer
    for text in CORPUS:
        ids = tok.encode(text)
        pieces = []
        stream = TextStream(tok, pieces.append)
        for t in ids:
            stream(t)
        stream.flush()
        assert "".join(pieces) == tok.decode(ids), text
        assert all("\ufffd" not in p for p in pieces), text


def test_remembered_token_bytes_are_the_bytes_worked_out(real_model):
    """token_bytes keeps what it works out (streaming asks it once a token): the second answer is
    the first, a fresh tokenizer's agrees, and an id outside the vocabulary is refused every time."""
    from nanocompile.errors import InputError

    tok = real_model.tokenizer
    ids = [0, 1, 220, 9707, 151643, 151644, tok.vocab_size - 1] + tok.encode("你好 😀 def f(x):")
    first = [tok.token_bytes(i) for i in ids]
    assert [tok.token_bytes(i) for i in ids] == first == [tok._token_bytes(i) for i in ids]
    for _ in range(2):
        with pytest.raises(InputError, match="outside the vocabulary"):
            tok.token_bytes(tok.vocab_size + 5)


def test_a_template_compiled_once_renders_every_conversation_and_fails_every_time():
    """The compiled chat template is kept by its text: other messages give other renderings, and
    a template that raises does so at every render, not only the first."""
    from nanocompile.errors import ModelError
    from nanocompile.models.tokenizer import render_template

    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    a = render_template(template, [{"role": "user", "content": "one"}], True)
    b = render_template(template, [{"role": "user", "content": "two"}], True)
    assert (a, b) == ("[user] one\n", "[user] two\n")
    failing = "{{ raise_exception('no system role here') }}"
    for _ in range(2):
        with pytest.raises(ModelError, match="chat template failed: no system role here"):
            render_template(failing, [], True)


def test_the_cached_tokenizer_is_the_one_built_from_the_file(real_model, monkeypatch):
    """A GGUF file's tokenizer is kept in the cache under its content; the next load reads it back
    without building it from the vocabulary (the builder is not even asked), and it is the same
    tokenizer: the same ids and text on the corpus, the same end-of-text ids and chat template."""
    from nanocompile.models import load_model
    from nanocompile.models.gguf_model import GGUFModel

    built = Tokenizer.from_gguf_data(GGUFModel(Path(real_model.source)).tokenizer_data())
    monkeypatch.setattr(GGUFModel, "tokenizer_data", lambda self: pytest.fail("the tokenizer was built again"))
    cached = load_model(real_model.source, progress=False).tokenizer
    for text in CORPUS:
        assert cached.encode(text) == built.encode(text) and cached.encode(text, special=False) == built.encode(
            text, special=False)
        assert cached.decode(built.encode(text)) == built.decode(built.encode(text))
    assert (cached.eos_ids, cached.bos_id, cached.chat_template) == (built.eos_ids, built.bos_id, built.chat_template)
    assert cached.vocab_size == built.vocab_size


def test_a_damaged_cached_tokenizer_is_built_again(tmp_path, monkeypatch):
    from bench.support.tiny import random_weights, tiny_config, write_gguf
    from nanocompile.models import load_model

    monkeypatch.setenv("NANOCOMPILE_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config()
    path = write_gguf(tmp_path / "tiny.gguf", cfg, random_weights(cfg))
    first = load_model(path, progress=False).tokenizer
    (cached,) = [f for f in (tmp_path / "cache" / "tokenizers").iterdir() if not f.name.endswith(".meta.json")]
    good = cached.read_text()
    cached.write_text(good[:-10] + "damaged!!!")
    again = load_model(path, progress=False).tokenizer  # the checksum fails: built from the file again
    assert again.encode("hello there") == first.encode("hello there")
    assert cached.read_text() == good  # and written anew
