"""Shared helpers for the DVM-vs-PyTorch tests: dtype maps, conversions, the torch op map,
special-value generators and the one comparison used everywhere."""
from __future__ import annotations

import contextlib
import itertools

import ml_dtypes
import pytest
import numpy as np
import torch
import torch.nn.functional as F

import dvm

BF16 = np.dtype(ml_dtypes.bfloat16)

DTYPES = ("bool", "int32", "int64", "float16", "bfloat16", "float32", "float64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int32", "int64")

NP_DTYPE = {"bool": np.dtype(np.bool_), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
            "float16": np.dtype(np.float16), "bfloat16": BF16, "float32": np.dtype(np.float32),
            "float64": np.dtype(np.float64)}
TORCH_DTYPE = {"bool": torch.bool, "int32": torch.int32, "int64": torch.int64,
               "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
               "float64": torch.float64}
NAME_OF_TORCH = {v: k for k, v in TORCH_DTYPE.items()}


def dtype_name(arr: np.ndarray) -> str:
    for name, d in NP_DTYPE.items():
        if arr.dtype == d:
            return name
    raise AssertionError(f"unexpected dtype {arr.dtype}")


def to_torch(arr) -> torch.Tensor:
    """NumPy (incl. ml_dtypes.bfloat16, any strides) -> torch tensor with the same values/dtype."""
    arr = np.array(arr, order="C", copy=True)  # (ascontiguousarray would make 0-d arrays 1-d)
    if arr.dtype == BF16:
        bits = np.asarray(arr.view(np.uint16).astype(np.int32) << 16)
        return torch.from_numpy(bits).view(torch.float32).to(torch.bfloat16)
    return torch.from_numpy(arr)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16)
    return t.numpy()


# --- the DVM op name -> PyTorch eager function --------------------------------------------------
TORCH_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log2": torch.log2, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "relu": torch.relu,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "sign": torch.sign, "logical_not": torch.logical_not, "isnan": torch.isnan,
    "isinf": torch.isinf, "isfinite": torch.isfinite,
}
TORCH_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "floor_divide": torch.floor_divide, "remainder": torch.remainder, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
}
TORCH_TERNARY = {
    "where": lambda c, a, b: torch.where(c, a, b),
    "clamp": lambda x, lo, hi: torch.clamp(x, min=lo, max=hi),
}


def dvm_call(k, name: str, *args):
    """Call DVM op `name` on builder `k` (gelu_tanh goes through k.gelu(approximate='tanh'))."""
    if name == "gelu_tanh":
        return k.gelu(*args, approximate="tanh")
    if name == "clamp":
        x, lo, hi = args
        return k.clamp(x, min=lo, max=hi)
    return getattr(k, name)(*args)


def assert_same(actual: np.ndarray, expected: torch.Tensor, msg: str = "", **tol):
    """DVM output vs torch eager: same dtype, same shape, assert_close (default tolerances for
    the dtype unless overridden), NaN positions equal."""
    assert isinstance(actual, np.ndarray), f"{msg}: DVM returned {type(actual).__name__}"
    got = dtype_name(actual)
    want = NAME_OF_TORCH[expected.dtype]
    assert got == want, f"{msg}: DVM dtype {got} != torch dtype {want}"
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{msg}: DVM shape {actual.shape} != torch shape {tuple(expected.shape)}"
    torch.testing.assert_close(to_torch(actual), expected, equal_nan=True, msg=lambda m: f"{msg}\n{m}",
                               **tol)


# --- the ONE table of deviations from eager ---------------------------------------------------
def _huge_inputs(x, out_dtype):
    half_max = 0.5 * float(np.finfo(np.float32).max)  # f32 and bf16 share the exponent range
    return ~(np.abs(np.asarray(x, dtype=np.float64)) <= half_max)


def _quotient_overflows(a, b, out_dtype):
    """|a / b| is finite-by-finite but overflows `out_dtype`."""
    if np.ndim(a) == 0 and not isinstance(a, np.ndarray) or np.ndim(b) == 0 and not isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(all="ignore"):
        q = np.abs(a64 / b64)
    big = float(np.finfo(np.float64).max if out_dtype == "float64" else
                np.finfo(np.float32).max if out_dtype == "float32" else
                np.finfo(np.float16).max if out_dtype == "float16" else 3.3895314e38)
    return np.isfinite(a64) & np.isfinite(b64) & (b64 != 0) & ~(q <= big)


