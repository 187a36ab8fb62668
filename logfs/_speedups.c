/* logfs._speedups: the per-record loops of the hot paths, in C.
 *
 * encode_lines(prefix, data, end, target): the bulk append. Whole batches of plain lines straight from a write
 *     buffer.
 * grow_lines(batch, prefix, data, end, ts_delta, cap): the small append. The same lines appended to the records of
 *     the tail batch being grown.
 * encode_records(values, keys=None) -> bytes: the records section of an uncompressed Kafka v2 batch (record i:
 *     attributes 0, timestampDelta 0, offsetDelta i, the key or null, the value or null, no headers). The caller
 *     adds the 61-byte header and CRC (logfs.storage.format.records.build_batch).
 * render_window(buf, skip, want, separator, null_marker): the read path. The requested bytes of the text-view
 *     lines of the batches in a read buffer.
 * render_records(batch, separator, null_marker) -> bytes: the lines of one batch ([key + separator] +
 *     (value | marker | "") + "\n" per record).
 * batch_stats(batch): line statistics of one batch (recovery, cleaning).
 * min_timestamp(batch): the smallest record timestamp of one batch (tiering: the manifest's min_timestamp).
 * seek_line(batch, separator, null_marker, offset, position): the text view's lookups (position_of, offset_at)
 *     inside one batch.
 * index_ok(kind, buf, n, log_size): the sanity checks of an index's entries (loading a store).
 * index_floor(fd, kind, field, n, target, sep_len, marker_len): an index file's binary search, by pread.
 * decode_columns(batches, start, end): Arrow column buffers of plain batches (the Spark data source).
 * merge_batches(batches, last_offset): plain batches merged into one (the rewrite of a sealed segment in its codec).
 * murmur2(data), partition_rows(n, keys, explicit, parts, rr), encode_arrow(values, keys, indices, start, end,
 *     target, timestamp): the Spark sink. Kafka's default partitioner, and batches, straight from Arrow buffers.
 *
 * Each is documented where it is defined. All are optional accelerators: logfs.storage.format.records and
 * logfs.view.text have pure-Python paths producing identical bytes (tests compare them). Compressed and control
 * batches always take the Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define HEADER_SIZE 61

static inline Py_ssize_t varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    Py_ssize_t n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline unsigned char *put_varint(unsigned char *p, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *p++ = (unsigned char)((z & 0x7f) | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    return p;
}

/* One record of a v2 batch with no headers and timestampDelta 0 (the batches logfs builds): its size with its
 * length prefix, and writing it at p (returns the end). klen/vlen -1: a null key/value. */
static inline Py_ssize_t plain_record_body(Py_ssize_t delta, int64_t klen, int64_t vlen) {
    return 1 + 1 + varint_size(delta) + varint_size(klen) + (klen > 0 ? klen : 0) + varint_size(vlen) +
           (vlen > 0 ? vlen : 0) + 1;
}

static inline unsigned char *put_plain_record(unsigned char *p, Py_ssize_t delta, const void *kp, int64_t klen,
                                              const void *vp, int64_t vlen) {
    p = put_varint(p, plain_record_body(delta, klen, vlen));
    *p++ = 0; /* attributes */
    *p++ = 0; /* timestampDelta */
    p = put_varint(p, delta);
    p = put_varint(p, klen);
    if (klen > 0) {
        memcpy(p, kp, klen);
        p += klen;
    }
    p = put_varint(p, vlen);
    if (vlen > 0) {
        memcpy(p, vp, vlen);
        p += vlen;
    }
    *p++ = 0; /* headers */
    return p;
}

/* Reads a zigzag varint; returns 0 on success, -1 past end or on an over-long encoding. */
static inline int get_varint(const unsigned char **pp, const unsigned char *end, int64_t *out) {
    const unsigned char *p = *pp;
    uint64_t z = 0;
    int shift = 0;
    while (1) {
        if (p >= end || shift > 63)
            return -1;
        unsigned char b = *p++;
        z |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
    }
    *out = (int64_t)((z >> 1) ^ (~(z & 1) + 1));
    *pp = p;
    return 0;
}

static int field(PyObject *obj, const char **data, Py_ssize_t *len) {
    if (obj == Py_None) {
        *data = NULL;
        *len = -1;
        return 0;
    }
    if (!PyBytes_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "record keys and values must be bytes or None");
        return -1;
    }
    *data = PyBytes_AS_STRING(obj);
    *len = PyBytes_GET_SIZE(obj);
    return 0;
}

static PyObject *encode_records(PyObject *self, PyObject *args) {
    PyObject *values, *keys = Py_None;
    if (!PyArg_ParseTuple(args, "O!|O", &PyList_Type, &values, &keys))
        return NULL;
    if (keys != Py_None && (!PyList_Check(keys) || PyList_GET_SIZE(keys) != PyList_GET_SIZE(values))) {
        PyErr_SetString(PyExc_ValueError, "keys must be None or a list as long as values");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *d;
        Py_ssize_t vlen, klen = -1;
        if (field(PyList_GET_ITEM(values, i), &d, &vlen) < 0)
            return NULL;
        if (keys != Py_None && field(PyList_GET_ITEM(keys, i), &d, &klen) < 0)
            return NULL;
        Py_ssize_t body = plain_record_body(i, klen, vlen);
        total += varint_size(body) + body;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *vdata, *kdata = NULL;
        Py_ssize_t vlen, klen = -1;
        field(PyList_GET_ITEM(values, i), &vdata, &vlen);
        if (keys != Py_None)
            field(PyList_GET_ITEM(keys, i), &kdata, &klen);
        p = put_plain_record(p, i, kdata, klen, vdata, vlen);
    }
    return out;
}

typedef struct {
    const unsigned char *key, *value;
    int64_t klen, vlen, ts_delta, offset_delta;
} parsed_record;

/* Walks the records of a batch; calls back per record (a callback returning > 0 ends the walk, < 0 fails it:
 * -1 is returned). Returns -2 if malformed, setting no error (so it may run without the GIL: walk_quiet). With
 * ``partial`` (only the first ``size`` bytes of the batch are at hand), a record that does not fit ends the walk
 * with 1 instead. */
static int walk_records(const unsigned char *buf, Py_ssize_t size, int32_t count,
                        int (*fn)(const parsed_record *, void *), void *ctx, int partial) {
    const unsigned char *p = buf + HEADER_SIZE, *end = buf + size;
    for (int32_t i = 0; i < count; i++) {
        int64_t len, hcount;
        const unsigned char *at = p;
        if (partial && (get_varint(&at, end, &len) < 0 || len > end - at))
            return 1;
        if (get_varint(&p, end, &len) < 0 || len < 0 || len > end - p)
            goto bad;
        const unsigned char *rec_end = p + len;
        parsed_record r;
        p += 1; /* attributes */
        if (get_varint(&p, rec_end, &r.ts_delta) < 0 || get_varint(&p, rec_end, &r.offset_delta) < 0)
            goto bad;
        if (get_varint(&p, rec_end, &r.klen) < 0 || r.klen < -1 || r.klen > rec_end - p)
            goto bad;
        r.key = p;
        p += r.klen > 0 ? r.klen : 0;
        if (get_varint(&p, rec_end, &r.vlen) < 0 || r.vlen < -1 || r.vlen > rec_end - p)
            goto bad;
        r.value = p;
        p += r.vlen > 0 ? r.vlen : 0;
        if (get_varint(&p, rec_end, &hcount) < 0 || hcount < 0)
            goto bad;
        p = rec_end; /* headers are not part of the view */
        int rc = fn(&r, ctx);
        if (rc < 0)
            return -1;
        if (rc > 0) /* the callback has what it needs */
            return 0;
    }
    return 0;
bad:
    return -2;
}

