/* shmcache._core, the arena: blocks allocated in a ring, compacted past pinned blocks.
 * Twin of arena.py.
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

/* The size of a block holding ``payload`` key and value bytes. (twin: block.py nbytes) */
static inline int64_t block_nbytes(Core *c, int64_t payload)
{
    return (c->block_header + payload + c->block_align - 1) & -c->block_align;
}

/* Whether a block at ``off`` with a value of ``vlen`` and a key of ``klen`` bytes lies within the arena. */
static inline int block_in_arena(Core *c, int64_t off, int64_t vlen, int64_t klen)
{
    return off >= 0 && off % 8 == 0 && vlen >= 1 && LEN_OK(vlen) && LEN_OK(klen)
           && off <= c->arena_nbytes - c->block_header - vlen - klen;
}


/* Cover [off, off + nbytes) with dead blocks. (twin: arena.py write_dead) */
static int write_dead(Core *c, int64_t off, int64_t nbytes)
{
    if (off < 0 || nbytes < 0 || off % 8 || nbytes % 8 || nbytes > c->arena_nbytes - off)
        return bounds(c);
    while (nbytes) {
        int64_t n = nbytes < c->max_block ? nbytes : c->max_block;
        AW(off) = n;
        off += n;
        nbytes -= n;
    }
    return ST_OK;
}

/* Pass the block at tail, absorbing it (dead) or sliding it down to head (live), in a ring of ``size`` bytes.
 * (twin: arena.py Arena._clean_one) */
static int clean_one(Core *c, int64_t size, int64_t *head, int64_t *tail, int64_t *fill, int64_t *stuck)
{
    int64_t hd = *head, tl = *tail, fl = *fill;
    if (tl < 0 || tl >= size || tl % 8 || hd < 0 || hd > tl)
        return bounds(c);
    int64_t hdr = AW(tl), nb = hdr & c->len_mask;
    if (nb < c->block_header || nb % c->block_align || nb > size - tl || nb > fl)
        return bounds(c);
    int64_t e = hdr >> c->owner_shift;
    if (SLOT_OK(e) && ER(e, off) == tl && ER(e, check)) {
        int pin = pinned(c, e);
        if (pin < 0)
            return bounds(c);
        if (pin) {
            /* A pinned block stays: the gap before it becomes a dead block and the ring goes on after it. */
            if (hd != tl) {
                int r = write_dead(c, hd, tl - hd);
                if (r)
                    return r;
            }
            (*stuck)++;
            tl += nb;
            if (tl == size)
                tl = 0;
            *head = tl;
            *tail = tl;
            *fill = size;
            return ST_OK;
        }
        if (hd != tl) {
            memmove(c->arena + hd, c->arena + tl, (size_t)nb); /* the ranges may overlap */
            EW(e, off, hd);
        }
        hd += nb;
        fl += nb;
    }
    fl -= nb;
    tl += nb;
    if (tl == size)
        tl = 0;
    if (hd == size)
        hd = 0;
    *head = hd;
    *tail = tl;
    *fill = fl;
    return ST_OK;
}

/* Bytes of the arena the ring uses under capacity word ``cap`` (0 or out of range: the arena's whole capacity): room
 * for the bytes, a block header and padding for each entry the limit may hold, and 1/16 slack. (twin:
 * layout/geometry.py Geometry.ring_nbytes) */
static inline int64_t ring_bytes(Core *c, int64_t cap, int64_t entries)
{
    if (!(cap > 0 && cap <= c->capacity_most))
        cap = c->capacity_most;
    int64_t n = (cap + cap / 16 + c->block_overhead * entries + 63) & ~(int64_t)63;
    return n < c->arena_nbytes ? n : c->arena_nbytes;
}

static inline int64_t ring_for(Core *c, int64_t cap)
{
    /* (the limit is this mapping's, taken and checked by the Python path: at most the reserved entry slots) */
    return ring_bytes(c, cap, c->ring_by_limit ? c->tables[3] : c->ring_entries);
}

/* The ring's bytes under the capacity in force (the lock held: a resize changes it). */
static inline int64_t ring_nbytes(Core *c)
{
    return ring_for(c, HW(capacity));
}

/* The most of the ring (``size`` bytes) the growth rule backs with memory: version 13's ring has room for every slot
 * the tables reach, but its extent grows only to what the capacity and the entry limit in force need (a store that
 * finds it there wraps instead); before 13, the ring. (twin: layout/geometry.py Geometry.extent_top) */
static inline int64_t extent_top(Core *c, int64_t size)
{
    if (!c->ring_follows || c->ring_by_limit)
        return size;
    /* (the limit taken with the tables: at least 1, below the reserved entry slots) */
    int64_t n = ring_bytes(c, HW(capacity), c->tables[3]);
    return n < size ? n : size;
}

/* The header's extent word ``ext`` as a number the ring of ``size`` bytes can trust: 0 or past it is all of it.
 * (twin: arena.py Arena.extent) */
