"""The CPU VM's rotary row form (FK_ROTARY: host/fuse_rotary, jit/fused/rotary): planned for
y = x * cos + (x_swapped * sign) * sin as the torch frontend writes RoPE (halves swapped by a view
of negative stride), in either operand order, and for q's and k's rotations in one kernel that
share the loads of cos, the signs and sin (the second reads their rows itself: ROT_THEN on the
first); bitwise the reference VM's on 1 and 2 threads (16-bit operands too, in the tile form),
with special values, partial tiles and operands the form refuses at run time (the instructions
then run; for a ROT_THEN pair, both runs' instructions where the second's operands are refused)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import dvm
from dvm.codegen.verifier import verify
from dvm.graph import build
from dvm.vm.cpu.abi import FK_ROTARY, ROT_R_SWAP, ROT_THEN, ROT_Y_SWAP
from dvm.vm.cpu.host import desc as cpu_desc
from dvm.vm.cpu.host.fuse_plan import fuse_plan

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


@pytest.mark.parametrize("b, length, heads, d", [(2, 64, 4, 32), (1, 37, 3, 64), (3, 5, 2, 8), (2, 300, 1, 130),
                                                 (1, 3, 1, 8200)])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_16bit_rope_bitwise_as_reference(dtype, b, length, heads, d):
    """Every operand and the output float16 or bfloat16 (a 16-bit model's RoPE: converted to f32
    at the loads, rounded at the store), q and k's pair too; special values, ties of the rounding.
    The row form takes these rows (one dtype throughout), converting in its loop."""
    x, xs, cos, sgn, sin = _rope_args(b, length, heads, d, dtype)
    x[0, 0, 0, 0, 0], x[-1, -1, -1, -1, -1] = np.nan, -np.inf
    x[0, -1, 0, 1, :] = -0.0
    cos[0, 0, 0, 1, 0], sin[0, -1, 0, 0, -1] = np.inf, np.nan
    cos[0, -1, 0, 1, :] = np.float32(1.0 + 2.0 ** -8)
    for kfn in (rope, rope_swapped):
        _bitwise_as_reference(kfn, x, xs, cos, sgn, sin, why=(dtype, b, length, heads, d))
    qkv, cos, sgn, sin = (a.astype(dtype) for a in _qk_args(b, length))
    _bitwise_as_reference(ROPE_QK, qkv, cos, sgn, sin, why=(dtype, b, length))


def test_rope_operands_the_row_form_refuses_run_the_instructions():
    """A float16 operand among f32 ones (not one dtype) and a head whose lanes are strided (no unit
    column stride) make the row form refuse the tile: the instructions' results, bitwise."""
    x, xs, cos, sgn, sin = _rope_args(2, 48, 4, 32)
    _bitwise_as_reference(rope, x, xs, cos.astype(np.float16), sgn, sin, why=("float16 cos",))
    wide = RNG.standard_normal((2, 48, 4, 2, 32)).astype(np.float32)[..., ::2]
    _bitwise_as_reference(rope, wide, wide[:, :, :, ::-1, :], cos, sgn, sin, why=("strided lanes",))
    assert _rotary_plans(rope, wide, wide[:, :, :, ::-1, :], cos, sgn, sin) == [(FK_ROTARY, 0)]


QK_HEADS, QK_HEAD = 4, 16


