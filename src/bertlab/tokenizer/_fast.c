/* bertlab.tokenizer._fast -- the hot loop of BertTokenizer in C (optional; Python is the reference).
 *
 * One Encoder turns a Python str into (ids, offsets, word ids) exactly as
 * BertTokenizer._encode_seq_py does: special tokens matched on the raw text, cleaning, CJK splitting,
 * lowercasing and accent stripping, punctuation splitting, then greedy longest-match-first WordPiece.
 *
 * It knows no Unicode itself. What a character is (dropped, whitespace, CJK, punctuation, other) and what
 * lowercasing + accent stripping make of it comes from BasicTokenizer._char_info, asked once per distinct
 * code point and cached in a table, so the C and Python paths share one definition by construction. The
 * few whitespace tokens whose normalisation depends on context (capital sigma; marks that canonical
 * reordering moves) are handed to BasicTokenizer._normalize_token. Offsets are indices into the Python
 * str (code points), like Hugging Face's.
 *
 * The vocabulary is a trie over code points whose edges live in one open-addressing hash table, with two
 * roots: word-initial pieces and '##' continuation pieces; the longest match is one walk from the start.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* kinds, as in basic.py (DROP, SPACE, CJK, PUNCT, OTHER) plus one: 0 = not asked yet */
#define K_DROP 1
#define K_SPACE 2
#define K_CJK 3
#define K_PUNCT 4
#define K_OTHER 5
/* info word per code point: bits 0-2 kind, bit 3 hard, bit 4 mapped, bits 5-31 offset into the pool,
 * where pool[offset] is the mapping's length followed by its code points */
#define INFO_KIND(x) ((x) & 7u)
#define INFO_HARD 8u
#define INFO_MAPPED 16u
#define INFO_POOL(x) ((x) >> 5)
#define N_CODEPOINTS 0x110000

typedef struct {
    uint64_t key; /* (node << 21 | code point) + 1; 0 marks an empty slot */
    int32_t child;
} Edge;

typedef struct {
    PyObject_HEAD
    uint32_t *info;
    uint32_t *pool;
    Py_ssize_t pool_len, pool_cap;
    PyObject *char_info;       /* BasicTokenizer._char_info */
    PyObject *normalize_token; /* BasicTokenizer._normalize_token */
    PyObject *error_cls;       /* raised for non-str input */
    int cjk;
    int32_t unk_id;
    Py_ssize_t max_chars;
    /* vocabulary trie: node 0 = word start, node 1 = continuation ('##') */
    Edge *edges;
    uint64_t edge_mask;
    int32_t *node_tok;
    Py_ssize_t n_nodes, cap_nodes;
    /* special tokens, longest first */
    Py_ssize_t n_special;
    uint32_t **sp_cps;
    Py_ssize_t *sp_len;
    int32_t *sp_id;
    uint8_t sp_first_ascii[128];
    int sp_first_nonascii;
    /* cached small ints for ids and offsets */
    PyObject **ints;
    Py_ssize_t n_ints;
} Encoder;

/* Scratch space of one encode call: kept out of Encoder so that two threads sharing a tokenizer cannot
 * clobber each other's buffers when a callback into Python lets the other one run. */
typedef struct {
    /* current whitespace token (cleaned) and its normalisation */
    uint32_t *tcp;
    Py_ssize_t *tidx;
    Py_ssize_t tlen, tcap;
    int thard;
    uint32_t *ncp;
    Py_ssize_t *nidx;
    Py_ssize_t nlen, ncap;
    /* output of one text */
    int32_t *oid;
    Py_ssize_t *ost, *oen, *ow;
    Py_ssize_t olen, ocap;
    Py_ssize_t word;
} Work;

static void work_free(Work *w) {
    PyMem_Free(w->tcp);
    PyMem_Free(w->tidx);
    PyMem_Free(w->ncp);
    PyMem_Free(w->nidx);
    PyMem_Free(w->oid);
    PyMem_Free(w->ost);
    PyMem_Free(w->oen);
    PyMem_Free(w->ow);
}

