"""Malformed model files for the loader fuzzer: deterministic mutants of a tiny GGUF file and of a
tiny Hugging Face directory (test_fuzz_loaders.py runs them).

Where each part of the GGUF file lies (header, every metadata key, every tensor entry, every
tensor's data) is found with the gguf library's own reader on the intact file, so mutations hit
the regions they mean to: byte flips in the header, metadata and tensor table, truncations at
every region boundary, absurd counts and dimensions, wrong value types, wrong tensor types,
overlapping and out-of-range offsets, non-finite hyperparameters. The directory's mutants give
config.json fields every wrong JSON type and value, and damage the safetensors header, its
tensor entries and data, the shard index and the tokenizer files.
"""
from __future__ import annotations

import json
import random
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

from bench.support.tiny import random_weights, tiny_config, write_gguf, write_hf_dir

SEED = 20260511
GGUF_RUN = ["-p", "hello there", "-n", "2", "--ids", "--temp", "0", "--backend", "interp", "-q", "-c", "64"]
HF_RUN = ["--prompt-ids", "1 2 3", "-n", "2", "--ids", "--temp", "0", "--backend", "interp", "-q", "-c", "64"]


@dataclass
class Case:
    name: str  # what was done, for the report
    kind: str  # "gguf" or "hf"
    path: str  # the model file or directory
    argv: list[str] = field(default_factory=list)


def base_config():
    # 64 wide, so the projections are stored as Q8_0 and the norms and biases as F32
    return tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, layers=2, vocab=300)


# GGUF ------------------------------------------------------------------------------------------

@dataclass
class Region:
    name: str
    start: int
    end: int
    parts: list[tuple[int, int]]  # (start, size) of each part: lengths, names, types, values


def gguf_regions(path: Path) -> dict:
    """The intact file's layout, by the gguf library's reader."""
    import gguf

    reader = gguf.GGUFReader(path)
    keys, infos = [], []
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        parts, pos = [], int(f.offset)
        for p in f.parts:
            parts.append((pos, int(p.nbytes)))
            pos += int(p.nbytes)
        keys.append(Region(name, int(f.offset), pos, parts))
    for t in reader.tensors:
        parts, pos = [], int(t.field.offset)
        for p in t.field.parts:
            parts.append((pos, int(p.nbytes)))
            pos += int(p.nbytes)
        infos.append(Region(t.name, int(t.field.offset), pos, parts))
    data = [Region(t.name, int(t.data_offset), int(t.data_offset) + int(t.n_bytes), []) for t in reader.tensors]
    types = {t.name: int(t.tensor_type) for t in reader.tensors}
    return {"keys": keys, "infos": infos, "data": data, "types": types, "data_start": min(d.start for d in data)}


