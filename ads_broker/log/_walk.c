/* The per-record walk of a client batch's records (record batch v2), in C without the GIL.
 *
 * Contract (the Python reference is ads_broker/log/walk_reference.py; a differential Hypothesis
 * test, tests/unit/log/test_walk_differential.py, checks that both agree):
 *
 *   scan_span(data, pos, end, index, count, min_delta, max_delta, no_ts_delta, first_null_key
 *             [, marks, deltas, low_delta, high_delta, flags])
 *     -> (pos, index, min_delta, max_delta, first_null_key, error_kind, error_a, error_b)
 *
 * Walks the complete records of data[pos:end] while index < count. Returns the position of the
 * first incomplete record (end if none) and the updated state, or, when a record is malformed,
 * error_kind != 0 with pos and index of that record and up to two numbers from which
 * ads_broker/log/records.py builds the error message. Varints follow Kafka's ByteUtils: zigzag,
 * at most 5 bytes for a varint (bits past 32 dropped), at most 10 for a varlong (bits past 64
 * dropped). No byte at or past `end` is ever read, and positions are Py_ssize_t (64-bit) so a
 * skip of at most 2^31 - 1 bytes can not overflow. The GIL is released around the walk; the
 * buffer is held with PyObject_GetBuffer, so a bytearray can not be resized meanwhile.
 *
 * The naming pass of a refused batch (Kafka's LogValidator.validateRecord per record, KIP-467): with
 * `marks` (a writable buffer of >= count bytes) and `deltas` (a writable buffer of >= 8 * count
 * bytes, native int64), each well-formed record walked gets marks[index] = MARK_NULL_KEY if
 * (flags & FLAG_KEYS) and its key is null, else MARK_TIMESTAMP if (flags & FLAG_TIMESTAMPS) and its
 * timestamp delta is neither no_ts_delta nor within [low_delta, high_delta], else MARK_OK; and
 * deltas[index] = its timestamp delta. Without `marks` (None) nothing is written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    WALK_OK = 0,
    WALK_SHORT_RECORD = 1,    /* a = declared length (< 6) */
    WALK_FIELDS_PAST = 2,     /* a field runs past the end of the data */
    WALK_SIZE_MISMATCH = 3,   /* a = declared length, b = bytes its fields hold */
    WALK_OFFSET_DELTA = 4,    /* a = offset delta found */
    WALK_NEGATIVE_HEADERS = 5, /* a = header count */
    WALK_HEADERS_PAST = 6,    /* a = header count */
    WALK_NEGATIVE_HEADER_KEY = 7, /* a = header key length */
    WALK_LONG_VARINT = 8,     /* a = Kafka's byte limit (5 varint, 10 varlong) */
};

enum { MARK_OK = 0, MARK_NULL_KEY = 1, MARK_TIMESTAMP = 2 };
enum { FLAG_KEYS = 1, FLAG_TIMESTAMPS = 2 };

#define READ_OK 0
#define READ_PAST (-1)
#define READ_LONG (-2)

/* Kafka ByteUtils.readVarint: at most 5 bytes; the 5th byte's bits past 32 are dropped. */
static inline int
read_varint(const uint8_t *d, Py_ssize_t *p, Py_ssize_t end, int32_t *out)
{
    Py_ssize_t q = *p;
    uint32_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (q >= end)
            return READ_PAST;
        uint8_t b = d[q++];
        v |= (uint32_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *p = q;
            *out = (int32_t)((v >> 1) ^ (0u - (v & 1u)));
            return READ_OK;
        }
    }
    return READ_LONG;
}

/* Kafka ByteUtils.readVarlong: at most 10 bytes; bits past 64 are dropped. */
static inline int
read_varlong(const uint8_t *d, Py_ssize_t *p, Py_ssize_t end, int64_t *out)
{
    Py_ssize_t q = *p;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (q >= end)
            return READ_PAST;
        uint8_t b = d[q++];
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *p = q;
            *out = (int64_t)((v >> 1) ^ (0ull - (v & 1ull)));
            return READ_OK;
        }
    }
    return READ_LONG;
}

typedef struct {
    Py_ssize_t pos;
    long long index, count;
    long long min_delta, max_delta, no_ts_delta, first_null_key;
    int kind;
    long long a, b;
    uint8_t *marks;   /* NULL: no naming pass */
    uint8_t *deltas;  /* native int64 per record, written with memcpy (no alignment assumed) */
    long long low_delta, high_delta;
    int flags;
} walk_state;

#define FAIL(k, va, vb) do { w->kind = (k); w->a = (va); w->b = (vb); goto done; } while (0)
/* A read error inside a record: past the data, or a varint over Kafka's limit. */
#define CHECK(r, limit) do { if ((r) == READ_PAST) FAIL(WALK_FIELDS_PAST, 0, 0); \
                             if ((r) == READ_LONG) FAIL(WALK_LONG_VARINT, (limit), 0); } while (0)

static int
skip_headers(const uint8_t *d, Py_ssize_t *pp, Py_ssize_t rec_end, Py_ssize_t end, walk_state *w)
{
    Py_ssize_t p = *pp;
    int32_t headers, key_len, value_len;
    int r = read_varint(d, &p, end, &headers);
    CHECK(r, 5);
    if (headers < 0)
        FAIL(WALK_NEGATIVE_HEADERS, headers, 0);
    for (int32_t i = 0; i < headers; i++) {
        if (p >= rec_end)
            FAIL(WALK_HEADERS_PAST, headers, 0);
        r = read_varint(d, &p, end, &key_len);
        CHECK(r, 5);
        if (key_len < 0)
            FAIL(WALK_NEGATIVE_HEADER_KEY, key_len, 0);
        p += key_len;
        r = read_varint(d, &p, end, &value_len);
        CHECK(r, 5);
        if (value_len > 0)
            p += value_len;
    }
done:
    *pp = p;
    return w->kind;
}