/* ---------------------------------------------------------------------------------------------------- */
/* growable arrays */

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t elem) {
    if (need <= *cap) return 0;
    Py_ssize_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = PyMem_Realloc(*p, (size_t)nc * elem);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q;
    *cap = nc;
    return 0;
}

static int grow_token(Work *w, Py_ssize_t need) {
    if (need <= w->tcap) return 0;
    Py_ssize_t cap = w->tcap;
    if (grow((void **)&w->tcp, &cap, need, sizeof(uint32_t))) return -1;
    cap = w->tcap;
    if (grow((void **)&w->tidx, &cap, need, sizeof(Py_ssize_t))) return -1;
    w->tcap = cap;
    return 0;
}

static int grow_norm(Work *w, Py_ssize_t need) {
    if (need <= w->ncap) return 0;
    Py_ssize_t cap = w->ncap;
    if (grow((void **)&w->ncp, &cap, need, sizeof(uint32_t))) return -1;
    cap = w->ncap;
    if (grow((void **)&w->nidx, &cap, need, sizeof(Py_ssize_t))) return -1;
    w->ncap = cap;
    return 0;
}

static int grow_out(Work *w, Py_ssize_t need) {
    if (need <= w->ocap) return 0;
    Py_ssize_t cap;
    cap = w->ocap; if (grow((void **)&w->oid, &cap, need, sizeof(int32_t))) return -1;
    cap = w->ocap; if (grow((void **)&w->ost, &cap, need, sizeof(Py_ssize_t))) return -1;
    cap = w->ocap; if (grow((void **)&w->oen, &cap, need, sizeof(Py_ssize_t))) return -1;
    cap = w->ocap; if (grow((void **)&w->ow, &cap, need, sizeof(Py_ssize_t))) return -1;
    w->ocap = cap;
    return 0;
}

static inline int emit(Work *w, int32_t id, Py_ssize_t start, Py_ssize_t end) {
    if (w->olen >= w->ocap && grow_out(w, w->olen + 1)) return -1;
    w->oid[w->olen] = id;
    w->ost[w->olen] = start;
    w->oen[w->olen] = end;
    w->ow[w->olen] = w->word;
    w->olen++;
    return 0;
}

/* ---------------------------------------------------------------------------------------------------- */
/* per-code-point table, filled on first sight by BasicTokenizer._char_info */

static uint32_t fill_info(Encoder *e, uint32_t cp) {
    PyObject *r = PyObject_CallFunction(e->char_info, "I", (unsigned int)cp);
    if (!r) return 0;
    long kind;
    int hard;
    PyObject *mapping;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "_char_info must return (kind, hard, mapping)");
        return 0;
    }
    kind = PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
    hard = PyObject_IsTrue(PyTuple_GET_ITEM(r, 1));
    mapping = PyTuple_GET_ITEM(r, 2);
    if ((kind == -1 || hard < 0) && PyErr_Occurred()) { Py_DECREF(r); return 0; }
    uint32_t x = (uint32_t)(kind + 1) & 7u; /* basic.py counts kinds from 0 */
    if (hard) x |= INFO_HARD;
    if (mapping != Py_None) {
        if (!PyUnicode_Check(mapping)) {
            Py_DECREF(r);
            PyErr_SetString(PyExc_TypeError, "_char_info mapping must be str or None");
            return 0;
        }
        Py_ssize_t n = PyUnicode_GET_LENGTH(mapping);
        if (grow((void **)&e->pool, &e->pool_cap, e->pool_len + n + 1, sizeof(uint32_t))) { Py_DECREF(r); return 0; }
        if (e->pool_len >= (1 << 26)) { Py_DECREF(r); PyErr_SetString(PyExc_OverflowError, "mapping pool full"); return 0; }
        x |= INFO_MAPPED | ((uint32_t)e->pool_len << 5);
        e->pool[e->pool_len++] = (uint32_t)n;
        for (Py_ssize_t k = 0; k < n; k++) e->pool[e->pool_len++] = PyUnicode_READ_CHAR(mapping, k);
    }
    Py_DECREF(r);
    e->info[cp] = x;
    return x;
}

