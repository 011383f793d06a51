/* bertlab.nn._cpu_kernels -- the loops around CPU inference's matrix multiplies, in C (optional; the torch
 * code in nn/cpu_kernels.py is the reference, and what runs without this extension).
 *
 * Why in C: around an int8 GEMM, quantizing its input and dequantizing its output take 6-8 torch element-wise
 * passes over (N, K) and (N, M) tensors (abs, amax, div, round, cast; multiply, addcmul), each reading and
 * writing memory and some allocating fresh buffers; together they cost about a third of an int8 forward
 * pass. Here each is one loop over a row that stays in L1, and the output of the GEMM is dequantized in
 * place. Softmax in bf16 is here too: torch's bf16 softmax widens, computes and narrows in separate passes
 * and was ~17% of an int8 forward pass at BERT's short sequence lengths. And four kernels for shapes the
 * library calls are not built for: an int8 GEMM for a few rows (AVX-512 VNNI), a decoding step's attention
 * (one query per row), and attention per (row, head), register-tiled: in fp32, and on AVX-512 BF16 dot
 * products for bf16 and int8 models.
 *
 * Every function takes raw pointers and sizes: nn/cpu_kernels.py checks dtypes, devices, shapes and
 * contiguity before calling, so nothing here re-checks them. The GIL is released while a kernel runs, and rows
 * are split over OpenMP threads (the OpenMP runtime torch itself loaded, so the thread count the caller passes
 * -- torch.get_num_threads() -- means the same pool).
 *
 * Numbers: quantize and dequantize perform the same float operations in the same order as the torch
 * reference, a multiply-add fused exactly where torch fuses one (elsewhere they have no add to contract), so
 * their results are bit-identical to it. Softmax uses its own exp (Cephes' polynomial, < 2 ulp), so it agrees
 * with torch's to rounding, not bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* One build for every x86-64 CPU, with the hot loops compiled again for AVX2+FMA and AVX-512 and picked at
 * load time (GCC's function multiversioning, Linux only); elsewhere the plain build. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* Helpers of the multiversioned loops are always inlined: a helper compiled on its own would be built for the
 * baseline CPU, without the vector instructions of the clone calling it. */
#define INLINE static inline __attribute__((always_inline))

/* Below this many elements a kernel runs on one thread: waking the pool costs more than it saves. */
#define PARALLEL_MIN_ELEMENTS (1 << 15)

enum { F32 = 0, BF16 = 1 };

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
INLINE float absmax_f32(const float *x, Py_ssize_t n) {
    uint32_t m = 0;
    for (Py_ssize_t c = 0; c < n; c++) {
        uint32_t a = bits_of(x[c]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return float_of(m);
}

INLINE float absmax_bf16(const uint16_t *x, Py_ssize_t n) {
    uint16_t m = 0;
    for (Py_ssize_t c = 0; c < n; c++) {
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

/* ------------------------------------------------------------------------------------------- quantize rows */
/* q[r, :] = round(x[r, :] / s[r]), s[r] = max(max|x[r, :]|, 1e-8) / 127: symmetric int8, one scale per row. */
MULTIVERSION
static void quantize_f32(const float *x, int8_t *q, float *s, Py_ssize_t rows, Py_ssize_t cols) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        float amax = absmax_f32(xr, cols);
        float scale = (amax > 1e-8f ? amax : 1e-8f) / 127.0f;
        s[r] = scale;
        for (Py_ssize_t c = 0; c < cols; c++) qr[c] = (int8_t)round_even(xr[c] / scale);
    }
}

MULTIVERSION
static void quantize_bf16(const uint16_t *x, int8_t *q, float *s, Py_ssize_t rows, Py_ssize_t cols) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        float amax = absmax_bf16(xr, cols);
        float scale = (amax > 1e-8f ? amax : 1e-8f) / 127.0f;
        s[r] = scale;
        for (Py_ssize_t c = 0; c < cols; c++) qr[c] = (int8_t)round_even(bf16_to_f32(xr[c]) / scale);
    }
}

/* ----------------------------------------------------------------------------------------- dequantize rows */
/* y[r, c] = (float(acc[r, c]) * xs[r]) * ws[c] + b[c]   (b optional; with b the last two operations are one
 * fused multiply-add, as torch.addcmul computes them), written over acc (same size). */
MULTIVERSION
static void dequantize_f32(const int32_t *acc, float *y, const float *xs, const float *ws, const float *b,
                           Py_ssize_t rows, Py_ssize_t cols) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int32_t *ar = acc + r * cols;
        float *yr = y + r * cols;
        const float sx = xs[r];
        if (b) {
            for (Py_ssize_t c = 0; c < cols; c++) yr[c] = fmaf((float)ar[c] * sx, ws[c], b[c]);
        } else {
            for (Py_ssize_t c = 0; c < cols; c++) yr[c] = ((float)ar[c] * sx) * ws[c];
        }
    }
}

/* ------------------------------------------------------------------------------------------------- softmax */
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
INLINE Py_ssize_t padded(Py_ssize_t n) { return (n + BLOCK - 1) / BLOCK * BLOCK; }

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

/* tmp[0:n16] (n16 a multiple of BLOCK, padding -inf) -> e^(tmp - max), returning 1 / their sum */
INLINE float exp_normalizer(float *tmp, Py_ssize_t n16) {
    i32x16 mk;
    for (int l = 0; l < BLOCK; l++) mk[l] = INT32_MIN;
    for (Py_ssize_t c = 0; c < n16; c += BLOCK) {
        i32x16 bits, key;
        memcpy(&bits, tmp + c, sizeof bits);
        key = bits ^ ((bits >> 31) & 0x7fffffff);  /* order_key, lane by lane */
        const i32x16 greater = key > mk;
        mk = (key & greater) | (mk & ~greater);
    }
    const float m = from_order_key(fold_max_i32(mk));
    f32x16 lanes = {0};
    for (Py_ssize_t c = 0; c < n16; c += BLOCK) {
        f32x16 e;
        for (int l = 0; l < BLOCK; l++) e[l] = tmp[c + l] = exp_nonpositive(tmp[c + l] - m);
        lanes += e;
    }
    return 1.0f / fold_sum_f32(lanes);
}

