/* shmcache._core, a snapshot's restore: the first pass's walk over the record headers, and the second pass's checks
 * and stores, without a Python object made per record.
 * Twin of snapshot.py (_plan), snapshot.py (_insert_rows) and snapshot.py (_store).
 * A part of the one translation unit _core.c (see there). Both passes run over a window of the file that
 * snapshot.py read (bytes it owns: nothing here reads the file or past the window), and stop at anything but the
 * common case, a record whose header and bytes are whole and right, leaving it to the Python code, which is the
 * reference: tests/test_snapshot.py holds the two to the same answers on the same files, damaged ones included.
 * Every byte of the window is the file's, so hostile: a length steers nothing but a bounds check against the
 * window before any read. */

/* A record's fixed fields (snapshot.py _RECORD, then its check): sync, key_nbytes, body_nbytes, tag, flags,
 * reserved, expires_ns, check. */
enum { REC_HEAD = 24, REC_HEAD_CHECKED = 32, REC_CHECK = 8, REC_ROW = 9 };
static const uint8_t rec_sync[4] = {0xd3, 'S', 'R', 0x01};

/* A row of the plan (snapshot.py _Plan.taken, one int64 each): the record's file offset, its length, its header's
 * check, key_nbytes, body_nbytes, tag, expires_ns, the kind its key names (-1: none), flags | reserved << 8. */
enum { ROW_P, ROW_N, ROW_CHECK, ROW_KLEN, ROW_BLEN, ROW_TAG, ROW_EXPIRES, ROW_KIND, ROW_FLAGS };

typedef struct {
    uint32_t klen, blen;
    uint8_t tag, flags;
    uint16_t reserved;
    int64_t expires;
    uint64_t check;
} RecHead;

/* The record header at ``h`` (REC_HEAD_CHECKED bytes), if its sync word and check hold: 1, else 0. */
static int rec_head(const uint8_t *h, uint64_t seed, RecHead *r)
{
    if (memcmp(h, rec_sync, 4) != 0)
        return 0;
    r->check = xxh_le64(h + REC_HEAD);
    if (xxh3_short(h, REC_HEAD, seed) != r->check)
        return 0;
    r->klen = xxh_le32(h + 4);
    r->blen = xxh_le32(h + 8);
    r->tag = h[12];
    r->flags = h[13];
    r->reserved = (uint16_t)(h[14] | h[15] << 8);
    r->expires = (int64_t)xxh_le64(h + 16);
    return 1;
}

