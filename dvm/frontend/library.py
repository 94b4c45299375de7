"""Standard fused kernels written with the builder API: the forms the demo, the benchmarks and
the tests share (each is one vector kernel)."""
from __future__ import annotations

from .builder import kernel


@kernel
def bias_gelu(k, x, b):
    """Broadcast bias-add (bias over the last dim) then exact GELU."""
    return k.store(k.gelu(k.add(k.load(x), k.load(b))))


@kernel
def softmax(k, x):
    """Safe softmax over the last dim. Like PyTorch's native CPU kernel it multiplies by the
    row's reciprocal: one division per row instead of one per element."""
    return k.store(softmax_of(k, k.load(x)))


def softmax_of(k, x, axis: int = -1):
    """The safe softmax of traced value x over `axis` (softmax's form: its last dim)."""
    m = k.max(x, axis=axis, keepdims=True)
    e = k.exp(k.sub(x, m))
    return k.mul(e, k.reciprocal(k.sum(e, axis=axis, keepdims=True)))


def layer_norm_of(k, x, w, b):
    """The LayerNorm (eps 1e-5) of traced value x over its last dim, with traced weight w and bias b."""
    mean = k.mean(x, axis=-1, keepdims=True)
    xc = k.sub(x, mean)
    var = k.mean(k.mul(xc, xc), axis=-1, keepdims=True)
    y = k.mul(xc, k.rsqrt(k.add(var, 1e-5)))
    return k.add(k.mul(y, w), b)


def rms_norm_of(k, x, w):
    """The RMSNorm (eps 1e-6) of traced value x over its last dim, with traced weight w."""
    ms = k.mean(k.mul(x, x), axis=-1, keepdims=True)
    return k.mul(k.mul(x, k.rsqrt(k.add(ms, 1e-6))), w)


@kernel
def layernorm(k, x, w, b):
    """LayerNorm over the last dim with weight and bias (eps 1e-5)."""
    return k.store(layer_norm_of(k, k.load(x), k.load(w), k.load(b)))


@kernel
def rmsnorm(k, x, w):
    """RMSNorm over the last dim with weight (eps 1e-6)."""
    return k.store(rms_norm_of(k, k.load(x), k.load(w)))
