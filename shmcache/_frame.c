/* The fast locals of a running frame, read in place: the shortcut _view.c's unexplained() takes before it reads a
 * frame's f_locals. Reading f_locals costs about 2,800 instructions a view's end on 3.11 (the frame's snapshot dict
 * filled name by name, then walked); the names of a function's frame sit in an array of the interpreter's frame, and
 * counting the ones bound to an object there costs a few instructions a name.
 *
 * CPython keeps that array (``localsplus``) behind its internal headers from 3.11, which an extension may include
 * with Py_BUILD_CORE defined: this file alone does, so that no other part of shmcache._core compiles against the
 * interpreter's internals. 3.10's frame object has the array in its public struct. Where neither is known (another
 * version, headers without the internal ones) frame_fast_names answers -2 and the caller reads f_locals as before. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && defined(__has_include)
#if __has_include(<internal/pycore_frame.h>)
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#include <internal/pycore_frame.h>
#define FAST_FRAMES 1
#endif
#endif

#include "_frame.h"

int frame_fast_built(void)
{
#if defined(FAST_FRAMES) || (PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030B0000)
    return 1;
#else
    return 0;
#endif
}

Py_ssize_t frame_fast_names(PyFrameObject *f, PyObject *obj, PyObject *view, int *relay)
{
#if defined(FAST_FRAMES) || (PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030B0000)
    PyCodeObject *code = PyFrame_GetCode(f); /* a new reference */
    if (!(code->co_flags & CO_OPTIMIZED)) { /* a module's or class body's: its names live in a dict */
        Py_DECREF(code);
        return -2;
    }
#if defined(FAST_FRAMES)
    /* Locals, then cells and free variables: a name a closure shares holds a cell, never ``obj`` itself, and so is
     * never counted (as f_locals leaves a cell's own reference unexplained). Slots past co_nlocalsplus are the
     * evaluation stack's. */
    PyObject **names = _PyFrame_GetLocalsArray(f->f_frame);
    Py_ssize_t count = code->co_nlocalsplus;
#else
    PyObject **names = f->f_localsplus; /* 3.10: locals first, co_nlocals of them (then cells, free variables) */
    Py_ssize_t count = code->co_nlocals;
#endif
    Py_DECREF(code);
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = names[i];
        if (v == obj)
            n++;
        else if (v != NULL && relays(v, view))
            *relay = 1;
    }
    return n;
#else
    (void)f, (void)obj, (void)view, (void)relay;
    return -2;
#endif
}
