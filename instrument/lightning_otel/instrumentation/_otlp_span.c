/* One finished span (an SDK ReadableSpan) -> its OTLP `Span` field bytes, for the span shapes the
 * agent exports on every model call: attributes in a plain dict with str, bool, int, float, bytes,
 * None or tuple-of-str values, no events, no links, no trace state. Anything else returns None and
 * instrument/lightning_otel/instrumentation/otlp_encoding.py's Python encoder (the reference, which also matches the OTLP
 * exporter's encode_spans byte for byte) encodes that span. Same field order and presence rules as
 * the Python code; tests/test_otlp_encoding.py runs its byte comparisons through both.
 *
 * Wire format: https://protobuf.dev/programming-guides/encoding/ ; layout:
 * opentelemetry/proto/trace/v1/trace.proto, common/v1/common.proto.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEAD 10 /* room before the body for the field's tag and length */

#include "_buffer.h"

static int varint_size(uint64_t v) {
    int n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}

static void put_varint(Buffer *b, uint64_t v) { /* room reserved by the caller */
    while (v >= 0x80) { b->data[b->len++] = (char)((v & 0x7F) | 0x80); v >>= 7; }
    b->data[b->len++] = (char)v;
}

static void put_raw(Buffer *b, const void *src, Py_ssize_t n) { memcpy(b->data + b->len, src, n); b->len += n; }

static void put_fixed64(Buffer *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b->data[b->len++] = (char)(v >> (8 * i));
}

static void put_fixed32(Buffer *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b->data[b->len++] = (char)(v >> (8 * i));
}

static void put_big_endian(Buffer *b, uint64_t v) {
    for (int i = 7; i >= 0; i--) b->data[b->len++] = (char)(v >> (8 * i));
}

/* tag + length + bytes */
static int put_delimited(Buffer *b, int tag, const char *src, Py_ssize_t n) {
    if (reserve(b, 2 + 10 + n) < 0) return -1;
    b->data[b->len++] = (char)tag;
    put_varint(b, (uint64_t)n);
    put_raw(b, src, n);
    return 0;
}

/* 1: written, 0: a shape the Python encoder handles, -1: error set */
static int put_string_field(Buffer *b, int tag, PyObject *text) {
    if (text == Py_None) return 1;
    if (!PyUnicode_CheckExact(text)) return 0;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    if (!utf8) { PyErr_Clear(); return 0; } /* lone surrogates: the Python encoder logs them */
    if (n == 0) return 1;
    return put_delimited(b, tag, utf8, n) < 0 ? -1 : 1;
}

/* The AnyValue of one attribute: its bytes in `value` (a pointer into the object or `scratch`). */
typedef struct {
    char head[11]; /* type tag and length or scalar */
    int head_len;
    const char *body;
    Py_ssize_t body_len;
} AnyValue;

static int any_value(PyObject *v, AnyValue *out) {
    out->head_len = 0;
    out->body = NULL;
    out->body_len = 0;
    Buffer h = {out->head, 0, sizeof out->head};
    if (v == Py_None) return 1;
    if (PyBool_Check(v)) {
        out->head[0] = 0x10;
        out->head[1] = v == Py_True;
        out->head_len = 2;
        return 1;
    }
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &n);
        if (!utf8) { PyErr_Clear(); return 0; }
        h.data[h.len++] = 0x0A;
        put_varint(&h, (uint64_t)n);
        out->body = utf8;
        out->body_len = n;
    } else if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
        h.data[h.len++] = 0x18;
        put_varint(&h, (uint64_t)x); /* negative: ten bytes of two's complement, as protobuf */
    } else if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        h.data[h.len++] = 0x21;
        put_fixed64(&h, bits);
    } else if (PyBytes_CheckExact(v)) {
        h.data[h.len++] = 0x3A;
        put_varint(&h, (uint64_t)PyBytes_GET_SIZE(v));
        out->body = PyBytes_AS_STRING(v);
        out->body_len = PyBytes_GET_SIZE(v);
    } else {
        return 0; /* arrays, mappings, subclasses */
    }
    out->head_len = (int)h.len;
    return 1;
}

