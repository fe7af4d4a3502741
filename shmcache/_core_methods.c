/* shmcache._core, the methods: arguments checked, the lock entered and left, results built, hand-overs made.
 * Twin of cache.py (SharedCache) and mapping.py (LocalMapping).
 * A part of the one translation unit _core.c (see there). */
#include "_core.h"

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
    /* ...AndOverflow: it reads an int of several digits (every fingerprint) in a loop over them, where
     * PyLong_AsLongLong goes through _PyLong_AsByteArray (about 250 instructions more an argument). */
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        if (overflow || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be an int that fits 64 bits", what);
        }
        return -1;
    }
    *out = x;
    return 0;
}

/* Whether an entry's arguments are consistent, as Store.encode makes them: a wrong size or block size would aim
 * writes past the block. */
static inline int encoded_ok(Core *c, const Encoded *st)
{
    return st->tag >= 0 && st->tag <= 255 && st->fp >= 0 && st->check != 0 && st->size == st->klen + st->blen + 1
           && st->nb == block_nbytes(c, st->size) && st->nb <= c->max_block && st->nb <= c->arena_nbytes;
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

/* What a call that C does not finish answers (``r``: ST_HANDOVER or ST_PINNED, its reason recorded): without a
 * fallback, HANDOVER or PINNED; with one (the handle's core.HandOver), what its method ``name`` answers for the same
 * ``args`` and ``waited``, whether the C waited the whole lock timeout (the Python path then waits no more). The one
 * place a hand-over is made. */
static PyObject *call_fallback(Core *c, PyObject *name, PyObject *const *args, Py_ssize_t n)
{
    PyObject *a[8];
    a[0] = c->fallback;
    for (Py_ssize_t i = 0; i < n; i++)
        a[i + 1] = args[i];
    a[n + 1] = thread_reason == WHY_TIMEOUT ? Py_True : Py_False;
    return PyObject_VectorcallMethod(name, a, (size_t)n + 2, NULL);
}

static PyObject *hand_over(Core *c, int r, PyObject *name, PyObject *const *args, Py_ssize_t n)
{
    PyObject *refused = refusal(c, r);
    if (c->fallback == NULL || refused == NULL)
        return refused;
    Py_DECREF(refused);
    return call_fallback(c, name, args, n);
}

/* The fallback's method ``name`` called with ``args`` (what C leaves to Python: a Raw to finish, a lease to look at
 * first, a batch's refusal to raise). */
static PyObject *leave_to(Core *c, PyObject *name, PyObject *const *args, Py_ssize_t n)
{
    PyObject *a[8];
    a[0] = c->fallback;
    for (Py_ssize_t i = 0; i < n; i++)
        a[i + 1] = args[i];
    return PyObject_VectorcallMethod(name, a, (size_t)n + 1, NULL);
}

/* A stripe's word that the last try of a read without the lock found odd (c->stuck), and is odd still while this
 * thread holds the lock with nothing half-done: no hold is writing under it, so a stray write (or a holder that died
 * between its odd store and its mask bit, which a bit set first rules out) left it so. Named in the open mask, it is
 * evened as this hold ends, and its keys read without the lock again. (No twin: the Python path reads under the
 * lock, and never sees a stripe's word.) */
static inline void heal_stripe(Core *c)
{
    int64_t k = c->stuck; /* (a stripe number window_enter found: below 1 << STRIPE_BITS) */
    c->stuck = -1;
    if (c->stripes == NULL || HW(dirty))
        return;
    if (__atomic_load_n(&c->stripes[STRIPE_WORD(k)], __ATOMIC_RELAXED) & 1)
        c->stripes[S_OPEN] = (int64_t)((uint64_t)c->stripes[S_OPEN] | ((uint64_t)1 << k));
}

/* The call takes the lock: 0, held; ST_HANDOVER, not held (its reason recorded); -1, a Python exception is set.
 * Every successful enter is followed by unlock() and leave(). */
static int enter(Core *c)
{
    c->users++;
    int r = lock(c);
    if (r)
        leave(c);
    else if (c->stuck >= 0)
        heal_stripe(c);
    return r;
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

/* 1 if the copy's checksum is right, 0 if not, -1 with an exception set. ``bytes``/``n``: the value after its tag;
 * ``owner``: the copy (bytes of exactly the value, or a bytearray holding the tag too). */
static int checksum_ok(Core *c, const char *bytes, Py_ssize_t n, int64_t tag, int64_t check)
{
    uint64_t h = xxh3_64((const uint8_t *)bytes, (size_t)n, (uint64_t)tag);
    return (int64_t)((h & (uint64_t)c->check_mask) | 1) == check;
}

/* What a get returns for hit *f once the lock is released, from its copy ``body`` (copy_value's; the reference is
 * taken): the copy's checksum checked, bytes returned as they are, a plain msgpack value decoded (_unpack.c);
 * anything else a Raw for the Python side (a failed checksum, an array or tensor, a value the decoder declines). */
static int copy_ok(Core *c, const Found *f, PyObject *body)
{
    const char *after_tag = PyByteArray_CheckExact(body) ? PyByteArray_AS_STRING(body) + 1 : PyBytes_AS_STRING(body);
    return checksum_ok(c, after_tag, (Py_ssize_t)(f->vlen - 1), f->tag, f->check);
}

/* finish's part after the checksum (``ok``: whether it was right). */
static PyObject *decoded(Core *c, const Found *f, PyObject *body, int ok)
{
    const char *after_tag = PyByteArray_CheckExact(body) ? PyByteArray_AS_STRING(body) + 1 : PyBytes_AS_STRING(body);
    Py_ssize_t n = (Py_ssize_t)(f->vlen - 1);
    if (ok && f->tag == c->tag_bytes)
        return body;
    if (ok && f->tag == c->tag_msgpack) {
        PyObject *v = shm_unpack(after_tag, n);
        if (v != NULL) {
            Py_DECREF(body);
            return v;
        }
    }
    PyObject *raw = raw_of(f->tag, body, f->slot, ok);
    if (raw == NULL || c->fallback == NULL)
        return raw;
    PyObject *v = leave_to(c, N_FINISH, &raw, 1);
    Py_DECREF(raw);
    return v;
}

static PyObject *finish(Core *c, const Found *f, PyObject *body)
{
    int ok = copy_ok(c, f, body);
    if (ok < 0) {
        Py_DECREF(body);
        return NULL;
    }
    return decoded(c, f, body, ok);
}

/* A call's key as the C reads it, and how to hand the call over: ``args``, the call's own (kb, fp, now_ns, last)
 * where it was called so, else NULL: they are made from the fields (Core.view_key's, whose key was encoded here). */
typedef struct {
    const char *kb;
    int64_t klen, fp, now; /* now: as the call gave it (-1: read the clock when needed) */
    PyObject *kbo;         /* the key's bytes as codec.encode_key made them, where it did (key_of's caller drops it) */
    PyObject *const *args;
} KeyCall;

/* hand_over of a call on key ``k`` to the fallback's method ``name`` as (kb, fp, now_ns, last). */
static PyObject *hand_over_key(Core *c, int r, PyObject *name, const KeyCall *k, PyObject *last)
{
    if (k->args != NULL)
        return hand_over(c, r, name, k->args, 4);
    PyObject *kb = k->kbo != NULL ? (Py_INCREF(k->kbo), k->kbo) : PyBytes_FromStringAndSize(k->kb, k->klen);
    PyObject *fp = PyLong_FromLongLong(k->fp), *now = PyLong_FromLongLong(k->now), *out = NULL;
    if (kb != NULL && fp != NULL && now != NULL) {
        PyObject *a[4] = {kb, fp, now, last};
        out = hand_over(c, r, name, a, 4);
    }
    Py_XDECREF(kb);
    Py_XDECREF(fp);
    Py_XDECREF(now);
    return out;
}

/* Set once by setup_keys(): codec.encode_key, what encodes a key that is not a str, and codec.EncodedKey, key bytes
 * already encoded (TieredCache's local hits; get alone takes one). */
static PyObject *key_encoder;
static PyTypeObject *encoded_key_type;

/* Key ``key`` as SharedCache.get and view are given it, encoded and hashed into *k as their Python did it before
 * calling: a str's UTF-8 (the bytes CPython keeps with the str) and XXH3 (_core_hash.c); an EncodedKey as it is
 * (where ``encoded`` allows one); any other key (or a str without UTF-8: a lone surrogate) through codec.encode_key,
 * which raises the TypeError; then its fingerprint (xxh3_64). 0, or -1 with an exception set; the new reference in
 * k->kbo, if any, is the caller's to drop. (twin: core.py Reference.view_key) */
static int key_of(PyObject *key, int encoded, KeyCall *k)
{
    Py_ssize_t n = 0;
    k->kbo = NULL;
    if (PyUnicode_CheckExact(key) && (k->kb = PyUnicode_AsUTF8AndSize(key, &n)) != NULL) {
        k->klen = n;
    } else if (encoded && encoded_key_type != NULL && Py_TYPE(key) == encoded_key_type) {
        k->kb = PyBytes_AS_STRING(key);
        k->klen = PyBytes_GET_SIZE(key);
    } else {
        PyErr_Clear(); /* (a lone surrogate: encode_key raises the TypeError) */
        if (key_encoder == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "shmcache._core.setup_keys was not called (shmcache/core.py calls it)");
            return -1;
        }
        PyObject *kbo = PyObject_CallOneArg(key_encoder, key);
        if (kbo == NULL)
            return -1;
        if (!PyBytes_CheckExact(kbo)) {
            PyErr_SetString(PyExc_TypeError, "encode_key must return bytes");
            Py_DECREF(kbo);
            return -1;
        }
        k->kb = PyBytes_AS_STRING(kbo);
        k->klen = PyBytes_GET_SIZE(kbo);
        k->kbo = kbo;
    }
    k->fp = (int64_t)(xxh3_64((const uint8_t *)k->kb, (size_t)k->klen, 0) & (uint64_t)INT64_MAX);
    return 0;
}

static PyObject *get_key_found(Core *c, const KeyCall *k, PyObject *dflt);

/* (twin: cache.py SharedCache.get) */
static PyObject *Core_get_value(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    KeyCall k = {NULL, 0, 0, 0, NULL, args};
    if (nargs_ok(nargs, 4, "get_value") || key_args(args, 3, "get_value", &k.kb, &k.klen, &k.fp, &k.now))
        return NULL;
    return get_key_found(c, &k, args[3]);
}

/* get_key(key, now_ns, default): get_value, the key encoded and hashed here (key_of). (twin: core.py
 * Reference.get_key) */
static PyObject *Core_get_key(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    KeyCall k = {NULL, 0, 0, 0, NULL, NULL};
    if (nargs_ok(nargs, 3, "get_key") || arg_int(args[1], "now_ns", &k.now) || key_of(args[0], 1, &k))
        return NULL;
    PyObject *out = get_key_found(c, &k, args[2]);
    Py_XDECREF(k.kbo);
    return out;
}

/* Core.get_value's work, for key ``k``. */
static PyObject *get_key_found(Core *c, const KeyCall *k, PyObject *dflt)
{
    const char *kb = k->kb;
    int64_t klen = k->klen, fp = k->fp, now = k->now;
    Found f = {0, 0, 0, 0, 0, 0};
    PyObject *body = NULL;
    int64_t *rd = reader_slot(c);
    if (rd != NULL && !c->released && c->bound) {
        /* Without the lock (_core_unlocked.c): counted in this handle's reader slot once the answer is sure. A
         * copy failing its checksum under a steady seq is damage: the locked path reads it again and judges. */
        c->users++; /* rd and the arena stay mapped until leave() */
        reading(c, rd, 1);
        int u = get_unlocked(c, rd, kb, klen, fp, &now, &f, &body);
        reading(c, rd, 0);
        int ok = u == U_DONE && f.hit ? copy_ok(c, &f, body) : 1;
        int done = u == U_DONE && ok == 1;
        if (done && f.hit) {
            hit_unlocked(c, f.slot, fp);
            ADD(rd[c->r_hits], 1);
        } else if (done) {
            ADD(rd[c->r_misses], 1);
        } else if (u >= 0 && ok >= 0) {
            ADD(rd[c->r_fallbacks], 1);
        }
        leave(c);
        if (u < 0 || ok < 0) {
            Py_XDECREF(body);
            return NULL;
        }
        if (done && !f.hit) {
            Py_INCREF(dflt);
            return dflt;
        }
        if (done)
            return decoded(c, &f, body, 1);
        Py_XDECREF(body);
        body = NULL;
    }
    int r = enter(c);
    if (r)
        return r < 0 ? NULL : hand_over_key(c, r, N_GET_VALUE, k, dflt);
    r = get_locked(c, kb, klen, fp, now, &f);
    if (r == ST_OK && f.hit)
        body = copy_value(c, &f);
    unlock(c);
    leave(c);
    if (r)
        return hand_over_key(c, r, N_GET_VALUE, k, dflt);
    if (!f.hit) {
        Py_INCREF(dflt);
        return dflt;
    }
    return body == NULL ? NULL : finish(c, &f, body);
}

static PyObject *view_out(Core *c, Pins *p, int fd, Taken t, const Found *f, int viewable, int64_t version);

/* Whether this thread's view in progress pinned without the lock (its hit is counted in the reader slot, after the
 * first look: _core.unlocked_view()). */
static _Thread_local int thread_unlocked_view;

static PyObject *view_key_found(Core *c, const KeyCall *k, Pins *p);

/* A view, compiled end to end: the pin as Store.pin takes it, through a description of ``pins`` (taken before the
 * lock, given back on a miss), then (_view.c) the lease that ends it, and the View if this handle checked the value
 * before. (twin: core.py Reference.view) */
static PyObject *Core_view(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    KeyCall k = {NULL, 0, 0, 0, NULL, args};
    if (nargs_ok(nargs, 4, "view") || key_args(args, 3, "view", &k.kb, &k.klen, &k.fp, &k.now))
        return NULL;
    if (Py_TYPE(args[3]) != &PinsType) {
        PyErr_SetString(PyExc_TypeError, "Core.view: pins must be a shmcache._core.Pins");
        return NULL;
    }
    return view_key_found(c, &k, (Pins *)args[3]);
}

/* view_key(key, now_ns, pins): view, the key encoded and hashed here (key_of; an EncodedKey is encoded as any other
 * bytes subclass, as view() does). (twin: core.py Reference.view_key) */
static PyObject *Core_view_key(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    KeyCall k = {NULL, 0, 0, 0, NULL, NULL};
    if (nargs_ok(nargs, 3, "view_key") || arg_int(args[1], "now_ns", &k.now))
        return NULL;
    if (Py_TYPE(args[2]) != &PinsType) {
        PyErr_SetString(PyExc_TypeError, "Core.view_key: pins must be a shmcache._core.Pins");
        return NULL;
    }
    if (key_of(args[0], 0, &k))
        return NULL;
    PyObject *out = view_key_found(c, &k, (Pins *)args[2]);
    Py_XDECREF(k.kbo);
    return out;
}

/* Core.view's work, for key ``k``. */
static PyObject *view_key_found(Core *c, const KeyCall *k, Pins *p)
{
    const char *kb = k->kb;
    int64_t klen = k->klen, fp = k->fp, now = k->now;
    PyObject *pins = (PyObject *)p;
    if (p->closed || !VERSIONS_SHOWN(c)) { /* (a view carries its version: the Python path shows the column) */
        c->reason = p->closed ? WHY_RELEASED : WHY_GROW;
        return hand_over_key(c, ST_HANDOVER, N_VIEW, k, pins);
    }
    int fd;
    Taken t;
    if (pins_take(p, &fd, &t))
        return NULL;
    Found f = {0, 0, 0, 0, 0, 0};
    int viewable = 0, locked = 0;
    int64_t version = 0, *rd = reader_slot(c);
    if (rd != NULL && !c->released && c->bound) {
        c->users++; /* rd and the arena stay mapped until leave() */
        int64_t *word;
        reading(c, rd, 1);
        int u = pin_unlocked(c, rd, kb, klen, fp, &now, fd, p->forking, &f, &viewable, &version, &word);
        reading(c, rd, 0);
        if (u == U_DONE && f.hit && viewable) {
            /* Counted once the view is built: a first look that fails its checksum (HandOver.first_look, which
             * then corrects no counter of the header) is a miss. */
            thread_unlocked_view = 1;
            PyObject *v;
            if (word != NULL) { /* pinned by the reader slot's word: the description goes back unused */
                pins_give(p, fd, t);
                v = view_of_slot_pin(p, word, c->reader, f.slot, f.off, f.vlen, f.check, version);
                if (v != NULL && c->fallback != NULL && Py_TYPE(v) != &ViewType) {
                    PyObject *out = leave_to(c, N_FIRST_LOOK, &v, 1);
                    Py_DECREF(v);
                    v = out;
                }
            } else {
                v = view_out(c, p, fd, t, &f, viewable, version);
            }
            thread_unlocked_view = 0;
            if (v != NULL)
                hit_unlocked(c, f.slot, fp);
            ADD(rd[v != NULL ? c->r_hits : c->r_misses], 1);
            leave(c);
            return v;
        }
        if (u == U_DONE && !f.hit)
            ADD(rd[c->r_misses], 1);
        else if (u != U_DONE)
            ADD(rd[c->r_fallbacks], 1);
        leave(c);
        if (u == U_DONE)
            return view_out(c, p, fd, t, &f, viewable, version);
        if (u == U_LOST && pins_take(p, &fd, &t))
            return NULL;
        f.hit = 0;
    }
    int r = enter(c);
    if (r) {
        pins_give(p, fd, t);
        return r < 0 ? NULL : hand_over_key(c, r, N_VIEW, k, pins);
    }
    r = pin_locked(c, kb, klen, fp, now, fd, &f, &viewable, &locked);
    version = f.hit ? c->ver[f.slot] : 0;
    unlock(c);
    leave(c);
    if (r) {
        if (locked)
            close(fd); /* closing drops the lock taken through it */
        else
            pins_give(p, fd, t);
        return hand_over_key(c, r, N_VIEW, k, pins);
    }
    if (p->closed && f.hit && viewable) { /* the handle was closed while this call waited for the lock */
        close(fd);
        c->reason = WHY_RELEASED;
        return hand_over_key(c, ST_HANDOVER, N_VIEW, k, pins);
    }
    return view_out(c, p, fd, t, &f, viewable, version);
}

/* What view answers once its lookup is done, through ``fd`` (locked through it only for a viewable hit). */
static PyObject *view_out(Core *c, Pins *p, int fd, Taken t, const Found *found_, int viewable, int64_t version)
{
    const Found f = *found_;
    if (!f.hit || !viewable) { /* nothing was locked through it */
        pins_give(p, fd, t);
        if (!f.hit)
            Py_RETURN_NONE;
        if (c->fallback == NULL)
            return PyLong_FromLong(-1);
        Py_INCREF(c->unviewable);
        return c->unviewable;
    }
    PyObject *v = view_of_pin(p, fd, t, f.slot, f.off, f.vlen, f.check, version);
    if (v == NULL || c->fallback == NULL || Py_TYPE(v) == &ViewType)
        return v;
    /* A value this handle has not checked before: the lease goes to the Python side, which checks it and builds the
     * view (view.first_look); dropped on the way, the lease ends the pin. */
    PyObject *out = leave_to(c, N_FIRST_LOOK, &v, 1);
    Py_DECREF(v);
    return out;
}

/* An entry's arguments from ``item``, a store.Encoded (kb, tag, body, fp, check, size, nb) or a store.Placed (and
 * its marks), into *st; -1 with an exception set. The encoding's own arithmetic is checked: a wrong size or block
 * size would aim writes past the block. */
static int arg_encoded(Core *c, PyObject *item, const char *what, Encoded *st)
{
    Py_ssize_t n = PyTuple_Check(item) ? PyTuple_GET_SIZE(item) : 0;
    if (n != 7 && n != 8) { /* a tuple: its fields stay as they are */
        PyErr_Format(PyExc_TypeError, "%s must be a store.Encoded (kb, tag, body, fp, check, size, nb), got %.100s",
                     what, Py_TYPE(item)->tp_name);
        return -1;
    }
    PyObject **a = &PyTuple_GET_ITEM(item, 0);
    st->marks = -1;
    if (arg_bytes(a[0], "kb", &st->kb, &st->klen) || arg_int(a[1], "tag", &st->tag)
        || arg_bytes(a[2], "body", &st->body, &st->blen) || arg_int(a[3], "fp", &st->fp)
        || arg_int(a[4], "check", &st->check) || arg_int(a[5], "size", &st->size) || arg_int(a[6], "nb", &st->nb)
        || (n == 8 && arg_int(a[7], "marks", &st->marks)))
        return -1;
    if (n == 8)
        st->marks &= MARK_FREQ | MARK_SMALL; /* (MARKS_VALID: any other bit is not a mark) */
    if (!encoded_ok(c, st)) {
        PyErr_Format(PyExc_ValueError, "%s: the tag, fingerprint, checksum, size or block size is inconsistent "
                                       "(encode it with Store.encode)", what);
        return -1;
    }
    return 0;
}

/* (twin: cache.py SharedCache.put) */
static PyObject *Core_put(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    Encoded st;
    int64_t now, ttl, tti;
    if (nargs_ok(nargs, 4, "put") || arg_encoded(c, args[0], "Core.put: encoded", &st)
        || arg_int(args[1], "now_ns", &now) || arg_int(args[2], "ttl_ns", &ttl) || arg_int(args[3], "tti_ns", &tti))
        return NULL;
    if (ttl < -1 || ttl > c->max_ttl || tti < -1 || tti > c->max_ttl) {
        PyErr_Format(PyExc_ValueError, "Core.put: ttl_ns and tti_ns must be -1 (the default) or 0 to %lld, got %lld "
                     "and %lld", (long long)c->max_ttl, (long long)ttl, (long long)tti);
        return NULL;
    }
    if (tti > 0 && c->ttis == NULL) {
        PyErr_SetString(PyExc_ValueError, "Core.put: a segment before layout version 14 has no idle expiry");
        return NULL;
    }
    int r = enter(c);
    if (r)
        return r < 0 ? NULL : hand_over(c, r, N_PUT, args, 4);
    r = put_locked(c, &st, now, ttl, tti);
    unlock(c);
    leave(c);
    if (r == ST_REFUSED)
        Py_RETURN_FALSE;
    if (r)
        return hand_over(c, r, N_PUT, args, 4);
    Py_RETURN_TRUE;
}

/* (twin: cache.py SharedCache.delete) */
static PyObject *Core_delete(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    const char *kb;
    int64_t klen, fp, now;
    if (key_args(args, nargs, "delete", &kb, &klen, &fp, &now))
        return NULL;
    int r = enter(c);
    if (r)
        return r < 0 ? NULL : hand_over(c, r, N_DELETE, args, 3);
    int deleted;
    r = delete_locked(c, kb, klen, fp, now, &deleted);
    unlock(c);
    leave(c);
    if (r)
        return hand_over(c, r, N_DELETE, args, 3);
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

/* The answer of a batch that stopped with ``r`` (ST_OK: every item done) after ``done`` (a new reference, or NULL
 * with an exception set: the list of what get_many found, or how many put_many stored). ``why``: the reason of a
 * hand-over, read right after the unlock (the results are built after it, running Python code: another thread's call
 * on this handle may set c->reason meanwhile). Without a fallback, (done, stop): stop None, PINNED or HANDOVER. With
 * one, the fallback's method ``name`` finishes the batch from where the C stopped: it is called with ``args`` (the
 * batch's own), ``done`` and ``waited``. */
static PyObject *batch_end(Core *c, int r, int why, PyObject *done, PyObject *name, PyObject *const *args,
                           Py_ssize_t n)
{
    if (done == NULL)
        return NULL;
    if (r)
        thread_reason = r == ST_PINNED ? WHY_PINNED : why;
    if (c->fallback == NULL)
        return Py_BuildValue("(NO)", done, r == ST_PINNED ? PINNED : r ? HANDOVER : Py_None);
    if (r == ST_OK && PyList_Check(done))
        return done;
    PyObject *out;
    if (r == ST_OK) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        PyObject *a[8];
        for (Py_ssize_t i = 0; i < n; i++)
            a[i] = args[i];
        a[n] = done;
        out = call_fallback(c, name, a, n + 1);
    }
    Py_DECREF(done);
    return out;
}

/* The results of keys[0..done) as Core.get_value returns them (``dflt`` for a miss); every body is taken. ``checked``:
 * every copy passed its checksum already (a batch read without the lock), so it is only decoded. */
static PyObject *found_list(Core *c, Lookup *keys, Py_ssize_t done, PyObject *dflt, int checked)
{
    PyObject *out = PyList_New(done);
    for (Py_ssize_t i = 0; i < done; i++) {
        Lookup *k = &keys[i];
        if (out != NULL) {
            PyObject *item = dflt;
            if (k->f.hit) { /* finish (decoded) takes the body, even when it fails */
                item = checked ? decoded(c, &k->f, k->body, 1) : finish(c, &k->f, k->body);
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

/* (twin: mapping.py LocalMapping.get_many) */
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
    int64_t *rd = reader_slot(c);
    if (rd != NULL && !c->released && c->bound) {
        /* Without the lock (_core_unlocked.c): answered only if every copy passes its checksum (one that fails under
         * a steady seq is damage, which the locked path reads again and judges); counted in the reader slot. */
        c->users++; /* rd and the arena stay mapped until leave() */
        reading(c, rd, 1);
        int u = get_many_unlocked(c, rd, keys, n, &now), ok = 1;
        reading(c, rd, 0);
        for (Py_ssize_t i = 0; u == U_DONE && ok == 1 && i < n; i++)
            if (keys[i].f.hit)
                ok = copy_ok(c, &keys[i].f, keys[i].body);
        if (u == U_DONE && ok == 1) {
            for (Py_ssize_t i = 0; i < n; i++) {
                if (keys[i].f.hit)
                    hit_unlocked(c, keys[i].f.slot, keys[i].fp);
                ADD(rd[keys[i].f.hit ? c->r_hits : c->r_misses], 1);
            }
        } else if (u >= 0 && ok >= 0) {
            ADD(rd[c->r_fallbacks], 1);
        }
        leave(c);
        if (u == U_DONE && ok == 1) {
            out = found_list(c, keys, n, args[3], 1);
            goto end;
        }
        if (u == U_DONE)
            for (Py_ssize_t i = 0; i < n; i++)
                Py_CLEAR(keys[i].body);
        if (u < 0 || ok < 0)
            goto end;
    }
    if ((r = enter(c))) {
        if (r > 0) /* a hand-over before anything was looked up */
            out = batch_end(c, r, c->reason, PyList_New(0), N_GET_MANY, args, 4);
        goto end;
    }
    r = get_many_locked(c, keys, n, now, &done);
    unlock(c);
    leave(c);
    int why = c->reason;
    if (r >= 0) {
        out = batch_end(c, r, why, found_list(c, keys, done, args[3], 0), N_GET_MANY, args, 4);
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

/* (twin: mapping.py LocalMapping.put_many) */
static PyObject *Core_put_many(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *items = NULL, *out = NULL;
    Encoded *st = NULL;
    Py_ssize_t n, done = 0, refused = 0;
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
    if (!(st = PyMem_New(Encoded, n ? n : 1))) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char what[48];
        snprintf(what, sizeof what, "Core.put_many: items[%zd]", i);
        if (arg_encoded(c, PyTuple_GET_ITEM(items, i), what, &st[i]))
            goto end;
    }
    if ((r = enter(c))) {
        if (r > 0) /* a hand-over before anything was stored */
            out = batch_end(c, r, c->reason, PyLong_FromSsize_t(0), N_PUT_MANY, args, 3);
        goto end;
    }
    r = put_many_locked(c, st, n, now, ttl, &done, &refused);
    unlock(c);
    leave(c);
    out = batch_end(c, r, c->reason, PyLong_FromSsize_t(done), N_PUT_MANY, args, 3);
    if (out != NULL && c->fallback != NULL) { /* the items not admitted: the C's, plus the fallback's of the rest */
        PyObject *sum = PyLong_FromSsize_t(refused);
        if (sum != NULL && out != Py_None)
            Py_SETREF(sum, PyNumber_Add(out, sum));
        Py_SETREF(out, sum);
    }
end:
    PyMem_Free(st);
    Py_DECREF(items);
    return out;
}

/* (twin: core.py Reference.evict_toward) */
static PyObject *Core_evict_toward(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t a[5];
    if (nargs_ok(nargs, 5, "evict_toward"))
        return NULL;
    for (int i = 0; i < 5; i++)
        if (arg_int(args[i], "evict_toward's arguments", &a[i]))
            return NULL;
    if (a[0] < 0 || a[1] < 0 || a[2] < 0 || a[3] < 0) {
        PyErr_SetString(PyExc_ValueError, "Core.evict_toward: the limits and the steps must be 0 or more");
        return NULL;
    }
    int met, r = enter(c);
    if (r)
        return r < 0 ? NULL : hand_over(c, r, N_EVICT_TOWARD, args, 5);
    r = evict_toward_locked(c, a[0], a[1], a[2], a[3], a[4], &met);
    unlock(c);
    leave(c);
    if (r)
        return hand_over(c, r, N_EVICT_TOWARD, args, 5);
    return PyBool_FromLong(met);
}

static PyObject *Core_release(Core *c, PyObject *Py_UNUSED(ignored))
{
    c->released = 1;
    c->rd = NULL;
    Py_CLEAR(c->reader);
    if (c->users == 0)
        drop_buffer(c);
    Py_RETURN_NONE;
}

/* (twin: readers.py Reader.bind) */
static PyObject *Core_use_reader(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t slot;
    if (nargs_ok(nargs, 2, "use_reader") || arg_int(args[1], "slot", &slot))
        return NULL;
    if (slot < -1 || slot >= c->reader_slots) {
        PyErr_Format(PyExc_ValueError, "slot must be -1 or below %lld, got %lld", (long long)c->reader_slots,
                     (long long)slot);
        return NULL;
    }
    c->rd = NULL;
    Py_CLEAR(c->reader);
    if (slot >= 0 && c->bound && !c->released) {
        Py_INCREF(args[0]);
        c->reader = args[0];
        c->rd = c->readers + slot * c->reader_words;
        c->rd_fork = fork_count;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_get_reason(Core *c, void *Py_UNUSED(closure))
{
    (void)c;
    return PyUnicode_FromString(why_names[thread_reason]);
}

static PyObject *Core_get_released(Core *c, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(c->released);
}

/* Each method's answers "with a fallback" are a handle's (core.path); "without" are a bare Core's (tests). */
static PyObject *Core_snapshot_plan(Core *c, PyObject *const *args, Py_ssize_t nargs);    /* _core_snapshot.c */
static PyObject *Core_snapshot_restore(Core *c, PyObject *const *args, Py_ssize_t nargs); /* _core_snapshot.c */

static PyMethodDef Core_methods[] = {
    {"get_value", (PyCFunction)(void (*)(void))Core_get_value, METH_FASTCALL,
     "get_value(kb, fp, now_ns, default) -> value | default (without a fallback: also Raw | HANDOVER)\n\nA lookup "
     "as SharedCache.get does it (now_ns: the CLOCK_MONOTONIC reading expiry is judged by; -1: Core reads the clock "
     "itself, only if an expiry needs it; the same for every method). A hit moves the entry to the front and counts "
     "a hit; a miss (or an expired entry, dropped: one a view pins stays) counts a miss and answers default. The "
     "value is copied out under the lock; after the unlock its checksum is checked, bytes are returned as they are "
     "and plain msgpack values decoded (_unpack.c). Anything else (a checksum that failed, an array or tensor, a "
     "value the decoder declines) is a Raw, which the fallback finishes (HandOver.finish); a hand-over calls the "
     "fallback's get_value with the same arguments."},
    {"get_key", (PyCFunction)(void (*)(void))Core_get_key, METH_FASTCALL,
     "get_key(key, now_ns, default) -> as get_value\n\nget_value of ``key`` as given to SharedCache.get: encoded "
     "and hashed here (a str; an EncodedKey as it is; any other key through codec.encode_key, which raises its "
     "TypeError), then as get_value(kb, fp, now_ns, default), to which a hand-over goes."},
    {"view", (PyCFunction)(void (*)(void))Core_view, METH_FASTCALL,
     "view(kb, fp, now_ns, pins) -> View | None | UNVIEWABLE (without a fallback: Lease | None | -1 | HANDOVER)"
     "\n\nThe key's entry pinned for a view (as Store.pin, through a description of pins), counted as a lookup: the "
     "View when this handle checked that stored value before, else the Lease of the pin, which the fallback looks at "
     "first (HandOver.first_look); None on a miss; UNVIEWABLE (-1) for a value view() does not serve (nothing "
     "counted or pinned)."},
    {"view_key", (PyCFunction)(void (*)(void))Core_view_key, METH_FASTCALL,
     "view_key(key, now_ns, pins) -> as view\n\nview of ``key`` as given to SharedCache.view: encoded and hashed "
     "here, as get_key does (an EncodedKey too is encoded as any bytes key), then as view(kb, fp, now_ns, pins), to "
     "which a hand-over goes."},
    {"put", (PyCFunction)(void (*)(void))Core_put, METH_FASTCALL,
     "put(encoded, now_ns, ttl_ns, tti_ns) -> bool (without a fallback: also PINNED | HANDOVER)\n\nStore encoded (a "
     "store.Encoded, or its seven fields) as SharedCache.put does under the lock (ttl_ns, tti_ns -1: the cache's "
     "defaults); "
     "False if it was not admitted (keep, full; or the room it needs is all pinned or held by open views). A view "
     "pinning the key's entry on a segment of version 11 or before (the segment consistent), and anything unusual, "
     "are handed over: the fallback's put raises PinnedError, TooLargeError, or stores it."},
    {"delete", (PyCFunction)(void (*)(void))Core_delete, METH_FASTCALL,
     "delete(kb, fp, now_ns) -> bool (without a fallback: also PINNED | HANDOVER)\n\nRemove the key, as "
     "SharedCache.delete does; True if it was present and live. A view pinning it (nothing changed) is handed over: "
     "the fallback raises PinnedError."},
    {"get_many", (PyCFunction)(void (*)(void))Core_get_many, METH_FASTCALL,
     "get_many(kbs, fps, now_ns, default) -> list (without a fallback: (found, stop))\n\nA lookup of each key "
     "(kbs[i], fingerprint fps[i]) in order under one hold of the lock, as entries.get_many_locked does: for each "
     "key, what get_value answers. A batch stopped by a hand-over at kbs[len(found)] (nothing of it counted or "
     "moved) is finished by the fallback's get_many(kbs, fps, now_ns, default, found, waited); without one, stop is "
     "None (every key looked up) or HANDOVER, and found holds Raws unfinished."},
    {"snapshot_plan", (PyCFunction)(void (*)(void))Core_snapshot_plan, METH_FASTCALL,
     "snapshot_plan(window, at, size, p, seed, tags, kinds, now_ns, state, out) -> (p, rows)\n\nA snapshot's "
     "first pass over the records whose headers are whole and right in ``window``, as snapshot._plan walks them "
     "(_core_snapshot.c says how)."},
    {"snapshot_restore", (PyCFunction)(void (*)(void))Core_snapshot_restore, METH_FASTCALL,
     "snapshot_restore(chunk, first, rows, count, seed, kinds, real_ns, now_ns) -> (stored, damaged, expired, "
     "refused, left)\n\nA snapshot's second pass over the plan's rows[0..count), as snapshot._insert makes it, "
     "under one hold of the lock (_core_snapshot.c says how)."},
    {"put_many", (PyCFunction)(void (*)(void))Core_put_many, METH_FASTCALL,
     "put_many(items, now_ns, ttl_ns) -> int (without a fallback: (done, stop))\n\nStore each item (a "
     "store.Encoded) in order under one hold of the lock, as entries.put_many_locked does, all expiring after ttl_ns "
     "(-1: the cache's default); how many were not admitted (keep, full; or the room an item needs all pinned or "
     "held by open views: passed, and the batch goes on). A hand-over (an entry above the byte limit hands over "
     "the whole batch first, and a view pinning items[done]'s key on a segment of version 11 or before hands it "
     "over with nothing of it written, reason \"pinned\") has the fallback's put_many store items[done:]. Without a "
     "fallback, done counts what was judged and stop is None or HANDOVER."},
    {"evict_toward", (PyCFunction)(void (*)(void))Core_evict_toward, METH_FASTCALL,
     "evict_toward(most_entries, most_bytes, entries_step, bytes_step, now_ns) -> bool (without a fallback: also "
     "HANDOVER)\n\nOne short hold's share of the evictions lower limits will need, as Store.evict_toward makes it: "
     "whether the cache holds at most most_entries entries of most_bytes bytes (or the rest is pinned)."},
    {"use_reader", (PyCFunction)(void (*)(void))Core_use_reader, METH_FASTCALL,
     "use_reader(owner, slot)\n\nCount reads without the lock in reader slot ``slot`` (held by ``owner``, a "
     "readers.Reader, kept while it is used); -1: read under the lock. Under lru every read takes the lock."},
    {"watch_extent", (PyCFunction)Core_watch_extent, METH_O,
     "watch_extent(cell)\n\nWrite blocks and read the arena only as far as the mapping's cell (an 8-byte writable "
     "buffer: segment.Segment.shown) says it shows the file; a store past it, or an extent in the header past it, "
     "is handed over (reason \"grow\")."},
    {"release", (PyCFunction)Core_release, METH_NOARGS,
     "Drop the buffer export (at once, or when the last call inside returns); every call after it hands over."},
    {NULL, NULL, 0, NULL},
};

static PyObject *Core_get_users(Core *c, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(c->users);
}

static PyGetSetDef Core_getset[] = {
    {"reason", (getter)Core_get_reason, NULL, "why this thread's last call was handed over (a key of REASONS)", NULL},
    {"released", (getter)Core_get_released, NULL, "whether release() was called", NULL},
    {"users", (getter)Core_get_users, NULL, "calls inside a method now (some waiting for the lock, the GIL released)",
     NULL},
    {"unlocked", (getter)Core_get_unlocked, NULL, "whether gets and views of this handle read without the lock", NULL},
    {"reader", (getter)Core_get_reader, NULL, "the readers.Reader whose slot counts those reads, or None", NULL},
    {"waits", (getter)Core_get_waits, NULL, "calls that found the lock busy and waited for it in C", NULL},
    {"holder_slot", (getter)Core_get_holder_slot, (setter)Core_set_holder_slot,
     "this handle's holder slot + 1 (lock.HolderSlot.number; 0: none), stored in the lock's holder word by each hold",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmcache._core.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Core(buffer, offsets, live_fd, timeout_ns, fallback=None): the compiled get, put, delete, "
              "view and batches of a segment; fallback: the core.HandOver it hands over to.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_weaklistoffset = offsetof(Core, weakreflist),
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
};
