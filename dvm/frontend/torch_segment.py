"""One DVM segment of a planned ATen graph as a callable of the run graph (torch_runtime).

A SegmentRunner compiles its segment once (a CompiledGraph on symbolic sizes: all of its vector
kernels in ONE VM launch), binds the sizes it needs from its inputs' shapes, checks the shape
facts recorded while tracing once per distinct tuple of sizes, and launches on tensor data
pointers (torch_launch). A call with the sizes of the two calls before it and tensors passing the
launch's tensor check runs that launch at once (run's quick path: ~0.7 us of ~3.5 a call).
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from ..config import config
from ..errors import ShapeError
from ..fusion.reshape_push import push_permutes
from ..graph.build import permute
from ..graph.node import topo_order
from ..graph.symbolic import SymExpr, evaluate, free_symbols
from ..runtime import counters
from ..runtime.compiled import shared_graph
from .aten_common import fake
from .aten_table import VIEW_OPS, Unsupported
from .torch_launch import TensorLauncher, _data_ptr, input_spans, tensor_check, writable_over

# PyTorch's results may follow an input's memory order (a product of transposed heads keeps the
# heads' order), and what reads them then differs: attention's output takes its query's order,
# and HF's transpose + reshape of it is a view in eager, a copy of a row-major one. A segment
# stores a value in PyTorch's order and views it back: "free" where that costs no kernel (the
# permute moves onto the loads, fusion/reshape_push), "always" (else a kernel of its own), or
# "never" (row-major).
TORCH_ORDER = "free"
_CHECKED_MAX = 4096   # size tuples whose shape checks passed, remembered per segment
# The accuracy verification mode's observer, called as VERIFY(runner, env, tensors, outs) after
# each launch (dvm.tools.verify installs it; DVM_VERIFY=1 at the first segment's compile). None:
# off, and a launch pays one global test.
VERIFY = None


def _stride_order(v) -> tuple | None:
    """The permutation that lists v's dims in PyTorch's memory order (None: row-major already)."""
    if not isinstance(v, torch.Tensor) or v.ndim < 2:
        return None
    try:
        sizes = [int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in v.shape]
        strides = [int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in v.stride()]
    except (TypeError, AttributeError):
        return None
    perm = tuple(sorted(range(v.ndim), key=lambda i: -strides[i]))
    if perm == tuple(range(v.ndim)):
        return None
    acc, expect = 1, [0] * v.ndim
    for i in reversed(perm):
        expect[i] = acc
        acc *= sizes[i]
    if any(sizes[i] > 1 and expect[i] != strides[i] for i in range(v.ndim)):
        return None          # not a dense permutation (expanded, overlapping): keep row-major
    # dims of size 1 keep their place: only the order of the others matters
    big = [i for i in perm if sizes[i] > 1]
    if big == sorted(big):
        return None
    return perm


def _device(outputs) -> torch.device | None:
    """The device of a segment's outputs (FX nodes) where it is not the host; None on the host."""
    for fxn in outputs:
        v = fake(fxn)
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            return v.device
    return None


def _stored(seg) -> list[tuple]:
    """(DVM node stored, permutation that views it back or None) per output of seg (TORCH_ORDER)."""
    plain = [seg.value[fxn] for fxn in seg.outputs]
    perms = [None if TORCH_ORDER == "never" or node.op == "input" else _stride_order(fake(fxn))
             for fxn, node in zip(seg.outputs, plain)]
    wanted = [node if perm is None else permute(seg.ctx, node, perm) for node, perm in zip(plain, perms)]
    if TORCH_ORDER == "free":
        moved = push_permutes(wanted)   # a permute left on top: it did not move
        wanted = [w if perm is None else m if m.op != "permute" else node
                  for w, m, node, perm in zip(wanted, moved, plain, perms)]
        perms = [perm if w is not node else None for w, node, perm in zip(wanted, plain, perms)]
    return [(w, None if perm is None else tuple(perm.index(i) for i in range(len(perm))))
            for w, perm in zip(wanted, perms)]


