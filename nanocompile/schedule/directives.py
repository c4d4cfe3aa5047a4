"""The schedule directives: plain data, applied in order by schedule.apply."""
from __future__ import annotations

from dataclasses import dataclass


class ScheduleError(ValueError):
    pass


@dataclass(frozen=True)
class Split:
    """Split loop `loop` into {loop}o (extent // factor) around {loop}i (factor), and a tail loop
    {loop}t for the extent % factor iterations left (omitted when the extent is a known multiple)."""
    loop: str
    factor: int

    def __str__(self) -> str:
        return f"Split({self.loop}, {self.factor})"


@dataclass(frozen=True)
class Reorder:
    """Swap two perfectly nested output loops: `outer` holds only `inner`."""
    outer: str
    inner: str

    def __str__(self) -> str:
        return f"Reorder({self.outer}, {self.inner})"


@dataclass(frozen=True)
class Unroll:
    """Unroll output loop `loop` by `factor`: each iteration runs `factor` copies of the body."""
    loop: str
    factor: int

    def __str__(self) -> str:
        return f"Unroll({self.loop}, {self.factor})"


@dataclass(frozen=True)
class UnrollJam:
    """Unroll output loop `loop` by `factor` and jam the copies' reduction loops into one; the
    copies' accumulators stay in registers (they are privatized locals of the loop body)."""
    loop: str
    factor: int

    def __str__(self) -> str:
        return f"UnrollJam({self.loop}, {self.factor})"


@dataclass(frozen=True)
class Vectorize:
    """Run `lanes` consecutive iterations of output loop `loop` as the lanes of one vector."""
    loop: str
    lanes: int

    def __str__(self) -> str:
        return f"Vectorize({self.loop}, {self.lanes})"


@dataclass(frozen=True)
class Pack:
    """Read parameter `param`, a weight of rows of `row` elements, in the blocked layout
    [rows / block, row / group, block, group]: element (n, k) at
    ((n / block) * (row / group) + k / group) * block * group + (n % block) * group + k % group,
    so `block` consecutive rows are contiguous at each k (one vector load across output columns);
    with group 4, each row's 4 consecutive k are adjacent (one 32-bit lane of a dot product).
    offset > 0 (int8 only): each value v is stored as the unsigned byte v + offset, so a dot
    product takes the weights as vpdpbusd's unsigned side (schedule/unsigned.py).
    bits 5 (with group 4, int8): the stored bytes are within [0, 31] (a GGUF's 5-bit blocks, with
    offset 16) and each 64 of them take 40 bytes: 32 of low nibbles, then the fifth bits as one
    64-bit mask; bits 4 and 6 alike keep bytes within [0, 15] in 32 and [0, 63] in 48
    (schedule/narrow.py); only dot products in 16 lanes read them in vector lanes. With offset 0
    the int8 values must already be within those ranges: they are the stored bytes."""
    param: str
    row: int
    block: int
    group: int = 1
    offset: int = 0
    bits: int = 8

    @property
    def layout(self) -> tuple:
        """(row, block), (row, block, group) or (row, block, group, offset): what the weights file
        is written in (schedule.pack.pack_array's arguments)."""
        if self.bits != 8:
            return (self.row, self.block, self.group, self.offset, self.bits)
        if self.offset:
            return (self.row, self.block, self.group, self.offset)
        return (self.row, self.block) if self.group == 1 else (self.row, self.block, self.group)

    def __str__(self) -> str:
        extra = f", {self.group}" if self.group > 1 or self.offset else ""
        extra += f", offset={self.offset}" if self.offset else ""
        extra += f", bits={self.bits}" if self.bits != 8 else ""
        return f"Pack({self.param}, {self.row}, {self.block}{extra})"


@dataclass(frozen=True)
class DotProduct:
    """Group `width` consecutive iterations of the reduction loop `loop` that adds products of
    two int8 values to an int32 accumulator into one dot product (ir.Dot: vpdpbusd's lane).
    Integer sums are exact, so the grouping changes no value."""
    loop: str
    width: int = 4

    def __str__(self) -> str:
        return f"DotProduct({self.loop}, {self.width})"


@dataclass(frozen=True)
class LaneReduce:
    """Run the max reduction loop `loop` on `lanes` lanes: lane l keeps the maximum of terms l,
    l + lanes, ..., then the lanes' maximum joins the accumulator. max is exact in any
    order; which of two values that compare equal (+0 and -0) or which NaN is kept may differ,
    and the definition (docs/PRIMITIVES.md, reduce_max) leaves both open."""
    loop: str
    lanes: int

    def __str__(self) -> str:
        return f"LaneReduce({self.loop}, {self.lanes})"


@dataclass(frozen=True)
class ByteSums:
    """Take the reduction loop `loop`, which adds consecutive int8 values to a float32 sum that
    starts at 0.0, as one integer sum of the bytes (ir.ByteSum). Every partial sum is an integer
    float32 holds exactly, so the order changes no value (schedule/bytesums.py)."""
    loop: str

    def __str__(self) -> str:
        return f"ByteSums({self.loop})"


