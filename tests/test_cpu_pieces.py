"""The CPU VM in pieces (dvm/vm/cpu/host/pieces.py, cache.py): each piece's disk cache is keyed by
the sources it is built from, processes that start together compile a piece once (its lock), the
lean cache stores machine code without numba's linking module, and the VM runs every program on
its generic paths alone (the fast pieces out of the table) with the results it has with them."""
import os
import platform
import subprocess
import sys
import textwrap
import time

import numba
import pytest

from dvm.vm.cpu import abi
from dvm.vm.cpu.host import cache as cpu_cache
from dvm.vm.cpu.host import pieces, tuning

pytestmark = pytest.mark.vm_once


def test_every_table_slot_has_one_piece_and_the_core_is_complete_without_fast_pieces():
    slots = sorted(s for p in pieces.PIECES for s in p.slots)
    assert slots == list(range(abi.N_PIECES))
    core = {s for p in pieces.PIECES if p.tier == pieces.CORE for s in p.slots}
    # the fast pieces are optional: the core calls each only where its table word is set
    assert {abi.PC_ROWTREE, abi.PC_FUSED_TILE, abi.PC_FUSED_ROWS, abi.PC_FUSED_ROTARY}.isdisjoint(core)


def test_a_piece_is_keyed_by_the_modules_it_is_built_from():
    """Editing a module recompiles the pieces whose sources import it, and only those."""
    closure = {p.name: set(pieces._closure(p.module)) for p in pieces.PIECES}
    rows = "dvm.vm.cpu.jit.fused.rows"
    assert {n for n, mods in closure.items() if rows in mods} == {"fused_rows"}
    assert {n for n, mods in closure.items() if "dvm.vm.cpu.jit.kernels" in mods} == {"ew_f32", "ew_other"}
    assert all("dvm.vm.cpu.abi" in mods for mods in closure.values())
    assert all(not m.startswith("dvm.vm.cpu.host") for mods in closure.values() for m in mods)
    stamps = {p.name: pieces.source_hash(p) for p in pieces.PIECES}
    assert len(set(stamps.values())) == len(stamps)   # pieces of one module differ by name


def _function_id(dispatcher) -> int:
    """The process counter numba named the dispatcher's one compiled function with ([abi:vN])."""
    (cres,) = dispatcher.overloads.values()
    return int(cres.fndesc.unique_name.rsplit("$", 1)[1])


def test_each_piece_names_the_functions_it_compiles_from_its_own_counter_range():
    """A piece's new functions take numba's counter from the piece's own base, so pieces compiled
    by different processes never define one name for two functions (the JIT resolved a piece's
    call by name to another piece's function of that name); the process's counter is restored."""
    bases = set()
    for piece in (pieces.BY_NAME["fused_rows"], pieces.BY_NAME["core"]):
        made = numba.njit(lambda x: x + 1)
        with pieces._own_function_ids(piece):
            made(1)
        base = (pieces.PIECES.index(piece) + 1) * pieces._ID_STRIDE
        assert base <= _function_id(made) < base + pieces._ID_STRIDE
        bases.add(base)
        after = numba.njit(lambda x: x + 2)
        after(1)
        assert _function_id(after) < pieces._ID_STRIDE
    assert len(bases) == 2


_MODULE = textwrap.dedent("""
    from numba import njit

    @njit
    def plus_one(x):
        return x + 1
""")

_WAITER = textwrap.dedent("""
    import sys
    import numba
    sys.path.insert(0, sys.argv[1])
    import tiny_vm
    from dvm.vm.cpu.host import cache
    c = cache.install(tiny_vm.plus_one, "stamp-1")
    print("waiting", flush=True)
    with cache.piece_lock(c, "tiny"):
        tiny_vm.plus_one.compile((numba.int64,))
    st = tiny_vm.plus_one.stats
    print(sum(st.cache_hits.values()), sum(st.cache_misses.values()), tiny_vm.plus_one(41), flush=True)
""")


