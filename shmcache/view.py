"""Zero-copy reads: ``SharedCache.view(key)`` pins an entry and hands out a read-only numpy array (for a bytes value,
a memoryview; for a tensor value, a tensor) over its bytes in the segment, with no copy.

Pinning. The pin is a shared open-file-description lock on byte ``ofd.PIN_BASE + e`` of the segment's file (``e``
being the entry slot), taken under the cache lock through a description the view opens for itself, plus a flag in
the entry's pins column. Whoever would move, overwrite or drop a flagged entry (eviction, compaction, put, delete,
expiry, clear) asks the kernel whether anyone still holds that byte (``Table.pinned``): if so the entry stays as it
is; if not, the flag is stale and is cleared. The kernel drops the lock when the description is closed -- when the
view's memory is no longer referenced, or at the latest when the process dies, SIGKILL included -- so a pin can
never outlive its holder, and nothing needs to be written when it ends.
Under s3fifo and keep the compiled section pins without the lock, and in a word of the handle's reader slot rather
than through a description where one is free (``readers.py``, ``_core_unlocked.c``); ``Table.pinned`` counts such a
word while the slot's kernel lock is held, so that pin too ends with its process.

Lifetime. A view is its export: the pin lasts exactly as long as some Python object references the pinned memory,
no shorter and no longer. The arrays handed out, and any slice, reshape, ``np.asarray``, memoryview or tensor made
of them, all keep a private owner alive, and the pin ends when that owner is garbage collected: in C, as the
compiled Lease is freed, or here, through a weak reference's callback, with no Python code between the memory going
and the pin ending. So a view's bytes are never reused while something can still read them. When the ``with`` block
ends, what ``__enter__`` handed out is let go of: a memoryview is released (using it raises ValueError), and an
array or a tensor is simply dropped by the view. An array still bound to a name after its block therefore keeps its
entry pinned until that name goes (``del arr``, or ``arr.copy()`` for what must outlive the block). That costs no
writer anything: a put, delete or clear of a pinned key succeeds at once (the entry is held aside for the view,
``Table.detach``); it keeps the bytes out of use, counted in ``stats().held_bytes``. Nothing here reads a
caller's frame, counts references or writes an array's fields.

Tensors. torch has no read-only tensors: a tensor over the segment's own (writable) mapping could be written through,
changing the value under every other process. So a tensor value's bytes are mapped a second time, read-only
(PROT_READ, through a description of their own that takes no lock), and the tensor is built over that mapping: a
write through it, or through ``t.numpy()``, faults (SIGSEGV) instead of changing the cached value; ``t.clone()`` is a
writable copy. torch warns once per process that the array is not writable: that is the truth, and is left to show.
As for an array, a tensor's pin ends when the tensor, and every tensor sharing its memory, is garbage collected
(each holds the array the tensor was made from, which holds the mapping and the pin; torch code outside Python's
reference counts, autograd's saved tensors or a DLPack capsule, holds it too): ``del`` the name after the block to
end the pin there.

The compiled build. ``shmcache/_view.c`` does what this module does, in C, and this module is its reference (the
test suite runs on both): ``Core.view`` pins through a description of a ``_core.Pins`` (this handle's pool), hands
the pin to a ``_core.Lease`` that owns the description, exports the value's bytes and unlocks in its deallocation (so
the arrays built over it end the pin as they go, with no Python code between), and for a stored value this handle
checked before builds the array and returns a ``_core.View``, whose close() lets go as ``PyView``'s does (its twin).
The first view of a value (its checksum and layout), a tensor's view and a call the C hands over go through
``first_look``.
"""

from __future__ import annotations

import fcntl
import functools
import io
import itertools
import mmap
import operator
import os
import sys
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from . import compiled, ofd, tensors
from .errors import ClosedError
from .codec import TAG_ARRAY, TAG_BYTES, TAG_TENSOR, array_layout, body_checksum

_ALL: weakref.WeakSet = weakref.WeakSet()  # every handle's PinDescriptions, for the fork hooks
# token -> every Pin handed over (PinDescriptions.hand_over) whose memory lives: a view outlives its handle, and its
# pin with it; the pin leaves as its memory goes (a weak reference's callback, in C), or as it is released.
_HELD: dict[int, Pin] = {}
# Forking is marked twice, before the fork and after it in the parent: a pin taken by another thread while a fork
# handler let it run is older than the second mark (see PinDescriptions: Fork).


