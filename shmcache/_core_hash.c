/* Twin of codec.py (xxh3): XXH3-64 computed in C where a key is encoded (Core.get_key, view_key), a value's
 * checksum checked and a snapshot's records read (_core_snapshot.c), without a call of xxhash's Python function (its
 * argument parsing alone costs more than a short hash). The algorithm is XXH3's, as its specification states it: for
 * inputs of at most 240 bytes XXH3_len_0to16, 17to128 and 129to240 with the default secret; for longer ones the
 * striped accumulation over 1024-byte blocks (XXH3_hashLong_64b), with the secret the seed derives from the default
 * one (XXH3_initCustomSecret) when the seed is not 0. Every answer equals xxhash's xxh3_64_intdigest(data, seed):
 * tests/test_core.py holds each length to it, for a process on the compiled path must find the entries one on the
 * pure path stored. */

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define XXH3_SHORT_MAX 240
#define XXH3_SECRET_NBYTES 192
#define XXH3_STRIPE 64
#define XXH3_BLOCK (XXH3_STRIPE * ((XXH3_SECRET_NBYTES - XXH3_STRIPE) / 8)) /* 16 stripes, the secret 8 on each */

/* XXH3's default secret ("kSecret"); inputs of up to 240 bytes read its first 136. */
static const uint8_t xxh3_secret[XXH3_SECRET_NBYTES] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define XXH_P32_1 0x9E3779B1U
#define XXH_P64_1 0x9E3779B185EBCA87ULL
#define XXH_P64_2 0xC2B2AE3D27D4EB4FULL
#define XXH_P64_3 0x165667B19E3779F9ULL
#define XXH_P64_4 0x85EBCA77C2B2AE63ULL
#define XXH_P64_5 0x27D4EB2F165667C5ULL
#define XXH_P32_2 0x85EBCA77U
#define XXH_P32_3 0xC2B2AE3DU
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

/* One 64-byte stripe into the eight accumulators, against the secret at ``sec`` (XXH3_accumulate_512). */
static inline void xxh3_stripe(uint64_t *restrict acc, const uint8_t *restrict in, const uint8_t *restrict sec)
{
#if defined(__SSE2__)
    /* The same arithmetic two lanes at a time, as xxhash's SSE2 path does it (every x86-64 has SSE2): 32x32->64
     * multiplies of each word's halves, and each lane's input word added to its neighbour's accumulator. */
    __m128i *xacc = (__m128i *)acc;
    for (int i = 0; i < 4; i++) {
        __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(in + 16 * i));
        __m128i k = _mm_xor_si128(d, _mm_loadu_si128((const __m128i *)(const void *)(sec + 16 * i)));
        __m128i product = _mm_mul_epu32(k, _mm_shuffle_epi32(k, _MM_SHUFFLE(0, 3, 0, 1)));
        __m128i sum = _mm_add_epi64(_mm_loadu_si128(xacc + i), _mm_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2)));
        _mm_storeu_si128(xacc + i, _mm_add_epi64(product, sum));
    }
#else
    for (int i = 0; i < 8; i++) {
        uint64_t d = xxh_le64(in + 8 * i), k = d ^ xxh_le64(sec + 8 * i);
        acc[i ^ 1] += d;
        acc[i] += (uint64_t)(uint32_t)k * (k >> 32);
    }
#endif
}

/* After each block (XXH3_scrambleAcc). */
static inline void xxh3_scramble(uint64_t *restrict acc, const uint8_t *restrict sec)
{
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= xxh_le64(sec + 8 * i);
        acc[i] = a * XXH_P32_1;
    }
}

/* The accumulation of every stripe of ``len`` (more than XXH3_SHORT_MAX) bytes at ``p``, against secret ``s``: each
 * whole block's stripes then a scramble, the last block's whole stripes, then the input's last 64 bytes (they may
 * overlap the stripes before) against the secret's end less 7. */
