/* shmcache._core, the table: entries inserted, overwritten, removed and evicted, every structure kept in step.
 * Twin of table.py (Table).
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

/* Whether a view without the lock of a live reader slot's holder pins entry ``e``: a pin word naming it in a slot
 * whose kernel lock is held (a dead viewer's pins end with it). 1, 0, -1 the query failed.
 * (twin: readers.py slot_pinned) */
static int slot_pinned(Core *c, int64_t e)
{
    if (!c->pol->reads_unlocked)
        return 0;
    for (int64_t r = 0; r < c->reader_slots; r++) {
        const int64_t *w = c->readers + r * c->reader_words + c->r_pins;
        for (int64_t i = 0; i < c->reader_pins; i++) {
            int64_t x = __atomic_load_n(&w[i], __ATOMIC_RELAXED);
            if ((x & PIN_SLOT_MASK) == e && (x >> 32) > 0) {
                struct flock fl = byte_lock(F_WRLCK, c->reader_base + r);
                if (fcntl(c->live_fd, F_OFD_GETLK, &fl) < 0)
                    return -1;
                if (fl.l_type != F_UNLCK)
                    return 1;
                break; /* a dead holder's: the next slot */
            }
        }
    }
    return 0;
}

/* Whether a view holds a pin on entry ``e`` now, whatever its flag says: a live reader slot's word names it, or
 * another description holds its pin byte. 1, 0, -1 the query failed. (twin: table.py Table._pin_held)
 * Ordering: the words first, then the byte. A viewer about to fork moves each word pin to the byte (_view.c
 * slot_pins_to_descriptions: the byte locked, then the word given back); asked the other way round, a query between
 * the two halves would find neither, and the entry's bytes could be reused under the view. */