static void
walk(const uint8_t *d, Py_ssize_t end, walk_state *w)
{
    Py_ssize_t pos = w->pos;
    while (w->index < w->count && pos < end) {
        Py_ssize_t p = pos;
        int32_t length, offset_delta, key_len, value_len;
        int64_t ts_delta;
        int null_key = 0;
        int r = read_varint(d, &p, end, &length);
        if (r == READ_PAST)
            break; /* the length itself is cut by the end of the span */
        if (r == READ_LONG)
            FAIL(WALK_LONG_VARINT, 5, 0);
        if (length < 6) /* attributes, two deltas, key and value lengths, header count */
            FAIL(WALK_SHORT_RECORD, length, 0);
        if (length > end - p)
            break; /* the record is cut by the end of the span */
        Py_ssize_t rec_end = p + length;
        p += 1; /* attributes */
        r = read_varlong(d, &p, end, &ts_delta);
        CHECK(r, 10);
        r = read_varint(d, &p, end, &offset_delta);
        CHECK(r, 5);
        r = read_varint(d, &p, end, &key_len);
        CHECK(r, 5);
        if (key_len >= 0)
            p += key_len;
        else {
            null_key = 1;
            if (w->first_null_key < 0)
                w->first_null_key = w->index;
        }
        r = read_varint(d, &p, end, &value_len);
        CHECK(r, 5);
        if (value_len > 0)
            p += value_len;
        if (skip_headers(d, &p, rec_end, end, w))
            goto done;
        if (p != rec_end)
            FAIL(WALK_SIZE_MISMATCH, length, (long long)length + (long long)(p - rec_end));
        if (offset_delta != w->index)
            FAIL(WALK_OFFSET_DELTA, offset_delta, 0);
        if (ts_delta > w->max_delta)
            w->max_delta = ts_delta;
        if (ts_delta < w->min_delta && ts_delta != w->no_ts_delta)
            w->min_delta = ts_delta;
        if (w->marks != NULL) {
            uint8_t mark = MARK_OK;
            if ((w->flags & FLAG_KEYS) && null_key)
                mark = MARK_NULL_KEY;
            else if ((w->flags & FLAG_TIMESTAMPS) && ts_delta != w->no_ts_delta
                     && (ts_delta < w->low_delta || ts_delta > w->high_delta))
                mark = MARK_TIMESTAMP;
            w->marks[w->index] = mark;
            memcpy(w->deltas + 8 * (Py_ssize_t)w->index, &ts_delta, sizeof ts_delta);
        }
        w->index += 1;
        pos = rec_end;
    }
done:
    w->pos = pos;
}

static PyObject *
scan_span(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *obj, *marks_obj = Py_None, *deltas_obj = Py_None;
    Py_ssize_t end;
    walk_state w = {0};
    Py_buffer view, marks_view = {0}, deltas_view = {0};
    if (!PyArg_ParseTuple(args, "OnnLLLLLL|OOLLi:scan_span", &obj, &w.pos, &end, &w.index, &w.count,
                          &w.min_delta, &w.max_delta, &w.no_ts_delta, &w.first_null_key, &marks_obj,
                          &deltas_obj, &w.low_delta, &w.high_delta, &w.flags))
        return NULL;
    if ((marks_obj == Py_None) != (deltas_obj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "scan_span: give both marks and deltas, or neither");
        return NULL;
    }
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (w.pos < 0 || end < w.pos || end > view.len) {
        PyErr_Format(PyExc_ValueError, "scan_span: need 0 <= pos <= end <= len(data), got pos %zd, end %zd, "
                     "len %zd", w.pos, end, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    if (marks_obj != Py_None) {
        if (PyObject_GetBuffer(marks_obj, &marks_view, PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (PyObject_GetBuffer(deltas_obj, &deltas_view, PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&marks_view);
            PyBuffer_Release(&view);
            return NULL;
        }
        if (w.count < 0 || marks_view.len < w.count || deltas_view.len / 8 < w.count) {
            PyErr_Format(PyExc_ValueError, "scan_span: marks need >= count (%lld) bytes and deltas >= 8 * count, "
                         "got %zd and %zd", w.count, marks_view.len, deltas_view.len);
            PyBuffer_Release(&deltas_view);
            PyBuffer_Release(&marks_view);
            PyBuffer_Release(&view);
            return NULL;
        }
        w.marks = (uint8_t *)marks_view.buf;
        w.deltas = (uint8_t *)deltas_view.buf;
    }
    Py_BEGIN_ALLOW_THREADS
    walk((const uint8_t *)view.buf, end, &w);
    Py_END_ALLOW_THREADS
    if (marks_obj != Py_None) {
        PyBuffer_Release(&deltas_view);
        PyBuffer_Release(&marks_view);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nLLLLiLL)", w.pos, w.index, w.min_delta, w.max_delta, w.first_null_key, w.kind,
                         w.a, w.b);
}

static PyMethodDef walk_methods[] = {
    {"scan_span", scan_span, METH_VARARGS,
     "scan_span(data, pos, end, index, count, min_delta, max_delta, no_ts_delta, first_null_key\n"
     "          [, marks, deltas, low_delta, high_delta, flags])\n"
     "-> (pos, index, min_delta, max_delta, first_null_key, error_kind, error_a, error_b)\n\n"
     "Walk the complete records of data[pos:end] without the GIL (see the module's C source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef walk_module = {
    PyModuleDef_HEAD_INIT, "ads_broker.log._walk",
    "The record walk of client batches in C (ads_broker/log/_walk.c).", 0, walk_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    return PyModule_Create(&walk_module);
}
