/* A growable byte buffer on Python's allocator, shared by the compiled helpers (_otlp_span.c,
 * _vllm_tokens.c). The includer includes Python.h first. */
#ifndef LIGHTNING_OTEL_BUFFER_H
#define LIGHTNING_OTEL_BUFFER_H

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

/* Room for `more` bytes after len: 0, or -1 with MemoryError set (the buffer is left as it was). */
static int reserve(Buffer *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->len + more) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (!data) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->cap = cap;
    return 0;
}

#endif
