/* shmcache._core's shared definitions: the Core object (one per attached handle), the words it addresses the
 * segment with, and the outcomes of a locked section. Included once, by _core.c, before the parts it includes; each
 * part includes it too (a no-op there) so that it reads on its own. */
#ifndef SHMCACHE_CORE_H
#define SHMCACHE_CORE_H

#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* F_OFD_GETLK (as pyconfig.h defines it, so its own definition is no redefinition) */
#endif
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h> /* offsetof (the weak reference list of Core) */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <limits.h>
#include <linux/futex.h>

#include "_unpack.h"
#include "_view.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the segment's words are little-endian; this build reads them as native int64"
#endif

/* Outcomes of a locked section, other than success (0). */
enum {
    ST_OK = 0,
    ST_HANDOVER = 1, /* hand over to the Python path; the reason says why */
    ST_PINNED = 2,   /* a view pins what the call must change; the segment is consistent: raise PinnedError */
    ST_REFUSED = 3,  /* the policy did not admit a new entry (keep, full): nothing stored, every structure consistent */
    ST_GROW = 4,     /* the arena's extent could not grow (/dev/shm full): every structure consistent; the store is
                      * handed over (WHY_GROW), and the Python path raises NoSpaceError */
};

/* The eviction policies and an entry's marks (layout/dtypes.py's POLICY_*, MARK_*, GHOST_*: bind checks that the
 * layout says the same). */
enum { POLICY_LRU = 0, POLICY_S3FIFO = 1, POLICY_KEEP = 2, POLICY_AUTO = 3, POLICY_COUNT = 4 };
enum { MARK_FREQ = 3, MARK_SMALL = 4, GHOST_WAYS = 16, GHOST_STAMP_BITS = 32, PROMOTE_AT = 2 };
/* auto's state words (the sketch's first block), its sketch's blocks and its tuning (layout/dtypes.py A_*,
 * policies/auto.py: bind checks that they say the same). */
enum { A_TARGET, A_STEP, A_LAST_PPM, A_REQUESTS, A_HITS, A_PERIODS, A_PREFERRED, A_REFUSED, SKETCH_BLOCK_WORDS = 8 };
enum {
    WINDOW_PERCENT = 1, ADMIT_MARGIN = 1, PERIOD_PER_ENTRY = 10, CHECK_EVERY = 64, STEP_PER_10000 = 625,
    RESTART_PPM = 50000, DECAY_PERCENT = 98, STEP_UNIT = 1024, PPM = 1000000, PERIOD_MAX = 65536, JUMP_SHARE = 8,
    GROW_SHARE = 2048, PPM_BITS = 20, PROMOTED_BITS = 40
};
#define MAX_COUNTER ((int64_t)1 << 62) /* layout/dtypes.py: a counter's bound */
#define GHOST_STAMP_MASK ((uint64_t)0xFFFFFFFFu)
#define PIN_SLOT_MASK 0xFFFFFFFFLL /* a reader slot's pin word: (count << 32) | entry slot (layout/dtypes.py) */

/* Why a call was handed over (Core.reason, and the REASONS dict of the module). */
enum {
    WHY_NONE, WHY_DIRTY, WHY_KIND, WHY_REENTERED, WHY_OWNERDEAD, WHY_TIMEOUT, WHY_BOUNDS, WHY_RELEASED,
    WHY_LIMIT, WHY_LOCK, WHY_PINNED, WHY_GROW, WHY_COUNT
};
static const char *const why_names[WHY_COUNT] = {
    "none", "dirty", "kind", "reentered", "ownerdead", "timeout", "bounds", "released", "limit", "lock", "pinned", "grow",
};