/* walk_records, with ValueError set for a malformed batch (-1 then). */
static int walk_ex(const unsigned char *buf, Py_ssize_t size, int32_t count,
                   int (*fn)(const parsed_record *, void *), void *ctx, int partial) {
    int rc = walk_records(buf, size, count, fn, ctx, partial);
    if (rc == -2) {
        PyErr_SetString(PyExc_ValueError, "malformed record batch");
        return -1;
    }
    return rc;
}

static int walk(const unsigned char *buf, Py_ssize_t size, int32_t count,
                int (*fn)(const parsed_record *, void *), void *ctx) {
    return walk_ex(buf, size, count, fn, ctx, 0);
}

/* A whole batch's walk that sets no Python error (-2: malformed), for a callback that touches no Python object:
 * it may run with the GIL released. */
static int walk_quiet(const unsigned char *buf, Py_ssize_t size, int32_t count,
                      int (*fn)(const parsed_record *, void *), void *ctx) {
    return walk_records(buf, size, count, fn, ctx, 0);
}

typedef struct {
    const char *sep, *marker;
    Py_ssize_t seplen, markerlen, total;
    unsigned char *out;
} render_ctx;

static int measure(const parsed_record *r, void *c) {
    render_ctx *ctx = c;
    ctx->total += (r->vlen >= 0 ? r->vlen : ctx->markerlen) + 1;
    if (ctx->sep && r->klen >= 0)
        ctx->total += r->klen + ctx->seplen;
    return 0;
}

static int emit(const parsed_record *r, void *c) {
    render_ctx *ctx = c;
    if (ctx->sep && r->klen >= 0) {
        memcpy(ctx->out, r->key, r->klen);
        ctx->out += r->klen;
        memcpy(ctx->out, ctx->sep, ctx->seplen);
        ctx->out += ctx->seplen;
    }
    if (r->vlen >= 0) {
        memcpy(ctx->out, r->value, r->vlen);
        ctx->out += r->vlen;
    } else if (ctx->markerlen) {
        memcpy(ctx->out, ctx->marker, ctx->markerlen);
        ctx->out += ctx->markerlen;
    }
    *ctx->out++ = '\n';
    return 0;
}

static int set_format(render_ctx *ctx, PyObject *sep, PyObject *marker) {
    if (sep != Py_None) {
        if (!PyBytes_Check(sep)) {
            PyErr_SetString(PyExc_TypeError, "separator must be bytes or None");
            return -1;
        }
        ctx->sep = PyBytes_AS_STRING(sep);
        ctx->seplen = PyBytes_GET_SIZE(sep);
    }
    if (marker != Py_None) {
        if (!PyBytes_Check(marker)) {
            PyErr_SetString(PyExc_TypeError, "null marker must be bytes or None");
            return -1;
        }
        ctx->marker = PyBytes_AS_STRING(marker);
        ctx->markerlen = PyBytes_GET_SIZE(marker);
    }
    return 0;
}

static PyObject *render_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *sep = Py_None, *marker = Py_None;
    if (!PyArg_ParseTuple(args, "y*|OO", &view, &sep, &marker))
        return NULL;
    render_ctx ctx = {NULL, NULL, 0, 0, 0, NULL};
    PyObject *out = NULL;
    const unsigned char *buf = view.buf;
    if (view.len < HEADER_SIZE) {
        PyErr_SetString(PyExc_ValueError, "truncated batch");
        goto done;
    }
    int16_t attributes = (int16_t)((buf[21] << 8) | buf[22]);
    if (attributes & 0x07 || attributes & 0x20) {
        PyErr_SetString(PyExc_ValueError, "compressed or control batch");
        goto done;
    }
    int32_t count = (int32_t)(((uint32_t)buf[57] << 24) | ((uint32_t)buf[58] << 16) | ((uint32_t)buf[59] << 8) | buf[60]);
    if (set_format(&ctx, sep, marker) < 0)
        goto done;
    if (walk(buf, view.len, count, measure, &ctx) < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, ctx.total);
    if (out == NULL)
        goto done;
    ctx.out = (unsigned char *)PyBytes_AS_STRING(out);
    if (walk(buf, view.len, count, emit, &ctx) < 0) {
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&view);
    return out;
}

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* render_window(buf, skip, want, separator=None, null_marker=None, stop=0x27) -> (out, advanced, skip_after, need, lines)
 *
 * The read path's one call per request: the text-view lines of the plain batches at the start of ``buf``, from
 * byte ``skip`` of those lines, at most ``want`` bytes. Lines before ``skip`` are measured, not copied, and the
 * walk stops as soon as ``want`` bytes are out, even inside a batch or a line. The resume point is
 * (``advanced``: the buf position of the batch holding the next unread byte; ``skip_after``: bytes of that
 * batch's lines already passed). ``need`` is why it stopped early: 0 (``want`` reached, or the buffer ended at
 * a batch boundary), N > 0 (the batch at ``advanced`` is not whole in ``buf``, and its lines were rendered as
 * far as its whole records go: read N bytes from there to go on), -1 (the batch at ``advanced`` is compressed, a control batch or not v2: the caller renders it).
 * ``stop``: the batch attributes the walk stops at (-1) and leaves to the caller: compression and control by
 * default; with the transactional bit too where the segment has aborted transactions (the caller decides).
 * ``lines`` is how many of ``out``'s bytes are a line's "\n" (records whose line ends in this window: the read
 * counter of the metrics, counted here for free instead of scanning ``out`` again). */
typedef struct {
    render_ctx fmt;
    Py_ssize_t skip, room, consumed, lines;
    int stopped;
} window_ctx;

static inline void window_put(window_ctx *w, const unsigned char *src, Py_ssize_t len) {
    if (len <= 0)
        return;
    if (w->skip >= len) {
        w->skip -= len;
        w->consumed += len;
        return;
    }
    src += w->skip;
    len -= w->skip;
    w->consumed += w->skip;
    w->skip = 0;
    Py_ssize_t n = len < w->room ? len : w->room;
    memcpy(w->fmt.out, src, n);
    w->fmt.out += n;
    w->room -= n;
    w->consumed += n;
}

static int emit_window(const parsed_record *r, void *c) {
    window_ctx *w = c;
    if (w->room == 0) {
        w->stopped = 1;
        return 1;
    }
    Py_ssize_t before = w->consumed, line = 1;
    if (w->fmt.sep && r->klen >= 0) {
        window_put(w, r->key, r->klen);
        window_put(w, (const unsigned char *)w->fmt.sep, w->fmt.seplen);
        line += r->klen + w->fmt.seplen;
    }
    if (r->vlen >= 0) {
        window_put(w, r->value, r->vlen);
        line += r->vlen;
    } else {
        window_put(w, (const unsigned char *)w->fmt.marker, w->fmt.markerlen);
        line += w->fmt.markerlen;
    }
    Py_ssize_t room = w->room;
    window_put(w, (const unsigned char *)"\n", 1);
    w->lines += w->room < room; /* the "\n" was copied, not passed over */
    if (w->consumed - before < line) { /* out of room inside this line */
        w->stopped = 1;
        return 1;
    }
    return 0;
}

