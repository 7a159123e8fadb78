/* Strict JSON scanning over bytes, for _vllm_tokens.c: what json.loads accepts (UTF-8 as Python's
 * strict decoder, RFC 8259 numbers, no NaN/Infinity: those are left to Python), walked without building
 * objects. Functions return 0 when the value at the scan was read, -1 when not (the caller then
 * declines, and Python decides).
 */
#ifndef LIGHTNING_OTEL_JSON_SCAN_H
#define LIGHTNING_OTEL_JSON_SCAN_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 256

typedef const unsigned char *Ptr;
typedef struct { Ptr p, end; int depth; } Scan;

static void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int hexdigit(unsigned char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

/* One UTF-8 sequence past its lead byte (>= 0x80), as Python's strict decoder accepts it. */
static int utf8(Scan *s) {
    unsigned char c = s->p[0];
    int n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 1;
    else if (c >= 0xE0 && c <= 0xEF) { n = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    if (s->end - s->p <= n) return -1;
    if (s->p[1] < lo || s->p[1] > hi) return -1;
    for (int i = 2; i <= n; i++)
        if (s->p[i] < 0x80 || s->p[i] > 0xBF) return -1;
    s->p += n + 1;
    return 0;
}

/* At '"'. *escaped: whether it holds a backslash (a key we look for must match byte for byte). */
static int string(Scan *s, int *escaped) {
    s->p++;
    while (s->p < s->end) {
        unsigned char c = *s->p;
        if (c == '"') { s->p++; return 0; }
        if (c == '\\') {
            *escaped = 1;
            if (s->end - s->p < 2) return -1;
            c = s->p[1];
            if (c == 'u') {
                if (s->end - s->p < 6 || !hexdigit(s->p[2]) || !hexdigit(s->p[3]) || !hexdigit(s->p[4]) || !hexdigit(s->p[5])) return -1;
                s->p += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
                s->p += 2;
            } else {
                return -1;
            }
        } else if (c < 0x20) {
            return -1;
        } else if (c < 0x80) {
            s->p++;
        } else if (utf8(s) < 0) {
            return -1;
        }
    }
    return -1;
}

/* A JSON number; *integer: no fraction or exponent. */
static int number(Scan *s, int *integer) {
    Ptr p = s->p, end = s->end;
    *integer = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < end && *p >= '0' && *p <= '9') p++;
    else return -1;
    if (p < end && *p == '.') {
        *integer = 0;
        if (++p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integer = 0;
        if (++p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    return 0;
}

static int literal(Scan *s, const char *word, Py_ssize_t n) {
    if (s->end - s->p < n || memcmp(s->p, word, n) != 0) return -1;
    s->p += n;
    return 0;
}

static int value(Scan *s);

/* Members or elements up to the closing bracket; the scan is just past the opening one. */
static int container(Scan *s, unsigned char close) {
    if (++s->depth > MAX_DEPTH) return -1;
    ws(s);
    if (s->p < s->end && *s->p == close) { s->p++; s->depth--; return 0; }
    for (;;) {
        if (close == '}') {
            int escaped = 0;
            if (s->p >= s->end || *s->p != '"' || string(s, &escaped) < 0) return -1;
            ws(s);
            if (s->p >= s->end || *s->p != ':') return -1;
            s->p++;
            ws(s);
        }
        if (value(s) < 0) return -1;
        ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p != close) return -1;
        s->p++;
        s->depth--;
        return 0;
    }
}

static int value(Scan *s) {
    int flag = 0;
    if (s->p >= s->end) return -1;
    switch (*s->p) {
    case '{': s->p++; return container(s, '}');
    case '[': s->p++; return container(s, ']');
    case '"': return string(s, &flag);
    case 't': return literal(s, "true", 4);
    case 'f': return literal(s, "false", 5);
    case 'n': return literal(s, "null", 4);
    default: return number(s, &flag); /* NaN and Infinity fail here: the Python path decides */
    }
}

static int is_null(Scan *s) {
    if (s->end - s->p >= 4 && memcmp(s->p, "null", 4) == 0) { s->p += 4; return 1; }
    return 0;
}

/* Calls member(key, key length, scan at the value, state) for each member of the object at the scan;
 * member consumes the value. A key we may look for must not be escaped (it would have to match byte
 * for byte): any escaped key means unsure. */
typedef int (*Member)(const char *key, Py_ssize_t n, Scan *s, void *state);

static int members(Scan *s, Member member, void *state) {
    if (s->p >= s->end || *s->p != '{' || ++s->depth > MAX_DEPTH) return -1;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; s->depth--; return 0; }
    for (;;) {
        int escaped = 0;
        Ptr key = s->p + 1;
        if (s->p >= s->end || *s->p != '"' || string(s, &escaped) < 0 || escaped) return -1;
        Py_ssize_t n = s->p - 1 - key;
        ws(s);
        if (s->p >= s->end || *s->p != ':') return -1;
        s->p++;
        ws(s);
        if (member((const char *)key, n, s, state) < 0) return -1;
        ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p != '}') return -1;
        s->p++;
        s->depth--;
        return 0;
    }
}

/* Calls element(scan at the element, state) for each element of the array at the scan. */
static int elements(Scan *s, int (*element)(Scan *s, void *state), void *state) {
    if (s->p >= s->end || *s->p != '[') return -1;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == ']') { s->p++; return 0; }
    for (;;) {
        if (element(s, state) < 0) return -1;
        ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p != ']') return -1;
        s->p++;
        return 0;
    }
}

#endif
