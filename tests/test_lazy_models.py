"""dvm.lazy() on tiny Hugging Face models (random init, no downloads): greedy generate() yields
eager's tokens, and a training step (forward, backward, an Adam step written with tensor ops)
gives eager's loss, gradients and parameters."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import dvm  # noqa: E402
from dvm.runtime import counters  # noqa: E402
from test_hf_models import _llama, _qwen_moe  # noqa: E402 (the same tiny models)

TOL = dict(rtol=1e-4, atol=1e-4)   # as tests/test_hf_models.py: reductions sum in another order

pytestmark = pytest.mark.vm_once


def _count(name):
    return counters.snapshot().get(name, 0)


@pytest.mark.parametrize("make", [_llama, _qwen_moe], ids=["llama", "qwen2_moe"])
def test_greedy_generate_matches_eager(make):
    model = make().eval()
    ids = torch.randint(0, 128, (1, 11), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    want = model.generate(ids, **kw)
    launches = _count("lazy_dvm_launches")
    with dvm.lazy(adaptive=False):
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)
    assert _count("lazy_dvm_launches") > launches
    with dvm.lazy():                 # the default (adaptive) policy: the same tokens
        assert torch.equal(model.generate(ids, **kw), want)


def _adam(params, state, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
    """torch.optim.Adam's single-tensor step, written with tensor ops."""
    state["t"] += 1
    t = state["t"]
    for p in params:
        m, v = state.setdefault(id(p), (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(b1).add_(p.grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
        denom = (v.sqrt() / (1 - b2 ** t) ** 0.5).add_(eps)
        p.data.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


def test_training_step_matches_eager():
    eager, lazy = _llama(), _llama()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(5))
    s_eager, s_lazy = {"t": 0}, {"t": 0}
    for step in range(2):
        want = eager(ids, labels=ids).loss
        want.backward()
        _adam(list(eager.parameters()), s_eager)
        kernels = _count("lazy_dvm_kernels")
        with dvm.lazy(adaptive=False):
            got = lazy(ids, labels=ids).loss
            got.backward()
            _adam(list(lazy.parameters()), s_lazy)
        assert _count("lazy_dvm_kernels") > kernels
        torch.testing.assert_close(got, want, **TOL)
        for (name, pe), pl in zip(eager.named_parameters(), lazy.parameters()):
            torch.testing.assert_close(pl.grad, pe.grad, **TOL, msg=lambda m: f"step {step} grad {name}: {m}")
            torch.testing.assert_close(pl, pe, **TOL, msg=lambda m: f"step {step} {name}: {m}")
        eager.zero_grad()
        lazy.zero_grad()
