/* shmcache._core: the compiled critical section of get, put, delete, a view's pin and the batches get_many and
 * put_many; after the unlock, a get's checksum and the decode of plain values (_unpack.c), and the view built over
 * its pin (_view.c).
 *
 * One Core is bound per attached handle (shmcache/core.py): it keeps a writable buffer export of the segment's
 * mapping and a table of every offset, word number and constant it uses, handed over by Python from
 * shmcache/layout at bind time. This file holds no layout number of its own; a missing key fails the bind.
 *
 * Each method runs the whole locked section in C, as shmcache/table.py, arena.py, index.py and lru.py do it in
 * Python (they stay the readable reference; tests/test_core.py pins the two to byte-identical segments). Anything
 * unusual is handed back to the Python path (HANDOVER), which knows how to judge, repair and raise: the dirty word
 * set on entry, a damaged mutex kind word, a re-entered call (EDEADLK), a dead holder (EOWNERDEAD), a lock wait past
 * the timeout, a put above the byte limit or a damaged default time to live, and any bound failing on the segment's
 * bytes. A bound failing after the first write of an update leaves the dirty word set, so that the Python path's
 * next holder repairs. Pins are asked of the kernel (F_OFD_GETLK on the pin byte) exactly where table.py asks,
 * and a refusal is answered with PINNED, the segment consistent, for the caller to raise PinnedError. A batch that
 * stops part-way says how far it got; the Python path does the rest.
 *
 * Why plain C and not Cython: no build-time dependency beyond a C compiler, direct control over the GIL and the
 * memory touched, and no generated code to audit.
 *
 * The GIL. It is kept for the whole locked section, so that no Python code (a signal handler, a finaliser, another
 * thread) ever runs while this thread holds the cache lock, and the section is never interrupted. It is released
 * only to wait for a busy lock (spin, yield, then timed lock in slices); between slices it is re-taken to run
 * pending signal handlers (the lock is not held then). A lock won after a wait re-takes the GIL while holding the
 * lock: a Python thread keeps the GIL for at most the switch interval, so that wait is bounded, as it is for a
 * Python-path holder that loses the GIL.
 *
 * Memory safety: every slot, offset and length read from the segment is checked before it is used to address
 * memory; index probes and list walks are bounded by the table sizes.
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* F_OFD_GETLK (as pyconfig.h defines it, so its own definition is no redefinition) */
#endif
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
};

/* Why a call was handed over (Core.reason, and the REASONS dict of the module). */
enum {
    WHY_NONE, WHY_DIRTY, WHY_KIND, WHY_REENTERED, WHY_OWNERDEAD, WHY_TIMEOUT, WHY_BOUNDS, WHY_RELEASED,
    WHY_LIMIT, WHY_LOCK, WHY_PINNED, WHY_COUNT
};
static const char *const why_names[WHY_COUNT] = {
    "none", "dirty", "kind", "reentered", "ownerdead", "timeout", "bounds", "released", "limit", "lock", "pinned",
};

/* The wait for a busy lock; each can be set at build time (CFLAGS=-DSPIN_ROUNDS=...) to measure another. */
#ifndef SPIN_ROUNDS
#define SPIN_ROUNDS 64   /* trylock attempts with pause instructions between them, GIL released */
#endif
#ifndef SPIN_PAUSES
#define SPIN_PAUSES 32   /* pause instructions per round (a lock hold is ~1 us) */
#endif
#ifndef YIELD_ROUNDS
#define YIELD_ROUNDS 50  /* then trylock + sched_yield rounds, as lock.py's _SPIN_TRIES */
#endif
#define SLICE_NS 100000000LL /* timed-lock slice: signals are looked at between two */
#define PATIENCE 1000        /* timeouts more for a holder whose long walk moves the progress word (lock.py's) */

static _Thread_local int64_t thread_waited_ns; /* how long this thread's last wait for the lock took */
static _Thread_local int thread_extended;      /* ...and how many timeouts it added for a holder's progress */

static int64_t mono_ns(void);

/* What a wait returns through: its figures recorded for last_wait(), then ``rc``. */
static inline int waited(int64_t start, int extensions, int rc)
{
    thread_waited_ns = mono_ns() - start;
    thread_extended = extensions;
    return rc;
}

static inline void cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

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
    PyObject *hasher; /* codec.xxh3: a get checks its copy's checksum with it, after the unlock */
    /* regions */
    unsigned char *mem;
    int64_t *h, *ix, *ent, *exp, *ver, *kw, *aw;
    unsigned char *kinds, *pins, *arena;
    pthread_mutex_t *mutex;
    volatile int64_t *kind_word;
    int64_t kind_word_value;
    /* geometry */
    int64_t slots, mask, arena_nbytes;
    /* word numbers */
    Py_ssize_t ew, iw, kww;
    Py_ssize_t e_prev, e_next, e_fp, e_off, e_klen, e_vlen, e_slot, e_check;
    Py_ssize_t i_fp, i_entry, k_entries, k_retained;
    Py_ssize_t h_hits, h_misses, h_puts, h_updates, h_deletes, h_evictions, h_dirty, h_entries, h_retained,
        h_max_entries, h_max_retained, h_head, h_tail, h_fill, h_arena_used, h_free_head, h_unused_next,
        h_version_clock, h_next_expiry, h_expired, h_default_ttl, h_writing, h_progress;
    /* constants */
    int64_t block_header, block_align, max_block, len_mask, owner_shift, empty, nil, sentinel, never, max_ttl,
        max_version, kind_prefix, pin_base, check_mask, tag_bytes, tag_msgpack, tag_array, tag_tensor;
} Core;

#define HW(f) (c->h[c->h_##f])
#define EN(e, f) (c->ent[(e) * c->ew + c->e_##f])
#define IXF(s) (c->ix[(s) * c->iw + c->i_fp])
#define IXE(s) (c->ix[(s) * c->iw + c->i_entry])
#define AW(off) (c->aw[(off) >> 3])
#define SLOT_OK(e) ((e) > 0 && (e) < c->slots)       /* a real entry slot (not the sentinel) */
#define LINK_OK(e) ((e) >= 0 && (e) < c->slots)      /* an entry slot or the sentinel */
#define LEN_OK(n) ((n) >= 0 && (n) <= c->arena_nbytes)
/* Counters: added in unsigned arithmetic, so that damaged words wrap instead of overflowing (undefined in C). */
#define ADD(p, d) ((p) = (int64_t)((uint64_t)(p) + (uint64_t)(int64_t)(d)))

static PyObject *HANDOVER; /* returned when the Python path must take the call */
static PyObject *PINNED;   /* returned by put when pinned entries leave no room (the Python side raises) */

/* ------------------------------------------------------------------------------------------------ binding */

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
    if (c->have_buf) {
        c->have_buf = 0;
        PyBuffer_Release(&c->buf);
    }
}

