"""Forward composites the torch backend hands to PyTorch's decompositions (aten_decomp.DECOMPOSE:
norms, batch / group / instance norm, logsumexp, hard and smooth activations, losses, any / all,
clamp by tensors, tril / triu, repeat, stack, PReLU, pixel (un)shuffle, logaddexp, sinc, ...):
eager's values and gradients, with no fallback op, f32 and bf16, fixed and changing sizes
(gradients within twice eager's own error from float64); batch norm's running statistics updated
as eager updates them. Norms and logit of 16-bit inputs stay PyTorch's ops."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.runtime import counters  # noqa: E402
from helpers import new_fallbacks  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _img(n=2, c=8, h=5, w=6, seed=0):
    return torch.randn(n, c, h, w, generator=torch.Generator().manual_seed(seed))


def _img6(n=2, c=8, h=6, w=6, seed=0):
    return _img(n, c, h, w, seed)


def _mat(r=37, c=24, seed=1):
    return torch.randn(r, c, generator=torch.Generator().manual_seed(seed)) * 2


W8, B8, MEAN8, VAR8 = torch.linspace(-1, 2, 8), torch.ones(8), torch.linspace(0, 0.7, 8), torch.linspace(1, 8, 8)
CASES = {
    "vector_norm": (lambda x: torch.linalg.vector_norm(x, dim=-1), _mat),
    "vector_norm_inf": (lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=0), _mat),
    "vector_norm_all": (lambda x: torch.linalg.vector_norm(x, ord=3), _mat),
    "normalize": (lambda x: F.normalize(x, dim=-1), _mat),
    "cosine_similarity": (lambda x: F.cosine_similarity(x, x * 0.5 + 1, dim=-1), _mat),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), _mat),
    "mish": (F.mish, _mat), "hardswish": (F.hardswish, _mat), "hardsigmoid": (F.hardsigmoid, _mat),
    "celu": (lambda x: F.celu(x, 0.7), _mat), "logit": (lambda x: torch.logit((x * 0.5).sigmoid(), eps=1e-6), _mat),
    "glu": (lambda x: F.glu(x, -1), _mat), "threshold": (lambda x: F.threshold(x, 0.1, 2.0), _mat),
    "frac": (torch.frac, _mat), "xlogy": (lambda x: torch.xlogy(x, x.abs() + 0.5), _mat),
    "smooth_l1": (lambda x: F.smooth_l1_loss(x, x * 0.8 - 0.3, beta=0.5), _mat),
    "huber": (lambda x: F.huber_loss(x, x * 0.3), _mat),
    "bce_logits": (lambda x: F.binary_cross_entropy_with_logits(x, (x * 0.7).sigmoid()), _mat),
    "aminmax": (lambda x: torch.aminmax(x, dim=0), _mat), "count_nonzero": (lambda x: torch.count_nonzero(x > 0, 0), _mat),
    "any_all": (lambda x: ((x > 3).any(-1), (x > -9).all()), _mat),
    "clamp_tensors": (lambda x: x.clamp_min(x.mean(0)).clamp_max(x.mean(0) + 1), _mat),
    "group_norm": (lambda x: F.group_norm(x, 4, W8.to(x.dtype), B8.to(x.dtype)), _img),
    "instance_norm": (F.instance_norm, _img),
    "batch_norm_eval": (lambda x: F.batch_norm(x, MEAN8, VAR8, W8, B8), _img),
    "batch_norm_train": (lambda x: F.batch_norm(x, None, None, training=True), _img),
    "tril_triu": (lambda x: torch.tril(x, -2) + torch.triu(x * 2, 3), _mat),
    "repeat": (lambda x: x.repeat(2, 1, 3) * 2, _mat), "stack": (lambda x: torch.stack([x, x.exp()], 1).sum(0), _mat),
    "prelu": (lambda x: F.prelu(x, (W8 * 0.2).to(x.dtype)), _img),
    "pixel_shuffle": (lambda x: F.pixel_unshuffle(F.pixel_shuffle(x, 2) * 3, 2) + x, _img6),
    "bce": (lambda x: F.binary_cross_entropy(x.sigmoid(), (x * 0.5).sigmoid()), _mat),
    "soft_margin": (lambda x: F.soft_margin_loss(x, (x * 0.3).sign()), _mat),
    "norm": (lambda x: torch.norm(x, dim=1) + torch.norm(x, p=1, dim=0).sum(), _mat),
    "logaddexp": (lambda x: torch.logaddexp(x, x * 0.5 - 1) + torch.logaddexp2(x, -x), _mat),
    "heaviside": (lambda x: torch.heaviside(x.round(), x * 0 + 0.5), _mat),
    "deg_rad": (lambda x: torch.rad2deg(torch.deg2rad(x) * 2), _mat), "sinc": (torch.sinc, _mat),
    "fill": (lambda x: (x * 2).fill_(0.5) + x, _mat),
}


WIDE_ONLY = ("group_norm", "instance_norm", "batch_norm_eval", "batch_norm_train", "logit")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_without_fallback(name, dtype):
    fn, make = CASES[name]
    x = make().to(dtype)
    torch._dynamo.reset()
    before = counters.snapshot()
    got = torch.compile(fn, backend="dvm", dynamic=False)(x)
    torch.testing.assert_close(got, fn(x))
    if dtype == torch.bfloat16 and name in WIDE_ONLY:   # the op stays PyTorch's (aten_decomp.wide_only)
        return
    fallbacks = {k for k in new_fallbacks(before) if not (name == "group_norm" and "aten.as_strided" in k)}
    assert not fallbacks, fallbacks   # (PyTorch's group norm decomposition takes one as_strided view)


@pytest.mark.parametrize("name", ["normalize", "group_norm", "logsumexp", "mish", "hardswish", "batch_norm_train",
                                  "tril_triu", "repeat", "stack", "bce", "logaddexp", "norm", "sinc"])
def test_gradients_and_changing_sizes(name):
    fn, make = CASES[name]
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="dvm", dynamic=True)
    for seed, size in enumerate(((37, 24), (50, 24)) if make is _mat else ((2, 8, 5, 6), (3, 8, 7, 4))):
        x = make(*size, seed=seed).requires_grad_(True)
        y = x.detach().clone().requires_grad_(True)
        z = x.detach().double().requires_grad_(True)
        got, want, exact = cf(x), fn(y), fn(z)
        torch.testing.assert_close(got, want)
        for out, t in ((got, x), (want, y), (exact, z)):
            out.square().sum().backward()
        err, eager_err = ((g.grad.double() - z.grad).abs().max().item() for g in (x, y))
        scale = z.grad.abs().max().item()
        assert err <= 2 * eager_err + 1e-6 * scale, (name, size, err, eager_err)


def test_batch_norm_module_updates_running_stats():
    """nn.BatchNorm2d in training mode: output, running mean / var and batch count as eager's."""
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm2d(8, momentum=0.3)
    ours = torch.nn.BatchNorm2d(8, momentum=0.3)
    ours.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    cf = torch.compile(ours, backend="dvm", dynamic=False)
    for seed in range(3):
        x = _img(4, 8, 5, 5, seed=seed) * 3 + 1
        torch.testing.assert_close(cf(x), eager(x))
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, msg=lambda m: f"{key}: {m}")
    eager.eval()
    ours.eval()
    x = _img(2, 8, 3, 3, seed=9)
    torch.testing.assert_close(cf(x), eager(x))
