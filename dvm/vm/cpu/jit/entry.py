"""The CPU VM's compiled entry point (`run_units`, with jit/interp the core of the VM): packed kernel
descriptors, the register block and frame of a kernel run, the work-unit loop shared by threads,
and the worker's spin on its mailbox. The work of each instruction is done by the pieces the core
calls through the VM table (host/pieces builds it: piece addresses, then the decode table).

Registers, scratch and the caller's tables are handed to the compiled loops as views without a
meminfo, so slicing them never touches a reference count.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ..abi import (DEC_WIDTH, FR_ADDRS, FR_ARGST, FR_ARGSZ, FR_B, FR_CONSTS, FR_D, FR_DEC, FR_DIMS, FR_F, FR_FP,
                   FR_FZ, FR_I, FR_INSTRS, FR_IX, FR_META, FR_NARGS, FR_NB, FR_NCONST, FR_ND, FR_NDEC, FR_NDIMS,
                   FR_NF, FR_NFP, FR_NI, FR_NINSTR, FR_NIX, FR_NMETA, FR_NOPND, FR_NSD, FR_NSF, FR_NSI, FR_NSI2,
                   FR_NUMELS, FR_OPTAB, FR_OPW, FR_PEEP, FR_RIO, FR_SD, FR_SF, FR_SI, FR_SI2, FR_ST, FR_T, FR_TAB,
                   FRAME_WORDS, FUSE_WIDTH, H_LEN, H_UNITS, INSTR_WIDTH, M_BM, M_BN, M_COLS, M_NB, M_ND, M_NF,
                   M_NI, M_NSW, M_PRO_E, M_PRO_S, M_SW, MAX_REGS, MB_BLOB, MB_BLOB_N, MB_BUFS, MB_BUFS_N,
                   MB_SCHED, MB_SCHED_N, MB_STATE, MB_TAKEN, MB_U0, MB_U1, N_PIECES, P_ARGST, P_ARGSZ, P_CONSTS,
                   P_DIMS, P_FUSE, P_HEADER, P_INSTRS, P_META, P_OPTAB, P_PEEP, P_RIO, RIO_WIDTH, S_CHUNK, S_DONE,
                   S_ERR, S_NEXT, SF_ROWS, SPINNING, ST_ROWS, SWEEP_META, TSC_NOW, WORKER, STACK, G_ERR, G_NK,
                   G_REC, G_UNITS, G_WAIT, G_WIDTH)
from .addr import alias_ok
from .bits import OPTS, ptr_f32, ptr_f64, ptr_i64, ptr_u8
from .interp import exec_tile
from .sync import atomic_add, atomic_load, atomic_store, await_post, pause, post_all, retract_all, tsc


@njit(inline='always', **OPTS)   # one call site; a call would pass every view's fields
def _exec_units(u0, u1, tile_par, fra, fr, tab, instrs, dec, peep, meta, dims, optab, consts, addrs, numels,
                argsz, argst, rio, fz, sched, F, D, I, B, fp, ix, st):
    """Run work units [u0, u1): row blocks, or (row block, column tile) pairs when tile_par.

    sched empty: this thread runs all of [u0, u1). Else [next, done, err, chunk]: threads share
    the units, each claiming `chunk` units at a time from `next` (atomically) and adding them to
    `done` when finished; a thread that starts late finds them claimed. Units are independent
    (reductions never cross a unit), so results do not depend on who runs which. After an error
    (stored in err) a thread still claims and counts units, without running them."""
    bm, bn = meta[M_BM], meta[M_BN]
    fp[:] = 0
    st[:, :] = 0
    aok = alias_ok(addrs, numels, argsz, argst, instrs, dec, rio, optab, meta, dims)
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
    while True:
        if q >= total:
            if dyn:
                if b > a:
                    atomic_add(sp + 8 * S_DONE, b - a)
                a = atomic_add(sp + 8 * S_NEXT, chunk)
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
            sw = M_SW + SWEEP_META * (t // (nct + 2))
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
        err = exec_tile(s, e, fra, fr, tab, instrs, dec, peep, meta, dims, optab, consts, addrs, F, D, I, B, fp,
                        aok, r0, c0, fin, ix, rio, st, fz)
        if err != 0 and dyn:
            sched[S_ERR] = err
    return err


@njit(**OPTS)
def _keep(*arrays):
    """A use that keeps the owning arrays alive until here (numba frees after the last use)."""
    return len(arrays)


@njit(**OPTS)
def _raw(a):
    """An int64 array as a view without a meminfo (not reference-counted)."""
    return carray(ptr_i64(a.ctypes.data), a.shape)


@njit(**OPTS)
def _seg(blob, base, k):
    """Segment k of a packed descriptor (the caller keeps `blob` alive): (address, length)."""
    return base + 8 * blob[1 + 2 * k], blob[2 + 2 * k]


@njit(**OPTS)
def _line(n):
    """n rounded up to a multiple of 64 (a cache line)."""
    return (n + 63) & ~63


@njit(**OPTS)
def _run_kernel(u0, u1, blob, base, tab, bufs, sched):
    """Work units [u0, u1) of the kernel packed at `base` (blob: its raw view); tab: the VM table.

    Registers, scratch and the frame are one block allocated here and handed down as raw views
    (carray): a view without a meminfo is never reference-counted, while every slice of an owned
    array costs an atomic increment and decrement (that was 70% of the time of narrow-row kernels)."""
    n = bufs.shape[0] // 2
    tile_par = blob[0] != 0
    at_ins, len_ins = _seg(blob, base, P_INSTRS)
    at_opt, len_opt = _seg(blob, base, P_OPTAB)
    opw = blob[P_HEADER - 1]
    at_meta, len_meta = _seg(blob, base, P_META)
    meta = carray(ptr_i64(at_meta), len_meta)
    bm, bn = meta[M_BM], meta[M_BN]
    t = bm * bn
    nf, nd, ni, nb = meta[M_NF], meta[M_ND], meta[M_NI], meta[M_NB]
    # one block for all of it (one allocation a launch), every part starting on a 64-byte
    # line: AVX-512 stores that straddle two lines make a store-bound pass ~40 % slower (a
    # numba aligns to 32 only)
    nfp = max(nf, 1)
    n_so = FRAME_WORDS + nfp + 2 * (bm + bn) + 3 * bn + ST_ROWS * MAX_REGS   # frame, fp, ix, si, si2, st
    n_sf = SF_ROWS * bn + bm   # tree rows, the fused runs' BM lanes and cached row vectors
    o_d = _line(4 * max(nf * t, 1))
    o_i = o_d + _line(8 * max(nd * t, 1))
    o_b = o_i + _line(8 * max(ni * t, 1))
    o_so = o_b + _line(max(nb * t, 1))
    o_sf = o_so + _line(8 * n_so)
    o_sd = o_sf + _line(4 * n_sf)
    blk = np.empty(o_sd + 16 * bn + 64, np.uint8)
    p0 = _line(np.int64(blk.ctypes.data))
    fra = p0 + o_so
    fr = carray(ptr_i64(fra), FRAME_WORDS)
    s0 = fra + 8 * FRAME_WORDS
    n_ix = 2 * (bm + bn)
    o_si = s0 + 8 * (nfp + n_ix)
    o_st = o_si + 8 * 3 * bn
    _fill_frame(fr, tab, blob, base, bufs, n, at_ins, len_ins, at_opt, len_opt, opw, at_meta, len_meta)
    fr[FR_F], fr[FR_D], fr[FR_I], fr[FR_B] = p0, p0 + o_d, p0 + o_i, p0 + o_b
    fr[FR_NF], fr[FR_ND], fr[FR_NI], fr[FR_NB], fr[FR_T] = nf, nd, ni, nb, t
    fr[FR_FP], fr[FR_NFP] = s0, nfp
    fr[FR_IX], fr[FR_NIX] = s0 + 8 * nfp, n_ix
    fr[FR_SF], fr[FR_NSF] = p0 + o_sf, n_sf
    fr[FR_SD], fr[FR_NSD] = p0 + o_sd, 2 * bn
    fr[FR_SI], fr[FR_NSI] = o_si, 2 * bn
    fr[FR_SI2], fr[FR_NSI2] = o_si + 8 * 2 * bn, bn
    fr[FR_ST] = o_st
    ninstr = len_ins // INSTR_WIDTH
    err = _exec_units(u0, u1, tile_par, fra, fr, carray(ptr_i64(fr[FR_TAB]), N_PIECES),
                      carray(ptr_i64(at_ins), (ninstr, INSTR_WIDTH)),
                      carray(ptr_i64(fr[FR_DEC]), (fr[FR_NDEC], DEC_WIDTH)), carray(ptr_i64(fr[FR_PEEP]), ninstr),
                      meta, carray(ptr_i64(fr[FR_DIMS]), fr[FR_NDIMS]),
                      carray(ptr_i64(at_opt), (len_opt // opw, opw)),
                      carray(ptr_i64(fr[FR_CONSTS]), fr[FR_NCONST]), carray(ptr_i64(fr[FR_ADDRS]), n),
                      carray(ptr_i64(fr[FR_NUMELS]), n), carray(ptr_i64(fr[FR_ARGSZ]), n),
                      carray(ptr_i64(fr[FR_ARGST]), n), carray(ptr_i64(fr[FR_RIO]), (ninstr, RIO_WIDTH)),
                      carray(ptr_i64(fr[FR_FZ]), (ninstr, FUSE_WIDTH)), _raw(sched),
                      carray(ptr_f32(p0), (nf, t)), carray(ptr_f64(p0 + o_d), (nd, t)),
                      carray(ptr_i64(p0 + o_i), (ni, t)), carray(ptr_u8(p0 + o_b), (nb, t)),
                      carray(ptr_i64(s0), nfp), carray(ptr_i64(s0 + 8 * nfp), n_ix),
                      carray(ptr_i64(o_st), (ST_ROWS, MAX_REGS)))
    _keep(blk)
    return err


@njit(**OPTS)
def _fill_frame(fr, tab, blob, base, bufs, n, at_ins, len_ins, at_opt, len_opt, opw, at_meta, len_meta):
    """The frame's descriptor and buffer words (abi.FR_*)."""
    fr[FR_TAB] = tab.ctypes.data
    fr[FR_DEC], fr[FR_NDEC] = tab.ctypes.data + 8 * N_PIECES, (tab.shape[0] - N_PIECES) // DEC_WIDTH
    fr[FR_INSTRS], fr[FR_NINSTR] = at_ins, len_ins // INSTR_WIDTH
    fr[FR_PEEP] = _seg(blob, base, P_PEEP)[0]
    fr[FR_META], fr[FR_NMETA] = at_meta, len_meta
    fr[FR_DIMS], fr[FR_NDIMS] = _seg(blob, base, P_DIMS)
    fr[FR_OPTAB], fr[FR_NOPND], fr[FR_OPW] = at_opt, len_opt // opw, opw
    fr[FR_CONSTS], fr[FR_NCONST] = _seg(blob, base, P_CONSTS)
    fr[FR_ADDRS], fr[FR_NUMELS], fr[FR_NARGS] = bufs.ctypes.data, bufs.ctypes.data + 8 * n, n
    fr[FR_ARGSZ] = _seg(blob, base, P_ARGSZ)[0]
    fr[FR_ARGST] = _seg(blob, base, P_ARGST)[0]
    fr[FR_RIO] = _seg(blob, base, P_RIO)[0]
    fr[FR_FZ] = _seg(blob, base, P_FUSE)[0]


