"""The cache verifies what it serves and repairs itself: a damaged entry is rebuilt with a note
and the run's output is unchanged; entries are written atomically, temporaries of a killed run
are removed by the next; concurrent runs on an empty cache make each entry once; a read-only
cache still runs; `nanocompile cache verify` and `clean` find and remove what is damaged or stale."""
from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from bench.support.tiny import random_weights, tiny_config, write_gguf, write_hf_dir

PROMPT = ("--prompt-ids", "1 2 3 4", "-n", "6", "--ids", "--temp", "0")


def nc(*args, cache: Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "NANOCOMPILE_CACHE": str(cache)}
    r = subprocess.run([sys.executable, "-m", "nanocompile", *args], capture_output=True, text=True, env=env,
                       timeout=300, **kw)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("nanocompile:")]


def flip_byte(path: Path, at: int) -> None:
    """Damage as a disk would: one byte changed in place."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    cfg = tiny_config()
    w = random_weights(cfg, seed=3)
    return {"gguf": write_gguf(d / "tiny.gguf", cfg, w), "hf": write_hf_dir(d / "hf", cfg, w), "dir": d}


def only(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, found
    return found[0]


# repair -----------------------------------------------------------------------------------------

@pytest.mark.c
def test_damaged_packed_weights_are_packed_again_with_a_note(models, tmp_path):
    cache = tmp_path / "cache"
    want = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache).stdout
    packed = only(cache / "packed", "*.bin")
    flip_byte(packed, packed.stat().st_size // 2)
    r = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache)
    assert r.stdout == want
    assert notes(r.stderr) == [f"nanocompile: {packed} does not match its checksum (damaged); packing it again"]
    with open(packed, "r+b") as f:  # truncated
        f.truncate(packed.stat().st_size - 100)
    r = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache)
    assert r.stdout == want and "its sidecar says" in r.stderr and "packing it again" in r.stderr
    # another model's packed weights (and sidecar) under this name: refused by what it was made from
    nc("run", "-q", "-m", models["hf"], *PROMPT, cache=cache)
    other = next(p for p in (cache / "packed").glob("*.bin") if p != packed)
    for suffix in ("", ".meta.json"):
        Path(str(packed) + suffix).write_bytes(Path(str(other) + suffix).read_bytes())
    r = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache)
    assert r.stdout == want and notes(r.stderr) == [
        f"nanocompile: {packed} was made from something else; packing it again"]
    assert nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache).stderr.count("nanocompile:") == 0


@pytest.mark.c
def test_damaged_library_is_built_again_with_a_note(models, tmp_path):
    cache = tmp_path / "cache"
    want = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache).stdout
    lib = only(cache / "libs", "*/lib*.so")
    flip_byte(lib, 100)
    r = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache)
    assert r.stdout == want
    assert notes(r.stderr) == [f"nanocompile: {lib} does not match its checksum (damaged); building it again"]
    (lib.parent / (lib.name + ".meta.json")).unlink()  # an installed library whose sidecar was lost
    r = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache)
    assert r.stdout == want and notes(r.stderr) == [f"nanocompile: {lib} has no sidecar; building it again"]


def test_damaged_default_model_is_assembled_again(tmp_path, isolated_cache, monkeypatch, capsys):
    """The default model's code path, on six small parts standing in for the PyPI ones."""
    import hashlib

    from nanocompile.models import default_model

    parts = []
    for i in range(6):
        parts.append(tmp_path / f"part{i + 1:02d}.bin")
        parts[-1].write_bytes(bytes([i]) * 5000)
    whole = b"".join(p.read_bytes() for p in parts)
    monkeypatch.setattr(default_model, "part_files", lambda: parts)
    monkeypatch.setattr(default_model, "SHA256", hashlib.sha256(whole).hexdigest())
    path = default_model.default_model_path()
    assert path.read_bytes() == whole and capsys.readouterr().err == ""
    flip_byte(path, 12345)
    assert default_model.default_model_path().read_bytes() == whole
    assert capsys.readouterr().err == f"nanocompile: {path} does not match its checksum (damaged); assembling it again\n"
    assert default_model.default_model_path() == path and capsys.readouterr().err == ""