typedef struct {
    PyObject_HEAD
    Py_buffer buf;
    int have_buf;   /* the export is held */
    int released;   /* release() was called: no new section starts; the export goes with the last one */
    int bound;      /* __init__ completed: until then (and after a failed one) every call hands over */
    int users;      /* calls inside a method (one may wait with the GIL released) */
    int reason;     /* WHY_* of the last hand-over */
    long long waits; /* calls that found the lock busy and waited for it in C */
    int live_fd;    /* the handle's description for pin queries (segment.live_fd) */
    int64_t timeout_ns;
    PyObject *fallback;   /* the handle's core.HandOver, which takes what C hands over (NULL: answer HANDOVER) */
    PyObject *unviewable; /* the fallback's UNVIEWABLE: view's answer for a value it does not serve */
    PyObject *weakreflist; /* a handle's finaliser holds the Core weakly (cache.py _release) */
    /* regions */
    unsigned char *mem;
    int64_t *h, *ix, *ent, *exp, *ver, *kw, *aw;
    unsigned char *kinds, *pins, *marks, *arena;
    int64_t *ghost;     /* the ghost's words (s3fifo, auto's sketch), ghost_slots reserved (a power of two, at least
                         * GHOST_WAYS); in force: GHOST_LIVE */
    int64_t ghost_slots;
    int ghost_shift;    /* the ghost's words in force are the index's slots shifted down by this, ghost_floor at
                         * least: 1 and SKETCH_MIN_WORDS for auto's sketch from version 16, else 0 and GHOST_WAYS
                         * (layout/geometry.py Geometry.ghost_for) */
    int64_t ghost_floor;
    const struct PolicyOps *pol; /* the segment's policy (_core_policy.c), chosen at bind: asked, never its number */
    /* reads without the lock (_core_unlocked.c) */
    int64_t *readers;   /* the reader slots' words, reader_slots records of reader_words */
    /* the stripes' words (layout version 11; NULL before it: seq alone): word S_OPEN the mask of the stripes the hold
     * under way opened, stripe k's sequence word at STRIPE_WORD(k), alone on its line (seqlock.py) */
    int64_t *stripes;
    /* version 12: a pinned entry a put or delete of its key meets is held aside (detach), not refused */
    int holds;
    /* version 14 (NULL before it): the idle region's words (D_DEFAULT_TTI, D_TTI_CHECK), and its columns: each
     * entry's time to idle and the deadline its time to live set (layout/dtypes.py) */
    int64_t *idle, *ttis, *deadlines;
    int64_t tti_none_check; /* the checksum of a default time to idle of 0 (config.tti_checksum(0)) */
    int64_t stuck; /* the stripe the last try of this handle's last read without the lock found odd (-1: none) */
    int64_t reader_slots, reader_words;
    int64_t *rd;        /* this handle's reader slot (NULL: none; every read takes the lock) */
    unsigned long rd_fork; /* fork_count when rd was claimed: a forked child never counts in its parent's slot */
    PyObject *reader;   /* what holds the slot (readers.Reader), kept while rd points into it */
    Py_ssize_t r_hits, r_misses, r_retries, r_fallbacks, r_pins, r_reading;
    int64_t reader_pins, reader_base; /* pin words per slot; the kernel lock byte of slot 0 (readers.READER_BASE) */
    uint32_t *lockword;   /* the lock's futex word: holder's thread id | WAITERS (lock.py), atomics only */
    uint32_t *holderword; /* the holder's holder slot + 1, stored after the word is taken, cleared before release */
    uint32_t *wakesword;  /* the wake count sleepers wait on */
    uint32_t holder_slot; /* this handle's holder slot + 1 (0: none), set from lock.HolderSlot */
    unsigned long holder_slot_fork; /* fork_count when it was set: a forked child's holds name no slot */
    int64_t holder_base, holder_slots; /* the OFD byte of holder slot 0 (lock.HOLDER_BASE), and their count */
    /* geometry: slots and index_slots are what the tables are reserved for */
    int64_t slots, index_slots, arena_nbytes;
    /* the tables in force (layout version 10 moves them: Segment.show_tables), words 1-5 of the mapping's cell
     * (watch_extent; own_tables until it is bound): the index's slots in force (IXMASK), the entry slots this mapping
     * shows (a slot past them is private zero pages: never handed out), the header's ``resizes`` when the Python
     * path last took them from the header, the entry limit then, and the lazy columns the mapping shows (IDLE_SHOWN,
     * VERSIONS_SHOWN; version 16 shows each once it is in use). A call that finds ``resizes`` moved is handed over
     * (WHY_GROW) before anything is read or written, and the Python path takes the new tables
     * (Segment.refresh_tables). */
    int64_t *tables;
    int64_t own_tables[5];
    /* the ring (arena.py): its size follows the header's capacity word (ring_nbytes), at most capacity_most (the
     * geometry's capacity_bytes), with room for ring_entries block headers of block_overhead bytes (ring_by_limit,
     * versions 10 to 12: the entry limit taken with the tables instead). ring_follows: version 10 or later (tables
     * that a resize moves) */
    int64_t capacity_most, ring_entries, block_overhead;
    int ring_follows, ring_by_limit;
    /* the arena's extent (arena.py): how far this handle's mapping shows the file's arena, backed (the segment's
     * cell, Segment.shown, bound by watch_extent; NULL: all of it), and the growth's step. A store that grows the
     * arena backs and shows the new part itself (reach); a call that finds the header's extent past what is shown
     * (another process grew it) is handed over before anything is done (WHY_GROW), and the Python path shows it
     * (Segment.refresh), as is a growth /dev/shm cannot back (NoSpaceError). */
    int64_t *shown;
    Py_buffer shown_buf;
    int have_shown;
    int64_t extent_step;
    int64_t page; /* the system's page size (sysconf): what MAP_FIXED swaps */
    /* word numbers */
    Py_ssize_t ew, iw, kww;
    Py_ssize_t e_prev, e_next, e_fp, e_off, e_klen, e_vlen, e_slot, e_check;
    Py_ssize_t i_fp, i_entry, k_entries, k_retained;
    int ixpack; /* version 15: an index slot is one word, (entry << IX_SHIFT) | the fingerprint's low bits (ix_*) */
    int ixrange; /* version 17: the index has any number of slots, a key's home its tag scaled to them (ix_home_of) */
    int narrow; /* version 19 (Geometry.narrow): the entry records are narrow, 32 bytes (ER, EW, ERD) */
    Py_ssize_t h_hits, h_misses, h_puts, h_updates, h_deletes, h_evictions, h_dirty, h_entries, h_retained,
        h_max_entries, h_max_retained, h_head, h_tail, h_fill, h_arena_used, h_free_head, h_unused_next,
        h_version_clock, h_next_expiry, h_expired, h_default_ttl, h_writing, h_progress, h_last_put, h_admitted,
        h_small_first, h_small, h_ghost_clock, h_not_admitted, h_promoted, h_ghost_hits, h_seq, h_arena_extent,
        h_capacity, h_resizes, h_index_slots;
    /* constants */
    int64_t block_header, block_align, max_block, len_mask, owner_shift, empty, nil, sentinel, never, max_ttl,
        max_version, kind_prefix, pin_base, check_mask, tag_bytes, tag_msgpack, tag_array, tag_tensor, tag_pickle;
} Core;

