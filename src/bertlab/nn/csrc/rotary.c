/* bertlab.nn._rotary -- rotary positions (Su et al.) written over q and k in place, in one pass (optional; the
 * torch formula in the model is the reference, and what runs without this extension).
 *
 * The fused projection's output holds, per token row, q's heads, then k's, then v's: (rows, 3, nh, hs) with
 * q and k's 2·nh heads side by side. Each of those heads is rotated where it lies:
 *     x1' = x1 · cos1 + (-x2) · sin1,   x2' = x2 · cos2 + x1 · sin2      (halves of hs; rotate_half's pairing)
 * the products and sum taken in that order and unfused (ISO C: no contraction into FMAs), so the result is the
 * torch formula's, x · cos + rotate_half(x) · sin, bit for bit. Why in C: the formula in torch is five passes
 * over q and k (negate, concatenate, two products, a sum), each allocating; here one pass, no allocation. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* One token row's heads: `heads` heads of hs floats, `head_stride` apart, rotated by one row of the tables. */
MULTIVERSION static void rotate_row(float *x, Py_ssize_t heads, Py_ssize_t head_stride, Py_ssize_t hs,
                                    const float *cos, const float *sin) {
    const Py_ssize_t half = hs / 2;
    for (Py_ssize_t h = 0; h < heads; h++) {
        float *a = x + h * head_stride, *b = a + half;
        for (Py_ssize_t i = 0; i < half; i++) {
            const float x1 = a[i], x2 = b[i];
            const float r1 = x1 * cos[i] + (-x2) * sin[i];
            const float r2 = x2 * cos[half + i] + x1 * sin[half + i];
            a[i] = r1;
            b[i] = r2;
        }
    }
}

/* rotate_heads(x, row_stride, heads, head_stride, hs, rows, cos, sin, table_rows, threads): row r of x (its
 * heads at x + r·row_stride + h·head_stride, in floats) by row r % table_rows of the (table_rows, hs) tables. */
static PyObject *py_rotate_heads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "rotate_heads takes 10 arguments");
        return NULL;
    }
    void *ptrs[3];
    const int at[3] = {0, 6, 7};
    for (int i = 0; i < 3; i++) {
        ptrs[i] = PyLong_AsVoidPtr(args[at[i]]);
        if (PyErr_Occurred()) return NULL;
    }
    Py_ssize_t n[6];
    const int sizes[6] = {1, 2, 3, 4, 5, 8};
    for (int i = 0; i < 6; i++) {
        n[i] = PyLong_AsSsize_t(args[sizes[i]]);
        if (n[i] == -1 && PyErr_Occurred()) return NULL;
    }
    const long threads = PyLong_AsLong(args[9]);
    if (threads == -1 && PyErr_Occurred()) return NULL;
    float *x = ptrs[0];
    const float *cos = ptrs[1], *sin = ptrs[2];
    const Py_ssize_t row_stride = n[0], heads = n[1], head_stride = n[2], hs = n[3], rows = n[4], table = n[5];
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
    /* a few hundred rows are a few microseconds: waking the pool for them costs more than it saves */
    #pragma omp parallel for num_threads((int)threads) schedule(static) if (threads > 1 && rows * heads * hs >= 65536)
#endif
    for (Py_ssize_t r = 0; r < rows; r++) {
        const Py_ssize_t t = r % table;
        rotate_row(x + r * row_stride, heads, head_stride, hs, cos + t * hs, sin + t * hs);
    }
    Py_END_ALLOW_THREADS
    (void)threads;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rotate_heads", (PyCFunction)(void (*)(void))py_rotate_heads, METH_FASTCALL,
     "rotate_heads(x, row_stride, heads, head_stride, hs, rows, cos, sin, table_rows, threads): rotary "
     "positions over each row's heads, in place, fp32"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rotary_module = {
    PyModuleDef_HEAD_INIT, "_rotary", "Rotary positions over q and k in place (optional accelerator).", -1, methods,
};

PyMODINIT_FUNC PyInit__rotary(void) { return PyModule_Create(&rotary_module); }
