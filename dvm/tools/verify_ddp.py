"""`dvm verify ddp`: the compiled model trained under torch.distributed DDP, against one process.

Two processes (started with subprocess, as torchrun would; gloo; this machine) each wrap the tiny model of
tools/verify_train in DistributedDataParallel, compile it with torch.compile(backend="dvm",
dynamic=True) and train it for N steps on their half of each batch of verify_train's fixed data
(one sequence each of verify_train.BATCH = 2). The same N steps run in one process on whole
batches (verify_train.train, the dvm system). Because every shard has the same number of tokens,
the mean of the ranks' mean losses is the whole batch's mean loss and DDP's averaged gradient is
the whole batch's gradient: the per-step losses (all-reduced mean over the ranks) must match the
single-process run within the assert_close tolerance of the precision's dtype (float32, or
bfloat16 under autocast), and the ranks' parameters must stay bitwise identical after every step
(checked by all_gather). Each process has its own DVM state (nothing is shared but the CPU VM's
disk cache, whose one compile per machine vm/cpu/host/cache.py's per-piece locks serialize); each uses one
torch and one DVM thread, as does the single-process run here, so the two cores are not
oversubscribed.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

from . import verify_train
from .bench_common import finish_report, loadavg, machine_info, progress

DEFAULT_JSON = os.path.join("bench-results", "verify-ddp.json")
DEFAULT_MD = os.path.join("bench-results", "verify-ddp.md")
WORLD = 2
DEFAULT_STEPS = 6
# torch.testing.assert_close's default (rtol, atol) per result dtype
TOLERANCE = {"f32": (1.3e-6, 1e-5), "bf16": (1.6e-2, 1e-5)}


def _worker(rank: int, world: int, init_file: str, out_dir: str, name: str, steps: int, seed: int,
            size: str, precision: str, optimizer: str) -> None:
    """One DDP rank: train, all-reduce the losses, check the parameters against the other ranks."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["DVM_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..config import reload
    reload()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = verify_train.build(name, seed, size)
        model.train()
        ddp = DistributedDataParallel(model)
        opt_cls = torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW
        opt = opt_cls(ddp.parameters(), **verify_train.OPTIMIZERS[optimizer])
        loss_fn = torch.compile(verify_train.LossModel(ddp), backend="dvm", dynamic=True)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
        vocab = verify_train.SIZES[size][2]
        losses, rank_losses, identical = [], [], []
        for step in range(steps):
            ids = verify_train.batch_ids(step, seed, vocab)
            shard = ids.chunk(world)[rank]
            with autocast:
                loss = loss_fn(shard)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(float(mean) / world)
            rank_losses.append(float(loss.detach()))
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            identical.append(all(torch.equal(gathered[0], g) for g in gathered[1:]))
            print(f"rank {rank}: step {step + 1} of {steps} done (loss {rank_losses[-1]:.6g})", flush=True)
        if rank == 0:
            np.savez(os.path.join(out_dir, "rank0.npz"), losses=np.array(losses), identical=np.array(identical),
                     params=flat.numpy())
        np.save(os.path.join(out_dir, f"rank{rank}_losses.npy"), np.array(rank_losses))
        print(f"rank {rank}: results written", flush=True)
    except BaseException:
        traceback.print_exc()   # now: the process group's teardown below may abort the process first
        raise SystemExit(1) from None
    finally:
        # (said first: a failure after it is in the process group's or the interpreter's teardown)
        print(f"rank {rank}: destroying the process group", flush=True)
        dist.destroy_process_group()
    # The gloo group lives on in the objects that hold it (DDP's reducer; the compiled model in
    # Dynamo's caches): released here, while the interpreter is whole, not in its finalization,
    # where a gloo thread's late GIL acquire can abort the process (pytorch/pytorch#179291).
    del loss_fn, ddp, model, opt
    torch._dynamo.reset()
    gc.collect()
    print(f"rank {rank}: process group destroyed and released", flush=True)


