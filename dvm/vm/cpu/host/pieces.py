"""The CPU VM in pieces: what is compiled separately, the VM table through which the core calls the
pieces, and getting each piece compiled or loaded once per machine.

The core (jit/entry.run_units with jit/interp) decodes instructions and calls a piece per
instruction through the VM table: abi.N_PIECES addresses, then the decode table. A piece is a C
function compiled and cached on its own, so compile cost adds up instead of multiplying, and
editing a module recompiles only the pieces built from it (host/cache: each cache entry is stamped
with the hash of its piece's sources).

Tiers: the CORE pieces run every program (generic loops); the FAST pieces are optional fast paths
(row trees in vector registers, fused runs, row forms) that compute the same results, bit for bit.
A cold process compiles what is missing of the core first (in parallel processes), starts running
programs, and compiles the fast pieces in a background process; each fast piece's address is
written into the table when it is ready (a word store: a launch in flight sees the old or the new
address, either gives the same results).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import itertools
import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache

import numba
import numpy as np
from numba.core import sigutils
from numba.core.bytecode import FunctionIdentity
from numba.core.ccallback import CFunc
from numba.core.compiler_lock import global_compiler_lock

from .. import abi
from . import cache, lean_compile, tuning
from .decode import DECODE

CORE, FAST = 0, 1
PIECE_SIG = sigutils.normalize_signature("int64(int64, int64, int64, int64)")   # (args, return type)
_PKG = "dvm.vm.cpu.jit"


@dataclass(frozen=True)
class Piece:
    name: str
    slots: tuple   # the abi.PC_* slots it fills; () for a function called from outside the table
    module: str
    function: str
    tier: int
    py_sig: tuple = ()   # the argument types of the function Python calls (the core's entry)
    c_sig: str = ""      # a C function's signature other than a table piece's (PIECE_SIG)
    build_s: float = 0.0  # its compile alone, seconds (measured: see PIECES): the build order


_ENTRY_TYPES = (numba.int64, numba.int64, numba.int64[::1], numba.int64[::1], numba.int64[::1], numba.int64[::1],
                numba.boolean)
BACKGROUND_FLAG = "--background"   # host/build: the pieces after it compile at low priority

# build_s: each piece alone, `python -m dvm.vm.cpu.host.build PIECE` from an empty cache, an AMD EPYC
# host with 2 cores (2026-12-05); only their order matters (pieces.build_order: longest first).
PIECES = (   # the table's order (it fixes each piece's function ids: _own_function_ids)
    Piece("core", (), f"{_PKG}.entry", "run_units", CORE, _ENTRY_TYPES, build_s=9.0),
    Piece("mem", (abi.PC_MEM,), f"{_PKG}.mem", "mem_piece", CORE, build_s=12.5),
    Piece("ew_f32", (abi.PC_EW_F32,), f"{_PKG}.kernels", "ew_f32_piece", CORE, build_s=6.6),
    Piece("reduce", (abi.PC_REDUCE,), f"{_PKG}.reduce", "reduce_piece", CORE, build_s=9.7),
    Piece("ew_other", (abi.PC_EW_F64, abi.PC_EW_I64, abi.PC_EW_B8, abi.PC_CAST), f"{_PKG}.kernels_other",
          "ew_other_piece", CORE, build_s=9.1),
    Piece("rowlevel", (abi.PC_ROWLEVEL,), f"{_PKG}.rowlevel", "rowlevel_piece", CORE, build_s=9.4),
    Piece("mem_t", (abi.PC_MEM_T,), f"{_PKG}.mem_t", "mem_t_piece", CORE, build_s=8.3),
    Piece("fused_tile", (abi.PC_FUSED_TILE,), f"{_PKG}.fused.tile", "fused_tile_piece", FAST, build_s=16.0),
    Piece("rowtree", (abi.PC_ROWTREE,), f"{_PKG}.rowtree", "rowtree_piece", FAST, build_s=11.5),
    Piece("fused_rows", (abi.PC_FUSED_ROWS,), f"{_PKG}.fused.rows", "fused_rows_piece", FAST, build_s=20.2),
    Piece("fused_rotary", (abi.PC_FUSED_ROTARY,), f"{_PKG}.fused.rotary", "fused_rotary_piece", FAST,
          build_s=2.6),
    Piece("team", (), f"{_PKG}.team", "team_body", FAST, c_sig="void(int64)", build_s=8.4),   # host/openmp
)
BY_NAME = {p.name: p for p in PIECES}
assert sorted(s for p in PIECES for s in p.slots) == list(range(abi.N_PIECES))

# The VM table every launch passes to the core: one array for the life of the process (worker
# threads keep a reference to it), whose piece words are written as pieces load.
TABLE = np.zeros(abi.N_PIECES + DECODE.size, np.int64)
TABLE[abi.N_PIECES:] = DECODE.reshape(-1)


# --- what a piece is compiled from ----------------------------------------------------------------
_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))   # holds dvm/
_CPU = "dvm.vm.cpu."   # the VM's own modules: their imports are followed; other dvm modules are hashed
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)", re.M)


def _module_file(name: str) -> str | None:
    path = os.path.join(_ROOT, *name.split("."))
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


@lru_cache(maxsize=None)
def _source(name: str) -> bytes:
    with open(_module_file(name), "rb") as f:
        return f.read()


@lru_cache(maxsize=None)
def _imports(module: str) -> tuple[str, ...]:
    """The dvm modules `module` imports (from its source's import statements)."""
    text = _source(module).decode()
    package = module if _module_file(module).endswith("__init__.py") else module.rpartition(".")[0]
    out = []
    for dots, base, names in _FROM.findall(text):
        if dots:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - len(dots) + 1] + ([base] if base else []))
        candidates = [base] + [f"{base}.{n.split()[0]}" for n in names.strip("()").replace("\\", " ").split(",")
                               if n.strip()]
        out += [c for c in candidates if c.startswith("dvm.") and _module_file(c)]
    for names in _IMPORT.findall(text):
        out += [n.split()[0] for n in names.split(",") if n.strip().startswith("dvm.")]
    return tuple(out)


