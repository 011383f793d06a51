/* The Python module bertlab.nn._cpu_kernels: bindings of the operations of kernels.h (METH_FASTCALL; pointers
 * and sizes as Python ints, checked by nn/cpu_kernels.py before every call), each run without the GIL through the
 * one table of kernels `select` chose. The only file of the extension that includes Python.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernels.h"

/* The table every binding runs: the CPU's highest level at import, then the level nn/cpu_kernels.py selects
 * (once per process, or again when a test or benchmark forces one). */
static bl_kernels table;

static int parse(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, const char *name) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, expected, nargs);
        return -1;
    }
    return 0;
}

static void *as_ptr(PyObject *o) { return o == Py_None ? NULL : PyLong_AsVoidPtr(o); }

/* An operation's return code as Python sees it: None, or the exception */
static PyObject *result(int rc, const char *name) {
    if (rc == BL_NO_MEMORY) return PyErr_NoMemory();
    if (rc == BL_UNSUPPORTED)
        return PyErr_Format(PyExc_ValueError, "%s: not at the level %s, or operands it does not take", name,
                            BL_LEVEL_NAMES[table.level]);
    Py_RETURN_NONE;
}

/* RUN(rc = operation(k, ...)): without the GIL, on a copy of the table (`k`), which a `select` from another
 * thread meanwhile leaves alone */
#define RUN(CALL)                              \
    do {                                       \
        const bl_kernels current = table;      \
        const bl_kernels *k = &current;        \
        Py_BEGIN_ALLOW_THREADS                 \
        CALL;                                  \
        Py_END_ALLOW_THREADS                   \
    } while (0)

/* select(level) -> the names of the kernels its table holds beside the portable loops */
static PyObject *py_select(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 1, "select") < 0) return NULL;
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (!name) return NULL;
    int level = -1;
    for (int l = 0; l < BL_LEVELS; l++)
        if (!strcmp(name, BL_LEVEL_NAMES[l])) level = l;
    bl_kernels chosen;
    if (level < 0 || bl_select(level, &chosen) != BL_OK)
        return PyErr_Format(PyExc_ValueError, "select: %R is not a level this CPU reaches (at most %s)", args[0],
                            BL_LEVEL_NAMES[bl_cpu_level()]);
    table = chosen;
    const char *names[8];
    int n = 0;
    if (table.gemm_f32) names[n++] = "gemm_f32";
    if (table.gemm_bf16) names[n++] = "gemm_bf16";
    if (table.attention_bf16_heads) names[n++] = "attention_bf16";
    if (table.attention_amx_heads) names[n++] = "attention_amx";
    if (table.beam_topk_input) names[n++] = "beam_topk";
    if (table.int8_columns_amx) names[n++] = "int8_amx";
    if (table.int8_name) names[n++] = !strcmp(table.int8_name, "vnni") ? "int8_vnni"
                                      : !strcmp(table.int8_name, "avxvnni") ? "int8_avxvnni" : "int8_avx2";
    PyObject *out = PyTuple_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *s = PyUnicode_FromString(names[i]);
        if (!s) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, s);
    }
    return out;
}

/* tune() -> the table's blocking (bl_tuning's fields in order); tune(f32_rows, f32_block, f32_prefetch,
 * int8_panel_rows, split, few_prefetch) sets it first (until the next `select`); out of range: ValueError, nothing changed */
static PyObject *py_tune(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs && parse(args, nargs, BL_TUNING_VALUES, "tune") < 0) return NULL;
    if (nargs) {
        long v[BL_TUNING_VALUES];
        for (int i = 0; i < BL_TUNING_VALUES; i++) v[i] = PyLong_AsLong(args[i]);
        if (PyErr_Occurred()) return NULL;
        for (int i = 0; i < BL_TUNING_VALUES; i++)
            if (v[i] < 0 || v[i] > 1 << 20) v[i] = -1;  /* (out of any field's range: bl_tune refuses it) */
        const bl_tuning t = {(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5]};
        if (bl_tune(&table, &t) != BL_OK)
            return PyErr_Format(PyExc_ValueError,
                                "tune: %ld, %ld, %ld, %ld, %ld, %ld is not a blocking of the level %s", v[0], v[1],
                                v[2], v[3], v[4], v[5], BL_LEVEL_NAMES[table.level]);
    }
    const bl_tuning *t = &table.tune;
    return Py_BuildValue("(iiiiii)", t->f32_rows, t->f32_block, t->f32_prefetch, t->int8_panel_rows, t->split,
                         t->few_prefetch);
}

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
    int rc;
    RUN(rc = bl_quantize_rows(k, x, (int)dtype, q, s, rows, cols, (int)threads));
    return result(rc, "quantize_rows");
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
    int rc;
    RUN(rc = bl_dequantize_rows(k, acc, y, xs, ws, b, rows, cols, (int)threads));
    return result(rc, "dequantize_rows");
}

