/* OTLP ExportTraceServiceRequest bytes -> the spans table's columns, without a Python object per
 * attribute on the way (collector/lightning_otel/collector/span_decoder.py builds the Arrow batch from what this returns).
 *
 * Why C: the Parquet store's target (BENCHMARKS.md, issue 3 (b)) leaves no room for per-attribute
 * Python work; the pure-Python path (spans_table.py) spends ~30 us per training span in its loop
 * and copies each token array twice. Here the protobuf wire format is walked once and packed token
 * arrays are copied once, straight from the write-ahead log's mapping into the Arrow buffer.
 *
 * The pure-Python path stays the reference: this decoder handles the common shapes and, for
 * anything unusual (a repeated singular sub-message, a value set twice, wire types that do not
 * match, invalid UTF-8, a callback error), raises Fallback so the caller converts that request with
 * the Python path instead. Values it does not format itself (arrays, key-value lists, base64 or
 * plain token arrays, events) go through Python callbacks, so both paths produce equal rows
 * (tests/test_spans_codec.py checks that on generated requests). Little-endian hosts only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "_otlp_wire.h"

#define N_LISTS 3
#define MAX_SCALARS 32

static PyObject *Fallback;

/* slot codes from Python: index * 8 + kind; or a fallback (GenAI-convention attribute that fills an
   empty column and stays in the map): FALLBACK_FLAG | rank << 8 | how << 5 | column index */
#define FALLBACK_FLAG (1L << 20)
/* how a fallback's value becomes the column's: a string, an integer, a string mapped through
   operation_kinds, or anything else through the Python callback (span_rows.fallback_value) */
enum { FB_STR = 0, FB_INT = 1, FB_KIND = 2, FB_CALLBACK = 3 };
enum { K_STR = 0, K_INT = 1, K_FLOAT = 2, K_BOOL = 3, K_LIST_PLAIN = 4, K_LIST_PACKED = 5 };
/* AnyValue oneof field numbers */
enum { V_NONE = 0, V_STRING = 1, V_BOOL = 2, V_INT = 3, V_DOUBLE = 4, V_ARRAY = 5, V_KVLIST = 6, V_BYTES = 7 };

typedef struct {
    PyObject *bytes;  /* bytearray: the values */
    Py_ssize_t used;
    PyObject *offsets; /* bytearray: int32 offsets, rows + 1 */
    Py_ssize_t offsets_used;
    PyObject *validity; /* bytearray: bitmap */
    Py_ssize_t nulls;
    int width;
} ListOut;

typedef struct {
    /* config */
    PyObject *slots, *kinds, *statuses, *text_of, *list_value, *events_json, *service_key, *fallback_of;
    PyObject *operation_kinds;
    int n_scalars;
    /* outputs */
    PyObject *fixed[13];
    PyObject *scalars[MAX_SCALARS];
    ListOut lists[N_LISTS];
    PyObject *keys, *values, *offsets, *res_keys, *res_values, *res_offsets;
    Py_ssize_t rows;
} State;

enum { F_TRACE, F_SPAN, F_PARENT, F_NAME, F_KIND, F_START, F_END, F_DURATION, F_CODE, F_MESSAGE, F_SERVICE, F_SCOPE, F_EVENTS };

/* ---- AnyValue ------------------------------------------------------------------------------- */
typedef struct {
    int which;
    Reader raw;   /* the whole AnyValue message */
    Reader data;  /* string/bytes/array/kvlist payload */
    uint64_t number; /* bool/int/double bits */
} Value;

static int any_value(Reader raw, Value *v) {
    Reader r = raw;
    uint32_t field, wire;
    int seen = 0;
    v->which = V_NONE;
    v->raw = raw;
    while (r.p < r.end) {
        if (tag(&r, &field, &wire) < 0) return -1;
        if (field >= 1 && field <= 7) {
            if (seen++) return -1; /* a oneof set twice: merge rules, leave to the reference */
            v->which = (int)field;
            int want = (field == V_BOOL || field == V_INT) ? 0 : field == V_DOUBLE ? 1 : 2;
            if ((int)wire != want) return -1;
            if (want == 0 && varint(&r, &v->number) < 0) return -1;
            if (want == 1 && fixed64(&r, &v->number) < 0) return -1;
            if (want == 2 && sub(&r, &v->data) < 0) return -1;
        } else if (skip(&r, wire) < 0) return -1;
    }
    return 0;
}

