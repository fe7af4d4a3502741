/* A msgpack decoder for the plain values a get returns most: nil, booleans, integers, floats, str, bin, and arrays
 * and maps of these, decoded exactly as codec.py's decoder (msgpack.unpackb with raw=False, strict_map_key=False)
 * decodes them, without its per-call set-up (keyword arguments, an ext hook, an unpacker context).
 *
 * It declines (returns NULL with no exception set) whatever it does not decode itself: any ext type (tuples, arrays,
 * big ints, tensors, timestamps), the unused byte 0xC1, nesting deeper than MAX_DEPTH, bytes that are truncated or
 * followed by more, invalid UTF-8, an unhashable map key, a length larger than the bytes left. The caller then runs
 * codec.py's decoder, which decodes the value or raises the ValueError that names the damage. So this file never
 * has to judge damaged bytes; it only has to read no byte past the end, which every length is checked against
 * before use. It runs after the cache lock is released, on a private copy of the value.
 *
 * Map keys that are short ASCII strings are taken from a small cache of str objects (msgpack interns map keys for
 * the same reason: records repeat their field names), so decoding a record allocates its values alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_unpack.h"

#define MAX_DEPTH 32       /* codec._MAX_DEPTH: deeper values are codec.py's to decode */
#define KEY_CACHE 512      /* slots of the map key cache (a power of two) */
#define KEY_CACHE_MAXLEN 32

typedef struct {
    const unsigned char *p, *end;
} Reader;

static PyObject *key_cache[KEY_CACHE];

static inline uint64_t be(const unsigned char *p, int n)
{
    uint64_t x = 0;
    for (int i = 0; i < n; i++)
        x = (x << 8) | p[i];
    return x;
}

/* Take n bytes: a pointer to them, or NULL if fewer are left. */
static inline const unsigned char *take(Reader *r, uint64_t n)
{
    if (n > (uint64_t)(r->end - r->p))
        return NULL;
    const unsigned char *at = r->p;
    r->p += n;
    return at;
}

/* A length of n big-endian bytes. -1: truncated. */
static inline int64_t length(Reader *r, int n)
{
    const unsigned char *at = take(r, (uint64_t)n);
    return at == NULL ? -1 : (int64_t)be(at, n);
}

static PyObject *str_of(const unsigned char *s, int64_t n)
{
    return PyUnicode_DecodeUTF8((const char *)s, (Py_ssize_t)n, NULL);
}

/* A map key that is a str: from the cache when it is short ASCII. */
static PyObject *key_str(const unsigned char *s, int64_t n)
{
    if (n > KEY_CACHE_MAXLEN)
        return str_of(s, n);
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) {
        if (s[i] >= 0x80)
            return str_of(s, n);
        h = (h ^ s[i]) * 16777619u;
    }
    PyObject **slot = &key_cache[h & (KEY_CACHE - 1)];
    PyObject *k = *slot;
    if (k != NULL && PyUnicode_GET_LENGTH(k) == n && memcmp(PyUnicode_DATA(k), s, (size_t)n) == 0) {
        Py_INCREF(k);
        return k;
    }
    k = str_of(s, n);
    if (k != NULL) {
        Py_XSETREF(*slot, k);
        Py_INCREF(k);
    }
    return k;
}

static PyObject *value(Reader *r, int depth, int is_key);

static PyObject *array(Reader *r, int64_t n, int depth)
{
    if (n < 0 || n > r->end - r->p) /* each item takes a byte at least */
        return NULL;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *item = value(r, depth + 1, 0);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static PyObject *map(Reader *r, int64_t n, int depth)
{
    if (n < 0 || n > (r->end - r->p) / 2)
        return NULL;
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *k = value(r, depth + 1, 1);
        if (k == NULL)
            goto fail;
        PyObject *v = value(r, depth + 1, 0);
        if (v == NULL) {
            Py_DECREF(k);
            goto fail;
        }
        int rc = PyDict_SetItem(dict, k, v); /* an unhashable key fails here */
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0)
            goto fail;
    }
    return dict;
fail:
    Py_DECREF(dict);
    return NULL;
}

static PyObject *raw(Reader *r, int64_t n, int is_str, int is_key)
{
    if (n < 0)
        return NULL;
    const unsigned char *s = take(r, (uint64_t)n);
    if (s == NULL)
        return NULL;
    if (!is_str)
        return PyBytes_FromStringAndSize((const char *)s, (Py_ssize_t)n);
    return is_key ? key_str(s, n) : str_of(s, n);
}

static PyObject *value(Reader *r, int depth, int is_key)
{
    if (depth > MAX_DEPTH || r->p >= r->end)
        return NULL;
    unsigned int b = *r->p++;
    const unsigned char *at;
    if (b <= 0x7f)
        return PyLong_FromLong((long)b);
    if (b >= 0xe0)
        return PyLong_FromLong((long)(int8_t)b);
    if (b <= 0x8f)
        return map(r, b & 0x0f, depth);
    if (b <= 0x9f)
        return array(r, b & 0x0f, depth);
    if (b <= 0xbf)
        return raw(r, b & 0x1f, 1, is_key);
    switch (b) {
    case 0xc0:
        Py_RETURN_NONE;
    case 0xc2:
        Py_RETURN_FALSE;
    case 0xc3:
        Py_RETURN_TRUE;
    case 0xc4:
    case 0xc5:
    case 0xc6:
        return raw(r, length(r, 1 << (b - 0xc4)), 0, 0);
    case 0xca:
        if ((at = take(r, 4)) == NULL)
            return NULL;
        {
            uint32_t u = (uint32_t)be(at, 4);
            float f;
            memcpy(&f, &u, 4);
            return PyFloat_FromDouble((double)f);
        }
    case 0xcb:
        if ((at = take(r, 8)) == NULL)
            return NULL;
        {
            uint64_t u = be(at, 8);
            double d;
            memcpy(&d, &u, 8);
            return PyFloat_FromDouble(d);
        }
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf: {
        int n = 1 << (b - 0xcc);
        if ((at = take(r, (uint64_t)n)) == NULL)
            return NULL;
        return PyLong_FromUnsignedLongLong((unsigned long long)be(at, n));
    }
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: {
        int n = 1 << (b - 0xd0);
        if ((at = take(r, (uint64_t)n)) == NULL)
            return NULL;
        uint64_t u = be(at, n);
        int shift = 64 - 8 * n; /* sign-extend the n-byte two's complement */
        return PyLong_FromLongLong((long long)((int64_t)(u << shift) >> shift));
    }
    case 0xd9:
    case 0xda:
    case 0xdb:
        return raw(r, length(r, 1 << (b - 0xd9)), 1, is_key);
    case 0xdc:
    case 0xdd:
        return array(r, length(r, b == 0xdc ? 2 : 4), depth);
    case 0xde:
    case 0xdf:
        return map(r, length(r, b == 0xde ? 2 : 4), depth);
    default: /* 0xc1 (never used) and every ext: codec.py's */
        return NULL;
    }
}

PyObject *shm_unpack(const char *data, Py_ssize_t n)
{
    Reader r = {(const unsigned char *)data, (const unsigned char *)data + n};
    PyObject *v = value(&r, 0, 0);
    if (v != NULL && r.p != r.end) { /* bytes left over: msgpack's ExtraData */
        Py_DECREF(v);
        v = NULL;
    }
    if (v == NULL)
        PyErr_Clear(); /* declined: codec.py decodes it, or raises what is wrong */
    return v;
}
