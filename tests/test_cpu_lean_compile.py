"""host/lean_compile: a build process compiles the functions a piece calls to IR only; the piece
computes what a plain compile's does, and numba is left as it was."""
import subprocess
import sys
import textwrap

import numba
import pytest

from dvm.vm.cpu.host import lean_compile

pytestmark = pytest.mark.vm_once

# A piece in small: a C function calling a callee that calls two more, marked to be inlined.
_PIECE = textwrap.dedent('''
    import contextlib, ctypes, sys
    import numpy as np
    from numba import njit, carray
    from numba.core import sigutils
    from numba.core.ccallback import CFunc
    from numba.core.compiler_lock import global_compiler_lock
    from dvm.vm.cpu.host import lean_compile
    from dvm.vm.cpu.jit.bits import NUMBA_INLINE

    @njit(inline="always")
    def scale(x, k):
        return x * k + 1.0

    @njit(inline=NUMBA_INLINE)
    def keep(x):
        return x

    @njit
    def total(a, n):
        s = 0.0
        for i in range(n):
            s += keep(scale(a[i], 3.0))
        return s

    def sum_piece(addr, n, b, c):
        return np.int64(total(carray(_ptr(addr), (n,)), n))

    from numba.extending import intrinsic
    from numba.core import types
    @intrinsic
    def _ptr(typingctx, addr):
        sig = types.CPointer(types.float64)(types.int64)
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float64)))
        return sig, codegen

    piece = CFunc(sum_piece, sigutils.normalize_signature("int64(int64, int64, int64, int64)"), locals={},
                  options=dict(nogil=True, error_model="numpy"))
    mode = sys.argv[1]   # plain (numba's compile) or lean
    with global_compiler_lock, (contextlib.nullcontext() if mode == "plain" else
                                lean_compile.callees_as_ir("sum_piece")):
        cres = piece._compile_uncached()
        lib = cres.library
        address = lib.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
        _name, kind, (obj, _bitcode) = lib.serialize_using_object_code()
    data = np.arange(10, dtype=np.float64)
    result = ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_int64] * 4)(address)(data.ctypes.data, 10, 0, 0)
    (callee,) = total.overloads.values()
    wrapped = lib.codegen._engine.is_symbol_defined(callee.fndesc.llvm_cpython_wrapper_name)
    print(kind, len(obj), result, wrapped, len(scale.overloads), len(keep.overloads))
''')


def _compile(tmp_path, mode: str) -> list[str]:
    script = tmp_path / "piece.py"
    script.write_text(_PIECE)
    out = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_piece_compiled_with_its_callees_as_ir_computes_the_same(tmp_path):
    assert lean_compile.available()   # numba is pinned: its internals are the ones replaced
    plain, lean = (_compile(tmp_path, mode) for mode in ("plain", "lean"))
    assert plain[0] == lean[0] == "object"   # machine code, as the disk cache stores it
    assert plain[2] == lean[2] == str(int(sum(3.0 * i + 1.0 for i in range(10))))
    # the callee's Python wrapper: only in numba's compile
    assert (plain[3], lean[3]) == ("True", "False")
    # the inline='always' function: copied into its caller's IR by numba, or compiled once for LLVM;
    # the one marked NUMBA_INLINE copied by numba both ways
    assert (plain[4], lean[4]) == ("0", "1")
    assert (plain[5], lean[5]) == ("0", "0")


def test_numba_is_itself_again_after_a_lean_compile():
    def current():
        return [getattr(owner, name) for owner, name in lean_compile._HOOKS]

    originals = current()
    with pytest.raises(RuntimeError):
        with lean_compile.callees_as_ir("nothing"):
            assert all(now is not was for now, was in zip(current(), originals))
            raise RuntimeError
    assert current() == originals

    @numba.njit
    def twice(x):
        return 2 * x

    assert twice(21) == 42   # compiled after: callable from Python as ever
