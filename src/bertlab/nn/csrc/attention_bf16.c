/* Short-row attention on AVX-512 BF16 dot products, for bf16 and int8 models (see common.h, and attention.c for
 * the fp32 kernel it follows). */
#include "common.h"

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
    const int NB, const uint32_t *q2, const uint32_t *kp, ptrdiff_t jb0, ptrdiff_t hp, float *S, ptrdiff_t n) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_ps();
    for (ptrdiff_t p = 0; p < hp; p++) {
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
    const int HB, const uint32_t *p2, ptrdiff_t n2, const uint32_t *vp, ptrdiff_t hs, ptrdiff_t pairs,
    __m512 acc[4][4]) {
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < HB; c++) acc[r][c] = _mm512_setzero_ps();
    for (ptrdiff_t jp = 0; jp < pairs; jp++) {
        __m512bh vv[4];
        for (int c = 0; c < HB; c++) vv[c] = (__m512bh)_mm512_loadu_si512(vp + jp * hs + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)p2[r * n2 + jp]);
            for (int c = 0; c < HB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vv[c]);
        }
    }
}

/* dst[0 .. n) = src[0 .. n) as bf16 (rounded to nearest even, as torch's conversion); n a multiple of 16 */
static inline __attribute__((always_inline)) BF16DOT_TARGET void bf16_row(const char *src, int dtype, ptrdiff_t n,
                                                                          uint16_t *dst) {
    if (dtype == BF16) {
        memcpy(dst, src, (size_t)n * 2);
        return;
    }
    for (ptrdiff_t c = 0; c < n; c += 16)
        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)src + c)));
}

/* row[0 .. n) (n a multiple of 16) -> e^(row - max), returning 1 / their sum. A shorter exp than
 * exp_normalizer's, for probabilities that are rounded to bf16 next (8 bits): e^x = 2^t, t = x·log2(e), as
 * 2^(t - round(t)) by a degree-4 polynomial (relative error 5.9e-5 at most over [-100, 0], against bf16's
 * 2e-3 half-ulp) scaled by
 * 2^round(t) in one VSCALEFPS; x clamped at -100 so the padding's -inf gives 0, not NaN. */
static inline __attribute__((always_inline)) BF16DOT_TARGET float exp_normalizer_bf16(float *row, ptrdiff_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (ptrdiff_t j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(row + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), floor = _mm512_set1_ps(-100.0f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 c1 = _mm512_set1_ps(0.693147180559945f), c2 = _mm512_set1_ps(0.240226506959101f),
                 c3 = _mm512_set1_ps(0.0555041086648216f), c4 = _mm512_set1_ps(0.00961812910762848f),
                 one = _mm512_set1_ps(1.0f);
    __m512 sum = _mm512_setzero_ps();
    for (ptrdiff_t j = 0; j < n; j += 16) {
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
                                                                               ptrdiff_t keys, ptrdiff_t n,
                                                                               float scale) {
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (ptrdiff_t j = 0; j < n; j += 16) {
        const ptrdiff_t left = keys - j;
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
HIDDEN BF16DOT_TARGET void attention_bf16_heads(const Rows *a, ptrdiff_t first, ptrdiff_t count,
                                                uint32_t *scratch) {
    /* keys padded to a multiple of 32: each probability row goes to bf16 32 at a time */
    const ptrdiff_t n = (a->keys + 31) / 32 * 32, hs = a->hs, hp = hs / 2, n2 = n / 2, pairs = (a->keys + 1) / 2;
    const int dt = a->dtype;
    const ptrdiff_t esize = dt == BF16 ? 2 : 4;
    uint32_t *kp = scratch, *vp = kp + n * hp, *p2 = vp + n * hp, *q2 = p2 + 4 * n2;
    float *S = (float *)(q2 + 4 * hp);
    uint16_t *kb = (uint16_t *)(S + 4 * n), *vb = kb + n * hs;  /* K and V rows in bf16, zero past the keys */
    memset(kp, 0, sizeof(uint32_t) * (size_t)(n * hs));  /* kp and vp: the padding keys stay zero */
    memset(kb, 0, sizeof(uint16_t) * (size_t)(2 * n * hs));
    for (ptrdiff_t task = first; task < first + count; task++) {
        const ptrdiff_t b = task / a->heads, h = task % a->heads;
        const char *q = (const char *)a->q + (b * a->qs[0] + h * a->qs[1]) * esize;
        const char *k = (const char *)a->k + (b / a->group * a->ks[0] + h * a->ks[1]) * esize;
        const char *v = (const char *)a->v + (b / a->group * a->vs[0] + h * a->vs[1]) * esize;
        const char *add = a->add ? (const char *)a->add + (b * a->adds[0] + h * a->adds[1]) * esize : NULL;
        for (ptrdiff_t j = 0; j < a->keys; j++) {
            bf16_row(k + j * a->ks[2] * esize, dt, hs, kb + j * hs);
            bf16_row(v + j * a->vs[2] * esize, dt, hs, vb + j * hs);
        }
        for (ptrdiff_t j = 0; j < a->keys; j++) {  /* kp: 16 keys' pairs side by side */
            const uint32_t *w = (const uint32_t *)(kb + j * hs);
            uint32_t *dst = kp + (j / 16) * hp * 16 + j % 16;
            for (ptrdiff_t p = 0; p < hp; p++) dst[p * 16] = w[p];
        }
        for (ptrdiff_t jp = 0; jp < pairs; jp++) {  /* vp: two keys' bf16 interleaved per dimension */
            const uint16_t *r0 = vb + 2 * jp * hs, *r1 = r0 + hs;  /* past the last key: zero rows */
            for (ptrdiff_t c = 0; c < hs; c += 16) {
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + c)));
                const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + c)));
                _mm512_storeu_si512(vp + jp * hs + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
        for (ptrdiff_t i0 = 0; i0 < a->queries; i0 += 4) {
            const int real = a->queries - i0 < 4 ? (int)(a->queries - i0) : 4;
            for (int r = 0; r < 4; r++)  /* q2 row r: the query's bf16, read as pairs */
                bf16_row(q + (i0 + (r < real ? r : 0)) * a->qs[2] * esize, dt, hs, (uint16_t *)(q2 + r * hp));
            ptrdiff_t jb = 0;
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
                for (ptrdiff_t j = 0; j < n; j += 32) {  /* p2: the row times 1 / sum, as pairs of bf16 */
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
                const ptrdiff_t at = ((b * a->queries + i0 + r) * a->heads + h) * hs;
                for (ptrdiff_t c = 0; c < hs / 16; c++) {
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
#endif
