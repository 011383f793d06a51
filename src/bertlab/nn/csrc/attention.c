/* Attention in C for CPU inference: a decoding step's one query per row and head, short rows per (row, head)
 * in fp32, and the same on AVX-512 BF16 dot products (see common.h). */
#include "common.h"

/* ------------------------------------------------------------------------------- attention, one query */
/* A decoding step: each row has one new query against its cached keys and values. Per (row, head), with
 * T_k keys of hs values:  s_j = scale · q·k_j + add_j,  p = softmax(s),  out = Σ_j p_j v_j.
 * Torch's SDPA spent ~0.4 ms a call on this at T5-small's beam search (32 rows, 8 heads, <= 48 keys): its
 * kernel is built for blocks of many queries. Here each (row, head) is a few hundred multiply-adds. */
/* out[j] = q · k_j for the n <= 16 keys k_j = k + j · key_stride (out[n..15] = 0); hs a multiple of 16 */
INLINE void dot16_keys(const float *q, const float *k, Py_ssize_t key_stride, Py_ssize_t hs, float *out, int n) {
    f32x16 acc[16];
    for (int j = 0; j < 16; j++) acc[j] = (f32x16){0};
    for (Py_ssize_t d = 0; d < hs; d += 16) {
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

/* out[0..NV·16) = Σ_j p[j] · v_j over n keys v_j = v + j · stride: the accumulators stay in registers (NV
 * vectors, twice: even and odd keys in separate chains) */
INLINE void weighted_sum16(const int NV, const float *p, const float *v, Py_ssize_t stride, Py_ssize_t n,
                           float *out) {
    f32x16 even[4] = {{0}}, odd[4] = {{0}};
    Py_ssize_t j = 0;
    for (; j + 2 <= n; j += 2) {
        for (int c = 0; c < NV; c++) {
            f32x16 a, b;
            memcpy(&a, v + j * stride + 16 * c, sizeof a);
            memcpy(&b, v + (j + 1) * stride + 16 * c, sizeof b);
            even[c] += p[j] * a;
            odd[c] += p[j + 1] * b;
        }
    }
    if (j < n)
        for (int c = 0; c < NV; c++) {
            f32x16 a;
            memcpy(&a, v + j * stride + 16 * c, sizeof a);
            even[c] += p[j] * a;
        }
    for (int c = 0; c < NV; c++) {
        const f32x16 sum = even[c] + odd[c];
        memcpy(out + 16 * c, &sum, sizeof sum);
    }
}

/* strides in elements, [0] row, [1] head, [2] position (q and out: one position); the last dimension is
 * contiguous. `add` (scores' additive mask and bias) may broadcast over rows or heads (stride 0) or be NULL. */
typedef struct {
    const float *q, *k, *v, *add;
    float *out;
    Py_ssize_t qs[2], ks[3], vs[3], adds[2];
    Py_ssize_t heads, hs, keys;
    Py_ssize_t group;  /* rows of q per row of k and v: beams of one input share its encoder's keys and values */
    float scale;
} OneQuery;

MULTIVERSION
static void one_query_heads(const OneQuery *a, Py_ssize_t first, Py_ssize_t count, float *tmp) {
    const Py_ssize_t n16 = padded(a->keys);
    for (Py_ssize_t task = first; task < first + count; task++) {
        const Py_ssize_t b = task / a->heads, h = task % a->heads;
        const float *q = a->q + b * a->qs[0] + h * a->qs[1];
        const float *k = a->k + b / a->group * a->ks[0] + h * a->ks[1];
        const float *v = a->v + b / a->group * a->vs[0] + h * a->vs[1];
        const float *add = a->add ? a->add + b * a->adds[0] + h * a->adds[1] : NULL;
        Py_ssize_t j = 0;
        if (a->hs % 16 == 0)
            for (; j < a->keys; j += 16)
                dot16_keys(q, k + j * a->ks[2], a->ks[2], a->hs, tmp + j, a->keys - j < 16 ? (int)(a->keys - j) : 16);
        for (; j < a->keys; j++) tmp[j] = dot_f32(q, k + j * a->ks[2], a->hs);
        for (j = 0; j < a->keys; j++) tmp[j] = a->scale * tmp[j] + (add ? add[j] : 0.0f);
        for (Py_ssize_t j = a->keys; j < n16; j++) tmp[j] = -INFINITY;
        const float inv = exp_normalizer(tmp, n16);
        for (j = 0; j < a->keys; j++) tmp[j] *= inv;
        float *out = a->out + (b * a->heads + h) * a->hs;
        switch (a->hs) {
            case 16: weighted_sum16(1, tmp, v, a->vs[2], a->keys, out); break;
            case 32: weighted_sum16(2, tmp, v, a->vs[2], a->keys, out); break;
            case 48: weighted_sum16(3, tmp, v, a->vs[2], a->keys, out); break;
            case 64: weighted_sum16(4, tmp, v, a->vs[2], a->keys, out); break;
            default:
                for (Py_ssize_t d = 0; d < a->hs; d++) out[d] = 0.0f;
                for (Py_ssize_t j = 0; j < a->keys; j++) {
                    const float *vj = v + j * a->vs[2];
                    for (Py_ssize_t d = 0; d < a->hs; d++) out[d] += tmp[j] * vj[d];
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
typedef struct {
    const void *q, *k, *v, *add;  /* `dtype` elements: F32 here; F32 or BF16 for attention_bf16 below */
    void *out;  /* (B, T_q, heads, hs) contiguous, `dtype` */
    Py_ssize_t qs[3], ks[3], vs[3], adds[3];  /* strides: row, head, position (0: broadcast) */
    Py_ssize_t heads, hs, queries, keys, group;
    float scale;
    int dtype;
} Rows;

/* The scores S[r, j0 .. j0 + 16·NB) = scale · q[r]·k_j + add[r][j] of 4 query rows q[r] (hs each) against kt
 * (hs x n: K transposed), -inf at the padding keys j >= keys, and the rows' running maxima mk[r] (order keys):
 * the softmax's first pass done while the scores are still in registers */
INLINE void qk_tile(const int NB, const float *const q[4], const float *kt, Py_ssize_t n, Py_ssize_t j0,
                    Py_ssize_t hs, float scale, const float *const add[4], Py_ssize_t keys, float *S, i32x16 mk[4]) {
    f32x16 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = (f32x16){0};
    for (Py_ssize_t d = 0; d < hs; d++) {
        f32x16 kv[4];
        for (int c = 0; c < NB; c++) memcpy(&kv[c], kt + d * n + j0 + 16 * c, sizeof kv[c]);
        for (int r = 0; r < 4; r++) {
            const float qd = q[r][d];
            for (int c = 0; c < NB; c++) acc[r][c] += qd * kv[c];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) {
            const Py_ssize_t j = j0 + 16 * c;
            f32x16 s = scale * acc[r][c];
            if (j + 16 <= keys) {
                if (add[r]) {
                    f32x16 a;
                    memcpy(&a, add[r] + j, sizeof a);
                    s += a;
                }
            } else  /* the last block: keys beyond `keys` are padding, and add has none of them */
                for (int l = 0; l < 16; l++) s[l] = j + l < keys ? s[l] + (add[r] ? add[r][j + l] : 0.0f) : -INFINITY;
            max_keys(&mk[r], &s);
            memcpy(S + r * n + j, &s, sizeof s);
        }
}

/* O[r] = inv[r] · Σ_j P[r, j] v_j for R rows of unnormalised probabilities, hs = 16 · HB (R · HB <= 16
 * accumulators, and as many independent chains of FMAs: 8 rows for heads of 16 or 32) */
INLINE void pv_tile(const int R, const int HB, const float *P, Py_ssize_t n, const float *v, Py_ssize_t v_step,
                    Py_ssize_t keys, const float *inv, float *const *o) {
    f32x16 acc[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < HB; c++) acc[r][c] = (f32x16){0};
    for (Py_ssize_t j = 0; j < keys; j++) {
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
INLINE void transpose16(const float *src, Py_ssize_t src_stride, Py_ssize_t rows, float *dst, Py_ssize_t dst_stride) {
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

/* scratch: hs · n (K transposed) + 8 · n (scores) + hs (a zero query row) floats, n = padded(keys) */
MULTIVERSION
static void attention_rows_heads(const Rows *a, Py_ssize_t first, Py_ssize_t count, float *scratch) {
    const Py_ssize_t n = padded(a->keys), hs = a->hs;
    const int R = hs <= 32 ? 8 : 4;  /* query rows a tile */
    float *kt = scratch, *S = scratch + hs * n, *zero = S + 8 * n;
    for (Py_ssize_t d = 0; d < hs; d++) zero[d] = 0.0f;
    for (Py_ssize_t task = first; task < first + count; task++) {
        const Py_ssize_t b = task / a->heads, h = task % a->heads;
        const float *q = (const float *)a->q + b * a->qs[0] + h * a->qs[1];
        const float *k = (const float *)a->k + b / a->group * a->ks[0] + h * a->ks[1];
        const float *v = (const float *)a->v + b / a->group * a->vs[0] + h * a->vs[1];
        const float *add = a->add ? (const float *)a->add + b * a->adds[0] + h * a->adds[1] : NULL;
        for (Py_ssize_t j0 = 0; j0 < n; j0 += 16)
            for (Py_ssize_t d0 = 0; d0 < hs; d0 += 16)
                transpose16(k + j0 * a->ks[2] + d0, a->ks[2], a->keys - j0, kt + d0 * n + j0, n);
        for (Py_ssize_t i0 = 0; i0 < a->queries; i0 += R) {
            float *orow[8];
            float inv[8] = {0};
            for (Py_ssize_t g = 0; g < R && i0 + g < a->queries; g += 4) {  /* Q Kᵀ and the softmax, 4 rows at once */
                const float *qr[4], *ar[4];
                i32x16 mk[4];
                for (int r = 0; r < 4; r++) {
                    const Py_ssize_t i = i0 + g + r;
                    const int real = i < a->queries;
                    qr[r] = real ? q + i * a->qs[2] : zero;
                    orow[g + r] = real ? (float *)a->out + ((b * a->queries + i) * a->heads + h) * hs : NULL;
                    ar[r] = add ? add + (real ? i : i0) * a->adds[2] : NULL;
                    for (int l = 0; l < BLOCK; l++) mk[r][l] = INT32_MIN;
                }
                float *Sg = S + g * n;
                Py_ssize_t j0 = 0;
                for (; j0 + 64 <= n; j0 += 64) qk_tile(4, qr, kt, n, j0, hs, a->scale, ar, a->keys, Sg, mk);
                switch ((n - j0) / 16) {
                    case 3: qk_tile(3, qr, kt, n, j0, hs, a->scale, ar, a->keys, Sg, mk); break;
                    case 2: qk_tile(2, qr, kt, n, j0, hs, a->scale, ar, a->keys, Sg, mk); break;
                    case 1: qk_tile(1, qr, kt, n, j0, hs, a->scale, ar, a->keys, Sg, mk); break;
                    default: break;
                }
                for (int r = 0; r < 4 && orow[g + r]; r++)
                    inv[g + r] = 1.0f / exp_sum(Sg + r * n, n, from_order_key(fold_max_i32(mk[r])));
            }
            for (Py_ssize_t r = a->queries - i0; r < R; r++) orow[r] = NULL;  /* rows past the end */
            switch (hs / 16) {
                case 1: pv_tile(8, 1, S, n, v, a->vs[2], a->keys, inv, orow); break;
                case 2: pv_tile(8, 2, S, n, v, a->vs[2], a->keys, inv, orow); break;
                case 3: pv_tile(4, 3, S, n, v, a->vs[2], a->keys, inv, orow); break;
                default: pv_tile(4, 4, S, n, v, a->vs[2], a->keys, inv, orow); break;
            }
        }
    }
}

#ifdef X86_KERNELS
/* ------------------------------------------------------------------------- attention with bf16 dot products */
/* The short-row attention above, with both products on AVX-512 BF16's VDPBF16PS: each instruction multiplies
 * 16 pairs of bf16 and adds both products to 16 fp32 sums, twice the work of an fp32 FMA per instruction and
 * half the bytes. For bf16 models, and for int8 models' long rows: inputs are rounded to bf16 as they are
 * packed, scores and softmax stay in fp32, the probabilities are rounded to bf16 for P V, and every sum is
 * fp32. Against batched bf16 matmuls with a softmax between them this keeps a block of scores in L1 (no
 * (T, T) matrix written and read back), needs no mask expanded over the heads, and splits (row, head) tasks
 * over threads, which the per-slice matmuls did not.
 * Layouts, per (row, head), in 32-bit words of two bf16 (the pair one VDPBF16PS lane takes):
 *   kp[jb][p][16]  key jb·16 + lane, dimensions 2p and 2p + 1           (Q Kᵀ: lanes are keys)
 *   vp[jp][hs]     dimension d of keys 2jp and 2jp + 1                  (P V: lanes are dimensions)
 *   q2[r][p], p2[r][jp]  a query's pair of dimensions, a probability row's pair of keys (broadcast)
 * Operands as `Rows` above, q, k, v, add and out all of its `dtype` (F32 or BF16). */

#define BF16DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* S[r, 16·jb0 .. 16·(jb0 + NB)) of 4 queries: acc[r][c] += q2[r][p] · kp[jb0 + c][p] over p < hs / 2 */
static inline __attribute__((always_inline)) BF16DOT_TARGET void qk_tile_bf16(
    const int NB, const uint32_t *q2, const uint32_t *kp, Py_ssize_t jb0, Py_ssize_t hp, float *S, Py_ssize_t n) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_ps();
    for (Py_ssize_t p = 0; p < hp; p++) {
        __m512bh kv[4];
        for (int c = 0; c < NB; c++) kv[c] = (__m512bh)_mm512_loadu_si512(kp + ((jb0 + c) * hp + p) * 16);
        for (int r = 0; r < 4; r++) {
            const __m512bh qb = (__m512bh)_mm512_set1_epi32((int)q2[r * hp + p]);
            for (int c = 0; c < NB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qb, kv[c]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) _mm512_storeu_ps(S + r * n + (jb0 + c) * 16, acc[r][c]);
}

/* O[r, 0 .. 16·HB) of 4 queries = Σ_jp p2[r][jp] · vp[jp] over the pairs of keys */
static inline __attribute__((always_inline)) BF16DOT_TARGET void pv_tile_bf16(
    const int HB, const uint32_t *p2, Py_ssize_t n2, const uint32_t *vp, Py_ssize_t hs, Py_ssize_t pairs,
    __m512 acc[4][4]) {
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < HB; c++) acc[r][c] = _mm512_setzero_ps();
    for (Py_ssize_t jp = 0; jp < pairs; jp++) {
        __m512bh vv[4];
        for (int c = 0; c < HB; c++) vv[c] = (__m512bh)_mm512_loadu_si512(vp + jp * hs + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)p2[r * n2 + jp]);
            for (int c = 0; c < HB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vv[c]);
        }
    }
}

/* dst[0 .. n) = src[0 .. n) as bf16 (rounded to nearest even, as torch's conversion); n a multiple of 16 */
static inline __attribute__((always_inline)) BF16DOT_TARGET void bf16_row(const char *src, int dtype, Py_ssize_t n,
                                                                          uint16_t *dst) {
    if (dtype == BF16) {
        memcpy(dst, src, (size_t)n * 2);
        return;
    }
    for (Py_ssize_t c = 0; c < n; c += 16)
        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)src + c)));
}

/* row[0 .. n) (n a multiple of 16) -> e^(row - max), returning 1 / their sum. A shorter exp than
 * exp_normalizer's, for probabilities that are rounded to bf16 next (8 bits): e^x = 2^t, t = x·log2(e), as
 * 2^(t - round(t)) by a degree-4 polynomial (relative error 5.9e-5 at most over [-100, 0], against bf16's
 * 2e-3 half-ulp) scaled by
 * 2^round(t) in one VSCALEFPS; x clamped at -100 so the padding's -inf gives 0, not NaN. */
static inline __attribute__((always_inline)) BF16DOT_TARGET float exp_normalizer_bf16(float *row, Py_ssize_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(row + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), floor = _mm512_set1_ps(-100.0f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 c1 = _mm512_set1_ps(0.693147180559945f), c2 = _mm512_set1_ps(0.240226506959101f),
                 c3 = _mm512_set1_ps(0.0555041086648216f), c4 = _mm512_set1_ps(0.00961812910762848f),
                 one = _mm512_set1_ps(1.0f);
    __m512 sum = _mm512_setzero_ps();
    for (Py_ssize_t j = 0; j < n; j += 16) {
        const __m512 t = _mm512_mul_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(row + j), mx), floor), log2e);
        const __m512 whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 f = _mm512_sub_ps(t, whole);
        __m512 poly = _mm512_fmadd_ps(c4, f, c3);
        poly = _mm512_fmadd_ps(poly, f, c2);
        poly = _mm512_fmadd_ps(poly, f, c1);
        poly = _mm512_fmadd_ps(poly, f, one);
        const __m512 e = _mm512_scalef_ps(poly, whole);
        _mm512_storeu_ps(row + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    return 1.0f / _mm512_reduce_add_ps(sum);
}

/* row[0 .. keys) = scale · row + add[0 .. keys) (add NULL: none), row[keys .. n) = -inf */
static inline __attribute__((always_inline)) BF16DOT_TARGET void scale_add_row(float *row, const char *add, int dtype,
                                                                               Py_ssize_t keys, Py_ssize_t n,
                                                                               float scale) {
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j = 0; j < n; j += 16) {
        const Py_ssize_t left = keys - j;
        const __mmask16 live = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(row + j), sc);
        if (add) {
            const __m512 a = dtype == BF16
                ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                      _mm256_maskz_loadu_epi16(live, (const uint16_t *)add + j)), 16))
                : _mm512_maskz_loadu_ps(live, (const float *)add + j);
            x = _mm512_add_ps(x, a);
        }
        _mm512_storeu_ps(row + j, _mm512_mask_blend_ps(live, ninf, x));
    }
}