static inline uint32_t get_info(Encoder *e, uint32_t cp) {
    uint32_t x = e->info[cp];
    return x ? x : fill_info(e, cp);
}

/* ---------------------------------------------------------------------------------------------------- */
/* vocabulary trie */

static inline uint64_t hash64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static inline int32_t trie_child(const Encoder *e, int32_t node, uint32_t cp) {
    uint64_t key = (((uint64_t)node << 21) | cp) + 1;
    uint64_t h = hash64(key) & e->edge_mask;
    for (;;) {
        const Edge *s = &e->edges[h];
        if (s->key == key) return s->child;
        if (s->key == 0) return -1;
        h = (h + 1) & e->edge_mask;
    }
}

static int trie_insert(Encoder *e, PyObject *tok, Py_ssize_t from, int32_t root, int32_t id) {
    int32_t node = root;
    Py_ssize_t n = PyUnicode_GET_LENGTH(tok);
    for (Py_ssize_t k = from; k < n; k++) {
        uint32_t cp = PyUnicode_READ_CHAR(tok, k);
        uint64_t key = (((uint64_t)node << 21) | cp) + 1;
        uint64_t h = hash64(key) & e->edge_mask;
        int32_t child = -1;
        for (;;) {
            Edge *s = &e->edges[h];
            if (s->key == key) { child = s->child; break; }
            if (s->key == 0) {
                if (e->n_nodes >= e->cap_nodes &&
                    grow((void **)&e->node_tok, &e->cap_nodes, e->n_nodes + 1, sizeof(int32_t))) return -1;
                child = (int32_t)e->n_nodes++;
                e->node_tok[child] = -1;
                s->key = key;
                s->child = child;
                break;
            }
            h = (h + 1) & e->edge_mask;
        }
        node = child;
    }
    if (node != root && e->node_tok[node] < 0) e->node_tok[node] = id;
    return 0;
}

/* ---------------------------------------------------------------------------------------------------- */
/* WordPiece over ncp[s:t), one word */

static int wordpiece(const Encoder *e, Work *w, Py_ssize_t s, Py_ssize_t t) {
    const uint32_t *cp = w->ncp;
    const Py_ssize_t *idx = w->nidx;
    Py_ssize_t mark = w->olen;
    if (t - s > e->max_chars) {
        if (emit(w, e->unk_id, idx[s], idx[t - 1] + 1)) return -1;
        w->word++;
        return 0;
    }
    Py_ssize_t start = s;
    while (start < t) {
        int32_t node = start == s ? 0 : 1, best = -1;
        Py_ssize_t best_end = -1;
        for (Py_ssize_t p = start; p < t; p++) {
            node = trie_child(e, node, cp[p]);
            if (node < 0) break;
            if (e->node_tok[node] >= 0) { best = e->node_tok[node]; best_end = p + 1; }
        }
        if (best < 0) { /* no piece fits here: the whole word is [UNK] */
            w->olen = mark;
            if (emit(w, e->unk_id, idx[s], idx[t - 1] + 1)) return -1;
            w->word++;
            return 0;
        }
        if (emit(w, best, idx[start], idx[best_end - 1] + 1)) return -1;
        start = best_end;
    }
    w->word++;
    return 0;
}

