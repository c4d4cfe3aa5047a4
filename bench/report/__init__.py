"""`python -m bench.report`: issue 15's benchmark, one command from measurement to docs/BENCHMARKS.md.

Every engine on the same weights, each in its own process (so no two thread pools are ever
alive at once), alternating in rounds; speed (llama-bench's pp512 and tg128, a depth sweep,
prompt lengths, 1 and 2 threads) beside the machine's probe and each engine's roofline,
accuracy (perplexity, KL divergence and top-token agreement) and cost (compile time, cache disk,
peak memory). Every measurement is recorded as it finishes in bench/runs/<run id>/records.jsonl,
so an interrupted run resumes where it stopped.

Modules, one job each: plan (what is measured), engines (the engine list), runners (an engine
opened inside a worker), speed / quality / costs / prepare (the worker processes), jobs (running
a worker, resuming), roofline, stats, plots, document.
"""