#define HW(f) (c->h[c->h_##f])
/* An entry's record (layout/dtypes.py ENTRY, ENTRY_NARROW; records.py), field ``f`` of entry ``e``: ER reads it as
 * an int64, EW writes it, ERD reads it with a relaxed atomic load (reads without the lock, _core_unlocked.c). A wide
 * record is eight words, at the word numbers bind took (e_*). A narrow one (c->narrow) is 32 bytes at the fixed
 * offsets NR_* (layout/dtypes.py ENTRY_NARROW): prev, next and slot int32 (read sign-extended), the lengths uint32,
 * the block's offset uint32 in units of 8 (NR_OFF_SHIFT: read back in bytes), the check a word; no fingerprint (EFP:
 * wide records only; entry_pfp stands for it in the policies). The field is a constant at each site: once inlined,
 * the narrow switch folds to one load or store. */
enum { NR_prev = 0, NR_next = 4, NR_slot = 8, NR_klen = 12, NR_vlen = 16, NR_off = 20, NR_check = 24, NR_BYTES = 32 };
#define NR_OFF_SHIFT 3
#define ENT_STEP static inline __attribute__((always_inline))
ENT_STEP unsigned char *nr_field(const Core *c, int64_t e, int at)
{
    return (unsigned char *)c->ent + e * NR_BYTES + at;
}
ENT_STEP int64_t ent_read(const Core *c, int64_t e, Py_ssize_t w, int at)
{
    if (!c->narrow)
        return c->ent[e * c->ew + w];
    const unsigned char *p = nr_field(c, e, at);
    switch (at) {
    case NR_prev: case NR_next: case NR_slot:
        return *(const int32_t *)p;
    case NR_off:
        return (int64_t)*(const uint32_t *)p << NR_OFF_SHIFT;
    case NR_check:
        return *(const int64_t *)p;
    default: /* the lengths */
        return *(const uint32_t *)p;
    }
}
ENT_STEP int64_t ent_load(const Core *c, int64_t e, Py_ssize_t w, int at)
{
    if (!c->narrow)
        return __atomic_load_n(&c->ent[e * c->ew + w], __ATOMIC_RELAXED);
    const unsigned char *p = nr_field(c, e, at);
    switch (at) {
    case NR_prev: case NR_next: case NR_slot:
        return __atomic_load_n((const int32_t *)p, __ATOMIC_RELAXED);
    case NR_off:
        return (int64_t)__atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED) << NR_OFF_SHIFT;
    case NR_check:
        return __atomic_load_n((const int64_t *)p, __ATOMIC_RELAXED);
    default:
        return __atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED);
    }
}
/* (every value written fits its narrow field: an entry slot, an index slot below 2**31 or HELD_SLOT, a length below
 * 2**32, an offset below 2**35 and a multiple of 8; bind refuses a narrow layout where one would not) */