/* softmax(x[r, :]) in place: p = e^(x - max) / sum, each row through `tmp` (padded(cols) floats) */
MULTIVERSION
static void softmax_f32(float *x, float *tmp, Py_ssize_t rows, Py_ssize_t cols) {
    const Py_ssize_t n16 = padded(cols);
    for (Py_ssize_t r = 0; r < rows; r++) {
        float *xr = x + r * cols;
        for (Py_ssize_t c = 0; c < cols; c++) tmp[c] = xr[c];
        for (Py_ssize_t c = cols; c < n16; c++) tmp[c] = -INFINITY;
        const float inv = exp_normalizer(tmp, n16);
        for (Py_ssize_t c = 0; c < cols; c++) xr[c] = tmp[c] * inv;
    }
}

MULTIVERSION
static void softmax_bf16(uint16_t *x, float *tmp, Py_ssize_t rows, Py_ssize_t cols) {
    const Py_ssize_t n16 = padded(cols);
    for (Py_ssize_t r = 0; r < rows; r++) {
        uint16_t *xr = x + r * cols;
        for (Py_ssize_t c = 0; c < cols; c++) tmp[c] = bf16_to_f32(xr[c]);
        for (Py_ssize_t c = cols; c < n16; c++) tmp[c] = -INFINITY;
        const float inv = exp_normalizer(tmp, n16);
        for (Py_ssize_t c = 0; c < cols; c++) xr[c] = f32_to_bf16(tmp[c] * inv);
    }
}

/* ------------------------------------------------------------------------------- attention, one query */
/* A decoding step: each row has one new query against its cached keys and values. Per (row, head), with
 * T_k keys of hs values:  s_j = scale · q·k_j + add_j,  p = softmax(s),  out = Σ_j p_j v_j.
 * Torch's SDPA spent ~0.4 ms a call on this at T5-small's beam search (32 rows, 8 heads, <= 48 keys): its
 * kernel is built for blocks of many queries. Here each (row, head) is a few hundred multiply-adds. */
INLINE float dot_f32(const float *a, const float *b, Py_ssize_t n) {
    f32x16 lanes = {0};
    Py_ssize_t d = 0;
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

/* ------------------------------------------------------------------------------------------- RMS norm */
/* y[r, :] = w · (x[r, :] · 1/sqrt(mean(x[r, :]²) + eps)), fp32: T5's layer norm, in torch's order of operations
 * (the mean of squares summed in 16 lanes: the same to ~1e-7). One call where torch made six (square, mean,
 * add, rsqrt, two products), each a few microseconds at a decoding step's size. */
MULTIVERSION
static void rms_norm_f32(const float *x, const float *w, float *y, Py_ssize_t rows, Py_ssize_t cols, float eps) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const float inv = 1.0f / sqrtf(dot_f32(xr, xr, cols) / (float)cols + eps);
        for (Py_ssize_t c = 0; c < cols; c++) yr[c] = w[c] * (xr[c] * inv);
    }
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

/* out[j] = q · k_j for the n <= 16 keys k_j = k + j · key_stride (out[n..15] = 0); hs a multiple of 16 */
INLINE void dot16_keys(const float *q, const float *k, Py_ssize_t key_stride, Py_ssize_t hs, float *out, int n) {
    f32x16 acc[16];
    for (int j = 0; j < 16; j++) acc[j] = (f32x16){0};
    for (Py_ssize_t d = 0; d < hs; d += 16) {
        f32x16 x;
        memcpy(&x, q + d, sizeof x);
        for (int j = 0; j < 16; j++) {
            if (j >= n) break;
            f32x16 y;
            memcpy(&y, k + j * key_stride + d, sizeof y);
            acc[j] += x * y;
        }
    }
    fold16(acc, out);
}

/* out[0..NV·16) = Σ_j p[j] · v_j over n keys v_j = v + j · stride: the accumulators stay in registers (NV
 * vectors, twice: even and odd keys in separate chains) */
INLINE void weighted_sum16(const int NV, const float *p, const float *v, Py_ssize_t stride, Py_ssize_t n,
                           float *out) {
    f32x16 even[4] = {{0}}, odd[4] = {{0}};
    Py_ssize_t j = 0;
    for (; j + 2 <= n; j += 2) {
        for (int c = 0; c < NV; c++) {
            f32x16 a, b;
            memcpy(&a, v + j * stride + 16 * c, sizeof a);
            memcpy(&b, v + (j + 1) * stride + 16 * c, sizeof b);
            even[c] += p[j] * a;
            odd[c] += p[j + 1] * b;
        }
    }
    if (j < n)
        for (int c = 0; c < NV; c++) {
            f32x16 a;
            memcpy(&a, v + j * stride + 16 * c, sizeof a);
            even[c] += p[j] * a;
        }
    for (int c = 0; c < NV; c++) {
        const f32x16 sum = even[c] + odd[c];
        memcpy(out + 16 * c, &sum, sizeof sum);
    }
}

/* ------------------------------------------------------------------------------- fp32 linear, few rows */
/* y (M, N) = x (M, K) · Wᵀ + b for a decoding step's few rows, W the layer's own (N, K) row-major weight (no
 * copy of it). oneDNN's packed kernel pads such a call to 8 rows and streamed T5-small's 154 MB of decoder
 * weights at ~20 GB/s (one thread); this reads W once, in memory order, for up to 4 rows of x at a time, at
 * 30 GB/s for 1-2 rows and 23 GB/s for 4 (from 6 rows on, oneDNN is as fast). Sums: two chains of 16 lanes
 * over k, then the lanes folded -- another order than oneDNN's, the same numbers to ~1e-6. K % 16 == 0; the
 * N % 16 last columns one at a time.
 *
 * gemv16: y[m][j] = x_m · w_j (+ b[j]) for the 16 rows w_j = w + j·K and MR (1-4) rows x_m. W is read in memory
 * order, row after row -- one sequential stream, which the hardware prefetcher follows, helped by a request
 * 4 KB ahead (reading the 16 rows side by side, 16 short streams, reached 26 GB/s) -- and the 16 rows' lanes
 * are folded at once at the end. */
INLINE void gemv16(const int MR, const float *x, Py_ssize_t K, const float *w, const float *b, float *y,
                   Py_ssize_t ldy) {
    f32x16 part[4][16];
    for (int j = 0; j < 16; j++) {
        const float *wj = w + j * K;
        f32x16 a0[4] = {{0}}, a1[4] = {{0}};
        Py_ssize_t d = 0;
        for (; d + 32 <= K; d += 32) {
            f32x16 v0, v1;
            memcpy(&v0, wj + d, sizeof v0);
            memcpy(&v1, wj + d + 16, sizeof v1);
            __builtin_prefetch(wj + d + 1024);  /* 4 KB ahead */
            __builtin_prefetch(wj + d + 1040);
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
            memcpy(&v0, wj + d, sizeof v0);
            for (int m = 0; m < MR; m++) {
                f32x16 x0;
                memcpy(&x0, x + m * K + d, sizeof x0);
                a0[m] += x0 * v0;
            }
        }
        for (int m = 0; m < MR; m++) part[m][j] = a0[m] + a1[m];
    }
    for (int m = 0; m < MR; m++) {
        fold16(part[m], y + m * ldy);
        if (b)
            for (int j = 0; j < 16; j++) y[m * ldy + j] += b[j];
    }
}

