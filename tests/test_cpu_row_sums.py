"""Norms of sums of several loaded terms in the CPU VM's row form (host/fuse_plan._residual,
jit/fused/common.add_terms), bitwise against the reference VM. Split from test_cpu_rows (its
helpers are shared)."""
from __future__ import annotations

import numpy as np
import pytest

import dvm
from dvm.vm import reference
from dvm.vm.cpu.abi import FK_ROWNORM

from test_cpu_layouts import RNG, _bitwise_as_reference
from test_cpu_rows import fuse_kind_at_first_load
from test_cpu_vm import run_on

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


@dvm.kernel
def sum3_layernorm(k, x, r, s, w, b):
    """A parallel block's LayerNorm of three terms, the sum stored (GPT-NeoX's, Phi's next norm)."""
    h = k.add(k.add(k.load(x), k.load(r)), k.load(s))
    d = k.sub(h, k.mean(h, axis=-1, keepdims=True))
    return k.store(d * k.rsqrt(k.mean(d * d, axis=-1, keepdims=True) + 1e-5) * k.load(w) + k.load(b)), k.store(h)


@dvm.kernel
def sum4_rmsnorm(k, x, r, s, t, w):
    """An RMSNorm of four terms, the third one the first operand of its add, the sum not stored."""
    h = k.add(k.load(x), k.load(r))
    h = k.add(k.load(s), h)
    h = k.add(h, k.load(t))
    return k.store(k.mul(k.mul(h, k.rsqrt(k.add(k.mean(k.mul(h, h), axis=-1, keepdims=True), 1e-6))), k.load(w)))


@dvm.kernel
def sum5_layernorm(k, x, r, s, t, u, w):
    """Five terms: more than the row form's ROWNORM_MAX_TERMS, so the first four are its sum and the
    last add stays an instruction (the form is then not taken: the tile form runs)."""
    h = k.add(k.add(k.add(k.add(k.load(x), k.load(r)), k.load(s)), k.load(t)), k.load(u))
    d = k.sub(h, k.mean(h, axis=-1, keepdims=True))
    return k.store(d * k.rsqrt(k.mean(d * d, axis=-1, keepdims=True) + 1e-5) * k.load(w))


@pytest.mark.parametrize("cols", [128, 200, 256, 600, 1024, 70000])
def test_norms_of_sums_of_several_terms_bitwise_as_reference(cols):
    """A norm of a sum of three or four loaded terms is one row form (host/fuse_plan._residual: the
    later terms' rows added in the sum's order, either operand order), bitwise the reference VM's
    on 1 and 2 threads: specials, a term passed twice, a row-vector term (its one row for every
    row), a transposed term (the form refuses the tile: the instructions run); five terms are
    more than the form takes."""
    x, r, s, t = (RNG.standard_normal((9, cols)).astype(np.float32) for _ in range(4))
    x[0], r[0], s[0] = -0.0, -0.0, -0.0
    x[2, ::7] = np.nan
    s[3, 1], t[3, -1] = np.inf, -np.inf
    r[5] *= np.float32(1e19)
    w, b = (RNG.standard_normal(cols).astype(np.float32) for _ in range(2))
    assert fuse_kind_at_first_load(sum3_layernorm, x, r, s, w, b) == FK_ROWNORM
    assert fuse_kind_at_first_load(sum4_rmsnorm, x, r, s, t, w) == FK_ROWNORM
    assert fuse_kind_at_first_load(sum5_layernorm, x, r, s, t, x, w) != FK_ROWNORM
    st = np.ascontiguousarray(s.T).T
    for args in ((x, r, s, w, b), (x, r, x, w, b), (x, r, b, w, b), (x, r, st, w, b)):
        _bitwise_as_reference(sum3_layernorm, *args, why=(cols, len(args)))
    for args in ((x, r, s, t, w), (x, x, s, x, w), (x, r, w, t, w)):
        _bitwise_as_reference(sum4_rmsnorm, *args, why=(cols,))
    _bitwise_as_reference(sum5_layernorm, x, r, s, t, x, w, why=(cols,))


@pytest.mark.parametrize("rows, cols", [(9, 128), (2048, 200), (33, 1024)])
@pytest.mark.parametrize("over", [0, 1, 2])
def test_stored_sum_of_several_terms_written_over_a_term(rows, cols, over):
    """sum3_layernorm with its stored sum placed over one of its terms' buffers: a kernel with
    reductions is never in place (jit/addr.in_place_pair), so its tiles run through registers,
    and the row form, which adds the terms into the sum's rows, is not taken. Both outputs as
    the reference VM's into fresh buffers, bit for bit; the other terms unchanged."""
    from dvm.codegen.verifier import verify
    from dvm.vm import registry
    args = [RNG.standard_normal((rows, cols)).astype(np.float32) for _ in range(3)]
    args += [RNG.standard_normal(cols).astype(np.float32) for _ in range(2)]
    args[1][0, ::3] = np.nan
    want = run_on(reference.run, sum3_layernorm, *args)
    bufs = [a.copy() for a in args]
    y = np.empty((rows, cols), np.float32)
    vm = registry.get("cpu")
    outs = [y.reshape(-1), bufs[over].reshape(-1)]
    vm.run(verify(sum3_layernorm.program(*bufs)), [b.reshape(-1) for b in bufs] + outs)
    assert y.tobytes() == want[0].tobytes() and bufs[over].tobytes() == want[1].tobytes(), over
    for k in {0, 1, 2} - {over}:
        assert bufs[k].tobytes() == args[k].tobytes()
