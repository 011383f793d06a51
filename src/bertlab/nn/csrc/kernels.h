/* bertlab's CPU inference kernels as a plain C library (no Python): the table of kernels one instruction-set
 * level runs, and the operations that split a call over threads and run it through a table. The Python module
 * (module.c) and the C benchmark (bench.c) are its two users.
 *
 * The dispatch: `bl_cpu_level()` says the highest level this CPU and build reach, `bl_select(level, &table)`
 * fills a table with a function pointer for every kernel at that level (NULL where the level has none: then the
 * operation returns BL_UNSUPPORTED and nn/cpu_kernels.py takes oneDNN's or torch's path). Which kernel runs is
 * decided there and nowhere else: the per-level code is compiled with target attributes (the GEMMs: one ISA per
 * function) or, for the portable loops (rows.c, attention.c, gemv.c), once per level (levels_avx2.c,
 * levels_avx512.c), and no operation asks the CPU again.
 *
 * Every operation takes raw pointers and sizes: the caller (nn/cpu_kernels.py) checks dtypes, shapes and
 * contiguity, so nothing here re-checks them. `threads` is the most OpenMP threads the call may use (the
 * runtime torch loaded, when called from Python); small calls run on one. */
#ifndef BERTLAB_KERNELS_H
#define BERTLAB_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum { F32 = 0, BF16 = 1 };  /* element types, as nn/cpu_kernels.py's _DTYPE_CODES */

/* The instruction-set levels, lowest first, as nn/cpu_kernels.py's ISA_LEVELS:
 *   none     the portable loops built for the baseline x86-64 (or any other CPU); no GEMM of bertlab's own
 *   avx2     AVX2 + FMA (x86-64-v3): the portable loops built for it, the AVX2 fp32 and int8 GEMMs, beam search
 *   avxvnni  avx2 plus AVX-VNNI's int8 dot products
 *   avx512   AVX-512 (x86-64-v4): the portable loops built for it, the AVX-512 fp32 GEMM, beam search; the int8
 *            GEMM on AVX-512 VNNI (else AVX-VNNI, else AVX2), the bf16 GEMM and attention where AVX-512 BF16 is
 *   amx      avx512 plus the int8 GEMM on AMX tiles for 16 rows or more, and the bf16 attention on AMX-BF16 tiles */
enum { BL_NONE, BL_AVX2, BL_AVXVNNI, BL_AVX512, BL_AMX, BL_LEVELS };
extern const char *const BL_LEVEL_NAMES[BL_LEVELS];

enum { BL_OK = 0, BL_NO_MEMORY = -1, BL_UNSUPPORTED = -2 };
/* What the fp32 GEMM applies to each block of its output right after storing it, still in L1 (its epilogue):
 * nothing, or the exact GELU (common.h: gelu_f32x16) */
enum { BL_ACT_NONE = 0, BL_ACT_GELU = 1 };
/* A decoder layer's FFN activation (bl_decoder_layer_step): ReLU, or GELU's tanh form (bl_gelu_tanh) */
enum { BL_ACT_RELU = 2, BL_ACT_GELU_TANH = 3 };

/* A decoding step's attention (one query per row and head), fp32. Strides in elements, [0] row, [1] head, [2]
 * position (q and out: one position); the last dimension contiguous. `add` (the scores' additive mask and bias)
 * may broadcast over rows or heads (stride 0) or be NULL. out is (rows, heads, hs) contiguous. */
typedef struct {
    const float *q, *k, *v, *add;
    float *out;
    ptrdiff_t qs[2], ks[3], vs[3], adds[2];
    ptrdiff_t heads, hs, keys;
    ptrdiff_t group;  /* rows of q per row of k and v: beams of one input share its encoder's keys and values */
    float scale;
} OneQuery;

/* Attention of many queries per (row, head). q, k, v, add and out of `dtype` (F32; F32 or BF16 for the bf16 dot
 * kernel); out (B, T_q, heads, hs) contiguous; strides row, head, position (0: broadcast); hs a multiple of 16
 * up to 64. `band` (0: every key): query i sees only the keys j with |i - j| < band -- a local window of
 * band - 1 keys either side, as a mask of -inf outside it would, with queries == keys; each tile of queries
 * computes the key blocks its window reaches and no others (the fp32 loops and the AVX-512 BF16 ones; not the
 * AMX tiles, nor DeBERTa's relative terms). */