ENT_STEP void ent_write(Core *c, int64_t e, Py_ssize_t w, int at, int64_t v)
{
    if (!c->narrow) {
        c->ent[e * c->ew + w] = v;
        return;
    }
    unsigned char *p = nr_field(c, e, at);
    switch (at) {
    case NR_prev: case NR_next: case NR_slot:
        *(int32_t *)p = (int32_t)v;
        break;
    case NR_off:
        *(uint32_t *)p = (uint32_t)((uint64_t)v >> NR_OFF_SHIFT);
        break;
    case NR_check:
        *(int64_t *)p = v;
        break;
    default:
        *(uint32_t *)p = (uint32_t)v;
    }
}
#define ER(e, f) ent_read(c, (e), c->e_##f, NR_##f)
#define ERD(e, f) ent_load(c, (e), c->e_##f, NR_##f)
#define EW(e, f, v) ent_write(c, (e), c->e_##f, NR_##f, (v))
#define EFP(e) (c->ent[(e) * c->ew + c->e_fp]) /* a wide record's fingerprint (a narrow one has none) */
/* The index's slots (index.py Wide, Packed; layout/dtypes.py INDEX_SLOT, INDEX_SLOT_PACKED): two words, the fingerprint
 * and the entry (IXF, IXE), before layout version 15; one word from it, (entry << IX_SHIFT) | the fingerprint's low 32
 * bits, its tag and its home slot's bits (every index is at most 2**32 slots). A slot is empty when its entry is EMPTY,
 * whatever its other bits. Every access goes through ix_*, which ask which. */
#define IXF(s) (c->ix[(s) * c->iw + c->i_fp])
#define IXE(s) (c->ix[(s) * c->iw + c->i_entry])
#define IX_SHIFT 32
#define IX_TAG 0xFFFFFFFFull
/* The entry slot ``s`` holds (EMPTY: none). (twin: index.py Wide.entry, Packed.entry) */
static inline int64_t ix_entry(const Core *c, int64_t s)
{
    return c->ixpack ? (int64_t)((uint64_t)c->ix[s] >> IX_SHIFT) : IXE(s);
}
/* Bits of slot ``s`` whose low ones are its key's home slot (under any mask of the index): the fingerprint, or the
 * word itself (its tag is the low bits). */
static inline int64_t ix_home(const Core *c, int64_t s) { return c->ixpack ? c->ix[s] : IXF(s); }
/* Whether slot ``s`` may hold the key of fingerprint ``fp``: its fingerprint is, or its tag is the low bits of, ``fp``
 * (the caller then compares the entry's fingerprint, for a tag, and its key). */
