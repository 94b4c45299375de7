"""`dvm bench lazy`: eager PyTorch code inside dvm.lazy() against the same code run eagerly.

Chains (bench_lazy_cases): RMSNorm, SwiGLU, bias+GELU, an 8-op elementwise chain, LayerNorm,
softmax-with-temperature sampling math and an Adam step over a parameter list, all written with
plain tensor ops, at the small / medium / large shapes of `dvm bench ops`. Systems, side by side,
their timed samples interleaved one by one (the median sample per system is reported; --rounds
scales how many):

  eager   the function as written
  lazy    the function decorated with dvm.lazy (the default, adaptive policy: what a user gets)
  forced  dvm.lazy(adaptive=False): everything recorded and fused (what fusion alone does)

Every chain is first checked: forced lazy against eager (assert_close defaults of the dtype;
Adam over three steps); a mismatch is a failure (exit 1). After a warm-up (the adaptive policy
learns: region skipping, the measured DVM-vs-eager choice), one batch of calls is counted:
flushes, DVM launches and eager replays per call.

Generation: greedy generate() of the tiny Llama and Qwen2-MoE of `dvm bench models` (random
weights, KV cache on) eagerly, inside `dvm.lazy()` and inside `dvm.lazy(adaptive=False)`: tokens
per second (median over rounds, after warm-up calls), flushes per generated token, and whether
the tokens equal eager's.

`--calibrate` measures where recording and fusing starts to pay: chains of 2, 4 and 8
elementwise ops at sizes 2^10 .. 2^22, forced lazy against eager; the thresholds of
dvm/frontend/lazy.py (MIN_NUMEL, MIN_BYTES) come from it (docs/DECISIONS.md).
Progress goes to stderr; the markdown to stdout; JSON, markdown and a PNG under bench-results/.
"""
from __future__ import annotations

import gc
import math
import os
import sys
import time

from .bench_common import BenchRun, finish_report, loadavg, restore_vm_threads, set_vm_threads, whole_vm
from .bench_lazy_cases import CHAIN_NAMES, CHAINS, models
from .bench_lazy_probes import recording_costs
from .bench_lazy_report import markdown, plot

DEFAULT_JSON = os.path.join("bench-results", "lazy.json")
DEFAULT_MD = os.path.join("bench-results", "lazy.md")
DEFAULT_PNG = os.path.join("bench-results", "lazy.png")
SIZE_ORDER = ("small", "medium", "large")
DEFAULT_ROUNDS, QUICK_ROUNDS = 7, 3
WARMUP_CALLS = 24            # the adaptive policy's learning: region skips, DVM-vs-eager timings
COUNT_CALLS = 8
DEFAULT_TOKENS, QUICK_TOKENS = 32, 8
PROMPT = 32
GEN_WARMUP = 3               # generate() calls before timing (then until the region has chosen)
WARMUP_MAX = 64
GEN_MIN_ROUND_S = 0.2        # generate() calls per system and round: at least this long (~8 calls)
CALIBRATE_OPS = (2, 4, 8)
CALIBRATE_LOG2 = tuple(range(10, 23, 2))
SYSTEMS = ("eager", "lazy", "forced")


def _sizes() -> dict:
    from .bench_ops import SIZES
    return {k: SIZES[k] for k in SIZE_ORDER}


def _counts() -> dict:
    from dvm.runtime import counters
    return {k: v for k, v in counters.snapshot().items() if k.startswith("lazy_")}


def _delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _per_call(delta: dict, n: int) -> dict:
    eager = sum(v for k, v in delta.items() if k.startswith("lazy_eager:"))
    return {"flushes": delta.get("lazy_flushes", 0) / n, "dvm_launches": delta.get("lazy_dvm_launches", 0) / n,
            "dvm_kernels": delta.get("lazy_dvm_kernels", 0) / n, "eager_replays": eager / n,
            "reasons": {k[len("lazy_flush:"):]: v / n for k, v in delta.items() if k.startswith("lazy_flush:")}}


SAMPLE_S = 20e-6   # a sample lasts at least this long (back-to-back calls): timer overhead < 1 %