#define XXH3_STRIPES(stripe, scramble)                                                                             \
    do {                                                                                                           \
        const size_t stripes_ = (XXH3_SECRET_NBYTES - XXH3_STRIPE) / 8, blocks_ = (len - 1) / XXH3_BLOCK;          \
        for (size_t b_ = 0; b_ < blocks_; b_++) {                                                                  \
            for (size_t n_ = 0; n_ < stripes_; n_++)                                                               \
                stripe(acc, p + b_ * XXH3_BLOCK + n_ * XXH3_STRIPE, s + n_ * 8);                                   \
            scramble(acc, s + XXH3_SECRET_NBYTES - XXH3_STRIPE);                                                   \
        }                                                                                                          \
        size_t last_ = ((len - 1) - XXH3_BLOCK * blocks_) / XXH3_STRIPE;                                           \
        for (size_t n_ = 0; n_ < last_; n_++)                                                                      \
            stripe(acc, p + blocks_ * XXH3_BLOCK + n_ * XXH3_STRIPE, s + n_ * 8);                                  \
        stripe(acc, p + len - XXH3_STRIPE, s + XXH3_SECRET_NBYTES - XXH3_STRIPE - 7);                              \
    } while (0)

static void xxh3_accumulate(uint64_t *restrict acc, const uint8_t *restrict p, size_t len,
                            const uint8_t *restrict s)
{
    XXH3_STRIPES(xxh3_stripe, xxh3_scramble);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The same with AVX2 (xxhash's AVX2 path: four lanes at a time) and AVX-512 where the processor has them, chosen
 * once at run time (xxh3_long): four to five times the SSE2 loop's speed on long values. */
#include <immintrin.h>
#define XXH3_AVX2 1

__attribute__((target("avx2"))) static inline void xxh3_stripe_avx2(uint64_t *restrict acc,
                                                                     const uint8_t *restrict in,
                                                                     const uint8_t *restrict sec)
{
    __m256i *xacc = (__m256i *)acc;
    for (int i = 0; i < 2; i++) {
        __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(in + 32 * i));
        __m256i k = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)(const void *)(sec + 32 * i)));
        __m256i product = _mm256_mul_epu32(k, _mm256_srli_epi64(k, 32));
        __m256i sum = _mm256_add_epi64(_mm256_loadu_si256(xacc + i), _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2)));
        _mm256_storeu_si256(xacc + i, _mm256_add_epi64(product, sum));
    }
}

__attribute__((target("avx2"))) static inline void xxh3_scramble_avx2(uint64_t *restrict acc,
                                                                       const uint8_t *restrict sec)
{
    __m256i *xacc = (__m256i *)acc;
    const __m256i prime = _mm256_set1_epi32((int)XXH_P32_1);
    for (int i = 0; i < 2; i++) {
        __m256i a = _mm256_loadu_si256(xacc + i);
        a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
        __m256i k = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(const void *)(sec + 32 * i)));
        __m256i lo = _mm256_mul_epu32(k, prime), hi = _mm256_mul_epu32(_mm256_srli_epi64(k, 32), prime);
        _mm256_storeu_si256(xacc + i, _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32)));
    }
}

__attribute__((target("avx2"))) static void xxh3_accumulate_avx2(uint64_t *restrict acc, const uint8_t *restrict p,
                                                                  size_t len, const uint8_t *restrict s)
{
    XXH3_STRIPES(xxh3_stripe_avx2, xxh3_scramble_avx2);
}

/* And with AVX-512: the eight accumulators in one register. */
__attribute__((target("avx512f"))) static inline void xxh3_stripe_avx512(uint64_t *restrict acc,
                                                                         const uint8_t *restrict in,
                                                                         const uint8_t *restrict sec)
{
    __m512i d = _mm512_loadu_si512((const void *)in);
    __m512i k = _mm512_xor_si512(d, _mm512_loadu_si512((const void *)sec));
    __m512i product = _mm512_mul_epu32(k, _mm512_srli_epi64(k, 32));
    __m512i sum = _mm512_add_epi64(_mm512_loadu_si512((const void *)acc),
                                   _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2)));
    _mm512_storeu_si512((void *)acc, _mm512_add_epi64(product, sum));
}