/* softmax_rows(x_ptr, dtype, rows, cols, threads): in place over contiguous rows */
static PyObject *py_softmax_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 5, "softmax_rows") < 0) return NULL;
    void *x = as_ptr(args[0]);
    long dtype = PyLong_AsLong(args[1]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[2]), cols = PyLong_AsSsize_t(args[3]);
    long threads = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_softmax_rows(k, x, (int)dtype, rows, cols, (int)threads));
    return result(rc, "softmax_rows");
}

/* The norms' last four arguments, from args[at]: rows, cols, eps, threads. Returns -1 with the exception set. */
static int parse_norm(PyObject *const *args, int at, Py_ssize_t *rows, Py_ssize_t *cols, float *eps, int *threads) {
    *rows = PyLong_AsSsize_t(args[at]), *cols = PyLong_AsSsize_t(args[at + 1]);
    *eps = (float)PyFloat_AsDouble(args[at + 2]);
    *threads = (int)PyLong_AsLong(args[at + 3]);
    return PyErr_Occurred() ? -1 : 0;
}

/* rotate_heads(x_ptr, dtype, row_stride, heads, head_stride, hs, rows, cos_ptr, sin_ptr, table_rows, threads):
 * fp32 or bf16 (x and tables alike) */
static PyObject *py_rotate_heads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 11, "rotate_heads") < 0) return NULL;
    void *x = as_ptr(args[0]);
    const int dtype = (int)PyLong_AsLong(args[1]);
    const void *cos = as_ptr(args[7]), *sin = as_ptr(args[8]);
    Py_ssize_t n[6];
    const int at[6] = {2, 3, 4, 5, 6, 9};
    for (int i = 0; i < 6; i++) n[i] = PyLong_AsSsize_t(args[at[i]]);
    const int threads = (int)PyLong_AsLong(args[10]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_rotate_heads(k, x, dtype, n[4], n[0], n[1], n[2], n[3], cos, sin, n[5], threads));
    return result(rc, "rotate_heads");
}

/* rms_norm_rows(x_ptr, w_ptr, y_ptr, dtype, rows, cols, eps, threads): fp32 or bf16 (all alike), contiguous */
static PyObject *py_rms_norm_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t rows, cols;
    float eps;
    int threads, rc;
    if (parse(args, nargs, 8, "rms_norm_rows") < 0 || parse_norm(args, 4, &rows, &cols, &eps, &threads) < 0)
        return NULL;
    const void *x = as_ptr(args[0]), *w = as_ptr(args[1]);
    void *y = as_ptr(args[2]);
    const int dtype = (int)PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    RUN(rc = bl_rms_norm_rows(k, x, w, y, dtype, rows, cols, eps, threads));
    return result(rc, "rms_norm_rows");
}

/* add_layer_norm_rows(y_ptr, residual_ptr, w_ptr, b_ptr, out_ptr, dtype, rows, cols, eps, threads): fp32 or bf16
 * (all alike), contiguous (out may be y) */
static PyObject *py_add_layer_norm_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t rows, cols;
    float eps;
    int threads, rc;
    if (parse(args, nargs, 10, "add_layer_norm_rows") < 0 || parse_norm(args, 6, &rows, &cols, &eps, &threads) < 0)
        return NULL;
    const void *y = as_ptr(args[0]), *res = as_ptr(args[1]), *w = as_ptr(args[2]), *b = as_ptr(args[3]);
    void *out = as_ptr(args[4]);
    const int dtype = (int)PyLong_AsLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    RUN(rc = bl_add_layer_norm_rows(k, y, res, w, b, out, dtype, rows, cols, eps, threads));
    return result(rc, "add_layer_norm_rows");
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
    int rc;
    RUN(rc = bl_attention_one_query(k, &a, rows, (int)threads));
    return result(rc, "attention_one_query (group >= 1)");
}

