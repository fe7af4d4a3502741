/* shmcache._core, the locked sections: one get, put, delete, pin or batch under one hold of the lock.
 * Twin of store.py (Store) and entries.py.
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

/* An expired entry that no pin flag marks: dropped, counted in ``expired``. (twin: store.py Store.lapse) */
static int lapse(Core *c, int64_t e)
{
    HW(dirty) = 1; /* (table_remove opens the stripes it writes) */
    int r = table_remove(c, e);
    if (r)
        return r;
    ADD(HW(expired), 1);
    HW(dirty) = 0;
    return ST_OK;
}

typedef struct {
    int64_t tag, check, vlen, off, slot;
    int hit;
} Found;

/* The steps of one item, shared by a call and a batch: inlined into each, so that a single get or put pays nothing for
 * the split (not inlined, they cost a get ~40 instructions, 3 %: benchmarks.instructions --collect Core_get_value). */
#define STEP static inline __attribute__((always_inline))

/* The caller checked the dirty word: the key's entry, or EMPTY if it is absent or expired (an
 * expired one is dropped, unless a view pins it: it stays, and reads as absent). *now: the clock reading, or -1
 * until an expiry needs it; read once, it stays for the caller's next lookups (a batch judges expiry by one
 * reading). (twin: store.py Store.find_live) */
STEP int find_live(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t *now, int64_t *out)
{
    int64_t e;
    int r;
    if ((r = find(c, kb, klen, fp, &e)))
        return r;
    if (e != c->empty) {
        int64_t x = c->exp[e];
        if (x && x <= (*now < 0 ? (*now = mono_ns()) : *now)) {
            int pin = pinned(c, e);
            if (pin < 0)
                return bounds(c);
            if (!pin && (r = lapse(c, e)))
                return r;
            e = c->empty;
        }
    }
    *out = e;
    return ST_OK;
}

/* What a hit reads of live entry ``e`` into *f (its block was checked by find). */
STEP void found(Core *c, int64_t e, Found *f)
{
    f->hit = 1;
    f->slot = e;
    f->check = ER(e, check);
    f->off = ER(e, off) + c->block_header;
    f->vlen = ER(e, vlen);
    f->tag = c->arena[f->off];
}

/* A hit on resident entry ``e`` that has a time to idle (version 14): its expiry moved to a tti from now, never past
 * its deadline, once that gains 1/IDLE_SHARE of the tti. One word, which a reader without the lock reads either side
 * of (both are deadlines the entry had); its stripe opened all the same, as for any write to a resident entry. A time
 * to idle or an expiry out of range (damage, which verify reports) moves nothing. *now: as find_live's.
 * (twin: table.py Table.idle_touch) */
static void idle_touch(Core *c, int64_t e, int64_t *now)
{
    int64_t t = c->ttis[e], x = c->exp[e];
    if (t <= 0 || t > c->max_ttl || x <= 0)
        return;
    if (*now < 0)
        *now = mono_ns();
    int64_t fresh = *now + t, d = c->deadlines[e]; /* (a clock reading below 2**62 and a tti of at most 2**61) */
    if (d > 0 && d < fresh)
        fresh = d;
    if (fresh - x >= t / IDLE_SHARE) {
        entry_open(c, e);
        c->exp[e] = fresh;
    }
}

/* A hit counted, the entry touched as the policy does: under lru it becomes the most recent (in the dirty bracket),
 * under s3fifo its counter rises (a byte, no bracket: any value is valid), under auto the sketch counts it too; an
 * idle entry's expiry moved (idle_touch). (twin: store.py Store.hit) */
STEP int hit(Core *c, int64_t e, int64_t *now)
{
    int r;
    if (!c->pol->relinks_on_hit) {
        if (c->pol->marks_on_hit)
            bump(c, e);
        if (c->pol->sketches)
            sketch_add(c, entry_pfp(c, e));
    } else if (ER(e, prev) != c->sentinel) {
        int64_t p = ER(e, prev), n = ER(e, next), first = ER(c->sentinel, next);
        if (!LINK_OK(p) || !LINK_OK(n) || !LINK_OK(first))
            return bounds(c); /* nothing written yet */
        seq_open(c);
        HW(dirty) = 1;
        if ((r = move_to_front(c, e)))
            return r;
        HW(dirty) = 0;
    }
    if (IDLE_SHOWN(c) && c->exp[e] && c->ttis[e]) /* (an idle entry has an expiry: find_live read its word) */
        idle_touch(c, e, now);
    ADD(HW(hits), 1);
    return ST_OK;
}

