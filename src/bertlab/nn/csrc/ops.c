/* The operations of kernels.h: each splits its rows, (row, head) tasks, panels or column blocks into one block per
 * OpenMP thread and runs a table's kernel on each block (plain C: the Python bindings are module.c). */
#include <float.h>

#include "common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Below this many elements a kernel runs on one thread: waking the pool costs more than it saves. */
#define PARALLEL_MIN_ELEMENTS (1 << 15)

/* Each kernel splits its rows into one block per thread; a block of rows is a plain call of its loops. */
static inline int block_of(ptrdiff_t rows, int part, int parts, ptrdiff_t *start, ptrdiff_t *count) {
    ptrdiff_t per = rows / parts, extra = rows % parts;
    *start = part * per + (part < extra ? part : extra);
    *count = per + (part < extra ? 1 : 0);
    return *count > 0;
}

static inline int thread_count(ptrdiff_t rows, ptrdiff_t cols, long requested) {
    if (requested < 1 || rows < 2 || rows * cols < PARALLEL_MIN_ELEMENTS) return 1;
    return (int)(requested < rows ? requested : rows);
}

/* Runs BODY once per block of `total` items split `parts` ways, one block per OpenMP thread; BODY sees the
 * block's `part`, `start` and `count`. */
#ifdef _OPENMP
#define PARALLEL_FOR _Pragma("omp parallel for num_threads(parts) schedule(static) if (parts > 1)")
#else
#define PARALLEL_FOR
#endif
#define FOR_EACH_BLOCK(total, parts, BODY)                                  \
    do {                                                                    \
        PARALLEL_FOR                                                        \
        for (int part = 0; part < (parts); part++) {                        \
            ptrdiff_t start, count;                                         \
            if (block_of((total), part, (parts), &start, &count)) { BODY; } \
        }                                                                   \
    } while (0)

/* FOR_EACH_BLOCK with `per_part` elements of TYPE scratch for each block, at `scratch + part * per_part`;
 * returns BL_NO_MEMORY from the calling operation when it cannot be allocated. */
#define FOR_EACH_BLOCK_WITH_SCRATCH(TYPE, per_part, total, parts, BODY)                                \
    do {                                                                                                \
        TYPE *scratch = malloc(sizeof(TYPE) * (size_t)(per_part) * (size_t)(parts));                    \
        if (!scratch) return BL_NO_MEMORY;                                                              \
        FOR_EACH_BLOCK(total, parts, BODY);                                                             \
        free(scratch);                                                                                  \
    } while (0)

/* ------------------------------------------------------------------------------------------------ rows */
int bl_quantize_rows(const bl_kernels *k, const void *x, int dtype, int8_t *q, float *s, ptrdiff_t rows,
                     ptrdiff_t cols, int threads) {
    int parts = thread_count(rows, cols, threads);
    FOR_EACH_BLOCK(rows, parts, {
        if (dtype == BF16)
            k->quantize_bf16((const uint16_t *)x + start * cols, q + start * cols, s + start, count, cols);
        else
            k->quantize_f32((const float *)x + start * cols, q + start * cols, s + start, count, cols);
    });
    return BL_OK;
}

int bl_dequantize_rows(const bl_kernels *k, const int32_t *acc, float *y, const float *xs, const float *ws,
                       const float *b, ptrdiff_t rows, ptrdiff_t cols, int threads) {
    int parts = thread_count(rows, cols, threads);
    FOR_EACH_BLOCK(rows, parts, { k->dequantize_f32(acc + start * cols, y + start * cols, xs + start, ws, b, count, cols); });
    return BL_OK;
}

int bl_softmax_rows(const bl_kernels *k, void *x, int dtype, ptrdiff_t rows, ptrdiff_t cols, int threads) {
    if (rows < 1 || cols < 1) return BL_OK;
    int parts = thread_count(rows, cols, threads);
    const ptrdiff_t row_floats = padded(cols);
    FOR_EACH_BLOCK_WITH_SCRATCH(float, row_floats, rows, parts, {
        if (dtype == BF16)
            k->softmax_bf16((uint16_t *)x + start * cols, scratch + part * row_floats, count, cols);
        else
            k->softmax_f32((float *)x + start * cols, scratch + part * row_floats, count, cols);
    });
    return BL_OK;
}

int bl_rms_norm_rows(const bl_kernels *k, const void *x, const void *w, void *y, int dtype, ptrdiff_t rows,
                     ptrdiff_t cols, float eps, int threads) {
    if (dtype != F32 && dtype != BF16) return BL_UNSUPPORTED;
    if (rows < 1 || cols < 1) return BL_OK;
    int parts = thread_count(rows, cols, threads);
    if (dtype == BF16) {
        FOR_EACH_BLOCK_WITH_SCRATCH(float, cols, rows, parts, {
            k->rms_norm_bf16((const uint16_t *)x + start * cols, w, (uint16_t *)y + start * cols,
                             scratch + part * cols, count, cols, eps);
        });
        return BL_OK;
    }
    FOR_EACH_BLOCK(rows, parts, {
        k->rms_norm_f32((const float *)x + start * cols, w, (float *)y + start * cols, count, cols, eps);
    });
    return BL_OK;
}

