"""Every byte of a GGUF file's data section is accounted for: the tensor count in the header, the
tensor table and the data agree, or the file is refused naming what disagrees. The reported
case: a header claiming fewer tensors than the table holds used to run (the data section was
taken to start inside the table) and print wrong tokens with exit status 0."""
from __future__ import annotations

import struct

import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf
from fuzz_cases import gguf_regions

from nanocompile.errors import ModelError
from nanocompile.models.gguf_file import read_gguf
from nanocompile.models.gguf_model import GGUFModel

CFG = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, layers=2, vocab=300)
COUNT_AT = 8  # the header: magic, version, tensor count, key count


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("layout")
    path = write_gguf(d / "base.gguf", CFG, random_weights(CFG, seed=5))
    return d, path, path.read_bytes(), gguf_regions(path)


def variant(base, name: str, data: bytes):
    d = base[0]
    path = d / f"{name}.gguf"
    path.write_bytes(data)
    return path


def n_tensors(raw: bytes) -> int:
    return struct.unpack_from("<Q", raw, COUNT_AT)[0]


def with_count(raw: bytes, n: int) -> bytes:
    return raw[:COUNT_AT] + struct.pack("<Q", n) + raw[COUNT_AT + 8:]


def test_the_intact_file_is_accounted_for_exactly(base):
    _, path, raw, regions = base
    f = read_gguf(path)
    assert len(f.tensors) == n_tensors(raw) == len(regions["data"])
    covered = sum(t.n_bytes for t in f.tensors)
    assert f.data_start + covered <= f.size < f.data_start + covered + f.alignment * len(f.tensors)


@pytest.mark.parametrize("delta", [-1, -2, -5, 1, 2])
def test_a_header_that_claims_another_tensor_count_is_refused_naming_both(base, delta):
    _, _, raw, _ = base
    held = n_tensors(raw)
    path = variant(base, f"count{delta:+d}", with_count(raw, held + delta))
    with pytest.raises(ModelError, match=rf"the header claims {held + delta} tensors, but the tensor table "
                                         rf"holds {held}"):
        GGUFModel(path)


def test_bytes_after_the_last_tensor_are_refused(base):
    _, _, raw, regions = base
    padding = len(raw) - max(d.end for d in regions["data"])  # the writer's, after the last tensor
    path = variant(base, "trailing", raw + b"\0" * 64)
    with pytest.raises(ModelError, match=rf"the data section has {64 + padding} bytes after tensor 'output.weight' "
                                         rf"\(.* up to the end of the file\)"):
        GGUFModel(path)
    GGUFModel(variant(base, "padded", raw + b"\0" * (-len(raw) % 32 or 0)))  # padding to the alignment is fine


def test_a_gap_between_tensors_is_refused(base):
    """A tensor moved 64 bytes later (its offset and its data): 64 bytes before it explain nothing."""
    _, _, raw, regions = base
    last = max(regions["data"], key=lambda r: r.start)
    entry = next(r for r in regions["infos"] if r.name == last.name)
    offset_at = entry.parts[5][0]
    (offset,) = struct.unpack_from("<Q", raw, offset_at)
    moved = raw[:offset_at] + struct.pack("<Q", offset + 64) + raw[offset_at + 8:last.start]
    moved += b"\0" * 64 + raw[last.start:]
    with pytest.raises(ModelError, match=rf"64 bytes after tensor .* before tensor '{last.name}'\) that no tensor"):
        GGUFModel(variant(base, "gap", moved))


def test_an_output_tensor_hidden_by_the_count_is_not_taken_for_a_tied_head(base):
    """With the output tensor last in the table, a count one short used to drop it and tie the
    head to the embedding; now the count is named. A file with no output tensor at all is tied."""
    _, _, raw, regions = base
    assert regions["infos"][-1].name == "output.weight"
    with pytest.raises(ModelError, match="the header claims"):
        GGUFModel(variant(base, "hidden-output", with_count(raw, n_tensors(raw) - 1)))
    tied_cfg = tiny_config(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, layers=2, vocab=300, tied=True)
    tied = write_gguf(base[0] / "tied.gguf", tied_cfg, random_weights(tied_cfg, seed=5))
    assert GGUFModel(tied).config.tie_word_embeddings and not GGUFModel(base[1]).config.tie_word_embeddings