# atomic writes and killed runs -----------------------------------------------------------------

def test_a_failed_write_leaves_nothing(tmp_path):
    from nanocompile.cache.files import AtomicFile, check_entry, write_entry

    dest = tmp_path / "entry.bin"
    with pytest.raises(RuntimeError):
        with AtomicFile(dest) as out:
            out.write(b"half of it")
            raise RuntimeError("killed in the middle")
    assert list(tmp_path.iterdir()) == []
    write_entry(dest, {"what": 1}, lambda out: out.write(b"x" * 1000))
    assert check_entry(dest, {"what": 1}) is None
    assert check_entry(dest, {"what": 2}) == "was made from something else"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.bin", "entry.bin.meta.json"]


def _pmd_mapped_kib(address: int) -> int:
    """FilePmdMapped of this process's mapping that holds address: how much of it the kernel maps
    in 2 MiB pages."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
        elif inside and line.startswith("FilePmdMapped:"):
            return int(line.split()[1])
    return 0


def test_written_weights_are_mapped_in_two_mib_pages_where_the_kernel_has_them(tmp_path):
    """A file written in pieces of any size (as the packer writes tensors) reaches the page cache
    in aligned 8 MiB writes, so it is kept in 2 MiB folios and its read-only mapping is mapped
    in 2 MiB pages, whatever the machine did since (docs/results/phase14.md: written tensor by
    tensor, a fresh file was in 4 KiB pages until evicted). Where the kernel or filesystem keeps files in 4 KiB
    pages whatever the writes, there is nothing to show: skipped, saying so."""
    from nanocompile.cache.files import WRITE_PIECE, write_entry
    from nanocompile.engine.pack import map_weights

    if not Path("/proc/self/smaps").exists():
        pytest.skip("no /proc/self/smaps: not Linux")
    size = 2 * WRITE_PIECE + 12345
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    control = tmp_path / "control.bin"
    with open(control, "wb") as f:  # whole aligned 2 MiB ranges in one write each
        for at in range(0, size, WRITE_PIECE):
            f.write(data[at:at + WRITE_PIECE])
    mapped = map_weights(control)
    mapped[::4096].sum()  # every page touched
    if _pmd_mapped_kib(mapped.ctypes.data) == 0:
        pytest.skip(f"this kernel ({os.uname().release}) or the filesystem of {tmp_path} keeps files in 4 KiB pages")
    del mapped

    dest = tmp_path / "packed.bin"

    def odd_pieces(out):  # sizes that leave every later write off any 4 KiB boundary
        at, sizes = 0, itertools.cycle((4097, 1 << 20, 3, 5 << 20, 777))
        while at < size:
            n = next(sizes)
            out.write(data[at:at + n])
            at += n
    write_entry(dest, {"what": "weights"}, odd_pieces)
    mapped = map_weights(dest)
    assert mapped.tobytes() == data
    assert _pmd_mapped_kib(mapped.ctypes.data) >= 2 * WRITE_PIECE // 1024


def test_an_entry_changed_in_any_way_is_hashed_in_full_and_an_unchanged_one_is_trusted(tmp_path):
    """A file whose identity (device, inode, size, modification and change times) is still the one
    its sidecar recorded when it was written is not hashed again; anything that changes the file
    changes its identity (a write sets the change time even when the modification time is put
    back), so it is hashed in full, and a file whose bytes still match gets its new identity
    recorded. The trade: bytes that change without the filesystem knowing (the disk's own
    corruption) pass a load until `cache verify`, which hashes in full (full=True)."""
    from nanocompile.cache.files import check_entry, identity, read_record, sidecar_path, write_entry, write_record

    dest = tmp_path / "entry.bin"
    write_entry(dest, {"what": 1}, lambda out: out.write(b"x" * 100000))
    meta = read_record(sidecar_path(dest))
    assert meta["identity"] == identity(os.stat(dest))
    st = os.stat(dest)
    with open(dest, "r+b") as f:  # a byte changed in place, the modification time put back
        f.seek(500)
        f.write(b"y")
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(dest).st_mtime_ns == st.st_mtime_ns and os.stat(dest).st_ctime_ns != st.st_ctime_ns
    assert check_entry(dest, {"what": 1}) == "does not match its checksum (damaged)"
    # bytes put back: hashed in full, whole, and the identity now recorded
    with open(dest, "r+b") as f:
        f.seek(500)
        f.write(b"x")
    assert check_entry(dest, {"what": 1}) is None
    assert read_record(sidecar_path(dest))["identity"] == identity(os.stat(dest))
    # what the filesystem cannot see: bytes differ, the identity is the recorded one
    with open(dest, "r+b") as f:
        f.seek(500)
        f.write(b"z")
    write_record(sidecar_path(dest), {**read_record(sidecar_path(dest)), "identity": identity(os.stat(dest))})
    assert check_entry(dest, {"what": 1}) is None
    assert check_entry(dest, {"what": 1}, full=True) == "does not match its checksum (damaged)"


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from nanocompile.cache.files import AtomicFile
    with AtomicFile(Path(sys.argv[1])) as out:
        out.write(b"x" * 100000)
        out.file.flush()
        print("writing", flush=True)
        time.sleep(600)
""")