int bl_rotate_heads(const bl_kernels *k, void *x, int dtype, ptrdiff_t rows, ptrdiff_t row_stride, ptrdiff_t heads,
                    ptrdiff_t head_stride, ptrdiff_t hs, const void *cos, const void *sin, ptrdiff_t table,
                    int threads) {
    if (rows < 1 || heads < 1 || hs < 2 || table < 1) return BL_OK;
    int parts = thread_count(rows, heads * hs, threads);
    FOR_EACH_BLOCK(rows, parts, {
        if (dtype == BF16)
            k->rotate_heads_bf16((uint16_t *)x + start * row_stride, count, start, row_stride, heads, head_stride, hs,
                                 cos, sin, table);
        else
            k->rotate_heads_f32((float *)x + start * row_stride, count, start, row_stride, heads, head_stride, hs,
                                cos, sin, table);
    });
    return BL_OK;
}

int bl_add_layer_norm_rows(const bl_kernels *k, const void *y, const void *res, const void *w, const void *b,
                           void *out, int dtype, ptrdiff_t rows, ptrdiff_t cols, float eps, int threads) {
    if (dtype != F32 && dtype != BF16) return BL_UNSUPPORTED;
    if (rows < 1 || cols < 1) return BL_OK;
    int parts = thread_count(rows, cols, threads);
    if (dtype == BF16) {
        float *wb = malloc(sizeof(float) * 2 * (size_t)cols);  /* w and b widened once, for every row */
        if (!wb) return BL_NO_MEMORY;
        for (ptrdiff_t c = 0; c < cols; c++) {
            wb[c] = bf16_to_f32(((const uint16_t *)w)[c]);
            wb[cols + c] = bf16_to_f32(((const uint16_t *)b)[c]);
        }
        const ptrdiff_t per_part = 3 * cols;
        float *scratch = malloc(sizeof(float) * (size_t)(per_part * parts));
        if (!scratch) {
            free(wb);
            return BL_NO_MEMORY;
        }
        FOR_EACH_BLOCK(rows, parts, {
            k->add_layer_norm_bf16((const uint16_t *)y + start * cols, (const uint16_t *)res + start * cols, wb,
                                   wb + cols, (uint16_t *)out + start * cols, scratch + part * per_part, count,
                                   cols, eps);
        });
        free(scratch);
        free(wb);
        return BL_OK;
    }
    FOR_EACH_BLOCK(rows, parts, {
        k->add_layer_norm_f32((const float *)y + start * cols, (const float *)res + start * cols, w, b,
                              (float *)out + start * cols, count, cols, eps);
    });
    return BL_OK;
}

/* ------------------------------------------------------------------------------------------- attention */
int bl_attention_one_query(const bl_kernels *k, const OneQuery *a, ptrdiff_t rows, int threads) {
    if (a->group < 1) return BL_UNSUPPORTED;
    const ptrdiff_t tasks = rows * a->heads;
    if (tasks < 1 || a->keys < 1) return BL_OK;
    int parts = thread_count(tasks, a->keys * a->hs, threads);
    const ptrdiff_t row_floats = padded(a->keys);
    FOR_EACH_BLOCK_WITH_SCRATCH(float, row_floats, tasks, parts, {
        k->one_query_heads(a, start, count, scratch + part * row_floats);
    });
    return BL_OK;
}

static int rows_fit(const Rows *a) {
    return (a->dtype == F32 || a->dtype == BF16) && a->group >= 1 && a->hs % 16 == 0 && a->hs <= 64 && a->hs >= 16;
}

int bl_attention_rows(const bl_kernels *k, const Rows *a, ptrdiff_t rows, int threads) {
    if (!rows_fit(a) || a->dtype != F32 || a->band < 0 || (a->band && a->queries != a->keys)) return BL_UNSUPPORTED;
    const ptrdiff_t tasks = rows * a->heads;
    if (tasks < 1 || a->keys < 1 || a->queries < 1) return BL_OK;
    int parts = thread_count(tasks, a->queries * a->keys * a->hs, threads);
    const ptrdiff_t n = padded(a->keys), per_part = a->hs * n + 8 * n + a->hs;
    FOR_EACH_BLOCK_WITH_SCRATCH(float, per_part, tasks, parts, {
        k->attention_rows_heads(a, start, count, scratch + part * per_part);
    });
    return BL_OK;
}

/* A table's index for row k ± δ, clamped to the 2k rows, less the table's first row; -1 where that falls outside
 * the rows it holds (a window that does not cover what the pass reaches: refused, never read). */
static inline int32_t table_index(ptrdiff_t row, ptrdiff_t top, ptrdiff_t first, ptrdiff_t rows) {
    ptrdiff_t at = (row < 0 ? 0 : row > top ? top : row) - first;
    return at < 0 || at >= rows ? -1 : (int32_t)at;
}

