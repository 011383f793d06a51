/* Byte-level BPE in C (GPT-2, RoBERTa): the encoder of RobertaTokenizer (`_fast.BPEEncoder`; optional, Python
 * is the reference). BPEEncoder does what RobertaTokenizer._encode_seq_py does with bpe.py.
 *
 * Special tokens are matched on the raw text (leftmost, longest; `<mask>` may take the whitespace before
 * it); each stretch between them gets the optional prefix space and is split by GPT-2's pattern, written out
 * below as the matcher it is; each pre-token's UTF-8 bytes are merged by the classic BPE loop (lowest-ranked
 * pair, all its occurrences left to right -- bpe.BPE.merge) on token ids, and the pieces are cached per byte
 * string. Character classes (letter, number, White_Space, other) come from bpe.char_class, asked once per
 * distinct code point, so both paths share one definition of them. */
#include "encoder.h"

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
    EncoderBase base;
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
    Specials sp;
    CacheSlot *cache;
    uint32_t cache_used;
    uint8_t *keys;
    Py_ssize_t keys_len, keys_cap;
    int32_t *pieces;
    Py_ssize_t pieces_len, pieces_cap;
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
        if (c < 128 ? !e->sp.first_ascii[c] : !e->sp.first_nonascii) continue;
        for (Py_ssize_t s = 0; s < e->sp.n; s++) {
            Py_ssize_t len = e->sp.len[s];
            if (i + len > n || memcmp(b->tc + i, e->sp.cps[s], len * sizeof(uint32_t))) continue;
            Py_ssize_t start = i;
            if (e->sp.lstrip[s])
                while (start > pos && e->cls[b->tc[start - 1]] == BC_SPACE) start--;
            if (bpe_stretch(e, b, w, pos, start)) return -1;
            Py_ssize_t o0 = start;
            if (e->trim_offsets && i > start) { /* the whitespace taken is trimmed like leading 'Ġ's */
                Py_ssize_t lead = i - start;
                if (!((w->olen == 0 || start == 0) && e->add_prefix_space && lead == 1)) o0 = i;
            }
            if (emit(w, e->sp.id[s], o0, i + len)) return -1;
            w->word++;
            pos = i + len;
            i = pos - 1;
            break;
        }
    }
    return bpe_stretch(e, b, w, pos, n);
}

/* the encoder's one-text call: its scratch lives for the one text (module.c's methods call it per text) */
static int bpe_encode(EncoderBase *e, Work *w, PyObject *text) {
    BWork b = {0};
    int r = bpe_encode_text((BPEEncoder *)e, &b, w, text);
    bwork_free(&b);
    return r;
}

/* ---------------------------------------------------------------------------------------------------- */
/* the Python type (its methods: module.c) */

static void BPEEncoder_dealloc(BPEEncoder *e) {
    PyMem_Free(e->cls);
    Py_XDECREF(e->char_class);
    Py_XDECREF(e->error_cls);
    PyMem_Free(e->merges);
    PyMem_Free(e->lead);
    PyMem_Free(e->trail);
    specials_free(&e->sp);
    PyMem_Free(e->cache);
    PyMem_Free(e->keys);
    PyMem_Free(e->pieces);
    encoder_base_free(&e->base);
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

    if (specials_init(&e->sp, specials, 1)) return -1;
    if (!(e->cache = PyMem_Calloc(BPE_CACHE_SLOTS, sizeof(CacheSlot)))) { PyErr_NoMemory(); return -1; }
    if (encoder_base_init(&e->base, n_tok)) return -1;
    e->base.encode = bpe_encode; /* ready: the methods run only on a fully initialised encoder */
    return 0;
}

PyTypeObject BPEEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bertlab.tokenizer._fast.BPEEncoder",
    .tp_basicsize = sizeof(BPEEncoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "byte-level BPE encoder in C; see bertlab/tokenizer/csrc/bpe.c",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BPEEncoder_init,
    .tp_dealloc = (destructor)BPEEncoder_dealloc,
    .tp_methods = encoder_methods,
};