/* One lookup, as get does it (the caller checked the dirty word; *now as find_live's). */
STEP int get_one(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t *now, Found *f)
{
    int64_t e;
    int r;
    f->hit = 0;
    if ((r = find_live(c, kb, klen, fp, now, &e)))
        return r;
    if (e == c->empty) {
        ADD(HW(misses), 1);
        return ST_OK;
    }
    if ((r = hit(c, e, now)))
        return r;
    found(c, e, f);
    return ST_OK;
}

/* get's locked part: a hit counted and moved to the front, or a miss counted. (twin: store.py Store.read) */
static int get_locked(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t now, Found *f)
{
    f->hit = 0;
    if (HW(dirty) || hidden(c))
        return unready(c);
    return get_one(c, kb, klen, fp, &now, f);
}

/* The value of hit *f copied out of the arena, under the lock: the bytes after its tag, or for an array or tensor the
 * whole value, tag first, into a bytearray: the one copy of its data a get makes (the array returned is built over
 * it, its data 8-aligned as in the arena). Neither bytes nor bytearray is tracked by the GC: this allocation runs no
 * Python code. NULL with a MemoryError set. */
static PyObject *copy_value(Core *c, const Found *f)
{
    const char *v = (const char *)c->arena + f->off;
    if (f->tag == c->tag_array || f->tag == c->tag_tensor)
        return PyByteArray_FromStringAndSize(v, (Py_ssize_t)f->vlen);
    return PyBytes_FromStringAndSize(v + 1, (Py_ssize_t)(f->vlen - 1));
}

/* A store's time to live in ns: ``ttl``, or the cache's default for -1 (ST_HANDOVER if that word is damaged).
 * (twin: store.py Store.expires_at) */
static int ttl_of(Core *c, int64_t *ttl)
{
    if (*ttl < 0) {
        *ttl = HW(default_ttl);
        if (*ttl < 0 || *ttl > c->max_ttl) { /* damaged: the Python path repairs it */
            c->reason = WHY_LIMIT;
            return ST_HANDOVER;
        }
    }
    return ST_OK;
}

/* The checksum of a default time to idle of ``tti`` ns (twin: config.py tti_checksum). */
static int64_t tti_checksum(Core *c, int64_t tti)
{
    uint8_t b[8];
    memcpy(b, &tti, 8); /* (a little-endian word: the hosts this builds for) */
    return (int64_t)((xxh3_short(b, 8, 0) & (uint64_t)c->check_mask) | 1);
}

/* A store's time to idle in ns: ``tti``, or the cache's default for -1, 0 where the segment has none (before version
 * 14); ST_HANDOVER if the default's word fails its checksum (the Python path repairs it), or if this mapping does not
 * show the idle columns and the store has a time to idle or they are in use (version 16: the Python path switches
 * them on). (twin: store.py Store.expiry, config.py default_tti) */
static int tti_of(Core *c, int64_t *tti)
{
    if (c->idle == NULL) {
        *tti = 0;
        return ST_OK;
    }
    if (*tti < 0) {
        int64_t w = c->idle[D_DEFAULT_TTI], k = c->idle[D_TTI_CHECK];
        if (!(w == 0 && k == c->tti_none_check) && (w < 0 || w > c->max_ttl || k != tti_checksum(c, w))) {
            c->reason = WHY_LIMIT;
            return ST_HANDOVER;
        }
        *tti = w;
    }
    /* Version 16: a store where this mapping does not show the idle columns is the Python path's (Store.show_idle)
     * if it has a time to idle (the first one switches them on) or if D_IDLE_ON says they are in use (a switch killed
     * before its count): a store that wrote no idle words into a column in use would leave the slot's last entry's.
     * Likewise a store where the versions column is in use and not shown here (Store.show_versions). */
    if ((!IDLE_SHOWN(c) && (*tti > 0 || c->idle[D_IDLE_ON])) || (!VERSIONS_SHOWN(c) && c->idle[D_VERSIONS_ON])) {
        c->reason = WHY_GROW;
        return ST_HANDOVER;
    }
    return ST_OK;
}

/* A store's expiry words into *st, for ``ttl`` and ``tti`` (-1: the cache's defaults) from ``now``: the deadline its
 * time to live sets (0 without a time to idle), its time to idle, and the expiry, the earlier of the deadline and a tti
 * from now. (twin: store.py Store.expiry) */
