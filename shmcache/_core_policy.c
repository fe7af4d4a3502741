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
    int64_t first = ER(c->sentinel, next);
    if (!LINK_OK(first))
        return bounds(c);
    EW(e, prev, c->sentinel);
    EW(e, next, first);
    EW(first, prev, e);
    EW(c->sentinel, next, e);
    return ST_OK;
}

/* Small's oldest entry ``t`` moved to main's front, its counter reset. (twin: policies/s3fifo.py to_main) */
static int to_main(Core *c, int64_t t)
{
    int64_t p = ER(t, prev), n = ER(t, next);
    if (!LINK_OK(p) || !LINK_OK(n))
        return bounds(c);
    EW(p, next, n);
    EW(n, prev, p);
    if (HW(small_first) == t)
        HW(small_first) = n;
    int r = push_front(c, t);
    if (r)
        return r;
    c->marks[t] = 0;
    ADD(HW(small), -1);
    return ST_OK;
}

/* Small's oldest entry (the sentinel's prev), checked to be one of small; 0 and bounds() if it is not.
 * (twin: policies/s3fifo.py small_oldest) */
static int64_t small_oldest(Core *c)
{
    int64_t t = ER(c->sentinel, prev);
    if (!SLOT_OK(t) || !(c->marks[t] & MARK_SMALL)) {
        bounds(c);
        return 0;
    }
    return t;
}

/* Main's next victim as its CLOCK chooses it, in *v: its oldest entry no view pins with its counter at 0, those
 * before it reinserted at main's front with one hit fewer; the sentinel if every one of its ``main`` entries is
 * pinned. Nothing is removed. (twin: policies/s3fifo.py main_victim) */
static int main_victim(Core *c, int64_t main, int64_t *v)
{
    int64_t passed = 0; /* pinned entries passed over since the last change: past main's size, none is left */
    int r;
    for (int64_t step = 0; step < 4 * c->slots + 4; step++) {
        int64_t first = HW(small_first);
        if (!LINK_OK(first))
            return bounds(c);
        int64_t t = first != c->sentinel ? ER(first, prev) : ER(c->sentinel, prev); /* main's oldest */
        if (!SLOT_OK(t) || (c->marks[t] & MARK_SMALL))
            return bounds(c);
        int pin = pinned_now(c, t);
        unsigned char m = c->marks[t];
        if (pin == 0 && !(m & MARK_FREQ))
            pin = pinned(c, t); /* the victim: its stripe opened, asked again (pinned_now) */
        if (pin < 0)
            return bounds(c);
        if (pin) {
            if (++passed > main) {
                *v = c->sentinel;
                return ST_OK;
            }
            if ((r = move_to_front(c, t)))
                return r;
            continue;
        }
        if (m & MARK_FREQ) {
            c->marks[t] = (unsigned char)(m - 1);
            passed = 0;
            if ((r = move_to_front(c, t)))
                return r;
            continue;
        }
        *v = t;
        return ST_OK;
    }
    return bounds(c);
}

/* Main's victim evicted (main_victim); if every entry of main is pinned, the list's oldest unpinned one instead,
 * if any. (twin: policies/s3fifo.py evict_main) */
static int evict_main(Core *c, int64_t main, int *done)
{
    int64_t v;
    int r;
    if ((r = main_victim(c, main, &v)))
        return r;
    if (v == c->sentinel)
        return evict_oldest(c, done); /* main is all pinned: small's oldest unpinned goes, if any */
    if ((r = table_remove(c, v)))
        return r;
    ADD(HW(evictions), 1);
    *done = 1;
    return ST_OK;
}

/* Evict one entry no view pins as S3-FIFO chooses it; *done 0 if every entry is pinned (or there is none).
 * (twin: policies/s3fifo.py s3fifo_evict_one) */
static int s3fifo_evict_one(Core *c, int *done)
{
    int r;
    *done = 0;
    if (HW(max_entries) < 1 || HW(max_entries) >= c->slots)
        return bounds(c);
    for (int64_t step = 0; step < 4 * c->slots + 4; step++) {
        int64_t small = HW(small), main, t;
        if (__builtin_sub_overflow(HW(entries), small, &main)) /* (as word_sum: damage) */
            return bounds(c);
        if (small > 0 && main <= HW(max_entries) - small_share(HW(max_entries))) {
            if (!(t = small_oldest(c)))
                return ST_HANDOVER; /* (small_oldest called bounds) */
            int pin = pinned_now(c, t);
            if (pin == 0 && (c->marks[t] & MARK_FREQ) < PROMOTE_AT)
                pin = pinned(c, t); /* the victim: its stripe opened, asked again (pinned_now) */
            if (pin < 0)
                return bounds(c);
            if (pin || (c->marks[t] & MARK_FREQ) >= PROMOTE_AT) {
                if ((r = to_main(c, t)))
                    return r;
                if (!pin)
                    ADD(HW(promoted), 1);
                continue;
            }
            ghost_add(c, entry_pfp(c, t));
            if ((r = table_remove(c, t)))
                return r;
            ADD(HW(evictions), 1);
            *done = 1;
            return ST_OK;
        }
        return main > 0 ? evict_main(c, main, done) : ST_OK;
    }
    return bounds(c);
}