static PyObject *render_window(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t skip, want;
    PyObject *sep = Py_None, *marker = Py_None;
    int stop = 0x27;
    if (!PyArg_ParseTuple(args, "y*nn|OOi", &view, &skip, &want, &sep, &marker, &stop))
        return NULL;
    window_ctx w = {{NULL, NULL, 0, 0, 0, NULL}, skip, want, 0, 0, 0};
    PyObject *out = NULL, *result = NULL;
    const unsigned char *buf = view.buf;
    if (skip < 0 || want < 0) {
        PyErr_SetString(PyExc_ValueError, "skip and want must not be negative");
        goto done;
    }
    if (set_format(&w.fmt, sep, marker) < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, want);
    if (out == NULL)
        goto done;
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out);
    w.fmt.out = start;
    Py_ssize_t pos = 0, skip_after = skip, need = 0;
    while (w.room > 0) {
        Py_ssize_t rem = view.len - pos;
        if (rem == 0)
            break;
        if (rem < 12) {
            need = HEADER_SIZE;
            break;
        }
        Py_ssize_t size = (Py_ssize_t)be32(buf + pos + 8) + 12;
        if (size < HEADER_SIZE) {
            need = -1; /* not a batch: the generic path reports it */
            break;
        }
        if (rem < HEADER_SIZE) {
            need = size;
            break;
        }
        int16_t attributes = (int16_t)((buf[pos + 21] << 8) | buf[pos + 22]);
        if (buf[pos + 16] != 2 || (attributes & (stop | 0x27))) {
            need = -1;
            break;
        }
        /* A batch cut off by the end of buf is walked as far as its records are whole: a small read needs only
         * the bytes up to its window, not the rest of the batch. */
        int partial = size > rem;
        w.consumed = 0;
        w.stopped = 0;
        if (walk_ex(buf + pos, partial ? rem : size, (int32_t)be32(buf + pos + 57), emit_window, &w, partial) < 0)
            goto done;
        if (w.stopped || partial) { /* resume inside this batch: what was passed, and what is left to pass */
            skip_after = w.consumed + w.skip;
            need = w.stopped ? 0 : size;
            break;
        }
        pos += size;
        skip_after = w.skip;
    }
    Py_ssize_t produced = want - w.room;
    if (produced < want && _PyBytes_Resize(&out, produced) < 0)
        goto done;
    result = Py_BuildValue("(Nnnnn)", out, pos, skip_after, need, w.lines);
    out = NULL;
done:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return result;
}

typedef struct {
    long long records, keyed, nulls, key_bytes, value_bytes;
} stats_ctx;

static int count(const parsed_record *r, void *c) {
    stats_ctx *s = c;
    s->records++;
    if (r->klen >= 0) {
        s->keyed++;
        s->key_bytes += r->klen;
    }
    if (r->vlen < 0)
        s->nulls++;
    else
        s->value_bytes += r->vlen;
    return 0;
}

/* batch_stats(batch) -> (records, keyed, nulls, key_bytes, value_bytes) of one uncompressed batch (a control
 * batch counts nothing). ValueError for a compressed or malformed batch: the caller decodes those generically. */
/* The attributes of an uncompressed v2 batch at buf (len bytes); -1 with ValueError set if it is not one. */
static int plain_v2_attributes(const unsigned char *buf, Py_ssize_t len) {
    if (len < HEADER_SIZE || buf[16] != 2) {
        PyErr_SetString(PyExc_ValueError, "not a v2 batch");
        return -1;
    }
    int attributes = (buf[21] << 8) | buf[22]; /* (0..65535: -1 is only the error) */
    if (attributes & 0x07) {
        PyErr_SetString(PyExc_ValueError, "compressed batch");
        return -1;
    }
    return attributes;
}

static PyObject *batch_stats(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    PyObject *result = NULL;
    const unsigned char *buf = view.buf;
    stats_ctx s = {0, 0, 0, 0, 0};
    int attributes = plain_v2_attributes(buf, view.len);
    if (attributes < 0)
        goto done;
    if (!(attributes & 0x20) && walk(buf, view.len, (int32_t)be32(buf + 57), count, &s) < 0)
        goto done;
    result = Py_BuildValue("(LLLLL)", s.records, s.keyed, s.nulls, s.key_bytes, s.value_bytes);
done:
    PyBuffer_Release(&view);
    return result;
}

/* min_timestamp(batch) -> int | None: the smallest record timestamp of one uncompressed v2 batch, as a reader
 * sees its records (CreateTime: firstTimestamp + the smallest timestampDelta, which may be negative: a batch's
 * records need not be in time order; LogAppendTime: the batch's maxTimestamp, every record's). None for a batch
 * without records. A control batch counts (its records are timestamped like any). ValueError for a compressed or
 * malformed batch. What tiering records per segment (the manifest's min_timestamp). */
typedef struct {
    int64_t lowest;
    int seen;
} min_ts_ctx;

static int min_ts_one(const parsed_record *r, void *c) {
    min_ts_ctx *m = c;
    if (!m->seen || r->ts_delta < m->lowest)
        m->lowest = r->ts_delta;
    m->seen = 1;
    return 0;
}

static PyObject *min_timestamp(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    PyObject *result = NULL;
    const unsigned char *buf = view.buf;
    min_ts_ctx m = {0, 0};
    int attributes = plain_v2_attributes(buf, view.len);
    if (attributes < 0)
        goto done;
    int32_t count = (int32_t)be32(buf + 57);
    if (count <= 0) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    if (attributes & 0x08) {
        result = PyLong_FromLongLong((long long)(int64_t)be64(buf + 35));
        goto done;
    }
    int rc;
    /* (no Python object is touched in the walk: other threads run meanwhile; the error, if any, is set after) */
    Py_BEGIN_ALLOW_THREADS
    rc = walk_quiet(buf, view.len, count, min_ts_one, &m);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "malformed record batch");
        goto done;
    }
    if (m.seen) {
        /* (wrapping as Kafka's long arithmetic does: no signed overflow) */
        result = PyLong_FromLongLong((long long)(int64_t)(be64(buf + 27) + (uint64_t)m.lowest));
    } else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    PyBuffer_Release(&view);
    return result;
}

/* seek_line(batch, separator, null_marker, offset, position) -> (passed, found)
 *
 * The lookups of the text view inside one uncompressed batch, without a Python object per record: the records are
 * walked in order, each one's line measured (``[key + separator] + (value | marker) + "\n"``), and the walk stops
 * at the first record whose offset is ``offset`` or more (``offset`` >= 0: position_of), or whose line holds byte
 * ``position`` of the batch's lines (``position`` >= 0: offset_at). ``passed`` is the bytes of the lines before
 * that record, ``found`` its offset; -1 if no record stops the walk (``passed`` then is all the batch's lines). A
 * control batch has no lines. ValueError for a compressed or malformed batch. */
typedef struct {
    render_ctx fmt;
    int64_t base, offset, position, found;
} seek_ctx;

static int seek_one(const parsed_record *r, void *c) {
    seek_ctx *s = c;
    int64_t offset = s->base + r->offset_delta;
    Py_ssize_t before = s->fmt.total;
    if (s->offset >= 0 && offset >= s->offset) {
        s->found = offset;
        return 1;
    }
    measure(r, &s->fmt);
    if (s->position >= 0 && s->fmt.total > s->position) {
        s->fmt.total = before;
        s->found = offset;
        return 1;
    }
    return 0;
}

static PyObject *seek_line(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *sep = Py_None, *marker = Py_None;
    long long offset, position;
    if (!PyArg_ParseTuple(args, "y*OOLL", &view, &sep, &marker, &offset, &position))
        return NULL;
    PyObject *result = NULL;
    const unsigned char *buf = view.buf;
    seek_ctx s = {{NULL, NULL, 0, 0, 0, NULL}, 0, offset, position, -1};
    if (set_format(&s.fmt, sep, marker) < 0)
        goto done;
    int attributes = plain_v2_attributes(buf, view.len);
    if (attributes < 0)
        goto done;
    s.base = (int64_t)(((uint64_t)be32(buf) << 32) | be32(buf + 4));
    if (!(attributes & 0x20) && walk(buf, view.len, (int32_t)be32(buf + 57), seek_one, &s) < 0)
        goto done;
    result = Py_BuildValue("(nL)", s.fmt.total, (long long)s.found);
done:
    PyBuffer_Release(&view);
    return result;
}

/* encode_lines(prefix, data, end, target) -> ([(batch, count, payload_bytes), ...], longest)
 *
 * The bulk-append path in one call: the text prefix + data[:end] (end > 0, data[end - 1] == '\n', no '\n' in
 * prefix) is cut into lines, each one record (the line without its '\n' as the value, no key), packed into
 * batches of records up to ``target`` bytes of payload + RECORD_OVERHEAD per record (at least one record each),
 * the same rule as Log.append. Each batch is a bytearray holding the whole uncompressed v2 batch with its 61
 * header bytes zeroed (the caller fills in offsets, timestamps and the CRC under the log's lock). ``longest`` is
 * the longest line, so the caller can refuse the whole write before anything is written. No list of lines, no
 * copy of the input. */
