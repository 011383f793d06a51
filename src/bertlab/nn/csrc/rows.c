/* Row-wise loops of CPU inference: quantize and dequantize around an int8 GEMM, softmax (fp32, bf16), T5's RMS
 * norm, the post-LN Add & Norm, a row's log-sum-exp (beam search's log-softmax). Each is one pass over a row
 * that stays in L1 (see common.h). Portable loops: built once per level (levels_*.c). */
#include "common.h"

/* ------------------------------------------------------------------------------------------- quantize rows */
/* q[r, :] = round(x[r, :] / s[r]), s[r] = max(max|x[r, :]|, 1e-8) / 127: symmetric int8, one scale per row.
 * A row holding NaN or inf keeps it in its scale (absmax's bit maximum ranks NaN above inf above every finite
 * value; the clamp lets NaN through, as torch's clamp does) and gets q = 0 (a NaN cast to int8 is undefined in
 * C), so every product dequantized from it is 0 · NaN or 0 · inf = NaN, as the torch formulas give: a blown-up
 * activation stays visible instead of turning into plausible numbers. */
INLINE float int8_scale(float amax) { return (amax > 1e-8f || amax != amax ? amax : 1e-8f) / 127.0f; }

HIDDEN void VARIANT(quantize_f32)(const float *x, int8_t *q, float *s, ptrdiff_t rows, ptrdiff_t cols) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        const float scale = s[r] = int8_scale(absmax_f32(xr, cols));
        if (!isfinite(scale)) {
            memset(qr, 0, (size_t)cols);
            continue;
        }
        for (ptrdiff_t c = 0; c < cols; c++) qr[c] = (int8_t)round_even(xr[c] / scale);
    }
}

HIDDEN void VARIANT(quantize_bf16)(const uint16_t *x, int8_t *q, float *s, ptrdiff_t rows, ptrdiff_t cols) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        const float scale = s[r] = int8_scale(absmax_bf16(xr, cols));
        if (!isfinite(scale)) {
            memset(qr, 0, (size_t)cols);
            continue;
        }
        for (ptrdiff_t c = 0; c < cols; c++) qr[c] = (int8_t)round_even(bf16_to_f32(xr[c]) / scale);
    }
}

/* ----------------------------------------------------------------------------------------- dequantize rows */
/* y[r, c] = (float(acc[r, c]) * xs[r]) * ws[c] + b[c]   (b optional; with b the last two operations are one
 * fused multiply-add, as torch.addcmul computes them), written over acc (same size). */
HIDDEN void VARIANT(dequantize_f32)(const int32_t *acc, float *y, const float *xs, const float *ws, const float *b,
                           ptrdiff_t rows, ptrdiff_t cols) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const int32_t *ar = acc + r * cols;
        float *yr = y + r * cols;
        const float sx = xs[r];
        if (b) {
            for (ptrdiff_t c = 0; c < cols; c++) yr[c] = fmaf((float)ar[c] * sx, ws[c], b[c]);
        } else {
            for (ptrdiff_t c = 0; c < cols; c++) yr[c] = ((float)ar[c] * sx) * ws[c];
        }
    }
}

/* softmax(x[r, :]) in place: p = e^(x - max) / sum, each row through `tmp` (padded(cols) floats) */
HIDDEN void VARIANT(softmax_f32)(float *x, float *tmp, ptrdiff_t rows, ptrdiff_t cols) {
    const ptrdiff_t n16 = padded(cols);
    for (ptrdiff_t r = 0; r < rows; r++) {
        float *xr = x + r * cols;
        for (ptrdiff_t c = 0; c < cols; c++) tmp[c] = xr[c];
        for (ptrdiff_t c = cols; c < n16; c++) tmp[c] = -INFINITY;
        const float inv = exp_normalizer(tmp, n16);
        for (ptrdiff_t c = 0; c < cols; c++) xr[c] = tmp[c] * inv;
    }
}

HIDDEN void VARIANT(softmax_bf16)(uint16_t *x, float *tmp, ptrdiff_t rows, ptrdiff_t cols) {
    const ptrdiff_t n16 = padded(cols);
    for (ptrdiff_t r = 0; r < rows; r++) {
        uint16_t *xr = x + r * cols;
        for (ptrdiff_t c = 0; c < cols; c++) tmp[c] = bf16_to_f32(xr[c]);
        for (ptrdiff_t c = cols; c < n16; c++) tmp[c] = -INFINITY;
        const float inv = exp_normalizer(tmp, n16);
        for (ptrdiff_t c = 0; c < cols; c++) xr[c] = f32_to_bf16(tmp[c] * inv);
    }
}

