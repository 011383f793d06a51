/* The Python module bertlab.nn._cpu_kernels: its entries (rows.c, attention.c, linear.c, search.c) and what
 * this CPU supports, as module constants. */
#include "common.h"

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
    {"add_layer_norm_rows", (PyCFunction)(void (*)(void))py_add_layer_norm_rows, METH_FASTCALL,
     "add_layer_norm_rows(y, residual, w, b, out, rows, cols, eps, threads): LayerNorm(y + residual) over each "
     "contiguous row, fp32"},
    {"rms_norm_rows", (PyCFunction)(void (*)(void))py_rms_norm_rows, METH_FASTCALL,
     "rms_norm_rows(x, w, y, rows, cols, eps, threads): T5's RMS norm over each contiguous row, fp32"},
    {"linear_few_rows", (PyCFunction)(void (*)(void))py_linear_few_rows, METH_FASTCALL,
     "linear_few_rows(x, w, bias, y, M, K, N, dtype, threads): y = x Wᵀ + b, W (N, K) as nn.Linear keeps it"},
    {"linear_f32", (PyCFunction)(void (*)(void))py_linear_f32, METH_FASTCALL,
     "linear_f32(x, panels, bias, y, M, K, N, threads, avx2): y = x Wᵀ + b, fp32, W packed in panels of 32 columns"},
    {"linear_bf16", (PyCFunction)(void (*)(void))py_linear_bf16, METH_FASTCALL,
     "linear_bf16(x, panels, bias_f32, y, M, K, N, threads): y = x Wᵀ + b, bf16, AVX-512 BF16 dot products"},
    {"linear_int8_vnni", (PyCFunction)(void (*)(void))py_linear_int8_vnni, METH_FASTCALL,
     "linear_int8_vnni(x, x_dtype, wpacked, comp, wscale, bias, y, M, K, N, threads): AVX-512 VNNI"},
    {"linear_int8_avx2", (PyCFunction)(void (*)(void))py_linear_int8_avx2, METH_FASTCALL,
     "linear_int8_avx2(x, x_dtype, wpacked, comp, wscale, bias, y, M, K, N, threads, vnni): AVX2 / AVX-VNNI"},
    {"linear_int8_amx", (PyCFunction)(void (*)(void))py_linear_int8_amx, METH_FASTCALL,
     "linear_int8_amx(x, x_dtype, wpacked, wscale, bias, y, M, K, N, threads): AMX-INT8 tiles"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernels_module = {
    PyModuleDef_HEAD_INIT, "_cpu_kernels", "CPU inference kernels: fused row passes, attention, GEMMs, search (optional accelerator).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__cpu_kernels(void) {
#ifdef _OPENMP
    const int openmp = 1;
#else
    const int openmp = 0;
#endif
    /* what this CPU and build support, as module constants (nn/cpu_kernels.py reads them) */
    const struct { const char *name; int value; } flags[] = {
        {"vnni", vnni_supported()}, {"avx512", avx512_supported()}, {"bf16dot", bf16dot_supported()},
        {"avx2", avx2_supported()}, {"avxvnni", avxvnni_supported()}, {"amx", amx_int8_supported()},
        {"openmp", openmp},
    };
    PyObject *m = PyModule_Create(&kernels_module);
    for (size_t i = 0; m && i < sizeof flags / sizeof flags[0]; i++)
        if (PyModule_AddIntConstant(m, flags[i].name, flags[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