def _rounds(calls: dict, rounds: int, min_total_s: float) -> dict:
    """Median seconds per call of each system, its samples interleaved with the others' one by one
    (a sample: back-to-back calls lasting SAMPLE_S or more), about rounds * min_total_s of samples
    per system (3 * rounds at least). The host's speed shifts between states lasting tens of
    milliseconds (the same eager SwiGLU: 49 or 66 us a call), so blocks of one system's calls that
    long can make it look 10-20 % faster than another running the very same code. Each sample
    follows an untimed call of its own system: the first call after another system's pays for the
    switch (caches, allocator), up to 10 % of a 50 us call."""
    clock = time.perf_counter

    def once(fn) -> float:
        t0 = clock()
        fn()
        return clock() - t0
    for fn in calls.values():
        fn()                                           # warm-up
    one = {k: max(min(once(fn) for _ in range(3)), 1e-9) for k, fn in calls.items()}
    number = {k: max(1, math.ceil(SAMPLE_S / t)) for k, t in one.items()}
    n = max(3 * rounds, min(1000, int(rounds * min_total_s / max(number[k] * one[k] for k in calls))))
    samples: dict = {k: [] for k in calls}
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            for name, fn in calls.items():
                fn()           # a lead-in: the sample times this system's calls, not the switch to it
                t0 = clock()
                for _ in range(number[name]):
                    fn()
                samples[name].append((clock() - t0) / number[name])
    finally:
        gc.enable()
    return {k: sorted(v)[len(v) // 2] for k, v in samples.items()}


def _warm_up(fn, site, calls: int):
    """`calls` calls of fn, and more (up to WARMUP_MAX) until its adaptive site has chosen
    between recording and running eagerly: the times that follow are of the chosen path."""
    out = None
    for i in range(WARMUP_MAX):
        if i >= calls and (site is None or site.choice is not None):
            break
        out = fn()
    return out


class _Run(BenchRun):
    bench = "lazy"

    # -- chains ------------------------------------------------------------------------------------
    def check(self, chain, shape) -> str | None:
        import torch

        import dvm
        r, c = shape
        fn, args, state = chain.make(r, c, torch.Generator().manual_seed(self.seed))
        lfn, largs, lstate = chain.make(r, c, torch.Generator().manual_seed(self.seed))
        try:
            for _ in range(3 if state is not None else 1):
                want = fn(*args)
                with dvm.lazy(adaptive=False):
                    got = lfn(*largs)
            torch.testing.assert_close(got, want)
        except AssertionError as e:
            return str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:4])
        return None

    def chain(self, chain, size: str, shape) -> dict:
        import torch

        import dvm
        r, c = shape
        row = {"case": chain.name, "what": chain.what, "size_class": size, "shape": [r, c],
               "elementwise": chain.elementwise}
        bad = self.check(chain, shape)
        if bad is not None:
            row["mismatch"] = bad
            self.failures.append(f"{chain.name} {r}x{c}: lazy differs from eager: {bad}")
        fn, args, _ = chain.make(r, c, torch.Generator().manual_seed(self.seed))
        lazy, forced = dvm.lazy(fn), dvm.lazy(fn, adaptive=False)
        calls = {"eager": lambda: fn(*args), "lazy": lambda: lazy(*args), "forced": lambda: forced(*args)}
        for name in ("lazy", "forced"):
            _warm_up(calls[name], getattr(lazy, "lazy_site", None) if name == "lazy" else None, WARMUP_CALLS)
        for name in ("lazy", "forced"):
            before = _counts()
            for _ in range(COUNT_CALLS):
                calls[name]()
            row[f"{name}_per_call"] = _per_call(_delta(before, _counts()), COUNT_CALLS)
        t = _rounds(calls, self.rounds, min_total_s=0.02)
        row.update({f"{k}_s": v for k, v in t.items()})
        row["lazy_speedup"] = t["eager"] / t["lazy"]
        row["forced_speedup"] = t["eager"] / t["forced"]
        return row

    # -- generation --------------------------------------------------------------------------------
    def generate(self, name: str, tokens: int) -> dict:
        import torch

        import dvm
        build, what = models()[name]
        model = build(self.seed).eval()
        ids = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(self.seed))
        kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0, use_cache=True)

        def eager():
            return model.generate(ids, **kw)
        lazy, forced = dvm.lazy(eager), dvm.lazy(eager, adaptive=False)
        calls = {"eager": eager, "lazy": lazy, "forced": forced}
        row = {"model": name, "what": what, "prompt": PROMPT, "tokens": tokens}
        with torch.no_grad():
            want = eager()
            for sys_name, fn in calls.items():
                got = _warm_up(fn, getattr(fn, "lazy_site", None) if sys_name == "lazy" else None, GEN_WARMUP)
                row[f"{sys_name}_equal"] = bool(torch.equal(got, want))
                if sys_name != "eager":
                    before = _counts()
                    fn()
                    row[f"{sys_name}_per_token"] = _per_call(_delta(before, _counts()), tokens)
            t = _rounds(calls, self.rounds, min_total_s=GEN_MIN_ROUND_S)
        for k, v in t.items():
            row[f"{k}_s"] = v
            row[f"{k}_tokens_per_s"] = tokens / v
        row["lazy_speedup"] = t["eager"] / t["lazy"]
        row["forced_speedup"] = t["eager"] / t["forced"]
        for sys_name in ("lazy", "forced"):
            if not row[f"{sys_name}_equal"]:
                self.failures.append(f"{name}: generate() inside dvm.lazy({'' if sys_name == 'lazy' else 'adaptive=False'})"
                                     " yields other tokens than eager")
        return row

    # -- calibration -------------------------------------------------------------------------------
    def calibrate(self) -> dict:
        import torch

        import dvm
        out: dict = {"ops": list(CALIBRATE_OPS), "log2_numel": list(CALIBRATE_LOG2), "speedup": {}, "crossover": {}}
        self.log("calibrate: the per-op cost of the ways to record ops")
        out["recording"] = recording_costs(lambda calls, n: _rounds(calls, n, 0.02), self.rounds)
        for k in CALIBRATE_OPS:
            def chain(x, k=k):
                for i in range(k):
                    x = x * 1.0001 if i % 2 == 0 else x + 0.5
                return x
            forced = dvm.lazy(chain, adaptive=False)
            ratios = {}
            for lg in CALIBRATE_LOG2:
                x = torch.randn(1 << lg, generator=torch.Generator().manual_seed(self.seed))
                for _ in range(3):
                    forced(x)
                t = _rounds({"eager": lambda: chain(x), "forced": lambda: forced(x)}, self.rounds, 0.02)
                ratios[lg] = t["eager"] / t["forced"]
                self.log(f"calibrate: {k} ops, 2^{lg} elements: forced lazy {ratios[lg]:.2f}x eager")
            out["speedup"][str(k)] = {str(lg): v for lg, v in ratios.items()}
            wins = [lg for lg in CALIBRATE_LOG2 if all(ratios[m] >= 1.0 for m in CALIBRATE_LOG2 if m >= lg)]
            out["crossover"][str(k)] = (1 << wins[0]) if wins else None
        return out


