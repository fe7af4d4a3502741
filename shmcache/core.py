"""The one choice between the compiled section (``shmcache._core``) and the Python path, made once per handle.

``path`` gives a handle the object its hot calls go to (docs/design.md, "The seams"): a ``Core`` bound with a
``HandOver``, which the C calls for whatever it does not finish, or a ``Reference`` where the extension is not built
(or SHMCACHE_PURE_PYTHON=1). ``bind`` hands the C the segment's writable buffer and every offset, word number and
constant it uses, taken from ``shmcache/layout`` (and the lock's word offsets from ``lock.py``), so that the layout has
one source of truth. A ``Core`` keeps a buffer export of the mapping: ``release()`` it before the segment is closed,
or the mapping cannot be unmapped.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from . import config, entries, ofd, policies
from .policies import auto
from .codec import (
    MASK63, TAG_ARRAY, TAG_BYTES, TAG_MSGPACK, TAG_TENSOR, EncodedKey, array_checksum, array_over, body_checksum,
    encode_key, xxh3,
)
from .compiled import HANDOVER, PATH, PINNED, TIMEOUT, Core, Raw, last_wait, word_try
from .compiled import extension as _core
from .errors import ClosedError
from .layout import (
    BLOCK_ALIGN, BLOCK_HEADER_NBYTES, EMPTY, HEADER_NBYTES, KIND, KIND_PREFIX, LOCK_NBYTES,
    MAX_BLOCK_NBYTES, MAX_KINDS, MAX_TTL_NS, MAX_VERSION, NEVER, NIL, SENTINEL,
)
from .layout import dtypes as d
from .lock import HOLDER_BASE, HOLDER_OFF, HOLDER_SLOTS, WAKES_OFF
from .readers import READER_BASE, Reader
from .segment import SHOWN_EXPIRES, SHOWN_IDLE, SHOWN_VERSIONS
from .serializers import TAG_PICKLE
from .store import UNVIEWABLE, Fields
from .view import Pin, PinDescriptions, PyView, compiled_pins, first_look

# (what the modules above read of the compiled section here, as before it had a module of its own: compiled.py)
__all__ = ["Core", "HANDOVER", "PATH", "PINNED", "Raw", "TIMEOUT", "HandOver", "Reference", "bind", "hot_path",
           "last_wait", "offsets", "path", "word_try"]

_WORDS = (
    "E_PREV", "E_NEXT", "E_FP", "E_OFF", "E_KEY_NBYTES", "E_VAL_NBYTES", "E_SLOT", "E_CHECK", "I_FP", "I_ENTRY",
    "K_ENTRIES", "K_RETAINED", "H_HITS", "H_MISSES", "H_PUTS", "H_UPDATES", "H_DELETES", "H_EVICTIONS", "H_DIRTY",
    "H_ENTRIES", "H_RETAINED", "H_MAX_ENTRIES", "H_MAX_RETAINED", "H_HEAD", "H_TAIL", "H_FILL", "H_ARENA_USED",
    "H_FREE_HEAD", "H_UNUSED_NEXT", "H_VERSION_CLOCK", "H_NEXT_EXPIRY", "H_EXPIRED", "H_DEFAULT_TTL", "H_WRITING",
    "H_PROGRESS", "H_LAST_PUT", "H_LOCK_OFF", "H_ADMITTED", "H_SMALL_FIRST", "H_SMALL", "H_GHOST_CLOCK",
    "H_NOT_ADMITTED", "H_PROMOTED", "H_GHOST_HITS", "POLICY_LRU", "POLICY_S3FIFO", "POLICY_KEEP", "MARK_FREQ",
    "MARK_SMALL", "GHOST_WAYS", "GHOST_STAMP_BITS", "H_SEQ", "R_HITS", "R_MISSES", "R_RETRIES", "R_FALLBACKS",
    "R_PINS", "H_ARENA_EXTENT", "H_CAPACITY", "BLOCK_OVERHEAD", "R_READING", "H_RESIZES", "H_INDEX_SLOTS",
    "POLICY_AUTO", "A_TARGET", "A_STEP", "A_LAST_PPM", "A_REQUESTS", "A_HITS", "A_PERIODS", "A_PREFERRED",
    "A_REFUSED", "SKETCH_BLOCK_WORDS", "MAX_COUNTER",
)


# auto's tuning, which the compiled climber has as constants (bind checks they are these).
_AUTO_TUNING = ("WINDOW_PERCENT", "ADMIT_MARGIN", "PERIOD_PER_ENTRY", "CHECK_EVERY", "STEP_PER_10000",
                "RESTART_PPM", "DECAY_PERCENT", "STEP_UNIT", "PPM", "PERIOD_MAX", "JUMP_SHARE", "GROW_SHARE",
                "PPM_BITS", "PROMOTED_BITS")


def hot_path() -> str:
    """Which implementation of the locked operations this installation runs (the same segments either way): what
    ``shmcache ls``, ``stats`` and ``bench`` print."""
    if PATH == "compiled":
        return "hot path: compiled (shmcache._core)"
    why = "SHMCACHE_PURE_PYTHON=1" if os.environ.get("SHMCACHE_PURE_PYTHON") == "1" else "the extension is not built"
    return f"hot path: pure Python ({why})"


def offsets(geometry) -> dict[str, int]:
    """Every number ``_core.Core`` needs, for a segment of ``geometry`` (a ``layout.Geometry``)."""
    g = geometry
    # (versions 10 to 12: the ring's room for block headers follows the entry limit in force, Geometry.ring_entries)
    out = {name: getattr(d, name) for name in _WORDS}
    out.update(
        header_off=0, index_off=g.index_off, entries_off=g.entries_off, expires_off=g.expires_off,
        versions_off=g.versions_off, kinds_off=g.kinds_off, pins_off=g.pins_off, kind_table_off=g.kind_table_off,
        marks_off=g.marks_off, ghost_off=g.ghost_off, ghost_slots=g.ghost_slots, ghost_shift=g.ghost_shift,
        ghost_floor=g.ghost_floor, policy=g.policy,
        readers_off=g.readers_off, READER_SLOTS=d.READER_SLOTS, READER_WORDS=d.READER_WORDS,
        stripes_off=g.stripes_off, stripes_nbytes=g.stripes_nbytes, STRIPE_BITS=d.STRIPE_BITS,
        STRIPE_MIN_SHIFT=d.STRIPE_MIN_SHIFT, STRIPE_WORDS=d.STRIPE_WORDS, S_HELD=d.S_HELD,
        S_HELD_FIRST=d.S_HELD_FIRST, S_HELD_BYTES=d.S_HELD_BYTES, HELD_SLOT=d.HELD_SLOT, holds=int(g.version >= 12),
        idle=int(g.version >= 14), lazy=g.lazy, idle_off=g.idle_off, ttis_off=g.ttis_off,
        deadlines_off=g.deadlines_off,
        IDLE_SHARE=d.IDLE_SHARE, D_DEFAULT_TTI=d.D_DEFAULT_TTI, D_TTI_CHECK=d.D_TTI_CHECK, D_IDLE_ON=d.D_IDLE_ON,
        D_VERSIONS_ON=d.D_VERSIONS_ON, D_EXPIRES_ON=d.D_EXPIRES_ON, D_WORDS=d.D_WORDS, SHOWN_IDLE=SHOWN_IDLE,
        SHOWN_VERSIONS=SHOWN_VERSIONS, SHOWN_EXPIRES=SHOWN_EXPIRES,
        TTI_NONE_CHECK=config.tti_checksum(0),
        READER_PINS=d.READER_PINS, READER_BASE=READER_BASE, PIN_SLOT_MASK=d.PIN_SLOT_MASK,
        arena_off=g.arena_off, arena_nbytes=g.arena_nbytes, EXTENT_STEP=d.EXTENT_STEP, entry_slots=g.entry_slots,
        capacity_bytes=g.capacity_bytes, max_entries=g.max_entries,
        index_slots=g.index_slots, ring_follows=int(g.version >= 10), ring_by_limit=int(10 <= g.version < 13),
        HEADER_WORDS=HEADER_NBYTES // 8, WORD_NBYTES=d.EXPIRES.itemsize, INDEX_SLOT_NBYTES=g.index_slot_nbytes,
        INDEX_PACKED=int(g.packed_index), INDEX_RANGED=int(g.ranged_index),
        ENTRY_NBYTES=g.entry_nbytes, ENTRY_NARROW=int(g.narrow), KIND_ROWS=MAX_KINDS + 1, KIND_NBYTES=KIND.itemsize,
        LOCK_NBYTES=LOCK_NBYTES,
        LOCK_HOLDER_OFF=HOLDER_OFF, LOCK_WAKES_OFF=WAKES_OFF, HOLDER_BASE=HOLDER_BASE, HOLDER_SLOTS=HOLDER_SLOTS,
        BLOCK_HEADER_NBYTES=BLOCK_HEADER_NBYTES,
        BLOCK_ALIGN=BLOCK_ALIGN, MAX_BLOCK_NBYTES=MAX_BLOCK_NBYTES, BLOCK_LEN_MASK=d.BLOCK_LEN_MASK,
        BLOCK_OWNER_SHIFT=d.BLOCK_OWNER_SHIFT, EMPTY=EMPTY, NIL=NIL, SENTINEL=SENTINEL, NEVER=NEVER,
        MAX_TTL_NS=MAX_TTL_NS, MAX_VERSION=MAX_VERSION, KIND_PREFIX=KIND_PREFIX, PIN_BASE=ofd.PIN_BASE,
        CHECK_MASK=MASK63, TAG_BYTES=TAG_BYTES, TAG_MSGPACK=TAG_MSGPACK, TAG_ARRAY=TAG_ARRAY, TAG_TENSOR=TAG_TENSOR,
        TAG_PICKLE=TAG_PICKLE,
        **{name: getattr(auto, name) for name in _AUTO_TUNING},
    )
    return out


def bind(seg, lock_timeout: float, fallback: HandOver | None = None):
    """A ``_core.Core`` over the open ``segment.Segment`` ``seg``, waiting at most ``lock_timeout`` seconds for a
    busy lock before handing over to ``fallback`` (None: answering HANDOVER); None when the extension is not built
    (or SHMCACHE_PURE_PYTHON=1)."""
    if _core is None:
        return None
    c = Core(seg.mm, offsets(seg.geometry), seg.live_fd, max(1, int(lock_timeout * 1e9)), fallback)
    c.watch_extent(seg.shown)
    return c


# ----------------------------------------------------------------------------------------------- the one dispatch
# A handle calls one object for its hot calls: its Core when the compiled section is built, bound with a HandOver
# that takes whatever the C does not finish (the C calls it: a hand-over costs the fast path nothing), else a
# Reference. Both answer the same methods with the same arguments.
if _core is not None:
    _core.setup_keys(encode_key, EncodedKey)  # what Core.get_key and view_key encode a key that is not a str with


class Reference:
    """The Python path of one handle's get, put, delete, view and batches: what a pure-Python handle calls, and what
    a Core hands over to (``HandOver``). Each runs under the guard (``Guard.run``); ``waited``: the compiled section
    waited the whole lock timeout already, so the guard waits no more. ``now`` is the Core's argument, unused here
    (the store reads the handle's clock)."""

    UNVIEWABLE = UNVIEWABLE  # view's answer for a value view() does not serve
    __slots__ = ("guard", "store", "decode", "arena", "base")

    def __init__(self, guard, store, arena, base: int) -> None:
        self.guard, self.store, self.arena, self.base = guard, store, arena, base
        self.decode = store.serializer.decode

    def get_value(self, kb: bytes, fp: int, now: int, default: Any, waited: bool = False) -> Any:
        """The value of key bytes ``kb`` (fingerprint ``fp``), or ``default``; a hit is made the most recent."""
        guard = self.guard
        found = guard.run(self.store.read, kb, fp, waited=waited)
        if found is None:
            return default
        tag, body, check, e, head = found
        if head is not None:  # an array: copied once, under the lock, and checked now
            if array_checksum(head, body) != check:
                guard.checksum_failed(e)
            return body
        if (xxh3(body, tag) & MASK63) | 1 != check:
            guard.checksum_failed(e)
        try:
            return self.decode(tag, body)
        except ValueError as exc:
            guard.undecodable(exc)

    def put(self, encoded: Fields, now: int, ttl: int, tti: int = -1, waited: bool = False) -> bool:
        """Store ``encoded`` (an Encoded, or its fields) where the policy puts it, expiring after ``ttl`` ns (0:
        never; -1: the cache's default) or once not read for ``tti`` ns (likewise); whether it was stored (the
        policy admitted it)."""
        return self.guard.run(self.store.put, None if ttl < 0 else ttl, encoded, None if tti < 0 else tti,
                              waited=waited)

    def delete(self, kb: bytes, fp: int, now: int, waited: bool = False) -> bool:
        return self.guard.run(self.store.delete, kb, fp, waited=waited)

    def get_key(self, key: Any, now: int, default: Any) -> Any:
        """``get_value`` of ``key`` as SharedCache.get is given it, encoded and hashed here (Core.get_key does both in
        C): an EncodedKey is key bytes already encoded (TieredCache's local hits), which no other method takes."""
        if type(key) is str:  # encode_key's first case, inlined: the call costs more than the encoding
            try:
                kb = key.encode()
            except UnicodeEncodeError:
                kb = encode_key(key)  # raises the TypeError
        elif type(key) is EncodedKey:
            kb = key
        else:
            kb = encode_key(key)
        return self.get_value(kb, xxh3(kb) & MASK63, now, default)

    def view_key(self, key: Any, now: int, pins) -> Any:
        """``view`` of ``key`` as SharedCache.view is given it, encoded and hashed here (Core.view_key does both in C;
        encode_key raises the TypeError of a key that cannot be one)."""
        if type(key) is str:  # as get_key
            try:
                kb = key.encode()
            except UnicodeEncodeError:
                kb = encode_key(key)  # raises the TypeError
        else:
            kb = encode_key(key)
        return self.view(kb, xxh3(kb) & MASK63, now, pins)

    def view(self, kb: bytes, fp: int, now: int, pins, waited: bool = False) -> Any:
        """A view of the key's value pinned through ``pins`` (a ``view.PinDescriptions``): the view, None on a miss,
        or UNVIEWABLE (nothing counted or pinned)."""
        # Why: the pin exists before anything is taken, and owns its description until it is handed over to the
        # view: an exception at any bytecode before that drops it, which closes the description and whatever lock it
        # took (see view.py).
        pin = Pin()
        try:
            fd = pins.take(pin)
            found = self.guard.run(self.store.pin, kb, fp, fd, waited=waited)
            if found is None or found is UNVIEWABLE:
                return found
            e, voff, vlen, check, version = found
            pin.byte = ofd.PIN_BASE + e
            value = self.arena[voff : voff + vlen].toreadonly()
            # The checksum policy: checked outside the lock (the entry is pinned: no writer may change these bytes
            # any more), on the first view this handle takes of each stored value (slot, version, offset and
            # checksum name it: a new store, or a compaction moving it, is checked again). Later views of it trust
            # that check: a stray write into a block already checked is caught by get(), not by view().
            stored = (version, voff, vlen, check)
            known = pins.viewed.get(e)
            if known is not None and known[0] == stored:
                return PyView(value, pins, pin, self.base + voff, known[1])  # its layout, checked with it, too
            if body_checksum(value[0], value[1:]) != check:
                pins.release(pin)
                self.guard.checksum_failed(e)
            view = PyView(value, pins, pin, self.base + voff)
            pins.viewed[e] = stored, view.layout
            return view
        except BaseException:
            pins.release(pin)  # an unknown byte closes the description, dropping its lock; a no-op if released
            raise

    def get_many(self, kbs: list, fps: list, now: int, default: Any, found: list | None = None,
                 waited: bool = False) -> list:
        """The values of keys ``kbs`` (fingerprints ``fps``) in order, ``default`` for a miss, under one hold of the
        lock; ``found``: the values of the first keys, which the compiled section looked up already."""
        done = 0 if found is None else len(found)
        got = self.guard.run(entries.get_many_locked, self.store, kbs[done:], fps[done:], waited=waited)
        decode, out = self.decode, [] if found is None else found
        try:
            for f in got:
                if f is None:
                    out.append(default)
                    continue
                tag, body, check, e = f
                if (xxh3(body, tag) & MASK63) | 1 != check:
                    self.guard.checksum_failed(e)
                out.append(decode(tag, body))
        except ValueError as exc:
            self.guard.undecodable(exc)
        return out

    def evict_toward(self, most_entries: int, most_bytes: int, entries_step: int, bytes_step: int, now: int,
                     waited: bool = False) -> bool:
        """One short hold's share of the evictions lower limits will need (``Store.evict_toward``): whether the
        cache holds at most ``most_entries`` entries of ``most_bytes`` bytes, or nothing more can go."""
        if min(most_entries, most_bytes, entries_step, bytes_step) < 0:  # (as Core.evict_toward refuses them)
            raise ValueError("evict_toward: the limits and the steps must be 0 or more")
        return self.guard.run(self.store.evict_toward, most_entries, most_bytes, entries_step, bytes_step,
                              waited=waited)

    def put_many(self, encoded: list, now: int, ttl: int, done: int = 0, waited: bool = False) -> int:
        """Store ``encoded[done:]`` in order under one hold of the lock (the first ``done``, the compiled section
        judged already), all expiring after ``ttl`` ns (-1: the cache's default); how many of them were not
        admitted."""
        return self.guard.run(entries.put_many_locked, self.store, None if ttl < 0 else ttl, encoded[done:],
                              waited=waited)


class HandOver(Reference):
    """What a handle's Core hands over to: the Python path, which judges, repairs and raises, for a call the C did
    not finish (a damaged segment, a dead holder, a lock wait past the timeout, a pin); and what it leaves to
    Python: a Raw to finish, a first look at a lease, a batch's refusal to raise."""

    __slots__ = ("pins",)

    def __init__(self, guard, store, arena, base: int, pins) -> None:
        super().__init__(guard, store, arena, base)
        self.pins = pins  # the handle's _core.Pins

    def finish(self, raw) -> Any:
        """The value of a hit the compiled section leaves to Python (a ``Raw``): a failed checksum
        (``Guard.checksum_failed`` raises CorruptionError), an array or tensor (built over the copy made under the
        lock), or a value its decoder declines (the serializer's; one that does not decode raises through
        ``Guard.undecodable``)."""
        if not raw.ok:
            self.guard.checksum_failed(raw.slot)
        try:
            if raw.tag == TAG_ARRAY or raw.tag == TAG_TENSOR:
                return array_over(raw.body)
            return self.decode(raw.tag, raw.body)
        except ValueError as exc:
            self.guard.undecodable(exc)

    def view(self, kb: bytes, fp: int, now: int, pins, waited: bool = False) -> Any:
        """The pin ``Core.view`` handed over, taken by the Python path (``Store.pin``) through the description of a
        new lease, and the view built over it (``first_look``); None on a miss; UNVIEWABLE. Until armed, the lease
        closes its description (dropping the lock taken through it) if it is dropped, an exception cutting this
        short."""
        if pins.closed:
            raise ClosedError("operation on a closed cache", what="view")
        lease = pins.lease()
        found = self.guard.run(self.store.pin, kb, fp, lease.fd, waited=waited)
        if found is None or found is UNVIEWABLE:
            return found
        lease.arm(*found)
        return self.first_look(lease)

    def first_look(self, lease) -> Any:
        """The view of a value this handle has not checked before (``view.first_look``). Pinned without the lock,
        its lookup is counted by the compiled section after this returns (a failed checksum: a miss), so the
        repair then corrects no counter of the header."""
        failed = self.guard.checksum_failed
        if _core.unlocked_view():
            failed = functools.partial(failed, counted=False)
        return first_look(self.pins, lease, failed, self.base)


def path(seg, guard, store, lock_timeout: float) -> tuple[Any, Any, Any]:
    """(the object a handle on ``seg`` calls for its hot calls, its Core or None, the descriptions its views pin
    through): a Core bound with a HandOver and a ``_core.Pins`` when the compiled section is built, else a Reference
    and a ``view.PinDescriptions``."""
    arena, base = seg.arena, seg.geometry.arena_off
    if _core is None:
        return Reference(guard, store, arena, base), None, PinDescriptions(seg.fd)
    pins = compiled_pins(seg)
    bound = bind(seg, lock_timeout, HandOver(guard, store, arena, base, pins))
    bound.holder_slot = guard.slot.number  # void in a forked child, whose holds then name no slot (_core_lock.c)
    if policies.of(seg.geometry.policy).reads_unlocked:  # gets and views without the lock, in a reader slot
        try:
            Reader(seg).bind(bound)
        except OSError:
            pass  # no /proc, or no descriptor left: every read takes the lock
    return bound, bound, pins
