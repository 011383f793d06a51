/* The portable loops (rows.c, attention.c, gemv.c) built for AVX2 + FMA (x86-64-v3): the row loops, fp32
 * attention and GEMV of the tables at the levels avx2 and avxvnni (dispatch.c). One translation unit of the three
 * files under one target, where GCC's target_clones used to pick a clone per call. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC target("arch=x86-64-v3")
#define VARIANT(name) name##_avx2
#include "rows.c"
#include "attention.c"
#include "gemv.c"
#else
typedef int levels_avx2_empty;  /* (ISO C: a translation unit holds a declaration) */
#endif