@lru_cache(maxsize=None)
def _digest(module: str) -> bytes:
    """A module's name and source, hashed once for every piece built from it."""
    return hashlib.sha256(module.encode() + b"\0" + _source(module)).digest()


@lru_cache(maxsize=None)
def _closure(module: str) -> tuple[str, ...]:
    """The modules a piece's code comes from: its module and, transitively, the VM modules it
    imports, with the other dvm modules they import (hashed, not followed)."""
    seen: dict[str, None] = {}
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen[m] = None
        if m.startswith(_CPU):
            todo += _imports(m)
    return tuple(sorted(seen))


def source_hash(piece: Piece) -> str:
    """A hash of the sources of every module the piece's module imports, transitively, and of the
    piece's name and function: its disk-cache stamp."""
    h = hashlib.sha256(f"{piece.name}:{piece.function}:numba {numba.__version__}:{tuning.stamp()}:"
                       f"ids {ID_SCHEME}:{lean_compile.stamp()}".encode())
    for m in _closure(piece.module):
        h.update(_digest(m))
    return h.hexdigest()[:24]


# Numba names a compiled function by its qualified name, its argument types and a counter of the
# process that compiled it ([abi:vN]). A piece's machine code defines those names globally, and
# the JIT resolves a piece's calls to its own functions by name, across every piece loaded. Pieces
# compiled by different processes could give the same name to two different functions (the
# closures one factory makes share a qualified name and argument types), and a call in one piece
# then ran the other's: wrong results only after a load from the disk cache. So each piece
# compiles with the counter starting at its own base: no two pieces' new functions share a name.
ID_SCHEME = 1            # (in the cache stamp: code named under an older scheme is not loaded)
_ID_STRIDE = 1 << 40     # far above any process's own count


@contextlib.contextmanager
def _own_function_ids(piece: Piece):
    """Numba's function counter at piece's base while it compiles (restored after)."""
    saved = FunctionIdentity._unique_ids
    FunctionIdentity._unique_ids = itertools.count((PIECES.index(piece) + 1) * _ID_STRIDE)
    try:
        yield
    finally:
        FunctionIdentity._unique_ids = saved