def _fork_hook(step: str):
    """A fork hook: ``step`` of every handle's pins (PinDescriptions, or the compiled Pins), then the views out."""
    each = operator.methodcaller(step)

    def hook() -> None:
        for pins in list(_ALL):
            each(pins)
        _close_at_end()

    return hook


os.register_at_fork(before=_fork_hook("_forking"), after_in_parent=_fork_hook("_forked_parent"),
                    after_in_child=_fork_hook("_forked_child"))

_UNTRACKED = {"trackfd": False} if sys.version_info >= (3, 13) else {}  # mmap keyword arguments


_CLOSE = operator.methodcaller("close")
_TOKENS = itertools.count(1)  # next() is one C call: a pin's token, never reused (an id() can be)


class _Unlocker(weakref.ref):
    """A weak reference whose callback (``_CLOSE``) calls its ``close`` attribute: a ``functools.partial`` of
    ``fcntl.fcntl`` unlocking a pin's byte. Why: C calls from end to end, so no exception can be raised between the
    view's memory going and its pin ending, not even in the middle of a garbage collection."""

    __slots__ = ("close",)
    close: Any


def _close_at_end() -> None:
    """The fork hooks' part for the views out (of every handle, open or collected): each pin ends by closing its
    description as its memory goes, never by unlocking it (an unlock would end the other process's pin too; see
    PinDescriptions, Fork). A pin ``_end`` disarmed meanwhile (``close`` is ``int``) stays disarmed."""
    for pin in list(_HELD.values()):
        file, ended = pin.file, pin.ended
        if file is not None and ended is not None and ended[1].close is not int:
            ended[1].close = file.close


class Pin:
    """One view's pin: the description it holds (``file``, an io.FileIO), the byte locked through it once known
    (``byte``), the process that took it (``pid``). Made before anything is taken, so that whoever is cut short
    finds what to release; released at most once (``file`` is None after)."""

    __slots__ = ("file", "byte", "pid", "token", "ended", "epoch", "armed")

    def __init__(self) -> None:
        self.file: io.FileIO | None = None
        self.byte = -1
        self.pid = os.getpid()
        self.token = next(_TOKENS)
        # the weak references that end the pin when the view's memory goes (kept alive here)
        self.ended: tuple[weakref.ref, _Unlocker, weakref.ref] | None = None
        self.epoch = -1  # PinDescriptions' fork count when its description was taken
        self.armed = -1  # ...and when it was handed over (a view that existed at a fork is the child's too)


