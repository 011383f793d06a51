/* Attention in C for CPU inference: a decoding step's one query per row and head, and short rows per (row,
 * head), in fp32 (see common.h; attention_bf16.c has the short rows on AVX-512 BF16). Portable loops: built once
 * per level (levels_*.c). */
#include "common.h"

/* ------------------------------------------------------------------------------- attention, one query */
/* A decoding step: each row has one new query against its cached keys and values. Per (row, head), with
 * T_k keys of hs values:  s_j = scale · q·k_j + add_j,  p = softmax(s),  out = Σ_j p_j v_j.
 * Torch's SDPA spent ~0.4 ms a call on this at T5-small's beam search (32 rows, 8 heads, <= 48 keys): its
 * kernel is built for blocks of many queries. Here each (row, head) is a few hundred multiply-adds. */
#if defined(__AVX2__) && !defined(__AVX512F__)
/* AVX2: the dot products and the weighted sum in 8-float vectors. In 16-float ones (16 keys' sums, 8 outputs
 * twice) they need 32 of AVX2's 16 registers, and the build kept them on the stack (1,625 stack references in the
 * kernel). The same sums here: each key's 16 lane sums as two halves, folded as fold16 folds them (lane l and
 * l + 8, then + 4, + 2, + 1), 4 keys at a time; the outputs 32 or 16 at a time (weighted_sum16). */
/* out[j] = q · k_j for the n <= 16 keys k_j = k + j · key_stride (out[n..15] = 0); hs a multiple of 16 */
INLINE void dot16_keys(const float *q, const float *k, ptrdiff_t key_stride, ptrdiff_t hs, float *out, int n) {
    for (int j0 = 0; j0 < 16; j0 += 4) {
        f32x8 lo[4], hi[4];
        for (int j = 0; j < 4; j++) lo[j] = hi[j] = (f32x8){0};
        for (ptrdiff_t d = 0; d < hs && j0 < n; d += 16) {
            f32x8 x0, x1;
            memcpy(&x0, q + d, sizeof x0);
            memcpy(&x1, q + d + 8, sizeof x1);
            for (int j = 0; j < 4; j++) {
                if (j0 + j >= n) break;
                f32x8 y0, y1;
                memcpy(&y0, k + (j0 + j) * key_stride + d, sizeof y0);
                memcpy(&y1, k + (j0 + j) * key_stride + d + 8, sizeof y1);
                lo[j] += x0 * y0;
                hi[j] += x1 * y1;
            }
        }
        for (int j = 0; j < 4; j++) {
            const f32x8 s = lo[j] + hi[j];
            out[j0 + j] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        }
    }
}
#else
/* out[j] = q · k_j for the n <= 16 keys k_j = k + j · key_stride (out[n..15] = 0); hs a multiple of 16 */
INLINE void dot16_keys(const float *q, const float *k, ptrdiff_t key_stride, ptrdiff_t hs, float *out, int n) {
    f32x16 acc[16];
    for (int j = 0; j < 16; j++) acc[j] = (f32x16){0};
    for (ptrdiff_t d = 0; d < hs; d += 16) {
        f32x16 x;
        memcpy(&x, q + d, sizeof x);
        for (int j = 0; j < 16; j++) {
            if (j >= n) break;
            f32x16 y;
            memcpy(&y, k + j * key_stride + d, sizeof y);
            acc[j] += x * y;
        }
    }
    fold16(acc, out);
}
#endif

/* out[0..NV·FVEC) = Σ_j p[j] · v_j over n keys v_j = v + j · stride: the accumulators stay in registers (NV
 * vectors of the level's width, twice: even and odd keys in separate chains) */
#if defined(__AVX2__) && !defined(__AVX512F__)
typedef f32x8 fvec;
#define FVEC 8
#else
typedef f32x16 fvec;
#define FVEC 16
#endif
INLINE void weighted_sum(const int NV, const float *p, const float *v, ptrdiff_t stride, ptrdiff_t n, float *out) {
    fvec even[4], odd[4];
    for (int c = 0; c < NV; c++) even[c] = odd[c] = (fvec){0};
    ptrdiff_t j = 0;
    for (; j + 2 <= n; j += 2) {
        for (int c = 0; c < NV; c++) {
            fvec a, b;
            memcpy(&a, v + j * stride + FVEC * c, sizeof a);
            memcpy(&b, v + (j + 1) * stride + FVEC * c, sizeof b);
            even[c] += p[j] * a;
            odd[c] += p[j + 1] * b;
        }
    }
    if (j < n)
        for (int c = 0; c < NV; c++) {
            fvec a;
            memcpy(&a, v + j * stride + FVEC * c, sizeof a);
            even[c] += p[j] * a;
        }
    for (int c = 0; c < NV; c++) {
        const fvec sum = even[c] + odd[c];
        memcpy(out + FVEC * c, &sum, sizeof sum);
    }
}

