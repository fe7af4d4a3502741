/* shmcache._core, the lock: the futex word taken with a compare-and-swap, waited for with the GIL released, its
 * holder judged by its holder slot, and given back. Twin of lock.py (SegmentLock); the protocol and what a stray
 * write can do are in lock.py's docstring and docs/design.md ("The cache lock").
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

#ifndef SPIN_ROUNDS
#define SPIN_ROUNDS 64   /* tries with pause instructions between them, GIL released */
#endif
#ifndef SPIN_PAUSES
#define SPIN_PAUSES 32   /* pause instructions per round (a lock hold is ~1 us) */
#endif
#ifndef YIELD_ROUNDS
#define YIELD_ROUNDS 20  /* then try + sched_yield rounds, as lock.py's _SPIN_TRIES */
#endif
#define SLICE_NS 5000000LL /* a sleep's longest: then signals are run and the holder is judged (lock.py _SLICE_S) */
#define TID_MASK 0x3FFFFFFFu /* the word's holder thread id (lock.py FUTEX_TID_MASK) */
#define WAITERS 0x80000000u  /* the word's bit: a thread sleeps, the unlock wakes one (lock.py FUTEX_WAITERS) */
#define PATIENCE 1000        /* timeouts more for a holder whose long walk moves the progress word (lock.py's) */

static _Thread_local int64_t thread_waited_ns; /* how long this thread's last wait for the lock took */
static _Thread_local int thread_extended;      /* ...and how many timeouts it added for a holder's progress */
static _Thread_local int64_t thread_holder;    /* ...and the futex word's holder it waited for, when it gave up */

