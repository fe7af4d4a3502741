/* shmcache._core, reads without the lock: a get's lookup and copy validated against the header's seq word and the
 * words of the index stripes its probe crossed, which writers make odd for the length of a hold that writes there
 * (seq_open, stripe_open, seq_close in _core_lock.c). Under s3fifo, keep and auto only (lru relinks on every hit:
 * its gets keep the lock).
 * Twin of store.py (Store.read), whose answers it gives: the Python path takes the lock for them
 * (tests/test_unlocked.py holds the two to the same answers and totals).
 *
 * The reader's protocol (docs/design.md, "Reads without the lock"): seq read (acquire), and each stripe's word as the
 * probe enters it (acquire); odd: a writer is at it, try again; the probe and the entry's words read once each
 * (relaxed atomic loads: never re-read after a check), every offset and length checked against the arena before
 * use; an acquire fence, then the words again (Window): unchanged, what was read is what one instant of the segment
 * held. Only then is the value's length trusted for an allocation, and
 * the copy is validated the same way. A hit still passes the value's checksum before it is returned or counted.
 * A read found torn is retried (counted in the reader slot's ``retries``); after UNLOCKED_TRIES, or on anything
 * unusual (an expired entry to drop, a bound failing on a quiet segment, no reader slot), it is handed to the
 * locked path (``fallbacks``).
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

#ifndef UNLOCKED_TRIES
#define UNLOCKED_TRIES 64 /* attempts before the lock is taken instead: a writer's hold is ~1 us, a big put ~50 us */
#endif

/* Whether lock-free reads are built for this machine: where the Python path's writers can order their stores
 * (seqlock.py): by x86-64's total store order, and on aarch64 with membarrier's full barriers. The reads themselves
 * are C11 atomics and fences, right on any machine; elsewhere every read takes the lock. */
#if defined(__x86_64__) || defined(__aarch64__)
#define UNLOCKED_READS 1
#else
#define UNLOCKED_READS 0
#endif

#define RD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* This handle's reader slot, or NULL: none claimed, or claimed before a fork (the child's is claimed by
 * readers.py's fork hook). */
static inline int64_t *reader_slot(Core *c)
{
    return (UNLOCKED_READS && c->rd != NULL && c->rd_fork == fork_count && c->pol->reads_unlocked) ? c->rd : NULL;
}

/* What a read without the lock validates what it read against: ``seq``, and the word of each stripe its probes
 * entered (none on a segment before version 11), each read with acquire order before anything it covers. */
typedef struct {
    int64_t seq;
    int shift;      /* slot >> shift: its stripe (stripe_shift, for the tables this mapping took) */
    uint64_t mask;  /* the stripes whose words were read */
    uint64_t probe; /* those the last probe crossed */
    int64_t seen[1 << STRIPE_BITS];
} Window;

/* A window begins: ``seq`` read. 0: it is odd (a writer is at it across the stripes). */
static inline int window_open(Core *c, Window *w)
{
    w->seq = __atomic_load_n(&HW(seq), __ATOMIC_ACQUIRE);
    w->mask = w->probe = 0;
    w->shift = stripe_shift(c); /* (stripe_of's, once a window) */
    c->stuck = -1;              /* (what this try finds odd, if anything: window_enter) */
    return !(w->seq & 1);
}

/* A probe enters index slot ``s``: its stripe's word read, unless the window read it already. 0: it is odd (a
 * writer is at it there). */
static inline int window_enter(Core *c, Window *w, int64_t s)
{
    if (c->stripes == NULL)
        return 1;
    int64_t k = s >> w->shift;
    uint64_t bit = (uint64_t)1 << k;
    w->probe |= bit;
    if (w->mask & bit)
        return 1;
    int64_t v = __atomic_load_n(&c->stripes[STRIPE_WORD(k)], __ATOMIC_ACQUIRE);
    if (v & 1) {
        c->stuck = k; /* (heal_stripe judges it, if the read ends under the lock) */
        return 0;
    }
    w->seen[k] = v;
    w->mask |= bit;
    return 1;
}

/* Whether neither ``seq`` nor the words of stripes ``m`` (of the window's) moved since they were read (the caller
 * fenced). */