#define RECORD_OVERHEAD 12

/* Line lengths of prefix + data[:end] (the first line includes the prefix), and the longest; NULL with an
 * exception set on bad input. The caller frees the array. */
static Py_ssize_t *line_lengths(const Py_buffer *pre, const Py_buffer *data, Py_ssize_t end, Py_ssize_t *n_out,
                                Py_ssize_t *longest_out) {
    const unsigned char *buf = data->buf;
    if (end <= 0 || end > data->len || buf[end - 1] != '\n' || memchr(pre->buf, '\n', pre->len) != NULL) {
        PyErr_SetString(PyExc_ValueError, "encode_lines needs whole lines");
        return NULL;
    }
    Py_ssize_t n = 0, cap = 64, pos = 0, longest = 0;
    Py_ssize_t *lens = PyMem_Malloc(cap * sizeof(Py_ssize_t));
    if (lens == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    while (pos < end) {
        const unsigned char *nl = memchr(buf + pos, '\n', end - pos);
        Py_ssize_t len = (nl - buf) - pos + (n == 0 ? pre->len : 0);
        if (n == cap) {
            cap *= 2;
            Py_ssize_t *bigger = PyMem_Realloc(lens, cap * sizeof(Py_ssize_t));
            if (bigger == NULL) {
                PyMem_Free(lens);
                PyErr_NoMemory();
                return NULL;
            }
            lens = bigger;
        }
        lens[n++] = len;
        if (len > longest)
            longest = len;
        pos = (nl - buf) + 1;
    }
    *n_out = n;
    *longest_out = longest;
    return lens;
}

static inline Py_ssize_t record_size(Py_ssize_t len, int64_t offset_delta, int64_t ts_delta) {
    Py_ssize_t body = 1 + varint_size(ts_delta) + varint_size(offset_delta) + 1 + varint_size(len) + len + 1;
    return varint_size(body) + body;
}

/* Records i..j-1 (offset deltas first_delta + k - i, timestamp delta ts_delta) at p; *src advances over the
 * lines it copied. Returns the end of what was written. */
static unsigned char *put_lines(unsigned char *p, const Py_ssize_t *lens, Py_ssize_t i, Py_ssize_t j,
                                int64_t first_delta, int64_t ts_delta, const Py_buffer *pre,
                                const unsigned char **src) {
    for (Py_ssize_t k = i; k < j; k++) {
        Py_ssize_t len = lens[k];
        int64_t delta = first_delta + (k - i);
        Py_ssize_t body = 1 + varint_size(ts_delta) + varint_size(delta) + 1 + varint_size(len) + len + 1;
        p = put_varint(p, body);
        *p++ = 0; /* attributes */
        p = put_varint(p, ts_delta);
        p = put_varint(p, delta);
        *p++ = 1; /* key length -1 (null), zigzag */
        p = put_varint(p, len);
        if (k == 0 && pre->len) {
            memcpy(p, pre->buf, pre->len);
            p += pre->len;
            len -= pre->len;
        }
        memcpy(p, *src, len);
        p += len;
        *src += len + 1; /* and the '\n' */
        *p++ = 0; /* headers */
    }
    return p;
}

static PyObject *encode_lines(PyObject *self, PyObject *args) {
    Py_buffer pre, data;
    Py_ssize_t end, target;
    if (!PyArg_ParseTuple(args, "y*y*nn", &pre, &data, &end, &target))
        return NULL;
    PyObject *result = NULL, *batches = NULL;
    Py_ssize_t n = 0, longest = 0;
    Py_ssize_t *lens = line_lengths(&pre, &data, end, &n, &longest);
    if (lens == NULL)
        goto done;
    batches = PyList_New(0);
    if (batches == NULL)
        goto done;
    const unsigned char *src = data.buf;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t j = i, acc = 0, size = HEADER_SIZE, payload = 0;
        while (j < n && (j == i || acc + lens[j] + RECORD_OVERHEAD <= target)) {
            size += record_size(lens[j], j - i, 0);
            acc += lens[j] + RECORD_OVERHEAD;
            payload += lens[j];
            j++;
        }
        PyObject *batch = PyByteArray_FromStringAndSize(NULL, size);
        if (batch == NULL)
            goto done;
        unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(batch);
        memset(p, 0, HEADER_SIZE);
        put_lines(p + HEADER_SIZE, lens, i, j, 0, 0, &pre, &src);
        PyObject *item = Py_BuildValue("(Nnn)", batch, j - i, payload);
        if (item == NULL || PyList_Append(batches, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
        i = j;
    }
    result = Py_BuildValue("(On)", batches, longest);
done:
    Py_XDECREF(batches);
    PyMem_Free(lens);
    PyBuffer_Release(&pre);
    PyBuffer_Release(&data);
    return result;
}

/* grow_lines(batch, prefix, data, end, ts_delta, cap) -> (count, payload_bytes, longest) or None
 *
 * The small append: the lines of prefix + data[:end] (as encode_lines) appended as records to ``batch``, a
 * bytearray holding a whole v2 batch that encode_lines made (its records count at bytes 57..60): offset deltas
 * continue from the batch's count, timestamp delta ``ts_delta``. None, and ``batch`` untouched, if the batch
 * would grow past ``cap`` bytes. The new records count is written at 57..60; the rest of the header is the
 * caller's to restamp (records.restamp_batch). */
static PyObject *grow_lines(PyObject *self, PyObject *args) {
    PyObject *batch;
    Py_buffer pre, data;
    Py_ssize_t end, cap;
    long long ts_delta;
    if (!PyArg_ParseTuple(args, "Yy*y*nLn", &batch, &pre, &data, &end, &ts_delta, &cap))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = 0, longest = 0;
    Py_ssize_t *lens = line_lengths(&pre, &data, end, &n, &longest);
    if (lens == NULL)
        goto done;
    Py_ssize_t old = PyByteArray_GET_SIZE(batch);
    if (old < HEADER_SIZE) {
        PyErr_SetString(PyExc_ValueError, "grow_lines needs a whole batch");
        goto done;
    }
    const unsigned char *h = (const unsigned char *)PyByteArray_AS_STRING(batch);
    int64_t first = (int64_t)be32(h + 57);
    Py_ssize_t size = old, payload = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        size += record_size(lens[k], first + k, ts_delta);
        payload += lens[k];
        if (size > cap) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    if (PyByteArray_Resize(batch, size) < 0)
        goto done;
    const unsigned char *src = data.buf;
    unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(batch);
    put_lines(b + old, lens, 0, n, first, ts_delta, &pre, &src);
    uint32_t count = (uint32_t)(first + n);
    b[57] = count >> 24, b[58] = count >> 16, b[59] = count >> 8, b[60] = count;
    result = Py_BuildValue("(nnn)", n, payload, longest);
done:
    PyMem_Free(lens);
    PyBuffer_Release(&pre);
    PyBuffer_Release(&data);
    return result;
}

/* index_ok(kind, buf, n, log_size) -> bool: the sanity checks of n index entries at the start of buf, in one
 * pass (loading a store checks every entry of every index: 50 partitions of 5,000 entries took ~0.25 s as
 * Python column checks). kind 0, the offset index (>ii): relative offsets increasing from >= 0, positions
 * non-decreasing from >= 0 and below max(log_size, 1). kind 1, the time index (>qi): timestamps and relative
 * offsets non-decreasing, offsets >= 0. kind 2, the view index (>IIIIIQQ: offset, position, records, keyed,
 * nulls, key bytes, value bytes): offsets and positions increasing, every stat non-decreasing, records <=
 * offset, keyed and nulls <= records, key + value bytes <= position; the last position <= log_size and the one
 * before it < log_size. The same rules as the pure-Python sanity_check methods in logfs/storage/local/index.py. */
static PyObject *index_ok(PyObject *self, PyObject *args) {
    int kind;
    Py_buffer view;
    Py_ssize_t n;
    long long log_size;
    if (!PyArg_ParseTuple(args, "iy*nL", &kind, &view, &n, &log_size))
        return NULL;
    static const Py_ssize_t sizes[3] = {8, 12, 36};
    int ok = 1;
    if (kind < 0 || kind > 2 || n < 0 || n * sizes[kind] > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "index_ok: bad kind or entry count");
        return NULL;
    }
    const unsigned char *b = view.buf;
    if (kind == 0) {
        int32_t prev_rel = -1, prev_pos = 0;
        for (Py_ssize_t i = 0; i < n && ok; i++, b += 8) {
            int32_t rel = (int32_t)be32(b), pos = (int32_t)be32(b + 4);
            ok = rel > prev_rel && pos >= prev_pos;
            prev_rel = rel;
            prev_pos = pos;
        }
        if (ok && n)
            ok = prev_pos < (log_size > 1 ? log_size : 1);
    } else if (kind == 1) {
        int64_t prev_ts = INT64_MIN;
        int32_t prev_rel = 0;
        for (Py_ssize_t i = 0; i < n && ok; i++, b += 12) {
            int64_t ts = (int64_t)be64(b);
            int32_t rel = (int32_t)be32(b + 8);
            ok = ts >= prev_ts && rel >= prev_rel;
            prev_ts = ts;
            prev_rel = rel;
        }
    } else {
        uint64_t prev[7] = {0, 0, 0, 0, 0, 0, 0};
        for (Py_ssize_t i = 0; i < n && ok; i++, b += 36) {
            uint64_t e[7] = {be32(b), be32(b + 4), be32(b + 8), be32(b + 12), be32(b + 16), be64(b + 20),
                             be64(b + 28)};
            /* (no bound of key + value bytes by the position: a compressed segment holds more than its size) */
            ok = e[2] <= e[0] && e[3] <= e[2] && e[4] <= e[2] && e[5] + e[6] >= e[5];
            if (i > 0)
                ok = ok && e[0] > prev[0] && e[1] > prev[1] && e[2] >= prev[2] && e[3] >= prev[3] &&
                     e[4] >= prev[4] && e[5] >= prev[5] && e[6] >= prev[6];
            if (ok && i == n - 1)
                ok = (long long)e[1] <= log_size && (n < 2 || (long long)prev[1] < log_size);
            memcpy(prev, e, sizeof e);
        }
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* decode_columns(batches, start, end) -> (n, offsets, timestamps_us, timestamp_types, key_valid, key_offsets,
 *                                         key_data, key_nulls, value_valid, value_offsets, value_data,
 *                                         value_nulls)
 *
 * The Spark data source's decoder: the records with offsets in [start, end) of a list of whole, uncompressed,
 * non-control v2 batches, as Arrow column buffers (little-endian): int64 offsets, int64 timestamps in
 * microseconds (CreateTime: firstTimestamp + delta; LogAppendTime: the batch's maxTimestamp), int32 timestamp
 * types, and for keys and values an Arrow binary column (validity bitmap, int32 offsets, data) with its null
 * count. No Python object per record. ValueError for anything else (the caller decodes those in Python). */
typedef struct {
    int64_t base, start, end, first_ts, max_ts;
    int log_append;
    Py_ssize_t n, key_bytes, value_bytes, cap_n, cap_bytes;
    int64_t *offsets, *stamps;
    int32_t *types, *koffs, *voffs;
    unsigned char *kvalid, *vvalid, *kdata, *vdata;
    Py_ssize_t knulls, vnulls;
} columns_ctx;

/* Row i of an Arrow binary column: its validity bit, its end offset and its bytes (len -1: null). */
static inline void put_binary(Py_ssize_t i, const unsigned char *src, int64_t len, unsigned char *valid,
                              int32_t *offs, unsigned char *data, Py_ssize_t *nulls) {
    if (len >= 0) {
        valid[i >> 3] |= (unsigned char)(1 << (i & 7));
        memcpy(data + offs[i], src, len);
        offs[i + 1] = offs[i] + (int32_t)len;
    } else {
        (*nulls)++;
        offs[i + 1] = offs[i];
    }
}

static int column_fill(const parsed_record *r, void *c) {
    columns_ctx *x = c;
    int64_t offset = x->base + r->offset_delta;
    if (offset < x->start || offset >= x->end)
        return 0;
    Py_ssize_t k = r->klen > 0 ? r->klen : 0, v = r->vlen > 0 ? r->vlen : 0;
    if (x->n >= x->cap_n || k > x->cap_bytes - x->key_bytes || v > x->cap_bytes - x->value_bytes) {
        PyErr_SetString(PyExc_ValueError, "malformed record batch"); /* (the bounds hold for a well-formed one) */
        return -1;
    }
    x->key_bytes += k;
    x->value_bytes += v;
    Py_ssize_t i = x->n++;
    x->offsets[i] = offset;
    x->stamps[i] = (x->log_append ? x->max_ts : x->first_ts + r->ts_delta) * 1000;
    x->types[i] = x->log_append;
    put_binary(i, r->key, r->klen, x->kvalid, x->koffs, x->kdata, &x->knulls);
    put_binary(i, r->value, r->vlen, x->vvalid, x->voffs, x->vdata, &x->vnulls);
    return 0;
}

static int walk_columns(PyObject *batches, columns_ctx *x, int (*fn)(const parsed_record *, void *)) {
    Py_ssize_t count = PyList_GET_SIZE(batches);
    for (Py_ssize_t b = 0; b < count; b++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PyList_GET_ITEM(batches, b), &view, PyBUF_SIMPLE) < 0)
            return -1;
        const unsigned char *buf = view.buf;
        int rc = 0;
        if (view.len < HEADER_SIZE || buf[16] != 2 || (Py_ssize_t)be32(buf + 8) + 12 != view.len) {
            PyErr_SetString(PyExc_ValueError, "decode_columns needs whole v2 batches");
            rc = -1;
        } else {
            int16_t attributes = (int16_t)((buf[21] << 8) | buf[22]);
            if (attributes & 0x27) {
                PyErr_SetString(PyExc_ValueError, "decode_columns: compressed or control batch");
                rc = -1;
            } else {
                x->base = (int64_t)be64(buf);
                x->first_ts = (int64_t)be64(buf + 27);
                x->max_ts = (int64_t)be64(buf + 35);
                x->log_append = (attributes & 0x08) ? 1 : 0;
                rc = walk(buf, view.len, (int32_t)be32(buf + 57), fn, x);
            }
        }
        PyBuffer_Release(&view);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* Bounds for one pass: at most min(the batch's record count, its record bytes / 7) records (the smallest record
 * is 7 bytes: its length, attributes, two deltas, key and value lengths and header count, a byte each), and at
 * most the batch's size in keys, and in values. decode_columns allocates them, fills the buffers in one walk and
 * shrinks them to what was filled (no second walk over the records to measure them first). */
static int column_bounds(PyObject *batches, Py_ssize_t *cap_n, Py_ssize_t *cap_bytes) {
    Py_ssize_t count = PyList_GET_SIZE(batches);
    *cap_n = *cap_bytes = 0;
    for (Py_ssize_t b = 0; b < count; b++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PyList_GET_ITEM(batches, b), &view, PyBUF_SIMPLE) < 0)
            return -1;
        if (view.len >= HEADER_SIZE) {
            int32_t records = (int32_t)be32((const unsigned char *)view.buf + 57);
            Py_ssize_t most = (view.len - HEADER_SIZE) / 7;
            *cap_n += records < 0 ? 0 : (records < most ? records : most);
            *cap_bytes += view.len;
        }
        PyBuffer_Release(&view);
    }
    return 0;
}

static PyObject *decode_columns(PyObject *self, PyObject *args) {
    PyObject *batches;
    long long start, end;
    if (!PyArg_ParseTuple(args, "O!LL", &PyList_Type, &batches, &start, &end))
        return NULL;
    columns_ctx x;
    memset(&x, 0, sizeof x);
    x.start = start;
    x.end = end;
    if (column_bounds(batches, &x.cap_n, &x.cap_bytes) < 0)
        return NULL;
    if (x.cap_bytes > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "decode_columns: over 2 GiB of batches in one call");
        return NULL;
    }
    Py_ssize_t cap = x.cap_n, bitmap = (cap + 7) / 8;
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, cap * 8), *stamps = PyBytes_FromStringAndSize(NULL, cap * 8),
             *types = PyBytes_FromStringAndSize(NULL, cap * 4), *kvalid = PyBytes_FromStringAndSize(NULL, bitmap),
             *vvalid = PyBytes_FromStringAndSize(NULL, bitmap),
             *koffs = PyBytes_FromStringAndSize(NULL, (cap + 1) * 4),
             *voffs = PyBytes_FromStringAndSize(NULL, (cap + 1) * 4),
             *kdata = PyBytes_FromStringAndSize(NULL, x.cap_bytes),
             *vdata = PyBytes_FromStringAndSize(NULL, x.cap_bytes);
    PyObject *result = NULL;
    if (!offsets || !stamps || !types || !kvalid || !vvalid || !koffs || !voffs || !kdata || !vdata)
        goto done;
    x.offsets = (int64_t *)PyBytes_AS_STRING(offsets);
    x.stamps = (int64_t *)PyBytes_AS_STRING(stamps);
    x.types = (int32_t *)PyBytes_AS_STRING(types);
    x.kvalid = (unsigned char *)PyBytes_AS_STRING(kvalid);
    x.vvalid = (unsigned char *)PyBytes_AS_STRING(vvalid);
    x.koffs = (int32_t *)PyBytes_AS_STRING(koffs);
    x.voffs = (int32_t *)PyBytes_AS_STRING(voffs);
    x.kdata = (unsigned char *)PyBytes_AS_STRING(kdata);
    x.vdata = (unsigned char *)PyBytes_AS_STRING(vdata);
    memset(x.kvalid, 0, bitmap);
    memset(x.vvalid, 0, bitmap);
    x.koffs[0] = x.voffs[0] = 0;
    if (walk_columns(batches, &x, column_fill) < 0)
        goto done;
    Py_ssize_t n = x.n;
    if (n < cap && (_PyBytes_Resize(&offsets, n * 8) < 0 || _PyBytes_Resize(&stamps, n * 8) < 0 ||
                    _PyBytes_Resize(&types, n * 4) < 0 || _PyBytes_Resize(&kvalid, (n + 7) / 8) < 0 ||
                    _PyBytes_Resize(&vvalid, (n + 7) / 8) < 0 || _PyBytes_Resize(&koffs, (n + 1) * 4) < 0 ||
                    _PyBytes_Resize(&voffs, (n + 1) * 4) < 0))
        goto done;
    if ((x.key_bytes < x.cap_bytes && _PyBytes_Resize(&kdata, x.key_bytes) < 0) ||
        (x.value_bytes < x.cap_bytes && _PyBytes_Resize(&vdata, x.value_bytes) < 0))
        goto done;
    result = Py_BuildValue("(nOOOOOOnOOOn)", n, offsets, stamps, types, kvalid, koffs, kdata, x.knulls, vvalid,
                           voffs, vdata, x.vnulls);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(stamps);
    Py_XDECREF(types);
    Py_XDECREF(kvalid);
    Py_XDECREF(vvalid);
    Py_XDECREF(koffs);
    Py_XDECREF(voffs);
    Py_XDECREF(kdata);
    Py_XDECREF(vdata);
    return result;
}