static PyObject *raw_bytes(Reader s) { return PyBytes_FromStringAndSize((const char *)s.p, s.end - s.p); }

static PyObject *call1(PyObject *fn, PyObject *arg) { /* steals arg */
    if (!arg) return NULL;
    PyObject *out = PyObject_CallOneArg(fn, arg);
    Py_DECREF(arg);
    return out;
}

/* The map's text for a value: what spans_table._as_text(any_value(value)) gives (json.dumps). */
static PyObject *value_text(State *st, Value *v) {
    double d;
    switch (v->which) {
    case V_STRING: return text(v->data);
    case V_BYTES: return hex(v->data);
    case V_INT: return PyUnicode_FromFormat("%lld", (long long)(int64_t)v->number);
    case V_BOOL: return PyUnicode_FromString(v->number ? "true" : "false");
    case V_DOUBLE:
        memcpy(&d, &v->number, 8);
        if (isnan(d)) return PyUnicode_FromString("NaN");
        if (isinf(d)) return PyUnicode_FromString(d > 0 ? "Infinity" : "-Infinity");
        {
            PyObject *f = PyFloat_FromDouble(d);
            if (!f) return NULL;
            PyObject *out = PyObject_Repr(f);
            Py_DECREF(f);
            return out;
        }
    default: return call1(st->text_of, raw_bytes(v->raw)); /* arrays, key-value lists, empty */
    }
}

/* ---- one span ------------------------------------------------------------------------------- */
typedef struct {
    PyObject *scalars[MAX_SCALARS];
    PyObject *fallback[MAX_SCALARS]; /* a fallback's value, used when scalars[i] stays empty */
    int fallback_rank[MAX_SCALARS];
    Reader packed[N_LISTS];   /* a packed value straight from the input */
    PyObject *other[N_LISTS]; /* bytes from the Python callback (plain arrays, base64) */
    int has[N_LISTS];
} Row;

static void row_clear(Row *row, int n_scalars) {
    for (int i = 0; i < n_scalars; i++) { Py_CLEAR(row->scalars[i]); Py_CLEAR(row->fallback[i]); }
    for (int i = 0; i < N_LISTS; i++) { Py_CLEAR(row->other[i]); row->has[i] = 0; }
}

/* 1 = promoted into the row, 0 = not a fit (goes to the map), -1 = error */
static int promote(State *st, Row *row, long code, Value *v) {
    int kind = (int)(code & 7), index = (int)(code >> 3);
    PyObject *value = NULL;
    if (v->which == V_NONE) return 1; /* an empty value: nothing to keep */
    if (kind <= K_BOOL) {
        if (index >= st->n_scalars) return -1;
        if (kind == K_STR && v->which == V_STRING) value = text(v->data);
        else if (kind == K_INT && v->which == V_INT) value = PyLong_FromLongLong((int64_t)v->number);
        else if (kind == K_FLOAT && v->which == V_INT) value = PyFloat_FromDouble((double)(int64_t)v->number);
        else if (kind == K_FLOAT && v->which == V_DOUBLE) { double d; memcpy(&d, &v->number, 8); value = PyFloat_FromDouble(d); }
        else if (kind == K_BOOL && v->which == V_BOOL) value = PyBool_FromLong(v->number != 0);
        else return 0;
        if (!value) return -1;
        Py_XSETREF(row->scalars[index], value);
        return 1;
    }
    if (index >= N_LISTS) return -1;
    int packed = kind == K_LIST_PACKED;
    if (packed && v->which == V_BYTES) {
        if ((v->data.end - v->data.p) % st->lists[index].width) return 0;
        Py_CLEAR(row->other[index]);
        row->packed[index] = v->data;
        row->has[index] = 1;
        return 1;
    }
    PyObject *args = Py_BuildValue("(Nii)", raw_bytes(v->raw), index, packed);
    if (!args) return -1;
    PyObject *data = PyObject_CallObject(st->list_value, args);
    Py_DECREF(args);
    if (!data) return -1;
    if (data == Py_None) { Py_DECREF(data); return 0; }
    if (!PyBytes_Check(data)) { Py_DECREF(data); return -1; }
    if (packed || !row->has[index]) { /* a packed value wins over a plain array */
        Py_XSETREF(row->other[index], data);
        row->has[index] = 1;
    } else Py_DECREF(data);
    return 1;
}

