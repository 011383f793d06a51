/* What the tokenizer's C encoders share (the extension bertlab.tokenizer._fast; optional, Python is the
 * reference): an encoder turns one Python str into token ids, character offsets and word ids in a Work, and the
 * Python methods around that one call (encode, encode_many, encode_ids, encode_flat) are written once, in
 * module.c, for every encoder: WordPiece (wordpiece.c, BertTokenizer's) and byte-level BPE (bpe.c,
 * RobertaTokenizer's). Both match special tokens on the raw text from the same table (`Specials`). */
#ifndef BERTLAB_TOKENIZER_ENCODER_H
#define BERTLAB_TOKENIZER_ENCODER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define N_CODEPOINTS 0x110000

/* cached small ints for ids and offsets, created on first use */
typedef struct {
    PyObject **ints;
    Py_ssize_t n_ints;
} IntCache;

/* The output of one encoded text, and the encoder's own scratch buffers: kept out of the encoder object so
 * that two threads sharing a tokenizer cannot clobber each other's buffers when a callback into Python lets
 * the other one run, and kept across the texts of one call so that they are allocated once. */
typedef struct {
    int32_t *oid;
    Py_ssize_t *ost, *oen, *ow;
    Py_ssize_t olen, ocap;
    Py_ssize_t word;
    void *scratch; /* the encoder's, freed by its free_scratch */
} Work;

typedef struct EncoderBase EncoderBase;

/* The head of every encoder object: the one call that differs, and the int cache of its results. */
struct EncoderBase {
    PyObject_HEAD
    int (*encode)(EncoderBase *self, Work *w, PyObject *text); /* one text into w->oid/ost/oen/ow[0:olen] */
    void (*free_scratch)(void *scratch);                       /* what encode left in w->scratch */
    IntCache ic;
};

/* Special tokens, longest first (leftmost-longest, like the Python regex), with the first characters that
 * can start one (so most characters are passed over at one lookup). */
typedef struct {
    Py_ssize_t n;
    uint32_t **cps;
    Py_ssize_t *len;
    int32_t *id;
    uint8_t *lstrip; /* may take the whitespace before it (BPE's `<mask>`) */
    uint8_t first_ascii[128];
    int first_nonascii;
} Specials;

/* module.c */
extern PyMethodDef encoder_methods[]; /* encode, encode_many, encode_ids, encode_flat */
int encoder_base_init(EncoderBase *e, Py_ssize_t n_tok);
void encoder_base_free(EncoderBase *e); /* the base's part of a dealloc, tp_free included */
/* specials: [(token, id), ...], or [(token, id, lstrip), ...] when `with_lstrip` */
int specials_init(Specials *s, PyObject *specials, int with_lstrip);
void specials_free(Specials *s);

/* wordpiece.c, bpe.c */
extern PyTypeObject WordPieceEncoderType;
extern PyTypeObject BPEEncoderType;

/* ---------------------------------------------------------------------------------------------------- */
/* growable arrays, the output of one text, the hash both encoders' tables use */

static inline int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t elem) {
    if (need <= *cap) return 0;
    Py_ssize_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = PyMem_Realloc(*p, (size_t)nc * elem);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q;
    *cap = nc;
    return 0;
}

static inline int grow_out(Work *w, Py_ssize_t need) {
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

static inline uint64_t hash64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

#endif