class PinDescriptions:
    """The open file descriptions one cache handle pins through: one per open view, so that two views of the same
    entry hold two locks (the locks of one description on one byte would merge, and the first release would drop
    both). Idle descriptions are kept for the next view: opening one costs more than the rest of a view.

    Interrupts. An exception may be raised at any bytecode, also inside a garbage collector's callback (where it is
    printed and dropped), and at the entry of any Python function, so a release written in Python can always be cut
    short before its first line; holding signals back (pthread_sigmask) would not prevent that, and costs ~8 us a
    bracket. Hence:

    - Each description is an ``io.FileIO``: it owns its descriptor from the open on, closes it at most once, and
      closes it in C when dropped. A description whatever code was cut short drops is closed, never leaked, and no
      descriptor number is ever closed twice (one the application reused would be closed).
    - Until the view is built and handed over (``hand_over``, view()'s last step), only view()'s frame references
      the pin: an exception unwinds it, and the description (and any lock taken through it) closes with it.
    - Once handed over, the end of the view's memory ends the pin in C (``_Unlocker``, which holds the
      description), and records it (another weak reference whose callback is ``_ended.__setitem__``); ``drain``,
      called at the end of every ``with`` block, by each new view and by close(), puts the description back in the
      pool. A drain cut short, or a view whose memory outlives its block, delays that (by a description held open
      until then), never the unlock. ``_HELD`` keeps the pin while its memory lives, so a view outlives its handle
      (collected or closed): its description then closes as the pin goes.

    Fork. A description lives until every process holding it has closed it, and so does any lock taken through it;
    but an unlock through a shared description ends the lock for every process that holds it. So: a child closes
    its copies of the idle descriptions at once; a view the child inherited open only closes the child's copy when
    its memory goes (the fork hooks turn its unlocker into the description's close, ``_close_at_end``), so a child
    never drops its parent's pin; and the parent, symmetrically, never unlocks a description that was out at the
    fork, it closes it as the memory goes (the same hooks, before the fork and after it): the pin then lasts until
    the child drops its copy of the view or exits, so the child never reads bytes reused under it, and no longer
    (the compiled Lease does the same in its dealloc). Nor does the parent lend such a description
    again (a pin taken through it later would outlive the parent). "Out"
    includes a description taken by a view still waiting for the lock in another thread: each pin records the fork
    count (``epoch``) when its description was taken, and one from before the last fork is closed, not lent again.
    """

    def __init__(self, segment_fd: int) -> None:
        self._path = f"/proc/self/fd/{segment_fd}"
        self._idle: list = []  # FileIO holding no lock
        self._out: dict[int, Pin] = {}  # token -> pin of a view handed over
        self._epoch = 0  # forks of this process since this handle opened (see Fork above)
        # slot -> ((version, offset, length, checksum), layout) of each stored value this handle's views checked
        # (the checksum policy: SharedCache.view; _core.Pins.viewed is the compiled build's)
        self.viewed: dict[int, tuple] = {}
        self._ended: dict[int, object] = {}  # tokens of pins whose memory is gone (filled from C, see above)
        self._closed = False
        _ALL.add(self)

    def forget(self) -> None:
        """Forget every stored value checked: the next view of each checks it again (benchmarks.views times it so)."""
        self.viewed.clear()

    def _forking(self) -> None:
        self._epoch += 1  # (the views out: _close_at_end, for every handle's at once)

    _forked_parent = _forking  # (the compiled Pins also ends the fork's window there)

    def _forked_child(self) -> None:
        # The inherited open views stay in _out: each closes the child's copy when the child drops it (pid check).
        idle, self._idle = self._idle, []
        self._epoch += 1
        for file in idle:
            file.close()

    def take(self, pin: Pin) -> int:
        """Lend ``pin`` a description holding no lock; returns its descriptor, through which the caller locks one
        byte (recorded in ``pin.byte``), then hands the pin over or drops it."""
        if self._closed:
            raise ClosedError("operation on a closed cache", what="view")
        if self._ended:
            self.drain()
        pin.epoch = self._epoch  # first: a fork from here on makes it older, never newer
        # Crash window: an exception between the pop (or the open) and the store drops the FileIO, which closes.
        pin.file = file = self._idle.pop() if self._idle else io.FileIO(self._path, "r+")  # close-on-exec, as Python
        return file.fileno()

    def hand_over(self, owner, pin: Pin) -> None:
        """End ``pin`` once ``owner`` is garbage collected: its byte is unlocked and its token recorded there, in C;
        its description goes back to the pool at the next ``drain``. The pin is registered last (until then an
        exception drops it, closing its description)."""
        pin.armed = self._epoch  # first: a fork from here on makes it older (and _close_at_end sees it in _HELD)
        unlocker = _Unlocker(owner, _CLOSE)
        file = pin.file
        if file is None:
            raise ValueError("hand_over: the pin holds no description")
        # Why the FileIO and not its number: the description lives as long as the unlocker can run, whoever drops
        # the pin first (the callbacks of an object's weak references all run, in C, each reference held meanwhile).
        unlocker.close = functools.partial(fcntl.fcntl, file, fcntl.F_OFD_SETLK, ofd.unlock_request(pin.byte))
        # (each callback is called with its reference: _HELD.pop takes it as the default of a pin gone already)
        pin.ended = (weakref.ref(owner, functools.partial(self._ended.__setitem__, pin.token)), unlocker,
                     weakref.ref(owner, functools.partial(_HELD.pop, pin.token)))
        self._out[pin.token] = pin
        _HELD[pin.token] = pin

    def drain(self) -> None:
        """Put back the descriptions of the pins whose memory is gone (their bytes are unlocked already)."""
        # Crash window: cut short anywhere, the token stays for the next drain (``_end`` is idempotent), and a
        # description ``_end`` had taken from its pin is closed as its last reference goes.
        while self._ended:
            token = next(iter(self._ended))
            pin = self._out.get(token)
            if pin is not None:
                # Ordering: the recording callback ran in the same C sequence as the unlocking one, with no bytecode
                # between (see hand_over), so the byte is unlocked already.
                self._end(pin, unlocked=True)
            self._ended.pop(token, None)  # (another thread's drain may have taken it)

    def release(self, pin: Pin) -> None:
        """End ``pin``: unlock its byte, or close its description if the byte is unknown; a no-op the second time."""
        self._end(pin, unlocked=False)

    def _end(self, pin: Pin, unlocked: bool) -> None:
        # Why no signal is held back (pthread_sigmask costs ~8 us a bracket, half a view): cut short at any bytecode,
        # this leaves either the pin as it was (to be ended again) or its description in a local name only, which
        # closes it (and drops its lock) as the exception unwinds; never a description leaked or closed twice.
        if pin.ended is not None:
            pin.ended[1].close = int  # disarmed first: the description may be lent again, or closed and reused
            # Invariant: a pin handed over is ended by whoever takes it out of _out (one dict call, indivisible):
            # drain in any thread and view()'s except clause may both try. (Not yet in _out: its FileIO closes as
            # the pin goes.)
            if self._out.pop(pin.token, None) is None:
                return
            _HELD.pop(pin.token, None)  # (its memory may live on: a release before the end)
        file, pin.file = pin.file, None
        if file is None:
            return
        if pin.pid != os.getpid():
            file.close()  # a copy inherited through fork: the pin is the parent's, and stays
            return
        if pin.byte >= 0 and not unlocked:
            if pin.armed >= 0 and pin.armed != self._epoch:
                file.close()  # a view that existed at a fork: the child's copy of it keeps the pin (see Fork)
                return
            ofd.unlock(file.fileno(), pin.byte)
        if pin.byte < 0 or self._closed or pin.epoch != self._epoch:
            file.close()  # closing drops whatever lock it took
        else:
            self._idle.append(file)

    def map_read_only(self, off: int, nbytes: int) -> tuple[mmap.mmap, int]:
        return map_read_only(self._path, off, nbytes)

    def close(self) -> None:
        """Close the idle descriptions; those of views still open are closed when the views go."""
        self._closed = True
        self.drain()
        while self._idle:
            self._idle.pop().close()


