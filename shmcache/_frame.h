/* The fast locals of a running frame, read in place (_frame.c): the shortcut of _view.c's unexplained(). */
#ifndef SHMCACHE_FRAME_H
#define SHMCACHE_FRAME_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

/* Whether a frame's local ``v`` is ``view`` or one of its bound methods: the frame runs the view's exit on behalf of
 * the one above it (view.py _relays). */
static inline int relays(PyObject *v, PyObject *view)
{
    return v == view || (PyMethod_Check(v) && PyMethod_GET_SELF(v) == view)
        || (PyCFunction_Check(v) && PyCFunction_GET_SELF(v) == view);
}

/* How many of the fast locals of ``f`` (a function's frame, running) are bound to ``obj``, each one reference; sets
 * *relay if one relays ``view``'s exit. -2 where this build cannot read them in place (a module's or class body's
 * frame, or an interpreter whose frames this was not built for): the caller reads f_locals. */
Py_ssize_t frame_fast_names(PyFrameObject *f, PyObject *obj, PyObject *view, int *relay);

/* 1 if this build reads fast locals in place (_core.FRAME_LOCALS_IN_PLACE), 0 if every read goes to f_locals. */
int frame_fast_built(void);

#endif