def test_a_second_process_waits_for_the_lock_and_loads_the_piece(tmp_path):
    (tmp_path / "tiny_vm.py").write_text(_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import tiny_vm
        c = cpu_cache.install(tiny_vm.plus_one, "stamp-1")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
        with cpu_cache.piece_lock(c, "tiny"):   # this process compiles the piece
            waiter = subprocess.Popen([sys.executable, "-c", _WAITER, str(tmp_path)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env)
            assert waiter.stdout.readline().strip() == "waiting"
            time.sleep(0.5)
            assert cpu_cache.locked_now(c, "tiny")
            tiny_vm.plus_one.compile((numba.int64,))   # compiled and cached while the other one waits
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, err
        hits, misses, value = map(int, out.split())
        assert (hits, misses, value) == (1, 0, 42)   # loaded from the cache, not compiled again
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tiny_vm", None)


def test_a_cache_entry_of_other_sources_is_not_loaded(tmp_path, monkeypatch):
    """The stamp (the piece's source hash) decides: another stamp compiles anew."""
    (tmp_path / "tiny_vm3.py").write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiny_vm3
    cpu_cache.install(tiny_vm3.plus_one, "stamp-a")
    tiny_vm3.plus_one.compile((numba.int64,))
    fresh = numba.njit(tiny_vm3.plus_one.py_func)
    c = cpu_cache.install(fresh, "stamp-a")
    assert c.load_overload((numba.int64,), fresh.targetctx) is not None
    c = cpu_cache.install(fresh, "stamp-b")
    assert c.load_overload((numba.int64,), fresh.targetctx) is None
    sys.modules.pop("tiny_vm3", None)


_WIDE_BUILD = textwrap.dedent("""
    import sys
    import numba
    sys.path.insert(0, sys.argv[1])
    import tiny_wide
    from dvm.vm.cpu.host import cache
    cache.install(tiny_wide.plus_one, "stamp-w")
    tiny_wide.plus_one.compile((numba.int64,))
    print(tiny_wide.plus_one.targetctx.codegen().magic_tuple()[2].split(",")[-1])
""")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the width preference is an x86 feature")
def test_code_built_with_the_width_preference_loads_in_a_process_without_it(tmp_path, monkeypatch):
    """The cache key leaves host/tuning's preference out: the build processes have it, the loading
    process does not."""
    from numba.core.codegen import get_host_cpu_features
    (tmp_path / "tiny_wide.py").write_text(_MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
               NUMBA_CPU_FEATURES=f"{get_host_cpu_features()},{tuning.WIDE}")
    out = subprocess.run([sys.executable, "-c", _WIDE_BUILD, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == tuning.WIDE   # the build's codegen had the preference
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiny_wide
    fresh = numba.njit(tiny_wide.plus_one.py_func)
    c = cpu_cache.install(fresh, "stamp-w")
    assert c.load_overload((numba.int64,), fresh.targetctx) is not None
    sys.modules.pop("tiny_wide", None)


_LEAN_MODULE = textwrap.dedent("""
    import numpy as np
    from numba import njit
    from dvm.vm.cpu.host import cache

    @njit
    def _scaled(a, s):
        return a * s + np.float32(1)

    @njit(cache=True)
    def entry(a, s):
        return _scaled(a, s).sum()

    if LEAN:
        cache.install(entry, "lean-test")
""")

_LEAN_LOADER = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import {name}
    st = {name}.entry.stats
    value = {name}.entry(np.arange(4, dtype=np.float32), np.float32(2))
    print(sum(st.cache_hits.values()), sum(st.cache_misses.values()), value, flush=True)
""")


def _cache_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.nbc"))


def _lean_module_runs(folder, name: str, lean: bool, script: str = _LEAN_LOADER, runs: int = 2) -> list[str]:
    """Writes module `name` (with lean_cache or numba's own cache) into `folder`, then runs
    `script` on it in `runs` fresh processes, one after the other; their outputs."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(f"LEAN = {lean}\n" + _LEAN_MODULE)
    outs = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", script.format(name=name), str(folder)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout)
    return outs


def test_lean_cache_stores_machine_code_without_the_linking_module(tmp_path):
    """cache.install: the cached library keeps its machine code and the names it defines, not numba's
    bitcode copy for linking; a new process loads it (a cache hit) and computes the same."""
    sizes = {}
    for lean in (False, True):
        folder = tmp_path / f"lean{int(lean)}"
        outs = _lean_module_runs(folder, f"lean_mod{int(lean)}", lean)
        for out, expect in zip(outs, ((0, 1), (1, 0))):   # first compiled and saved, then loaded
            hits, misses, value = out.split()
            assert (int(hits), int(misses), float(value)) == (*expect, 16.0)
        sizes[lean] = _cache_bytes(folder)
    assert 0 < sizes[True] < sizes[False]


def test_symbols_only_defines_the_same_names():
    from llvmlite import binding as llvm
    full = llvm.parse_assembly(textwrap.dedent("""
        @"g.x" = global i32 7
        @ext = external global i32
        declare i32 @callee(i32)
        define i32 @"_ZN3dvm\\22q\\22"(i32 %a) {
          %b = call i32 @callee(i32 %a)
          ret i32 %b
        }
        define linkonce_odr i32 @other() {
          ret i32 1
        }
    """))
    lean = cpu_cache._symbols_only(full)

    def defined(mod):
        return ({f.name for f in mod.functions if not f.is_declaration},
                {g.name for g in mod.global_variables if not g.is_declaration})
    assert defined(lean) == defined(full) == ({'_ZN3dvm"q"', "other"}, {"g.x"})


# imported by numba's registry refresh, not by `import numba` nor by loading code that uses arrays
_REGISTRY_PROBE = "numba.np.polynomial.polynomial_functions"


def test_lean_cache_loads_without_refreshing_numba_registries(tmp_path):
    """A lean cache hit links the machine code without numba's refresh of every typing and
    lowering registry (most of a cached VM's load); numba's own cache still refreshes."""
    probe = _LEAN_LOADER + f"print({_REGISTRY_PROBE!r} in sys.modules)\n"
    refreshed = {}
    for lean in (False, True):   # compiled and saved, then loaded
        outs = _lean_module_runs(tmp_path / f"probe{int(lean)}", f"probe_mod{int(lean)}", lean, probe)
        counts, loaded = outs[-1].splitlines()
        assert counts.split()[:2] == ["1", "0"]   # the second process loaded the cache
        refreshed[lean] = loaded == "True"
    assert refreshed == {False: True, True: False}


def test_lean_cache_refreshes_where_a_symbol_is_unresolved(tmp_path, monkeypatch):
    _lean_module_runs(tmp_path, "lean_unres", True, runs=1)   # compiled and cached by another process
    monkeypatch.syspath_prepend(str(tmp_path))
    import lean_unres
    ctx = lean_unres.entry.targetctx
    calls = []
    refresh = ctx.refresh
    monkeypatch.setattr(ctx, "refresh", lambda: (calls.append(1), refresh())[1])
    monkeypatch.setattr(cpu_cache, "_links_resolved", lambda payload: False)
    import numpy as np
    assert lean_unres.entry(np.arange(4, dtype=np.float32), np.float32(2)) == 16.0
    assert sum(lean_unres.entry.stats.cache_hits.values()) == 1 and calls   # refreshed (numba re-enters it)
    sys.modules.pop("lean_unres", None)


def _object_code(ir: str) -> bytes:
    from llvmlite import binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(ir)
    return llvm.Target.from_default_triple().create_target_machine(reloc="pic").emit_object(mod)


def test_undefined_symbols_of_an_object_and_whether_they_resolve():
    obj = _object_code(textwrap.dedent("""
        @ext = external global i32
        declare i32 @dvm_test_no_such_symbol(i32)
        declare double @cos(double)
        define i32 @f(i32 %a) {
          %b = call i32 @dvm_test_no_such_symbol(i32 %a)
          %c = load i32, ptr @ext
          %d = add i32 %b, %c
          ret i32 %d
        }
        define double @g(double %x) {
          %y = call double @cos(double %x)
          ret double %y
        }
    """))
    if obj[:4] != b"\x7fELF":   # pragma: no cover - not an ELF platform: the loader refreshes
        assert cpu_cache._undefined_symbols(obj) is None
        return
    assert sorted(cpu_cache._undefined_symbols(obj)) == ["cos", "dvm_test_no_such_symbol", "ext"]
    assert not cpu_cache._links_resolved([("lib", "object", (obj, b""))])
    resolved = _object_code("declare double @cos(double)\n"
                            "define double @g(double %x) {\n  %y = call double @cos(double %x)\n  ret double %y\n}\n")
    assert cpu_cache._links_resolved([("lib", "object", (resolved, b""))])
    assert cpu_cache._undefined_symbols(b"MZ not an ELF object") is None
    assert not cpu_cache._links_resolved([("lib", "bitcode", b"")])


def test_a_lock_held_elsewhere_is_left_when_not_waiting(tmp_path, monkeypatch):
    (tmp_path / "tiny_vm4.py").write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiny_vm4
    c = cpu_cache.install(tiny_vm4.plus_one, "stamp-1")
    assert cpu_cache.can_lock(c, "tiny") and not cpu_cache.can_lock(None, "tiny")   # None: no cache, no lock
    with cpu_cache.piece_lock(None, "tiny", wait=False) as unlocked:
        assert unlocked   # where no lock can be taken, the caller goes on
    with cpu_cache.piece_lock(c, "tiny") as held:   # another open file: flock sees another holder
        assert held
        with cpu_cache.piece_lock(c, "tiny", wait=False) as second:
            assert not second
        assert cpu_cache.locked_now(c, "tiny")
    with cpu_cache.piece_lock(c, "tiny", wait=False) as held:
        assert held


def test_a_build_process_leaves_a_piece_another_one_is_compiling():
    piece = pieces.loaded("fused_rotary")
    with cpu_cache.piece_lock(piece.cache, "fused_rotary"):
        assert pieces.compile_in_this_process(["fused_rotary"]) == ["fused_rotary"]


def test_build_order_is_the_core_first_then_each_tier_longest_first():
    names = [p.name for p in pieces.PIECES]
    order = pieces.build_order(names)
    tiers = [pieces.BY_NAME[n].tier for n in order]
    assert sorted(order) == sorted(names) and tiers == sorted(tiers)
    for tier in (pieces.CORE, pieces.FAST):
        times = [pieces.BY_NAME[n].build_s for n in order if pieces.BY_NAME[n].tier == tier]
        assert times == sorted(times, reverse=True) and min(times) > 0


def test_every_build_process_is_given_the_same_list(monkeypatch):
    from dvm.vm.cpu.host import startup
    started = []

    class FakeProcess:
        pid = 0

        def __init__(self, cmd, **kwargs):
            started.append(cmd)

        def poll(self):
            return 0   # exited at once

    monkeypatch.setattr(startup.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(pieces, "worker_count", lambda: 2)
    build = startup._Build(["ew_f32", "mem"], ["team", "fused_rows"])
    assert len(started) == 2 and started[0] == started[1]
    assert started[0][-5:] == ["mem", "ew_f32", pieces.BACKGROUND_FLAG, "fused_rows", "team"]
    build.wait_loaded(["ew_f32"])   # returns: every process has exited
    startup._Build([], ["rowtree"])
    assert started[-1][-2:] == [pieces.BACKGROUND_FLAG, "rowtree"]


def test_the_build_command_refuses_unknown_pieces(capsys):
    from dvm.vm.cpu.host import build
    assert build.main(["core", pieces.BACKGROUND_FLAG, "no_such_piece"]) == 2
    assert "no_such_piece" in capsys.readouterr().err


def test_without_locks_each_build_process_is_given_its_share(monkeypatch):
    from dvm.vm.cpu.host import startup
    started = []

    class FakeProcess:
        pid = 0

        def __init__(self, cmd, **kwargs):
            started.append(cmd[cmd.index("dvm.vm.cpu.host.build") + 1:])

    monkeypatch.setattr(startup.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(startup.cache, "can_lock", lambda c, name: False)
    monkeypatch.setattr(pieces, "worker_count", lambda: 2)
    startup._Build(["ew_f32", "mem", "core"], ["team", "fused_rows"])
    flag = pieces.BACKGROUND_FLAG
    assert started == [["mem", "ew_f32", flag, "fused_rows"], ["core", flag, "team"]]


def test_a_build_of_no_pieces_starts_no_process(monkeypatch):
    from dvm.vm.cpu.host import startup
    monkeypatch.setattr(startup.subprocess, "Popen", lambda *a, **k: pytest.fail("a process started"))
    build = startup._Build([], [])
    assert build.procs == [] and not build.alive()