static inline int64_t extent_in(int64_t ext, int64_t size)
{
    return ext > 0 && ext <= size ? ext : size;
}

static inline int64_t extent(Core *c)
{
    return extent_in(HW(arena_extent), ring_nbytes(c));
}

/* How far this handle's mapping shows the arena, backed (Segment.shown): what may be written. */
static inline int64_t shown(Core *c)
{
    return c->shown ? *c->shown : c->arena_nbytes;
}

/* Whether the header's extent differs from what this mapping shows: another process grew the arena, or a resize
 * shrank it and gave its pages back, and the Python path shows or hides the difference (Segment.refresh) before
 * anything is read or written; or a resize moved the tables since this mapping took them (Segment.refresh_tables).
 * (twin: guard.py Guard.run's test) */
static inline int hidden(Core *c)
{
    if (c->shown == NULL) /* (version 10: no tables taken; core.bind always gives the mapping's cell) */
        return c->ring_follows;
    /* (the index and the limit as well as the count: a damaged count may come back to the one taken) */
    return (HW(arena_extent) != *c->shown && extent(c) != *c->shown) || HW(resizes) != c->tables[2]
           || HW(index_slots) != c->tables[0] || HW(max_entries) != c->tables[3];
}

/* A locked section's refusal to start: the dirty word set (a repair first), or part of the arena hidden. */
static int unready(Core *c)
{
    c->reason = HW(dirty) ? WHY_DIRTY : WHY_GROW;
    return ST_HANDOVER;
}

/* The least extent that reaches ``need`` with a word to spare, in a ring of ``size`` bytes. (twin:
 * layout/geometry.py least_extent) */
static int64_t least_extent(Core *c, int64_t need, int64_t size)
{
    int64_t target = (need + c->block_align + 4095) & ~(int64_t)4095;
    return target < size ? target : size;
}

/* The least growth of the extent in a ring (or under a top) of ``size`` bytes: EXTENT_STEP, or a sixteenth of a
 * smaller ring, a page at least. (twin: layout/geometry.py extent_step) */
static inline int64_t extent_step(Core *c, int64_t size)
{
    int64_t step = ((size / 16) + 4095) & ~(int64_t)4095;
    step = step < c->extent_step ? step : c->extent_step;
    return step > 4096 ? step : 4096;
}

/* The extent after a growth that must reach ``need``: an eighth more, the step at least, not past ``top`` but for
 * ``need``. (twin: layout/geometry.py grown_extent) */
static int64_t grown_extent(Core *c, int64_t ext, int64_t need, int64_t size, int64_t top)
{
    int64_t least = extent_step(c, top), step = ext >> 3 > least ? ext >> 3 : least;
    int64_t target = (ext + step + 4095) & ~(int64_t)4095, needed = (need + c->block_align + 4095) & ~(int64_t)4095;
    target = target < top ? target : top;
    target = target > needed ? target : needed;
    return target < size ? target : size;
}

/* Back the arena up to ``stop`` with memory (posix_fallocate through the handle's description) and show it in this
 * mapping, where private zero pages were (MAP_FIXED of the file's pages, in place). Both reach the end of stop's
 * system page (c->page, which MAP_FIXED swaps whole: 4 KiB, or 16 or 64 KiB on some arm64 kernels), so that no page
 * of the file is shown that is not backed. 0, or -1: /dev/shm is full (or the mapping could not be made), nothing
 * changed but what fallocate backed. (twin: segment.py Segment.back, _backed_to, _show) */
static int reach(Core *c, int64_t stop)
{
    int64_t have = shown(c);
    if (stop <= have)
        return 0;
    int64_t base = (int64_t)(c->arena - c->mem), total = (int64_t)c->buf.len, pg = c->page;
    int64_t backed = (base + stop + pg - 1) / pg * pg;
    if (backed > total)
        backed = total;
    if (posix_fallocate(c->live_fd, (off_t)(base + have), (off_t)(backed - base - have)))
        return -1;
    int64_t start = (base + have) / pg * pg, end = (backed + pg - 1) / pg * pg;
    if (end > start) {
        void *p = mmap(c->mem + start, (size_t)(end - start), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                       c->live_fd, (off_t)start);
        if (p == MAP_FAILED)
            return -1;
    }
    *c->shown = stop;
    return 0;
}

/* The extent grown to reach ``need``, backed, shown and published, into *ext: an eighth more, else (on a nearly full
 * /dev/shm) the least that serves, as the Python path does. ST_GROW: neither could be backed; the ring head, tail,
 * fill (as cleaned so far: consistent) are recorded first, and the store is handed over, where NoSpaceError is
 * raised. (twin: arena.py Arena._grow) */
static int grow(Core *c, int64_t size, int64_t top, int64_t *ext, int64_t need, int64_t head, int64_t tail,
                int64_t fill)
{
    int64_t next = grown_extent(c, *ext, need, size, top), least = least_extent(c, need, size);
    if (reach(c, next) && (least >= next || reach(c, (next = least)))) {
        HW(head) = head;
        HW(tail) = tail;
        HW(fill) = fill;
        return ST_GROW;
    }
    HW(arena_extent) = next;
    *ext = next;
    return ST_OK;
}