int bl_relative_attention_rows(const bl_kernels *k, const Rows *a, const RelativeTerms *t, const int64_t *relative,
                               ptrdiff_t span, ptrdiff_t c2p_first, ptrdiff_t p2c_first, ptrdiff_t rows, int threads) {
    if (!rows_fit(a) || a->dtype != F32 || a->band || !k->relative_rows_heads) return BL_UNSUPPORTED;
    const ptrdiff_t tasks = rows * a->heads, Tq = a->queries, T = a->keys, top = 2 * span - 1;
    if (tasks < 1 || T < 1 || Tq < 1) return BL_OK;
    int32_t *at = malloc(sizeof(int32_t) * 2 * (size_t)(Tq * T));
    if (!at) return BL_NO_MEMORY;
    int32_t *at_c = at, *at_p = at + Tq * T;
    int rc = BL_OK;
    const ptrdiff_t n = padded(T), hs = a->hs, nc = padded(t->c2p ? t->c2p_rows : 0);
    const ptrdiff_t np = padded(t->p2c ? t->p2c_rows : 0);
    for (ptrdiff_t q = 0; q < Tq; q++)  /* the same for every (row, head): made once */
        for (ptrdiff_t j = 0; j < T; j++) {
            const ptrdiff_t i = t->query_start + q;
            const int32_t c = t->c2p ? table_index(span + relative[i * T + j], top, c2p_first, t->c2p_rows) : 0;
            const int32_t p = t->p2c ? table_index(span - relative[j * T + i], top, p2c_first, t->p2c_rows) : 0;
            at_c[q * T + j] = c;
            at_p[q * T + j] = (int32_t)(j * np) + p;  /* where rows_heads keeps key j's p2c products: row j of np */
            if (c < 0 || p < 0) rc = BL_UNSUPPORTED;
        }
    if (rc == BL_OK) {
        RelativeTerms terms = *t;
        terms.at_c = at_c, terms.at_p = at_p;
        /* rows_heads' scratch (attention.c): K transposed, a tile's scores, a zero row; the tables transposed and
         * the products, each with a tile's rows to spare (8 at most) */
        const ptrdiff_t per_part = hs * n + 8 * n + hs + hs * (nc + np) + (Tq + 8) * nc + (T + 8) * np;
        int parts = thread_count(tasks, Tq * T * hs, threads);
        if (!t->c2p) terms.c2p_rows = 0;
        if (!t->p2c) terms.p2c_rows = 0;
        float *scratch = malloc(sizeof(float) * (size_t)per_part * (size_t)parts);
        if (scratch)
            FOR_EACH_BLOCK(tasks, parts, { k->relative_rows_heads(a, &terms, start, count, scratch + part * per_part); });
        else
            rc = BL_NO_MEMORY;
        free(scratch);
    }
    free(at);
    return rc;
}

/* bf16 attention on AMX tiles (where the level has them) from this many queries: below, most of a tile's 16 rows
 * are empty and AVX-512 BF16's tiles of 4 queries were faster (Intel Xeon with AMX, one thread, 12 heads of 32,
 * 128 keys: AMX 0.78-0.99x at 1-4 queries, 1.08-1.14x at 8, 1.2x at 12, 1.3-1.4x at 16) */
#define AMX_MIN_QUERIES 8

int bl_attention_bf16(const bl_kernels *k, const Rows *a, ptrdiff_t rows, int threads) {
    if (!rows_fit(a) || a->band < 0 || (a->band && a->queries != a->keys) || !k->attention_bf16_heads)
        return BL_UNSUPPORTED;
    const ptrdiff_t tasks = rows * a->heads;
    if (tasks < 1 || a->keys < 1 || a->queries < 1) return BL_OK;
    int parts = thread_count(tasks, a->queries * a->keys * a->hs, threads);
    const ptrdiff_t n = (a->keys + 31) / 32 * 32;
    if (k->attention_amx_heads && a->queries >= AMX_MIN_QUERIES && !a->band) {  /* (the tiles take no band) */
        /* attention_amx_heads' scratch: kp, vp, qb, pb, S, O, and the bf16 rows of K and V */
        const ptrdiff_t hq = (a->hs / 2 + 15) / 16 * 16;
        const ptrdiff_t words = n * hq + n / 2 * a->hs + 16 * hq + 8 * n + 16 * n + 16 * a->hs + n * a->hs;
        const ptrdiff_t per_part = (words + 15) / 16 * 16;
        FOR_EACH_BLOCK_WITH_SCRATCH(uint32_t, per_part, tasks, parts, {
            k->attention_amx_heads(a, start, count, scratch + part * per_part);
        });
        return BL_OK;
    }
    const ptrdiff_t per_part = 2 * n * a->hs + 6 * n + 2 * a->hs + 16;
    FOR_EACH_BLOCK_WITH_SCRATCH(uint32_t, per_part, tasks, parts, {
        k->attention_bf16_heads(a, start, count, scratch + part * per_part);
    });
    return BL_OK;
}

/* -------------------------------------------------------------------------------------------- linear */
/* y (M, N) = x (M, K) · Wᵀ + b, all of `dtype` (F32 or BF16) and contiguous, W (N, K) as nn.Linear holds it;
 * K % 16 == 0. Threads split the columns. */
