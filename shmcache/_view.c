/* shmcache._core's zero-copy views: what view.py's PinDescriptions, Pin and View do, in C (view.py is the reference;
 * its module docstring says what a pin is and how long it lasts).
 *
 * Core.view (_core.c) takes the pin under the lock: the entry's pin flag, and a read lock on its pin byte through a
 * description from ``Pins``. Everything after the unlock happens here:
 *
 * - ``Lease`` owns that description from then on, and holds a buffer export of the segment's mapping. It exports the
 *   pinned value's bytes (tag first, read-only). The arrays and memoryviews handed out are built over it, so it is
 *   freed only after the last of them, and its dealloc ends the pin: unlock, and the description back to the pool.
 *   No Python code runs between the memory going and the pin ending, so no exception can come between them.
 * - A handle checks a stored value once (view.py: the checksum policy). ``Pins.viewed`` remembers what it checked
 *   (slot -> version, offset, length, checksum and layout); a view of a value it names is built here at once.
 * - ``View`` is what ``SharedCache.view`` returns in the compiled build: its close() lets go of the object handed out
 *   exactly as view.PyView's does (a memoryview released; an array left to whoever still holds it, whose pin ends
 *   with its last reference: the pin is the export, nothing else).
 *
 * Fork: neither side of a fork may unlock a description the other may still hold (an OFD unlock ends the lock for
 * every holder of the description), and the parent must not lend such a description again. view.py's fork hooks
 * call Pins._forking (before the fork and after it in the parent) and Pins._forked_child: each bumps the epoch (a
 * lease of an earlier epoch closes its description at the end, never unlocking it nor lending it again), and the
 * child closes its copies of the idle descriptions and takes its own pid (a lease of another pid only closes its
 * copy). An inherited view's pin so lasts until the child drops it or exits.
 */
#include "_view.h"

/* numpy's C API, for the arrays a view hands out: built from a layout's numbers in one call, without the argument
 * parsing of the Python-level constructor (about 2,900 instructions a view). Its table is loaded by setup_views,
 * which view.py calls once numpy is imported anyway; this is the one translation unit that uses it. */
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#if NPY_ABI_VERSION < 0x02000000 /* numpy 1.x headers (numpy 2's accessor reads either runtime's descriptor) */
#define PyDataType_ELSIZE(d) ((d)->elsize)
#endif
#define VIEW_MAXDIMS 32 /* numpy 1.x's NPY_MAXDIMS: the most dimensions every runtime takes */

#include <errno.h>
#include <fcntl.h>
#include <stddef.h> /* offsetof (the member tables; structmember.h brought it before 3.12) */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if PY_VERSION_HEX >= 0x030C0000 /* the member types moved into Python.h (structmember.h is deprecated) */
#define MEMBER_LL Py_T_LONGLONG
#define MEMBER_RO Py_READONLY
#else
#include "structmember.h"
#define MEMBER_LL T_LONGLONG
#define MEMBER_RO READONLY
#endif

/* Set once by setup_views(): what the views are built with. */
static PyObject *frombuffer;   /* numpy.frombuffer: a bytes value's memory */
static PyObject *ndarray;      /* numpy.ndarray: an array value's, in its shape at once */
static long tag_bytes = -1, tag_array = -1;
static PyObject *s_release;

enum { VK_ARRAY, VK_BYTES, VK_TENSOR };

typedef struct LeaseS {
    PyObject_HEAD
    Pins *pins;
    int64_t *pin_word;   /* a reader slot's pin word holding this pin (no description: fd -1); NULL otherwise */
    PyObject *pin_owner; /* what holds that slot, kept while the pin is */
    struct LeaseS *pin_prev, *pin_next; /* in pins->slot_leases */
    Py_buffer src; /* the export of the mapping, held while the lease lives */
    int have_src;
    int fd;         /* the description the pin is held through; -1 once the pin ended */
    int64_t byte;   /* the byte locked through it; -1 unknown (the description is then closed at the end) */
    pid_t pid;      /* Pins.pid when the pin was taken */
    unsigned long epoch;       /* Pins.epoch when the description was taken */
    unsigned long armed_epoch; /* ...and when the lease was armed: a view made before a fork is the child's too */
    char *ptr;      /* the value, tag first */
    Py_ssize_t len;
    int64_t slot, off, check, version;
} Lease;