/* ------------------------------------------------------------------------------- auto's sketch and climber */

/* The block of the sketch in force that holds ``fp``'s 4 counters (block 0 holds the state words, so a key whose bits
 * choose it counts in block 1); counter ``i`` is in word 2i or 2i + 1 of it, the nibble 4 more bits choose.
 * Whatever ``fp`` is (a damaged entry's), the block is one of the sketch in force. (twin: policies/auto.py
 * _counters) */
static inline int64_t *sketch_block(Core *c, uint64_t fp)
{
    uint64_t b = fp & ((uint64_t)GHOST_LIVE(c) / SKETCH_BLOCK_WORDS - 1);
    return c->ghost + (b ? b : 1) * SKETCH_BLOCK_WORDS;
}

#define SKETCH_WORD(block, fp, i) ((block) + 2 * (i) + (((fp) >> (32 + (i))) & 1))
#define SKETCH_SHIFT(fp, i) ((int)((((fp) >> (36 + 4 * (i))) & 15) << 2))

/* One more lookup of ``fp``: each of its counters raised, saturating at 15; a saturated one is not written, so the
 * hot keys' hits store nothing. The same under the lock and by a hit read without it: each word is loaded and stored
 * whole (relaxed: plain moves on x86-64), never torn; a raise lost to a race with another reader's, or one that
 * undoes a halving of its word, is a lookup counted wrong, and any counter is valid.
 * (twin: policies/auto.py sketch_add) */
static inline void sketch_add(Core *c, int64_t fp)
{
    uint64_t u = (uint64_t)fp;
    int64_t *block = sketch_block(c, u);
    for (int i = 0; i < 4; i++) {
        int64_t *w = SKETCH_WORD(block, u, i);
        int sh = SKETCH_SHIFT(u, i);
        uint64_t v = (uint64_t)__atomic_load_n(w, __ATOMIC_RELAXED);
        if (((v >> sh) & 15) != 15)
            __atomic_store_n(w, (int64_t)(v + ((uint64_t)1 << sh)), __ATOMIC_RELAXED);
    }
}

/* How often ``fp`` was looked up lately: the least of its counters (lock held). (twin: policies/auto.py
 * frequency) */
static int frequency(Core *c, int64_t fp)
{
    uint64_t u = (uint64_t)fp;
    int64_t *block = sketch_block(c, u);
    int f = 15;
    for (int i = 0; i < 4; i++) {
        int n = (int)(((uint64_t)*SKETCH_WORD(block, u, i) >> SKETCH_SHIFT(u, i)) & 15);
        if (n < f)
            f = n;
    }
    return f;
}

/* The window's target: the state's, or 1 % of the entries, within [1, max_entries - 1].
 * (twin: policies/auto.py window_target) */
static int64_t window_target(Core *c, int64_t max_entries)
{
    int64_t t = c->ghost[A_TARGET], top = max_entries - 1 > 1 ? max_entries - 1 : 1;
    if (t <= 0)
        t = max_entries > 0 ? max_entries * WINDOW_PERCENT / 100 : 0;
    return t < 1 ? 1 : t > top ? top : t;
}

static inline uint64_t clip_count(int64_t x)
{
    return x < 0 ? 0 : x > MAX_COUNTER ? (uint64_t)MAX_COUNTER : (uint64_t)x;
}

/* The lookups and hits every process has counted: the header's and the reader slots' (each count clipped into
 * range, the sums too). (twin: policies/auto.py lookups) */
static void lookups(Core *c, int64_t *requests, int64_t *hits)
{
    uint64_t h = clip_count(HW(hits)), m = clip_count(HW(misses));
    for (int64_t r = 0; c->readers != NULL && r < c->reader_slots; r++) {
        const int64_t *rd = c->readers + r * c->reader_words;
        h += clip_count(rd[c->r_hits]); /* (at most 2**63: no overflow) */
        m += clip_count(rd[c->r_misses]);
        h = h > (uint64_t)MAX_COUNTER ? (uint64_t)MAX_COUNTER : h;
        m = m > (uint64_t)MAX_COUNTER ? (uint64_t)MAX_COUNTER : m;
    }
    uint64_t all = h + m;
    *hits = (int64_t)h;
    *requests = (int64_t)(all > (uint64_t)MAX_COUNTER ? (uint64_t)MAX_COUNTER : all);
}