/* scratch (32-bit words): kp n·hs/2, vp n·hs/2, p2 2n, q2 2·hs, S 4n, then bf16 rows of K and V n·hs/2 each;
 * n: keys padded to a multiple of 32 */
static BF16DOT_TARGET void attention_bf16_heads(const Rows *a, Py_ssize_t first, Py_ssize_t count,
                                                uint32_t *scratch) {
    /* keys padded to a multiple of 32: each probability row goes to bf16 32 at a time */
    const Py_ssize_t n = (a->keys + 31) / 32 * 32, hs = a->hs, hp = hs / 2, n2 = n / 2, pairs = (a->keys + 1) / 2;
    const int dt = a->dtype;
    const Py_ssize_t esize = dt == BF16 ? 2 : 4;
    uint32_t *kp = scratch, *vp = kp + n * hp, *p2 = vp + n * hp, *q2 = p2 + 4 * n2;
    float *S = (float *)(q2 + 4 * hp);
    uint16_t *kb = (uint16_t *)(S + 4 * n), *vb = kb + n * hs;  /* K and V rows in bf16, zero past the keys */
    memset(kp, 0, sizeof(uint32_t) * (size_t)(n * hs));  /* kp and vp: the padding keys stay zero */
    memset(kb, 0, sizeof(uint16_t) * (size_t)(2 * n * hs));
    for (Py_ssize_t task = first; task < first + count; task++) {
        const Py_ssize_t b = task / a->heads, h = task % a->heads;
        const char *q = (const char *)a->q + (b * a->qs[0] + h * a->qs[1]) * esize;
        const char *k = (const char *)a->k + (b / a->group * a->ks[0] + h * a->ks[1]) * esize;
        const char *v = (const char *)a->v + (b / a->group * a->vs[0] + h * a->vs[1]) * esize;
        const char *add = a->add ? (const char *)a->add + (b * a->adds[0] + h * a->adds[1]) * esize : NULL;
        for (Py_ssize_t j = 0; j < a->keys; j++) {
            bf16_row(k + j * a->ks[2] * esize, dt, hs, kb + j * hs);
            bf16_row(v + j * a->vs[2] * esize, dt, hs, vb + j * hs);
        }
        for (Py_ssize_t j = 0; j < a->keys; j++) {  /* kp: 16 keys' pairs side by side */
            const uint32_t *w = (const uint32_t *)(kb + j * hs);
            uint32_t *dst = kp + (j / 16) * hp * 16 + j % 16;
            for (Py_ssize_t p = 0; p < hp; p++) dst[p * 16] = w[p];
        }
        for (Py_ssize_t jp = 0; jp < pairs; jp++) {  /* vp: two keys' bf16 interleaved per dimension */
            const uint16_t *r0 = vb + 2 * jp * hs, *r1 = r0 + hs;  /* past the last key: zero rows */
            for (Py_ssize_t c = 0; c < hs; c += 16) {
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + c)));
                const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + c)));
                _mm512_storeu_si512(vp + jp * hs + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
        for (Py_ssize_t i0 = 0; i0 < a->queries; i0 += 4) {
            const int real = a->queries - i0 < 4 ? (int)(a->queries - i0) : 4;
            for (int r = 0; r < 4; r++)  /* q2 row r: the query's bf16, read as pairs */
                bf16_row(q + (i0 + (r < real ? r : 0)) * a->qs[2] * esize, dt, hs, (uint16_t *)(q2 + r * hp));
            Py_ssize_t jb = 0;
            for (; jb + 4 <= n / 16; jb += 4) qk_tile_bf16(4, q2, kp, jb, hp, S, n);
            switch (n / 16 - jb) {
                case 3: qk_tile_bf16(3, q2, kp, jb, hp, S, n); break;
                case 2: qk_tile_bf16(2, q2, kp, jb, hp, S, n); break;
                case 1: qk_tile_bf16(1, q2, kp, jb, hp, S, n); break;
                default: break;
            }
            for (int r = 0; r < real; r++) {
                float *row = S + r * n;
                const char *ar = add ? add + (i0 + r) * a->adds[2] * esize : NULL;
                scale_add_row(row, ar, dt, a->keys, n, a->scale);
                const __m512 inv = _mm512_set1_ps(exp_normalizer_bf16(row, n));
                for (Py_ssize_t j = 0; j < n; j += 32) {  /* p2: the row times 1 / sum, as pairs of bf16 */
                    const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(row + j), inv);
                    const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(row + j + 16), inv);
                    _mm512_storeu_si512(p2 + r * n2 + j / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                }
            }
            __m512 acc[4][4];
            switch (hs / 16) {
                case 1: pv_tile_bf16(1, p2, n2, vp, hs, pairs, acc); break;
                case 2: pv_tile_bf16(2, p2, n2, vp, hs, pairs, acc); break;
                case 3: pv_tile_bf16(3, p2, n2, vp, hs, pairs, acc); break;
                default: pv_tile_bf16(4, p2, n2, vp, hs, pairs, acc); break;
            }
            for (int r = 0; r < real; r++) {
                const Py_ssize_t at = ((b * a->queries + i0 + r) * a->heads + h) * hs;
                for (Py_ssize_t c = 0; c < hs / 16; c++) {
                    if (dt == BF16)
                        _mm256_storeu_si256((__m256i *)((uint16_t *)a->out + at + 16 * c),
                                            (__m256i)_mm512_cvtneps_pbh(acc[r][c]));
                    else
                        _mm512_storeu_ps((float *)a->out + at + 16 * c, acc[r][c]);
                }
            }
        }
    }
}

