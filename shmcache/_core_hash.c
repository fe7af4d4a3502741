/* Twin of codec.py (xxh3): XXH3-64 of short inputs, computed in C where a key is encoded (Core.get_key,
 * view_key) and a short value's checksum checked, without a call of xxhash's Python function (its argument parsing
 * alone costs more than the hash). The algorithm is XXH3's, as its specification states it for inputs of at most
 * 240 bytes (XXH3_len_0to16, 17to128, 129to240 with the default secret); a longer input goes to xxhash, the one
 * implementation of every length. Every answer equals xxhash's xxh3_64_intdigest(data, seed): tests/test_core.py
 * holds each length to it, for a process on the compiled path must find the entries one on the pure path stored. */

#define XXH3_SHORT_MAX 240

/* The first 136 bytes of XXH3's default secret ("kSecret"): all that inputs of up to 240 bytes read. */
static const uint8_t xxh3_secret[136] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3,
};

#define XXH_P32_1 0x9E3779B1U
#define XXH_P64_1 0x9E3779B185EBCA87ULL
#define XXH_P64_2 0xC2B2AE3D27D4EB4FULL
#define XXH_P64_3 0x165667B19E3779F9ULL
#define XXH_MX1 0x165667919E3779F9ULL
#define XXH_MX2 0x9FB21C651E98DF25ULL

/* Little-endian reads at any alignment (memcpy: one load where the target allows it; a byte swap on a big-endian
 * one, as the specification reads every word little-endian). */
static inline uint32_t xxh_le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t xxh_rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

/* The 128-bit product of a and b, its two halves xored. */
static inline uint64_t xxh_fold64(uint64_t a, uint64_t b)
{
    unsigned __int128 m = (unsigned __int128)a * b;
    return (uint64_t)m ^ (uint64_t)(m >> 64);
}

static inline uint64_t xxh64_avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= XXH_P64_2;
    h ^= h >> 29;
    h *= XXH_P64_3;
    return h ^ (h >> 32);
}

static inline uint64_t xxh3_avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= XXH_MX1;
    return h ^ (h >> 32);
}

static inline uint64_t xxh3_rrmxmx(uint64_t h, uint64_t len)
{
    h ^= xxh_rotl64(h, 49) ^ xxh_rotl64(h, 24);
    h *= XXH_MX2;
    h ^= (h >> 35) + len;
    h *= XXH_MX2;
    return h ^ (h >> 28);
}

static inline uint64_t xxh3_mix16(const uint8_t *in, const uint8_t *sec, uint64_t seed)
{
    return xxh_fold64(xxh_le64(in) ^ (xxh_le64(sec) + seed), xxh_le64(in + 8) ^ (xxh_le64(sec + 8) - seed));
}

/* XXH3-64 of ``len`` (at most XXH3_SHORT_MAX) bytes at ``p`` with ``seed``. */
static uint64_t xxh3_short(const uint8_t *p, size_t len, uint64_t seed)
{
    const uint8_t *s = xxh3_secret;
    if (len == 0)
        return xxh64_avalanche(seed ^ (xxh_le64(s + 56) ^ xxh_le64(s + 64)));
    if (len <= 3) {
        uint32_t combined = ((uint32_t)p[0] << 16) | ((uint32_t)p[len >> 1] << 24) | (uint32_t)p[len - 1]
                            | ((uint32_t)len << 8);
        uint64_t flip = (uint64_t)(xxh_le32(s) ^ xxh_le32(s + 4)) + seed;
        return xxh64_avalanche((uint64_t)combined ^ flip);
    }
    if (len <= 8) {
        seed ^= (uint64_t)__builtin_bswap32((uint32_t)seed) << 32;
        uint64_t flip = (xxh_le64(s + 8) ^ xxh_le64(s + 16)) - seed;
        uint64_t in64 = (uint64_t)xxh_le32(p + len - 4) + ((uint64_t)xxh_le32(p) << 32);
        return xxh3_rrmxmx(in64 ^ flip, len);
    }
    if (len <= 16) {
        uint64_t lo = xxh_le64(p) ^ ((xxh_le64(s + 24) ^ xxh_le64(s + 32)) + seed);
        uint64_t hi = xxh_le64(p + len - 8) ^ ((xxh_le64(s + 40) ^ xxh_le64(s + 48)) - seed);
        uint64_t acc = len + __builtin_bswap64(lo) + hi + xxh_fold64(lo, hi);
        return xxh3_avalanche(acc);
    }
    uint64_t acc = len * XXH_P64_1;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += xxh3_mix16(p + 48, s + 96, seed);
                    acc += xxh3_mix16(p + len - 64, s + 112, seed);
                }
                acc += xxh3_mix16(p + 32, s + 64, seed);
                acc += xxh3_mix16(p + len - 48, s + 80, seed);
            }
            acc += xxh3_mix16(p + 16, s + 32, seed);
            acc += xxh3_mix16(p + len - 32, s + 48, seed);
        }
        acc += xxh3_mix16(p, s, seed);
        acc += xxh3_mix16(p + len - 16, s + 16, seed);
        return xxh3_avalanche(acc);
    }
    /* 129 to 240 bytes: eight rounds, an avalanche, the rounds left over the secret shifted by 3, and the last 16
     * bytes against the secret's bytes 119 to 135 (its minimum size, 136, less 17). */
    size_t rounds = len / 16;
    for (size_t i = 0; i < 8; i++)
        acc += xxh3_mix16(p + 16 * i, s + 16 * i, seed);
    acc = xxh3_avalanche(acc);
    for (size_t i = 8; i < rounds; i++)
        acc += xxh3_mix16(p + 16 * i, s + 16 * (i - 8) + 3, seed);
    acc += xxh3_mix16(p + len - 16, s + 119, seed);
    return xxh3_avalanche(acc);
}

/* _core.xxh3_short(data, seed=0): xxh3_short, for the tests that hold it to xxhash. */
static PyObject *mod_xxh3_short(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "xxh3_short(data, seed=0)");
        return NULL;
    }
    unsigned long long seed = 0;
    if (nargs == 2) {
        seed = PyLong_AsUnsignedLongLong(args[1]);
        if (seed == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    if (b.len > XXH3_SHORT_MAX)
        PyErr_Format(PyExc_ValueError, "xxh3_short hashes at most %d bytes, got %zd", XXH3_SHORT_MAX, b.len);
    else
        out = PyLong_FromUnsignedLongLong(xxh3_short((const uint8_t *)b.buf, (size_t)b.len, seed));
    PyBuffer_Release(&b);
    return out;
}
