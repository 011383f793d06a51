/* bertlab.tokenizer._fast -- the hot loops of BertTokenizer (Encoder) and RobertaTokenizer (BPEEncoder, at the
 * end of this file) in C (optional; Python is the reference).
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

/* cached small ints for ids and offsets, created on first use */
typedef struct {
    PyObject **ints;
    Py_ssize_t n_ints;
} IntCache;

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
    IntCache ic;
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

static int intcache_init(IntCache *c, Py_ssize_t n_tok) {
    c->n_ints = n_tok > 65536 ? n_tok : 65536;
    c->ints = PyMem_Calloc(c->n_ints, sizeof(PyObject *));
    if (!c->ints) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void intcache_free(IntCache *c) {
    if (c->ints) {
        for (Py_ssize_t k = 0; k < c->n_ints; k++) Py_XDECREF(c->ints[k]);
        PyMem_Free(c->ints);
    }
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
/* the Python type */

/* The loops below serve both encoders: `fn` encodes one text of `self` into a Work's output arrays. */
typedef int (*EncodeFn)(PyObject *self, Work *w, PyObject *text);

static PyObject *encode_one(PyObject *e, EncodeFn fn, IntCache *ic, PyObject *text) {
    Work w = {0};
    PyObject *r = fn(e, &w, text) ? NULL : result(ic, &w);
    work_free(&w);
    return r;
}

static PyObject *encode_many(PyObject *e, EncodeFn fn, IntCache *ic, PyObject *texts) {
    PyObject *seq = PySequence_Fast(texts, "encode_many needs a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    Work w = {0};
    if (!out) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *r;
        if (fn(e, &w, PySequence_Fast_GET_ITEM(seq, k)) || !(r = result(ic, &w))) goto fail;
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
static PyObject *encode_ids(PyObject *e, EncodeFn fn, IntCache *ic, PyObject *texts) {
    PyObject *seq = PySequence_Fast(texts, "encode_ids needs a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    Work w = {0};
    if (!out) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (fn(e, &w, PySequence_Fast_GET_ITEM(seq, k))) goto fail;
        PyObject *ids = PyList_New(w.olen);
        if (!ids) goto fail;
        for (Py_ssize_t j = 0; j < w.olen; j++) {
            PyObject *a = get_int(ic, w.oid[j]);
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
static PyObject *encode_flat(PyObject *e, EncodeFn fn, PyObject *texts) {
    PyObject *seq = PySequence_Fast(texts, "encode_flat needs a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), len = 0, cap = 0;
    int32_t *ids = NULL;
    int64_t *lengths = PyMem_Malloc((n ? n : 1) * sizeof(int64_t));
    PyObject *res = NULL;
    Work w = {0};
    if (!lengths) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (fn(e, &w, PySequence_Fast_GET_ITEM(seq, k))) goto done;
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

static int wp_encode(PyObject *e, Work *w, PyObject *text) { return encode_text((Encoder *)e, w, text); }

static PyObject *Encoder_encode(Encoder *e, PyObject *text) {
    return encode_one((PyObject *)e, wp_encode, &e->ic, text);
}
static PyObject *Encoder_encode_many(Encoder *e, PyObject *texts) {
    return encode_many((PyObject *)e, wp_encode, &e->ic, texts);
}
static PyObject *Encoder_encode_ids(Encoder *e, PyObject *texts) {
    return encode_ids((PyObject *)e, wp_encode, &e->ic, texts);
}
static PyObject *Encoder_encode_flat(Encoder *e, PyObject *texts) {
    return encode_flat((PyObject *)e, wp_encode, texts);
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
    intcache_free(&e->ic);
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

    if (intcache_init(&e->ic, n_tok)) return -1;
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

/* ==================================================================================================== */
/* Byte-level BPE (GPT-2, RoBERTa): BPEEncoder does what RobertaTokenizer._encode_seq_py does with bpe.py.
 *
 * Special tokens are matched on the raw text (leftmost, longest; `<mask>` may take the whitespace before
 * it); each stretch between them gets the optional prefix space and is split by GPT-2's pattern, written out
 * below as the matcher it is; each pre-token's UTF-8 bytes are merged by the classic BPE loop (lowest-ranked
 * pair, all its occurrences left to right -- bpe.BPE.merge) on token ids, and the pieces are cached per byte
 * string. Character classes (letter, number, White_Space, other) come from bpe.char_class, asked once per
 * distinct code point, so both paths share one definition of them. */

#define BC_OTHER 0
#define BC_LETTER 1
#define BC_NUMBER 2
#define BC_SPACE 3
#define BC_UNSET 0xFF
#define BPE_UNMERGEABLE (-2) /* a symbol that stands for the unk id: no merge has it */
#define BPE_CACHE_SLOTS (1u << 17)
#define BPE_CACHE_MAX_WORD 256 /* longer pre-tokens are merged every time */

typedef struct {
    uint64_t key; /* ((uint64_t)left << 32 | right) + 1; 0 marks an empty slot */
    int32_t rank, id;
} MergeSlot;

typedef struct {
    uint64_t hash; /* 0 marks an empty slot */
    uint32_t key, key_len; /* bytes at keys[key ...] */
    uint32_t res, n; /* n pieces at pieces[res ...], 3 ints each: id, first byte, end byte */
} CacheSlot;

typedef struct {
    PyObject_HEAD
    uint8_t *cls;
    PyObject *char_class;
    PyObject *error_cls;
    int32_t byte_id[256];
    MergeSlot *merges;
    uint64_t merge_mask;
    int32_t *lead, *trail; /* leading / trailing 'Ġ's of each token, for trim_offsets */
    Py_ssize_t n_tok;
    int add_prefix_space, trim_offsets;
    int32_t unk_id;
    Py_ssize_t n_special;
    uint32_t **sp_cps;
    Py_ssize_t *sp_len;
    int32_t *sp_id;
    uint8_t *sp_lstrip;
    uint8_t sp_first_ascii[128];
    int sp_first_nonascii;
    CacheSlot *cache;
    uint32_t cache_used;
    uint8_t *keys;
    Py_ssize_t keys_len, keys_cap;
    int32_t *pieces;
    Py_ssize_t pieces_len, pieces_cap;
    IntCache ic;
} BPEEncoder;

/* scratch of one encode call */
typedef struct {
    uint32_t *tc; /* the text's code points */
    Py_ssize_t tcap;
    uint32_t *sc; /* one stretch (with the prefix space), its classes and text index per character */
    uint8_t *scl;
    Py_ssize_t *sidx, scap;
    uint8_t *bytes; /* one pre-token's UTF-8 bytes and the stretch index of each byte's character */
    Py_ssize_t *bchar, bcap;
    int32_t *sym, *sb0, *sb1; /* BPE symbols: id, first byte, end byte */
    Py_ssize_t symcap;
} BWork;

static void bwork_free(BWork *b) {
    PyMem_Free(b->tc);
    PyMem_Free(b->sc);
    PyMem_Free(b->scl);
    PyMem_Free(b->sidx);
    PyMem_Free(b->bytes);
    PyMem_Free(b->bchar);
    PyMem_Free(b->sym);
    PyMem_Free(b->sb0);
    PyMem_Free(b->sb1);
}

static int grow3(void **a, void **b, void **c, Py_ssize_t *cap, Py_ssize_t need, size_t ea, size_t eb,
                 size_t ec) {
    if (need <= *cap) return 0;
    Py_ssize_t k, nk;
    k = *cap; if (grow(a, &k, need, ea)) return -1;
    nk = k;
    k = *cap; if (grow(b, &k, need, eb)) return -1;
    k = *cap; if (c && grow(c, &k, need, ec)) return -1;
    *cap = nk; /* all grew alike from the same capacity */
    return 0;
}

static inline uint64_t merge_key(int32_t a, int32_t b) { return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1; }

static inline const MergeSlot *merge_find(const BPEEncoder *e, int32_t a, int32_t b) {
    if (a < 0 || b < 0) return NULL;
    uint64_t key = merge_key(a, b);
    for (uint64_t h = hash64(key) & e->merge_mask;; h = (h + 1) & e->merge_mask) {
        const MergeSlot *m = &e->merges[h];
        if (m->key == key) return m;
        if (!m->key) return NULL;
    }
}

static int classify(BPEEncoder *e, uint32_t cp) {
    PyObject *r = PyObject_CallFunction(e->char_class, "I", (unsigned int)cp);
    if (!r) return -1;
    long k = PyLong_AsLong(r);
    Py_DECREF(r);
    if (k == -1 && PyErr_Occurred()) return -1;
    if (k < 0 || k > BC_SPACE) {
        PyErr_SetString(PyExc_ValueError, "char_class must return 0..3");
        return -1;
    }
    e->cls[cp] = (uint8_t)k;
    return 0;
}

/* The end of GPT-2's pattern's match at i in c[0..n) (classes k):
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static Py_ssize_t gpt2_match(const uint32_t *c, const uint8_t *k, Py_ssize_t i, Py_ssize_t n) {
    if (c[i] == '\'' && i + 1 < n) {
        uint32_t a = c[i + 1], b = i + 2 < n ? c[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    Py_ssize_t j = i;
    if (c[i] == ' ' && i + 1 < n && k[i + 1] != BC_SPACE) j = i + 1; /* the optional space */
    uint8_t want = k[j];
    if (want != BC_SPACE) {
        while (j < n && k[j] == want) j++;
        return j;
    }
    while (j < n && k[j] == BC_SPACE) j++;
    if (j < n && j - i >= 2) return j - 1; /* \s+(?!\S): leave the last space to the next token */
    return j;
}

static void cache_clear(BPEEncoder *e) {
    memset(e->cache, 0, BPE_CACHE_SLOTS * sizeof(CacheSlot));
    e->cache_used = 0;
    e->keys_len = e->pieces_len = 0;
}

/* The pieces of one pre-token (bytes[0..nb)): a pointer to n triples (id, first byte, end byte), in the
 * cache or in the symbol arrays. */
static int bpe_pieces(BPEEncoder *e, BWork *b, Py_ssize_t nb, const int32_t **out, Py_ssize_t *n_out,
                      Py_ssize_t *stride) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t k = 0; k < nb; k++) h = (h ^ b->bytes[k]) * 1099511628211ULL;
    h |= 1;
    uint32_t slot = (uint32_t)(h & (BPE_CACHE_SLOTS - 1));
    if (nb <= BPE_CACHE_MAX_WORD) {
        for (;; slot = (slot + 1) & (BPE_CACHE_SLOTS - 1)) {
            CacheSlot *c = &e->cache[slot];
            if (!c->hash) break;
            if (c->hash == h && c->key_len == nb && !memcmp(e->keys + c->key, b->bytes, nb)) {
                *out = e->pieces + c->res;
                *n_out = c->n;
                *stride = 3;
                return 0;
            }
        }
    }
    /* symbols: the bytes with an id; unknown ones dropped, or kept as unmergeable unk */
    if (grow3((void **)&b->sym, (void **)&b->sb0, (void **)&b->sb1, &b->symcap, nb + 1, sizeof(int32_t),
              sizeof(int32_t), sizeof(int32_t)))
        return -1;
    Py_ssize_t n = 0;
    for (Py_ssize_t k = 0; k < nb; k++) {
        int32_t id = e->byte_id[b->bytes[k]];
        if (id < 0) {
            if (e->unk_id < 0) continue;
            id = BPE_UNMERGEABLE;
        }
        b->sym[n] = id;
        b->sb0[n] = (int32_t)k;
        b->sb1[n] = (int32_t)k + 1;
        n++;
    }
    while (n > 1) {
        int32_t best = -1, left = 0, right = 0, new_id = 0;
        for (Py_ssize_t k = 0; k + 1 < n; k++) {
            const MergeSlot *m = merge_find(e, b->sym[k], b->sym[k + 1]);
            if (m && (best < 0 || m->rank < best)) {
                best = m->rank;
                left = b->sym[k];
                right = b->sym[k + 1];
                new_id = m->id;
            }
        }
        if (best < 0) break;
        Py_ssize_t o = 0;
        for (Py_ssize_t k = 0; k < n; o++) {
            if (k + 1 < n && b->sym[k] == left && b->sym[k + 1] == right) {
                b->sym[o] = new_id;
                b->sb0[o] = b->sb0[k];
                b->sb1[o] = b->sb1[k + 1];
                k += 2;
            } else {
                b->sym[o] = b->sym[k];
                b->sb0[o] = b->sb0[k];
                b->sb1[o] = b->sb1[k];
                k += 1;
            }
        }
        n = o;
    }
    for (Py_ssize_t k = 0; k < n; k++)
        if (b->sym[k] == BPE_UNMERGEABLE) b->sym[k] = e->unk_id;
    if (nb <= BPE_CACHE_MAX_WORD) {
        if (e->cache_used >= BPE_CACHE_SLOTS / 2 || e->keys_len + nb > (1 << 28)) {
            cache_clear(e);
            slot = (uint32_t)(h & (BPE_CACHE_SLOTS - 1));
            while (e->cache[slot].hash) slot = (slot + 1) & (BPE_CACHE_SLOTS - 1);
        }
        if (grow((void **)&e->keys, &e->keys_cap, e->keys_len + nb, 1)) return -1;
        if (grow((void **)&e->pieces, &e->pieces_cap, e->pieces_len + 3 * n, sizeof(int32_t))) return -1;
        CacheSlot *c = &e->cache[slot];
        c->hash = h;
        c->key = (uint32_t)e->keys_len;
        c->key_len = (uint32_t)nb;
        c->res = (uint32_t)e->pieces_len;
        c->n = (uint32_t)n;
        memcpy(e->keys + e->keys_len, b->bytes, nb);
        e->keys_len += nb;
        for (Py_ssize_t k = 0; k < n; k++) {
            e->pieces[e->pieces_len++] = b->sym[k];
            e->pieces[e->pieces_len++] = b->sb0[k];
            e->pieces[e->pieces_len++] = b->sb1[k];
        }
        e->cache_used++;
        *out = e->pieces + c->res;
        *n_out = n;
        *stride = 3;
        return 0;
    }
    /* not cached: hand out the symbol arrays as (id) with byte spans read from sb0/sb1 */
    *out = NULL;
    *n_out = n;
    *stride = 0;
    return 0;
}

static inline void trim(const BPEEncoder *e, int32_t lead, int32_t trail, int first, Py_ssize_t *o0,
                        Py_ssize_t *o1) {
    if (lead) {
        if (first && e->add_prefix_space && lead == 1) lead = 0;
        *o0 = *o0 + lead < *o1 ? *o0 + lead : *o1;
    }
    if (trail && *o1 >= trail) *o1 = *o1 - trail > *o0 ? *o1 - trail : *o0;
}

/* one pre-token: stretch characters [s, t) */
static int bpe_word(BPEEncoder *e, BWork *b, Work *w, Py_ssize_t s, Py_ssize_t t) {
    Py_ssize_t nb = 0;
    if (grow3((void **)&b->bytes, (void **)&b->bchar, NULL, &b->bcap, 4 * (t - s) + 1, 1, sizeof(Py_ssize_t), 0))
        return -1;
    for (Py_ssize_t i = s; i < t; i++) {
        uint32_t cp = b->sc[i];
        uint8_t *o = b->bytes + nb;
        int len;
        if (cp < 0x80) { o[0] = (uint8_t)cp; len = 1; }
        else if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); len = 2; }
        else if (cp < 0x10000) {
            if (cp >= 0xD800 && cp < 0xE000) {
                char hex[8];
                snprintf(hex, sizeof hex, "%04X", (unsigned int)cp);
                PyErr_Format(e->error_cls, "cannot encode a lone surrogate (U+%s at index %zd); text must be "
                             "valid Unicode", hex, b->sidx[i]);
                return -1;
            }
            o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F); len = 3;
        } else {
            o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F); o[2] = 0x80 | ((cp >> 6) & 0x3F);
            o[3] = 0x80 | (cp & 0x3F); len = 4;
        }
        for (int k = 0; k < len; k++) b->bchar[nb + k] = i;
        nb += len;
    }
    const int32_t *p;
    Py_ssize_t n, stride;
    if (bpe_pieces(e, b, nb, &p, &n, &stride)) return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t id, b0, b1;
        if (stride) { id = p[3 * k]; b0 = p[3 * k + 1]; b1 = p[3 * k + 2]; }
        else { id = b->sym[k]; b0 = b->sb0[k]; b1 = b->sb1[k]; }
        Py_ssize_t o0 = b->sidx[b->bchar[b0]], o1 = b->sidx[b->bchar[b1 - 1]] + 1;
        if (e->trim_offsets && id >= 0 && id < e->n_tok && (e->lead[id] || e->trail[id]))
            trim(e, e->lead[id], e->trail[id], w->olen == 0 || o0 == 0, &o0, &o1);
        if (emit(w, id, o0, o1)) return -1;
    }
    return 0;
}

/* text characters [start, end): no special token inside */
static int bpe_stretch(BPEEncoder *e, BWork *b, Work *w, Py_ssize_t start, Py_ssize_t end) {
    if (start >= end) return 0;
    int prefixed = e->add_prefix_space && b->tc[start] != ' ';
    Py_ssize_t m = end - start + prefixed;
    if (grow3((void **)&b->sc, (void **)&b->scl, (void **)&b->sidx, &b->scap, m, sizeof(uint32_t), 1,
              sizeof(Py_ssize_t)))
        return -1;
    if (prefixed) {
        b->sc[0] = ' ';
        b->scl[0] = BC_SPACE;
        b->sidx[0] = start; /* the added space is aligned to the first character */
    }
    for (Py_ssize_t i = start; i < end; i++) {
        b->sc[i - start + prefixed] = b->tc[i];
        b->scl[i - start + prefixed] = e->cls[b->tc[i]];
        b->sidx[i - start + prefixed] = i;
    }
    for (Py_ssize_t i = 0; i < m;) {
        Py_ssize_t j = gpt2_match(b->sc, b->scl, i, m);
        if (bpe_word(e, b, w, i, j)) return -1;
        w->word++;
        i = j;
    }
    return 0;
}

static int bpe_encode_text(BPEEncoder *e, BWork *b, Work *w, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(e->error_cls, "expected text as str, got %s", Py_TYPE(text)->tp_name);
        return -1;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    w->olen = 0;
    w->word = 0;
    if (grow((void **)&b->tc, &b->tcap, n + 1, sizeof(uint32_t))) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t cp = PyUnicode_READ(kind, data, i);
        b->tc[i] = cp;
        if (e->cls[cp] == BC_UNSET && classify(e, cp)) return -1;
    }
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t c = b->tc[i];
        if (c < 128 ? !e->sp_first_ascii[c] : !e->sp_first_nonascii) continue;
        for (Py_ssize_t s = 0; s < e->n_special; s++) {
            Py_ssize_t len = e->sp_len[s];
            if (i + len > n || memcmp(b->tc + i, e->sp_cps[s], len * sizeof(uint32_t))) continue;
            Py_ssize_t start = i;
            if (e->sp_lstrip[s])
                while (start > pos && e->cls[b->tc[start - 1]] == BC_SPACE) start--;
            if (bpe_stretch(e, b, w, pos, start)) return -1;
            Py_ssize_t o0 = start;
            if (e->trim_offsets && i > start) { /* the whitespace taken is trimmed like leading 'Ġ's */
                Py_ssize_t lead = i - start;
                if (!((w->olen == 0 || start == 0) && e->add_prefix_space && lead == 1)) o0 = i;
            }
            if (emit(w, e->sp_id[s], o0, i + len)) return -1;
            w->word++;
            pos = i + len;
            i = pos - 1;
            break;
        }
    }
    return bpe_stretch(e, b, w, pos, n);
}