/* A pin word's pin given back: one view fewer of its entry. */
static void word_release(int64_t *w)
{
    int64_t x = __atomic_load_n(w, __ATOMIC_RELAXED);
    __atomic_store_n(w, (x >> 32) > 1 ? x - ((int64_t)1 << 32) : 0, __ATOMIC_RELAXED);
}

/* Lease ``l``'s pin by a pin word ended (at most once): the word given back (unless this process is a fork child
 * the lease was inherited by: the word is the parent's), the lease off the list. */
static void slot_end(Lease *l)
{
    Pins *p = l->pins;
    if (l->pid == p->pid)
        word_release(l->pin_word);
    l->pin_word = NULL;
    if (l->pin_prev != NULL)
        l->pin_prev->pin_next = l->pin_next;
    else if (p->slot_leases == l)
        p->slot_leases = l->pin_next;
    if (l->pin_next != NULL)
        l->pin_next->pin_prev = l->pin_prev;
    l->pin_prev = l->pin_next = NULL;
    Py_CLEAR(l->pin_owner);
}

typedef struct {
    PyObject_HEAD
    PyObject *obj; /* what __enter__ hands out; NULL once closed */
    int kind;
    PyObject *weakreflist;
} View;

/* ------------------------------------------------------------------------------------------------ descriptions */

int pins_take(Pins *p, int *fd, Taken *t)
{
    t->pid = p->pid;
    t->epoch = p->epoch;
    if (p->nidle > 0) {
        *fd = p->idle[--p->nidle];
        return 0;
    }
    int f = open(p->path, O_RDWR | O_CLOEXEC);
    if (f < 0) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, p->path);
        return -1;
    }
    *fd = f;
    return 0;
}

void pins_give(Pins *p, int fd, Taken t)
{
    if (p->closed || t.epoch != p->epoch || t.pid != p->pid) {
        close(fd);
        return;
    }
    if (p->nidle == p->cap) {
        Py_ssize_t cap = p->cap ? 2 * p->cap : 8;
        int *idle = PyMem_Realloc(p->idle, (size_t)cap * sizeof(int));
        if (idle == NULL) { /* no room to keep it: closed (it holds no lock); never an exception here */
            close(fd);
            return;
        }
        p->idle = idle;
        p->cap = cap;
    }
    p->idle[p->nidle++] = fd;
}

static void close_idle(Pins *p)
{
    while (p->nidle > 0)
        close(p->idle[--p->nidle]);
}

static int Pins_init(Pins *p, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"segment_fd", "mapping", "arena_off", "arena_nbytes", "pin_base", NULL};
    int seg_fd;
    PyObject *mapping;
    Py_ssize_t arena_off, arena_nbytes;
    long long pin_base;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOnnL", kwlist, &seg_fd, &mapping, &arena_off, &arena_nbytes,
                                     &pin_base))
        return -1;
    if (frombuffer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shmcache._core.setup_views() was not called");
        return -1;
    }
    if (p->bound) {
        PyErr_SetString(PyExc_RuntimeError, "shmcache._core.Pins is bound once");
        return -1;
    }
    if (seg_fd < 0 || arena_off < 0 || arena_nbytes < 0 || pin_base < 0) {
        PyErr_SetString(PyExc_ValueError, "Pins: a negative descriptor, offset or length");
        return -1;
    }
    if (!PyObject_CheckBuffer(mapping)) {
        PyErr_SetString(PyExc_TypeError, "Pins: mapping must export a buffer (the segment's mmap)");
        return -1;
    }
    p->bound = 1;
    snprintf(p->path, sizeof p->path, "/proc/self/fd/%d", seg_fd);
    Py_INCREF(mapping);
    p->mapping = mapping;
    p->arena_off = arena_off;
    p->arena_nbytes = arena_nbytes;
    p->pin_base = pin_base;
    p->pid = getpid();
    return 0;
}

/* Made with its (empty) record of checked values, so that no method meets a NULL one: a Pins whose __init__ did not
 * run has no mapping and an empty path, and every view through it fails cleanly. */
static PyObject *Pins_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Pins *p = (Pins *)PyType_GenericNew(type, args, kwds);
    if (p != NULL && (p->viewed = PyDict_New()) == NULL)
        Py_CLEAR(p);
    return (PyObject *)p;
}