def test_temporaries_of_a_killed_run_are_removed_by_the_next(tmp_path):
    cache = tmp_path / "cache"
    (cache / "packed").mkdir(parents=True)
    env = {**os.environ, "NANOCOMPILE_CACHE": str(cache)}
    killed = subprocess.Popen([sys.executable, "-c", WRITER, str(cache / "packed" / "a.bin")], env=env,
                              stdout=subprocess.PIPE, text=True)
    alive = subprocess.Popen([sys.executable, "-c", WRITER, str(cache / "packed" / "b.bin")], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline() == "writing\n" and alive.stdout.readline() == "writing\n"
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        left = sorted(p.name for p in (cache / "packed").iterdir())
        assert len(left) == 2 and all(".tmp-" in n for n in left), left
        r = nc("cache", "verify", cache=cache)
        assert f"removed 1 temporary file(s) that killed runs left in {cache}" in r.stderr
        remaining = [p.name for p in (cache / "packed").iterdir()]
        assert remaining == [n for n in left if n.startswith(".b.bin")], "the live writer's file is kept"
    finally:
        alive.kill()
        alive.wait()


# concurrency ------------------------------------------------------------------------------------

@pytest.mark.c
def test_concurrent_runs_on_an_empty_cache_make_each_entry_once(models, tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "NANOCOMPILE_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "nanocompile", "run", "-m", str(models["gguf"]), *PROMPT]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert [rc for _, _, rc in results] == [0, 0, 0], [err for _, err, _ in results]
    assert len({out for out, _, _ in results}) == 1
    stderr = "".join(err for _, err, _ in results)
    assert stderr.count("compiling a library for this config") == 1, stderr
    assert "Traceback" not in stderr
    only(cache / "packed", "*.bin")
    only(cache / "libs", "*/lib*.so")
    leftovers = [p for p in cache.rglob(".*.tmp-*")]
    assert leftovers == []


# where the cache is -----------------------------------------------------------------------------

def read_only(directory: Path) -> list[str]:
    """A command prefix that runs its command with directory mounted read-only (a user and mount
    namespace: even root gets EROFS), or [] when the directory is made read-only by its mode."""
    probe = subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True) if shutil.which("unshare") else None
    if probe is not None and probe.returncode == 0:
        d = str(directory)
        return ["unshare", "-r", "-m", "sh", "-c",
                f'mount --bind "{d}" "{d}" && mount -o remount,bind,ro "{d}" "{d}" && exec "$@"', "sh"]
    if os.getuid() == 0:
        pytest.skip("root writes through permissions and unshare cannot make a read-only mount here")
    for path in [directory, *directory.rglob("*")]:
        os.chmod(path, 0o444 if path.is_file() else 0o555)
    return []


@pytest.mark.c
def test_read_only_cache_still_runs(models, tmp_path):
    filled, empty = tmp_path / "filled", tmp_path / "empty"
    want = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=filled).stdout
    empty.mkdir()
    try:
        for cache, made in ((filled, False), (empty, True)):
            env = {**os.environ, "NANOCOMPILE_CACHE": str(cache)}
            cmd = read_only(cache) + [sys.executable, "-m", "nanocompile", "run", "-m", str(models["gguf"]), *PROMPT]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            assert r.returncode == 0, r.stderr
            assert r.stdout == want
            assert re.search(f"the cache {cache} (is read-only|cannot be written)", r.stderr), r.stderr
            assert ("packing weights" in r.stderr) == made, r.stderr  # a filled cache serves what it holds
            scratch = re.search(r"making the rest in (\S+) for this run only \(slower\)", r.stderr).group(1)
            assert not os.path.exists(scratch), "the scratch directory goes with the process"
    finally:
        for path in [filled, *filled.rglob("*"), empty]:
            os.chmod(path, 0o755)


