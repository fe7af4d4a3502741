/* shmcache._core, the eviction policies' own steps: a hit's counter, S3-FIFO's ghost and its choice of what goes.
 * Twin of policy.py (which says what each policy does, and why any ghost word is valid).
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

/* The entries small holds before eviction takes from it. (twin: policy.py small_share) */
static inline int64_t small_share(int64_t max_entries)
{
    int64_t n = max_entries / 10;
    return n > 1 ? n : 1;
}

/* How many keys the ghost remembers. (twin: policy.py ghost_size) */
static inline uint64_t ghost_size(int64_t max_entries)
{
    return max_entries > 0 ? (uint64_t)(max_entries / 10 * 9 + max_entries % 10 * 9 / 10) : 0;
}

/* A hit under s3fifo: the counter raised, saturating, the byte written only when it changes. (twin: policy.py bump) */
static inline void bump(Core *c, int64_t e)
{
    unsigned char m = c->marks[e];
    if ((m & MARK_FREQ) != MARK_FREQ)
        c->marks[e] = (unsigned char)(m + 1);
}

static inline uint64_t ghost_tag(int64_t fp)
{
    return ((uint64_t)fp >> 33) | ((uint64_t)1 << 30);
}

/* Remember ``fp``: a free or lapsed slot of its group, else the oldest. (twin: policy.py ghost_add) */
static void ghost_add(Core *c, int64_t fp)
{
    uint64_t size = ghost_size(HW(max_entries));
    if (!size)
        return;
    uint64_t clock = ((uint64_t)HW(ghost_clock) + 1) & GHOST_STAMP_MASK, oldest = 0;
    HW(ghost_clock) = (int64_t)clock;
    int64_t base = fp & (c->ghost_slots - 1) & -(int64_t)GHOST_WAYS, victim = base;
    int any = 0;
    for (int64_t i = base; i < base + GHOST_WAYS; i++) {
        uint64_t w = (uint64_t)c->ghost[i], age = (clock - w) & GHOST_STAMP_MASK;
        if (w == 0 || age >= size) {
            victim = i;
            break;
        }
        if (!any || age > oldest) {
            victim = i;
            oldest = age;
            any = 1;
        }
    }
    c->ghost[victim] = (int64_t)((ghost_tag(fp) << GHOST_STAMP_BITS) | clock);
}

/* Whether the ghost remembers ``fp`` (a slot found is freed); counted in ghost_hits.
 * (twin: policy.py admit_to_main) */
static int admit_to_main(Core *c, int64_t fp)
{
    uint64_t size = ghost_size(HW(max_entries));
    if (!size)
        return 0;
    uint64_t clock = (uint64_t)HW(ghost_clock), tag = ghost_tag(fp);
    int64_t base = fp & (c->ghost_slots - 1) & -(int64_t)GHOST_WAYS;
    for (int64_t i = base; i < base + GHOST_WAYS; i++) {
        uint64_t w = (uint64_t)c->ghost[i];
        if (w >> GHOST_STAMP_BITS == tag && ((clock - w) & GHOST_STAMP_MASK) < size) {
            c->ghost[i] = 0;
            ADD(HW(ghost_hits), 1);
            return 1;
        }
    }
    return 0;
}

/* Link entry ``e`` in at the front of the list (lru.py push_front; e's own links checked by the caller). */
static int push_front(Core *c, int64_t e)
{
    int64_t first = EN(c->sentinel, next);
    if (!LINK_OK(first))
        return bounds(c);
    EN(e, prev) = c->sentinel;
    EN(e, next) = first;
    EN(first, prev) = e;
    EN(c->sentinel, next) = e;
    return ST_OK;
}

/* Small's oldest entry ``t`` moved to main's front, its counter reset. (twin: policy.py _to_main) */
static int to_main(Core *c, int64_t t)
{
    int64_t p = EN(t, prev), n = EN(t, next);
    if (!LINK_OK(p) || !LINK_OK(n))
        return bounds(c);
    EN(p, next) = n;
    EN(n, prev) = p;
    if (HW(small_first) == t)
        HW(small_first) = n;
    int r = push_front(c, t);
    if (r)
        return r;
    c->marks[t] = 0;
    ADD(HW(small), -1);
    return ST_OK;
}

/* Evict one entry no view pins as S3-FIFO chooses it; *done 0 if every entry is pinned (or there is none).
 * (twin: policy.py s3fifo_evict_one) */
static int s3fifo_evict_one(Core *c, int *done)
{
    int64_t passed = 0;
    int r;
    *done = 0;
    if (HW(max_entries) < 1 || HW(max_entries) >= c->slots)
        return bounds(c);
    for (int64_t step = 0; step < 4 * c->slots + 4; step++) {
        int64_t small = HW(small), main = HW(entries) - small;
        if (small > 0 && main <= HW(max_entries) - small_share(HW(max_entries))) {
            int64_t t = EN(c->sentinel, prev); /* small's oldest */
            if (!SLOT_OK(t) || !(c->marks[t] & MARK_SMALL))
                return bounds(c);
            int pin = pinned(c, t);
            if (pin < 0)
                return bounds(c);
            if (pin || (c->marks[t] & MARK_FREQ) >= PROMOTE_AT) {
                if ((r = to_main(c, t)))
                    return r;
                if (!pin)
                    ADD(HW(promoted), 1);
                continue;
            }
            ghost_add(c, EN(t, fp));
            if ((r = table_remove(c, t)))
                return r;
            ADD(HW(evictions), 1);
            *done = 1;
            return ST_OK;
        }
        if (main <= 0)
            return ST_OK;
        int64_t first = HW(small_first);
        if (!LINK_OK(first))
            return bounds(c);
        int64_t t = first != c->sentinel ? EN(first, prev) : EN(c->sentinel, prev); /* main's oldest */
        if (!SLOT_OK(t) || (c->marks[t] & MARK_SMALL))
            return bounds(c);
        int pin = pinned(c, t);
        if (pin < 0)
            return bounds(c);
        if (pin) {
            if (++passed > main)
                return evict_oldest(c, done); /* main is all pinned: small's oldest unpinned goes, if any */
            if ((r = move_to_front(c, t)))
                return r;
            continue;
        }
        unsigned char m = c->marks[t];
        if (m & MARK_FREQ) {
            c->marks[t] = (unsigned char)(m - 1);
            passed = 0;
            if ((r = move_to_front(c, t)))
                return r;
            continue;
        }
        if ((r = table_remove(c, t)))
            return r;
        ADD(HW(evictions), 1);
        *done = 1;
        return ST_OK;
    }
    return bounds(c);
}
