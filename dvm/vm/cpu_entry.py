"""The CPU VM's compiled entry point (`run_units`, cached on disk): packed kernel descriptors, the
register block of a kernel run, the work-unit loop shared by threads, and the worker's spin on its
mailbox. The per-instruction dispatch it runs is cpu_interp._exec.

Registers, scratch and the caller's tables are handed to the compiled loops as views without a
meminfo, so slicing them never touches a reference count.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from .cpu_bits import OPTS, ptr_f32, ptr_f64, ptr_i64, ptr_u8
from .cpu_fused import FUSE_WIDTH, SF_ROWS, ST_ROWS
from .cpu_interp import _exec
from .cpu_mem import M_BM, M_BN, M_COLS, M_NB, M_ND, M_NF, M_NI, M_NSW, M_PRO_E, M_PRO_S, M_SW, _alias_ok
from .cpu_sync import (MB_BLOB, MB_BLOB_N, MB_BUFS, MB_BUFS_N, MB_SCHED, MB_SCHED_N, MB_STATE, MB_TAKEN,
                       MB_U0, MB_U1, S_CHUNK, S_DONE, S_ERR, S_NEXT, SPINNING, _atomic_add, _atomic_load,
                       _atomic_store, _await_post, _post_all, _retract_all)

MAX_REGS = 256   # per bank (codegen.program.MAX_REGS; checked in cpu.py)


@njit(inline='always', **OPTS)
def _exec_units(u0, u1, tile_par, instrs, dec, peep, meta, dims, optab, consts, addrs, numels, argsz, argst,
                rio, fz, sched, F, D, I, B, fp, ix, sf, sd, si, si2, st):
    """Run work units [u0, u1): row blocks, or (row block, column tile) pairs when tile_par.
    F, D, I, B, fp and the scratch rows are views without a meminfo (see run_units).

    sched empty: this thread runs all of [u0, u1). Else [next, done, err, chunk]: threads share
    the units, each claiming `chunk` units at a time from `next` (atomically) and adding them to
    `done` when finished; a thread that starts late finds them claimed. Units are independent
    (reductions never cross a unit), so results do not depend on who runs which. After an error
    (stored in err) a thread still claims and counts units, without running them."""
    bm, bn = meta[M_BM], meta[M_BN]
    fp[:] = 0
    st[:, :] = 0
    aok = _alias_ok(addrs, numels, argsz, argst)
    cols = meta[M_COLS]
    nct = (cols + bn - 1) // bn
    per_unit = 1 if tile_par else meta[M_NSW] * (nct + 2)
    dyn = sched.shape[0] > S_CHUNK
    sp = np.int64(sched.ctypes.data) if dyn else np.int64(0)
    chunk = max(sched[S_CHUNK], 1) if dyn else max(u1 - u0, 1)
    a = u0        # the current chunk of units [a, b)
    b = u0
    q = -1        # step in the chunk; -1: the prologue
    total = 0
    once = False
    err = 0
    # one call site for _exec (it is inlined)
    while True:
        if q >= total:
            if dyn:
                if b > a:
                    _atomic_add(sp + 8 * S_DONE, b - a)
                a = _atomic_add(sp + 8 * S_NEXT, chunk)
            elif once:
                break
            else:
                once = True
                a = u0
            if a >= u1:
                break
            b = min(a + chunk, u1)
            total = (b - a) * per_unit
            q = 0
        if q < 0:
            s, e, r0, c0, fin = meta[M_PRO_S], meta[M_PRO_E], u0 * 0, u0 * 0, bm > 0
        elif tile_par:
            u = a + q
            s, e, r0, c0, fin = meta[M_SW + 2], meta[M_SW + 3], (u // nct) * bm, (u % nct) * bn, bm < 0
        else:
            u = a + q // per_unit
            t = q % per_unit
            sw = M_SW + 6 * (t // (nct + 2))
            ph = t % (nct + 2)
            r0 = u * bm
            if ph == 0:
                s, e, c0, fin = meta[sw], meta[sw + 1], u0 * 0, bm > 0
            elif ph == nct + 1:
                s, e, c0, fin = meta[sw + 4], meta[sw + 5], u0 * 0, bm > 0
            else:
                s, e, c0, fin = meta[sw + 2], meta[sw + 3], (ph - 1) * bn, bm < 0
        q += 1
        if s == e or err != 0:
            continue
        err = _exec(s, e, instrs, dec, peep, meta, dims, optab, consts, addrs, numels, F, D, I, B, fp,
                    aok, r0, c0, fin, ix, sf, sd, si, si2, rio, st, fz)
        if err != 0 and dyn:
            sched[S_ERR] = err
    return err


@njit(**OPTS)
def _keep(*arrays):
    """A use that keeps the owning arrays alive until here (numba frees after the last use)."""
    return len(arrays)


@njit(inline='always', **OPTS)
def _raw(a):
    """An int64 array as a view without a meminfo (not reference-counted)."""
    return carray(ptr_i64(a.ctypes.data), a.shape)


# Packed kernel descriptor (cpu.py `_pack`): one int64 array, so that a launch passes a few arrays
# to the compiled code instead of 13 (numba's per-argument dispatch cost dominates small launches).
# blob[0] = tile_par; blob[1 + 2k], blob[2 + 2k] = offset and length of segment k (P_* below);
# blob[H_UNITS] = the kernel's work units; blob[H_LEN] = the blob's own length (blobs can be
# chained back to back); blob[P_HEADER - 1] = the width of an optab row. Segments are handed
# down as raw views.
P_INSTRS, P_PEEP, P_META, P_DIMS, P_OPTAB, P_CONSTS, P_ARGSZ, P_ARGST, P_RIO, P_FUSE = range(10)
N_SEGS = 10
H_UNITS, H_LEN = 1 + 2 * N_SEGS, 2 + 2 * N_SEGS
P_HEADER = 4 + 2 * N_SEGS
RIO_WIDTH = 10


@njit(inline='always', **OPTS)
def _seg(blob, base, k):
    """Segment k of a packed descriptor (the caller keeps `blob` alive)."""
    return carray(ptr_i64(base + 8 * blob[1 + 2 * k]), blob[2 + 2 * k])


@njit(inline='always', **OPTS)
def _seg2(blob, base, k, width):
    return carray(ptr_i64(base + 8 * blob[1 + 2 * k]), (blob[2 + 2 * k] // width, width))


@njit(inline='always', **OPTS)
def _line(n):
    """n rounded up to a multiple of 64 (a cache line)."""
    return (n + 63) & ~63


@njit(inline='always', **OPTS)
def _run_kernel(u0, u1, blob, base, dec, bufs, sched):
    """Work units [u0, u1) of the kernel packed at `base` (blob: its raw view).

    Registers and scratch are allocated here and handed down as raw-pointer views (carray): a
    view without a meminfo is never reference-counted, while every slice of an owned array
    costs an atomic increment and decrement (that was 70% of the time of narrow-row kernels)."""
    n = bufs.shape[0] // 2
    tile_par = blob[0] != 0
    instrs = _seg2(blob, base, P_INSTRS, 6)
    optab = _seg2(blob, base, P_OPTAB, blob[P_HEADER - 1])
    rio = _seg2(blob, base, P_RIO, RIO_WIDTH)
    fz = _seg2(blob, base, P_FUSE, FUSE_WIDTH)
    peep, meta, dims = _seg(blob, base, P_PEEP), _seg(blob, base, P_META), _seg(blob, base, P_DIMS)
    consts, argsz, argst = _seg(blob, base, P_CONSTS), _seg(blob, base, P_ARGSZ), _seg(blob, base, P_ARGST)
    addrs = carray(ptr_i64(bufs.ctypes.data), n)
    numels = carray(ptr_i64(bufs.ctypes.data + 8 * n), n)
    bm, bn = meta[M_BM], meta[M_BN]
    t = bm * bn
    nf, nd, ni, nb = meta[M_NF], meta[M_ND], meta[M_NI], meta[M_NB]
    # one block for all of it (one allocation, not seven: ~0.2 us a launch), every part starting
    # on a 64-byte line: AVX-512 stores that straddle two lines make a store-bound pass ~40 %
    # slower (a 4096-lane pass: 64 ns aligned, 89 ns at 32 bytes off; numba aligns to 32 only)
    nfp = max(nf, 1)
    n_so = nfp + 2 * (bm + bn) + 3 * bn + ST_ROWS * MAX_REGS   # fp, ix, si, si2, st
    n_sf = SF_ROWS * bn + bm   # tree rows, cpu_fused's BM lanes and cached row vectors
    o_d = _line(4 * max(nf * t, 1))
    o_i = o_d + _line(8 * max(nd * t, 1))
    o_b = o_i + _line(8 * max(ni * t, 1))
    o_so = o_b + _line(max(nb * t, 1))
    o_sf = o_so + _line(8 * n_so)
    o_sd = o_sf + _line(4 * n_sf)
    blk = np.empty(o_sd + 16 * bn + 64, np.uint8)
    p0 = _line(np.int64(blk.ctypes.data))
    s0 = p0 + o_so
    # the caller's int64 tables too (the caller keeps them alive during the call)
    err = _exec_units(u0, u1, tile_par, instrs, _raw(dec), peep, meta, dims,
                      optab, consts, addrs, numels, argsz, argst, rio, fz,
                      _raw(sched),
                      carray(ptr_f32(p0), (nf, t)), carray(ptr_f64(p0 + o_d), (nd, t)),
                      carray(ptr_i64(p0 + o_i), (ni, t)), carray(ptr_u8(p0 + o_b), (nb, t)),
                      carray(ptr_i64(s0), nfp), carray(ptr_i64(s0 + 8 * nfp), 2 * (bm + bn)),
                      carray(ptr_f32(p0 + o_sf), n_sf), carray(ptr_f64(p0 + o_sd), 2 * bn),
                      carray(ptr_i64(s0 + 8 * (nfp + 2 * (bm + bn))), 2 * bn),
                      carray(ptr_i64(s0 + 8 * (nfp + 2 * (bm + bn) + 2 * bn)), bn),
                      carray(ptr_i64(s0 + 8 * (nfp + 2 * (bm + bn) + 3 * bn)), (ST_ROWS, MAX_REGS)))
    _keep(blk)
    return err


WORKER = -7   # run_units(WORKER, spin_ticks, mailbox, DECODE, mailbox, mailbox, False): a worker's spin


@njit(cache=True, **OPTS)
def run_units(u0, u1, blob, dec, bufs, sched, wait):
    """Run work units [u0, u1) of the kernel packed in `blob` on the calling thread (releases the
    GIL); bufs: the n buffer addresses, then their n element counts.

    u1 < 0: `blob` is a chain of packed kernels back to back (cpu.py `_prog`), each run whole, in
    order, on this thread (one call for a launch of small kernels: numba's dispatch costs ~1 us
    per call); the chain stops at the first error.

    wait (the launching thread of a parallel kernel): first posts the job to the spinning workers
    that sched lists, returns when every unit is done (cpu_sync). u0 == WORKER: `blob` is a
    worker's mailbox; runs the jobs posted to it until u1 TSC ticks pass without one."""
    worker = u0 == WORKER
    mb = blob.ctypes.data
    B, F, S = _raw(blob), _raw(bufs), _raw(sched)
    lo, hi = u0, u1
    if wait:
        _post_all(S, B, F, u0, u1)
    at = 0
    err = 0
    while True:
        if worker and at == 0:
            if not _await_post(mb, u1):
                return 0
            B = carray(ptr_i64(blob[MB_BLOB]), blob[MB_BLOB_N])
            F = carray(ptr_i64(blob[MB_BUFS]), blob[MB_BUFS_N])
            S = carray(ptr_i64(blob[MB_SCHED]), blob[MB_SCHED_N])
            lo, hi = blob[MB_U0], blob[MB_U1]
            blob[MB_TAKEN] += 1
        base = B.ctypes.data + 8 * at
        kb = carray(ptr_i64(base), B[at + H_LEN])
        a = lo if hi >= 0 else 0
        b = hi if hi >= 0 else kb[H_UNITS]
        if b > a:   # (one call site: the kernel body is inlined once)
            err = _run_kernel(a, b, kb, base, dec, F, S)
        at += kb[H_LEN]
        if hi >= 0 or err != 0 or at >= B.shape[0]:
            if not worker:
                break
            _atomic_store(mb + 8 * MB_STATE, SPINNING)   # a worker's errors are in its job's sched
            at = 0
    if wait and S.shape[0] > S_CHUNK:   # the launching thread returns when every unit is done
        sp = S.ctypes.data
        while _atomic_load(sp + 8 * S_DONE) < u1 - u0:
            pass
        _retract_all(S)
    return err


ENTRY_POINTS = (run_units,)
