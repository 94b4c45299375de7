"""Compile the CPU VM once per machine, not once per process.

The VM is one numba entry point (cpu_entry.run_units) cached on disk. A cold cache costs a long
compile (~15 min on this project's 2-core machine); processes that start together on it (pytest
workers, data-loader workers, one process per rank) would each compile the same code. `ensure`
makes the first use in every process take an exclusive lock on a file beside numba's cache: the
first process compiles and writes the cache; the others wait, then load it (0.3 s). Where the
lock cannot be taken (no fcntl, a read-only cache directory) each process compiles on its own, as
numba does by default. A compile (a cache miss) and a wait of more than WAIT_NOTICE_S for
another process's lock are said on stderr: the one-time compile is minutes of silence otherwise.

`lean_cache` stores the entry point without the LLVM bitcode numba keeps beside the machine code
(see _symbols_only): parsing it was most of the time a cached VM took to load. Its load skips
numba's refresh of every typing and lowering registry where the machine code's undefined symbols
all resolve without it (_LeanCache.load_overload): that refresh was most of what remained.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings

import numba
import numpy as np
from numba.core import event
from numba.core.caching import CompileResultCacheImpl, FunctionCache

_LOCK_NAME = "dvm-vm-compile.lock"
_thread_lock = threading.Lock()
done = False   # set once ensure() has compiled or loaded the VM in this process (read per launch)
WAIT_NOTICE_S = 2.0   # a wait for the lock longer than this is said (loading the cache takes < 1 s)


def ensure(dispatcher, example_args: tuple) -> None:
    """Compile (or load from the disk cache) `dispatcher` for the types of example_args, once per
    process, under the machine-wide lock."""
    global done
    if done:
        return
    with _thread_lock:
        if done:
            return
        sig = tuple(numba.typeof(a) for a in example_args)
        fd = _lock_file(dispatcher)
        try:
            with event.install_listener("numba:compile", _CompileNotice(dispatcher)):
                dispatcher.compile(sig)
        finally:
            if fd is not None:
                os.close(fd)   # closing the descriptor releases the lock
        done = True


def _lock_file(dispatcher) -> int | None:
    """A descriptor holding the exclusive lock on the file beside the dispatcher's disk cache
    (blocks while another process holds it), or None."""
    try:
        import fcntl
        path = os.path.join(dispatcher._cache._cache_path, _LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, AttributeError, OSError):
        return None
    deadline = time.monotonic() + WAIT_NOTICE_S
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        _say(f"waiting for another process that is compiling the CPU VM (lock: {path}) ...")
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def _say(message: str) -> None:
    print(f"dvm: {message}", file=sys.stderr, flush=True)


class _CompileNotice(event.Listener):
    """Says on stderr when numba starts compiling `dispatcher` itself (a cache miss) and how
    long that took; a load from the disk cache says nothing."""

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self.t0: float | None = None

    def on_start(self, ev) -> None:
        if self.t0 is None and ev.data.get("dispatcher") is self.dispatcher:
            self.t0 = time.perf_counter()
            _say("compiling the CPU VM with numba, once per machine: 7-15 minutes on 2 cores "
                 "(later processes load it from the disk cache in well under a second) ...")

    def on_end(self, ev) -> None:
        if self.t0 is not None and ev.data.get("dispatcher") is self.dispatcher:
            where = getattr(getattr(self.dispatcher, "_cache", None), "_cache_path", "numba's cache")
            _say(f"CPU VM compiled in {time.perf_counter() - self.t0:.0f} s; cached in {where}")


def lean_cache(dispatcher) -> None:
    """Give `dispatcher` (an entry point called only from Python) a disk cache that stores its
    library's linking module as symbols only (_symbols_only). Where numba's internals differ
    from what this expects, the default cache stays."""
    try:
        cache = dispatcher._cache
        if isinstance(cache, FunctionCache) and not isinstance(cache, _LeanCache):
            dispatcher._cache = _LeanCache(dispatcher.py_func)
    except (AttributeError, TypeError):  # pragma: no cover - numba internals changed
        pass


class _LeanImpl(CompileResultCacheImpl):
    def reduce(self, cres):
        lib = cres.library
        try:
            full = lib._get_module_for_linking()
            lean = _symbols_only(full)
        except Exception as e:   # pragma: no cover - numba / llvmlite internals changed: store it whole
            warnings.warn(f"DVM: the CPU VM's cache is stored whole (slower to load): {e!r}")
            return super().reduce(cres)
        lib._shared_module = lean
        try:
            return super().reduce(cres)
        finally:
            lib._shared_module = full   # this process keeps the full module


class _LeanCache(FunctionCache):
    _impl_class = _LeanImpl

    def load_overload(self, sig, target_context):
        """numba's load of a cached overload without its `target_context.refresh()` where the
        machine code does not need it. The refresh imports and installs every typing and lowering
        registry numba has (~0.3 s, most of a cached VM's load) for compiling; loading machine
        code needs only the symbols it links against. Those are registered by the context's init
        (numba's C helpers, C math) and by the runtime's initialize (NRT_*); a symbol still
        unresolved (one a registry module registers when imported) makes this do the refresh,
        as numba would. A later compile in this process refreshes the context itself."""
        with self._guard_against_spurious_io_errors():
            if not self._enabled:
                return None
            data = self._cache_file.load(self._index_key(sig, target_context.codegen()))
            if data is None:
                return None
            from numba.core.runtime import rtsys
            rtsys.initialize(target_context)
            if not _links_resolved(data):
                target_context.refresh()
            return self._impl.rebuild(target_context, data)


def _links_resolved(payload) -> bool:
    """Whether every symbol the cached machine code leaves undefined is known to LLVM's JIT now
    (registered or in the process). False where that cannot be told (not an ELF object)."""
    from llvmlite import binding as llvm
    try:
        _name, kind, (obj, _bitcode) = payload[0]
        names = _undefined_symbols(obj) if kind == "object" else None
    except (TypeError, ValueError, IndexError):
        return False
    return names is not None and all(llvm.address_of_symbol(n) is not None for n in names)


_ELF_SECTION = np.dtype([("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"),
                         ("offset", "<u8"), ("size", "<u8"), ("link", "<u4"), ("info", "<u4"),
                         ("addralign", "<u8"), ("entsize", "<u8")])
_ELF_SYMBOL = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                        ("value", "<u8"), ("size", "<u8")])
_SHT_SYMTAB = 2
_GOT = "_GLOBAL_OFFSET_TABLE_"


def _undefined_symbols(obj: bytes) -> list[str] | None:
    """The names of the undefined symbols of a little-endian ELF64 relocatable object, or None
    when `obj` is not one."""
    if obj[:6] != b"\x7fELF\x02\x01":   # ELF, 64-bit, little-endian
        return None
    shoff = int.from_bytes(obj[0x28:0x30], "little")
    shnum = int.from_bytes(obj[0x3C:0x3E], "little")
    if int.from_bytes(obj[0x3A:0x3C], "little") != _ELF_SECTION.itemsize:
        return None
    sections = np.frombuffer(obj, _ELF_SECTION, shnum, shoff)
    symtabs = np.flatnonzero(sections["type"] == _SHT_SYMTAB)
    if len(symtabs) != 1:
        return None
    symtab = sections[symtabs[0]]
    strtab = sections[symtab["link"]]
    syms = np.frombuffer(obj, _ELF_SYMBOL, int(symtab["size"]) // _ELF_SYMBOL.itemsize, int(symtab["offset"]))
    strings = obj[int(strtab["offset"]):int(strtab["offset"] + strtab["size"])]
    undefined = syms["name"][(syms["shndx"] == 0) & (syms["name"] != 0)]
    names = [strings[i:strings.index(b"\0", i)].decode() for i in undefined.tolist()]
    return [n for n in names if n != _GOT]   # (the JIT's linker makes the GOT itself)


def _symbols_only(mod):
    """A module that defines the names `mod` defines and nothing else.

    Numba stores, beside a cached library's machine code, the whole optimized module as bitcode
    (4.2 MB of the VM's 6.2 MB cache file) for one use: linking the library into another numba
    function, so that function can inline it. Loading parses it (0.45 s of a ~1 s load on the
    2-core machine).
    The VM's entry point is only called from Python, never linked, and the loader reads only
    which symbols the module defines (numba's JIT engine looks functions up by that set), so
    stub definitions of the same names do. The machine code is untouched."""
    from llvmlite import binding as llvm
    lines = [f'target triple = "{mod.triple}"', f'target datalayout = "{mod.data_layout}"']
    lines += [f'define void @"{_ir_name(fn.name)}"() {{\n  unreachable\n}}' for fn in mod.functions
              if not fn.is_declaration]
    lines += [f'@"{_ir_name(gv.name)}" = global i8 0' for gv in mod.global_variables if not gv.is_declaration]
    lean = llvm.parse_assembly("\n".join(lines))
    lean.verify()
    return lean


def _ir_name(name: str) -> str:
    """`name` escaped for a quoted LLVM IR identifier."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "".join(f"\\{b:02X}" for b in c.encode())
                   for c in name)
