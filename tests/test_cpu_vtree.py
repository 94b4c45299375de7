"""The CPU VM's reduction trees (jit/rowtree.tree_p2, jit/vtree's register trees) against the
reference VM's tree, bit for bit: every width, special values in every position, rows of any
width and partial rows (masked loads that never read past the row)."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_cpu_tree_matches_the_reference_tree_at_every_width(op, dtype):
    """The CPU VM's fused, straight-line tree (cpu_reduce._tree_p2: up to three levels a pass,
    three passes inlined, a loop past 4096 lanes) pairs the same lanes as the reference VM's
    tree at every power-of-two width up to program.MAX_TILE: bitwise the same result."""
    from dvm.codegen.program import MAX_TILE
    from dvm.graph.dtypes import Bank
    from dvm.vm import reference
    from dvm.vm.cpu.abi import RED_NAMES
    from dvm.vm.cpu.jit.rowtree import tree_p2 as _tree_p2

    rng = np.random.default_rng(7)
    code = RED_NAMES.index(op)
    bank = {np.float32: Bank.F32, np.float64: Bank.F64, np.int64: Bank.I64}[dtype]
    combine = reference._combine(op, bank)
    p = 1
    while p <= MAX_TILE:
        if dtype is np.int64:
            x = rng.integers(-3, 4, p).astype(dtype)
        elif op == "prod":
            x = rng.uniform(0.99, 1.01, p).astype(dtype)
        else:
            x = rng.standard_normal(p).astype(dtype)
            if op in ("max", "min") and p >= 64:
                x[p // 3] = np.nan
        a, b = np.empty(p, dtype), np.empty(p, dtype)
        got = _tree_p2(code, x, a, b, p)
        want = reference._tree(x[None, :].copy(), combine)[0]
        assert np.array_equal(np.asarray(got, dtype), want, equal_nan=True), (op, p)
        p *= 2


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_register_tree_keeps_the_bits_of_special_values(op, dtype):
    """Rows of 16 to 256 lanes reduce in vector registers (jit/vtree) and wider ones finish there:
    with +-0, +-inf, NaN and subnormals in every position, the result has the reference tree's
    bits (max/min: b on ties, so max(-0, +0) depends on the order; NaN propagates)."""
    from dvm.graph.dtypes import Bank
    from dvm.vm import reference
    from dvm.vm.cpu.abi import RED_NAMES
    from dvm.vm.cpu.jit.rowtree import tree_p2 as _tree_p2

    rng = np.random.default_rng(11)
    code = RED_NAMES.index(op)
    combine = reference._combine(op, {np.float32: Bank.F32, np.float64: Bank.F64}[dtype])
    tiny = np.finfo(dtype).smallest_subnormal
    pool = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.25, tiny, -tiny], dtype)
    bits = np.int32 if dtype is np.float32 else np.int64
    for p in (16, 32, 64, 128, 256, 512, 2048):
        for _ in range(60):
            x = rng.choice(pool, p) if rng.random() < 0.5 else np.where(
                rng.random(p) < 0.1, rng.choice(pool, p), rng.standard_normal(p)).astype(dtype)
            a, b = np.empty(p, dtype), np.empty(p, dtype)
            got = np.asarray(_tree_p2(code, x, a, b, p), dtype)
            want = reference._tree(x[None, :].copy(), combine)[0]
            if np.isnan(want):
                assert np.isnan(got), (op, p, x)
            else:
                assert got.view(bits) == np.asarray(want, dtype).view(bits), (op, p, x, got, want)


def _row_at_page_end(n: int, dtype):
    """A writable array of n elements whose last one ends a page; the next page is PROT_NONE
    (reading past the row faults). Returns the array and the mapping that backs it."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(base + page, page, 0) == 0   # PROT_NONE
    whole = np.frombuffer(m, dtype, count=page // np.dtype(dtype).itemsize)
    return whole[whole.size - n:], m


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_cpu_register_tree_of_any_width_is_the_spec_tree_and_reads_only_the_row(dtype):
    """vtree_n (whole rows of any width up to 512 lanes, cpu_reduce.ROW_MASKED) fills the lanes
    past the row by masked loads with a pass-through value: the result has the reference tree's
    bits (-0.0 sums stay -0.0, NaN and ties as the spec's tree), and a row that ends a page
    followed by an unreadable one is never read past its end."""
    from numba import njit
    from dvm.graph.dtypes import Bank
    from dvm.vm import reference
    from dvm.vm.cpu.abi import RED_NAMES
    from dvm.vm.cpu.jit.vtree import vtree_n

    @njit
    def tree(code, x, n):
        return vtree_n(code, x, n)

    rng = np.random.default_rng(5)
    bank = {np.float32: Bank.F32, np.float64: Bank.F64, np.int64: Bank.I64}[dtype]
    if dtype is np.int64:
        pool = np.array([0, 1, -1, 7, -9, np.iinfo(np.int64).max, np.iinfo(np.int64).min], dtype)
    else:
        tiny = np.finfo(dtype).smallest_subnormal
        pool = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.25, tiny], dtype)
    bits = {np.float32: np.int32}.get(dtype, np.int64)
    for op in ("sum", "prod", "max", "min"):
        code, combine = RED_NAMES.index(op), reference._combine(op, bank)
        for n in (*range(1, 40), 47, 63, 65, 100, 127, 129, 200, 255, 257, 300, 511, 512):
            row, mapping = _row_at_page_end(n, dtype)
            for trial in range(6):
                row[:] = rng.choice(pool, n) if trial % 2 else np.full(n, pool[trial // 2 % pool.size])
                with np.errstate(all="ignore"):
                    want = np.asarray(reference._tree(row[None, :].copy(), combine)[0], dtype)
                got = np.asarray(tree(code, row, n), dtype)
                assert got.view(bits) == want.view(bits) or np.isnan(got) and np.isnan(want), (op, n, row, got, want)
            del row
            mapping.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_cpu_register_tree_of_a_padded_row_is_the_spec_tree_and_reads_only_the_row(dtype):
    """vtree_pad (a partial row of more than half a power-of-two tile, cpu_reduce.ROW_PADDED): the
    lanes past the row hold the op's identity, as the spec pads them (+0.0 for a float sum, so an all -0.0 row
    sums to the reference's +0.0), and the row's end is never read past."""
    from numba import njit
    from dvm.graph.dtypes import Bank
    from dvm.graph.ops import reduce_identity
    from dvm.vm import reference
    from dvm.vm.cpu.abi import RED_NAMES
    from dvm.vm.cpu.jit.vtree import VTREE_MAX, vtree_pad

    @njit
    def tree(code, x, n, p):
        return vtree_pad(code, x, n, p)

    rng = np.random.default_rng(6)
    bank = {np.float32: Bank.F32, np.float64: Bank.F64, np.int64: Bank.I64}[dtype]
    if dtype is np.int64:
        pool = np.array([0, 1, -1, 7, np.iinfo(np.int64).max, np.iinfo(np.int64).min], dtype)
    else:
        pool = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.25, np.finfo(dtype).smallest_subnormal], dtype)
    bits = {np.float32: np.int32}.get(dtype, np.int64)
    for op in ("sum", "prod", "max", "min"):
        code, combine = RED_NAMES.index(op), reference._combine(op, bank)
        ident = np.array(reduce_identity(op, bank), dtype)
        p = 16
        while p <= VTREE_MAX:
            for n in sorted({p // 2 + 1, p - 1, int(rng.integers(p // 2 + 1, p))}):
                row, mapping = _row_at_page_end(n, dtype)
                for trial in range(4):
                    row[:] = rng.choice(pool, n) if trial % 2 else np.full(n, pool[trial // 2])
                    padded = np.concatenate([row, np.full(p - n, ident)])
                    with np.errstate(all="ignore"):
                        want = np.asarray(reference._tree(padded[None, :], combine)[0], dtype)
                    got = np.asarray(tree(code, row, n, p), dtype)
                    assert got.view(bits) == want.view(bits) or np.isnan(got) and np.isnan(want), (op, p, n, row)
                del row
                mapping.close()
            p *= 2