static inline void count_word(int64_t *w)
{
    *w = *w >= 0 && *w < MAX_COUNTER ? *w + 1 : 1;
}

#define PPM_MASK (((uint64_t)1 << PPM_BITS) - 1)
#define PROMOTED_MASK (((uint64_t)1 << PROMOTED_BITS) - 1)

/* The climber's step: the window's target moved by the hit ratio ``ppm`` of the period (``dr`` lookups, ``dh`` hits,
 * ``dp`` promotions) against the last one's, the step made for the next period. (twin: policies/auto.py _move) */
static void move(Core *c, int64_t cap, int64_t ppm, int64_t dr, int64_t dh, int64_t dp)
{
    int64_t *s = c->ghost, last = (int64_t)((uint64_t)s[A_LAST_PPM] & PPM_MASK);
    int64_t change = ppm - (last > PPM ? PPM : last);
    int64_t restart = cap * STEP_PER_10000 / 10000 * STEP_UNIT, step = s[A_STEP];
    if (restart < STEP_UNIT)
        restart = STEP_UNIT;
    if (step == 0 || step < -restart || step > restart)
        step = restart; /* 0 or out of range: the restarting step */
    int jump = change >= RESTART_PPM || change <= -RESTART_PPM;
    int64_t size = step < 0 ? -step : step;
    /* (dp <= dr <= MAX_COUNTER and dh <= dr: the products below stay under 2**74, so in 128 bits) */
    int up = (jump && (__int128)dp * JUMP_SHARE >= dr) || ((step > 0) == (change >= 0));
    int64_t next = jump ? restart : size * DECAY_PERCENT / 100;
    s[A_STEP] = up ? next : -next;
    if (up && (__int128)dp * GROW_SHARE < dh)
        return; /* recency paid nothing this period: the window stays */
    int64_t moved = size / STEP_UNIT, t = window_target(c, cap) + (up ? moved : -moved);
    int64_t top = cap - 1 > 1 ? cap - 1 : 1;
    s[A_TARGET] = t < 1 ? 1 : t > top ? top : t;
}

/* Close the period if it is over: the window's target moved as the hit ratio and the promotions say (the first
 * period, since the creation, a clear or a resize, only measures), the sketch halved every k-th period (lock held).
 * Every state word is taken as any value: out of range, it starts a period or the step again. A_LAST_PPM holds the
 * last hit ratio in its low PPM_BITS and ``promoted`` when the period began (modulo 2**PROMOTED_BITS) above them.
 * (twin: policies/auto.py climb) */
static void climb(Core *c)
{
    int64_t *s = c->ghost, cap = HW(max_entries), requests, hits;
    if (cap <= 0 || cap >= c->slots)
        return; /* damaged: the eviction that follows says so */
    lookups(c, &requests, &hits);
    int64_t r0 = s[A_REQUESTS], h0 = s[A_HITS];
    if (r0 < 0 || r0 > requests || h0 < 0 || h0 > hits || hits - h0 > requests - r0) {
        s[A_REQUESTS] = requests; /* the counters were reset (clear()) or the words damaged: a period starts */
        s[A_HITS] = hits;
        return;
    }
    int64_t dr = requests - r0, dh = hits - h0;
    int64_t period = PERIOD_PER_ENTRY * cap < PERIOD_MAX ? PERIOD_PER_ENTRY * cap : PERIOD_MAX; /* (cap < slots) */
    if (dr < period)
        return;
    int64_t ppm = (int64_t)((unsigned __int128)dh * PPM / (uint64_t)dr);
    uint64_t promoted = clip_count(HW(promoted));
    if (s[A_PERIODS] > 0 && s[A_PERIODS] <= MAX_COUNTER) { /* (else the first period: the baseline) */
        uint64_t dp = (promoted - ((uint64_t)s[A_LAST_PPM] >> PPM_BITS)) & PROMOTED_MASK;
        move(c, cap, ppm, dr, dh, dp > (uint64_t)dr ? dr : (int64_t)dp); /* (more than dr: damage) */
    }
    s[A_LAST_PPM] = (int64_t)((uint64_t)ppm | (promoted & PROMOTED_MASK) << PPM_BITS);
    s[A_REQUESTS] = requests;
    s[A_HITS] = hits;
    count_word(&s[A_PERIODS]);
    /* every k-th period, k the periods that PERIOD_PER_ENTRY x cap lookups take (cap < slots: no overflow) */
    int64_t k = (PERIOD_PER_ENTRY * cap + period - 1) / period;
    if (s[A_PERIODS] % k == 0)
        for (int64_t w = SKETCH_BLOCK_WORDS, live = GHOST_LIVE(c); w < live; w++)
            s[w] = (int64_t)(((uint64_t)s[w] >> 1) & 0x7777777777777777ULL);
}

