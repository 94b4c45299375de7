"""Self-contained reproducers of a kernel launch (`.npz`, no pickle) and `dvm repro FILE`.

A reproducer holds what one launch of a torch-backend segment ran: its Program's words, the
input buffers the Program addresses (each the 1-D span of memory an input covered; bf16 stored as
its 16-bit patterns), the sizes and dtypes of the output and workspace buffers, and per output
the float64 reference, eager PyTorch's result in the same dtype and DVM's result at capture time,
plus a JSON header (kernel name, ATen ops, model, VM, sizes, which outputs are reductions'
results: verify_metrics' accumulating rule). Replaying builds a Program from the words,
runs it on each VM through dvm.execute (which verifies it first: a Program the verifier rejects is
never run) and measures each VM's outputs against the float64 reference with the verification
mode's metrics and rules (tools/verify_metrics).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import torch

from ..codegen.program import Program
from ..graph.dtypes import DType
from ..runtime.launch import execute
from .verify_metrics import compare

FORMAT = "dvm-repro-1"
_BF16 = np.dtype(ml_dtypes.bfloat16)


def _store(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint16) if a.dtype == _BF16 else a


def _restore(a: np.ndarray, code: int) -> np.ndarray:
    dt = DType(int(code))
    return a.view(_BF16) if dt is DType.BFLOAT16 else a.astype(dt.np_dtype, copy=False)


def _code(dt: np.dtype) -> int:
    for d in DType:
        if d.np_dtype == dt:
            return int(d)
    raise ValueError(f"no DVM dtype for {dt}")


@dataclass
class Repro:
    program: Program
    inputs: list            # 1-D input buffers
    outputs: list           # (shape, NumPy dtype) per Program output
    workspaces: list        # (numel, NumPy dtype)
    expected: dict          # Program output index -> float64 (or int/bool) reference
    eager: dict             # ... -> eager PyTorch's result, same dtype
    captured: dict          # ... -> DVM's result when the reproducer was written
    meta: dict


def write(path: str, program: Program, inputs: list, outputs: list, workspaces: list,
          expected: dict, eager: dict, captured: dict, meta: dict) -> str:
    """Write a reproducer; returns its path. Arrays are NumPy (bf16 as ml_dtypes)."""
    arrays = {"format": np.array(FORMAT), "program": np.asarray(program.words, np.int64),
              "meta": np.array(json.dumps(meta, sort_keys=True)),
              "in_dtypes": np.array([_code(b.dtype) for b in inputs], np.int64),
              "out_dtypes": np.array([_code(np.dtype(dt)) for _, dt in outputs], np.int64),
              "out_shapes": np.array(json.dumps([list(map(int, s)) for s, _ in outputs])),
              "ws_dtypes": np.array([_code(np.dtype(dt)) for _, dt in workspaces], np.int64),
              "ws_numels": np.array([int(n) for n, _ in workspaces], np.int64)}
    for i, b in enumerate(inputs):
        arrays[f"in{i}"] = _store(b)
    for name, table in (("expected", expected), ("eager", eager), ("captured", captured)):
        for k, a in table.items():
            arrays[f"{name}{k}"] = _store(a)
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def load(path: str) -> Repro:
    """Read a reproducer (no pickle). ValueError for a file that is not one."""
    with np.load(path, allow_pickle=False) as z:
        if "format" not in z.files or str(z["format"]) != FORMAT:
            raise ValueError(f"{path} is not a DVM reproducer ({FORMAT})")
        words = np.ascontiguousarray(z["program"])
        if words.dtype != np.int64 or words.ndim != 1:
            raise ValueError(f"{path}: the program is not a 1-D int64 array")
        in_codes, out_codes = z["in_dtypes"].tolist(), z["out_dtypes"].tolist()
        shapes = json.loads(str(z["out_shapes"]))
        outputs = [(tuple(s), DType(int(c)).np_dtype) for s, c in zip(shapes, out_codes)]
        tables: dict = {"expected": {}, "eager": {}, "captured": {}}
        for name, table in tables.items():
            for k in range(len(outputs)):
                key = f"{name}{k}"
                if key in z.files:   # the reference is float64 (or int / bool): stored as it is
                    table[k] = z[key] if name == "expected" else _restore(z[key], out_codes[k])
        return Repro(program=Program(words),
                     inputs=[_restore(z[f"in{i}"], c) for i, c in enumerate(in_codes)],
                     outputs=outputs,
                     workspaces=[(int(n), DType(int(c)).np_dtype)
                                 for n, c in zip(z["ws_numels"].tolist(), z["ws_dtypes"].tolist())],
                     expected=tables["expected"], eager=tables["eager"], captured=tables["captured"],
                     meta=json.loads(str(z["meta"])))


def _torch(a: np.ndarray) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def run_on(repro: Repro, vm: str) -> list[np.ndarray]:
    """The Program's outputs on `vm` (verified first: VerifyError for a malformed Program)."""
    outs = [np.zeros(int(np.prod(s, dtype=np.int64)), dt) for s, dt in repro.outputs]
    ws = [np.zeros(n, dt) for n, dt in repro.workspaces]
    execute(repro.program, [np.ascontiguousarray(b) for b in repro.inputs] + outs + ws, vm=vm)
    return [o.reshape(s) for o, (s, _) in zip(outs, repro.outputs)]


def replay(repro: Repro, vm: str) -> list[dict]:
    """Per output with a reference: the comparison (verify_metrics.compare) of `vm`'s result."""
    outs = run_on(repro, vm)
    rows = []
    for k, ref in sorted(repro.expected.items()):
        got = _torch(outs[k])
        eager = _torch(repro.eager[k]) if k in repro.eager else got
        row = compare(got, eager, _torch(ref), bool(repro.meta.get("accumulating", {}).get(str(k), False)))
        row["output"] = k
        cap = repro.captured.get(k)
        row["same_as_captured"] = bool(cap is not None and np.array_equal(
            np.asarray(outs[k]).view(np.uint8), np.ascontiguousarray(cap).view(np.uint8)))
        rows.append(row)
    return rows
