/* WordPiece in C: the encoder of BertTokenizer (`_fast.Encoder`; optional, Python is the reference).
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
#include "encoder.h"

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

typedef struct {
    uint64_t key; /* (node << 21 | code point) + 1; 0 marks an empty slot */
    int32_t child;
} Edge;

typedef struct {
    EncoderBase base;
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
    Specials sp;
} Encoder;

/* Scratch of the encode calls (Work.scratch): the current whitespace token (cleaned) and its normalisation */
typedef struct {
    uint32_t *tcp;
    Py_ssize_t *tidx;
    Py_ssize_t tlen, tcap;
    int thard;
    uint32_t *ncp;
    Py_ssize_t *nidx;
    Py_ssize_t nlen, ncap;
} WPScratch;

static void scratch_free(void *p) {
    WPScratch *sw = p;
    PyMem_Free(sw->tcp);
    PyMem_Free(sw->tidx);
    PyMem_Free(sw->ncp);
    PyMem_Free(sw->nidx);
    PyMem_Free(sw);
}

/* ---------------------------------------------------------------------------------------------------- */
/* growable scratch arrays */

static int grow_token(WPScratch *sw, Py_ssize_t need) {
    if (need <= sw->tcap) return 0;
    Py_ssize_t cap = sw->tcap;
    if (grow((void **)&sw->tcp, &cap, need, sizeof(uint32_t))) return -1;
    cap = sw->tcap;
    if (grow((void **)&sw->tidx, &cap, need, sizeof(Py_ssize_t))) return -1;
    sw->tcap = cap;
    return 0;
}

