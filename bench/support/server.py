"""`nanocompile serve` in a process of its own, on a free loopback port: for the load and soak
probes and the tests that kill it. Its log is drained as it runs (a full pipe would stall it)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .measure import THREADS


class ServerProcess:
    """serve_args: the serve command's flags after `-m MODEL` (context, queue, key, backend...)."""

    def __init__(self, model: str, serve_args: list[str] = (), env: dict | None = None, timeout: float = 600):
        self.argv = [sys.executable, "-m", "nanocompile", "serve", "-m", str(model), "--host", "127.0.0.1",
                     "--port", "0", "-t", str(THREADS), *serve_args]
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        env=env, cwd=tempfile.gettempdir())  # the installed package
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stderr), daemon=True).start()
        end = time.time() + timeout
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)/v1", self.log)):
            if self.process.poll() is not None or time.time() > end:
                self.process.kill()
                raise RuntimeError(f"the server did not start ({' '.join(self.argv)}):\n{self.log}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{m.group(1)}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def pid(self) -> int:
        return self.process.pid

    def resources(self) -> dict:
        """The process's resident memory (bytes), open file descriptors and threads, from /proc."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        field = dict(line.split(":", 1) for line in status.splitlines())
        field = {k: v.split()[0] for k, v in field.items() if k in ("VmRSS", "Threads")}
        return {"rss_bytes": int(field["VmRSS"]) * 1024, "threads": int(field["Threads"]),
                "fds": len(list(Path(f"/proc/{self.pid}/fd").iterdir()))}

    def kill(self) -> int:
        self.process.send_signal(signal.SIGKILL)
        return self.process.wait(60)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout)


LLAMA_SERVER = "NANOCOMPILE_LLAMA_SERVER"  # the path of a llama-server binary (docs/SERVER.md, Batched decoding)


def free_port() -> int:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


class LlamaServerProcess(ServerProcess):
    """llama.cpp's own server, llama-server, on a model file: the peer of `serve --parallel`.
    slots: its -np (each slot gets ctx tokens: -c is the slots' total); 2 threads like ours."""

    def __init__(self, binary: str, model_file: str, slots: int, ctx: int, timeout: float = 600):
        import httpx

        port = free_port()
        self.argv = [binary, "-m", str(model_file), "--host", "127.0.0.1", "--port", str(port), "-t", str(THREADS),
                     "-tb", str(THREADS), "-np", str(slots), "-c", str(ctx * slots), "-ngl", "0", "--no-webui"]
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stderr), daemon=True).start()
        self.url = f"http://127.0.0.1:{port}"
        end = time.time() + timeout
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.time() > end:
                self.process.kill()
                raise RuntimeError(f"llama-server did not start ({' '.join(self.argv)}):\n{self.log[-3000:]}")
            time.sleep(0.2)