/* Keep a fallback attribute's column value (span_rows.fallback_value) unless one of a lower rank is held. */
static int fallback(State *st, Row *row, long code, Value *v) {
    int index = (int)(code & 31), how = (int)((code >> 5) & 7), rank = (int)((code >> 8) & 0xfff);
    PyObject *value = NULL;
    if (v->which == V_NONE) return 0;
    if (index >= st->n_scalars) return -1;
    if (row->scalars[index]) return 0; /* the span's own value came first: it wins anyway */
    if (row->fallback[index] && row->fallback_rank[index] <= rank) return 0;
    if (how == FB_STR) {
        if (v->which != V_STRING) return 0;
        value = text(v->data);
    } else if (how == FB_INT) {
        if (v->which != V_INT) return 0;
        value = PyLong_FromLongLong((int64_t)v->number);
    } else if (how == FB_KIND) {
        if (v->which != V_STRING) return 0;
        PyObject *key = text(v->data);
        if (!key) return -1;
        value = PyDict_GetItemWithError(st->operation_kinds, key);
        Py_DECREF(key);
        if (!value) return PyErr_Occurred() ? -1 : 0;
        Py_INCREF(value);
    } else {
        PyObject *args = Py_BuildValue("(Ni)", raw_bytes(v->raw), rank);
        if (!args) return -1;
        value = PyObject_CallObject(st->fallback_of, args);
        Py_DECREF(args);
    }
    if (!value) return -1;
    if (value == Py_None) { Py_DECREF(value); return 0; }
    Py_XSETREF(row->fallback[index], value);
    row->fallback_rank[index] = rank;
    return 0;
}

/* A KeyValue: its key as a str (new reference) and its value; -1 on malformed input. */
static int key_value(Reader kv, PyObject **name, Value *v) {
    Reader key = {kv.p, kv.p}, raw = {NULL, NULL};
    uint32_t field, wire;
    int values = 0;
    while (kv.p < kv.end) {
        if (tag(&kv, &field, &wire) < 0) return -1;
        if (field == 1 && wire == 2) { if (sub(&kv, &key) < 0) return -1; }
        else if (field == 2 && wire == 2) { if (values++ || sub(&kv, &raw) < 0) return -1; }
        else if (field <= 2 || skip(&kv, wire) < 0) return -1;
    }
    if (raw.p == NULL) { raw.p = raw.end = kv.end; } /* no value: an empty AnyValue */
    if (any_value(raw, v) < 0) return -1;
    *name = text(key);
    return *name ? 0 : -1;
}

static int attribute(State *st, Row *row, Reader kv) {
    PyObject *name;
    Value v;
    if (key_value(kv, &name, &v) < 0) return -1;
    PyObject *slot = PyDict_GetItemWithError(st->slots, name);
    if (slot) {
        long code = PyLong_AsLong(slot);
        if (code & FALLBACK_FLAG) {
            if (fallback(st, row, code, &v) < 0) { Py_DECREF(name); return -1; }
        } else {
            int fits = promote(st, row, code, &v);
            if (fits != 0) { Py_DECREF(name); return fits; }
        }
    } else if (PyErr_Occurred()) { Py_DECREF(name); return -1; }
    if (v.which == V_NONE) { Py_DECREF(name); return 0; }
    if (append(st->keys, name) < 0) return -1;
    return append(st->values, value_text(st, &v));
}

static int finish_list(ListOut *out, const uint8_t *data, Py_ssize_t n, int valid, Py_ssize_t row) {
    if (n && put(out->bytes, &out->used, data, n) < 0) return -1;
    int32_t end = (int32_t)(out->used / out->width);
    if (out->used / out->width > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "list too long"); return -1; }
    if (put(out->offsets, &out->offsets_used, &end, 4) < 0) return -1;
    if (grow(out->validity, 0, row / 8 + 1) < 0) return -1;
    uint8_t *bits = (uint8_t *)PyByteArray_AS_STRING(out->validity);
    if (row % 8 == 0) bits[row / 8] = 0;
    if (valid) bits[row / 8] |= (uint8_t)(1 << (row % 8));
    else out->nulls++;
    return 0;
}