MULTIVERSION
static void linear_f32_columns(const float *x, Py_ssize_t M, Py_ssize_t K, const float *w, const float *b,
                               float *y, Py_ssize_t N, Py_ssize_t nb0, Py_ssize_t nb1) {
    for (Py_ssize_t nb = nb0; nb < nb1; nb++) {
        const float *wb = w + nb * 16 * K, *bb = b ? b + nb * 16 : NULL;
        Py_ssize_t m = 0;
        for (; m + 4 <= M; m += 4) gemv16(4, x + m * K, K, wb, bb, y + m * N + nb * 16, N);
        switch (M - m) {
            case 3: gemv16(3, x + m * K, K, wb, bb, y + m * N + nb * 16, N); break;
            case 2: gemv16(2, x + m * K, K, wb, bb, y + m * N + nb * 16, N); break;
            case 1: gemv16(1, x + m * K, K, wb, bb, y + m * N + nb * 16, N); break;
        }
    }
}

MULTIVERSION
static void linear_f32_tail(const float *x, Py_ssize_t M, Py_ssize_t K, const float *w, const float *b, float *y,
                            Py_ssize_t N, Py_ssize_t n0) {
    for (Py_ssize_t m = 0; m < M; m++)
        for (Py_ssize_t n = n0; n < N; n++) y[m * N + n] = dot_f32(x + m * K, w + n * K, K) + (b ? b[n] : 0.0f);
}

/* strides in elements, [0] row, [1] head, [2] position (q and out: one position); the last dimension is
 * contiguous. `add` (scores' additive mask and bias) may broadcast over rows or heads (stride 0) or be NULL. */
typedef struct {
    const float *q, *k, *v, *add;
    float *out;
    Py_ssize_t qs[2], ks[3], vs[3], adds[2];
    Py_ssize_t heads, hs, keys;
    Py_ssize_t group;  /* rows of q per row of k and v: beams of one input share its encoder's keys and values */
    float scale;
} OneQuery;

MULTIVERSION
static void one_query_heads(const OneQuery *a, Py_ssize_t first, Py_ssize_t count, float *tmp) {
    const Py_ssize_t n16 = padded(a->keys);
    for (Py_ssize_t task = first; task < first + count; task++) {
        const Py_ssize_t b = task / a->heads, h = task % a->heads;
        const float *q = a->q + b * a->qs[0] + h * a->qs[1];
        const float *k = a->k + b / a->group * a->ks[0] + h * a->ks[1];
        const float *v = a->v + b / a->group * a->vs[0] + h * a->vs[1];
        const float *add = a->add ? a->add + b * a->adds[0] + h * a->adds[1] : NULL;
        Py_ssize_t j = 0;
        if (a->hs % 16 == 0)
            for (; j < a->keys; j += 16)
                dot16_keys(q, k + j * a->ks[2], a->ks[2], a->hs, tmp + j, a->keys - j < 16 ? (int)(a->keys - j) : 16);
        for (; j < a->keys; j++) tmp[j] = dot_f32(q, k + j * a->ks[2], a->hs);
        for (j = 0; j < a->keys; j++) tmp[j] = a->scale * tmp[j] + (add ? add[j] : 0.0f);
        for (Py_ssize_t j = a->keys; j < n16; j++) tmp[j] = -INFINITY;
        const float inv = exp_normalizer(tmp, n16);
        for (j = 0; j < a->keys; j++) tmp[j] *= inv;
        float *out = a->out + (b * a->heads + h) * a->hs;
        switch (a->hs) {
            case 16: weighted_sum16(1, tmp, v, a->vs[2], a->keys, out); break;
            case 32: weighted_sum16(2, tmp, v, a->vs[2], a->keys, out); break;
            case 48: weighted_sum16(3, tmp, v, a->vs[2], a->keys, out); break;
            case 64: weighted_sum16(4, tmp, v, a->vs[2], a->keys, out); break;
            default:
                for (Py_ssize_t d = 0; d < a->hs; d++) out[d] = 0.0f;
                for (Py_ssize_t j = 0; j < a->keys; j++) {
                    const float *vj = v + j * a->vs[2];
                    for (Py_ssize_t d = 0; d < a->hs; d++) out[d] += tmp[j] * vj[d];
                }
        }
    }
}

/* ------------------------------------------------------------------------------ attention, short rows */
/* Attention of a few dozen queries per (row, head), fp32: a short input, or a lone request. At these sizes
 * batched matmuls spend most of their time per call, not per flop (MiniLM, one 72-token row: ~180 us a layer
 * through SDPA or bmm for ~8 Mflop). Here each (row, head) is three register-tiled loops over data in L1:
 *   S = scale · Q Kᵀ + add      4 queries x NB·16 keys of accumulators, K transposed once per head
 *   P = softmax(S)              per row, as softmax_rows
 *   O = P V                     4 queries x hs in accumulators (hs a multiple of 16, at most 64) */
typedef struct {
    const void *q, *k, *v, *add;  /* `dtype` elements: F32 here; F32 or BF16 for attention_bf16 below */
    void *out;  /* (B, T_q, heads, hs) contiguous, `dtype` */
    Py_ssize_t qs[3], ks[3], vs[3], adds[3];  /* strides: row, head, position (0: broadcast) */
    Py_ssize_t heads, hs, queries, keys, group;
    float scale;
    int dtype;
} Rows;