/* out[0..NV·16) = weighted_sum (AVX2: 32 or 16 outputs a pass, 8 or 4 accumulators) */
INLINE void weighted_sum16(const int NV, const float *p, const float *v, ptrdiff_t stride, ptrdiff_t n,
                           float *out) {
#if defined(__AVX2__) && !defined(__AVX512F__)
    int c = 0;
    for (; c + 2 <= NV; c += 2) weighted_sum(4, p, v + 16 * c, stride, n, out + 16 * c);
    if (c < NV) weighted_sum(2, p, v + 16 * c, stride, n, out + 16 * c);
#else
    weighted_sum(NV, p, v, stride, n, out);
#endif
}

/* see OneQuery (kernels.h) */
HIDDEN void VARIANT(one_query_heads)(const OneQuery *a, ptrdiff_t first, ptrdiff_t count, float *tmp) {
    const ptrdiff_t n16 = padded(a->keys);
    for (ptrdiff_t task = first; task < first + count; task++) {
        const ptrdiff_t b = task / a->heads, h = task % a->heads;
        const float *q = a->q + b * a->qs[0] + h * a->qs[1];
        const float *k = a->k + b / a->group * a->ks[0] + h * a->ks[1];
        const float *v = a->v + b / a->group * a->vs[0] + h * a->vs[1];
        const float *add = a->add ? a->add + b * a->adds[0] + h * a->adds[1] : NULL;
        ptrdiff_t j = 0;
        if (a->hs % 16 == 0)
            for (; j < a->keys; j += 16)
                dot16_keys(q, k + j * a->ks[2], a->ks[2], a->hs, tmp + j, a->keys - j < 16 ? (int)(a->keys - j) : 16);
        for (; j < a->keys; j++) tmp[j] = dot_f32(q, k + j * a->ks[2], a->hs);
        for (j = 0; j < a->keys; j++) tmp[j] = a->scale * tmp[j] + (add ? add[j] : 0.0f);
        for (ptrdiff_t j = a->keys; j < n16; j++) tmp[j] = -INFINITY;
        const float inv = exp_normalizer(tmp, n16);
        for (j = 0; j < a->keys; j++) tmp[j] *= inv;
        float *out = a->out + (b * a->heads + h) * a->hs;
        switch (a->hs) {
            case 16: weighted_sum16(1, tmp, v, a->vs[2], a->keys, out); break;
            case 32: weighted_sum16(2, tmp, v, a->vs[2], a->keys, out); break;
            case 48: weighted_sum16(3, tmp, v, a->vs[2], a->keys, out); break;
            case 64: weighted_sum16(4, tmp, v, a->vs[2], a->keys, out); break;
            default:
                for (ptrdiff_t d = 0; d < a->hs; d++) out[d] = 0.0f;
                for (ptrdiff_t j = 0; j < a->keys; j++) {
                    const float *vj = v + j * a->vs[2];
                    for (ptrdiff_t d = 0; d < a->hs; d++) out[d] += tmp[j] * vj[d];
                }
        }
    }
}

/* ------------------------------------------------------------------------------ attention, short rows */
/* Attention of a few dozen queries per (row, head), fp32: a short input, or a lone request. At these sizes
 * batched matmuls spend most of their time per call, not per flop (MiniLM, one 72-token row: ~180 us a layer
 * through SDPA or bmm for ~8 Mflop). Here each (row, head) is three register-tiled loops over data in L1:
 *   S = scale · Q Kᵀ + add      4 queries x NB·16 keys of accumulators, K transposed once per head; each row's
 *                               max kept as the scores leave the registers
 *   E = e^(S - max)             per row, summed
 *   O = (E V) / Σ E             8 queries (heads up to 32; 4 wider) x hs in accumulators, scaled once at the end
 *                               (hs a multiple of 16, at most 64)
 * Folding scale, mask and max into the Q Kᵀ loop and the normalisation into O (hs values, not T_k
 * probabilities) left the exponentials the only pass of their own: 1.15-1.25x at 72-384 keys (MiniLM's heads). */
/* (operands: Rows, kernels.h) */
/* The lanes of *s (the keys j .. j + 15) outside the row's visible keys [lo, hi) set to -inf: a local window's edges */
INLINE void outside_window16(f32x16 *s, ptrdiff_t j, ptrdiff_t lo, ptrdiff_t hi) {
    static const i32x16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const i32x16 at = lane + (int32_t)j;
    const i32x16 in = (at >= (i32x16){0} + (int32_t)lo) & (at < (i32x16){0} + (int32_t)hi);
    const f32x16 ninf = (f32x16){0} - INFINITY;
    i32x16 bits, off;
    memcpy(&bits, s, sizeof bits);
    memcpy(&off, &ninf, sizeof off);
    bits = (bits & in) | (off & ~in);
    memcpy(s, &bits, sizeof bits);
}

