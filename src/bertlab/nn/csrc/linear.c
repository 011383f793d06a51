/* Linear layers of CPU inference: fp32 and bf16 GEMMs over weights packed in panels (AVX-512, AVX-512 BF16); an
 * int8 GEMM on AVX-512 VNNI (quantize, multiply, dequantize in one call), by panels from 16 rows and tuned for a
 * decoding step's few rows below; an fp32 / bf16 GEMV over the plain weight for 1-4 rows (see common.h). */
#include "common.h"

/* ------------------------------------------------------------------------------ fp32 / bf16 linear, few rows */
/* y (M, N) = x (M, K) · Wᵀ + b for a decoding step's few rows, W the layer's own (N, K) row-major weight (no
 * copy of it), fp32 or bf16 (x, W, b and y all one dtype). oneDNN's packed kernel pads such a call to 8 rows
 * and streamed T5-small's 154 MB of fp32 decoder weights at ~20 GB/s (one thread); this reads W once, in memory
 * order, for up to 4 rows of x at a time, at 30 GB/s for 1-2 rows and 23 GB/s for 4 (from 6 rows on, oneDNN is
 * as fast). Sums in fp32 whatever the dtype: two chains of 16 lanes over k, then the lanes folded -- another
 * order than oneDNN's, the same numbers to ~1e-6 in fp32; bf16 inputs are widened exactly and the fp32 result
 * rounded to bf16 once, as oneDNN's bf16 kernel does. K % 16 == 0; the N % 16 last columns one at a time.
 *
 * gemv16: y[m][j] = x_m · w_j (+ b[j]) for the 16 rows w_j = w + j·K and MR (1-4) rows x_m (fp32: a bf16 x is
 * widened by the caller, once). W is read in memory order, row after row -- one sequential stream, which the
 * hardware prefetcher follows, helped by a request 4 KB ahead (reading the 16 rows side by side, 16 short
 * streams, reached 26 GB/s) -- and the 16 rows' lanes are folded at once at the end. */
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

/* *f = 16 weights from w[i..i+16), of dtype WBF16 ? bf16 : fp32, as floats (bf16: its bits in the high half) */
INLINE void load16(f32x16 *f, const void *w, Py_ssize_t i, const int WBF16) {
    if (WBF16) {
        u16x16 h;
        memcpy(&h, (const uint16_t *)w + i, sizeof h);
        const u32x16 u = __builtin_convertvector(h, u32x16) << 16;
        memcpy(f, &u, sizeof *f);
    } else {
        memcpy(f, (const float *)w + i, sizeof *f);
    }
}

INLINE void gemv16(const int MR, const int WBF16, const float *x, Py_ssize_t K, const void *w, const float *b,
                   void *y, Py_ssize_t ldy) {
    const Py_ssize_t size = WBF16 ? 2 : 4;
    f32x16 part[4][16];
    for (int j = 0; j < 16; j++) {
        const char *wj = (const char *)w + j * K * size;
        f32x16 a0[4] = {{0}}, a1[4] = {{0}};
        Py_ssize_t d = 0;
        for (; d + 32 <= K; d += 32) {
            f32x16 v0, v1;
            load16(&v0, wj, d, WBF16);
            load16(&v1, wj, d + 16, WBF16);
            __builtin_prefetch(wj + d * size + 4096);  /* 4 KB ahead */
            if (!WBF16) __builtin_prefetch(wj + d * size + 4096 + 64);
            for (int m = 0; m < MR; m++) {
                f32x16 x0, x1;
                memcpy(&x0, x + m * K + d, sizeof x0);
                memcpy(&x1, x + m * K + d + 16, sizeof x1);
                a0[m] += x0 * v0;
                a1[m] += x1 * v1;
            }
        }
        if (d < K) {  /* K % 32 == 16 */
            f32x16 v0;
            load16(&v0, wj, d, WBF16);
            for (int m = 0; m < MR; m++) {
                f32x16 x0;
                memcpy(&x0, x + m * K + d, sizeof x0);
                a0[m] += x0 * v0;
            }
        }
        for (int m = 0; m < MR; m++) part[m][j] = a0[m] + a1[m];
    }
    for (int m = 0; m < MR; m++) {
        float out[16];
        fold16(part[m], out);
        for (int j = 0; j < 16; j++) {
            const float v = b ? out[j] + b[j] : out[j];
            if (WBF16)
                ((uint16_t *)y)[m * ldy + j] = f32_to_bf16(v);
            else
                ((float *)y)[m * ldy + j] = v;
        }
    }
}