static int pin_held(Core *c, int64_t e)
{
    int w = slot_pinned(c, e);
    if (w)
        return w;
    struct flock fl = byte_lock(F_WRLCK, c->pin_base + e);
    if (fcntl(c->live_fd, F_OFD_GETLK, &fl) < 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

/* Open the stripe of the index slot that points at resident entry ``e``, before the entry is written or its pins
 * asked: where a reader found it. A slot word that does not point back (damage) opens ``seq``, which every reader
 * validates. (twin: table.py Table.open_entry) */
static inline void entry_open(Core *c, int64_t e)
{
    int64_t s = ER(e, slot);
    if (s >= 0 && s <= IXMASK(c) && ix_entry(c, s) == e)
        stripe_open(c, s);
    else
        seq_open(c);
}

/* Whether a view pins entry ``e`` as the flag, the pin byte and the reader slots' words say now, without opening its
 * stripe or clearing a stale flag: what an eviction's scan decides by (moving an entry in the queues writes nothing a
 * reader reads), so that it opens only the stripes it writes; the one it removes is asked again by ``pinned``. 1, 0,
 * -1 the query failed. (twin: table.py Table.pinned_now) */
static int pinned_now(Core *c, int64_t e)
{
    if (c->holds && ER(e, slot) == HELD_SLOT)
        return 1;
    if (!c->pins[e])
        return 0;
    return pin_held(c, e);
}

/* Whether a view (of any process) still pins entry ``e``, asked before the entry is written or removed: its stripe
 * opened first (Dekker's pattern against a viewer without the lock: see seq_open), then a flagged entry is pinned
 * while another description holds its pin byte or a live reader slot's word names it; a flag found without either
 * is cleared. A held entry (version 12) is pinned until reclaim_held gives it back. 1 pinned, 0 not, -1 the query
 * failed. (twin: table.py Table.pinned) */
static int pinned(Core *c, int64_t e)
{
    if (c->holds && ER(e, slot) == HELD_SLOT)
        return 1;
    entry_open(c, e); /* before the flag is read: see seq_open */
    int p = pinned_now(c, e);
    if (p == 0 && c->pins[e])
        c->pins[e] = 0;
    return p;
}


/* Resident entry ``e`` (whose index slot ``s`` and list neighbours ``p``, ``n`` were checked) out of the index, the
 * list and the policy's queues: table_remove's and detach's common steps, after their first write. */
static inline int unindex(Core *c, int64_t e, int64_t p, int64_t n, int64_t s)
{
    int r = index_remove(c, s);
    if (r)
        return r;
    EW(p, next, n);
    EW(n, prev, p);
    c->pol->unlinked(c, e, n);
    c->marks[e] = 0;
    return ST_OK;
}

/* Entry ``e``, of ``nbytes`` key and value bytes, out of the occupancy and kind counts and the expiry column:
 * table_remove's and detach's last steps. */
static inline void uncount(Core *c, int64_t e, int64_t nbytes)
{
    ADD(HW(entries), -1);
    ADD(HW(retained), -nbytes);
    if (c->exp[e]) /* (never 0 over 0: the column may not be shown here, version 18) */
        c->exp[e] = 0;
    int64_t k = c->kinds[e];
    if (k) {
        ADD(c->kw[k * c->kww + c->k_entries], -1);
        ADD(c->kw[k * c->kww + c->k_retained], -nbytes);
    }
}

/* Drop entry ``e`` from every structure; its slot and block go back (lru.unlink and Arena.free inlined).
 * (twin: table.py Table.remove) */
static int table_remove(Core *c, int64_t e)
{
    if (!SLOT_OK(e))
        return bounds(c);
    int64_t p = ER(e, prev), n = ER(e, next), off = ER(e, off), klen = ER(e, klen), vlen = ER(e, vlen),
            s = ER(e, slot);
    if (!(s >= 0 && s <= IXMASK(c) && ix_entry(c, s) == e && LINK_OK(p) && LINK_OK(n) && LEN_OK(klen) && LEN_OK(vlen)))
        return bounds(c);
    int64_t nb = block_nbytes(c, klen + vlen);
    /* arena free: the block must be this entry's own */
    if (!(off >= 0 && off < c->arena_nbytes && off % 8 == 0 && AW(off) == (nb | (e << c->owner_shift))))
        return bounds(c);
    stripe_open(c, s);
    AW(off) = nb;
    ADD(HW(arena_used), -nb);
    int r = unindex(c, e, p, n, s);
    if (r)
        return r;
    EW(e, check, 0);
    EW(e, next, HW(free_head));
    HW(free_head) = e;
    uncount(c, e, klen + vlen);
    return ST_OK;
}

/* The held entries' count and bytes (version 12; 0 before it) into *n and *nbytes; bounds() if a word is out of
 * range. (twin: table.py Table.held) */
static int held_counts(Core *c, int64_t *n, int64_t *nbytes)
{
    *n = *nbytes = 0;
    if (!c->holds)
        return ST_OK;
    int64_t h = c->stripes[S_HELD], b = c->stripes[S_HELD_BYTES];
    if (!(h >= 0 && h < c->tables[1] && b >= 0 && b <= c->arena_nbytes && (h == 0) == (b == 0)))
        return bounds(c);
    *n = h;
    *nbytes = b;
    return ST_OK;
}

/* Hold resident entry ``e``, which a view pins, aside (version 12): out of the index, the list, the queues and the
 * occupancy counts, so that its key is free for a new entry at once, its slot and block kept for the views until
 * reclaim_held finds its pins all ended. (twin: table.py Table.detach) */
static int detach(Core *c, int64_t e)
{
    if (!SLOT_OK(e))
        return bounds(c);
    int64_t p = ER(e, prev), n = ER(e, next), off = ER(e, off), klen = ER(e, klen), vlen = ER(e, vlen),
            s = ER(e, slot), held, held_bytes;
    if (!(s >= 0 && s <= IXMASK(c) && ix_entry(c, s) == e && LINK_OK(p) && LINK_OK(n) && LEN_OK(klen) && LEN_OK(vlen)))
        return bounds(c);
    int64_t nb = block_nbytes(c, klen + vlen);
    if (!(off >= 0 && off <= c->arena_nbytes - nb && off % 8 == 0 && AW(off) == (nb | (e << c->owner_shift))))
        return bounds(c);
    int r = held_counts(c, &held, &held_bytes);
    if (r)
        return r;
    stripe_open(c, s);
    /* Crash window: the slot word first. From here on a repair takes the entry for a held one, never for a resident
     * one: its key's new entry may be stored beside it. */
    EW(e, slot, HELD_SLOT);
    if ((r = unindex(c, e, p, n, s)))
        return r;
    EW(e, next, c->stripes[S_HELD_FIRST]);
    c->stripes[S_HELD_FIRST] = e;
    c->stripes[S_HELD] = held + 1;
    c->stripes[S_HELD_BYTES] = held_bytes + klen + vlen;
    uncount(c, e, klen + vlen);
    return ST_OK;
}

/* Give back the slot and block of every held entry whose pins have all ended (a walk of the held list, a kernel
 * query per entry). (twin: table.py Table.reclaim_held) */
static int reclaim_held(Core *c)
{
    int64_t held, held_bytes;
    int r = held_counts(c, &held, &held_bytes);
    if (r || !held)
        return r;
    int64_t prev = c->nil, e = c->stripes[S_HELD_FIRST], count = held;
    for (int64_t i = 0; i < count; i++) {
        if (!SLOT_OK(e) || ER(e, slot) != HELD_SLOT || !ER(e, check))
            return bounds(c);
        int64_t after = ER(e, next);
        int pin = pin_held(c, e);
        if (pin < 0)
            return bounds(c);
        if (pin) {
            prev = e;
        } else {
            int64_t klen = ER(e, klen), vlen = ER(e, vlen), off = ER(e, off);
            if (!LEN_OK(klen) || !LEN_OK(vlen))
                return bounds(c);
            int64_t nb = block_nbytes(c, klen + vlen);
            if (!(off >= 0 && off < c->arena_nbytes && off % 8 == 0 && AW(off) == (nb | (e << c->owner_shift))))
                return bounds(c);
            /* Crash window: the block first, then the slot off the held list and onto the free list. */
            AW(off) = nb;
            ADD(HW(arena_used), -nb);
            if (prev == c->nil)
                c->stripes[S_HELD_FIRST] = after;
            else
                EW(prev, next, after);
            EW(e, check, 0);
            EW(e, slot, 0);
            c->pins[e] = 0;
            EW(e, next, HW(free_head));
            HW(free_head) = e;
            held--;
            held_bytes -= klen + vlen;
            c->stripes[S_HELD] = held;
            c->stripes[S_HELD_BYTES] = held_bytes;
        }
        e = after;
    }
    if (e != c->nil || held_bytes < 0 || (held == 0) != (held_bytes == 0))
        return bounds(c);
    return ST_OK;
}

/* Remove every expired entry no view pins, then raise next_expiry to what is left.
 * (twin: table.py Table.reclaim_expired) */
static int reclaim_expired(Core *c, int64_t now)
{
    int64_t un = HW(unused_next), handed_out = (un > 0 && un <= c->slots) ? un : c->slots, removed = 0;
    for (int64_t e = 0; e < handed_out; e++) {
        int64_t x = c->exp[e];
        if (x != 0 && x <= now && ER(e, check)) {
            int p = pinned(c, e);
            if (p < 0)
                return bounds(c);
            if (!p) {
                int r = table_remove(c, e);
                if (r)
                    return r;
                removed++;
            }
        }
    }
    int64_t least = c->never;
    int any = 0;
    for (int64_t e = 0; e < handed_out; e++) {
        int64_t x = c->exp[e];
        if (x != 0 && (!any || x < least)) {
            least = x;
            any = 1;
        }
    }
    HW(next_expiry) = any ? least : c->never;
    ADD(HW(expired), removed);
    return ST_OK;
}

/* Make room for ``more`` more entries of ``size`` more bytes: expired entries first, then the least recently used,
 * pinned ones excepted. (twin: table.py Table.evict_until) */
static int evict_until(Core *c, int64_t more, int64_t size, int64_t now)
{
    int64_t held, held_bytes;
    int r0 = held_counts(c, &held, &held_bytes);
    if (!r0 && held) /* held entries count against the limits: those whose pins ended go back first */
        r0 = reclaim_held(c) || held_counts(c, &held, &held_bytes);
    if (r0)
        return bounds(c);
    int64_t most_entries, most_bytes; /* (as word_sum: a result out of range is damage) */
    if (__builtin_sub_overflow(HW(max_entries), more, &most_entries)
        || __builtin_sub_overflow(most_entries, held, &most_entries)
        || __builtin_sub_overflow(HW(max_retained), size, &most_bytes)
        || __builtin_sub_overflow(most_bytes, held_bytes, &most_bytes))
        return bounds(c);
    if (HW(entries) <= most_entries && HW(retained) <= most_bytes)
        return ST_OK;
    if (HW(next_expiry) != c->never && HW(next_expiry) <= now) {
        int r = reclaim_expired(c, now);
        if (r)
            return r;
    }
    if (!c->pol->evicts_from_tail) { /* the policy's own choice, one at a time */
        for (int64_t i = 0; i < c->slots; i++) {
            if (HW(entries) <= most_entries && HW(retained) <= most_bytes)
                return ST_OK;
            int done, r = c->pol->evict_one(c, &done);
            if (r)
                return r;
            if (!done)
                return ER(c->sentinel, next) != c->sentinel || held ? ST_PINNED : bounds(c);
        }
        return bounds(c);
    }
    /* lru and keep: from the back of the list (the least recently used; keep's oldest), pinned ones passed over. */
    int64_t e = ER(c->sentinel, prev), passed = 0;
    for (int64_t i = 0; i < c->slots; i++) {
        if (HW(entries) <= most_entries && HW(retained) <= most_bytes)
            return ST_OK;
        if (e == c->sentinel)
            break;
        if (!SLOT_OK(e))
            return bounds(c);
        int64_t p = ER(e, prev);
        int pin = pinned(c, e);
        if (pin < 0)
            return bounds(c);
        if (pin) {
            passed++;
        } else {
            int r = table_remove(c, e);
            if (r)
                return r;
            ADD(HW(evictions), 1);
        }
        e = p;
    }
    return passed || held ? ST_PINNED : bounds(c);
}

/* Evict the entry nearest the back of the list that no view pins; *done 0 if there is none.
 * (twin: table.py Table.evict_oldest) */
static int evict_oldest(Core *c, int *done)
{
    int64_t e = ER(c->sentinel, prev);
    for (int64_t i = 0; i < c->slots; i++) {
        if (e == c->sentinel) {
            *done = 0;
            return ST_OK;
        }
        if (!SLOT_OK(e))
            return bounds(c);
        int pin = pinned(c, e);
        if (pin < 0)
            return bounds(c);
        if (!pin) {
            c->pol->leaving(c, e);
            int r = table_remove(c, e);
            if (r)
                return r;
            ADD(HW(evictions), 1);
            *done = 1;
            return ST_OK;
        }
        e = ER(e, prev);
    }
    return bounds(c);
}

/* Evict the entry no view pins that the policy chooses; *done 0 if there is none. (twin: table.py Table.evict_one) */
static int evict_one(Core *c, int *done)
{
    return c->pol->evict_one(c, done);
}

/* Whether one more entry of ``size`` bytes fits the limits once expired entries are dropped (keep), into *fits.
 * (twin: table.py Table.room_without_evicting) */
static int room_without_evicting(Core *c, int64_t size, int64_t now, int *fits)
{
    if (HW(next_expiry) != c->never && HW(next_expiry) <= now) {
        int r = reclaim_expired(c, now);
        if (r)
            return r;
    }
    int64_t held, held_bytes;
    if (held_counts(c, &held, &held_bytes))
        return bounds(c);
    int64_t want_entries, want_bytes;
    if (word_sum(HW(entries), held, 0, &want_entries) || word_sum(HW(retained), held_bytes, size, &want_bytes))
        return bounds(c);
    *fits = want_entries < HW(max_entries) && want_bytes <= HW(max_retained);
    return ST_OK;
}

/* A hit on resident entry ``e`` as the policy takes it: lru moves it to the front (the caller raised the dirty
 * word), s3fifo raises its counter, keep does nothing. (twin: table.py Table.touch) */
static inline int touch(Core *c, int64_t e)
{
    return c->pol->on_hit(c, e);
}


/* The columns a store writes: a new version, the expiry (lowering the bound if need be), and (version 14) the time
 * to idle and deadline. */
static inline void stamp(Core *c, int64_t e, const Encoded *st)
{
    int64_t v = (int64_t)((uint64_t)HW(version_clock) + 1), expires = st->expires;
    HW(version_clock) = v;
    if (VERSIONS_SHOWN(c)) /* (else no caller has asked for a version: version 16) */
        c->ver[e] = v;
    if (expires != c->exp[e]) /* (never 0 over 0: the column may not be shown here, version 18: EXPIRES_SHOWN) */
        c->exp[e] = expires;
    if (IDLE_SHOWN(c)) { /* (else no store has a time to idle: tti_of) */
        c->ttis[e] = st->tti;
        c->deadlines[e] = st->deadline;
    }
    if (expires && expires < HW(next_expiry))
        HW(next_expiry) = expires;
}

/* A new entry as the most recently used (the key is absent), evicting first as the limits require: expired entries,
 * then the least recently used, pinned ones excepted; and, if pinned blocks split the free space so that no run of
 * st->nb bytes is left, more (what is not pinned) until one is. The one place eviction is decided, as in Python.
 * ST_REFUSED: not admitted, counted (keep with no room left; or what is left to evict is all pinned or held, or
 * pinned blocks split the free space: the evictions made stand, every structure is consistent).
 * (twin: table.py Table.insert) */
static int insert(Core *c, const Encoded *st, int64_t now)
{
    int64_t e, off = 0, vlen = st->blen + 1;
    int r, from_free, done;
    /* Asked before evicting (s3fifo's ghost, whose keys may take this one's ghost slot). */
    int probation = c->pol->admit(c, pfp(c, st->fp));
    /* A restored entry goes where its marks say, with its counter (asked all the same: what admit counts, as for any
     * new key). (twin: table.py Table.insert, placed) */
    int64_t placed = c->pol->marks_on_hit ? st->marks : -1;
    if (placed >= 0)
        probation = (placed & MARK_SMALL) != 0;
    int64_t held, held_bytes; /* (held entries count against the limits) */
    if ((r = held_counts(c, &held, &held_bytes)))
        return r;
    int64_t want_entries, want_bytes;
    if (word_sum(HW(entries), held, 0, &want_entries) || word_sum(HW(retained), held_bytes, st->size, &want_bytes))
        return bounds(c);
    if (want_entries >= HW(max_entries) || want_bytes > HW(max_retained)) {
        if (c->pol->evicts_to_admit) {
            if ((r = evict_until(c, 1, st->size, now))) {
                if (r != ST_PINNED)
                    return r;
                ADD(HW(not_admitted), 1); /* the rest is pinned or held: not admitted */
                return ST_REFUSED;
            }
        } else {
            int fits;
            if ((r = room_without_evicting(c, st->size, now, &fits)))
                return r;
            if (!fits) {
                ADD(HW(not_admitted), 1);
                return ST_REFUSED;
            }
        }
    }
    /* The slot is chosen first (its number goes in the block header) but taken only once the block is had: an
     * allocation refused because pinned blocks split the free space leaves the slots as they were (an eviction then
     * frees a slot, so the choice is made again). ``writing`` names the slot once it is known to be free. */
    for (;;) {
        e = HW(free_head);
        from_free = e != c->nil;
        if (!from_free) {
            e = HW(unused_next);
            if (!SLOT_OK(e) || e >= c->tables[1]) /* (past the slots shown: only damage puts it there) */
                return bounds(c);
        } else if (!SLOT_OK(e) || ER(e, check)) {
            return bounds(c);
        }
        HW(writing) = e;
        r = alloc(c, st->nb, e, &off);
        if (r != ST_PINNED)
            break;
        if (!c->pol->evicts_to_admit) { /* no room but what evicting would make: not admitted */
            HW(writing) = 0;
            ADD(HW(not_admitted), 1);
            return ST_REFUSED;
        }
        if ((r = evict_one(c, &done)))
            return r;
        if (!done) { /* pinned blocks split what is left: not admitted */
            HW(writing) = 0;
            ADD(HW(not_admitted), 1);
            return ST_REFUSED;
        }
    }
    if (r)
        return r;
    if (from_free)
        HW(free_head) = ER(e, next);
    else
        HW(unused_next) = e + 1;
    unsigned char *v0 = c->arena + off + c->block_header; /* a block is [header][value][key] */
    v0[0] = (unsigned char)st->tag;
    memcpy(v0 + 1, st->body, (size_t)st->blen);
    memcpy(v0 + vlen, st->kb, (size_t)st->klen);
    const int64_t mask = IXMASK(c);
    int64_t s = ix_home_of(c, st->fp, mask), i;
    for (i = 0; i <= mask && ix_entry(c, s) != c->empty; i++)
        s = ix_next(s, mask);
    if (i > mask)
        return bounds(c);
    stripe_open(c, s); /* (the entry and its block are no reader's until the slot names them) */
    /* Where it is linked: at the front (lru, keep, and main under s3fifo), or small's front. */
    int64_t p, n;
    if ((r = c->pol->link_new(c, e, probation, &p, &n)))
        return r;
    if (placed > 0)
        c->marks[e] |= (uint8_t)(placed & MARK_FREQ);
    EW(e, prev, p);
    EW(e, next, n);
    if (!c->narrow)
        EFP(e) = st->fp;
    EW(e, off, off);
    EW(e, klen, st->klen);
    EW(e, vlen, vlen);
    EW(e, slot, s);
    EW(e, check, st->check);
    ix_put(c, s, st->fp, e);
    EW(n, prev, e);
    EW(p, next, e);
    ADD(HW(entries), 1);
    ADD(HW(admitted), 1);
    ADD(HW(retained), st->klen + vlen);
    stamp(c, e, st);
    c->pins[e] = 0;
    if (st->klen > 1 && (unsigned char)st->kb[0] == c->kind_prefix) {
        int64_t k = (unsigned char)st->kb[1];
        c->kinds[e] = (unsigned char)k;
        ADD(c->kw[k * c->kww + c->k_entries], 1);
        ADD(c->kw[k * c->kww + c->k_retained], st->klen + vlen);
    } else {
        c->kinds[e] = 0;
    }
    return ST_OK;
}

/* A new value for resident entry ``e`` in place, when the block size is the same and the byte
 * limit allows; *done 0 (nothing written) otherwise.  (twin: table.py Table.overwrite) */
static int overwrite(Core *c, int64_t e, const Encoded *st, int *done)
{
    int64_t klen = ER(e, klen), old_vlen = ER(e, vlen), off = ER(e, off), vlen = st->blen + 1;
    int64_t held, held_bytes;
    *done = 0;
    if (!LEN_OK(klen) || !LEN_OK(old_vlen) || held_counts(c, &held, &held_bytes))
        return bounds(c);
    int64_t want_bytes; /* (the lengths are checked: their difference is in range) */
    if (word_sum(HW(retained), held_bytes, vlen - old_vlen, &want_bytes))
        return bounds(c);
    if (block_nbytes(c, klen + old_vlen) != st->nb || want_bytes > HW(max_retained) || !SLOT_OK(e))
        return ST_OK;
    if (!(off >= 0 && off <= c->arena_nbytes - st->nb && off % 8 == 0 && AW(off) == (st->nb | (e << c->owner_shift))))
        return bounds(c);
    entry_open(c, e);
    HW(writing) = e;
    unsigned char *v0 = c->arena + off + c->block_header;
    v0[0] = (unsigned char)st->tag;
    memcpy(v0 + 1, st->body, (size_t)st->blen);
    if (vlen != old_vlen) {
        memcpy(v0 + vlen, st->kb, (size_t)klen);
        EW(e, vlen, vlen);
        ADD(HW(retained), vlen - old_vlen);
        int64_t k = c->kinds[e];
        if (k)
            ADD(c->kw[k * c->kww + c->k_retained], vlen - old_vlen);
    }
    EW(e, check, st->check);
    int r = touch(c, e);
    if (r)
        return r;
    stamp(c, e, st);
    *done = 1;
    return ST_OK;
}

