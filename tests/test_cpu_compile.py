"""dvm.vm.cpu_compile: processes that start together on a cold numba cache compile once."""
import os
import subprocess
import sys
import textwrap

import numba

from dvm.vm import cpu_compile

_MODULE = textwrap.dedent("""
    from numba import njit

    @njit(cache=True)
    def plus_one(x):
        return x + 1
""")

_WAITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import tiny_vm
    from dvm.vm import cpu_compile
    print("waiting", flush=True)
    cpu_compile.ensure(tiny_vm.plus_one, (1,))
    st = tiny_vm.plus_one.stats
    print(sum(st.cache_hits.values()), sum(st.cache_misses.values()), tiny_vm.plus_one(41), flush=True)
""")


def test_a_second_process_waits_and_loads_the_cache(tmp_path):
    (tmp_path / "tiny_vm.py").write_text(_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import tiny_vm
        fd = cpu_compile._lock_file(tiny_vm.plus_one)   # this process holds the lock
        assert fd is not None
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
        waiter = subprocess.Popen([sys.executable, "-c", _WAITER, str(tmp_path)], stdout=subprocess.PIPE,
                                  text=True, env=env)
        assert waiter.stdout.readline().strip() == "waiting"
        tiny_vm.plus_one.compile((numba.int64,))   # compiled and cached while the other one waits
        os.close(fd)
        out, _ = waiter.communicate(timeout=120)
        assert waiter.returncode == 0
        hits, misses, value = map(int, out.split())
        assert (hits, misses, value) == (1, 0, 42)   # loaded from the cache, not compiled again
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tiny_vm", None)


def test_ensure_is_once_per_process_and_falls_back_without_a_lock(tmp_path, monkeypatch):
    (tmp_path / "tiny_vm2.py").write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiny_vm2
    monkeypatch.setattr(cpu_compile, "done", False)
    monkeypatch.setattr(cpu_compile, "_lock_file", lambda dispatcher: None)   # e.g. a read-only cache
    cpu_compile.ensure(tiny_vm2.plus_one, (1,))
    assert cpu_compile.done and len(tiny_vm2.plus_one.signatures) == 1
    cpu_compile.ensure(tiny_vm2.plus_one, (1.0,))   # a no-op once ready
    assert len(tiny_vm2.plus_one.signatures) == 1
    sys.modules.pop("tiny_vm2", None)
