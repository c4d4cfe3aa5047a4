"""/metrics in Prometheus' text format, through prometheus-client, as llama-server has it: requests
by how they ended, tokens fed, reused and generated, the queue, time to first token and decode
speed. One registry per application (not the library's global one), so that several servers in one
process keep their own counts. The request counts and the queue are read from the worker at each
scrape: the same numbers /health shows."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..results import Timings
from .worker import Engine

CONTENT_TYPE = CONTENT_TYPE_LATEST
FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SPEED_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 250)


class _WorkerState:
    """Collects what the worker counts, when scraped."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        state = self.engine.state()
        requests = CounterMetricFamily("nanocompile_requests", "requests, by how they ended (rejected: the queue "
                                       "was full)", labels=["outcome"])
        for outcome, n in state["requests"].items():
            requests.add_metric([outcome], n)
        yield requests
        yield CounterMetricFamily("nanocompile_tokens_generated", "tokens generated, every request",
                                  value=state["tokens_generated"])
        yield GaugeMetricFamily("nanocompile_queue_length", "requests waiting for the worker", value=state["queued"])
        yield GaugeMetricFamily("nanocompile_busy", "requests being answered (at most the slots, --parallel)",
                                value=state["slots_busy"])


class Metrics:
    def __init__(self, engine: Engine):
        self.registry = CollectorRegistry()
        self.registry.register(_WorkerState(engine))
        self.prompt_tokens = Counter("nanocompile_prompt_tokens", "prompt tokens fed to the model",
                                     registry=self.registry)
        self.cached_tokens = Counter("nanocompile_prompt_tokens_cached", "prompt tokens found in the KV cache and "
                                     "not fed again", registry=self.registry)
        self.first_token = Histogram("nanocompile_time_to_first_token_seconds", "from a request's arrival to its "
                                     "first token: the wait in the queue and the prompt", buckets=FIRST_TOKEN_BUCKETS,
                                     registry=self.registry)
        self.decode_speed = Histogram("nanocompile_decode_tokens_per_second", "decode speed of each answer of more "
                                      "than one token", buckets=SPEED_BUCKETS, registry=self.registry)

    def answered(self, timings: Timings, waited: float) -> None:
        """One choice's generation ended; waited: seconds from its request's arrival until it began."""
        self.prompt_tokens.inc(timings.prompt_tokens)
        self.cached_tokens.inc(timings.cached_tokens)
        if timings.generated_tokens:
            self.first_token.observe(waited + timings.prompt_seconds)
        if timings.generated_tokens > 1 and timings.decode_seconds > 0:
            self.decode_speed.observe(timings.decode_tps)

    def text(self) -> bytes:
        return generate_latest(self.registry)