/* Normalise the buffered whitespace token, split it on punctuation, WordPiece each word. */
static int flush_token(Encoder *e, Work *w) {
    Py_ssize_t n = w->tlen;
    if (n == 0) return 0;
    w->nlen = 0;
    if (w->thard) {
        PyObject *s = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, w->tcp, n);
        if (!s) return -1;
        PyObject *r = PyObject_CallOneArg(e->normalize_token, s);
        Py_DECREF(s);
        if (!r) return -1;
        PyObject *ns, *ni;
        if (!PyArg_ParseTuple(r, "UO!", &ns, &PyList_Type, &ni)) { Py_DECREF(r); return -1; }
        Py_ssize_t m = PyUnicode_GET_LENGTH(ns);
        if (PyList_GET_SIZE(ni) != m) { Py_DECREF(r); PyErr_SetString(PyExc_ValueError, "_normalize_token: length mismatch"); return -1; }
        if (grow_norm(w, m)) { Py_DECREF(r); return -1; }
        for (Py_ssize_t k = 0; k < m; k++) {
            Py_ssize_t rel = PyLong_AsSsize_t(PyList_GET_ITEM(ni, k));
            if (rel < 0 || rel >= n) {
                Py_DECREF(r);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_normalize_token: bad index");
                return -1;
            }
            w->ncp[k] = PyUnicode_READ_CHAR(ns, k);
            w->nidx[k] = w->tidx[rel];
        }
        w->nlen = m;
        Py_DECREF(r);
    } else {
        for (Py_ssize_t k = 0; k < n; k++) {
            uint32_t c = w->tcp[k];
            uint32_t x = get_info(e, c);
            if (!x) return -1;
            if (x & INFO_MAPPED) {
                const uint32_t *m = e->pool + INFO_POOL(x);
                uint32_t len = m[0];
                if (w->nlen + (Py_ssize_t)len > w->ncap && grow_norm(w, w->nlen + len)) return -1;
                for (uint32_t j = 1; j <= len; j++) {
                    w->ncp[w->nlen] = m[j];
                    w->nidx[w->nlen++] = w->tidx[k];
                }
            } else {
                if (w->nlen >= w->ncap && grow_norm(w, w->nlen + 1)) return -1;
                w->ncp[w->nlen] = c;
                w->nidx[w->nlen++] = w->tidx[k];
            }
        }
    }
    w->tlen = 0;
    w->thard = 0;
    Py_ssize_t ws = 0, m = w->nlen;
    for (Py_ssize_t k = 0; k < m; k++) {
        uint32_t x = get_info(e, w->ncp[k]);
        if (!x) return -1;
        if (INFO_KIND(x) == K_PUNCT) {
            if (k > ws && wordpiece(e, w, ws, k)) return -1;
            if (wordpiece(e, w, k, k + 1)) return -1;
            ws = k + 1;
        }
    }
    if (m > ws && wordpiece(e, w, ws, m)) return -1;
    return 0;
}

static inline int push_char(Work *w, uint32_t cp, Py_ssize_t i, uint32_t x) {
    if (w->tlen >= w->tcap && grow_token(w, w->tlen + 1)) return -1;
    w->tcp[w->tlen] = cp;
    w->tidx[w->tlen++] = i;
    if (x & INFO_HARD) w->thard = 1;
    return 0;
}

/* Longest special token starting at i, or -1. */
static Py_ssize_t match_special(Encoder *e, int kind, const void *data, Py_ssize_t n, Py_ssize_t i) {
    for (Py_ssize_t s = 0; s < e->n_special; s++) {
        Py_ssize_t len = e->sp_len[s];
        if (i + len > n) continue;
        const uint32_t *c = e->sp_cps[s];
        Py_ssize_t k = 0;
        while (k < len && PyUnicode_READ(kind, data, i + k) == c[k]) k++;
        if (k == len) return s;
    }
    return -1;
}

/* The whole pipeline for one text; results in w->oid/ost/oen/ow[0:olen]. */
static int encode_text(Encoder *e, Work *w, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(e->error_cls, "expected text as str, got %s", Py_TYPE(text)->tp_name);
        return -1;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) return -1;
