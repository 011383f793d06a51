/* Short-row attention on AVX-512 BF16 dot products, for bf16 and int8 models (see common.h, and attention.c for
 * the fp32 kernel it follows). */
#include "common.h"

#ifdef X86_KERNELS
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
    const int NB, const uint32_t *q2, const uint32_t *kp, ptrdiff_t jb0, ptrdiff_t hp, float *S, ptrdiff_t n) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_ps();
    for (ptrdiff_t p = 0; p < hp; p++) {
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

/* O[r, 0 .. 16·HB) of 4 queries = Σ_jp p2[r][jp] · vp[jp] over the pairs of keys jp0 <= jp < jp1 */
static inline __attribute__((always_inline)) BF16DOT_TARGET void pv_tile_bf16(
    const int HB, const uint32_t *p2, ptrdiff_t n2, const uint32_t *vp, ptrdiff_t hs, ptrdiff_t jp0, ptrdiff_t jp1,
    __m512 acc[4][4]) {
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < HB; c++) acc[r][c] = _mm512_setzero_ps();
    for (ptrdiff_t jp = jp0; jp < jp1; jp++) {
        __m512bh vv[4];
        for (int c = 0; c < HB; c++) vv[c] = (__m512bh)_mm512_loadu_si512(vp + jp * hs + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)p2[r * n2 + jp]);
            for (int c = 0; c < HB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vv[c]);
        }
    }
}

/* dst[0 .. n) = src[0 .. n) as bf16 (rounded to nearest even, as torch's conversion); n a multiple of 16 */
static inline __attribute__((always_inline)) BF16DOT_TARGET void bf16_row(const char *src, int dtype, ptrdiff_t n,
                                                                          uint16_t *dst) {
    if (dtype == BF16) {
        memcpy(dst, src, (size_t)n * 2);
        return;
    }
    for (ptrdiff_t c = 0; c < n; c += 16)
        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)src + c)));
}

/* row[0 .. n) (n a multiple of 16) -> e^(row - max), returning 1 / their sum. A shorter exp than
 * exp_normalizer's, for probabilities that are rounded to bf16 next (8 bits): e^x = 2^t, t = x·log2(e), as
 * 2^(t - round(t)) by a degree-4 polynomial (relative error 5.9e-5 at most over [-100, 0], against bf16's
 * 2e-3 half-ulp) scaled by
 * 2^round(t) in one VSCALEFPS; x clamped at -100 so the padding's -inf gives 0, not NaN. */
