"""The measuring side of `dvm bench ab`: times one checkout's kernels or models in this process and
writes the medians to a JSON file.

Executed by path (`python bench_ab_child.py --suite ops --out PATH ...`) with PYTHONPATH set to
the checkout being measured, which may be an OLD one: this file is self-contained and uses only
what commit 19fe007 already has (bench_ops_cases.CASES, bench_ops.SIZES,
bench_common.time_call, bench_models.MODELS and _ids); `cpu.warm_up` only where it exists.
It never imports the checkout it lives in: its own folder is taken off sys.path before `dvm` is
imported, so the `dvm` found is the one on PYTHONPATH.

Output: {"meta": {"dvm_file", "dvm_version", "vm", "threads", "warm_up"}, "times": {case: median
seconds}}, cases in the order they ran. Suites:

  ops     every case of bench_ops_cases.CASES x every shape of bench_ops.SIZES (optionally fewer)
  models  Llama and Qwen2-MoE under torch.compile(backend="dvm", dynamic=True), one thread,
          batch 1 and 3, lengths 8, 17, 64, 200, 512; steady state
  zoo     the `dvm bench models --zoo` architectures (bench_zoo_models.ZOO and inputs, since
          d2ec6f5) the same way, two threads, batch 1 and 4, lengths 8, 64, 256; float32, or the
          dtype --zoo-dtype names (weights and activations)
  train   the same architectures' training steps as `dvm bench train` takes them (its
          step_inputs and make_step: a checkout with bench_train), two threads, its cells 1x64
          and 4x256; steady state
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SUITES = ("ops", "models", "zoo", "train")

OPS_REPEAT = 7               # time_call samples, at least
OPS_MIN_TOTAL_S = 0.03       # timing per (case, shape), at least
OPS_SEED = 0

MODEL_NAMES = ("llama", "qwen2_moe")
MODEL_BATCHES = (1, 3)
MODEL_LENGTHS = (8, 17, 64, 200, 512)
MODEL_THREADS = 1
MODEL_REPEAT = 5
MODEL_MIN_TOTAL_S = 0.1
MODEL_WARM_CALLS = 2         # untimed calls per (batch, length) first: the compile, then one more
MODEL_SEED = 0
ZOO_BATCHES = (1, 4)
ZOO_LENGTHS = (8, 64, 256)
ZOO_THREADS = 2
ZOO_DTYPE = "float32"       # the models' dtype, unless --zoo-dtype says another of ZOO_DTYPES
ZOO_DTYPES = ("float32", "float16", "bfloat16")


def _own_folder_off_path() -> None:
    """Running a file by path puts its folder first on sys.path: take dvm/tools of THIS checkout
    off, so that nothing in it shadows a module of the checkout measured."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


def _warm_up() -> bool:
    """Wait for the whole CPU VM where the checkout can say so (older ones have no warm_up: their
    first call loads it, and the untimed calls before timing take that). Returns whether it did."""
    try:
        from dvm.vm import cpu
    except ImportError:
        return False
    if not hasattr(cpu, "warm_up"):
        return False
    cpu.warm_up(wait_fast=True)
    return True


def _meta(warmed: bool) -> dict:
    import dvm
    meta = {"dvm_file": os.path.abspath(dvm.__file__), "dvm_version": getattr(dvm, "__version__", None),
            "warm_up": warmed, "vm": None, "threads": None}
    try:
        from dvm.config import config
        meta["vm"], meta["threads"] = config().vm, config().threads
    except (ImportError, AttributeError):
        pass
    return meta


def _selected(name: str, filters: list[str]) -> bool:
    return not filters or any(f in name for f in filters)


def run_ops(filters: list[str], sizes: list[str]) -> dict:
    import numpy as np
    from dvm.tools.bench_common import time_call
    from dvm.tools.bench_ops import SIZES
    from dvm.tools.bench_ops_cases import CASES
    rng = np.random.default_rng(OPS_SEED)
    times = {}
    for case in CASES:
        if not _selected(case.name, filters):
            continue
        for cls, shapes in SIZES.items():
            if sizes and cls not in sizes:
                continue
            for shape in shapes:
                arrays = case.inputs(rng, shape)
                fn = case.kernel
                fn(*arrays)
                t = time_call(lambda: fn(*arrays), repeat=OPS_REPEAT, min_total_s=OPS_MIN_TOTAL_S)
                times[f"{case.name} {shape[0]}x{shape[1]}"] = t["median_s"]
    return times