def run(sizes=SIZE_ORDER, cases=CHAIN_NAMES, model_names=None, tokens: int = DEFAULT_TOKENS,
        rounds: int = DEFAULT_ROUNDS, seed: int = 0, threads: int = 2, calibrate: bool = False,
        quiet: bool = False) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import dvm
    old_threads, old_vm = torch.get_num_threads(), set_vm_threads(threads)
    whole_vm("lazy")
    torch.set_num_threads(threads)
    r = _Run(rounds, seed, quiet)
    t0, load = time.time(), loadavg()
    try:
        r.log(f"VM {dvm.config.config().vm}; threads {threads}; rounds {rounds}; 1-min load {load}")
        chains = []
        for size in sizes:
            for shape in _sizes()[size]:
                for name in cases:
                    r.log(f"{name} {shape[0]}x{shape[1]} ({size})")
                    chains.append(r.chain(CHAINS[name], size, shape))
        gens = []
        for name in model_names if model_names is not None else list(models()):
            r.log(f"generate: {name}, {tokens} new tokens")
            gens.append(r.generate(name, tokens))
        cal = r.calibrate() if calibrate else None
    finally:
        torch.set_num_threads(old_threads)
        restore_vm_threads(old_vm)
    return r.report(t0, load, threads, chains=chains, generate=gens, calibration=cal)


def parse_list(text: str, what: str, choices) -> list:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in choices]
    if not items or bad:
        raise ValueError(f"unknown {what}(s) {', '.join(bad) or repr(text)}; choose from {', '.join(choices)}")
    return items


def main(sizes=None, cases=None, model_names=None, tokens=None, rounds=None, seed: int = 0, threads: int = 2,
         calibrate: bool = False, quick: bool = False, json_path=DEFAULT_JSON, md_path=DEFAULT_MD,
         png_path=DEFAULT_PNG) -> int:
    report = run(sizes=sizes or (["small", "medium"] if quick else list(SIZE_ORDER)),
                 cases=cases or list(CHAIN_NAMES), model_names=model_names,
                 tokens=tokens or (QUICK_TOKENS if quick else DEFAULT_TOKENS),
                 rounds=rounds or (QUICK_ROUNDS if quick else DEFAULT_ROUNDS), seed=seed, threads=threads,
                 calibrate=calibrate)
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, sys.stdout,
                         "case(s)")
