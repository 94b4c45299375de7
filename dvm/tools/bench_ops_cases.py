"""The cases of `dvm bench ops`: each computation as a DVM kernel, a NumPy float32 form (the
reference, or the exact float64 result where NumPy's form approximates), PyTorch's composite and
native forms, and a numexpr expression where one exists; with the inputs and tolerances per shape."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import dvm

from ..frontend.library import layer_norm_of, rms_norm_of, softmax_of
from .bench_encode import _ref_chain8, _ref_layernorm, _ref_rmsnorm, _ref_softmax
from .bench_encode import bias_gelu, chain8, layernorm, rmsnorm, softmax


# ---------------------------------------------------------------------------------------------
# DVM kernels (chain8, bias_gelu, softmax, layernorm, rmsnorm come from bench_encode).
@dvm.kernel
def tanh_exp(k, a, b):
    """tanh(exp(a*b) + a) * b"""
    a, b = k.load(a), k.load(b)
    return k.store(k.mul(k.tanh(k.add(k.exp(k.mul(a, b)), a)), b))


@dvm.kernel
def silu_mul(k, a, b):
    """SiLU(a) * b (the gate of a SwiGLU MLP)"""
    return k.store(k.mul(k.silu(k.load(a)), k.load(b)))


@dvm.kernel
def pow_abs(k, a):
    """|a| ** 2.5 (a power that is not a product or a root: the VM's pow)"""
    return k.store(k.pow(k.abs(k.load(a)), 2.5))


@dvm.kernel
def add_softmax(k, a, b):
    """softmax of a + b (attention scores plus an additive mask, where no fused attention takes them)"""
    return k.store(softmax_of(k, k.add(k.load(a), k.load(b))))


@dvm.kernel
def add_layernorm(k, a, b, w, c):
    """LayerNorm of a residual sum a + b (a post-norm block's: BERT, BART)"""
    return k.store(layer_norm_of(k, k.add(k.load(a), k.load(b)), k.load(w), k.load(c)))


@dvm.kernel
def add3_layernorm(k, a, b, c, w, d):
    """LayerNorm of a parallel block's sum a + b + c (attention, MLP and residual: GPT-NeoX, Phi, Falcon)"""
    return k.store(layer_norm_of(k, k.add(k.add(k.load(a), k.load(b)), k.load(c)), k.load(w), k.load(d)))


@dvm.kernel
def add_rmsnorm(k, a, b, w):
    """RMSNorm of a residual sum a + b"""
    return k.store(rms_norm_of(k, k.add(k.load(a), k.load(b)), k.load(w)))


@dvm.kernel
def hf_add_rmsnorm_bf16(k, a, b, w):
    """RMSNorm of a bfloat16 residual sum as Hugging Face's models compute it: the sum rounded to
    bfloat16, the norm in float32, its result rounded to bfloat16 before the weight"""
    h = k.cast(k.add(k.load(a), k.load(b)), "float32")
    y = k.mul(h, k.rsqrt(k.add(k.mean(k.mul(h, h), axis=-1, keepdims=True), 1e-6)))
    return k.store(k.mul(k.load(w), k.cast(y, "bfloat16")))


@dvm.kernel
def softmax_first(k, x):
    """softmax over the first axis (a sequence axis ahead of the heads: its columns strided)"""
    return k.store(softmax_of(k, k.load(x), axis=0))


@dvm.kernel
def centre_first(k, x):
    """x minus its mean over the first axis (features centred over a batch: its columns strided)"""
    v = k.load(x)
    return k.store(k.sub(v, k.mean(v, axis=0, keepdims=True)))


@dvm.kernel
def sum_last(k, x):
    return k.store(k.sum(k.load(x), axis=-1))


@dvm.kernel
def max_last(k, x):
    return k.store(k.max(k.load(x), axis=-1))


@dvm.kernel
def sum_first(k, x):
    return k.store(k.sum(k.load(x), axis=0))


@dvm.kernel
def max_first(k, x):
    return k.store(k.max(k.load(x), axis=0))


@dvm.kernel
def add_one(k, x):
    """The launch-overhead probe: one add."""
    return k.store(k.add(k.load(x), 1.0))


# ---------------------------------------------------------------------------------------------
# NumPy forms (float32 in, float32 out).
def _np_erf(x: np.ndarray) -> np.ndarray:
    """erf by Abramowitz & Stegun 7.1.26 (max abs error 1.5e-7): NumPy has no erf."""
    a = np.abs(x)
    t = 1.0 / (1.0 + np.float32(0.3275911) * a)
    p = ((((np.float32(1.061405429) * t - np.float32(1.453152027)) * t + np.float32(1.421413741)) * t
          - np.float32(0.284496736)) * t + np.float32(0.254829592)) * t
    return np.copysign(1.0 - p * np.exp(-a * a), x)


def _np_bias_gelu(x, b):
    v = x + b
    return 0.5 * v * (1.0 + _np_erf(v * np.float32(1 / math.sqrt(2.0))))


def _exact_bias_gelu(x, b):
    """The exact GELU (float64 erf) of the float32 sum x + b, which every implementation rounds
    first. The check reference for bias_gelu: the NumPy form's erf is itself an approximation
    (abs. error ~5e-7 in GELU), which used up half of the absolute tolerance."""
    import torch
    v = (x + b).astype(np.float64)
    return torch.nn.functional.gelu(torch.from_numpy(v)).numpy()


def _np_tanh_exp(a, b):
    return np.tanh(np.exp(a * b) + a) * b


def _np_silu_mul(a, b):
    return a / (1.0 + np.exp(-a)) * b


# PyTorch forms, imported lazily (torch costs ~1 s to import).
def _torch_forms() -> dict:
    import torch
    import torch.nn.functional as F

    def chain8_t(x):
        t = torch.sigmoid(x * 1.702)
        t = x * t
        t = t + 0.1
        t = torch.tanh(t)
        t = t * t
        t = t - 0.5
        return torch.abs(t)

    def softmax_t(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    def layernorm_t(x, w, b):
        xc = x - x.mean(-1, keepdim=True)
        var = (xc * xc).mean(-1, keepdim=True)
        return xc * torch.rsqrt(var + 1e-5) * w + b

    def rmsnorm_t(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    forms = {
        "chain8": (chain8_t, None),
        "tanh_exp": (lambda a, b: torch.tanh(torch.exp(a * b) + a) * b, None),
        "bias_gelu": (lambda x, b: F.gelu(x + b), None),
        "silu_mul": (lambda a, b: F.silu(a) * b, None),
        "silu_mul_halves": (lambda a, b: F.silu(a) * b, None),
        "silu_mul_transposed": (lambda a, b: F.silu(a) * b, None),
        "pow_abs": (lambda a: torch.abs(a) ** 2.5, None),
        "softmax": (softmax_t, lambda x: torch.softmax(x, -1)),
        "add_softmax": (lambda a, b: softmax_t(a + b), lambda a, b: torch.softmax(a + b, -1)),
        "softmax_first": (lambda x: softmax_t(x.T).T, lambda x: torch.softmax(x, 0)),
        "centre_first": (lambda x: x - x.mean(0, keepdim=True), None),
        "layernorm": (layernorm_t, lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)),
        "layernorm_transposed": (layernorm_t, lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)),
        "rmsnorm": (rmsnorm_t, lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6)),
        "add_layernorm": (lambda a, b, w, c: layernorm_t(a + b, w, c),
                          lambda a, b, w, c: F.layer_norm(a + b, (a.shape[-1],), w, c, 1e-5)),
        "add3_layernorm": (lambda a, b, c, w, d: layernorm_t(a + b + c, w, d),
                           lambda a, b, c, w, d: F.layer_norm(a + b + c, (a.shape[-1],), w, d, 1e-5)),
        "add_rmsnorm": (lambda a, b, w: rmsnorm_t(a + b, w), lambda a, b, w: F.rms_norm(a + b, (a.shape[-1],), w, 1e-6)),
        "sum_last": (lambda x: x.sum(-1), None),
        "max_last": (lambda x: x.amax(-1), None),
        "sum_first": (lambda x: x.sum(0), None),
        "max_first": (lambda x: x.amax(0), None),
    }
    def hf_add_rmsnorm_t(a, b, w):   # LlamaRMSNorm (and Mistral's, Qwen's, ...) of the residual sum
        h = (a + b).float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(a.dtype)

    forms["hf_add_rmsnorm_bf16"] = (hf_add_rmsnorm_t, forms["add_rmsnorm"][1])
    return forms | {f"{name}_bf16": forms[name] for name in ("silu_mul", "silu_mul_halves", "add_rmsnorm")}


