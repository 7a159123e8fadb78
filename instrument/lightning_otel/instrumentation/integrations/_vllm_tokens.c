/* vLLM's token fields, cut from a raw chat/completions response body before Python parses it.
 *
 * cut(body, chat, strip_ids, strip_logprobs) -> (text, prompt, completion, logprobs, position) | None
 *
 * text is the body as str (checked as UTF-8) with the token fields the caller did not ask for set to
 * null (as vLLM answers a request that does not ask: `"prompt_token_ids": null`), so json.loads no
 * longer builds a Python int per prompt token and a dict per logprob; prompt/completion are the ids of the first choice with
 * index 0 as little-endian int32 bytes, logprobs its logprobs as little-endian float64 bytes (each
 * None when absent or null), position that choice's place in `choices` (-1: none). Field places as in
 * vllm_endpoint.token_attributes: chat prompt ids at the top level, completions' in the choice;
 * chat logprobs in logprobs.content[i].logprob, completions' in logprobs.token_logprobs.
 *
 * It answers only when it is sure to agree with json.loads and the Python reader: the whole body is
 * checked as strict JSON (what json.loads accepts, UTF-8 included), and anything unusual (NaN or
 * Infinity, escaped or repeated keys we look for, ids past int32, non-numeric logprobs, another
 * top-level shape) returns None, and the caller takes the Python path (the reference; both are
 * compared in tests/test_vllm_tokens.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030B0000 /* public from 3.11 */
#define PyFloat_Pack8 _PyFloat_Pack8
#endif

#include "../_buffer.h"
#include "../_json_scan.h"

#define MAX_CUTS 64

typedef struct { Ptr start, end; } Span; /* a value's bytes */
#define KEY(name) (n == (Py_ssize_t)sizeof(name) - 1 && memcmp(key, name, n) == 0)

/* An array of JSON integers in int32 (a fraction or an exponent is not an id) -> little-endian bytes.
 * Its own loop: a prompt's ids are most of a response's bytes. */
static int put_ids(Scan *s, Buffer *b) {
    Ptr p = s->p + 1, end = s->end; /* past '[' */
    /* room for as many ids as the rest of the body could hold ("1," per id): no check per id */
    if (reserve(b, ((end - p) / 2 + 1) * 4) < 0) return -1;
    unsigned char *out = (unsigned char *)b->data + b->len;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    if (p < end && *p == ']') { s->p = p + 1; return 0; }
    for (;;) {
        int negative = p < end && *p == '-';
        p += negative;
        if (p >= end || *p < '0' || *p > '9') return -1;
        Ptr digits = p;
        uint64_t x = 0;
        if (*p == '0') p++;
        else while (p < end && (unsigned)(*p - '0') < 10) x = x * 10 + (*p++ - '0');
        if (p >= end || p - digits > 10 || *p == '.' || *p == 'e' || *p == 'E' || (unsigned)(*p - '0') < 10) return -1;
        if (x > (negative ? (uint64_t)INT32_MAX + 1 : (uint64_t)INT32_MAX)) return -1;
        uint32_t u = negative ? (uint32_t)(0u - (uint32_t)x) : (uint32_t)x;
        out[0] = (unsigned char)u, out[1] = (unsigned char)(u >> 8), out[2] = (unsigned char)(u >> 16), out[3] = (unsigned char)(u >> 24);
        out += 4;
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
        if (p >= end) return -1;
        if (*p == ']') { s->p = p + 1; break; }
        if (*p++ != ',') return -1;
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    }
    b->len = (char *)out - b->data;
    return 0;
}

