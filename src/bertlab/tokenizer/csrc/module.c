/* bertlab.tokenizer._fast: the Python side of the encoders, written once for all of them -- the methods
 * (encode, encode_many, encode_ids, encode_flat) around an encoder's one-text call, its results as Python
 * objects, the special-token table, and the module. The encoders themselves are in wordpiece.c and bpe.c. */
#include "encoder.h"

static void work_free(EncoderBase *e, Work *w) {
    PyMem_Free(w->oid);
    PyMem_Free(w->ost);
    PyMem_Free(w->oen);
    PyMem_Free(w->ow);
    if (w->scratch && e->free_scratch) e->free_scratch(w->scratch);
}

/* ---------------------------------------------------------------------------------------------------- */
/* results as Python objects */

static inline PyObject *get_int(IntCache *c, Py_ssize_t v) {
    if (v >= 0 && v < c->n_ints) {
        PyObject *o = c->ints[v];
        if (!o) {
            o = PyLong_FromSsize_t(v);
            if (!o) return NULL;
            c->ints[v] = o;
        }
        Py_INCREF(o);
        return o;
    }
    return PyLong_FromSsize_t(v);
}

int encoder_base_init(EncoderBase *e, Py_ssize_t n_tok) {
    IntCache *c = &e->ic;
    c->n_ints = n_tok > 65536 ? n_tok : 65536;
    c->ints = PyMem_Calloc(c->n_ints, sizeof(PyObject *));
    if (!c->ints) { PyErr_NoMemory(); return -1; }
    return 0;
}

void encoder_base_free(EncoderBase *e) {
    IntCache *c = &e->ic;
    if (c->ints) {
        for (Py_ssize_t k = 0; k < c->n_ints; k++) Py_XDECREF(c->ints[k]);
        PyMem_Free(c->ints);
    }
    Py_TYPE(e)->tp_free((PyObject *)e);
}

/* (ids, offsets, word ids) of the last encoded text */
static PyObject *result(IntCache *e, Work *w) {
    Py_ssize_t n = w->olen;
    PyObject *ids = NULL, *offs = NULL, *words = NULL, *res = NULL;
    ids = PyList_New(n);
    offs = PyList_New(n);
    words = PyList_New(n);
    if (!ids || !offs || !words) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *a = get_int(e, w->oid[k]);
        if (!a) goto fail;
        PyList_SET_ITEM(ids, k, a);
        PyObject *s = get_int(e, w->ost[k]);
        if (!s) goto fail;
        PyObject *en = get_int(e, w->oen[k]);
        if (!en) { Py_DECREF(s); goto fail; }
        PyObject *t = PyTuple_New(2);
        if (!t) { Py_DECREF(s); Py_DECREF(en); goto fail; }
        PyTuple_SET_ITEM(t, 0, s);
        PyTuple_SET_ITEM(t, 1, en);
        /* A pair of ints can never be part of a reference cycle; untracking it now (CPython would do so at
         * its next collection) keeps the garbage collector from walking ~300k tuples per WikiText batch. */
        PyObject_GC_UnTrack(t);
        PyList_SET_ITEM(offs, k, t);
        PyObject *wi = get_int(e, w->ow[k]);
        if (!wi) goto fail;
        PyList_SET_ITEM(words, k, wi);
    }
    res = PyTuple_New(3);
    if (!res) goto fail;
    PyTuple_SET_ITEM(res, 0, ids);
    PyTuple_SET_ITEM(res, 1, offs);
    PyTuple_SET_ITEM(res, 2, words);
    return res;
fail:
    Py_XDECREF(ids);
    Py_XDECREF(offs);
    Py_XDECREF(words);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------- */
/* the methods every encoder has */

/* An encoder whose __init__ never ran (or failed) has no encode call: a RuntimeError, not a crash. */
static int ready(EncoderBase *e) {
    if (e->encode) return 1;
    PyErr_SetString(PyExc_RuntimeError, "the encoder is not initialised");
    return 0;
}

static PyObject *encode_one(EncoderBase *e, PyObject *text) {
    if (!ready(e)) return NULL;
    Work w = {0};
    PyObject *r = e->encode(e, &w, text) ? NULL : result(&e->ic, &w);
    work_free(e, &w);
    return r;
}

/* The ids of the last encoded text, as a list: the corpus-scale path when lists are wanted (no offsets, fewer
 * objects) */
static PyObject *ids_list(IntCache *ic, Work *w) {
    PyObject *ids = PyList_New(w->olen);
    if (!ids) return NULL;
    for (Py_ssize_t j = 0; j < w->olen; j++) {
        PyObject *a = get_int(ic, w->oid[j]);
        if (!a) { Py_DECREF(ids); return NULL; }
        PyList_SET_ITEM(ids, j, a);
    }
    return ids;
}

/* [make(text) for text in texts], each text encoded into one Work kept across them */
static PyObject *encode_each(EncoderBase *e, PyObject *texts, const char *message,
                             PyObject *(*make)(IntCache *, Work *)) {
    if (!ready(e)) return NULL;
    PyObject *seq = PySequence_Fast(texts, message);
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    Work w = {0};
    if (!out) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *r;
        if (e->encode(e, &w, PySequence_Fast_GET_ITEM(seq, k)) || !(r = make(&e->ic, &w))) goto fail;
        PyList_SET_ITEM(out, k, r);
    }
    work_free(e, &w);
    Py_DECREF(seq);
    return out;
