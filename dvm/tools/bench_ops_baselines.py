"""The baselines of `dvm bench ops` (bench_ops): what each one runs, the copy roofline's buffers,
Inductor's compile (cold and warm), and the result check every DVM result and baseline passes
before it is timed."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

import dvm

from .bench_ops_cases import Case

REFERENCE_MAX_NUMEL = 1 << 17      # the reference VM runs shapes up to 128 K elements
COPY_DELTA = 2048   # (dst - src) mod 4096 of the roofline's buffers


def _aligned(n: int, offset: int) -> np.ndarray:
    """n f32 zeros starting `offset` bytes past a 4096-byte boundary."""
    raw = np.zeros(n + (4096 + offset) // 4, np.float32)
    skip = (-raw.ctypes.data % 4096 + offset) // 4
    return raw[skip:skip + n]


def copy_pair(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The copy roofline's source (ones) and destination: the best case of a copy. Two buffers
    allocated one after the other land a multiple of 4096 bytes + 16 apart (glibc's chunk
    header); a copy between addresses that close modulo 4096 stalls on 4K aliasing (AMD EPYC:
    256 KiB 7.4 -> 89 us), which would make any kernel look close to the roofline."""
    src = _aligned(n, 0)
    src[:] = 1.0
    return src, _aligned(n, COPY_DELTA)


def call_on_vm(kf: dvm.KernelFunction, args, vm: str):
    """Call kernel `kf` as a user does, with its Program run on the named VM."""
    return kf(*args, vm=vm)


class Mismatch(AssertionError):
    pass


def as_tensor(a: np.ndarray):
    """The torch tensor sharing a's memory (strides kept); bfloat16 through its bits."""
    import torch
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def check(got, want: np.ndarray, rtol: float, atol: float, who: str, ref: str = "NumPy",
          dtype: str = "float32") -> None:
    """Raise Mismatch, naming the worst element, unless got (of `dtype`) matches want (float32) in
    shape and values."""
    if _dtype_name(got) != dtype or tuple(got.shape) != want.shape:
        raise Mismatch(f"{who}: got {_dtype_name(got)}{list(got.shape)}, expected {dtype}{list(want.shape)}")
    got = got.float().numpy() if hasattr(got, "numpy") else np.asarray(got).astype(np.float32)
    try:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as e:
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        i = np.unravel_index(int(np.nanargmax(err)), err.shape) if err.size else ()
        raise Mismatch(f"{who} disagrees with {ref} (rtol {rtol:g}, atol {atol:g}): max abs error "
                       f"{float(np.nanmax(err)):.3g} at {tuple(int(j) for j in i)} "
                       f"(got {got[i]!r}, {ref} {want[i]!r}); "
                       f"{str(e).strip().splitlines()[2] if len(str(e).splitlines()) > 2 else ''}") from None


Runs = dict[str, tuple[Callable | None, str]]


def baseline_runs(case: Case, arrays: list, targs: list, forms: tuple, numel: int, vm: str, inductor: bool,
                  compile_inductor: Callable) -> Runs:
    """name -> (callable or None, note) for every baseline of one (case, shape). forms: the case's
    (eager, native) torch forms; compile_inductor(eager, mode) compiles and returns the steady-state
    callable (it is called when the baseline runs, so each compile is logged in its place)."""
    eager, native = forms
    runs: Runs = {}
    if numel <= REFERENCE_MAX_NUMEL:
        runs["reference_vm"] = (lambda: call_on_vm(case.kernel, arrays, "reference"),
                                "the selected VM is the reference VM" if vm == "reference" else "")
    else:
        runs["reference_vm"] = (None, f"skipped: more than {REFERENCE_MAX_NUMEL} elements")
    runs["numpy"] = ((lambda: case.numpy(*arrays), "") if case.dtype == "float32"
                     else (None, f"n/a: NumPy has no {case.dtype} arithmetic"))
    runs["torch_eager"] = (lambda: eager(*targs), "")
    runs["torch_native"] = ((lambda: native(*targs), case.native_name) if native is not None
                            else (None, "n/a: no native kernel"))
    if case.numexpr is not None:
        import numexpr
        local = dict(zip(["a", "b"][:case.n_full], arrays))
        local.update({k: np.float32(v) for k, v in case.numexpr_consts.items()})
        expr = case.numexpr
        runs["numexpr"] = (lambda: numexpr.evaluate(expr, local_dict=local), "")
    else:
        runs["numexpr"] = (None, f"n/a: {case.numexpr_note}")
    for mode in ("static", "dynamic"):
        runs[f"inductor_{mode}"] = ((lambda mode=mode: compile_inductor(eager, mode), "") if inductor
                                    else (None, "not run (--no-inductor)"))
    return runs


def inductor_compiled(eager: Callable, targs: list, mode: str) -> tuple[Callable, dict]:
    """Compile `eager` with Inductor (fresh Dynamo state), time the first call (cold compile) and
    a recompile after torch._dynamo.reset() (warm caches); the compiled callable and the times."""
    import torch
    import torch._dynamo
    dynamic = mode == "dynamic"
    torch._dynamo.reset()
    compiled = torch.compile(eager, dynamic=dynamic, backend="inductor")
    t0 = time.perf_counter()
    compiled(*targs)
    first = time.perf_counter() - t0
    torch._dynamo.reset()
    again = torch.compile(eager, dynamic=dynamic, backend="inductor")
    t0 = time.perf_counter()
    again(*targs)
    warm = time.perf_counter() - t0
    return (lambda: again(*targs)), {"first_s": first, "warm_s": warm}