/* The operands both short-row attention bindings take, from 25 arguments: q, q_strides(3), k, k_strides(3), v,
 * v_strides(3), add | None, add_strides(3), out, rows, heads, hs, queries, keys, scale, threads, group. Returns
 * -1 with the exception set. */
static int parse_rows(PyObject *const *args, int dtype, Rows *a, Py_ssize_t *rows, long *threads) {
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
    a->band = 0;
    return PyErr_Occurred() ? -1 : 0;
}

/* attention_rows(the 25 operands of parse_rows, band): fp32; see Rows */
static PyObject *py_attention_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 26, "attention_rows") < 0) return NULL;
    Rows a;
    Py_ssize_t rows;
    long threads;
    if (parse_rows(args, F32, &a, &rows, &threads) < 0) return NULL;
    a.band = PyLong_AsSsize_t(args[25]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_attention_rows(k, &a, rows, (int)threads));
    return result(rc, "attention_rows (group >= 1, hs a multiple of 16 up to 64; band: queries == keys)");
}

/* relative_attention_rows(the 25 operands of parse_rows, c2p, its 2 strides, rows and first row, p2c the same,
 * c2p_scale, relative, mask, query_start, span): DeBERTa's attention, fp32; see RelativeTerms (a table or the mask
 * None where absent) */
static PyObject *py_relative_attention_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 40, "relative_attention_rows") < 0) return NULL;
    Rows a;
    Py_ssize_t rows;
    long threads;
    if (parse_rows(args, F32, &a, &rows, &threads) < 0) return NULL;
    PyObject *const *r = args + 25;
    RelativeTerms t = {.c2p = as_ptr(r[0]), .p2c = as_ptr(r[5])};
    Py_ssize_t firsts[2];
    for (int i = 0; i < 2; i++) {
        t.c2p_s[i] = PyLong_AsSsize_t(r[1 + i]);
        t.p2c_s[i] = PyLong_AsSsize_t(r[6 + i]);
    }
    t.c2p_rows = PyLong_AsSsize_t(r[3]), firsts[0] = PyLong_AsSsize_t(r[4]);
    t.p2c_rows = PyLong_AsSsize_t(r[8]), firsts[1] = PyLong_AsSsize_t(r[9]);
    t.c2p_scale = (float)PyFloat_AsDouble(r[10]);
    const int64_t *relative = as_ptr(r[11]);
    t.mask = as_ptr(r[12]);
    t.query_start = PyLong_AsSsize_t(r[13]);
    Py_ssize_t span = PyLong_AsSsize_t(r[14]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_relative_attention_rows(k, &a, &t, relative, span, firsts[0], firsts[1], rows, (int)threads));
    return result(rc, "relative_attention_rows");
}

/* attention_bf16(dtype, the 25 operands of parse_rows, band): AVX-512 BF16 dot products (or AMX tiles); see Rows */
static PyObject *py_attention_bf16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 27, "attention_bf16") < 0) return NULL;
    Rows a;
    Py_ssize_t rows;
    long threads;
    const long dtype = PyLong_AsLong(args[0]);
    if (PyErr_Occurred() || parse_rows(args + 1, (int)dtype, &a, &rows, &threads) < 0) return NULL;
    a.band = PyLong_AsSsize_t(args[26]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_attention_bf16(k, &a, rows, (int)threads));
    return result(rc, "attention_bf16 (AVX-512 BF16; fp32 or bf16, group >= 1, hs a multiple of 16 up to 64; "
                      "band: queries == keys)");
}

/* linear_few_rows(x_ptr, w_ptr, bias_ptr | None, y_ptr, M, K, N, dtype, threads): y (M, N) = x (M, K) · Wᵀ + b,
 * W (N, K); K % 16 == 0 */