/* A tuple of str (a string[] attribute, e.g. gen_ai.response.finish_reasons): its AnyValue's array_value
 * body length in `*array_len`; 1 when it is one, 0 when not (another shape: the Python encoder). */
static int string_array_size(PyObject *v, uint64_t *array_len) {
    if (!PyTuple_CheckExact(v)) return 0;
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++) {
        PyObject *item = PyTuple_GET_ITEM(v, i);
        if (!PyUnicode_CheckExact(item)) return 0;
        Py_ssize_t n;
        if (!PyUnicode_AsUTF8AndSize(item, &n)) { PyErr_Clear(); return 0; }
        uint64_t item_len = 1 + varint_size((uint64_t)n) + (uint64_t)n; /* AnyValue{string_value} */
        total += 1 + varint_size(item_len) + item_len;                  /* ArrayValue.values */
    }
    *array_len = total;
    return 1;
}

static void put_string_array(Buffer *b, PyObject *v, uint64_t array_len) { /* room reserved by the caller */
    b->data[b->len++] = 0x2A;
    put_varint(b, array_len);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(v, i), &n); /* checked by string_array_size */
        b->data[b->len++] = 0x0A;
        put_varint(b, 1 + varint_size((uint64_t)n) + (uint64_t)n);
        b->data[b->len++] = 0x0A;
        put_varint(b, (uint64_t)n);
        put_raw(b, utf8, n);
    }
}


/* Span.attributes (field 9) entry: a KeyValue's header up to its AnyValue's bytes (key, field 1,
   left out when empty as the SDK's encoder does; value, field 2, of value_len bytes), with room
   reserved for the whole entry. The caller writes the value_len bytes next. */
static int put_key_value_head(Buffer *b, const char *key, Py_ssize_t key_len, uint64_t value_len) {
    uint64_t kv_len = (key_len ? 1 + varint_size(key_len) + key_len : 0) + 1 + varint_size(value_len) + value_len;
    if (reserve(b, 1 + 10 + (Py_ssize_t)kv_len) < 0) return -1;
    b->data[b->len++] = 0x4A;
    put_varint(b, kv_len);
    if (key_len) {
        b->data[b->len++] = 0x0A;
        put_varint(b, (uint64_t)key_len);
        put_raw(b, key, key_len);
    }
    b->data[b->len++] = 0x12;
    put_varint(b, value_len);
    return 0;
}

static int put_attributes(Buffer *b, PyObject *attributes) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(attributes, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) return 0;
        Py_ssize_t key_len;
        const char *key_utf8 = PyUnicode_AsUTF8AndSize(key, &key_len);
        if (!key_utf8) { PyErr_Clear(); return 0; }
        uint64_t array_len;
        if (string_array_size(value, &array_len)) {
            uint64_t value_len = 1 + varint_size(array_len) + array_len;
            if (put_key_value_head(b, key_utf8, key_len, value_len) < 0) return -1;
            put_string_array(b, value, array_len);
            continue;
        }
        AnyValue av;
        if (!any_value(value, &av)) return 0;
        uint64_t value_len = (uint64_t)av.head_len + (uint64_t)av.body_len;
        if (put_key_value_head(b, key_utf8, key_len, value_len) < 0) return -1;
        put_raw(b, av.head, av.head_len);
        if (av.body_len) put_raw(b, av.body, av.body_len);
    }
    return 1;
}

