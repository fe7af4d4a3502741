/* shmcache._core, the index: open addressing with linear probing, no tombstones.
 * Twin of index.py.
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

/* The entry holding key ``kb`` (fingerprint ``fp``), or EMPTY, into *out. (twin: index.py find) */
static int find(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t *out)
{
    const int64_t mask = IXMASK(c); /* (read once: the index's stores below may alias the cell, for the compiler) */
    int64_t s = ix_home_of(c, fp, mask);
    for (int64_t i = 0; i <= mask; i++) {
        int64_t e = ix_entry(c, s);
        if (e == c->empty) {
            *out = c->empty;
            return ST_OK;
        }
        if (!SLOT_OK(e))
            return bounds(c);
        /* (a one-word slot has the fingerprint's low bits: the entry's own says whether it is the key's; a narrow
         * record keeps none, and its key's bytes decide) */
        if (ix_tagged(c, s, fp) && (!c->ixpack || c->narrow || EFP(e) == fp) && ER(e, klen) == klen) {
            int64_t off = ER(e, off), vlen = ER(e, vlen);
            if (!block_in_arena(c, off, vlen, klen))
                return bounds(c);
            if (memcmp(c->arena + off + c->block_header + vlen, kb, (size_t)klen) == 0) {
                *out = e;
                return ST_OK;
            }
        }
        s = ix_next(s, mask);
    }
    return bounds(c); /* no empty slot anywhere */
}

/* Empty slot ``s`` and shift back what follows it in its cluster, each slot's stripe opened before an entry moves out
 * of it (the caller opened ``s``'s). (twin: index.py remove) */
static int index_remove(Core *c, int64_t s)
{
    const int64_t mask = IXMASK(c);
    ix_clear(c, s);
    int64_t j = s;
    for (int64_t i = 0; i <= mask; i++) {
        j = ix_next(j, mask);
        int64_t e = ix_entry(c, j);
        if (e == c->empty)
            return ST_OK;
        /* The entry at j may fill the hole at s only if its home slot is not cyclically within (s, j]. */
        if (ix_dist(c, j, ix_home_of(c, ix_home(c, j), mask), mask) >= ix_dist(c, j, s, mask)) {
            if (!SLOT_OK(e))
                return bounds(c);
            stripe_open(c, j);
            ix_copy(c, s, j);
            EW(e, slot, s);
            ix_clear(c, j);
            s = j;
        }
    }
    return bounds(c);
}