@njit(**OPTS)
def _aliases_ordered(recs, at, bufs, argsz):
    """Whether the waits of a stack (by argument) order every access to memory that arguments
    share: each overlap of a stored argument a with another argument b must be an exact alias (the
    same memory) where a is stored by one kernel k and no kernel but k touches b (an in-place
    update: runtime/in_place). recs[at:at + n]: per argument the kernel that stores it (-1 none,
    -2 several); recs[at + n:at + 2n]: the kernel that loads or stores it (-1 none, -2 several)."""
    n = bufs.shape[0] // 2
    addrs, numels = carray(ptr_i64(bufs.ctypes.data), n), carray(ptr_i64(bufs.ctypes.data + 8 * n), n)
    for a in range(n):
        k = recs[at + a]
        if k == -1 or numels[a] == 0:
            continue
        lo, hi = addrs[a], addrs[a] + numels[a] * argsz[a]
        for b in range(n):
            if b == a or numels[b] == 0:
                continue
            b_lo, b_hi = addrs[b], addrs[b] + numels[b] * argsz[b]
            if b_lo < hi and lo < b_hi:
                touched_by = recs[at + n + b]
                if k < 0 or b_lo != lo or b_hi != hi or (touched_by != -1 and touched_by != k):
                    return False
    return True