static int expiry(Core *c, Encoded *st, int64_t now, int64_t ttl, int64_t tti)
{
    int r;
    if ((r = ttl_of(c, &ttl)) || (r = tti_of(c, &tti)))
        return r;
    /* Version 18: the expires column is the Python path's to switch on (Store.need_expires) where this mapping does
     * not show it, for an entry that expires, or once D_EXPIRES_ON says it is in use (a switch cut before its count) */
    if (!EXPIRES_SHOWN(c) && (ttl || tti || (c->idle != NULL && c->idle[D_EXPIRES_ON]))) {
        c->reason = WHY_GROW;
        return ST_HANDOVER;
    }
    st->expires = ttl ? now + ttl : 0;
    st->tti = tti;
    st->deadline = tti ? st->expires : 0; /* (kept for an idle entry alone: 0 beside no time to idle) */
    if (tti && (!ttl || tti < ttl))
        st->expires = now + tti;
    return ST_OK;
}

/* Hold entry ``e``, which a view pins, aside for it (version 12: detach), counted in header word ``counter``; in a
 * dirty bracket of its own. (twin: store.py Store.hold) */
static int hold(Core *c, int64_t e, int64_t *counter)
{
    HW(dirty) = 1; /* (detach opens the stripes it writes) */
    int r = detach(c, e);
    if (r)
        return r;
    ADD(*counter, 1);
    HW(dirty) = 0;
    return ST_OK;
}

/* A store's checks before its first write (the caller checked the dirty word): the key's resident entry (an expired
 * one dropped, or held aside where a view pins it: version 12) into *old, or EMPTY. ST_PINNED (before version 12): a
 * view pins that entry; nothing was written. */
STEP int put_find(Core *c, Encoded *st, int64_t now, int64_t *old)
{
    int r;
    /* The version clock is stamped mid-update: one out of range (damaged; stepping it could wrap) is repaired by
       the Python path before anything is written. */
    if (HW(version_clock) < 0 || HW(version_clock) >= c->max_version) {
        HW(dirty) = 1;
        return bounds(c);
    }
    if ((r = find(c, st->kb, st->klen, st->fp, old)))
        return r;
    if (*old != c->empty && c->exp[*old] && c->exp[*old] <= now) {
        int pin = pinned(c, *old);
        if (pin < 0)
            return bounds(c);
        if (pin && !c->holds) /* the key must never be in the index twice: a pinned expired entry refuses its
                               * replacement, or (version 12) is held aside for its views */
            return ST_PINNED;
        if ((r = pin ? hold(c, *old, &HW(expired)) : lapse(c, *old)))
            return r;
        *old = c->empty;
    }
    /* Store.write's checks before its first write: the byte limit, then a pin on the old entry. */
    if (st->size > HW(max_retained)) { /* TooLargeError, raised by the Python path */
        c->reason = WHY_LIMIT;
        return ST_HANDOVER;
    }
    if (*old != c->empty && !c->holds) { /* (version 12: asked by put_write, which holds it aside) */
        int pin = pinned(c, *old);
        if (pin)
            return pin < 0 ? bounds(c) : ST_PINNED; /* nothing written */
    }
    return ST_OK;
}

/* A store's writes, after put_find (st->expires set by the caller): an update of ``old`` in place or a new entry,
 * evicting as the limits require. ST_REFUSED: the new entry was not admitted (keep, full; or the room it needs is
 * all pinned or held: counted, the evictions made stand, every structure consistent; an ``old`` removed stays so).
 * (twin: store.py Store.write) */
STEP int put_write(Core *c, Encoded *st, int64_t old, int64_t now)
{
    int r, done;
    HW(dirty) = 1; /* (overwrite, table_remove and insert open the stripes they write) */
    if (c->holds) {
        /* What the views no longer pin, before the limits are judged (the count read here first: the walk's call
         * is made only while something is held). */
        if (c->stripes[S_HELD] != 0 && (r = reclaim_held(c)))
            return r;
        if (old != c->empty) {
            int pin = pinned(c, old);
            if (pin < 0)
                return bounds(c);
            if (pin) { /* a view reads the old value: held aside for it, the new one stored as a new entry */
                ADD(HW(updates), 1);
                if ((r = detach(c, old)))
                    return r;
                old = c->empty;
            }
        }
    }
    if (old != c->empty) {
        ADD(HW(updates), 1);
        if ((r = overwrite(c, old, st, &done)))
            return r;
        if (!done) {
            if ((r = table_remove(c, old)))
                return r;
            old = c->empty;
        }
    }
    if (old == c->empty) {
        r = insert(c, st, now);
        if (r == ST_REFUSED || r == ST_GROW) { /* refused with every structure consistent: no repair needed */
            HW(writing) = 0;
            HW(dirty) = 0;
            if (r == ST_GROW) { /* the Python path grows the arena (or raises NoSpaceError) and stores */
                c->reason = WHY_GROW;
                r = ST_HANDOVER;
            }
            return r;
        }
        if (r)
            return r;
    }
    ADD(HW(puts), 1);
    /* The time of the last store, to the second: the line is written once a second at most (unsigned, so that a
     * word ahead of ``now`` -- damaged, or another clock's -- is rewritten too). */
    if ((uint64_t)now - (uint64_t)HW(last_put) >= 1000000000u)
        HW(last_put) = now;
    HW(writing) = 0;
    HW(dirty) = 0;
    return ST_OK;
}