/* The scores S[r, j0 .. j0 + 16·NB) = scale · q[r]·k_j + add[r][j] of 4 query rows q[r] (hs each) against kt
 * (hs x n: K transposed), -inf outside each row's visible keys [lo[r], hi[r]) (hi <= keys: the padding keys
 * j >= keys, and a local window), and the rows' running maxima mk[r] (order keys): the softmax's first pass done
 * while the scores are still in registers. `add` rows hold `keys` values. */
INLINE void qk_tile(const int NB, const float *const q[4], const float *kt, ptrdiff_t n, ptrdiff_t j0,
                    ptrdiff_t hs, float scale, const float *const add[4], ptrdiff_t keys, const ptrdiff_t lo[4],
                    const ptrdiff_t hi[4], float *S, i32x16 mk[4]) {
    f32x16 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = (f32x16){0};
    for (ptrdiff_t d = 0; d < hs; d++) {
        f32x16 kv[4];
        for (int c = 0; c < NB; c++) memcpy(&kv[c], kt + d * n + j0 + 16 * c, sizeof kv[c]);
        for (int r = 0; r < 4; r++) {
            const float qd = q[r][d];
            for (int c = 0; c < NB; c++) acc[r][c] += qd * kv[c];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) {
            const ptrdiff_t j = j0 + 16 * c;
            f32x16 s = scale * acc[r][c];
            if (j + 16 <= keys) {
                if (add[r]) {
                    f32x16 a;
                    memcpy(&a, add[r] + j, sizeof a);
                    s += a;
                }
                if (j < lo[r] || j + 16 > hi[r]) outside_window16(&s, j, lo[r], hi[r]);
            } else  /* the last block: keys beyond `keys` are padding, and add has none of them */
                for (int l = 0; l < 16; l++)
                    s[l] = j + l >= lo[r] && j + l < hi[r] ? s[l] + (add[r] ? add[r][j + l] : 0.0f) : -INFINITY;
            max_keys(&mk[r], &s);
            memcpy(S + r * n + j, &s, sizeof s);
        }
}

/* O[r] = inv[r] · Σ_j P[r, j] v_j for R rows of unnormalised probabilities, hs = 16 · HB (R · HB <= 16
 * accumulators, and as many independent chains of FMAs: 8 rows for heads of 16 or 32) */
INLINE void pv_tile(const int R, const int HB, const float *P, ptrdiff_t n, const float *v, ptrdiff_t v_step,
                    ptrdiff_t keys, const float *inv, float *const *o) {
    f32x16 acc[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < HB; c++) acc[r][c] = (f32x16){0};
    for (ptrdiff_t j = 0; j < keys; j++) {
        f32x16 vv[4];
        for (int c = 0; c < HB; c++) memcpy(&vv[c], v + j * v_step + 16 * c, sizeof vv[c]);
        for (int r = 0; r < R; r++) {
            const float p = P[r * n + j];
            for (int c = 0; c < HB; c++) acc[r][c] += p * vv[c];
        }
    }
    for (int r = 0; r < R; r++)
        if (o[r])
            for (int c = 0; c < HB; c++) {
                const f32x16 y = inv[r] * acc[r][c];
                memcpy(o[r] + 16 * c, &y, sizeof y);
            }
}

/* dst[i · dst_stride + j] = src[j · src_stride + i] for a 16 x 16 block, rows j >= rows of src read as zeros: in
 * registers, four stages that each exchange blocks of half the previous width between row pairs (64 two-source
 * shuffles for 256 floats, where element by element took 256 strided stores and was ~15% of a short row's
 * attention) */
INLINE void transpose16(const float *src, ptrdiff_t src_stride, ptrdiff_t rows, float *dst, ptrdiff_t dst_stride) {
    static const i32x16 lo[4] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
        {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
        {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
        {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
    static const i32x16 hi[4] = {
        {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
        {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
        {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
        {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
    f32x16 r[16];
    for (int j = 0; j < 16; j++) {
        r[j] = (f32x16){0};
        if (j < rows) memcpy(&r[j], src + j * src_stride, sizeof r[j]);
    }
    for (int stage = 0, w = 8; stage < 4; stage++, w /= 2)
        for (int i = 0; i < 16; i++)
            if (!(i & w)) {
                const f32x16 a = r[i], b = r[i + w];
                r[i] = __builtin_shuffle(a, b, lo[stage]);
                r[i + w] = __builtin_shuffle(a, b, hi[stage]);
            }
    for (int i = 0; i < 16; i++) memcpy(dst + i * dst_stride, &r[i], sizeof r[i]);
}

/* One (row, head) task of a fp32 Rows: its row b, head h, and where its q, k, v and mask rows start (add NULL
 * where there is no mask). */
typedef struct {
    ptrdiff_t b, h;
    const float *q, *k, *v, *add;
} HeadRows;

INLINE HeadRows head_rows(const Rows *a, ptrdiff_t task) {
    const ptrdiff_t b = task / a->heads, h = task % a->heads;
    return (HeadRows){.b = b, .h = h, .q = (const float *)a->q + b * a->qs[0] + h * a->qs[1],
                      .k = (const float *)a->k + b / a->group * a->ks[0] + h * a->ks[1],
                      .v = (const float *)a->v + b / a->group * a->vs[0] + h * a->vs[1],
                      .add = a->add ? (const float *)a->add + b * a->adds[0] + h * a->adds[1] : NULL};
}

/* s[j] += c[ac[j]] + P[ap[j]] for the keys j of one query row (either table NULL: its term left out; their sum
 * first, as torch adds them): the gathers in whole vectors where the level has them (each lane the scalar loop's
 * sum, so the same bits) */
INLINE void add_terms_row(float *s, const float *c, const int32_t *ac, const float *P, const int32_t *ap,
                          ptrdiff_t keys) {
    ptrdiff_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= keys; j += 16) {
        __m512 t;
        if (c && P)
            t = _mm512_add_ps(_mm512_i32gather_ps(_mm512_loadu_si512(ac + j), c, 4),
                              _mm512_i32gather_ps(_mm512_loadu_si512(ap + j), P, 4));
        else if (c)
            t = _mm512_i32gather_ps(_mm512_loadu_si512(ac + j), c, 4);
        else
            t = _mm512_i32gather_ps(_mm512_loadu_si512(ap + j), P, 4);
        _mm512_storeu_ps(s + j, _mm512_add_ps(_mm512_loadu_ps(s + j), t));
    }
#elif defined(__AVX2__)
    for (; j + 8 <= keys; j += 8) {
        __m256 t;
        if (c && P)
            t = _mm256_add_ps(_mm256_i32gather_ps(c, _mm256_loadu_si256((const __m256i *)(ac + j)), 4),
                              _mm256_i32gather_ps(P, _mm256_loadu_si256((const __m256i *)(ap + j)), 4));
        else if (c)
            t = _mm256_i32gather_ps(c, _mm256_loadu_si256((const __m256i *)(ac + j)), 4);
        else
            t = _mm256_i32gather_ps(P, _mm256_loadu_si256((const __m256i *)(ap + j)), 4);
        _mm256_storeu_ps(s + j, _mm256_add_ps(_mm256_loadu_ps(s + j), t));
    }
#endif
    for (; j < keys; j++) s[j] += c && P ? c[ac[j]] + P[ap[j]] : c ? c[ac[j]] : P[ap[j]];
}

/* DeBERTa's relative terms (RelativeTerms, kernels.h) into the scores of the R query rows i0 .. i0 + R - 1 of row b
 * (row r's keys at S + r · n): S += C[i, at_c[i, j]] + P[at_p[i, j]], C the queries' c2p products (nc a query), P
 * the keys' p2c products (at_p: offsets into P, key j's row at j · np), either NULL; then the lowest float where
 * the mask has 0 (after the sum, as torch's masked_fill_ replaces what a masked score held). */
INLINE void add_relative_terms(const RelativeTerms *t, ptrdiff_t b, ptrdiff_t i0, int R, ptrdiff_t keys,
                               const float *C, ptrdiff_t nc, const float *P, float *S, ptrdiff_t n) {
    for (int r = 0; r < R; r++) {
        const ptrdiff_t i = i0 + r;
        float *s = S + r * n;
        add_terms_row(s, C ? C + i * nc : NULL, t->at_c + i * keys, P, t->at_p + i * keys, keys);
        if (t->mask) {
            const uint8_t *keep = t->mask + (b * keys + t->query_start + i) * keys;
            for (ptrdiff_t j = 0; j < keys; j++) s[j] = keep[j] ? s[j] : -FLT_MAX;
        }
    }
}

/* (each level's own, below) */
INLINE void transpose_rows(const float *src, ptrdiff_t stride, ptrdiff_t rows, ptrdiff_t hs, float *dst, ptrdiff_t n);
INLINE void row_products(const float *x, ptrdiff_t x_stride, ptrdiff_t rows, const float *kt, ptrdiff_t n,
                         ptrdiff_t cols, ptrdiff_t hs, float scale, const float *zero, float *out);

/* What one (row, head) of DeBERTa's attention gathers its terms from: its queries' c2p products into C (nc a query)
 * and its keys' p2c products into P (np a key), each table's rows for head h transposed first (into ct, pt) */
INLINE void relative_products(const RelativeTerms *rel, const Rows *a, const HeadRows *t, const float *zero,
                              float *ct, ptrdiff_t nc, float *C, float *pt, ptrdiff_t np, float *P) {
    if (rel->c2p) {
        transpose_rows(rel->c2p + t->h * rel->c2p_s[0], rel->c2p_s[1], rel->c2p_rows, a->hs, ct, nc);
        row_products(t->q, a->qs[2], a->queries, ct, nc, rel->c2p_rows, a->hs, rel->c2p_scale, zero, C);
    }
    if (rel->p2c) {
        transpose_rows(rel->p2c + t->h * rel->p2c_s[0], rel->p2c_s[1], rel->p2c_rows, a->hs, pt, np);
        row_products(t->k, a->ks[2], a->keys, pt, np, rel->p2c_rows, a->hs, 1.0f, zero, P);
    }
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* AVX2: the same loops on tiles that fit its 16 registers of 8 floats. The tiles above (4 x 64 scores, 8 x 32
 * outputs: 32 of those registers) spilled to the stack in every inner step -- all-MiniLM-L6-v2's attention took
 * 34x the AVX-512 build's time there. Here 6 queries x 16 keys of scores and 6 queries x 16 values of outputs
 * (12 accumulators each), K transposed in 8 x 8 blocks. Each score is still one FMA chain over hs in order and
 * each output one over the keys in order, scaled once: the numbers of the loops above. */
/* (f32x8, i32x8: common.h) */
/* dst[i · dst_stride + j] = src[j · src_stride + i] for an 8 x 8 block, rows j >= rows of src read as zeros */
INLINE void transpose8(const float *src, ptrdiff_t src_stride, ptrdiff_t rows, float *dst, ptrdiff_t dst_stride) {
    __m256 r[8];
    for (int j = 0; j < 8; j++) r[j] = j < rows ? _mm256_loadu_ps(src + j * src_stride) : _mm256_setzero_ps();
    __m256 t[8], u[8];
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xee);
        u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * dst_stride, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * dst_stride, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* query rows a tile: 6 x 16 scores or outputs in 12 accumulators (8 would leave no slack under the FMAs' latency) */
#define R8 6
/* outside_window16 for the 8 lanes of keys j .. j + 7 */
INLINE void outside_window8(f32x8 *s, ptrdiff_t j, ptrdiff_t lo, ptrdiff_t hi) {
    static const i32x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const i32x8 at = lane + (int32_t)j;
    const i32x8 in = (at >= (i32x8){0} + (int32_t)lo) & (at < (i32x8){0} + (int32_t)hi);
    const f32x8 ninf = (f32x8){0} - INFINITY;
    i32x8 bits, off;
    memcpy(&bits, s, sizeof bits);
    memcpy(&off, &ninf, sizeof off);
    bits = (bits & in) | (off & ~in);
    memcpy(s, &bits, sizeof bits);
}

/* qk_tile for R8 query rows x 16 keys j0 .. j0 + 16; mk[r] the rows' running maxima (order keys) in 8 lanes */
INLINE void qk_tile8(const float *const q[R8], const float *kt, ptrdiff_t n, ptrdiff_t j0, ptrdiff_t hs, float scale,
                     const float *const add[R8], ptrdiff_t keys, const ptrdiff_t lo[R8], const ptrdiff_t hi[R8],
                     float *S, i32x8 mk[R8]) {
    f32x8 acc[R8][2];
    for (int r = 0; r < R8; r++) acc[r][0] = acc[r][1] = (f32x8){0};
    for (ptrdiff_t d = 0; d < hs; d++) {
        f32x8 k0, k1;
        memcpy(&k0, kt + d * n + j0, sizeof k0);
        memcpy(&k1, kt + d * n + j0 + 8, sizeof k1);
        for (int r = 0; r < R8; r++) {
            const float qd = q[r][d];
            acc[r][0] += qd * k0;
            acc[r][1] += qd * k1;
        }
    }
    for (int r = 0; r < R8; r++)
        for (int c = 0; c < 2; c++) {
            const ptrdiff_t j = j0 + 8 * c;
            f32x8 s = scale * acc[r][c];
            if (j + 8 <= keys) {
                if (add[r]) {
                    f32x8 a;
                    memcpy(&a, add[r] + j, sizeof a);
                    s += a;
                }
                if (j < lo[r] || j + 8 > hi[r]) outside_window8(&s, j, lo[r], hi[r]);
            } else
                for (int l = 0; l < 8; l++)
                    s[l] = j + l >= lo[r] && j + l < hi[r] ? s[l] + (add[r] ? add[r][j + l] : 0.0f) : -INFINITY;
            i32x8 key;
            memcpy(&key, &s, sizeof key);
            key ^= (key >> 31) & 0x7fffffff;  /* order_key, lane by lane */
            const i32x8 greater = key > mk[r];
            mk[r] = (key & greater) | (mk[r] & ~greater);
            memcpy(S + r * n + j, &s, sizeof s);
        }
}

/* pv_tile for R8 rows and the 16 values v[0..16) of each key (o[r] + 0 .. 16) */
INLINE void pv_tile8(const float *P, ptrdiff_t n, const float *v, ptrdiff_t v_step, ptrdiff_t keys,
                     const float *inv, float *const *o, ptrdiff_t col) {
    f32x8 acc[R8][2];
    for (int r = 0; r < R8; r++) acc[r][0] = acc[r][1] = (f32x8){0};
    for (ptrdiff_t j = 0; j < keys; j++) {
        f32x8 v0, v1;
        memcpy(&v0, v + j * v_step, sizeof v0);
        memcpy(&v1, v + j * v_step + 8, sizeof v1);
        for (int r = 0; r < R8; r++) {
            const float p = P[r * n + j];
            acc[r][0] += p * v0;
            acc[r][1] += p * v1;
        }
    }
    for (int r = 0; r < R8; r++)
        if (o[r])
            for (int c = 0; c < 2; c++) {
                const f32x8 y = inv[r] * acc[r][c];
                memcpy(o[r] + col + 8 * c, &y, sizeof y);
            }
}

/* dst (hs x n) = the `rows` rows of src (hs floats each, `stride` apart) transposed, zeros past them */
INLINE void transpose_rows(const float *src, ptrdiff_t stride, ptrdiff_t rows, ptrdiff_t hs, float *dst, ptrdiff_t n) {
    for (ptrdiff_t j0 = 0; j0 < n; j0 += 8)
        for (ptrdiff_t d0 = 0; d0 < hs; d0 += 8) transpose8(src + j0 * stride + d0, stride, rows - j0, dst + d0 * n + j0, n);
}

/* out[i · n + j] = scale · x_i · kt[:, j] for `rows` rows x_i = x + i · x_stride against kt (hs x n), -inf at the
 * columns j >= cols: qk_tile8's products, R8 rows at a time (out holds rows + R8 rows) */
INLINE void row_products(const float *x, ptrdiff_t x_stride, ptrdiff_t rows, const float *kt, ptrdiff_t n,
                         ptrdiff_t cols, ptrdiff_t hs, float scale, const float *zero, float *out) {
    const float *const none[R8] = {NULL};
    ptrdiff_t lo[R8], hi[R8];
    for (int r = 0; r < R8; r++) lo[r] = 0, hi[r] = cols;
    for (ptrdiff_t i0 = 0; i0 < rows; i0 += R8) {
        const float *xr[R8];
        i32x8 mk[R8];
        for (int r = 0; r < R8; r++) {
            xr[r] = i0 + r < rows ? x + (i0 + r) * x_stride : zero;
            for (int l = 0; l < 8; l++) mk[r][l] = INT32_MIN;
        }
        for (ptrdiff_t j0 = 0; j0 < n; j0 += 16)
            qk_tile8(xr, kt, n, j0, hs, scale, none, cols, lo, hi, out + i0 * n, mk);
    }
}

/* attention_rows_heads, and with `rel` DeBERTa's relative_rows_heads. scratch: hs · n (K transposed) + 8 · n
 * (scores) + hs (a zero query row) floats, n = padded(keys); with `rel` also hs · (nc + np) (the tables
 * transposed) + (queries + R8) · nc + (keys + R8) · np (the products), nc and np the tables' rows padded */
INLINE void rows_heads(const Rows *a, const RelativeTerms *rel, ptrdiff_t first, ptrdiff_t count, float *scratch) {
    const ptrdiff_t n = padded(a->keys), hs = a->hs;
    float *kt = scratch, *S = scratch + hs * n, *zero = S + 8 * n;
    const ptrdiff_t nc = rel ? padded(rel->c2p_rows) : 0, np = rel ? padded(rel->p2c_rows) : 0;
    float *ct = zero + hs, *pt = ct + hs * nc, *C = pt + hs * np, *P = C + (a->queries + R8) * nc;
    for (ptrdiff_t d = 0; d < hs; d++) zero[d] = 0.0f;
    for (ptrdiff_t task = first; task < first + count; task++) {
        const HeadRows t = head_rows(a, task);
        const ptrdiff_t b = t.b, h = t.h;
        const float *q = t.q, *k = t.k, *v = t.v, *add = t.add;
        transpose_rows(k, a->ks[2], a->keys, hs, kt, n);
        if (rel) relative_products(rel, a, &t, zero, ct, nc, C, pt, np, P);
        for (ptrdiff_t i0 = 0; i0 < a->queries; i0 += R8) {
            float *orow[R8];
            float inv[R8] = {0};
            const float *qr[R8], *ar[R8];
            i32x8 mk[R8];
            ptrdiff_t lo[R8], hi[R8], from, to;
            visible_keys(a, i0, R8, BLOCK, lo, hi, &from, &to);
            for (int r = 0; r < R8; r++) {
                const ptrdiff_t i = i0 + r;
                const int real = i < a->queries;
                qr[r] = real ? q + i * a->qs[2] : zero;
                orow[r] = real ? (float *)a->out + ((b * a->queries + i) * a->heads + h) * hs : NULL;
                ar[r] = add ? add + (real ? i : i0) * a->adds[2] : NULL;
                for (int l = 0; l < 8; l++) mk[r][l] = INT32_MIN;
            }
            for (ptrdiff_t j0 = from; j0 < to; j0 += 16) qk_tile8(qr, kt, n, j0, hs, a->scale, ar, a->keys, lo, hi, S, mk);
            if (rel) {  /* the relative terms change every maximum */
                const int real = a->queries - i0 < R8 ? (int)(a->queries - i0) : R8;
                add_relative_terms(rel, b, i0, real, a->keys, rel->c2p ? C : NULL, nc, rel->p2c ? P : NULL, S, n);
                for (int r = 0; r < real; r++) inv[r] = exp_normalizer(S + r * n, n);
            } else
                for (int r = 0; r < R8 && orow[r]; r++) {
                    int32_t best = mk[r][0];
                    for (int l = 1; l < 8; l++) best = mk[r][l] > best ? mk[r][l] : best;
                    inv[r] = 1.0f / exp_sum(S + r * n + from, to - from, from_order_key(best));
                }
            /* the keys [from, min(to, keys)): P from column `from` on, V from key `from` on */
            const ptrdiff_t m = (to < a->keys ? to : a->keys) - from;
            for (ptrdiff_t c = 0; c < hs; c += 16) pv_tile8(S + from, n, v + from * a->vs[2] + c, a->vs[2], m, inv, orow, c);
        }
    }
}
#else
/* dst (hs x n) = the `rows` rows of src (hs floats each, `stride` apart) transposed, zeros past them */
INLINE void transpose_rows(const float *src, ptrdiff_t stride, ptrdiff_t rows, ptrdiff_t hs, float *dst, ptrdiff_t n) {
    for (ptrdiff_t j0 = 0; j0 < n; j0 += 16)
        for (ptrdiff_t d0 = 0; d0 < hs; d0 += 16)
            transpose16(src + j0 * stride + d0, stride, rows - j0, dst + d0 * n + j0, n);
}

/* qk_tile over the columns [from, to) of kt (multiples of 16) for 4 rows q[r] (the rows' running maxima in mk,
 * from INT32_MIN) */
INLINE void qk_tiles(const float *const q[4], const float *kt, ptrdiff_t n, ptrdiff_t from, ptrdiff_t to, ptrdiff_t hs,
                     float scale, const float *const add[4], ptrdiff_t keys, const ptrdiff_t lo[4],
                     const ptrdiff_t hi[4], float *S, i32x16 mk[4]) {
    for (int r = 0; r < 4; r++)
        for (int l = 0; l < BLOCK; l++) mk[r][l] = INT32_MIN;
    ptrdiff_t j0 = from;
    for (; j0 + 64 <= to; j0 += 64) qk_tile(4, q, kt, n, j0, hs, scale, add, keys, lo, hi, S, mk);
    switch ((to - j0) / 16) {
        case 3: qk_tile(3, q, kt, n, j0, hs, scale, add, keys, lo, hi, S, mk); break;
        case 2: qk_tile(2, q, kt, n, j0, hs, scale, add, keys, lo, hi, S, mk); break;
        case 1: qk_tile(1, q, kt, n, j0, hs, scale, add, keys, lo, hi, S, mk); break;
        default: break;
    }
}

/* out[i · n + j] = scale · x_i · kt[:, j] for `rows` rows x_i = x + i · x_stride against kt (hs x n), -inf at the
 * columns j >= cols: qk_tile's products, 4 rows at a time (out holds rows + 4 rows) */
INLINE void row_products(const float *x, ptrdiff_t x_stride, ptrdiff_t rows, const float *kt, ptrdiff_t n,
                         ptrdiff_t cols, ptrdiff_t hs, float scale, const float *zero, float *out) {
    const float *const none[4] = {NULL, NULL, NULL, NULL};
    const ptrdiff_t lo[4] = {0, 0, 0, 0}, hi[4] = {cols, cols, cols, cols};
    for (ptrdiff_t i0 = 0; i0 < rows; i0 += 4) {
        const float *xr[4];
        i32x16 mk[4];
        for (int r = 0; r < 4; r++) xr[r] = i0 + r < rows ? x + (i0 + r) * x_stride : zero;
        qk_tiles(xr, kt, n, 0, n, hs, scale, none, cols, lo, hi, out + i0 * n, mk);
    }
}

/* attention_rows_heads, and with `rel` DeBERTa's relative_rows_heads. scratch: hs · n (K transposed) + 8 · n
 * (scores) + hs (a zero query row) floats, n = padded(keys); with `rel` also hs · (nc + np) (the tables
 * transposed) + (queries + 8) · nc + (keys + 8) · np (the products), nc and np the tables' rows padded */
INLINE void rows_heads(const Rows *a, const RelativeTerms *rel, ptrdiff_t first, ptrdiff_t count, float *scratch) {
    const ptrdiff_t n = padded(a->keys), hs = a->hs;
    const int R = hs <= 32 ? 8 : 4;  /* query rows a tile */
    float *kt = scratch, *S = scratch + hs * n, *zero = S + 8 * n;
    const ptrdiff_t nc = rel ? padded(rel->c2p_rows) : 0, np = rel ? padded(rel->p2c_rows) : 0;
    float *ct = zero + hs, *pt = ct + hs * nc, *C = pt + hs * np, *P = C + (a->queries + 8) * nc;
    for (ptrdiff_t d = 0; d < hs; d++) zero[d] = 0.0f;
    for (ptrdiff_t task = first; task < first + count; task++) {
        const HeadRows t = head_rows(a, task);
        const ptrdiff_t b = t.b, h = t.h;
        const float *q = t.q, *k = t.k, *v = t.v, *add = t.add;
        transpose_rows(k, a->ks[2], a->keys, hs, kt, n);
        if (rel) relative_products(rel, a, &t, zero, ct, nc, C, pt, np, P);
        for (ptrdiff_t i0 = 0; i0 < a->queries; i0 += R) {
            float *orow[8];
            float inv[8] = {0};
            ptrdiff_t lo[8], hi[8], from, to;
            visible_keys(a, i0, R, BLOCK, lo, hi, &from, &to);
            for (ptrdiff_t g = 0; g < R && i0 + g < a->queries; g += 4) {  /* Q Kᵀ and the softmax, 4 rows at once */
                const float *qr[4], *ar[4];
                i32x16 mk[4];
                for (int r = 0; r < 4; r++) {
                    const ptrdiff_t i = i0 + g + r;
                    const int real = i < a->queries;
                    qr[r] = real ? q + i * a->qs[2] : zero;
                    orow[g + r] = real ? (float *)a->out + ((b * a->queries + i) * a->heads + h) * hs : NULL;
                    ar[r] = add ? add + (real ? i : i0) * a->adds[2] : NULL;
                }
                float *Sg = S + g * n;
                qk_tiles(qr, kt, n, from, to, hs, a->scale, ar, a->keys, lo + g, hi + g, Sg, mk);
                if (rel) {  /* the relative terms change every maximum */
                    const int real = a->queries - (i0 + g) < 4 ? (int)(a->queries - (i0 + g)) : 4;
                    add_relative_terms(rel, b, i0 + g, real, a->keys, rel->c2p ? C : NULL, nc,
                                       rel->p2c ? P : NULL, Sg, n);
                    for (int r = 0; r < real; r++) inv[g + r] = exp_normalizer(Sg + r * n, n);
                } else
                    for (int r = 0; r < 4 && orow[g + r]; r++)
                        inv[g + r] = 1.0f / exp_sum(Sg + r * n + from, to - from, from_order_key(fold_max_i32(mk[r])));
            }
            for (ptrdiff_t r = a->queries - i0; r < R; r++) orow[r] = NULL;  /* rows past the end */
            /* the keys [from, min(to, keys)): P from column `from` on, V from key `from` on */
            const float *P = S + from, *vf = v + from * a->vs[2];
            const ptrdiff_t m = (to < a->keys ? to : a->keys) - from;
            switch (hs / 16) {
                case 1: pv_tile(8, 1, P, n, vf, a->vs[2], m, inv, orow); break;
                case 2: pv_tile(8, 2, P, n, vf, a->vs[2], m, inv, orow); break;
                case 3: pv_tile(4, 3, P, n, vf, a->vs[2], m, inv, orow); break;
                default: pv_tile(4, 4, P, n, vf, a->vs[2], m, inv, orow); break;
            }
        }
    }
}
#endif

/* see Rows (kernels.h) */
HIDDEN void VARIANT(attention_rows_heads)(const Rows *a, ptrdiff_t first, ptrdiff_t count, float *scratch) {
    rows_heads(a, NULL, first, count, scratch);
}

/* see RelativeTerms (kernels.h) */
HIDDEN void VARIANT(relative_rows_heads)(const Rows *a, const RelativeTerms *t, ptrdiff_t first, ptrdiff_t count,
                                         float *scratch) {
    rows_heads(a, t, first, count, scratch);
}