#define GEMV_BLOCK(BF)                                                                                          \
    do {                                                                                                       \
        const char *wb = (const char *)w + nb * 16 * K * (BF ? 2 : 4);                                         \
        char *yb = (char *)y + nb * 16 * (BF ? 2 : 4);                                                         \
        const Py_ssize_t row_bytes = N * (BF ? 2 : 4);                                                         \
        Py_ssize_t m = 0;                                                                                      \
        for (; m + 4 <= M; m += 4) gemv16(4, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N);               \
        switch (M - m) {                                                                                       \
            case 3: gemv16(3, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N); break;                         \
            case 2: gemv16(2, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N); break;                         \
            case 1: gemv16(1, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N); break;                         \
        }                                                                                                      \
    } while (0)

/* Column blocks [nb0, nb1) of 16; x (M, K) and b fp32 (a bf16 layer's widened by the entry), W and y of the
 * layer's dtype */
MULTIVERSION
static void linear_columns(int dtype, const float *x, Py_ssize_t M, Py_ssize_t K, const void *w, const float *b,
                           void *y, Py_ssize_t N, Py_ssize_t nb0, Py_ssize_t nb1) {
    for (Py_ssize_t nb = nb0; nb < nb1; nb++) {
        const float *bb = b ? b + nb * 16 : NULL;
        if (dtype == BF16)
            GEMV_BLOCK(1);
        else
            GEMV_BLOCK(0);
    }
}
#undef GEMV_BLOCK

static void linear_tail(int dtype, const float *x, Py_ssize_t M, Py_ssize_t K, const void *w, const float *b,
                        void *y, Py_ssize_t N, Py_ssize_t n0) {
    for (Py_ssize_t m = 0; m < M; m++)
        for (Py_ssize_t n = n0; n < N; n++) {
            float sum = b ? b[n] : 0.0f;
            for (Py_ssize_t k = 0; k < K; k++)
                sum += x[m * K + k] * (dtype == BF16 ? bf16_to_f32(((const uint16_t *)w)[n * K + k])
                                                      : ((const float *)w)[n * K + k]);
            if (dtype == BF16)
                ((uint16_t *)y)[m * N + n] = f32_to_bf16(sum);
            else
                ((float *)y)[m * N + n] = sum;
        }
}

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
#define HAVE_F32_GEMM 1
#define AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,fma")))
#define PANEL 32
#define GEMM_MR 12
#define GEMM_MC 192
/* Bytes of a panel per step of its k loop, in every dtype: 32 columns of fp32, of bf16 pairs, of int8 quads */
#define PANEL_STEP 128

/* Rows [M0, M1) by tiles of GEMM_MR rows, then the last 1-11 rows with MR a constant in each case (the tile's
 * registers are then known at compile time): TILE(MR) runs with `m` at the tile's first row. */
#define ROW_TILES(M0, M1, TILE)                                                              \
    do {                                                                                     \
        Py_ssize_t m = (M0);                                                                 \
        for (; m + GEMM_MR <= (M1); m += GEMM_MR) TILE(GEMM_MR);                             \
        switch ((M1) - m) {                                                                  \
            case 11: TILE(11); break;                                                        \
            case 10: TILE(10); break;                                                        \
            case 9: TILE(9); break;                                                          \
            case 8: TILE(8); break;                                                          \
            case 7: TILE(7); break;                                                          \
            case 6: TILE(6); break;                                                          \
            case 5: TILE(5); break;                                                          \
            case 4: TILE(4); break;                                                          \
            case 3: TILE(3); break;                                                          \
            case 2: TILE(2); break;                                                          \
            case 1: TILE(1); break;                                                          \
        }                                                                                    \
    } while (0)