@njit(**OPTS)
def run_stack(chain, tab, bufs, recs_addr):
    """This thread's part of a stacked launch (abi.STACK; records at recs_addr, the kernels' blobs
    back to back in `chain`). Each kernel's units are claimed from its own counter; a thread goes
    on to the next kernel as soon as nothing of this one is left to claim, except where the next
    one waits (G_WAIT; every kernel where a stored argument overlaps another beyond an in-place
    update: _aliases_ordered) until every kernel since the last wait is done. A kernel that
    failed (its S_ERR) stops the launch at the next wait. Returns this thread's error code (0:
    none), also stored at G_ERR."""
    nk = carray(ptr_i64(recs_addr), 1)[G_NK]
    recs = carray(ptr_i64(recs_addr), G_REC + G_WIDTH * nk + bufs.shape[0])   # lines, then 2 words an argument
    base0 = chain.ctypes.data
    ordered = _aliases_ordered(recs, G_REC + G_WIDTH * nk, bufs,
                               carray(ptr_i64(_seg(chain, base0, P_ARGSZ)[0]), bufs.shape[0] // 2))
    first = 0
    at = 0
    for k in range(nk):
        r = G_REC + G_WIDTH * k
        if k > first and (recs[r + G_WAIT] != 0 or not ordered):
            for p in range(first, k):
                rp = recs_addr + 8 * (G_REC + G_WIDTH * p)
                while atomic_load(rp + 8 * S_DONE) < atomic_load(rp + 8 * G_UNITS):
                    pause()
                if atomic_load(rp + 8 * S_ERR) != 0:
                    return 0   # the failing kernel's threads report its error
            first = k
        kb = carray(ptr_i64(base0 + 8 * at), chain[at + H_LEN])
        units = recs[r + G_UNITS]
        if atomic_load(recs_addr + 8 * (r + S_NEXT)) < units:   # else nothing is left to claim
            err = _run_kernel(0, units, kb, base0 + 8 * at, tab, bufs, carray(ptr_i64(recs_addr + 8 * r), S_CHUNK + 1))
            if err != 0:
                atomic_store(recs_addr + 8 * G_ERR, err)
                return err
        at += kb[H_LEN]
    return 0


@njit(**OPTS)
def _stack_join(recs_addr):
    """The launching thread's end of a stacked launch shared with workers: claims every unit no
    one has claimed (a worker that takes the job late, or goes on after a failed kernel, finds
    nothing left to run), lowers each kernel's units to what was claimed (so no thread waits for
    more), and returns when every claimed unit is done."""
    nk = carray(ptr_i64(recs_addr), 1)[G_NK]
    for k in range(nk):
        rp = recs_addr + 8 * (G_REC + G_WIDTH * k)
        units = atomic_load(rp + 8 * G_UNITS)
        claimed = min(atomic_add(rp + 8 * S_NEXT, units), units)
        atomic_store(rp + 8 * G_UNITS, claimed)
        while atomic_load(rp + 8 * S_DONE) < claimed:
            pause()


@njit(cache=True, **OPTS)
def run_units(u0, u1, blob, tab, bufs, sched, wait):
    """Run work units [u0, u1) of the kernel packed in `blob` on the calling thread (releases the
    GIL); tab: the VM table (host/pieces); bufs: the n buffer addresses, then their n element counts.

    u1 < 0: `blob` is a chain of packed kernels back to back (host/desc._chain), each run whole, in
    order, on this thread (one call for a launch of small kernels: numba's dispatch costs more
    than a small kernel); the chain stops at the first error. u0 == STACK: `blob` is the chain of
    a stacked launch whose records are at address u1 (run_stack; with the workers sched lists
    when `wait`).

    wait (the launching thread of a parallel kernel): first posts the job to the spinning workers
    that sched lists, returns when every unit is done (jit/sync). u0 == WORKER: `blob` is a
    worker's mailbox; runs the jobs posted to it until u1 TSC ticks pass without one. u0 ==
    TSC_NOW: returns the time-stamp counter."""
    if u0 == TSC_NOW:
        return tsc()
    worker = u0 == WORKER
    mb = blob.ctypes.data
    B, F, S, T = _raw(blob), _raw(bufs), _raw(sched), _raw(tab)
    lo, hi = u0, u1
    if wait:
        post_all(S, B, F, u0, u1)
    at = 0
    err = 0
    while True:
        if worker and at == 0:
            if not await_post(mb, u1):
                return 0
            B = carray(ptr_i64(blob[MB_BLOB]), blob[MB_BLOB_N])
            F = carray(ptr_i64(blob[MB_BUFS]), blob[MB_BUFS_N])
            S = carray(ptr_i64(blob[MB_SCHED]), blob[MB_SCHED_N])
            lo, hi = blob[MB_U0], blob[MB_U1]
            blob[MB_TAKEN] += 1
        if lo == STACK:
            err = run_stack(B, T, F, hi)
            at = B.shape[0]
        else:
            base = B.ctypes.data + 8 * at
            kb = carray(ptr_i64(base), B[at + H_LEN])
            a = lo if hi >= 0 else 0
            b = hi if hi >= 0 else kb[H_UNITS]
            if b > a:
                err = _run_kernel(a, b, kb, base, T, F, S)
            at += kb[H_LEN]
        if hi >= 0 or err != 0 or at >= B.shape[0]:
            if not worker:
                break
            atomic_store(mb + 8 * MB_STATE, SPINNING)   # a worker's errors are in its job's sched
            at = 0
    if wait and S.shape[0] > S_CHUNK:   # the launching thread returns when every unit is done
        if u0 == STACK:
            _stack_join(u1)
        else:
            sp = S.ctypes.data
            while atomic_load(sp + 8 * S_DONE) < u1 - u0:
                pass
        retract_all(S)
    return err