/* A writable buffer of int64 words, at least ``want`` of them. */
static int words_arg(PyObject *o, Py_buffer *b, Py_ssize_t want, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->len < want * 8 || b->len % 8 || ((uintptr_t)b->buf & 7)) {
        PyErr_Format(PyExc_ValueError, "%s must hold at least %zd aligned int64 words", what, want);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* A read-only buffer of exactly ``n`` bytes (n < 0: any length). */
static int bytes_arg(PyObject *o, Py_buffer *b, Py_ssize_t n, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_SIMPLE) < 0)
        return -1;
    if (n >= 0 && b->len != n) {
        PyErr_Format(PyExc_ValueError, "%s must be %zd bytes, got %zd", what, n, b->len);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* Core.snapshot_plan(window, at, size, p, seed, tags, kinds, now_ns, state, out) -> (p, rows): the first pass
 * (snapshot.py _plan) from the record at file offset ``p`` over ``window`` (the file's bytes from offset ``at``; the
 * file is ``size`` bytes): each record whose header is whole in the window, right, and whose bytes the file holds is
 * counted and judged as _plan judges it (``tags`` and ``kinds``: 256 bytes, non-zero for each tag the serializer
 * writes and each kind the header names), the ones taken written to ``out`` as rows (REC_ROW words). ``state``: the
 * walk's words, read and written: entries and bytes taken, their limits, then the counts valid, unusable, expired
 * and no_room. Stops at the first record it does not pass (snapshot.py takes that one), at the window's end, or
 * with ``out`` full; the offset reached and the rows written. */
static PyObject *Core_snapshot_plan(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t at, size, p, seed, now;
    Py_buffer b[5]; /* the window, tags, kinds, state and out, taken in order; those taken are released at the end */
    int taken = 0;
    if (nargs_ok(nargs, 10, "snapshot_plan") || arg_int(args[1], "at", &at) || arg_int(args[2], "size", &size)
        || arg_int(args[3], "p", &p) || arg_int(args[4], "seed", &seed) || arg_int(args[7], "now_ns", &now))
        return NULL;
    if (bytes_arg(args[0], &b[0], -1, "window") || (taken++, bytes_arg(args[5], &b[1], 256, "tags"))
        || (taken++, bytes_arg(args[6], &b[2], 256, "kinds")) || (taken++, words_arg(args[8], &b[3], 8, "state"))
        || (taken++, words_arg(args[9], &b[4], REC_ROW, "out"))) {
        while (taken > 0)
            PyBuffer_Release(&b[--taken]);
        return NULL;
    }
    Py_buffer win = b[0], tags = b[1], kinds = b[2], state = b[3], out = b[4];
    const uint8_t *w = win.buf, *tag_ok = tags.buf, *kind_ok = kinds.buf;
    int64_t *s = state.buf, *row = out.buf;
    Py_ssize_t rows = 0, cap = out.len / (8 * REC_ROW);
    int64_t wn = (int64_t)win.len;
    Py_BEGIN_ALLOW_THREADS
    while (rows < cap && p >= at && p - at <= wn - (REC_HEAD_CHECKED + 2) && p < size) {
        const uint8_t *h = w + (p - at);
        RecHead r;
        if (!rec_head(h, (uint64_t)seed, &r))
            break;
        int64_t n = REC_HEAD_CHECKED + (int64_t)r.klen + (int64_t)r.blen + REC_CHECK;
        if (n > size - p) /* cut short: the file ends inside it */
            break;
        s[4]++;
        int64_t total = (int64_t)r.klen + (int64_t)r.blen + 1;
        const uint8_t *key = h + REC_HEAD_CHECKED;
        int marked = r.klen >= 1 && key[0] == (uint8_t)c->kind_prefix;
        int64_t kind = marked && r.klen >= 2 ? key[1] : -1;
        if (!tag_ok[r.tag] || block_nbytes(c, total) > c->max_block || (marked && (r.klen < 2 || !kind_ok[key[1]]))) {
            s[5]++;
        } else if (r.expires && r.expires <= now) {
            s[6]++;
        } else if (s[0] < s[2] && s[1] + total <= s[3]) {
            s[0]++;
            s[1] += total;
            int64_t *o = row + rows * REC_ROW;
            o[ROW_P] = p;
            o[ROW_N] = n;
            o[ROW_CHECK] = (int64_t)r.check;
            o[ROW_KLEN] = r.klen;
            o[ROW_BLEN] = r.blen;
            o[ROW_TAG] = r.tag;
            o[ROW_EXPIRES] = r.expires;
            o[ROW_KIND] = kind;
            o[ROW_FLAGS] = r.flags | (int64_t)r.reserved << 8;
            rows++;
        } else {
            s[7]++;
        }
        p += n;
    }
    Py_END_ALLOW_THREADS
    for (int i = 0; i < 5; i++)
        PyBuffer_Release(&b[i]);
    return Py_BuildValue("(Ln)", (long long)p, rows);
}

/* What became of a row of the second pass. */
enum { RS_TODO, RS_PUT, RS_DAMAGED, RS_EXPIRED, RS_STORED, RS_REFUSED };
/* A record's flags: with bit 3 set, bits 0-2 are the marks its entry had (an s3fifo or auto cache's), which place
 * it again (Encoded.marks). (twin: snapshot.py FLAG_MARKED, FLAG_MARKS) */
enum { REC_MARKED = 8, REC_MARKS = 7 };

/* Store st[0..n) (rows ``from`` theirs, each with its own time to live) in order, one at a time as snapshot.py's
 * _store does where a batch fails, under one hold of the lock: a store a pin or the policy refuses is counted
 * refused and the rest go on. *done: how many were judged before a hand-over (ST_HANDOVER: the Python path takes
 * st[*done]: an arena to grow, a repair, or a store over the byte limit, which it refuses and counts in too_large).
 * (twin: snapshot.py _store) */
static int restore_locked(Core *c, Encoded *st, const int64_t *ttls, uint8_t *outcome, const Py_ssize_t *from,
                          Py_ssize_t n, int64_t now, Py_ssize_t *done)
{
    int64_t old;
    int r;
    *done = 0;
    if (HW(dirty) || hidden(c))
        return unready(c);
    if (now < 0)
        now = mono_ns();
    for (Py_ssize_t i = 0; i < n; i++) {
        Encoded *e = &st[i];
        if ((r = expiry(c, e, now, ttls[i], -1))) /* (the cache's default time to idle, as put_many gives) */
            return r;
        if (e->nb > c->arena_nbytes) { /* beyond the byte limit too: refused (and counted) by the Python path */
            c->reason = WHY_LIMIT;
            return ST_HANDOVER;
        }
        if ((r = put_find(c, e, now, &old))) { /* over the byte limit: a hand-over, as for put */
            if (r != ST_PINNED)
                return r;
            outcome[from[i]] = RS_REFUSED; /* PinnedError: a view pins the key's entry; nothing written */
        } else {
            r = put_write(c, e, old, now);
            if (r == ST_OK)
                outcome[from[i]] = RS_STORED;
            else if (r == ST_REFUSED) /* not admitted (keep, full; or its room pinned or held), every structure whole */
                outcome[from[i]] = RS_REFUSED;
            else
                return r;
        }
        *done = i + 1;
    }
    return ST_OK;
}

/* Core.snapshot_restore(chunk, first, rows, count, seed, kinds, real_ns, now_ns) -> (stored, damaged, expired,
 * refused, left): the second pass (snapshot.py _insert) over the plan's rows[0..count) (REC_ROW words each, hottest
 * first), whose records lie in ``chunk`` (the file's bytes from offset ``first``), coldest first: each checked whole
 * against its row (the header the first pass read) and its own check; a key's kind renumbered by ``kinds`` (256
 * bytes: this cache's number for each of the file's, 0 for none: damaged); its time to live from its expiry and
 * ``real_ns`` (time.time_ns); then stored, expiring by the clock reading ``now_ns`` (-1: CLOCK_MONOTONIC's).
 * ``left``: the rows [0, left) not judged, where a hand-over stopped the stores at row left - 1 (the Python path
 * takes it, then calls again for the rest). */
static PyObject *Core_snapshot_restore(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t first, count, seed, real, now;
    Py_buffer chunk, rowbuf, kinds;
    PyObject *out = NULL;
    Encoded *st = NULL;
    int64_t *ttls = NULL;
    Py_ssize_t *from = NULL;
    uint8_t *outcome = NULL, *keys = NULL;
    if (nargs_ok(nargs, 8, "snapshot_restore") || arg_int(args[1], "first", &first)
        || arg_int(args[3], "count", &count) || arg_int(args[4], "seed", &seed) || arg_int(args[6], "real_ns", &real)
        || arg_int(args[7], "now_ns", &now))
        return NULL;
    if (bytes_arg(args[0], &chunk, -1, "chunk"))
        return NULL;
    if (bytes_arg(args[2], &rowbuf, -1, "rows")) {
        PyBuffer_Release(&chunk);
        return NULL;
    }
    if (bytes_arg(args[5], &kinds, 256, "kinds")) {
        PyBuffer_Release(&chunk);
        PyBuffer_Release(&rowbuf);
        return NULL;
    }
    if (count < 0 || rowbuf.len % (8 * REC_ROW) || count > rowbuf.len / (8 * REC_ROW) || ((uintptr_t)rowbuf.buf & 7)) {
        PyErr_Format(PyExc_ValueError, "Core.snapshot_restore: rows must hold at least %lld aligned rows of %d int64",
                     (long long)count, REC_ROW);
        goto end;
    }
    Py_ssize_t n = (Py_ssize_t)count;
    const int64_t *rows = rowbuf.buf;
    const uint8_t *ch = chunk.buf, *kind_map = kinds.buf;
    int64_t clen = (int64_t)chunk.len, key_bytes = 0;
    for (Py_ssize_t j = 0; j < n; j++) /* room for the keys whose kind byte is renumbered */
        if (rows[j * REC_ROW + ROW_KIND] >= 0 && rows[j * REC_ROW + ROW_KLEN] > 0)
            key_bytes += rows[j * REC_ROW + ROW_KLEN];
    st = PyMem_New(Encoded, n ? n : 1);
    ttls = PyMem_New(int64_t, n ? n : 1);
    from = PyMem_New(Py_ssize_t, n ? n : 1);
    outcome = PyMem_Calloc(n ? (size_t)n : 1, 1);
    keys = PyMem_Malloc(key_bytes ? (size_t)key_bytes : 1);
    if (!st || !ttls || !from || !outcome || !keys) {
        PyErr_NoMemory();
        goto end;
    }
    Py_ssize_t m = 0;
    int64_t kused = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = n - 1; j >= 0; j--) { /* coldest first */
        const int64_t *o = rows + j * REC_ROW;
        int64_t at = o[ROW_P] - first;
        RecHead r;
        /* Read again and checked whole: its header as the first pass found it (the file may have changed since),
         * then its key and body against the record's own check, seeded with the header's. */
        if (at < 0 || o[ROW_N] < REC_HEAD_CHECKED + REC_CHECK || at > clen - o[ROW_N]
            || !rec_head(ch + at, (uint64_t)seed, &r) || (int64_t)r.check != o[ROW_CHECK] || r.klen != o[ROW_KLEN]
            || r.blen != o[ROW_BLEN] || r.tag != o[ROW_TAG] || r.expires != o[ROW_EXPIRES]
            || (r.flags | (int64_t)r.reserved << 8) != o[ROW_FLAGS]
            || o[ROW_N] != REC_HEAD_CHECKED + (int64_t)r.klen + (int64_t)r.blen + REC_CHECK) {
            outcome[j] = RS_DAMAGED;
            continue;
        }
        const uint8_t *kb = ch + at + REC_HEAD_CHECKED, *body = kb + r.klen;
        uint64_t kh = xxh3_64(kb, r.klen, r.check);
        if (xxh3_64(body, r.blen, kh) != xxh_le64(body + r.blen)) {
            outcome[j] = RS_DAMAGED;
            continue;
        }
        if (r.klen && kb[0] == (uint8_t)c->kind_prefix) { /* the file's kind number, as this cache numbers the name */
            uint8_t k = r.klen >= 2 ? kind_map[kb[1]] : 0;
            if (!k || kused + r.klen > key_bytes) {
                outcome[j] = RS_DAMAGED;
                continue;
            }
            uint8_t *copy = keys + kused;
            memcpy(copy, kb, r.klen);
            copy[1] = k;
            kb = copy;
            kused += r.klen;
        }
        int64_t ttl = 0;
        if (r.expires) {
            if (r.expires <= real) {
                outcome[j] = RS_EXPIRED;
                continue;
            }
            ttl = r.expires - real < c->max_ttl ? r.expires - real : c->max_ttl;
        }
        Encoded *e = &st[m];
        e->kb = (const char *)kb;
        e->klen = r.klen;
        e->body = (const char *)body;
        e->blen = r.blen;
        e->tag = r.tag;
        e->fp = (int64_t)(xxh3_64(kb, r.klen, 0) & (uint64_t)INT64_MAX);
        e->check = (int64_t)((xxh3_64(body, r.blen, r.tag) & (uint64_t)c->check_mask) | 1);
        e->size = (int64_t)r.klen + (int64_t)r.blen + 1;
        e->nb = block_nbytes(c, e->size);
        e->marks = r.flags & REC_MARKED ? r.flags & REC_MARKS : -1;
        ttls[m] = ttl;
        from[m++] = j;
        outcome[j] = RS_PUT;
    }
    Py_END_ALLOW_THREADS
    Py_ssize_t done = m;
    int r = ST_OK;
    if (m > 0) {
        if ((r = enter(c)) < 0)
            goto end;
        if (r == ST_OK) {
            r = restore_locked(c, st, ttls, outcome, from, m, now, &done);
            unlock(c);
            leave(c);
            if (r < 0)
                goto end;
        } else {
            done = 0;
        }
    }
    /* A hand-over at st[done]: the rows from its own down are not judged (their checks are made again by the Python
     * path, which reads the same bytes). */
    Py_ssize_t left = done < m ? from[done] + 1 : 0;
    long long counts[5] = {0, 0, 0, 0, 0};
    for (Py_ssize_t j = left; j < n; j++)
        if (outcome[j] >= RS_DAMAGED)
            counts[outcome[j] - RS_DAMAGED]++;
    if (done < m)
        thread_reason = c->reason;
    out = Py_BuildValue("(LLLLn)", counts[RS_STORED - RS_DAMAGED], counts[0], counts[RS_EXPIRED - RS_DAMAGED],
                        counts[RS_REFUSED - RS_DAMAGED], left);
end:
    PyMem_Free(st);
    PyMem_Free(ttls);
    PyMem_Free(from);
    PyMem_Free(outcome);
    PyMem_Free(keys);
    PyBuffer_Release(&chunk);
    PyBuffer_Release(&rowbuf);
    PyBuffer_Release(&kinds);
    return out;
}