static PyObject *enum_name(PyObject *names, uint64_t raw) {
    int32_t value = (int32_t)raw;
    if (value >= 0 && value < PyTuple_GET_SIZE(names)) return Py_NewRef(PyTuple_GET_ITEM(names, value));
    return PyUnicode_FromFormat("%d", value);
}

static int status(Reader s, uint64_t *code, Reader *message) {
    uint32_t field, wire;
    while (s.p < s.end) {
        if (tag(&s, &field, &wire) < 0) return -1;
        if (field == 3 && wire == 0) { if (varint(&s, code) < 0) return -1; }
        else if (field == 2 && wire == 2) { if (sub(&s, message) < 0) return -1; }
        else if (field == 2 || field == 3 || skip(&s, wire) < 0) return -1;
    }
    return 0;
}

static int span(State *st, Reader r, PyObject *service, PyObject *scope, PyObject *res_keys, PyObject *res_values) {
    Reader empty = {r.p, r.p}, trace = empty, span_id = empty, parent = empty, name = empty, message = empty, st_raw;
    uint64_t kind = 0, start = 0, end = 0, code = 0;
    uint32_t field, wire;
    int statuses = 0;
    Row row;
    PyObject *events = NULL;
    memset(&row, 0, sizeof row);
    while (r.p < r.end) {
        if (tag(&r, &field, &wire) < 0) goto fail;
        int ok;
        switch (field) {
        case 1: ok = wire == 2 && sub(&r, &trace) == 0; break;
        case 2: ok = wire == 2 && sub(&r, &span_id) == 0; break;
        case 4: ok = wire == 2 && sub(&r, &parent) == 0; break;
        case 5: ok = wire == 2 && sub(&r, &name) == 0; break;
        case 6: ok = wire == 0 && varint(&r, &kind) == 0; break;
        case 7: ok = wire == 1 && fixed64(&r, &start) == 0; break;
        case 8: ok = wire == 1 && fixed64(&r, &end) == 0; break;
        case 9: {
            Reader kv;
            ok = wire == 2 && sub(&r, &kv) == 0 && attribute(st, &row, kv) >= 0;
            break;
        }
        case 11: {
            Reader ev;
            ok = wire == 2 && sub(&r, &ev) == 0;
            if (ok && !events && !(events = PyList_New(0))) goto fail;
            ok = ok && append(events, raw_bytes(ev)) == 0;
            break;
        }
        case 15: ok = wire == 2 && !statuses++ && sub(&r, &st_raw) == 0 && status(st_raw, &code, &message) == 0; break;
        default: ok = skip(&r, wire) == 0; /* trace_state, flags, links, dropped counts: not stored */
        }
        if (!ok) goto fail;
    }
    if (append(st->offsets, PyLong_FromSsize_t(PyList_GET_SIZE(st->keys))) < 0) goto fail;
    for (int i = 0; i < st->n_scalars; i++)
        if (PyList_Append(st->scalars[i], row.scalars[i] ? row.scalars[i] : row.fallback[i] ? row.fallback[i] : Py_None) < 0)
            goto fail;
    for (int i = 0; i < N_LISTS; i++) {
        ListOut *out = &st->lists[i];
        int rc;
        if (row.other[i]) rc = finish_list(out, (const uint8_t *)PyBytes_AS_STRING(row.other[i]), PyBytes_GET_SIZE(row.other[i]), 1, st->rows);
        else if (row.has[i]) rc = finish_list(out, row.packed[i].p, row.packed[i].end - row.packed[i].p, 1, st->rows);
        else rc = finish_list(out, NULL, 0, 0, st->rows);
        if (rc < 0) goto fail;
    }
    double duration = end >= start ? (double)(end - start) : -(double)(start - end);
    PyObject **f = st->fixed;
    if (append(f[F_TRACE], hex(trace)) < 0 || append(f[F_SPAN], hex(span_id)) < 0 ||
        append(f[F_PARENT], parent.p == parent.end ? Py_NewRef(Py_None) : hex(parent)) < 0 ||
        append(f[F_NAME], text(name)) < 0 || append(f[F_KIND], enum_name(st->kinds, kind)) < 0 ||
        append(f[F_START], PyLong_FromUnsignedLongLong(start / 1000)) < 0 ||
        append(f[F_END], PyLong_FromUnsignedLongLong(end / 1000)) < 0 ||
        append(f[F_DURATION], PyFloat_FromDouble(duration / 1e6)) < 0 ||
        append(f[F_CODE], enum_name(st->statuses, code)) < 0 ||
        append(f[F_MESSAGE], message.p == message.end ? Py_NewRef(Py_None) : text(message)) < 0 ||
        PyList_Append(f[F_SERVICE], service) < 0 || PyList_Append(f[F_SCOPE], scope) < 0 ||
        append(f[F_EVENTS], events ? call1(st->events_json, Py_NewRef(events)) : Py_NewRef(Py_None)) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(res_keys); i++)
        if (PyList_Append(st->res_keys, PyList_GET_ITEM(res_keys, i)) < 0 ||
            PyList_Append(st->res_values, PyList_GET_ITEM(res_values, i)) < 0) goto fail;
    if (append(st->res_offsets, PyLong_FromSsize_t(PyList_GET_SIZE(st->res_keys))) < 0) goto fail;
    st->rows++;
    row_clear(&row, st->n_scalars);
    Py_XDECREF(events);
    return 0;
fail:
    row_clear(&row, st->n_scalars);
    Py_XDECREF(events);
    return -1;
}

