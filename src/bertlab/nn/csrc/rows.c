/* Row-wise loops of CPU inference: quantize and dequantize around an int8 GEMM, softmax (fp32, bf16), T5's RMS
 * norm. Each is one pass over a row that stays in L1 (see common.h). */
#include "common.h"

/* ------------------------------------------------------------------------------------------- quantize rows */
/* q[r, :] = round(x[r, :] / s[r]), s[r] = max(max|x[r, :]|, 1e-8) / 127: symmetric int8, one scale per row.
 * A row holding NaN or inf keeps it in its scale (absmax's bit maximum ranks NaN above inf above every finite
 * value; the clamp lets NaN through, as torch's clamp does) and gets q = 0 (a NaN cast to int8 is undefined in
 * C), so every product dequantized from it is 0 · NaN or 0 · inf = NaN, as the torch formulas give: a blown-up
 * activation stays visible instead of turning into plausible numbers. */
INLINE float int8_scale(float amax) { return (amax > 1e-8f || amax != amax ? amax : 1e-8f) / 127.0f; }

MULTIVERSION
HIDDEN void quantize_f32(const float *x, int8_t *q, float *s, Py_ssize_t rows, Py_ssize_t cols) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        const float scale = s[r] = int8_scale(absmax_f32(xr, cols));
        if (!isfinite(scale)) {
            memset(qr, 0, (size_t)cols);
            continue;
        }
        for (Py_ssize_t c = 0; c < cols; c++) qr[c] = (int8_t)round_even(xr[c] / scale);
    }
}

MULTIVERSION
HIDDEN void quantize_bf16(const uint16_t *x, int8_t *q, float *s, Py_ssize_t rows, Py_ssize_t cols) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        const float scale = s[r] = int8_scale(absmax_bf16(xr, cols));
        if (!isfinite(scale)) {
            memset(qr, 0, (size_t)cols);
            continue;
        }
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

/* The Transformer's "Add & Norm" in fp32, post-LN: out = LayerNorm(y + residual) = (s - mean(s)) / sqrt(var(s) + eps)
 * · w + b, s = y + residual, over each row. One pass over y and the residual (out may be y), then two over the
 * row's sum while it is in L1: the mean, then the variance as the mean of squared deviations (as torch's
 * LayerNorm, not E[s²] - mean², which cancels). Where torch took two calls and three trips through memory. */
MULTIVERSION
static void add_layer_norm_f32(const float *y, const float *res, const float *w, const float *b, float *out,
                               Py_ssize_t rows, Py_ssize_t cols, float eps) {
    const Py_ssize_t whole = cols / BLOCK * BLOCK;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *yr = y + r * cols, *rr = res + r * cols;
        float *o = out + r * cols;
        f32x16 lanes = {0};
        for (Py_ssize_t c = 0; c < whole; c += BLOCK) {
            f32x16 a, x;
            memcpy(&a, yr + c, sizeof a);
            memcpy(&x, rr + c, sizeof x);
            a += x;
            memcpy(o + c, &a, sizeof a);
            lanes += a;
        }
        float sum = fold_sum_f32(lanes);
        for (Py_ssize_t c = whole; c < cols; c++) sum += o[c] = yr[c] + rr[c];
        const float mean = sum / (float)cols;
        lanes = (f32x16){0};
        for (Py_ssize_t c = 0; c < whole; c += BLOCK) {
            f32x16 a;
            memcpy(&a, o + c, sizeof a);
            a -= mean;
            lanes += a * a;
        }
        float sq = fold_sum_f32(lanes);
        for (Py_ssize_t c = whole; c < cols; c++) sq += (o[c] - mean) * (o[c] - mean);
        const float inv = 1.0f / sqrtf(sq / (float)cols + eps);
        for (Py_ssize_t c = 0; c < cols; c++) o[c] = (o[c] - mean) * inv * w[c] + b[c];
    }
}

/* add_layer_norm_rows(y_ptr, residual_ptr, w_ptr, b_ptr, out_ptr, rows, cols, eps, threads): fp32, contiguous
 * (out may be y); see add_layer_norm_f32 */
ENTRY py_add_layer_norm_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 9, "add_layer_norm_rows") < 0) return NULL;
    const float *y = as_ptr(args[0]), *res = as_ptr(args[1]), *w = as_ptr(args[2]), *b = as_ptr(args[3]);
    float *out = as_ptr(args[4]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[5]), cols = PyLong_AsSsize_t(args[6]);
    const float eps = (float)PyFloat_AsDouble(args[7]);
    long threads = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 1 || cols < 1) Py_RETURN_NONE;
    int parts = thread_count(rows, cols, threads);
    FOR_EACH_BLOCK(rows, parts, {
        add_layer_norm_f32(y + start * cols, res + start * cols, w, b, out + start * cols, count, cols, eps);
    });
    Py_RETURN_NONE;
}

/* quantize_rows(x_ptr, x_dtype, q_ptr, scale_ptr, rows, cols, threads) */
ENTRY py_quantize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
ENTRY py_dequantize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
ENTRY py_softmax_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
ENTRY py_rms_norm_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

