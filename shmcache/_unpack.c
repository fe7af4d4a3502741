/* A msgpack decoder for the values a get returns most: nil, booleans, integers, floats, str, bin, arrays and maps of
 * these, and the ext types of tuples (1), sets (11), frozensets (12) and the standard library's scalars
 * (stdtypes.py: datetime 5, date 6, time 7, timedelta 8, Decimal 9, UUID 10, complex 13), decoded exactly as
 * codec.py's decoder (msgpack.unpackb with raw=False, strict_map_key=False and codec._ext_hook) decodes them,
 * without its per-call set-up (keyword arguments, an ext hook called per ext, an unpacker context).
 *
 * It declines (returns NULL with no exception set) whatever it does not decode itself: the other ext types (arrays,
 * big ints, tensors, timestamps), the unused byte 0xC1, nesting deeper than MAX_DEPTH, bytes that are truncated or
 * followed by more, invalid UTF-8, an unhashable map key or set item, a length larger than the bytes left, and any
 * field of an ext type that its constructor refuses or stdtypes.py calls malformed. The caller then runs codec.py's
 * decoder, which decodes the value or raises the ValueError that names the damage. So this file never has to judge
 * damaged bytes; it only has to read no byte past the end, which every length is checked against before use, and to
 * decline whatever codec.py would not return as it is. It runs after the cache lock is released, on a private copy
 * of the value. tests/test_unpack.py holds it to codec.py on valid, damaged and random bytes.
 *
 * Map keys that are short ASCII strings are taken from a small cache of str objects (msgpack interns map keys for
 * the same reason: records repeat their field names), so decoding a record allocates its values alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "datetime.h"

#include "_unpack.h"

#define MAX_DEPTH 32       /* codec._MAX_DEPTH: deeper values are codec.py's to decode */
#define US_PER_DAY 86400000000LL

/* The ext codes (codec.py, stdtypes.py). */
enum { EXT_TUPLE = 1, EXT_DATETIME = 5, EXT_DATE = 6, EXT_TIME = 7, EXT_TIMEDELTA = 8, EXT_DECIMAL = 9, EXT_UUID = 10,
       EXT_SET = 11, EXT_FROZENSET = 12, EXT_COMPLEX = 13 };
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

/* Little-endian n bytes (stdtypes.py's formats). */
static inline uint64_t le(const unsigned char *p, int n)
{
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static PyObject *decimal_type, *uuid_type, *bytes_kw; /* taken once, kept for the life of the process */

/* The datetime C API, decimal.Decimal and uuid.UUID: 0 once they are at hand, -1 (exception set) if not. */
static int ready(void)
{
    if (uuid_type != NULL)
        return 0;
    if (PyDateTimeAPI == NULL) {
        PyDateTime_IMPORT;
        if (PyDateTimeAPI == NULL)
            return -1;
    }
    PyObject *m = PyImport_ImportModule("decimal");
    if (m == NULL)
        return -1;
    PyObject *dec = PyObject_GetAttrString(m, "Decimal");
    Py_DECREF(m);
    if (dec == NULL)
        return -1;
    PyObject *kw = Py_BuildValue("(s)", "bytes");
    m = PyImport_ImportModule("uuid");
    PyObject *u = m == NULL ? NULL : PyObject_GetAttrString(m, "UUID");
    Py_XDECREF(m);
    if (kw == NULL || u == NULL) {
        Py_DECREF(dec);
        Py_XDECREF(kw);
        Py_XDECREF(u);
        return -1;
    }
    decimal_type = dec;
    bytes_kw = kw;
    uuid_type = u; /* Ordering: last, as the flag that the others are set */
    return 0;
}

/* The items of a tuple or set: the ext's data is one msgpack array and nothing else (codec._items). */
static PyObject *items(const unsigned char *p, int64_t n, int depth)
{
    Reader s = {p, p + n};
    PyObject *list = value(&s, depth + 1, 0);
    if (list != NULL && (!PyList_CheckExact(list) || s.p != s.end))
        Py_CLEAR(list);
    return list;
}

/* A zone part (stdtypes._tzinfo): None (new reference) when empty; NULL to decline. */
static PyObject *zone(const unsigned char *z, int64_t n)
{
    if (n == 0)
        Py_RETURN_NONE;
    if (n < 8)
        return NULL;
    int64_t us = (int64_t)le(z, 8);
    if (us <= -US_PER_DAY || us >= US_PER_DAY)
        return NULL;
    int64_t days = us < 0 ? -1 : 0, rem = us - days * US_PER_DAY; /* |us| < a day: floor division by a day */
    PyObject *offset = PyDelta_FromDSU((int)days, (int)(rem / 1000000), (int)(rem % 1000000));
    if (offset == NULL)
        return NULL;
    PyObject *tz = PyTimeZone_FromOffset(offset);
    if (tz == NULL || n == 8) {
        Py_DECREF(offset);
        return tz;
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)z + 8, (Py_ssize_t)(n - 8), NULL);
    PyObject *plain = name == NULL ? NULL : PyObject_CallMethod(tz, "tzname", "O", Py_None);
    Py_DECREF(tz);
    tz = NULL;
    /* A name that is its offset's default one is never written (stdtypes._zone): malformed, so codec.py's. */
    if (plain != NULL && PyUnicode_Check(plain) && PyUnicode_Compare(plain, name) != 0 && !PyErr_Occurred())
        tz = PyTimeZone_FromOffsetAndName(offset, name);
    Py_XDECREF(plain);
    Py_XDECREF(name);
    Py_DECREF(offset);
    return tz;
}