# 16-bit results: torch.testing's bfloat16 rtol; atol a few of the data's bfloat16 steps (eager
# rounds each intermediate: a sum's cancellation leaves that much absolute error)
HALF_RTOL, HALF_ATOL = 1.6e-2, 2.0 ** -7


LAYER_NORMS = ("layernorm", "layernorm_transposed", "add_layernorm", "add3_layernorm")


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    kernel: dvm.KernelFunction
    n_vectors: int               # arguments of shape (cols,) after the full-shape ones
    n_full: int                  # full-shape arguments
    numpy: Callable
    kind: str                    # elementwise | norm | sum | max
    native_name: str | None = None
    numexpr: str | None = None   # a fixed expression over a, b and float32 constants c1.. (never user input)
    numexpr_consts: dict = field(default_factory=dict)
    numexpr_note: str = "not elementwise"
    reduce_axis: int | None = None
    exact: Callable | None = None  # float64 result to check against, where the NumPy form approximates
    halves: bool = False         # the full-shape arguments: the pieces of each row of one array
    transposed: bool = False     # the first full-shape argument: a transposed (column-major) view
    # every argument and the result: float32, or bfloat16 (ml_dtypes' NumPy type; the reference
    # is the NumPy form over their float32 values, NumPy and numexpr have no bfloat16 arithmetic)
    dtype: str = "float32"

    def cast(self, a: np.ndarray) -> np.ndarray:
        """a (float32) in the case's dtype."""
        if self.dtype == "float32":
            return a
        import ml_dtypes
        return a.astype(getattr(ml_dtypes, self.dtype))

    def inputs(self, rng: np.random.Generator, shape: tuple) -> list[np.ndarray]:
        full = [self.cast(rng.standard_normal(shape, dtype=np.float32)) for _ in range(self.n_full)]
        if self.halves:   # views of one array's rows (a merged gate-and-up product's two halves)
            rows = self.cast(rng.standard_normal((*shape[:-1], self.n_full * shape[-1]), dtype=np.float32))
            full = [rows[..., i * shape[-1]:(i + 1) * shape[-1]] for i in range(self.n_full)]
        if self.transposed:   # the same values, column-major (a LAPACK result, a heads-last layout)
            full[0] = np.ascontiguousarray(full[0].T).T
        vecs = [rng.standard_normal(shape[-1:], dtype=np.float32) for _ in range(self.n_vectors)]
        if self.name.removesuffix("_bf16") in LAYER_NORMS:   # weight near 1, bias small: a realistic LayerNorm
            vecs = [1.0 + 0.1 * vecs[0], 0.1 * vecs[1]]
        elif self.name.removesuffix("_bf16") in ("rmsnorm", "add_rmsnorm", "hf_add_rmsnorm"):
            vecs = [1.0 + 0.1 * vecs[0]]
        return full + [self.cast(v.astype(np.float32)) for v in vecs]

    def reference(self, arrays: list[np.ndarray]) -> np.ndarray:
        """The float32 result the case is checked against: the NumPy form (or the exact one) over
        the inputs' float32 values."""
        f32 = arrays if self.dtype == "float32" else [a.astype(np.float32) for a in arrays]
        want = self.numpy(*f32)
        assert want.dtype == np.float32, f"{self.name}: the NumPy form must stay float32"
        return self.exact(*f32).astype(np.float32) if self.exact is not None else want

    def tolerance(self, shape: tuple, want: np.ndarray) -> tuple[float, float]:
        """(rtol, atol) against the reference result `want`. Elementwise: atol is 1e-6 times
        the data's scale (max |want|, at least 1): a float32 kernel's absolute error near zero
        is a few ULPs of the intermediate values (e.g. 0.5*x*(1 + erf(x/sqrt2)) for x << 0), so
        a fixed 1e-6 would flag float32-exact implementations on data of magnitude ~8."""
        if self.dtype != "float32":   # one rounding of the result, and eager's of its intermediates
            scale = float(np.abs(want).max(initial=1.0)) if want.size else 1.0
            return HALF_RTOL, HALF_ATOL * max(1.0, scale)
        if self.kind == "elementwise":
            scale = float(np.abs(want).max(initial=1.0)) if want.size else 1.0
            return 1e-5, 1e-6 * max(1.0, scale)
        if self.kind == "norm":
            return 1e-4, 1e-5
        if self.kind == "max":
            return 0.0, 0.0
        n = shape[self.reduce_axis]   # sum: float32 rounding grows with the reduced length
        return 1e-5, 1e-6 * n


