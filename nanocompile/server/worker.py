"""One model, one KV cache, one generation at a time: requests wait in a bounded queue and a
single worker thread runs them in order of arrival, off the event loop.

A job is a function run in the worker thread: given should_stop, it yields what the request
answers with (chunks of a stream, or one whole result). Its items reach the event loop through an
asyncio queue. Cancelling a waiting job removes it from the queue at once; cancelling the running
job makes should_stop() true, and generation stops before the next token (or prompt chunk).
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable

Work = Callable[[Callable[[], bool]], Iterable[Any]]


class QueueFull(Exception):
    """Every place in the queue is taken."""


class ShuttingDown(Exception):
    """The server is stopping: the job was cancelled before it ran."""


_END = object()


@dataclass(frozen=True)
class _Failure:
    error: BaseException


class Job:
    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop):
        self.work, self.loop = work, loop
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.started = False

    def push(self, item: Any) -> None:
        """From the worker thread: hands an item to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[Any]:
        """The job's items as they come; raises what the job raised, or ShuttingDown if it was
        cancelled before it started."""
        while True:
            item = await self.items.get()
            if item is _END:
                if not self.started:
                    raise ShuttingDown()
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item


@dataclass
class Stats:
    done: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0
    tokens: int = 0  # tokens generated, by every job


class Engine:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.stats = Stats()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="nanocompile-generation", daemon=True)
        self._thread.start()

    def submit(self, work: Work) -> Job:
        """Queues work; raises QueueFull when max_queue jobs are already waiting."""
        job = Job(work, asyncio.get_running_loop())
        with self._cond:
            if self._closed:
                raise ShuttingDown()
            if len(self._waiting) >= self.max_queue:
                self.stats.rejected += 1
                raise QueueFull()
            self._waiting.append(job)
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: a waiting job leaves the queue now, the running one stops at its
        next token. A job that has finished is left as it is."""
        with self._cond:
            if job.cancelled.is_set():
                return
            job.cancelled.set()
            if job in self._waiting:
                self._waiting.remove(job)
                self.stats.cancelled += 1
                job.push(_END)

    def state(self) -> dict:
        with self._cond:
            return {"queued": len(self._waiting), "busy": self._running is not None, "max_queue": self.max_queue,
                    "requests": {"done": self.stats.done, "cancelled": self.stats.cancelled,
                                 "failed": self.stats.failed, "rejected": self.stats.rejected},
                    "tokens_generated": self.stats.tokens}

    def close(self) -> None:
        """Stops taking jobs; cancels those waiting and the one running."""
        with self._cond:
            self._closed = True
            jobs = list(self._waiting) + ([self._running] if self._running else [])
            self._cond.notify()
        for job in jobs:
            self.cancel(job)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                job = self._running = self._waiting.popleft()
                job.started = True
            outcome = "done"
            try:
                for item in job.work(job.cancelled.is_set):
                    self.stats.tokens += len(getattr(item, "tokens", ()))
                    job.push(item)
            except Exception as e:  # reported to the request's client; the server goes on
                outcome = "failed"
                job.push(_Failure(e))
            finally:
                if job.cancelled.is_set() and outcome == "done":
                    outcome = "cancelled"
                job.push(_END)
                with self._cond:
                    self._running = None
                    setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