@dataclass(frozen=True)
class PrefetchNext:
    """While the row tiles of output loop `rows` read one block of a packed weight (what an
    iteration of output loop `columns` reads over a whole reduction of K steps, n lines of 64 bytes a
    step), fetch the block the next iteration reads into L2: one line per reduction step, row
    tile r taking lines [(r mod n) * K, (r mod n + 1) * K) of it. The hardware prefetcher does
    not cross into the next block in time: the first row tile of each block waited on memory.
    Changes no value."""
    columns: str
    rows: str

    def __str__(self) -> str:
        return f"PrefetchNext({self.columns}, {self.rows})"


@dataclass(frozen=True)
class FetchNextBlock:
    """While the first row tile of output loop `rows` reads a block of a quantized weight (what an
    iteration of output loop `columns` reads over the whole reduction, its quants in storage and
    its scales), fetch the block the next iteration reads: each reduction step fetches the lines
    its own step of the next block holds. A step of a few rows (a verify step, a batched one) has
    one row tile, whose weights otherwise arrive from memory only when it asks for them: its
    arithmetic and the reads wait on each other. Changes no value."""
    columns: str
    rows: str

    def __str__(self) -> str:
        return f"FetchNextBlock({self.columns}, {self.rows})"


@dataclass(frozen=True)
class FetchAhead:
    """While output loop `rows` (one row at a time: a decode step's) reads a quantized weight's
    block front to back, fetch into L1 the lines `bytes` bytes further on in its storage, the
    lines each iteration of the reduction's innermost loop that advances a line or more reads,
    spread over those iterations. The next block lies right after the last one a thread reads,
    so the stream runs on across blocks. The hardware prefetcher alone left a single row's
    8-lane products reading at 0.85-0.9x the rate of the same loop with it. rows == columns: no
    row tiles (a kernel of one row, a decode step's output head; or each row over every column),
    the reductions directly inside the columns. Changes no value."""
    columns: str
    rows: str
    bytes: int

    def __str__(self) -> str:
        return f"FetchAhead({self.columns}, {self.rows}, {self.bytes})"


@dataclass(frozen=True)
class AmxSums:
    """After Unpack(param, at): the row tiles inside `at` (its copy over the rebuilt bytes) read
    each super-block's integer sums of param, which AMX tiles compute once per column block for
    all their rows, instead of summing the sub-blocks' dot products themselves
    (schedule/tiles.py). Only on a target with AMX; the sums are the same integers."""
    param: str
    at: str

    def __str__(self) -> str:
        return f"AmxSums({self.param}, {self.at})"


@dataclass(frozen=True)
class RowSlices:
    """Run a call over more than `rows` rows as consecutive calls over slices of at most `rows`
    (equal slices, whole 16-row tiles where the rows allow), each with its row-stored buffers
    offset to the slice's first row. Where each column block reads every row's activations (AMX
    tile sums over a deep projection), a slice's activations and sums stay in L2 from one column
    block to the next. A row's numbers do not depend on the rows beside it, so no value changes;
    only a kernel that reads no past may take it."""
    rows: int

    def __str__(self) -> str:
        return f"RowSlices({self.rows})"


@dataclass(frozen=True)
class Unpack:
    """Rebuild the bytes of param (a weight Pack keeps in 4-6 bits) that the dot products inside
    loop `at` read, once, before it, into a local array they then read in 8 bits: a prefill
    chunk's row tiles rebuild each weight once instead of once per tile (schedule/unpack.py).
    Skipped when `at` runs no iteration. The bytes are the same, so no value changes."""
    param: str
    at: str

    def __str__(self) -> str:
        return f"Unpack({self.param}, {self.at})"


@dataclass(frozen=True)
class PairSums:
    """Keep each int32 sum of param's dot products (param kept in 4-6 bits, read unsigned at 8
    lanes) that starts at zero and is summed by one loop as vpmaddubsw's int16 pairs, added with
    vpaddw and widened once where the sum is read (schedule/pairs.py): where the largest such sum
    fits int16, so no value changes. With VNNI the pairs are plain int32 sums (vpdpbusd)."""
    param: str

    def __str__(self) -> str:
        return f"PairSums({self.param})"


@dataclass(frozen=True)
class MinPairs:
    """Sum a super-block's mins term (each row's activation sum of a sub-block times the column's
    int8 min, over the sub-blocks of loop `loop`) two sub-blocks at a time in the int16 halves of
    each lane, one vpdpwssd per pair, in a loop of its own after `loop` (schedule/minpairs.py):
    where the activation sums fit int16, so every sum is the same integer."""
    loop: str

    def __str__(self) -> str:
        return f"MinPairs({self.loop})"


@dataclass(frozen=True)
class Parallel:
    """Split the iterations of loop `loop` across the threads."""
    loop: str

    def __str__(self) -> str:
        return f"Parallel({self.loop})"