/* What a wait returns through: its figures recorded for last_wait(), then ``rc``. */
static inline int waited(int64_t start, int extensions, int rc)
{
    thread_waited_ns = mono_ns() - start;
    thread_extended = extensions;
    thread_holder = 0;
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

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static unsigned long fork_count; /* raised in every forked child (pthread_atfork): a slot claimed before is not ours */

static void count_fork(void) { fork_count++; }

static _Thread_local pid_t thread_tid;
static _Thread_local unsigned long thread_tid_fork = ~0UL; /* fork_count when thread_tid was read */

/* The calling thread's id, read again after a fork (the child's thread has another). */
static inline uint32_t my_tid(void)
{
    if (thread_tid_fork != fork_count) {
        thread_tid = (pid_t)syscall(SYS_gettid);
        thread_tid_fork = fork_count;
    }
    return (uint32_t)thread_tid;
}

/* Take a word that names no thread (0, or a damaged one with only flag bits) for ``tid``, keeping WAITERS when
 * ``waiters`` (a thread that slept takes it so: another may sleep still); or, when it names a holder, set WAITERS in
 * it. 1: taken. The kernel's FUTEX_TRYLOCK_PI, the Python path's try, takes a word the same way. */
static inline int take_or_mark(Core *c, uint32_t tid, uint32_t waiters)
{
    uint32_t v = __atomic_load_n(c->lockword, __ATOMIC_RELAXED);
    for (int i = 0; i < 16; i++) {
        if (!(v & TID_MASK)) {
            if (__atomic_compare_exchange_n(c->lockword, &v, tid | waiters, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
                return 1;
        } else if (waiters && !(v & WAITERS)) {
            if (__atomic_compare_exchange_n(c->lockword, &v, v | WAITERS, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                return 0;
        } else {
            return 0;
        }
    }
    return 0;
}

/* Whether the holder that word ``v`` names is to be judged by the Python path (lock.py holder_state): its holder
 * slot is named and no description holds that slot's byte (its process is gone: the kernel dropped the lock at
 * exit) or its thread id names no thread, the slot named is out of range, or no slot is named a slice after the
 * holder was first seen and its thread id names no thread. Only a word still
 * ``v`` after the look. (twin: lock.py SegmentLock.holder_state, its first case) */
static int holder_suspect(Core *c, uint32_t v, int first)
{
    uint32_t s = __atomic_load_n(c->holderword, __ATOMIC_RELAXED);
    /* No slot named: a holder between taking the word and naming its slot (or between clearing them), perhaps
     * descheduled there, is looked at a slice later, and then only a thread id that names no thread is handed to
     * the Python path (which judges the rest when the wait times out). */
    if (s == 0 && (first || !(kill((pid_t)(v & TID_MASK), 0) < 0 && errno == ESRCH)))
        return 0;
    if (s != 0 && (int64_t)s <= c->holder_slots) {
        struct flock fl;
        memset(&fl, 0, sizeof fl);
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = (off_t)(c->holder_base + (int64_t)s - 1);
        fl.l_len = 1;
        if (fcntl(c->live_fd, F_OFD_GETLK, &fl) < 0)
            return 0;
        /* Its process lives: its thread too, unless no thread has the id here (the Python path then asks whether
         * the id may be another PID namespace's). */
        if (fl.l_type != F_UNLCK && !(kill((pid_t)(v & TID_MASK), 0) < 0 && errno == ESRCH))
            return 0;
    }
    return __atomic_load_n(c->lockword, __ATOMIC_RELAXED) == v;
}

/* Wait for a busy lock with the GIL released: spin with pause instructions, then yield, then sleep on the wake count
 * in slices until the timeout, extended by another timeout each time the holder moved the progress word meanwhile
 * (lock.py's SegmentLock.acquire_slow has the same patience); between slices the GIL is re-taken to run pending
 * signal handlers, and a holder seen for a whole slice is judged (holder_suspect). Returns 0 (held), ETIMEDOUT,
 * EBUSY (a close() came), WAIT_MINE (the word names this thread), WAIT_SUSPECT (its holder is for the Python path to
 * judge), or -2 with a Python exception set (a signal handler raised). The time it took is the thread's
 * last_wait(). (twin: lock.py SegmentLock.acquire_slow) */
#define WAIT_MINE (-3)
#define WAIT_SUSPECT (-4)
static int wait_lock(Core *c, uint32_t tid)
{
    int rc = EBUSY;
    int64_t start = mono_ns();
    int64_t seen = *(volatile int64_t *)&HW(progress); /* read without the lock: one word, for patience only */
    int extensions = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < SPIN_ROUNDS && rc == EBUSY; i++) {
        for (int j = 0; j < SPIN_PAUSES; j++)
            cpu_pause();
        if (take_or_mark(c, tid, 0))
            rc = 0;
    }
    for (int i = 0; i < YIELD_ROUNDS && rc == EBUSY; i++) {
        sched_yield();
        if (take_or_mark(c, tid, 0))
            rc = 0;
    }
    Py_END_ALLOW_THREADS
    if (rc == 0)
        return waited(start, extensions, 0);
    int64_t deadline = mono_ns() + c->timeout_ns;
    uint32_t judged = 0;
    int64_t judged_at = 0;
    for (;;) {
        int64_t now = mono_ns();
        uint32_t v = __atomic_load_n(c->lockword, __ATOMIC_RELAXED);
        if ((v & TID_MASK) == tid)
            return waited(start, extensions, WAIT_MINE);
        /* Each holder is judged when first seen here, then once a slice. */
        if ((v & TID_MASK) && (v != judged || now - judged_at >= SLICE_NS)) {
            int first = v != judged;
            judged = v;
            judged_at = now;
            if (holder_suspect(c, v, first))
                return waited(start, extensions, WAIT_SUSPECT);
        }
        if (now >= deadline) {
            int64_t p = *(volatile int64_t *)&HW(progress);
            if (p != seen && extensions < PATIENCE) {
                seen = p;
                extensions++;
                deadline = now + c->timeout_ns;
                continue;
            }
            /* Whom the wait was for: the Python path it hands over to judges that holder, not one that took the
             * lock since, which it waits for afresh. */
            waited(start, extensions, ETIMEDOUT);
            thread_holder = v & TID_MASK;
            return ETIMEDOUT;
        }
        if (PyErr_CheckSignals() < 0)
            return waited(start, extensions, -2);
        if (c->released)
            return waited(start, extensions, EBUSY); /* a close() came meanwhile: the Python path says so */
        int64_t until = deadline < now + SLICE_NS ? deadline : now + SLICE_NS;
        Py_BEGIN_ALLOW_THREADS
        /* Ordering: the count is read before WAITERS is set and the word tried again, so an unlock after that try
         * has changed it, and the sleep returns at once. */
        uint32_t count = __atomic_load_n(c->wakesword, __ATOMIC_ACQUIRE);
        if (take_or_mark(c, tid, WAITERS)) {
            rc = 0;
        } else {
            struct timespec ts;
            int64_t ns = until - mono_ns();
            if (ns < 0)
                ns = 0;
            ts.tv_sec = (time_t)(ns / 1000000000LL);
            ts.tv_nsec = (long)(ns % 1000000000LL);
            syscall(SYS_futex, c->wakesword, FUTEX_WAIT, count, &ts, NULL, 0);
            if (take_or_mark(c, tid, WAITERS))
                rc = 0;
        }
        Py_END_ALLOW_THREADS
        if (rc == 0)
            return waited(start, extensions, 0);
    }
}

/* The write side of the seqlocks that readers without the lock validate against (docs/design.md, "Reads without
 * the lock"): header word ``seq`` is made odd before the first write of a hold that writes across the stripes (none
 * of the compiled section's; every write and pin query on a segment before version 11, which has no stripes), and a
 * stripe's word before the hold's first write to one of its index slots or to an entry one of them points at, or a
 * pin query of such an entry (stripe_open); each is made even again as the hold ends with nothing half-done. The
 * fence orders the odd word before every later store of the hold (readers never see a write under an even word they
 * read first) and before every later load: a pin flag is read only after the odd word is visible, so a viewer
 * without the lock either sees it and retries, or its flag is seen here (the two stores and two loads of Dekker's
 * protocol). Under lru nobody reads without the lock: the words stay 0. (twin: seqlock.py open_seq) */
static inline void seq_open(Core *c)
{
    if (!c->pol->reads_unlocked)
        return;
    int64_t s = __atomic_load_n(&HW(seq), __ATOMIC_RELAXED);
    if (!(s & 1)) {
        __atomic_store_n(&HW(seq), (int64_t)((uint64_t)s + 1), __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
    }
}

/* Open the stripe of index slot ``s`` (see seq_open): its bit in the open mask first, so that the hold's end (or, if
 * this holder dies, the next hold's) evens it, then its word odd and the fence. A slot out of range (damage) or a
 * segment without stripes opens ``seq``, which every reader validates. (twin: seqlock.py open_stripe) */
static inline void stripe_open(Core *c, int64_t s)
{
    if (!c->pol->reads_unlocked)
        return;
    if (c->stripes == NULL || s < 0 || s > IXMASK(c)) {
        seq_open(c);
        return;
    }
    int64_t k = stripe_of(c, s);
    uint64_t bit = (uint64_t)1 << k, m = (uint64_t)c->stripes[S_OPEN];
    if (!(m & bit))
        c->stripes[S_OPEN] = (int64_t)(m | bit);
    int64_t *w = &c->stripes[STRIPE_WORD(k)], v = __atomic_load_n(w, __ATOMIC_RELAXED);
    if (!(v & 1)) {
        __atomic_store_n(w, (int64_t)((uint64_t)v + 1), __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
    }
}

/* The hold ends: ``seq`` and every stripe the open mask names even again, with release order after every write of
 * the hold, and the mask cleared, unless an update was cut short (``dirty`` set): they stay odd until the repair's
 * hold ends (the repair names every stripe in the mask). Odd words left by a holder that died between the two are
 * evened by the next hold to end. (twin: seqlock.py close_seq) */
static inline void seq_close(Core *c)
{
    if (HW(dirty))
        return;
    int64_t s = HW(seq);
    if (s & 1)
        __atomic_store_n(&HW(seq), (int64_t)((uint64_t)s + 1), __ATOMIC_RELEASE);
    if (c->stripes == NULL)
        return;
    uint64_t m = (uint64_t)c->stripes[S_OPEN];
    if (!m)
        return;
    while (m) {
        int k = __builtin_ctzll(m);
        m &= m - 1;
        int64_t *w = &c->stripes[STRIPE_WORD(k)], v = *w;
        if (v & 1)
            __atomic_store_n(w, (int64_t)((uint64_t)v + 1), __ATOMIC_RELEASE);
    }
    c->stripes[S_OPEN] = 0;
}

/* Give the lock back: the holder word cleared, then the futex word, with release order after every store of the
 * hold; a word that gained WAITERS is exchanged for 0, the wake count raised and one sleeper woken. A word that does
 * not name this thread was changed by a stray write during the hold: it is left as it is (another thread may have
 * come in through it), and the dirty word has the next holder repair. (twin: lock.py SegmentLock.release) */
static void release(Core *c)
{
    uint32_t tid = my_tid();
    __atomic_store_n(c->holderword, 0, __ATOMIC_RELAXED);
    uint32_t v = tid;
    if (__atomic_compare_exchange_n(c->lockword, &v, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        return;
    if ((v & TID_MASK) == tid) {
        uint32_t old = __atomic_exchange_n(c->lockword, 0, __ATOMIC_RELEASE);
        if (old & WAITERS) {
            __atomic_fetch_add(c->wakesword, 1, __ATOMIC_RELEASE);
            syscall(SYS_futex, c->wakesword, FUTEX_WAKE, 1, NULL, NULL, 0);
        }
        return;
    }
    HW(dirty) = 1;
}

static void unlock(Core *c)
{
    seq_close(c);
    release(c);
}

/* Take the lock (GIL held). 0: held; ST_HANDOVER with c->reason set: not held; -1: a Python exception is set.
 * (twin: guard.py Guard.enter) */
static int lock(Core *c)
{
    if (c->released || !c->bound) {
        c->reason = WHY_RELEASED;
        return ST_HANDOVER;
    }
    uint32_t tid = my_tid(), v = 0;
    int rc = 0;
    if (!__atomic_compare_exchange_n(c->lockword, &v, tid, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        c->waits++;
        rc = wait_lock(c, tid);
    }
    if (rc == -2)
        return -1;
    if (rc == 0) {
        /* A forked child has not claimed the parent's slot: its holds name none, and are judged by thread id. */
        __atomic_store_n(c->holderword, c->holder_slot_fork == fork_count ? c->holder_slot : 0, __ATOMIC_RELAXED);
        if (!c->released)
            return ST_OK;
        unlock(c);
        rc = EBUSY;
    }
    switch (rc) {
    case WAIT_MINE:
        c->reason = WHY_REENTERED; /* the Python path tells a call from inside a call from a damaged word */
        break;
    case WAIT_SUSPECT:
        c->reason = WHY_OWNERDEAD; /* the Python path judges the holder and takes the lock over */
        break;
    case ETIMEDOUT:
        c->reason = WHY_TIMEOUT;
        break;
    default:
        c->reason = WHY_RELEASED;
        break;
    }
    return ST_HANDOVER;
}

/* Core.holder_slot and Core.waits (the attributes of a handle's lock). */
static PyObject *Core_get_holder_slot(Core *c, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLong(c->holder_slot);
}

static int Core_set_holder_slot(Core *c, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "holder_slot cannot be deleted");
        return -1;
    }
    unsigned long n = PyLong_AsUnsignedLong(value);
    if (n == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if ((int64_t)n > c->holder_slots) {
        PyErr_SetString(PyExc_ValueError, "holder_slot is a number from 0 to HOLDER_SLOTS");
        return -1;
    }
    c->holder_slot = (uint32_t)n;
    c->holder_slot_fork = fork_count;
    return 0;
}

static PyObject *Core_get_waits(Core *c, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(c->waits);
}