fail:
    work_free(e, &w);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *encode_many(EncoderBase *e, PyObject *texts) {
    return encode_each(e, texts, "encode_many needs a sequence of str", result);
}

static PyObject *encode_ids(EncoderBase *e, PyObject *texts) {
    return encode_each(e, texts, "encode_ids needs a sequence of str", ids_list);
}

/* ids of all texts packed into one int32 buffer, plus an int64 buffer of per-text lengths: the corpus-scale
 * path, which creates no Python object per token */
static PyObject *encode_flat(EncoderBase *e, PyObject *texts) {
    if (!ready(e)) return NULL;
    PyObject *seq = PySequence_Fast(texts, "encode_flat needs a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), len = 0, cap = 0;
    int32_t *ids = NULL;
    int64_t *lengths = PyMem_Malloc((n ? n : 1) * sizeof(int64_t));
    PyObject *res = NULL;
    Work w = {0};
    if (!lengths) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (e->encode(e, &w, PySequence_Fast_GET_ITEM(seq, k))) goto done;
        if (grow((void **)&ids, &cap, len + w.olen, sizeof(int32_t))) goto done;
        if (w.olen) memcpy(ids + len, w.oid, w.olen * sizeof(int32_t));
        len += w.olen;
        lengths[k] = w.olen;
    }
    res = Py_BuildValue("(y#y#)", ids ? (const char *)ids : "", len * (Py_ssize_t)sizeof(int32_t),
                        (const char *)lengths, n * (Py_ssize_t)sizeof(int64_t));
done:
    work_free(e, &w);
    PyMem_Free(ids);
    PyMem_Free(lengths);
    Py_DECREF(seq);
    return res;
}

PyMethodDef encoder_methods[] = {
    {"encode", (PyCFunction)encode_one, METH_O,
     "encode(text) -> (ids, offsets, word_ids) without special tokens, as the tokenizer's _encode_seq_py"},
    {"encode_many", (PyCFunction)encode_many, METH_O, "encode_many(texts) -> [encode(t) for t in texts]"},
    {"encode_ids", (PyCFunction)encode_ids, METH_O, "encode_ids(texts) -> [ids of t for t in texts]"},
    {"encode_flat", (PyCFunction)encode_flat, METH_O,
     "encode_flat(texts) -> (int32 ids of all texts as bytes, int64 length per text as bytes)"},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------------------- */
/* special tokens */

int specials_init(Specials *sp, PyObject *specials, int with_lstrip) {
    Py_ssize_t ns = PyList_GET_SIZE(specials);
    sp->cps = PyMem_Calloc(ns ? ns : 1, sizeof(uint32_t *));
    sp->len = PyMem_Calloc(ns ? ns : 1, sizeof(Py_ssize_t));
    sp->id = PyMem_Calloc(ns ? ns : 1, sizeof(int32_t));
    sp->lstrip = PyMem_Calloc(ns ? ns : 1, 1);
    if (!sp->cps || !sp->len || !sp->id || !sp->lstrip) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t s = 0; s < ns; s++) {
        PyObject *tok;
        int id, lstrip = 0;
        if (with_lstrip ? !PyArg_ParseTuple(PyList_GET_ITEM(specials, s), "Uip", &tok, &id, &lstrip)
                        : !PyArg_ParseTuple(PyList_GET_ITEM(specials, s), "Ui", &tok, &id))
            return -1;
        Py_ssize_t len = PyUnicode_GET_LENGTH(tok);
        if (len == 0) continue;
        /* insertion keeps the array sorted by length, longest first */
        Py_ssize_t pos = sp->n;
        while (pos > 0 && sp->len[pos - 1] < len) {
            sp->cps[pos] = sp->cps[pos - 1];
            sp->len[pos] = sp->len[pos - 1];
            sp->id[pos] = sp->id[pos - 1];
            sp->lstrip[pos] = sp->lstrip[pos - 1];
            pos--;
        }
        sp->cps[pos] = PyMem_Malloc(len * sizeof(uint32_t));
        if (!sp->cps[pos]) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t k = 0; k < len; k++) sp->cps[pos][k] = PyUnicode_READ_CHAR(tok, k);
        sp->len[pos] = len;
        sp->id[pos] = id;
        sp->lstrip[pos] = (uint8_t)lstrip;
        sp->n++;
        uint32_t first = sp->cps[pos][0];
        if (first < 128) sp->first_ascii[first] = 1;
        else sp->first_nonascii = 1;
    }
    return 0;
}

void specials_free(Specials *sp) {
    for (Py_ssize_t s = 0; s < sp->n; s++) PyMem_Free(sp->cps[s]);
    PyMem_Free(sp->cps);
    PyMem_Free(sp->len);
    PyMem_Free(sp->id);
    PyMem_Free(sp->lstrip);
}

/* ---------------------------------------------------------------------------------------------------- */

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "_fast", "The encoding loops of BertTokenizer and RobertaTokenizer in C (optional "
    "accelerator).", -1, NULL,
};

static int add_type(PyObject *m, const char *name, PyTypeObject *type) {
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__fast(void) {
    if (PyType_Ready(&WordPieceEncoderType) < 0 || PyType_Ready(&BPEEncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fast_module);
    if (!m) return NULL;
    if (add_type(m, "Encoder", &WordPieceEncoderType) || add_type(m, "BPEEncoder", &BPEEncoderType)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
