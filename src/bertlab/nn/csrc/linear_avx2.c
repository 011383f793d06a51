/* Linear layers of CPU inference on AVX2 + FMA (and AVX-VNNI where present): the fp32 GEMM and the int8 GEMM of
 * linear.c for the CPUs without AVX-512 -- Intel client CPUs, AMD before Zen 4 -- over the same packed weights,
 * with the same numbers. Compiled per function for AVX2 (target attributes), so the one build runs everywhere;
 * dispatch.c's tables hold them at the levels avx2 and avxvnni (and the int8 one at avx512 without VNNI).
 *
 * AVX2 has 16 vector registers of 8 floats, AVX-512 32 of 16: a tile of 12 rows x 32 columns (24 accumulators)
 * does not fit, so a tile here is 6 rows x 16 columns -- half a panel -- in 12 accumulators, with the half panel's
 * two weight vectors and one broadcast row value (15 of the 16 registers; BLIS's Haswell kernel has this shape).
 * Each half of a panel is 64 bytes per k, one cache line: the two halves are two passes over the panel, the
 * second from L2. */
#include "common.h"

#ifdef X86_KERNELS
#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define AVXVNNI_TARGET __attribute__((target("avx2,fma,avxvnni")))
#define AVX2_PANEL 32  /* columns per packed panel: linear.c's PANEL, the packing of nn/cpu_kernels.py */
#define AVX2_MR 6    /* the tallest tile (the fp32 GEMM's is a run-time choice up to it: bl_tuning.f32_rows) */
#define AVX2_MC 192  /* the int8 GEMM's rows per block (the fp32 GEMM's: bl_tuning.f32_block) */

/* ---------------------------------------------------------------------------------------------- fp32 GEMM */
/* rows [0, MR) of x against 16 columns of a panel (`half` points at the panel's column 0 or 16): y[m][0..cols) =
 * b + x_m · W, cols ≤ 16. The sum over k is one FMA chain per output, in k order, from the bias -- the AVX-512
 * kernel's chain, so the two give the same bits. */
static inline __attribute__((always_inline)) AVX2_TARGET void half_panel_tile(
    const int MR, const float *x, ptrdiff_t K, const float *half, const float *b, float *y, ptrdiff_t ldy,
    int cols, const char *pf, ptrdiff_t pf_step) {
    __m256 acc0[AVX2_MR], acc1[AVX2_MR];
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    for (int m = 0; m < MR; m++) {
        acc0[m] = b0;
        acc1[m] = b1;
    }
    for (ptrdiff_t k = 0; k < K; k++) {
        const __m256 w0 = _mm256_loadu_ps(half + k * AVX2_PANEL), w1 = _mm256_loadu_ps(half + k * AVX2_PANEL + 8);
        if (pf) _mm_prefetch(pf + k * pf_step, _MM_HINT_T0);
        for (int m = 0; m < MR; m++) {
            const __m256 v = _mm256_broadcast_ss(x + m * K + k);
            acc0[m] = _mm256_fmadd_ps(v, w0, acc0[m]);
            acc1[m] = _mm256_fmadd_ps(v, w1, acc1[m]);
        }
    }
    for (int m = 0; m < MR; m++) {
        if (cols == 16) {
            _mm256_storeu_ps(y + m * ldy, acc0[m]);
            _mm256_storeu_ps(y + m * ldy + 8, acc1[m]);
        } else {
            float row[16];
            _mm256_storeu_ps(row, acc0[m]);
            _mm256_storeu_ps(row + 8, acc1[m]);
            memcpy(y + m * ldy, row, sizeof(float) * (size_t)cols);
        }
    }
}

/* Tiles of MR rows, a run-time choice of 1-6 (bl_tuning.f32_rows), each height an inlined copy of TILE: linear.c's
 * TILE_OF with its cases cut at 6, since AVX2's 16 registers hold at most 6 rows of two 8-float halves and the
 * 7-12-row copies would only spill */