static inline int ix_tagged(const Core *c, int64_t s, int64_t fp)
{
    return c->ixpack ? (((uint64_t)c->ix[s] ^ (uint64_t)fp) & IX_TAG) == 0 : IXF(s) == fp;
}
/* Slot ``s`` made to hold entry ``e`` of fingerprint ``fp`` (0 <= e < 2**31). (twin: index.py Wide.put, Packed.put) */
static inline void ix_put(Core *c, int64_t s, int64_t fp, int64_t e)
{
    if (c->ixpack) {
        c->ix[s] = (int64_t)(((uint64_t)e << IX_SHIFT) | ((uint64_t)fp & IX_TAG));
    } else {
        IXF(s) = fp;
        IXE(s) = e;
    }
}
/* Slot ``s`` emptied: its entry EMPTY (a one-word slot is cleared whole). */
static inline void ix_clear(Core *c, int64_t s)
{
    if (c->ixpack)
        c->ix[s] = 0;
    else
        IXE(s) = c->empty;
}
/* Slot ``to`` made to hold what slot ``from`` holds (a backward shift). */
static inline void ix_copy(Core *c, int64_t to, int64_t from)
{
    if (c->ixpack) {
        c->ix[to] = c->ix[from];
    } else {
        IXF(to) = IXF(from);
        IXE(to) = IXE(from);
    }
}
#define AW(off) (c->aw[(off) >> 3])
/* The index in force's last slot (its slots less one: the mask under a power of two), from the tables this mapping
 * took. */
#define IXMASK(c) ((c)->tables[0] - 1)
/* The fingerprint the policies know a key by (sketch, ghost, admission): in a wide segment its fingerprint; in a narrow
 * one, whose records keep none, a mix of its low 32 bits alone, which are what a resident entry's index slot keeps
 * (its tag), so that an entry's (entry_pfp) is its key's. (twin: table.py Table.pfp, Table.entry_pfp) */
static inline int64_t narrow_pfp(uint64_t tag) { return (int64_t)(((tag & IX_TAG) * 0x9E3779B97F4A7C15ULL) >> 1); }
static inline int64_t pfp(const Core *c, int64_t fp) { return c->narrow ? narrow_pfp((uint64_t)fp) : fp; }
/* Entry ``e``'s: a narrow one's from the tag of the index slot its record names (0 for a slot out of the index in
 * force: held, or damaged). */
static inline int64_t entry_pfp(const Core *c, int64_t e)
{
    if (!c->narrow)
        return EFP(e);
    int64_t s = ER(e, slot);
    return narrow_pfp(s >= 0 && s <= IXMASK(c) ? (uint64_t)c->ix[s] : 0);
}
/* The home slot of fingerprint ``fp`` in an index whose last slot is ``mask``: its low bits before version 17; from
 * it, the tag scaled to the slots (tag * slots < 2**64: at most 2**32 slots). (twin: index.py _home, _r_home) */
static inline int64_t ix_home_of(const Core *c, int64_t fp, int64_t mask)
{
    if (c->ixrange)
        return (int64_t)((((uint64_t)fp & IX_TAG) * (uint64_t)(mask + 1)) >> 32);
    return fp & mask;
}
/* The slot after ``s``, round to the first past the last. */
static inline int64_t ix_next(int64_t s, int64_t mask) { return s < mask ? s + 1 : 0; }
/* How far slot ``j`` is past slot ``from``, cyclically (both within the index). */
static inline uint64_t ix_dist(const Core *c, int64_t j, int64_t from, int64_t mask)
{
    if (c->ixrange)
        return (uint64_t)(j >= from ? j - from : j - from + mask + 1);
    return ((uint64_t)j - (uint64_t)from) & (uint64_t)mask;
}
/* Stripes (layout/dtypes.py): the stripe of index slot s in the index in force, a run of 2**STRIPE_MIN_SHIFT slots at
 * least; its word's place in the region (after the open mask's line). (twin: seqlock.py stripe_of) */
#define STRIPE_BITS 6
#define STRIPE_MIN_SHIFT 4
#define STRIPE_WORDS 8
#define S_OPEN 0
/* Version 12: the held entries' words (layout/dtypes.py S_HELD_*; table.py Table.detach), and a held entry's slot word */
#define S_HELD_FIRST 1
#define S_HELD 2
#define S_HELD_BYTES 3
#define HELD_SLOT (-1)
#define STRIPE_WORD(k) (STRIPE_WORDS * (1 + (k)))
/* Version 14: the idle region's words, and the share of its tti an idle entry's expiry gains before a hit moves it
 * (layout/dtypes.py D_*, IDLE_SHARE; table.py Table.idle_touch) */
