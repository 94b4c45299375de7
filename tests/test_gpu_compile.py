"""The GPU VM's specialised kernels compile for a real GPU (sm_90) with Triton's compiler and
ptxas, which run without one: structures that interpreter mode accepts but the compiler may not
(an all-scalar kernel: no operand with a dim; 0-d operands beside tiles; bf16; reductions). Run in
a subprocess: this pytest process may have defined the kernels in interpreter mode
(tests/gpu_helpers.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton", reason="the GPU VM needs Triton (pip install '.[gpu]')")

SCRIPT = r'''
import json
import os
import torch
import dvm
from dvm.frontend.gpu_arrays import kernel_program
from dvm.tools import bench_gpu_cases as c
from dvm.vm.gpu import resources

@dvm.kernel
def doubled(k, s):
    return k.store(k.mul(k.load(s), 2.0))

@dvm.kernel
def plus_scalars(k, x, s, i):
    return k.store(k.add(k.add(k.load(x), k.load(s)), k.cast(k.load(i), "float32")))

x = torch.randn(9, 300, dtype=torch.bfloat16)
wide = torch.randn(4, 4096)
cases = {"0-d": (doubled, (torch.tensor(3.0),)), "[1]": (doubled, (torch.tensor([3.0]),)),
         "0-d beside a tile": (plus_scalars, (torch.randn(9, 300), torch.tensor(1e-6), torch.tensor(3))),
         "chain8 bf16": (c.chain8, (x.flatten(), x.flatten())), "layer_norm bf16": (c.layer_norm, (x, x[0], x[1])),
         "chain8 f32": (c.chain8, (wide.flatten(), wide.flatten())), "rms_norm f32": (c.rms_norm, (wide, wide[0]))}
report = {}
for vector in ("0", "1"):   # DVM_GPU_VECTOR: the fast path's source too
    os.environ["DVM_GPU_VECTOR"] = vector
    dvm.config.reload()
    for name, (kfn, args) in cases.items():
        report[f"{name} vector={vector}"] = resources.specialised_usage(dvm.verify(kernel_program(kfn, args)))
print(json.dumps(report))
'''


@pytest.mark.vm_once
def test_specialised_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name, kernels in report.items():
        assert kernels, name
        for k in kernels:
            assert k["local"] == 0, (name, k)   # no spills to local memory
    # the fast path moves 4 f32 lanes a thread at once; without it, one at a time
    for name in ("chain8 f32", "rms_norm f32"):
        assert report[f"{name} vector=1"][0]["vector_loads"] > 0 < report[f"{name} vector=1"][0]["vector_stores"]
        assert report[f"{name} vector=0"][0]["vector_loads"] == 0 == report[f"{name} vector=0"][0]["vector_stores"]