/* ---- resource and scope ----------------------------------------------------------------------- */
static int resource(State *st, Reader r, PyObject *keys, PyObject *values, PyObject **service) {
    uint32_t field, wire;
    while (r.p < r.end) {
        if (tag(&r, &field, &wire) < 0) return -1;
        if (field != 1) { if (skip(&r, wire) < 0) return -1; continue; }
        Reader kv;
        PyObject *name;
        Value v;
        if (wire != 2 || sub(&r, &kv) < 0 || key_value(kv, &name, &v) < 0) return -1;
        PyObject *value = value_text(st, &v);
        if (!value) { Py_DECREF(name); return -1; }
        /* the first service.name whose value reads as text (bytes read as hex, like any_value) */
        if (*service == Py_None && (v.which == V_STRING || v.which == V_BYTES) && PyUnicode_Compare(name, st->service_key) == 0)
            Py_SETREF(*service, Py_NewRef(value));
        int rc = PyList_Append(keys, name) < 0 || PyList_Append(values, value) < 0 ? -1 : 0;
        Py_DECREF(name);
        Py_DECREF(value);
        if (rc < 0) return -1;
    }
    return 0;
}

static int scope_spans(State *st, Reader r, PyObject *service, PyObject *res_keys, PyObject *res_values) {
    /* the scope may follow its spans on the wire: find it first */
    Reader walk = r, scope_raw = {NULL, NULL}, name = {NULL, NULL}, s;
    uint32_t field, wire;
    int scopes = 0;
    while (walk.p < walk.end) {
        if (tag(&walk, &field, &wire) < 0) return -1;
        if (field == 1) { if (wire != 2 || scopes++ || sub(&walk, &scope_raw) < 0) return -1; }
        else if (skip(&walk, wire) < 0) return -1;
    }
    if (scope_raw.p) {
        Reader q = scope_raw;
        while (q.p < q.end) {
            if (tag(&q, &field, &wire) < 0) return -1;
            if (field == 1) { if (wire != 2 || sub(&q, &name) < 0) return -1; }
            else if (skip(&q, wire) < 0) return -1;
        }
    }
    PyObject *scope = (name.p && name.p != name.end) ? text(name) : Py_NewRef(Py_None);
    if (!scope) return -1;
    int rc = 0;
    while (rc == 0 && r.p < r.end) {
        if (tag(&r, &field, &wire) < 0) { rc = -1; break; }
        if (field == 2) rc = (wire == 2 && sub(&r, &s) == 0) ? span(st, s, service, scope, res_keys, res_values) : -1;
        else rc = skip(&r, wire);
    }
    Py_DECREF(scope);
    return rc;
}