def gguf_cases(out: Path, rng: random.Random) -> list[Case]:
    out.mkdir(parents=True, exist_ok=True)
    cfg = base_config()
    base = write_gguf(out / "base.gguf", cfg, random_weights(cfg, seed=11))
    raw = base.read_bytes()
    regions = gguf_regions(base)
    keys = {r.name: r for r in regions["keys"]}
    infos = {r.name: r for r in regions["infos"]}
    cases: list[Case] = []

    def emit(name: str, data: bytes) -> None:
        path = out / f"m{len(cases):04d}.gguf"
        path.write_bytes(data)
        cases.append(Case(name, "gguf", str(path), GGUF_RUN))

    def patched(at: int, new: bytes, data: bytes = raw) -> bytes:
        return data[:at] + new + data[at + len(new):]

    def flip(at: int) -> bytes:
        return patched(at, bytes([raw[at] ^ rng.randrange(1, 256)]))

    emit("intact", raw)
    # byte flips: every header byte, and random bytes of the metadata and the tensor table
    for at in range(24):
        emit(f"header byte {at} flipped", flip(at))
    kv_start, kv_end = regions["keys"][0].start, regions["keys"][-1].end
    for at in sorted(rng.sample(range(kv_start, kv_end), 70)):
        emit(f"metadata byte {at} flipped", flip(at))
    ti_start, ti_end = regions["infos"][0].start, regions["infos"][-1].end
    for at in sorted(rng.sample(range(ti_start, ti_end), 50)):
        emit(f"tensor table byte {at} flipped", flip(at))
    for d in rng.sample(regions["data"], 8):  # weights' bytes: a Q8_0 scale may become NaN or Inf
        at = rng.randrange(d.start, d.end)
        emit(f"data byte {at} of {d.name} flipped", flip(at))
    for d in regions["data"]:
        if regions["types"][d.name] == 8:  # Q8_0: the first block's f16 scale made NaN, then Inf
            emit(f"{d.name}: first block scale NaN", patched(d.start, struct.pack("<e", float("nan"))))
            emit(f"{d.name}: first block scale Inf", patched(d.start, struct.pack("<e", float("inf"))))
            break
    # truncations at every region boundary (and one byte before it)
    bounds = {0, 4, 8, 16, 24, len(raw) - 1}
    for r in regions["keys"] + regions["infos"] + regions["data"]:
        bounds |= {r.start, r.end, r.start + 1, r.end - 1}
    bounds.add(regions["data_start"])
    for at in sorted(b for b in bounds if 0 <= b < len(raw)):
        emit(f"truncated to {at} bytes", raw[:at])
    # absurd counts
    for label, at, values in (("tensor count", 8, [0, 1, 26, 28, 1 << 16, (1 << 64) - 1]),
                              ("metadata key count", 16, [0, 1, 21, 23, 1 << 16, (1 << 64) - 1])):
        for v in values:
            emit(f"{label} {v}", patched(at, struct.pack("<Q", v)))
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        count_at = keys[key].parts[4][0]  # key length, key, type, element type, count
        n = struct.unpack_from("<Q", raw, count_at)[0]
        for v in (0, n - 1, n + 1, 1 << 40, (1 << 64) - 1):
            emit(f"{key}: element count {v}", patched(count_at, struct.pack("<Q", v)))
    for key in ("general.architecture", "tokenizer.ggml.model", "tokenizer.chat_template"):
        len_at = keys[key].parts[3][0]  # the string value's length
        n = struct.unpack_from("<Q", raw, len_at)[0]
        for v in (n + 1, n - 1, 1 << 40):
            emit(f"{key}: string length {v}", patched(len_at, struct.pack("<Q", v)))
    for v in (0, 1 << 40):
        emit(f"first key's name length {v}", patched(keys["general.architecture"].start, struct.pack("<Q", v)))
    # absurd dimensions and dimension counts
    for tname in ("token_embd.weight", "blk.0.ffn_down.weight", "output_norm.weight"):
        r = infos[tname]
        ndims_at, dims_at = r.parts[2][0], r.parts[3][0]
        for v in (0, 3, 5, 255):
            emit(f"{tname}: {v} dimensions", patched(ndims_at, struct.pack("<I", v)))
        for v in (0, 1, 2, 1 << 31, 1 << 40, (1 << 63) + 5, (1 << 64) - 1):
            emit(f"{tname}: first dimension {v}", patched(dims_at, struct.pack("<Q", v)))
    # wrong value types: each key's type changed (same-size types read the same bytes)
    for key in ("qwen2.block_count", "qwen2.embedding_length", "qwen2.attention.head_count",
                "qwen2.rope.freq_base", "qwen2.attention.layer_norm_rms_epsilon", "tokenizer.ggml.eos_token_id",
                "general.architecture", "tokenizer.ggml.tokens"):
        type_at = keys[key].parts[2][0]
        for t in (0, 1, 4, 5, 6, 7, 8, 9, 10, 12, 13, 0xFFFFFFFF):
            emit(f"{key}: value type {t}", patched(type_at, struct.pack("<I", t)))
    tt = keys["tokenizer.ggml.token_type"]
    for t in (6, 8, 9, 7):  # the array's element type: float, string, array, bool
        emit(f"tokenizer.ggml.token_type: element type {t}", patched(tt.parts[3][0], struct.pack("<I", t)))
    # values out of range, and non-finite hyperparameters
    for key, values in (("qwen2.block_count", [0, 1, 3, 1 << 31, (1 << 32) - 1]),
                        ("qwen2.attention.head_count", [0, 3, 5, 8, 64, 128]),
                        ("qwen2.attention.head_count_kv", [0, 1, 3, 8]),
                        ("qwen2.embedding_length", [0, 32, 63, 128]),
                        ("qwen2.attention.key_length", [0, 15, 8, 32]),
                        ("qwen2.feed_forward_length", [0, 95, 1 << 31]),
                        ("qwen2.context_length", [0, 1, 3, (1 << 32) - 1]),
                        ("tokenizer.ggml.eos_token_id", [299, 300, (1 << 32) - 1]),
                        ("tokenizer.ggml.bos_token_id", [300, 1 << 31])):
        at = keys[key].parts[3][0]
        for v in values:
            emit(f"{key} = {v}", patched(at, struct.pack("<I", v)))
    for key in ("qwen2.rope.freq_base", "qwen2.attention.layer_norm_rms_epsilon"):
        at = keys[key].parts[3][0]
        for v in (float("nan"), float("inf"), float("-inf"), 0.0, -1.0, 1e-45, 3e38):
            emit(f"{key} = {v}", patched(at, struct.pack("<f", v)))
    # wrong tensor types
    for tname in ("token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_norm.weight", "output.weight"):
        type_at = infos[tname].parts[4][0]
        for t in (0, 1, 2, 6, 8, 10, 12, 14, 24, 26, 28, 30, 31, 99, 0xFFFFFFFF):
            if t != regions["types"][tname]:
                emit(f"{tname}: tensor type {t}", patched(type_at, struct.pack("<I", t)))
    # overlapping and out-of-range offsets
    names = list(infos)
    offsets = {n: struct.unpack_from("<Q", raw, infos[n].parts[5][0])[0] for n in names}
    for tname in ("blk.0.attn_k.weight", "blk.1.ffn_up.weight", names[-1]):
        at = infos[tname].parts[5][0]
        other = names[(names.index(tname) + 1) % len(names)]
        for label, v in (("the next tensor's", offsets[other]), ("0", 0), ("+32", offsets[tname] + 32),
                         ("-32", max(0, offsets[tname] - 32)), ("+1 (misaligned)", offsets[tname] + 1),
                         ("past the end", len(raw)), ("2^63", 1 << 63), ("2^64-1", (1 << 64) - 1)):
            emit(f"{tname}: data offset {label}", patched(at, struct.pack("<Q", v)))
    # duplicate names: a tensor and a key renamed to an existing one
    emit("tensor name duplicated", raw.replace(b"blk.0.attn_k.bias", b"blk.0.attn_q.bias", 1))
    emit("metadata key duplicated", _with_key(raw, regions, b"qwen2.block_count", 4, struct.pack("<I", 5)))
    emit("metadata key renamed", patched(keys["qwen2.context_length"].parts[1][0], b"qwen2.block_countXXX"))
    # alignment key
    emit("general.alignment 0", _with_key(raw, regions, b"general.alignment", 4, struct.pack("<I", 0)))
    emit("general.alignment 48", _with_key(raw, regions, b"general.alignment", 4, struct.pack("<I", 48)))
    emit("general.alignment as FLOAT32", _with_key(raw, regions, b"general.alignment", 6, struct.pack("<f", 32.0)))
    emit("rope scaling yarn", _with_key(raw, regions, b"qwen2.rope.scaling.type", 8,
                                        struct.pack("<Q", 4) + b"yarn"))
    return cases