int bl_linear_few_rows(const bl_kernels *k, const void *x, const void *w, const void *b, void *y, ptrdiff_t M,
                       ptrdiff_t K, ptrdiff_t N, int dtype, int threads) {
    if (K % 16 || (dtype != F32 && dtype != BF16)) return BL_UNSUPPORTED;
    /* a bf16 layer's x and bias widened to fp32 once (a few KB), not in each of the N / 16 blocks */
    const float *xf = x, *bf = b;
    float *wide = NULL;
    if (dtype == BF16) {
        wide = malloc(sizeof(float) * (size_t)(M * K + (b ? N : 0)));
        if (!wide) return BL_NO_MEMORY;
        for (ptrdiff_t i = 0; i < M * K; i++) wide[i] = bf16_to_f32(((const uint16_t *)x)[i]);
        if (b)
            for (ptrdiff_t i = 0; i < N; i++) wide[M * K + i] = bf16_to_f32(((const uint16_t *)b)[i]);
        xf = wide;
        bf = b ? wide + M * K : NULL;
    }
    const ptrdiff_t blocks = N / 16;
    int parts = thread_count(blocks, M * K * 16, threads);
    FOR_EACH_BLOCK(blocks, parts, { k->gemv_columns(dtype, xf, M, K, w, bf, y, N, start, start + count); });
    if (N % 16) gemv_tail(dtype, xf, M, K, w, bf, y, N, blocks * 16);
    free(wide);
    return BL_OK;
}

#define PANEL 32  /* columns per packed panel (linear.c, linear_avx2.c; nn/cpu_kernels.py: pack_f32_panels) */

/* Whether bl_tuning.split says rows for an fp32 (`f32`) or int8 layer of M rows over `threads`. */
static inline int split_rows(const bl_tuning *t, int f32, ptrdiff_t M, int threads) {
    const ptrdiff_t f32_bulk = (ptrdiff_t)BL_SPLIT_F32_BULK_ROWS * (threads > 1 ? threads : 1);
    const int bit = f32 ? (M < f32_bulk ? BL_SPLIT_F32_FEW : BL_SPLIT_F32_BULK)
                        : (M < BL_SPLIT_BULK_ROWS ? BL_SPLIT_INT8_FEW : BL_SPLIT_INT8_BULK);
    return (t->split & bit) != 0;
}

/* y (M, N) = act(x (M, K) · Wᵀ + b), fp32, W packed into panels of 32 columns; on the level's GEMM (AVX-512 or
 * AVX2 + FMA: the same panels, the same result). Threads split the panels, or the rows (bl_tuning.split, by the row
 * count's class): the same bits. `act`: BL_ACT_NONE or BL_ACT_GELU, over each block of output as soon as it is
 * stored. */
int bl_linear_f32(const bl_kernels *k, const float *x, const float *w, const float *b, float *y, ptrdiff_t M,
                  ptrdiff_t K, ptrdiff_t N, int threads, int act) {
    if (act != BL_ACT_NONE && act != BL_ACT_GELU) return BL_UNSUPPORTED;
    if (!k->gemm_f32) return BL_UNSUPPORTED;
    const ptrdiff_t panels = (N + PANEL - 1) / PANEL;
    if (split_rows(&k->tune, 1, M, threads)) { /* (bl_tuning: the rows split, each thread every panel) */
        int parts = thread_count(M, K * N, threads);
        FOR_EACH_BLOCK(M, parts, { k->gemm_f32(&k->tune, x + start * K, count, K, w, b, y + start * N, N, 0, panels, act); });
        return BL_OK;
    }
    int parts = thread_count(panels, M * K * PANEL, threads);
    FOR_EACH_BLOCK(panels, parts, { k->gemm_f32(&k->tune, x, M, K, w, b, y, N, start, start + count, act); });
    return BL_OK;
}

/* y (M, N) bf16 = x (M, K) bf16 · Wᵀ + b, W packed into bf16 pair panels, the bias fp32; K even. Threads split
 * the panels. */
int bl_linear_bf16(const bl_kernels *k, const uint16_t *x, const uint16_t *w, const float *b, uint16_t *y,
                   ptrdiff_t M, ptrdiff_t K, ptrdiff_t N, int threads) {
    if (!k->gemm_bf16 || K % 2) return BL_UNSUPPORTED;
    const ptrdiff_t panels = (N + PANEL - 1) / PANEL;
    int parts = thread_count(panels, M * K * PANEL, threads);
    FOR_EACH_BLOCK(panels, parts, { k->gemm_bf16(&k->tune, x, M, K, w, b, y, N, start, start + count); });
    return BL_OK;
}

/* The int8 layer's two steps in one parallel region: each thread quantizes its share of the rows (and flips
 * their sign bits for the VNNI dot products and AVX2's narrow kernel), waits for the others -- every column
 * block reads every row -- then multiplies its share of the column blocks (AMX: of the pairs of blocks). The
 * quantize ran on one thread before the GEMM's region, ~1/3 of a short layer's time at two threads; each row is
 * quantized as before, so the output is unchanged bit for bit. */