static int bind(Core *c, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offsets", "live_fd", "timeout_ns", "hasher", NULL};
    PyObject *obj, *d, *hasher;
    int live_fd;
    long long timeout_ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!iLO", kwlist, &obj, &PyDict_Type, &d, &live_fd, &timeout_ns,
                                     &hasher))
        return -1;
    if (!PyCallable_Check(hasher)) {
        PyErr_SetString(PyExc_TypeError, "hasher must be callable (codec.xxh3)");
        return -1;
    }
    if (c->have_buf || c->released) {
        PyErr_SetString(PyExc_RuntimeError, "shmcache._core.Core is bound once");
        return -1;
    }
    if (timeout_ns <= 0) {
        PyErr_Format(PyExc_ValueError, "timeout_ns must be above 0, got %lld", timeout_ns);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &c->buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
        return -1;
    c->have_buf = 1;
    c->mem = c->buf.buf;
    c->live_fd = live_fd;
    c->timeout_ns = timeout_ns;
    Py_INCREF(hasher);
    c->hasher = hasher;
    int64_t index_slots, entry_slots, index_bytes, entry_bytes, kind_rows, kind_bytes, lock_off, lock_nbytes,
        kind_off, word;
    if (take(d, "entry_slots", &entry_slots) || take(d, "index_slots", &index_slots)
        || take(d, "arena_nbytes", &c->arena_nbytes) || take(d, "INDEX_SLOT_NBYTES", &index_bytes)
        || take(d, "ENTRY_NBYTES", &entry_bytes) || take(d, "KIND_ROWS", &kind_rows)
        || take(d, "KIND_NBYTES", &kind_bytes) || take(d, "H_LOCK_OFF", &lock_off)
        || take(d, "LOCK_NBYTES", &lock_nbytes) || take(d, "MUTEX_KIND_OFF", &kind_off)
        || take(d, "MUTEX_KIND_WORD", &c->kind_word_value) || take(d, "WORD_NBYTES", &word)
        || take(d, "BLOCK_HEADER_NBYTES", &c->block_header) || take(d, "BLOCK_ALIGN", &c->block_align)
        || take(d, "MAX_BLOCK_NBYTES", &c->max_block) || take(d, "BLOCK_LEN_MASK", &c->len_mask)
        || take(d, "BLOCK_OWNER_SHIFT", &c->owner_shift) || take(d, "EMPTY", &c->empty)
        || take(d, "NIL", &c->nil) || take(d, "SENTINEL", &c->sentinel) || take(d, "NEVER", &c->never)
        || take(d, "MAX_TTL_NS", &c->max_ttl) || take(d, "MAX_VERSION", &c->max_version)
        || take(d, "KIND_PREFIX", &c->kind_prefix)
        || take(d, "PIN_BASE", &c->pin_base) || take(d, "CHECK_MASK", &c->check_mask)
        || take(d, "TAG_BYTES", &c->tag_bytes) || take(d, "TAG_MSGPACK", &c->tag_msgpack)
        || take(d, "TAG_ARRAY", &c->tag_array) || take(d, "TAG_TENSOR", &c->tag_tensor))
        return -1;
    if (word != (int64_t)sizeof(int64_t) || entry_slots < 2 || index_slots < 2 || (index_slots & (index_slots - 1))
        || entry_slots >= ((int64_t)1 << 31) || c->arena_nbytes <= 0 || c->arena_nbytes % 8
        || c->block_header != (int64_t)sizeof(int64_t) || c->block_align <= 0 || c->block_align % 8
        || entry_bytes % 8 || index_bytes % 8 || kind_bytes % 8 || kind_rows < 256 || c->owner_shift <= 0
        || c->owner_shift > 32 || c->len_mask != ((int64_t)1 << c->owner_shift) - 1 || c->sentinel != 0
        || lock_nbytes < (int64_t)sizeof(pthread_mutex_t) || kind_off < 0 || kind_off % 8
        || kind_off + 8 > lock_nbytes || c->kind_prefix < 0 || c->kind_prefix > 255) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the offsets describe a layout this build cannot "
                                          "address (word size, slot counts, block header or mutex)");
        return -1;
    }
    c->slots = entry_slots;
    c->mask = index_slots - 1;
    c->ew = (Py_ssize_t)(entry_bytes / 8);
    c->iw = (Py_ssize_t)(index_bytes / 8);
    c->kww = (Py_ssize_t)(kind_bytes / 8);
    int64_t hw_limit;
    if (take(d, "HEADER_WORDS", &hw_limit) || region(c, d, "header_off", hw_limit * 8, 8, (void **)&c->h)
        || region(c, d, "index_off", index_slots * index_bytes, 8, (void **)&c->ix)
        || region(c, d, "entries_off", entry_slots * entry_bytes, 8, (void **)&c->ent)
        || region(c, d, "expires_off", entry_slots * 8, 8, (void **)&c->exp)
        || region(c, d, "versions_off", entry_slots * 8, 8, (void **)&c->ver)
        || region(c, d, "kinds_off", entry_slots, 1, (void **)&c->kinds)
        || region(c, d, "pins_off", entry_slots, 1, (void **)&c->pins)
        || region(c, d, "kind_table_off", kind_rows * kind_bytes, 8, (void **)&c->kw)
        || region(c, d, "arena_off", c->arena_nbytes, 8, (void **)&c->arena))
        return -1;
    c->aw = (int64_t *)c->arena;
    c->mutex = (pthread_mutex_t *)((unsigned char *)c->h + lock_off);
    c->kind_word = (volatile int64_t *)((unsigned char *)c->h + lock_off + kind_off);
    int64_t ewl = c->ew, iwl = c->iw, kwl = c->kww;
    if (take_word(d, "E_PREV", &c->e_prev, ewl) || take_word(d, "E_NEXT", &c->e_next, ewl)
        || take_word(d, "E_FP", &c->e_fp, ewl) || take_word(d, "E_OFF", &c->e_off, ewl)
        || take_word(d, "E_KEY_NBYTES", &c->e_klen, ewl) || take_word(d, "E_VAL_NBYTES", &c->e_vlen, ewl)
        || take_word(d, "E_SLOT", &c->e_slot, ewl) || take_word(d, "E_CHECK", &c->e_check, ewl)
        || take_word(d, "I_FP", &c->i_fp, iwl) || take_word(d, "I_ENTRY", &c->i_entry, iwl)
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
        || take_word(d, "H_PROGRESS", &c->h_progress, hw_limit))
        return -1;
    if (lock_off % 8 || lock_off + lock_nbytes > hw_limit * 8) {
        PyErr_SetString(PyExc_ValueError, "shmcache._core.Core: the mutex is not within the header");
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

static void Core_dealloc(Core *c)
{
    drop_buffer(c);
    Py_CLEAR(c->hasher);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* ------------------------------------------------------------------------------------------------ the lock */

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int kind_ok(Core *c) { return *c->kind_word == c->kind_word_value; }

/* trylock, unless the kind word is not init_mutex's: glibc asserts inside some kinds' lock calls. */
static inline int try_checked(Core *c) { return kind_ok(c) ? pthread_mutex_trylock(c->mutex) : -1; }

/* Wait for a busy lock with the GIL released: spin with pause instructions, then yield, then timed lock in
 * slices until the timeout, extended by another timeout each time the holder moved the progress word meanwhile (a
 * long repair or verify: lock.py's SegmentLock.acquire_slow has the same patience); between slices the GIL is
 * re-taken to run pending signal handlers. Returns the last lock result (0: held), -1 for a damaged kind word, or
 * -2 with a Python exception set (a signal handler raised). The time it took is the thread's last_wait(). */
static int wait_lock(Core *c)
{
    int rc = EBUSY;
    int64_t start = mono_ns();
    int64_t seen = *(volatile int64_t *)&HW(progress); /* read without the lock: one word, for patience only */
    int extensions = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < SPIN_ROUNDS && rc == EBUSY; i++) {
        for (int j = 0; j < SPIN_PAUSES; j++)
            cpu_pause();
        rc = try_checked(c);
    }
    for (int i = 0; i < YIELD_ROUNDS && rc == EBUSY; i++) {
        sched_yield();
        rc = try_checked(c);
    }
    Py_END_ALLOW_THREADS
    int64_t deadline = mono_ns() + c->timeout_ns;
    while (rc == EBUSY || rc == ETIMEDOUT) {
        int64_t now = mono_ns();
        if (now >= deadline) {
            int64_t p = *(volatile int64_t *)&HW(progress);
            if (p != seen && extensions < PATIENCE) {
                seen = p;
                extensions++;
                deadline = now + c->timeout_ns;
                continue;
            }
            rc = ETIMEDOUT;
            break;
        }
        if (PyErr_CheckSignals() < 0)
            return waited(start, extensions, -2);
        if (c->released)
            return waited(start, extensions, EBUSY); /* a close() came meanwhile: the Python path says so */
        int64_t until = deadline < now + SLICE_NS ? deadline : now + SLICE_NS;
        Py_BEGIN_ALLOW_THREADS
        if (!kind_ok(c)) {
            rc = -1;
        } else {
            /* The wall-clock API (every libc has it), converted per slice so a clock step costs one slice. */
            struct timespec real;
            clock_gettime(CLOCK_REALTIME, &real);
            int64_t at = (int64_t)real.tv_sec * 1000000000LL + real.tv_nsec + (until - mono_ns());
            real.tv_sec = at / 1000000000LL;
            real.tv_nsec = at % 1000000000LL;
            rc = pthread_mutex_timedlock(c->mutex, &real);
        }
        Py_END_ALLOW_THREADS
    }
    return waited(start, extensions, rc);
}

static void unlock(Core *c)
{
    /* A kind word damaged while held is put back before glibc reads it, and the segment marked for repair. */
    if (!kind_ok(c)) {
        *c->kind_word = c->kind_word_value;
        HW(dirty) = 1;
    }
    pthread_mutex_unlock(c->mutex);
}

/* Take the lock (GIL held). 0: held; ST_HANDOVER with c->reason set: not held; -1: a Python exception is set. */
static int lock(Core *c)
{
    if (c->released || !c->bound) {
        c->reason = WHY_RELEASED;
        return ST_HANDOVER;
    }
    int rc = try_checked(c);
    if (rc == EBUSY) {
        c->waits++;
        rc = wait_lock(c);
    }
    if (rc == -2)
        return -1;
    if (rc == 0 && c->released) {
        unlock(c);
        rc = EBUSY;
    }
    switch (rc) {
    case 0:
        return ST_OK;
    case -1:
        c->reason = WHY_KIND;
        break;
    case EOWNERDEAD:
        /* Consistent at once, as the Python path does; what the dead holder left half-done is flagged by the
         * dirty word, which the Python path looks at when it takes the lock again. */
        pthread_mutex_consistent(c->mutex);
        unlock(c);
        c->reason = WHY_OWNERDEAD;
        break;
    case EDEADLK:
        c->reason = WHY_REENTERED;
        break;
    case ETIMEDOUT:
        c->reason = WHY_TIMEOUT;
        break;
    case EBUSY:
        c->reason = WHY_RELEASED;
        break;
    default:
        c->reason = WHY_LOCK;
        break;
    }
    return ST_HANDOVER;
}

/* ------------------------------------------------------------------------------------------------ structures */

/* A hand-over for a failed bound; the caller leaves the dirty word as it is (set, if a write was made). */
static inline int bounds(Core *c)
{
    c->reason = WHY_BOUNDS;
    return ST_HANDOVER;
}

static inline int64_t block_nbytes(Core *c, int64_t payload)
{
    return (c->block_header + payload + c->block_align - 1) & -c->block_align;
}

/* Whether a block at ``off`` with a value of ``vlen`` and a key of ``klen`` bytes lies within the arena. */
static inline int block_in_arena(Core *c, int64_t off, int64_t vlen, int64_t klen)
{
    return off >= 0 && off % 8 == 0 && vlen >= 1 && LEN_OK(vlen) && LEN_OK(klen)
           && off <= c->arena_nbytes - c->block_header - vlen - klen;
}

/* Pin test (table.pinned): a flagged entry is pinned while another description holds its pin byte; a flag found
 * without one is cleared. 1 pinned, 0 not, -1 the query failed. */
static int pinned(Core *c, int64_t e)
{
    if (!c->pins[e])
        return 0;
    struct flock fl = byte_lock(F_WRLCK, c->pin_base + e);
    if (fcntl(c->live_fd, F_OFD_GETLK, &fl) < 0)
        return -1;
    if (fl.l_type != F_UNLCK)
        return 1;
    c->pins[e] = 0;
    return 0;
}

/* index.find: the entry holding key ``kb`` (fingerprint ``fp``), or EMPTY, into *out. */
static int find(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t *out)
{
    int64_t s = fp & c->mask;
    for (int64_t i = 0; i <= c->mask; i++) {
        int64_t e = IXE(s);
        if (e == c->empty) {
            *out = c->empty;
            return ST_OK;
        }
        if (!SLOT_OK(e))
            return bounds(c);
        if (IXF(s) == fp && EN(e, klen) == klen) {
            int64_t off = EN(e, off), vlen = EN(e, vlen);
            if (!block_in_arena(c, off, vlen, klen))
                return bounds(c);
            if (memcmp(c->arena + off + c->block_header + vlen, kb, (size_t)klen) == 0) {
                *out = e;
                return ST_OK;
            }
        }
        s = (s + 1) & c->mask;
    }
    return bounds(c); /* no empty slot anywhere */
}

/* index.remove: empty slot ``s`` and shift back what follows it in its cluster. */
static int index_remove(Core *c, int64_t s)
{
    IXE(s) = c->empty;
    int64_t j = s;
    for (int64_t i = 0; i <= c->mask; i++) {
        j = (j + 1) & c->mask;
        int64_t e = IXE(j);
        if (e == c->empty)
            return ST_OK;
        /* The entry at j may fill the hole at s only if its home slot is not cyclically within (s, j]. */
        if ((((uint64_t)j - (uint64_t)IXF(j)) & (uint64_t)c->mask) >= ((uint64_t)(j - s) & (uint64_t)c->mask)) {
            if (!SLOT_OK(e))
                return bounds(c);
            IXF(s) = IXF(j);
            IXE(s) = e;
            EN(e, slot) = s;
            IXE(j) = c->empty;
            s = j;
        }
    }
    return bounds(c);
}

/* lru.move_to_front. */
static int move_to_front(Core *c, int64_t e)
{
    int64_t p = EN(e, prev);
    if (p == c->sentinel)
        return ST_OK;
    int64_t n = EN(e, next), first = EN(c->sentinel, next);
    if (!LINK_OK(p) || !LINK_OK(n) || !LINK_OK(first))
        return bounds(c);
    EN(p, next) = n;
    EN(n, prev) = p;
    first = EN(c->sentinel, next); /* re-read: p may have been the sentinel's next's neighbour */
    EN(e, prev) = c->sentinel;
    EN(e, next) = first;
    EN(first, prev) = e;
    EN(c->sentinel, next) = e;
    return ST_OK;
}

/* Table.remove: drop entry ``e`` from every structure; its slot and block go back. */
static int table_remove(Core *c, int64_t e)
{
    if (!SLOT_OK(e))
        return bounds(c);
    int64_t p = EN(e, prev), n = EN(e, next), off = EN(e, off), klen = EN(e, klen), vlen = EN(e, vlen),
            s = EN(e, slot);
    if (!(s >= 0 && s <= c->mask && IXE(s) == e && LINK_OK(p) && LINK_OK(n) && LEN_OK(klen) && LEN_OK(vlen)))
        return bounds(c);
    int64_t nb = block_nbytes(c, klen + vlen);
    /* arena free: the block must be this entry's own */
    if (!(off >= 0 && off < c->arena_nbytes && off % 8 == 0 && AW(off) == (nb | (e << c->owner_shift))))
        return bounds(c);
    AW(off) = nb;
    ADD(HW(arena_used), -nb);
    int r = index_remove(c, s);
    if (r)
        return r;
    EN(p, next) = n;
    EN(n, prev) = p;
    EN(e, check) = 0;
    EN(e, next) = HW(free_head);
    HW(free_head) = e;
    ADD(HW(entries), -1);
    ADD(HW(retained), -(klen + vlen));
    c->exp[e] = 0;
    int64_t k = c->kinds[e];
    if (k) {
        ADD(c->kw[k * c->kww + c->k_entries], -1);
        ADD(c->kw[k * c->kww + c->k_retained], -(klen + vlen));
    }
    return ST_OK;
}

/* Table.reclaim_expired: remove every expired entry no view pins, then raise next_expiry to what is left. */
static int reclaim_expired(Core *c, int64_t now)
{
    int64_t un = HW(unused_next), handed_out = (un > 0 && un <= c->slots) ? un : c->slots, removed = 0;
    for (int64_t e = 0; e < handed_out; e++) {
        int64_t x = c->exp[e];
        if (x != 0 && x <= now && EN(e, check)) {
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

/* Table.evict_until(1, size): expired entries first, then the least recently used, pinned ones excepted. */
static int evict_until(Core *c, int64_t size, int64_t now)
{
    int64_t most_entries = HW(max_entries) - 1, most_bytes = HW(max_retained) - size;
    if (HW(entries) <= most_entries && HW(retained) <= most_bytes)
        return ST_OK;
    if (HW(next_expiry) != c->never && HW(next_expiry) <= now) {
        int r = reclaim_expired(c, now);
        if (r)
            return r;
    }
    int64_t e = EN(c->sentinel, prev), held = 0;
    for (int64_t i = 0; i < c->slots; i++) {
        if (HW(entries) <= most_entries && HW(retained) <= most_bytes)
            return ST_OK;
        if (e == c->sentinel)
            break;
        if (!SLOT_OK(e))
            return bounds(c);
        int64_t p = EN(e, prev);
        int pin = pinned(c, e);
        if (pin < 0)
            return bounds(c);
        if (pin) {
            held++;
        } else {
            int r = table_remove(c, e);
            if (r)
                return r;
            ADD(HW(evictions), 1);
        }
        e = p;
    }
    return held ? ST_PINNED : bounds(c);
}

/* Table.evict_one: evict the least recently used entry no view pins; *done 0 if there is none. */
static int evict_one(Core *c, int *done)
{
    int64_t e = EN(c->sentinel, prev);
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
            int r = table_remove(c, e);
            if (r)
                return r;
            ADD(HW(evictions), 1);
            *done = 1;
            return ST_OK;
        }
        e = EN(e, prev);
    }
    return bounds(c);
}

/* arena write_dead: cover [off, off + nbytes) with dead blocks. */
static int write_dead(Core *c, int64_t off, int64_t nbytes)
{
    if (off < 0 || nbytes < 0 || off % 8 || nbytes % 8 || nbytes > c->arena_nbytes - off)
        return bounds(c);
    while (nbytes) {
        int64_t n = nbytes < c->max_block ? nbytes : c->max_block;
        AW(off) = n;
        off += n;
        nbytes -= n;
    }
    return ST_OK;
}

/* Arena._clean_one: pass the block at tail, absorbing it (dead) or sliding it down to head (live). */
static int clean_one(Core *c, int64_t *head, int64_t *tail, int64_t *fill, int64_t *stuck)
{
    int64_t size = c->arena_nbytes, hd = *head, tl = *tail, fl = *fill;
    if (tl < 0 || tl >= size || tl % 8 || hd < 0 || hd > tl)
        return bounds(c);
    int64_t hdr = AW(tl), nb = hdr & c->len_mask;
    if (nb < c->block_header || nb % c->block_align || nb > size - tl || nb > fl)
        return bounds(c);
    int64_t e = hdr >> c->owner_shift;
    if (SLOT_OK(e) && EN(e, off) == tl && EN(e, check)) {
        int pin = pinned(c, e);
        if (pin < 0)
            return bounds(c);
        if (pin) {
            /* A pinned block stays: the gap before it becomes a dead block and the ring goes on after it. */
            if (hd != tl) {
                int r = write_dead(c, hd, tl - hd);
                if (r)
                    return r;
            }
            (*stuck)++;
            tl += nb;
            if (tl == size)
                tl = 0;
            *head = tl;
            *tail = tl;
            *fill = size;
            return ST_OK;
        }
        if (hd != tl) {
            memmove(c->arena + hd, c->arena + tl, (size_t)nb); /* the ranges may overlap */
            EN(e, off) = hd;
        }
        hd += nb;
        fl += nb;
    }
    fl -= nb;
    tl += nb;
    if (tl == size)
        tl = 0;
    if (hd == size)
        hd = 0;
    *head = hd;
    *tail = tl;
    *fill = fl;
    return ST_OK;
}

/* Arena.alloc: the offset of a new block of ``nb`` bytes owned by entry ``e`` into *out. */
static int alloc(Core *c, int64_t nb, int64_t e, int64_t *out)
{
    int64_t size = c->arena_nbytes, head = HW(head), tail = HW(tail), fill = HW(fill), used = HW(arena_used);
    if (!(head >= 0 && head < size && tail >= 0 && tail < size && fill >= 0 && fill <= size && !((head | tail) & 7)
          && (((head - tail) % size) + size) % size == fill % size && used >= 0 && used <= size - nb))
        return bounds(c);
    int64_t cleaned = 0, stuck = 0;
    for (;;) {
        if (fill == 0)
            head = tail = 0;
        if (head >= tail && fill < size) { /* free space is [head, size) then [0, tail) */
            int64_t room = size - head;
            if (room >= nb)
                break;
            if (room) {
                int r = write_dead(c, head, room);
                if (r)
                    return r;
                fill += room;
            }
            head = 0;
            continue;
        }
        if (fill < size && tail - head >= nb) /* free space is the gap [head, tail) */
            break;
        int64_t before = tail;
        int r = clean_one(c, &head, &tail, &fill, &stuck);
        if (r)
            return r;
        int64_t passed = (((tail - before) % size) + size) % size;
        cleaned += passed ? passed : size;
        if (cleaned > 2 * size) {
            if (stuck) {
                /* Pinned blocks split the free space into pieces all smaller than nb: the ring as it stands is
                 * consistent; record it and refuse. */
                HW(head) = head;
                HW(tail) = tail;
                HW(fill) = fill;
                return ST_PINNED;
            }
            return bounds(c);
        }
    }
    if (head < 0 || head % 8 || nb > size - head)
        return bounds(c);
    AW(head) = nb | (e << c->owner_shift);
    *out = head;
    head += nb;
    /* Ordering: head, tail and fill are written together after the block (see arena.py). */
    HW(head) = head == size ? 0 : head;
    HW(tail) = tail;
    HW(fill) = fill + nb;
    ADD(HW(arena_used), nb);
    return ST_OK;
}

/* The columns a store writes: a new version, the expiry (lowering the bound if need be). */
static inline void stamp(Core *c, int64_t e, int64_t expires)
{
    int64_t v = (int64_t)((uint64_t)HW(version_clock) + 1);
    HW(version_clock) = v;
    c->ver[e] = v;
    c->exp[e] = expires;
    if (expires && expires < HW(next_expiry))
        HW(next_expiry) = expires;
}

/* The arguments of a store, checked once by the method. */
typedef struct {
    const char *kb, *body;
    int64_t klen, blen, tag, fp, check, size, nb, expires;
} Store;

/* Whether a store's arguments are consistent, as SharedCache.put encodes them: a wrong size or block size would aim
 * writes past the block. */
static inline int store_ok(Core *c, const Store *st)
{
    return st->tag >= 0 && st->tag <= 255 && st->fp >= 0 && st->check != 0 && st->size == st->klen + st->blen + 1
           && st->nb == block_nbytes(c, st->size) && st->nb <= c->max_block && st->nb <= c->arena_nbytes;
}

/* Table.insert: a new entry as the most recently used (the key is absent; the limits leave room). */
static int insert(Core *c, const Store *st)
{
    int64_t e = HW(free_head), off = 0, vlen = st->blen + 1, r;
    int from_free = e != c->nil;
    if (!from_free) {
        e = HW(unused_next);
        if (!SLOT_OK(e))
            return bounds(c);
    } else if (!SLOT_OK(e) || EN(e, check)) {
        return bounds(c);
    }
    HW(writing) = e;
    if ((r = alloc(c, st->nb, e, &off)))
        return (int)r;
    if (from_free)
        HW(free_head) = EN(e, next);
    else
        HW(unused_next) = e + 1;
    unsigned char *v0 = c->arena + off + c->block_header; /* a block is [header][value][key] */
    v0[0] = (unsigned char)st->tag;
    memcpy(v0 + 1, st->body, (size_t)st->blen);
    memcpy(v0 + vlen, st->kb, (size_t)st->klen);
    int64_t s = st->fp & c->mask, i;
    for (i = 0; i <= c->mask && IXE(s) != c->empty; i++)
        s = (s + 1) & c->mask;
    if (i > c->mask)
        return bounds(c);
    int64_t first = EN(c->sentinel, next);
    if (!LINK_OK(first))
        return bounds(c);
    EN(e, prev) = c->sentinel;
    EN(e, next) = first;
    EN(e, fp) = st->fp;
    EN(e, off) = off;
    EN(e, klen) = st->klen;
    EN(e, vlen) = vlen;
    EN(e, slot) = s;
    EN(e, check) = st->check;
    IXF(s) = st->fp;
    IXE(s) = e;
    EN(first, prev) = e;
    EN(c->sentinel, next) = e;
    ADD(HW(entries), 1);
    ADD(HW(retained), st->klen + vlen);
    stamp(c, e, st->expires);
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

/* Table.overwrite: a new value for resident entry ``e`` in place, when the block size is the same and the byte
 * limit allows; *done 0 (nothing written) otherwise. */
static int overwrite(Core *c, int64_t e, const Store *st, int *done)
{
    int64_t klen = EN(e, klen), old_vlen = EN(e, vlen), off = EN(e, off), vlen = st->blen + 1;
    *done = 0;
    if (!LEN_OK(klen) || !LEN_OK(old_vlen))
        return bounds(c);
    if (block_nbytes(c, klen + old_vlen) != st->nb || HW(retained) + vlen - old_vlen > HW(max_retained)
        || !SLOT_OK(e))
        return ST_OK;
    if (!(off >= 0 && off <= c->arena_nbytes - st->nb && off % 8 == 0 && AW(off) == (st->nb | (e << c->owner_shift))))
        return bounds(c);
    HW(writing) = e;
    unsigned char *v0 = c->arena + off + c->block_header;
    v0[0] = (unsigned char)st->tag;
    memcpy(v0 + 1, st->body, (size_t)st->blen);
    if (vlen != old_vlen) {
        memcpy(v0 + vlen, st->kb, (size_t)klen);
        EN(e, vlen) = vlen;
        ADD(HW(retained), vlen - old_vlen);
        int64_t k = c->kinds[e];
        if (k)
            ADD(c->kw[k * c->kww + c->k_retained], vlen - old_vlen);
    }
    EN(e, check) = st->check;
    int r = move_to_front(c, e);
    if (r)
        return r;
    stamp(c, e, st->expires);
    *done = 1;
    return ST_OK;
}

/* _lapse_locked for an expired entry that no pin flag marks: drop it, counted in ``expired``. */
static int lapse(Core *c, int64_t e)
{
    HW(dirty) = 1;
    int r = table_remove(c, e);
    if (r)
        return r;
    ADD(HW(expired), 1);
    HW(dirty) = 0;
    return ST_OK;
}

/* ------------------------------------------------------------------------------------------------ sections */

typedef struct {
    int64_t tag, check, vlen, off, slot;
    int hit;
} Found;

/* The steps of one item, shared by a call and a batch: inlined into each, so that a single get or put pays nothing for
 * the split (not inlined, they cost a get ~40 instructions, 3 %: benchmarks.instructions --collect Core_get_value). */
#define STEP static inline __attribute__((always_inline))

/* Store.find_live (the caller checked the dirty word): the key's entry, or EMPTY if it is absent or expired (an
 * expired one is dropped, unless a view pins it: it stays, and reads as absent). *now: the clock reading, or -1
 * until an expiry needs it; read once, it stays for the caller's next lookups (a batch judges expiry by one
 * reading). */
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
    f->check = EN(e, check);
    f->off = EN(e, off) + c->block_header;
    f->vlen = EN(e, vlen);
    f->tag = c->arena[f->off];
}

/* Store.hit: the entry becomes the most recent (in the dirty bracket), and a hit is counted. */
STEP int hit(Core *c, int64_t e)
{
    int r;
    if (EN(e, prev) != c->sentinel) {
        int64_t p = EN(e, prev), n = EN(e, next), first = EN(c->sentinel, next);
        if (!LINK_OK(p) || !LINK_OK(n) || !LINK_OK(first))
            return bounds(c); /* nothing written yet */
        HW(dirty) = 1;
        if ((r = move_to_front(c, e)))
            return r;
        HW(dirty) = 0;
    }
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
    if ((r = hit(c, e)))
        return r;
    found(c, e, f);
    return ST_OK;
}

static int get_locked(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t now, Found *f)
{
    f->hit = 0;
    if (HW(dirty)) {
        c->reason = WHY_DIRTY;
        return ST_HANDOVER;
    }
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

/* A store's time to live in ns: ``ttl``, or the cache's default for -1 (ST_HANDOVER if that word is damaged). */
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

/* A store's checks before its first write (the caller checked the dirty word): the key's resident entry (an expired
 * one dropped) into *old, or EMPTY. ST_PINNED: a view pins that entry; nothing was written. */
STEP int put_find(Core *c, Store *st, int64_t now, int64_t *old)
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
        if (pin)  /* the key must never be in the index twice: a pinned expired entry refuses its replacement */
            return pin < 0 ? bounds(c) : ST_PINNED;
        if ((r = lapse(c, *old)))
            return r;
        *old = c->empty;
    }
    /* _store_locked */
    if (st->size > HW(max_retained)) { /* TooLargeError, raised by the Python path */
        c->reason = WHY_LIMIT;
        return ST_HANDOVER;
    }
    if (*old != c->empty) {
        int pin = pinned(c, *old);
        if (pin)
            return pin < 0 ? bounds(c) : ST_PINNED; /* nothing written */
    }
    return ST_OK;
}

/* A store's writes, after put_find (st->expires set by the caller): an update of ``old`` in place or a new entry,
 * evicting as the limits require. ST_PINNED: the room needed is pinned (the evictions made stand; every structure
 * is consistent). */
STEP int put_write(Core *c, Store *st, int64_t old, int64_t now)
{
    int r, done;
    HW(dirty) = 1;
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
        r = ST_OK;
        if (HW(entries) >= HW(max_entries) || HW(retained) + st->size > HW(max_retained))
            r = evict_until(c, st->size, now);
        while (r == ST_OK) {
            r = insert(c, st);
            if (r != ST_PINNED)
                break;
            /* Pinned blocks split the free space: evicting more (what is not pinned) may join it. */
            if ((r = evict_one(c, &done)))
                return r;
            r = done ? ST_OK : ST_PINNED;
        }
        if (r == ST_PINNED) { /* refused with every structure consistent: no repair needed */
            HW(writing) = 0;
            HW(dirty) = 0;
            return ST_PINNED;
        }
        if (r)
            return r;
    }
    ADD(HW(puts), 1);
    HW(writing) = 0;
    HW(dirty) = 0;
    return ST_OK;
}

