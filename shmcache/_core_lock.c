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

static unsigned long fork_count; /* raised in every forked child (pthread_atfork): a slot claimed before is not ours */

static void count_fork(void) { fork_count++; }

/* ---------------------------------------------------------------------- holds taken through a foreign kind's path
 * glibc reads the kind word again, a few nanoseconds after kind_ok, and takes the path of whatever kind it finds: a
 * word damaged in between sends the call down another kind's path (docs/operations.md, "a kind word damaged between
 * the lock's check and glibc's own read of it"). Only a robust kind's path queues the mutex on the holder's robust
 * list, at its head (the kernel's struct robust_list_head, which glibc registers for every thread): that tells a
 * right hold from a foreign one, where the futex word cannot (the priority-inheritance path writes the holder's id
 * too). A foreign hold is given back by hand at once; an unlock checks the word names its holder, and that glibc
 * took the mutex off the list. (twin: lock.py, "Holds taken through a foreign kind's path") */

static unsigned long foreign_holds;   /* holds given back by give_back_foreign, in this process (atomic) */
static unsigned long unlisted_unlocks; /* unlocks that left the mutex listed, put right by release (atomic) */
static _Thread_local struct robust_list_head *thread_robust; /* this thread's list head; NULL: none to look at */
static _Thread_local int thread_robust_asked;
static _Thread_local pid_t thread_tid;
static _Thread_local unsigned long thread_tid_fork = ~0UL; /* fork_count when thread_tid was read */

/* This thread's robust-list head, asked of the kernel once per thread (the same address in a forked child: glibc
 * registers the same struct pthread's head again), or NULL where it will not say (seccomp, no such call). */
static inline struct robust_list_head *robust_head(void)
{
    if (!thread_robust_asked) {
        struct robust_list_head *h = NULL;
        size_t len = 0;
        if (syscall(SYS_get_robust_list, 0, &h, &len) != 0 || len != sizeof *h)
            h = NULL;
        thread_robust = h;
        thread_robust_asked = 1;
    }
    return thread_robust;
}

/* The calling thread's id, read again after a fork (the child's thread has another). */
static inline uint32_t my_tid(void)
{
    if (thread_tid_fork != fork_count) {
        thread_tid = (pid_t)syscall(SYS_gettid);
        thread_tid_fork = fork_count;
    }
    return (uint32_t)thread_tid;
}

/* The list's first entry as glibc wrote it (bit 0: a priority-inheritance mutex). */
static inline uintptr_t robust_first(struct robust_list_head *h)
{
    return (uintptr_t)__atomic_load_n(&h->list.next, __ATOMIC_RELAXED);
}

/* Whether mutex m heads this thread's robust list (h NULL: cannot tell, taken as yes, as before this check). */
static inline int queued(struct robust_list_head *h, pthread_mutex_t *m)
{
    return h == NULL || (robust_first(h) & ~(uintptr_t)1) + (uintptr_t)h->futex_offset == (uintptr_t)m;
}

/* Give back a hold that glibc took through a foreign kind's path: nobody else is inside (every kind's path takes
 * the word from 0 with a compare-and-swap or an exchange), and nothing was written under it. The owner field is
 * cleared as an unlock clears it, the word set to 0, and every sleeper woken: one that read a plain kind sleeps on
 * 2, one that read the robust kind on the word with FUTEX_WAITERS. */
static void give_back_foreign(pthread_mutex_t *m)
{
    __atomic_fetch_add(&foreign_holds, 1, __ATOMIC_RELAXED);
    m->__data.__owner = 0;
    __atomic_store_n((uint32_t *)m, 0, __ATOMIC_RELEASE);
    syscall(SYS_futex, (uint32_t *)m, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A lock call's result, checked: 0 only for a hold that glibc queued; a foreign one is given back, and the caller
 * waits on (EBUSY) as for a busy lock, meeting the damaged kind, if it is still there, at its next kind_ok. */
static inline int checked_hold(Core *c, int rc)
{
    if (rc != 0 || queued(robust_head(), c->mutex))
        return rc;
    give_back_foreign(c->mutex);
    return EBUSY;
}

/* trylock, unless the kind word is not init_mutex's: glibc asserts inside some kinds' lock calls.
 * (twin: lock.py SegmentLock.try_checked) */
static inline int try_checked(Core *c) { return kind_ok(c) ? checked_hold(c, pthread_mutex_trylock(c->mutex)) : -1; }

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
            rc = checked_hold(c, pthread_mutex_timedlock(c->mutex, &real));
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

/* Give the lock back through glibc. The holder's id goes back first into a futex word that a waiter which read a
 * plain kind overwrote (its exchange writes 2): the robust unlock refuses a word that does not name its caller
 * (EPERM), which would leave the lock held for ever; FUTEX_WAITERS goes in with it, so that the unlock wakes that
 * waiter. Then, should glibc have read a foreign kind in its turn and released the mutex without taking it off this
 * thread's robust list, the list is put back as it was before the lock: an entry left there points into the
 * segment, and the next robust lock of this thread writes through it, after an unmap too. The Python path's first
 * step is inline in guard.py's unlocks. (twin: lock.py SegmentLock.settle_release) */
static void release(Core *c)
{
    pthread_mutex_t *m = c->mutex;
    uint32_t *w = (uint32_t *)m, tid = my_tid();
    int rc = EPERM;
    /* Every refusal comes before glibc writes anything, so the lock is still held: EPERM for a word that does not
     * name the caller, EINVAL where glibc read the kind word a second time (__pthread_mutex_unlock_full does) and
     * found a kind it has no case for. */
    for (int i = 0; i < 1000 && rc != 0; i++) {
        uint32_t v = __atomic_load_n(w, __ATOMIC_RELAXED);
        if ((v & FUTEX_TID_MASK) != tid)
            __atomic_compare_exchange_n(w, &v, tid | FUTEX_WAITERS, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        rc = pthread_mutex_unlock(m);
    }
    struct robust_list_head *h = robust_head();
#if defined(__x86_64__) || defined(__aarch64__)
    if (rc == 0 && h != NULL && queued(h, m)) { /* a robust unlock takes it off: glibc read a foreign kind */
        /* Released but still listed: take it off as glibc's DEQUEUE_MUTEX would. glibc's list is doubly linked on
         * 64-bit targets, each __prev word 8 bytes before the entry it belongs to (the head's too, robust_prev):
         * the entry that is first again points back at the head. */
        uintptr_t prev = c->robust_prev;
        __atomic_fetch_add(&unlisted_unlocks, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&h->list.next, (struct robust_list *)prev, __ATOMIC_RELAXED);
        ((void **)(prev & ~(uintptr_t)1))[-1] = (void *)h;
    }
#endif
}

static void unlock(Core *c)
{
    /* A kind word damaged while held is put back before glibc reads it, and the segment marked for repair. */
    if (!kind_ok(c)) {
        *c->kind_word = c->kind_word_value;
        HW(dirty) = 1;
    }
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
    struct robust_list_head *h = robust_head();
    uintptr_t prev = h != NULL ? robust_first(h) : 0; /* what release() puts back, if glibc leaves the mutex listed */
    int rc = try_checked(c);
    if (rc == EBUSY) {
        c->waits++;
        rc = wait_lock(c);
    }
    if (rc == -2)
        return -1;
    if (rc == 0 || rc == EOWNERDEAD)
        c->robust_prev = prev; /* written by the holder alone */
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