typedef struct {
    const void *q, *k, *v, *add;
    void *out;
    ptrdiff_t qs[3], ks[3], vs[3], adds[3];
    ptrdiff_t heads, hs, queries, keys, group, band;
    float scale;
    int dtype;
} Rows;

/* DeBERTa's disentangled attention (models/deberta_v2/modeling.py) over a fp32 Rows whose keys come divided by the
 * scale (and a->scale 1): to each score q_i · k_j of query i and key j its relative terms are added,
 *     c2p = c2p_scale · q_i · K_r[at_c[i, j]]        p2c = k_j · Q_r[at_p[j, i]]
 * (their sum first, as torch adds them), the lowest float where mask[b, query_start + i, j] is 0, then the softmax
 * and the product with V as Rows. K_r and Q_r are the position projections' rows the pass reaches, one head's at
 * table + h · s[0] + row · s[1] (hs contiguous), NULL where the term is off; at_c (queries, keys) their row
 * numbers, at_p (queries, keys) j · np + Q_r's row number (np: the p2c rows padded to 16, rows_heads' stride of its
 * products), the same for every (row, head); mask (B, keys, keys) or NULL. Each (row, head) multiplies its queries
 * by K_r and its keys by Q_r into scratch, so no (B, heads, T, rows) table is written. */
typedef struct {
    const float *c2p, *p2c;
    ptrdiff_t c2p_s[2], p2c_s[2], c2p_rows, p2c_rows;
    float c2p_scale;
    const int32_t *at_c, *at_p;
    const uint8_t *mask;
    ptrdiff_t query_start;
} RelativeTerms;

/* The GEMMs' blocking, chosen at run time (nn/cpu_tuning.py measures it once per CPU, level and thread count;
 * bl_select sets the defaults, bl_tune another). None of it moves a sum: each fp32 output is one FMA chain over
 * k from the bias and each int8 one an exact integer sum, whatever the tiles, blocks or thread split, so every
 * choice gives the same bits. */
typedef struct {
    int f32_rows;      /* rows per register tile of the fp32 GEMM: 1-12 (AVX-512), 1-6 (AVX2) */
    int f32_block;     /* rows of x per block: they stay in L2 while every panel passes (>= 1) */
    int f32_prefetch;  /* the panel that many ahead is requested while one is multiplied (0: none; 0-4) */
    int int8_panel_rows; /* AVX-512 VNNI: from this many rows, 12-row tiles over panels of 32 columns (>= 1) */
    int split;         /* how threads share the fp32 GEMM and the int8 layer below AMX, one bit per shape class
                        * (BL_SPLIT_*): set, by rows (each thread every panel); clear, by columns (each its own) */
    int few_prefetch;  /* f32_prefetch for a call whose rows fit in one tile (a decoding step's), in the fp32 and
                        * bf16 GEMMs (0-4): on an AMD EPYC (Zen 4) the next panel requested made 4-8 rows 1.2-1.35x
                        * slower, and no fewer or more rows faster */
} bl_tuning;
enum { BL_TUNING_VALUES = 6 };
/* split's bits: fp32 or int8, below or from a class boundary (a lone input's few rows, where reading half the
 * weights each can pay, or a batch's many, where each thread's rows stay in its cache from the step before). The
 * int8 layer's boundary is BL_SPLIT_BULK_ROWS rows; the fp32 GEMM's BL_SPLIT_F32_BULK_ROWS rows per thread: at two
 * threads a lone long input's 256-512 rows ran slower by rows, a bulk batch's ~1,024 faster (the boundary: where
 * the two splits crossed on an Intel Xeon, MiniLM's six layers with their weights from L3). */
enum { BL_SPLIT_F32_FEW = 1, BL_SPLIT_F32_BULK = 2, BL_SPLIT_INT8_FEW = 4, BL_SPLIT_INT8_BULK = 8, BL_SPLIT_ALL = 15,
       BL_SPLIT_BULK_ROWS = 128, BL_SPLIT_F32_BULK_ROWS = 384 };

