"""When an output may be written into the memory of an input (an in-place update, `p.add_(g)`).

A VM runs a kernel's instruction stream tile by tile, in order; a tile loads the elements of an
unviewed operand over its own part of the domain only. A VM may keep a loaded tile in the
buffer itself (the CPU VM's registers point into contiguous inputs) and may compute the value
a store writes directly into the output. So output `out` may occupy exactly the memory of input
`slot` (the same elements at the same addresses: equal shape and dtype, both row-major) when:

- exactly one kernel of the graph reads the input, and that kernel stores the output;
- that kernel has no reductions (one sweep: nothing reads the input again after a store);
- it loads the input once, with no view (each element by the point of the domain that stores it);
- the output is stored unviewed over the kernel's whole domain;
- in the kernel's stream, every instruction that reads a register loaded from the input comes
  no later than the one computing the stored value (which may read it, element by element).

Then every element is read before it is overwritten and never read after. The caller checks the
tensors: the output's memory is the input's, row-major, and no other input overlaps it.
"""
from __future__ import annotations

from typing import Sequence

from ..codegen import isa
from ..codegen.lower import KernelTemplate
from ..codegen.program import OPND_ARG
from ..graph.node import Node


def may_overwrite(templates: Sequence[KernelTemplate], n_inputs: int, inputs: Sequence[Node],
                  outputs: Sequence[Node], out: int, slot: int) -> bool:
    """Whether output `out` may be written into input `slot`'s memory (module docstring)."""
    src, dst = inputs[slot], outputs[out]
    if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
        return False
    readers = [t for t in templates if any(o.kind == OPND_ARG and o.slot == slot for o in t.operands)]
    if len(readers) != 1:
        return False
    t = readers[0]
    if t.axes or t.group.reductions or len(t.sweeps) != 1 or tuple(t.shape) != tuple(dst.shape):
        return False
    loads = [o for o in t.operands if o.kind == OPND_ARG and o.slot == slot]
    if len(loads) != 1 or loads[0].chain:
        return False
    stores = [s for s in t.group.stores if s.slot == n_inputs + out]
    if len(stores) != 1 or stores[0].view is not None or tuple(stores[0].value.shape) != tuple(t.shape):
        return False
    store_opnd = next(j for j, o in enumerate(t.operands)
                      if o.kind == OPND_ARG and o.slot == n_inputs + out and not o.chain)
    return _reads_precede_store(t.instrs.tolist(), t.operands.index(loads[0]), store_opnd)


def _reads_precede_store(rows: list, load_opnd: int, store_opnd: int) -> bool:
    """Every read of a register loaded from operand load_opnd comes no later than the instruction
    computing the value that the (one) store to operand store_opnd writes."""
    loaded: set = set()     # (bank, register) holding the input's tile
    writer: dict = {}       # (bank, register) -> the instruction that last wrote it
    last_read, produced_at = -1, None
    for i, row in enumerate(rows):
        spec = isa.BY_CODE[row[0]]
        srcs = [(f.bank, row[1 + j]) for j, f in enumerate(spec.fields) if f.role in "sm"]
        dsts = [(f.bank, row[1 + j]) for j, f in enumerate(spec.fields) if f.role in "dm"]
        opnd = next((row[1 + j] for j, f in enumerate(spec.fields) if f.role == "o"), None)
        if loaded.intersection(srcs):
            last_read = i
        if spec.group == "store" and opnd == store_opnd:
            if produced_at is not None:
                return False                          # stored twice
            produced_at = writer.get(srcs[0], len(rows))
        for r in dsts:
            loaded.discard(r)
            writer[r] = i
        if spec.group == "load" and opnd == load_opnd:
            loaded.update(dsts)
    return produced_at is not None and last_read <= produced_at
