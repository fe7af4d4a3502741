"""The write side of the seqlock that gets and views without the lock validate what they read against (the
compiled section's seq_open and seq_close in _core_lock.c are its twins; docs/design.md, "Reads without the lock").

Header word ``seq`` is odd from a hold's first write or pin query until the hold ends with nothing half-done
(``dirty`` 0). A reader reads it, then what it needs, then the word again: any change, or an odd word, voids what it
read. Under lru nobody reads without the lock and ``seq`` stays 0: callers skip these under it (``seqlocked``).
"""

from __future__ import annotations

import threading

from .layout.dtypes import H_DIRTY, H_SEQ

_INT64_MAX = 2**63 - 1
# A full barrier from Python: the compare-and-swap of a lock's acquire is a locked instruction on x86-64 (mfence's
# effect), taken or not. The only way to order a store before a later load without a compiled call.
_BARRIER = threading.Lock()


def _fence() -> None:
    if _BARRIER.acquire(False):
        _BARRIER.release()


def open_seq(h) -> None:
    """Make header word ``seq`` odd before a hold's first write or pin query, and fence: readers without the lock
    validate what they read against it. Callers skip it under lru. (twin: _core_lock.c seq_open)"""
    s = h[H_SEQ]
    if not s & 1:
        h[H_SEQ] = s + 1 if s < _INT64_MAX else -_INT64_MAX - 1  # wraps as the C's unsigned step does
        _fence()


def close_seq(h) -> None:
    """The hold ends: ``seq`` even again unless an update was cut short (``dirty`` set). On x86-64 stores are seen
    in program order, so no fence is needed before this one. (twin: _core_lock.c seq_close)"""
    s = h[H_SEQ]
    if s & 1 and not h[H_DIRTY]:
        h[H_SEQ] = s + 1 if s < _INT64_MAX else -_INT64_MAX - 1