#define HAVE_BF16DOT 1

#endif
/* attention_one_query(q, q_strides(2), k, k_strides(3), v, v_strides(3), add | None, add_strides(2), out,
 * rows, heads, hs, keys, scale, threads, group): fp32; see OneQuery */
ENTRY py_attention_one_query(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 22, "attention_one_query") < 0) return NULL;
    OneQuery a;
    a.q = as_ptr(args[0]);
    a.qs[0] = PyLong_AsSsize_t(args[1]), a.qs[1] = PyLong_AsSsize_t(args[2]);
    a.k = as_ptr(args[3]);
    for (int i = 0; i < 3; i++) a.ks[i] = PyLong_AsSsize_t(args[4 + i]);
    a.v = as_ptr(args[7]);
    for (int i = 0; i < 3; i++) a.vs[i] = PyLong_AsSsize_t(args[8 + i]);
    a.add = as_ptr(args[11]);
    a.adds[0] = PyLong_AsSsize_t(args[12]), a.adds[1] = PyLong_AsSsize_t(args[13]);
    a.out = as_ptr(args[14]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[15]);
    a.heads = PyLong_AsSsize_t(args[16]), a.hs = PyLong_AsSsize_t(args[17]), a.keys = PyLong_AsSsize_t(args[18]);
    a.scale = (float)PyFloat_AsDouble(args[19]);
    long threads = PyLong_AsLong(args[20]);
    a.group = PyLong_AsSsize_t(args[21]);
    if (PyErr_Occurred()) return NULL;
    if (a.group < 1) {
        PyErr_SetString(PyExc_ValueError, "attention_one_query: group < 1");
        return NULL;
    }
    const Py_ssize_t tasks = rows * a.heads;
    if (tasks < 1 || a.keys < 1) Py_RETURN_NONE;
    int parts = thread_count(tasks, a.keys * a.hs, threads);
    const Py_ssize_t row_floats = padded(a.keys);
    FOR_EACH_BLOCK_WITH_SCRATCH(float, row_floats, tasks, parts, {
        one_query_heads(&a, start, count, scratch + part * row_floats);
    });
    Py_RETURN_NONE;
}

