"""Kernels and inputs shared by the GPU VM's device tests (tests/test_gpu_device.py): no test
here, and no side effect on import (tests/gpu_helpers.py, which sets TRITON_INTERPRET, is not
imported)."""
from __future__ import annotations

import dvm
from dvm.tools.bench_gpu_cases import chain8, layer_norm, rms_norm, softmax

from helpers import random_values


@dvm.kernel
def reductions(k, x):
    x = k.load(x)
    return k.store(k.argmax(x, axis=-1)), k.store(k.sum(x, axis=0)), k.store(k.min(x, axis=-1))


@dvm.kernel
def ints_and_casts(k, x, m):
    x, m = k.load(x), k.load(m)
    i = k.add(k.mul(k.iota(x.shape, 1), 3), k.cast(k.gt(x, 0), "int32"))
    return k.store(i), k.store(k.where(m, k.cast(x, "bfloat16"), k.cast(k.neg(x), "bfloat16"))), \
        k.store(k.cast(k.mul(x, 1000.0), "int64"))


def _floats(rng, dtype, shapes, lo=-4, hi=4):
    return [tuple(random_values(rng, dtype, s, lo=lo, hi=hi, specials=False) for s in shape) for shape in shapes]


KERNELS = {
    "chain8": (chain8, lambda rng: [a for dt in ("float32", "bfloat16")
                                    for a in _floats(rng, dt, [((1000, 333), (333,)), ((4096 * 64,), (1,))])]),
    "softmax": (softmax, lambda rng: [a for dt in ("float32", "bfloat16")
                                      for a in _floats(rng, dt, [((7, 300),), ((33, 5000),)])]),
    "layer_norm": (layer_norm, lambda rng: [(random_values(rng, dt, (9, c), specials=False),
                                             random_values(rng, dt, (c,), lo=0.5, hi=1.5, specials=False),
                                             random_values(rng, dt, (c,), specials=False))
                                            for dt in ("float32", "bfloat16") for c in (100, 3000)]),
    "rms_norm": (rms_norm, lambda rng: [(random_values(rng, dt, (9, c), specials=False),
                                         random_values(rng, dt, (c,), lo=0.5, hi=1.5, specials=False))
                                        for dt in ("float32", "bfloat16") for c in (100, 3000)]),
    "reductions": (reductions, lambda rng: [(random_values(rng, "float32", (257, 1100)),)]),
    "ints_and_casts": (ints_and_casts, lambda rng: [(random_values(rng, "float32", (5, 2000)),
                                                     rng.random((5, 2000)) < 0.5)]),
}
