/* shmcache._core: the compiled critical section of get, put, delete, a view's pin and the batches get_many and
 * put_many; after the unlock, a get's checksum and the decode of plain values (_unpack.c), and the view built over
 * its pin (_view.c).
 *
 * One Core is bound per attached handle (shmcache/core.py): it keeps a writable buffer export of the segment's
 * mapping and a table of every offset, word number and constant it uses, handed over by Python from
 * shmcache/layout at bind time. This file holds no layout number of its own; a missing key fails the bind.
 *
 * Each method runs the whole locked section in C, as shmcache/table.py, policies/, arena.py, index.py and lru.py do
 * it in Python (they stay the readable reference; tests/test_core.py pins the two to byte-identical segments). Anything
 * unusual is handed over to the Python path (the handle's core.HandOver, called from C with the call's own
 * arguments; a Core bound without one answers HANDOVER), which knows how to judge, repair and raise: the dirty word
 * set on entry, a lock word naming this thread (a re-entered call, or damage), a holder to judge, a lock wait past
 * the timeout, a put above the byte limit or a damaged default time to live, and any bound failing on the segment's
 * bytes. A bound failing after the first write of an update leaves the dirty word set, so that the Python path's
 * next holder repairs. Pins are asked of the kernel (F_OFD_GETLK on the pin byte) exactly where table.py asks,
 * and a refusal is handed over too, the segment consistent, for the Python path to raise PinnedError (PINNED,
 * without a fallback: a pinned key's put or delete on a segment of layout version 11 or before, which holds no
 * entry aside; a put whose room is all pinned is not admitted instead, ST_REFUSED, on every version). A batch that
 * stops part-way hands over how far it got; the Python path does the rest.
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
 *
 * The source is split by concern into parts named after the Python modules each mirrors, and included here as one
 * translation unit, so that the hot paths' static functions inline across parts with no link-time optimisation:
 * _core.h (the Core object and the outcomes), _core_binding.c (core.py), _core_lock.c (lock.py), _core_arena.c
 * (arena.py), _core_index.c (index.py), _core_lru.c (lru.py), _core_policy.c (policies/), _core_table.c (table.py),
 * _core_sections.c (store.py and entries.py), _core_methods.c (cache.py and mapping.py), _core_hash.c (codec.py's
 * xxh3, for short keys and values). A function with a Python
 * twin names it, as "(twin: table.py Table.insert)"; tests/test_seams.py checks that every twin named exists.
 */
#include "_core.h"

#ifndef SHMCACHE_SOURCES
#define SHMCACHE_SOURCES "" /* built without setup.py: the digest of its sources is unknown, and not checked */
#endif

#include "_core_hash.c"
#include "_core_binding.c"
#include "_core_lock.c"
#include "_core_arena.c"
#include "_core_index.c"
#include "_core_lru.c"
#include "_core_policy.c"
#include "_core_table.c"
#include "_core_sections.c"
#include "_core_unlocked.c"
#include "_core_methods.c"
#include "_core_snapshot.c"

/* ------------------------------------------------------------------------------------------------ the module */

static PyObject *module_unpack(PyObject *Py_UNUSED(m), PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "unpack takes bytes, got %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    PyObject *v = shm_unpack(PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
    return v != NULL ? v : handover(NULL);
}

/* try_word(address): the Python path's try of the lock's futex word at ``address`` (an int: the lock page the
 * caller keeps mapped), with a compare-and-swap instead of the kernel's FUTEX_TRYLOCK_PI, with its answers: 0
 * (taken), EDEADLK (the word names this thread), EAGAIN (held). (twin: lock.py futex_trylock) */
