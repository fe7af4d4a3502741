/* shmcache._core, binding: a Core bound to one segment's buffer and to the numbers shmcache/layout gives.
 * Twin of core.py (bind, offsets).
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

static int take(PyObject *d, const char *key, int64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "shmcache._core.Core: the offsets dict lacks %s (it is built by "
                                     "shmcache/core.py from shmcache/layout)", key);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static int take_word(PyObject *d, const char *key, Py_ssize_t *out, int64_t limit)
{
    int64_t x;
    if (take(d, key, &x))
        return -1;
    if (x < 0 || x >= limit) {
        PyErr_Format(PyExc_ValueError, "shmcache._core.Core: %s is %lld, expected 0 to %lld", key, (long long)x,
                     (long long)limit - 1);
        return -1;
    }
    *out = (Py_ssize_t)x;
    return 0;
}

static int region(Core *c, PyObject *d, const char *key, int64_t nbytes, int64_t align, void **out)
{
    int64_t off;
    if (take(d, key, &off))
        return -1;
    if (off < 0 || nbytes < 0 || off % align || off > (int64_t)c->buf.len || nbytes > (int64_t)c->buf.len - off) {
        PyErr_Format(PyExc_ValueError, "shmcache._core.Core: region %s (%lld bytes at %lld) is not within the "
                                       "%zd-byte buffer", key, (long long)nbytes, (long long)off, c->buf.len);
        return -1;
    }
    *out = c->mem + off;
    return 0;
}

static void drop_buffer(Core *c)
{
    if (c->have_shown) {
        c->have_shown = 0;
        c->shown = NULL;
        c->tables = c->own_tables;
        PyBuffer_Release(&c->shown_buf);
    }
    if (c->have_buf) {
        c->have_buf = 0;
        PyBuffer_Release(&c->buf);
    }
}

/* Core(buffer, offsets, live_fd, timeout_ns, fallback=None): every region and word from ``offsets``, each
 * checked against the buffer. (twin: core.py offsets) */
