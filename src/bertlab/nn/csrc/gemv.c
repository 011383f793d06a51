/* An fp32 / bf16 linear layer for a decoding step's 1-4 rows: a GEMV over the plain weight (see common.h).
 * Portable loops: built once per level (levels_*.c). */
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

/* *f = 16 weights from w[i..i+16), of dtype WBF16 ? bf16 : fp32, as floats (bf16: its bits in the high half) */
INLINE void load16(f32x16 *f, const void *w, ptrdiff_t i, const int WBF16) {
    if (WBF16) {
        u16x16 h;
        memcpy(&h, (const uint16_t *)w + i, sizeof h);
        const u32x16 u = __builtin_convertvector(h, u32x16) << 16;
        memcpy(f, &u, sizeof *f);
    } else {
        memcpy(f, (const float *)w + i, sizeof *f);
    }
}

/* y[at + j] = out[j] (+ b[j]), j < 16, in the layer's dtype (bf16: rounded once) */
INLINE void store16(const float *out, const float *b, void *y, ptrdiff_t at, const int WBF16) {
    for (int j = 0; j < 16; j++) {
        const float v = b ? out[j] + b[j] : out[j];
        if (WBF16)
            ((uint16_t *)y)[at + j] = f32_to_bf16(v);
        else
            ((float *)y)[at + j] = v;
    }
}

