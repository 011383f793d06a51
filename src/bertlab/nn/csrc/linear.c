/* Linear layers of CPU inference on AVX-512: fp32 and bf16 GEMMs over weights packed in panels (AVX-512,
 * AVX-512 BF16); the int8 GEMM on AVX-512 VNNI (its input quantized by ops.c), by panels from 16 rows and tuned
 * for a decoding step's few rows below (see common.h). One instruction set per function (target attributes);
 * dispatch.c's tables say which runs. */
#include "common.h"

/* ------------------------------------------------------------------------------- fp32 GEMM, packed panels */
/* y (M, N) = x (M, K) · Wᵀ + b in fp32 on AVX-512, W packed once into panels of 32 columns, k-major:
 * panel p holds W[p·32 + c][k] at [p][k][c] (see nn/cpu_kernels.py: pack_f32_panels; the last panel's missing
 * columns are zeros). A tile of MR ≤ 12 rows x 32 columns lives in 24 of the 32 vector registers for all of K:
 * each k loads the panel's 32 weights once (two vectors, streamed in memory order) and broadcasts each row's
 * x[m][k] into two FMAs. The sum over k is one FMA chain per output, in k order, started from the bias.
 *
 * Why not oneDNN's packed kernel, which the rest of the matrix multiplies use: each call through torch costs
 * ~10 us before any arithmetic, and its primitives are built per row count, so a call's rows are padded to a
 * few bucket sizes (a 70-token input computes 72 rows, a 700-token batch up to 31 spare rows). This kernel
 * takes any M exactly, at 245-265 GFLOP/s on one Zen 5 core for BERT's shapes from 32 rows to 700 (oneDNN:
 * 180-250 below 128 rows, ~250 above), and is called without the dispatcher's overhead. */
#ifdef X86_KERNELS
#define AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,fma")))
#define PANEL 32
#define GEMM_MR 12
#define GEMM_MC 192
/* Bytes of a panel per step of its k loop, in every dtype: 32 columns of fp32, of bf16 pairs, of int8 quads */
#define PANEL_STEP 128

/* Rows [M0, M1) by tiles of MR rows (a run-time choice of 1-12, bl_tuning.f32_rows, or the constant GEMM_MR),
 * then the last MR - 1 or fewer; every tile height its own inlined copy of TILE, so its registers are known at
 * compile time (the switch is one predictable branch a tile) */
#define TILE_OF(R, TILE)                                                                                        \
    switch (R) {                                                                                                \
        case 12: TILE(12); break;                                                                               \
        case 11: TILE(11); break;                                                                               \
        case 10: TILE(10); break;                                                                               \
        case 9: TILE(9); break;                                                                                 \
        case 8: TILE(8); break;                                                                                 \
        case 7: TILE(7); break;                                                                                 \
        case 6: TILE(6); break;                                                                                 \
        case 5: TILE(5); break;                                                                                 \
        case 4: TILE(4); break;                                                                                 \
        case 3: TILE(3); break;                                                                                 \
        case 2: TILE(2); break;                                                                                 \
        case 1: TILE(1); break;                                                                                 \
    }
#define ROW_TILES_OF(M0, M1, MR, TILE)                                                       \
    do {                                                                                     \
        ptrdiff_t m = (M0);                                                                  \
        for (; m + (MR) <= (M1); m += (MR)) TILE_OF(MR, TILE);                               \
        if (m < (M1)) TILE_OF((M1) - m, TILE);                                               \
    } while (0)

/* The next panel (`bytes` long, NULL if none), requested while this one is multiplied: the tile at row `m` of a
 * chunk of `rows` asks for its share of it, a k-step's part of that share per step (PANEL_STEP · MR / rows
 * bytes). The panels are one stream in memory, but the first tile of a panel would otherwise wait for it --
 * every weight comes from memory once per call. */
INLINE const char *next_share(const char *next, ptrdiff_t bytes, ptrdiff_t m, ptrdiff_t rows) {
    return next ? next + m * bytes / rows : NULL;
}