/* The next panel (`bytes` long, NULL if none), requested while this one is multiplied: the tile at row `m` of a
 * chunk of `rows` asks for its share of it, a k-step's part of that share per step (PANEL_STEP · MR / rows
 * bytes). The panels are one stream in memory, but the first tile of a panel would otherwise wait for it --
 * every weight comes from memory once per call. */
INLINE const char *next_share(const char *next, Py_ssize_t bytes, Py_ssize_t m, Py_ssize_t rows) {
    return next ? next + m * bytes / rows : NULL;
}

/* rows [0, MR) of x against one panel: y[m][0..cols) = b + x_m · panel, cols ≤ 32 (the last panel's fewer) */
INLINE void panel_tile(const int MR, const float *x, Py_ssize_t K, const float *panel, const float *b,
                       float *y, Py_ssize_t ldy, int cols, const char *pf, Py_ssize_t pf_step) {
    f32x16 acc0[GEMM_MR], acc1[GEMM_MR], b0, b1;
    memcpy(&b0, b, sizeof b0);
    memcpy(&b1, b + 16, sizeof b1);
    for (int m = 0; m < MR; m++) {
        acc0[m] = b0;
        acc1[m] = b1;
    }
    for (Py_ssize_t k = 0; k < K; k++) {
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

/* panels [p0, p1) for all M rows, GEMM_MC rows at a time: those rows of x stay in L2 while the panels pass */
static AVX512_TARGET void gemm_panels(const float *x, Py_ssize_t M, Py_ssize_t K, const float *w,
                                      const float *b, float *y, Py_ssize_t N, Py_ssize_t p0, Py_ssize_t p1) {
    for (Py_ssize_t m0 = 0; m0 < M; m0 += GEMM_MC) {
        const Py_ssize_t m1 = m0 + GEMM_MC < M ? m0 + GEMM_MC : M;
        for (Py_ssize_t p = p0; p < p1; p++) {
            const float *panel = w + p * K * PANEL;
            const int cols = (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL);
            float bias[PANEL] = {0};
            if (b) memcpy(bias, b + p * PANEL, sizeof(float) * (size_t)cols);
            float *yp = y + p * PANEL;
            const char *next = p + 1 < p1 ? (const char *)(panel + K * PANEL) : NULL;
            const Py_ssize_t rows = m1 - m0, bytes = K * PANEL * 4;
#define TILE(MR) panel_tile(MR, x + m * K, K, panel, bias, yp + m * N, N, cols,                     \
                            next_share(next, bytes, m - m0, rows), PANEL_STEP * (MR) / rows)
            ROW_TILES(m0, m1, TILE);
#undef TILE
        }
    }
}
#endif

/* linear_f32(x_ptr, panels_ptr, bias_ptr | None, y_ptr, M, K, N, threads, avx2): y (M, N) = x (M, K) · Wᵀ + b,
 * all fp32 and contiguous, W packed into panels (above); on AVX-512, or with `avx2` set on AVX2 + FMA
 * (linear_avx2.c: the same panels, the same result). Threads split the panels. */
ENTRY py_linear_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 9, "linear_f32") < 0) return NULL;
#ifdef HAVE_F32_GEMM
    const float *x = as_ptr(args[0]), *w = as_ptr(args[1]), *b = as_ptr(args[2]);
    float *y = as_ptr(args[3]);
    Py_ssize_t M = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), N = PyLong_AsSsize_t(args[6]);
    long threads = PyLong_AsLong(args[7]), avx2 = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (avx2 ? !avx2_supported() : !avx512_supported()) {
        PyErr_SetString(PyExc_ValueError, avx2 ? "linear_f32: needs AVX2 and FMA" : "linear_f32: needs AVX-512");
        return NULL;
    }
    const Py_ssize_t panels = (N + PANEL - 1) / PANEL;
    int parts = thread_count(panels, M * K * PANEL, threads);
    if (avx2)
        FOR_EACH_BLOCK(panels, parts, { gemm_panels_avx2(x, M, K, w, b, y, N, start, start + count); });
    else
        FOR_EACH_BLOCK(panels, parts, { gemm_panels(x, M, K, w, b, y, N, start, start + count); });
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "linear_f32: not built for this CPU");
    return NULL;
