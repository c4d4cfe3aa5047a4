"""The nanocompile command line: `nanocompile run`, `nanocompile graph`."""
from __future__ import annotations

import argparse
import os
import sys

from .errors import NanocompileError


def _threads(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"threads must be >= 0 (0 = all cores), got {n}")
    return n


def _set_threads(n: int) -> None:
    # the interpreter's matmuls run on NumPy's BLAS; it reads these before it starts
    count = str(n or os.cpu_count() or 1)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = count


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise NanocompileError(f"--prompt-ids wants integers separated by spaces, got {text!r}") from None


def cmd_run(args) -> int:
    _set_threads(args.threads)
    from .generate_text import TextStream, generate
    from .models import load_model
    from .sampling import Sampler, SamplingParams
    from .session import open_session

    sampler = Sampler(SamplingParams(args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty,
                                     args.repeat_last_n, args.seed))  # checked before the model loads
    model = load_model(args.model, progress=not args.quiet)
    tok = model.tokenizer
    if args.prompt_ids is not None:
        prompt_ids = _parse_ids(args.prompt_ids)
    else:
        if tok is None:
            raise NanocompileError(f"{model.source} has no tokenizer; use --prompt-ids")
        if args.prompt is None and args.file is None:
            raise NanocompileError("no prompt: give -p TEXT, -f FILE or --prompt-ids")
        text = args.prompt
        if args.file is not None:
            try:
                with open(args.file, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise NanocompileError(f"{args.file}: cannot read prompt file ({e.strerror})") from None
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": text})
            text = tok.render_chat(messages)
        prompt_ids = tok.encode(text)
    if not prompt_ids:
        raise NanocompileError("the prompt is empty")

    n_ctx = args.ctx_size if args.ctx_size is not None else min(4096, model.config.max_position_embeddings)
    session = open_session(model, args.backend, n_ctx=n_ctx, threads=args.threads, progress=not args.quiet)
    stop = set(tok.eos_ids) if tok else set()
    out = sys.stdout

    def write(text):
        out.write(text)
        out.flush()

    if args.ids:
        on_token = None
    else:
        stream = TextStream(tok, write)

        def on_token(token):
            if token not in stop:  # like llama-cli, the end-of-text token is not printed
                stream(token)
    sampler.accept(prompt_ids)
    result = generate(session, prompt_ids, args.n_predict, stop, on_token, sampler)
    if args.ids:
        write(" ".join(str(t) for t in result.tokens) + "\n")
    else:
        stream.flush()
        write("\n")
    if result.stop_reason == "context":
        print(f"stopped: the context of {session.n_ctx} tokens is full", file=sys.stderr)
    print(f"prompt: {result.prompt_tokens} tokens, {result.prompt_seconds * 1000:.1f} ms, "
          f"{result.prompt_tps:.2f} tok/s | generation: {len(result.tokens)} tokens, "
          f"{result.decode_tps:.2f} tok/s | backend {session.backend_name} | seed {sampler.seed}", file=sys.stderr)
    return 0


def cmd_graph(args) -> int:
    from .frontend import Qwen2Config, build_qwen2
    from .ir import format_graph

    if args.model:
        from .models import load_model
        cfg = load_model(args.model, progress=not args.quiet).config
    else:
        cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936)
    if args.layers is not None:
        cfg = Qwen2Config(**{**cfg.__dict__, "num_hidden_layers": args.layers})
    graph = build_qwen2(cfg)
    if args.passes:
        from .passes.cse import cse
        from .passes.fold import fold_constants
        graph = fold_constants(cse(graph))
    if args.print:
        sys.stdout.write(format_graph(graph))
        return 0
    from .graph_stats import node_counts
    counts = node_counts(graph, cfg.num_hidden_layers)
    print(f"nodes, whole model ({cfg.num_hidden_layers} layers): {counts['total']}")
    print(f"nodes per transformer block: {counts['per_block']}")
    print(f"nodes outside the blocks: {counts['outside']}")
    print("per block: " + ", ".join(f"{op} {n}" for op, n in counts["block_ops"].items()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanocompile", description="An ahead-of-time compiler for Qwen2.")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="generate text from a prompt")
    run.add_argument("-m", "--model", default="default", help="'default', a GGUF file or a Hugging Face directory")
    run.add_argument("-p", "--prompt", help="prompt text")
    run.add_argument("-f", "--file", help="read the prompt from this file")
    run.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate (-1: until end of text)")
    run.add_argument("-c", "--ctx-size", type=int, help="context size in tokens (default: 4096 or the model's maximum)")
    run.add_argument("-t", "--threads", type=_threads, default=2,
                     help="threads (0 = all cores); the interpreter passes them to NumPy's BLAS")
    sampling = run.add_argument_group("sampling (llama.cpp's defaults; --temp 0 is greedy)")
    sampling.add_argument("-s", "--seed", type=int, default=-1, help="random seed (-1: a random one, printed)")
    sampling.add_argument("--temp", type=float, default=0.8, help="temperature (<= 0: greedy)")
    sampling.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens (0: off)")
    sampling.add_argument("--top-p", type=float, default=0.95, help="keep the smallest set reaching this probability")
    sampling.add_argument("--min-p", type=float, default=0.05, help="drop tokens below min-p x the top probability")
    sampling.add_argument("--repeat-penalty", type=float, default=1.0, help="penalize recent tokens (1.0: off)")
    sampling.add_argument("--repeat-last-n", type=int, default=64, help="recent tokens the penalty looks at")
    run.add_argument("--chat", action="store_true", help="apply the model's chat template")
    run.add_argument("--system", help="system message (with --chat)")
    run.add_argument("--prompt-ids", help="token ids instead of a prompt, e.g. '1 2 3'")
    run.add_argument("--ids", action="store_true", help="print generated token ids instead of text")
    run.add_argument("--backend", choices=["compiled", "interp"], default="compiled",
                     help="compiled: the whole-model C library (default); interp: the NumPy interpreter")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)

    graph = sub.add_parser("graph", help="node counts of the Qwen2 graph, or the graph itself")
    graph.add_argument("-m", "--model", help="take the config from this model (default: Qwen2.5-0.5B's)")
    graph.add_argument("--layers", type=int, help="override the number of layers")
    graph.add_argument("--print", action="store_true", help="print the graph IR")
    graph.add_argument("--passes", action="store_true", help="after common-subexpression elimination and folding")
    graph.add_argument("-q", "--quiet", action="store_true")
    graph.set_defaults(func=cmd_graph)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except NanocompileError as e:
        print(f"nanocompile: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nnanocompile: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
