/* shmcache._core's zero-copy views (_view.c): the descriptions pins are taken through, the lease that holds one pin
 * and exports the pinned bytes, and the View handed out. Core.view (_core.c) takes the pin under the lock; these
 * types make everything after it run in C. */
#ifndef SHMCACHE_VIEW_H
#define SHMCACHE_VIEW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

/* The open-file-description lock request of one byte: a pin's (``type`` F_RDLCK to take it, F_UNLCK to end it) or
 * the query whether another description holds it (F_WRLCK, with F_OFD_GETLK). */
static inline struct flock byte_lock(short type, int64_t byte)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)byte;
    fl.l_len = 1;
    return fl;
}

/* One cache handle's descriptions (the C twin of view.PinDescriptions): idle ones, kept for the next view, and what
 * a lease needs to export the arena's bytes. */
typedef struct {
    PyObject_HEAD
    char path[40];        /* /proc/self/fd/<segment fd>: each description is a new open of the segment */
    int *idle;            /* descriptions holding no lock */
    Py_ssize_t nidle, cap;
    pid_t pid;            /* the process the idle descriptions belong to */
    unsigned long epoch;  /* forks of this process: a lease from an earlier epoch may be shared with a child */
    int closed;
    int bound;            /* __init__ ran (once) */
    PyObject *mapping;    /* the segment's mmap: each lease holds a buffer export of it */
    Py_ssize_t arena_off, arena_nbytes;
    int64_t pin_base;
    PyObject *viewed;     /* slot -> (version, offset, length, checksum, layout) of values a view checked */
    PyObject *weakreflist;
    void *slot_leases;    /* the leases pinned by a reader slot's word (Core.view without the lock), linked */
    int forking;          /* between the fork hooks before and after: no new pin by a reader slot's word */
} Pins;

extern PyTypeObject PinsType, LeaseType, ViewType;

/* Ready the three types and add them to module ``m``; -1 with an exception set. */
int view_types_add(PyObject *m);

/* Whose a description is: the process and fork epoch it was taken in (a fork while the call that took it waits for
 * the lock must not be missed: the child holds a copy from then on). */
typedef struct {
    pid_t pid;
    unsigned long epoch;
} Taken;

/* A description holding no lock into *fd (an idle one, or a new open), and whose it is into *t; -1 with an exception
 * set. */
int pins_take(Pins *p, int *fd, Taken *t);

/* Give back description ``fd``, taken as ``t`` and holding no lock: closed instead once the handle is closed, or if
 * this process forked since it was taken (a child may hold a copy). */
void pins_give(Pins *p, int fd, Taken t);

/* The lease of the pin Core.view took on entry ``slot`` through ``fd`` (which it now owns, closing it on failure),
 * over the value at arena offset ``off`` of ``len`` bytes; then the View of it, when this handle has checked that
 * stored value before (the lease itself otherwise: a first look, for the Python side). NULL with an exception set. */
PyObject *view_of_pin(Pins *p, int fd, Taken t, int64_t slot, int64_t off, int64_t len, int64_t check,
                      int64_t version);

/* As view_of_pin, for a pin held by the reader slot's pin word ``word`` (Core.view without the lock: no description,
 * no system call), which the lease decrements as it ends; ``owner`` holds the slot (readers.Reader) and is kept as
 * long as the lease. Before a fork (Pins._forking) such a lease takes a description's lock instead, so that a child's
 * inherited view stays pinned. NULL with an exception set (the word given back). */
PyObject *view_of_slot_pin(Pins *p, int64_t *word, PyObject *owner, int64_t slot, int64_t off, int64_t len,
                           int64_t check, int64_t version);

/* _core.setup_views(frombuffer, ndarray, tag_bytes, tag_array): what views are built with (view.py calls it once, at
 * import). */
PyObject *setup_views(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#endif