/* The kernels of one level: each works on a block of rows, columns or (row, head) tasks, on one thread. */
typedef struct {
    int level;
    bl_tuning tune;  /* the GEMMs' blocking (bl_select: the level's defaults) */
    const char *int8_name;  /* the int8 GEMM's instruction set: "vnni", "avxvnni", "avx2", or NULL */
    /* the portable loops (rows.c, attention.c, gemv.c), built for the level's instruction set */
    void (*quantize_f32)(const float *x, int8_t *q, float *s, ptrdiff_t rows, ptrdiff_t cols);
    void (*quantize_bf16)(const uint16_t *x, int8_t *q, float *s, ptrdiff_t rows, ptrdiff_t cols);
    void (*dequantize_f32)(const int32_t *acc, float *y, const float *xs, const float *ws, const float *b,
                           ptrdiff_t rows, ptrdiff_t cols);
    void (*softmax_f32)(float *x, float *tmp, ptrdiff_t rows, ptrdiff_t cols);
    void (*softmax_bf16)(uint16_t *x, float *tmp, ptrdiff_t rows, ptrdiff_t cols);
    void (*rms_norm_f32)(const float *x, const float *w, float *y, ptrdiff_t rows, ptrdiff_t cols, float eps);
    void (*rms_norm_bf16)(const uint16_t *x, const uint16_t *w, uint16_t *y, float *tmp, ptrdiff_t rows,
                          ptrdiff_t cols, float eps);
    void (*add_layer_norm_f32)(const float *y, const float *res, const float *w, const float *b, float *out,
                               ptrdiff_t rows, ptrdiff_t cols, float eps);
    void (*add_layer_norm_bf16)(const uint16_t *y, const uint16_t *res, const float *wf, const float *bf,
                                uint16_t *out, float *tmp, ptrdiff_t rows, ptrdiff_t cols, float eps);
    void (*row_logsumexp)(const float *x, ptrdiff_t rows, ptrdiff_t cols, float *m, float *lse);
    void (*gelu_f32)(float *y, ptrdiff_t rows, ptrdiff_t cols);  /* in place: the fp32 GEMM's epilogue, as a pass */
    void (*gelu_bf16)(uint16_t *y, ptrdiff_t n);  /* the same over bf16, each value rounded once */
    void (*gelu_tanh_f32)(float *y, ptrdiff_t n);  /* GELU's tanh form, in place */
    void (*gelu_tanh_bf16)(uint16_t *y, ptrdiff_t n);
    void (*one_query_heads)(const OneQuery *a, ptrdiff_t first, ptrdiff_t count, float *tmp);
    void (*attention_rows_heads)(const Rows *a, ptrdiff_t first, ptrdiff_t count, float *scratch);
    void (*relative_rows_heads)(const Rows *a, const RelativeTerms *t, ptrdiff_t first, ptrdiff_t count,
                                float *scratch);
    void (*gemv_columns)(int dtype, const float *x, ptrdiff_t M, ptrdiff_t K, const void *w, const float *b,
                         void *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1);
    void (*rotate_heads_f32)(float *x, ptrdiff_t rows, ptrdiff_t first, ptrdiff_t row_stride, ptrdiff_t heads,
                             ptrdiff_t head_stride, ptrdiff_t hs, const float *cos, const float *sin, ptrdiff_t table);
    void (*rotate_heads_bf16)(uint16_t *x, ptrdiff_t rows, ptrdiff_t first, ptrdiff_t row_stride, ptrdiff_t heads,
                              ptrdiff_t head_stride, ptrdiff_t hs, const uint16_t *cos, const uint16_t *sin,
                              ptrdiff_t table);
    /* the level's own kernels; NULL where it has none */
    void (*gemm_f32)(const bl_tuning *t, const float *x, ptrdiff_t M, ptrdiff_t K, const float *w, const float *b,
                     float *y, ptrdiff_t N, ptrdiff_t p0, ptrdiff_t p1, int act);
    void (*gemm_bf16)(const bl_tuning *t, const uint16_t *x, ptrdiff_t M, ptrdiff_t K, const uint16_t *w, const float *b, uint16_t *y,
                      ptrdiff_t N, ptrdiff_t p0, ptrdiff_t p1);
    void (*attention_bf16_heads)(const Rows *a, ptrdiff_t first, ptrdiff_t count, uint32_t *scratch);
    void (*attention_amx_heads)(const Rows *a, ptrdiff_t first, ptrdiff_t count, uint32_t *scratch);  /* the same, AMX */
    /* int8: x quantized, as unsigned bytes x + 128 where `int8_unsigned` (the VNNI dot products; `comp` takes
     * the offset off again), else signed */
    void (*int8_columns)(const bl_tuning *t, const uint8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp,
                         const int32_t *comp, const float *xs, const float *ws, const float *b, float *y, ptrdiff_t N,
                         ptrdiff_t nb0, ptrdiff_t nb1);
    int int8_unsigned;
    /* AVX2 without VNNI: the same layer for weights within ±64 (`narrow`), on the unsigned x + 128 (`comp` taking
     * it off) in three instructions a vector instead of four; NULL elsewhere */
    void (*int8_columns_narrow)(const bl_tuning *t, const uint8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp,
                                const int32_t *comp, const float *xs, const float *ws, const float *b, float *y,
                                ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1);
    void (*int8_columns_amx)(const int8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp, const float *xs,
                             const float *ws, const float *b, float *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1);
    int (*beam_topk_input)(const float *score, const float *add, const float *mx, const float *lse, ptrdiff_t K,
                           ptrdiff_t V, int keep, float *best, int64_t *index);
} bl_kernels;

