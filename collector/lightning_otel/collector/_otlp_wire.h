/* Protobuf wire-format reading and small CPython helpers for _spans_codec.c. Every reader returns
 * -1 on malformed input without setting a Python exception (the caller falls back). */
#ifndef LIGHTNING_OTEL_OTLP_WIRE_H
#define LIGHTNING_OTEL_OTLP_WIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct { const uint8_t *p, *end; } Reader;


/* ---- wire format ---------------------------------------------------------------------------- */
static inline int varint(Reader *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && r->p < r->end; shift += 7) {
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) { *out = v; return 0; }
    }
    return -1;
}

static inline int tag(Reader *r, uint32_t *field, uint32_t *wire) {
    uint64_t t;
    if (varint(r, &t) < 0 || (t >> 3) == 0 || (t >> 3) > 0x1fffffff) return -1;
    *field = (uint32_t)(t >> 3);
    *wire = (uint32_t)(t & 7);
    return 0;
}

static inline int sub(Reader *r, Reader *out) {
    uint64_t n;
    if (varint(r, &n) < 0 || n > (uint64_t)(r->end - r->p)) return -1;
    out->p = r->p;
    out->end = r->p + n;
    r->p += n;
    return 0;
}

static inline int fixed64(Reader *r, uint64_t *out) {
    if (r->end - r->p < 8) return -1;
    memcpy(out, r->p, 8);
    r->p += 8;
    return 0;
}

static inline int skip(Reader *r, uint32_t wire) {
    uint64_t v;
    Reader s;
    switch (wire) {
    case 0: return varint(r, &v);
    case 1: return fixed64(r, &v);
    case 2: return sub(r, &s);
    case 5: if (r->end - r->p < 4) return -1; r->p += 4; return 0;
    default: return -1; /* groups: let the reference decoder decide */
    }
}

/* ---- small builders ------------------------------------------------------------------------- */
static inline PyObject *text(Reader s) {
    return PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, "strict");
}

static inline PyObject *hex(Reader s) {
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t n = s.end - s.p;
    PyObject *out = PyUnicode_New(2 * n, 127);
    if (!out) return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        d[2 * i] = digits[s.p[i] >> 4];
        d[2 * i + 1] = digits[s.p[i] & 15];
    }
    return out;
}

static inline int append(PyObject *list, PyObject *item) { /* steals item */
    if (!item) return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static inline int grow(PyObject *array, Py_ssize_t used, Py_ssize_t extra) {
    Py_ssize_t have = PyByteArray_GET_SIZE(array);
    if (used + extra <= have) return 0;
    Py_ssize_t want = have ? have : 4096;
    while (want < used + extra) want *= 2;
    return PyByteArray_Resize(array, want);
}

static inline int put(PyObject *array, Py_ssize_t *used, const void *data, Py_ssize_t n) {
    if (grow(array, *used, n) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(array) + *used, data, n);
    *used += n;
    return 0;
}

#endif