static void int8_share(const bl_kernels *k, int amx, int narrow, int split, const void *x, int dtype, int8_t *xq,
                       float *xs, const int8_t *wp, const int32_t *comp, const float *ws, const float *b, float *y,
                       ptrdiff_t M, ptrdiff_t K, ptrdiff_t N, int part, int parts) {
    ptrdiff_t start, count;
    const int rows = block_of(M, part, parts, &start, &count);
    if (rows) {
        if (dtype == BF16)
            k->quantize_bf16((const uint16_t *)x + start * K, xq + start * K, xs + start, count, K);
        else
            k->quantize_f32((const float *)x + start * K, xq + start * K, xs + start, count, K);
        if (!amx && (k->int8_unsigned || narrow))
            for (ptrdiff_t i = start * K; i < (start + count) * K; i++) ((uint8_t *)xq)[i] ^= 0x80u;
    }
    const ptrdiff_t blocks = N / 16;
    const int32_t *c = k->int8_unsigned || narrow ? comp : NULL;
    void (*const columns)(INT8_COLUMNS_ARGS) = narrow ? k->int8_columns_narrow : k->int8_columns;
    if (split) { /* (bl_tuning) this thread's rows, every column block: it reads only the rows it quantized */
        if (rows)
            columns(&k->tune, (const uint8_t *)xq + start * K, count, K, wp, c, xs + start, ws, b,
                            y + start * N, N, 0, blocks);
        return;
    }
#ifdef _OPENMP
#pragma omp barrier
#endif
    if (amx) {
        if (block_of((blocks + 1) / 2, part, parts, &start, &count)) {
            const ptrdiff_t nb1 = 2 * (start + count) < blocks ? 2 * (start + count) : blocks;
            k->int8_columns_amx(xq, M, K, wp, xs, ws, b, y, N, 2 * start, nb1);
        }
    } else if (block_of(blocks, part, parts, &start, &count)) {
        columns(&k->tune, (const uint8_t *)xq, M, K, wp, c, xs, ws, b, y, N, start, start + count);
    }
}

/* y (M, N) fp32 = the int8 linear layer of x (M, K) fp32 or bf16: x quantized per row (as bl_quantize_rows),
 * times W (N, K)ᵀ packed [N/16][K/4][16][4], dequantized; K % 4 == 0, N % 16 == 0. One call for the whole layer:
 * at a few rows, each call from Python costs about as much as the arithmetic. On AMX tiles from BL_AMX_MIN_ROWS
 * rows where the level has them and K % 64 == 0, else on the level's int8 kernel; the same output either way.
 * Threads split the rows to quantize, then the column blocks (AMX: in pairs), each reading its own share of the
 * weights -- or below AMX, where the tuning says so, the rows, each reading all of them (see int8_share). */
int bl_linear_int8(const bl_kernels *k, const void *x, int dtype, const int8_t *wp, const int32_t *comp,
                   const float *ws, const float *b, float *y, ptrdiff_t M, ptrdiff_t K, ptrdiff_t N, int narrow,
                   int threads) {
    const int amx = k->int8_columns_amx && M >= BL_AMX_MIN_ROWS && K % 64 == 0;
    narrow = narrow && !amx && k->int8_columns_narrow;  /* (elsewhere the level's kernel takes any weight) */
    if (!(amx || k->int8_columns) || K % 4 || N % 16) return BL_UNSUPPORTED;
    int8_t *xq = malloc((size_t)(M * K) + sizeof(float) * (size_t)M);
    if (!xq) return BL_NO_MEMORY;
    float *xs = (float *)(xq + M * K);  /* M * K is a multiple of 4: the scales stay aligned */
    const ptrdiff_t blocks = N / 16;
    const int split = !amx && split_rows(&k->tune, 0, M, threads);
    const int parts = amx     ? thread_count((blocks + 1) / 2, M * K * 32, threads)
                      : split ? thread_count(M, K * N, threads)
                              : thread_count(blocks, M * K * 16, threads);
#ifdef _OPENMP
#pragma omp parallel num_threads(parts) if (parts > 1)
    int8_share(k, amx, narrow, split, x, dtype, xq, xs, wp, comp, ws, b, y, M, K, N, omp_get_thread_num(),
               omp_get_num_threads());
#else
    int8_share(k, amx, narrow, split, x, dtype, xq, xs, wp, comp, ws, b, y, M, K, N, 0, 1);
#endif
    free(xq);
    return BL_OK;
}

/* ------------------------------------------------------------------------------ a post-LN encoder layer */
int bl_gelu_rows(const bl_kernels *k, void *y, int dtype, ptrdiff_t rows, ptrdiff_t cols, int threads) {
    if (!k->gelu_f32 || (dtype != F32 && dtype != BF16)) return BL_UNSUPPORTED;
    if (rows < 1 || cols < 1) return BL_OK;
    int parts = thread_count(rows, cols, threads);
    FOR_EACH_BLOCK(rows, parts, {
        if (dtype == BF16)
            k->gelu_bf16((uint16_t *)y + start * cols, count * cols);
        else
            k->gelu_f32((float *)y + start * cols, count, cols);
    });
    return BL_OK;
}