def _with_key(raw: bytes, regions: dict, key: bytes, type_id: int, value: bytes) -> bytes:
    """raw with one more metadata key appended after the last (the counts and offsets adjusted:
    the tensor table moves, the data section starts at the next aligned byte)."""
    last_key_end = regions["keys"][-1].end
    entry = struct.pack("<Q", len(key)) + key + struct.pack("<I", type_id) + value
    n_keys = struct.unpack_from("<Q", raw, 16)[0]
    head = raw[:16] + struct.pack("<Q", n_keys + 1) + raw[24:last_key_end] + entry
    table = raw[last_key_end:regions["infos"][-1].end]
    before = head + table
    data = raw[regions["data_start"]:]
    pad = -len(before) % 32
    return before + b"\0" * pad + data


# Hugging Face directories ----------------------------------------------------------------------

WRONG_VALUES = {
    "a string": "64", "a fraction": 64.5, "true": True, "null": None, "a list": [64], "an object": {"v": 64},
    "zero": 0, "negative": -64, "2^40": 1 << 40, "NaN": float("nan"), "Infinity": float("inf"),
}


def hf_cases(out: Path, rng: random.Random) -> list[Case]:
    from nanocompile.models.gguf_model import GGUFModel
    from nanocompile.models.tokenizer import Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    cfg = base_config()
    w = random_weights(cfg, seed=12)
    gguf_path = write_gguf(out / "for-tokenizer.gguf", cfg, w)
    tokenizer_json = Tokenizer.from_gguf_data(GGUFModel(gguf_path).tokenizer_data()).backend.to_str()
    base = write_hf_dir(out / "base", cfg, w, tokenizer_json=tokenizer_json)
    sharded = write_hf_dir(out / "sharded", cfg, w, shards=2)
    cases: list[Case] = []

    def emit(name: str, mutate, source: Path = base) -> None:
        path = out / f"d{len(cases):04d}"
        shutil.copytree(source, path)
        mutate(path)
        cases.append(Case(name, "hf", str(path), HF_RUN))

    def set_config(path: Path, edit) -> None:
        d = json.loads((path / "config.json").read_text())
        edit(d)
        (path / "config.json").write_text(json.dumps(d))  # NaN and Infinity as Python's json writes them

    emit("intact", lambda p: None)
    emit("intact, sharded", lambda p: None, sharded)
    fields = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
              "model_type", "use_sliding_window", "hidden_act"]
    for key in fields:
        for label, value in WRONG_VALUES.items():
            emit(f"config.json {key}: {label}", lambda p, k=key, v=value: set_config(p, lambda d: d.__setitem__(k, v)))
        emit(f"config.json {key}: missing", lambda p, k=key: set_config(p, lambda d: d.pop(k)))
    for label, value in WRONG_VALUES.items():
        emit(f"config.json rope_parameters.rope_theta: {label}",
             lambda p, v=value: set_config(p, lambda d: d["rope_parameters"].__setitem__("rope_theta", v)))
    for label, value in (("a list", [1]), ("a string", "default"), ("yarn", {"rope_type": "yarn", "factor": 4.0}),
                         ("rope_type 7", {"rope_type": 7})):
        emit(f"config.json rope_parameters: {label}",
             lambda p, v=value: set_config(p, lambda d: d.__setitem__("rope_parameters", v)))
        emit(f"config.json rope_scaling: {label}",
             lambda p, v=value: set_config(p, lambda d: d.__setitem__("rope_scaling", v)))
    emit("config.json both rope forms", lambda p: set_config(p, lambda d: d.__setitem__("rope_theta", 5.0)))
    for label, text in (("empty", ""), ("a list", "[1, 2]"), ("truncated", None), ("not UTF-8", "\udcff")):
        def write(p, t=text):
            body = (p / "config.json").read_text()
            if t is None:
                (p / "config.json").write_text(body[: len(body) // 2])
            elif t == "\udcff":
                (p / "config.json").write_bytes(b"\xff\xfe" + body.encode())
            else:
                (p / "config.json").write_text(t)
        emit(f"config.json {label}", write)
    # the safetensors file: header bytes, entries, data
    st = base / "model.safetensors"
    raw = st.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8:8 + n])
    for at in sorted(rng.sample(range(0, 8 + n), 40)):
        emit(f"safetensors header byte {at} flipped",
             lambda p, a=at: _patch(p / "model.safetensors", a, bytes([raw[a] ^ rng.randrange(1, 256)])))
    for v in (0, 7, n - 1, n + 1, len(raw), 1 << 40, (1 << 64) - 1):
        emit(f"safetensors header length {v}", lambda p, v=v: _patch(p / "model.safetensors", 0, struct.pack("<Q", v)))
    bounds = {0, 4, 8, 8 + n, len(raw) - 1}
    for info in header.values():
        if isinstance(info, dict) and "data_offsets" in info:
            bounds |= {8 + n + info["data_offsets"][0], 8 + n + info["data_offsets"][1]}
    for at in sorted(rng.sample(sorted(b for b in bounds if b < len(raw)), 20)):
        emit(f"safetensors truncated to {at} bytes", lambda p, a=at: _truncate(p / "model.safetensors", a))
    names = [k for k in header if k != "__metadata__"]
    victims = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.bias", names[-1]]
    entry_edits = {
        "dtype I32": lambda e: e.__setitem__("dtype", "I32"),
        "dtype F16": lambda e: e.__setitem__("dtype", "F16"),
        "dtype F64": lambda e: e.__setitem__("dtype", "F64"),
        "dtype 5": lambda e: e.__setitem__("dtype", 5),
        "shape of strings": lambda e: e.__setitem__("shape", [str(d) for d in e["shape"]]),
        "shape of fractions": lambda e: e.__setitem__("shape", [d + 0.5 for d in e["shape"]]),
        "shape negative": lambda e: e.__setitem__("shape", [-d for d in e["shape"]]),
        "shape a number": lambda e: e.__setitem__("shape", 64),
        "shape 2^62": lambda e: e.__setitem__("shape", [1 << 62] + e["shape"][1:]),
        "offsets reversed": lambda e: e.__setitem__("data_offsets", e["data_offsets"][::-1]),
        "offsets strings": lambda e: e.__setitem__("data_offsets", [str(o) for o in e["data_offsets"]]),
        "offsets booleans": lambda e: e.__setitem__("data_offsets", [False, True]),
        "offsets past the end": lambda e: e.__setitem__("data_offsets", [o + (1 << 30) for o in e["data_offsets"]]),
        "offsets overlap the start": lambda e: e.__setitem__("data_offsets", [0, e["data_offsets"][1]
                                                                               - e["data_offsets"][0]]),
        "offsets one value": lambda e: e.__setitem__("data_offsets", [0]),
        "entry a list": None,
        "entry missing dtype": lambda e: e.pop("dtype"),
    }
    for victim in victims:
        for label, edit in entry_edits.items():
            emit(f"safetensors {victim}: {label}",
                 lambda p, v=victim, e=edit: _rewrite_header(p / "model.safetensors", v, e))
    emit("safetensors header a list", lambda p: _replace_header(p / "model.safetensors", b"[1, 2, 3]"))
    emit("safetensors unexpected tensor",
         lambda p: _rewrite_header(p / "model.safetensors", victims[1], None, rename="model.layers.9.mlp.up.weight"))
    emit("safetensors tensor missing", lambda p: _rewrite_header(p / "model.safetensors", victims[2], "drop"))
    # a bfloat16 NaN in the data
    first = header["model.norm.weight"]["data_offsets"][0] + 8 + n
    emit("model.norm.weight[0] NaN", lambda p: _patch(p / "model.safetensors", first, struct.pack("<f", float("nan"))))
    # the shard index
    for label, edit in (("weight_map a list", lambda d: d.__setitem__("weight_map", [])),
                        ("shard outside the directory", lambda d: d["weight_map"].__setitem__(
                            next(iter(d["weight_map"])), "../base/model.safetensors")),
                        ("shard missing", lambda d: d["weight_map"].__setitem__(next(iter(d["weight_map"])), "gone")),
                        ("shard a number", lambda d: d["weight_map"].__setitem__(next(iter(d["weight_map"])), 3)),
                        ("no weight_map", lambda d: d.pop("weight_map"))):
        def edit_index(p, e=edit):
            f = p / "model.safetensors.index.json"
            d = json.loads(f.read_text())
            e(d)
            f.write_text(json.dumps(d))
        emit(f"index {label}", edit_index, sharded)
    emit("index not JSON", lambda p: (p / "model.safetensors.index.json").write_text("{"), sharded)
    # tokenizer files
    tok = (base / "tokenizer.json").read_bytes()
    for at in sorted(rng.sample(range(len(tok)), 10)):
        emit(f"tokenizer.json byte {at} flipped",
             lambda p, a=at: _patch(p / "tokenizer.json", a, bytes([tok[a] ^ rng.randrange(1, 256)])))
    emit("tokenizer.json truncated", lambda p: (p / "tokenizer.json").write_bytes(tok[: len(tok) // 2]))
    for label, text in (("a list", "[]"), ("chat_template a number", '{"chat_template": 5}'),
                        ("eos_token an object", '{"eos_token": {"x": 1}}'), ("not JSON", "{")):
        emit(f"tokenizer_config.json {label}", lambda p, t=text: (p / "tokenizer_config.json").write_text(t))
    return cases


def _patch(file: Path, at: int, new: bytes) -> None:
    data = bytearray(file.read_bytes())
    data[at:at + len(new)] = new
    file.write_bytes(bytes(data))


def _truncate(file: Path, at: int) -> None:
    file.write_bytes(file.read_bytes()[:at])


def _replace_header(file: Path, header: bytes) -> None:
    raw = file.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    header += b" " * (-len(header) % 8)
    file.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n:])


def _rewrite_header(file: Path, victim: str, edit, rename: str | None = None) -> None:
    """The header with one tensor's entry edited (None: replaced by a list), dropped or renamed."""
    raw = file.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8:8 + n])
    if edit == "drop":
        header.pop(victim)
    elif rename:
        header[rename] = header.pop(victim)
    elif edit is None:
        header[victim] = [header[victim]["dtype"]]
    else:
        edit(header[victim])
    _replace_header(file, json.dumps(header).encode())


def all_cases(out: Path) -> list[Case]:
    rng = random.Random(SEED)
    return gguf_cases(out / "gguf", rng) + hf_cases(out / "hf", rng)