/* rows [0, MR) of x against one panel: y[m][0..cols) = b + x_m · panel, cols ≤ 32 (the last panel's fewer) */
INLINE void panel_tile(const int MR, const float *x, ptrdiff_t K, const float *panel, const float *b,
                       float *y, ptrdiff_t ldy, int cols, const char *pf, ptrdiff_t pf_step) {
    f32x16 acc0[GEMM_MR], acc1[GEMM_MR], b0, b1;
    memcpy(&b0, b, sizeof b0);
    memcpy(&b1, b + 16, sizeof b1);
    for (int m = 0; m < MR; m++) {
        acc0[m] = b0;
        acc1[m] = b1;
    }
    for (ptrdiff_t k = 0; k < K; k++) {
        f32x16 w0, w1;
        memcpy(&w0, panel + k * PANEL, sizeof w0);
        memcpy(&w1, panel + k * PANEL + 16, sizeof w1);
        if (pf) __builtin_prefetch(pf + k * pf_step);
        for (int m = 0; m < MR; m++) {
            const float v = x[m * K + k];
            acc0[m] += v * w0;
            acc1[m] += v * w1;
        }
    }
    if (cols == PANEL) {
        for (int m = 0; m < MR; m++) {
            memcpy(y + m * ldy, &acc0[m], sizeof acc0[m]);
            memcpy(y + m * ldy + 16, &acc1[m], sizeof acc1[m]);
        }
    } else {
        for (int m = 0; m < MR; m++) {
            float row[PANEL];
            memcpy(row, &acc0[m], sizeof acc0[m]);
            memcpy(row + 16, &acc1[m], sizeof acc1[m]);
            memcpy(y + m * ldy, row, sizeof(float) * (size_t)cols);
        }
    }
}

/* The GELU epilogue (BL_ACT_GELU) over a block's panel just stored (rows x cols ≤ 32, in L1) */
static __attribute__((noinline)) AVX512_TARGET void gelu_panel(float *y, ptrdiff_t rows, ptrdiff_t ldy, int cols) {
    gelu_rows(y, rows, ldy, cols);
}

/* panels [p0, p1) for all M rows, t->f32_block rows at a time (those rows of x stay in L2 while the panels pass),
 * by tiles of t->f32_rows rows; the panel t->f32_prefetch ahead requested meanwhile (t->few_prefetch where the M
 * rows fit in one tile); `act` on each block's panel once its tiles are stored */
HIDDEN AVX512_TARGET void gemm_f32_avx512(const bl_tuning *t, const float *x, ptrdiff_t M, ptrdiff_t K,
                                          const float *w, const float *b, float *y, ptrdiff_t N, ptrdiff_t p0,
                                          ptrdiff_t p1, int act) {
    const int mr = t->f32_rows;
    const ptrdiff_t mc = t->f32_block, ahead = M <= mr ? t->few_prefetch : t->f32_prefetch;
    for (ptrdiff_t m0 = 0; m0 < M; m0 += mc) {
        const ptrdiff_t m1 = m0 + mc < M ? m0 + mc : M;
        for (ptrdiff_t p = p0; p < p1; p++) {
            const float *panel = w + p * K * PANEL;
            const int cols = (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL);
            float bias[PANEL] = {0};
            if (b) memcpy(bias, b + p * PANEL, sizeof(float) * (size_t)cols);
            float *yp = y + p * PANEL;
            const char *next = ahead && p + ahead < p1 ? (const char *)(panel + ahead * K * PANEL) : NULL;
            const ptrdiff_t rows = m1 - m0, bytes = K * PANEL * 4;
#define TILE(MR) panel_tile(MR, x + m * K, K, panel, bias, yp + m * N, N, cols,                     \
                            next_share(next, bytes, m - m0, rows), PANEL_STEP * (MR) / rows)
            ROW_TILES_OF(m0, m1, mr, TILE);
#undef TILE
            if (act == BL_ACT_GELU) gelu_panel(yp + m0 * N, rows, N, cols);
        }
    }
}
#endif


/* ------------------------------------------------------------------------------- bf16 GEMM, packed panels */
/* y (M, N) bf16 = x (M, K) bf16 · Wᵀ + b on AVX-512 BF16, the same tiles as the fp32 GEMM on bf16 dot products:
 * VDPBF16PS adds the products of 16 pairs of bf16 into 16 fp32 sums, so each panel holds its 32 columns' pairs
 * of consecutive k, [p][K/2][32][2] (nn/cpu_kernels.py: pack_bf16_panels), and each row's pair x[m][2k'],
 * x[m][2k'+1] is broadcast as one 32-bit value. Products of bf16 are exact in fp32; the sums are fp32 from the
 * fp32 bias, rounded to bf16 once at the end (to nearest even), as oneDNN's bf16 kernel does; only the
 * summation order differs. K even. Against oneDNN's packed bf16 kernel through torch: 1.03-1.3x per call from
 * 72 to 704 rows, more below (one Zen 5 core). */