static int resource_spans(State *st, Reader r) {
    Reader walk = r, res = {r.p, r.p}, s;
    uint32_t field, wire;
    int resources = 0, rc = 0;
    while (walk.p < walk.end) {
        if (tag(&walk, &field, &wire) < 0) return -1;
        if (field == 1) { if (wire != 2 || resources++ || sub(&walk, &res) < 0) return -1; }
        else if (skip(&walk, wire) < 0) return -1;
    }
    PyObject *keys = PyList_New(0), *values = PyList_New(0), *service = Py_NewRef(Py_None);
    if (!keys || !values || resource(st, res, keys, values, &service) < 0) rc = -1;
    while (rc == 0 && r.p < r.end) {
        if (tag(&r, &field, &wire) < 0) { rc = -1; break; }
        if (field == 2) rc = (wire == 2 && sub(&r, &s) == 0) ? scope_spans(st, s, service, keys, values) : -1;
        else rc = skip(&r, wire);
    }
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_DECREF(service);
    return rc;
}

/* ---- entry point ------------------------------------------------------------------------------ */
static void state_clear(State *st) {
    for (int i = 0; i < 13; i++) Py_CLEAR(st->fixed[i]);
    for (int i = 0; i < MAX_SCALARS; i++) Py_CLEAR(st->scalars[i]);
    for (int i = 0; i < N_LISTS; i++) {
        Py_CLEAR(st->lists[i].bytes);
        Py_CLEAR(st->lists[i].offsets);
        Py_CLEAR(st->lists[i].validity);
    }
    Py_CLEAR(st->keys); Py_CLEAR(st->values); Py_CLEAR(st->offsets);
    Py_CLEAR(st->res_keys); Py_CLEAR(st->res_values); Py_CLEAR(st->res_offsets);
}

static PyObject *list_result(ListOut *out, Py_ssize_t rows) {
    if (PyByteArray_Resize(out->bytes, out->used) < 0 || PyByteArray_Resize(out->offsets, out->offsets_used) < 0 ||
        PyByteArray_Resize(out->validity, (rows + 7) / 8) < 0)
        return NULL;
    return Py_BuildValue("(OOOn)", out->bytes, out->offsets, out->validity, out->nulls);
}

