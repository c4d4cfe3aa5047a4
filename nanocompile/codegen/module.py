"""What the compiler makes: a Module, a compiled step program, the data code generation renders
into one library. A leaf: the driver builds a Module, codegen and the engine read it."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from ..ir.signature import Signature
from ..loopir.ir import Kernel, Program
from ..loopir.plan import MemoryPlan
from ..schedule.program import kernel_digest, tuned_map
from ..version import GENERATOR
from .data import sources_digest
from .layout import WeightSlot
from .options import Options

@dataclass
class Module:
    """A compiled step program: what codegen renders into one library."""
    signature: Signature
    options: Options
    isa: list[str]
    kernels: dict[str, Kernel]
    variants: dict[str, Program]
    plans: dict[str, MemoryPlan]
    weights: list[WeightSlot]
    consts: dict[str, np.ndarray]
    state_blocks: dict[str, int] = field(default_factory=dict)  # state array -> positions per block
    # the batched step: the "all" variant's calls in groups that run once per sequence, and its
    # memory plan (loopir/segments.py); no plan: the program has no batched step
    batch_groups: list = field(default_factory=list)
    batch_plan: MemoryPlan | None = None

    @property
    def precision(self) -> str:
        return self.options.precision

    @property
    def march(self) -> str:
        return self.options.march

    @property
    def max_chunk(self) -> int:
        return self.options.max_chunk

    @property
    def prefix(self) -> str:
        """The C symbol prefix: the signature's name plus a short hash of what it is compiled for."""
        return f"{self.signature.name}_{self.fingerprint_hash[:10]}_"

    @property
    def fingerprint(self) -> dict:
        o = self.options
        return {"generator": GENERATOR, "sources": sources_digest(), "config": self.signature.config, "precision": o.precision,
                "max_chunk": o.max_chunk, "march": o.march, "isa": self.isa, "fused": o.fuse,
                "scheduled": o.schedule, "fma": o.fma, "tuned": self.tuned_hash, "narrow": self.narrow_hash,
                "superblocks": [list(x) for x in o.superblocks] or None}

    @property
    def narrow_weights(self) -> list[str]:
        """The weights kept in fewer than 8 bits (schedule/narrow.py)."""
        return [w.name for w in self.weights if len(w.packed) == 5 and w.packed[4] < 8]

    @property
    def narrow_hash(self) -> str | None:
        names = [(w.name, w.packed[4]) for w in self.weights if w.name in self.narrow_weights]
        return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:20] if names else None

    @property
    def tuned_hash(self) -> str | None:
        """The measured schedules this module uses instead of recipes (None: the recipes alone)."""
        used = sorted((name, [str(d) for d in self.kernels[name].schedule]) for name in self.tuned_kernels)
        return hashlib.sha256(json.dumps(used).encode()).hexdigest()[:20] if used else None

    @property
    def fingerprint_json(self) -> str:
        return json.dumps(self.fingerprint, sort_keys=True, separators=(",", ":"))

    @property
    def fingerprint_hash(self) -> str:
        return hashlib.sha256(self.fingerprint_json.encode()).hexdigest()

    @property
    def tuned_kernels(self) -> list[str]:
        """The kernels whose schedule was measured on this machine rather than a recipe's."""
        table = tuned_map(self.options.tuned)
        return [name for name, k in self.kernels.items()
                if kernel_digest(k) in table and table[kernel_digest(k)][0] == k.schedule]

    @property
    def stale_tuned_kernels(self) -> list[str]:
        """Kernels with a measured schedule that is not used: measured against a recipe that has
        changed since (or no longer legal). `nanocompile tune` measures them again."""
        table = tuned_map(self.options.tuned)
        return [name for name, k in self.kernels.items()
                if kernel_digest(k) in table and table[kernel_digest(k)][0] != k.schedule]

    @property
    def weights_bytes(self) -> int:
        last = self.weights[-1]
        return last.offset + last.nbytes

    @property
    def layout_hash(self) -> str:
        """Identifies the packed weights file layout this library reads."""
        table = [(w.name, w.shape, w.offset, w.nbytes, list(w.packed)) for w in self.weights]
        what = [self.signature.config, self.precision, table]  # the kernels only through the layouts
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    @property
    def arena_bytes(self) -> int:
        plans = list(self.plans.values()) + ([self.batch_plan] if self.batch_plan else [])
        return max(p.arena_bytes for p in plans)
