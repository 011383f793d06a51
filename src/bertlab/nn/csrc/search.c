/* A beam-search step's candidates in one pass over the log-probabilities, or over the logits with their
 * log-softmax taken on the way (and greedy decoding's argmax, the same pass with one candidate) (see common.h). */
#include "common.h"

/* ---------------------------------------------------------------------------------------- log-sum-exp */
/* For each of `rows` rows of x: its max m[r] and lse[r] = log Σ_j e^(x[r, j] - m[r]), so that the row's
 * log-softmax is (x - m) - lse, torch's order of operations (its exp is Sleef's and its sum's order its own: the
 * two agree to ~1e-6). The max over the floats' bits as integers and the sum in 16 lanes, as softmax's. */
MULTIVERSION
static void row_logsumexp(const float *x, Py_ssize_t rows, Py_ssize_t cols, float *m, float *lse) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int32_t mk = INT32_MIN;
        for (Py_ssize_t c = 0; c < cols; c++) {
            const int32_t key = order_key(xr[c]);
            mk = key > mk ? key : mk;
        }
        const float mx = from_order_key(mk);
        f32x16 lanes = {0};
        Py_ssize_t c = 0;
        for (; c + 16 <= cols; c += 16) {
            f32x16 e;
            for (int l = 0; l < 16; l++) e[l] = exp_nonpositive(xr[c + l] - mx);
            lanes += e;
        }
        float sum = fold_sum_f32(lanes);
        for (; c < cols; c++) sum += exp_nonpositive(xr[c] - mx);
        m[r] = mx;
        lse[r] = logf(sum);
    }
}

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
static AVX512F_TARGET int beam_topk_input(const float *score, const float *add, const float *mx, const float *lse,
                                          Py_ssize_t K, Py_ssize_t V, int keep, float *best, int64_t *index) {
    int n = 0;
    __mmask16 nan = 0;
    for (Py_ssize_t k = 0; k < K; k++) {
        const float *row = score + k * V;
        const __m512 a = _mm512_set1_ps(add[k]);
        const __m512 m = _mm512_set1_ps(mx ? mx[k] : 0.0f), l = _mm512_set1_ps(lse ? lse[k] : 0.0f);
        for (Py_ssize_t v0 = 0; v0 < V; v0 += 16) {
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

#define HAVE_BEAM_TOPK 1
#endif
/* beam_topk(score_ptr, add_ptr, best_ptr, index_ptr, B, K, V, keep, log_softmax, threads) -> whether a sum was
 * NaN: score (B·K, V) and add (B·K,) fp32, best (B, keep) fp32 and index (B, keep) int64 written; see
 * beam_topk_input. With `log_softmax` the scores are logits, each row's log-softmax taken on the way (its max
 * and log-sum-exp first, one more pass: no (B·K, V) log-probabilities written). Threads split the inputs. */
ENTRY py_beam_topk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 10, "beam_topk") < 0) return NULL;
#ifdef HAVE_BEAM_TOPK
    const float *score = as_ptr(args[0]), *add = as_ptr(args[1]);
    float *best = as_ptr(args[2]);
    int64_t *index = as_ptr(args[3]);
    Py_ssize_t B = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), V = PyLong_AsSsize_t(args[6]);
    long keep = PyLong_AsLong(args[7]), log_softmax = PyLong_AsLong(args[8]), threads = PyLong_AsLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (!avx512_supported() || keep < 1 || keep > K * V) {
        PyErr_SetString(PyExc_ValueError, "beam_topk: needs AVX-512 and 1 <= keep <= K * V");
        return NULL;
    }
    float *stats = NULL;  /* log_softmax: each row's max, then each row's log-sum-exp */
    if (log_softmax && !(stats = PyMem_RawMalloc(sizeof(float) * 2 * (size_t)(B * K)))) return PyErr_NoMemory();
    int parts = thread_count(B, K * V, threads), nan = 0;
    FOR_EACH_BLOCK(B, parts, {
        for (Py_ssize_t b = start; b < start + count; b++) {
            float *mx = stats ? stats + b * K : NULL;
            float *lse = stats ? stats + B * K + b * K : NULL;
            if (stats) row_logsumexp(score + b * K * V, K, V, mx, lse);
            if (beam_topk_input(score + b * K * V, add + b * K, mx, lse, K, V, (int)keep, best + b * keep,
                                index + b * keep))
                nan = 1;  /* (any thread may set it; none clears it) */
        }
    });
    PyMem_RawFree(stats);
    return PyBool_FromLong(nan);
#else
    PyErr_SetString(PyExc_RuntimeError, "beam_topk: not built for this CPU");
    return NULL;
#endif
}