/* The operands both attention entries take, from 25 arguments: q, q_strides(3), k, k_strides(3), v,
 * v_strides(3), add | None, add_strides(3), out, rows, heads, hs, queries, keys, scale, threads, group; hs a
 * multiple of 16 up to 64. Returns -1 with the exception set. */
static int parse_rows(PyObject *const *args, const char *name, int dtype, Rows *a, Py_ssize_t *rows,
                      long *threads) {
    a->dtype = dtype;
    a->q = as_ptr(args[0]);
    for (int i = 0; i < 3; i++) a->qs[i] = PyLong_AsSsize_t(args[1 + i]);
    a->k = as_ptr(args[4]);
    for (int i = 0; i < 3; i++) a->ks[i] = PyLong_AsSsize_t(args[5 + i]);
    a->v = as_ptr(args[8]);
    for (int i = 0; i < 3; i++) a->vs[i] = PyLong_AsSsize_t(args[9 + i]);
    a->add = as_ptr(args[12]);
    for (int i = 0; i < 3; i++) a->adds[i] = PyLong_AsSsize_t(args[13 + i]);
    a->out = as_ptr(args[16]);
    *rows = PyLong_AsSsize_t(args[17]);
    a->heads = PyLong_AsSsize_t(args[18]), a->hs = PyLong_AsSsize_t(args[19]);
    a->queries = PyLong_AsSsize_t(args[20]), a->keys = PyLong_AsSsize_t(args[21]);
    a->scale = (float)PyFloat_AsDouble(args[22]);
    *threads = PyLong_AsLong(args[23]);
    a->group = PyLong_AsSsize_t(args[24]);
    if (PyErr_Occurred()) return -1;
    if ((dtype != F32 && dtype != BF16) || a->group < 1 || a->hs % 16 || a->hs > 64 || a->hs < 16) {
        PyErr_Format(PyExc_ValueError, "%s: needs fp32 or bf16, group >= 1 and hs a multiple of 16 up to 64", name);
        return -1;
    }
    return 0;
}

