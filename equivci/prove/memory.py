"""The memory a saturation pass takes, measured, and whether the next one fits (Linux: /proc/self).

Rows are the e-graph's own memory, not a pass's: matching a rule that joins two growing tables
costs their product, so a pass's peak grows with the square of the e-graph's growth (measured on
split 17's pipeline: rows x1.97 a pass, the pass's peak over its start x3.7 to x4: 83 MB, 344 MB,
1.3 GB, 4.7 GB, then past a 17.7 GiB cap, from 0.9M rows under a budget of 4M)."""

from __future__ import annotations

import os
import resource

_STATUS = "/proc/self/status"
# A pass may be predicted to reach at most this share of the memory cap: the prediction was within
# 10 % of the measured peaks, and the rest is room for an error twice as large.
SHARE = 0.5


def cap() -> int:
    """The bytes this process may map: its address-space limit (the verifier child's memory cap,
    EQUIVCI_VERIFY_MEMORY, or a `ulimit -v`), else three quarters of the machine's memory."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return soft
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.75)


def _status(field: str) -> int | None:
    """A size field of /proc/self/status in bytes, None where there is none."""
    try:
        with open(_STATUS) as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PassMeter:
    """The peak resident memory of one pass above the resident memory it started from. Read off the
    process's peak (getrusage), which a growing pass raises: where the pass stayed under an earlier
    peak, what it kept is the measure (a lower bound). The peak is never reset (/proc's clear_refs
    would do it, and hide the process's true peak from the rusage its parent reads)."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.peak = 0

    def begin(self) -> None:
        self.start, self.peak = _status("VmRSS"), _peak()

    def extra(self) -> int | None:
        """The peak of the pass since begin() above its start, in bytes; None if not measured."""
        now, peak = _status("VmRSS"), _peak()
        if self.start is None or now is None:
            return None
        return max(0, (peak if peak > self.peak else now) - self.start)


def _peak() -> int:
    """The process's peak resident memory so far, in bytes (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def next_pass(extra: int | None, growth: float) -> int | None:
    """The mapped bytes the process is predicted to reach in a pass after one that took `extra`
    bytes above its start and grew the e-graph `growth`-fold: its work grows with the square."""
    size = _status("VmSize")
    return None if extra is None or size is None else size + int(extra * growth * growth)


def fits(predicted: int | None, limit: int) -> bool:
    """Whether a pass predicted to reach `predicted` mapped bytes stays within SHARE of `limit`."""
    return predicted is None or predicted <= SHARE * limit