#endif
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    w->olen = 0;
    w->word = 0;
    w->tlen = 0;
    w->thard = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t cp = PyUnicode_READ(kind, data, i);
        if (e->n_special && ((cp < 128 && e->sp_first_ascii[cp]) || (cp >= 128 && e->sp_first_nonascii))) {
            Py_ssize_t s = match_special(e, kind, data, n, i);
            if (s >= 0) {
                if (flush_token(e, w)) return -1;
                if (emit(w, e->sp_id[s], i, i + e->sp_len[s])) return -1;
                w->word++;
                i += e->sp_len[s] - 1;
                continue;
            }
        }
        uint32_t x = get_info(e, cp);
        if (!x) return -1;
        switch (INFO_KIND(x)) {
        case K_DROP:
            break;
        case K_SPACE:
            if (flush_token(e, w)) return -1;
            break;
        case K_CJK:
            if (e->cjk) {
                if (flush_token(e, w)) return -1;
                if (push_char(w, cp, i, x)) return -1;
                if (flush_token(e, w)) return -1;
                break;
            }
            /* fall through */
        default:
            if (push_char(w, cp, i, x)) return -1;
        }
    }
    return flush_token(e, w);
}

/* ---------------------------------------------------------------------------------------------------- */
/* results as Python objects */

static inline PyObject *get_int(Encoder *e, Py_ssize_t v) {
    if (v >= 0 && v < e->n_ints) {
        PyObject *o = e->ints[v];
        if (!o) {
            o = PyLong_FromSsize_t(v);
            if (!o) return NULL;
            e->ints[v] = o;
        }
        Py_INCREF(o);
        return o;
    }
    return PyLong_FromSsize_t(v);
}

