"""What `dvm bench lazy` runs: eager chains written with plain tensor ops (the forms of
`dvm bench ops`, plus softmax-with-temperature sampling math and an Adam step over a list of
parameters), torch.optim's own Adam step, and the models whose greedy generate() it times."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .bench_ops_cases import _torch_forms

# sampling: temperature and min-p (a filter relative to the top probability: no sort, no top-k)
TEMPERATURE = 0.7
MIN_P = 0.05
# Adam (torch.optim.Adam's defaults, lr 1e-3)
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8


def sampling(logits):
    """Softmax with temperature, its log-probabilities and entropy, and the min-p filtered,
    renormalized distribution a sampler would draw from."""
    import torch
    z = logits / TEMPERATURE
    p = torch.softmax(z, -1)
    logp = torch.log_softmax(z, -1)
    entropy = -(p * logp).sum(-1, keepdim=True)
    keep = p >= MIN_P * p.amax(-1, keepdim=True)
    q = torch.where(keep, p, 0.0)
    return q / q.sum(-1, keepdim=True), entropy


class Adam:
    """torch.optim.Adam's single-tensor step (foreach=False), written with tensor ops over a list
    of parameters; every call is one step (the bias corrections change: runtime scalars)."""

    def __init__(self, params: list, grads: list):
        import torch
        self.params, self.grads, self.t = params, grads, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def step(self):
        self.t += 1
        bc1, bc2 = 1 - BETA1 ** self.t, 1 - BETA2 ** self.t
        for p, g, m, v in zip(self.params, self.grads, self.m, self.v):
            m.mul_(BETA1).add_(g, alpha=1 - BETA1)
            v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
            denom = (v.sqrt() / bc2 ** 0.5).add_(EPS)
            p.addcdiv_(m, denom, value=-LR / bc1)
        return self.params


@dataclass(frozen=True)
class Chain:
    name: str
    what: str
    elementwise: bool            # elementwise-heavy (the 1.5x target of DESIGN.md §9)
    make: Callable               # (rows, cols, generator) -> (callable, args, state to compare)


def _randn(shape, gen):
    import torch
    return torch.randn(*shape, generator=gen)


def _forms() -> dict:
    return {k: v[0] for k, v in _torch_forms().items()}


def _plain(form: str, shapes: Callable):
    def make(rows, cols, gen):
        fn = _forms()[form]
        return fn, tuple(_randn(s, gen) for s in shapes(rows, cols)), None
    return make


def _adam(rows, cols, gen):
    """A model-like parameter list of rows*cols*2 + 2*cols elements: two matrices, two vectors."""
    shapes = [(rows, cols), (cols,), (rows, cols), (cols,)]
    params = [_randn(s, gen) for s in shapes]
    opt = Adam(params, [_randn(s, gen) * 0.01 for s in shapes])
    return opt.step, (), opt


def _torch_adam(rows, cols, gen):
    """torch.optim.Adam itself (its single-tensor loop, PyTorch's default for CPU parameters) over
    the same parameter list: it reads its step count with .item() between the moments' and the
    parameters' updates."""
    import torch
    shapes = [(rows, cols), (cols,), (rows, cols), (cols,)]
    params = [torch.nn.Parameter(_randn(s, gen)) for s in shapes]
    for p in params:
        p.grad = _randn(p.shape, gen) * 0.01
    opt = torch.optim.Adam(params, lr=LR, foreach=False)

    def step():
        opt.step()
        return [p.detach() for p in params]
    return step, (), opt


CHAINS = {c.name: c for c in (
    Chain("rmsnorm", "x * rsqrt(mean(x*x, -1) + eps) * w", True, _plain("rmsnorm", lambda r, c: [(r, c), (c,)])),
    Chain("swiglu", "silu(gate) * up", True, _plain("silu_mul", lambda r, c: [(r, c), (r, c)])),
    Chain("bias_gelu", "gelu(x + b) (erf)", True, _plain("bias_gelu", lambda r, c: [(r, c), (c,)])),
    Chain("chain8", "sigmoid/mul/add/tanh/mul/sub/abs: 8 elementwise ops", True,
          _plain("chain8", lambda r, c: [(r, c)])),
    Chain("layernorm", "(x - mean) * rsqrt(var + eps) * w + b", False,
          _plain("layernorm", lambda r, c: [(r, c), (c,), (c,)])),
    Chain("sampling", "softmax(x / T), log_softmax, entropy, min-p filter, renormalize", False,
          lambda r, c, gen: (sampling, (_randn((r, c), gen) * 3,), None)),
    Chain("adam", "Adam step with tensor ops over 4 parameters (2 rows x cols, 2 cols)", True, _adam),
    Chain("torch_adam", "torch.optim.Adam(foreach=False).step() over the same parameters", False, _torch_adam),
)}
CHAIN_NAMES = tuple(CHAINS)


def models() -> dict:
    """name -> (builder(seed), description): the tiny models of `dvm bench models`."""
    from .bench_models import MODELS
    return MODELS