def _spawn(world: int, tmp: str, args: tuple) -> None:
    """Start the ranks as fresh interpreters (no re-import of the caller's main module, unlike
    multiprocessing's spawn) and wait for them; RuntimeError naming a rank that failed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    procs = []
    for rank in range(world):
        code = f"from dvm.tools.verify_ddp import _worker; _worker(*{json.dumps([rank, world, *args])})"
        log = open(os.path.join(tmp, f"rank{rank}.log"), "w")
        procs.append((subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=subprocess.STDOUT),
                      log))
    failed = []
    for rank, (p, log) in enumerate(procs):
        if p.wait() != 0:
            failed.append((rank, p.returncode))
        log.close()
    if failed:
        rank, code = failed[0]
        with open(os.path.join(tmp, f"rank{rank}.log")) as f:
            tail = f.read()[-3000:]
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        raise RuntimeError(f"DDP rank(s) {[r for r, _ in failed]} failed; rank {rank} ({how}): "
                           f"its output ends:\n{tail}")


def run(name: str = "llama", steps: int = DEFAULT_STEPS, seed: int = 0, size: str = "small",
        precision: str = "f32", optimizer: str = "sgd") -> dict:
    """The DDP run and the single-process run of one model; the comparison as a dict."""
    import torch
    with tempfile.TemporaryDirectory(prefix="dvm-ddp-") as tmp:
        t0 = time.perf_counter()
        _spawn(WORLD, tmp, (os.path.join(tmp, "init"), tmp, name, steps, seed, size, precision, optimizer))
        ddp_s = time.perf_counter() - t0
        with np.load(os.path.join(tmp, "rank0.npz"), allow_pickle=False) as z:
            ddp = {k: z[k] for k in z.files}
        ranks = [np.load(os.path.join(tmp, f"rank{r}_losses.npy"), allow_pickle=False).tolist() for r in range(WORLD)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        single = verify_train.train(name, f"dvm_{precision}", steps, seed, size, optimizer)
        single_s = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    rtol, atol = TOLERANCE[precision]
    ref = np.array(single["losses"])
    got = ddp["losses"]
    params = torch.cat([p.reshape(-1) for p in single["params"].values()]).numpy()
    loss_ok = bool(np.all(np.abs(got - ref) <= atol + rtol * np.abs(ref)))
    # reported, not a verdict: DDP sums the gradient in another order, and parameters near zero
    # then differ beyond atol (bf16 autocast: 6e-5 after 4 steps)
    params_ok = bool(np.all(np.abs(ddp["params"] - params) <= atol + rtol * np.abs(params)))
    return {"model": name, "precision": precision, "steps": steps, "size": size, "world": WORLD,
            "single_losses": ref.tolist(), "ddp_losses": got.tolist(), "rank_losses": ranks,
            "max_abs_loss_diff": float(np.max(np.abs(got - ref))),
            "max_rel_loss_diff": float(np.max(np.abs(got - ref) / np.abs(ref))),
            "max_abs_param_diff": float(np.max(np.abs(ddp["params"] - params))),
            "tolerance": {"rtol": rtol, "atol": atol}, "losses_match": loss_ok, "params_match": params_ok,
            "ranks_identical_each_step": [bool(x) for x in ddp["identical"]],
            "ranks_identical": bool(np.all(ddp["identical"])), "ddp_s": ddp_s, "single_s": single_s,
            "passed": loss_ok and bool(np.all(ddp["identical"]))}


def main(models=None, steps: int = DEFAULT_STEPS, precisions=None, seed: int = 0, size: str = "small",
         optimizer: str = "sgd", json_path: str | None = DEFAULT_JSON, md_path: str | None = DEFAULT_MD,
         out=None) -> int:
    from ..config import config
    out = out or sys.stdout
    report = {"benchmark": "verify-ddp", "machine": machine_info(), "loadavg": loadavg(), "vm": config().vm,
              "runs": [], "failures": []}
    for name in models or ["llama"]:
        for precision in precisions or ["f32"]:
            progress("verify ddp", f"{name} {precision}: {WORLD} processes (gloo) and one, {steps} steps")
            r = run(name, steps, seed, size, precision, optimizer)
            report["runs"].append(r)
            if not r["passed"]:
                report["failures"].append(f"{name} {precision}: losses match {r['losses_match']}, ranks identical "
                                          f"{r['ranks_identical']}")
    return finish_report(report, markdown(report), None, json_path, md_path, None, out, "DDP run(s)")


def markdown(report: dict) -> str:
    lines = [f"`dvm verify ddp` (VM {report['vm']}): torch.compile(backend='dvm') under DDP, {WORLD} processes "
             "(gloo), against the same steps in one process", ""]
    for r in report["runs"]:
        tol = r["tolerance"]
        lines += [f"### {r['model']}, {r['precision']} ({r['steps']} steps, size {r['size']}; DDP "
                  f"{r['ddp_s']:.1f} s, one process {r['single_s']:.1f} s)", "",
                  "| step | one process | DDP (mean of ranks) | " + " | ".join(f"rank {i}" for i in range(r["world"]))
                  + " | ranks' parameters identical |", "|---:|---:|---:|" + "---:|" * r["world"] + "---|"]
        for i, (a, b) in enumerate(zip(r["single_losses"], r["ddp_losses"])):
            ranks = " | ".join(f"{rl[i]:.7f}" for rl in r["rank_losses"])
            lines.append(f"| {i} | {a:.7f} | {b:.7f} | {ranks} | {'yes' if r['ranks_identical_each_step'][i] else 'NO'} |")
        lines += ["", f"Max loss difference {r['max_abs_loss_diff']:.2e} (relative {r['max_rel_loss_diff']:.2e}), "
                  f"max final parameter difference {r['max_abs_param_diff']:.2e}; tolerance rtol {tol['rtol']}, atol "
                  f"{tol['atol']}: losses {'match' if r['losses_match'] else 'DIFFER'}, parameters "
                  f"{'match' if r['params_match'] else 'DIFFER'}, ranks "
                  f"{'identical at every step' if r['ranks_identical'] else 'DIVERGED'}.", ""]
    return "\n".join(lines)