#endif
}

/* ------------------------------------------------------------------------------- bf16 GEMM, packed panels */
/* y (M, N) bf16 = x (M, K) bf16 · Wᵀ + b on AVX-512 BF16, the same tiles as the fp32 GEMM on bf16 dot products:
 * VDPBF16PS adds the products of 16 pairs of bf16 into 16 fp32 sums, so each panel holds its 32 columns' pairs
 * of consecutive k, [p][K/2][32][2] (nn/cpu_kernels.py: pack_bf16_panels), and each row's pair x[m][2k'],
 * x[m][2k'+1] is broadcast as one 32-bit value. Products of bf16 are exact in fp32; the sums are fp32 from the
 * fp32 bias, rounded to bf16 once at the end (to nearest even), as oneDNN's bf16 kernel does; only the
 * summation order differs. K even. Against oneDNN's packed bf16 kernel through torch: 1.03-1.3x per call from
 * 72 to 704 rows, more below (one Zen 5 core). */
#ifdef X86_KERNELS
#define HAVE_BF16_GEMM 1
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline __attribute__((always_inline)) BF16_TARGET void panel_tile_bf16(
        const int MR, const uint16_t *x, Py_ssize_t K, const uint16_t *panel, const float *b, uint16_t *y,
        Py_ssize_t ldy, int cols, const char *pf, Py_ssize_t pf_step) {
    __m512 acc0[GEMM_MR], acc1[GEMM_MR];
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
    for (int m = 0; m < MR; m++) {
        acc0[m] = b0;
        acc1[m] = b1;
    }
    for (Py_ssize_t kp = 0; kp < K / 2; kp++) {
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

static BF16_TARGET void gemm_panels_bf16(const uint16_t *x, Py_ssize_t M, Py_ssize_t K, const uint16_t *w,
                                         const float *b, uint16_t *y, Py_ssize_t N, Py_ssize_t p0,
                                         Py_ssize_t p1) {
    for (Py_ssize_t m0 = 0; m0 < M; m0 += GEMM_MC) {
        const Py_ssize_t m1 = m0 + GEMM_MC < M ? m0 + GEMM_MC : M;
        for (Py_ssize_t p = p0; p < p1; p++) {
            const uint16_t *panel = w + p * K * PANEL;
            const int cols = (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL);
            float bias[PANEL] = {0};
            if (b) memcpy(bias, b + p * PANEL, sizeof(float) * (size_t)cols);
            uint16_t *yp = y + p * PANEL;
            const char *next = p + 1 < p1 ? (const char *)(panel + K * PANEL) : NULL;
            const Py_ssize_t rows = m1 - m0, bytes = K * PANEL * 2;
#define TILE(MR) panel_tile_bf16(MR, x + m * K, K, panel, bias, yp + m * N, N, cols,                \
                                 next_share(next, bytes, m - m0, rows), PANEL_STEP * (MR) / rows)
            ROW_TILES(m0, m1, TILE);
#undef TILE
        }
    }
}
#endif

/* linear_bf16(x_ptr, panels_ptr, bias_f32_ptr | None, y_ptr, M, K, N, threads): y (M, N) bf16 = x (M, K) bf16 ·
 * Wᵀ + b, contiguous, W packed into bf16 pair panels (above), the bias fp32; K even. Threads split the panels. */
ENTRY py_linear_bf16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 8, "linear_bf16") < 0) return NULL;
#ifdef HAVE_BF16_GEMM
    const uint16_t *x = as_ptr(args[0]), *w = as_ptr(args[1]);
    const float *b = as_ptr(args[2]);
    uint16_t *y = as_ptr(args[3]);
    Py_ssize_t M = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), N = PyLong_AsSsize_t(args[6]);
    long threads = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (!bf16dot_supported() || K % 2) {
        PyErr_SetString(PyExc_ValueError, "linear_bf16: needs AVX-512 BF16 and an even K");
        return NULL;
    }
    const Py_ssize_t panels = (N + PANEL - 1) / PANEL;
    int parts = thread_count(panels, M * K * PANEL, threads);
    FOR_EACH_BLOCK(panels, parts, { gemm_panels_bf16(x, M, K, w, b, y, N, start, start + count); });
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "linear_bf16: not built for this CPU");
    return NULL;