def map_read_only(path: str, off: int, nbytes: int) -> tuple[mmap.mmap, int]:
    """A read-only mapping of the segment's bytes ``off`` to ``off + nbytes`` (``path``: the segment's
    /proc/self/fd entry) and where they start in it. Through a description of its own: the mapping keeps its
    description open, and one a pin was taken through would keep that pin while the mapping lives."""
    start = off - off % mmap.ALLOCATIONGRANULARITY
    with io.FileIO(path, "r") as file:  # closes in C if cut short, like the pins' descriptions
        # Why trackfd=False where there is one (3.13): an mmap otherwise keeps a descriptor of its own open, one per
        # live tensor view.
        return mmap.mmap(file.fileno(), off + nbytes - start, access=mmap.ACCESS_READ, offset=start,
                         **_UNTRACKED), off - start


_U8 = np.dtype(np.uint8)


def layout_of(value: memoryview) -> tuple:
    """How a view reads the encoded value in ``value`` (tag byte first): (tag, dtype, shape, data offset, count of
    items). Raises TypeError for a value of another kind than an array, a tensor or bytes, and ValueError for a
    malformed array or tensor."""
    tag = value[0]
    if tag == TAG_BYTES:
        return tag, _U8, None, 1, len(value) - 1
    if tag != TAG_ARRAY and tag != TAG_TENSOR:
        raise TypeError("view() reads numpy arrays, tensors and bytes values without copying; use get() for others")
    dtype, shape, data0 = array_layout(value)
    if tag == TAG_TENSOR:
        tensors.check(value[1], dtype)
    return tag, dtype, shape, data0, (len(value) - data0) // dtype.itemsize


