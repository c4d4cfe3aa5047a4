"""What tests and benchmarks share, outside the product package: measure.py (threads, the machine,
statistics, sign tests, the one timer, bench/results.jsonl), tiny.py (tiny Qwen2 models and their
GGUF and Hugging Face files), oracle.py (transformers' Qwen2 in float32) and peer.py (llama.cpp:
requantized files, an engine, ggml's C reference). Each imports its heavy dependency only when used."""