#define D_DEFAULT_TTI 0
#define D_TTI_CHECK 1
#define D_IDLE_ON 2
#define D_VERSIONS_ON 4
#define D_EXPIRES_ON 5
#define D_WORDS 6
#define IDLE_SHARE 8
static inline int stripe_shift(const Core *c)
{
    /* (the bits of the last slot: log2 of the slots under a power of two; tables[0] is 8 at least) */
    int shift = 64 - __builtin_clzll((unsigned long long)(c->tables[0] - 1)) - STRIPE_BITS;
    return shift < STRIPE_MIN_SHIFT ? STRIPE_MIN_SHIFT : shift;
}
static inline int64_t stripe_of(const Core *c, int64_t s) { return s >> stripe_shift(c); }
/* The ghost's words in force (twin: layout/geometry.py Geometry.ghost_for); at most ghost_slots, since tables[0] is
 * at most the index's reserved slots. */
#define GHOST_LIVE(c) ghost_live(c)
static inline int64_t ghost_live(const Core *c)
{
    int64_t n = c->tables[0];
    if (c->ixrange) { /* (the power-of-two index of version 16 for the limit these slots hold: Geometry.ghost_for) */
        uint64_t need = 2 * (((uint64_t)n * 7) / 10);
        if (need < 8)
            need = 8;
        n = (int64_t)1 << (64 - __builtin_clzll(need - 1));
    }
    n >>= c->ghost_shift;
    return n < c->ghost_floor ? c->ghost_floor : n;
}
/* Within the entry slots this mapping shows (tables[1]): every slot handed out is; one past them (only damage names
 * it) would be read as this process's own zero pages, and written there unseen by the others. */
/* Whether this mapping shows the idle columns (version 14): until it does (version 16: until they are in use, which
 * counts a resize, so that a call made after the switch is handed over and the Python path shows them) they are its
 * own zero pages, read as "no time to idle" and never written. (twin: segment.py Segment.ttis_live) */
#define SHOWN_IDLE 1     /* bits of the cell's word 5 (tables[4]): layout/dtypes.py SHOWN_* */
#define SHOWN_VERSIONS 2
#define SHOWN_EXPIRES 4
#define SHOWN_ALL 7
#define IDLE_SHOWN(c) ((c)->ttis != NULL && ((c)->tables[4] & SHOWN_IDLE))
/* Whether this mapping shows the versions column: until it does (version 16: until a caller asks for a version) no
 * store writes it, and a call that reads a version (a view) is handed over, so that the Python path switches it on
 * (Store.show_versions). (twin: segment.py Segment.versions_live) */
#define VERSIONS_SHOWN(c) (((c)->tables[4] & SHOWN_VERSIONS) != 0)
/* Whether this mapping shows the expires column: until it does (version 18: until an entry has an expiry) it reads
 * 0, never, for every slot, and no store writes a word of it (a 0 over 0 is skipped); a store that gives an expiry,
 * or any store once D_EXPIRES_ON says the column is in use, is handed over, so that the Python path switches it on
 * (Store.need_expires). (twin: segment.py Segment.expires_shown) */
#define EXPIRES_SHOWN(c) (((c)->tables[4] & SHOWN_EXPIRES) != 0)
#define SLOT_OK(e) ((e) > 0 && (e) < c->tables[1])       /* a real entry slot (not the sentinel) */
#define LINK_OK(e) ((e) >= 0 && (e) < c->tables[1])      /* an entry slot or the sentinel */
#define LEN_OK(n) ((n) >= 0 && (n) <= c->arena_nbytes)
/* Counters: added in unsigned arithmetic, so that damaged words wrap instead of overflowing (undefined in C). */
#define ADD(p, d) ((p) = (int64_t)((uint64_t)(p) + (uint64_t)(int64_t)(d)))


static PyObject *HANDOVER; /* returned, without a fallback, when the Python path must take the call */
static PyObject *PINNED;   /* returned, without a fallback, when a view pins what the call must change (version 11
                            * and before: the Python side raises) */
/* The fallback's methods, interned at import (_core.c). */
static PyObject *N_GET_VALUE, *N_PUT, *N_DELETE, *N_VIEW, *N_GET_MANY, *N_PUT_MANY, *N_FINISH, *N_FIRST_LOOK,
    *N_EVICT_TOWARD;