/* S[r, j0 .. j0 + 16·NB) for 4 query rows q[r] (hs each) against kt (hs x n: K transposed) */
INLINE void qk_tile(const int NB, const float *const q[4], const float *kt, Py_ssize_t n, Py_ssize_t j0,
                    Py_ssize_t hs, float *S) {
    f32x16 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = (f32x16){0};
    for (Py_ssize_t d = 0; d < hs; d++) {
        f32x16 kv[4];
        for (int c = 0; c < NB; c++) memcpy(&kv[c], kt + d * n + j0 + 16 * c, sizeof kv[c]);
        for (int r = 0; r < 4; r++) {
            const float qd = q[r][d];
            for (int c = 0; c < NB; c++) acc[r][c] += qd * kv[c];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) memcpy(S + r * n + j0 + 16 * c, &acc[r][c], sizeof acc[r][c]);
}

/* O[r] = Σ_j P[r, j] v_j for 4 rows, hs = 16 · HB */
INLINE void pv_tile(const int HB, const float *P, Py_ssize_t n, const float *v, Py_ssize_t v_step,
                    Py_ssize_t keys, float *const o[4]) {
    f32x16 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < HB; c++) acc[r][c] = (f32x16){0};
    for (Py_ssize_t j = 0; j < keys; j++) {
        f32x16 vv[4];
        for (int c = 0; c < HB; c++) memcpy(&vv[c], v + j * v_step + 16 * c, sizeof vv[c]);
        for (int r = 0; r < 4; r++) {
            const float p = P[r * n + j];
            for (int c = 0; c < HB; c++) acc[r][c] += p * vv[c];
        }
    }
    for (int r = 0; r < 4; r++)
        if (o[r])
            for (int c = 0; c < HB; c++) memcpy(o[r] + 16 * c, &acc[r][c], sizeof acc[r][c]);
}

/* dst[i · dst_stride + j] = src[j · src_stride + i] for a 16 x 16 block, rows j >= rows of src read as zeros: in
 * registers, four stages that each exchange blocks of half the previous width between row pairs (64 two-source
 * shuffles for 256 floats, where element by element took 256 strided stores and was ~15% of a short row's
 * attention) */
INLINE void transpose16(const float *src, Py_ssize_t src_stride, Py_ssize_t rows, float *dst, Py_ssize_t dst_stride) {
    static const i32x16 lo[4] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
        {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
        {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
        {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
    static const i32x16 hi[4] = {
        {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
        {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
        {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
        {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
    f32x16 r[16];
    for (int j = 0; j < 16; j++) {
        r[j] = (f32x16){0};
        if (j < rows) memcpy(&r[j], src + j * src_stride, sizeof r[j]);
    }
    for (int stage = 0, w = 8; stage < 4; stage++, w /= 2)
        for (int i = 0; i < 16; i++)
            if (!(i & w)) {
                const f32x16 a = r[i], b = r[i + w];
                r[i] = __builtin_shuffle(a, b, lo[stage]);
                r[i + w] = __builtin_shuffle(a, b, hi[stage]);
            }
    for (int i = 0; i < 16; i++) memcpy(dst + i * dst_stride, &r[i], sizeof r[i]);
}

/* scratch: hs · n (K transposed) + 4 · n (scores) + hs (a zero query row) floats, n = padded(keys) */
MULTIVERSION
static void attention_rows_heads(const Rows *a, Py_ssize_t first, Py_ssize_t count, float *scratch) {
    const Py_ssize_t n = padded(a->keys), hs = a->hs;
    float *kt = scratch, *S = scratch + hs * n, *zero = S + 4 * n;
    for (Py_ssize_t d = 0; d < hs; d++) zero[d] = 0.0f;
    for (Py_ssize_t task = first; task < first + count; task++) {
        const Py_ssize_t b = task / a->heads, h = task % a->heads;
        const float *q = (const float *)a->q + b * a->qs[0] + h * a->qs[1];
        const float *k = (const float *)a->k + b / a->group * a->ks[0] + h * a->ks[1];
        const float *v = (const float *)a->v + b / a->group * a->vs[0] + h * a->vs[1];
        const float *add = a->add ? (const float *)a->add + b * a->adds[0] + h * a->adds[1] : NULL;
        for (Py_ssize_t j0 = 0; j0 < n; j0 += 16)
            for (Py_ssize_t d0 = 0; d0 < hs; d0 += 16)
                transpose16(k + j0 * a->ks[2] + d0, a->ks[2], a->keys - j0, kt + d0 * n + j0, n);
        for (Py_ssize_t i0 = 0; i0 < a->queries; i0 += 4) {
            const float *qr[4];
            float *orow[4];
            for (int r = 0; r < 4; r++) {
                const int real = i0 + r < a->queries;
                qr[r] = real ? q + (i0 + r) * a->qs[2] : zero;
                orow[r] = real ? (float *)a->out + ((b * a->queries + i0 + r) * a->heads + h) * hs : NULL;
            }
            Py_ssize_t j0 = 0;
            for (; j0 + 64 <= n; j0 += 64) qk_tile(4, qr, kt, n, j0, hs, S);
            switch ((n - j0) / 16) {
                case 3: qk_tile(3, qr, kt, n, j0, hs, S); break;
                case 2: qk_tile(2, qr, kt, n, j0, hs, S); break;
                case 1: qk_tile(1, qr, kt, n, j0, hs, S); break;
                default: break;
            }
            for (int r = 0; r < 4 && i0 + r < a->queries; r++) {
                float *row = S + r * n;
                const float *ar = add ? add + (i0 + r) * a->adds[2] : NULL;
                for (Py_ssize_t j = 0; j < a->keys; j++) row[j] = a->scale * row[j] + (ar ? ar[j] : 0.0f);
                for (Py_ssize_t j = a->keys; j < n; j++) row[j] = -INFINITY;
                const float inv = exp_normalizer(row, n);
                for (Py_ssize_t j = 0; j < a->keys; j++) row[j] *= inv;
            }
            switch (hs / 16) {
                case 1: pv_tile(1, S, n, v, a->vs[2], a->keys, orow); break;
                case 2: pv_tile(2, S, n, v, a->vs[2], a->keys, orow); break;
                case 3: pv_tile(3, S, n, v, a->vs[2], a->keys, orow); break;
                default: pv_tile(4, S, n, v, a->vs[2], a->keys, orow); break;
            }
        }
    }
}

/* --------------------------------------------------------------------------------- int8 GEMM for few rows */
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
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
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

static int vnni_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

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
    const int NB, const uint32_t *q2, const uint32_t *kp, Py_ssize_t jb0, Py_ssize_t hp, float *S, Py_ssize_t n) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_ps();
    for (Py_ssize_t p = 0; p < hp; p++) {
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
    const int HB, const uint32_t *p2, Py_ssize_t n2, const uint32_t *vp, Py_ssize_t hs, Py_ssize_t pairs,
    __m512 acc[4][4]) {
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < HB; c++) acc[r][c] = _mm512_setzero_ps();
    for (Py_ssize_t jp = 0; jp < pairs; jp++) {
        __m512bh vv[4];
        for (int c = 0; c < HB; c++) vv[c] = (__m512bh)_mm512_loadu_si512(vp + jp * hs + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)p2[r * n2 + jp]);
            for (int c = 0; c < HB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vv[c]);
        }
    }
}

/* dst[0 .. n) = src[0 .. n) as bf16 (rounded to nearest even, as torch's conversion); n a multiple of 16 */
static inline __attribute__((always_inline)) BF16DOT_TARGET void bf16_row(const char *src, int dtype, Py_ssize_t n,
                                                                          uint16_t *dst) {
    if (dtype == BF16) {
        memcpy(dst, src, (size_t)n * 2);
        return;
    }
    for (Py_ssize_t c = 0; c < n; c += 16)
        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)src + c)));
}

