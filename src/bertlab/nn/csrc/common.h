/* bertlab.nn._cpu_kernels -- the loops around CPU inference's matrix multiplies, in C (optional; the torch
 * code in nn/cpu_kernels.py is the reference, and what runs without this extension). This header holds what
 * every file of the extension shares: build switches, float helpers, the exp and lane folds, threading and
 * argument parsing. The kernels, by family:
 *   rows.c       quantize, dequantize, softmax, RMS norm: one pass over each row
 *   attention.c  a decoding step's attention (one query), short rows in fp32, and on AVX-512 BF16 dot products
 *   linear.c     fp32 and bf16 GEMMs over packed panels (AVX-512, AVX-512 BF16); an int8 GEMM on
 *                AVX-512 VNNI (up to 128 rows); for a decoding step's 1-4 rows an fp32 / bf16 GEMV
 *   linear_avx2.c the fp32 and int8 GEMMs again on AVX2 + FMA (int8: AVX-VNNI where present), for CPUs
 *                without AVX-512
 *   linear_amx.c the int8 GEMM on AMX tiles, for many rows on CPUs with AMX
 *   search.c     a beam-search step's best candidates (and greedy's argmax)
 *   module.c     the Python module: its entries and what the CPU supports
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
#ifndef BERTLAB_CPU_KERNELS_H
#define BERTLAB_CPU_KERNELS_H

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

/* *mk = the lane-wise maximum of *mk and x's order keys: a running maximum, folded once at the end (INT32_MIN
 * lanes to start) */
INLINE void max_keys(i32x16 *mk, const f32x16 *x) {
    i32x16 bits, key;
    memcpy(&bits, x, sizeof bits);
    key = bits ^ ((bits >> 31) & 0x7fffffff);  /* order_key, lane by lane */
    const i32x16 greater = key > *mk;
    *mk = (key & greater) | (*mk & ~greater);
}

/* tmp[0:n16] -> e^(tmp - m), returning their sum */
INLINE float exp_sum(float *tmp, Py_ssize_t n16, float m) {
    f32x16 lanes = {0};
    for (Py_ssize_t c = 0; c < n16; c += BLOCK) {
        f32x16 e;
        for (int l = 0; l < BLOCK; l++) e[l] = tmp[c + l] = exp_nonpositive(tmp[c + l] - m);
        lanes += e;
    }
    return fold_sum_f32(lanes);
}

/* tmp[0:n16] (n16 a multiple of BLOCK, padding -inf) -> e^(tmp - max), returning 1 / their sum */
INLINE float exp_normalizer(float *tmp, Py_ssize_t n16) {
    i32x16 mk;
    for (int l = 0; l < BLOCK; l++) mk[l] = INT32_MIN;
    for (Py_ssize_t c = 0; c < n16; c += BLOCK) {
        f32x16 x;
        memcpy(&x, tmp + c, sizeof x);
        max_keys(&mk, &x);
    }
    return 1.0f / exp_sum(tmp, n16, from_order_key(fold_max_i32(mk)));
}

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

/* What this CPU runs, asked once per call of an entry (GCC's cached cpuid) */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define X86_KERNELS 1
static inline int vnni_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}
static inline int bf16dot_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}
static inline int avx512_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
}
static inline int avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static inline int avxvnni_supported(void) {
    __builtin_cpu_init();
    return avx2_supported() && __builtin_cpu_supports("avxvnni");
}
#else
static inline int vnni_supported(void) { return 0; }
static inline int bf16dot_supported(void) { return 0; }
static inline int avx512_supported(void) { return 0; }
static inline int avx2_supported(void) { return 0; }
static inline int avxvnni_supported(void) { return 0; }
#endif

/* ------------------------------------------------------------------------------------ the Python entries' parts */
/* Each kernel splits its rows into one block per thread; a block of rows is a plain call of its loops. */
static inline int block_of(Py_ssize_t rows, int part, int parts, Py_ssize_t *start, Py_ssize_t *count) {
    Py_ssize_t per = rows / parts, extra = rows % parts;
    *start = part * per + (part < extra ? part : extra);
    *count = per + (part < extra ? 1 : 0);
    return *count > 0;
}

static inline int thread_count(Py_ssize_t rows, Py_ssize_t cols, long requested) {
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

static inline int parse(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, const char *name) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, expected, nargs);
        return -1;
    }
    return 0;
}

static inline void *as_ptr(PyObject *o) { return o == Py_None ? NULL : PyLong_AsVoidPtr(o); }


/* Shared between the files, not exported from the module */
#if defined(__GNUC__)
#define HIDDEN __attribute__((visibility("hidden")))
#else
#define HIDDEN
#endif

/* rows.c's quantizers, which linear.c's int8 GEMM runs on its input: x (rows, cols) fp32 or bf16 -> q int8 and
 * one scale per row */
HIDDEN void quantize_f32(const float *x, int8_t *q, float *s, Py_ssize_t rows, Py_ssize_t cols);
HIDDEN void quantize_bf16(const uint16_t *x, int8_t *q, float *s, Py_ssize_t rows, Py_ssize_t cols);

/* The Python entries (METH_FASTCALL), one file each family; module.c lists them */
#define ENTRY HIDDEN PyObject *
#define DECLARE(name) ENTRY name(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
DECLARE(py_quantize_rows);
DECLARE(py_dequantize_rows);
DECLARE(py_softmax_rows);
DECLARE(py_rms_norm_rows);
DECLARE(py_add_layer_norm_rows);
DECLARE(py_attention_one_query);
DECLARE(py_attention_rows);
DECLARE(py_attention_bf16);
DECLARE(py_linear_int8_vnni);
DECLARE(py_linear_few_rows);
DECLARE(py_linear_f32);
DECLARE(py_linear_bf16);
DECLARE(py_linear_int8_avx2);
DECLARE(py_linear_int8_amx);

/* linear_avx2.c's fp32 GEMM over panels [p0, p1), which linear.c's entry runs where asked for AVX2 */
HIDDEN void gemm_panels_avx2(const float *x, Py_ssize_t M, Py_ssize_t K, const float *w, const float *b, float *y,
                             Py_ssize_t N, Py_ssize_t p0, Py_ssize_t p1);

/* linear_amx.c: whether this CPU has AMX-INT8 and the OS gave this process the tile state (asked once) */
HIDDEN int amx_int8_supported(void);
DECLARE(py_beam_topk);

#endif
