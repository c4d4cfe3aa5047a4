"""Runs fuzz cases through the command line in forked children: `python fuzz_runner.py CASES RESULTS`.

The interpreter starts and imports once; each case runs `nanocompile.cli.main` in a child forked
from it, so a crash, a hang or a runaway allocation is contained, at a few milliseconds per case
instead of a second of Python start-up. The child's address space is capped (RLIMIT_AS: its
size at the fork plus MEMORY_HEADROOM), its output goes to files, and the parent kills it after
TIMEOUT seconds. The config the loader produced is recorded, so the test can compare it with
what the file says.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

TIMEOUT = 30.0
MEMORY_HEADROOM = 1536 << 20
EXIT_EXCEPTION = 99


def vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def child(argv: list[str], out: Path, config_file: Path) -> None:
    """Never returns: runs the command line and exits with its status."""
    try:
        fd_out = os.open(out.with_suffix(".out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        fd_err = os.open(out.with_suffix(".err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        limit = vm_size() + MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        import nanocompile.models as models
        from nanocompile.cli import main

        load = models.load_model

        def recording(*args, **kwargs):
            model = load(*args, **kwargs)
            config_file.write_text(model.config.to_json())
            return model

        models.load_model = recording
        rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:
        traceback.print_exc()
        rc = EXIT_EXCEPTION
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc if isinstance(rc, int) else 0)


def run_case(case: dict, work: Path, index: int) -> dict:
    out = work / f"case{index:05d}"
    config_file = out.with_suffix(".config.json")
    argv = ["run", "-m", case["path"], *case["argv"]]
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        child(argv, out, config_file)
    status, timed_out = None, False
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = raw
        elif time.perf_counter() - start > TIMEOUT:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            timed_out = True
        else:
            time.sleep(0.002)
    result = {"name": case["name"], "path": case["path"], "kind": case["kind"],
              "seconds": time.perf_counter() - start, "timeout": timed_out,
              "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) and not timed_out else None,
              "rc": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
              "stdout": out.with_suffix(".out").read_text(errors="replace"),
              "stderr": out.with_suffix(".err").read_text(errors="replace"),
              "config": json.loads(config_file.read_text()) if config_file.exists() else None}
    return result


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    # everything a case needs, imported once, before the first fork
    import gguf  # noqa: F401
    import tokenizers  # noqa: F401

    import nanocompile.cli  # noqa: F401
    import nanocompile.engine.interpreted  # noqa: F401
    import nanocompile.engine.open  # noqa: F401
    import nanocompile.engine.stream  # noqa: F401
    import nanocompile.ir.interpreter  # noqa: F401
    import nanocompile.models.gguf_model  # noqa: F401
    import nanocompile.models.hf_dir  # noqa: F401
    import nanocompile.models.tokenizer  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="nc-fuzz-") as work:
        results = [run_case(case, Path(work), i) for i, case in enumerate(cases)]
    Path(sys.argv[2]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
