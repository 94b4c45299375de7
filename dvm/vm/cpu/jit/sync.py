"""Atomics and the worker mailbox of the CPU VM's threads (compiled code, no GIL).

A worker that has finished a job spins for a short while (DVM_SPIN_US) on its mailbox before it
goes back to sleep on the Python queue: a launch that comes within that window hands the worker
its job through memory instead of a kernel wake-up, which costs as much as a 256 K-element
kernel's whole run. After the first SPIN_ALONE-th of that window the spin calls the mailbox's
MB_YIELD function (sched_yield) at each turn: in a model the next op is often PyTorch's, whose
threads would otherwise wait for the spinning worker's time slice on a core they need, while
back-to-back launches come within the first part.

Mailbox: one int64 row per worker (MB_WIDTH words, so two workers never share a cache line);
MB_TAKEN counts the jobs the worker took from it. Its state word moves only by compare-and-swap,
so exactly one side wins each race:

  SLEEPING --(worker, woken by the queue)--> SPINNING
  SPINNING --(launching thread: job fields written first)--> POSTED
  POSTED   --(worker)--> TAKEN --(worker, job done)--> SPINNING
  POSTED   --(launching thread, all units done, job never taken)--> SPINNING
  SPINNING --(worker, spin time over)--> SLEEPING

A worker that took a job after its units were all claimed finds nothing left to run (units are
claimed from the job's atomic counter), so a late worker costs nothing; the launching thread
keeps the job's arrays alive until it posts that worker's next job (host/threads.Workers).
"""
from __future__ import annotations

from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from ..abi import (MB_BLOB, MB_BLOB_N, MB_BUFS, MB_BUFS_N, MB_SCHED, MB_SCHED_N, MB_U0, MB_U1, MB_WIDTH,
                   MB_YIELD, POSTED, SLEEPING, SPINNING, SPIN_ALONE, S_NPOST, S_POST, TAKEN)
from .bits import OPTS, ptr_i64


def _i64_ptr(builder, addr):
    return builder.inttoptr(addr, ir.PointerType(ir.IntType(64)))


@intrinsic
def atomic_add(typingctx, addr, val):
    """*(int64*)addr += val atomically (sequentially consistent); returns the old value."""
    if not (isinstance(addr, types.Integer) and isinstance(val, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _i64_ptr(builder, args[0]), args[1], "seq_cst")
    return types.int64(addr, val), codegen


@intrinsic
def atomic_load(typingctx, addr):
    """*(int64*)addr, read atomically (acquire): no cache-line write, unlike an RMW of 0."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_i64_ptr(builder, args[0]), "acquire", 8)
    return types.int64(addr), codegen


@intrinsic
def atomic_store(typingctx, addr, val):
    """*(int64*)addr = val (release: every earlier write is visible first)."""
    if not (isinstance(addr, types.Integer) and isinstance(val, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], _i64_ptr(builder, args[0]), "release", 8)
        return context.get_dummy_value()
    return types.none(addr, val), codegen


@intrinsic
def cas(typingctx, addr, old, new):
    """If *(int64*)addr == old, set it to new (sequentially consistent); True if it did."""
    if not all(isinstance(t, types.Integer) for t in (addr, old, new)):
        return None

    def codegen(context, builder, sig, args):
        res = builder.cmpxchg(_i64_ptr(builder, args[0]), args[1], args[2], "seq_cst", "seq_cst")
        return builder.extract_value(res, 1)
    return types.boolean(addr, old, new), codegen


@intrinsic
def tsc(typingctx):
    """The CPU's time-stamp counter (x86 rdtsc: a constant rate on CPUs with constant_tsc, as this
    machine's; calibrated against perf_counter by host/threads._tsc_per_us through the core's TSC_NOW mode)."""
    def codegen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic("llvm.x86.rdtsc", (), ir.FunctionType(ir.IntType(64), ()))
        return builder.call(fn, ())
    return types.int64(), codegen


@intrinsic
def pause(typingctx):
    """The spin-wait hint (x86 `pause`): yields the core's pipeline to its sibling while waiting."""
    def codegen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", (), ir.FunctionType(ir.VoidType(), ()))
        builder.call(fn, ())
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def call_void(typingctx, addr):
    """(*(int (*)(void)) addr)(): a C function of no arguments, by address."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return context.get_dummy_value()
    return types.none(addr), codegen


@njit(**OPTS)
def await_post(mb, ticks):
    """Spin on the mailbox at address mb for up to `ticks` TSC ticks, yielding the core at each
    turn (MB_YIELD) after the first ticks / SPIN_ALONE: True with the job taken (state TAKEN), or
    False with the worker gone to sleep (state SLEEPING)."""
    yield_fn = carray(ptr_i64(mb), MB_WIDTH)[MB_YIELD]
    alone = ticks // SPIN_ALONE
    t0 = tsc()
    while True:
        s = atomic_load(mb)
        if s == POSTED:
            if cas(mb, POSTED, TAKEN):
                return True
        elif tsc() - t0 >= ticks:
            if cas(mb, SPINNING, SLEEPING):
                return False
        pause()
        if yield_fn != 0 and tsc() - t0 >= alone:
            call_void(yield_fn)


@njit(**OPTS)
def post_all(sched, blob, bufs, u0, u1):
    """Hand units [u0, u1) of the job (blob, bufs, sched: raw views, see jit/entry.run_units) to
    the spinning workers whose mailboxes sched lists: the job's fields first, then the state (a
    compare-and-swap, which orders the field stores before it). A worker that went to sleep
    meanwhile is not posted to and does not help. Only the launching thread writes a listed
    mailbox's fields: a SPINNING or SLEEPING worker does not read them."""
    if sched.shape[0] > S_POST:
        for k in range(sched[S_NPOST]):
            mb = sched[S_POST + k]
            m = carray(ptr_i64(mb), MB_WIDTH)
            m[MB_BLOB], m[MB_BLOB_N] = blob.ctypes.data, blob.shape[0]
            m[MB_BUFS], m[MB_BUFS_N] = bufs.ctypes.data, bufs.shape[0]
            m[MB_SCHED], m[MB_SCHED_N] = sched.ctypes.data, sched.shape[0]
            m[MB_U0], m[MB_U1] = u0, u1
            cas(mb, SPINNING, POSTED)


@njit(**OPTS)
def retract_all(sched):
    """After the launch: withdraw the job from workers that never took it."""
    if sched.shape[0] > S_POST:
        for k in range(sched[S_NPOST]):
            cas(sched[S_POST + k], POSTED, SPINNING)
