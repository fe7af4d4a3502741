/* shmcache._core, the lock: the robust mutex taken, waited for with the GIL released, and given back.
 * Twin of lock.py (SegmentLock).
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

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

static inline int kind_ok(Core *c) { return *c->kind_word == c->kind_word_value; }

/* trylock, unless the kind word is not init_mutex's: glibc asserts inside some kinds' lock calls.
 * (twin: lock.py SegmentLock.try_checked) */
static inline int try_checked(Core *c) { return kind_ok(c) ? pthread_mutex_trylock(c->mutex) : -1; }

/* Wait for a busy lock with the GIL released: spin with pause instructions, then yield, then timed lock in
 * slices until the timeout, extended by another timeout each time the holder moved the progress word meanwhile (a
 * long repair or verify: lock.py's SegmentLock.acquire_slow has the same patience); between slices the GIL is
 * re-taken to run pending signal handlers. Returns the last lock result (0: held), -1 for a damaged kind word, or
 * -2 with a Python exception set (a signal handler raised). The time it took is the thread's last_wait().
 * (twin: lock.py SegmentLock.acquire_slow) */
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
            /* Whom the wait was for: the Python path it hands over to judges that holder, not one that took the
             * lock since (another waiter's re-initialisation, say), which it waits for afresh. */
            waited(start, extensions, rc);
            thread_holder = *(volatile uint32_t *)c->mutex & 0x3FFFFFFF; /* lock.py's FUTEX_TID_MASK */
            return rc;
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

/* The write side of the seqlock that readers without the lock validate against (docs/design.md, "Reads without
 * the lock"): ``seq`` is made odd before a hold's first write or pin query, and even again as the hold ends with
 * nothing half-done. The fence orders the odd ``seq`` before every later store of the hold (readers never see a
 * write under an even ``seq`` they read first) and before every later load: a pin flag is read only after the odd
 * word is visible, so a viewer without the lock either sees it and retries, or its flag is seen here (the two
 * stores and two loads of Dekker's protocol). Under lru nobody reads without the lock: ``seq`` stays 0.
 * (twin: seqlock.py open_seq) */
static inline void seq_open(Core *c)
{
    if (c->policy == POLICY_LRU)
        return;
    int64_t s = __atomic_load_n(&HW(seq), __ATOMIC_RELAXED);
    if (!(s & 1)) {
        __atomic_store_n(&HW(seq), (int64_t)((uint64_t)s + 1), __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
    }
}

/* The hold ends: ``seq`` even again, with release order after every write of the hold, unless an update was cut
 * short (``dirty`` set): it stays odd until the repair's hold ends. An odd word left by a holder that died between
 * the two is evened by the next hold to end. (twin: seqlock.py close_seq) */
static inline void seq_close(Core *c)
{
    int64_t s = HW(seq);
    if ((s & 1) && !HW(dirty))
        __atomic_store_n(&HW(seq), (int64_t)((uint64_t)s + 1), __ATOMIC_RELEASE);
}

static void unlock(Core *c)
{
    /* A kind word damaged while held is put back before glibc reads it, and the segment marked for repair. */
    if (!kind_ok(c)) {
        *c->kind_word = c->kind_word_value;
        HW(dirty) = 1;
    }
    seq_close(c);
    pthread_mutex_unlock(c->mutex);
}

/* Take the lock (GIL held). 0: held; ST_HANDOVER with c->reason set: not held; -1: a Python exception is set.
 * (twin: guard.py Guard.enter) */
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
