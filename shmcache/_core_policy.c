/* shmcache._core, the eviction policies' own steps: a hit's counter, S3-FIFO's ghost and its choice of what goes,
 * and each policy's table of steps (policy_ops), which the rest asks instead of the policy's number.
 * Twin of policies/base.py (Policy), policies/lru.py (Lru), policies/keep.py (Keep) and policies/s3fifo.py (which
 * says what S3-FIFO does, and why any ghost word is valid).
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

/* The entries small holds before eviction takes from it. (twin: policies/s3fifo.py small_share) */
static inline int64_t small_share(int64_t max_entries)
{
    int64_t n = max_entries / 10;
    return n > 1 ? n : 1;
}

/* How many keys the ghost remembers. (twin: policies/s3fifo.py ghost_size) */
static inline uint64_t ghost_size(int64_t max_entries)
{
    return max_entries > 0 ? (uint64_t)(max_entries / 10 * 9 + max_entries % 10 * 9 / 10) : 0;
}

/* A hit under s3fifo: the counter raised, saturating, the byte written only when it changes.
 * (twin: policies/s3fifo.py bump) */
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

/* Remember ``fp``: a free or lapsed slot of its group, else the oldest. (twin: policies/s3fifo.py ghost_add) */
static void ghost_add(Core *c, int64_t fp)
{
    uint64_t size = ghost_size(HW(max_entries));
    if (!size)
        return;
    uint64_t clock = ((uint64_t)HW(ghost_clock) + 1) & GHOST_STAMP_MASK, oldest = 0;
    HW(ghost_clock) = (int64_t)clock;
    int64_t base = fp & (GHOST_LIVE(c) - 1) & -(int64_t)GHOST_WAYS, victim = base;
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
 * (twin: policies/s3fifo.py admit_to_main) */
static int admit_to_main(Core *c, int64_t fp)
{
    uint64_t size = ghost_size(HW(max_entries));
    if (!size)
        return 0;
    uint64_t clock = (uint64_t)HW(ghost_clock), tag = ghost_tag(fp);
    int64_t base = fp & (GHOST_LIVE(c) - 1) & -(int64_t)GHOST_WAYS;
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

/* Small's oldest entry ``t`` moved to main's front, its counter reset. (twin: policies/s3fifo.py _to_main) */
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
 * (twin: policies/s3fifo.py s3fifo_evict_one) */
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

/* ------------------------------------------------------------------------------------- each policy's steps */

/* The list policies' (lru, keep): a new entry at the front, no marks. (twin: policies/base.py Policy.link_new) */
static int list_link_new(Core *c, int64_t e, int probation, int64_t *p, int64_t *n)
{
    (void)probation;
    *p = c->sentinel;
    *n = EN(c->sentinel, next); /* after the sentinel, before the most recent entry */
    if (!LINK_OK(*n))
        return bounds(c);
    c->marks[e] = 0;
    return ST_OK;
}

/* (twin: policies/lru.py Lru.on_hit) */
static int lru_on_hit(Core *c, int64_t e)
{
    return move_to_front(c, e);
}

/* (twin: policies/base.py Policy.on_hit) */
static int no_hit_step(Core *c, int64_t e)
{
    (void)c;
    (void)e;
    return ST_OK;
}

/* (twin: policies/s3fifo.py S3fifo.on_hit) */
static int s3fifo_on_hit(Core *c, int64_t e)
{
    bump(c, e);
    return ST_OK;
}

/* (twin: policies/s3fifo.py S3fifo.admit) */
static int s3fifo_admit(Core *c, int64_t fp)
{
    return !admit_to_main(c, fp);
}

/* A new entry on probation goes to small's front (between main's newest, or the sentinel, and small's newest),
 * else to the front. (twin: policies/s3fifo.py S3fifo.link_new) */
static int s3fifo_link_new(Core *c, int64_t e, int probation, int64_t *p, int64_t *n)
{
    if (!probation)
        return list_link_new(c, e, probation, p, n);
    *n = HW(small_first);
    if (!LINK_OK(*n))
        return bounds(c);
    *p = EN(*n, prev);
    if (!LINK_OK(*p))
        return bounds(c);
    HW(small_first) = e;
    ADD(HW(small), 1);
    c->marks[e] = MARK_SMALL;
    return ST_OK;
}

/* (twin: policies/s3fifo.py S3fifo.unlinked) */
static void s3fifo_unlinked(Core *c, int64_t e, int64_t n)
{
    if (c->marks[e] & MARK_SMALL) {
        ADD(HW(small), -1);
        if (HW(small_first) == e)
            HW(small_first) = n; /* the next of small, or the sentinel: small is empty */
    }
}

/* It leaves small unhit: the ghost remembers it. (twin: policies/s3fifo.py S3fifo.leaving) */
static void s3fifo_leaving(Core *c, int64_t e)
{
    if (c->marks[e] & MARK_SMALL)
        ghost_add(c, EN(e, fp));
}

/* (twin: policies/base.py Policy.admit) */
static int never_probation(Core *c, int64_t fp)
{
    (void)c;
    (void)fp;
    return 0;
}

static void no_unlink_step(Core *c, int64_t e, int64_t n)
{
    (void)c;
    (void)e;
    (void)n;
}

static void no_leaving_step(Core *c, int64_t e)
{
    (void)c;
    (void)e;
}

/* By POLICY_* number (bind checks the number): lru, s3fifo, keep. (twin: policies/__init__.py POLICIES) */
static const struct PolicyOps policy_ops[3] = {
    [POLICY_LRU] = {.reads_unlocked = 0, .relinks_on_hit = 1, .marks_on_hit = 0, .evicts_to_admit = 1,
                    .evicts_from_tail = 1, .on_hit = lru_on_hit, .admit = never_probation, .link_new = list_link_new,
                    .unlinked = no_unlink_step, .leaving = no_leaving_step, .evict_one = evict_oldest},
    [POLICY_S3FIFO] = {.reads_unlocked = 1, .relinks_on_hit = 0, .marks_on_hit = 1, .evicts_to_admit = 1,
                       .evicts_from_tail = 0, .on_hit = s3fifo_on_hit, .admit = s3fifo_admit,
                       .link_new = s3fifo_link_new, .unlinked = s3fifo_unlinked, .leaving = s3fifo_leaving,
                       .evict_one = s3fifo_evict_one},
    [POLICY_KEEP] = {.reads_unlocked = 1, .relinks_on_hit = 0, .marks_on_hit = 0, .evicts_to_admit = 0,
                     .evicts_from_tail = 1, .on_hit = no_hit_step, .admit = never_probation,
                     .link_new = list_link_new, .unlinked = no_unlink_step, .leaving = no_leaving_step,
                     .evict_one = evict_oldest},
};