/* ------------------------------------------------------------------------------------------- RMS norm */
/* y[r, :] = w · (x[r, :] · 1/sqrt(mean(x[r, :]²) + eps)), fp32: T5's layer norm, in torch's order of operations
 * (the mean of squares summed in 16 lanes: the same to ~1e-7). One call where torch made six (square, mean,
 * add, rsqrt, two products), each a few microseconds at a decoding step's size. */
HIDDEN void VARIANT(rms_norm_f32)(const float *x, const float *w, float *y, ptrdiff_t rows, ptrdiff_t cols, float eps) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const float inv = 1.0f / sqrtf(dot_f32(xr, xr, cols) / (float)cols + eps);
        for (ptrdiff_t c = 0; c < cols; c++) yr[c] = w[c] * (xr[c] * inv);
    }
}

/* The same in bf16, as `transformers`' T5LayerNorm computes a bf16 model's: x widened, the mean of squares and
 * x · 1/sqrt(...) in fp32 (the fp32 kernel's sum), that rounded to bf16, then times w in bf16 (rounded once more).
 * tmp: cols floats. */
HIDDEN void VARIANT(rms_norm_bf16)(const uint16_t *x, const uint16_t *w, uint16_t *y, float *tmp, ptrdiff_t rows,
                                   ptrdiff_t cols, float eps) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * cols;
        uint16_t *yr = y + r * cols;
        for (ptrdiff_t c = 0; c < cols; c++) tmp[c] = bf16_to_f32(xr[c]);
        const float inv = 1.0f / sqrtf(dot_f32(tmp, tmp, cols) / (float)cols + eps);
        for (ptrdiff_t c = 0; c < cols; c++)
            yr[c] = f32_to_bf16(bf16_to_f32(w[c]) * bf16_to_f32(f32_to_bf16(tmp[c] * inv)));
    }
}

/* GELU (exact form) over rows x cols fp32 in place: the fp32 GEMM's epilogue (common.h: gelu_rows) as a pass of
 * its own, for a layer whose GEMM has no epilogue (int8) -- the same bits as that epilogue */
HIDDEN void VARIANT(gelu_f32)(float *y, ptrdiff_t rows, ptrdiff_t cols) { gelu_rows(y, rows, cols, cols); }

/* The same GELU over n bf16 in place: each widened, the fp32 formula, rounded to bf16 once (as torch's bf16 gelu
 * rounds its fp32 result; torch's took ~1 ns a value on an AMD EPYC, a bf16 model's widest pass) */
HIDDEN void VARIANT(gelu_bf16)(uint16_t *y, ptrdiff_t n) { map_bf16(y, n, gelu_f32x16); }

/* GELU (tanh form) over n fp32 in place (common.h: gelu_tanh_f32x16) */
HIDDEN void VARIANT(gelu_tanh_f32)(float *y, ptrdiff_t n) {
    ptrdiff_t c = 0;
    for (; c + 16 <= n; c += 16) {  /* (a constant size: a vector load and store, not a call of memcpy) */
        f32x16 v;
        memcpy(&v, y + c, sizeof v);
        gelu_tanh_f32x16(&v);
        memcpy(y + c, &v, sizeof v);
    }
    if (c < n) {
        f32x16 v = {0};
        memcpy(&v, y + c, sizeof(float) * (size_t)(n - c));
        gelu_tanh_f32x16(&v);
        memcpy(y + c, &v, sizeof(float) * (size_t)(n - c));
    }
}

/* The same over n bf16 in place: each widened, the fp32 formula, rounded to bf16 once (as torch's bf16 gelu) */
HIDDEN void VARIANT(gelu_tanh_bf16)(uint16_t *y, ptrdiff_t n) { map_bf16(y, n, gelu_tanh_f32x16); }

/* The Transformer's "Add & Norm" in fp32, post-LN: out = LayerNorm(y + residual) = (s - mean(s)) / sqrt(var(s) + eps)
 * · w + b, s = y + residual, over each row. One pass over y and the residual (out may be y), then two over the
 * row's sum while it is in L1: the mean, then the variance as the mean of squared deviations (as torch's
 * LayerNorm, not E[s²] - mean², which cancels). Where torch took two calls and three trips through memory. */
