/*
 * Compiled loops of the sorted-run format (airflow_seatunnel_ckpt/core/runs.py).
 *
 * The format is defined by runs.py's numpy code: key_hashes, _mix, _word_masks and
 * Bloom (layout 2). These loops compute exactly the same values in one pass each
 * instead of numpy's one pass per operation (and, for byte keys, per byte position);
 * tests/core/test_runs_accel.py holds both paths to byte-identical results. The word
 * masks are passed in from runs._word_masks so their definition stays in one place.
 *
 * Plain CPython C API over the buffer protocol (numpy arrays, bytes, Arrow buffers):
 * no numpy headers, so it builds with only a C compiler and Python's headers. Every
 * buffer is bounds-checked before the loops run; the loops release the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MASKS 65536

static inline uint64_t mix64(uint64_t x) {
    /* splitmix64's finaliser, as runs._mix */
    x += 0x9E3779B97F4A7C15ULL;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

static inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* any alignment; a plain load on the targets we build for */
    return v;
}

static inline void store64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

/* Get a C-contiguous buffer, writable or not; 0 on success, -1 with an exception set. */
static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous%s buffer", what, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

static int check_words(Py_buffer *view, const char *what) {
    if (view->len % 8) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not whole 64-bit words", what, view->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(mix_doc,
"mix(values, out)\n--\n\n"
"out[i] = splitmix64 finaliser of the 64-bit word values[i] (native byte order).");

static PyObject *accel_mix(PyObject *self, PyObject *args) {
    PyObject *values_obj, *out_obj;
    Py_buffer values, out;
    if (!PyArg_ParseTuple(args, "OO:mix", &values_obj, &out_obj))
        return NULL;
    if (get_buffer(values_obj, &values, 0, "values") < 0)
        return NULL;
    if (get_buffer(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&values);
        return NULL;
    }
    if (check_words(&values, "values") < 0 || values.len != out.len) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "out holds %zd bytes, values %zd", out.len, values.len);
        PyBuffer_Release(&values);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t n = values.len / 8;
    const unsigned char *src = values.buf;
    unsigned char *dst = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        store64(dst + 8 * i, mix64(load64(src + 8 * i)));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(fnv1a_doc,
"fnv1a(offsets, width, data, out)\n--\n\n"
"out[i] = mix(FNV-1a 64 of data[offsets[i]:offsets[i+1]] ^ length): Arrow binary offsets\n"
"of ``width`` bytes (4 or 8), len(out) + 1 of them.");

