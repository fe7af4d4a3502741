/* shmcache._core, the LRU list: doubly linked through the entry table, the sentinel at slot 0.
 * Twin of lru.py.
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

/* Make entry ``e`` the most recently used. (twin: lru.py move_to_front) */
static int move_to_front(Core *c, int64_t e)
{
    int64_t p = ER(e, prev);
    if (p == c->sentinel)
        return ST_OK;
    int64_t n = ER(e, next), first = ER(c->sentinel, next);
    if (!LINK_OK(p) || !LINK_OK(n) || !LINK_OK(first))
        return bounds(c);
    EW(p, next, n);
    EW(n, prev, p);
    first = ER(c->sentinel, next); /* re-read: p may have been the sentinel's next's neighbour */
    EW(e, prev, c->sentinel);
    EW(e, next, first);
    EW(first, prev, e);
    EW(c->sentinel, next, e);
    return ST_OK;
}