def _torch_arg(x):
    """An operand for eager: arrays as tensors, Python scalars as they are (weak)."""
    return to_torch(x) if isinstance(x, np.ndarray) else x


def _floor_steps_differ(a, b, out_dtype):
    """Where eager's f16/bf16 floor_divide differs from the floor computed in f32 and rounded once."""
    def f32_arg(x):
        return _torch_arg(np.asarray(x, dtype=np.float32) if isinstance(x, np.ndarray) else x)
    eager = torch.floor_divide(_torch_arg(a), _torch_arg(b))
    once = torch.floor_divide(f32_arg(a), f32_arg(b)).to(eager.dtype)
    return ~((eager == once) | (eager.isnan() & once.isnan())).numpy()


# The ONE table of deviations from eager: (op, output dtype) -> assert_close tolerance overrides
# ("tol") and/or inputs excluded from the comparison ("exclude": a predicate over the op's
# inputs), each with its reason. Everything not listed matches eager at default tolerances.
_GELU_INF = {"exclude": lambda x, out: _huge_inputs(x, out),
             "reason": "eager's vectorized f32 GELU returns NaN for +-inf inputs (its f64 path and "
                       "its scalar tail give +inf / -0, as do the math and DVM), and inf for "
                       "x > max/2 (x*(1+erf) overflows in f32); DVM computes in f64, rounds once"}
_GELU_HALF = {"exclude": lambda x, out: _huge_inputs(x, out) | (np.abs(np.asarray(x, np.float64)) < 2.0 ** -14),
              "reason": "eager's f16 GELU depends on the host's Half kernel: on AVX-512 hosts it "
                        "returns NaN for +-inf (as its f32 path does) and rounds gelu(2^-24) = "
                        "2^-25 (1 + 4e-8) up to 2^-24; elsewhere it rounds the f32 value 2^-25, a "
                        "tie, to 0, as DVM does (f64 -> f32 -> f16: subnormal results may be "
                        "double-rounded)"}
_REMAINDER_OVERFLOW = {"exclude": lambda a, b, out: _quotient_overflows(a, b, out),
                       "reason": "eager's float remainder is a - b*floor(a/b) in the output dtype, "
                                 "NaN when a/b overflows it; DVM's remainder is exact there "
                                 "(fmod in f64, Python's % semantics)"}
_FLOORDIV_HALF = {"exclude": _floor_steps_differ,
                  "reason": "eager's f16/bf16 floor_divide rounds each step to the dtype (its "
                            "Vectorized<Half> arithmetic), which moves the floor by one when "
                            "a - fmod(a, b) rounds (-5 // f16(0.0060005): eager -835, the floor "
                            "-834); DVM computes in f32 and rounds once, as Inductor does"}
# Also outside this table (handled where the operands are made, test_property._fix_operands):
# floor_divide / remainder by an f16/bf16 *subnormal* divisor — eager's vectorized path treats
# the divisor as 0 and returns NaN; DVM divides by the subnormal exactly.
TOLERANCES: dict[tuple[str, str], dict] = {
    ("gelu", "float32"): _GELU_INF,
    ("gelu", "bfloat16"): _GELU_INF,
    ("gelu", "float16"): _GELU_HALF,
    **{("remainder", dt): _REMAINDER_OVERFLOW for dt in FLOATS},
    ("floor_divide", "float16"): _FLOORDIV_HALF,
    ("floor_divide", "bfloat16"): _FLOORDIV_HALF,
    ("prod", "float32"): {"tol": {"rtol": 1e-5, "atol": 1e-5},
                          "reason": "a product of ~4000 f32 factors accumulates ~sqrt(n) ulp of "
                                    "rounding error in any order (eager's own error is 2e-6 "
                                    "relative on the test data; DVM's is smaller)"},
}


def tol(op: str, dtype: str) -> dict:
    return TOLERANCES.get((op, dtype), {}).get("tol", {})