static PyObject *accel_fnv1a(PyObject *self, PyObject *args) {
    PyObject *offsets_obj, *data_obj, *out_obj;
    int width;
    Py_buffer offsets, data, out;
    if (!PyArg_ParseTuple(args, "OiOO:fnv1a", &offsets_obj, &width, &data_obj, &out_obj))
        return NULL;
    if (width != 4 && width != 8) {
        PyErr_Format(PyExc_ValueError, "offsets are 4 or 8 bytes wide, not %d", width);
        return NULL;
    }
    if (get_buffer(offsets_obj, &offsets, 0, "offsets") < 0)
        return NULL;
    if (get_buffer(data_obj, &data, 0, "data") < 0) {
        PyBuffer_Release(&offsets);
        return NULL;
    }
    if (get_buffer(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&offsets);
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = out.len / 8;
    if (out.len % 8 || offsets.len != (n + 1) * width) {
        PyErr_Format(PyExc_ValueError, "%zd bytes of offsets do not describe %zd keys", offsets.len, n);
        goto done;
    }
    const unsigned char *offs = offsets.buf, *bytes = data.buf;
    unsigned char *dst = out.buf;
    /* Offsets must rise and stay inside the data: checked before any byte is read. */
    int64_t prev = -1;
    for (Py_ssize_t i = 0; i <= n; i++) {
        int64_t at;
        if (width == 4) {
            int32_t v;
            memcpy(&v, offs + 4 * i, 4);
            at = v;
        } else {
            memcpy(&at, offs + 8 * i, 8);
        }
        if (at < 0 || at > data.len || (i && at < prev)) {
            PyErr_Format(PyExc_ValueError, "key offset %zd is %lld: outside the %zd data bytes or falling",
                         i, (long long)at, data.len);
            goto done;
        }
        prev = at;
    }
    Py_BEGIN_ALLOW_THREADS
    int64_t start, end;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (width == 4) {
            int32_t a, b;
            memcpy(&a, offs + 4 * i, 4);
            memcpy(&b, offs + 4 * i + 4, 4);
            start = a, end = b;
        } else {
            memcpy(&start, offs + 8 * i, 8);
            memcpy(&end, offs + 8 * i + 8, 8);
        }
        uint64_t h = 0xCBF29CE484222325ULL;
        for (const unsigned char *p = bytes + start, *stop = bytes + end; p < stop; p++)
            h = (h ^ *p) * 0x100000001B3ULL;
        store64(dst + 8 * i, mix64(h ^ (uint64_t)(end - start)));
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

/* The arguments of bloom_add and bloom_probe: filter words, key hashes, the word masks. */
typedef struct {
    Py_buffer words, hashes, masks;
    int have;
} bloom_args;

static void bloom_release(bloom_args *a) {
    if (a->have > 0) PyBuffer_Release(&a->words);
    if (a->have > 1) PyBuffer_Release(&a->hashes);
    if (a->have > 2) PyBuffer_Release(&a->masks);
}

static int bloom_get(bloom_args *a, PyObject *words, int writable, PyObject *hashes, PyObject *masks) {
    a->have = 0;
    if (get_buffer(words, &a->words, writable, "filter words") < 0) return -1;
    a->have = 1;
    if (get_buffer(hashes, &a->hashes, 0, "hashes") < 0) goto fail;
    a->have = 2;
    if (get_buffer(masks, &a->masks, 0, "masks") < 0) goto fail;
    a->have = 3;
    if (check_words(&a->words, "the filter") < 0 || check_words(&a->hashes, "hashes") < 0) goto fail;
    if (a->words.len == 0) {
        PyErr_SetString(PyExc_ValueError, "a filter needs at least one word");
        goto fail;
    }
    if (a->masks.len != MASKS * 8) {
        PyErr_Format(PyExc_ValueError, "masks hold %zd bytes, not %d words", a->masks.len, MASKS);
        goto fail;
    }
    return 0;
fail:
    bloom_release(a);
    return -1;
}

/* Layout 2: a key's word ((h mod 2**32) * words) >> 32 and mask masks[h >> 48]. */
#define BLOOM_WORD(h, nwords) ((size_t)((((h) & 0xFFFFFFFFULL) * (uint64_t)(nwords)) >> 32))

PyDoc_STRVAR(bloom_add_doc,
"bloom_add(words, hashes, masks)\n--\n\n"
"Layout 2: words[word(h)] |= masks[h >> 48] for each key hash h (words updated in place).");

static PyObject *accel_bloom_add(PyObject *self, PyObject *args) {
    PyObject *w, *h, *m;
    bloom_args a;
    if (!PyArg_ParseTuple(args, "OOO:bloom_add", &w, &h, &m))
        return NULL;
    if (bloom_get(&a, w, 1, h, m) < 0)
        return NULL;
    Py_ssize_t n = a.hashes.len / 8, nwords = a.words.len / 8;
    unsigned char *words = a.words.buf;
    const unsigned char *hashes = a.hashes.buf, *masks = a.masks.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t hv = load64(hashes + 8 * i);
        unsigned char *word = words + 8 * BLOOM_WORD(hv, nwords);
        store64(word, load64(word) | load64(masks + 8 * (hv >> 48)));
    }
    Py_END_ALLOW_THREADS
    bloom_release(&a);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(bloom_probe_doc,
"bloom_probe(words, hashes, masks, out)\n--\n\n"
"Layout 2: out[i] = 1 if every bit of key i's mask is set in its word, else 0.");

static PyObject *accel_bloom_probe(PyObject *self, PyObject *args) {
    PyObject *w, *h, *m, *out_obj;
    bloom_args a;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "OOOO:bloom_probe", &w, &h, &m, &out_obj))
        return NULL;
    if (bloom_get(&a, w, 0, h, m) < 0)
        return NULL;
    if (get_buffer(out_obj, &out, 1, "out") < 0) {
        bloom_release(&a);
        return NULL;
    }
    Py_ssize_t n = a.hashes.len / 8, nwords = a.words.len / 8;
    if (out.len != n) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes for %zd keys", out.len, n);
        PyBuffer_Release(&out);
        bloom_release(&a);
        return NULL;
    }
    const unsigned char *words = a.words.buf, *hashes = a.hashes.buf, *masks = a.masks.buf;
    unsigned char *dst = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t hv = load64(hashes + 8 * i);
        uint64_t mask = load64(masks + 8 * (hv >> 48));
        dst[i] = (load64(words + 8 * BLOOM_WORD(hv, nwords)) & mask) == mask;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    bloom_release(&a);
    Py_RETURN_NONE;
}

static PyMethodDef accel_methods[] = {
    {"mix", accel_mix, METH_VARARGS, mix_doc},
    {"fnv1a", accel_fnv1a, METH_VARARGS, fnv1a_doc},
    {"bloom_add", accel_bloom_add, METH_VARARGS, bloom_add_doc},
    {"bloom_probe", accel_bloom_probe, METH_VARARGS, bloom_probe_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef accel_module = {
    PyModuleDef_HEAD_INIT,
    "_runs_accel",
    "Compiled key hashing and layout 2 bloom filter loops of the sorted-run format (see runs.py).",
    -1,
    accel_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__runs_accel(void) { return PyModule_Create(&accel_module); }