static inline int window_unchanged_in(Core *c, const Window *w, uint64_t m)
{
    if (__atomic_load_n(&HW(seq), __ATOMIC_RELAXED) != w->seq)
        return 0;
    for (; m; m &= m - 1) {
        int k = __builtin_ctzll(m);
        if (__atomic_load_n(&c->stripes[STRIPE_WORD(k)], __ATOMIC_RELAXED) != w->seen[k])
            return 0;
    }
    return 1;
}

static inline int window_unchanged(Core *c, const Window *w) { return window_unchanged_in(c, w, w->mask); }

/* Whether nothing the window covers was written since it was read: what was read is what one instant held. */
static inline int window_same(Core *c, const Window *w)
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return window_unchanged(c, w);
}

/* Whether nothing the last probe read was written since: its entry's words are those of one instant (a batch's
 * check before a copy, whose length it trusts; the whole window is checked once every key is copied). */
static inline int window_same_probe(Core *c, const Window *w)
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return window_unchanged_in(c, w, w->probe);
}

/* The probe of index.find without the lock: 1 found (its entry's words into *f), 0 absent, -1 something failed a
 * bound (torn, or damage: the caller tells them apart by the window), -2 a stripe entered is odd (torn). Each
 * stripe's word is read as the probe enters it. (index.py find's probe, each word read once) */
static int find_unlocked(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t *out, Found *f, Window *w)
{
    const int64_t mask = IXMASK(c);
    int64_t s = ix_home_of(c, fp, mask);
    w->probe = 0;
    for (int64_t i = 0; i <= mask; i++) {
        if (!window_enter(c, w, s))
            return -2;
        /* (a one-word slot is read once: its tag and entry together) */
        int64_t word = RD(c->ix[c->ixpack ? s : s * c->iw + c->i_entry]);
        int64_t e = c->ixpack ? (int64_t)((uint64_t)word >> IX_SHIFT) : word;
        if (e == c->empty)
            return 0;
        if (!SLOT_OK(e))
            return -1;
        int tagged = c->ixpack ? (((uint64_t)word ^ (uint64_t)fp) & IX_TAG) == 0 && (c->narrow || RD(EFP(e)) == fp)
                               : RD(IXF(s)) == fp; /* (a narrow record has no fingerprint: as find) */
        if (tagged && ERD(e, klen) == klen) {
            int64_t off = ERD(e, off), vlen = ERD(e, vlen);
            if (!block_in_arena(c, off, vlen, klen))
                return -1;
            if (memcmp(c->arena + off + c->block_header + vlen, kb, (size_t)klen) == 0) {
                /* The entry must name this slot as its own: a writer opens the stripe of the slot the entry names
                 * (entry_open) before it writes the entry or reads its pin flag, so an entry reached through another
                 * slot (damage: two slots naming it) would not be covered by this stripe's word. */
                if (ERD(e, slot) != s)
                    return -1;
                *out = e;
                f->slot = e;
                f->off = off + c->block_header;
                f->vlen = vlen;
                f->check = ERD(e, check);
                f->tag = RD(c->arena[f->off]);
                return 1;
            }
        }
        s = ix_next(s, mask);
    }
    return -1;
}

/* A hit's counter raised without the lock (s3fifo): a compare-and-swap on the marks byte, once, so that a writer's
 * MARK_SMALL bit is never overwritten (a writer's plain store may drop the raise instead: any counter is valid).
 * (twin: policies/s3fifo.py bump) */