#endif
}

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
#define HAVE_VNNI_GEMM 1
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* One tile: MR rows x NB blocks of 16 columns, accumulated over all of K in MR · NB registers. Always inlined
 * with constant MR and NB, so the accumulators are registers and the loops unrolled. */
static inline __attribute__((always_inline)) VNNI_TARGET void vnni_tile(
    const int MR, const int NB, const uint8_t *x, Py_ssize_t K, const int8_t *wp, const int32_t *comp,
    const float *xs, const float *ws, const float *b, float *y, Py_ssize_t ldy, const char *pf,
    Py_ssize_t pf_step) {
    const Py_ssize_t KQ = K / 4;
    __m512i acc[8][8];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_si512();
    for (Py_ssize_t kq = 0; kq < KQ; kq++) {
        __m512i w[8];
        for (int c = 0; c < NB; c++) w[c] = _mm512_loadu_si512(wp + ((Py_ssize_t)c * KQ + kq) * 64);
        if (pf)
            for (Py_ssize_t o = 0; o < pf_step; o += 64) _mm_prefetch(pf + kq * pf_step + o, _MM_HINT_T0);
        for (int r = 0; r < MR; r++) {
            int32_t quad;
            memcpy(&quad, x + r * K + kq * 4, 4);
            const __m512i xb = _mm512_set1_epi32(quad);
            for (int c = 0; c < NB; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xb, w[c]);
        }
    }
    for (int c = 0; c < NB; c++) {
        const __m512i cc = _mm512_loadu_si512(comp + c * 16);
        const __m512 wsc = _mm512_loadu_ps(ws + c * 16);
        const __m512 bc = b ? _mm512_loadu_ps(b + c * 16) : _mm512_setzero_ps();
        for (int r = 0; r < MR; r++) {
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][c], cc)), _mm512_set1_ps(xs[r]));
            v = b ? _mm512_fmadd_ps(v, wsc, bc) : _mm512_mul_ps(v, wsc);
            _mm512_storeu_ps(y + r * ldy + c * 16, v);
        }
    }
}

/* From VNNI_PANEL_ROWS rows on, pairs of blocks are taken as one panel of 32 columns by tiles of 12 rows (24
 * accumulators), as the fp32 and bf16 GEMMs do, GEMM_MC rows at a time: the weights are then reused by many
 * rows and no longer the stream to hide, and the wider tile does twice the multiply-adds per broadcast row of
 * the 8 x 2 one. Against torch._int_mm with its quantize and dequantize passes, per layer of MiniLM's shapes:
 * 1.15-1.7x at 32-128 rows, where the 8 x 2 tiles alone fell to 0.83-1.02x at 128 rows. The same integer sums,
 * the same dequantize: identical outputs. */
