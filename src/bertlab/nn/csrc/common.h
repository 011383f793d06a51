/* What the kernel files of bertlab.nn._cpu_kernels share (plain C, no Python; kernels.h is their interface):
 * build switches, float helpers, the exp and lane folds, and the names of the per-level kernels that
 * dispatch.c puts in the tables. The kernels, by family:
 *   rows.c          quantize, dequantize, softmax, RMS norm, Add & Norm, a row's log-sum-exp: one pass over each row
 *   attention.c     a decoding step's attention (one query), short rows in fp32
 *   gemv.c          an fp32 / bf16 linear layer for a decoding step's 1-4 rows: a GEMV over the plain weight
 *   (those three are the portable loops: written in GCC's vector extension, built once per level by
 *   levels_avx2.c and levels_avx512.c, and as they are for the baseline CPU)
 *   attention_bf16.c  short-row attention on AVX-512 BF16 dot products, and on AMX tiles where the CPU has them
 *   linear.c        fp32 and bf16 GEMMs over packed panels (AVX-512, AVX-512 BF16); an int8 GEMM on AVX-512 VNNI
 *   linear_avx2.c   the fp32 and int8 GEMMs again on AVX2 + FMA (int8: AVX-VNNI where present), for CPUs
 *                   without AVX-512
 *   linear_amx.c    the int8 GEMM on AMX tiles, for many rows on CPUs with AMX
 *   search.c        a beam-search step's best candidates (and greedy's argmax), AVX-512 and AVX2
 *   dispatch.c      the CPU's level and each level's table; ops.c the operations (threads, scratch, the int8
 *                   layer's quantize); module.c the Python bindings; bench.c a benchmark in C
 *
 * Why in C: around an int8 GEMM, quantizing its input and dequantizing its output take 6-8 torch element-wise
 * passes over (N, K) and (N, M) tensors (abs, amax, div, round, cast; multiply, addcmul), each reading and
 * writing memory and some allocating fresh buffers; together they cost about a third of an int8 forward
 * pass. Here each is one loop over a row that stays in L1, and the output of the GEMM is dequantized in
 * place. Softmax in bf16 is here too: torch's bf16 softmax widens, computes and narrows in separate passes
 * and was ~17% of an int8 forward pass at BERT's short sequence lengths. And four kernels for shapes the
 * library calls are not built for: an int8 GEMM for up to 128 rows (AVX-512 VNNI), a decoding step's attention
 * (one query per row), and attention per (row, head), register-tiled: in fp32, and on AVX-512 BF16 dot
 * products for bf16 and int8 models.
 *
 * Numbers: quantize and dequantize perform the same float operations in the same order as the torch
 * reference, a multiply-add fused exactly where torch fuses one (elsewhere they have no add to contract), so
 * their results are bit-identical to it. Softmax uses its own exp (Cephes' polynomial, < 2 ulp), so it agrees
 * with torch's to rounding, not bit for bit.
 */
#ifndef BERTLAB_CPU_KERNELS_COMMON_H
#define BERTLAB_CPU_KERNELS_COMMON_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define X86_KERNELS 1
#endif

/* The portable loops are built once per level where GCC can (levels_*.c: `#pragma GCC target`), with their
 * table functions named by VARIANT: name_avx2, name_avx512; built as they are, name_base. */
#if defined(X86_KERNELS) && !defined(__clang__)
#define PORTABLE_LEVELS 1
#endif
#ifndef VARIANT
#define VARIANT(name) name##_base
#define BASE_BUILD 1
#endif

/* The portable loops' helpers are always inlined, so they are built for the instruction set of the loop
 * calling them. */
#define INLINE static inline __attribute__((always_inline))

#if defined(__GNUC__)
#define HIDDEN __attribute__((visibility("hidden")))
#else
#define HIDDEN
#endif

INLINE uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

INLINE float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

INLINE float bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

/* Round to nearest even, as torch's conversion; NaN stays NaN. */
INLINE uint16_t f32_to_bf16(float f) {
    const uint32_t u = bits_of(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)rounded;
}

