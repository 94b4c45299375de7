"""The per-op cost of the ways to record eager ATen ops, measured by `dvm bench lazy --calibrate`
(docs/DECISIONS.md, "Lazy mode: a dispatch mode with placeholders"): the slope of chains of 8 and
32 ops (so a region's fixed costs cancel) of

  eager        the ops themselves (tensors of PROBE_NUMEL elements)
  mode         a TorchDispatchMode that runs each op (the interception alone)
  mode_alloc   a TorchDispatchMode that returns an unwritten row-major tensor (a placeholder)
  subclass     a wrapper tensor subclass whose __torch_dispatch__ returns a new wrapper
  dvm_lazy     dvm.lazy(adaptive=False): the recorder, flush included (its cost per op)
"""
from __future__ import annotations

PROBE_NUMEL = 4096
SHORT, LONG = 8, 32


def _chain(x, n: int):
    for i in range(n):
        x = x * 1.0001 if i % 2 == 0 else x + 0.5
    return x


def _classes():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    try:
        from torch._C._dynamo.guards import _empty_strided_cpu as empty
    except ImportError:  # pragma: no cover
        def empty(size, stride, dtype):
            return torch.empty_strided(size, stride, dtype=dtype)

    class RunMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class AllocMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            a = args[0]
            return empty(tuple(a.shape), tuple(a.stride()), a.dtype)

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, shape, dtype):
            return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            a = args[0]
            return Wrapper(a.shape, a.dtype)

    return RunMode, AllocMode, Wrapper


def recording_costs(timer, rounds: int) -> dict:
    """Microseconds per op of each way (module docstring); timer(calls, rounds) -> medians."""
    import torch

    import dvm
    run_mode, alloc_mode, wrapper = _classes()
    x = torch.randn(PROBE_NUMEL, generator=torch.Generator().manual_seed(0))
    wx = wrapper(x.shape, x.dtype)
    forced = {n: dvm.lazy(lambda x, n=n: _chain(x, n), adaptive=False) for n in (SHORT, LONG)}

    def in_mode(cls, n):
        m = cls()

        def call():
            with m:
                _chain(x, n)
        return call
    calls = {}
    for n in (SHORT, LONG):
        calls[("eager", n)] = lambda n=n: _chain(x, n)
        calls[("mode", n)] = in_mode(run_mode, n)
        calls[("mode_alloc", n)] = in_mode(alloc_mode, n)
        calls[("subclass", n)] = lambda n=n: _chain(wx, n)
        calls[("dvm_lazy", n)] = lambda n=n: forced[n](x)
    t = timer(calls, rounds)
    names = ("eager", "mode", "mode_alloc", "subclass", "dvm_lazy")
    return {"numel": PROBE_NUMEL, "us_per_op": {k: (t[(k, LONG)] - t[(k, SHORT)]) / (LONG - SHORT) * 1e6 for k in names}}