/* merge_batches(batches, last_offset) -> bytes: plain uncompressed v2 batches (one timestamp type, no producer
 * id, not transactional, not control; in offset order) merged into one, for the rewrite of a sealed segment in its
 * topic's codec. The merged batch has the first one's base offset, first timestamp, attributes and leader epoch,
 * the largest max timestamp, the record counts summed and last offset delta = last_offset - base. Each record's
 * timestamp and offset deltas are re-based on it; its other bytes (attributes, key, value, headers) are copied.
 * The CRC is left 0: the caller stamps it. ValueError for a malformed batch. */
typedef struct {
    int64_t base_offset, first_ts;
} merge_base;

static Py_ssize_t merge_walk(const unsigned char *b, Py_ssize_t size, const merge_base *m, unsigned char *out) {
    /* With out == NULL, measures; else writes. Returns the bytes of records, or -1 if malformed. */
    int64_t boff = (int64_t)be64(b), bts = (int64_t)be64(b + 27);
    int32_t count = (int32_t)be32(b + 57);
    const unsigned char *p = b + HEADER_SIZE, *end = b + size;
    Py_ssize_t total = 0;
    for (int32_t i = 0; i < count; i++) {
        int64_t len, tsd, od;
        if (get_varint(&p, end, &len) < 0 || len < 1 || len > end - p)
            return -1;
        const unsigned char *rec_end = p + len, *attr = p;
        p += 1;
        if (get_varint(&p, rec_end, &tsd) < 0 || get_varint(&p, rec_end, &od) < 0)
            return -1;
        int64_t ntsd = bts + tsd - m->first_ts, nod = boff + od - m->base_offset;
        Py_ssize_t rest = rec_end - p;
        int64_t nlen = 1 + varint_size(ntsd) + varint_size(nod) + rest;
        if (out != NULL) {
            unsigned char *q = put_varint(out + total, nlen);
            *q++ = *attr;
            q = put_varint(q, ntsd);
            q = put_varint(q, nod);
            memcpy(q, p, rest);
        }
        total += varint_size(nlen) + nlen;
        p = rec_end;
    }
    return p == end ? total : -1;
}

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static inline void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static PyObject *merge_batches(PyObject *self, PyObject *args) {
    PyObject *batches, *seq = NULL, *out = NULL;
    long long last_offset;
    if (!PyArg_ParseTuple(args, "OL", &batches, &last_offset))
        return NULL;
    seq = PySequence_Fast(batches, "batches must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), done = 0, total = HEADER_SIZE;
    Py_buffer *views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (views == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    merge_base m = {0, 0};
    int64_t max_ts = -1, count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &views[i], PyBUF_SIMPLE) < 0)
            goto fail;
        done = i + 1;
        const unsigned char *b = views[i].buf;
        Py_ssize_t len = views[i].len;
        /* no codec, not transactional, not control, no delete horizon; the first's timestamp type */
        if (len < HEADER_SIZE || b[16] != 2 || (Py_ssize_t)be32(b + 8) + 12 != len || b[21] || (b[22] & 0x77)
            || (int64_t)be64(b + 43) >= 0 || (i && (b[22] & 0x08) != (((unsigned char *)views[0].buf)[22] & 0x08)))
            goto bad;
        if (i == 0) {
            m.base_offset = (int64_t)be64(b);
            m.first_ts = (int64_t)be64(b + 27);
        }
        int64_t ts = (int64_t)be64(b + 35);
        if (ts > max_ts)
            max_ts = ts;
        count += (int32_t)be32(b + 57);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = merge_walk(views[i].buf, views[i].len, &m, NULL);
        if (size < 0)
            goto bad;
        total += size;
    }
    if (n == 0 || total - 12 > INT32_MAX || count > INT32_MAX || last_offset - m.base_offset > INT32_MAX
        || last_offset < m.base_offset)
        goto bad;
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto fail;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *first = views[0].buf;
    memcpy(o, first, HEADER_SIZE);
    put_be32(o + 8, (uint32_t)(total - 12));
    put_be32(o + 17, 0); /* CRC: stamped by the caller */
    o[21] = 0;
    o[22] = first[22] & 0x08; /* the timestamp type */
    put_be32(o + 23, (uint32_t)(last_offset - m.base_offset));
    put_be64(o + 35, (uint64_t)max_ts);
    put_be32(o + 57, (uint32_t)count);
    Py_ssize_t at = HEADER_SIZE;
    for (Py_ssize_t i = 0; i < n; i++)
        at += merge_walk(views[i].buf, views[i].len, &m, o + at);
    goto release;
