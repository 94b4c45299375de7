"""The kernels of `dvm bench ops --device cuda` (also the GPU VM's tests): the issue's 8-op chain,
softmax, LayerNorm and RMSNorm (any float dtype in and out, float32 inside), as DVM kernels and as
PyTorch composites (what eager and Inductor run)."""
from __future__ import annotations

import dvm


@dvm.kernel
def chain8(k, x, y):
    """mul, add, sigmoid, mul, sub, max, mul, add: ((sigmoid(1.5x + y) x - y) max 0.25) 2 + 1"""
    x, y = k.load(x), k.load(y)
    z = k.sub(k.mul(k.sigmoid(k.add(k.mul(x, 1.5), y)), x), y)
    return k.store(k.add(k.mul(k.maximum(z, 0.25), 2.0), 1.0))


@dvm.kernel
def softmax(k, x):
    x = k.load(x)
    e = k.exp(k.sub(x, k.max(x, axis=-1, keepdims=True)))
    return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True)))


@dvm.kernel
def layer_norm(k, x, w, b):
    xf = k.cast(k.load(x), "float32")
    mu = k.mean(xf, axis=-1, keepdims=True)
    xc = k.sub(xf, mu)
    var = k.mean(k.mul(xc, xc), axis=-1, keepdims=True)
    y = k.add(k.mul(k.mul(xc, k.rsqrt(k.add(var, 1e-5))), k.cast(k.load(w), "float32")),
              k.cast(k.load(b), "float32"))
    return k.store(k.cast(y, x.node.dtype.short))


@dvm.kernel
def rms_norm(k, x, w):
    xf = k.cast(k.load(x), "float32")
    ms = k.mean(k.mul(xf, xf), axis=-1, keepdims=True)
    return k.store(k.cast(k.mul(k.mul(xf, k.rsqrt(k.add(ms, 1e-6))), k.cast(k.load(w), "float32")),
                          x.node.dtype.short))


# --- PyTorch composites (torch imported by the caller) ----------------------------------------------
def torch_chain8(x, y):
    import torch
    z = torch.sigmoid(x * 1.5 + y) * x - y
    return torch.maximum(z, torch.tensor(0.25, dtype=x.dtype, device=x.device)) * 2.0 + 1.0


def torch_softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def torch_layer_norm(x, w, b):
    xf = x.float()
    mu = xf.mean(-1, keepdim=True)
    var = ((xf - mu) ** 2).mean(-1, keepdim=True)
    return ((xf - mu) * (var + 1e-5).rsqrt() * w.float() + b.float()).to(x.dtype)


def torch_rms_norm(x, w):
    xf = x.float()
    return (xf * (xf * xf).mean(-1, keepdim=True).add(1e-6).rsqrt() * w.float()).to(x.dtype)