/* row[0 .. n) (n a multiple of 16) -> e^(row - max), returning 1 / their sum. A shorter exp than
 * exp_normalizer's, for probabilities that are rounded to bf16 next (8 bits): e^x = 2^t, t = x·log2(e), as
 * 2^(t - round(t)) by a degree-4 polynomial (relative error 5.9e-5 at most over [-100, 0], against bf16's
 * 2e-3 half-ulp) scaled by
 * 2^round(t) in one VSCALEFPS; x clamped at -100 so the padding's -inf gives 0, not NaN. */
static inline __attribute__((always_inline)) BF16DOT_TARGET float exp_normalizer_bf16(float *row, Py_ssize_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(row + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), floor = _mm512_set1_ps(-100.0f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 c1 = _mm512_set1_ps(0.693147180559945f), c2 = _mm512_set1_ps(0.240226506959101f),
                 c3 = _mm512_set1_ps(0.0555041086648216f), c4 = _mm512_set1_ps(0.00961812910762848f),
                 one = _mm512_set1_ps(1.0f);
    __m512 sum = _mm512_setzero_ps();
    for (Py_ssize_t j = 0; j < n; j += 16) {
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
                                                                               Py_ssize_t keys, Py_ssize_t n,
                                                                               float scale) {
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (Py_ssize_t j = 0; j < n; j += 16) {
        const Py_ssize_t left = keys - j;
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
static BF16DOT_TARGET void attention_bf16_heads(const Rows *a, Py_ssize_t first, Py_ssize_t count,
                                                uint32_t *scratch) {
    /* keys padded to a multiple of 32: each probability row goes to bf16 32 at a time */
    const Py_ssize_t n = (a->keys + 31) / 32 * 32, hs = a->hs, hp = hs / 2, n2 = n / 2, pairs = (a->keys + 1) / 2;
    const int dt = a->dtype;
    const Py_ssize_t esize = dt == BF16 ? 2 : 4;
    uint32_t *kp = scratch, *vp = kp + n * hp, *p2 = vp + n * hp, *q2 = p2 + 4 * n2;
    float *S = (float *)(q2 + 4 * hp);
    uint16_t *kb = (uint16_t *)(S + 4 * n), *vb = kb + n * hs;  /* K and V rows in bf16, zero past the keys */
    memset(kp, 0, sizeof(uint32_t) * (size_t)(n * hs));  /* kp and vp: the padding keys stay zero */
    memset(kb, 0, sizeof(uint16_t) * (size_t)(2 * n * hs));
    for (Py_ssize_t task = first; task < first + count; task++) {
        const Py_ssize_t b = task / a->heads, h = task % a->heads;
        const char *q = (const char *)a->q + (b * a->qs[0] + h * a->qs[1]) * esize;
        const char *k = (const char *)a->k + (b / a->group * a->ks[0] + h * a->ks[1]) * esize;
        const char *v = (const char *)a->v + (b / a->group * a->vs[0] + h * a->vs[1]) * esize;
        const char *add = a->add ? (const char *)a->add + (b * a->adds[0] + h * a->adds[1]) * esize : NULL;
        for (Py_ssize_t j = 0; j < a->keys; j++) {
            bf16_row(k + j * a->ks[2] * esize, dt, hs, kb + j * hs);
            bf16_row(v + j * a->vs[2] * esize, dt, hs, vb + j * hs);
        }
        for (Py_ssize_t j = 0; j < a->keys; j++) {  /* kp: 16 keys' pairs side by side */
            const uint32_t *w = (const uint32_t *)(kb + j * hs);
            uint32_t *dst = kp + (j / 16) * hp * 16 + j % 16;
            for (Py_ssize_t p = 0; p < hp; p++) dst[p * 16] = w[p];
        }
        for (Py_ssize_t jp = 0; jp < pairs; jp++) {  /* vp: two keys' bf16 interleaved per dimension */
            const uint16_t *r0 = vb + 2 * jp * hs, *r1 = r0 + hs;  /* past the last key: zero rows */
            for (Py_ssize_t c = 0; c < hs; c += 16) {
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + c)));
                const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + c)));
                _mm512_storeu_si512(vp + jp * hs + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
        for (Py_ssize_t i0 = 0; i0 < a->queries; i0 += 4) {
            const int real = a->queries - i0 < 4 ? (int)(a->queries - i0) : 4;
            for (int r = 0; r < 4; r++)  /* q2 row r: the query's bf16, read as pairs */
                bf16_row(q + (i0 + (r < real ? r : 0)) * a->qs[2] * esize, dt, hs, (uint16_t *)(q2 + r * hp));
            Py_ssize_t jb = 0;
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
                for (Py_ssize_t j = 0; j < n; j += 32) {  /* p2: the row times 1 / sum, as pairs of bf16 */
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
                const Py_ssize_t at = ((b * a->queries + i0 + r) * a->heads + h) * hs;
                for (Py_ssize_t c = 0; c < hs / 16; c++) {
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

static int bf16dot_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}
#define HAVE_BF16DOT 1

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
static AVX512F_TARGET int beam_topk_input(const float *score, const float *add, Py_ssize_t K, Py_ssize_t V,
                                          int keep, float *best, int64_t *index) {
    int n = 0;
    __mmask16 nan = 0;
    for (Py_ssize_t k = 0; k < K; k++) {
        const float *row = score + k * V;
        const __m512 a = _mm512_set1_ps(add[k]);
        for (Py_ssize_t v0 = 0; v0 < V; v0 += 16) {
            const __mmask16 valid = V - v0 >= 16 ? 0xffff : (__mmask16)((1u << (V - v0)) - 1);
            const __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(valid, row + v0), a);
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

static int avx512_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
}
#define HAVE_BEAM_TOPK 1
#else
static int vnni_supported(void) { return 0; }
static int bf16dot_supported(void) { return 0; }
static int avx512_supported(void) { return 0; }
#endif

/* ------------------------------------------------------------------------------------------ Python entries */
/* Each kernel splits its rows into one block per thread; a block of rows is a plain call of the loops above. */
static int block_of(Py_ssize_t rows, int part, int parts, Py_ssize_t *start, Py_ssize_t *count) {
    Py_ssize_t per = rows / parts, extra = rows % parts;
    *start = part * per + (part < extra ? part : extra);
    *count = per + (part < extra ? 1 : 0);
    return *count > 0;
}

static int thread_count(Py_ssize_t rows, Py_ssize_t cols, long requested) {
    if (requested < 1 || rows < 2 || rows * cols < PARALLEL_MIN_ELEMENTS) return 1;
    return (int)(requested < rows ? requested : rows);
}

/* Runs BODY once per block of `total` items split `parts` ways, one block per OpenMP thread, without the GIL;
 * BODY sees the block's `part`, `start` and `count`. */
#ifdef _OPENMP
#define PARALLEL_FOR _Pragma("omp parallel for num_threads(parts) schedule(static) if (parts > 1)")
#else
#define PARALLEL_FOR
#endif
#define FOR_EACH_BLOCK(total, parts, BODY)                                  \
    do {                                                                    \
        Py_BEGIN_ALLOW_THREADS                                              \
        PARALLEL_FOR                                                        \
        for (int part = 0; part < (parts); part++) {                        \
            Py_ssize_t start, count;                                        \
            if (block_of((total), part, (parts), &start, &count)) { BODY; } \
        }                                                                   \
        Py_END_ALLOW_THREADS                                                \
    } while (0)

/* FOR_EACH_BLOCK with `per_part` elements of TYPE scratch for each block, at `scratch + part * per_part`;
 * returns MemoryError from the calling entry when it cannot be allocated. */
#define FOR_EACH_BLOCK_WITH_SCRATCH(TYPE, per_part, total, parts, BODY)                                \
    do {                                                                                                \
        TYPE *scratch = PyMem_RawMalloc(sizeof(TYPE) * (size_t)(per_part) * (size_t)(parts));           \
        if (!scratch) return PyErr_NoMemory();                                                          \
        FOR_EACH_BLOCK(total, parts, BODY);                                                             \
        PyMem_RawFree(scratch);                                                                         \
    } while (0)

static int parse(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, const char *name) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, expected, nargs);
        return -1;
    }
    return 0;
}

static void *as_ptr(PyObject *o) { return o == Py_None ? NULL : PyLong_AsVoidPtr(o); }

/* quantize_rows(x_ptr, x_dtype, q_ptr, scale_ptr, rows, cols, threads) */
static PyObject *py_quantize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 7, "quantize_rows") < 0) return NULL;
    void *x = as_ptr(args[0]);
    long dtype = PyLong_AsLong(args[1]);
    int8_t *q = as_ptr(args[2]);
    float *s = as_ptr(args[3]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[4]), cols = PyLong_AsSsize_t(args[5]);
    long threads = PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    int parts = thread_count(rows, cols, threads);
    FOR_EACH_BLOCK(rows, parts, {
        if (dtype == BF16)
            quantize_bf16((const uint16_t *)x + start * cols, q + start * cols, s + start, count, cols);
        else
            quantize_f32((const float *)x + start * cols, q + start * cols, s + start, count, cols);
    });
    Py_RETURN_NONE;
}