static PyObject *module_try_word(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long long a = PyLong_AsUnsignedLongLong(arg);
    if (a == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (a == 0 || a % 4) {
        PyErr_SetString(PyExc_ValueError, "try_word: not the address of a 32-bit word");
        return NULL;
    }
    uint32_t *w = (uint32_t *)(uintptr_t)a, tid = my_tid(), v = 0;
    int rc = EAGAIN;
    if (__atomic_compare_exchange_n(w, &v, tid, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        rc = 0;
    else if ((v & TID_MASK) == tid)
        rc = EDEADLK;
    else if (!(v & TID_MASK)
             && __atomic_compare_exchange_n(w, &v, tid | (v & WAITERS), 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        rc = 0;
    return PyLong_FromLong(rc);
}

static PyObject *module_last_wait(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(diL)", (double)thread_waited_ns / 1e9, thread_extended, (long long)thread_holder);
}

static PyObject *module_unlocked_view(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(thread_unlocked_view);
}

static PyObject *module_setup_keys(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyType_Check(args[1])
        || !PyType_IsSubtype((PyTypeObject *)args[1], &PyBytes_Type)) {
        PyErr_SetString(PyExc_TypeError, "setup_keys takes codec.encode_key and codec.EncodedKey");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(key_encoder, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(encoded_key_type, (PyTypeObject *)args[1]);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup_keys", (PyCFunction)(void (*)(void))module_setup_keys, METH_FASTCALL,
     "setup_keys(encode_key, EncodedKey)\n\nWhat Core.get_key and view_key encode a key that is not a str with, and "
     "the type of key bytes already encoded (core.py calls it once)."},
    {"unlocked_view", module_unlocked_view, METH_NOARGS,
     "unlocked_view() -> bool\n\nWhether the calling thread's view in progress was pinned without the lock: its "
     "lookup is counted in the handle's reader slot once the first look is done (a failed checksum counts a miss), "
     "so the first look corrects no counter of the header."},
    {"try_word", module_try_word, METH_O,
     "try_word(address) -> int\n\nThe Python path's try of the lock's futex word at address, by compare-and-swap: 0 "
     "(taken), EDEADLK (it names this thread), EAGAIN (held) -- FUTEX_TRYLOCK_PI's answers (lock.py)."},
    {"last_wait", module_last_wait, METH_NOARGS,
     "last_wait() -> (seconds, extensions, holder)\n\nHow long the calling thread's last wait for a busy lock took "
     "in C, how many timeouts it added while the holder made progress (what a timeout message counts), and the "
     "thread id the lock's word named when it gave up (0: it did not)."},
    {"setup_views", (PyCFunction)(void (*)(void))setup_views, METH_FASTCALL,
     "setup_views(frombuffer, ndarray, tag_bytes, tag_array)\n\nWhat views are built with (view.py calls it once)."},
    {"xxh3", (PyCFunction)(void (*)(void))mod_xxh3, METH_FASTCALL,
     "xxh3(data, seed=0, portable=0) -> int\n\nXXH3-64 of any length, computed by the compiled section as "
     "xxhash.xxh3_64_intdigest(data, seed) does (the fingerprints and checksums of keys, values and snapshot "
     "records); ``portable``: 1, no loop wider than AVX2; 2, none wider than SSE2."},
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
    static int atfork;
    if (!atfork && pthread_atfork(NULL, NULL, count_fork) == 0)
        atfork = 1;
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    if (RawType.tp_name == NULL && PyStructSequence_InitType2(&RawType, &raw_desc) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    struct {
        PyObject **name;
        const char *text;
    } names[] = {
        {&N_GET_VALUE, "get_value"}, {&N_PUT, "put"}, {&N_DELETE, "delete"}, {&N_VIEW, "view"},
        {&N_GET_MANY, "get_many"}, {&N_PUT_MANY, "put_many"}, {&N_FINISH, "finish"},
        {&N_FIRST_LOOK, "first_look"}, {&N_EVICT_TOWARD, "evict_toward"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].name == NULL && !(*names[i].name = PyUnicode_InternFromString(names[i].text))) {
            Py_DECREF(m);
            return NULL;
        }
    }
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
    if (view_types_add(m) < 0 || PyModule_AddStringConstant(m, "SOURCES", SHMCACHE_SOURCES) < 0)
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
