"""What DVM_DEBUG and DVM_DUMP_DIR show: fusion groups (2), graph IR (3), disassembly (4)."""
from __future__ import annotations

import os
import sys

from ..codegen.disasm import disasm
from ..codegen.program import Program
from ..config import config
from ..graph.node import topo_order


def graph_ir(outputs) -> str:
    names: dict = {}
    lines = []
    for node in topo_order(outputs):
        names[node] = f"%{len(names)}"
        args = ", ".join(names[i] for i in node.inputs)
        lines.append(f"  {names[node]} = {node!r}({args})")
    lines.append("  return " + ", ".join(names[o] for o in outputs))
    return "\n".join(lines)


def report(compiled) -> str:
    """Fusion groups of a CompiledGraph, one line each, with their stores."""
    plan = compiled.plan
    lines = [f"{len(plan.groups)} vector kernel(s), {len(plan.workspaces)} workspace(s)"]
    for g, t in zip(plan.groups, compiled.templates):
        lines.append("  " + g.describe() + f"; {len(t.instrs)} instructions, {len(t.sweeps)} sweep(s)")
    return "\n".join(lines)


def on_compile(compiled) -> None:
    level = config().debug
    if level >= 2:
        print("[dvm] compiled graph:\n" + report(compiled), file=sys.stderr)
    if level >= 3:
        print("[dvm] graph IR:\n" + graph_ir(compiled.outputs), file=sys.stderr)


def on_encode(program: Program, encode_us: float) -> None:
    cfg = config()
    if cfg.debug >= 1:
        print(f"[dvm] encoded {program!r} in {encode_us:.1f} us", file=sys.stderr)
    if cfg.debug >= 4:
        print(disasm(program), file=sys.stderr)
    if cfg.dump_dir:
        os.makedirs(cfg.dump_dir, exist_ok=True)
        base = os.path.join(cfg.dump_dir, f"program_{program.digest}")
        program.save(base + ".npy")
        with open(base + ".txt", "w") as f:
            f.write(disasm(program) + "\n")