/* dequantize_rows(acc_ptr, y_ptr, xscale_ptr, wscale_ptr, bias_ptr | None, rows, cols, threads): fp32 out */
static PyObject *py_dequantize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 8, "dequantize_rows") < 0) return NULL;
    const int32_t *acc = as_ptr(args[0]);
    float *y = as_ptr(args[1]);
    const float *xs = as_ptr(args[2]), *ws = as_ptr(args[3]), *b = as_ptr(args[4]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[5]), cols = PyLong_AsSsize_t(args[6]);
    long threads = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    int parts = thread_count(rows, cols, threads);
    FOR_EACH_BLOCK(rows, parts, {
        dequantize_f32(acc + start * cols, y + start * cols, xs + start, ws, b, count, cols);
    });
    Py_RETURN_NONE;
}

/* softmax_rows(x_ptr, dtype, rows, cols, threads): in place over contiguous rows */
static PyObject *py_softmax_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 5, "softmax_rows") < 0) return NULL;
    void *x = as_ptr(args[0]);
    long dtype = PyLong_AsLong(args[1]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[2]), cols = PyLong_AsSsize_t(args[3]);
    long threads = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 1 || cols < 1) Py_RETURN_NONE;
    int parts = thread_count(rows, cols, threads);
    const Py_ssize_t row_floats = padded(cols);
    FOR_EACH_BLOCK_WITH_SCRATCH(float, row_floats, rows, parts, {
        if (dtype == BF16)
            softmax_bf16((uint16_t *)x + start * cols, scratch + part * row_floats, count, cols);
        else
            softmax_f32((float *)x + start * cols, scratch + part * row_floats, count, cols);
    });
    Py_RETURN_NONE;
}

/* rms_norm_rows(x_ptr, w_ptr, y_ptr, rows, cols, eps, threads): fp32, contiguous; see rms_norm_f32 */
static PyObject *py_rms_norm_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 7, "rms_norm_rows") < 0) return NULL;
    const float *x = as_ptr(args[0]), *w = as_ptr(args[1]);
    float *y = as_ptr(args[2]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[3]), cols = PyLong_AsSsize_t(args[4]);
    const float eps = (float)PyFloat_AsDouble(args[5]);
    long threads = PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 1 || cols < 1) Py_RETURN_NONE;
    int parts = thread_count(rows, cols, threads);
    FOR_EACH_BLOCK(rows, parts, { rms_norm_f32(x + start * cols, w, y + start * cols, count, cols, eps); });
    Py_RETURN_NONE;
}

/* linear_int8_few_rows(x_ptr, x_dtype, wpacked_ptr, comp_ptr, wscale_ptr, bias_ptr | None, y_ptr, M, K, N,
 * threads): y (M, N) fp32 = the int8 linear layer of x (M, K) fp32 or bf16: x quantized per row (as
 * quantize_rows), times W (N, K)ᵀ packed, dequantized; K % 4 == 0, N % 16 == 0. One call for the whole layer:
 * at a few rows, each call from Python costs about as much as the arithmetic. */