static int bpe_encode(PyObject *e, Work *w, PyObject *text) {
    BWork b = {0};
    int r = bpe_encode_text((BPEEncoder *)e, &b, w, text);
    bwork_free(&b);
    return r;
}

static PyObject *BPEEncoder_encode(BPEEncoder *e, PyObject *text) {
    return encode_one((PyObject *)e, bpe_encode, &e->ic, text);
}
static PyObject *BPEEncoder_encode_many(BPEEncoder *e, PyObject *texts) {
    return encode_many((PyObject *)e, bpe_encode, &e->ic, texts);
}
static PyObject *BPEEncoder_encode_ids(BPEEncoder *e, PyObject *texts) {
    return encode_ids((PyObject *)e, bpe_encode, &e->ic, texts);
}
static PyObject *BPEEncoder_encode_flat(BPEEncoder *e, PyObject *texts) {
    return encode_flat((PyObject *)e, bpe_encode, texts);
}

static void BPEEncoder_dealloc(BPEEncoder *e) {
    PyMem_Free(e->cls);
    Py_XDECREF(e->char_class);
    Py_XDECREF(e->error_cls);
    PyMem_Free(e->merges);
    PyMem_Free(e->lead);
    PyMem_Free(e->trail);
    for (Py_ssize_t s = 0; s < e->n_special; s++) PyMem_Free(e->sp_cps[s]);
    PyMem_Free(e->sp_cps);
    PyMem_Free(e->sp_len);
    PyMem_Free(e->sp_id);
    PyMem_Free(e->sp_lstrip);
    PyMem_Free(e->cache);
    PyMem_Free(e->keys);
    PyMem_Free(e->pieces);
    intcache_free(&e->ic);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

/* BPEEncoder(tokens, merges, specials, char_class, add_prefix_space, trim_offsets, unk_id, error_cls)
 * tokens: the vocabulary in id order (byte-level pieces); merges: [(a, b), ...] highest priority first, every
 * piece in the vocabulary; specials: [(token, id, lstrip), ...]; unk_id: -1 drops unknown bytes. */
static int BPEEncoder_init(BPEEncoder *e, PyObject *args, PyObject *kw) {
    PyObject *tokens, *merges, *specials, *char_class, *error_cls;
    int add_prefix_space, trim_offsets, unk_id;
    static char *kwlist[] = {"tokens", "merges", "specials", "char_class", "add_prefix_space", "trim_offsets",
                             "unk_id", "error_cls", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!O!OppiO", kwlist, &PyList_Type, &tokens, &PyList_Type, &merges,
                                     &PyList_Type, &specials, &char_class, &add_prefix_space, &trim_offsets,
                                     &unk_id, &error_cls))
        return -1;
    if (e->cls) {
        PyErr_SetString(PyExc_RuntimeError, "BPEEncoder is already initialised");
        return -1;
    }
    e->add_prefix_space = add_prefix_space;
    e->trim_offsets = trim_offsets;
    e->unk_id = unk_id;
    Py_INCREF(char_class);
    e->char_class = char_class;
    Py_INCREF(error_cls);
    e->error_cls = error_cls;
    if (!(e->cls = PyMem_Malloc(N_CODEPOINTS))) { PyErr_NoMemory(); return -1; }
    memset(e->cls, BC_UNSET, N_CODEPOINTS);
    for (uint32_t cp = 0; cp < 128; cp++)
        if (classify(e, cp)) return -1;

    /* token ids: the vocabulary as a dict, the 'Ġ' counts, and the id of each byte's character */
    Py_ssize_t n_tok = PyList_GET_SIZE(tokens);
    e->n_tok = n_tok;
    PyObject *ids = PyDict_New();
    if (!ids) return -1;
    e->lead = PyMem_Calloc(n_tok ? n_tok : 1, sizeof(int32_t));
    e->trail = PyMem_Calloc(n_tok ? n_tok : 1, sizeof(int32_t));
    if (!e->lead || !e->trail) { Py_DECREF(ids); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < n_tok; k++) {
        PyObject *t = PyList_GET_ITEM(tokens, k), *i = PyLong_FromSsize_t(k);
        if (!i || !PyUnicode_Check(t) || PyDict_SetItem(ids, t, i)) {
            Py_XDECREF(i);
            Py_DECREF(ids);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "tokens must be str");
            return -1;
        }
        Py_DECREF(i);
        Py_ssize_t len = PyUnicode_GET_LENGTH(t), a = 0, z = 0;
        while (a < len && PyUnicode_READ_CHAR(t, a) == 0x120) a++;
        while (z < len && PyUnicode_READ_CHAR(t, len - 1 - z) == 0x120) z++;
        e->lead[k] = (int32_t)a;
        e->trail[k] = (int32_t)z;
    }
    /* GPT-2's byte -> character table (bpe.bytes_to_unicode) */
    for (int by = 0, extra = 0; by < 256; by++) {
        int keep = (by >= '!' && by <= '~') || (by >= 0xA1 && by <= 0xAC) || (by >= 0xAE && by <= 0xFF);
        Py_UCS4 ch = keep ? (Py_UCS4)by : (Py_UCS4)(256 + extra++);
        PyObject *s = PyUnicode_FromOrdinal(ch);
        if (!s) { Py_DECREF(ids); return -1; }
        PyObject *i = PyDict_GetItemWithError(ids, s);
        Py_DECREF(s);
        if (!i && PyErr_Occurred()) { Py_DECREF(ids); return -1; }
        e->byte_id[by] = i ? (int32_t)PyLong_AsLong(i) : -1;
    }
    /* merges -> (rank, id of the merged piece), the first rank of a pair kept */
    Py_ssize_t nm = PyList_GET_SIZE(merges);
    uint64_t size = 1024;
    while (size < (uint64_t)nm * 2 + 16) size *= 2;
    e->merges = PyMem_Calloc(size, sizeof(MergeSlot));
    if (!e->merges) { Py_DECREF(ids); PyErr_NoMemory(); return -1; }
    e->merge_mask = size - 1;
    for (Py_ssize_t r = 0; r < nm; r++) {
        PyObject *a, *b, *ab = NULL, *ia, *ib, *iab;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(merges, r), "UU", &a, &b) || !(ab = PyUnicode_Concat(a, b))) {
            Py_DECREF(ids);
            return -1;
        }
        ia = PyDict_GetItem(ids, a);
        ib = PyDict_GetItem(ids, b);
        iab = PyDict_GetItem(ids, ab);
        Py_DECREF(ab);
        if (!ia || !ib || !iab) {
            Py_DECREF(ids);
            PyErr_Format(PyExc_ValueError, "merge %zd has a piece that is not in the vocabulary", r + 1);
            return -1;
        }
        uint64_t key = merge_key((int32_t)PyLong_AsLong(ia), (int32_t)PyLong_AsLong(ib));
        uint64_t h = hash64(key) & e->merge_mask;
        while (e->merges[h].key && e->merges[h].key != key) h = (h + 1) & e->merge_mask;
        if (!e->merges[h].key) {
            e->merges[h].key = key;
            e->merges[h].rank = (int32_t)r;
            e->merges[h].id = (int32_t)PyLong_AsLong(iab);
        }
    }
    Py_DECREF(ids);

    /* special tokens, longest first (leftmost-longest, like the Python regex) */
    Py_ssize_t ns = PyList_GET_SIZE(specials);
    e->sp_cps = PyMem_Calloc(ns ? ns : 1, sizeof(uint32_t *));
    e->sp_len = PyMem_Calloc(ns ? ns : 1, sizeof(Py_ssize_t));
    e->sp_id = PyMem_Calloc(ns ? ns : 1, sizeof(int32_t));
    e->sp_lstrip = PyMem_Calloc(ns ? ns : 1, 1);
    if (!e->sp_cps || !e->sp_len || !e->sp_id || !e->sp_lstrip) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t s = 0; s < ns; s++) {
        PyObject *tok;
        int id, lstrip;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(specials, s), "Uip", &tok, &id, &lstrip)) return -1;
        Py_ssize_t len = PyUnicode_GET_LENGTH(tok);
        if (len == 0) continue;
        Py_ssize_t pos = e->n_special;
        while (pos > 0 && e->sp_len[pos - 1] < len) {
            e->sp_cps[pos] = e->sp_cps[pos - 1];
            e->sp_len[pos] = e->sp_len[pos - 1];
            e->sp_id[pos] = e->sp_id[pos - 1];
            e->sp_lstrip[pos] = e->sp_lstrip[pos - 1];
            pos--;
        }
        e->sp_cps[pos] = PyMem_Malloc(len * sizeof(uint32_t));
        if (!e->sp_cps[pos]) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t k = 0; k < len; k++) e->sp_cps[pos][k] = PyUnicode_READ_CHAR(tok, k);
        e->sp_len[pos] = len;
        e->sp_id[pos] = id;
        e->sp_lstrip[pos] = (uint8_t)lstrip;
        e->n_special++;
        uint32_t first = e->sp_cps[pos][0];
        if (first < 128) e->sp_first_ascii[first] = 1;
        else e->sp_first_nonascii = 1;
    }
    if (!(e->cache = PyMem_Calloc(BPE_CACHE_SLOTS, sizeof(CacheSlot)))) { PyErr_NoMemory(); return -1; }
    return intcache_init(&e->ic, n_tok);
}