#define AVX2_TILE_OF(R, TILE)                          \
    switch (R) {                                       \
        case 6: TILE(6); break;                        \
        case 5: TILE(5); break;                        \
        case 4: TILE(4); break;                        \
        case 3: TILE(3); break;                        \
        case 2: TILE(2); break;                        \
        case 1: TILE(1); break;                        \
    }

/* The GELU epilogue (BL_ACT_GELU) over a block's half panel just stored (rows x cols ≤ 16, in L1): linear.c's
 * vector code, so the same bits */
static __attribute__((noinline)) AVX2_TARGET void gelu_half_panel(float *y, ptrdiff_t rows, ptrdiff_t ldy, int cols) {
    gelu_rows(y, rows, ldy, cols);
}

/* panels [p0, p1) for all M rows, t->f32_block rows at a time (those rows of x stay in L2 while the panels pass),
 * by tiles of t->f32_rows rows, `act` applied to each block's half panel once stored. With t->f32_prefetch (or
 * t->few_prefetch where the M rows fit in one tile), the panel that many ahead is requested meanwhile, spread over
 * both halves' tiles as gemm_f32_avx512 spreads it over its tiles. */
HIDDEN AVX2_TARGET void gemm_f32_avx2(const bl_tuning *t, const float *x, ptrdiff_t M, ptrdiff_t K,
                                      const float *w, const float *b, float *y, ptrdiff_t N, ptrdiff_t p0,
                                      ptrdiff_t p1, int act) {
    const int mr = t->f32_rows;
    const ptrdiff_t mc = t->f32_block, ahead = M <= mr ? t->few_prefetch : t->f32_prefetch;
    for (ptrdiff_t m0 = 0; m0 < M; m0 += mc) {
        const ptrdiff_t m1 = m0 + mc < M ? m0 + mc : M;
        for (ptrdiff_t p = p0; p < p1; p++) {
            const float *panel = w + p * K * AVX2_PANEL;
            const int cols = (int)(N - p * AVX2_PANEL < AVX2_PANEL ? N - p * AVX2_PANEL : AVX2_PANEL);
            float bias[AVX2_PANEL] = {0};
            if (b) memcpy(bias, b + p * AVX2_PANEL, sizeof(float) * (size_t)cols);
            const char *next = ahead && p + ahead < p1 ? (const char *)(panel + ahead * K * AVX2_PANEL) : NULL;
            const ptrdiff_t rows = 2 * (m1 - m0), bytes = K * AVX2_PANEL * 4;  /* (both halves' tiles share it) */
            for (int h = 0; h < 2 && h * 16 < cols; h++) {
                const int hc = cols - h * 16 < 16 ? cols - h * 16 : 16;
                float *yp = y + p * AVX2_PANEL + h * 16;
#define TILE(MR) half_panel_tile(MR, x + m * K, K, panel + h * 16, bias + h * 16, yp + m * N, N, hc,       \
                                 next ? next + (h * (m1 - m0) + m - m0) * bytes / rows : NULL,               \
                                 128 * (MR) / rows)
                ptrdiff_t m = m0;
                for (; m + mr <= m1; m += mr) AVX2_TILE_OF(mr, TILE);
                if (m < m1) AVX2_TILE_OF(m1 - m, TILE);
#undef TILE
                if (act == BL_ACT_GELU) gelu_half_panel(yp + m0 * N, m1 - m0, N, hc);
            }
        }
    }
}
#endif