def _time_model(fn, kwargs: dict, time_call) -> float:
    for _ in range(MODEL_WARM_CALLS):
        fn(**kwargs)
    return time_call(lambda: fn(**kwargs), repeat=MODEL_REPEAT, min_total_s=MODEL_MIN_TOTAL_S)["median_s"]


def _time_grid(times: dict, name: str, model, batches, lengths, kwargs_of) -> None:
    """Steady-state medians of `model` under torch.compile(backend="dvm", dynamic=True) per
    (batch, length), into times["name bB LL"]; kwargs_of(b, length) gives the forward's inputs."""
    import torch
    from dvm.tools.bench_common import time_call
    fn = torch.compile(model, backend="dvm", dynamic=True)
    with torch.no_grad():
        for b in batches:
            for length in lengths:
                times[f"{name} b{b} L{length}"] = _time_model(fn, kwargs_of(b, length), time_call)


def run_models(filters: list[str]) -> dict:
    import torch
    torch.set_num_threads(MODEL_THREADS)
    from dvm.tools.bench_models import MODELS, _ids
    times = {}
    for name in MODEL_NAMES:
        if _selected(name, filters):
            _time_grid(times, name, MODELS[name][0](MODEL_SEED).eval(), MODEL_BATCHES, MODEL_LENGTHS,
                       lambda b, length: {"input_ids": _ids(b, length, MODEL_SEED)})
    return times


def _zoo_selected(filters: list[str]):
    """(name, zoo model) of each zoo model --cases selects, Dynamo's caches reset before each, on
    ZOO_THREADS threads."""
    import torch
    torch.set_num_threads(ZOO_THREADS)
    from dvm.tools.bench_zoo_models import ZOO
    for name, zoo_model in ZOO.items():
        if _selected(name, filters):
            torch._dynamo.reset()
            yield name, zoo_model


def run_zoo(filters: list[str], dtype: str = ZOO_DTYPE) -> dict:
    import torch
    from dvm.tools.bench_zoo_models import inputs
    times = {}
    for name, zoo_model in _zoo_selected(filters):
        _time_grid(times, name, zoo_model.build().to(getattr(torch, dtype)), ZOO_BATCHES, ZOO_LENGTHS,
                   lambda b, length, m=zoo_model: inputs(m, b, length))
    return times


def run_train(filters: list[str], cells=None, min_total_s: float | None = None) -> dict:
    """cells, min_total_s: the measured checkout's bench_train.CELLS and MIN_TOTAL_S unless given."""
    import torch
    from dvm.tools import bench_train
    from dvm.tools.bench_common import time_call
    from dvm.tools.bench_train import make_step, step_inputs
    cells = bench_train.CELLS if cells is None else cells
    min_total_s = bench_train.MIN_TOTAL_S if min_total_s is None else min_total_s
    times = {}
    for name, zoo_model in _zoo_selected(filters):
        model = zoo_model.build()
        fn = torch.compile(model, backend="dvm", dynamic=True)
        for b, length in cells:
            step = make_step(fn, model, step_inputs(zoo_model, b, length, MODEL_SEED))
            for _ in range(MODEL_WARM_CALLS):
                step()
            times[f"{name} b{b} L{length}"] = time_call(step, repeat=MODEL_REPEAT, min_total_s=min_total_s)["median_s"]
    return times


def _split(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Time one checkout for `dvm bench ab` (run with PYTHONPATH=CHECKOUT).")
    p.add_argument("--suite", choices=SUITES, required=True)
    p.add_argument("--out", required=True, metavar="PATH", help="where to write the JSON")
    p.add_argument("--cases", default=None, metavar="LIST", help="comma-separated name substrings (default all)")
    p.add_argument("--zoo-dtype", default=ZOO_DTYPE, choices=ZOO_DTYPES, help="zoo: the models' dtype")
    p.add_argument("--sizes", default=None, metavar="LIST", help="ops: comma-separated size classes (default all)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.suite in ("models", "zoo", "train"):   # before torch, transformers or dvm read them
        os.environ["DVM_NUM_THREADS"] = str(MODEL_THREADS if args.suite == "models" else ZOO_THREADS)
        os.environ["HF_HUB_OFFLINE"] = "1"
    _own_folder_off_path()
    warmed = _warm_up()
    filters = _split(args.cases)
    run = {"ops": lambda: run_ops(filters, _split(args.sizes)), "models": lambda: run_models(filters),
           "zoo": lambda: run_zoo(filters, args.zoo_dtype), "train": lambda: run_train(filters)}[args.suite]
    times = run()
    with open(args.out, "w") as f:
        meta = _meta(warmed)
        if args.suite == "zoo":
            meta["dtype"] = args.zoo_dtype
        json.dump({"meta": meta, "times": times}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