def _heads(k, x, which: int, step: int = 1):
    """Head block `which` of a projection's rows (every `step`-th column) as [b, n, heads, 2,
    d/2], and the same with its halves swapped (a view of negative stride)."""
    b, n = x.node.shape[0], x.node.shape[1]
    v = build.slice_view(k.ctx, x.node, 2, which * QK_HEADS * QK_HEAD * step, QK_HEADS * QK_HEAD, step)
    v = build.reshape(k.ctx, v, (b, n, QK_HEADS, 2, QK_HEAD // 2))
    return k._wrap(v), k._wrap(build.slice_view(k.ctx, v, 3, 1, 2, -1))


def _rope_qk(k_step: int):
    """q's and k's rotations from one projection, sharing the loads of cos, the signs and sin (as
    the torch frontend lowers them for equal head counts: one kernel); k's columns every k_step-th
    (2: its rows have no unit column stride, so the row form refuses k's run)."""
    def kern(k, qkv, cos, sgn, sin):
        x = k.load(qkv)
        c, g, s = k.load(cos), k.load(sgn), k.load(sin)
        (q, qs), (kk, ks) = _heads(k, x, 0), _heads(k, x, 1, k_step)
        return k.store(q * c + (qs * g) * s), k.store(kk * c + (ks * g) * s)
    kern.__name__ = f"rope_qk_{k_step}"
    return dvm.kernel(kern)


ROPE_QK, ROPE_QK_STRIDED_K = _rope_qk(1), _rope_qk(2)


def _qk_args(b, length):
    qkv = RNG.standard_normal((b, length, 5 * QK_HEADS * QK_HEAD + 8)).astype(np.float32)
    _, _, cos, sgn, sin = _rope_args(b, length, QK_HEADS, QK_HEAD)
    return qkv, cos, sgn, sin


def test_rotations_sharing_loads_are_planned_as_a_pair():
    args = _qk_args(2, 64)
    assert _rotary_plans(ROPE_QK, *args) == [(FK_ROTARY, ROT_THEN), (FK_ROTARY, 0)]
    assert _rotary_plans(ROPE_QK_STRIDED_K, *args) == [(FK_ROTARY, ROT_THEN), (FK_ROTARY, 0)]


def _body_plan(instrs, kl):
    sections = [kl.prologue] + [sec for sw in kl.sweeps for sec in (sw.init, sw.body, sw.fin)]
    return fuse_plan(instrs, sections)


def test_a_shared_load_read_after_the_pair_keeps_it_unpaired():
    """A register the first rotation loaded and the second does not overwrite, read again after
    the second (here: a copy of the second's last product squaring it, and a store) must be
    loaded: the first run is not planned (ROT_THEN would leave it unloaded)."""
    (kl,) = verify(ROPE_QK.program(*_qk_args(2, 64))).kernels
    body = kl.sweeps[0].body
    instrs = kl.instrs[body[0]:body[1]]
    sign = int(instrs[13, 3])   # mul q2, c2, sign: the sign register the first run loaded
    assert sign not in {int(instrs[q, 1]) for q in range(10, 17)}   # (the second does not write it)
    reuse, store = instrs[13].copy(), instrs[16].copy()
    reuse[2] = reuse[3] = sign
    store[1] = reuse[1]
    more = np.concatenate([kl.instrs[:body[1]], [reuse, store], kl.instrs[body[1]:]]).astype(kl.instrs.dtype)
    plan = fuse_plan(more, [kl.prologue, (body[0], body[1] + 2)])
    assert plan[body[0], 0] != FK_ROTARY and plan[body[0] + 10, 0] == FK_ROTARY
    assert _body_plan(kl.instrs, kl)[body[0], 7] == ROT_THEN


@pytest.mark.parametrize("b, length", [(2, 64), (4, 1024), (1, 37), (3, 5), (1, 1)])
@pytest.mark.parametrize("kfn", [ROPE_QK, ROPE_QK_STRIDED_K])
def test_rotations_sharing_loads_bitwise_as_reference(kfn, b, length):
    """The pair (both runs fused) and, where k's rows are strided, neither (k's operands refused:
    q's run must not leave cos, the signs and sin unloaded for k's instructions)."""
    qkv, cos, sgn, sin = _qk_args(b, length)
    qkv[0, 0, 0], qkv[-1, -1, QK_HEADS * QK_HEAD + 3] = np.nan, -np.inf
    cos[0, 0, 0, 1, 0], sin[0, -1, 0, 0, -1] = np.inf, np.nan
    _bitwise_as_reference(kfn, qkv, cos, sgn, sin, why=(b, length))
