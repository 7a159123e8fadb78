/* The receiver's quick check of an OTLP/protobuf export body: is it well-formed, how many spans
 * does it hold, and do all of them have valid ids? (collector/lightning_otel/collector/request_check.py)
 *
 * Why C: the receiver used to parse every body into upb message objects only to validate it,
 * count its spans and check their ids, then threw the objects away (the conversion workers decode
 * the logged bytes again). That parse held the GIL ~5 ms per 5 MB request, the largest item of
 * the receiver's CPU. This walk reads the wire format once, checks UTF-8 where upb would, keeps
 * nothing, and runs without the GIL.
 *
 * It answers only when it is sure: a count when every field is one the schema (built from the
 * installed protobuf descriptors) knows with the wire type it expects, every string is valid
 * UTF-8, nesting is shallow, every span's ids have the OTLP lengths and no attribute or resource
 * comes near a size cap (size_caps.py; measured on the wire, never less than upb's ByteSize).
 * Anything else (unknown fields, groups, malformed or truncated data, deep nesting, a span with bad
 * ids, a size cap passed) gives None and the caller parses the body with upb as before, which
 * decides between 400 and partial success.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_otlp_wire.h"

#define MAX_SCHEMAS 64
#define MAX_DEPTH 32

/* A field's kind in a schema row (indexed by field number); 16 + i is a message of schema i. */
enum { F_UNKNOWN = 0, F_VARINT = 1, F_FIXED64 = 2, F_FIXED32 = 3, F_BYTES = 4, F_STRING = 5, F_MESSAGE = 16 };

typedef struct {
    uint8_t *kinds;
    Py_ssize_t n;
} Schema;

static Schema schemas[MAX_SCHEMAS];
static int n_schemas = 0;
static int span_schema = -1;
static uint32_t trace_id_field, span_id_field, parent_field;
/* size caps (size_caps.py): every KeyValue's key and whole length; per ResourceSpans, its resource */
static int key_value_schema = -1, resource_spans_schema = -1;
static uint32_t key_field, resource_field;
static Py_ssize_t max_key, max_attribute, max_resource, max_resource_copy;

typedef struct {
    Py_ssize_t spans;
} Tally;