#ifdef X86_KERNELS
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline __attribute__((always_inline)) BF16_TARGET void panel_tile_bf16(
        const int MR, const uint16_t *x, ptrdiff_t K, const uint16_t *panel, const float *b, uint16_t *y,
        ptrdiff_t ldy, int cols, const char *pf, ptrdiff_t pf_step) {
    __m512 acc0[GEMM_MR], acc1[GEMM_MR];
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
    for (int m = 0; m < MR; m++) {
        acc0[m] = b0;
        acc1[m] = b1;
    }
    for (ptrdiff_t kp = 0; kp < K / 2; kp++) {
        const __m512i w0 = _mm512_loadu_si512(panel + kp * 2 * PANEL);
        const __m512i w1 = _mm512_loadu_si512(panel + kp * 2 * PANEL + PANEL);
        if (pf) _mm_prefetch(pf + kp * pf_step, _MM_HINT_T0);
        for (int m = 0; m < MR; m++) {
            int32_t pair;
            memcpy(&pair, x + m * K + 2 * kp, sizeof pair);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            acc0[m] = _mm512_dpbf16_ps(acc0[m], a, (__m512bh)w0);
            acc1[m] = _mm512_dpbf16_ps(acc1[m], a, (__m512bh)w1);
        }
    }
    for (int m = 0; m < MR; m++) {
        __m256i lo = (__m256i)_mm512_cvtneps_pbh(acc0[m]), hi = (__m256i)_mm512_cvtneps_pbh(acc1[m]);
        if (cols == PANEL) {
            _mm256_storeu_si256((__m256i *)(y + m * ldy), lo);
            _mm256_storeu_si256((__m256i *)(y + m * ldy + 16), hi);
        } else {
            uint16_t row[PANEL];
            _mm256_storeu_si256((__m256i *)row, lo);
            _mm256_storeu_si256((__m256i *)(row + 16), hi);
            memcpy(y + m * ldy, row, sizeof(uint16_t) * (size_t)cols);
        }
    }
}

HIDDEN BF16_TARGET void gemm_bf16_avx512(const bl_tuning *t, const uint16_t *x, ptrdiff_t M, ptrdiff_t K,
                                         const uint16_t *w, const float *b, uint16_t *y, ptrdiff_t N, ptrdiff_t p0,
                                         ptrdiff_t p1) {
    /* the next panel requested (t->few_prefetch panels ahead where the M rows fit in one tile) */
    const ptrdiff_t ahead = M <= GEMM_MR ? t->few_prefetch : 1;
    for (ptrdiff_t m0 = 0; m0 < M; m0 += GEMM_MC) {
        const ptrdiff_t m1 = m0 + GEMM_MC < M ? m0 + GEMM_MC : M;
        for (ptrdiff_t p = p0; p < p1; p++) {
            const uint16_t *panel = w + p * K * PANEL;
            const int cols = (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL);
            float bias[PANEL] = {0};
            if (b) memcpy(bias, b + p * PANEL, sizeof(float) * (size_t)cols);
            uint16_t *yp = y + p * PANEL;
            const char *next = ahead && p + ahead < p1 ? (const char *)(panel + ahead * K * PANEL) : NULL;
            const ptrdiff_t rows = m1 - m0, bytes = K * PANEL * 2;
#define TILE(MR) panel_tile_bf16(MR, x + m * K, K, panel, bias, yp + m * N, N, cols,                \
                                 next_share(next, bytes, m - m0, rows), PANEL_STEP * (MR) / rows)
            ROW_TILES_OF(m0, m1, GEMM_MR, TILE);
#undef TILE
        }
    }
}
#endif