static PyMethodDef BPEEncoder_methods[] = {
    {"encode", (PyCFunction)BPEEncoder_encode, METH_O,
     "encode(text) -> (ids, offsets, word_ids) without special tokens, as RobertaTokenizer._encode_seq_py"},
    {"encode_many", (PyCFunction)BPEEncoder_encode_many, METH_O, "encode_many(texts) -> [encode(t) for t in texts]"},
    {"encode_ids", (PyCFunction)BPEEncoder_encode_ids, METH_O, "encode_ids(texts) -> [ids of t for t in texts]"},
    {"encode_flat", (PyCFunction)BPEEncoder_encode_flat, METH_O,
     "encode_flat(texts) -> (int32 ids of all texts as bytes, int64 length per text as bytes)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BPEEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bertlab.tokenizer._fast.BPEEncoder",
    .tp_basicsize = sizeof(BPEEncoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "byte-level BPE encoder in C; see bertlab/tokenizer/_fast.c",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BPEEncoder_init,
    .tp_dealloc = (destructor)BPEEncoder_dealloc,
    .tp_methods = BPEEncoder_methods,
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "_fast", "The encoding loops of BertTokenizer and RobertaTokenizer in C (optional "
    "accelerator).", -1, NULL,
};

PyMODINIT_FUNC PyInit__fast(void) {
    if (PyType_Ready(&EncoderType) < 0 || PyType_Ready(&BPEEncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fast_module);
    if (!m) return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&BPEEncoderType);
    if (PyModule_AddObject(m, "BPEEncoder", (PyObject *)&BPEEncoderType) < 0) {
        Py_DECREF(&BPEEncoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