_WATCHES: dict = {}  # id -> the weak references below, alive until their callback runs (ndarrays do not hash)
_purge_at = 1024  # when _WATCHES grows past this, entries whose callback was cut short are dropped


def _watch(obj, callback) -> weakref.ref:
    """Call ``callback()`` when ``obj`` is garbage collected (a bare weak reference: a fraction of the cost of a
    ``weakref.finalize``). Returns the reference; taking it out of ``_WATCHES`` cancels the call."""
    global _purge_at

    def fire(ref) -> None:
        if _WATCHES.pop(id(ref), None) is not None:
            callback()

    ref = weakref.ref(obj, fire)
    _WATCHES[id(ref)] = ref
    if len(_WATCHES) > _purge_at:
        # Crash window: an exception at fire's first bytecode leaves its entry behind, its object gone: dropped
        # here, in amortised constant time.
        for key, r in list(_WATCHES.items()):
            if r() is None:
                _WATCHES.pop(key, None)
        _purge_at = 2 * len(_WATCHES) + 1024
    return ref


def _nothing(*_) -> None:
    pass


class PyView:
    """A pinned entry's value, zero-copy: ``with cache.view(key) as arr:``. Returned by ``SharedCache.view`` on the
    pure-Python path (the compiled build returns ``_core.View``, the same in C: ``View`` names whichever runs)."""

    def __init__(self, value: memoryview, pins: PinDescriptions, pin: Pin, off: int = -1,
                 layout: tuple | None = None) -> None:
        """``value``: a read-only view of the pinned entry's encoded value (tag byte first), at offset ``off`` of the
        segment; ``pin``: released through ``pins`` once the memory is no longer referenced; ``layout``: this
        value's ``layout`` as an earlier View of the same stored bytes found it (None: read it from the bytes).
        Raises TypeError for a value of another kind, and ValueError for a malformed array (the caller then
        releases the pin)."""
        if layout is None:
            layout = layout_of(value)
        self.layout = layout
        tag, dtype, shape, data0, _ = layout
        # ``owner`` is the one object that references the pinned memory directly: every array or memoryview handed
        # out derives from it (numpy collapses a view's base to it), so it is garbage collected -- and the pin
        # released -- only after the last of them.
        if tag == TAG_TENSOR:
            mapping, start = pins.map_read_only(off, len(value))  # unmapped as the last array over it goes
            owner = np.frombuffer(mapping, dtype=np.uint8, count=len(value), offset=start)
        else:
            owner = np.frombuffer(value, dtype=np.uint8)
        if tag == TAG_BYTES:
            self._obj: Any = memoryview(owner[1:])  # type: ignore[arg-type]  # (numpy declares __buffer__ from 3.12)
        elif tag == TAG_TENSOR:
            # The tensor's storage holds the array, which holds ``owner``: the pin lasts while any tensor sharing
            # this memory does (see the module docstring).
            self._obj = tensors.from_array(value[1], owner[data0:].view(dtype).reshape(shape))
        else:
            self._obj = owner[data0:].view(dtype).reshape(shape)  # its base is ``owner`` (numpy collapses views)
        self._open = True
        self._pins = pins
        pins.hand_over(owner, pin)  # last: until here, an exception drops the pin, closing its description

    def __enter__(self) -> Any:
        """The value: a read-only numpy array, a read-only memoryview for bytes, a tensor for a tensor. Typed Any,
        as ``get`` is: the caller knows what it stored, and uses it as such without a cast."""
        if not self._open:
            raise ValueError("this view is closed; take a new one with cache.view(key)")
        return self._obj

    def __exit__(self, *exc: object) -> None:
        self._close()
        self._pins.drain()  # in case a release was cut short

    def close(self) -> None:
        """Let go of the object handed out (a memoryview is released); the pin goes when nothing references the
        memory any more."""
        self._close()

    def _close(self) -> None:
        """The view lets go of what it handed out: a memoryview is released, unless something exported it meanwhile
        (np.frombuffer of it...), which keeps it, and the pin, while it lives; an array or a tensor is dropped, its
        pin ending with its last reference, wherever that is. (twin: _view.c view_close)"""
        if not self._open:
            return
        self._open = False
        obj, self._obj = self._obj, None
        if isinstance(obj, memoryview):
            try:
                obj.release()
            except BufferError:
                pass