/* A hand-over for a failed bound; the caller leaves the dirty word as it is (set, if a write was made). */
static inline int bounds(Core *c)
{
    c->reason = WHY_BOUNDS;
    return ST_HANDOVER;
}

/* ``a + b + d`` into *out, where ``a`` is a header word (another process may have written any value there) and
 * ``b``, ``d`` are bounded counts or sizes: 1 if the sum leaves int64's range, which only damage does (the caller
 * hands over: bounds). Every sum or difference of a header word that decides an eviction or a store goes through
 * it or through __builtin_sub_overflow: a wrapped comparison would store past a limit. */
static inline int word_sum(int64_t a, int64_t b, int64_t d, int64_t *out)
{
    return __builtin_add_overflow(a, b, out) || __builtin_add_overflow(*out, d, out);
}

/* Whether value tag ``tag`` is one view() serves. */
static inline int tag_viewable(const Core *c, int64_t tag)
{
    return tag == c->tag_bytes || tag == c->tag_array || tag == c->tag_tensor;
}

/* Whether an encoder writes value tag ``tag``: any other is damage (twin: store.py _WRITTEN). */
static inline int tag_written(const Core *c, int64_t tag)
{
    return tag_viewable(c, tag) || tag == c->tag_msgpack || tag == c->tag_pickle;
}

/* An entry ready to store, its arguments checked once by the method (twin: store.py Encoded). */
typedef struct {
    const char *kb, *body;
    int64_t klen, blen, tag, fp, check, size, nb, expires;
    int64_t tti, deadline; /* its time to idle (0: none) and the expiry its time to live set (version 14) */
    /* A new entry's marks where it was restored from a snapshot (its record's: store.py Placed), which place it
     * under a policy that keeps marks; -1: the policy places it, as any new key. */
    int64_t marks;
} Encoded;

static int64_t mono_ns(void);
static inline void seq_open(Core *c); /* _core_lock.c: before a hold's first write across the stripes */
static inline void stripe_open(Core *c, int64_t s); /* _core_lock.c: before a write to index slot s or its entry */
/* An eviction policy's steps, one table per policy (_core_policy.c policy_ops), chosen at bind as policies.of
 * chooses in Python: what a hit does, where a new key goes and whether it is admitted, and which entry goes next.
 * The flags are read on the hot paths, the functions elsewhere. (twin: policies/base.py Policy) */
struct PolicyOps {
    int reads_unlocked;   /* gets and views read without the lock (validated by seq) */
    int relinks_on_hit;   /* a hit moves its entry: links written, in the dirty bracket (lru) */
    int marks_on_hit;     /* a hit raises its entry's counter: a byte, no bracket (s3fifo, auto) */
    int sketches;         /* every lookup adds to the frequency sketch, hits too (auto): see sketch_add */
    int evicts_to_admit;  /* a new key evicts for its room; 0: admitted only while it fits (keep) */
    int evicts_from_tail; /* the next to go is the list's tail, pinned ones passed over; 0: evict_one chooses */
    int (*on_hit)(Core *c, int64_t e);        /* a hit on resident entry e (lock held) */
    int (*admit)(Core *c, int64_t fp);        /* asked before a new key evicts (fp: its pfp): 1, it enters on
                                               * probation */
    int (*link_new)(Core *c, int64_t e, int probation, int64_t *p, int64_t *n); /* its neighbours; marks set */
    void (*unlinked)(Core *c, int64_t e, int64_t n); /* e (whose next was n) left the list */
    void (*leaving)(Core *c, int64_t e);      /* e is about to be evicted */
    int (*evict_one)(Core *c, int *done);     /* the entry no view pins that the policy chooses goes */
};

static const struct PolicyOps policy_ops[POLICY_COUNT]; /* _core_policy.c, by POLICY_* number (a tentative definition) */

static int pinned(Core *c, int64_t e); /* _core_table.c: the arena's cleaner asks it, as arena.py's does */
static int pinned_now(Core *c, int64_t e); /* _core_table.c: what an eviction's scan decides by */
static int table_remove(Core *c, int64_t e);            /* _core_table.c: the policies' eviction calls them */
static int evict_oldest(Core *c, int *done);

#endif /* SHMCACHE_CORE_H */