static PyObject *py_linear_few_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 9, "linear_few_rows") < 0) return NULL;
    const void *x = as_ptr(args[0]), *w = as_ptr(args[1]), *b = as_ptr(args[2]);
    void *y = as_ptr(args[3]);
    Py_ssize_t M = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), N = PyLong_AsSsize_t(args[6]);
    long dtype = PyLong_AsLong(args[7]), threads = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_linear_few_rows(k, x, w, b, y, M, K, N, (int)dtype, (int)threads));
    return result(rc, "linear_few_rows (K % 16 == 0, fp32 or bf16)");
}

/* linear_f32 and linear_bf16(x_ptr, panels_ptr, bias_ptr | None, y_ptr, M, K, N, threads): y = x Wᵀ + b, W packed
 * in panels (fp32; bf16 pairs with an fp32 bias and K even); linear_f32 takes an epilogue (BL_ACT_*) after them */
static PyObject *panel_gemm(PyObject *const *args, Py_ssize_t nargs, int dtype) {
    const char *name = dtype == BF16 ? "linear_bf16 (AVX-512 BF16, K even)" : "linear_f32 (AVX-512 or AVX2)";
    long act = BL_ACT_NONE;
    if (dtype == F32 && nargs == 9) {
        act = PyLong_AsLong(args[--nargs]);
        if (act == -1 && PyErr_Occurred()) return NULL;
    }
    if (parse(args, nargs, 8, dtype == BF16 ? "linear_bf16" : "linear_f32") < 0) return NULL;
    const void *x = as_ptr(args[0]), *w = as_ptr(args[1]);
    const float *b = as_ptr(args[2]);
    void *y = as_ptr(args[3]);
    Py_ssize_t M = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), N = PyLong_AsSsize_t(args[6]);
    long threads = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = dtype == BF16 ? bl_linear_bf16(k, x, w, b, y, M, K, N, (int)threads)
                           : bl_linear_f32(k, x, w, b, y, M, K, N, (int)threads, (int)act));
    return result(rc, name);
}

/* A BlockLinear from (w, bias | None, comp | None, scale | None, narrow[, gemv]): int8 where comp is set, else fp32
 * panels, or the plain weight's GEMV where `with_gemv` and the sixth item is true */
static BlockLinear block_linear_arg(PyObject *const *a, int with_gemv) {
    const int32_t *comp = as_ptr(a[2]);
    if (comp)
        return (BlockLinear){.int8 = {.w = as_ptr(a[0]), .comp = comp, .scale = as_ptr(a[3]), .bias = as_ptr(a[1]),
                                      .narrow = PyLong_AsLong(a[4]) != 0}};
    return (BlockLinear){.w = as_ptr(a[0]), .b = as_ptr(a[1]), .gemv = with_gemv && PyLong_AsLong(a[5]) != 0};
}

/* post_ln_layer(x, out, B, T, add | None, add_rows, hidden, heads, inter, then (w, bias | None, comp | None,
 * scale | None, narrow) for qkv, o, i, f -- fp32 (or, with dtype BF16, bf16) panels where comp is None, else int8
 * --, then ln1_w, ln1_b, ln2_w, ln2_b, eps1, eps2, scale, bf16_attention, threads, dtype): a post-LN encoder layer
 * in one call (see kernels.h) */
static PyObject *py_post_ln_layer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 39, "post_ln_layer") < 0) return NULL;
    const void *x = as_ptr(args[0]), *add = as_ptr(args[4]);
    void *out = as_ptr(args[1]);
    Py_ssize_t B = PyLong_AsSsize_t(args[2]), T = PyLong_AsSsize_t(args[3]), add_rows = PyLong_AsSsize_t(args[5]);
    PostLnLayer l = {.hidden = PyLong_AsSsize_t(args[6]), .heads = PyLong_AsSsize_t(args[7]),
                     .inter = PyLong_AsSsize_t(args[8])};
    BlockLinear *layers[] = {&l.qkv, &l.o, &l.i, &l.f};
    for (int i = 0; i < 4; i++) *layers[i] = block_linear_arg(args + 9 + 5 * i, 0);
    l.ln1_w = as_ptr(args[29]), l.ln1_b = as_ptr(args[30]), l.ln2_w = as_ptr(args[31]), l.ln2_b = as_ptr(args[32]);
    l.eps1 = (float)PyFloat_AsDouble(args[33]), l.eps2 = (float)PyFloat_AsDouble(args[34]);
    l.scale = (float)PyFloat_AsDouble(args[35]);
    l.bf16_attention = PyLong_AsLong(args[36]) != 0;
    long threads = PyLong_AsLong(args[37]);
    l.dtype = (int)PyLong_AsLong(args[38]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_post_ln_layer(k, &l, x, out, B, T, add, add_rows, (int)threads));
    return result(rc, "post_ln_layer (an fp32 or bf16 GEMM or an int8 kernel at this level, heads of a multiple of "
                      "16 up to 64)");
}