INLINE void gemv16_v16(const int MR, const int WBF16, const float *x, ptrdiff_t K, const void *w, const float *b,
                       void *y, ptrdiff_t ldy) {
    const ptrdiff_t size = WBF16 ? 2 : 4;
    f32x16 part[4][16];
    for (int j = 0; j < 16; j++) {
        const char *wj = (const char *)w + j * K * size;
        f32x16 a0[4] = {{0}}, a1[4] = {{0}};
        ptrdiff_t d = 0;
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
        store16(out, b, y, m * ldy, WBF16);
    }
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* Below AVX-512 GCC keeps gemv16_v16's 16-float vectors on the stack and moves them through general registers
 * lane by lane, and takes fold16's shuffles apart into scalar inserts: the level avx2's build read ~8 GB/s of
 * weights at one row. For 1-2 rows this is the same arithmetic, lane for lane (the same bits), on 8-float halves
 * held in registers: each 16-float accumulator is two 8-float ones (2 rows: 8 accumulators and 4 weight vectors
 * of AVX2's 16 registers), ~13 GB/s at one row. 3-4 rows (16 accumulators) keep the 16-float form: two passes
 * of two rows over each row of w measured slower. The fold is fold16's, in its order:
 *   h[j][t] = acc[j][t] + acc[j][t + 8]   (t < 8)     s[j][t] = h[j][t] + h[j][t + 4]   (t < 4)
 *   u[j][t] = s[j][t] + s[j][t + 2]       (t < 2)     out[j]  = u[j][0] + u[j][1] */
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

/* *f = 8 weights from w[i..i+8), of dtype WBF16 ? bf16 : fp32, as floats */
INLINE void load8(f32x8 *f, const void *w, ptrdiff_t i, const int WBF16) {
    if (WBF16) {
        u16x8 h;
        memcpy(&h, (const uint16_t *)w + i, sizeof h);
        const u32x8 u = __builtin_convertvector(h, u32x8) << 16;
        memcpy(f, &u, sizeof *f);
    } else {
        memcpy(f, (const float *)w + i, sizeof *f);
    }
}

/* out[0..15] = h[j]'s 8 lanes summed, in fold16's order (its first step, acc's halves, is the caller's) */
INLINE void fold16_x8(const f32x8 h[16], float *out) {
    const i32x8 half_lo = {0, 1, 2, 3, 8, 9, 10, 11}, half_hi = {4, 5, 6, 7, 12, 13, 14, 15};
    const i32x8 pair_lo = {0, 1, 8, 9, 4, 5, 12, 13}, pair_hi = {2, 3, 10, 11, 6, 7, 14, 15};
    const i32x8 even = {0, 2, 8, 10, 4, 6, 12, 14}, odd = {1, 3, 9, 11, 5, 7, 13, 15};
    const i32x8 keys = {0, 4, 1, 5, 2, 6, 3, 7};  /* the last step leaves keys 0 2 4 6 1 3 5 7 */
    f32x8 p[8], q[4];
    for (int i = 0; i < 8; i++)  /* keys 2i, 2i + 1: [s(2i) | s(2i + 1)] */
        p[i] = __builtin_shuffle(h[2 * i], h[2 * i + 1], half_lo)
               + __builtin_shuffle(h[2 * i], h[2 * i + 1], half_hi);
    for (int i = 0; i < 4; i++)  /* keys 4i..4i + 3: [u(4i) u(4i + 2) | u(4i + 1) u(4i + 3)] */
        q[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], pair_lo)
               + __builtin_shuffle(p[2 * i], p[2 * i + 1], pair_hi);
    for (int i = 0; i < 2; i++) {
        const f32x8 r = __builtin_shuffle(q[2 * i], q[2 * i + 1], even)
                        + __builtin_shuffle(q[2 * i], q[2 * i + 1], odd);
        const f32x8 o = __builtin_shuffle(r, keys);
        memcpy(out + 8 * i, &o, sizeof o);
    }
}

/* *h0, *h1 = the h of rows x_0, x_1 (MR: 1-2) against w's row wj: gemv16_v16's chains a0 (k from d) and a1 (from
 * d + 16) as 8-float halves, summed as gemv16_v16 then fold16's first step sum them */
INLINE void gemv_row_x8(const int MR, const int WBF16, const float *x, ptrdiff_t K, const char *wj, f32x8 *h0,
                        f32x8 *h1) {
    const ptrdiff_t size = WBF16 ? 2 : 4;
    const float *x1 = x + (MR > 1 ? K : 0);
    /* named, not arrays indexed by m: GCC kept the arrays in memory */
    f32x8 p0 = {0}, p1 = {0}, p2 = {0}, p3 = {0}, q0 = {0}, q1 = {0}, q2 = {0}, q3 = {0};
    ptrdiff_t d = 0;
    for (; d + 32 <= K; d += 32) {
        f32x8 v0, v1, v2, v3, xv[4];
        load8(&v0, wj, d, WBF16);
        load8(&v1, wj, d + 8, WBF16);
        load8(&v2, wj, d + 16, WBF16);
        load8(&v3, wj, d + 24, WBF16);
        __builtin_prefetch(wj + d * size + 4096);  /* 4 KB ahead */
        if (!WBF16) __builtin_prefetch(wj + d * size + 4096 + 64);
        memcpy(xv, x + d, sizeof xv);
        p0 += xv[0] * v0;  /* a0, lanes 0-7 */
        p1 += xv[1] * v1;  /* a0, lanes 8-15 */
        p2 += xv[2] * v2;  /* a1, lanes 0-7 */
        p3 += xv[3] * v3;  /* a1, lanes 8-15 */
        if (MR > 1) {
            memcpy(xv, x1 + d, sizeof xv);
            q0 += xv[0] * v0;
            q1 += xv[1] * v1;
            q2 += xv[2] * v2;
            q3 += xv[3] * v3;
        }
    }
    if (d < K) {  /* K % 32 == 16 */
        f32x8 v0, v1, xv[2];
        load8(&v0, wj, d, WBF16);
        load8(&v1, wj, d + 8, WBF16);
        memcpy(xv, x + d, sizeof xv);
        p0 += xv[0] * v0;
        p1 += xv[1] * v1;
        if (MR > 1) {
            memcpy(xv, x1 + d, sizeof xv);
            q0 += xv[0] * v0;
            q1 += xv[1] * v1;
        }
    }
    /* part = a0 + a1, then its two halves added */
    *h0 = (p0 + p2) + (p1 + p3);
    if (MR > 1) *h1 = (q0 + q2) + (q1 + q3);
}

INLINE void gemv16(const int MR, const int WBF16, const float *x, ptrdiff_t K, const void *w, const float *b,
                   void *y, ptrdiff_t ldy) {
    const ptrdiff_t size = WBF16 ? 2 : 4;
    if (MR > 2) {
        gemv16_v16(MR, WBF16, x, K, w, b, y, ldy);
        return;
    }
    f32x8 h[2][16];
    for (int j = 0; j < 16; j++) {
        const char *wj = (const char *)w + j * K * size;
        gemv_row_x8(MR, WBF16, x, K, wj, &h[0][j], &h[1][j]);
    }
    for (int m = 0; m < MR; m++) {
        float out[16];
        fold16_x8(h[m], out);
        store16(out, b, y, m * ldy, WBF16);
    }
}
#else
#define gemv16 gemv16_v16
#endif

#define GEMV_BLOCK(BF)                                                                                          \
    do {                                                                                                       \
        const char *wb = (const char *)w + nb * 16 * K * (BF ? 2 : 4);                                         \
        char *yb = (char *)y + nb * 16 * (BF ? 2 : 4);                                                         \
        const ptrdiff_t row_bytes = N * (BF ? 2 : 4);                                                          \
        ptrdiff_t m = 0;                                                                                       \
        for (; m + 4 <= M; m += 4) gemv16(4, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N);               \
        switch (M - m) {                                                                                       \
            case 3: gemv16(3, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N); break;                         \
            case 2: gemv16(2, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N); break;                         \
            case 1: gemv16(1, BF, x + m * K, K, wb, bb, yb + m * row_bytes, N); break;                         \
        }                                                                                                      \
    } while (0)

/* Column blocks [nb0, nb1) of 16; x (M, K) and b fp32 (a bf16 layer's widened by the entry), W and y of the
 * layer's dtype */
HIDDEN void VARIANT(gemv_columns)(int dtype, const float *x, ptrdiff_t M, ptrdiff_t K, const void *w, const float *b,
                           void *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1) {
    for (ptrdiff_t nb = nb0; nb < nb1; nb++) {
        const float *bb = b ? b + nb * 16 : NULL;
        if (dtype == BF16)
            GEMV_BLOCK(1);
        else
            GEMV_BLOCK(0);
    }
}
#undef GEMV_BLOCK

#ifdef BASE_BUILD
/* (built once, for the baseline CPU: a few columns) */
HIDDEN void gemv_tail(int dtype, const float *x, ptrdiff_t M, ptrdiff_t K, const void *w, const float *b,
                        void *y, ptrdiff_t N, ptrdiff_t n0) {
    for (ptrdiff_t m = 0; m < M; m++)
        for (ptrdiff_t n = n0; n < N; n++) {
            float sum = b ? b[n] : 0.0f;
            for (ptrdiff_t k = 0; k < K; k++)
                sum += x[m * K + k] * (dtype == BF16 ? bf16_to_f32(((const uint16_t *)w)[n * K + k])
                                                      : ((const float *)w)[n * K + k]);
            if (dtype == BF16)
                ((uint16_t *)y)[m * N + n] = f32_to_bf16(sum);
            else
                ((float *)y)[m * N + n] = sum;
        }
}
#endif