int bl_gelu_tanh(const bl_kernels *k, void *y, int dtype, ptrdiff_t n, int threads) {
    if (!k->gelu_tanh_f32 || (dtype != F32 && dtype != BF16)) return BL_UNSUPPORTED;
    if (n < 1) return BL_OK;
    const ptrdiff_t blocks = (n + 15) / 16;  /* whole 16-float blocks per thread: the same bits at any split */
    int parts = thread_count(blocks, 16, threads);
    FOR_EACH_BLOCK(blocks, parts, {
        const ptrdiff_t end = (start + count) * 16 < n ? (start + count) * 16 : n;
        if (dtype == BF16)
            k->gelu_tanh_bf16((uint16_t *)y + start * 16, end - start * 16);
        else
            k->gelu_tanh_f32((float *)y + start * 16, end - start * 16);
    });
    return BL_OK;
}

/* y (M, N) = x (M, K) Wᵀ + b, GELU'd where `gelu`, as the block's module computes it in `dtype`: fp32 -- the fp32
 * GEMM with the GELU as its epilogue, or the int8 layer then the same GELU as a pass over its output; bf16 -- the
 * bf16 panel GEMM (its bias fp32), the GELU a bf16 pass (as a bf16 PackedLinear and `elementwise.gelu_inplace` run
 * them); either, a few rows' GEMV over the plain weight (its bias of the dtype; no GELU: its module applies none
 * there). */
static int block_linear(const bl_kernels *k, const BlockLinear *w, int dtype, const void *x, void *y, ptrdiff_t M,
                        ptrdiff_t K, ptrdiff_t N, int gelu, int threads) {
    if (w->gemv) return gelu ? BL_UNSUPPORTED : bl_linear_few_rows(k, x, w->w, w->b, y, M, K, N, dtype, threads);
    int rc;
    if (dtype == BF16) {
        if (w->int8.w) return BL_UNSUPPORTED;
        rc = bl_linear_bf16(k, x, (const uint16_t *)w->w, w->b, y, M, K, N, threads);
    } else if (!w->int8.w) {
        return bl_linear_f32(k, x, w->w, w->b, y, M, K, N, threads, gelu ? BL_ACT_GELU : BL_ACT_NONE);
    } else {
        const Int8Weight *q = &w->int8;
        rc = bl_linear_int8(k, x, F32, q->w, q->comp, q->scale, q->bias, y, M, K, N, q->narrow, threads);
    }
    return rc == BL_OK && gelu ? bl_gelu_rows(k, y, dtype, M, N, threads) : rc;
}

/* One call for a whole layer: at one row of a short input, the Python around its seven kernels (module calls,
 * operand checks, views of q, k and v) cost ~125 us a layer of all-MiniLM-L6-v2 at one thread, the kernels
 * stubbed out (see nn/encoder_layer.py); the int8 modules' as much, the bf16 ones' more. Scratch: qkv (3H), the
 * heads' output (H), the first sub-layer's output (H), the FFN's middle (I), per row, of the layer's dtype. */
int bl_post_ln_layer(const bl_kernels *k, const PostLnLayer *l, const void *x, void *out, ptrdiff_t B, ptrdiff_t T,
                     const void *add, ptrdiff_t add_rows, int threads) {
    const ptrdiff_t H = l->hidden, I = l->inter, M = B * T;
    const int int8 = l->qkv.int8.w != NULL, dtype = l->dtype;
    if (dtype != F32 && dtype != BF16) return BL_UNSUPPORTED;
    if (dtype == BF16 ? !k->gemm_bf16 || !k->attention_bf16_heads || !k->gelu_f32
                      : !(int8 ? k->gelu_f32 != NULL : k->gemm_f32 != NULL) || !k->attention_rows_heads)
        return BL_UNSUPPORTED;
    if (l->heads < 1 || H % l->heads) return BL_UNSUPPORTED;
    const ptrdiff_t hs = H / l->heads;
    if (hs % 16 || hs > 64 || M < 1) return M < 1 ? BL_OK : BL_UNSUPPORTED;
    const size_t size = dtype == BF16 ? 2 : 4;  /* bytes per value */
    char *qkv = malloc(size * (size_t)(M * (5 * H + I)));
    if (!qkv) return BL_NO_MEMORY;
    char *ctx = qkv + size * M * 3 * H, *y = ctx + size * M * H, *h = y + size * M * H;
    int rc = block_linear(k, &l->qkv, dtype, x, qkv, M, H, 3 * H, 0, threads);
    if (rc == BL_OK) {
        /* q, k, v: (B, heads, T, hs) views of qkv (row T·3H, head hs, position 3H); ctx (B, T, heads, hs) */
        Rows a = {.q = qkv, .k = qkv + size * H, .v = qkv + size * 2 * H, .add = add, .out = ctx,
                  .qs = {T * 3 * H, hs, 3 * H}, .ks = {T * 3 * H, hs, 3 * H}, .vs = {T * 3 * H, hs, 3 * H},
                  .adds = {add_rows, 0, 0}, .heads = l->heads, .hs = hs, .queries = T, .keys = T, .group = 1,
                  .scale = l->scale, .dtype = dtype};
        rc = dtype == BF16 || l->bf16_attention ? bl_attention_bf16(k, &a, B, threads)
                                                : bl_attention_rows(k, &a, B, threads);
    }
    if (rc == BL_OK) rc = block_linear(k, &l->o, dtype, ctx, y, M, H, H, 0, threads);
    if (rc == BL_OK) rc = bl_add_layer_norm_rows(k, y, x, l->ln1_w, l->ln1_b, y, dtype, M, H, l->eps1, threads);
    if (rc == BL_OK) rc = block_linear(k, &l->i, dtype, y, h, M, H, I, 1, threads);
    if (rc == BL_OK) rc = block_linear(k, &l->f, dtype, h, out, M, I, H, 0, threads);
    if (rc == BL_OK) rc = bl_add_layer_norm_rows(k, out, y, l->ln2_w, l->ln2_b, out, dtype, M, H, l->eps2, threads);
    free(qkv);
    return rc;
}

