"""`nanocompile cache verify`: every cache entry checked in full (every byte against its
checksum), with what is stale; `nanocompile cache clean`: removes what is stale, orphaned or
damaged, and temporary files of killed runs."""
from __future__ import annotations

import sys
import time


def _size(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB" if n >= 2 ** 20 else f"{n} B"


def _current():
    from ..cache.inventory import Current
    from ..engine.pack import PACKER
    from ..engine.warm import RECORD_VERSION
    from ..models import default_model
    from ..models.tokenizer import builder_digest
    from ..version import GENERATOR

    return Current(GENERATOR, PACKER, default_model.NAME, default_model.SHA256, builder_digest(), RECORD_VERSION)


def _relative(path, root) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def cmd_verify(args) -> int:
    from ..cache.inventory import survey
    from ..cache.location import cache_root

    root = cache_root().path
    start = time.perf_counter()
    entries = survey(root, _current())
    for e in entries:
        why = e.problem or e.stale or ""
        print(f"{e.state:8} {e.kind:15} {_size(e.size):>10}  {_relative(e.path, root)}" + (f": {why}" if why else ""))
    damaged = [e for e in entries if e.problem]
    stale = [e for e in entries if not e.problem and e.stale]
    total = sum(e.size for e in entries)
    print(f"cache {root}: {len(entries)} entries, {_size(total)}, checked in {time.perf_counter() - start:.1f} s: "
          f"{len(entries) - len(damaged) - len(stale)} ok, {len(damaged)} damaged, {len(stale)} stale "
          f"({_size(sum(e.size for e in damaged + stale))}; `nanocompile cache clean` removes them)", file=sys.stderr)
    return 1 if damaged else 0


def cmd_clean(args) -> int:
    from ..cache.inventory import remove, survey
    from ..cache.location import cache_root

    root = cache_root().path
    entries = [e for e in survey(root, _current()) if e.problem or e.stale]
    freed, kept = 0, 0
    for e in entries:
        why = e.problem or e.stale
        if args.dry_run:
            print(f"would remove {_relative(e.path, root)} ({_size(e.size)}): {why}")
            freed += e.size
            continue
        failed = remove(e)
        if failed:
            print(f"kept    {_relative(e.path, root)}: {failed}")
            kept += 1
        else:
            print(f"removed {_relative(e.path, root)} ({_size(e.size)}): {why}")
            freed += e.size
    verb = "would free" if args.dry_run else "freed"
    print(f"cache {root}: {verb} {_size(freed)} in {len(entries) - kept} entries"
          + (f"; {kept} kept" if kept else ""), file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="check or clean the cache")
    actions = p.add_subparsers(dest="action", required=True)
    verify = actions.add_parser("verify", help="check every cache entry in full; exit status 1 if any is damaged")
    verify.set_defaults(func=cmd_verify)
    clean = actions.add_parser("clean", help="remove stale, orphaned and damaged entries")
    clean.add_argument("-n", "--dry-run", action="store_true", help="say what would be removed, remove nothing")
    clean.set_defaults(func=cmd_clean)