static const double POWERS[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number as float() reads it. Up to 15 significant digits and a power of ten up to 22: the
 * digits and the power are exact doubles, so one multiplication or division rounds correctly (the
 * exact-case shortcut of every correct strtod); otherwise Python's own conversion of the text. An
 * integer float() might refuse (past 15 digits: OverflowError for huge ones) is left to Python. */
static int put_float(Scan *s, void *state) {
    Buffer *b = state;
    Ptr start = s->p;
    int integer;
    if (number(s, &integer) < 0 || reserve(b, 8) < 0) return -1;
    Ptr p = start + (*start == '-');
    uint64_t digits = 0;
    int significant = 0, exponent = 0;
    for (; p < s->p && *p != 'e' && *p != 'E'; p++) {
        if (*p == '.') { for (p++; p < s->p && *p >= '0' && *p <= '9'; p++, exponent--) if (significant || *p != '0') { digits = digits * 10 + (*p - '0'); significant++; } break; }
        if (significant || *p != '0') { digits = digits * 10 + (*p - '0'); significant++; }
        if (significant > 18) break;
    }
    double x;
    int fast = significant <= 15;
    if (fast && p < s->p && (*p == 'e' || *p == 'E')) {
        int sign = 1, e = 0;
        p++;
        if (*p == '+' || *p == '-') sign = *p++ == '-' ? -1 : 1;
        for (; p < s->p && e < 1000; p++) e = e * 10 + (*p - '0');
        fast = p == s->p;
        exponent += sign * e;
    }
    if (integer && significant > 15) return -1;
    if (fast && exponent >= -22 && exponent <= 22) {
        x = exponent < 0 ? (double)digits / POWERS[-exponent] : (double)digits * POWERS[exponent];
        if (*start == '-' && !(integer && digits == 0)) x = -x; /* json.loads("-0") is the int 0 */
    } else {
        char text[64], *stop;
        Py_ssize_t n = s->p - start;
        if (n >= (Py_ssize_t)sizeof(text)) return -1;
        memcpy(text, start, n);
        text[n] = 0;
        x = PyOS_string_to_double(text, &stop, NULL); /* float()'s conversion: the same double */
        if ((x == -1.0 && PyErr_Occurred()) || stop != text + n) return -1;
    }
    if (PyFloat_Pack8(x, b->data + b->len, 1) < 0) return -1;
    b->len += 8;
    return 0;
}

/* An array of ids (element NULL) or numbers into *b, or null; *present: it was an array. */
static int array(Scan *s, int (*element)(Scan *, void *), Buffer *b, int *present) {
    if (*present) return -1; /* a repeated key: json.loads keeps the last; the Python path */
    if (is_null(s)) return 0;
    *present = 1;
    if (element) return elements(s, element, b);
    return s->p < s->end && *s->p == '[' ? put_ids(s, b) : -1;
}

typedef struct {
    Buffer *out;
    int seen;
} Entry;

static int entry_member(const char *key, Py_ssize_t n, Scan *s, void *state) {
    Entry *e = state;
    if (!KEY("logprob")) return value(s);
    if (e->seen++) return -1;
    return put_float(s, e->out);
}

/* One element of a chat choice's logprobs.content: its logprob. */
static int put_entry(Scan *s, void *state) {
    Entry e = {state, 0};
    return members(s, entry_member, &e) < 0 || !e.seen ? -1 : 0;
}

typedef struct {
    int chat;
    Buffer *out;
    int present, other; /* the list was there and not null; the other kind's list was seen */
} Logprobs;

static int logprobs_member(const char *key, Py_ssize_t n, Scan *s, void *state) {
    Logprobs *l = state;
    if (KEY("content") || KEY("token_logprobs")) {
        if (l->chat != (n == 7)) return l->other++ ? -1 : value(s);
        return array(s, l->chat ? put_entry : put_float, l->out, &l->present);
    }
    return value(s);
}

typedef struct {
    int chat, strip_ids, strip_logprobs;
    Py_ssize_t count, position;    /* choices seen; the chosen one's place (-1: none yet) */
    Buffer prompt, ids, lps;       /* the chosen choice's (the top-level prompt ids for chat) */
    int has_prompt, has_ids, has_lps;
    Span cuts[MAX_CUTS];           /* values to set to null, in body order */
    int ncuts;
} Walk;

typedef struct {
    Walk *w;
    Buffer prompt, ids, lps;
    int has_prompt, has_ids, has_lps, has_index, zero;
} Choice;

static int cut_here(Walk *w, Ptr start, Ptr end) {
    if (end - start == 4 && memcmp(start, "null", 4) == 0) return 0; /* null already */
    if (w->ncuts == MAX_CUTS) return -1;
    w->cuts[w->ncuts].start = start;
    w->cuts[w->ncuts++].end = end;
    return 0;
}

/* index missing, null or 0: the choice vllm_endpoint.first_choice takes; another integer: not. */
static int read_index(Scan *s, Choice *c) {
    if (c->has_index++) return -1;
    if (is_null(s)) { c->zero = 1; return 0; }
    Ptr start = s->p;
    int integer;
    if (number(s, &integer) < 0 || !integer) return -1;
    c->zero = start[*start == '-'] == '0'; /* no leading zeros in JSON: "0" or "-0" alone */
    return 0;
}

static int choice_member(const char *key, Py_ssize_t n, Scan *s, void *state) {
    Choice *c = state;
    Walk *w = c->w;
    Ptr start = s->p;
    int rc, strip;
    if (KEY("index")) return read_index(s, c);
    if (KEY("token_ids")) {
        rc = array(s, NULL, &c->ids, &c->has_ids);
        strip = w->strip_ids;
    } else if (KEY("prompt_token_ids")) {
        rc = w->chat ? (c->has_prompt++ ? -1 : value(s)) : array(s, NULL, &c->prompt, &c->has_prompt);
        strip = w->strip_ids;
    } else if (KEY("logprobs")) {
        Logprobs l = {w->chat, &c->lps, 0, 0};
        if (c->has_lps) return -1;
        c->has_lps = 1;
        rc = is_null(s) ? 0 : members(s, logprobs_member, &l);
        c->has_lps = l.present ? 1 : 2; /* 2: the key without a list */
        strip = w->strip_logprobs;
    } else {
        return value(s);
    }
    return rc < 0 || (strip && cut_here(w, start, s->p) < 0) ? -1 : 0;
}

static void release(Buffer *b) { PyMem_Free(b->data); b->data = NULL; b->len = b->cap = 0; }

static int walk_choice(Scan *s, void *state) {
    Walk *w = state;
    Choice c;
    memset(&c, 0, sizeof c);
    c.w = w;
    int rc = members(s, choice_member, &c);
    if (rc == 0 && (!c.has_index || c.zero) && w->position < 0) { /* the chosen one: keep its lists */
        w->position = w->count;
        w->ids = c.ids, w->has_ids = c.has_ids;
        w->lps = c.lps, w->has_lps = c.has_lps == 1;
        if (!w->chat) w->prompt = c.prompt, w->has_prompt = c.has_prompt;
    } else {
        release(&c.ids);
        release(&c.lps);
    }
    if (w->chat || w->position != w->count) release(&c.prompt);
    w->count++;
    return rc;
}

static int top_member(const char *key, Py_ssize_t n, Scan *s, void *state) {
    Walk *w = state;
    Ptr start = s->p;
    if (KEY("choices")) {
        if (w->count || w->position >= 0 || (s->p < s->end && *s->p != '[')) return -1; /* a repeated or odd list */
        w->count = 0;
        if (elements(s, walk_choice, w) < 0) return -1;
        if (!w->count) w->count = -1; /* seen, empty */
        return 0;
    }
    if (!KEY("prompt_token_ids")) return value(s);
    if (w->chat ? array(s, NULL, &w->prompt, &w->has_prompt) < 0 : (w->has_prompt++ ? -1 : value(s)) < 0) return -1;
    return w->strip_ids ? cut_here(w, start, s->p) : 0;
}

static PyObject *bytes_or_none(Buffer *b, int present) {
    if (!present) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
}

static PyObject *cut(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer body;
    int chat, strip_ids, strip_logprobs;
    if (!PyArg_ParseTuple(args, "y*ppp", &body, &chat, &strip_ids, &strip_logprobs)) return NULL;
    PyObject *result = NULL, *trimmed = NULL;
    Walk *w = PyMem_Calloc(1, sizeof(Walk));
    if (!w) { PyBuffer_Release(&body); return PyErr_NoMemory(); }
    w->chat = chat, w->strip_ids = strip_ids, w->strip_logprobs = strip_logprobs, w->position = -1;
    Scan s = {body.buf, (Ptr)body.buf + body.len, 0};
    ws(&s);
    if (members(&s, top_member, w) < 0) goto unsure;
    ws(&s);
    if (s.p != s.end || !w->count) goto unsure; /* trailing bytes, or no choices list */
    if (w->ncuts == 0) {
        trimmed = PyUnicode_DecodeUTF8(body.buf, body.len, "strict");
    } else {
        Py_ssize_t size = body.len;
        for (int i = 0; i < w->ncuts; i++) size -= (w->cuts[i].end - w->cuts[i].start) - 4;
        char *text = PyMem_Malloc(size ? size : 1);
        if (!text) { PyErr_NoMemory(); goto done; }
        char *out = text;
        Ptr from = body.buf;
        for (int i = 0; i < w->ncuts; i++) {
            memcpy(out, from, w->cuts[i].start - from);
            out += w->cuts[i].start - from;
            memcpy(out, "null", 4);
            out += 4;
            from = w->cuts[i].end;
        }
        memcpy(out, from, (Ptr)body.buf + body.len - from);
        trimmed = PyUnicode_DecodeUTF8(text, size, "strict");
        PyMem_Free(text);
    }
    if (trimmed) {
        int chosen = w->position >= 0;
        result = Py_BuildValue("(NNNNn)", trimmed, bytes_or_none(&w->prompt, chosen && w->has_prompt),
                               bytes_or_none(&w->ids, chosen && w->has_ids), bytes_or_none(&w->lps, chosen && w->has_lps), w->position);
    }
    goto done;
unsure:
    if (!PyErr_Occurred()) { result = Py_None; Py_INCREF(result); }
done:
    release(&w->prompt);
    release(&w->ids);
    release(&w->lps);
    PyMem_Free(w);
    PyBuffer_Release(&body);
    return result;
}

static PyMethodDef methods[] = {
    {"cut", cut, METH_VARARGS, "cut(body, chat, strip_ids, strip_logprobs) -> (text, prompt, completion, logprobs, position) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_vllm_tokens", "vLLM token fields cut from a response body.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__vllm_tokens(void) { return PyModule_Create(&module); }