/* ----------------------------------------------------------- int8 GEMM on AVX-512 VNNI, up to 128 rows */
/* y = dequantize(xq · Wqᵀ) for a handful of rows (a decoder step: one row per sequence or beam), with AVX-512
 * VNNI. oneDNN's int8 GEMM behind torch._int_mm is tuned for many rows: from 2 to 16 rows it ran at 1/8-1/3 of
 * its many-row rate, and T5's int8 decoding spent most of its time there. Here the weight stays put and the few
 * rows stream past it: each 64-byte load of weights (16 columns x 4 k) feeds one VPDPBUSD per row.
 *
 * VPDPBUSD multiplies unsigned by signed bytes, so x goes in as x + 128 (its sign bit flipped) and
 * 128 · Σ_k W[n, k] (`comp`, computed when packing) comes off again: Σ (x + 128) w - 128 Σ w = Σ x w, exact in
 * int32. The products are then dequantized as dequantize_rows does, with the same operations: the result is
 * bit-identical to torch._int_mm followed by the torch formula.
 *
 * Weights are packed (see nn/cpu_kernels.py) as [N / 16][K / 4][16][4]: block nb, k-quad kq holds columns
 * nb·16 .. nb·16 + 15, each with its 4 consecutive k. */
#ifdef X86_KERNELS
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* One tile: MR rows x NB blocks of 16 columns, accumulated over all of K in MR · NB registers. Always inlined
 * with constant MR and NB, so the loops unroll and the rows and blocks a tile does not have fold away. The
 * accumulators are named variables (acc<row>_<block>), not an array indexed in loops, and the kernel is built
 * without loop-header copying (VNNI_OPT): with the array GCC 12 copied every accumulator to another register
 * and back at each step of k (the 8 x 2 and 4 x 4 tiles: 59-70 instructions a step around their 16 dot
 * products, 28 of them register moves), as it did in the AVX-VNNI tiles (linear_avx2.c). */
#define VNNI_OPT __attribute__((optimize("no-tree-ch")))
#define VNNI_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define VNNI_BLOCKS(X, r) X(r, 0) X(r, 1) X(r, 2) X(r, 3) X(r, 4) X(r, 5) X(r, 6) X(r, 7)
#define VNNI_DECL_V(r, c) __m512i acc##r##_##c = _mm512_setzero_si512();
#define VNNI_DECL(r) VNNI_BLOCKS(VNNI_DECL_V, r)
#define VNNI_W(c) \
    const __m512i w##c = (c) < NB ? _mm512_loadu_si512(wp + ((ptrdiff_t)(c) * KQ + kq) * 64) : _mm512_setzero_si512();
#define VNNI_DOT(r, c) \
    if ((c) < NB) acc##r##_##c = _mm512_dpbusd_epi32(acc##r##_##c, xb, w##c);
#define VNNI_ROW(r)                                   \
    if ((r) < MR) {                                   \
        int32_t quad;                                 \
        memcpy(&quad, x + (r) * K + kq * 4, 4);       \
        const __m512i xb = _mm512_set1_epi32(quad);   \
        VNNI_BLOCKS(VNNI_DOT, r)                      \
    }
/* y = (acc - comp) · xs · ws (+ b): dequantize_rows' operations in its order */
#define VNNI_OUT_V(r, c)                                                                                        \
    if ((r) < MR && (c) < NB) {                                                                                 \
        const __m512i cc = _mm512_loadu_si512(comp + (c) * 16);                                                 \
        const __m512 wsc = _mm512_loadu_ps(ws + (c) * 16);                                                      \
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc##r##_##c, cc)), _mm512_set1_ps(xs[r])); \
        v = b ? _mm512_fmadd_ps(v, wsc, _mm512_loadu_ps(b + (c) * 16)) : _mm512_mul_ps(v, wsc);                 \
        _mm512_storeu_ps(y + (r) * ldy + (c) * 16, v);                                                          \
    }