CASES = (
    Case("chain8", "8-op elementwise chain", chain8, 0, 1, _ref_chain8, "elementwise",
         numexpr="abs(tanh(a * (1 / (1 + exp(-(a * c1)))) + c2) ** 2 - c3)",
         numexpr_consts={"c1": 1.702, "c2": 0.1, "c3": 0.5}),
    Case("tanh_exp", "tanh(exp(a*b)+a)*b", tanh_exp, 0, 2, _np_tanh_exp, "elementwise",
         numexpr="tanh(exp(a * b) + a) * b"),
    Case("bias_gelu", "bias-add (broadcast over rows) + GELU", bias_gelu, 1, 1, _np_bias_gelu,
         "elementwise", numexpr_note="numexpr has no erf", exact=_exact_bias_gelu),
    Case("silu_mul", "SiLU(a) * b", silu_mul, 0, 2, _np_silu_mul, "elementwise",
         numexpr="a / (1 + exp(-a)) * b"),
    Case("silu_mul_halves", "SiLU(a) * b, a and b the two halves of each row of one array (the gate and up "
         "halves of a merged product)", silu_mul, 0, 2, _np_silu_mul, "elementwise",
         numexpr="a / (1 + exp(-a)) * b", halves=True),
    Case("silu_mul_transposed", "SiLU(a) * b, a a transposed view (column-major: a LAPACK result, a heads-last "
         "layout)", silu_mul, 0, 2, _np_silu_mul, "elementwise", numexpr="a / (1 + exp(-a)) * b", transposed=True),
    Case("silu_mul_bf16", "SiLU(a) * b in bfloat16", silu_mul, 0, 2, _np_silu_mul, "elementwise",
         numexpr_note="numexpr has no bfloat16", dtype="bfloat16"),
    Case("silu_mul_halves_bf16", "SiLU(a) * b in bfloat16, a and b the two halves of each row of one array",
         silu_mul, 0, 2, _np_silu_mul, "elementwise", numexpr_note="numexpr has no bfloat16", halves=True,
         dtype="bfloat16"),
    Case("pow_abs", "|a| ** 2.5", pow_abs, 0, 1, lambda a: np.abs(a) ** np.float32(2.5), "elementwise",
         numexpr="abs(a) ** 2.5"),
    Case("softmax", "softmax over the last axis", softmax, 0, 1, _ref_softmax, "norm",
         native_name="torch.softmax"),
    Case("add_softmax", "softmax over the last axis of a + b (scores plus an additive mask)", add_softmax, 0, 2,
         lambda a, b: _ref_softmax(a + b), "norm", native_name="torch.softmax(a + b)"),
    Case("softmax_first", "softmax over the first axis (its columns strided: a sequence axis ahead of the heads)",
         softmax_first, 0, 1, lambda x: _ref_softmax(x.T).T, "norm", native_name="torch.softmax(x, 0)"),
    Case("centre_first", "x minus its mean over the first axis (features centred over a batch: its columns "
         "strided)", centre_first, 0, 1, lambda x: x - x.mean(axis=0, keepdims=True), "norm"),
    Case("layernorm", "LayerNorm (weight, bias) over the last axis", layernorm, 2, 1, _ref_layernorm,
         "norm", native_name="F.layer_norm"),
    Case("layernorm_transposed", "LayerNorm (weight, bias) over the last axis of a transposed view (the channels "
         "of a channels-first image)", layernorm, 2, 1, _ref_layernorm, "norm", native_name="F.layer_norm",
         transposed=True),
    Case("rmsnorm", "RMSNorm (weight) over the last axis", rmsnorm, 1, 1, _ref_rmsnorm, "norm",
         native_name="F.rms_norm"),
    Case("add_layernorm", "LayerNorm of a residual sum a + b", add_layernorm, 2, 2,
         lambda a, b, w, c: _ref_layernorm(a + b, w, c), "norm", native_name="F.layer_norm(a + b)"),
    Case("add3_layernorm", "LayerNorm of a parallel block's sum a + b + c", add3_layernorm, 2, 3,
         lambda a, b, c, w, d: _ref_layernorm(a + b + c, w, d), "norm", native_name="F.layer_norm(a + b + c)"),
    Case("add_rmsnorm", "RMSNorm of a residual sum a + b", add_rmsnorm, 1, 2,
         lambda a, b, w: _ref_rmsnorm(a + b, w), "norm", native_name="F.rms_norm(a + b)"),
    Case("add_rmsnorm_bf16", "RMSNorm of a residual sum a + b in bfloat16", add_rmsnorm, 1, 2,
         lambda a, b, w: _ref_rmsnorm(a + b, w), "norm", native_name="F.rms_norm(a + b)", dtype="bfloat16"),
    Case("hf_add_rmsnorm_bf16", "RMSNorm of a residual sum a + b in bfloat16, computed in float32 as Hugging "
         "Face's models do", hf_add_rmsnorm_bf16, 1, 2, lambda a, b, w: _ref_rmsnorm(a + b, w), "norm",
         native_name="F.rms_norm(a + b)", dtype="bfloat16"),
    Case("sum_last", "sum over the last axis", sum_last, 0, 1, lambda x: x.sum(axis=-1), "sum",
         reduce_axis=-1),
    Case("max_last", "max over the last axis", max_last, 0, 1, lambda x: x.max(axis=-1), "max",
         reduce_axis=-1),
    Case("sum_first", "sum over the first axis", sum_first, 0, 1, lambda x: x.sum(axis=0), "sum",
         reduce_axis=0),
    Case("max_first", "max over the first axis", max_first, 0, 1, lambda x: x.max(axis=0), "max",
         reduce_axis=0),
)
CASE_NAMES = tuple(c.name for c in CASES)
