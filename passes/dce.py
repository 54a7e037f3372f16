"""dce: pure ops whose results nothing reads are dropped.

Before:  %1 = stablehlo.broadcast_in_dim %c ... : tensor<2x16x8192x16384xf32>   (never read)
After:   (gone)

Shape and mesh reduction rewrite a pair and leave such ops behind (a splat a rescaled
constant replaced), and the real programs hold some too (broadcasts `stack_writes` leaves
unread). They compute nothing the outputs depend on, yet tv simulated them, and a dead
broadcast that no class ties to the batch kept its real batch through shape and mesh
reduction: at TrainVerify's 8,192-device plan, 30 such broadcasts were 15 of the reduced
spec's 17 million elements. The pipeline drops them from the rewritten pair before it is
simulated (`pipeline._reduce_and_prove`), not before shape reduction reads the programs:
its dimension classes are tied through every op, read or not, and some programs shrink
only through ties a dead broadcast makes. Only ops `cse` treats as pure and without
regions are dropped (collectives, RNG, custom calls, calls and I/O stay); a value read
anywhere, in a nested region too, is live.
"""

from __future__ import annotations

from tv_ir.ir.program import Block, Module, walk

from .cse import KEEP

name = "dce"


def run(module: Module) -> Module:
    for fn in module.functions.values():
        _drop_dead(fn.body)
    return module


def _drop_dead(body: Block) -> None:
    """Drop from `body` and its nested blocks every pure op whose results nothing live
    reads, in one backward sweep: each op is met after every op that reads it (later ops
    of its block and the ops nested in them), so a dead chain goes at once, however long."""
    ops = list(walk(body))
    reads = read_counts(body, ops)
    dead: set[int] = set()
    for op in reversed(ops):
        if op.regions or op.name in KEEP or not op.results:
            continue
        if any(reads.get(r.id, 0) for r in op.results):
            continue
        dead.add(id(op))
        for v in op.operands:
            reads[v.id] -= 1
    if dead:
        for block in _blocks(body):
            block.ops = [op for op in block.ops if id(op) not in dead]


def read_counts(body: Block, ops: list | None = None) -> dict[int, int]:
    """How many times each value is read in `body` and the blocks nested in it (`ops`:
    `walk(body)`'s ops, when the caller has them)."""
    reads: dict[int, int] = {}
    for v in body.results:
        reads[v.id] = reads.get(v.id, 0) + 1
    for op in walk(body) if ops is None else ops:
        for v in op.operands:
            reads[v.id] = reads.get(v.id, 0) + 1
        for region in op.regions:
            for v in region.block.results:
                reads[v.id] = reads.get(v.id, 0) + 1
    return reads


def _blocks(body: Block):
    yield body
    for op in walk(body):
        for region in op.regions:
            yield region.block
