"""The nanocompile command line: run, chat, serve, bench, compile, tune, info, graph, cache. One module per command."""
from __future__ import annotations

import argparse
import sys

from ..errors import NanocompileError
from . import bench, cache, chat, compile, graph, info, run, serve, tune


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanocompile", description="An ahead-of-time compiler for Qwen2.")
    sub = p.add_subparsers(dest="command", required=True)
    for command in (run, chat, serve, bench, compile, tune, info, graph, cache):
        command.add_parser(sub)
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