#define VNNI_OUT(r) VNNI_BLOCKS(VNNI_OUT_V, r)
static inline __attribute__((always_inline)) VNNI_OPT VNNI_TARGET void vnni_tile(
    const int MR, const int NB, const uint8_t *x, ptrdiff_t K, const int8_t *wp, const int32_t *comp,
    const float *xs, const float *ws, const float *b, float *y, ptrdiff_t ldy, const char *pf,
    ptrdiff_t pf_step) {
    const ptrdiff_t KQ = K / 4;
    VNNI_ROWS(VNNI_DECL)
    for (ptrdiff_t kq = 0; kq < KQ; kq++) {
        VNNI_W(0) VNNI_W(1) VNNI_W(2) VNNI_W(3) VNNI_W(4) VNNI_W(5) VNNI_W(6) VNNI_W(7)
        if (pf) { /* the lines [0, pf_step) of this step's share, pf_step <= NB · 64 <= 256 (a loop here, not
                   * rotated without loop-header copying, cost the 2 x 4 tile ~15%) */
            const char *p = pf + kq * pf_step;
            _mm_prefetch(p, _MM_HINT_T0);
            if (pf_step > 64) _mm_prefetch(p + 64, _MM_HINT_T0);
            if (pf_step > 128) _mm_prefetch(p + 128, _MM_HINT_T0);
            if (pf_step > 192) _mm_prefetch(p + 192, _MM_HINT_T0);
        }
        VNNI_ROWS(VNNI_ROW)
    }
    VNNI_ROWS(VNNI_OUT)
}

/* From bl_tuning.int8_panel_rows rows on (16 by default), pairs of blocks are taken as one panel of 32 columns by
 * tiles of 12 rows (24 accumulators), as the fp32 and bf16 GEMMs do, GEMM_MC rows at a time: the weights are then reused by many
 * rows and no longer the stream to hide, and the wider tile does twice the multiply-adds per broadcast row of
 * the 8 x 2 one. Against torch._int_mm with its quantize and dequantize passes, per layer of MiniLM's shapes:
 * 1.15-1.7x at 32-128 rows, where the 8 x 2 tiles alone fell to 0.83-1.02x at 128 rows. The same integer sums,
 * the same dequantize: identical outputs. */
static inline __attribute__((always_inline)) VNNI_TARGET void vnni_panel_tile(
    const int MR, const uint8_t *x, ptrdiff_t K, const int8_t *w0p, const int8_t *w1p, const int32_t *comp,
    const float *xs, const float *ws, const float *b, float *y, ptrdiff_t ldy, const char *pf,
    ptrdiff_t pf_step) {
    __m512i acc0[GEMM_MR], acc1[GEMM_MR];
    for (int r = 0; r < MR; r++) acc0[r] = acc1[r] = _mm512_setzero_si512();
    for (ptrdiff_t kq = 0; kq < K / 4; kq++) {
        const __m512i w0 = _mm512_loadu_si512(w0p + kq * 64), w1 = _mm512_loadu_si512(w1p + kq * 64);
        if (pf) _mm_prefetch(pf + kq * pf_step, _MM_HINT_T0);
        for (int r = 0; r < MR; r++) {
            int32_t quad;
            memcpy(&quad, x + r * K + kq * 4, 4);
            const __m512i xb = _mm512_set1_epi32(quad);
            acc0[r] = _mm512_dpbusd_epi32(acc0[r], xb, w0);
            acc1[r] = _mm512_dpbusd_epi32(acc1[r], xb, w1);
        }
    }
    for (int c = 0; c < 2; c++) {
        const __m512i cc = _mm512_loadu_si512(comp + c * 16);
        const __m512 wsc = _mm512_loadu_ps(ws + c * 16);
        const __m512 bc = b ? _mm512_loadu_ps(b + c * 16) : _mm512_setzero_ps();
        for (int r = 0; r < MR; r++) {
            const __m512i a = c ? acc1[r] : acc0[r];
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a, cc)), _mm512_set1_ps(xs[r]));
            v = b ? _mm512_fmadd_ps(v, wsc, bc) : _mm512_mul_ps(v, wsc);
            _mm512_storeu_ps(y + r * ldy + c * 16, v);
        }
    }
}