static int put_locked(Core *c, Store *st, int64_t now, int64_t ttl)
{
    int64_t old;
    int r;
    if (HW(dirty)) {
        c->reason = WHY_DIRTY;
        return ST_HANDOVER;
    }
    if (now < 0)
        now = mono_ns();
    if ((r = ttl_of(c, &ttl)))
        return r;
    st->expires = ttl ? now + ttl : 0;
    if ((r = put_find(c, st, now, &old)))
        return r;
    return put_write(c, st, old, now);
}

static int delete_locked(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t now, int *deleted)
{
    int64_t e;
    int r;
    *deleted = 0;
    if (HW(dirty)) {
        c->reason = WHY_DIRTY;
        return ST_HANDOVER;
    }
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
    if (pin)
        return ST_PINNED;
    HW(dirty) = 1;
    if ((r = table_remove(c, e)))
        return r;
    ADD(HW(deletes), 1);
    HW(dirty) = 0;
    *deleted = 1;
    return ST_OK;
}

/* One key of a batch get: its arguments, what get_one found, and the body copied out under the lock. */
typedef struct {
    const char *kb;
    int64_t klen, fp;
    Found f;
    PyObject *body;
} Lookup;

/* entries.get_many_locked: each key looked up in order as get does (a hit made the most recent and counted, a miss
 * counted, an expired entry dropped), under one hold of the lock, expiry judged by one clock reading. *done: how
 * many keys were looked up, all unless a hand-over stops the batch at keys[*done] (nothing of it counted or moved:
 * the Python path looks up the rest); -1 with a MemoryError set if a body could not be copied (keys[*done - 1]'s). */
