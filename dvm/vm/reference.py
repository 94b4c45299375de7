"""The reference VM: the executable specification of the ISA, in plain NumPy.

Semantics (every VM must match them):
- A kernel's domain is rows x cols. Per row block of BM rows, each sweep runs its init once, its
  body once per column tile of BN columns (in increasing order), then its fin once.
- Registers hold BM x BN tiles. Edge tiles use indices clamped to the last valid row/column, so
  lanes outside the domain hold copies of valid lanes; stores write valid lanes only and
  accumulators ignore invalid columns.
- Body loads/stores address (row, col); fin loads read column 0 broadcast over the tile and fin
  stores write column 0 of valid rows.
- f32-bank math is evaluated in float64 and rounded to float32 per instruction.
- rfin reduces a BM x BN accumulator over columns with a pairwise-halving tree over the next
  power of two (padding with the identity), and broadcasts the result over the tile.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..codegen import isa
from ..codegen.program import KernelLayout, ProgramLayout
from ..graph.dtypes import Bank, DType
from ..graph.ops import OP_TABLE, reduce_identity
from .contract import VM

_I32 = np.iinfo(np.int32)
_I64 = np.iinfo(np.int64)


def run(layout: ProgramLayout, buffers: list[np.ndarray]) -> None:
    """Execute a verified program (see codegen.verifier.verify / check_buffers)."""
    with np.errstate(all="ignore"):
        for kl in layout.kernels:
            _Kernel(kl, buffers).run()


def _unravel_addr(idx: np.ndarray, sizes: tuple, strides: np.ndarray) -> np.ndarray:
    """sum over dims of digit_d(idx) * stride_d for a row-major flat index (int64)."""
    out = np.zeros(idx.shape, np.int64)
    rem = idx.copy()
    for size, stride in zip(reversed(sizes), reversed(list(strides))):
        size = max(size, 1)
        out += (rem % size) * int(stride)
        rem //= size
    return out


def to_bank(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Widen stored values to their register bank (bf16/f16 -> f32, int32 -> int64)."""
    if dtype is DType.BFLOAT16:
        return (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return values.astype(dtype.bank.np_dtype)


def from_bank(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Narrow register values to a stored dtype: RNE for floats, wrap for int32."""
    if dtype is DType.BFLOAT16:
        return values.astype(np.float32).astype(ml_dtypes.bfloat16)
    return values.astype(dtype.np_dtype)


def cast_value(x: np.ndarray, dst: Bank, target: DType) -> np.ndarray:
    """The cast instruction: convert a bank value to `target`, held in bank `dst`."""
    if target is DType.BOOL:
        return x != 0
    if target.category.name == "INT":
        if x.dtype.kind == "f":
            lo, hi = (_I32.min, _I32.max) if target is DType.INT32 else (_I64.min, 2.0 ** 63)
            bad = ~((x >= lo) & (x < hi + (1 if target is DType.INT32 else 0)))
            out = np.where(bad, 0, np.trunc(np.where(bad, 0, x))).astype(np.int64)
            return np.where(bad, lo, out).astype(np.int64)
        out = x.astype(np.int64)
        return out.astype(np.int32).astype(np.int64) if target is DType.INT32 else out
    if x.dtype == np.bool_:
        x = x.astype(np.float64)
    if target in (DType.FLOAT16, DType.BFLOAT16):
        return to_bank(from_bank(x, target), target)
    return x.astype(dst.np_dtype)


def _tree(acc: np.ndarray, combine) -> np.ndarray:
    width = acc.shape[1]
    p = 1
    while p < width:
        p *= 2
    t = acc
    while p > 1:
        h = p // 2
        left, right = t[:, :h], t[:, h:p]
        if right.shape[1] < h:  # implicit identity padding: lanes beyond width keep `left`
            merged = left.copy()
            merged[:, :right.shape[1]] = combine(left[:, :right.shape[1]], right)
        else:
            merged = combine(left, right)
        t, p = merged, h
    return t[:, 0]


def _f32(fn):
    return lambda *a: fn(*[x.astype(np.float64) for x in a]).astype(np.float32)


def _combine(op: str, bank: Bank):
    base = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    return _f32(base) if bank is Bank.F32 and op in ("sum", "prod") else base


def _arg_better(op: str, v_new, i_new, v_old, i_old, tie_by_index: bool):
    nan_new = np.isnan(v_new) if v_new.dtype.kind == "f" else np.zeros(v_new.shape, bool)
    nan_old = np.isnan(v_old) if v_old.dtype.kind == "f" else np.zeros(v_old.shape, bool)
    strictly = (v_new > v_old) if op == "argmax" else (v_new < v_old)
    better = (strictly & ~nan_old) | (nan_new & ~nan_old)
    if tie_by_index:
        same = (v_new == v_old) | (nan_new & nan_old)
        better |= same & (i_new < i_old)
    return better


def _arg_tree(op: str, vals: np.ndarray, idxs: np.ndarray) -> np.ndarray:
    """Pairwise-halving (value, index) tree over columns; ties and NaNs pick the lower index."""
    width, p = vals.shape[1], 1
    while p < width:
        p *= 2
    while p > 1:
        h = p // 2
        n = max(0, min(h, width - h))
        if n:
            better = _arg_better(op, vals[:, h:h + n], idxs[:, h:h + n], vals[:, :n], idxs[:, :n],
                                 tie_by_index=True)
            vals[:, :n] = np.where(better, vals[:, h:h + n], vals[:, :n])
            idxs[:, :n] = np.where(better, idxs[:, h:h + n], idxs[:, :n])
        width, p = min(width, h), h
    return idxs[:, :1]


class _Kernel:
    def __init__(self, kl: KernelLayout, buffers: list[np.ndarray]):
        self.kl, self.buffers = kl, buffers
        self.tile = (kl.bm, kl.bn)
        self.regs = [[None] * n for n in kl.nregs]
        self.nr = len(kl.row_sizes)

    # -- driver ---------------------------------------------------------------------------------
    def run(self) -> None:
        kl = self.kl
        self.exec_range(kl.prologue, None)
        rows, cols = kl.rows, kl.cols
        for r0 in range(0, rows, kl.bm):
            r = r0 + np.arange(kl.bm, dtype=np.int64)
            r_valid, r_idx = r < rows, np.minimum(r, rows - 1)
            for sw in kl.sweeps:
                self.exec_range(sw.init, None)
                for c0 in range(0, cols, kl.bn):
                    c = c0 + np.arange(kl.bn, dtype=np.int64)
                    ctx = ("B", r_idx, r_valid, np.minimum(c, cols - 1), c < cols, c)
                    self.exec_range(sw.body, ctx)
                zero = np.zeros(kl.bn, np.int64)
                self.exec_range(sw.fin, ("F", r_idx, r_valid, zero, zero == 0, zero))

    def exec_range(self, rng: tuple[int, int], ctx) -> None:
        for i in range(*rng):
            row = self.kl.instrs[i]
            spec = isa.BY_CODE[int(row[0])]
            getattr(self, "op_" + spec.group)(spec, [int(v) for v in row[1:]], ctx)

    # -- helpers --------------------------------------------------------------------------------
    def get(self, bank: Bank, r: int) -> np.ndarray:
        return self.regs[bank][r]

    def put(self, bank: Bank, r: int, value: np.ndarray) -> None:
        self.regs[bank][r] = np.broadcast_to(value, self.tile).astype(bank.np_dtype)

    def addresses(self, j: int, ctx) -> np.ndarray:
        kl = self.kl
        _, r_idx, _, c_idx, _, _ = ctx
        strides = kl.opnd_strides[j]
        ra = _unravel_addr(r_idx, kl.row_sizes, strides[:self.nr])
        ca = _unravel_addr(c_idx, kl.col_sizes, strides[self.nr:])
        return int(kl.opnd_offset[j]) + ra[:, None] + ca[None, :]

    # -- instruction groups ---------------------------------------------------------------------
    def op_const(self, spec, f, ctx) -> None:
        bits = int(self.kl.const_bits[f[1]])
        if spec.bank in (Bank.F32, Bank.F64):
            value = np.array(bits, np.int64).view(np.float64)
        else:
            value = np.array(bits, np.int64)
        self.put(spec.bank, f[0], value)

    def op_load(self, spec, f, ctx) -> None:
        j = f[1]
        dtype = DType(int(self.kl.opnd_dtype[j]))
        buf = self.buffers[int(self.kl.opnd_arg[j])]
        self.put(spec.bank, f[0], to_bank(buf[self.addresses(j, ctx)], dtype))

    def op_index(self, spec, f, ctx) -> None:
        self.put(Bank.I64, f[0], self.addresses(f[1], ctx))

    def op_storerow(self, spec, f, ctx) -> None:
        sec, r_idx, r_valid, c_idx, c_valid, c_global = ctx
        self.op_store(spec, f, ("F", r_idx, r_valid, np.zeros_like(c_idx), c_valid, c_global))

    def op_rowred(self, spec, f, ctx) -> None:
        _, _, _, _, c_valid, c_global = ctx
        x = self.get(spec.bank, f[1])
        ident = np.array(reduce_identity(spec.op, spec.bank), spec.bank.np_dtype)
        masked = np.where(c_valid[None, :], x, ident)
        if spec.op.startswith("arg"):
            idx = np.where(c_valid, c_global, np.iinfo(np.int64).max)
            self.put(Bank.I64, f[0], _arg_tree(spec.op, masked, np.broadcast_to(idx[None, :], self.tile).copy()))
            return
        self.put(spec.bank, f[0], _tree(masked, _combine(spec.op, spec.bank))[:, None])

    def op_store(self, spec, f, ctx) -> None:
        j = f[1]
        dtype = DType(int(self.kl.opnd_dtype[j]))
        buf = self.buffers[int(self.kl.opnd_arg[j])]
        sec, _, r_valid, _, c_valid, _ = ctx
        mask = r_valid[:, None] & c_valid[None, :]
        if sec == "F":
            mask &= np.arange(self.kl.bn)[None, :] == 0
        addr = self.addresses(j, ctx)
        buf[addr[mask]] = from_bank(self.get(spec.bank, f[0])[mask], dtype)

    def op_cast(self, spec, f, ctx) -> None:
        src_bank = spec.fields[1].bank
        self.put(spec.bank, f[0], cast_value(self.get(src_bank, f[1]), spec.bank, DType(f[2])))

    def op_ew(self, spec, f, ctx) -> None:
        ref = OP_TABLE[spec.op].ref
        args = [self.get(fld.bank, f[k]) for k, fld in enumerate(spec.fields) if fld.role == "s"]
        if spec.bank is Bank.F32:
            args = [a.astype(np.float64) if a.dtype == np.float32 else a for a in args]
        out = ref(*args)
        self.put(spec.fields[0].bank, f[0], np.asarray(out))

    def op_accinit(self, spec, f, ctx) -> None:
        self.put(spec.bank, f[0], np.array(reduce_identity(spec.op, spec.bank)))
        if spec.op.startswith("arg"):
            self.put(Bank.I64, f[1], np.array(0))

    def op_acc(self, spec, f, ctx) -> None:
        _, _, _, _, c_valid, c_global = ctx
        valid = np.broadcast_to(c_valid[None, :], self.tile)
        if spec.op.startswith("arg"):
            v, i, x = self.get(spec.bank, f[0]), self.get(Bank.I64, f[1]), self.get(spec.bank, f[2])
            idx = np.broadcast_to(c_global[None, :], self.tile)
            upd = valid & _arg_better(spec.op, x, idx, v, i, tie_by_index=False)
            self.put(spec.bank, f[0], np.where(upd, x, v))
            self.put(Bank.I64, f[1], np.where(upd, idx, i))
            return
        acc, x = self.get(spec.bank, f[0]), self.get(spec.bank, f[1])
        self.put(spec.bank, f[0], np.where(valid, _combine(spec.op, spec.bank)(acc, x), acc))

    def op_rfin(self, spec, f, ctx) -> None:
        if spec.op.startswith("arg"):
            v, i = self.get(spec.bank, f[1]), self.get(Bank.I64, f[2])
            self.put(Bank.I64, f[0], _arg_tree(spec.op, v.copy(), i.copy()))
            return
        acc = self.get(spec.bank, f[1])
        self.put(spec.bank, f[0], _tree(acc, _combine(spec.op, spec.bank))[:, None])


class ReferenceVM(VM):
    """The reference VM under the VM contract: runs buffer objects only (no bound launches)."""
    name = "reference"

    def run(self, layout: ProgramLayout, buffers: list[np.ndarray], threads: int | None = None) -> None:
        run(layout, buffers)


VM_INSTANCE = ReferenceVM()