/* decoder_layer_step(x, out, rows, self_k, self_v, cache_len, start, self_add | None, self_add_rows,
 * self_add_heads, cross_k | None, cross_v | None, cross_add | None, group, enc_len, cross_add_rows, threads, then
 * the layer: hidden, heads, hs, inter, act (BL_ACT_RELU or BL_ACT_GELU_TANH), 7 x (w, bias, comp, scale, narrow,
 * gemv) for qkv, o, cross q, cross o, ffn in, ffn gate (w None: no gate), ffn out, then norm_self, norm_cross |
 * None, norm_ffn, eps, scale, dtype): a pre-norm decoder layer's decoding step in one call (see kernels.h) */
static PyObject *py_decoder_layer_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 70, "decoder_layer_step") < 0) return NULL;
    const void *x = as_ptr(args[0]);
    void *out = as_ptr(args[1]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[2]);
    DecoderState s = {.self_k = as_ptr(args[3]), .self_v = as_ptr(args[4]), .cache_len = PyLong_AsSsize_t(args[5]),
                      .start = PyLong_AsSsize_t(args[6]), .self_add = as_ptr(args[7]),
                      .self_add_rows = PyLong_AsSsize_t(args[8]), .self_add_heads = PyLong_AsSsize_t(args[9]),
                      .cross_k = as_ptr(args[10]), .cross_v = as_ptr(args[11]), .cross_add = as_ptr(args[12]),
                      .group = PyLong_AsSsize_t(args[13]), .enc_len = PyLong_AsSsize_t(args[14]),
                      .cross_add_rows = PyLong_AsSsize_t(args[15])};
    long threads = PyLong_AsLong(args[16]);
    PyObject *const *a = args + 17;
    DecoderLayer l = {.hidden = PyLong_AsSsize_t(a[0]), .heads = PyLong_AsSsize_t(a[1]),
                      .hs = PyLong_AsSsize_t(a[2]), .inter = PyLong_AsSsize_t(a[3]), .act = (int)PyLong_AsLong(a[4])};
    BlockLinear *layers[] = {&l.qkv, &l.o, &l.cross_q, &l.cross_o, &l.ffn_in, &l.ffn_gate, &l.ffn_out};
    for (int i = 0; i < 7; i++) *layers[i] = block_linear_arg(a + 5 + 6 * i, 1);
    l.norm_self = as_ptr(a[47]), l.norm_cross = as_ptr(a[48]), l.norm_ffn = as_ptr(a[49]);
    l.eps = (float)PyFloat_AsDouble(a[50]), l.scale = (float)PyFloat_AsDouble(a[51]);
    l.dtype = (int)PyLong_AsLong(a[52]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_decoder_layer_step(k, &l, &s, x, out, rows, (int)threads));
    return result(rc, "decoder_layer_step (a GEMV, an fp32 or bf16 GEMM, bf16 attention or an int8 kernel at this "
                      "level)");
}

/* gelu_tanh(y_ptr, dtype, n, threads): GELU's tanh form in place, fp32 or bf16 */
static PyObject *py_gelu_tanh(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 4, "gelu_tanh") < 0) return NULL;
    void *y = as_ptr(args[0]);
    const int dtype = (int)PyLong_AsLong(args[1]);
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    long threads = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_gelu_tanh(k, y, dtype, n, (int)threads));
    return result(rc, "gelu_tanh");
}

static PyObject *py_linear_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return panel_gemm(args, nargs, F32);
}

static PyObject *py_linear_bf16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return panel_gemm(args, nargs, BF16);
}

/* linear_int8(x_ptr, x_dtype, wpacked_ptr, comp_ptr, wscale_ptr, bias_ptr | None, y_ptr, M, K, N, narrow,
 * threads): the int8 linear layer on the table's int8 kernel (AMX tiles, AVX-512 VNNI, AVX-VNNI or AVX2; with
 * `narrow`, every weight within ±64, AVX2's narrow kernel where the table has one); K % 4 == 0, N % 16 == 0 */
