/* A beam-search step's candidates in one pass over the log-probabilities, or over the logits with their
 * log-softmax taken on the way (rows.c: row_logsumexp) -- and greedy decoding's argmax, the same pass with one
 * candidate (see common.h). AVX-512, and AVX2. */
#include "common.h"

#ifdef X86_KERNELS
/* ------------------------------------------------------------------------------------------- beam search */
/* The candidates of a beam-search step: for each input b, the `keep` best of score[r][v] + add[r] over its K
 * beams r = b·K .. b·K + K - 1 and the V words, scores descending, ties to the lower index k·V + v (torch.topk
 * over the (B, K·V) sums picks among ties in no documented order). One pass over the scores: 16 at a time are
 * compared with the worst score kept so far (a mask, almost always empty once `keep` are held), and the few
 * that beat it are inserted into the sorted list. torch's add and topk made two passes and a (B·K, V) sum,
 * ~0.8 ms of every T5-small step at 8 inputs x 4 beams. */
#define AVX512F_TARGET __attribute__((target("avx512f")))

INLINE void keep_best(float v, int64_t at, float *best, int64_t *index, int *n, int keep) {
    int p = *n < keep ? (*n)++ : keep - 1;  /* when full, the last (worst) one goes */
    while (p > 0 && best[p - 1] < v) {
        best[p] = best[p - 1];
        index[p] = index[p - 1];
        p--;
    }
    best[p] = v;
    index[p] = at;
}

/* Returns whether a sum was NaN (the caller then takes torch's path, which ranks NaN above every number). */
HIDDEN AVX512F_TARGET int beam_topk_input(const float *score, const float *add, const float *mx, const float *lse,
                                          ptrdiff_t K, ptrdiff_t V, int keep, float *best, int64_t *index) {
    int n = 0;
    __mmask16 nan = 0;
    for (ptrdiff_t k = 0; k < K; k++) {
        const float *row = score + k * V;
        const __m512 a = _mm512_set1_ps(add[k]);
        const __m512 m = _mm512_set1_ps(mx ? mx[k] : 0.0f), l = _mm512_set1_ps(lse ? lse[k] : 0.0f);
        for (ptrdiff_t v0 = 0; v0 < V; v0 += 16) {
            const __mmask16 valid = V - v0 >= 16 ? 0xffff : (__mmask16)((1u << (V - v0)) - 1);
            __m512 x = _mm512_maskz_loadu_ps(valid, row + v0);
            if (mx) x = _mm512_sub_ps(_mm512_sub_ps(x, m), l);  /* the log-softmax, (x - max) - lse */
            x = _mm512_add_ps(x, a);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            __mmask16 m = n < keep ? valid
                                   : _mm512_mask_cmp_ps_mask(valid, x, _mm512_set1_ps(best[keep - 1]), _CMP_GT_OQ);
            if (!m) continue;
            float lanes[16];
            _mm512_storeu_ps(lanes, x);
            for (; m; m &= m - 1) {
                const int lane = __builtin_ctz(m);
                if (n < keep || lanes[lane] > best[keep - 1]) keep_best(lanes[lane], k * V + v0 + lane, best, index, &n, keep);
            }
        }
    }
    return nan != 0;
}

/* The same pass on AVX2 (8 scores at a time; the log-softmax's statistics from rows.c's row_logsumexp built for
 * AVX2): the same candidates in the same order, sums of the same operations. Only the real sums are checked for
 * NaN (AVX-512's also its last block's zero padding, NaN only where the row's statistics are, and then its
 * real sums with them). */
#define AVX2_TARGET __attribute__((target("avx2,fma")))

HIDDEN AVX2_TARGET int beam_topk_input_avx2(const float *score, const float *add, const float *mx, const float *lse,
                                            ptrdiff_t K, ptrdiff_t V, int keep, float *best, int64_t *index) {
    int n = 0, nan = 0;
    const __m256i lane_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (ptrdiff_t k = 0; k < K; k++) {
        const float *row = score + k * V;
        const __m256 a = _mm256_set1_ps(add[k]);
        const __m256 m = _mm256_set1_ps(mx ? mx[k] : 0.0f), l = _mm256_set1_ps(lse ? lse[k] : 0.0f);
        for (ptrdiff_t v0 = 0; v0 < V; v0 += 8) {
            const int left = V - v0 >= 8 ? 8 : (int)(V - v0);
            const int valid = (1 << left) - 1;
            __m256 x = left == 8 ? _mm256_loadu_ps(row + v0)
                                 : _mm256_maskload_ps(row + v0, _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane_index));
            if (mx) x = _mm256_sub_ps(_mm256_sub_ps(x, m), l);  /* the log-softmax, (x - max) - lse */
            x = _mm256_add_ps(x, a);
            nan |= _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) & valid;
            int mask = n < keep ? valid
                                : _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(best[keep - 1]), _CMP_GT_OQ)) & valid;
            if (!mask) continue;
            float lanes[8];
            _mm256_storeu_ps(lanes, x);
            for (; mask; mask &= mask - 1) {
                const int lane = __builtin_ctz((unsigned)mask);
                if (n < keep || lanes[lane] > best[keep - 1]) keep_best(lanes[lane], k * V + v0 + lane, best, index, &n, keep);
            }
        }
    }
    return nan != 0;
}

#endif