def excluded(op: str, out_dtype: str, *args):
    """Replace the inputs that TOLERANCES excludes for (op, out_dtype) by 1 (in every operand)."""
    entry = TOLERANCES.get((op, out_dtype))
    if not entry or "exclude" not in entry:
        return args
    mask = np.asarray(entry["exclude"](*args, out_dtype))
    if not mask.any():
        return args
    return tuple(np.where(mask, np.ones((), dtype=a.dtype), a).astype(a.dtype)
                 if isinstance(a, np.ndarray) and a.shape == mask.shape else a for a in args)


def check_ew(op: str, args: tuple, torch_fn, what: str) -> None:
    """Run op over args (arrays / Python scalars) in DVM and compare with torch_fn on the same
    values; torch_fn raising (RuntimeError / TypeError) means DVM must raise DTypeError."""
    def eager(xs):
        return torch_fn(*[_torch_arg(x) for x in xs])
    try:
        expected = eager(args)
    except (RuntimeError, TypeError) as e:
        if "ZeroDivisionError" in str(e):
            raise AssertionError(f"{what}: test data divides an integer by zero") from e
        with pytest.raises(dvm.DTypeError):
            run_ew(op, *args)
        return
    out_dt = NAME_OF_TORCH[expected.dtype]
    kept = excluded(op, out_dt, *args)
    if kept is not args:
        args, expected = kept, eager(kept)
    assert_same(run_ew(op, *args), expected, what, **tol(op, out_dt))


_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def torch_with_scalar(op, a, b):
    """Eager `op(a, b)` where one of a, b is a Python scalar (PyTorch's weak-scalar promotion)."""
    fn = TORCH_BINARY[op]
    t = a if isinstance(a, torch.Tensor) else b
    s = b if t is a else a
    if op in _MIRROR:
        return TORCH_BINARY[_MIRROR[op]](t, s) if t is b else fn(t, s)
    if op.startswith("bitwise") and isinstance(s, float):
        raise TypeError("bitwise ops reject float scalars")
    if op in ("maximum", "minimum", "logical_and", "logical_or", "logical_xor"):
        # no scalar overload: the scalar becomes a tensor of the promoted dtype
        dt = torch.result_type(t, s)
        st = torch.tensor(s, dtype=dt)
        return fn(t, st) if t is a else fn(st, t)
    return fn(a, b)  # torch.add(t, 2), torch.add(2, t), ...: the scalar stays weak


# --- values ------------------------------------------------------------------------------------
def special_floats(dtype: str) -> np.ndarray:
    """NaN, ±inf, ±0, subnormals, the extremes and ordinary values, representable in `dtype`."""
    fi = ml_dtypes.finfo(NP_DTYPE[dtype]) if dtype == "bfloat16" else np.finfo(NP_DTYPE[dtype])
    tiny, smallest_sub, big = float(fi.tiny), float(fi.smallest_subnormal), float(fi.max)
    vals = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, smallest_sub, -smallest_sub, tiny / 4,
            -tiny * 3, tiny, big, -big, big / 3, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 0.1,
            -0.7, 7.25, -13.5, 100.0, -1e3, 1e4, 88.0, -88.0, 20.0, -20.0, 6e-3, 1e-5, 3.14159]
    if dtype in ("float32", "float64", "bfloat16"):
        vals += [1e20, -1e20, 1e-20, 1e30, 1e-30, 700.0, -745.0]
    return np.array(vals, dtype=np.float64).astype(NP_DTYPE[dtype])


def special_ints(dtype: str) -> np.ndarray:
    info = np.iinfo(NP_DTYPE[dtype])
    vals = [0, 1, -1, 2, -2, 3, -3, 7, -7, 10, -10, 100, -128, 255, 65535, -65536, 2**31 - 1,
            -2**31, 2**31 - 2, -2**31 + 1, 46341, -46341, 123456789]
    if dtype == "int64":
        vals += [info.max, info.min, info.max - 1, info.min + 1, 2**40 + 3, -2**33]
    return np.array(vals, dtype=np.int64).astype(NP_DTYPE[dtype])