/* a non-negative Python int -> `size` (8 or 16) big-endian bytes; 0 when it does not fit */
static int put_id(Buffer *b, PyObject *id, int size) {
    if (!PyLong_CheckExact(id)) return 0;
    uint64_t high = 0, low;
    if (size == 16) {
        PyObject *sixty_four = PyLong_FromLong(64);
        if (!sixty_four) return -1;
        PyObject *upper = PyNumber_Rshift(id, sixty_four);
        Py_DECREF(sixty_four);
        if (!upper) return -1;
        high = PyLong_AsUnsignedLongLong(upper); /* raises for a negative id or one over 128 bits */
        Py_DECREF(upper);
        if (high == (uint64_t)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        low = PyLong_AsUnsignedLongLongMask(id);
        put_big_endian(b, high);
    } else {
        low = PyLong_AsUnsignedLongLong(id);
    }
    if (low == (uint64_t)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    put_big_endian(b, low);
    return 1;
}

static PyObject *get(PyObject *obj, const char *name) { return PyObject_GetAttrString(obj, name); }

/* 1 when obj.name is an empty sequence (or None), 0 when not, -1 on error */
static int is_empty(PyObject *obj, const char *name) {
    PyObject *v = get(obj, name);
    if (!v) return -1;
    int empty = v == Py_None ? 1 : PyObject_Length(v) == 0;
    if (PyErr_Occurred()) { PyErr_Clear(); empty = 0; }
    Py_DECREF(v);
    return empty;
}

/* 1 when obj.name is 0, 0 when not, -1 on error */
static int is_zero(PyObject *obj, const char *name) {
    PyObject *v = get(obj, name);
    if (!v) return -1;
    int zero = PyLong_Check(v) && PyLong_AsLong(v) == 0;
    if (PyErr_Occurred()) { PyErr_Clear(); zero = 0; }
    Py_DECREF(v);
    return zero;
}

static int put_time(Buffer *b, int tag, PyObject *span, const char *name) {
    PyObject *t = get(span, name);
    if (!t) return -1;
    int ok = 1;
    if (t != Py_None) {
        if (!PyLong_CheckExact(t)) ok = 0;
        else {
            uint64_t v = PyLong_AsUnsignedLongLong(t);
            if (v == (uint64_t)-1 && PyErr_Occurred()) { PyErr_Clear(); ok = 0; }
            else if (v) { b->data[b->len++] = (char)tag; put_fixed64(b, v); }
        }
    }
    Py_DECREF(t);
    return ok;
}

static int put_status(Buffer *b, PyObject *status) {
    if (status == Py_None) return 1;
    PyObject *code = get(status, "status_code"), *description = get(status, "description"), *value = NULL;
    int ok = 0;
    if (code && description && (value = get(code, "value")) && PyLong_Check(value)) {
        long c = PyLong_AsLong(value);
        Py_ssize_t text_len = 0;
        const char *text = NULL;
        if (PyUnicode_CheckExact(description)) text = PyUnicode_AsUTF8AndSize(description, &text_len);
        if (description == Py_None || text) {
            Py_ssize_t size = (text_len ? 1 + varint_size(text_len) + text_len : 0) + (c ? 1 + varint_size((uint64_t)c) : 0);
            if (reserve(b, 2 + 10 + size) == 0) {
                b->data[b->len++] = 0x7A;
                put_varint(b, (uint64_t)size);
                if (text_len) { b->data[b->len++] = 0x12; put_varint(b, (uint64_t)text_len); put_raw(b, text, text_len); }
                if (c) { b->data[b->len++] = 0x18; put_varint(b, (uint64_t)c); }
                ok = 1;
            } else ok = -1;
        }
    }
    if (PyErr_Occurred() && ok != -1) { PyErr_Clear(); ok = 0; }
    Py_XDECREF(code);
    Py_XDECREF(description);
    Py_XDECREF(value);
    return ok;
}

#define STEP(expr) do { int r_ = (expr); if (r_ <= 0) { result = r_; goto done; } } while (0)

static PyObject *span_bytes(PyObject *self, PyObject *span) {
    Buffer b = {PyMem_Malloc(4096), HEAD, 4096};
    if (!b.data) return PyErr_NoMemory();
    PyObject *context = NULL, *parent = NULL, *state = NULL, *name = NULL, *kind = NULL, *kind_value = NULL,
             *attributes = NULL, *status = NULL, *id = NULL, *remote = NULL;
    int result = 1;
    context = PyObject_CallMethod(span, "get_span_context", NULL);
    STEP(context ? 1 : -1);
    STEP((state = get(context, "trace_state")) ? 1 : -1);
    STEP(state == Py_None || PyObject_Length(state) == 0 ? 1 : (PyErr_Occurred() ? -1 : 0));
    b.data[b.len++] = 0x0A; b.data[b.len++] = 0x10;
    STEP((id = get(context, "trace_id")) ? 1 : -1);
    STEP(put_id(&b, id, 16));
    Py_CLEAR(id);
    b.data[b.len++] = 0x12; b.data[b.len++] = 0x08;
    STEP((id = get(context, "span_id")) ? 1 : -1);
    STEP(put_id(&b, id, 8));
    Py_CLEAR(id);
    STEP((parent = get(span, "parent")) ? 1 : -1);
    int parent_remote = 0;
    if (parent != Py_None) {
        STEP(reserve(&b, 16) == 0 ? 1 : -1);
        b.data[b.len++] = 0x22; b.data[b.len++] = 0x08;
        STEP((id = get(parent, "span_id")) ? 1 : -1);
        STEP(put_id(&b, id, 8));
        STEP((remote = get(parent, "is_remote")) ? 1 : -1);
        parent_remote = remote == Py_True;
    }
    STEP((name = get(span, "name")) ? 1 : -1);
    STEP(put_string_field(&b, 0x2A, name));
    STEP((kind = get(span, "kind")) && (kind_value = get(kind, "value")) ? 1 : -1);
    STEP(PyLong_CheckExact(kind_value) ? 1 : 0);
    STEP(reserve(&b, 2 * 9 + 12) == 0 ? 1 : -1);
    b.data[b.len++] = 0x30;
    put_varint(&b, (uint64_t)(PyLong_AsLong(kind_value) + 1));
    STEP(put_time(&b, 0x39, span, "start_time"));
    STEP(put_time(&b, 0x41, span, "end_time"));
    STEP((attributes = get(span, "_attributes")) ? 1 : (PyErr_ExceptionMatches(PyExc_AttributeError) ? (PyErr_Clear(), 0) : -1));
    if (attributes != Py_None) {
        STEP(PyDict_CheckExact(attributes) ? 1 : 0); /* BoundedAttributes (SDK spans): the Python encoder */
        STEP(put_attributes(&b, attributes));
    }
    STEP(is_empty(span, "events"));
    STEP(is_empty(span, "links"));
    STEP(is_zero(span, "dropped_events"));
    STEP(is_zero(span, "dropped_links"));
    STEP((status = get(span, "status")) ? 1 : -1);
    STEP(put_status(&b, status));
    STEP(reserve(&b, 8) == 0 ? 1 : -1);
    b.data[b.len++] = (char)0x85; b.data[b.len++] = 0x01;
    put_fixed32(&b, parent_remote ? 0x300 : 0x100);
done:
    Py_XDECREF(context); Py_XDECREF(parent); Py_XDECREF(state); Py_XDECREF(name); Py_XDECREF(kind);
    Py_XDECREF(kind_value); Py_XDECREF(attributes); Py_XDECREF(status); Py_XDECREF(id); Py_XDECREF(remote);
    PyObject *out = NULL;
    if (result > 0) {
        Py_ssize_t body = b.len - HEAD;
        char head[11];
        Buffer h = {head, 0, sizeof head};
        h.data[h.len++] = 0x12;
        put_varint(&h, (uint64_t)body);
        memcpy(b.data + HEAD - h.len, head, h.len);
        out = PyBytes_FromStringAndSize(b.data + HEAD - h.len, body + h.len);
    } else if (result == 0) {
        if (PyErr_Occurred()) PyErr_Clear();
        out = Py_NewRef(Py_None);
    }
    PyMem_Free(b.data);
    return out;
}

static PyMethodDef methods[] = {
    {"span_bytes", span_bytes, METH_O, "A ReadableSpan's OTLP Span field (tag and length included), or None for the Python encoder."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlp_span", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__otlp_span(void) {
#if PY_BIG_ENDIAN
    PyErr_SetString(PyExc_ImportError, "little-endian only (the Python encoder runs instead)");
    return NULL;
#endif
    return PyModule_Create(&module);
}