/* (ids, offsets, word ids) of the last encoded text */
static PyObject *result(Encoder *e, Work *w) {
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
/* the Python type */

static PyObject *Encoder_encode(Encoder *e, PyObject *text) {
    Work w = {0};
    PyObject *r = encode_text(e, &w, text) ? NULL : result(e, &w);
    work_free(&w);
    return r;
}

static PyObject *Encoder_encode_many(Encoder *e, PyObject *texts) {
    PyObject *seq = PySequence_Fast(texts, "encode_many needs a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    Work w = {0};
    if (!out) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *r;
        if (encode_text(e, &w, PySequence_Fast_GET_ITEM(seq, k)) || !(r = result(e, &w))) goto fail;
        PyList_SET_ITEM(out, k, r);
    }
    work_free(&w);
    Py_DECREF(seq);
    return out;
fail:
    work_free(&w);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ids only, one list per text: the corpus-scale path when lists are wanted (no offsets, fewer objects) */
static PyObject *Encoder_encode_ids(Encoder *e, PyObject *texts) {
    PyObject *seq = PySequence_Fast(texts, "encode_ids needs a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    Work w = {0};
    if (!out) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (encode_text(e, &w, PySequence_Fast_GET_ITEM(seq, k))) goto fail;
        PyObject *ids = PyList_New(w.olen);
        if (!ids) goto fail;
        for (Py_ssize_t j = 0; j < w.olen; j++) {
            PyObject *a = get_int(e, w.oid[j]);
            if (!a) { Py_DECREF(ids); goto fail; }
            PyList_SET_ITEM(ids, j, a);
        }
        PyList_SET_ITEM(out, k, ids);
    }
    work_free(&w);
    Py_DECREF(seq);
    return out;
fail:
    work_free(&w);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ids of all texts packed into one int32 buffer, plus an int64 buffer of per-text lengths: the corpus-scale
 * path, which creates no Python object per token */
static PyObject *Encoder_encode_flat(Encoder *e, PyObject *texts) {
    PyObject *seq = PySequence_Fast(texts, "encode_flat needs a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), len = 0, cap = 0;
    int32_t *ids = NULL;
    int64_t *lengths = PyMem_Malloc((n ? n : 1) * sizeof(int64_t));
    PyObject *res = NULL;
    Work w = {0};
    if (!lengths) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (encode_text(e, &w, PySequence_Fast_GET_ITEM(seq, k))) goto done;
        if (grow((void **)&ids, &cap, len + w.olen, sizeof(int32_t))) goto done;
        if (w.olen) memcpy(ids + len, w.oid, w.olen * sizeof(int32_t));
        len += w.olen;
        lengths[k] = w.olen;
    }
    res = Py_BuildValue("(y#y#)", ids ? (const char *)ids : "", len * (Py_ssize_t)sizeof(int32_t),
                        (const char *)lengths, n * (Py_ssize_t)sizeof(int64_t));
done:
    work_free(&w);
    PyMem_Free(ids);
    PyMem_Free(lengths);
    Py_DECREF(seq);
    return res;
}

static void Encoder_dealloc(Encoder *e) {
    PyMem_Free(e->info);
    PyMem_Free(e->pool);
    Py_XDECREF(e->char_info);
    Py_XDECREF(e->normalize_token);
    Py_XDECREF(e->error_cls);
    PyMem_Free(e->edges);
    PyMem_Free(e->node_tok);
    for (Py_ssize_t s = 0; s < e->n_special; s++) PyMem_Free(e->sp_cps[s]);
    PyMem_Free(e->sp_cps);
    PyMem_Free(e->sp_len);
    PyMem_Free(e->sp_id);
    if (e->ints) {
        for (Py_ssize_t k = 0; k < e->n_ints; k++) Py_XDECREF(e->ints[k]);
        PyMem_Free(e->ints);
    }
    Py_TYPE(e)->tp_free((PyObject *)e);
}

/* Encoder(ids_to_tokens, unk_id, basic, max_input_chars_per_word, specials, error_cls)
 * specials: [(token, id), ...] matched on the raw text. */
static int Encoder_init(Encoder *e, PyObject *args, PyObject *kw) {
    PyObject *tokens, *basic, *specials, *error_cls;
    int unk_id;
    Py_ssize_t max_chars;
    static char *kwlist[] = {"tokens", "unk_id", "basic", "max_input_chars_per_word", "specials", "error_cls", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!iOnO!O", kwlist, &PyList_Type, &tokens, &unk_id, &basic,
                                     &max_chars, &PyList_Type, &specials, &error_cls))
        return -1;
    if (e->info) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder is already initialised");
        return -1;
    }
    e->unk_id = unk_id;
    e->max_chars = max_chars;
    Py_INCREF(error_cls);
    e->error_cls = error_cls;
    if (!(e->char_info = PyObject_GetAttrString(basic, "_char_info"))) return -1;
    if (!(e->normalize_token = PyObject_GetAttrString(basic, "_normalize_token"))) return -1;
    PyObject *cjk = PyObject_GetAttrString(basic, "tokenize_chinese_chars");
    if (!cjk) return -1;
    e->cjk = PyObject_IsTrue(cjk);
    Py_DECREF(cjk);
    if (e->cjk < 0) return -1;

    e->info = PyMem_Calloc(N_CODEPOINTS, sizeof(uint32_t));
    if (!e->info) { PyErr_NoMemory(); return -1; }

    /* trie: size the edge table for every character of the vocabulary at load <= 1/2 */
    Py_ssize_t n_tok = PyList_GET_SIZE(tokens), total = 0;
    for (Py_ssize_t k = 0; k < n_tok; k++) {
        PyObject *t = PyList_GET_ITEM(tokens, k);
        if (!PyUnicode_Check(t)) { PyErr_SetString(PyExc_TypeError, "tokens must be str"); return -1; }
        total += PyUnicode_GET_LENGTH(t);
    }
    uint64_t size = 1024;
    while (size < (uint64_t)total * 2 + 16) size *= 2;
    e->edges = PyMem_Calloc(size, sizeof(Edge));
    if (!e->edges) { PyErr_NoMemory(); return -1; }
    e->edge_mask = size - 1;
    if (grow((void **)&e->node_tok, &e->cap_nodes, total + 2, sizeof(int32_t))) return -1;
    e->node_tok[0] = e->node_tok[1] = -1;
    e->n_nodes = 2;
    for (Py_ssize_t k = 0; k < n_tok; k++) {
        PyObject *t = PyList_GET_ITEM(tokens, k);
        Py_ssize_t len = PyUnicode_GET_LENGTH(t);
        int cont = len > 2 && PyUnicode_READ_CHAR(t, 0) == '#' && PyUnicode_READ_CHAR(t, 1) == '#';
        if (trie_insert(e, t, cont ? 2 : 0, cont ? 1 : 0, (int32_t)k)) return -1;
    }

    /* special tokens, longest first (leftmost-longest, like the Python regex) */
    Py_ssize_t ns = PyList_GET_SIZE(specials);
    e->sp_cps = PyMem_Calloc(ns ? ns : 1, sizeof(uint32_t *));
    e->sp_len = PyMem_Calloc(ns ? ns : 1, sizeof(Py_ssize_t));
    e->sp_id = PyMem_Calloc(ns ? ns : 1, sizeof(int32_t));
    if (!e->sp_cps || !e->sp_len || !e->sp_id) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t s = 0; s < ns; s++) {
        PyObject *item = PyList_GET_ITEM(specials, s), *tok;
        int id;
        if (!PyArg_ParseTuple(item, "Ui", &tok, &id)) return -1;
        Py_ssize_t len = PyUnicode_GET_LENGTH(tok);
        if (len == 0) continue;
        /* insertion keeps the array sorted by length, longest first */
        Py_ssize_t pos = e->n_special;
        while (pos > 0 && e->sp_len[pos - 1] < len) {
            e->sp_cps[pos] = e->sp_cps[pos - 1];
            e->sp_len[pos] = e->sp_len[pos - 1];
            e->sp_id[pos] = e->sp_id[pos - 1];
            pos--;
        }
        e->sp_cps[pos] = PyMem_Malloc(len * sizeof(uint32_t));
        if (!e->sp_cps[pos]) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t k = 0; k < len; k++) e->sp_cps[pos][k] = PyUnicode_READ_CHAR(tok, k);
        e->sp_len[pos] = len;
        e->sp_id[pos] = id;
        e->n_special++;
        uint32_t first = e->sp_cps[pos][0];
        if (first < 128) e->sp_first_ascii[first] = 1;
        else e->sp_first_nonascii = 1;
    }

    e->n_ints = n_tok > 65536 ? n_tok : 65536;
    e->ints = PyMem_Calloc(e->n_ints, sizeof(PyObject *));
    if (!e->ints) { PyErr_NoMemory(); return -1; }
    /* ASCII first, so the common case never calls back */
    for (uint32_t cp = 0; cp < 128; cp++)
        if (!get_info(e, cp)) return -1;
    return 0;
}

static PyMethodDef Encoder_methods[] = {
    {"encode", (PyCFunction)Encoder_encode, METH_O,
     "encode(text) -> (ids, offsets, word_ids) without special tokens, as BertTokenizer._encode_seq_py"},
    {"encode_many", (PyCFunction)Encoder_encode_many, METH_O, "encode_many(texts) -> [encode(t) for t in texts]"},
    {"encode_ids", (PyCFunction)Encoder_encode_ids, METH_O, "encode_ids(texts) -> [ids of t for t in texts]"},
    {"encode_flat", (PyCFunction)Encoder_encode_flat, METH_O,
     "encode_flat(texts) -> (int32 ids of all texts as bytes, int64 length per text as bytes)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bertlab.tokenizer._fast.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WordPiece encoder in C; see the module docstring of bertlab/tokenizer/_fast.c",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = Encoder_methods,
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "_fast", "BertTokenizer's encoding loop in C (optional accelerator).", -1, NULL,
};

PyMODINIT_FUNC PyInit__fast(void) {
    if (PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fast_module);
    if (!m) return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