bad:
    PyErr_SetString(PyExc_ValueError, "not plain uncompressed v2 batches in offset order");
fail:
    Py_CLEAR(out);
release:
    for (Py_ssize_t i = 0; i < done; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return out;
}

/* --- the Spark sink: Arrow columns -> partitions and batches ------------------------------------------------
 *
 * A binary (or string: the same layout) Arrow column comes from Python as a tuple (validity bitmap or None, int32
 * offsets, data or None, array offset); an int32 column as (validity or None, values, array offset). */
typedef struct {
    Py_buffer valid, offs, data;
    int has_valid, has_offs, has_data;
    Py_ssize_t offset;
    const uint8_t *v;
    const int32_t *o;
    const unsigned char *d;
} arrow_col;

static void release_col(arrow_col *a) {
    if (a->has_valid)
        PyBuffer_Release(&a->valid);
    if (a->has_offs)
        PyBuffer_Release(&a->offs);
    if (a->has_data)
        PyBuffer_Release(&a->data);
    a->has_valid = a->has_offs = a->has_data = 0;
}

/* binary != 0: (valid, offsets, data, offset); else (valid, values, offset). Checks the buffers hold n rows. */
static int get_col(PyObject *t, Py_ssize_t n, int binary, arrow_col *a) {
    memset(a, 0, sizeof *a);
    Py_ssize_t want = binary ? 4 : 3;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != want) {
        PyErr_SetString(PyExc_TypeError, "an Arrow column is a tuple of its buffers and its offset");
        return -1;
    }
    a->offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, want - 1));
    if (a->offset < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "negative array offset");
        return -1;
    }
    PyObject *valid = PyTuple_GET_ITEM(t, 0), *offs = PyTuple_GET_ITEM(t, 1);
    if (valid != Py_None) {
        if (PyObject_GetBuffer(valid, &a->valid, PyBUF_SIMPLE) < 0)
            goto fail;
        a->has_valid = 1;
        if (a->valid.len < (a->offset + n + 7) / 8)
            goto short_;
        a->v = a->valid.buf;
    }
    if (PyObject_GetBuffer(offs, &a->offs, PyBUF_SIMPLE) < 0)
        goto fail;
    a->has_offs = 1;
    if (a->offs.len < (a->offset + n + (binary ? 1 : 0)) * 4)
        goto short_;
    a->o = a->offs.buf;
    if (binary) {
        PyObject *data = PyTuple_GET_ITEM(t, 2);
        Py_ssize_t need = n ? (Py_ssize_t)a->o[a->offset + n] : 0;
        if (data != Py_None) {
            if (PyObject_GetBuffer(data, &a->data, PyBUF_SIMPLE) < 0)
                goto fail;
            a->has_data = 1;
            a->d = a->data.buf;
        }
        if (need < 0 || (need > 0 && (!a->has_data || a->data.len < need)))
            goto short_;
        for (Py_ssize_t i = 0; i < n; i++)  /* offsets must not go back (a record's length is their difference) */
            if (a->o[a->offset + i + 1] < a->o[a->offset + i])
                goto short_;
    }
    return 0;
