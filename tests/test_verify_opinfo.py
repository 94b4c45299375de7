"""PyTorch's own operator tests as a peer suite: OpInfo samples (op_db: unary, binary, reduction,
norm and activation ops; float32, bfloat16, float16) through torch.compile(backend="dvm") against
eager with assert_close's defaults, as Inductor's OpInfo test runs them (tools/verify_opinfo).

The suite runs a fixed subset per op and dtype (the first verify_opinfo.DEFAULT_SAMPLES samples and
every sample listed in verify_opinfo.EXPECTED); `dvm verify opinfo --full` runs all 1635 samples. A
difference from eager passes only when it is listed and the verification mode shows DVM's error
against float64 no larger than eager's on that sample."""

import pytest

torch = pytest.importorskip("torch")
# op_db needs PyTorch's test dependency expecttest (the [dev] extra installs it)
pytest.importorskip("expecttest")

from dvm.tools import verify_opinfo as V  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]
NAMES = [n for group in V.OPS.values() for n in group]


@pytest.fixture(scope="module")
def ops():
    return {V.op_name(op): op for op in V.selected()}


@pytest.mark.parametrize("name", NAMES)
def test_opinfo_samples_match_eager(name, ops):
    op = ops[name]
    ran = 0
    for dtype in V.DTYPES:
        for i, sample in V.suite_samples(op, dtype):
            result = V.run_sample(op, dtype, sample)
            verdict = V.judge(op, dtype, result)
            assert verdict != "FAIL", f"{name} {dtype} sample {i}: {result.get('message')}; {result.get('accuracy')}"
            ran += 1
    assert ran > 0


def test_expected_differences_are_selected_ops():
    for (name, dtype), (decision, reason, samples) in V.EXPECTED.items():
        assert name in NAMES and dtype in V.DTYPES and decision == V.MORE_ACCURATE and reason and samples