PyDoc_STRVAR(decode_doc,
"decode(body, slots, n_scalars, widths, kinds, statuses, service_key, text_of, list_value, events_json,\n"
"       fallback_of, operation_kinds)\n"
"-> (rows, fixed, scalars, lists, attributes, resource_attributes); raises Fallback when the\n"
"request needs the reference (pure-Python) decoder.");

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer body;
    State st;
    PyObject *widths, *result = NULL;
    memset(&st, 0, sizeof st);
    if (!PyArg_ParseTuple(args, "y*O!iO!O!O!UOOOOO!", &body, &PyDict_Type, &st.slots, &st.n_scalars, &PyTuple_Type, &widths,
                          &PyTuple_Type, &st.kinds, &PyTuple_Type, &st.statuses, &st.service_key, &st.text_of,
                          &st.list_value, &st.events_json, &st.fallback_of, &PyDict_Type, &st.operation_kinds))
        return NULL;
    if (st.n_scalars > MAX_SCALARS || PyTuple_GET_SIZE(widths) != N_LISTS) {
        PyBuffer_Release(&body);
        PyErr_SetString(PyExc_ValueError, "unsupported spans layout");
        return NULL;
    }
    for (int i = 0; i < 13; i++) if (!(st.fixed[i] = PyList_New(0))) goto done;
    for (int i = 0; i < st.n_scalars; i++) if (!(st.scalars[i] = PyList_New(0))) goto done;
    for (int i = 0; i < N_LISTS; i++) {
        ListOut *out = &st.lists[i];
        int32_t zero = 0;
        out->width = (int)PyLong_AsLong(PyTuple_GET_ITEM(widths, i));
        if (out->width <= 0 || !(out->bytes = PyByteArray_FromStringAndSize(NULL, 0)) ||
            !(out->offsets = PyByteArray_FromStringAndSize(NULL, 0)) || !(out->validity = PyByteArray_FromStringAndSize(NULL, 0)) ||
            put(out->offsets, &out->offsets_used, &zero, 4) < 0)
            goto done;
    }
    if (!(st.keys = PyList_New(0)) || !(st.values = PyList_New(0)) || !(st.offsets = PyList_New(0)) ||
        !(st.res_keys = PyList_New(0)) || !(st.res_values = PyList_New(0)) || !(st.res_offsets = PyList_New(0)))
        goto done;
    if (append(st.offsets, PyLong_FromLong(0)) < 0 || append(st.res_offsets, PyLong_FromLong(0)) < 0) goto done;

    Reader r = {(const uint8_t *)body.buf, (const uint8_t *)body.buf + body.len}, s;
    uint32_t field, wire;
    int rc = 0;
    while (rc == 0 && r.p < r.end) {
        if (tag(&r, &field, &wire) < 0) { rc = -1; break; }
        if (field == 1) rc = (wire == 2 && sub(&r, &s) == 0) ? resource_spans(&st, s) : -1;
        else rc = skip(&r, wire);
    }
    if (rc < 0) goto done;
    PyObject *fixed = PyTuple_New(13), *scalars = PyTuple_New(st.n_scalars), *lists = PyTuple_New(N_LISTS);
    if (fixed && scalars && lists) {
        for (int i = 0; i < 13; i++) PyTuple_SET_ITEM(fixed, i, Py_NewRef(st.fixed[i]));
        for (int i = 0; i < st.n_scalars; i++) PyTuple_SET_ITEM(scalars, i, Py_NewRef(st.scalars[i]));
        int ok = 1;
        for (int i = 0; i < N_LISTS && ok; i++) {
            PyObject *item = list_result(&st.lists[i], st.rows);
            if (item) PyTuple_SET_ITEM(lists, i, item); else ok = 0;
        }
        if (ok)
            result = Py_BuildValue("(nOOO(OOO)(OOO))", st.rows, fixed, scalars, lists, st.offsets, st.keys, st.values,
                                   st.res_offsets, st.res_keys, st.res_values);
    }
    Py_XDECREF(fixed); Py_XDECREF(scalars); Py_XDECREF(lists);
done:
    PyBuffer_Release(&body);
    state_clear(&st);
    if (!result && !PyErr_ExceptionMatches(PyExc_MemoryError)) {
        /* malformed or unusual input, or a callback that raised: the reference decoder decides */
        PyErr_Clear();
        PyErr_SetString(Fallback, "request left to the reference decoder");
    }
    return result;
}

PyDoc_STRVAR(keep_freed_memory_doc,
"keep_freed_memory(max_block) -> bool: glibc keeps freed blocks up to max_block bytes (and a free heap\n"
"top up to twice that) for reuse instead of returning them to the kernel; False where not glibc.");

/* A conversion worker decodes one log segment after another into token buffers of megabytes each.
 * By default glibc unmaps such blocks (or trims the heap) once they are freed, so every segment's
 * buffers are faulted in again as fresh zeroed pages: measured, about a third of decoding a
 * training span (BENCHMARKS.md, issue 16). Kept in the heap, they are reused as they are. */
static PyObject *keep_freed_memory(PyObject *self, PyObject *arg) {
    long max_block = PyLong_AsLong(arg);
    if (max_block == -1 && PyErr_Occurred()) return NULL;
    if (max_block <= 0 || max_block > INT_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "max_block out of range");
        return NULL;
    }
#ifdef __GLIBC__
    return PyBool_FromLong(mallopt(M_MMAP_THRESHOLD, (int)max_block) && mallopt(M_TRIM_THRESHOLD, (int)(2 * max_block)));
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {"keep_freed_memory", keep_freed_memory, METH_O, keep_freed_memory_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spans_codec", "OTLP spans -> columns (see spans_fast.py).", -1, methods};

PyMODINIT_FUNC PyInit__spans_codec(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Fallback = PyErr_NewException("_spans_codec.Fallback", PyExc_ValueError, NULL);
    if (!Fallback || PyModule_AddObjectRef(m, "Fallback", Fallback) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
