/* A benchmark of the kernels from C, without Python or torch: a kernel timed on its own, at any level this CPU
 * reaches, through the same tables and operations the Python module runs (kernels.h). Not part of the
 * extension; built by hand, from the repository's root:
 *
 *   cc -O3 -std=c99 -ffp-contract=fast -fopenmp -o bench_kernels \
 *       $(ls src/bertlab/nn/csrc/*.c | grep -v /module.c) -lm
 *   ./bench_kernels [--level avx2] [--threads 2] [--rows 128] [--k 384] [--n 1536] [--ms 300] [--check]
 *       [--tune f32_rows,f32_block,f32_prefetch,int8_panel_rows,split,few_prefetch]
 *
 * Prints, per kernel, the best time of one call and its rate over repeated calls of about `--ms` milliseconds.
 * --check instead runs every kernel at every level this CPU reaches, on the same inputs, and exits 1 unless
 * each level's outputs are the bits the tests hold them to: the fp32 GEMM, the int8 layer and quantize the same
 * at every level and under another blocking (kernels.h: bl_tuning), softmax the same at avx2 and above. --tune
 * times the kernels under another blocking than the level's default. */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint32_t seed = 12345;
static float uniform(void) { /* in [-1, 1) */
    seed = seed * 1664525u + 1013904223u;
    return (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
}

static uint16_t to_bf16(float f) { /* round to nearest even (no NaN here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void *alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* The operands of one layer: x (M, K), W (N, K) and its packings (nn/cpu_kernels.py: pack_f32_panels,
 * pack_bf16_panels, pack_int8_weight), the bias */
typedef struct {
    ptrdiff_t M, K, N;
    float *x, *w, *b, *panels, *y;
    uint16_t *xb, *pairs, *yb;
    int8_t *wq;
    int32_t *comp;
    float *ws;
} Layer;

static Layer make_layer(ptrdiff_t M, ptrdiff_t K, ptrdiff_t N) {
    Layer l = {M, K, N};
    const ptrdiff_t P = (N + 31) / 32;
    l.x = alloc(sizeof(float) * M * K);
    l.w = alloc(sizeof(float) * N * K);
    l.b = alloc(sizeof(float) * N);
    l.y = alloc(sizeof(float) * M * (N > K ? N : K));  /* (softmax and quantize's scales use it too) */
    l.panels = alloc(sizeof(float) * P * K * 32);
    l.xb = alloc(2 * M * K);
    l.pairs = alloc(2 * P * K * 32);
    l.yb = alloc(2 * M * (N > K ? N : K));  /* (quantize's int8 too) */
    l.wq = alloc(N * K);
    l.comp = alloc(sizeof(int32_t) * N);
    l.ws = alloc(sizeof(float) * N);
    for (ptrdiff_t i = 0; i < M * K; i++) l.xb[i] = to_bf16(l.x[i] = 3.0f * uniform());
    for (ptrdiff_t i = 0; i < N * K; i++) l.w[i] = 0.05f * uniform();
    for (ptrdiff_t i = 0; i < N; i++) l.b[i] = uniform();
    for (ptrdiff_t n = 0; n < N; n++)
        for (ptrdiff_t k = 0; k < K; k++) {
            const float v = l.w[n * K + k];
            l.panels[(n / 32 * K + k) * 32 + n % 32] = v;
            if (K % 2 == 0) l.pairs[((n / 32 * (K / 2) + k / 2) * 32 + n % 32) * 2 + k % 2] = to_bf16(v);
        }
    for (ptrdiff_t n = 0; n < N; n++) { /* per-column int8, as Int8Linear quantizes its weight */
        float amax = 1e-8f;
        for (ptrdiff_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(l.w[n * K + k]));
        l.ws[n] = amax / 127.0f;
        int32_t sum = 0;
        for (ptrdiff_t k = 0; k < K; k++) {
            const int8_t q = (int8_t)lrintf(l.w[n * K + k] / l.ws[n]);
            sum += q;
            l.wq[((n / 16 * (K / 4) + k / 4) * 16 + n % 16) * 4 + k % 4] = q;
        }
        l.comp[n] = 128 * sum;
    }
    return l;
}

/* ------------------------------------------------------------------------------------------------ timing */
typedef int (*Call)(const bl_kernels *t, Layer *l, int threads);

static int call_f32(const bl_kernels *t, Layer *l, int threads) {
    return bl_linear_f32(t, l->x, l->panels, l->b, l->y, l->M, l->K, l->N, threads, BL_ACT_NONE);
}
static int call_bf16(const bl_kernels *t, Layer *l, int threads) {
    return bl_linear_bf16(t, l->xb, l->pairs, l->b, l->yb, l->M, l->K, l->N, threads);
}
static int call_int8(const bl_kernels *t, Layer *l, int threads) {
    return bl_linear_int8(t, l->x, F32, l->wq, l->comp, l->ws, l->b, l->y, l->M, l->K, l->N, 0, threads);
}
static int call_few_rows(const bl_kernels *t, Layer *l, int threads) {
    const ptrdiff_t M = l->M < 4 ? l->M : 4;
    return bl_linear_few_rows(t, l->x, l->w, l->b, l->y, M, l->K, l->N, F32, threads);
}
static int call_quantize(const bl_kernels *t, Layer *l, int threads) {
    return bl_quantize_rows(t, l->x, F32, (int8_t *)l->yb, l->y, l->M, l->K, threads);
}
static int call_softmax(const bl_kernels *t, Layer *l, int threads) {
    memcpy(l->y, l->x, sizeof(float) * l->M * l->K);
    return bl_softmax_rows(t, l->y, F32, l->M, l->K, threads);
}

static void bench(const char *name, Call call, const bl_kernels *t, Layer *l, int threads, double ms, double flop) {
    if (call(t, l, threads) == BL_UNSUPPORTED) {
        printf("%-12s  (none at this level)\n", name);
        return;
    }
    double best = 1e30, start = now(), end;
    long calls = 0;
    do {
        const double t0 = now();
        call(t, l, threads);
        const double dt = now() - t0;
        best = dt < best ? dt : best;
        calls++;
        end = now();
    } while (end - start < ms / 1e3);
    const double mean = (end - start) / (double)calls;
    printf("%-12s  best %9.1f us  mean %9.1f us", name, best * 1e6, mean * 1e6);
    if (flop > 0) printf("  %7.1f GFLOP/s (best)", flop / best / 1e9);
    printf("  (%ld calls)\n", calls);
}

/* ---------------------------------------------------------------------------------------------- --check */
static int same(const char *what, const char *level, const void *a, const void *b, size_t bytes) {
    if (!memcmp(a, b, bytes)) return 1;
    fprintf(stderr, "bench_kernels --check: %s at %s differs from the highest level's\n", what, level);
    return 0;
}

static int check(ptrdiff_t M, ptrdiff_t K, ptrdiff_t N, int threads) {
    Layer l = make_layer(M, K, N);
    const int top = bl_cpu_level();
    bl_kernels t;
    const size_t out = sizeof(float) * M * N;
    float *f32_ref = alloc(out), *int8_ref = alloc(out), *soft_ref = alloc(sizeof(float) * M * K);
    float *s_ref = alloc(sizeof(float) * M);
    int8_t *q_ref = alloc(M * K);
    int ok = 1, have_f32 = 0;
    for (int level = top; level >= BL_NONE; level--) {
        if (bl_select(level, &t) != BL_OK) return 0;
        const char *name = BL_LEVEL_NAMES[level];
        const int first = level == top;
        if (call_f32(&t, &l, threads) == BL_OK) {
            if (!have_f32) memcpy(f32_ref, l.y, out), have_f32 = 1;
            ok &= same("linear_f32", name, f32_ref, l.y, out);
        }
        if (call_int8(&t, &l, threads) == BL_OK) {
            if (first) memcpy(int8_ref, l.y, out);
            ok &= same("linear_int8", name, int8_ref, l.y, out);
        }
        /* another blocking: short tiles, odd blocks, two panels ahead, VNNI panels from 4 rows, the rows split, no
         * request ahead in one-tile calls */
        const bl_tuning other = {level >= BL_AVX512 ? 5 : 3, 37, 2, 4, BL_SPLIT_ALL, 0};
        if (bl_tune(&t, &other) == BL_OK) {
            if (call_f32(&t, &l, threads) == BL_OK) ok &= same("linear_f32 (another blocking)", name, f32_ref, l.y, out);
            if (call_int8(&t, &l, threads) == BL_OK) ok &= same("linear_int8 (another blocking)", name, int8_ref, l.y, out);
        }
        call_quantize(&t, &l, threads);  /* (q into yb, the scales into y) */
        if (first) memcpy(q_ref, l.yb, M * K), memcpy(s_ref, l.y, sizeof(float) * M);
        ok &= same("quantize_rows", name, q_ref, l.yb, M * K) & same("quantize_rows' scales", name, s_ref, l.y,
                                                                     sizeof(float) * M);
        memcpy(l.y, l.x, sizeof(float) * M * K);
        bl_softmax_rows(&t, l.y, F32, M, K, threads);
        if (first) memcpy(soft_ref, l.y, sizeof(float) * M * K);
        if (level >= BL_AVX2) ok &= same("softmax_rows", name, soft_ref, l.y, sizeof(float) * M * K);
        printf("%-8s %s\n", name, ok ? "same bits" : "DIFFERENT");
    }
    return ok;
}

int main(int argc, char **argv) {
    int level = bl_cpu_level(), threads = 1, do_check = 0, tuned = 0;
    bl_tuning tuning;
    ptrdiff_t M = 128, K = 384, N = 1536;
    double ms = 300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) {
            do_check = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_kernels: %s: expected a value after it\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--level")) {
            level = -1;
            for (int l = 0; l < BL_LEVELS; l++)
                if (!strcmp(v, BL_LEVEL_NAMES[l])) level = l;
            if (level < 0 || level > bl_cpu_level()) {
                fprintf(stderr, "bench_kernels: --level %s: expected a level this CPU reaches (at most %s)\n", v,
                        BL_LEVEL_NAMES[bl_cpu_level()]);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            threads = atoi(v);
        } else if (!strcmp(a, "--rows")) {
            M = atol(v);
        } else if (!strcmp(a, "--k")) {
            K = atol(v);
        } else if (!strcmp(a, "--n")) {
            N = atol(v);
        } else if (!strcmp(a, "--ms")) {
            ms = atof(v);
        } else if (!strcmp(a, "--tune")) {
            tuned = sscanf(v, "%d,%d,%d,%d,%d,%d", &tuning.f32_rows, &tuning.f32_block, &tuning.f32_prefetch,
                           &tuning.int8_panel_rows, &tuning.split, &tuning.few_prefetch) == BL_TUNING_VALUES;
            if (!tuned) {
                fprintf(stderr, "bench_kernels: --tune %s: expected six integers, as f32_rows,f32_block,"
                                "f32_prefetch,int8_panel_rows,split,few_prefetch\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "bench_kernels: unknown option %s\n", a);
            return 2;
        }
    }
    if (M < 1 || K < 64 || K % 64 || N < 16 || N % 16 || threads < 1) {
        fprintf(stderr, "bench_kernels: expected --rows >= 1, --k a multiple of 64, --n a multiple of 16, "
                        "--threads >= 1\n");
        return 2;
    }
    if (do_check) return check(M, K, N, threads) ? 0 : 1;
    bl_kernels t;
    bl_select(level, &t);
    if (tuned && bl_tune(&t, &tuning) != BL_OK) {
        fprintf(stderr, "bench_kernels: --tune: not a blocking of the level %s\n", BL_LEVEL_NAMES[level]);
        return 2;
    }
    Layer l = make_layer(M, K, N);
    printf("level %s (highest here: %s), %d thread(s), x (%td, %td), W (%td, %td), blocking %d,%d,%d,%d,%d,%d\n",
           BL_LEVEL_NAMES[level], BL_LEVEL_NAMES[bl_cpu_level()], threads, M, K, N, K, t.tune.f32_rows,
           t.tune.f32_block, t.tune.f32_prefetch, t.tune.int8_panel_rows, t.tune.split, t.tune.few_prefetch);
    const double flop = 2.0 * (double)M * (double)K * (double)N;
    bench("linear_f32", call_f32, &t, &l, threads, ms, flop);
    bench("linear_bf16", call_bf16, &t, &l, threads, ms, flop);
    bench("linear_int8", call_int8, &t, &l, threads, ms, flop);
    bench("few_rows", call_few_rows, &t, &l, threads, ms, 2.0 * (double)(M < 4 ? M : 4) * (double)K * (double)N);
    bench("quantize", call_quantize, &t, &l, threads, ms, 0);
    bench("softmax", call_softmax, &t, &l, threads, ms, 0);
    return 0;
}