static inline __attribute__((always_inline)) BF16DOT_TARGET float exp_normalizer_bf16(float *row, ptrdiff_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (ptrdiff_t j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(row + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), floor = _mm512_set1_ps(-100.0f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 c1 = _mm512_set1_ps(0.693147180559945f), c2 = _mm512_set1_ps(0.240226506959101f),
                 c3 = _mm512_set1_ps(0.0555041086648216f), c4 = _mm512_set1_ps(0.00961812910762848f),
                 one = _mm512_set1_ps(1.0f);
    __m512 sum = _mm512_setzero_ps();
    for (ptrdiff_t j = 0; j < n; j += 16) {
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

/* row[j] = scale · row[j] + add[j] (add NULL: none) for the keys lo <= j < hi, -inf for the other j in
 * [from, to) (from and to multiples of 16): the keys a query sees, the columns its tile computed */
static inline __attribute__((always_inline)) BF16DOT_TARGET void scale_add_row(float *row, const char *add, int dtype,
                                                                               ptrdiff_t lo, ptrdiff_t hi,
                                                                               ptrdiff_t from, ptrdiff_t to,
                                                                               float scale) {
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (ptrdiff_t j = from; j < to; j += 16) {
        /* the lanes l with lo <= j + l < hi */
        const ptrdiff_t start = lo - j < 0 ? 0 : lo - j > 16 ? 16 : lo - j;
        const ptrdiff_t end = hi - j < 0 ? 0 : hi - j > 16 ? 16 : hi - j;
        const __mmask16 live = (__mmask16)((((1u << end) - 1) >> start) << start);
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

/* One (row, head) task's keys and values as the dot products take them, from k and v (`Rows` strides, of its
 * dtype): kp[jb][p][16] with `hq` pairs a key (hq >= hs / 2: the pairs past hs / 2 are left as they are, zero),
 * vp[jp][hs]; kb and vb hold the keys' and values' bf16 rows on the way (zero past the last key). */
static inline __attribute__((always_inline)) BF16DOT_TARGET void pack_keys_values(
    const Rows *a, const char *k, const char *v, ptrdiff_t hq, uint32_t *kp, uint32_t *vp, uint16_t *kb,
    uint16_t *vb) {
    const ptrdiff_t hs = a->hs, hp = hs / 2, pairs = (a->keys + 1) / 2, esize = a->dtype == BF16 ? 2 : 4;
    for (ptrdiff_t j = 0; j < a->keys; j++) {
        bf16_row(k + j * a->ks[2] * esize, a->dtype, hs, kb + j * hs);
        bf16_row(v + j * a->vs[2] * esize, a->dtype, hs, vb + j * hs);
    }
    for (ptrdiff_t j = 0; j < a->keys; j++) {  /* kp: 16 keys' pairs side by side */
        const uint32_t *w = (const uint32_t *)(kb + j * hs);
        uint32_t *dst = kp + (j / 16) * hq * 16 + j % 16;
        for (ptrdiff_t p = 0; p < hp; p++) dst[p * 16] = w[p];
    }
    for (ptrdiff_t jp = 0; jp < pairs; jp++) {  /* vp: two keys' bf16 interleaved per dimension */
        const uint16_t *r0 = vb + 2 * jp * hs, *r1 = r0 + hs;  /* past the last key: zero rows */
        for (ptrdiff_t c = 0; c < hs; c += 16) {
            const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + c)));
            const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + c)));
            _mm512_storeu_si512(vp + jp * hs + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* Task (b, h)'s query rows and additive rows (NULL: none), and its keys and values packed (pack_keys_values) */
static inline __attribute__((always_inline)) BF16DOT_TARGET void task_operands(
    const Rows *a, ptrdiff_t b, ptrdiff_t h, ptrdiff_t hq, const char **q, const char **add, uint32_t *kp,
    uint32_t *vp, uint16_t *kb, uint16_t *vb) {
    const ptrdiff_t esize = a->dtype == BF16 ? 2 : 4;
    *q = (const char *)a->q + (b * a->qs[0] + h * a->qs[1]) * esize;
    *add = a->add ? (const char *)a->add + (b * a->adds[0] + h * a->adds[1]) * esize : NULL;
    const char *k = (const char *)a->k + (b / a->group * a->ks[0] + h * a->ks[1]) * esize;
    const char *v = (const char *)a->v + (b / a->group * a->vs[0] + h * a->vs[1]) * esize;
    pack_keys_values(a, k, v, hq, kp, vp, kb, vb);
}

/* row[0 .. n) (n a multiple of 32), e^(x - max) as exp_normalizer_bf16 leaves it, times 1 / their sum -> dst,
 * the probabilities as bf16 in key order (pairs of keys per 32-bit word, the operand of P V) */
static inline __attribute__((always_inline)) BF16DOT_TARGET void probabilities_bf16(float *row, ptrdiff_t n,
                                                                                    uint32_t *dst) {
    const __m512 inv = _mm512_set1_ps(exp_normalizer_bf16(row, n));
    for (ptrdiff_t j = 0; j < n; j += 32) {
        const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(row + j), inv);
        const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(row + j + 16), inv);
        _mm512_storeu_si512(dst + j / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* Flush denormals to zero (MXCSR FTZ and DAZ) for the duration of a call, on the calling thread; returns the
 * MXCSR to restore. Masked keys' scores (-inf, the dtype's minimum) and the padding keys' come out of the exp as
 * e^-100, a denormal, and each denormal result or operand costs a microcode assist of ~150 cycles on Intel
 * cores: on all-MiniLM-L6-v2's padded batches these assists were most of the kernel's time. The bits do not
 * change: the dot products and the conversions to bf16 flush denormals whatever the MXCSR says, and a denormal
 * added to a sum of at least 1 (the row's maximum contributes e^0) leaves it as it is. */
static inline __attribute__((always_inline)) unsigned int flush_denormals(void) {
    const unsigned int mxcsr = _mm_getcsr();
    _mm_setcsr(mxcsr | 0x8040u);  /* FTZ (bit 15), DAZ (bit 6) */
    return mxcsr;
}

/* scratch (32-bit words): kp n·hs/2, vp n·hs/2, p2 2n, q2 2·hs, S 4n, then bf16 rows of K and V n·hs/2 each;
 * n: keys padded to a multiple of 32 */
HIDDEN BF16DOT_TARGET void attention_bf16_heads(const Rows *a, ptrdiff_t first, ptrdiff_t count,
                                                uint32_t *scratch) {
    /* keys padded to a multiple of 32: each probability row goes to bf16 32 at a time */
    const ptrdiff_t n = (a->keys + 31) / 32 * 32, hs = a->hs, hp = hs / 2, n2 = n / 2, pairs = (a->keys + 1) / 2;
    const int dt = a->dtype;
    const ptrdiff_t esize = dt == BF16 ? 2 : 4;
    uint32_t *kp = scratch, *vp = kp + n * hp, *p2 = vp + n * hp, *q2 = p2 + 4 * n2;
    float *S = (float *)(q2 + 4 * hp);
    uint16_t *kb = (uint16_t *)(S + 4 * n), *vb = kb + n * hs;  /* K and V rows in bf16, zero past the keys */
    memset(kp, 0, sizeof(uint32_t) * (size_t)(n * hs));  /* kp and vp: the padding keys stay zero */
    memset(kb, 0, sizeof(uint16_t) * (size_t)(2 * n * hs));
    const unsigned int mxcsr = flush_denormals();
    for (ptrdiff_t task = first; task < first + count; task++) {
        const ptrdiff_t b = task / a->heads, h = task % a->heads;
        const char *q, *add;
        task_operands(a, b, h, hp, &q, &add, kp, vp, kb, vb);
        for (ptrdiff_t i0 = 0; i0 < a->queries; i0 += 4) {
            const int real = a->queries - i0 < 4 ? (int)(a->queries - i0) : 4;
            for (int r = 0; r < 4; r++)  /* q2 row r: the query's bf16, read as pairs */
                bf16_row(q + (i0 + (r < real ? r : 0)) * a->qs[2] * esize, dt, hs, (uint16_t *)(q2 + r * hp));
            ptrdiff_t lo[4], hi[4], from, to;  /* each row's keys, the 32-key chunks the tile computes */
            visible_keys(a, i0, 4, 32, lo, hi, &from, &to);
            ptrdiff_t jb = from / 16;
            for (; jb + 4 <= to / 16; jb += 4) qk_tile_bf16(4, q2, kp, jb, hp, S, n);
            switch (to / 16 - jb) {
                case 3: qk_tile_bf16(3, q2, kp, jb, hp, S, n); break;
                case 2: qk_tile_bf16(2, q2, kp, jb, hp, S, n); break;
                case 1: qk_tile_bf16(1, q2, kp, jb, hp, S, n); break;
                default: break;
            }
            for (int r = 0; r < real; r++) {
                float *row = S + r * n;
                const char *ar = add ? add + (i0 + r) * a->adds[2] * esize : NULL;
                scale_add_row(row, ar, dt, lo[r], hi[r], from, to, a->scale);
                probabilities_bf16(row + from, to - from, p2 + r * n2 + from / 2);
            }
            /* P V over the tile's chunks: the probabilities outside a row's window are 0 (the exp of -inf, flushed) */
            const ptrdiff_t jp0 = from / 2, jp1 = to / 2 < pairs ? to / 2 : pairs;
            __m512 acc[4][4];
            switch (hs / 16) {
                case 1: pv_tile_bf16(1, p2, n2, vp, hs, jp0, jp1, acc); break;
                case 2: pv_tile_bf16(2, p2, n2, vp, hs, jp0, jp1, acc); break;
                case 3: pv_tile_bf16(3, p2, n2, vp, hs, jp0, jp1, acc); break;
                default: pv_tile_bf16(4, p2, n2, vp, hs, jp0, jp1, acc); break;
            }
            for (int r = 0; r < real; r++) {
                const ptrdiff_t at = ((b * a->queries + i0 + r) * a->heads + h) * hs;
                for (ptrdiff_t c = 0; c < hs / 16; c++) {
                    if (dt == BF16)
                        _mm256_storeu_si256((__m256i *)((uint16_t *)a->out + at + 16 * c),
                                            (__m256i)_mm512_cvtneps_pbh(acc[r][c]));
                    else
                        _mm512_storeu_ps((float *)a->out + at + 16 * c, acc[r][c]);
                }
            }
        }
    }
    _mm_setcsr(mxcsr);
}

/* ------------------------------------------------------------------------- attention on AMX tiles */
/* The same attention, both products on AMX tiles (Intel Sapphire Rapids and later): TDPBF16PS multiplies a
 * tile of 16 rows x 32 bf16 by one of 16 pairs x 16 columns into 16 x 16 fp32 sums -- 8,192 multiply-adds an
 * instruction, 16 times VDPBF16PS's 512. The same bf16 operands, fp32 sums (in another order), the same
 * scale, mask, exp and bf16 probabilities as attention_bf16_heads above: the same formula, the same reference.
 * Per (row, head) task the keys and values are packed as above (kp, vp: their layouts are already the B tiles'
 * -- 16 pairs of a key block, a 32-key chunk's pairs of 16 dimensions), then 16 queries at a time:
 *   Q Kᵀ   A: the 16 queries' bf16 rows (dimensions padded to 32 or 64 with zeros), B: kp, 32 keys a step;
 *          the 16 x n scores stored to S
 *   softmax per row of S in fp32 (scale_add_row, probabilities_bf16), the probabilities as bf16 rows pb
 *   P V    A: pb, 32 keys a step, B: vp, one C tile per 16 dimensions (up to 4)
 * Tiles: 0-3 C, 4-5 A, 6-7 B, every one 16 rows x 64 bytes (the last query block's missing rows are zero
 * queries whose outputs are not stored). The tile state is the process's already (linear_amx.c asked for it
 * before the dispatch picked this level); each call configures its thread's tiles and releases them. */
#define AMX_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

/* scratch (32-bit words, sized by ops.c): kp n·hq, vp n·hs/2, qb 16·hq, pb 8n, S 16n, O 16·hs, then the bf16 rows
 * of K and V n·hs/2 each; hq: a key's pairs padded to 16 (hs 16, 32) or 32 (hs 48, 64), n: keys padded to 32 */
HIDDEN AMX_BF16_TARGET void attention_amx_heads(const Rows *a, ptrdiff_t first, ptrdiff_t count,
                                                uint32_t *scratch) {
    const ptrdiff_t n = (a->keys + 31) / 32 * 32, hs = a->hs, hq = (hs / 2 + 15) / 16 * 16, n2 = n / 2;
    const int dt = a->dtype, wide = hq == 32;
    const ptrdiff_t esize = dt == BF16 ? 2 : 4;
    uint32_t *kp = scratch, *vp = kp + n * hq, *qb = vp + n2 * hs, *pb = qb + 16 * hq;
    float *S = (float *)(pb + 16 * n2), *O = S + 16 * n;
    uint16_t *kb = (uint16_t *)(O + 16 * hs), *vb = kb + n * hs;
    memset(kp, 0, sizeof(uint32_t) * (size_t)(n * hq + n2 * hs + 16 * hq));  /* kp, vp, qb: their padding zero */
    memset(kb, 0, sizeof(uint16_t) * (size_t)(2 * n * hs));
    amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    const unsigned int mxcsr = flush_denormals();
    for (ptrdiff_t task = first; task < first + count; task++) {
        const ptrdiff_t b = task / a->heads, h = task % a->heads;
        const char *q, *add;
        task_operands(a, b, h, hq, &q, &add, kp, vp, kb, vb);
        for (ptrdiff_t i0 = 0; i0 < a->queries; i0 += 16) {
            const int real = a->queries - i0 < 16 ? (int)(a->queries - i0) : 16;
            for (int r = 0; r < 16; r++) {  /* qb row r: the query's bf16, zero past hs (and past the queries) */
                if (r < real)
                    bf16_row(q + (i0 + r) * a->qs[2] * esize, dt, hs, (uint16_t *)(qb + r * hq));
                else
                    memset(qb + r * hq, 0, sizeof(uint32_t) * (size_t)hq);
            }
            _tile_loadd(4, qb, hq * 4);
            if (wide) _tile_loadd(5, qb + 16, hq * 4);
            for (ptrdiff_t jb = 0; jb < n / 16; jb += 2) {  /* scores of 32 keys: two C tiles */
                const uint32_t *k0 = kp + jb * hq * 16, *k1 = k0 + hq * 16;
                _tile_zero(0);
                _tile_zero(1);
                _tile_loadd(6, k0, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, k1, 64);
                _tile_dpbf16ps(1, 4, 7);
                if (wide) {
                    _tile_loadd(6, k0 + 256, 64);
                    _tile_dpbf16ps(0, 5, 6);
                    _tile_loadd(7, k1 + 256, 64);
                    _tile_dpbf16ps(1, 5, 7);
                }
                _tile_stored(0, S + jb * 16, n * 4);
                _tile_stored(1, S + jb * 16 + 16, n * 4);
            }
            for (int r = 0; r < 16; r++) {
                if (r < real) {
                    float *row = S + r * n;
                    scale_add_row(row, add ? add + (i0 + r) * a->adds[2] * esize : NULL, dt, 0, a->keys, 0, n,
                                  a->scale);
                    probabilities_bf16(row, n, pb + r * n2);
                } else {
                    memset(pb + r * n2, 0, sizeof(uint32_t) * (size_t)n2);
                }
            }
            const int blocks = (int)(hs / 16);
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (ptrdiff_t kc = 0; kc < n / 32; kc++) {  /* 32 keys a step: 16 pairs of vp */
                const uint32_t *v0 = vp + 16 * kc * hs;
                _tile_loadd(4, pb + 16 * kc, n * 2);
                _tile_loadd(6, v0, hs * 4);
                _tile_dpbf16ps(0, 4, 6);
                if (blocks > 1) {
                    _tile_loadd(7, v0 + 16, hs * 4);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (blocks > 2) {
                    _tile_loadd(6, v0 + 32, hs * 4);
                    _tile_dpbf16ps(2, 4, 6);
                }
                if (blocks > 3) {
                    _tile_loadd(7, v0 + 48, hs * 4);
                    _tile_dpbf16ps(3, 4, 7);
                }
            }
            _tile_stored(0, O, hs * 4);
            if (blocks > 1) _tile_stored(1, O + 16, hs * 4);
            if (blocks > 2) _tile_stored(2, O + 32, hs * 4);
            if (blocks > 3) _tile_stored(3, O + 48, hs * 4);
            for (int r = 0; r < real; r++) {
                const ptrdiff_t at = ((b * a->queries + i0 + r) * a->heads + h) * hs;
                for (ptrdiff_t c = 0; c < hs; c += 16) {
                    const __m512 o = _mm512_loadu_ps(O + r * hs + c);
                    if (dt == BF16)
                        _mm256_storeu_si256((__m256i *)((uint16_t *)a->out + at + c), (__m256i)_mm512_cvtneps_pbh(o));
                    else
                        _mm512_storeu_ps((float *)a->out + at + c, o);
                }
            }
        }
    }
    _tile_release();
    _mm_setcsr(mxcsr);
}
#endif