static inline void bump_unlocked(Core *c, int64_t e)
{
    unsigned char m = RD(c->marks[e]);
    if ((m & MARK_FREQ) != MARK_FREQ)
        __atomic_compare_exchange_n(&c->marks[e], &m, (unsigned char)(m + 1), 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* A hit read without the lock, touched as the policy does: s3fifo's and auto's counter raised, and auto's sketch
 * counting the key (fingerprint ``fp``; the sketch takes its pfp). (twin: the policy's on_hit, by the locked path's
 * hit) */
static inline void hit_unlocked(Core *c, int64_t e, int64_t fp)
{
    if (c->pol->marks_on_hit)
        bump_unlocked(c, e);
    if (c->pol->sketches)
        sketch_add(c, pfp(c, fp));
}

/* Before try ``t`` (from 1) of a read: counted as a retry, then 2**t pause instructions (at most 256). */
static inline void backoff(Core *c, int64_t *rd, int t)
{
    ADD(rd[c->r_retries], 1);
    for (int i = 0; i < (t < 8 ? 1 << t : 256); i++)
        cpu_pause();
}

/* Count in this handle's reader slot the reads of the arena without the lock under way (``on``: one begins; else
 * one ends): a resize that gives pages back waits until no live slot counts one (readers.quiesce). The store is relaxed and only a compiler barrier
 * orders it before the read's loads: the resize makes the processor-level barrier for every thread at once
 * (membarrier(MEMBARRIER_CMD_GLOBAL)) before it looks, so the read path pays no fence. The clear is a release: the
 * arena's loads are done before it shows. */
static inline void reading(Core *c, int64_t *rd, int on)
{
    /* A count, not a flag: the handle's threads share its slot, and a read may run inside another's (a finaliser the
     * copy's allocation ran). Only this handle writes it, under the GIL: no atomic read-modify-write is needed. */
    int64_t *w = &rd[c->r_reading], n = __atomic_load_n(w, __ATOMIC_RELAXED);
    if (on) {
        __atomic_store_n(w, n + 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    } else {
        __atomic_store_n(w, n > 0 ? n - 1 : 0, __ATOMIC_RELEASE);
    }
}

enum { U_DONE = 0, U_LOCK = 1, U_LOST = 2 /* (pin_unlocked) fd was closed: take another */ };

/* One get without the lock: U_DONE with *f (f->hit 0: a miss) and, for a hit, the copy in *body (copy_value's);
 * U_LOCK: take the lock instead; -1: a Python exception (no memory). Nothing is counted here. *now as find_live's. */
/* Whether the tables moved since this mapping took them (a resize, which may also have given arena pages back):
 * read after seq, before the probe, which must not read a table, or touch a page, the resize left (it would back the
 * page again); the locked path takes the new tables first (Segment.refresh_tables). */
static inline int hidden_unlocked(Core *c)
{
    if (c->shown == NULL)
        return c->ring_follows; /* (version 10 without the tables taken: the locked path, which hands over) */
    /* The tables moved: a key may be past what this mapping shows. (The index's size too, on a line no put writes: a
     * damaged count may come back to the one taken. The limit is on the occupancy's line, which every put writes:
     * not read here; a slot past those shown fails SLOT_OK, and the locked path takes the tables.) */
    return RD(HW(resizes)) != c->tables[2] || RD(HW(index_slots)) != c->tables[0];
}

/* Whether the header's arena extent differs from what this mapping shows (read as a reader reads every word): the
 * locked path shows the new part first (Segment.refresh). Read after the probe's stripe words: a growth and the
 * blocks it made room for are one hold, and a block past what is shown would read as zeros, its key as a miss. */
static inline int extent_hidden(Core *c)
{
    if (c->shown == NULL)
        return 0; /* (all of the arena shown; hidden_unlocked judged the rest) */
    int64_t ext = RD(HW(arena_extent));
    return ext != *c->shown && extent_in(ext, ring_for(c, RD(HW(capacity)))) != *c->shown;
}

/* Whether entry ``e``, found without the lock, is the locked path's to answer: expired (or an expiry out of range),
 * or (version 14) an idle entry whose expiry a hit is to move (idle_touch, which writes under the lock: so once per
 * 1/IDLE_SHARE of its tti at most). The words are read as they are; the caller validates its window after, and the
 * locked path judges them again. *now: as find_live's. */
static inline int lapsed_unlocked(Core *c, int64_t e, int64_t *now)
{
    int64_t x = RD(c->exp[e]);
    if (!x)
        return 0;
    if (*now < 0)
        *now = mono_ns();
    if (x <= *now)
        return 1;
    if (!IDLE_SHOWN(c))
        return 0;
    int64_t t = RD(c->ttis[e]);
    if (t == 0)
        return 0;
    if (t < 0 || t > c->max_ttl)
        return 1;
    int64_t fresh = *now + t, d = RD(c->deadlines[e]); /* (x > now > 0: no difference below overflows) */
    if (d > 0 && d < fresh)
        fresh = d;
    return fresh - x >= t / IDLE_SHARE;
}

static int get_unlocked(Core *c, int64_t *rd, const char *kb, int64_t klen, int64_t fp, int64_t *now, Found *f,
                        PyObject **body)
{
    Window win;
    for (int t = 0; t < UNLOCKED_TRIES; t++) {
        if (t)
            backoff(c, rd, t);
        int64_t e;
        if (!window_open(c, &win))
            continue;
        if (hidden_unlocked(c)) /* (read after seq: a resize and the tables it moved are one hold) */
            return U_LOCK;
        f->hit = 0;
        int r = find_unlocked(c, kb, klen, fp, &e, f, &win);
        if (r == -2)
            continue;
        if (extent_hidden(c)) /* (read after the stripes' words) */
            return U_LOCK;
        if (r <= 0) {
            if (!window_same(c, &win))
                continue;
            return r == 0 ? U_DONE : U_LOCK; /* a bound failed on a quiet segment: damage, the locked path judges */
        }
        if (lapsed_unlocked(c, e, now))
            return U_LOCK; /* expired: the locked path drops it (or finds it rewritten meanwhile); or idle_touch */
        if (!window_same(c, &win))
            continue; /* the length is trusted for an allocation only once validated */
        PyObject *copy = copy_value(c, f);
        if (copy == NULL)
            return -1;
        if (!window_same(c, &win)) {
            Py_DECREF(copy);
            continue;
        }
        f->hit = 1;
        *body = copy;
        return U_DONE;
    }
    return U_LOCK;
}

/* The word of reader slot ``rd`` a new pin of entry ``e`` goes into: the one already counting views of it, else a
 * free one; NULL when all are taken (the pin byte's lock then). Only this handle writes them (GIL held). */
static int64_t *free_pin_word(Core *c, int64_t *rd, int64_t e)
{
    int64_t *w = rd + c->r_pins, *free = NULL;
    for (int64_t i = 0; i < c->reader_pins; i++) {
        int64_t x = w[i];
        if ((x & PIN_SLOT_MASK) == e && (x >> 32) > 0)
            return (x >> 32) < ((int64_t)1 << 30) ? &w[i] : NULL;
        if (x == 0 && free == NULL)
            free = &w[i];
    }
    return free;
}

/* The pin of a view without the lock: the entry found as get_unlocked finds it, then pinned as Store.pin pins it
 * (the flag, then the pin byte read-locked through ``fd``), then, after a full fence, seq read again. A writer opens
 * seq and fences before it reads a pin flag (seq_open): either it sees this flag, and asks the kernel, which holds
 * the lock taken before it, or this reader sees its odd seq and lets the pin go. U_DONE with *f (f->hit 0: a miss;
 * *viewable 0: a value view() does not serve, nothing pinned) and, for a pin held, *version and *word (the reader
 * slot's pin word holding it, or NULL: the pin byte's lock through fd; ``forking``: never a word); U_LOCK: nothing
 * locked through fd any more, take the mutex instead; U_LOST: as U_LOCK, but the pin byte could not be let go, so
 * fd was closed (the locked path takes another). */
static int pin_unlocked(Core *c, int64_t *rd, const char *kb, int64_t klen, int64_t fp, int64_t *now, int fd,
                        int forking, Found *f, int *viewable, int64_t *version, int64_t **word)
{
    *word = NULL;
    Window win;
    for (int t = 0; t < UNLOCKED_TRIES; t++) {
        if (t)
            backoff(c, rd, t);
        int64_t e;
        if (!window_open(c, &win))
            continue;
        if (hidden_unlocked(c)) /* (read after seq: a resize and the tables it moved are one hold) */
            return U_LOCK;
        f->hit = 0;
        int r = find_unlocked(c, kb, klen, fp, &e, f, &win);
        if (r == -2)
            continue;
        if (extent_hidden(c)) /* (read after the stripes' words) */
            return U_LOCK;
        if (r <= 0) {
            if (!window_same(c, &win))
                continue;
            return r == 0 ? U_DONE : U_LOCK;
        }
        if (lapsed_unlocked(c, e, now))
            return U_LOCK;
        *viewable = tag_viewable(c, f->tag);
        *version = RD(c->ver[e]);
        if (!window_same(c, &win))
            continue;
        if (!*viewable) {
            if (!tag_written(c, f->tag))
                return U_LOCK; /* damage: the locked path hands it over to be judged and repaired */
            f->hit = 1;
            return U_DONE; /* refused before anything is counted or pinned */
        }
        /* Ordering: the flag before the pin, as Store.pin: a holder dying between the two leaves a stale flag,
         * never a pin nobody can see. The pin is a word of this handle's reader slot when one is free (no system
         * call: a writer finds it in slot_pinned), else the pin byte's read lock through fd. */
        __atomic_store_n(&c->pins[e], 1, __ATOMIC_RELAXED);
        int64_t *w = forking ? NULL : free_pin_word(c, rd, e), was = 0;
        if (w != NULL) {
            was = RD(*w);
            __atomic_store_n(w, was ? was + ((int64_t)1 << 32) : (e | ((int64_t)1 << 32)), __ATOMIC_RELAXED);
        } else {
            struct flock fl = byte_lock(F_RDLCK, c->pin_base + e);
            if (fcntl(fd, F_OFD_SETLK, &fl) < 0)
                return U_LOCK; /* never refused (pin bytes are only read-locked): the locked path tries again */
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the flag and the pin before the words are read again: above */
        if (window_unchanged(c, &win)) {
            f->hit = 1;
            *word = w;
            return U_DONE;
        }
        if (w != NULL) {
            __atomic_store_n(w, was, __ATOMIC_RELAXED);
            continue;
        }
        struct flock un = byte_lock(F_UNLCK, c->pin_base + e);
        if (fcntl(fd, F_OFD_SETLK, &un) < 0) {
            close(fd); /* closing drops the lock taken through it */
            return U_LOST;
        }
    }
    return U_LOCK;
}

#ifndef UNLOCKED_BATCH_TRIES
#define UNLOCKED_BATCH_TRIES 4 /* a batch's window is long: a writer met again and again sends it to the lock soon */
#endif

/* A batch get without the lock: every key looked up and copied within one window of an unchanged seq, so that the
 * batch reads one instant of the segment, as under one hold of the lock. U_DONE with keys[i].f and .body (the
 * copies) for all n keys; U_LOCK: nothing kept, take the lock; -1: a Python exception. Nothing is counted here. */
static int get_many_unlocked(Core *c, int64_t *rd, Lookup *keys, Py_ssize_t n, int64_t *now)
{
    Window win;
    for (int t = 0; t < UNLOCKED_BATCH_TRIES; t++) {
        if (t) {
            ADD(rd[c->r_retries], 1);
            for (int i = 0; i < 64 << t; i++)
                cpu_pause();
        }
        int64_t e;
        if (!window_open(c, &win))
            continue;
        if (hidden_unlocked(c)) /* (read after seq: a resize and the tables it moved are one hold) */
            return U_LOCK;
        int u = U_DONE;
        Py_ssize_t i = 0;
        for (; i < n && u == U_DONE; i++) {
            Lookup *k = &keys[i];
            k->f.hit = 0;
            int r = find_unlocked(c, k->kb, k->klen, k->fp, &e, &k->f, &win);
            if (r == -2) {
                u = -2; /* a stripe odd: torn */
            } else if (extent_hidden(c)) { /* (read after the stripes' words) */
                u = U_LOCK;
            } else if (r < 0) {
                u = U_LOCK;
            } else if (r > 0) {
                if (lapsed_unlocked(c, e, now))
                    u = U_LOCK;
                else if (!window_same_probe(c, &win))
                    u = -2; /* torn: the length is not to be trusted */
                else if (!(k->body = copy_value(c, &k->f)))
                    u = -1;
                else
                    k->f.hit = 1;
            }
        }
        int same = u != -1 && u != -2 && window_same(c, &win); /* (-2: torn, whatever the words say now) */
        if (u == U_DONE && same)
            return U_DONE;
        for (Py_ssize_t j = 0; j < i; j++)
            Py_CLEAR(keys[j].body);
        if (u == -1)
            return -1;
        if (same)
            return U_LOCK; /* an expired entry, or a bound failing on a quiet segment */
    }
    return U_LOCK;
}

static PyObject *Core_get_unlocked(Core *c, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(reader_slot(c) != NULL);
}

/* The readers.Reader whose slot this handle's reads without the lock count in, or None (they take the lock). */
static PyObject *Core_get_reader(Core *c, void *Py_UNUSED(closure))
{
    PyObject *r = reader_slot(c) != NULL && c->reader != NULL ? c->reader : Py_None;
    Py_INCREF(r);
    return r;
}