/* dispatch.c */
int bl_cpu_level(void);                      /* the highest level this CPU and build reach */
int bl_select(int level, bl_kernels *table); /* the table of `level`; BL_UNSUPPORTED above bl_cpu_level() */
int bl_tune(bl_kernels *table, const bl_tuning *t); /* another blocking; BL_UNSUPPORTED (table kept) if out of range */

/* ops.c: the operations, each one call of nn/cpu_kernels.py (see there for what they compute) */
#define BL_AMX_MIN_ROWS 16  /* int8 on AMX tiles from this many rows (K % 64 == 0): below, a tile is mostly empty */
int bl_quantize_rows(const bl_kernels *k, const void *x, int dtype, int8_t *q, float *s, ptrdiff_t rows,
                     ptrdiff_t cols, int threads);
int bl_dequantize_rows(const bl_kernels *k, const int32_t *acc, float *y, const float *xs, const float *ws,
                       const float *b, ptrdiff_t rows, ptrdiff_t cols, int threads);
int bl_softmax_rows(const bl_kernels *k, void *x, int dtype, ptrdiff_t rows, ptrdiff_t cols, int threads);
/* T5's RMS norm over each row: x, w and y all F32 or all BF16 (rms_norm_f32, rms_norm_bf16) */
int bl_rms_norm_rows(const bl_kernels *k, const void *x, const void *w, void *y, int dtype, ptrdiff_t rows,
                     ptrdiff_t cols, float eps, int threads);
/* rotary positions over `heads` heads in each of `rows` rows, in place: row r's heads at x + r·row_stride +
 * h·head_stride, rotated by row r % table of the (table, hs) cos and sin tables; x and tables of `dtype`
 * (F32 or BF16), strides in elements */
int bl_rotate_heads(const bl_kernels *k, void *x, int dtype, ptrdiff_t rows, ptrdiff_t row_stride, ptrdiff_t heads,
                    ptrdiff_t head_stride, ptrdiff_t hs, const void *cos, const void *sin, ptrdiff_t table,
                    int threads);
/* out = LayerNorm(y + res) over each row (post-LN's Add & Norm; out may be y): all fp32, or y, res, w, b and out
 * bf16 (add_layer_norm_bf16) */
int bl_add_layer_norm_rows(const bl_kernels *k, const void *y, const void *res, const void *w, const void *b,
                           void *out, int dtype, ptrdiff_t rows, ptrdiff_t cols, float eps, int threads);