static int get_many_locked(Core *c, Lookup *keys, Py_ssize_t n, int64_t now, Py_ssize_t *done)
{
    int r;
    *done = 0;
    if (HW(dirty)) {
        c->reason = WHY_DIRTY;
        return ST_HANDOVER;
    }
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

/* entries.put_many_locked: store st[0..n) in order as put does, all expiring ``ttl`` ns (-1: the default) after one
 * clock reading, under one hold of the lock. Every size is checked against the byte limit first: if one can never
 * fit, nothing is stored and the Python path raises TooLargeError. *done: how many were stored when the batch stops
 * early. ST_PINNED: the room st[*done] needs is pinned (the evictions made stand; every structure is consistent).
 * A view pinning st[*done]'s own entry is a hand-over instead (WHY_PINNED, nothing of it written), so that the
 * Python path raises its own PinnedError for it. */
static int put_many_locked(Core *c, Store *st, Py_ssize_t n, int64_t now, int64_t ttl, Py_ssize_t *done)
{
    int64_t old;
    int r;
    *done = 0;
    if (HW(dirty)) {
        c->reason = WHY_DIRTY;
        return ST_HANDOVER;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (st[i].size > HW(max_retained)) { /* TooLargeError, raised by the Python path before anything is stored */
            c->reason = WHY_LIMIT;
            return ST_HANDOVER;
        }
    }
    if (now < 0)
        now = mono_ns();
    if ((r = ttl_of(c, &ttl)))
        return r;
    for (Py_ssize_t i = 0; i < n; i++) {
        st[i].expires = ttl ? now + ttl : 0;
        if ((r = put_find(c, &st[i], now, &old))) {
            if (r == ST_PINNED) {
                c->reason = WHY_PINNED;
                r = ST_HANDOVER;
            }
            return r;
        }
        if ((r = put_write(c, &st[i], old, now)))
            return r;
        *done = i + 1;
    }
    return ST_OK;
}

/* ------------------------------------------------------------------------------------------------ methods */

static int arg_bytes(PyObject *o, const char *what, const char **p, int64_t *n)
{
    if (!PyBytes_Check(o)) { /* a subclass too: TieredCache hands over EncodedKey */
        PyErr_Format(PyExc_TypeError, "%s must be bytes, got %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    *p = PyBytes_AS_STRING(o);
    *n = (int64_t)PyBytes_GET_SIZE(o);
    return 0;
}

static int arg_int(PyObject *o, const char *what, int64_t *out)
{
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be an int that fits 64 bits", what);
        }
        return -1;
    }
    *out = x;
    return 0;
}

static int nargs_ok(Py_ssize_t nargs, Py_ssize_t want, const char *name)
{
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "Core.%s takes %zd arguments, got %zd", name, want, nargs);
    return -1;
}

