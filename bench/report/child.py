"""The frame of every worker process: `python -m bench.report.<worker> SPEC.json OUT.json`. The
worker's result is written with the process's own costs: wall time and peak resident memory
(the RSS high-water mark, which is this engine's alone since nothing else runs in it: /proc's
VmHWM, which exec starts afresh; getrusage's ru_maxrss survives exec, so a worker started by a
parent holding a model would report the parent's size)."""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path


def peak_rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_worker(work) -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    start = time.perf_counter()
    result = work(spec)
    result["process"] = {"seconds": time.perf_counter() - start, "loadavg": os.getloadavg(),
                         "peak_rss_bytes": peak_rss_bytes()}
    out = Path(sys.argv[2])
    out.write_text(json.dumps(result))