/* Evict one entry no view pins as auto chooses it; *done 0 if every entry is pinned (or there is none).
 * (twin: policies/auto.py auto_evict_one) */
static int auto_evict_one(Core *c, int *done)
{
    int r;
    *done = 0;
    int64_t cap = HW(max_entries);
    if (cap < 1 || cap >= c->slots)
        return bounds(c);
    int64_t target = window_target(c, cap);
    for (int64_t step = 0; step < c->slots + 1; step++) {
        int64_t small = HW(small), main, t, v;
        if (__builtin_sub_overflow(HW(entries), small, &main)) /* (as word_sum: damage) */
            return bounds(c);
        if (small > 0 && (small >= target || main <= 0)) {
            if (!(t = small_oldest(c)))
                return ST_HANDOVER; /* (small_oldest called bounds) */
            int hit = c->marks[t] & MARK_FREQ, pin = pinned_now(c, t);
            if (pin == 0 && !hit && small <= target)
                pin = pinned(c, t); /* a victim (t, or main's beside it): its stripe opened, asked again */
            if (pin < 0)
                return bounds(c);
            if (pin || hit || small > target) { /* hit in the window (or in use, or the window over its target) */
                if ((r = to_main(c, t)))
                    return r;
                if (!pin && hit)
                    ADD(HW(promoted), 1);
                continue;
            }
            if (main > 0) {
                if ((r = main_victim(c, main, &v)))
                    return r;
                if (v != c->sentinel) {
                    if (frequency(c, entry_pfp(c, t)) > frequency(c, entry_pfp(c, v)) + ADMIT_MARGIN) {
                        if ((r = table_remove(c, v)) || (r = to_main(c, t)))
                            return r;
                        count_word(&c->ghost[A_PREFERRED]);
                        ADD(HW(evictions), 1);
                        *done = 1;
                        return ST_OK;
                    }
                    count_word(&c->ghost[A_REFUSED]);
                }
            }
            if ((r = table_remove(c, t)))
                return r;
            ADD(HW(evictions), 1);
            *done = 1;
            return ST_OK;
        }
        return main > 0 ? evict_main(c, main, done) : ST_OK;
    }
    return bounds(c);
}

/* ------------------------------------------------------------------------------------- each policy's steps */

/* The list policies' (lru, keep): a new entry at the front, no marks. (twin: policies/base.py Policy.link_new) */
static int list_link_new(Core *c, int64_t e, int probation, int64_t *p, int64_t *n)
{
    (void)probation;
    *p = c->sentinel;
    *n = ER(c->sentinel, next); /* after the sentinel, before the most recent entry */
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
    *p = ER(*n, prev);
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
        ghost_add(c, entry_pfp(c, e));
}

/* A hit under auto: its counter raised and its key counted in the sketch. (twin: policies/auto.py Auto.on_hit) */
static int auto_on_hit(Core *c, int64_t e)
{
    bump(c, e);
    sketch_add(c, entry_pfp(c, e));
    return ST_OK;
}

/* Every new key enters the window, counted in the sketch; every CHECK_EVERY admissions the climber looks whether
 * the period is over. (twin: policies/auto.py Auto.admit) */
static int auto_admit(Core *c, int64_t fp)
{
    sketch_add(c, fp);
    if (!((uint64_t)HW(admitted) % CHECK_EVERY))
        climb(c);
    return 1;
}

/* A window at its target with nothing evicted (the cache is filling) gives its oldest to main; the new entry goes
 * to the window's front. (twin: policies/auto.py Auto.link_new) */
static int auto_link_new(Core *c, int64_t e, int probation, int64_t *p, int64_t *n)
{
    int64_t small = HW(small);
    if (small > 0 && small >= window_target(c, HW(max_entries))) {
        int64_t t = small_oldest(c);
        int r;
        if (!t)
            return ST_HANDOVER; /* (small_oldest called bounds) */
        int hit = c->marks[t] & MARK_FREQ;
        if ((r = to_main(c, t)))
            return r;
        if (hit)
            ADD(HW(promoted), 1);
    }
    return s3fifo_link_new(c, e, probation, p, n);
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

/* By POLICY_* number (bind checks the number): lru, s3fifo, keep, auto. (twin: policies/__init__.py POLICIES) */
static const struct PolicyOps policy_ops[POLICY_COUNT] = {
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
    [POLICY_AUTO] = {.reads_unlocked = 1, .relinks_on_hit = 0, .marks_on_hit = 1, .sketches = 1,
                     .evicts_to_admit = 1, .evicts_from_tail = 0, .on_hit = auto_on_hit, .admit = auto_admit,
                     .link_new = auto_link_new, .unlinked = s3fifo_unlinked, .leaving = no_leaving_step,
                     .evict_one = auto_evict_one},
};
