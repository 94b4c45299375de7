"""The CPU VM's rotary row form (FK_ROTARY: host/fuse_plan._rotary, jit/fused/rotary): planned for
y = x * cos + (x_swapped * sign) * sin as the torch frontend writes RoPE (halves swapped by a view
of negative stride), in either operand order; bitwise the reference VM's on 1 and 2 threads,
with special values, partial tiles and operands the form refuses at run time (the instructions
then run)."""
from __future__ import annotations

import numpy as np
import pytest

import dvm
from dvm.codegen.verifier import verify
from dvm.vm.cpu.abi import FK_ROTARY, ROT_R_SWAP, ROT_Y_SWAP
from dvm.vm.cpu.host import desc as cpu_desc

from test_cpu_layouts import RNG, _bitwise_as_reference

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


@dvm.kernel
def rope(k, x, xs, cos, sgn, sin):
    return k.store(k.load(x) * k.load(cos) + (k.load(xs) * k.load(sgn)) * k.load(sin))


@dvm.kernel
def rope_swapped(k, x, xs, cos, sgn, sin):
    """Every product's and the sum's operands the other way round."""
    return k.store(k.load(sin) * (k.load(sgn) * k.load(xs)) + k.load(cos) * k.load(x))


@dvm.kernel
def rope_and_product(k, x, xs, cos, sgn, sin):
    """x * cos is stored too: alive after the sum, so not a rotary run."""
    p = k.load(x) * k.load(cos)
    return k.store(p + (k.load(xs) * k.load(sgn)) * k.load(sin)), k.store(p)


def _rope_args(b, length, heads, d, dtype=np.float32, proj=None):
    """q as HF's attention has it: a view of a projection (proj columns per token, q's first),
    split into halves; the halves swapped by a view; cos, sin over the length; the signs (-1, +1)."""
    proj = proj or heads * d + 8
    qkv = RNG.standard_normal((b, length, proj)).astype(dtype)
    x = qkv[:, :, :heads * d].reshape(b, length, heads, 2, d // 2)
    cos = RNG.standard_normal((1, length, 1, 2, d // 2)).astype(dtype)
    sin = RNG.standard_normal((1, length, 1, 2, d // 2)).astype(dtype)
    sgn = np.repeat(np.array([-1.0, 1.0], dtype), d // 2).reshape(1, 1, 1, 2, d // 2)
    return x, x[:, :, :, ::-1, :], cos, sgn, sin


def _rotary_plans(kfn, *args) -> list[tuple[int, int]]:
    layout = verify(kfn.program(*args))
    return [(int(f[0]), int(f[7])) for kl in layout.kernels
            for f in cpu_desc._desc(kl, len(layout.args)).fuse if f[0] == FK_ROTARY]


def test_rope_is_planned_as_a_rotary_run():
    args = _rope_args(2, 64, 4, 32)
    assert _rotary_plans(rope, *args) == [(FK_ROTARY, 0)]
    assert _rotary_plans(rope_swapped, *args) == [(FK_ROTARY, ROT_R_SWAP | ROT_Y_SWAP)]
    assert _rotary_plans(rope_and_product, *args) == []


@pytest.mark.parametrize("b, length, heads, d", [(2, 64, 4, 32), (4, 1024, 4, 32), (1, 37, 3, 64), (3, 5, 2, 8),
                                                 (1, 1, 1, 2), (2, 300, 1, 130), (1, 3, 1, 8200)])
@pytest.mark.parametrize("kfn", [rope, rope_swapped])
def test_rope_bitwise_as_reference(kfn, b, length, heads, d):
    """Any lengths (partial row tiles, rows of 1 to 65 lanes, rows of 4100 lanes in two column
    tiles), NaN, infinities and signed zeros."""
    x, xs, cos, sgn, sin = _rope_args(b, length, heads, d)
    x[0, 0, 0, 0, 0], x[-1, -1, -1, -1, -1] = np.nan, -np.inf
    x[0, -1, 0, 1, :] = -0.0
    cos[0, 0, 0, 1, 0], sin[0, -1, 0, 0, -1] = np.inf, np.nan
    _bitwise_as_reference(kfn, x, xs, cos, sgn, sin, why=(b, length, heads, d))


def test_rope_operands_the_row_form_refuses_run_the_instructions():
    """A float16 operand (rows not f32) and a head whose lanes are strided (no unit column stride)
    make the row form refuse the tile: the instructions' results, bitwise."""
    x, xs, cos, sgn, sin = _rope_args(2, 48, 4, 32)
    _bitwise_as_reference(rope, x, xs, cos.astype(np.float16), sgn, sin, why=("float16 cos",))
    wide = RNG.standard_normal((2, 48, 4, 2, 32)).astype(np.float32)[..., ::2]
    _bitwise_as_reference(rope, wide, wide[:, :, :, ::-1, :], cos, sgn, sin, why=("strided lanes",))
    assert _rotary_plans(rope, wide, wide[:, :, :, ::-1, :], cos, sgn, sin) == [(FK_ROTARY, 0)]
