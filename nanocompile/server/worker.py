"""Requests wait in a bounded queue and worker threads run them in order of arrival, off the
event loop: one worker per lane, a lane being what a generation runs on (a model and its KV cache;
with --parallel N, one of the N sequences whose decoding steps run together, engine/batcher.py).

A job is a function run in a worker thread: given should_stop and its lane, it yields what the
request answers with (chunks of a stream, or one whole result). Its items reach the event loop
through an asyncio queue. A waiting job goes to a free lane, the one whose cached tokens share the
longest start with its prompt where the engine is told how to ask (affinity), as llama-server picks
a slot. Cancelling a waiting job removes it from the queue at once; cancelling a running job makes
should_stop() true, and generation stops before the next token (or prompt chunk), freeing its lane.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

Work = Callable[[Callable[[], bool], Any], Iterable[Any]]


class QueueFull(Exception):
    """Every place in the queue is taken."""


class ShuttingDown(Exception):
    """The server is stopping: the job was cancelled before it ran."""


_END = object()


@dataclass(frozen=True)
class _Failure:
    error: BaseException


class Job:
    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop, prompt: Sequence[int] = ()):
        self.work, self.loop, self.prompt = work, loop, prompt
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
    def __init__(self, max_queue: int, lanes: Sequence[Any] = (None,),
                 affinity: Callable[[Any, Job], int] | None = None):
        """lanes: what each worker hands its jobs (one worker each); affinity(lane, job): how well
        a free lane suits a waiting job (the tokens its cache shares with the prompt)."""
        self.max_queue = max_queue
        self.lanes = list(lanes)
        self.affinity = affinity
        self.stats = Stats()
        self._waiting: deque[Job] = deque()
        self._running: list[Job | None] = [None] * len(self.lanes)
        self._assigned: list[Job | None] = [None] * len(self.lanes)
        self._closed = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"nanocompile-generation-{i}",
                                          daemon=True) for i in range(len(self.lanes))]
        for t in self._threads:
            t.start()

    def submit(self, work: Work, prompt: Sequence[int] = ()) -> Job:
        """Queues work; raises QueueFull when max_queue jobs are already waiting."""
        job = Job(work, asyncio.get_running_loop(), prompt)
        with self._cond:
            if self._closed:
                raise ShuttingDown()
            if len(self._waiting) >= self.max_queue and not self._free():
                self.stats.rejected += 1
                raise QueueFull()
            self._waiting.append(job)
            self._dispatch()
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: a waiting job leaves the queue now, a running one stops at its
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
            running = sum(j is not None for j in self._running) + sum(j is not None for j in self._assigned)
            return {"queued": len(self._waiting), "busy": running > 0, "slots": len(self.lanes),
                    "slots_busy": running, "max_queue": self.max_queue,
                    "requests": {"done": self.stats.done, "cancelled": self.stats.cancelled,
                                 "failed": self.stats.failed, "rejected": self.stats.rejected},
                    "tokens_generated": self.stats.tokens}

    def close(self) -> None:
        """Stops taking jobs; cancels those waiting and those running."""
        with self._cond:
            self._closed = True
            jobs = list(self._waiting) + [j for j in self._running + self._assigned if j is not None]
            self._cond.notify_all()
        for job in jobs:
            self.cancel(job)

    def _free(self) -> list[int]:
        return [i for i in range(len(self.lanes)) if self._running[i] is None and self._assigned[i] is None]

    def _dispatch(self) -> None:
        """Hands waiting jobs to free lanes, in order of arrival (holding _cond)."""
        free = self._free()
        while self._waiting and free:
            job = self._waiting.popleft()
            lane = max(free, key=lambda i: self.affinity(self.lanes[i], job)) if self.affinity and len(free) > 1 \
                else free[0]
            free.remove(lane)
            self._assigned[lane] = job
        self._cond.notify_all()

    def _loop(self, lane: int) -> None:
        while True:
            with self._cond:
                while self._assigned[lane] is None and not self._closed:
                    self._cond.wait()
                job = self._assigned[lane]
                if job is None:
                    return
                self._assigned[lane], self._running[lane] = None, job
                job.started = True
            outcome = "done"
            try:
                for item in job.work(job.cancelled.is_set, self.lanes[lane]):
                    with self._cond:
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
                    self._running[lane] = None
                    setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
                    self._dispatch()