__attribute__((target("avx512f"))) static inline void xxh3_scramble_avx512(uint64_t *restrict acc,
                                                                           const uint8_t *restrict sec)
{
    const __m512i prime = _mm512_set1_epi32((int)XXH_P32_1);
    __m512i a = _mm512_loadu_si512((const void *)acc);
    a = _mm512_xor_si512(a, _mm512_srli_epi64(a, 47));
    __m512i k = _mm512_xor_si512(a, _mm512_loadu_si512((const void *)sec));
    __m512i lo = _mm512_mul_epu32(k, prime), hi = _mm512_mul_epu32(_mm512_srli_epi64(k, 32), prime);
    _mm512_storeu_si512((void *)acc, _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32)));
}

__attribute__((target("avx512f"))) static void xxh3_accumulate_avx512(uint64_t *restrict acc,
                                                                      const uint8_t *restrict p, size_t len,
                                                                      const uint8_t *restrict s)
{
    XXH3_STRIPES(xxh3_stripe_avx512, xxh3_scramble_avx512);
}
#endif

/* XXH3-64 of ``len`` (more than XXH3_SHORT_MAX) bytes at ``p`` with ``seed`` (XXH3_hashLong_64b); ``portable``: 0,
 * the widest loop the processor runs; 1, none wider than AVX2; 2, none wider than SSE2 (the tests hold each loop
 * to xxhash). */
static uint64_t xxh3_long(const uint8_t *p, size_t len, uint64_t seed, int portable)
{
    uint8_t custom[XXH3_SECRET_NBYTES];
    const uint8_t *s = xxh3_secret;
    if (seed != 0) { /* the secret this seed derives: each 16 bytes' first word plus the seed, second minus it */
        for (int i = 0; i < XXH3_SECRET_NBYTES; i += 16) {
            uint64_t lo = xxh_le64(xxh3_secret + i) + seed, hi = xxh_le64(xxh3_secret + i + 8) - seed;
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            lo = __builtin_bswap64(lo);
            hi = __builtin_bswap64(hi);
#endif
            memcpy(custom + i, &lo, 8);
            memcpy(custom + i + 8, &hi, 8);
        }
        s = custom;
    }
    uint64_t acc[8] __attribute__((aligned(32))) = {XXH_P32_3, XXH_P64_1, XXH_P64_2, XXH_P64_3,
                                                    XXH_P64_4, XXH_P32_2, XXH_P64_5, XXH_P32_1};
#ifdef XXH3_AVX2
    static int simd = -1; /* 2: AVX-512, 1: AVX2, 0: neither; a race between threads writes the same answer */
    if (simd < 0)
        simd = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
    if (simd == 2 && portable < 2)
        xxh3_accumulate_avx512(acc, p, len, s);
    else if (simd >= 1 && portable < 1)
        xxh3_accumulate_avx2(acc, p, len, s);
    else
#endif
        xxh3_accumulate(acc, p, len, s);
    (void)portable;
    uint64_t h = (uint64_t)len * XXH_P64_1;
    for (int i = 0; i < 4; i++) /* XXH3_mergeAccs, from the secret's byte 11 */
        h += xxh_fold64(acc[2 * i] ^ xxh_le64(s + 11 + 16 * i), acc[2 * i + 1] ^ xxh_le64(s + 11 + 16 * i + 8));
    return xxh3_avalanche(h);
}

/* XXH3-64 of ``len`` bytes at ``p`` with ``seed``, any length. */
static inline uint64_t xxh3_64(const uint8_t *p, size_t len, uint64_t seed)
{
    return len <= XXH3_SHORT_MAX ? xxh3_short(p, len, seed) : xxh3_long(p, len, seed, 0);
}

/* _core.xxh3(data, seed=0, portable=0): xxh3_64, for the tests that hold it to xxhash (portable: xxh3_long's). */
static PyObject *mod_xxh3(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "xxh3(data, seed=0, portable=0)");
        return NULL;
    }
    int portable = nargs == 3 ? PyLong_AsLong(args[2]) : 0;
    if (portable == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long seed = 0;
    if (nargs >= 2) {
        seed = PyLong_AsUnsignedLongLong(args[1]);
        if (seed == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = b.len <= XXH3_SHORT_MAX ? xxh3_short((const uint8_t *)b.buf, (size_t)b.len, seed)
                                : xxh3_long((const uint8_t *)b.buf, (size_t)b.len, seed, portable);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(h);
}