/* ---------------------------------------------------------------------------------------------- int8 GEMM */
/* The int8 linear layer of linear.c (x quantized per row by ops.c, times the int8 weight packed
 * [N/16][K/4][16][4], dequantized) on 256-bit vectors: a block of 16 columns is two vectors of 8 columns x 4 k.
 * The integer sums are exact either way, and the dequantize is linear.c's operations in its order, so the output is bit for bit that
 * of quantize_rows, torch._int_mm and dequantize_rows.
 *
 * With AVX-VNNI (Intel client CPUs from 12th gen), VPDPBUSD on ymm as on AVX-512: x goes in as unsigned x + 128
 * and `comp` = 128 · Σ_k W takes the offset off again. Without it (AVX2 alone) there is no exact 4-byte dot
 * product: VPMADDUBSW sums pairs of unsigned x signed bytes into int16 with saturation, which (x + 128) · w
 * would overflow (2 · 255 · 127). So the sign moves to the weights instead (llama.cpp's way): |x| · (w · sign x),
 * both at most 127 in magnitude (quantize_rows never gives -128, nor does the weight quantizer), a pair at most
 * 2 · 127² = 32258 < 2^15: exact; VPMADDWD by ones then sums the pairs into int32. comp is not used there.
 * Four instructions a vector where VNNI has one; for weights within ±64 (what Int8Linear quantizes to at this
 * level, nn/int8_linear.py) the narrow kernel takes the unsigned x + 128 straight into VPMADDUBSW -- a pair at
 * most 2 · 255 · 64 = 32,640 < 2^15, exact in three (comp takes the offset off as with VNNI). oneDNN's int8
 * GEMM held to AVX2 takes 8-bit weights in such pairs and saturates (nn/cpu_kernels.py: int_mm_exact). */
#ifdef X86_KERNELS
/* One tile: MR rows x NB blocks of 16 columns (j = 0 .. 2 NB - 1: the block's 8-column halves), MR · NB · 2
 * accumulators over all of K; VNNI picks the product. The accumulators are named variables (acc<row>_<j>), one
 * per register, not an array indexed in loops, and the GEMMs are built without loop-header copying
 * (INT8_OPT): with either, GCC 12 kept a copy of every accumulator on the stack, storing it at each step of k
 * (18-19 stores a step in the 6 x 1 VPDPBUSD tile, with 20 register moves beside its 12 dot products). The rows
 * and halves a tile does not have are folded away (MR and NB are constants where the tile is inlined). */
#define INT8_OPT __attribute__((optimize("no-tree-ch")))
#define INT8_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define INT8_VECS(X, r) X(r, 0) X(r, 1) X(r, 2) X(r, 3) X(r, 4) X(r, 5) X(r, 6) X(r, 7)
#define INT8_DECL_V(r, j) __m256i acc##r##_##j = _mm256_setzero_si256();
#define INT8_DECL(r) INT8_VECS(INT8_DECL_V, r)
#define INT8_W(j)                                                                                              \
    const __m256i w##j = (j) < 2 * NB ? _mm256_loadu_si256((const __m256i *)(wp + ((ptrdiff_t)((j) / 2) * KQ + kq) * 64 \
                                                                               + (j) % 2 * 32))                 \
                                      : _mm256_setzero_si256();
#define INT8_X(r)                                                                                              \
    int32_t quad;                                                                                              \
    memcpy(&quad, x + (r) * K + kq * 4, 4);                                                                    \
    const __m256i xb = _mm256_set1_epi32(quad);
/* acc += the four products of each k quad: one VPDPBUSD (AVX-VNNI), or (AVX2) |x| · (w · sign x) in pairs,
 * VPMADDUBSW, then VPMADDWD by ones */
#define INT8_VNNI_V(r, j) \
    if ((j) < 2 * NB) acc##r##_##j = _mm256_dpbusd_avx_epi32(acc##r##_##j, xb, w##j);
#define INT8_VNNI_ROW(r) \
    if ((r) < MR) {      \
        INT8_X(r)        \
        INT8_VECS(INT8_VNNI_V, r) \
    }
#define INT8_PAIRS_V(r, j)                                                                                     \
    if ((j) < 2 * NB)                                                                                          \
        acc##r##_##j = _mm256_add_epi32(                                                                       \
            acc##r##_##j, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w##j, xb)), ones));
/* (narrow weights, |w| <= 64) the unsigned x + 128 and w straight into VPMADDUBSW: a pair reaches at most
 * 2 · 255 · 64 = 32,640 < 2^15, exact in three instructions where the sign's way takes four */
#define INT8_NARROW_V(r, j)                                                                                    \
    if ((j) < 2 * NB)                                                                                          \
        acc##r##_##j = _mm256_add_epi32(acc##r##_##j, _mm256_madd_epi16(_mm256_maddubs_epi16(xb, w##j), ones));