static PyObject *py_linear_int8_few_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 11, "linear_int8_few_rows") < 0) return NULL;
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
        PyErr_SetString(PyExc_ValueError, "linear_int8_few_rows: needs AVX-512 VNNI, K % 4 == 0 and N % 16 == 0");
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
    PyErr_SetString(PyExc_RuntimeError, "linear_int8_few_rows: not built for this CPU");
    return NULL;
#endif
}

/* linear_f32_few_rows(x_ptr, w_ptr, bias_ptr | None, y_ptr, M, K, N, threads): y (M, N) = x (M, K) · Wᵀ + b,
 * all fp32 and contiguous, W (N, K); K % 16 == 0. Threads split the columns. */
static PyObject *py_linear_f32_few_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 8, "linear_f32_few_rows") < 0) return NULL;
    const float *x = as_ptr(args[0]), *w = as_ptr(args[1]), *b = as_ptr(args[2]);
    float *y = as_ptr(args[3]);
    Py_ssize_t M = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), N = PyLong_AsSsize_t(args[6]);
    long threads = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (K % 16) {
        PyErr_SetString(PyExc_ValueError, "linear_f32_few_rows: needs K % 16 == 0");
        return NULL;
    }
    const Py_ssize_t blocks = N / 16;
    int parts = thread_count(blocks, M * K * 16, threads);
    FOR_EACH_BLOCK(blocks, parts, { linear_f32_columns(x, M, K, w, b, y, N, start, start + count); });
    if (N % 16) linear_f32_tail(x, M, K, w, b, y, N, blocks * 16);
    Py_RETURN_NONE;
}

/* beam_topk(score_ptr, add_ptr, best_ptr, index_ptr, B, K, V, keep, threads) -> whether a sum was NaN: score
 * (B·K, V) and add (B·K,) fp32, best (B, keep) fp32 and index (B, keep) int64 written; see beam_topk_input.
 * Threads split the inputs. */
static PyObject *py_beam_topk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 9, "beam_topk") < 0) return NULL;
#ifdef HAVE_BEAM_TOPK
    const float *score = as_ptr(args[0]), *add = as_ptr(args[1]);
    float *best = as_ptr(args[2]);
    int64_t *index = as_ptr(args[3]);
    Py_ssize_t B = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), V = PyLong_AsSsize_t(args[6]);
    long keep = PyLong_AsLong(args[7]), threads = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (!avx512_supported() || keep < 1 || keep > K * V) {
        PyErr_SetString(PyExc_ValueError, "beam_topk: needs AVX-512 and 1 <= keep <= K * V");
        return NULL;
    }
    int parts = thread_count(B, K * V, threads), nan = 0;
    FOR_EACH_BLOCK(B, parts, {
        for (Py_ssize_t b = start; b < start + count; b++)
            if (beam_topk_input(score + b * K * V, add + b * K, K, V, (int)keep, best + b * keep, index + b * keep))
                nan = 1;  /* (any thread may set it; none clears it) */
    });
    return PyBool_FromLong(nan);
#else
    PyErr_SetString(PyExc_RuntimeError, "beam_topk: not built for this CPU");
    return NULL;
#endif
}

/* attention_one_query(q, q_strides(2), k, k_strides(3), v, v_strides(3), add | None, add_strides(2), out,
 * rows, heads, hs, keys, scale, threads, group): fp32; see OneQuery */
static PyObject *py_attention_one_query(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 22, "attention_one_query") < 0) return NULL;
    OneQuery a;
    a.q = as_ptr(args[0]);
    a.qs[0] = PyLong_AsSsize_t(args[1]), a.qs[1] = PyLong_AsSsize_t(args[2]);
    a.k = as_ptr(args[3]);
    for (int i = 0; i < 3; i++) a.ks[i] = PyLong_AsSsize_t(args[4 + i]);
    a.v = as_ptr(args[7]);
    for (int i = 0; i < 3; i++) a.vs[i] = PyLong_AsSsize_t(args[8 + i]);
    a.add = as_ptr(args[11]);
    a.adds[0] = PyLong_AsSsize_t(args[12]), a.adds[1] = PyLong_AsSsize_t(args[13]);
    a.out = as_ptr(args[14]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[15]);
    a.heads = PyLong_AsSsize_t(args[16]), a.hs = PyLong_AsSsize_t(args[17]), a.keys = PyLong_AsSsize_t(args[18]);
    a.scale = (float)PyFloat_AsDouble(args[19]);
    long threads = PyLong_AsLong(args[20]);
    a.group = PyLong_AsSsize_t(args[21]);
    if (PyErr_Occurred()) return NULL;
    if (a.group < 1) {
        PyErr_SetString(PyExc_ValueError, "attention_one_query: group < 1");
        return NULL;
    }
    const Py_ssize_t tasks = rows * a.heads;
    if (tasks < 1 || a.keys < 1) Py_RETURN_NONE;
    int parts = thread_count(tasks, a.keys * a.hs, threads);
    const Py_ssize_t row_floats = padded(a.keys);
    FOR_EACH_BLOCK_WITH_SCRATCH(float, row_floats, tasks, parts, {
        one_query_heads(&a, start, count, scratch + part * row_floats);
    });
    Py_RETURN_NONE;
}

/* The operands both attention entries take, from 25 arguments: q, q_strides(3), k, k_strides(3), v,
 * v_strides(3), add | None, add_strides(3), out, rows, heads, hs, queries, keys, scale, threads, group; hs a
 * multiple of 16 up to 64. Returns -1 with the exception set. */