/* put's locked part: the encoded entry stored as the most recent. (twin: store.py Store.put) */
static int put_locked(Core *c, Encoded *st, int64_t now, int64_t ttl, int64_t tti)
{
    int64_t old;
    int r;
    if (HW(dirty) || hidden(c))
        return unready(c);
    if (now < 0)
        now = mono_ns();
    if ((r = expiry(c, st, now, ttl, tti)))
        return r;
    if ((r = put_find(c, st, now, &old)))
        return r;
    return put_write(c, st, old, now);
}

/* delete's locked part: True into *deleted if the key was live and is gone. (twin: store.py Store.delete) */
static int delete_locked(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t now, int *deleted)
{
    int64_t e;
    int r;
    *deleted = 0;
    if (HW(dirty) || hidden(c))
        return unready(c);
    if ((r = find(c, kb, klen, fp, &e)))
        return r;
    if (e == c->empty)
        return ST_OK;
    if (now < 0)
        now = mono_ns();
    int pin = pinned(c, e);
    if (pin < 0)
        return bounds(c);
    if (c->exp[e] && c->exp[e] <= now) /* expired: absent (dropped, unless a view pins it) */
        return pin ? ST_OK : lapse(c, e);
    if (pin && !c->holds)
        return ST_PINNED;
    HW(dirty) = 1; /* (pinned opened the entry's stripe) */
    if ((r = pin ? detach(c, e) : table_remove(c, e))) /* (version 12: one a view pins is held aside for it) */
        return r;
    ADD(HW(deletes), 1);
    HW(dirty) = 0;
    *deleted = 1;
    return ST_OK;
}

/* ``a - b`` where ``a`` is above ``b``, else 0 (``b`` >= 0: no overflow, whatever a damaged word holds). */
static inline int64_t above(int64_t a, int64_t b)
{
    return a > b ? a - b : 0;
}

/* One short hold's share of the evictions that lower limits will need, as the policy chooses: until at most
 * ``most_entries`` entries of ``most_bytes`` bytes are resident, or ``entries_step`` entries or ``bytes_step`` bytes
 * fewer than now, whichever comes first; into *met whether the cache is within the two (or nothing more can go: the
 * rest is pinned). The limits stay as they are. (twin: store.py Store.evict_toward) */
static int evict_toward_locked(Core *c, int64_t most_entries, int64_t most_bytes, int64_t entries_step,
                               int64_t bytes_step, int64_t now, int *met)
{
    *met = 1;
    if (HW(dirty) || hidden(c))
        return unready(c);
    int64_t entries = HW(entries), nbytes = HW(retained);
    if (entries <= most_entries && nbytes <= most_bytes)
        return ST_OK;
    int64_t to_entries = above(entries, entries_step), to_bytes = above(nbytes, bytes_step);
    to_entries = to_entries > most_entries ? to_entries : most_entries;
    to_bytes = to_bytes > most_bytes ? to_bytes : most_bytes;
    HW(dirty) = 1; /* (table_remove and the policies' evictions open the stripes they write) */
    int r = evict_until(c, above(HW(max_entries), to_entries), above(HW(max_retained), to_bytes),
                        now < 0 ? mono_ns() : now);
    if (r && r != ST_PINNED)
        return r;
    HW(dirty) = 0; /* (ST_PINNED: the rest is pinned, every structure consistent) */
    *met = r == ST_PINNED || (HW(entries) <= most_entries && HW(retained) <= most_bytes);
    return ST_OK;
}

