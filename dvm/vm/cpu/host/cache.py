"""The CPU VM's disk cache: one numba cache entry per piece (host/pieces), keyed by the content of the
files the piece is compiled from, and stored lean.

Key: numba keys a cached function by its source file's modification time and size, and only its
own file. A piece's code comes from several modules (jit/ops, jit/mathf, ...), so each piece's
cache is stamped instead with a hash of the sources of every module it imports, transitively
(host/pieces.source_hash): editing a module recompiles exactly the pieces built from it, and a
fresh checkout of the same sources finds its cache valid.

Lean: the cache stores the machine code without the LLVM bitcode numba keeps beside it
(_symbols_only): pieces are only ever called by address, never linked into other numba
functions, and parsing the bitcode was most of a cached load. Its load skips numba's refresh of
every typing and lowering registry where the machine code's undefined symbols all resolve
without it (_LeanCache.load_overload): that refresh was most of what remained.

Machine-wide lock: `piece_lock` takes an exclusive lock on a file beside a piece's cache, so that
processes starting together on a cold cache (pytest workers, DDP ranks, the background compile)
compile each piece once; where it cannot be taken (no fcntl, a read-only cache directory), each
process compiles on its own, as numba does.
"""
from __future__ import annotations

import contextlib
import os
import warnings

import numpy as np
from numba.core.caching import CompileResultCacheImpl, FunctionCache

from .tuning import key_features


def install(cache_owner, stamp: str) -> FunctionCache | None:
    """Give `cache_owner` (a numba Dispatcher or CFunc, called only by address or from Python) a
    lean disk cache whose entries are valid for source hash `stamp`. None where numba's internals
    differ from what this expects (the default cache then stays)."""
    try:
        cache = _LeanCache(cache_owner.py_func if hasattr(cache_owner, "py_func") else cache_owner._pyfunc)
        cache._cache_file._source_stamp = ("dvm-piece", stamp)
    except (AttributeError, TypeError):  # pragma: no cover - numba internals changed
        return None
    cache_owner._cache = cache
    return cache


def cache_dir(cache: FunctionCache) -> str:
    return cache._cache_path


def _lock_file(cache: FunctionCache | None, name: str) -> int | None:
    """An open descriptor of piece `name`'s lock file; None where no lock can be taken (no fcntl,
    no writable cache directory)."""
    try:
        import fcntl  # noqa: F401 (the locks are fcntl's)
        os.makedirs(cache_dir(cache), exist_ok=True)
        return os.open(os.path.join(cache_dir(cache), f"dvm-{name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, AttributeError, OSError):
        return None


def can_lock(cache: FunctionCache | None, name: str) -> bool:
    """Whether piece `name`'s lock can be taken (not whether another process holds it)."""
    fd = _lock_file(cache, name)
    if fd is not None:
        os.close(fd)
    return fd is not None


@contextlib.contextmanager
def piece_lock(cache: FunctionCache | None, name: str, wait: bool = True):
    """An exclusive machine-wide lock for compiling piece `name`: yields True once this process
    holds it (waiting while another process does), or where no lock can be taken; with
    wait=False, yields False at once if another process holds it."""
    fd = _lock_file(cache, name)
    if fd is not None:
        import fcntl
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except OSError:
            os.close(fd)
            fd = None
    try:
        yield True
    finally:
        if fd is not None:
            os.close(fd)   # closing the descriptor releases the lock


def locked_now(cache: FunctionCache | None, name: str) -> bool:
    """Whether another process holds piece `name`'s lock (it is compiling it)."""
    with piece_lock(cache, name, wait=False) as held:
        return not held


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

    def _index_key(self, sig, codegen):
        """numba's key with the codegen's vector-width preference left out (host/tuning)."""
        sig_key, magic, code = super()._index_key(sig, codegen)
        return sig_key, magic[:2] + (key_features(magic[2]),) + magic[3:], code

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