#define INT8_NARROW_ROW(r)          \
    if ((r) < MR) {                 \
        INT8_X(r)                   \
        INT8_VECS(INT8_NARROW_V, r) \
    }
#define INT8_PAIRS_ROW(r)                          \
    if ((r) < MR) {                                \
        INT8_X(r)                                  \
        const __m256i ax = _mm256_abs_epi8(xb);    \
        INT8_VECS(INT8_PAIRS_V, r)                 \
    }
/* y = (acc - comp) · xs · ws (+ b), linear.c's dequantize in its order */
#define INT8_OUT_V(r, j)                                                                                       \
    if ((r) < MR && (j) < 2 * NB) {                                                                            \
        const __m256i cc = comp ? _mm256_loadu_si256((const __m256i *)(comp + (j) * 8)) : _mm256_setzero_si256(); \
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc##r##_##j, cc)), _mm256_set1_ps(xs[r])); \
        v = b ? _mm256_fmadd_ps(v, _mm256_loadu_ps(ws + (j) * 8), _mm256_loadu_ps(b + (j) * 8))               \
              : _mm256_mul_ps(v, _mm256_loadu_ps(ws + (j) * 8));                                               \
        _mm256_storeu_ps(y + (r) * ldy + (j) * 8, v);                                                          \
    }
#define INT8_OUT(r) INT8_VECS(INT8_OUT_V, r)
#define INT8_W_ALL INT8_W(0) INT8_W(1) INT8_W(2) INT8_W(3) INT8_W(4) INT8_W(5) INT8_W(6) INT8_W(7)

/* One register tile of MR rows x NB blocks over all of K: the accumulators declared, each step of k the block's
 * weights loaded and every row's product added (ROW: one VPDPBUSD, the exact pairs of AVX2 alone, or the narrow
 * pairs), then dequantized and stored. SETUP: what ROW needs beside them (the ones of VPMADDWD). */
#define INT8_TILE(NAME, TARGET, SETUP, ROW)                                                                    \
    static inline __attribute__((always_inline)) INT8_OPT TARGET void NAME(                                    \
        const int MR, const int NB, const uint8_t *x, ptrdiff_t K, const int8_t *wp, const int32_t *comp,      \
        const float *xs, const float *ws, const float *b, float *y, ptrdiff_t ldy) {                           \
        const ptrdiff_t KQ = K / 4;                                                                            \
        SETUP                                                                                                  \
        INT8_ROWS(INT8_DECL)                                                                                   \
        for (ptrdiff_t kq = 0; kq < KQ; kq++) {                                                                \
            INT8_W_ALL                                                                                         \
            INT8_ROWS(ROW)                                                                                     \
        }                                                                                                      \
        INT8_ROWS(INT8_OUT)                                                                                    \
    }
INT8_TILE(int8_tile_avxvnni, AVXVNNI_TARGET, , INT8_VNNI_ROW)
INT8_TILE(int8_tile_avx2, AVX2_TARGET, const __m256i ones = _mm256_set1_epi16(1);, INT8_PAIRS_ROW)
INT8_TILE(int8_tile_avx2_narrow, AVX2_TARGET, const __m256i ones = _mm256_set1_epi16(1);, INT8_NARROW_ROW)

/* Column blocks [nb0, nb1) for all M rows: from BIG rows on, tiles of BIG rows x 1 block (the rows streaming
 * past each block's weights, which stay in L1), AVX2_MC rows at a time; for 2 to BIG - 1 rows tiles of SMALL
 * rows x 2 blocks; for one row 1 x 4 (a decoding step: several independent chains, the weights one stream).
 * The heights are what fits the 16 registers without spilling an accumulator: with VPDPBUSD a tile holds its
 * accumulators, the block's two weight vectors and the broadcast x (6 x 1: 12 + 2 + 1, 3 x 2: 6 + 4 + 1); the
 * pairs of AVX2 alone also hold |x|, the product and the ones of VPMADDWD, so there 4 x 1 and 2 x 2 (6 x 1 and
 * 3 x 2 kept 11 of their 12 accumulators on the stack across each step of k); the narrow kernel the same (its
 * 5 x 1 fits 15 registers but GCC stored five accumulators a step, and measured level with 4 x 1). */