/* Leave a method: the last call out after release() drops the buffer export. */
static void leave(Core *c)
{
    if (--c->users == 0 && c->released)
        drop_buffer(c);
}

/* Why this thread's last call was handed over (Core.reason): kept per thread, so that the Python path reading it right
 * after a HANDOVER reads its own call's reason, whatever other threads' calls on the same handle answered meanwhile
 * (it tells a timed-out wait, which the Python path must not wait again, from the rest). */
static _Thread_local int thread_reason;

/* HANDOVER, for a call of ``c`` (NULL: no call of a Core), its reason recorded for this thread. */
static PyObject *handover(Core *c)
{
    if (c != NULL)
        thread_reason = c->reason;
    Py_INCREF(HANDOVER);
    return HANDOVER;
}

/* What a call that did not succeed answers: PINNED (a view pins what it must change), or HANDOVER. */
static PyObject *refusal(Core *c, int r)
{
    if (r != ST_PINNED)
        return handover(c);
    /* Recorded too: the caller's Python path reads the reason (a stale "timeout" would make it skip its wait). */
    thread_reason = WHY_PINNED;
    Py_INCREF(PINNED);
    return PINNED;
}

/* The call takes the lock: 0, held; otherwise -1, with what the call returns in *out (NULL with an exception set, or
   HANDOVER). Every successful enter is followed by unlock() and leave(). */