static void Pins_dealloc(Pins *p)
{
    if (p->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)p);
    close_idle(p);
    PyMem_Free(p->idle);
    Py_CLEAR(p->mapping);
    Py_CLEAR(p->viewed);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static Lease *lease_alloc(Pins *p, int fd, Taken t)
{
    Lease *l = PyObject_New(Lease, &LeaseType);
    if (l == NULL)
        return NULL;
    Py_INCREF(p);
    l->pins = p;
    l->pin_word = NULL;
    l->pin_owner = NULL;
    l->pin_prev = l->pin_next = NULL;
    l->have_src = 0;
    l->fd = fd;
    l->byte = -1;
    l->pid = t.pid;
    l->epoch = l->armed_epoch = t.epoch;
    l->ptr = NULL;
    l->len = 0;
    l->slot = l->off = l->check = l->version = -1;
    return l;
}

/* Arm lease ``l``: its pin is on entry ``slot`` (so the end unlocks that byte and lends the description again), over
 * the value at arena offset ``off``, ``len`` bytes (bounds-checked: they come from the segment). -1 with an exception
 * set, the lease left as it was. */
static int lease_arm(Lease *l, int64_t slot, int64_t off, int64_t len, int64_t check, int64_t version)
{
    Pins *p = l->pins;
    if (l->have_src || p->mapping == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        l->have_src ? "Lease.arm: armed already" : "Lease.arm: the pins are closed");
        return -1;
    }
    if (slot < 0 || off < 0 || len < 1 || off > p->arena_nbytes || len > p->arena_nbytes - off) {
        PyErr_Format(PyExc_ValueError, "Lease.arm: slot %lld, value at %lld of %lld bytes is not within the arena",
                     (long long)slot, (long long)off, (long long)len);
        return -1;
    }
    if (PyObject_GetBuffer(p->mapping, &l->src, PyBUF_SIMPLE) < 0)
        return -1;
    if (l->src.len < p->arena_off + p->arena_nbytes) {
        PyBuffer_Release(&l->src);
        PyErr_SetString(PyExc_ValueError, "Lease.arm: the mapping is smaller than its arena");
        return -1;
    }
    l->have_src = 1;
    l->armed_epoch = p->epoch;
    l->ptr = (char *)l->src.buf + p->arena_off + off;
    l->len = (Py_ssize_t)len;
    l->byte = p->pin_base + slot;
    l->slot = slot;
    l->off = off;
    l->check = check;
    l->version = version;
    return 0;
}

/* End the pin (at most once): unlock its byte and lend the description again; or, for a description that is not
 * this process's alone (inherited through fork, or out when this process forked) or whose byte is unknown, close it,
 * which drops whatever lock it holds once no other process holds it too. Never raises. */
static void lease_end(Lease *l)
{
    if (l->pin_word != NULL) {
        slot_end(l);
        return;
    }
    int fd = l->fd;
    if (fd < 0)
        return;
    l->fd = -1;
    Pins *p = l->pins;
    if (l->pid != p->pid) { /* a copy inherited through fork: the pin is the parent's, and stays */
        close(fd);
        return;
    }
    int unlocked = 0;
    /* A view made before this process forked is the child's too, and an unlock through its description would end
     * the child's pin as well (its inherited view would read bytes reused under it): closed, never unlocked. (An
     * unarmed lease has no view: its armed_epoch is its description's.) */
    if (l->byte >= 0 && l->armed_epoch == p->epoch) {
        struct flock fl = byte_lock(F_UNLCK, l->byte);
        unlocked = fcntl(fd, F_OFD_SETLK, &fl) == 0;
    }
    Taken t = {l->pid, l->epoch};
    if (unlocked)
        pins_give(p, fd, t);
    else
        close(fd);
}

static void Lease_dealloc(Lease *l)
{
    lease_end(l);
    if (l->have_src) {
        l->have_src = 0;
        PyBuffer_Release(&l->src);
    }
    Py_CLEAR(l->pins);
    PyObject_Free(l);
}

static int Lease_getbuffer(Lease *l, Py_buffer *view, int flags)
{
    if (!l->have_src) {
        PyErr_SetString(PyExc_BufferError, "this lease is not armed");
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)l, l->ptr, l->len, 1, flags);
}

static PyBufferProcs Lease_as_buffer = {(getbufferproc)Lease_getbuffer, NULL};