static PyObject *py_linear_int8(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 12, "linear_int8") < 0) return NULL;
    const void *x = as_ptr(args[0]);
    long dtype = PyLong_AsLong(args[1]);
    const int8_t *wp = as_ptr(args[2]);
    const int32_t *comp = as_ptr(args[3]);
    const float *ws = as_ptr(args[4]), *b = as_ptr(args[5]);
    float *y = as_ptr(args[6]);
    Py_ssize_t M = PyLong_AsSsize_t(args[7]), K = PyLong_AsSsize_t(args[8]), N = PyLong_AsSsize_t(args[9]);
    long narrow = PyLong_AsLong(args[10]), threads = PyLong_AsLong(args[11]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_linear_int8(k, x, (int)dtype, wp, comp, ws, b, y, M, K, N, narrow != 0, (int)threads));
    return result(rc, "linear_int8 (an int8 kernel at this level, K % 4 == 0, N % 16 == 0)");
}

/* gelu_rows(y_ptr, dtype, rows, cols, threads): GELU in place, fp32 (the fp32 GEMM's epilogue as a pass) or bf16 */
static PyObject *py_gelu_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 5, "gelu_rows") < 0) return NULL;
    void *y = as_ptr(args[0]);
    const int dtype = (int)PyLong_AsLong(args[1]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[2]), cols = PyLong_AsSsize_t(args[3]);
    long threads = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_gelu_rows(k, y, dtype, rows, cols, (int)threads));
    return result(rc, "gelu_rows");
}

/* beam_topk(score_ptr, add_ptr, best_ptr, index_ptr, B, K, V, keep, log_softmax, threads) -> whether a sum was
 * NaN; see bl_beam_topk */
static PyObject *py_beam_topk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (parse(args, nargs, 10, "beam_topk") < 0) return NULL;
    const float *score = as_ptr(args[0]), *add = as_ptr(args[1]);
    float *best = as_ptr(args[2]);
    int64_t *index = as_ptr(args[3]);
    Py_ssize_t B = PyLong_AsSsize_t(args[4]), K = PyLong_AsSsize_t(args[5]), V = PyLong_AsSsize_t(args[6]);
    long keep = PyLong_AsLong(args[7]), log_softmax = PyLong_AsLong(args[8]), threads = PyLong_AsLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    RUN(rc = bl_beam_topk(k, score, add, best, index, B, K, V, (int)keep, (int)log_softmax, (int)threads));
    if (rc < 0) return result(rc, "beam_topk (AVX2 or AVX-512, 1 <= keep <= K * V)");
    return PyBool_FromLong(rc);
}