static int enter(Core *c, PyObject **out)
{
    c->users++;
    int r = lock(c);
    if (r) {
        leave(c);
        *out = r < 0 ? NULL : handover(c);
        return -1;
    }
    return 0;
}

/* The arguments of get and delete: (kb, fp, now_ns). */
static int key_args(PyObject *const *args, Py_ssize_t nargs, const char *name, const char **kb, int64_t *klen,
                    int64_t *fp, int64_t *now)
{
    if (nargs_ok(nargs, 3, name) || arg_bytes(args[0], "kb", kb, klen) || arg_int(args[1], "fp", fp)
        || arg_int(args[2], "now_ns", now))
        return -1;
    if (*fp < 0) {
        PyErr_SetString(PyExc_ValueError, "fp must be a 63-bit fingerprint");
        return -1;
    }
    return 0;
}

/* What get_value leaves to Python: a value it does not decode itself, or a copy whose checksum failed. */
static PyTypeObject RawType;
static PyStructSequence_Field raw_fields[] = {
    {"tag", "the value's tag byte"},
    {"body", "the bytes after the tag (bytes), or for an array or tensor the whole value, tag first (a bytearray "
             "the array is built over: its data starts 8-aligned)"},
    {"slot", "the entry's slot (for Guard.checksum_failed)"},
    {"ok", "whether the copy's checksum was right"},
    {NULL, NULL},
};
static PyStructSequence_Desc raw_desc = {
    "shmcache._core.Raw", "A hit Core.get_value leaves to the Python side to decode or to judge.", raw_fields, 4,
};

static PyObject *raw_of(int64_t tag, PyObject *body, int64_t slot, int ok)
{
    PyObject *out = PyStructSequence_New(&RawType), *t = PyLong_FromLongLong(tag), *e = PyLong_FromLongLong(slot);
    if (out == NULL || t == NULL || e == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(t);
        Py_XDECREF(e);
        Py_DECREF(body);
        return NULL;
    }
    PyStructSequence_SET_ITEM(out, 0, t);
    PyStructSequence_SET_ITEM(out, 1, body); /* the reference is the Raw's now */
    PyStructSequence_SET_ITEM(out, 2, e);
    PyStructSequence_SET_ITEM(out, 3, PyBool_FromLong(ok));
    return out;
}