static PyObject *Lease_arm(Lease *l, PyObject *args)
{
    long long slot, off, len, check, version;
    if (!PyArg_ParseTuple(args, "LLLLL:arm", &slot, &off, &len, &check, &version))
        return NULL;
    if (l->fd < 0) {
        PyErr_SetString(PyExc_RuntimeError, "Lease.arm: the pin has ended");
        return NULL;
    }
    if (lease_arm(l, slot, off, len, check, version))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Lease_end(Lease *l, PyObject *Py_UNUSED(ignored))
{
    lease_end(l);
    Py_RETURN_NONE;
}

static PyObject *Lease_get_fd(Lease *l, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(l->fd);
}

static PyMethodDef Lease_methods[] = {
    {"arm", (PyCFunction)Lease_arm, METH_VARARGS,
     "arm(slot, off, len, check, version)\n\nThe pin taken through fd (by Store.pin) is on entry slot, over the value "
     "at arena offset off of len bytes, stored with that checksum and version."},
    {"end", (PyCFunction)Lease_end, METH_NOARGS,
     "End the pin now (idempotent): only for a lease no view was built over, when the view cannot be made."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Lease_members[] = {
    {"slot", MEMBER_LL, offsetof(Lease, slot), MEMBER_RO, "the entry pinned"},
    {"off", MEMBER_LL, offsetof(Lease, off), MEMBER_RO, "the value's offset in the arena"},
    {"check", MEMBER_LL, offsetof(Lease, check), MEMBER_RO, "the checksum the value was stored with"},
    {"version", MEMBER_LL, offsetof(Lease, version), MEMBER_RO, "the entry's version when pinned"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Lease_getset[] = {
    {"fd", (getter)Lease_get_fd, NULL, "the description the pin is taken through (-1 once it ended)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject LeaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmcache._core.Lease",
    .tp_basicsize = sizeof(Lease),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One view's pin: it owns the description the pin is held through and exports the pinned value's bytes "
              "(tag first, read-only); the pin ends when it is freed. Made by Core.view and Pins.lease().",
    .tp_dealloc = (destructor)Lease_dealloc,
    .tp_as_buffer = &Lease_as_buffer,
    .tp_methods = Lease_methods,
    .tp_members = Lease_members,
    .tp_getset = Lease_getset,
};

/* ------------------------------------------------------------------------------------------------ views */

/* A View handing out ``obj`` (a reference stolen, also on failure). */
static PyObject *view_new(PyObject *obj, int kind)
{
    View *v = PyObject_GC_New(View, &ViewType);
    if (v == NULL) {
        Py_DECREF(obj);
        return NULL;
    }
    v->obj = obj;
    v->kind = kind;
    v->weakreflist = NULL;
    PyObject_GC_Track(v);
    return (PyObject *)v;
}

/* The View of leased value ``l`` as ``layout`` (tag, dtype, shape, data offset, count) reads it: a memoryview for
 * bytes, an array for an array. The memory is owned by an array over the lease (``owner``): what is handed out
 * derives from it (numpy collapses a view's base to it, and to nothing further: the lease is not an array), so the
 * lease goes after the last of them. An array's owner is built in its shape by one call of ndarray (two thirds of
 * frombuffer followed by reshape), what is handed out a view() of it. */
/* The array of ``nd`` items of ``shape`` (a tuple; NULL for one dimension of ``count``) of ``dt`` over lease ``l``
 * from ``off``, read-only, its base the lease; NULL without an exception where this dtype is not one to build so
 * (a structured, subarray or object dtype: the Python-level constructor takes those, or refuses them, as before).
 * Every number is checked against the lease's length before the pointer is made. */
static PyObject *owner_array(Lease *l, PyObject *dt, PyObject *shape, PyObject *count, PyObject *off_obj)
{
    if (!PyArray_DescrCheck(dt))
        return NULL;
    PyArray_Descr *descr = (PyArray_Descr *)dt;
    if (PyDataType_HASFIELDS(descr) || PyDataType_HASSUBARRAY(descr) || PyDataType_REFCHK(descr)
        || PyDataType_ELSIZE(descr) <= 0)
        return NULL;
    npy_intp dims[VIEW_MAXDIMS];
    int nd = 1;
    if (shape == NULL) {
        dims[0] = PyLong_AsSsize_t(count);
    } else {
        if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > VIEW_MAXDIMS)
            return NULL;
        nd = (int)PyTuple_GET_SIZE(shape);
        for (int i = 0; i < nd; i++)
            dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
    }
    Py_ssize_t off = PyLong_AsSsize_t(off_obj), nbytes = (Py_ssize_t)PyDataType_ELSIZE(descr);
    if (PyErr_Occurred())
        return NULL;
    for (int i = 0; i < nd; i++)
        if (dims[i] < 0 || __builtin_mul_overflow(nbytes, (Py_ssize_t)dims[i], &nbytes)) {
            PyErr_SetString(PyExc_ValueError, "a view's shape is negative or too large");
            return NULL;
        }
    if (off < 0 || off > l->len || nbytes > l->len - off) {
        PyErr_SetString(PyExc_ValueError, "a view's layout does not fit the value it reads");
        return NULL;
    }
    Py_INCREF(descr); /* stolen by the constructor */
    PyObject *a = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, l->ptr + off, NPY_ARRAY_C_CONTIGUOUS,
                                       NULL);
    if (a == NULL)
        return NULL;
    Py_INCREF(l); /* stolen by SetBaseObject, also when it fails */
    if (PyArray_SetBaseObject((PyArrayObject *)a, (PyObject *)l) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

static PyObject *build(Lease *l, PyObject *layout)
{
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 5) {
        PyErr_SetString(PyExc_TypeError, "a view layout is (tag, dtype, shape, data offset, count)");
        return NULL;
    }
    long tag = PyLong_AsLong(PyTuple_GET_ITEM(layout, 0));
    if (tag == -1 && PyErr_Occurred())
        return NULL;
    int kind;
    if (tag == tag_bytes)
        kind = VK_BYTES;
    else if (tag == tag_array)
        kind = VK_ARRAY;
    else {
        PyErr_Format(PyExc_ValueError, "a view built in C is of bytes or an array, not tag %ld", tag);
        return NULL;
    }
    PyObject *owner, *obj;
    owner = owner_array(l, PyTuple_GET_ITEM(layout, 1), kind == VK_BYTES ? NULL : PyTuple_GET_ITEM(layout, 2),
                        PyTuple_GET_ITEM(layout, 4), PyTuple_GET_ITEM(layout, 3));
    if (owner == NULL && PyErr_Occurred())
        return NULL;
    if (owner == NULL && kind == VK_BYTES) {
        PyObject *fargs[4] = {(PyObject *)l, PyTuple_GET_ITEM(layout, 1), PyTuple_GET_ITEM(layout, 4),
                              PyTuple_GET_ITEM(layout, 3)};
        owner = PyObject_Vectorcall(frombuffer, fargs, 4, NULL); /* bounds-checked by numpy */
    } else if (owner == NULL) {
        /* ndarray(shape, dtype, buffer, offset): numpy checks the buffer holds the shape's bytes from offset. */
        PyObject *nargs[4] = {PyTuple_GET_ITEM(layout, 2), PyTuple_GET_ITEM(layout, 1), (PyObject *)l,
                              PyTuple_GET_ITEM(layout, 3)};
        owner = PyObject_Vectorcall(ndarray, nargs, 4, NULL);
    }
    if (owner == NULL)
        return NULL;
    if (kind == VK_BYTES)
        obj = PyMemoryView_FromObject(owner);
    else
        obj = PyArray_View((PyArrayObject *)owner, NULL, NULL); /* its base collapses to owner, as .view()'s */
    Py_DECREF(owner);
    return obj == NULL ? NULL : view_new(obj, kind);
}

/* Whether this handle checked the value ``l`` leases before (the same version, offset, length and checksum in the
 * same slot): its layout (borrowed), or NULL (and no exception) if not. */
static PyObject *known_layout(Pins *p, Lease *l)
{
    PyObject *key = PyLong_FromLongLong(l->slot);
    if (key == NULL)
        return NULL;
    PyObject *rec = PyDict_GetItemWithError(p->viewed, key);
    Py_DECREF(key);
    if (rec == NULL || !PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 5)
        return NULL;
    PyObject *layout = PyTuple_GET_ITEM(rec, 4);
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 5 || !PyLong_CheckExact(PyTuple_GET_ITEM(layout, 0)))
        return NULL; /* (recorded by Pins.build, which checks nothing of it: not one to trust) */
    int64_t want[4] = {l->version, l->off, (int64_t)l->len, l->check};
    for (int i = 0; i < 4; i++) {
        PyObject *x = PyTuple_GET_ITEM(rec, i);
        int overflow = 0; /* (...AndOverflow: it reads an int of several digits in a loop, see arg_int) */
        if (!PyLong_CheckExact(x) || PyLong_AsLongLongAndOverflow(x, &overflow) != want[i] || overflow)
            return NULL; /* (an overflow: not the same value) */
    }
    return layout;
}

static PyObject *view_of_lease(Pins *p, Lease *l);

PyObject *view_of_pin(Pins *p, int fd, Taken t, int64_t slot, int64_t off, int64_t len, int64_t check,
                      int64_t version)
{
    Lease *l = lease_alloc(p, fd, t);
    if (l == NULL) {
        close(fd); /* drops the lock just taken through it */
        return NULL;
    }
    l->byte = p->pin_base + slot; /* so that any failure below unlocks it, as the lease goes */
    if (lease_arm(l, slot, off, len, check, version)) {
        Py_DECREF(l);
        return NULL;
    }
    return view_of_lease(p, l);
}

/* The View of armed lease ``l`` (whose reference it takes), or the lease itself for a first look. */
static PyObject *view_of_lease(Pins *p, Lease *l)
{
    PyObject *layout = known_layout(p, l);
    if (layout == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(l);
            return NULL;
        }
        return (PyObject *)l; /* a first look: view.first_look checks it */
    }
    long tag = PyLong_AsLong(PyTuple_GET_ITEM(layout, 0)); /* (an int: known_layout checked) */
    if (tag != tag_bytes && tag != tag_array)
        return (PyObject *)l; /* a tensor: built by view.first_look (it needs a read-only mapping of its own) */
    /* Held across build: numpy's calls may run a garbage collection, and Python code with it. */
    Py_INCREF(layout);
    PyObject *v = build(l, layout);
    Py_DECREF(layout);
    Py_DECREF(l); /* held by the view's memory now, or freed (unlocking) if it could not be built */
    return v;
}

PyObject *view_of_slot_pin(Pins *p, int64_t *word, PyObject *owner, int64_t slot, int64_t off, int64_t len,
                           int64_t check, int64_t version)
{
    Taken t = {p->pid, p->epoch};
    Lease *l = lease_alloc(p, -1, t);
    if (l == NULL) {
        word_release(word);
        return NULL;
    }
    l->pin_word = word;
    Py_INCREF(owner);
    l->pin_owner = owner;
    l->pin_next = p->slot_leases;
    if (l->pin_next != NULL)
        l->pin_next->pin_prev = l;
    p->slot_leases = l;
    if (lease_arm(l, slot, off, len, check, version)) {
        Py_DECREF(l); /* its end gives the word back */
        return NULL;
    }
    return view_of_lease(p, l);
}

/* view.PyView._close: let go of what was handed out. A memoryview is released (bytes(mv) then raises), unless
 * something exported it meanwhile (np.frombuffer of it...): that keeps it, and the pin, while it lives. An array or a
 * tensor is dropped: its pin ends with its last reference, wherever that is (a name still bound after the block, a
 * slice, a tensor over it), and never sooner. (twin: view.py PyView._close) */
static int view_close(View *v)
{
    PyObject *obj = v->obj;
    if (obj == NULL)
        return 0;
    v->obj = NULL;
    int r = 0;
    if (v->kind == VK_BYTES) {
        PyObject *margs[1] = {obj};
        PyObject *x = PyObject_VectorcallMethod(s_release, margs, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (x == NULL) {
            if (PyErr_ExceptionMatches(PyExc_BufferError))
                PyErr_Clear();
            else
                r = -1;
        }
        Py_XDECREF(x);
    }
    Py_DECREF(obj);
    return r;
}

static PyObject *View_enter(View *v, PyObject *Py_UNUSED(ignored))
{
    if (v->obj == NULL) {
        PyErr_SetString(PyExc_ValueError, "this view is closed; take a new one with cache.view(key)");
        return NULL;
    }
    Py_INCREF(v->obj);
    return v->obj;
}

static PyObject *View_exit(View *v, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    if (view_close(v))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *View_close(View *v, PyObject *Py_UNUSED(ignored))
{
    if (view_close(v))
        return NULL;
    Py_RETURN_NONE;
}

static int View_traverse(View *v, visitproc visit, void *arg)
{
    Py_VISIT(v->obj);
    return 0;
}

static int View_clear(View *v)
{
    Py_CLEAR(v->obj);
    return 0;
}

static void View_dealloc(View *v)
{
    PyObject_GC_UnTrack(v);
    if (v->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)v);
    Py_CLEAR(v->obj);
    PyObject_GC_Del(v);
}

static PyMethodDef View_methods[] = {
    {"__enter__", (PyCFunction)View_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))View_exit, METH_FASTCALL, NULL},
    {"close", (PyCFunction)View_close, METH_NOARGS,
     "Let go of the object handed out (a memoryview is released); the pin goes when nothing references the memory "
     "any more."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ViewType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmcache.View",
    .tp_basicsize = sizeof(View),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A pinned entry's value, zero-copy: ``with cache.view(key) as arr:``. Returned by SharedCache.view "
              "(see shmcache/view.py for what the pin holds and how long).",
    .tp_dealloc = (destructor)View_dealloc,
    .tp_traverse = (traverseproc)View_traverse,
    .tp_clear = (inquiry)View_clear,
    .tp_weaklistoffset = offsetof(View, weakreflist),
    .tp_methods = View_methods,
};

/* ------------------------------------------------------------------------------------------------ Pins methods */

static PyObject *Pins_lease(Pins *p, PyObject *Py_UNUSED(ignored))
{
    if (p->closed) {
        PyErr_SetString(PyExc_ValueError, "Pins.lease: closed");
        return NULL;
    }
    int fd;
    Taken t;
    if (pins_take(p, &fd, &t))
        return NULL;
    Lease *l = lease_alloc(p, fd, t);
    if (l == NULL)
        pins_give(p, fd, t);
    return (PyObject *)l;
}

static PyObject *Pins_build(Pins *p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "Pins.build(lease, layout[, tensor])");
        return NULL;
    }
    if (Py_TYPE(args[0]) != &LeaseType || ((Lease *)args[0])->pins != p || !((Lease *)args[0])->have_src) {
        PyErr_SetString(PyExc_TypeError, "Pins.build: an armed lease of these pins");
        return NULL;
    }
    Lease *l = (Lease *)args[0];
    PyObject *view;
    if (nargs == 2) {
        view = build(l, args[1]);
    } else {
        Py_INCREF(args[2]);
        view = view_new(args[2], VK_TENSOR);
    }
    if (view == NULL)
        return NULL;
    /* Recorded once the view is built: a layout that builds nothing is never trusted for the next views. */
    PyObject *rec = Py_BuildValue("(LLnLO)", (long long)l->version, (long long)l->off, l->len, (long long)l->check,
                                  args[1]);
    PyObject *key = PyLong_FromLongLong(l->slot);
    int bad = rec == NULL || key == NULL || PyDict_SetItem(p->viewed, key, rec) < 0;
    Py_XDECREF(rec);
    Py_XDECREF(key);
    if (bad)
        Py_CLEAR(view);
    return view;
}

static PyObject *Pins_close(Pins *p, PyObject *Py_UNUSED(ignored))
{
    p->closed = 1;
    close_idle(p);
    Py_CLEAR(p->mapping); /* each lease alive holds an export of it, so it is unmapped after the last */
    Py_RETURN_NONE;
}

/* Before a fork: every pin held by a reader slot's word moves to a description's lock, which the child inherits (the
 * word is the parent's alone: a child's view would lose its pin when the parent's ended); from then until the hook
 * after the fork, views pin through descriptions only. A pin that cannot move (no descriptor left) stays the
 * parent's: the child's inherited view of it is then pinned only while the parent's is. */
static void slot_pins_to_descriptions(Pins *p)
{
    Lease *l = p->slot_leases;
    while (l != NULL) {
        Lease *next = l->pin_next;
        int fd;
        Taken t;
        if (pins_take(p, &fd, &t) < 0) {
            PyErr_Clear();
        } else {
            struct flock fl = byte_lock(F_RDLCK, p->pin_base + l->slot);
            if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
                close(fd);
            } else {
                slot_end(l); /* (the flag stays set: the pin byte now holds it) */
                l->fd = fd;
                l->byte = p->pin_base + l->slot;
                l->pid = t.pid;
                l->epoch = l->armed_epoch = t.epoch; /* armed before the fork: closed, never unlocked, at its end */
            }
        }
        l = next;
    }
}