def _viewed(outs: Sequence[torch.Tensor], perms: tuple) -> tuple:
    """The launch's outputs, each stored in PyTorch's order viewed back by its permutation."""
    return tuple(o if p is None else o.permute(p) for o, p in zip(outs, perms))


def _returned(n) -> bool:
    """The graph returns FX node n or a view of it."""
    return any(u.op == "output" or (u.target in VIEW_OPS and _returned(u)) for u in n.users)


class SegmentRunner:
    def __init__(self, seg, env_names: Sequence[str], launchers: dict):
        """env_names: the keys of the env run() is given, in order (the graph's size symbols).
        launchers: the TensorLaunchers of the segments of one Dynamo graph, by CompiledGraph (its
        segments of equal graphs share one, behind the same guards); this segment's is added."""
        self.seg = seg
        nodes, self.out_map = [], []
        for fxn, (node, inv) in zip(seg.outputs, _stored(seg)):
            if node.op == "input":
                self.out_map.append((fxn, True, node.attr("index"), None))
                continue
            if node not in nodes:
                nodes.append(node)
            self.out_map.append((fxn, False, nodes.index(node), inv))
        needed: set = set()
        for node in topo_order(nodes):
            for d in node.shape:
                needed |= {s.name for s in free_symbols(d)}
            if node.op == "const" and isinstance(node.attr("value"), SymExpr):
                needed |= {s.name for s in free_symbols(node.attr("value"))}
        for c in seg.ctx.checks:
            needed |= {s.name for s in free_symbols(c.lhs) | free_symbols(c.rhs if c.rhs is not None else 0)}
        self.binds, bound = [], set(env_names)
        for i, node in enumerate(seg.input_nodes):
            for j, d in enumerate(node.shape):
                s = d.as_symbol() if isinstance(d, SymExpr) else None
                if s is not None and s.name not in bound:
                    self.binds.append((i, j, s.name))
                    bound.add(s.name)
        if needed - bound:
            raise Unsupported(f"sizes {sorted(needed - bound)} cannot be bound from the inputs")
        self.checks = list(seg.ctx.checks)
        self._checked: set = set()      # env value tuples (fixed key order) that passed the checks
        self.inputs = list(seg.inputs)
        self.outputs = [fxn for fxn, _, _, _ in self.out_map]   # run()'s results, in this order
        self.results = [(is_input, k, inv) for _, is_input, k, inv in self.out_map]
        # results that the graph returns (or views of which it returns) but that share a launch
        # output with such a result before them (a value and its clone, one DVM value): copied,
        # so that the caller gets distinct tensors, as from eager
        shown, self._copies = set(), set()
        for i, (fxn, is_input, k, _) in enumerate(self.out_map):
            if is_input or not _returned(fxn):
                continue
            if k in shown:
                self._copies.add(i)
            shown.add(k)
        # graph inputs updated by the segment (fx_updates.absorb_write), passed after the inputs:
        # (index in run()'s results, launch output or None (a copy), input slot of the same tensor)
        # (an input passed through is copied after the launch: its old value, so never written over)
        self.write_dsts = [dst for _, _, dst in seg.writes]
        self._into_memo: tuple | None = None   # (tensor check, addresses, writes stored directly)
        self.writes = []
        passed = {k for is_input, k, _ in self.results if is_input}
        for _, src, dst in seg.writes:
            is_input, k, inv = self.results[self.outputs.index(src)]
            slot = self.inputs.index(dst) if dst in self.inputs else None
            direct = None if is_input or inv is not None or slot in passed else k
            self.writes.append((self.outputs.index(src), direct, slot))
        self._outside = [i for i, (_, _, slot) in enumerate(self.writes) if slot is None]
        # the launch's outputs are the results, in order: run() returns them as they come, those
        # stored in PyTorch's order viewed back (_perms)
        self._direct = [r[:2] for r in self.results] == [(False, k) for k in range(len(self.results))]
        perms = tuple(inv for _, _, inv in self.results)
        self._perms = perms if self._direct and any(p is not None for p in perms) else None
        t0 = time.perf_counter()
        # (a model's equal layers: one graph, whose Programs and Launches serve them all)
        self.graph = shared_graph(seg.input_nodes, nodes, [*env_names, *(name for _, _, name in self.binds)]) \
            if nodes else None
        self.compile_s = time.perf_counter() - t0
        if self.graph is not None and self.graph not in launchers:
            # guarded: CompiledFx runs behind Dynamo's guards (see torch_launch.guarded_signature)
            launchers[self.graph] = TensorLauncher(self.graph, guarded=True)
        self.launch = launchers.get(self.graph)
        # the outputs' device where it is not the host: the launch runs there whatever the inputs
        # say (none, or 0-d host scalars); the quick paths below are the host VM's
        self.device = _device(self.outputs)
        # run()'s quick path: (graph sizes, tensor check, VM, direct call) of the last launch
        self._quick: tuple | None = None
        self._last_key: tuple | None = None
        self._quick_ok = self.launch is not None and not self.writes and self._direct and self.device is None
        # or, for a segment updating inputs, where every output is written into one (_remember_writes)
        self._quick_writes = self.launch is not None and bool(self.writes) and self._direct and \
            self._perms is None and not self._copies and self.device is None
        self._no_quick: tuple | None = None   # (sizes, _into decision) for which it was not possible
        self.n_kernels = len(self.graph.templates) if self.graph else 0
        if VERIFY is None and config().verify:
            from ..tools.verify import install_from_env   # DVM_VERIFY=1
            install_from_env()

    def owns_result(self, i: int) -> bool:
        """run()'s result i is memory of its own on every call: a launch output that no other
        result shares (not an input passed on; no input updated)."""
        if self.writes or not 0 <= i < len(self.results):
            return False
        is_input, k, _ = self.results[i]
        return not is_input and sum(1 for other_input, other, _ in self.results if not other_input and other == k) == 1

    def check(self, env) -> None:
        """The shape facts recorded while tracing, once per distinct tuple of sizes."""
        key = tuple(env.values())      # the env's key order is fixed per graph and segment
        if key in self._checked:
            return
        for c in self.checks:
            lhs = evaluate(c.lhs, env)
            if (lhs == 0) if c.rhs is None else lhs != evaluate(c.rhs, env):
                raise ShapeError(f"dvm torch backend: {c.why} (sizes {env})")
        if len(self._checked) >= _CHECKED_MAX:
            self._checked.clear()
        self._checked.add(key)

    def run(self, env: dict, *tensors: torch.Tensor) -> Sequence[torch.Tensor]:
        """The segment's outputs (self.outputs' order) from its input tensors (self.inputs' order),
        then the graph inputs it updates (self.write_dsts' order)."""
        key = tuple(env.values())
        quick = self._quick
        if quick is not None and quick[0] == key and quick[1](*tensors) and \
                quick[2] == config().vm and VERIFY is None:
            counters.bump_segment()
            return quick[3](tensors)
        results = self._run(env, tensors)
        if self._quick_ok:
            self._remember_quick(key, env, tensors)
        elif self._quick_writes:
            self._remember_writes(key, env, tensors)
        return results

    def _remember_quick(self, key: tuple, env: dict, tensors: Sequence[torch.Tensor]) -> None:
        """After the second call in a row with the same sizes (key: env's values), the launch those
        sizes and tensors found, as run()'s quick path: its tensor check, on the same graph sizes,
        stands for the binds, the shape checks and the launcher's own signature."""
        if key != self._last_key:
            self._last_key, self._quick = key, None
            return
        got = self.launch.direct_for(self._bound(env, tensors), tensors, self._perms or ())
        self._quick = None if got is None else (key, got[0], config().vm, got[1])

    def _remember_writes(self, key: tuple, env: dict, tensors: Sequence[torch.Tensor]) -> None:
        """After the second call in a row with the same sizes, where _into wrote every output into
        the input it updates (an optimizer step) and the launch runs on addresses alone: run()'s
        quick path, the VM on the same addresses once the tensors pass _into's check (the same
        addresses, dtypes, sizes and strides: the same decisions)."""
        if key != self._last_key:
            self._last_key, self._quick = key, None
            return
        n, memo = len(self.inputs), self._into_memo
        tried = self._no_quick
        if memo is None or VERIFY is not None or (tried is not None and tried[0] == key and tried[1] is memo):
            return
        self._no_quick = (key, memo)   # (tried once per sizes and _into decision; kept if it fails)
        same, ptrs, direct = memo
        dst_of = {self.writes[i][1]: i for i in direct}   # launch output -> the write storing it
        if len(direct) != len(self.writes) or set(dst_of) != set(range(len(self.graph.outputs))):
            return
        run = self.launch.addresses_for(self._bound(env, tensors[:n]), tensors[:n])
        if run is None:
            return
        dsts = [n + dst_of[k] for k in range(len(dst_of))]
        addrs = [*map(_data_ptr, tensors[:n]), *(_data_ptr(tensors[i]) for i in dsts)]
        outside = [n + i for i in self._outside]

        def check(*tensors) -> bool:
            every = (*tensors[:n], *[tensors[i] for i in outside])   # (each tensor once, as _into)
            return tuple(map(_data_ptr, every)) == ptrs and same(*every)

        def call(tensors: Sequence[torch.Tensor]) -> tuple:
            run(addrs)
            counters.bump("torch_input_updates_stored", len(dsts))
            return tuple(tensors[i] for i in dsts)
        self._quick = (key, check, config().vm, call)

    def _bound(self, env: dict, tensors: Sequence[torch.Tensor]) -> dict:
        """env with the segment's own sizes bound from its inputs' shapes."""
        if not self.binds:
            return env
        env = dict(env)
        for i, j, name in self.binds:
            env[name] = tensors[i].shape[j]
        return env

    def _run(self, env: dict, tensors: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        dsts = ()
        if self.writes:
            tensors, dsts = tensors[:len(self.inputs)], tensors[len(self.inputs):]
        env = self._bound(env, tensors)
        if self.checks:
            self.check(env)
        counters.bump_segment()
        into = self._into(tensors, dsts) if dsts and VERIFY is None else None
        outs = self.launch(env, tensors, into, self.device) if self.launch is not None else ()
        if VERIFY is not None:
            VERIFY(self, env, tensors, outs)
        results = (outs if self._perms is None else _viewed(outs, self._perms)) if self._direct else tuple(
            # an input passed through is copied row-major, like most DVM outputs: later views work
            [tensors[k].clone(memory_format=torch.contiguous_format) if is_input
             else outs[k] if inv is None else outs[k].permute(inv) for is_input, k, inv in self.results])
        if self._copies:
            results = tuple(r.clone() if i in self._copies else r for i, r in enumerate(results))
        for (j, _, _), dst in zip(self.writes, dsts):
            if results[j] is not dst:
                dst.copy_(results[j])
                counters.bump("torch_input_updates_copied")
        return results

    def _into(self, tensors: Sequence, dsts: Sequence) -> list | None:
        """The launch's outputs that are written straight into the graph inputs they update. The
        answer depends only on the tensors' addresses, dtypes, sizes and strides: it is kept for
        the next call with the same ones (an optimizer's step: the same tensors every time)."""
        memo = self._into_memo
        # (each tensor once: a check of the same tensor twice fails; a dst read by the segment is
        # one of its inputs)
        every = (*tensors, *[dsts[i] for i in self._outside])
        ptrs = tuple(map(_data_ptr, every))
        if memo is not None and memo[1] == ptrs and memo[0](*every):
            direct = memo[2]
        else:
            direct, taken, spans = [], set(), input_spans(tensors)
            for i, ((_, k, slot), dst) in enumerate(zip(self.writes, dsts)):
                if k is not None and k not in taken and writable_over(self.graph, k, dst, spans, slot):
                    direct.append(i)
                    taken.add(k)
            same = tensor_check(every)
            self._into_memo = None if same is None else (same, ptrs, direct)
        if not direct:
            return None
        into = [None] * len(self.graph.outputs)
        for i in direct:
            into[self.writes[i][1]] = dsts[i]
        counters.bump("torch_input_updates_stored", len(direct))
        return into