HIDDEN void VARIANT(add_layer_norm_f32)(const float *y, const float *res, const float *w, const float *b, float *out,
                               ptrdiff_t rows, ptrdiff_t cols, float eps) {
    const ptrdiff_t whole = cols / BLOCK * BLOCK;
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *yr = y + r * cols, *rr = res + r * cols;
        float *o = out + r * cols;
#if defined(__AVX2__) && !defined(__AVX512F__)
        /* AVX2: GCC passed the 16-float vectors below through the stack and general registers at every step (4.6x
         * the AVX-512 build's time on MiniLM's rows); here the 16 lanes are two 8-float halves, each lane the same
         * chain of operations, folded as one -- the bits of the 16-float loops below */
        f32x8 lo = {0}, hi = {0};
        for (ptrdiff_t c = 0; c < whole; c += BLOCK) {
            f32x8 a0, a1, x0, x1;
            memcpy(&a0, yr + c, sizeof a0);
            memcpy(&a1, yr + c + 8, sizeof a1);
            memcpy(&x0, rr + c, sizeof x0);
            memcpy(&x1, rr + c + 8, sizeof x1);
            a0 += x0;
            a1 += x1;
            memcpy(o + c, &a0, sizeof a0);
            memcpy(o + c + 8, &a1, sizeof a1);
            lo += a0;
            hi += a1;
        }
        float sum = fold_sum_halves(lo, hi);
        for (ptrdiff_t c = whole; c < cols; c++) sum += o[c] = yr[c] + rr[c];
        const float mean = sum / (float)cols;
        lo = hi = (f32x8){0};
        for (ptrdiff_t c = 0; c < whole; c += BLOCK) {
            f32x8 a0, a1;
            memcpy(&a0, o + c, sizeof a0);
            memcpy(&a1, o + c + 8, sizeof a1);
            a0 -= mean;
            a1 -= mean;
            lo += a0 * a0;
            hi += a1 * a1;
        }
        float sq = fold_sum_halves(lo, hi);
        for (ptrdiff_t c = whole; c < cols; c++) sq += (o[c] - mean) * (o[c] - mean);
        const float inv = 1.0f / sqrtf(sq / (float)cols + eps);
        ptrdiff_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            f32x8 a, wc, bc;
            memcpy(&a, o + c, sizeof a);
            memcpy(&wc, w + c, sizeof wc);
            memcpy(&bc, b + c, sizeof bc);
            a = (a - mean) * inv * wc + bc;
            memcpy(o + c, &a, sizeof a);
        }
        for (; c < cols; c++) o[c] = (o[c] - mean) * inv * w[c] + b[c];
#else
        f32x16 lanes = {0};
        for (ptrdiff_t c = 0; c < whole; c += BLOCK) {
            f32x16 a, x;
            memcpy(&a, yr + c, sizeof a);
            memcpy(&x, rr + c, sizeof x);
            a += x;
            memcpy(o + c, &a, sizeof a);
            lanes += a;
        }
        float sum = fold_sum_f32(lanes);
        for (ptrdiff_t c = whole; c < cols; c++) sum += o[c] = yr[c] + rr[c];
        const float mean = sum / (float)cols;
        lanes = (f32x16){0};
        for (ptrdiff_t c = 0; c < whole; c += BLOCK) {
            f32x16 a;
            memcpy(&a, o + c, sizeof a);
            a -= mean;
            lanes += a * a;
        }
        float sq = fold_sum_f32(lanes);
        for (ptrdiff_t c = whole; c < cols; c++) sq += (o[c] - mean) * (o[c] - mean);
        const float inv = 1.0f / sqrtf(sq / (float)cols + eps);
        for (ptrdiff_t c = 0; c < cols; c++) o[c] = (o[c] - mean) * inv * w[c] + b[c];
#endif
    }
}

/* Add & Norm in bf16, as a bf16 model's modules compute it: s = y + residual rounded to bf16 (torch's bf16 add),
 * then LayerNorm(s) with fp32 statistics and arithmetic -- add_layer_norm_f32's over s and a zero residual, w and
 * b widened by the caller (wf, bf) -- rounded to bf16 once. tmp: 3 · cols floats. (torch's bf16 LayerNorm also
 * takes fp32 statistics, in another summation order: a value can land one bf16 step apart, rarely.) */
HIDDEN void VARIANT(add_layer_norm_bf16)(const uint16_t *y, const uint16_t *res, const float *wf, const float *bf,
                                         uint16_t *out, float *tmp, ptrdiff_t rows, ptrdiff_t cols, float eps) {
    float *s = tmp, *zero = tmp + cols, *o = tmp + 2 * cols;
    for (ptrdiff_t c = 0; c < cols; c++) zero[c] = 0.0f;
    for (ptrdiff_t r = 0; r < rows; r++) {
        const uint16_t *yr = y + r * cols, *rr = res + r * cols;
        for (ptrdiff_t c = 0; c < cols; c++) s[c] = bf16_to_f32(f32_to_bf16(bf16_to_f32(yr[c]) + bf16_to_f32(rr[c])));
        VARIANT(add_layer_norm_f32)(s, zero, wf, bf, o, 1, cols, eps);
        for (ptrdiff_t c = 0; c < cols; c++) out[r * cols + c] = f32_to_bf16(o[c]);
    }
}