static PyObject *Pins_forking(Pins *p, PyObject *Py_UNUSED(ignored))
{
    p->forking = 1;
    slot_pins_to_descriptions(p);
    p->epoch++;
    Py_RETURN_NONE;
}

static PyObject *Pins_forked_parent(Pins *p, PyObject *Py_UNUSED(ignored))
{
    p->epoch++;
    p->forking = 0;
    Py_RETURN_NONE;
}

static PyObject *Pins_forked_child(Pins *p, PyObject *Py_UNUSED(ignored))
{
    close_idle(p);
    p->epoch++;
    p->pid = getpid();
    p->forking = 0;
    Py_RETURN_NONE;
}

static PyObject *Pins_get_closed(Pins *p, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(p->closed);
}

static PyObject *Pins_get_idle(Pins *p, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(p->nidle);
}

static PyObject *Pins_get_path(Pins *p, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(p->path);
}

static PyObject *Pins_get_viewed(Pins *p, void *Py_UNUSED(closure))
{
    return PyDictProxy_New(p->viewed);
}

static PyObject *Pins_forget(Pins *p, PyObject *Py_UNUSED(ignored))
{
    PyDict_Clear(p->viewed);
    Py_RETURN_NONE;
}

static PyMethodDef Pins_methods[] = {
    {"lease", (PyCFunction)Pins_lease, METH_NOARGS,
     "A lease not yet armed, owning a description that holds no lock: the Python path pins through lease.fd, then "
     "arms it. Dropped unarmed, it closes the description (dropping any lock taken through it)."},
    {"build", (PyCFunction)(void (*)(void))Pins_build, METH_FASTCALL,
     "build(lease, layout[, tensor]) -> View\n\nThe View of an armed lease whose value was checked, recorded in "
     "viewed so that the next views of that stored value are built in Core.view: over its bytes as layout (tag, "
     "dtype, shape, data offset, count) reads them, or holding tensor."},
    {"close", (PyCFunction)Pins_close, METH_NOARGS,
     "Close the idle descriptions; those of leases still alive are closed as they go."},
    {"forget", (PyCFunction)Pins_forget, METH_NOARGS,
     "Forget every stored value checked: the next view of each checks it again (benchmarks.views times it so)."},
    {"_forking", (PyCFunction)Pins_forking, METH_NOARGS, "os.register_at_fork's before"},
    {"_forked_parent", (PyCFunction)Pins_forked_parent, METH_NOARGS, "os.register_at_fork's after_in_parent"},
    {"_forked_child", (PyCFunction)Pins_forked_child, METH_NOARGS, "os.register_at_fork's after_in_child"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Pins_getset[] = {
    {"closed", (getter)Pins_get_closed, NULL, "whether close() was called", NULL},
    {"idle", (getter)Pins_get_idle, NULL, "descriptions kept for the next views", NULL},
    {"path", (getter)Pins_get_path, NULL, "what each description opens (the segment, through its descriptor)", NULL},
    {"viewed", (getter)Pins_get_viewed, NULL,
     "slot -> (version, offset, length, checksum, layout) of the stored values this handle's views checked "
     "(read-only)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PinsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmcache._core.Pins",
    .tp_basicsize = sizeof(Pins),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pins(segment_fd, mapping, arena_off, arena_nbytes, pin_base): the descriptions one cache handle's "
              "views pin through, and the values they checked.",
    .tp_new = Pins_new,
    .tp_init = (initproc)Pins_init,
    .tp_dealloc = (destructor)Pins_dealloc,
    .tp_weaklistoffset = offsetof(Pins, weakreflist),
    .tp_methods = Pins_methods,
    .tp_getset = Pins_getset,
};

/* ------------------------------------------------------------------------------------------------ module */

PyObject *setup_views(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "setup_views(frombuffer, ndarray, tag_bytes, tag_array)");
        return NULL;
    }
    long tb = PyLong_AsLong(args[2]), ta = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyCallable_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_views: frombuffer must be callable, ndarray a type");
        return NULL;
    }
    if (PyArray_API == NULL && _import_array() < 0)
        return NULL;
    PyObject *olds[2] = {frombuffer, ndarray};
    for (int i = 0; i < 2; i++)
        Py_INCREF(args[i]);
    frombuffer = args[0];
    ndarray = args[1];
    for (int i = 0; i < 2; i++)
        Py_XDECREF(olds[i]);
    tag_bytes = tb;
    tag_array = ta;
    Py_RETURN_NONE;
}

int view_types_add(PyObject *m)
{
    s_release = PyUnicode_InternFromString("release");
    if (s_release == NULL)
        return -1;
    PyTypeObject *types[3] = {&PinsType, &LeaseType, &ViewType};
    const char *names[3] = {"Pins", "Lease", "View"};
    for (int i = 0; i < 3; i++) {
        if (PyType_Ready(types[i]) < 0)
            return -1;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            return -1;
        }
    }
    return 0;
}