/* 1 if the copy's checksum is right, 0 if not, -1 with an exception set. ``bytes``/``n``: the value after its tag. */
static int checksum_ok(Core *c, const char *bytes, Py_ssize_t n, PyObject *owner, int64_t tag, int64_t check)
{
    /* A memoryview over the copy's memory, which ``owner`` keeps alive for the call: the hasher (xxhash's C
       function) keeps no reference to its argument. */
    PyObject *view = PyBytes_CheckExact(owner) ? (Py_INCREF(owner), owner)
                                               : PyMemoryView_FromMemory((char *)bytes, n, PyBUF_READ);
    PyObject *t = PyLong_FromLongLong(tag);
    PyObject *h = NULL;
    if (view != NULL && t != NULL) {
        PyObject *hargs[2] = {view, t};
        h = PyObject_Vectorcall(c->hasher, hargs, 2, NULL);
    }
    Py_XDECREF(view);
    Py_XDECREF(t);
    if (h == NULL)
        return -1;
    unsigned long long x = PyLong_AsUnsignedLongLong(h);
    Py_DECREF(h);
    if (x == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return (int64_t)((x & (uint64_t)c->check_mask) | 1) == check;
}

/* What a get returns for hit *f once the lock is released, from its copy ``body`` (copy_value's; the reference is
 * taken): the copy's checksum checked, bytes returned as they are, a plain msgpack value decoded (_unpack.c);
 * anything else a Raw for the Python side (a failed checksum, an array or tensor, a value the decoder declines). */
static PyObject *finish(Core *c, const Found *f, PyObject *body)
{
    int whole = PyByteArray_CheckExact(body);
    const char *after_tag = whole ? PyByteArray_AS_STRING(body) + 1 : PyBytes_AS_STRING(body);
    Py_ssize_t n = (Py_ssize_t)(f->vlen - 1);
    int ok = checksum_ok(c, after_tag, n, body, f->tag, f->check);
    if (ok < 0) {
        Py_DECREF(body);
        return NULL;
    }
    if (ok && f->tag == c->tag_bytes)
        return body;
    if (ok && f->tag == c->tag_msgpack) {
        PyObject *v = shm_unpack(after_tag, n);
        if (v != NULL) {
            Py_DECREF(body);
            return v;
        }
    }
    return raw_of(f->tag, body, f->slot, ok);
}

static PyObject *Core_get_value(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    const char *kb;
    int64_t klen, fp, now;
    if (nargs_ok(nargs, 4, "get_value") || key_args(args, 3, "get_value", &kb, &klen, &fp, &now))
        return NULL;
    PyObject *refused;
    int r = enter(c, &refused);
    if (r)
        return refused;
    Found f = {0, 0, 0, 0, 0, 0};
    PyObject *body = NULL;
    r = get_locked(c, kb, klen, fp, now, &f);
    if (r == ST_OK && f.hit)
        body = copy_value(c, &f);
    unlock(c);
    leave(c);
    if (r)
        return handover(c);
    if (!f.hit) {
        Py_INCREF(args[3]);
        return args[3];
    }
    return body == NULL ? NULL : finish(c, &f, body);
}

/* Store.pin: the key's live entry pinned through description ``fd`` for a view, counted as a lookup (*locked: whether
 * the pin byte was locked through fd, whatever is answered). */
static int pin_locked(Core *c, const char *kb, int64_t klen, int64_t fp, int64_t now, int fd, Found *f, int *viewable,
                      int *locked)
{
    int64_t e;
    int r;
    f->hit = 0;
    if (HW(dirty)) {
        c->reason = WHY_DIRTY;
        return ST_HANDOVER;
    }
    if ((r = find_live(c, kb, klen, fp, &now, &e)))
        return r;
    if (e == c->empty) {
        ADD(HW(misses), 1);
        return ST_OK;
    }
    found(c, e, f);
    *viewable = f->tag == c->tag_bytes || f->tag == c->tag_array || f->tag == c->tag_tensor;
    if (!*viewable)
        return ST_OK; /* refused before anything is counted or pinned */
    /* Ordering: the flag before the kernel lock, as Store.pin: a holder dying between the two leaves a stale flag. */
    c->pins[e] = 1;
    struct flock fl = byte_lock(F_RDLCK, c->pin_base + e);
    if (fcntl(fd, F_OFD_SETLK, &fl) < 0) /* never refused (pin bytes are only read-locked): the Python path raises */
        return bounds(c);
    *locked = 1;
    return hit(c, e);
}

/* A view, compiled end to end: the pin as Store.pin takes it, through a description of ``pins`` (taken before the
 * lock, given back on a miss), then (_view.c) the lease that ends it, and the View if this handle checked the value
 * before. */
static PyObject *Core_view(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    const char *kb;
    int64_t klen, fp, now;
    if (nargs_ok(nargs, 4, "view") || key_args(args, 3, "view", &kb, &klen, &fp, &now))
        return NULL;
    if (Py_TYPE(args[3]) != &PinsType) {
        PyErr_SetString(PyExc_TypeError, "Core.view: pins must be a shmcache._core.Pins");
        return NULL;
    }
    Pins *p = (Pins *)args[3];
    if (p->closed) {
        c->reason = WHY_RELEASED;
        return handover(c);
    }
    int fd;
    Taken t;
    if (pins_take(p, &fd, &t))
        return NULL;
    PyObject *refused;
    if (enter(c, &refused)) {
        pins_give(p, fd, t);
        return refused;
    }
    Found f = {0, 0, 0, 0, 0, 0};
    int viewable = 0, locked = 0;
    int r = pin_locked(c, kb, klen, fp, now, fd, &f, &viewable, &locked);
    int64_t version = f.hit ? c->ver[f.slot] : 0;
    unlock(c);
    leave(c);
    if (r) {
        if (locked)
            close(fd); /* closing drops the lock taken through it */
        else
            pins_give(p, fd, t);
        return handover(c);
    }
    if (p->closed && f.hit && viewable) { /* the handle was closed while this call waited for the lock */
        close(fd);
        c->reason = WHY_RELEASED;
        return handover(c);
    }
    if (!f.hit || !viewable) { /* nothing was locked through it */
        pins_give(p, fd, t);
        if (!f.hit)
            Py_RETURN_NONE;
        return PyLong_FromLong(-1);
    }
    return view_of_pin(p, fd, t, f.slot, f.off, f.vlen, f.check, version);
}

static PyObject *Core_put(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    Store st;
    int64_t now, ttl;
    if (nargs_ok(nargs, 9, "put") || arg_bytes(args[0], "kb", &st.kb, &st.klen)
        || arg_int(args[1], "tag", &st.tag) || arg_bytes(args[2], "body", &st.body, &st.blen)
        || arg_int(args[3], "fp", &st.fp) || arg_int(args[4], "check", &st.check)
        || arg_int(args[5], "size", &st.size) || arg_int(args[6], "nb", &st.nb) || arg_int(args[7], "now_ns", &now)
        || arg_int(args[8], "ttl_ns", &ttl))
        return NULL;
    /* The encoding's own arithmetic, checked: a wrong size or block size would aim writes past the block. */
    if (!store_ok(c, &st) || ttl < -1 || ttl > c->max_ttl) {
        PyErr_SetString(PyExc_ValueError, "Core.put: the encoded entry's tag, fingerprint, checksum, size, block "
                                          "size or ttl_ns is inconsistent (encode it as SharedCache._encode does)");
        return NULL;
    }
    PyObject *refused;
    int r = enter(c, &refused);
    if (r)
        return refused;
    r = put_locked(c, &st, now, ttl);
    unlock(c);
    leave(c);
    if (r)
        return refusal(c, r);
    Py_RETURN_NONE;
}

static PyObject *Core_delete(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    const char *kb;
    int64_t klen, fp, now;
    if (key_args(args, nargs, "delete", &kb, &klen, &fp, &now))
        return NULL;
    PyObject *refused;
    int r = enter(c, &refused);
    if (r)
        return refused;
    int deleted;
    r = delete_locked(c, kb, klen, fp, now, &deleted);
    unlock(c);
    leave(c);
    if (r)
        return refusal(c, r);
    return PyBool_FromLong(deleted);
}

/* A batch argument as a tuple (a new reference): its items stay alive while the GIL is released to wait for the
 * lock, whatever another thread does to the list meanwhile. */
static PyObject *arg_batch(PyObject *o, const char *what)
{
    if (PyTuple_Check(o)) {
        Py_INCREF(o);
        return o;
    }
    if (PyList_Check(o))
        return PyList_AsTuple(o);
    PyErr_Format(PyExc_TypeError, "%s must be a list or tuple, got %.100s", what, Py_TYPE(o)->tp_name);
    return NULL;
}

/* (done, stop), the answer of a batch, from ``done`` (a new reference, or NULL with an exception set): stop is None
 * (every item done), PINNED or HANDOVER. */
/* (done, stop) of a batch; ``why``: the reason of a hand-over, read right after the unlock (the results are built
 * after it, running Python code: another thread's call on this handle may set c->reason meanwhile). */
static PyObject *batch_result(PyObject *done, int r, int why)
{
    if (done == NULL)
        return NULL;
    if (r)
        thread_reason = r == ST_PINNED ? WHY_PINNED : why;
    return Py_BuildValue("(NO)", done, r == ST_PINNED ? PINNED : r ? HANDOVER : Py_None);
}

/* The results of keys[0..done) as Core.get_value returns them (``dflt`` for a miss); every body is taken. */
static PyObject *found_list(Core *c, Lookup *keys, Py_ssize_t done, PyObject *dflt)
{
    PyObject *out = PyList_New(done);
    for (Py_ssize_t i = 0; i < done; i++) {
        Lookup *k = &keys[i];
        if (out != NULL) {
            PyObject *item = dflt;
            if (k->f.hit) { /* finish takes the body, even when it fails */
                item = finish(c, &k->f, k->body);
                k->body = NULL;
            } else {
                Py_INCREF(item);
            }
            if (item == NULL)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, i, item);
        }
        Py_CLEAR(k->body);
    }
    return out;
}

static PyObject *Core_get_many(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *kbs = NULL, *fps = NULL, *out = NULL;
    Lookup *keys = NULL;
    Py_ssize_t n, done = 0;
    int64_t now;
    int r;
    if (nargs_ok(nargs, 4, "get_many") || arg_int(args[2], "now_ns", &now) || !(kbs = arg_batch(args[0], "kbs"))
        || !(fps = arg_batch(args[1], "fps")))
        goto end;
    n = PyTuple_GET_SIZE(kbs);
    if (PyTuple_GET_SIZE(fps) != n) {
        PyErr_Format(PyExc_ValueError, "Core.get_many: %zd keys but %zd fingerprints", n, PyTuple_GET_SIZE(fps));
        goto end;
    }
    if (!(keys = PyMem_New(Lookup, n ? n : 1))) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        keys[i].body = NULL;
        if (arg_bytes(PyTuple_GET_ITEM(kbs, i), "kbs[i]", &keys[i].kb, &keys[i].klen)
            || arg_int(PyTuple_GET_ITEM(fps, i), "fps[i]", &keys[i].fp))
            goto end;
        if (keys[i].fp < 0) {
            PyErr_SetString(PyExc_ValueError, "fps[i] must be a 63-bit fingerprint");
            goto end;
        }
    }
    if (enter(c, &out)) {
        if (out != NULL) { /* HANDOVER before anything was looked up */
            Py_DECREF(out);
            out = batch_result(PyList_New(0), ST_HANDOVER, thread_reason);
        }
        goto end;
    }
    r = get_many_locked(c, keys, n, now, &done);
    unlock(c);
    leave(c);
    int why = c->reason;
    if (r >= 0) {
        out = batch_result(found_list(c, keys, done, args[3]), r, why);
    } else {
        for (Py_ssize_t i = 0; i < done; i++)
            Py_CLEAR(keys[i].body);
    }
end:
    PyMem_Free(keys);
    Py_XDECREF(kbs);
    Py_XDECREF(fps);
    return out;
}

static PyObject *Core_put_many(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *items = NULL, *out = NULL;
    Store *st = NULL;
    Py_ssize_t n, done = 0;
    int64_t now, ttl;
    int r;
    if (nargs_ok(nargs, 3, "put_many") || arg_int(args[1], "now_ns", &now) || arg_int(args[2], "ttl_ns", &ttl))
        return NULL;
    if (ttl < -1 || ttl > c->max_ttl) {
        PyErr_Format(PyExc_ValueError, "Core.put_many: ttl_ns must be -1 (the default) or 0 to %lld, got %lld",
                     (long long)c->max_ttl, (long long)ttl);
        return NULL;
    }
    if (!(items = arg_batch(args[0], "items")))
        return NULL;
    n = PyTuple_GET_SIZE(items);
    if (!(st = PyMem_New(Store, n ? n : 1))) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i); /* a tuple: its fields stay as they are */
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7) {
            PyErr_Format(PyExc_TypeError, "Core.put_many: items[%zd] must be a tuple (kb, tag, body, fp, check, "
                                          "size, nb) as Store.encode makes, got %.100s", i, Py_TYPE(item)->tp_name);
            goto end;
        }
        Store *s = &st[i];
        PyObject **a = &PyTuple_GET_ITEM(item, 0);
        if (arg_bytes(a[0], "kb", &s->kb, &s->klen) || arg_int(a[1], "tag", &s->tag)
            || arg_bytes(a[2], "body", &s->body, &s->blen) || arg_int(a[3], "fp", &s->fp)
            || arg_int(a[4], "check", &s->check) || arg_int(a[5], "size", &s->size) || arg_int(a[6], "nb", &s->nb))
            goto end;
        if (!store_ok(c, s)) {
            PyErr_Format(PyExc_ValueError, "Core.put_many: items[%zd]'s tag, fingerprint, checksum, size or block "
                                           "size is inconsistent (encode it with Store.encode)", i);
            goto end;
        }
    }
    if (enter(c, &out)) {
        if (out != NULL) { /* HANDOVER before anything was stored */
            Py_DECREF(out);
            out = batch_result(PyLong_FromSsize_t(0), ST_HANDOVER, thread_reason);
        }
        goto end;
    }
    r = put_many_locked(c, st, n, now, ttl, &done);
    unlock(c);
    leave(c);
    out = batch_result(PyLong_FromSsize_t(done), r, c->reason);