#define VNNI_PANEL_ROWS 16
static inline __attribute__((always_inline)) VNNI_TARGET void vnni_panel_tile(
    const int MR, const uint8_t *x, Py_ssize_t K, const int8_t *w0p, const int8_t *w1p, const int32_t *comp,
    const float *xs, const float *ws, const float *b, float *y, Py_ssize_t ldy, const char *pf,
    Py_ssize_t pf_step) {
    __m512i acc0[GEMM_MR], acc1[GEMM_MR];
    for (int r = 0; r < MR; r++) acc0[r] = acc1[r] = _mm512_setzero_si512();
    for (Py_ssize_t kq = 0; kq < K / 4; kq++) {
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

static inline __attribute__((always_inline)) VNNI_TARGET Py_ssize_t vnni_panels(
    const uint8_t *x, Py_ssize_t M, Py_ssize_t K, const int8_t *wp, const int32_t *comp, const float *xs,
    const float *ws, const float *b, float *y, Py_ssize_t N, Py_ssize_t nb0, Py_ssize_t nb1) {
    const Py_ssize_t KQ = K / 4, last = nb0 + (nb1 - nb0) / 2 * 2;
    for (Py_ssize_t m0 = 0; m0 < M; m0 += GEMM_MC) {
        const Py_ssize_t m1 = m0 + GEMM_MC < M ? m0 + GEMM_MC : M;
        for (Py_ssize_t nb = nb0; nb < last; nb += 2) {
            const int8_t *w0p = wp + nb * KQ * 64, *w1p = wp + (nb + 1) * KQ * 64;
            /* the next pair of blocks (the two lie one after the other), as gemm_panels requests its next panel */
            const char *next = nb + 2 < last ? (const char *)(wp + (nb + 2) * KQ * 64) : NULL;
            const Py_ssize_t rows = m1 - m0, bytes = KQ * 128;
#define TILE(MR) vnni_panel_tile(MR, x + m * K, K, w0p, w1p, comp + nb * 16, xs + m, ws + nb * 16,        \
                                 b ? b + nb * 16 : NULL, y + m * N + nb * 16, N,                           \
                                 next_share(next, bytes, m - m0, rows), PANEL_STEP * (MR) / rows)
            ROW_TILES(m0, m1, TILE);
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
        Py_ssize_t r = 0;                                               \
        if ((NB) <= 2) for (; r + 8 <= M; r += 8) TILE(8, NB);          \
        if ((NB) <= 4) for (; r + 4 <= M; r += 4) TILE(4, NB);          \
        for (; r + 2 <= M; r += 2) TILE(2, NB);                         \
        for (; r < M; r++) TILE(1, NB);                                 \
    } while (0)
static VNNI_TARGET void vnni_columns(const uint8_t *x, Py_ssize_t M, Py_ssize_t K, const int8_t *wp,
                                     const int32_t *comp, const float *xs, const float *ws, const float *b,
                                     float *y, Py_ssize_t N, Py_ssize_t nb0, Py_ssize_t nb1) {
    const Py_ssize_t KQ = K / 4;
    const int NB = M >= 8 ? 2 : M >= 2 ? 4 : 8;
    Py_ssize_t nb = nb0;
    if (M >= VNNI_PANEL_ROWS) nb = vnni_panels(x, M, K, wp, comp, xs, ws, b, y, N, nb0, nb1);
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
#undef TILE


#endif
/* linear_int8_vnni(x_ptr, x_dtype, wpacked_ptr, comp_ptr, wscale_ptr, bias_ptr | None, y_ptr, M, K, N,
 * threads): y (M, N) fp32 = the int8 linear layer of x (M, K) fp32 or bf16: x quantized per row (as
 * quantize_rows), times W (N, K)ᵀ packed, dequantized; K % 4 == 0, N % 16 == 0. One call for the whole layer:
 * at a few rows, each call from Python costs about as much as the arithmetic. */
ENTRY py_linear_int8_vnni(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 11, "linear_int8_vnni") < 0) return NULL;
#ifdef HAVE_VNNI_GEMM
    const void *x = as_ptr(args[0]);
    long dtype = PyLong_AsLong(args[1]);
    const int8_t *wp = as_ptr(args[2]);
    const int32_t *comp = as_ptr(args[3]);
    const float *ws = as_ptr(args[4]), *b = as_ptr(args[5]);
    float *y = as_ptr(args[6]);
    Py_ssize_t M = PyLong_AsSsize_t(args[7]), K = PyLong_AsSsize_t(args[8]), N = PyLong_AsSsize_t(args[9]);
    long threads = PyLong_AsLong(args[10]);
    if (PyErr_Occurred()) return NULL;
    if (!vnni_supported() || K % 4 || N % 16) {
        PyErr_SetString(PyExc_ValueError, "linear_int8_vnni: needs AVX-512 VNNI, K % 4 == 0 and N % 16 == 0");
        return NULL;
    }
    /* x quantized per row, then + 128 as unsigned bytes (its sign bit flipped), once for all column blocks */
    uint8_t *xu = PyMem_RawMalloc((size_t)(M * K) + sizeof(float) * (size_t)M);
    if (!xu) return PyErr_NoMemory();
    float *xs = (float *)(xu + M * K);  /* M * K is a multiple of 4: the scales stay aligned */
    if (dtype == BF16)
        quantize_bf16(x, (int8_t *)xu, xs, M, K);
    else
        quantize_f32(x, (int8_t *)xu, xs, M, K);
    for (Py_ssize_t i = 0; i < M * K; i++) xu[i] ^= 0x80u;
    const Py_ssize_t blocks = N / 16;
    /* split the columns: every thread reads its own share of the weights */
    int parts = thread_count(blocks, M * K * 16, threads);
    FOR_EACH_BLOCK(blocks, parts, {
        vnni_columns(xu, M, K, wp, comp, xs, ws, b, y, N, start, start + count);
    });
    PyMem_RawFree(xu);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "linear_int8_vnni: not built for this CPU");
    return NULL;
#endif
}

/* linear_few_rows(x_ptr, w_ptr, bias_ptr | None, y_ptr, M, K, N, dtype, threads): y (M, N) = x (M, K) · Wᵀ + b,
 * all of `dtype` (F32 or BF16) and contiguous, W (N, K); K % 16 == 0. Threads split the columns. */
ENTRY py_linear_few_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 9, "linear_few_rows") < 0) return NULL;
    const void *x = as_ptr(args[0]), *w = as_ptr(args[1]), *b = as_ptr(args[2]);
    void *y = as_ptr(args[3]);
    Py_ssize_t M = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), N = PyLong_AsSsize_t(args[6]);
    long dtype = PyLong_AsLong(args[7]), threads = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (K % 16 || (dtype != F32 && dtype != BF16)) {
        PyErr_SetString(PyExc_ValueError, "linear_few_rows: needs K % 16 == 0 and fp32 or bf16");
        return NULL;
    }
    /* a bf16 layer's x and bias widened to fp32 once (a few KB), not in each of the N / 16 blocks */
    const float *xf = x, *bf = b;
    float *wide = NULL;
    if (dtype == BF16) {
        wide = PyMem_RawMalloc(sizeof(float) * (size_t)(M * K + (b ? N : 0)));
        if (!wide) return PyErr_NoMemory();
        for (Py_ssize_t i = 0; i < M * K; i++) wide[i] = bf16_to_f32(((const uint16_t *)x)[i]);
        if (b)
            for (Py_ssize_t i = 0; i < N; i++) wide[M * K + i] = bf16_to_f32(((const uint16_t *)b)[i]);
        xf = wide;
        bf = b ? wide + M * K : NULL;
    }
    const Py_ssize_t blocks = N / 16;
    int parts = thread_count(blocks, M * K * 16, threads);
    FOR_EACH_BLOCK(blocks, parts, { linear_columns((int)dtype, xf, M, K, w, bf, y, N, start, start + count); });
    if (N % 16) linear_tail((int)dtype, xf, M, K, w, bf, y, N, blocks * 16);
    PyMem_RawFree(wide);
    Py_RETURN_NONE;
}