/* ---------------------------------------------------------------------------------------- log-sum-exp */
/* For each of `rows` rows of x: its max m[r] and lse[r] = log Σ_j e^(x[r, j] - m[r]), so that the row's
 * log-softmax is (x - m) - lse, torch's order of operations (its exp is Sleef's and its sum's order its own: the
 * two agree to ~1e-6). The max over the floats' bits as integers and the sum in 16 lanes, as softmax's. */
HIDDEN void VARIANT(row_logsumexp)(const float *x, ptrdiff_t rows, ptrdiff_t cols, float *m, float *lse) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int32_t mk = INT32_MIN;
        for (ptrdiff_t c = 0; c < cols; c++) {
            const int32_t key = order_key(xr[c]);
            mk = key > mk ? key : mk;
        }
        const float mx = from_order_key(mk);
        ptrdiff_t c = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
        /* AVX2 took the lane-wise loop below one float at a time (see exp_nonpositive8): here its exp runs in
         * 8-float vectors, the same operations per lane, and the 16 lanes' sums are kept as two halves folded as
         * one -- the same bits */
        f32x8 lo = {0}, hi = {0};
        for (; c + 16 <= cols; c += 16) {
            f32x8 x0, x1;
            memcpy(&x0, xr + c, sizeof x0);
            memcpy(&x1, xr + c + 8, sizeof x1);
            lo += exp_nonpositive8(x0 - mx);
            hi += exp_nonpositive8(x1 - mx);
        }
        float sum = fold_sum_halves(lo, hi);
#else
        f32x16 lanes = {0};
        for (; c + 16 <= cols; c += 16) {
            f32x16 e;
            for (int l = 0; l < 16; l++) e[l] = exp_nonpositive(xr[c + l] - mx);
            lanes += e;
        }
        float sum = fold_sum_f32(lanes);
#endif
        for (; c < cols; c++) sum += exp_nonpositive(xr[c] - mx);
        m[r] = mx;
        lse[r] = logf(sum);
    }
}

/* ------------------------------------------------------------------------------------------ rotary positions */
/* Rotary positions (Su et al., RoFormer) over `heads` heads of hs floats in each of `rows` rows, in place: row r
 * (first + r overall) at x + r·row_stride, head h at + h·head_stride, rotated by row (first + r) % table of the
 * (table, hs) cos/sin tables:
 *     x1' = x1 · cos1 + (-x2) · sin1,   x2' = x2 · cos2 + x1 · sin2      (halves of hs; rotate_half's pairing)
 * each product rounded before the sum -- no FMA contraction, unlike this library's other loops -- so the result
 * is torch's formula x · cos + rotate_half(x) · sin bit for bit. One pass where torch's formula takes five over q
 * and k (negate, concatenate, two products, a sum), each allocating. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
/* One loop for both element types: T the stored type, LOAD widening an element to float, STORE narrowing back. */
#define ROTATE_HEADS(NAME, T, LOAD, STORE)                                                                      \
    HIDDEN void VARIANT(NAME)(T *x, ptrdiff_t rows, ptrdiff_t first, ptrdiff_t row_stride, ptrdiff_t heads,     \
                              ptrdiff_t head_stride, ptrdiff_t hs, const T *cos, const T *sin, ptrdiff_t table) { \
        const ptrdiff_t half = hs / 2;                                                                          \
        for (ptrdiff_t r = 0; r < rows; r++) {                                                                  \
            const ptrdiff_t t = (first + r) % table;                                                            \
            const T *c = cos + t * hs, *s = sin + t * hs;                                                       \
            for (ptrdiff_t h = 0; h < heads; h++) {                                                             \
                T *a = x + r * row_stride + h * head_stride, *b = a + half;                                     \
                for (ptrdiff_t i = 0; i < half; i++) {                                                          \
                    const float x1 = LOAD(a[i]), x2 = LOAD(b[i]);                                               \
                    const float r1 = x1 * LOAD(c[i]) + (-x2) * LOAD(s[i]);                                      \
                    const float r2 = x2 * LOAD(c[half + i]) + x1 * LOAD(s[half + i]);                           \
                    a[i] = STORE(r1);                                                                           \
                    b[i] = STORE(r2);                                                                           \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    }
#define AS_FLOAT(v) (v)
ROTATE_HEADS(rotate_heads_f32, float, AS_FLOAT, AS_FLOAT)

/* The same over bf16 q, k and tables, as torch's bf16 formula runs it (`modeling.rotate`): each element widened
 * to fp32, the rotation in fp32 (products rounded before the sum, as above), narrowed once to bf16 rounding to
 * nearest even -- bit for bit the formula. The conversions are integer shifts and adds the compiler vectorises
 * at each level; VCVTNEPS2BF16 is not used because it flushes denormal inputs to zero, which torch's narrowing
 * does not. */
ROTATE_HEADS(rotate_heads_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
#undef AS_FLOAT
#undef ROTATE_HEADS
#pragma GCC pop_options