/* Round to nearest, ties to even (torch.round), for |v| < 2^22: adding and removing 1.5 * 2^23 leaves no
 * fraction bits, and the FPU's default rounding is to nearest even. */
INLINE float round_even(float v) {
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

/* Row reductions. A float max or sum written as one sequential loop may not be reordered (no -ffast-math
 * here), so the compiler would not vectorize it. Maxima are therefore taken over the floats' bits as integers
 * (which may be reordered freely), and sums in 16 independent lanes of a vector (GCC's vector extension). */
#define BLOCK 16
/* max |x[c]|: without its sign bit a float's bits order as its magnitude does (a NaN above every number) */
INLINE float absmax_f32(const float *x, ptrdiff_t n) {
    uint32_t m = 0;
    for (ptrdiff_t c = 0; c < n; c++) {
        uint32_t a = bits_of(x[c]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return float_of(m);
}

INLINE float absmax_bf16(const uint16_t *x, ptrdiff_t n) {
    uint16_t m = 0;
    for (ptrdiff_t c = 0; c < n; c++) {
        uint16_t a = x[c] & 0x7fffu;
        m = a > m ? a : m;
    }
    return bf16_to_f32(m);
}

/* (A float's maximum over its signed-integer keys: as a signed integer, a non-negative float's bits order as
 * its value does, a negative float's in reverse, which flipping its 31 low bits undoes. NaN aside.) */
INLINE int32_t order_key(float f) {
    int32_t i = (int32_t)bits_of(f);
    return i ^ ((i >> 31) & 0x7fffffff);
}

INLINE float from_order_key(int32_t k) { return float_of((uint32_t)(k ^ ((k >> 31) & 0x7fffffff))); }

typedef float f32x16 __attribute__((vector_size(64)));

/* --------------------------------------------------------------------------------------- exp, lane folds */
/* e^x for x <= 0 (a softmax's x - max): e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln2 / 2, and e^r from
 * Cephes' expf polynomial; below -87 (where 2^n would leave the normal range) it is 0, as the exact value
 * rounds to in the float arithmetic that follows. */
INLINE float exp_nonpositive(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    float n = round_even(xc * 1.44269504088896341f);
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return x < -87.0f ? 0.0f : y * two_n;
}

/* Softmax works on a row copied into `tmp`, widened to fp32 and padded with -inf to a whole number of 16-float
 * blocks: every loop below then runs in whole vectors. (Unpadded, a row of 72 or 124 scores left 8-12 columns
 * to scalar tail loops in each of four passes, and those cost as much as the vector part.) */
INLINE ptrdiff_t padded(ptrdiff_t n) { return (n + BLOCK - 1) / BLOCK * BLOCK; }

/* The keys each of the R query rows i0 .. i0 + R - 1 sees, [lo[r], hi[r]) -- every key, or with a->band the
 * local window |i - j| < band -- and the columns [from, to) the tile computes: the `chunk`-key blocks (16 in the
 * fp32 loops, 32 in the bf16 ones) its real rows' windows reach (every block without a band). Rows past the last
 * query get the last one's window. */
INLINE void visible_keys(const Rows *a, ptrdiff_t i0, int R, ptrdiff_t chunk, ptrdiff_t *lo, ptrdiff_t *hi,
                         ptrdiff_t *from, ptrdiff_t *to) {
    const ptrdiff_t keys = a->keys, w = a->band;
    for (int r = 0; r < R; r++) {
        const ptrdiff_t i = i0 + r < a->queries ? i0 + r : a->queries - 1;
        lo[r] = w && i - w + 1 > 0 ? i - w + 1 : 0;
        hi[r] = w && i + w < keys ? i + w : keys;
    }
    *from = lo[0] / chunk * chunk;
    *to = (hi[R - 1] + chunk - 1) / chunk * chunk;
}

/* Lane folds in registers: each step combines lanes l and l + half (half = 8, 4, 2, 1) -- the tree the folds
 * through a stack array took, without its chain of stores and reloads (which was most of a short row's softmax) */
typedef int32_t i32x16 __attribute__((vector_size(64)));
static const i32x16 FOLD[4] = {
    {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
    {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
    {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
    {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}};

INLINE int32_t fold_max_i32(i32x16 v) {
    for (int i = 0; i < 4; i++) {
        const i32x16 s = __builtin_shuffle(v, FOLD[i]);
        const i32x16 greater = v > s;
        v = (v & greater) | (s & ~greater);
    }
    return v[0];
}

INLINE float fold_sum_f32(f32x16 v) {
    for (int i = 0; i < 4; i++) v += __builtin_shuffle(v, FOLD[i]);
    return v[0];
}

/* *mk = the lane-wise maximum of *mk and x's order keys: a running maximum, folded once at the end (INT32_MIN
 * lanes to start) */
INLINE void max_keys(i32x16 *mk, const f32x16 *x) {
    i32x16 bits, key;
    memcpy(&bits, x, sizeof bits);
    key = bits ^ ((bits >> 31) & 0x7fffffff);  /* order_key, lane by lane */
    const i32x16 greater = key > *mk;
    *mk = (key & greater) | (*mk & ~greater);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* exp_nonpositive on 8 lanes at once, its operations lane by lane (the same bits), the two branches as masks.
 * Written per lane, GCC vectorized it for AVX-512 (masked moves) but not for AVX2 ("control flow in loop"),
 * where a softmax then ran scalar: 7.5x the AVX-512 build's time on rows of 128. 8 lanes, not 16: GCC splits a
 * 16-float comparison into scalar ones where the target has no 64-byte vectors. */
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
INLINE f32x8 exp_nonpositive8(f32x8 x) {
    /* The lanes below -87 are 0 in the end whatever is computed for them: they compute e^0 here, where
     * exp_nonpositive's -87 gives 2^-126 times ~0.7, a subnormal product that costs a microcode assist per
     * lane -- every -inf of a padded row and every masked key */
    const i32x8 below = x < -87.0f;  /* (lanes of -1 where true) */
    i32x8 xb;
    memcpy(&xb, &x, sizeof xb);
    xb &= ~below;
    f32x8 xc;
    memcpy(&xc, &xb, sizeof xc);
    const f32x8 n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round_even */
    f32x8 r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    f32x8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const f32x8 y = p * (r * r) + r + 1.0f;
    const i32x8 two_nb = (__builtin_convertvector(n, i32x8) + 127) << 23;
    f32x8 two_n, out;
    memcpy(&two_n, &two_nb, sizeof two_n);
    const f32x8 e = y * two_n;
    i32x8 eb;
    memcpy(&eb, &e, sizeof eb);
    eb &= ~below;  /* 0.0f where x < -87 */
    memcpy(&out, &eb, sizeof out);
    return out;
}

/* fold_sum_f32 of the 16 lanes held as lanes 0-7 and 8-15 */
INLINE float fold_sum_halves(f32x8 lo, f32x8 hi) {
    f32x16 lanes;
    memcpy(&lanes, &lo, sizeof lo);
    memcpy((char *)&lanes + sizeof lo, &hi, sizeof hi);
    return fold_sum_f32(lanes);
}

/* tmp[0:n16] -> e^(tmp - m), returning their sum */
INLINE float exp_sum(float *tmp, ptrdiff_t n16, float m) {
    f32x8 lo = {0}, hi = {0};  /* lanes 0-7 and 8-15 of the 16 lanes' sums */
    for (ptrdiff_t c = 0; c < n16; c += BLOCK) {
        f32x8 x0, x1;
        memcpy(&x0, tmp + c, sizeof x0);
        memcpy(&x1, tmp + c + 8, sizeof x1);
        const f32x8 e0 = exp_nonpositive8(x0 - m), e1 = exp_nonpositive8(x1 - m);
        memcpy(tmp + c, &e0, sizeof e0);
        memcpy(tmp + c + 8, &e1, sizeof e1);
        lo += e0;
        hi += e1;
    }
    return fold_sum_halves(lo, hi);
}
#else
/* tmp[0:n16] -> e^(tmp - m), returning their sum */
INLINE float exp_sum(float *tmp, ptrdiff_t n16, float m) {
    f32x16 lanes = {0};
    for (ptrdiff_t c = 0; c < n16; c += BLOCK) {
        f32x16 e;
        for (int l = 0; l < BLOCK; l++) e[l] = tmp[c + l] = exp_nonpositive(tmp[c + l] - m);
        lanes += e;
    }
    return fold_sum_f32(lanes);
}
#endif

/* tmp[0:n16] (n16 a multiple of BLOCK, padding -inf) -> e^(tmp - max), returning 1 / their sum */
INLINE float exp_normalizer(float *tmp, ptrdiff_t n16) {
#if defined(__AVX2__) && !defined(__AVX512F__)
    /* the running maximum in 8-lane vectors: GCC takes a 16-lane comparison one lane at a time on AVX2 (a
     * maximum is exact, so any grouping of the lanes gives the same one) */
    i32x8 mk = {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
    for (ptrdiff_t c = 0; c < n16; c += 8) {
        i32x8 key;
        memcpy(&key, tmp + c, sizeof key);
        key ^= (key >> 31) & 0x7fffffff;  /* order_key, lane by lane */
        const i32x8 greater = key > mk;
        mk = (key & greater) | (mk & ~greater);
    }
    int32_t best = mk[0];
    for (int l = 1; l < 8; l++) best = mk[l] > best ? mk[l] : best;
    return 1.0f / exp_sum(tmp, n16, from_order_key(best));
#else
    i32x16 mk;
    for (int l = 0; l < BLOCK; l++) mk[l] = INT32_MIN;
    for (ptrdiff_t c = 0; c < n16; c += BLOCK) {
        f32x16 x;
        memcpy(&x, tmp + c, sizeof x);
        max_keys(&mk, &x);
    }
    return 1.0f / exp_sum(tmp, n16, from_order_key(fold_max_i32(mk)));
#endif
}

INLINE float dot_f32(const float *a, const float *b, ptrdiff_t n) {
    f32x16 lanes = {0};
    ptrdiff_t d = 0;
    for (; d + 16 <= n; d += 16) {
        f32x16 x, y;
        memcpy(&x, a + d, sizeof x);
        memcpy(&y, b + d, sizeof y);
        lanes += x * y;
    }
    float sums[16];
    memcpy(sums, &lanes, sizeof sums);
    for (int half = 8; half > 0; half /= 2)
        for (int l = 0; l < half; l++) sums[l] += sums[l + half];
    float sum = sums[0];
    for (; d < n; d++) sum += a[d] * b[d];
    return sum;
}

/* The scores of 16 keys at once: acc[j] holds key j's q·k_j in 16 partial sums (one per 16-float slice of hs);
 * folding the 16 vectors pairwise in halves (a transpose-and-add, 15 shuffle pairs) leaves one vector of the 16
 * totals, where summing each vector's lanes one by one took ~15 dependent additions per key. */
/* acc[j]'s 16 lanes summed, for the 16 j at once, into out[0..15] */
INLINE void fold16(const f32x16 acc[16], float *out) {
    /* lane masks: each step sums lane pairs `width` apart, keeping the keys' order */
    const i32x16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const i32x16 lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const i32x16 lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const i32x16 lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    f32x16 l1[8], l2[4], l3[2];
    for (int i = 0; i < 8; i++)
        l1[i] = __builtin_shuffle(acc[2 * i], acc[2 * i + 1], lo8) + __builtin_shuffle(acc[2 * i], acc[2 * i + 1], lo8 + 8);
    for (int i = 0; i < 4; i++)
        l2[i] = __builtin_shuffle(l1[2 * i], l1[2 * i + 1], lo4) + __builtin_shuffle(l1[2 * i], l1[2 * i + 1], lo4 + 4);
    for (int i = 0; i < 2; i++)
        l3[i] = __builtin_shuffle(l2[2 * i], l2[2 * i + 1], lo2) + __builtin_shuffle(l2[2 * i], l2[2 * i + 1], lo2 + 2);
    const f32x16 total = __builtin_shuffle(l3[0], l3[1], lo1) + __builtin_shuffle(l3[0], l3[1], lo1 + 1);
    memcpy(out, &total, sizeof total);
}


/* ------------------------------------------------------------------------------------------------- GELU */
/* GELU in its exact form (BERT's `gelu`, torch's default): x · Φ(x) = 0.5 x (1 + erf(x / √2)), 16 lanes, applied
 * by the fp32 GEMM to the output blocks it has just stored (the epilogue BL_ACT_GELU), so a layer's activation
 * is neither a call nor a pass over memory of its own. erf(z) ≈ z · P(z²) / Q(z²) with z clamped to [-4, 4]
 * (the rational approximation of XLA's and Eigen's float erf; no exp, so no denormals and no table): against
 * erf in float64 over [-6, 6], at most 4.5e-7 off (7.5 ulp); the GELU at most 1.4e-6 off, 6e-7 relative for
 * x > -1 (torch's own fp32 gelu: 1.2e-6 and 3.7e-7 there). 1 + erf is kept >= 0, so from x ≈ -5.6 on the
 * result is -0.0, as torch's is from x ≈ -5.9 on; +inf gives +inf, -inf and NaN give NaN (torch's fp32 gelu:
 * NaN for both infinities). Integer masks rather than float comparisons (which GCC took lane by lane here),
 * all in the vector extension, so every level computes the same operations and gets the same bits. */
#define splat16(v) ((f32x16){0} + (v))
#define splat16i(v) ((i32x16){0} + (v))

/* *v = GELU(*v), lane by lane (by pointer: a 64-byte vector passed by value changes the ABI without AVX-512) */
INLINE void gelu_f32x16(f32x16 *v) {
    const f32x16 x = *v, z0 = x * splat16(0.70710678118654752f);
    const i32x16 bits = (i32x16)z0;
    /* all ones where |z| > 4 (or NaN): 4.0f's bits less |z|'s, negative -- no overflow, both in [0, 2^31) */
    const i32x16 big = (splat16i(0x40800000) - (bits & splat16i(0x7fffffff))) >> 31;
    const f32x16 z = (f32x16)((bits & ~big) | (((bits & splat16i((int32_t)0x80000000)) | splat16i(0x40800000)) & big));
    const f32x16 z2 = z * z;
    f32x16 p = splat16(-2.72614225801306e-10f);
    p = p * z2 + splat16(2.77068142495902e-08f);
    p = p * z2 + splat16(-2.10102402082508e-06f);
    p = p * z2 + splat16(-5.69250639462346e-05f);
    p = p * z2 + splat16(-7.34990630326855e-04f);
    p = p * z2 + splat16(-2.95459980854025e-03f);
    p = p * z2 + splat16(-1.60960333262415e-02f);
    f32x16 q = splat16(-1.45660718464996e-05f);
    q = q * z2 + splat16(-2.13374055278905e-04f);
    q = q * z2 + splat16(-1.68282697438203e-03f);
    q = q * z2 + splat16(-7.37332916720468e-03f);
    q = q * z2 + splat16(-1.42647390514189e-02f);
    f32x16 t = splat16(1.0f) + (p * z) / q;  /* 1 + erf(x / √2) */
    t = (f32x16)((i32x16)t & ~((i32x16)t >> 31));  /* max(t, 0): a negative t (its sign bit) becomes +0 */
    *v = x * (splat16(0.5f) * t);
}

/* GELU in its tanh form (`gelu_new`, torch's approximate="tanh": GPT-2's, ALBERT's, T5 v1.1's), 16 lanes:
 * 0.5 x (1 + tanh(u)), u = √(2/π) (x + 0.044715 x³), computed as x · σ(2u) = x / (1 + e^(-2u)) -- the same function,
 * without tanh's cancellation near 0 -- with t = e^(-2|u|) from exp_nonpositive's polynomial, 0 from |2u| > 87
 * (below 2^-125, and a huge |x| must not scale it back up): x / (1 + t) for u >= 0, x t / (1 + t) below. Against the formula in
 * float64 over [-10, 10]: within 6e-7, and 1e-6 relative for x > -3 (torch's own fp32 tanh GELU: 4.3e-7 and
 * 1.2e-5; tests/test_nn_cpu_kernels.py). Integer masks and the vector extension only, as gelu_f32x16: every
 * level the same operations, so the same bits. */
INLINE void gelu_tanh_f32x16(f32x16 *v) {
    const f32x16 x = *v;
    const f32x16 u = splat16(0.7978845608028654f) * (x + splat16(0.044715f) * (x * x * x));
    const i32x16 ub = (i32x16)u, mag = ub & splat16i(0x7fffffff), neg = ub >> 31;
    /* -2|u|, clamped at -87 (also for NaN: x then carries it through; t is 0 there in the end) */
    const i32x16 big = (splat16i(0x422e0000) - mag) >> 31;  /* |u| > 43.5 (bits of 43.5f) */
    const f32x16 a = (f32x16)(((i32x16)(splat16(-2.0f) * (f32x16)mag) & ~big) | ((i32x16)splat16(-87.0f) & big));
    /* e^a: a = n ln2 + r, Cephes' expf polynomial for e^r, 2^n from its exponent bits (n in [-126, 0]) */
    const f32x16 n = (a * splat16(1.44269504088896341f) + splat16(12582912.0f)) - splat16(12582912.0f);
    f32x16 r = a - n * splat16(0.693359375f);
    r = r - n * splat16(-2.12194440e-4f);
    f32x16 p = r * splat16(1.9875691500e-4f) + splat16(1.3981999507e-3f);
    p = p * r + splat16(8.3334519073e-3f);
    p = p * r + splat16(4.1665795894e-2f);
    p = p * r + splat16(1.6666665459e-1f);
    p = p * r + splat16(5.0000001201e-1f);
    const f32x16 e = (p * (r * r) + r + splat16(1.0f)) * (f32x16)((__builtin_convertvector(n, i32x16) + 127) << 23);
    const f32x16 t = (f32x16)((i32x16)e & ~big);  /* 0 where |u| > 43.5: x itself, or -0.0 (NaN for -inf) */
    const f32x16 w = (f32x16)(((i32x16)t & neg) | ((i32x16)splat16(1.0f) & ~neg));  /* t where u < 0, else 1 */
    *v = x * (w / (splat16(1.0f) + t));
}

/* ------------------------------------------------------------------------------------------- bf16 lanes */
/* 16 bf16 values as fp32 lanes and back, in the vector extension (a lane-by-lane loop over a vector's elements
 * made GCC keep it in memory: the bf16 GELU pass ran 10x slower than torch's). Widening is exact (the bits in the
 * high half); narrowing rounds to nearest even and keeps a NaN a NaN, as f32_to_bf16. */
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
INLINE void widen16(const uint16_t *h, f32x16 *v) {
    u16x16 b;
    memcpy(&b, h, sizeof b);
    const u32x16 u = __builtin_convertvector(b, u32x16) << 16;
    memcpy(v, &u, sizeof *v);
}
INLINE void narrow16(const f32x16 *v, uint16_t *h) {
    u32x16 u;
    memcpy(&u, v, sizeof u);
    const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const u32x16 nan = (u32x16)((u & 0x7fffffffu) > 0x7f800000u);  /* all ones in a NaN's lane */
    const u16x16 b = __builtin_convertvector((rounded & ~nan) | (((u >> 16) | 0x40u) & nan), u16x16);
    memcpy(h, &b, sizeof b);
}

/* fn over n bf16 in place, 16 lanes at a time (the last block zero-padded): each value widened, fn's fp32
 * result rounded once */
INLINE void map_bf16(uint16_t *y, ptrdiff_t n, void (*fn)(f32x16 *)) {
    f32x16 v;
    ptrdiff_t c = 0;
    for (; c + 16 <= n; c += 16) {
        widen16(y + c, &v);
        fn(&v);
        narrow16(&v, y + c);
    }
    if (c < n) {
        uint16_t tail[16] = {0};
        memcpy(tail, y + c, sizeof(uint16_t) * (size_t)(n - c));
        widen16(tail, &v);
        fn(&v);
        narrow16(&v, tail);
        memcpy(y + c, tail, sizeof(uint16_t) * (size_t)(n - c));
    }
}

/* GELU over `rows` rows of `cols` floats, `ldy` apart: an output block the GEMM has just stored, still in L1 --
 * after the tiles rather than inside them, so their k loops stay the plain GEMM's code */
INLINE void gelu_rows(float *y, ptrdiff_t rows, ptrdiff_t ldy, ptrdiff_t cols) {
    for (ptrdiff_t m = 0; m < rows; m++)
        for (ptrdiff_t c = 0; c < cols; c += 16) {
            f32x16 v = {0};
            if (cols - c >= 16) {  /* (a constant size: a vector load and store, not a call of memcpy) */
                memcpy(&v, y + m * ldy + c, sizeof v);
                gelu_f32x16(&v);
                memcpy(y + m * ldy + c, &v, sizeof v);
            } else {
                memcpy(&v, y + m * ldy + c, sizeof(float) * (size_t)(cols - c));
                gelu_f32x16(&v);
                memcpy(y + m * ldy + c, &v, sizeof(float) * (size_t)(cols - c));
            }
        }
}


/* ------------------------------------------------------------------------------- the per-level kernels */
/* the portable loops, one set per variant (V: a macro naming the variant's function) */
#define DECLARE_PORTABLE(V)                                                                                         \
    HIDDEN void V(quantize_f32)(const float *x, int8_t *q, float *s, ptrdiff_t rows, ptrdiff_t cols);              \
    HIDDEN void V(quantize_bf16)(const uint16_t *x, int8_t *q, float *s, ptrdiff_t rows, ptrdiff_t cols);          \
    HIDDEN void V(dequantize_f32)(const int32_t *acc, float *y, const float *xs, const float *ws, const float *b,   \
                                  ptrdiff_t rows, ptrdiff_t cols);                                                  \
    HIDDEN void V(softmax_f32)(float *x, float *tmp, ptrdiff_t rows, ptrdiff_t cols);                              \
    HIDDEN void V(softmax_bf16)(uint16_t *x, float *tmp, ptrdiff_t rows, ptrdiff_t cols);                          \
    HIDDEN void V(rms_norm_f32)(const float *x, const float *w, float *y, ptrdiff_t rows, ptrdiff_t cols,          \
                                float eps);                                                                         \
    HIDDEN void V(rms_norm_bf16)(const uint16_t *x, const uint16_t *w, uint16_t *y, float *tmp, ptrdiff_t rows,   \
                                 ptrdiff_t cols, float eps);                                                        \
    HIDDEN void V(add_layer_norm_f32)(const float *y, const float *res, const float *w, const float *b,            \
                                      float *out, ptrdiff_t rows, ptrdiff_t cols, float eps);                      \
    HIDDEN void V(add_layer_norm_bf16)(const uint16_t *y, const uint16_t *res, const float *wf, const float *bf,  \
                                       uint16_t *out, float *tmp, ptrdiff_t rows, ptrdiff_t cols, float eps);      \
    HIDDEN void V(row_logsumexp)(const float *x, ptrdiff_t rows, ptrdiff_t cols, float *m, float *lse);            \
    HIDDEN void V(gelu_f32)(float *y, ptrdiff_t rows, ptrdiff_t cols);                                             \
    HIDDEN void V(gelu_bf16)(uint16_t *y, ptrdiff_t n);                                                            \
    HIDDEN void V(gelu_tanh_f32)(float *y, ptrdiff_t n);                                                           \
    HIDDEN void V(gelu_tanh_bf16)(uint16_t *y, ptrdiff_t n);                                                       \
    HIDDEN void V(one_query_heads)(const OneQuery *a, ptrdiff_t first, ptrdiff_t count, float *tmp);               \
    HIDDEN void V(attention_rows_heads)(const Rows *a, ptrdiff_t first, ptrdiff_t count, float *scratch);          \
    HIDDEN void V(relative_rows_heads)(const Rows *a, const RelativeTerms *t, ptrdiff_t first, ptrdiff_t count,    \
                                       float *scratch);                                                            \
    HIDDEN void V(gemv_columns)(int dtype, const float *x, ptrdiff_t M, ptrdiff_t K, const void *w,                \
                                const float *b, void *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1);                \
    HIDDEN void V(rotate_heads_f32)(float *x, ptrdiff_t rows, ptrdiff_t first, ptrdiff_t row_stride,               \
                                    ptrdiff_t heads, ptrdiff_t head_stride, ptrdiff_t hs, const float *cos,         \
                                    const float *sin, ptrdiff_t table);                                         \
    HIDDEN void V(rotate_heads_bf16)(uint16_t *x, ptrdiff_t rows, ptrdiff_t first, ptrdiff_t row_stride,           \
                                     ptrdiff_t heads, ptrdiff_t head_stride, ptrdiff_t hs, const uint16_t *cos,     \
                                     const uint16_t *sin, ptrdiff_t table);
#define NAME_BASE(name) name##_base
#define NAME_AVX2(name) name##_avx2
#define NAME_AVX512(name) name##_avx512
DECLARE_PORTABLE(NAME_BASE)
DECLARE_PORTABLE(NAME_AVX2)
DECLARE_PORTABLE(NAME_AVX512)

/* gemv.c: the last N % 16 columns of a few-rows linear layer, one at a time (built once) */
HIDDEN void gemv_tail(int dtype, const float *x, ptrdiff_t M, ptrdiff_t K, const void *w, const float *b, void *y,
                      ptrdiff_t N, ptrdiff_t n0);

/* the GEMMs, attention and search on one instruction set each (target attributes), x86-64 only */
#define INT8_COLUMNS_ARGS                                                                                       \
    const bl_tuning *tune, const uint8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp, const int32_t *comp, const float *xs,         \
        const float *ws, const float *b, float *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1
HIDDEN void gemm_f32_avx512(const bl_tuning *t, const float *x, ptrdiff_t M, ptrdiff_t K, const float *w,
                            const float *b, float *y, ptrdiff_t N, ptrdiff_t p0, ptrdiff_t p1, int act);
HIDDEN void gemm_f32_avx2(const bl_tuning *t, const float *x, ptrdiff_t M, ptrdiff_t K, const float *w,
                          const float *b, float *y, ptrdiff_t N, ptrdiff_t p0, ptrdiff_t p1, int act);
HIDDEN void gemm_bf16_avx512(const bl_tuning *t, const uint16_t *x, ptrdiff_t M, ptrdiff_t K, const uint16_t *w, const float *b,
                             uint16_t *y, ptrdiff_t N, ptrdiff_t p0, ptrdiff_t p1);
HIDDEN void int8_columns_vnni(INT8_COLUMNS_ARGS);
HIDDEN void int8_columns_avxvnni(INT8_COLUMNS_ARGS);
HIDDEN void int8_columns_avx2(INT8_COLUMNS_ARGS);
HIDDEN void int8_columns_avx2_narrow(INT8_COLUMNS_ARGS);
HIDDEN void int8_columns_amx(const int8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp, const float *xs,
                             const float *ws, const float *b, float *y, ptrdiff_t N, ptrdiff_t nb0, ptrdiff_t nb1);
HIDDEN int amx_int8_granted(void);  /* linear_amx.c: the CPU has AMX-INT8 and the OS gave this process its tiles */
HIDDEN void attention_bf16_heads(const Rows *a, ptrdiff_t first, ptrdiff_t count, uint32_t *scratch);
HIDDEN void attention_amx_heads(const Rows *a, ptrdiff_t first, ptrdiff_t count, uint32_t *scratch);
HIDDEN int beam_topk_input(const float *score, const float *add, const float *mx, const float *lse, ptrdiff_t K,
                           ptrdiff_t V, int keep, float *best, int64_t *index);
HIDDEN int beam_topk_input_avx2(const float *score, const float *add, const float *mx, const float *lse, ptrdiff_t K,
                                ptrdiff_t V, int keep, float *best, int64_t *index);

#endif