class DevView:
    """What ``SharedCache.view`` returns under ``python -X dev``: the view, which also notes (a weak reference) the
    array or tensor it handed out once its block has ended, so that the handle's close() can warn, with a
    ResourceWarning, of those still alive: each still pins its entry (``del`` it, or keep ``arr.copy()``)."""

    __slots__ = ("_view", "_obj", "_outlived")

    def __init__(self, view: Any, outlived: list) -> None:
        self._view, self._obj, self._outlived = view, None, outlived

    def __enter__(self) -> Any:
        self._obj = self._view.__enter__()
        return self._obj

    def __exit__(self, *exc: object) -> None:
        self._view.__exit__(*exc)
        self._note()

    def close(self) -> None:
        self._view.close()
        self._note()

    def _note(self) -> None:
        obj, self._obj = self._obj, None
        if obj is None or isinstance(obj, memoryview):  # (released at the block's end)
            return
        outlived = self._outlived
        if len(outlived) >= 1024:  # the dead ones dropped, in amortised constant time
            outlived[:] = [r for r in outlived if r() is not None]
        outlived.append(weakref.ref(obj))


def outlived_warning(name: str, outlived: list) -> None:
    """At a handle's close() under ``-X dev``: a ResourceWarning if arrays its views handed out are still alive."""
    alive = sum(1 for r in outlived if r() is not None)
    outlived.clear()
    if alive:
        warnings.warn(f"{alive} array(s) of views of cache {name!r} outlived their with blocks and still pin their "
                      "entries: del them when done, or keep a copy (arr.copy())", ResourceWarning, stacklevel=3)


_core: Any = compiled.extension
if TYPE_CHECKING:
    View = PyView  # what type checkers read: _core.View (shmcache/_view.c) has the same methods, written in C
else:
    View = PyView if _core is None else _core.View  # what SharedCache.view returns in this process


def compiled_pins(seg) -> Any:
    """The ``_core.Pins`` the views of a handle on ``seg`` (a ``segment.Segment``) pin through, in the compiled
    build; the fork hooks above run for it as for PinDescriptions."""
    pins = _core.Pins(seg.fd, seg.mm, seg.geometry.arena_off, seg.geometry.arena_nbytes, ofd.PIN_BASE)
    _ALL.add(pins)
    return pins


def first_look(pins, lease, checksum_failed, arena_off: int):
    """The View of the value ``lease`` (a ``_core.Lease``) pins, the compiled build's first view of it through this
    handle (``pins``, a ``_core.Pins``): its checksum checked (``checksum_failed(slot)`` raises CorruptionError) and
    its layout read, both recorded for the next views of that stored value, which ``Core.view`` builds in C; or a
    tensor's view, which needs a read-only mapping of its own (``arena_off``: where the arena starts in the segment).
    Raises TypeError for a value of another kind and ValueError for a malformed one; the pin ends on any error."""
    try:
        value = memoryview(lease)
        known = pins.viewed.get(lease.slot)
        if known is not None and known[:4] == (lease.version, lease.off, len(value), lease.check):
            layout = known[4]
        else:
            if body_checksum(value[0], value[1:]) != lease.check:
                lease.end()
                checksum_failed(lease.slot)
            layout = layout_of(value)
        if layout[0] != TAG_TENSOR:
            return pins.build(lease, layout)
        _, dtype, shape, data0, _ = layout
        mapping, start = map_read_only(pins.path, arena_off + lease.off, len(value))
        owner = np.frombuffer(mapping, dtype=np.uint8, count=len(value), offset=start)
        _watch(owner, functools.partial(_nothing, lease))  # the pin lasts while anything holds the tensor's memory
        return pins.build(lease, layout, tensors.from_array(value[1], owner[data0:].view(dtype).reshape(shape)))
    except BaseException:
        lease.end()  # no view was handed out: its pin ends now, whatever still references the lease
        raise


if _core is not None:
    _core.setup_views(np.frombuffer, np.ndarray, TAG_BYTES, TAG_ARRAY)