int bl_attention_one_query(const bl_kernels *k, const OneQuery *a, ptrdiff_t rows, int threads);
int bl_attention_rows(const bl_kernels *k, const Rows *a, ptrdiff_t rows, int threads);
/* DeBERTa's attention (RelativeTerms) for `rows` rows: the terms' row numbers made here from relative (keys, keys),
 * δ(i, j), as clamp(span + δ(query_start + i, j)) - c2p_first and clamp(span - δ(j, query_start + i)) - p2c_first
 * (clamp to 0 .. 2 · span - 1; t's at_c and at_p are ignored); BL_UNSUPPORTED where one falls outside the rows a
 * table holds (a window that does not cover what the pass reaches: refused, never read) */
int bl_relative_attention_rows(const bl_kernels *k, const Rows *a, const RelativeTerms *t, const int64_t *relative,
                               ptrdiff_t span, ptrdiff_t c2p_first, ptrdiff_t p2c_first, ptrdiff_t rows, int threads);
int bl_attention_bf16(const bl_kernels *k, const Rows *a, ptrdiff_t rows, int threads);
int bl_linear_few_rows(const bl_kernels *k, const void *x, const void *w, const void *b, void *y, ptrdiff_t M,
                       ptrdiff_t K, ptrdiff_t N, int dtype, int threads);
int bl_linear_f32(const bl_kernels *k, const float *x, const float *w, const float *b, float *y, ptrdiff_t M,
                  ptrdiff_t K, ptrdiff_t N, int threads, int act);
int bl_linear_bf16(const bl_kernels *k, const uint16_t *x, const uint16_t *w, const float *b, uint16_t *y,
                   ptrdiff_t M, ptrdiff_t K, ptrdiff_t N, int threads);
int bl_linear_int8(const bl_kernels *k, const void *x, int dtype, const int8_t *wp, const int32_t *comp,
                   const float *ws, const float *b, float *y, ptrdiff_t M, ptrdiff_t K, ptrdiff_t N, int narrow,
                   int threads);
/* A post-LN Transformer encoder layer (BERT's) in one call, each step one of the operations above in turn (the
 * same kernels, so the same bits as calling them one by one): qkv = x Wqkvᵀ + b (the three projections side by
 * side); attention over q, k, v read in place from qkv (hs a multiple of 16 up to 64); y = LayerNorm(ctx Woᵀ + b +
 * x); out = LayerNorm(GELU(y Wiᵀ + b) Wfᵀ + b + y). x and out (B·T, hidden) fp32; `add` the scores' additive
 * mask, (B, T) (row stride `add_rows`, 0: one row for all) or NULL. Each linear layer either fp32 (bl_linear_f32
 * over panels, the GELU its epilogue) or, where `int8.w` is set, int8 (bl_linear_int8: x quantized per row, the
 * packed weight, its compensation, per-channel scales, the bias or NULL, `narrow` as there; the GELU a pass of
 * the level's gelu_f32, bl_gelu_rows) -- the kernels the fp32 or int8 modules call, in their order; the attention
 * bl_attention_rows, or bl_attention_bf16 where `bf16_attention` (fp32 in and out, as int8's modules call it). */
typedef struct {
    const int8_t *w;
    const int32_t *comp;
    const float *scale, *bias;
    int narrow;
} Int8Weight;
typedef struct {
    const float *w, *b;  /* fp32: packed panels and bias (or NULL) */
    Int8Weight int8;     /* int8 where int8.w is set */
    int gemv;            /* fp32 with w the plain (N, K) weight: bl_linear_few_rows' GEMV (a few rows, K % 16 == 0) */
} BlockLinear;
typedef struct {
    ptrdiff_t hidden, heads, inter;
    BlockLinear qkv, o, i, f;
    const void *ln1_w, *ln1_b, *ln2_w, *ln2_b;  /* of the layer's dtype */
    float eps1, eps2, scale;
    int bf16_attention;  /* the attention on bf16 dot products (bl_attention_bf16), as int8's bf16 attention runs it */
    int dtype;           /* F32, or BF16: x, out, add, the norms bf16, each linear layer bf16 panels (bl_linear_bf16,
                          * its bias fp32), the attention bl_attention_bf16's, the GELU bl_gelu_rows' bf16 pass */
} PostLnLayer;
int bl_post_ln_layer(const bl_kernels *k, const PostLnLayer *l, const void *x, void *out, ptrdiff_t B, ptrdiff_t T,
                     const void *add, ptrdiff_t add_rows, int threads);