/* The offset of a new block of ``nb`` bytes owned by entry ``e`` into *out. ST_PINNED: pinned blocks split the free
 * space into pieces all smaller than nb. ST_GROW: the extent must grow past what is shown (every structure
 * consistent). The
 * ring keeps below the extent, wrapping early or growing it as arena.py says. (twin: arena.py Arena.alloc) */
static int alloc(Core *c, int64_t nb, int64_t e, int64_t *out)
{
    int64_t size = ring_nbytes(c), ext = extent_in(HW(arena_extent), size), top = extent_top(c, size);
    int r;
    if (reach(c, ext)) /* (the section's start showed it already, unless the word changed since: damage) */
        return ST_GROW;
    int64_t head = HW(head), tail = HW(tail), fill = HW(fill), used = HW(arena_used);
    if (!(head >= 0 && head < size && tail >= 0 && tail < size && fill >= 0 && fill <= size && !((head | tail) & 7)
          && (((head - tail) % size) + size) % size == fill % size && used >= 0 && used <= size - nb))
        return bounds(c);
    int64_t cleaned = 0, stuck = 0;
    for (;;) {
        if (fill == 0)
            head = tail = 0;
        if (head >= tail && fill < size) { /* free space is [head, size) then [0, tail) */
            int64_t room = size - head;
            if (head + nb < ext || (ext == size && room >= nb))
                break;
            /* (a block that would end past the top wraps the ring rather than grow it, but for a dead block too long
             * for one header: its words past the extent would be written where this mapping shows no file) */
            if (room >= nb && (head + nb < top || top == size || room > c->max_block)
                && (cleaned >= size || used + nb > ext - (ext >> 3) || head >= ext || room > c->max_block)) {
                if ((r = grow(c, size, top, &ext, head + nb, head, tail, fill)))
                    return r;
                break;
            }
            if (room) {
                if (head >= ext && (r = grow(c, size, top, &ext, head, head, tail, fill)))
                    return r;
                if ((r = write_dead(c, head, room)))
                    return r;
                fill += room;
            }
            head = 0;
            continue;
        }
        if (fill < size && tail - head >= nb) /* free space is the gap [head, tail) */
            break;
        int64_t before = tail;
        r = clean_one(c, size, &head, &tail, &fill, &stuck);
        if (r)
            return r;
        int64_t passed = (((tail - before) % size) + size) % size;
        cleaned += passed ? passed : size;
        if (cleaned > 2 * size) {
            if (stuck) {
                /* Pinned blocks split the free space into pieces all smaller than nb: the ring as it stands is
                 * consistent; record it and refuse. */
                HW(head) = head;
                HW(tail) = tail;
                HW(fill) = fill;
                return ST_PINNED;
            }
            return bounds(c);
        }
    }
    if (head < 0 || head % 8 || nb > size - head)
        return bounds(c);
    AW(head) = nb | (e << c->owner_shift);
    *out = head;
    head += nb;
    /* Ordering: head, tail and fill are written together after the block (see arena.py). */
    HW(head) = head == size ? 0 : head;
    HW(tail) = tail;
    HW(fill) = fill + nb;
    ADD(HW(arena_used), nb);
    return ST_OK;
}

/* Bind the mapping's cell saying how far it shows the arena and which tables it took (segment.py Segment.shown: six
 * int64, written by the Python path as it shows more); the export is held until release. */
static PyObject *Core_watch_extent(Core *c, PyObject *cell)
{
    if (c->have_shown || c->released || !c->bound) {
        PyErr_SetString(PyExc_ValueError, "Core.watch_extent: already bound, released, or not bound yet");
        return NULL;
    }
    if (PyObject_GetBuffer(cell, &c->shown_buf, PyBUF_WRITABLE) < 0)
        return NULL;
    int64_t *w = (int64_t *)c->shown_buf.buf;
    if (c->shown_buf.len != 6 * (Py_ssize_t)sizeof(int64_t) || ((uintptr_t)c->shown_buf.buf % sizeof(int64_t))
        || w[1] < 8 || w[1] > c->index_slots || (!c->ixrange && (w[1] & (w[1] - 1))) || w[2] < 1 || w[2] > c->slots
        || w[4] < 1 || w[4] >= c->slots || (w[5] & ~(int64_t)SHOWN_ALL)) {
        PyBuffer_Release(&c->shown_buf);
        PyErr_SetString(PyExc_ValueError, "Core.watch_extent: the cell must be six aligned 8-byte words, the index, "
                                          "entry slots and limit in force within the tables, and the lazy columns "
                                          "shown");
        return NULL;
    }
    c->have_shown = 1;
    c->shown = w;
    c->tables = w + 1;
    Py_RETURN_NONE;
}