# --- one piece's compiled form ----------------------------------------------------------------------
class _Loaded:
    """A piece's numba object with its lean, stamped disk cache."""

    def __init__(self, piece: Piece):
        self.piece = piece
        fn = getattr(importlib.import_module(piece.module), piece.function)
        if piece.py_sig:
            self.obj, self.sig = fn, piece.py_sig
        else:
            sig = sigutils.normalize_signature(piece.c_sig) if piece.c_sig else PIECE_SIG
            self.obj = CFunc(fn, sig, locals={}, options=dict(nogil=True, error_model="numpy"))
            self.sig = self.obj._sig
        self.cache = cache.install(self.obj, source_hash(piece))
        self.address = 0       # a C function's address, once loaded
        self.entry = None      # a Python-called piece's compiled entry point, once loaded

    @property
    def ready(self) -> bool:
        return self.address != 0 or self.entry is not None

    def try_load(self) -> bool:
        """Load the piece from the disk cache if it is there (never compiles)."""
        with global_compiler_lock:
            return self._try_load()

    def _try_load(self) -> bool:
        if self.ready:
            return True
        if self.cache is None:
            return False
        if self.piece.py_sig:
            cres = self.cache.load_overload(self.sig, self.obj.targetctx)
            if cres is None:
                return False
            self.obj.add_overload(cres)
            self.entry = cres.entry_point
            return True
        target = self.obj._targetdescr.target_context
        cres = self.cache.load_overload(self.sig, target)
        if cres is None:
            return False
        self._bind(cres)
        return True

    def compile(self, wait: bool = True) -> bool:
        """Compile the piece (under its machine-wide lock, unless another process did meanwhile)
        and save it to the disk cache. wait=False: if another process holds the lock (it is
        compiling the piece), return False at once instead of waiting for it."""
        with cache.piece_lock(self.cache, self.piece.name, wait) as held, global_compiler_lock:
            if not held:
                return False
            if self._try_load():
                return True
            if self.piece.py_sig:
                with _own_function_ids(self.piece):
                    self.obj.compile(self.sig)
                self.entry = self.obj.overloads[tuple(self.sig)].entry_point
            else:
                with _own_function_ids(self.piece):
                    cres = self.obj._compile_uncached()
                if self.cache is not None:
                    self.cache.save_overload(self.sig, cres)
                self._bind(cres)
            return True

    def _bind(self, cres) -> None:
        self.obj._library = cres.library
        self.obj._wrapper_name = cres.fndesc.llvm_cfunc_wrapper_name
        self.obj._wrapper_address = cres.library.get_pointer_to_function(self.obj._wrapper_name)
        self.address = self.obj._wrapper_address


_LOADED: dict[str, _Loaded] = {}


def loaded(name: str) -> _Loaded:
    obj = _LOADED.get(name)
    if obj is None:
        obj = _LOADED[name] = _Loaded(BY_NAME[name])
    return obj


def install(name: str) -> None:
    """Write loaded piece `name`'s address into the VM table."""
    p = loaded(name)
    for slot in p.piece.slots:
        TABLE[slot] = p.address


def install_all_loaded() -> None:
    """Write every loaded piece's address into the VM table."""
    for name, p in _LOADED.items():
        if p.ready:
            install(name)


def uninstall_fast() -> None:
    """Take every FAST piece out of the table (the generic paths run): for tests comparing them."""
    for p in PIECES:
        if p.tier == FAST:
            TABLE[list(p.slots)] = 0


def build_order(names: list[str]) -> list[str]:
    """Pieces in the order build processes take them: CORE before FAST (a first call waits for the
    core only), each tier longest first (the processes then finish together)."""
    return sorted(names, key=lambda n: (BY_NAME[n].tier, -BY_NAME[n].build_s, PIECES.index(BY_NAME[n])))


def compile_in_this_process(names: list[str]) -> list[str]:
    """Compile (or load) pieces here, in `names`' order: the body of the build processes
    (host/build), which compile the functions a piece calls to IR only (host/lean_compile). A piece
    whose lock another process holds is left to it: processes given the same list share it out
    piece by piece, as each becomes free. Returns the pieces left to other processes."""
    left = []
    for n in names:
        p = loaded(n)
        with lean_compile.callees_as_ir(p.piece.function, p.obj._compiler if p.piece.py_sig else None):
            if not p.compile(wait=False):
                left.append(n)
    return left


def say(message: str) -> None:
    print(f"dvm: {message}", file=sys.stderr, flush=True)


def cache_location() -> str:
    return cache.cache_dir(loaded("core").cache) if loaded("core").cache is not None else "numba's cache"


def worker_count() -> int:
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
                      4))