/* The key's live entry pinned through description ``fd`` for a view, counted as a lookup (*locked: whether
 * the pin byte was locked through fd, whatever is answered). (twin: store.py Store.pin) */
static int pin_locked(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t now, int fd, Found *f, int *viewable,
                      int *locked)
{
    int64_t e;
    int r;
    f->hit = 0;
    if (HW(dirty) || hidden(c))
        return unready(c);
    if ((r = find_live(c, kb, klen, fp, &now, &e)))
        return r;
    if (e == c->empty) {
        ADD(HW(misses), 1);
        return ST_OK;
    }
    found(c, e, f);
    *viewable = tag_viewable(c, f->tag);
    if (!*viewable) {
        if (!tag_written(c, f->tag))
            return bounds(c); /* damage: the Python path counts the miss, raises, and its repair drops the entry */
        return ST_OK;         /* refused before anything is counted or pinned */
    }
    /* Ordering: the flag before the kernel lock, as Store.pin: a holder dying between the two leaves a stale flag. */
    c->pins[e] = 1;
    struct flock fl = byte_lock(F_RDLCK, c->pin_base + e);
    if (fcntl(fd, F_OFD_SETLK, &fl) < 0) /* never refused (pin bytes are only read-locked): the Python path raises */
        return bounds(c);
    *locked = 1;
    return hit(c, e, &now);
}

/* One key of a batch get: its arguments, what get_one found, and the body copied out under the lock. */
typedef struct {
    const char *kb;
    int64_t klen, fp;
    Found f;
    PyObject *body;
} Lookup;

/* Each key looked up in order as get does (a hit made the most recent and counted, a miss
 * counted, an expired entry dropped), under one hold of the lock, expiry judged by one clock reading. *done: how
 * many keys were looked up, all unless a hand-over stops the batch at keys[*done] (nothing of it counted or moved:
 * the Python path looks up the rest); -1 with a MemoryError set if a body could not be copied (keys[*done - 1]'s).
 * (twin: entries.py get_many_locked) */
static int get_many_locked(Core *c, Lookup *keys, Py_ssize_t n, int64_t now, Py_ssize_t *done)
{
    int r;
    *done = 0;
    if (HW(dirty) || hidden(c))
        return unready(c);
    for (Py_ssize_t i = 0; i < n; i++) {
        Lookup *k = &keys[i];
        if ((r = get_one(c, k->kb, k->klen, k->fp, &now, &k->f)))
            return r;
        *done = i + 1;
        if (k->f.hit && !(k->body = copy_value(c, &k->f))) /* copied before the next key is looked up */
            return -1;
    }
    return ST_OK;
}

/* Store st[0..n) in order as put does, all expiring ``ttl`` ns (-1: the default) after one
 * clock reading, under one hold of the lock. Every size is checked against the byte limit first: if one can never
 * fit, nothing is stored and the Python path raises TooLargeError. *done: how many were stored when the batch stops
 * early. One not admitted (keep, full; or its room all pinned or held) is passed, counted in *refused (of the first
 * *done), and the batch goes on. A view pinning st[*done]'s own entry (before version 12) is a hand-over
 * (WHY_PINNED, nothing of it written), so that the Python path raises its own PinnedError for it.
 * (twin: entries.py put_many_locked) */
static int put_many_locked(Core *c, Encoded *st, Py_ssize_t n, int64_t now, int64_t ttl, Py_ssize_t *done,
                           Py_ssize_t *refused)
{
    int64_t old;
    int r;
    *done = *refused = 0;
    if (HW(dirty) || hidden(c))
        return unready(c);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (st[i].size > HW(max_retained)) { /* TooLargeError, raised by the Python path before anything is stored */
            c->reason = WHY_LIMIT;
            return ST_HANDOVER;
        }
    }
    if (now < 0)
        now = mono_ns();
    Encoded times;
    if ((r = expiry(c, &times, now, ttl, -1)))
        return r;
    for (Py_ssize_t i = 0; i < n; i++) {
        st[i].expires = times.expires;
        st[i].tti = times.tti;
        st[i].deadline = times.deadline;
        if ((r = put_find(c, &st[i], now, &old))) {
            if (r == ST_PINNED) {
                c->reason = WHY_PINNED;
                r = ST_HANDOVER;
            }
            return r;
        }
        if ((r = put_write(c, &st[i], old, now)) == ST_REFUSED) /* one not admitted: the batch goes on */
            ++*refused;
        else if (r)
            return r;
        *done = i + 1;
    }
    return ST_OK;
}