static int bind(Core *c, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offsets", "live_fd", "timeout_ns", "fallback", NULL};
    PyObject *obj, *d, *fallback = Py_None;
    int live_fd;
    long long timeout_ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!iL|O", kwlist, &obj, &PyDict_Type, &d, &live_fd, &timeout_ns,
                                     &fallback))
        return -1;
    PyObject *unviewable = NULL;
    if (fallback != Py_None && !(unviewable = PyObject_GetAttrString(fallback, "UNVIEWABLE")))
        return -1; /* a fallback is a core.HandOver */
    if (c->have_buf || c->released) {
        Py_XDECREF(unviewable);
        PyErr_SetString(PyExc_RuntimeError, "shmcache._core.Core is bound once");
        return -1;
    }
    if (timeout_ns <= 0) {
        Py_XDECREF(unviewable);
        PyErr_Format(PyExc_ValueError, "timeout_ns must be above 0, got %lld", timeout_ns);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &c->buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) {
        Py_XDECREF(unviewable);
        return -1;
    }
    c->have_buf = 1;
    c->mem = c->buf.buf;
    c->live_fd = live_fd;
    c->timeout_ns = timeout_ns;
    if (unviewable != NULL) {
        Py_INCREF(fallback);
        c->fallback = fallback;
        c->unviewable = unviewable;
    }
    int64_t index_slots, entry_slots, index_bytes, entry_bytes, kind_rows, kind_bytes, lock_off, lock_nbytes,
        holder_off, wakes_off, word, index_packed, index_ranged, narrow;
    if (take(d, "entry_slots", &entry_slots) || take(d, "index_slots", &index_slots)
        || take(d, "arena_nbytes", &c->arena_nbytes) || take(d, "INDEX_SLOT_NBYTES", &index_bytes)
        || take(d, "ENTRY_NBYTES", &entry_bytes) || take(d, "KIND_ROWS", &kind_rows)
        || take(d, "KIND_NBYTES", &kind_bytes) || take(d, "H_LOCK_OFF", &lock_off)
        || take(d, "LOCK_NBYTES", &lock_nbytes) || take(d, "LOCK_HOLDER_OFF", &holder_off)
        || take(d, "LOCK_WAKES_OFF", &wakes_off) || take(d, "HOLDER_BASE", &c->holder_base)
        || take(d, "HOLDER_SLOTS", &c->holder_slots) || take(d, "WORD_NBYTES", &word)
        || take(d, "BLOCK_HEADER_NBYTES", &c->block_header) || take(d, "BLOCK_ALIGN", &c->block_align)
        || take(d, "MAX_BLOCK_NBYTES", &c->max_block) || take(d, "BLOCK_LEN_MASK", &c->len_mask)
        || take(d, "BLOCK_OWNER_SHIFT", &c->owner_shift) || take(d, "EMPTY", &c->empty)
        || take(d, "NIL", &c->nil) || take(d, "SENTINEL", &c->sentinel) || take(d, "NEVER", &c->never)
        || take(d, "MAX_TTL_NS", &c->max_ttl) || take(d, "MAX_VERSION", &c->max_version)
        || take(d, "KIND_PREFIX", &c->kind_prefix)
        || take(d, "PIN_BASE", &c->pin_base) || take(d, "CHECK_MASK", &c->check_mask)
        || take(d, "TAG_BYTES", &c->tag_bytes) || take(d, "TAG_MSGPACK", &c->tag_msgpack)
        || take(d, "TAG_ARRAY", &c->tag_array) || take(d, "TAG_TENSOR", &c->tag_tensor)
        || take(d, "TAG_PICKLE", &c->tag_pickle) || take(d, "INDEX_PACKED", &index_packed)
        || take(d, "INDEX_RANGED", &index_ranged) || take(d, "ENTRY_NARROW", &narrow))
        return -1;
    if (word != (int64_t)sizeof(int64_t) || entry_slots < 2 || index_slots < 2
        || (!index_ranged && (index_slots & (index_slots - 1))) || (index_ranged && !index_packed)
        || entry_slots >= ((int64_t)1 << 31) || c->arena_nbytes <= 0 || c->arena_nbytes % 8
        || c->block_header != (int64_t)sizeof(int64_t) || c->block_align <= 0 || c->block_align % 8
        || entry_bytes % 8 || index_bytes % 8 || kind_bytes % 8 || kind_rows < 256 || c->owner_shift <= 0
        || c->owner_shift > 32 || c->len_mask != ((int64_t)1 << c->owner_shift) - 1 || c->sentinel != 0
        || holder_off != 4 || wakes_off != 8 || lock_nbytes < 12 || c->holder_base <= 0 || c->holder_slots <= 0
        || c->holder_slots > ((int64_t)1 << 30) || c->kind_prefix < 0 || c->kind_prefix > 255
        || (index_packed ? index_bytes != 8 || index_slots > ((int64_t)1 << 32) : index_bytes < 16)
        || (narrow != 0 && narrow != 1)
        /* a narrow record (layout/dtypes.py ENTRY_NARROW: NARROW_INDEX_SLOTS, NARROW_ARENA_NBYTES) names an index slot
         * in an int32 and the block's offset in units of 8 in a uint32; its fingerprint is the packed index's tag */
        || (narrow && (entry_bytes != NR_BYTES || !index_packed || !index_ranged || index_slots >= ((int64_t)1 << 31)
                       || c->arena_nbytes > ((int64_t)1 << 35)))) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the offsets describe a layout this build cannot "
                                          "address (word size, slot counts, block header or lock words)");
        return -1;
    }
    c->slots = entry_slots;
    c->index_slots = index_slots;
    c->own_tables[0] = index_slots; /* (until watch_extent binds the mapping's cell: the whole, as before version 10) */
    c->own_tables[1] = entry_slots;
    c->own_tables[2] = 0;
    c->own_tables[3] = entry_slots - 1;
    c->own_tables[4] = 0; /* (the lazy columns shown: set below, once the layout's version is known) */
    c->tables = c->own_tables;
    c->ew = (Py_ssize_t)(entry_bytes / 8);
    c->narrow = narrow != 0; /* (then the E_* words are not taken: a narrow record's fields are at NR_*) */
    c->iw = (Py_ssize_t)(index_bytes / 8);
    c->ixpack = index_packed != 0; /* (then i_fp and i_entry are not taken: ix_* read the one word) */
    c->ixrange = index_ranged != 0;
    c->kww = (Py_ssize_t)(kind_bytes / 8);
    int64_t ring_follows, ring_by_limit, hw_limit, ghost_slots, ghost_shift, policy, l_policies[4], l_marks[2];
    int64_t l_ghost[2], ghost_floor;
    /* auto's state words and tuning, as layout/dtypes.py and policies/auto.py have them (_core.h's enums) */
    static const char *const auto_names[] = {
        "A_TARGET", "A_STEP", "A_LAST_PPM", "A_REQUESTS", "A_HITS", "A_PERIODS", "A_PREFERRED", "A_REFUSED",
        "SKETCH_BLOCK_WORDS", "WINDOW_PERCENT", "ADMIT_MARGIN", "PERIOD_PER_ENTRY", "CHECK_EVERY",
        "STEP_PER_10000", "RESTART_PPM", "DECAY_PERCENT", "STEP_UNIT", "PPM", "MAX_COUNTER", "PERIOD_MAX",
        "JUMP_SHARE", "GROW_SHARE", "PPM_BITS", "PROMOTED_BITS",
    };
    static const int64_t auto_values[] = {
        A_TARGET, A_STEP, A_LAST_PPM, A_REQUESTS, A_HITS, A_PERIODS, A_PREFERRED, A_REFUSED, SKETCH_BLOCK_WORDS,
        WINDOW_PERCENT, ADMIT_MARGIN, PERIOD_PER_ENTRY, CHECK_EVERY, STEP_PER_10000, RESTART_PPM, DECAY_PERCENT,
        STEP_UNIT, PPM, MAX_COUNTER, PERIOD_MAX, JUMP_SHARE, GROW_SHARE, PPM_BITS, PROMOTED_BITS,
    };
    int auto_same = 1;
    for (size_t i = 0; i < sizeof auto_values / sizeof auto_values[0]; i++) {
        int64_t v;
        if (take(d, auto_names[i], &v))
            return -1;
        auto_same &= v == auto_values[i];
    }
    if (take(d, "ghost_slots", &ghost_slots) || take(d, "ghost_shift", &ghost_shift)
        || take(d, "ghost_floor", &ghost_floor) || take(d, "policy", &policy)
        || take(d, "POLICY_LRU", &l_policies[0]) || take(d, "POLICY_S3FIFO", &l_policies[1])
        || take(d, "POLICY_KEEP", &l_policies[2]) || take(d, "POLICY_AUTO", &l_policies[3])
        || take(d, "MARK_FREQ", &l_marks[0]) || take(d, "MARK_SMALL", &l_marks[1])
        || take(d, "GHOST_WAYS", &l_ghost[0]) || take(d, "GHOST_STAMP_BITS", &l_ghost[1]))
        return -1;
    int ghostly = policy == POLICY_S3FIFO || policy == POLICY_AUTO; /* the ghost region: s3fifo's, auto's sketch */
    if (!auto_same || l_policies[0] != POLICY_LRU || l_policies[1] != POLICY_S3FIFO || l_policies[2] != POLICY_KEEP
        || l_policies[3] != POLICY_AUTO || l_marks[0] != MARK_FREQ || l_marks[1] != MARK_SMALL
        || l_ghost[0] != GHOST_WAYS || l_ghost[1] != GHOST_STAMP_BITS || policy < 0 || policy >= POLICY_COUNT
        || (ghostly ? ghost_slots < GHOST_WAYS || (ghost_slots & (ghost_slots - 1)) : ghost_slots != 0)
        || ghost_shift < 0 || ghost_shift > (policy == POLICY_AUTO)
        || (ghostly
            && (ghost_floor < GHOST_WAYS || ghost_floor > ghost_slots || (ghost_floor & (ghost_floor - 1))))) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the layout's policies, marks or ghost are not the ones "
                                          "this build knows");
        return -1;
    }
    c->pol = &policy_ops[policy]; /* (the number was checked above) */
    c->ghost_slots = ghost_slots;
    c->ghost_shift = (int)ghost_shift;
    c->ghost_floor = ghost_floor;
    if (take(d, "HEADER_WORDS", &hw_limit) || region(c, d, "header_off", hw_limit * 8, 8, (void **)&c->h)
        || region(c, d, "index_off", index_slots * index_bytes, 8, (void **)&c->ix)
        || region(c, d, "entries_off", entry_slots * entry_bytes, 8, (void **)&c->ent)
        || region(c, d, "expires_off", entry_slots * 8, 8, (void **)&c->exp)
        || region(c, d, "versions_off", entry_slots * 8, 8, (void **)&c->ver)
        || region(c, d, "kinds_off", entry_slots, 1, (void **)&c->kinds)
        || region(c, d, "pins_off", entry_slots, 1, (void **)&c->pins)
        || region(c, d, "marks_off", entry_slots, 1, (void **)&c->marks)
        || region(c, d, "ghost_off", ghost_slots * 8, 8, (void **)&c->ghost)
        || region(c, d, "kind_table_off", kind_rows * kind_bytes, 8, (void **)&c->kw)
        || region(c, d, "arena_off", c->arena_nbytes, 8, (void **)&c->arena))
        return -1;
    c->aw = (int64_t *)c->arena;
    c->lockword = (uint32_t *)((unsigned char *)c->h + lock_off);
    c->holderword = c->lockword + 1;
    c->wakesword = c->lockword + 2;
    int64_t ewl = c->ew, iwl = c->iw, kwl = c->kww;
    if ((!c->narrow
         && (take_word(d, "E_PREV", &c->e_prev, ewl) || take_word(d, "E_NEXT", &c->e_next, ewl)
             || take_word(d, "E_FP", &c->e_fp, ewl) || take_word(d, "E_OFF", &c->e_off, ewl)
             || take_word(d, "E_KEY_NBYTES", &c->e_klen, ewl) || take_word(d, "E_VAL_NBYTES", &c->e_vlen, ewl)
             || take_word(d, "E_SLOT", &c->e_slot, ewl) || take_word(d, "E_CHECK", &c->e_check, ewl)))
        || (!c->ixpack && (take_word(d, "I_FP", &c->i_fp, iwl) || take_word(d, "I_ENTRY", &c->i_entry, iwl)))
        || take_word(d, "K_ENTRIES", &c->k_entries, kwl) || take_word(d, "K_RETAINED", &c->k_retained, kwl)
        || take_word(d, "H_HITS", &c->h_hits, hw_limit) || take_word(d, "H_MISSES", &c->h_misses, hw_limit)
        || take_word(d, "H_PUTS", &c->h_puts, hw_limit) || take_word(d, "H_UPDATES", &c->h_updates, hw_limit)
        || take_word(d, "H_DELETES", &c->h_deletes, hw_limit)
        || take_word(d, "H_EVICTIONS", &c->h_evictions, hw_limit)
        || take_word(d, "H_DIRTY", &c->h_dirty, hw_limit) || take_word(d, "H_ENTRIES", &c->h_entries, hw_limit)
        || take_word(d, "H_RETAINED", &c->h_retained, hw_limit)
        || take_word(d, "H_MAX_ENTRIES", &c->h_max_entries, hw_limit)
        || take_word(d, "H_MAX_RETAINED", &c->h_max_retained, hw_limit)
        || take_word(d, "H_HEAD", &c->h_head, hw_limit) || take_word(d, "H_TAIL", &c->h_tail, hw_limit)
        || take_word(d, "H_FILL", &c->h_fill, hw_limit) || take_word(d, "H_ARENA_USED", &c->h_arena_used, hw_limit)
        || take_word(d, "H_FREE_HEAD", &c->h_free_head, hw_limit)
        || take_word(d, "H_UNUSED_NEXT", &c->h_unused_next, hw_limit)
        || take_word(d, "H_VERSION_CLOCK", &c->h_version_clock, hw_limit)
        || take_word(d, "H_NEXT_EXPIRY", &c->h_next_expiry, hw_limit)
        || take_word(d, "H_EXPIRED", &c->h_expired, hw_limit)
        || take_word(d, "H_DEFAULT_TTL", &c->h_default_ttl, hw_limit)
        || take_word(d, "H_WRITING", &c->h_writing, hw_limit)
        || take_word(d, "H_PROGRESS", &c->h_progress, hw_limit)
        || take_word(d, "H_LAST_PUT", &c->h_last_put, hw_limit)
        || take_word(d, "H_ADMITTED", &c->h_admitted, hw_limit)
        || take_word(d, "H_SMALL_FIRST", &c->h_small_first, hw_limit)
        || take_word(d, "H_SMALL", &c->h_small, hw_limit)
        || take_word(d, "H_GHOST_CLOCK", &c->h_ghost_clock, hw_limit)
        || take_word(d, "H_NOT_ADMITTED", &c->h_not_admitted, hw_limit)
        || take_word(d, "H_PROMOTED", &c->h_promoted, hw_limit)
        || take_word(d, "H_GHOST_HITS", &c->h_ghost_hits, hw_limit)
        || take_word(d, "H_SEQ", &c->h_seq, hw_limit)
        || take_word(d, "H_ARENA_EXTENT", &c->h_arena_extent, hw_limit) || take(d, "EXTENT_STEP", &c->extent_step)
        || take_word(d, "H_CAPACITY", &c->h_capacity, hw_limit) || take(d, "capacity_bytes", &c->capacity_most)
        || take_word(d, "H_RESIZES", &c->h_resizes, hw_limit)
        || take_word(d, "H_INDEX_SLOTS", &c->h_index_slots, hw_limit)
        || take(d, "max_entries", &c->ring_entries) || take(d, "BLOCK_OVERHEAD", &c->block_overhead)
        || take(d, "ring_follows", &ring_follows) || take(d, "ring_by_limit", &ring_by_limit))
        return -1;
    c->ring_follows = ring_follows != 0;
    c->ring_by_limit = ring_follows != 0 && ring_by_limit != 0;
    long page = sysconf(_SC_PAGESIZE);
    c->page = page > 0 ? (int64_t)page : 4096;
    if (c->extent_step <= 0 || c->extent_step % 4096) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the arena's extent step is not whole pages");
        return -1;
    }
    /* (bounds that keep ring_for's arithmetic far from overflow: the arena is at most what it is sized for) */
    if (c->capacity_most <= 0 || c->capacity_most > c->arena_nbytes || c->ring_entries <= 0
        || c->ring_entries >= entry_slots + 1 || c->block_overhead <= 0 || c->block_overhead > 64) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the ring's capacity does not fit its arena");
        return -1;
    }
    c->shown = NULL; /* all of the arena, until watch_extent binds the mapping's cell */
    int64_t rw;
    int64_t pin_mask;
    if (take(d, "READER_SLOTS", &c->reader_slots) || take(d, "READER_WORDS", &rw)
        || take(d, "READER_PINS", &c->reader_pins) || take(d, "READER_BASE", &c->reader_base)
        || take(d, "PIN_SLOT_MASK", &pin_mask))
        return -1;
    if (c->reader_slots < 0 || c->reader_slots > 65536 || rw < 4 || rw > 64 || c->reader_pins < 0
        || c->reader_pins > rw || c->reader_base <= 0 || pin_mask != (int64_t)PIN_SLOT_MASK) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the reader slots are not a layout this build knows");
        return -1;
    }
    c->reader_words = rw;
    if (region(c, d, "readers_off", c->reader_slots * rw * 8, 8, (void **)&c->readers)
        || take_word(d, "R_HITS", &c->r_hits, rw) || take_word(d, "R_MISSES", &c->r_misses, rw)
        || take_word(d, "R_RETRIES", &c->r_retries, rw) || take_word(d, "R_FALLBACKS", &c->r_fallbacks, rw)
        || take_word(d, "R_READING", &c->r_reading, rw)
        || take_word(d, "R_PINS", &c->r_pins, rw - c->reader_pins + 1))
        return -1;
    int64_t stripes_nbytes, stripe_bits, stripe_min_shift, stripe_words, s_held[3], held_slot, holds;
    void *stripes;
    if (take(d, "stripes_nbytes", &stripes_nbytes) || take(d, "STRIPE_BITS", &stripe_bits)
        || take(d, "STRIPE_MIN_SHIFT", &stripe_min_shift) || take(d, "STRIPE_WORDS", &stripe_words)
        || take(d, "S_HELD_FIRST", &s_held[0]) || take(d, "S_HELD", &s_held[1])
        || take(d, "S_HELD_BYTES", &s_held[2]) || take(d, "HELD_SLOT", &held_slot) || take(d, "holds", &holds))
        return -1;
    if (stripe_bits != STRIPE_BITS || stripe_min_shift != STRIPE_MIN_SHIFT || stripe_words != STRIPE_WORDS
        || s_held[0] != S_HELD_FIRST || s_held[1] != S_HELD || s_held[2] != S_HELD_BYTES || held_slot != HELD_SLOT
        || (holds && stripes_nbytes == 0)
        || (stripes_nbytes != 0 && stripes_nbytes != (int64_t)STRIPE_WORD((int64_t)1 << STRIPE_BITS) * 8)) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the stripes are not a layout this build knows");
        return -1;
    }
    if (region(c, d, "stripes_off", stripes_nbytes, 8, &stripes))
        return -1;
    c->stripes = stripes_nbytes ? (int64_t *)stripes : NULL;
    c->holds = holds != 0;
    int64_t idle, lazy, idle_share, d_words[6], shown_bits[3];
    void *idle_words, *ttis, *deadlines;
    if (take(d, "idle", &idle) || take(d, "lazy", &lazy) || take(d, "IDLE_SHARE", &idle_share)
        || take(d, "D_DEFAULT_TTI", &d_words[0]) || take(d, "D_IDLE_ON", &d_words[2])
        || take(d, "D_VERSIONS_ON", &d_words[3]) || take(d, "D_EXPIRES_ON", &d_words[4])
        || take(d, "D_WORDS", &d_words[5]) || take(d, "SHOWN_IDLE", &shown_bits[0])
        || take(d, "SHOWN_VERSIONS", &shown_bits[1]) || take(d, "SHOWN_EXPIRES", &shown_bits[2])
        || take(d, "D_TTI_CHECK", &d_words[1]) || take(d, "TTI_NONE_CHECK", &c->tti_none_check))
        return -1;
    if (idle_share != IDLE_SHARE || d_words[0] != D_DEFAULT_TTI || d_words[1] != D_TTI_CHECK
        || d_words[2] != D_IDLE_ON || d_words[3] != D_VERSIONS_ON || d_words[4] != D_EXPIRES_ON
        || d_words[5] != D_WORDS || shown_bits[0] != SHOWN_IDLE || shown_bits[1] != SHOWN_VERSIONS
        || shown_bits[2] != SHOWN_EXPIRES || (lazy & ~(int64_t)SHOWN_ALL) || (lazy && !idle)) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the idle region is not a layout this build knows");
        return -1;
    }
    if (region(c, d, "idle_off", idle ? D_WORDS * 8 : 0, 8, &idle_words)
        || region(c, d, "ttis_off", idle ? entry_slots * 8 : 0, 8, &ttis)
        || region(c, d, "deadlines_off", idle ? entry_slots * 8 : 0, 8, &deadlines))
        return -1;
    c->idle = idle ? (int64_t *)idle_words : NULL;
    c->ttis = idle ? (int64_t *)ttis : NULL;
    c->deadlines = idle ? (int64_t *)deadlines : NULL;
    c->own_tables[4] = SHOWN_ALL & ~lazy; /* (the columns a layout backs with the tables: Geometry.lazy) */
    c->stuck = -1;
    if (lock_off % 8 || lock_off + lock_nbytes > hw_limit * 8) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the lock's words are not within the header");
        return -1;
    }
    return 0;
}

static int Core_init(Core *c, PyObject *args, PyObject *kwds)
{
    int again = c->have_buf || c->released;
    if (bind(c, args, kwds)) {
        if (!again) { /* half bound: the export goes now, and every call hands over */
            drop_buffer(c);
            c->released = 1;
        }
        return -1;
    }
    c->bound = 1;
    return 0;
}

/* The GC's walk: a Core holds its fallback (which holds the handle's guard, store and whatever they hold, a clock of
 * the caller's among them), so a cycle through it must be collectable. */
static int Core_traverse(Core *c, visitproc visit, void *arg)
{
    Py_VISIT(c->fallback);
    Py_VISIT(c->unviewable);
    Py_VISIT(c->reader);
    return 0;
}

/* An unreachable cycle broken: no call can come any more (a call holds a reference to its Core). */
static int Core_clear(Core *c)
{
    Py_CLEAR(c->fallback);
    Py_CLEAR(c->unviewable);
    c->rd = NULL;
    Py_CLEAR(c->reader);
    return 0;
}

static void Core_dealloc(Core *c)
{
    PyObject_GC_UnTrack(c);
    if (c->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)c);
    drop_buffer(c);
    Core_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}
