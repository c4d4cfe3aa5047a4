"""A run's records and the worker processes that make them.

Every measurement is appended to <runs>/<run id>/records.jsonl the moment its worker exits, so
an interrupted run, started again with the same plan, skips what is recorded and measures the
rest. A worker that fails is recorded as failed (and tried again on the next start), never
silently dropped. Workers run one at a time: no two engines' thread pools are ever alive at once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.support.measure import THREAD_VARS

ROOT = Path(__file__).resolve().parents[2]  # the directory holding bench/: `-m bench.report.x` runs from it
TIMEOUT_S = 3600


class WorkerError(Exception):
    pass


class Run:
    def __init__(self, directory: Path):
        self.dir = directory
        self.path = directory / "records.jsonl"
        self.records = {}
        if self.path.exists():
            lines = [line for line in self.path.read_text().splitlines() if line.strip()]
            for i, line in enumerate(lines):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    if i < len(lines) - 1:
                        raise SystemExit(f"{self.path}: line {i + 1} is not a record; the run cannot be "
                                         f"resumed from it") from None
                    # the last record cut short (a full disk, a kill while writing): measured again
                    print(f"{self.path}: its last record was cut short; that measurement runs again",
                          file=sys.stderr)
                    self.path.write_text("".join(kept + "\n" for kept in lines[:-1]))
                    break
                self.records[record["key"]] = record
        self.started = time.perf_counter()

    @property
    def id(self) -> str:
        return self.dir.name

    def done(self, key: str) -> bool:
        return key in self.records and "error" not in self.records[key]

    def result(self, key: str):
        record = self.records.get(key)
        return record.get("result") if record else None

    def put(self, key: str, result=None, error: str | None = None) -> None:
        record = {"key": key, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        record.update({"error": error} if error is not None else {"result": result})
        self.records[key] = record
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def forget(self, key: str) -> None:
        """Drops a record (the file keeps it; the last line for a key wins when read)."""
        if key in self.records:
            self.put(key, error="redone")

    def say(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.started:7.1f} s] {message}", flush=True)


def open_run(runs: Path, plan_key: str, plan: dict, run_id: str | None, new: bool) -> Run:
    """The run to add to: the one named, or the latest unfinished one with this plan, or a new one."""
    runs.mkdir(parents=True, exist_ok=True)
    if run_id is None and not new:
        for d in sorted((d for d in runs.iterdir() if (d / "plan.json").exists()), key=lambda d: d.name, reverse=True):
            if json.loads((d / "plan.json").read_text())["key"] == plan_key and not Run(d).done("finished"):
                return Run(d)
    directory = runs / (run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{plan_key}")
    plan_file = directory / "plan.json"
    if plan_file.exists():
        recorded = json.loads(plan_file.read_text())
        if recorded["key"] != plan_key:
            raise SystemExit(f"{directory}: run {directory.name} was made with another plan ({recorded['plan']}); "
                             f"name another run id, or use --new")
    else:
        directory.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(json.dumps({"key": plan_key, "plan": plan}, indent=1))
    return Run(directory)


def thread_env(threads: int) -> dict:
    return {var: str(threads) for var in THREAD_VARS}


def run_worker(run: Run, module: str, spec: dict, threads: int, env: dict | None = None,
               python: str = sys.executable) -> dict:
    """Runs bench.report.<module> on spec in a process of its own (in another interpreter, for a
    peer built otherwise); its result, or WorkerError."""
    work = run.dir / "work"
    work.mkdir(exist_ok=True)
    spec_path, out_path = work / "spec.json", work / "out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    child_env = {**os.environ, **thread_env(threads), **(env or {})}
    try:
        r = subprocess.run([python, "-m", f"bench.report.{module}", str(spec_path), str(out_path)], cwd=ROOT,
                           env=child_env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise WorkerError(f"bench.report.{module} took more than {TIMEOUT_S} s") from None
    if r.returncode != 0 or not out_path.exists():
        tail = (r.stderr or r.stdout or "").strip().splitlines()[-12:]
        raise WorkerError(f"bench.report.{module} exited with status {r.returncode}: " + " | ".join(tail))
    return json.loads(out_path.read_text())


def job(run: Run, key: str, module: str, spec: dict, threads: int, env: dict | None = None,
        python: str = sys.executable):
    """The recorded result of key, or runs the worker and records what it gives (None if it failed)."""
    if run.done(key):
        return run.result(key)
    run.say(f"{key} ...")
    try:
        result = run_worker(run, module, spec, threads, env, python)
    except WorkerError as e:
        run.put(key, error=str(e))
        run.say(f"{key} FAILED: {e}")
        return None
    run.put(key, result)
    return result