/* ------------------------------------------------------------------------- a decoder layer's decoding step */
/* The step's elementwise passes over n values of `dtype`, each result as torch's operator gives it (bf16: the
 * operands widened, the fp32 result rounded once) */
enum { STEP_ADD, STEP_MUL };
static void elementwise(int dtype, int op, const void *x, const void *y, void *out, ptrdiff_t n) {
    if (dtype == BF16) {
        const uint16_t *a = x, *b = y;
        uint16_t *o = out;
        for (ptrdiff_t i = 0; i < n; i++) {
            const float u = bf16_to_f32(a[i]), v = bf16_to_f32(b[i]);
            o[i] = f32_to_bf16(op == STEP_ADD ? u + v : u * v);
        }
        return;
    }
    const float *a = x, *b = y;
    float *o = out;
    for (ptrdiff_t i = 0; i < n; i++) o[i] = op == STEP_ADD ? a[i] + b[i] : a[i] * b[i];
}

/* ReLU in place (x < 0: 0; NaN and -0 as they are, as torch's) */
static void relu(int dtype, void *y, ptrdiff_t n) {
    if (dtype == BF16) {
        uint16_t *h = y;
        for (ptrdiff_t i = 0; i < n; i++) h[i] = bf16_to_f32(h[i]) < 0.0f ? 0 : h[i];
        return;
    }
    float *f = y;
    for (ptrdiff_t i = 0; i < n; i++) f[i] = f[i] < 0.0f ? 0.0f : f[i];
}

/* One query per row over `keys` keys and values (row stride `row`, group rows sharing one), as the modules run it:
 * fp32 on bl_attention_one_query's loops, bf16 on bl_attention_bf16's (bf16 products, fp32 scores and softmax) */
static int step_attention(const bl_kernels *k, int dtype, const DecoderLayer *l, const void *q, ptrdiff_t q_row,
                          const void *K, const void *V, ptrdiff_t row, ptrdiff_t keys, ptrdiff_t group,
                          const void *add, ptrdiff_t add_rows, ptrdiff_t add_heads, void *ctx, ptrdiff_t M,
                          int threads) {
    const ptrdiff_t D = l->heads * l->hs;
    if (dtype == BF16) {
        Rows a = {.q = q, .k = K, .v = V, .add = add, .out = ctx, .qs = {q_row, l->hs, q_row},
                  .ks = {row, l->hs, D}, .vs = {row, l->hs, D}, .adds = {add_rows, add_heads, 0},
                  .heads = l->heads, .hs = l->hs, .queries = 1, .keys = keys, .group = group, .scale = l->scale,
                  .dtype = BF16};
        return bl_attention_bf16(k, &a, M, threads);
    }
    OneQuery a = {.q = q, .k = K, .v = V, .add = add, .out = ctx, .qs = {q_row, l->hs}, .ks = {row, l->hs, D},
                  .vs = {row, l->hs, D}, .adds = {add_rows, add_heads}, .heads = l->heads, .hs = l->hs,
                  .keys = keys, .group = group, .scale = l->scale};
    return bl_attention_one_query(k, &a, M, threads);
}

/* One call for a decoder layer's step: at batch 1, t5-small's six decoder layers ran ~2 ms a step of Python
 * around their kernels at two threads (module calls, operand checks, views of q, k and v, cache writes), against
 * ~8 ms of GEMVs (see nn/decoder_layer.py). Scratch per row: the normed input (H), qkv (3D), the heads' output
 * (D), a sub-layer's output (H), the FFN's middle (I; twice where gated), of the step's dtype. */
