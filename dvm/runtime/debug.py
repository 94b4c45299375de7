"""What DVM_DEBUG and DVM_DUMP_DIR show: fusion groups (2), graph IR (3), disassembly (4).

Dump files are written safely in a directory others may write to: each is written to a new file
created exclusively (mkstemp: O_CREAT | O_EXCL, never through an existing name or link) and then
renamed over its final name, which replaces a file or link planted there instead of writing
through it."""
from __future__ import annotations

import io
import os
import sys
import tempfile

import numpy as np

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
        name = f"program_{program.digest}"
        npy = io.BytesIO()
        np.save(npy, program.words, allow_pickle=False)
        write_new(cfg.dump_dir, name + ".npy", npy.getvalue())
        write_new(cfg.dump_dir, name + ".txt", (disasm(program) + "\n").encode())


def write_new(directory: str, name: str, data: bytes) -> str:
    """Write `data` to directory/name without following a link or opening a file that exists:
    a fresh temporary file in the same directory, renamed over `name`. Returns the path."""
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        path = os.path.join(directory, name)
        os.replace(tmp, path)
        return path
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