static int parse_rows(PyObject *const *args, const char *name, int dtype, Rows *a, Py_ssize_t *rows,
                      long *threads) {
    a->dtype = dtype;
    a->q = as_ptr(args[0]);
    for (int i = 0; i < 3; i++) a->qs[i] = PyLong_AsSsize_t(args[1 + i]);
    a->k = as_ptr(args[4]);
    for (int i = 0; i < 3; i++) a->ks[i] = PyLong_AsSsize_t(args[5 + i]);
    a->v = as_ptr(args[8]);
    for (int i = 0; i < 3; i++) a->vs[i] = PyLong_AsSsize_t(args[9 + i]);
    a->add = as_ptr(args[12]);
    for (int i = 0; i < 3; i++) a->adds[i] = PyLong_AsSsize_t(args[13 + i]);
    a->out = as_ptr(args[16]);
    *rows = PyLong_AsSsize_t(args[17]);
    a->heads = PyLong_AsSsize_t(args[18]), a->hs = PyLong_AsSsize_t(args[19]);
    a->queries = PyLong_AsSsize_t(args[20]), a->keys = PyLong_AsSsize_t(args[21]);
    a->scale = (float)PyFloat_AsDouble(args[22]);
    *threads = PyLong_AsLong(args[23]);
    a->group = PyLong_AsSsize_t(args[24]);
    if (PyErr_Occurred()) return -1;
    if ((dtype != F32 && dtype != BF16) || a->group < 1 || a->hs % 16 || a->hs > 64 || a->hs < 16) {
        PyErr_Format(PyExc_ValueError, "%s: needs fp32 or bf16, group >= 1 and hs a multiple of 16 up to 64", name);
        return -1;
    }
    return 0;
}

/* attention_rows(the 25 operands of parse_rows): fp32; see Rows */
static PyObject *py_attention_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 25, "attention_rows") < 0) return NULL;
    Rows a;
    Py_ssize_t rows;
    long threads;
    if (parse_rows(args, "attention_rows", F32, &a, &rows, &threads) < 0) return NULL;
    const Py_ssize_t tasks = rows * a.heads;
    if (tasks < 1 || a.keys < 1 || a.queries < 1) Py_RETURN_NONE;
    int parts = thread_count(tasks, a.queries * a.keys * a.hs, threads);
    const Py_ssize_t n = padded(a.keys), per_part = a.hs * n + 4 * n + a.hs;
    FOR_EACH_BLOCK_WITH_SCRATCH(float, per_part, tasks, parts, {
        attention_rows_heads(&a, start, count, scratch + part * per_part);
    });
    Py_RETURN_NONE;
}

/* attention_bf16(dtype, the 25 operands of parse_rows): AVX-512 BF16 dot products; see attention_bf16_heads */
static PyObject *py_attention_bf16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 26, "attention_bf16") < 0) return NULL;
#ifdef HAVE_BF16DOT
    Rows a;
    Py_ssize_t rows;
    long threads;
    const long dtype = PyLong_AsLong(args[0]);
    if (PyErr_Occurred() || parse_rows(args + 1, "attention_bf16", (int)dtype, &a, &rows, &threads) < 0) return NULL;
    if (!bf16dot_supported()) {
        PyErr_SetString(PyExc_ValueError, "attention_bf16: this CPU has no AVX-512 BF16");
        return NULL;
    }
    const Py_ssize_t tasks = rows * a.heads;
    if (tasks < 1 || a.keys < 1 || a.queries < 1) Py_RETURN_NONE;
    int parts = thread_count(tasks, a.queries * a.keys * a.hs, threads);
    const Py_ssize_t n = (a.keys + 31) / 32 * 32, per_part = 2 * n * a.hs + 6 * n + 2 * a.hs + 16;
    FOR_EACH_BLOCK_WITH_SCRATCH(uint32_t, per_part, tasks, parts, {
        attention_bf16_heads(&a, start, count, scratch + part * per_part);
    });
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_ValueError, "attention_bf16: not built for this CPU");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"quantize_rows", (PyCFunction)(void (*)(void))py_quantize_rows, METH_FASTCALL,
     "quantize_rows(x_ptr, x_dtype, q_ptr, scale_ptr, rows, cols, threads): symmetric int8 per row"},
    {"dequantize_rows", (PyCFunction)(void (*)(void))py_dequantize_rows, METH_FASTCALL,
     "dequantize_rows(acc_ptr, y_ptr, xscale_ptr, wscale_ptr, bias_ptr, rows, cols, threads)"},
    {"softmax_rows", (PyCFunction)(void (*)(void))py_softmax_rows, METH_FASTCALL,
     "softmax_rows(x_ptr, dtype, rows, cols, threads): softmax over each contiguous row, in place"},
    {"attention_one_query", (PyCFunction)(void (*)(void))py_attention_one_query, METH_FASTCALL,
     "attention_one_query(q, 2 strides, k, 3 strides, v, 3 strides, add, 2 strides, out, rows, heads, hs, keys, "
     "scale, threads, group)"},
    {"attention_rows", (PyCFunction)(void (*)(void))py_attention_rows, METH_FASTCALL,
     "attention_rows(q, 3 strides, k, 3 strides, v, 3 strides, add, 3 strides, out, rows, heads, hs, queries, "
     "keys, scale, threads, group)"},
    {"attention_bf16", (PyCFunction)(void (*)(void))py_attention_bf16, METH_FASTCALL,
     "attention_bf16(dtype, q, 3 strides, k, 3 strides, v, 3 strides, add, 3 strides, out, rows, heads, hs, "
     "queries, keys, scale, threads, group): AVX-512 BF16 dot products"},
    {"beam_topk", (PyCFunction)(void (*)(void))py_beam_topk, METH_FASTCALL,
     "beam_topk(score, add, best, index, B, K, V, keep, threads): a beam step's best candidates per input"},
    {"rms_norm_rows", (PyCFunction)(void (*)(void))py_rms_norm_rows, METH_FASTCALL,
     "rms_norm_rows(x, w, y, rows, cols, eps, threads): T5's RMS norm over each contiguous row, fp32"},
    {"linear_f32_few_rows", (PyCFunction)(void (*)(void))py_linear_f32_few_rows, METH_FASTCALL,
     "linear_f32_few_rows(x, w, bias, y, M, K, N, threads): y = x Wᵀ + b, W (N, K) as nn.Linear keeps it"},
    {"linear_int8_few_rows", (PyCFunction)(void (*)(void))py_linear_int8_few_rows, METH_FASTCALL,
     "linear_int8_few_rows(x, x_dtype, wpacked, comp, wscale, bias, y, M, K, N, threads): AVX-512 VNNI"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernels_module = {
    PyModuleDef_HEAD_INIT, "_cpu_kernels", "Fused element-wise loops of CPU inference (optional accelerator).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__cpu_kernels(void) {
    PyObject *m = PyModule_Create(&kernels_module);
    if (m && PyModule_AddIntConstant(m, "vnni", vnni_supported()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (m && PyModule_AddIntConstant(m, "avx512", avx512_supported()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (m && PyModule_AddIntConstant(m, "bf16dot", bf16dot_supported()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (m && PyModule_AddIntConstant(m, "openmp",
#ifdef _OPENMP
                                     1
#else
                                     0
#endif
                                     ) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