#define INT8_COLUMNS(NAME, TARGET, TILE_FN, BIG, SMALL)                                                          \
    HIDDEN INT8_OPT TARGET void NAME(INT8_COLUMNS_ARGS) {                                                                 \
        const ptrdiff_t KQ = K / 4;                                                                             \
        const int NB = M >= BIG ? 1 : M >= 2 ? 2 : 4;                                                           \
        ptrdiff_t nb = nb0;                                                                                     \
        if (NB > 1) {                                                                                           \
            for (; nb + NB <= nb1; nb += NB) {                                                                  \
                const int8_t *wb = wp + nb * KQ * 64;                                                           \
                const int32_t *cb = comp ? comp + nb * 16 : NULL;                                               \
                ptrdiff_t r = 0;                                                                                \
                if (NB == 4) {                                                                                  \
                    TILE_FN(1, 4, x, K, wb, cb, xs, ws + nb * 16, b ? b + nb * 16 : NULL, y + nb * 16, N);      \
                    continue;                                                                                   \
                }                                                                                               \
                for (; r + SMALL <= M; r += SMALL)                                                              \
                    TILE_FN(SMALL, 2, x + r * K, K, wb, cb, xs + r, ws + nb * 16, b ? b + nb * 16 : NULL,       \
                            y + r * N + nb * 16, N);                                                            \
                if (M - r == 2)                                                                                 \
                    TILE_FN(2, 2, x + r * K, K, wb, cb, xs + r, ws + nb * 16, b ? b + nb * 16 : NULL,           \
                            y + r * N + nb * 16, N);                                                            \
                else if (M - r == 1)                                                                            \
                    TILE_FN(1, 2, x + r * K, K, wb, cb, xs + r, ws + nb * 16, b ? b + nb * 16 : NULL,           \
                            y + r * N + nb * 16, N);                                                            \
            }                                                                                                   \
        }                                                                                                       \
        for (ptrdiff_t m0 = 0; m0 < M; m0 += AVX2_MC) {                                                         \
            const ptrdiff_t m1 = m0 + AVX2_MC < M ? m0 + AVX2_MC : M;                                           \
            for (ptrdiff_t c = nb; c < nb1; c++) {                                                              \
                const int8_t *wb = wp + c * KQ * 64;                                                            \
                const int32_t *cb = comp ? comp + c * 16 : NULL;                                                \
                ptrdiff_t m = m0;                                                                               \
                for (; m + BIG <= m1; m += BIG) INT8_ONE(TILE_FN, BIG);                                         \
                switch (m1 - m) {                                                                               \
                    case 5: INT8_ONE(TILE_FN, 5); break;                                                        \
                    case 4: INT8_ONE(TILE_FN, 4); break;                                                        \
                    case 3: INT8_ONE(TILE_FN, 3); break;                                                        \
                    case 2: INT8_ONE(TILE_FN, 2); break;                                                        \
                    case 1: INT8_ONE(TILE_FN, 1); break;                                                        \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    }
#define INT8_ONE(TILE_FN, MR) \
    TILE_FN(MR, 1, x + m * K, K, wb, cb, xs + m, ws + c * 16, b ? b + c * 16 : NULL, y + m * N + c * 16, N)
INT8_COLUMNS(int8_columns_avxvnni, AVXVNNI_TARGET, int8_tile_avxvnni, 6, 3)
INT8_COLUMNS(int8_columns_avx2, AVX2_TARGET, int8_tile_avx2, 4, 2)
INT8_COLUMNS(int8_columns_avx2_narrow, AVX2_TARGET, int8_tile_avx2_narrow, 4, 2)
#undef INT8_ONE
#undef INT8_COLUMNS
#endif
