/* The int8 linear layer of linear.c on AMX tiles (Intel Sapphire Rapids and later): the same packed weight, the
 * same integer sums, the same dequantize, so the same output bit for bit -- for the many-row calls where the
 * AVX-512 VNNI kernel loses to a GEMM of tiles. oneDNN's AMX int8 kernels are not reachable with per-row input
 * scales through torch (torch._int_mm takes oneDNN's VNNI GEMM API), so the tiles are driven here.
 *
 * TDPBSSD multiplies a tile of 16 rows x 64 signed bytes of x by a tile of 16 k-quads x 16 columns x 4 signed
 * bytes of W into 16 x 16 int32 sums: exact, and with both operands signed no +128 offset is needed. The weight's
 * packing for the VNNI kernel, [N/16][K/4][16][4], is already the B tile's layout: column block nb, k-quads
 * 16 kc .. 16 kc + 15 are 16 rows of 64 bytes, one after the other. A tile of output is 16 rows x 32 columns
 * (two C tiles: one A tile feeds two B tiles), stored to a small buffer and dequantized from there. K % 64 == 0.
 *
 * Linux gives a process AMX's tile state only after asking (arch_prctl ARCH_REQ_XCOMP_PERM), once per process;
 * each thread then loads its tile configuration before its first tile instruction. */
#include "common.h"

#if defined(X86_KERNELS) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX_GEMM 1
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,amx-tile,amx-int8")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int amx_int8_supported(void) {
    static int state = 0;  /* 1 granted, -1 refused (asked once: module init) */
    if (!state) {
        __builtin_cpu_init();
        state = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
                        __builtin_cpu_supports("avx512bw") &&
                        syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
                    ? 1
                    : -1;
    }
    return state == 1;
}

/* palette 1: tiles 0-1 C (rows x 64 bytes of int32), 2 A (rows x 64 bytes), 3-4 B (16 k-quads x 64 bytes) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static AMX_TARGET void amx_configure(int rows) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 5; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = (uint8_t)(t < 3 ? rows : 16);
    }
    _tile_loadconfig(&cfg);
}

/* rows [0, rows) of x against column blocks nb, nb + 1 (or nb alone when `pair` is 0), dequantized into y */
static inline __attribute__((always_inline)) AMX_TARGET void amx_tile(
    int rows, int pair, const int8_t *x, Py_ssize_t K, const int8_t *w0, const int8_t *w1, const float *xs,
    const float *ws, const float *b, float *y, Py_ssize_t ldy) {
    int32_t acc[16][32];
    _tile_zero(0);
    _tile_zero(1);
    for (Py_ssize_t kc = 0; kc < K / 64; kc++) {
        _tile_loadd(2, x + kc * 64, K);
        _tile_loadd(3, w0 + kc * 16 * 64, 64);
        _tile_dpbssd(0, 2, 3);
        if (pair) {
            _tile_loadd(4, w1 + kc * 16 * 64, 64);
            _tile_dpbssd(1, 2, 4);
        }
    }
    _tile_stored(0, acc, 128);
    if (pair) _tile_stored(1, &acc[0][16], 128);
    for (int c = 0; c < 1 + pair; c++) {
        const __m512 wsc = _mm512_loadu_ps(ws + c * 16);
        const __m512 bc = b ? _mm512_loadu_ps(b + c * 16) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(&acc[r][c * 16])),
                                     _mm512_set1_ps(xs[r]));
            v = b ? _mm512_fmadd_ps(v, wsc, bc) : _mm512_mul_ps(v, wsc);
            _mm512_storeu_ps(y + r * ldy + c * 16, v);
        }
    }
}

/* column blocks [nb0, nb1) for all M rows: 16 rows at a time (the last 1-15 with the tiles reconfigured), pairs
 * of blocks, an odd one alone */
static AMX_TARGET void amx_columns(const int8_t *x, Py_ssize_t M, Py_ssize_t K, const int8_t *wp, const float *xs,
                                   const float *ws, const float *b, float *y, Py_ssize_t N, Py_ssize_t nb0,
                                   Py_ssize_t nb1) {
    const Py_ssize_t KQ = K / 4;
    int configured = 0;
    for (Py_ssize_t m = 0; m < M; m += 16) {
        const int rows = (int)(M - m < 16 ? M - m : 16);
        if (rows != configured) {
            amx_configure(rows);
            configured = rows;
        }
        for (Py_ssize_t nb = nb0; nb < nb1; nb += 2) {
            const int pair = nb + 1 < nb1;
            amx_tile(rows, pair, x + m * K, K, wp + nb * KQ * 64, wp + (nb + pair) * KQ * 64, xs + m, ws + nb * 16,
                     b ? b + nb * 16 : NULL, y + m * N + nb * 16, N);
        }
    }
    _tile_release();
}
#else
int amx_int8_supported(void) { return 0; }
#endif

/* linear_int8_amx(x_ptr, x_dtype, wpacked_ptr, wscale_ptr, bias_ptr | None, y_ptr, M, K, N, threads): the int8
 * linear layer of linear_int8_vnni on AMX tiles, the same packed weight (its `comp` is not needed) and the same
 * output; K % 64 == 0, N % 16 == 0. Threads split the column blocks in pairs. */
ENTRY py_linear_int8_amx(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 10, "linear_int8_amx") < 0) return NULL;
#ifdef HAVE_AMX_GEMM
    const void *x = as_ptr(args[0]);
    long dtype = PyLong_AsLong(args[1]);
    const int8_t *wp = as_ptr(args[2]);
    const float *ws = as_ptr(args[3]), *b = as_ptr(args[4]);
    float *y = as_ptr(args[5]);
    Py_ssize_t M = PyLong_AsSsize_t(args[6]), K = PyLong_AsSsize_t(args[7]), N = PyLong_AsSsize_t(args[8]);
    long threads = PyLong_AsLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (!amx_int8_supported() || K % 64 || N % 16) {
        PyErr_SetString(PyExc_ValueError, "linear_int8_amx: needs AMX-INT8, K % 64 == 0 and N % 16 == 0");
        return NULL;
    }
    int8_t *xq = PyMem_RawMalloc((size_t)(M * K) + sizeof(float) * (size_t)M);
    if (!xq) return PyErr_NoMemory();
    float *xs = (float *)(xq + M * K);  /* M * K is a multiple of 64: the scales stay aligned */
    if (dtype == BF16)
        quantize_bf16(x, xq, xs, M, K);
    else
        quantize_f32(x, xq, xs, M, K);
    const Py_ssize_t pairs = (N / 16 + 1) / 2;
    int parts = thread_count(pairs, M * K * 32, threads);
    FOR_EACH_BLOCK(pairs, parts, {
        const Py_ssize_t nb1 = 2 * (start + count) < N / 16 ? 2 * (start + count) : N / 16;
        amx_columns(xq, M, K, wp, xs, ws, b, y, N, 2 * start, nb1);
    });
    PyMem_RawFree(xq);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "linear_int8_amx: not built for this CPU");
    return NULL;
#endif
}
