"""Where lazy regions are entered, and whether an entry records: measured, per site.

A site is a `with dvm.lazy():` statement (its code location) or a function decorated with
dvm.lazy. Its first SITE_WARM entries record (the plans they compile learn their own DVM-vs-eager
choice meanwhile, lazy_flush.Timing); then entries alternate between recording and running
eagerly (lazy mode off: no dispatch mode at all), each timed end to end, until both have
SITE_TRIALS times; the faster (median of the last SITE_WINDOW times) is taken from then on, and
the other is timed again after `period` entries. Only steady-state entries are timed: the first
entry of a kind after one of the other kind is a lead-in, run untimed (switching costs the
first entry more, up to several times a recording's usual time, and a probe timed across the
switch would favour the kind already chosen). A probe slower than the chosen kind's median
doubles the period (up to SITE_PERIOD_MAX), a faster one starts the measurement again (windows
cleared: times from before may be stale, e.g. from a plan's own trials). A recording entry that recorded
nothing at all (every call too small, or none recordable), or past the warm-up fused nothing on
DVM (its plans measured their eager replay faster), chooses eager at once. So a region
whose fusion does not pay for its recording runs eagerly, at the cost of the probes.
Only the adaptive policy consults sites; regions nested in a recording region are part of it.
"""
from __future__ import annotations

import threading

from ..runtime import counters

SITE_WARM = 8            # recording entries before any timing (covers a plan's DVM/eager trials)
SITE_TRIALS = 3          # timed entries of each kind before the first choice
SITE_WINDOW = 5          # times kept per kind (median)
SITE_PERIOD_FIRST = 16   # entries between probes of the other kind, doubled per confirmation
SITE_PERIOD_MAX = 1024
SITES_MAX = 4096

RECORD, RECORD_TIMED, SKIP, SKIP_TIMED = range(4)

_SITES: dict = {}
_LOCK = threading.Lock()


def _median(xs: list) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


class Site:
    __slots__ = ("entries", "lazy_t", "eager_t", "choice", "countdown", "skips", "period", "warm", "probing",
                 "code", "last")

    def __init__(self, code=None):
        self.code = code                   # a `with` statement's code object (its key's check)
        self.entries = 0                   # entries decided here (the fast-path skips are not counted)
        self.lazy_t: list = []
        self.eager_t: list = []
        self.choice: bool | None = None    # None while measuring; True: record; False: run eagerly
        self.countdown = 0                 # recording entries until the next probe of eager
        self.skips = 0                     # eager entries until the next probe of recording (the
        self.period = SITE_PERIOD_FIRST    # callers' fast paths count these down themselves)
        self.warm = SITE_WARM
        self.probing = False
        self.last = True                   # the kind of the last entry (True: recorded)

    def action(self) -> int:
        """What this entry does (RECORD*, SKIP*)."""
        self.entries += 1
        if self.skips:
            self.skips -= 1
            self.last = False
            return SKIP
        if self.warm:
            self.last = True
            return RECORD
        if self.choice is None:
            return self._timed(len(self.lazy_t) < SITE_TRIALS and len(self.lazy_t) <= len(self.eager_t))
        if self.countdown:
            self.countdown -= 1
            return self._timed(True)
        act = self._timed(not self.choice)
        self.probing = act in (RECORD_TIMED, SKIP_TIMED)
        return act

    def _timed(self, record: bool) -> int:
        """A timed entry of the kind, or its untimed lead-in when the last entry was the other kind."""
        lead_in = record is not self.last
        self.last = record
        if record:
            return RECORD if lead_in else RECORD_TIMED
        return SKIP if lead_in else SKIP_TIMED

    def observe(self, recorded: bool, seconds: float | None, recorded_ops: bool = True, fused: bool = True) -> None:
        """An entry's outcome: recorded or eager, its time (None: untimed), whether it recorded
        any op and whether any of its flushes ran on DVM. An entry that recorded nothing, or
        (past the warm-up, when the plans have timed both of their paths) fused nothing, cannot
        be faster than eager: eager is chosen without timing."""
        if recorded and (not recorded_ops or (not fused and not self.warm)):
            self.warm, self.probing = 0, False
            self._decided(False)
            return
        if recorded and self.warm:
            self.warm -= 1
            return
        if seconds is None:
            return
        times = self.lazy_t if recorded else self.eager_t
        times.append(seconds)
        if len(times) > SITE_WINDOW:
            del times[0]
        if self.choice is None:
            if len(self.lazy_t) >= SITE_TRIALS and len(self.eager_t) >= SITE_TRIALS:
                self._decided(_median(self.lazy_t) < _median(self.eager_t))
        elif self.probing:
            self.probing = False
            chosen = self.lazy_t if self.choice else self.eager_t
            # the other kind won its probe, or the chosen kind was never timed (eager chosen
            # untimed because nothing fused, and now a probe fused something): measure both afresh
            if not chosen or seconds < _median(chosen):
                del times[:-1]
                other = self.eager_t if recorded else self.lazy_t
                del other[:]
                self.choice, self.period, self.countdown = None, SITE_PERIOD_FIRST, 0
            else:
                self._decided(self.choice)

    def _decided(self, record: bool) -> None:
        if record == self.choice:
            self.period = min(2 * self.period, SITE_PERIOD_MAX)
        else:
            self.period = SITE_PERIOD_FIRST
            counters.bump("lazy_sites_chose_lazy" if record else "lazy_sites_chose_eager")
        self.choice = record
        self.countdown, self.skips = (self.period, 0) if record else (0, self.period)
        if not record:
            self.last = False              # the skips run eagerly without asking action()


def site_at(frame) -> Site:
    """The site of a `with dvm.lazy():` statement executing in frame. Keyed by the code object's
    id (hashing a code object hashes its contents: ~0.4 us); the site keeps the code object, so
    an id reused by another code object gets a site of its own."""
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    site = _SITES.get(key)
    if site is None or site.code is not code:
        with _LOCK:
            if len(_SITES) >= SITES_MAX:
                _SITES.clear()
            site = _SITES[key] = Site(code)
    return site
