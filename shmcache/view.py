"""Zero-copy reads: ``SharedCache.view(key)`` pins an entry and hands out a read-only numpy array (or, for a bytes
value, a memoryview) over its bytes in the segment, with no copy.

Pinning. The pin is a shared open-file-description lock on byte ``ofd.PIN_BASE + e`` of the segment's file (``e``
being the entry slot), taken under the cache lock through a description the view opens for itself, plus a flag in
the entry's pins column. Whoever would move, overwrite or drop a flagged entry (eviction, compaction, put, delete,
expiry, clear) asks the kernel whether anyone still holds that byte (``Table.pinned``): if so the entry stays as it
is; if not, the flag is stale and is cleared. The kernel drops the lock when the description is closed -- when the
view's memory is no longer referenced, or at the latest when the process dies, SIGKILL included -- so a pin can
never outlive its holder, and nothing needs to be written when it ends.

Lifetime. The pin lasts as long as any Python object references the pinned memory, not merely until the ``with``
block ends: the arrays handed out, and any slice or ``np.asarray`` of them, all keep a private owner array alive,
and the description is closed when that owner is garbage collected. So a view's bytes are never reused while
something can still read them. The object returned by ``__enter__`` is revoked when the block ends: a memoryview
is released (using it raises ValueError), and an array is turned, in place, into an empty array of the
``CLOSED`` dtype, on which arithmetic raises and indexing finds nothing. An array derived from it inside the block
(a slice, a reshape) stays valid, and the entry pinned, until it is dropped; so does whatever holds the array
itself (a memoryview of it, a tensor from ``torch.from_numpy``), which close() tells from the ``with`` target's own
name by counting references. (On CPython before 3.13 that count reads the caller's ``f_locals``, a snapshot the
frame then keeps until it returns or is read again: an array derived in the same function may hold its pin until
then. Never longer than something could read it; sometimes longer than needed.)
"""

from __future__ import annotations

import functools
import os
import sys
import weakref

import numpy as np

from . import ofd
from .lock import signals_deferred
from .errors import ClosedError
from .codec import TAG_ARRAY, TAG_BYTES, array_layout

_ALL: weakref.WeakSet = weakref.WeakSet()  # every handle's PinDescriptions, for the fork hooks
os.register_at_fork(after_in_parent=lambda: [pins._forked_parent() for pins in list(_ALL)],
                    after_in_child=lambda: [pins._forked_child() for pins in list(_ALL)])

CLOSED = np.dtype([("closed_shmcache_view", "V1")])  # what a revoked array becomes
_CLOSED_STATE = (1, (0,), CLOSED, False, b"")


NO_FD = -1


class Pin:
    """One view's pin: the description it holds (``fd``), the byte locked through it once known (``byte``), the
    process that took it (``pid``). Made before anything is taken, so that whoever is cut short finds what to
    release; released at most once (``fd`` is NO_FD after)."""

    __slots__ = ("fd", "byte", "pid", "ended")

    def __init__(self) -> None:
        self.fd = NO_FD
        self.byte = -1
        self.pid = os.getpid()
        self.ended = None  # the weak reference that reports the view's memory gone (kept alive here)


class PinDescriptions:
    """The open file descriptions one cache handle pins through: one per open view, so that two views of the same
    entry hold two locks (the locks of one description on one byte would merge, and the first release would drop
    both). Idle descriptions are kept for the next view: opening one costs more than the rest of a view.

    Interrupts. An exception may be raised at any bytecode, also inside a garbage collector's callback (where it is
    printed and dropped). Every change of what is held (take, release) runs with asynchronous signals held back; the
    end of a view's memory is recorded by a weak reference whose callback is a C method (``_ended.__setitem__``:
    no bytecode, so nothing can cut it), and the release itself runs from ``drain``, called by a second callback, at
    the end of every ``with`` block, by each new view and by close(). So a release cut short is finished by the next
    of these, and a descriptor is forgotten before it is closed (never closed twice: its number may be reused).

    Fork. A description lives until every process holding it has closed it, and so does any lock taken through it.
    So: a child closes its copies of the idle descriptions at once; a view the child inherited open only closes the
    child's copy when it goes (its pin knows the pid that took it), so a child never drops its parent's pin; and the
    parent never lends again a description that was out at the fork (the child may still hold it: a pin taken
    through it later would outlive the parent), it closes it on release instead.
    """

    def __init__(self, segment_fd: int) -> None:
        self._path = f"/proc/self/fd/{segment_fd}"
        self._idle: list[int] = []
        self._out: dict[int, Pin] = {}  # lent to open views
        self._shared: set[int] = set()  # lent when this process forked: closed, not reused, on release
        self._ended: dict[Pin, object] = {}  # pins whose memory is gone, to release (filled from C, see above)
        self._closed = False
        _ALL.add(self)

    def _forked_parent(self) -> None:
        self._shared |= set(self._out)

    def _forked_child(self) -> None:
        idle, self._idle, self._out, self._shared = self._idle, [], {}, set()
        for fd in idle:
            os.close(fd)

    def take(self, pin: Pin) -> None:
        """Lend ``pin`` a description holding no lock (the caller locks one byte through it and records the byte in
        ``pin``; ``release`` ends it, whatever was done)."""
        if self._closed:
            raise ClosedError("operation on a closed cache", what="view")
        if self._ended:
            self.drain()
        # Crash window: between getting the descriptor and recording it an exception would leak it: held back.
        with signals_deferred():
            fd = self._idle.pop() if self._idle else os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
            pin.fd = fd
            self._out[fd] = pin

    def watch(self, owner, pin: Pin) -> None:
        """Release ``pin`` once ``owner`` is garbage collected. Ordering: the drain callback is made first, so
        that it runs after the recording one (CPython calls the newest weak reference's callback first)."""
        _watch(owner, self.drain)
        pin.ended = weakref.ref(owner, functools.partial(self._ended.__setitem__, pin))

    def drain(self) -> None:
        """Release the pins whose memory is gone."""
        with signals_deferred():
            while self._ended:
                pin = next(iter(self._ended))
                self.release(pin)
                del self._ended[pin]

    def release(self, pin: Pin) -> None:
        """End ``pin``: unlock its byte (closing its description if the byte is unknown); a no-op the second time."""
        with signals_deferred():
            fd = pin.fd
            if fd == NO_FD:
                return
            pin.fd = NO_FD
            if pin.pid != os.getpid():
                os.close(fd)  # a copy inherited through fork: the pin is the parent's, and stays
                return
            self._out.pop(fd, None)
            if pin.byte >= 0:
                ofd.unlock(fd, pin.byte)
            if pin.byte < 0 or self._closed or fd in self._shared:
                self._shared.discard(fd)
                os.close(fd)  # closing drops whatever lock it took
            else:
                self._idle.append(fd)

    def close(self) -> None:
        """Close the idle descriptions; those of views still open are closed when the views go."""
        self._closed = True
        self.drain()
        with signals_deferred():
            while self._idle:
                fd = self._idle.pop()
                os.close(fd)


