"""Tiny Hugging Face models (random init, no downloads) under torch.compile(backend="dvm",
dynamic=True): eager equality over many sequence lengths and two batch sizes, no recompiles
beyond Dynamo's own one-time size-1 specializations, gradients, greedy generate()."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.runtime import counters  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

# batch 1: 20 lengths (incl. 1, 2, 17, 257, 1000) for both models; batch 3: a subset
LENGTHS_B1 = [17, 1, 2, 3, 5, 8, 9, 16, 31, 33, 64, 100, 127, 128, 200, 257, 300, 511, 700, 1000]
LENGTHS_B3 = [17, 1, 2, 9, 257, 1000]
# forward logits of the 2-layer models: fused f32 reductions (RMSNorm means, softmax sums) sum in
# a different order than ATen; errors grow through two layers and the LM head.
TOL = dict(rtol=1e-4, atol=1e-4)


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=2048)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _qwen_moe():
    cfg = transformers.Qwen2MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      num_experts=4, num_experts_per_tok=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(cfg)


def _graphs() -> int:
    return counters.snapshot().get("torch_dynamo_graphs", 0)


def _run_lengths(model, shapes):
    torch._dynamo.reset()
    cm = torch.compile(model, backend="dvm", dynamic=True)
    before = _graphs()
    ones = set()
    with torch.no_grad():
        for b, L in shapes:
            ids = torch.randint(0, 128, (b, L), generator=torch.Generator().manual_seed(b * 7919 + L))
            torch.testing.assert_close(cm(ids).logits, model(ids).logits, **TOL,
                                       msg=lambda m: f"batch {b} length {L}: {m}")
            ones.add((b == 1, L == 1))
    # one graph per pattern of sizes equal to 1: Dynamo's own specialization, never DVM's
    assert _graphs() - before <= len(ones)
    assert not any(k.startswith("fallback:graph:") for k in counters.snapshot())


def test_llama_lengths():
    shapes = [(3, L) for L in LENGTHS_B3] + [(1, L) for L in LENGTHS_B1]
    _run_lengths(_llama().eval(), shapes)


def test_qwen2_moe_lengths():
    shapes = [(3, L) for L in LENGTHS_B3[:4]] + [(1, L) for L in LENGTHS_B1]
    _run_lengths(_qwen_moe().eval(), shapes)


def test_llama_training_gradients():
    model = _llama().train()
    torch._dynamo.reset()
    cm = torch.compile(model, backend="dvm", dynamic=True)
    for L in (7, 13, 40):
        ids = torch.randint(0, 128, (2, L))
        model.zero_grad()
        loss = cm(ids, labels=ids).loss
        loss.backward()
        got = {k: p.grad.clone() for k, p in model.named_parameters()}
        model.zero_grad()
        ref = model(ids, labels=ids).loss
        ref.backward()
        torch.testing.assert_close(loss, ref)
        for k, p in model.named_parameters():
            torch.testing.assert_close(got[k], p.grad, **TOL, msg=lambda m: f"{k} L={L}: {m}")


@pytest.mark.parametrize("make", [_llama, _qwen_moe], ids=["llama", "qwen2_moe"])
def test_greedy_generate_matches_eager(make):
    model = make().eval()
    ids = torch.randint(0, 128, (1, 11), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    want = model.generate(ids, **kw)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="dvm", dynamic=True)
    got = model.generate(ids, **kw)
    assert torch.equal(got, want)