short_:
    PyErr_SetString(PyExc_ValueError, "an Arrow column's buffers do not hold its rows");
fail:
    release_col(a);
    return -1;
}

static inline int col_valid(const arrow_col *a, Py_ssize_t i) {
    Py_ssize_t j = a->offset + i;
    return !a->has_valid || (a->v[j >> 3] >> (j & 7)) & 1;
}

/* Row i of a binary column: its bytes (length -1: null). */
static inline int64_t col_bytes(const arrow_col *a, Py_ssize_t i, const unsigned char **p) {
    if (!col_valid(a, i))
        return -1;
    Py_ssize_t j = a->offset + i;
    *p = a->d ? a->d + a->o[j] : (const unsigned char *)"";
    return (int64_t)a->o[j + 1] - a->o[j];
}

/* Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2, the default partitioner's hash of the key). */
static int32_t murmur2(const unsigned char *data, Py_ssize_t length) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t length4 = length / 4;
    for (Py_ssize_t i = 0; i < length4; i++) {
        const unsigned char *q = data + i * 4;
        uint32_t k = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const unsigned char *tail = data + (length & ~(Py_ssize_t)3);
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)tail[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

static PyObject *py_murmur2(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b))
        return NULL;
    int32_t h = murmur2(b.buf, b.len);
    PyBuffer_Release(&b);
    return PyLong_FromLong(h);
}

/* partition_rows(n, keys, explicit, parts, rr) -> (bytes of n int32 partitions, rr): a row's ``explicit``
 * partition when it has one, else parts[toPositive(murmur2(key)) % len(parts)] (Kafka's default partitioner),
 * else, for a null key, parts[rr++ % len(parts)] (round robin). ``keys``/``explicit`` may be None. */
static PyObject *partition_rows(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    PyObject *keys_t, *explicit_t;
    Py_buffer parts;
    long long rr;
    if (!PyArg_ParseTuple(args, "nOOy*L", &n, &keys_t, &explicit_t, &parts, &rr))
        return NULL;
    arrow_col keys, ex;
    memset(&keys, 0, sizeof keys);
    memset(&ex, 0, sizeof ex);
    PyObject *out = NULL;
    Py_ssize_t nparts = parts.len / 4;
    if (n < 0 || nparts < 1) {
        PyErr_SetString(PyExc_ValueError, "partition_rows needs n >= 0 and at least one partition");
        goto done;
    }
    if (keys_t != Py_None && get_col(keys_t, n, 1, &keys) < 0)
        goto done;
    if (explicit_t != Py_None && get_col(explicit_t, n, 0, &ex) < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL)
        goto done;
    int32_t *dst = (int32_t *)PyBytes_AS_STRING(out);
    const int32_t *pl = parts.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (explicit_t != Py_None && col_valid(&ex, i)) {
            dst[i] = ex.o[ex.offset + i];
            continue;
        }
        const unsigned char *k;
        int64_t klen = keys_t != Py_None ? col_bytes(&keys, i, &k) : -1;
        if (klen >= 0)
            dst[i] = pl[(uint32_t)(murmur2(k, klen) & 0x7fffffff) % (uint32_t)nparts];
        else
            dst[i] = pl[(uint64_t)(rr++) % (uint64_t)nparts];
    }
done:
    release_col(&keys);
    release_col(&ex);
    PyBuffer_Release(&parts);
    if (out == NULL)
        return NULL;
    PyObject *result = Py_BuildValue("(OL)", out, rr);
    Py_DECREF(out);
    return result;
}

static inline Py_ssize_t sink_record_size(int64_t klen, int64_t vlen, int64_t delta) {
    Py_ssize_t body = plain_record_body(delta, klen, vlen);
    return varint_size(body) + body;
}

/* encode_arrow(values, keys, indices, start, end, target, timestamp) -> [bytearray]: the rows indices[start:end]
 * (int64; or rows start..end-1 when indices is None) of a value column and a key column (or None) as uncompressed
 * v2 batches of about ``target`` bytes each (at least one record), as the sink stages them: base offset 0, offset
 * deltas 0..n-1, timestamps ``timestamp`` (deltas 0), no producer (-1), no headers, leader epoch 0. The CRC is
 * left 0: the caller stamps it. */