end:
    PyMem_Free(st);
    Py_DECREF(items);
    return out;
}

static PyObject *Core_release(Core *c, PyObject *Py_UNUSED(ignored))
{
    c->released = 1;
    if (c->users == 0)
        drop_buffer(c);
    Py_RETURN_NONE;
}

static PyObject *Core_get_reason(Core *c, void *Py_UNUSED(closure))
{
    (void)c;
    return PyUnicode_FromString(why_names[thread_reason]);
}

static PyObject *Core_get_waits(Core *c, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(c->waits);
}

static PyObject *Core_get_released(Core *c, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(c->released);
}

static PyMethodDef Core_methods[] = {
    {"get_value", (PyCFunction)(void (*)(void))Core_get_value, METH_FASTCALL,
     "get_value(kb, fp, now_ns, default) -> value | default | Raw | HANDOVER\n\nA lookup as SharedCache.get does "
     "it (now_ns: the CLOCK_MONOTONIC reading expiry is judged by; -1: Core reads the clock itself, only if an expiry "
     "needs it; the same for every method). A hit moves the entry to the front and counts a hit; a miss (or an "
     "expired entry, dropped: one a view pins stays) counts a miss and answers default. The value is copied out under "
     "the lock; after the unlock its checksum is checked, bytes are returned as they are and plain msgpack values "
     "decoded (_unpack.c). Anything else (a checksum that failed, an array or tensor, a value the decoder declines) "
     "comes back as a Raw, for the Python side (core.finish)."},
    {"view", (PyCFunction)(void (*)(void))Core_view, METH_FASTCALL,
     "view(kb, fp, now_ns, pins) -> View | Lease | None | -1 | HANDOVER\n\nThe key's entry pinned for a view (as "
     "Store.pin, through a description of pins), counted as a lookup: the View when this handle checked that "
     "stored value before, else the Lease of the pin for view.first_look; None on a miss; -1 for a value view() "
     "does not serve (nothing counted or pinned)."},
    {"put", (PyCFunction)(void (*)(void))Core_put, METH_FASTCALL,
     "put(kb, tag, body, fp, check, size, nb, now_ns, ttl_ns) -> None | PINNED | HANDOVER\n\nStore an encoded "
     "entry as SharedCache.put does under the lock (ttl_ns -1: the cache's default). PINNED: a view pins the key's "
     "entry, or the room needed (the segment is consistent; raise PinnedError)."},
    {"delete", (PyCFunction)(void (*)(void))Core_delete, METH_FASTCALL,
     "delete(kb, fp, now_ns) -> bool | PINNED | HANDOVER\n\nRemove the key, as SharedCache.delete does; True if "
     "it was present and live. PINNED: a view pins it (nothing changed; raise PinnedError)."},
    {"get_many", (PyCFunction)(void (*)(void))Core_get_many, METH_FASTCALL,
     "get_many(kbs, fps, now_ns, default) -> (found, stop)\n\nA lookup of each key (kbs[i], fingerprint fps[i]) in "
     "order under one hold of the lock, as entries.get_many_locked does: found holds, for each key looked up, what "
     "get_value returns for it (default for a miss, the value, or a Raw). stop: None, every key looked up; HANDOVER, the batch stopped at "
     "kbs[len(found)] (nothing of it counted or moved; reason says why): the Python path looks up the rest."},
    {"put_many", (PyCFunction)(void (*)(void))Core_put_many, METH_FASTCALL,
     "put_many(items, now_ns, ttl_ns) -> (done, stop)\n\nStore each encoded entry (kb, tag, body, fp, check, size, "
     "nb) in order under one hold of the lock, as entries.put_many_locked does, all expiring after ttl_ns (-1: the "
     "cache's default); done: how many were stored. stop: None, all of them; PINNED, the room items[done] needs is "
     "pinned (the segment is consistent; raise PinnedError); HANDOVER, the Python path stores items[done:] (an "
     "entry above the byte limit hands over the whole batch first, and a view pinning items[done]'s key hands it "
     "over with nothing of it written, reason \"pinned\")."},
    {"release", (PyCFunction)Core_release, METH_NOARGS,
     "Drop the buffer export (at once, or when the last call inside returns); every call after it hands over."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Core_getset[] = {
    {"reason", (getter)Core_get_reason, NULL, "why this thread's last call was handed over (a key of REASONS)", NULL},
    {"released", (getter)Core_get_released, NULL, "whether release() was called", NULL},
    {"waits", (getter)Core_get_waits, NULL, "calls that found the lock busy and waited for it in C", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmcache._core.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Core(buffer, offsets, live_fd, timeout_ns, hasher): the compiled get/put/delete and batches of a segment.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
};

static PyObject *module_unpack(PyObject *Py_UNUSED(m), PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "unpack takes bytes, got %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    PyObject *v = shm_unpack(PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
    return v != NULL ? v : handover(NULL);
}

static PyObject *module_last_wait(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(di)", (double)thread_waited_ns / 1e9, thread_extended);
}

static PyMethodDef module_methods[] = {
    {"last_wait", module_last_wait, METH_NOARGS,
     "last_wait() -> (seconds, extensions)\n\nHow long the calling thread's last wait for a busy lock took in C, "
     "and how many timeouts it added while the holder made progress (what a timeout message counts)."},
    {"setup_views", (PyCFunction)(void (*)(void))setup_views, METH_FASTCALL,
     "setup_views(frombuffer, closed_state, keep, tag_bytes, tag_array)\n\nWhat views are built and revoked with "
     "(view.py calls it once)."},
    {"unpack", module_unpack, METH_O,
     "unpack(data) -> value | HANDOVER\n\nThe plain msgpack value in ``data`` as get_value decodes it, or HANDOVER "
     "where it declines (codec.py then decodes, or raises)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, .m_name = "shmcache._core", .m_methods = module_methods,
    .m_doc = "The compiled critical section of shmcache's get, put, delete, view pins and batches, and the plain "
             "msgpack decoder of _unpack.c (see shmcache/core.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__core(void)
{
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    if (RawType.tp_name == NULL && PyStructSequence_InitType2(&RawType, &raw_desc) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    PyObject *base = (PyObject *)&PyBaseObject_Type;
    HANDOVER = PyObject_CallNoArgs(base);
    PINNED = PyObject_CallNoArgs(base);
    PyObject *reasons = PyDict_New();
    if (HANDOVER == NULL || PINNED == NULL || reasons == NULL)
        goto fail;
    for (int i = 0; i < WHY_COUNT; i++) {
        PyObject *v = PyLong_FromLong(i);
        if (v == NULL || PyDict_SetItemString(reasons, why_names[i], v) < 0) {
            Py_XDECREF(v);
            goto fail;
        }
        Py_DECREF(v);
    }
    if (view_types_add(m) < 0)
        goto fail;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        goto fail;
    }
    Py_INCREF(&RawType);
    if (PyModule_AddObject(m, "Raw", (PyObject *)&RawType) < 0) {
        Py_DECREF(&RawType);
        goto fail;
    }
    Py_INCREF(HANDOVER);
    Py_INCREF(PINNED);
    if (PyModule_AddObject(m, "HANDOVER", HANDOVER) < 0 || PyModule_AddObject(m, "PINNED", PINNED) < 0
        || PyModule_AddObject(m, "REASONS", reasons) < 0)
        goto fail;
    return m;
fail:
    Py_XDECREF(reasons);
    Py_DECREF(m);
    return NULL;
}
