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
#define _GNU_SOURCE  /* syscall() */
#include "common.h"

#if defined(X86_KERNELS) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,amx-tile,amx-int8")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

HIDDEN int amx_int8_granted(void) {
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
    int rows, int pair, const int8_t *x, ptrdiff_t K, const int8_t *w0, const int8_t *w1, const float *xs,
    const float *ws, const float *b, float *y, ptrdiff_t ldy) {
    int32_t acc[16][32];
    _tile_zero(0);
    _tile_zero(1);
    for (ptrdiff_t kc = 0; kc < K / 64; kc++) {
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
HIDDEN AMX_TARGET void int8_columns_amx(const int8_t *x, ptrdiff_t M, ptrdiff_t K, const int8_t *wp, const float *xs,
                                   const float *ws, const float *b, float *y, ptrdiff_t N, ptrdiff_t nb0,
                                   ptrdiff_t nb1) {
    const ptrdiff_t KQ = K / 4;
    int configured = 0;
    for (ptrdiff_t m = 0; m < M; m += 16) {
        const int rows = (int)(M - m < 16 ? M - m : 16);
        if (rows != configured) {
            amx_configure(rows);
            configured = rows;
        }
        for (ptrdiff_t nb = nb0; nb < nb1; nb += 2) {
            const int pair = nb + 1 < nb1;
            amx_tile(rows, pair, x + m * K, K, wp + nb * KQ * 64, wp + (nb + pair) * KQ * 64, xs + m, ws + nb * 16,
                     b ? b + nb * 16 : NULL, y + m * N + nb * 16, N);
        }
    }
    _tile_release();
}
#else
HIDDEN int amx_int8_granted(void) { return 0; }
#endif