/* GELU (exact form) over rows x cols in place: fp32 (the fp32 GEMM's epilogue as a pass) or bf16 */
int bl_gelu_rows(const bl_kernels *k, void *y, int dtype, ptrdiff_t rows, ptrdiff_t cols, int threads);
/* GELU's tanh form (`gelu_new`) over n F32 or BF16 in place */
int bl_gelu_tanh(const bl_kernels *k, void *y, int dtype, ptrdiff_t n, int threads);
/* A pre-norm decoder layer's decoding step (T5's: RMSNorm before each sub-layer, no biases needed) in one call,
 * one new position per row, each step one of the operations above in turn (the kernels the modules call, in their
 * order, so the same bits):
 *   h = RMSNorm(x); q, k, v = h Wqkvᵀ; k, v written to the caches at position `start`;
 *   x = x + OneQuery(q, K[:start+1], V[:start+1], self_add) Woᵀ
 *   x = x + OneQuery(RMSNorm(x) Wcqᵀ, cross K, cross V, cross_add) Wcoᵀ    (where norm_cross is set)
 *   out = x + act(RMSNorm(x) Wiᵀ) Wfᵀ, or x + (act(RMSNorm(x) Wiᵀ) * RMSNorm(x) Wgᵀ) Wfᵀ where gated (ffn_gate set)
 * x and out (rows, hidden) of `dtype`, F32 or BF16, and every other tensor with them (a bf16 model's step: the
 * caches, the additive parts, the norms' weights and the GEMV's weights and bias bf16, a panel GEMM's bias fp32);
 * inner = heads · hs. The self-attention caches (rows, cache_len, inner), contiguous; `self_add` the scores'
 * additive part of this position (position bias and mask) for row r, head h at self_add + r·self_add_rows +
 * h·self_add_heads (strides 0: broadcast), or NULL. The cross-attention keys and values (rows / group, enc_len,
 * inner) contiguous, each shared by `group` consecutive rows (the beams of one input); `cross_add` (rows, enc_len)
 * with row stride cross_add_rows (0: one row for all), or NULL. Each linear layer as BlockLinear: the GEMV over the
 * plain weight, the GEMM over panels (fp32, or bf16 in a bf16 step), or int8 (fp32 steps). Attention as the
 * modules run it: fp32 bl_attention_one_query, bf16 bl_attention_bf16; the residual sums, the ReLU and the gate's
 * product elementwise in the step's dtype (bf16: each rounded once, as torch's bf16 operators). */
typedef struct {
    ptrdiff_t hidden, heads, hs, inter;
    BlockLinear qkv, o, cross_q, cross_o, ffn_in, ffn_gate, ffn_out;  /* ffn_gate unset: no gate */
    const void *norm_self, *norm_cross, *norm_ffn;  /* RMSNorm weights; norm_cross NULL: no cross-attention */
    float eps, scale;
    int act;    /* BL_ACT_RELU or BL_ACT_GELU_TANH */
    int dtype;  /* F32 or BF16 */
} DecoderLayer;
typedef struct {
    void *self_k, *self_v;
    ptrdiff_t cache_len, start;
    const void *self_add;
    ptrdiff_t self_add_rows, self_add_heads;
    const void *cross_k, *cross_v, *cross_add;
    ptrdiff_t group, enc_len, cross_add_rows;
} DecoderState;
int bl_decoder_layer_step(const bl_kernels *k, const DecoderLayer *l, const DecoderState *s, const void *x,
                          void *out, ptrdiff_t rows, int threads);
/* returns 1 where a sum was NaN (the caller then takes torch's path), else BL_OK or an error */
int bl_beam_topk(const bl_kernels *k, const float *score, const float *add, float *best, int64_t *index,
                 ptrdiff_t B, ptrdiff_t K, ptrdiff_t V, int keep, int log_softmax, int threads);

#endif