#define METHOD(name, doc) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, doc}
static PyMethodDef methods[] = {
    METHOD(select, "select(level): run every kernel from now on at `level` (none, avx2, avxvnni, avx512, amx); "
                   "returns the names of the GEMMs, attention and search kernels its table holds"),
    METHOD(tune, "tune([f32_rows, f32_block, f32_prefetch, int8_panel_rows, split, few_prefetch]): the GEMMs' blocking at the "
                 "selected level, set first where given; outputs are the same bits under any blocking"),
    METHOD(quantize_rows, "quantize_rows(x_ptr, x_dtype, q_ptr, scale_ptr, rows, cols, threads): symmetric int8 per row"),
    METHOD(dequantize_rows, "dequantize_rows(acc_ptr, y_ptr, xscale_ptr, wscale_ptr, bias_ptr, rows, cols, threads)"),
    METHOD(softmax_rows, "softmax_rows(x_ptr, dtype, rows, cols, threads): softmax over each contiguous row, in place"),
    METHOD(attention_one_query, "attention_one_query(q, 2 strides, k, 3 strides, v, 3 strides, add, 2 strides, out, "
                                "rows, heads, hs, keys, scale, threads, group)"),
    METHOD(attention_rows, "attention_rows(q, 3 strides, k, 3 strides, v, 3 strides, add, 3 strides, out, rows, "
                           "heads, hs, queries, keys, scale, threads, group, band)"),
    METHOD(relative_attention_rows, "relative_attention_rows(attention_rows' first 25 operands, c2p, 2 strides, "
                                    "rows, first, p2c, 2 strides, rows, first, c2p_scale, relative, mask, "
                                    "query_start, span): DeBERTa's disentangled attention, fp32"),
    METHOD(attention_bf16, "attention_bf16(dtype, q, 3 strides, k, 3 strides, v, 3 strides, add, 3 strides, out, "
                           "rows, heads, hs, queries, keys, scale, threads, group, band): AVX-512 BF16 dot products"),
    METHOD(beam_topk, "beam_topk(score, add, best, index, B, K, V, keep, log_softmax, threads): a beam step's best "
                      "candidates per input"),
    METHOD(add_layer_norm_rows, "add_layer_norm_rows(y, residual, w, b, out, dtype, rows, cols, eps, threads): "
                                "LayerNorm(y + residual) over each contiguous row, fp32 or bf16"),
    METHOD(rotate_heads, "rotate_heads(x, dtype, row_stride, heads, head_stride, hs, rows, cos, sin, table_rows, "
                         "threads): rotary positions over each row's heads in place, fp32 or bf16, torch's formula "
                         "bit for bit"),
    METHOD(rms_norm_rows, "rms_norm_rows(x, w, y, dtype, rows, cols, eps, threads): T5's RMS norm over each contiguous row, fp32 or bf16"),
    METHOD(linear_few_rows, "linear_few_rows(x, w, bias, y, M, K, N, dtype, threads): y = x Wᵀ + b, W (N, K) as "
                            "nn.Linear keeps it"),
    METHOD(linear_f32, "linear_f32(x, panels, bias, y, M, K, N, threads[, act]): y = act(x Wᵀ + b), fp32, W packed "
                       "in panels of 32 columns; act 0 none (the default), 1 the exact GELU"),
    METHOD(post_ln_layer, "post_ln_layer(x, out, B, T, add, add_rows, hidden, heads, inter, 4 x (w, bias, comp, "
                          "scale, narrow), 4 norm weights, eps1, eps2, scale, bf16_attention, threads, dtype): a "
                          "post-LN encoder layer in one call, its linear layers fp32 or bf16 (comp None) or int8"),
    METHOD(decoder_layer_step, "decoder_layer_step(x, out, rows, self_k, self_v, cache_len, start, self_add, "
                               "self_add_rows, self_add_heads, cross_k, cross_v, cross_add, group, enc_len, "
                               "cross_add_rows, threads, hidden, heads, hs, inter, act, 7 x (w, bias, comp, scale, "
                               "narrow, gemv), 3 norm weights, eps, scale, dtype): a pre-norm decoder layer's decoding step "
                               "in one call"),
    METHOD(gelu_tanh, "gelu_tanh(y, dtype, n, threads): GELU's tanh form (gelu_new) in place, fp32 or bf16"),
    METHOD(gelu_rows, "gelu_rows(y, dtype, rows, cols, threads): GELU in place, fp32 (the fp32 GEMM epilogue's bits) or bf16"),
    METHOD(linear_bf16, "linear_bf16(x, panels, bias_f32, y, M, K, N, threads): y = x Wᵀ + b, bf16, AVX-512 BF16 dot "
                        "products"),
    METHOD(linear_int8, "linear_int8(x, x_dtype, wpacked, comp, wscale, bias, y, M, K, N, narrow, threads): the int8 "
                        "linear layer on the selected level's int8 kernel"),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernels_module = {
    PyModuleDef_HEAD_INIT, "_cpu_kernels",
    "CPU inference kernels: fused row passes, attention, GEMMs, search (optional accelerator).", -1, methods,
};

PyMODINIT_FUNC PyInit__cpu_kernels(void) {
#ifdef _OPENMP
    const int openmp = 1;
#else
    const int openmp = 0;
#endif
    const int level = bl_cpu_level();
    bl_select(level, &table);
    PyObject *m = PyModule_Create(&kernels_module);
    /* the highest level this CPU and build reach (nn/cpu_kernels.py selects it or a lower one) */
    if (m && (PyModule_AddStringConstant(m, "cpu_level", BL_LEVEL_NAMES[level]) < 0 ||
              PyModule_AddIntConstant(m, "openmp", openmp) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