static inline __attribute__((always_inline)) VNNI_TARGET ptrdiff_t vnni_panels(
    const uint8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp, const int32_t *comp, const float *xs,
    const float *ws, const float *b, float *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1) {
    const ptrdiff_t KQ = K / 4, last = nb0 + (nb1 - nb0) / 2 * 2;
    for (ptrdiff_t m0 = 0; m0 < M; m0 += GEMM_MC) {
        const ptrdiff_t m1 = m0 + GEMM_MC < M ? m0 + GEMM_MC : M;
        for (ptrdiff_t nb = nb0; nb < last; nb += 2) {
            const int8_t *w0p = wp + nb * KQ * 64, *w1p = wp + (nb + 1) * KQ * 64;
            /* the next pair of blocks (the two lie one after the other), as gemm_f32_avx512 requests its next panel */
            const char *next = nb + 2 < last ? (const char *)(wp + (nb + 2) * KQ * 64) : NULL;
            const ptrdiff_t rows = m1 - m0, bytes = KQ * 128;
#define TILE(MR) vnni_panel_tile(MR, x + m * K, K, w0p, w1p, comp + nb * 16, xs + m, ws + nb * 16,        \
                                 b ? b + nb * 16 : NULL, y + m * N + nb * 16, N,                           \
                                 next_share(next, bytes, m - m0, rows), PANEL_STEP * (MR) / rows)
            ROW_TILES_OF(m0, m1, GEMM_MR, TILE);
#undef TILE
        }
    }
    return last;  /* the first block left to the caller: an odd one out */
}

/* Column blocks [nb0, nb1) for all M rows (x as unsigned bytes, x + 128): groups of NB blocks, each taken by
 * tiles of MR rows while MR fit, then by tiles of 4, 2, 1 rows; leftover blocks one at a time. MR · NB
 * accumulators (at most 16) plus NB weight registers, of AVX-512's 32.
 *
 * Prefetch: from 2 rows on, while one group of blocks is computed, the next group's weights are requested,
 * spread evenly over the group's row tiles (`pf`, `pf_step` bytes per k-quad). A decoder step's weights are
 * tens of MB, read once from memory: the hardware prefetcher alone kept few lines in flight, and the loads and
 * the arithmetic took turns (T5-small's decoder step at 8 rows: 3.1 ms at 12 GB/s; with this, 1.3 ms at
 * 30 GB/s, what one row's streaming reaches; at 32 rows 5.9 -> 4.1 ms). At one row the 8 block streams keep
 * enough in flight already. */
#define TILE(MR, NB) vnni_tile(MR, NB, x + r * K, K, wp + nb * KQ * 64, comp + nb * 16, xs + r, ws + nb * 16, \
                               b ? b + nb * 16 : NULL, y + r * N + nb * 16, N,                      \
                               next ? next + r * NB * KQ * 64 / M : NULL, MR * NB * 64 / M)
#define ROWS(NB) do {                                                   \
        ptrdiff_t r = 0;                                                \
        if ((NB) <= 2) for (; r + 8 <= M; r += 8) TILE(8, NB);          \
        if ((NB) <= 4) for (; r + 4 <= M; r += 4) TILE(4, NB);          \
        for (; r + 2 <= M; r += 2) TILE(2, NB);                         \
        for (; r < M; r++) TILE(1, NB);                                 \
    } while (0)
/* blocks [nb, nb1) by the small-row tiles (built apart from the panels: VNNI_OPT's loops measured 0.95-1.03x the
 * panel tiles' usual build) */
static __attribute__((noinline)) VNNI_OPT VNNI_TARGET void vnni_blocks(
    const uint8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp, const int32_t *comp, const float *xs,
    const float *ws, const float *b, float *y, ptrdiff_t N, ptrdiff_t nb, ptrdiff_t nb1) {
    const ptrdiff_t KQ = K / 4;
    const int NB = M >= 8 ? 2 : M >= 2 ? 4 : 8;
    for (; nb + NB <= nb1; nb += NB) {
        const char *next = NB <= 4 && nb + 2 * NB <= nb1 ? (const char *)(wp + (nb + NB) * KQ * 64) : NULL;
        switch (NB) {
            case 2: ROWS(2); break;
            case 4: ROWS(4); break;
            default: ROWS(8); break;
        }
    }
    const char *next = NULL;
    for (; nb < nb1; nb++) ROWS(1);
}
#undef ROWS
HIDDEN VNNI_TARGET void int8_columns_vnni(const bl_tuning *tune, const uint8_t *x, ptrdiff_t M, ptrdiff_t K,
                                          const int8_t *wp, const int32_t *comp, const float *xs, const float *ws,
                                          const float *b, float *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1) {
    ptrdiff_t nb = nb0;
    if (M >= tune->int8_panel_rows) nb = vnni_panels(x, M, K, wp, comp, xs, ws, b, y, N, nb0, nb1);
    if (nb < nb1) vnni_blocks(x, M, K, wp, comp, xs, ws, b, y, N, nb, nb1);
}
#undef TILE


#endif