static int grow_norm(WPScratch *sw, Py_ssize_t need) {
    if (need <= sw->ncap) return 0;
    Py_ssize_t cap = sw->ncap;
    if (grow((void **)&sw->ncp, &cap, need, sizeof(uint32_t))) return -1;
    cap = sw->ncap;
    if (grow((void **)&sw->nidx, &cap, need, sizeof(Py_ssize_t))) return -1;
    sw->ncap = cap;
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

static int wordpiece(const Encoder *e, Work *w, WPScratch *sw, Py_ssize_t s, Py_ssize_t t) {
    const uint32_t *cp = sw->ncp;
    const Py_ssize_t *idx = sw->nidx;
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
static int flush_token(Encoder *e, Work *w, WPScratch *sw) {
    Py_ssize_t n = sw->tlen;
    if (n == 0) return 0;
    sw->nlen = 0;
    if (sw->thard) {
        PyObject *s = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, sw->tcp, n);
        if (!s) return -1;
        PyObject *r = PyObject_CallOneArg(e->normalize_token, s);
        Py_DECREF(s);
        if (!r) return -1;
        PyObject *ns, *ni;
        if (!PyArg_ParseTuple(r, "UO!", &ns, &PyList_Type, &ni)) { Py_DECREF(r); return -1; }
        Py_ssize_t m = PyUnicode_GET_LENGTH(ns);
        if (PyList_GET_SIZE(ni) != m) { Py_DECREF(r); PyErr_SetString(PyExc_ValueError, "_normalize_token: length mismatch"); return -1; }
        if (grow_norm(sw, m)) { Py_DECREF(r); return -1; }
        for (Py_ssize_t k = 0; k < m; k++) {
            Py_ssize_t rel = PyLong_AsSsize_t(PyList_GET_ITEM(ni, k));
            if (rel < 0 || rel >= n) {
                Py_DECREF(r);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_normalize_token: bad index");
                return -1;
            }
            sw->ncp[k] = PyUnicode_READ_CHAR(ns, k);
            sw->nidx[k] = sw->tidx[rel];
        }
        sw->nlen = m;
        Py_DECREF(r);
    } else {
        for (Py_ssize_t k = 0; k < n; k++) {
            uint32_t c = sw->tcp[k];
            uint32_t x = get_info(e, c);
            if (!x) return -1;
            if (x & INFO_MAPPED) {
                const uint32_t *m = e->pool + INFO_POOL(x);
                uint32_t len = m[0];
                if (sw->nlen + (Py_ssize_t)len > sw->ncap && grow_norm(sw, sw->nlen + len)) return -1;
                for (uint32_t j = 1; j <= len; j++) {
                    sw->ncp[sw->nlen] = m[j];
                    sw->nidx[sw->nlen++] = sw->tidx[k];
                }
            } else {
                if (sw->nlen >= sw->ncap && grow_norm(sw, sw->nlen + 1)) return -1;
                sw->ncp[sw->nlen] = c;
                sw->nidx[sw->nlen++] = sw->tidx[k];
            }
        }
    }
    sw->tlen = 0;
    sw->thard = 0;
    Py_ssize_t ws = 0, m = sw->nlen;
    for (Py_ssize_t k = 0; k < m; k++) {
        uint32_t x = get_info(e, sw->ncp[k]);
        if (!x) return -1;
        if (INFO_KIND(x) == K_PUNCT) {
            if (k > ws && wordpiece(e, w, sw, ws, k)) return -1;
            if (wordpiece(e, w, sw, k, k + 1)) return -1;
            ws = k + 1;
        }
    }
    if (m > ws && wordpiece(e, w, sw, ws, m)) return -1;
    return 0;
}

static inline int push_char(WPScratch *sw, uint32_t cp, Py_ssize_t i, uint32_t x) {
    if (sw->tlen >= sw->tcap && grow_token(sw, sw->tlen + 1)) return -1;
    sw->tcp[sw->tlen] = cp;
    sw->tidx[sw->tlen++] = i;
    if (x & INFO_HARD) sw->thard = 1;
    return 0;
}

/* Longest special token starting at i, or -1. */
static Py_ssize_t match_special(Encoder *e, int kind, const void *data, Py_ssize_t n, Py_ssize_t i) {
    for (Py_ssize_t s = 0; s < e->sp.n; s++) {
        Py_ssize_t len = e->sp.len[s];
        if (i + len > n) continue;
        const uint32_t *c = e->sp.cps[s];
        Py_ssize_t k = 0;
        while (k < len && PyUnicode_READ(kind, data, i + k) == c[k]) k++;
        if (k == len) return s;
    }
    return -1;
}

/* The whole pipeline for one text; results in w->oid/ost/oen/ow[0:olen]. */
static int encode_text(Encoder *e, Work *w, WPScratch *sw, PyObject *text) {
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
    sw->tlen = 0;
    sw->thard = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t cp = PyUnicode_READ(kind, data, i);
        if (e->sp.n && ((cp < 128 && e->sp.first_ascii[cp]) || (cp >= 128 && e->sp.first_nonascii))) {
            Py_ssize_t s = match_special(e, kind, data, n, i);
            if (s >= 0) {
                if (flush_token(e, w, sw)) return -1;
                if (emit(w, e->sp.id[s], i, i + e->sp.len[s])) return -1;
                w->word++;
                i += e->sp.len[s] - 1;
                continue;
            }
        }
        uint32_t x = get_info(e, cp);
        if (!x) return -1;
        switch (INFO_KIND(x)) {
        case K_DROP:
            break;
        case K_SPACE:
            if (flush_token(e, w, sw)) return -1;
            break;
        case K_CJK:
            if (e->cjk) {
                if (flush_token(e, w, sw)) return -1;
                if (push_char(sw, cp, i, x)) return -1;
                if (flush_token(e, w, sw)) return -1;
                break;
            }
            /* fall through */
        default:
            if (push_char(sw, cp, i, x)) return -1;
        }
    }
    return flush_token(e, w, sw);
}
static int wp_encode(EncoderBase *self, Work *w, PyObject *text) {
    if (!w->scratch && !(w->scratch = PyMem_Calloc(1, sizeof(WPScratch)))) {
        PyErr_NoMemory();
        return -1;
    }
    return encode_text((Encoder *)self, w, (WPScratch *)w->scratch, text);
}

/* ---------------------------------------------------------------------------------------------------- */
/* the Python type (its methods: module.c) */

static void Encoder_dealloc(Encoder *e) {
    PyMem_Free(e->info);
    PyMem_Free(e->pool);
    Py_XDECREF(e->char_info);
    Py_XDECREF(e->normalize_token);
    Py_XDECREF(e->error_cls);
    PyMem_Free(e->edges);
    PyMem_Free(e->node_tok);
    specials_free(&e->sp);
    encoder_base_free(&e->base);
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

    if (specials_init(&e->sp, specials, 0)) return -1;

    if (encoder_base_init(&e->base, n_tok)) return -1;
    /* ASCII first, so the common case never calls back */
    for (uint32_t cp = 0; cp < 128; cp++)
        if (!get_info(e, cp)) return -1;
    e->base.free_scratch = scratch_free;
    e->base.encode = wp_encode; /* ready: the methods run only on a fully initialised encoder */
    return 0;
}

PyTypeObject WordPieceEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bertlab.tokenizer._fast.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WordPiece encoder in C; see bertlab/tokenizer/csrc/wordpiece.c",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = encoder_methods,
};