int bl_decoder_layer_step(const bl_kernels *k, const DecoderLayer *l, const DecoderState *s, const void *x,
                          void *out, ptrdiff_t rows, int threads) {
    const ptrdiff_t H = l->hidden, D = l->heads * l->hs, I = l->inter, M = rows, end = s->start + 1;
    const int dtype = l->dtype;
    if (M < 1) return BL_OK;
    const int gated = l->ffn_gate.w || l->ffn_gate.int8.w;
    if (l->heads < 1 || l->hs < 1 || s->start < 0 || end > s->cache_len || (l->norm_cross && s->group < 1)
        || (l->act != BL_ACT_RELU && l->act != BL_ACT_GELU_TANH) || (dtype != F32 && dtype != BF16))
        return BL_UNSUPPORTED;
    const size_t size = dtype == BF16 ? 2 : 4;  /* bytes per value */
    char *h = malloc(size * (size_t)(M * (2 * H + 4 * D + (gated ? 2 : 1) * I)));
    if (!h) return BL_NO_MEMORY;
    char *qkv = h + size * M * H, *ctx = qkv + size * M * 3 * D, *y = ctx + size * M * D, *f = y + size * M * H,
         *g = f + size * M * I;
    /* self-attention over the cache, this step's keys and values written into it first */
    int rc = bl_rms_norm_rows(k, x, l->norm_self, h, dtype, M, H, l->eps, threads);
    if (rc == BL_OK) rc = block_linear(k, &l->qkv, dtype, h, qkv, M, H, 3 * D, 0, threads);
    if (rc == BL_OK) {
        const ptrdiff_t row = s->cache_len * D;
        for (ptrdiff_t r = 0; r < M; r++) {
            memcpy((char *)s->self_k + size * (r * row + s->start * D), qkv + size * (r * 3 * D + D), size * D);
            memcpy((char *)s->self_v + size * (r * row + s->start * D), qkv + size * (r * 3 * D + 2 * D), size * D);
        }
        /* q (rows, heads, hs) in qkv; K, V (rows, heads, end, hs) views of the caches; ctx (rows, heads, hs) */
        rc = step_attention(k, dtype, l, qkv, 3 * D, s->self_k, s->self_v, row, end, 1, s->self_add,
                            s->self_add_rows, s->self_add_heads, ctx, M, threads);
    }
    if (rc == BL_OK) rc = block_linear(k, &l->o, dtype, ctx, y, M, D, H, 0, threads);
    if (rc == BL_OK) elementwise(dtype, STEP_ADD, x, y, out, M * H);
    /* cross-attention over the encoder's keys and values */
    if (rc == BL_OK && l->norm_cross) {
        rc = bl_rms_norm_rows(k, out, l->norm_cross, h, dtype, M, H, l->eps, threads);
        if (rc == BL_OK) rc = block_linear(k, &l->cross_q, dtype, h, qkv, M, H, D, 0, threads);
        if (rc == BL_OK)
            rc = step_attention(k, dtype, l, qkv, D, s->cross_k, s->cross_v, s->enc_len * D, s->enc_len, s->group,
                                s->cross_add, s->cross_add_rows, 0, ctx, M, threads);
        if (rc == BL_OK) rc = block_linear(k, &l->cross_o, dtype, ctx, y, M, D, H, 0, threads);
        if (rc == BL_OK) elementwise(dtype, STEP_ADD, out, y, out, M * H);
    }
    /* the feed-forward block: act(h Wiᵀ) (times h Wgᵀ where gated) Wfᵀ */
    if (rc == BL_OK) rc = bl_rms_norm_rows(k, out, l->norm_ffn, h, dtype, M, H, l->eps, threads);
    if (rc == BL_OK) rc = block_linear(k, &l->ffn_in, dtype, h, f, M, H, I, 0, threads);
    if (rc == BL_OK) {
        if (l->act == BL_ACT_GELU_TANH)
            rc = bl_gelu_tanh(k, f, dtype, M * I, threads);
        else
            relu(dtype, f, M * I);
    }
    if (rc == BL_OK && gated) {
        rc = block_linear(k, &l->ffn_gate, dtype, h, g, M, H, I, 0, threads);
        if (rc == BL_OK) elementwise(dtype, STEP_MUL, f, g, f, M * I);
    }
    if (rc == BL_OK) rc = block_linear(k, &l->ffn_out, dtype, f, y, M, I, H, 0, threads);
    if (rc == BL_OK) elementwise(dtype, STEP_ADD, out, y, out, M * H);
    free(h);
    return rc;
}

/* ------------------------------------------------------------------------------------------- search */
/* score (B·K, V) and add (B·K,) fp32, best (B, keep) fp32 and index (B, keep) int64 written; see beam_topk_input
 * (search.c). With `log_softmax` the scores are logits, each row's log-softmax taken on the way (its max and
 * log-sum-exp first, one more pass: no (B·K, V) log-probabilities written). Threads split the inputs. */
int bl_beam_topk(const bl_kernels *k, const float *score, const float *add, float *best, int64_t *index,
                 ptrdiff_t B, ptrdiff_t K, ptrdiff_t V, int keep, int log_softmax, int threads) {
    if (!k->beam_topk_input || keep < 1 || keep > K * V) return BL_UNSUPPORTED;
    float *stats = NULL;  /* log_softmax: each row's max, then each row's log-sum-exp */
    if (log_softmax && !(stats = malloc(sizeof(float) * 2 * (size_t)(B * K)))) return BL_NO_MEMORY;
    int parts = thread_count(B, K * V, threads), nan = 0;
    FOR_EACH_BLOCK(B, parts, {
        for (ptrdiff_t b = start; b < start + count; b++) {
            float *mx = stats ? stats + b * K : NULL;
            float *lse = stats ? stats + B * K + b * K : NULL;
            if (stats) k->row_logsumexp(score + b * K * V, K, V, mx, lse);
            if (k->beam_topk_input(score + b * K * V, add + b * K, mx, lse, K, V, keep, best + b * keep,
                                   index + b * keep))
                nan = 1;  /* (any thread may set it; none clears it) */
        }
    });
    free(stats);
    return nan;
}