def random_values(rng: np.random.Generator, dtype: str, shape, *, nonzero: bool = False,
                  specials: bool = True, lo: float = -10, hi: float = 10) -> np.ndarray:
    """Random data of `dtype` mixed with special values of that dtype."""
    size = int(np.prod(shape, dtype=np.int64))
    npd = NP_DTYPE[dtype]
    if dtype == "bool":
        return np.ones(shape, dtype=bool) if nonzero else np.asarray(rng.random(shape) < 0.5)
    if dtype in INTS:
        out = rng.integers(int(lo), int(hi) + 1, size=size).astype(npd)
        if specials and size:
            sp = special_ints(dtype)
            idx = rng.choice(size, size=min(size, len(sp)), replace=False)
            out[idx] = rng.choice(sp, size=len(idx))
        if nonzero:
            out[out == 0] = 1
        return out.reshape(shape)
    out = rng.uniform(lo, hi, size=size).astype(npd)
    if specials and size:
        sp = special_floats(dtype)
        idx = rng.choice(size, size=min(size, len(sp) // 2), replace=False)
        out[idx] = rng.choice(sp, size=len(idx))
    if nonzero:
        out[out == 0] = 1
    return out.reshape(shape)


def torch_accepts(fn, *tensors) -> bool:
    try:
        fn(*tensors)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


def run_ew(name: str, *arrays):
    """Run elementwise op `name` over `arrays` (NumPy arrays or Python scalars) as one DVM kernel.
    Array arguments become kernel inputs; Python scalars are passed to the op directly."""
    is_arr = [isinstance(a, np.ndarray) for a in arrays]
    tensors = [a for a, t in zip(arrays, is_arr) if t]
    names = [f"a{i}" for i in range(len(tensors))]

    def body(k, *refs):
        it = iter(refs)
        args = [k.load(next(it)) if t else a for a, t in zip(arrays, is_arr)]
        return k.store(dvm_call(k, name, *args))
    src = f"def kern(k, {', '.join(names)}):\n    return body(k, {', '.join(names)})\n"
    scope = {"body": body}
    exec(src, scope)  # noqa: S102 - a kernel needs one named parameter per array argument
    return dvm.kernel(scope["kern"])(*tensors)


@contextlib.contextmanager
def generic_paths():
    """The CPU VM with its FAST pieces out of the VM table: every instruction on the generic
    paths (the core and the CORE pieces), as a process runs while the fast paths still compile."""
    from dvm.vm import cpu
    from dvm.vm.cpu.host import pieces
    cpu.warm_up(wait_fast=True)
    saved = pieces.TABLE[:pieces.abi.N_PIECES].copy()
    pieces.uninstall_fast()
    try:
        yield
    finally:
        pieces.TABLE[:pieces.abi.N_PIECES] = saved


def pairwise(*factors) -> list[tuple]:
    """Rows of one value per factor such that every pair of values of any two factors is in some
    row (a greedy covering array: about max(len(a) * len(b)) rows instead of the full product).
    For parametrized grids whose factors interact in pairs; a tuple value spreads over several
    parameters (`("where", "min")` fills `mask_kind,fill`). Deterministic."""
    uncovered = {((i, a), (j, b)) for i, j in itertools.combinations(range(len(factors)), 2)
                 for a in range(len(factors[i])) for b in range(len(factors[j]))}
    grid = list(itertools.product(*(range(len(f)) for f in factors)))

    def pairs(row):
        return {((i, row[i]), (j, row[j])) for i, j in itertools.combinations(range(len(row)), 2)}
    rows = []
    while uncovered:
        best = max(grid, key=lambda row: len(pairs(row) & uncovered))   # first of the best, in the grid's order
        uncovered -= pairs(best)
        rows.append(best)
    return [tuple(v for f, k in zip(factors, row)
                  for v in (f[k] if isinstance(f[k], tuple) else (f[k],))) for row in rows]


def new_fallbacks(before: dict) -> dict:
    """The fallback counters (`fallback:<op>:<reason>`) that grew since the snapshot `before`."""
    after = dvm.counters()
    return {k: v - before.get(k, 0) for k, v in after.items() if k.startswith("fallback:") and v != before.get(k, 0)}