static PyObject *encode_arrow(PyObject *self, PyObject *args) {
    PyObject *values_t, *keys_t, *indices_o;
    Py_ssize_t start, end, target;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "OOOnnnL", &values_t, &keys_t, &indices_o, &start, &end, &target, &timestamp))
        return NULL;
    arrow_col values, keys;
    memset(&values, 0, sizeof values);
    memset(&keys, 0, sizeof keys);
    Py_buffer idx;
    int has_idx = 0;
    PyObject *out = NULL, *batch = NULL;
    const int64_t *rows = NULL;
    Py_ssize_t nrows = 0;
    if (start < 0 || end < start || target < 1) {
        PyErr_SetString(PyExc_ValueError, "encode_arrow: bad start, end or target");
        return NULL;
    }
    if (indices_o != Py_None) {
        if (PyObject_GetBuffer(indices_o, &idx, PyBUF_SIMPLE) < 0)
            return NULL;
        has_idx = 1;
        rows = idx.buf;
        if (end > idx.len / 8) {
            PyErr_SetString(PyExc_ValueError, "encode_arrow: end is past the indices");
            goto fail;
        }
    }
    /* The columns' row count: the largest row named (or end). */
    nrows = end;
    if (rows != NULL) {
        nrows = 0;
        for (Py_ssize_t j = start; j < end; j++) {
            if (rows[j] < 0) {
                PyErr_SetString(PyExc_ValueError, "encode_arrow: a negative row index");
                goto fail;
            }
            if (rows[j] + 1 > nrows)
                nrows = (Py_ssize_t)rows[j] + 1;
        }
    }
    if (get_col(values_t, nrows, 1, &values) < 0)
        goto fail;
    if (keys_t != Py_None && get_col(keys_t, nrows, 1, &keys) < 0)
        goto fail;
    out = PyList_New(0);
    if (out == NULL)
        goto fail;
    Py_ssize_t j = start;
    while (j < end) {
        /* measure: records while the batch stays within target (at least one) */
        Py_ssize_t total = HEADER_SIZE, count = 0, k = j;
        for (; k < end; k++) {
            Py_ssize_t row = rows ? (Py_ssize_t)rows[k] : k;
            const unsigned char *p;
            int64_t vlen = col_bytes(&values, row, &p), klen = keys_t != Py_None ? col_bytes(&keys, row, &p) : -1;
            Py_ssize_t size = sink_record_size(klen, vlen, count);
            if (count && total + size > target)
                break;
            if (total + size - 12 > INT32_MAX || count == INT32_MAX) {
                if (!count) {
                    PyErr_SetString(PyExc_ValueError, "encode_arrow: a record over 2 GiB");
                    goto fail;
                }
                break;
            }
            total += size;
            count++;
        }
        batch = PyByteArray_FromStringAndSize(NULL, total);
        if (batch == NULL)
            goto fail;
        unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(batch), *q = b + HEADER_SIZE;
        memset(b, 0, HEADER_SIZE);
        put_be32(b + 8, (uint32_t)(total - 12));
        b[16] = 2;                                    /* magic; leader epoch and CRC 0, attributes 0 */
        put_be32(b + 23, (uint32_t)(count - 1));
        put_be64(b + 27, (uint64_t)timestamp);
        put_be64(b + 35, (uint64_t)timestamp);
        memset(b + 43, 0xff, 14);                     /* producer id, epoch, base sequence: -1 */
        put_be32(b + 57, (uint32_t)count);
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t row = rows ? (Py_ssize_t)rows[j + i] : j + i;
            const unsigned char *kp = NULL, *vp = NULL;
            int64_t vlen = col_bytes(&values, row, &vp), klen = keys_t != Py_None ? col_bytes(&keys, row, &kp) : -1;
            q = put_plain_record(q, i, kp, klen, vp, vlen);
        }
        if (PyList_Append(out, batch) < 0)
            goto fail;
        Py_CLEAR(batch);
        j += count;
    }
    goto done;
fail:
    Py_CLEAR(out);
    Py_CLEAR(batch);
done:
    release_col(&values);
    release_col(&keys);
    if (has_idx)
        PyBuffer_Release(&idx);
    return out;
}

/* index_floor(fd, kind, field, n, target, sep_len, marker_len) -> slot: the binary search of an index file for the
 * greatest of its first n entries whose key is <= target (-1: none; -2: the file is shorter than its entries),
 * reading one entry per probe with pread. Indexes are read with pread, never through a memory map: an I/O error
 * on a mapped page kills the process with SIGBUS, while pread returns it (raised here as OSError). kind 0, the
 * offset index (>ii), field 0: the relative offset. kind 1, the time index (>qi), field 0: the timestamp,
 * field 1: the relative offset. kind 2, the view index (>IIIIIQQ), field 0: the relative offset, field 1: the
 * position, field 2: the view length before the entry (records + value bytes + nulls * marker_len, plus key
 * bytes + keyed * sep_len when sep_len > 0: LineFormat.length). The Python twin is logfs.storage.format.twins.index_floor. */
static PyObject *index_floor(PyObject *self, PyObject *args) {
    int fd, kind, field;
    Py_ssize_t n;
    long long target, sep_len, marker_len;
    if (!PyArg_ParseTuple(args, "iiinLLL", &fd, &kind, &field, &n, &target, &sep_len, &marker_len))
        return NULL;
    static const Py_ssize_t sizes[3] = {8, 12, 36};
    if (kind < 0 || kind > 2 || field < 0 || field > 2 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "index_floor: bad kind, field or entry count");
        return NULL;
    }
    const Py_ssize_t size = sizes[kind];
    unsigned char e[36];
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        ssize_t got = pread(fd, e, (size_t)size, (off_t)mid * size);
        if (got < 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        if (got != size)
            return PyLong_FromLong(-2);
        long long key;
        if (kind == 0) {
            key = (int32_t)be32(e);
        } else if (kind == 1) {
            key = field == 0 ? (long long)(int64_t)be64(e) : (long long)(int32_t)be32(e + 8);
        } else if (field == 0) {
            key = be32(e);
        } else if (field == 1) {
            key = be32(e + 4);
        } else {
            long long records = be32(e + 8), keyed = be32(e + 12), nulls = be32(e + 16);
            long long key_bytes = (long long)be64(e + 20), value_bytes = (long long)be64(e + 28);
            key = records + value_bytes + nulls * marker_len;
            if (sep_len > 0)
                key += key_bytes + keyed * sep_len;
        }
        if (target < key)
            hi = mid;
        else
            lo = mid + 1;
    }
    return PyLong_FromSsize_t(lo - 1);
}

static PyMethodDef methods[] = {
    {"murmur2", py_murmur2, METH_VARARGS, "Kafka's murmur2 hash of bytes (the default partitioner's)."},
    {"partition_rows", partition_rows, METH_VARARGS, "Kafka's default partitioner over Arrow columns (the sink)."},
    {"encode_arrow", encode_arrow, METH_VARARGS, "v2 batches of Arrow value/key columns, as the sink stages them."},
    {"merge_batches", merge_batches, METH_VARARGS, "Plain batches merged into one (the compressed rewrite)."},
    {"decode_columns", decode_columns, METH_VARARGS, "Arrow column buffers of plain batches (Spark source)."},
    {"index_ok", index_ok, METH_VARARGS, "Sanity checks of an index's entries, in one pass."},
    {"index_floor", index_floor, METH_VARARGS, "Binary search of an index file by pread (greatest entry <= a key)."},
    {"batch_stats", batch_stats, METH_VARARGS, "Line statistics of one uncompressed batch."},
    {"min_timestamp", min_timestamp, METH_VARARGS, "The smallest record timestamp of one uncompressed batch."},
    {"seek_line", seek_line, METH_VARARGS, "Lines before an offset, or the record holding a byte, in one batch."},
    {"render_window", render_window, METH_VARARGS, "Text-view bytes of a read request, from a skip, within a limit."},
    {"encode_lines", encode_lines, METH_VARARGS, "Whole batches of plain lines, for the bulk append."},
    {"grow_lines", grow_lines, METH_VARARGS, "Plain lines appended to a batch's records, for the small append."},
    {"encode_records", encode_records, METH_VARARGS, "Records section of an uncompressed v2 batch."},
    {"render_records", render_records, METH_VARARGS, "Text-view lines of an uncompressed v2 batch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "logfs._speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