static PyObject *datetime_of(const unsigned char *p, int64_t n)
{
    if (n < 12 || le(p + 8, 4) >= 1000000)
        return NULL;
    PyObject *tz = zone(p + 12, n - 12);
    if (tz == NULL)
        return NULL;
    /* Every other field is checked by the constructor, as datetime() checks it, fold included. */
    PyObject *v = PyDateTimeAPI->DateTime_FromDateAndTimeAndFold((int)le(p, 2), p[2], p[3], p[4], p[5], p[6],
                                                                 (int)le(p + 8, 4), tz, p[7],
                                                                 PyDateTimeAPI->DateTimeType);
    Py_DECREF(tz);
    return v;
}

static PyObject *time_of(const unsigned char *p, int64_t n)
{
    if (n < 8 || le(p + 4, 4) >= 1000000)
        return NULL;
    PyObject *tz = zone(p + 8, n - 8);
    if (tz == NULL)
        return NULL;
    PyObject *v = PyDateTimeAPI->Time_FromTimeAndFold(p[0], p[1], p[2], (int)le(p + 4, 4), tz, p[3],
                                                      PyDateTimeAPI->TimeType);
    Py_DECREF(tz);
    return v;
}

static PyObject *timedelta_of(const unsigned char *p, int64_t n)
{
    if (n != 12)
        return NULL;
    uint64_t seconds = le(p + 4, 4), us = le(p + 8, 4);
    if (seconds >= 86400 || us >= 1000000)
        return NULL;
    return PyDelta_FromDSU((int)(int32_t)le(p, 4), (int)seconds, (int)us); /* OverflowError past 999999999 days */
}

static PyObject *decimal_of(const unsigned char *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (p[i] >= 0x80)
            return NULL;
    PyObject *text = PyUnicode_DecodeASCII((const char *)p, (Py_ssize_t)n, NULL);
    if (text == NULL)
        return NULL;
    PyObject *d = PyObject_CallOneArg(decimal_type, text);
    PyObject *back = d == NULL ? NULL : PyObject_Str(d);
    /* Only the canonical text (a syntax error under a context that traps nothing gives a NaN, whose text differs) */
    if (back == NULL || PyUnicode_Compare(back, text) != 0 || PyErr_Occurred())
        Py_CLEAR(d);
    Py_XDECREF(back);
    Py_DECREF(text);
    return d;
}

static PyObject *uuid_of(const unsigned char *p, int64_t n)
{
    if (n != 16)
        return NULL;
    PyObject *b = PyBytes_FromStringAndSize((const char *)p, 16);
    if (b == NULL)
        return NULL;
    PyObject *args[] = {b};
    PyObject *u = PyObject_Vectorcall(uuid_type, args, 0, bytes_kw); /* uuid.UUID(bytes=b) */
    Py_DECREF(b);
    return u;
}

static PyObject *complex_of(const unsigned char *p, int64_t n)
{
    if (n != 16)
        return NULL;
    uint64_t re = le(p, 8), im = le(p + 8, 8);
    double a, b;
    memcpy(&a, &re, 8);
    memcpy(&b, &im, 8);
    return PyComplex_FromDoubles(a, b);
}

/* An ext of n data bytes (its type byte next), or NULL to decline. */
static PyObject *ext(Reader *r, int64_t n, int depth)
{
    const unsigned char *at = take(r, 1);
    if (n < 0 || at == NULL || depth >= MAX_DEPTH)
        return NULL;
    int code = (int8_t)*at;
    const unsigned char *p = take(r, (uint64_t)n);
    if (p == NULL || ready() < 0)
        return NULL;
    PyObject *list, *v;
    switch (code) {
    case EXT_TUPLE:
    case EXT_SET:
    case EXT_FROZENSET:
        if ((list = items(p, n, depth)) == NULL)
            return NULL;
        v = code == EXT_TUPLE ? PyList_AsTuple(list) : code == EXT_SET ? PySet_New(list) : PyFrozenSet_New(list);
        Py_DECREF(list);
        return v; /* an unhashable item: NULL, so codec.py's (which calls it malformed) */
    case EXT_DATETIME:
        return datetime_of(p, n);
    case EXT_DATE:
        return n == 4 ? PyDate_FromDate((int)le(p, 2), p[2], p[3]) : NULL;
    case EXT_TIME:
        return time_of(p, n);
    case EXT_TIMEDELTA:
        return timedelta_of(p, n);
    case EXT_DECIMAL:
        return decimal_of(p, n);
    case EXT_UUID:
        return uuid_of(p, n);
    case EXT_COMPLEX:
        return complex_of(p, n);
    default: /* arrays, big ints, tensors, timestamps, unknown codes: codec.py's */
        return NULL;
    }
}

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
    case 0xc7:
    case 0xc8:
    case 0xc9:
        return ext(r, length(r, 1 << (b - 0xc7)), depth);
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        return ext(r, (int64_t)1 << (b - 0xd4), depth);
    default: /* 0xc1: never used */
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