/* Strict UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF), as upb checks it. */
static int utf8_ok(const uint8_t *s, const uint8_t *end) {
    while (s < end) {
        if (end - s >= 8) {
            uint64_t word;
            memcpy(&word, s, 8);
            if (!(word & 0x8080808080808080ULL)) {
                s += 8;
                continue;
            }
        }
        uint8_t c = *s;
        if (c < 0x80) {
            s++;
        } else if (c < 0xC2) {
            return 0; /* a stray continuation byte, or an overlong 2-byte form */
        } else if (c < 0xE0) {
            if (end - s < 2 || (s[1] & 0xC0) != 0x80) return 0;
            s += 2;
        } else if (c < 0xF0) {
            if (end - s < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F)) return 0; /* overlong; surrogate */
            s += 3;
        } else if (c < 0xF5) {
            if (end - s < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
            if ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F)) return 0; /* overlong; > U+10FFFF */
            s += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* 0: the message is well-formed and every span in it has valid ids; -1: not sure (fall back). */
static int walk(Reader r, int schema, int depth, Tally *tally) {
    if (depth > MAX_DEPTH) return -1;
    const Schema *s = &schemas[schema];
    const int is_span = schema == span_schema;
    const int is_key_value = schema == key_value_schema, is_resource_spans = schema == resource_spans_schema;
    Py_ssize_t trace_id = 0, span_id = 0, parent = 0; /* lengths; the last occurrence counts */
    Py_ssize_t resource = 0, spans_before = tally->spans; /* every occurrence counts: upb merges them */
    if (is_key_value && r.end - r.p > max_attribute) return -1;
    while (r.p < r.end) {
        uint32_t field, wire;
        uint64_t value;
        Reader sub_reader;
        if (tag(&r, &field, &wire) < 0) return -1;
        int kind = field < (uint32_t)s->n ? s->kinds[field] : F_UNKNOWN;
        switch (kind) {
        case F_UNKNOWN:
            return -1;
        case F_VARINT:
            if (wire != 0 || varint(&r, &value) < 0) return -1;
            break;
        case F_FIXED64:
            if (wire != 1 || fixed64(&r, &value) < 0) return -1;
            break;
        case F_FIXED32:
            if (wire != 5 || r.end - r.p < 4) return -1;
            r.p += 4;
            break;
        case F_BYTES:
        case F_STRING:
            if (wire != 2 || sub(&r, &sub_reader) < 0) return -1;
            if (kind == F_STRING && !utf8_ok(sub_reader.p, sub_reader.end)) return -1;
            if (is_key_value && field == key_field && sub_reader.end - sub_reader.p > max_key) return -1;
            if (is_span) {
                Py_ssize_t length = sub_reader.end - sub_reader.p;
                if (field == trace_id_field) trace_id = length;
                else if (field == span_id_field) span_id = length;
                else if (field == parent_field) parent = length;
            }
            break;
        default: /* a message */
            if (wire != 2 || sub(&r, &sub_reader) < 0) return -1;
            if (is_resource_spans && field == resource_field) resource += sub_reader.end - sub_reader.p;
            if (walk(sub_reader, kind - F_MESSAGE, depth + 1, tally) < 0) return -1;
        }
    }
    if (is_resource_spans &&
        (resource > max_resource || (tally->spans - spans_before) > max_resource_copy / (resource ? resource : 1)))
        return -1;
    if (is_span) {
        if (trace_id != 16 || span_id != 8 || (parent != 0 && parent != 8)) return -1;
        tally->spans++;
    }
    return 0;
}

PyDoc_STRVAR(configure_doc,
             "configure(schemas, span_schema, trace_id_field, span_id_field, parent_field, key_value_schema,\n"
             "          key_field, resource_spans_schema, resource_field, max_key, max_attribute, max_resource,\n"
             "          max_resource_copy)\n\n"
             "Set the message schemas (one bytes row of field kinds per message; schema 0 is the request)\n"
             "and the size caps.");

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *rows;
    int span, kv, rs;
    unsigned int trace_f, span_f, parent_f, key_f, resource_f;
    Py_ssize_t caps[4];
    if (!PyArg_ParseTuple(args, "O!iIIIiIiInnnn", &PyTuple_Type, &rows, &span, &trace_f, &span_f, &parent_f, &kv, &key_f,
                          &rs, &resource_f, &caps[0], &caps[1], &caps[2], &caps[3]))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    if (n < 1 || n > MAX_SCHEMAS || span < 0 || span >= n || kv < 0 || kv >= n || rs < 0 || rs >= n || caps[0] < 0 ||
        caps[1] < 0 || caps[2] < 0 || caps[3] < 0) {
        PyErr_SetString(PyExc_ValueError, "bad schema table");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        if (!PyBytes_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "schema rows must be bytes");
            return NULL;
        }
        const uint8_t *kinds = (const uint8_t *)PyBytes_AS_STRING(row);
        for (Py_ssize_t f = 0; f < PyBytes_GET_SIZE(row); f++) {
            if (kinds[f] > F_STRING && (kinds[f] < F_MESSAGE || kinds[f] - F_MESSAGE >= n)) {
                PyErr_SetString(PyExc_ValueError, "schema row names an unknown kind or message");
                return NULL;
            }
        }
    }
    for (int i = 0; i < n_schemas; i++) PyMem_Free(schemas[i].kinds);
    n_schemas = 0;
    span_schema = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        Py_ssize_t size = PyBytes_GET_SIZE(row);
        schemas[i].kinds = PyMem_Malloc(size ? size : 1);
        if (!schemas[i].kinds) return PyErr_NoMemory();
        memcpy(schemas[i].kinds, PyBytes_AS_STRING(row), size);
        schemas[i].n = size;
        n_schemas = (int)i + 1;
    }
    span_schema = span;
    trace_id_field = trace_f;
    span_id_field = span_f;
    parent_field = parent_f;
    key_value_schema = kv;
    key_field = key_f;
    resource_spans_schema = rs;
    resource_field = resource_f;
    max_key = caps[0];
    max_attribute = caps[1];
    max_resource = caps[2];
    max_resource_copy = caps[3];
    Py_RETURN_NONE;
}

PyDoc_STRVAR(span_count_doc,
             "span_count(body) -> int | None\n\n"
             "The number of spans in an ExportTraceServiceRequest when the body is well-formed, every\n"
             "string valid UTF-8 and every span's ids valid; None when not sure (parse it instead).");

static PyObject *span_count(PyObject *self, PyObject *arg) {
    if (n_schemas == 0) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Reader r = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    Tally tally = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = walk(r, 0, 0, &tally);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc < 0) Py_RETURN_NONE;
    return PyLong_FromSsize_t(tally.spans);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, configure_doc},
    {"span_count", span_count, METH_O, span_count_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_request_check", "Quick validation of OTLP export bodies (see request_check.py).", -1,
    methods};

PyMODINIT_FUNC PyInit__request_check(void) { return PyModule_Create(&module); }