@pytest.mark.slow
def test_cache_path_that_is_a_file_is_an_error(models, tmp_path):
    file = tmp_path / "not-a-dir"
    file.write_text("x")
    r = nc("run", "-m", models["gguf"], *PROMPT, cache=file, check=False)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"nanocompile: error: {file}: the cache path is a file, not a directory (set NANOCOMPILE_CACHE to a directory)"]
    r = nc("run", "-m", models["gguf"], *PROMPT, cache=file / "below", check=False)
    assert r.returncode == 1 and "the cache path is inside a file" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.c
def test_cache_entry_that_cannot_be_written_is_an_error(models, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "packed").write_text("a file where the packed weights' directory goes")
    r = nc("run", "-m", models["gguf"], *PROMPT, cache=cache, check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"nanocompile: error: {cache / 'packed'}/")
    assert "cannot be written" in r.stderr


# verify and clean -------------------------------------------------------------------------------

@pytest.mark.c
def test_cache_verify_and_clean(models, tmp_path):
    cache = tmp_path / "cache"
    nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache)
    assert nc("cache", "verify", cache=cache).stdout.count("ok ") >= 4
    # stale: packed weights of a model file that is gone; the old format's float32 copies
    gone = tmp_path / "gone.gguf"
    gone.write_bytes(models["gguf"].read_bytes()[:-16] + b"\x01" * 16)  # other content, another key
    nc("run", "-q", "-m", gone, *PROMPT, cache=cache)
    gone.unlink()
    (cache / "weights" / "aeb22a597ebffc4ad90d").mkdir(parents=True)
    (cache / "weights" / "aeb22a597ebffc4ad90d" / "weights.safetensors").write_bytes(b"\0" * 4096)
    # damaged: the library
    lib = only(cache / "libs", "*/lib*.so")
    flip_byte(lib, 200)
    r = nc("cache", "verify", cache=cache, check=False)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert any(line.startswith("damaged  library") and "does not match its checksum" in line for line in lines), lines
    assert any(line.startswith("stale    packed weights") and "gone.gguf is gone" in line for line in lines), lines
    assert any(line.startswith("stale    float32 copy") for line in lines), lines
    assert any(line.startswith("stale    index") for line in lines), lines
    assert "1 damaged" in r.stderr
    r = nc("cache", "clean", cache=cache)
    assert "removed libs/" in r.stdout and "removed weights/aeb22a597ebffc4ad90d" in r.stdout
    r = nc("cache", "verify", cache=cache)
    assert "0 damaged, 0 stale" in r.stderr
    assert len(list((cache / "packed").glob("*.bin"))) == 1
    r = nc("run", "-q", "-m", models["gguf"], *PROMPT, cache=cache)
    assert "packing" not in r.stderr