_WATCHES: dict = {}  # id -> the weak references below, alive until their callback runs (ndarrays do not hash)


def _watch(obj, callback) -> weakref.ref:
    """Call ``callback()`` when ``obj`` is garbage collected (a bare weak reference: a fraction of the cost of a
    ``weakref.finalize``). Returns the reference; taking it out of ``_WATCHES`` cancels the call."""
    def fire(ref) -> None:
        if _WATCHES.pop(id(ref), None) is not None:
            callback()

    ref = weakref.ref(obj, fire)
    _WATCHES[id(ref)] = ref
    return ref


def _nothing(*_) -> None:
    pass


class View:
    """A pinned entry's value, zero-copy: ``with cache.view(key) as arr:``. Returned by ``SharedCache.view``."""

    def __init__(self, value: memoryview, pins: PinDescriptions, pin: Pin) -> None:
        """``value``: a read-only view of the pinned entry's encoded value (tag byte first); ``pin``: released
        through ``pins`` once the memory is no longer referenced. Raises TypeError for a value of another kind, and
        ValueError for a malformed array (the caller then releases the pin)."""
        tag = value[0]
        if tag == TAG_ARRAY:
            dtype, shape, data0 = array_layout(value)
        elif tag != TAG_BYTES:
            raise TypeError("view() reads numpy arrays and bytes values without copying; use get() for others")
        # ``owner`` is the one object that references the pinned memory directly: every array or memoryview handed
        # out derives from it (numpy collapses a view's base to it), so it is garbage collected -- and the pin
        # released -- only after the last of them.
        owner = np.frombuffer(value, dtype=np.uint8)
        self._keep = None
        if tag == TAG_BYTES:
            self._obj = memoryview(owner[1:])
        else:
            self._obj = owner[data0:].view(dtype).reshape(shape)
            # Revoking the array (close) drops its reference to ``owner``; whatever still points into its memory
            # through the array itself (a memoryview of it, a tensor from torch.from_numpy) must keep ``owner``
            # alive, and holds the array: so ``owner`` lives as long as the array, unless close() finds nothing
            # but the ``with`` target's own name referring to it.
            self._keep = _watch(self._obj, functools.partial(_nothing, owner))  # holds owner while obj lives
        self._pins = pins
        pins.watch(owner, pin)  # last: until here, the caller ends the pin on error (a second release is a no-op)
        self._open = True

    def __enter__(self):
        if not self._open:
            raise ValueError("this view is closed; take a new one with cache.view(key)")
        return self._obj

    def __exit__(self, *exc) -> None:
        self._close(sys._getframe(1))
        self._pins.drain()  # in case a release was cut short

    def close(self) -> None:
        """Revoke the object handed out; the pin goes when nothing references the memory any more."""
        self._close(sys._getframe(1))

    def _close(self, frame) -> None:
        """``frame``: the caller's, where the ``with`` statement bound the object handed out."""
        if not self._open:
            return
        self._open = False
        obj, self._obj = self._obj, None
        if isinstance(obj, memoryview):
            try:
                obj.release()
            except BufferError:
                pass  # exported (np.frombuffer of it...): it stays valid, and the entry pinned, while that lives
            return
        # References beyond this function's and the caller's names: someone else holds the array itself.
        others = sys.getrefcount(obj) - 2
        if others:
            others -= sum(1 for v in frame.f_locals.values() if v is obj)
        obj.__setstate__(_CLOSED_STATE)  # in place: every name bound to it now sees an empty, unusable array
        if others <= 0:
            _WATCHES.pop(id(self._keep), None)
        self._keep = None
