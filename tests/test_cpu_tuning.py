"""The CPU VM's vector width (dvm/vm/cpu/host/tuning.py): the build processes and the loading
process agree on the pieces' stamp, a user's NUMBA_CPU_FEATURES wins, and 512-bit code computes
the 256-bit code's values bit for bit (the cache key's part: tests/test_cpu_pieces.py)."""
import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dvm.vm.cpu.host import tuning

_X86 = platform.machine().lower() in ("x86_64", "amd64")

pytestmark = pytest.mark.vm_once


@pytest.fixture
def fresh_features():
    tuning.build_features.cache_clear()
    yield
    tuning.build_features.cache_clear()


def _host_features() -> str:
    from numba.core.codegen import get_host_cpu_features
    return get_host_cpu_features()


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    env.pop("NUMBA_CPU_FEATURES", None)
    env.update(extra)
    return env


def test_key_features_leaves_out_only_the_width_preference():
    assert tuning.key_features(f"+avx2,+fma,{tuning.WIDE}") == "+avx2,+fma"
    assert tuning.key_features("+avx2,+fma") == "+avx2,+fma"
    assert tuning.key_features(f"+avx512f,{tuning.WIDE},+fma") == "+avx512f,+fma"


def test_a_users_numba_cpu_features_are_what_the_pieces_are_built_with(monkeypatch, fresh_features):
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+sse2,+avx2")
    assert tuning.build_features() == "+sse2,+avx2"
    assert tuning.stamp() == ""
    tuning.build_features.cache_clear()
    monkeypatch.setenv("NUMBA_CPU_FEATURES", f"+avx512f,{tuning.WIDE}")
    assert tuning.stamp() == "zmm"


def test_this_host_gets_wide_vectors_exactly_where_it_has_avx512(monkeypatch, fresh_features):
    from llvmlite import binding as llvm
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    features = _host_features()
    wide = "+avx512f" in features.split(",") and llvm.get_host_cpu_name() not in tuning.NARROW_CPUS
    assert tuning.build_features() == (f"{features},{tuning.WIDE}" if wide else None)
    assert tuning.stamp() == ("zmm" if wide else "")


def test_a_build_process_computes_the_stamp_the_loading_process_computes(monkeypatch, fresh_features):
    """The build processes get build_features() as NUMBA_CPU_FEATURES (host/startup): with it they
    must stamp the pieces as the process without it does, or the cache would never be found."""
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    here = tuning.stamp()
    extra = {} if tuning.build_features() is None else {"NUMBA_CPU_FEATURES": tuning.build_features()}
    out = subprocess.run([sys.executable, "-c", "from dvm.vm.cpu.host import tuning; print(tuning.stamp())"],
                         env=_env(**extra), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == here


# the VM's float32 math over lanes (jit/mathf, jit/mathf_ext) in the VM's own tile loops (jit/loops.loop1)
_MATH = textwrap.dedent("""
    import sys
    import numpy as np
    from numba import njit
    from dvm.vm.cpu.jit.bits import OPTS
    from dvm.vm.cpu.jit.loops import loop1
    from dvm.vm.cpu.jit.mathf import expf, log1pf, logf, sigmoid_into, tanhf
    from dvm.vm.cpu.jit.mathf_ext import erff, gelu_tanhf, geluf

    @njit(**OPTS)
    def silu(o, a):
        sigmoid_into(o, a, a.shape[0], True)

    a = np.fromfile(sys.argv[1], np.float32)
    outs = []
    for run in [loop1(f) for f in (erff, expf, geluf, gelu_tanhf, log1pf, logf, tanhf)] + [silu]:
        o = np.empty_like(a)
        run(o, a)
        outs.append(o)
    np.concatenate(outs).tofile(sys.argv[2])
""")


@pytest.mark.skipif(not _X86 or "+avx512f" not in _host_features().split(","),
                    reason="only an AVX-512 CPU has wider vectors to compare")
def test_wide_vectors_compute_the_same_bits(tmp_path):
    rng = np.random.default_rng(0)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 88.7, -103.9, 3e38, -3e38],
                        np.float32)
    a = np.concatenate([(rng.standard_normal(4099) * 4).astype(np.float32), specials,
                        rng.uniform(-30, 30, 1001).astype(np.float32)])
    a.tofile(tmp_path / "in.bin")
    bits = {}
    for name, extra in (("narrow", {}), ("wide", {"NUMBA_CPU_FEATURES": f"{_host_features()},{tuning.WIDE}"})):
        out = subprocess.run([sys.executable, "-c", _MATH, str(tmp_path / "in.bin"), str(tmp_path / name)],
                             env=_env(NUMBA_CACHE_DIR=str(tmp_path / f"cache_{name}"), **extra),
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        bits[name] = np.fromfile(tmp_path / name, np.uint32)
    assert bits["narrow"].size == 8 * a.size
    assert np.array_equal(bits["narrow"], bits["wide"])