/* attention_rows(the 25 operands of parse_rows): fp32; see Rows */
ENTRY py_attention_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 25, "attention_rows") < 0) return NULL;
    Rows a;
    Py_ssize_t rows;
    long threads;
    if (parse_rows(args, "attention_rows", F32, &a, &rows, &threads) < 0) return NULL;
    const Py_ssize_t tasks = rows * a.heads;
    if (tasks < 1 || a.keys < 1 || a.queries < 1) Py_RETURN_NONE;
    int parts = thread_count(tasks, a.queries * a.keys * a.hs, threads);
    const Py_ssize_t n = padded(a.keys), per_part = a.hs * n + 8 * n + a.hs;
    FOR_EACH_BLOCK_WITH_SCRATCH(float, per_part, tasks, parts, {
        attention_rows_heads(&a, start, count, scratch + part * per_part);
    });
    Py_RETURN_NONE;
}

/* attention_bf16(dtype, the 25 operands of parse_rows): AVX-512 BF16 dot products; see attention_bf16_heads */
ENTRY py_attention_bf16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 26, "attention_bf16") < 0) return NULL;
#ifdef HAVE_BF16DOT
    Rows a;
    Py_ssize_t rows;
    long threads;
    const long dtype = PyLong_AsLong(args[0]);
    if (PyErr_Occurred() || parse_rows(args + 1, "attention_bf16", (int)dtype, &a, &rows, &threads) < 0) return NULL;
    if (!bf16dot_supported()) {
        PyErr_SetString(PyExc_ValueError, "attention_bf16: this CPU has no AVX-512 BF16");
        return NULL;
    }
    const Py_ssize_t tasks = rows * a.heads;
    if (tasks < 1 || a.keys < 1 || a.queries < 1) Py_RETURN_NONE;
    int parts = thread_count(tasks, a.queries * a.keys * a.hs, threads);
    const Py_ssize_t n = (a.keys + 31) / 32 * 32, per_part = 2 * n * a.hs + 6 * n + 2 * a.hs + 16;
    FOR_EACH_BLOCK_WITH_SCRATCH(uint32_t, per_part, tasks, parts, {
        attention_bf16_heads(&a, start, count, scratch + part * per_part);
    });
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_ValueError, "attention_bf16: not built for this CPU");
    return NULL;
#endif
}

