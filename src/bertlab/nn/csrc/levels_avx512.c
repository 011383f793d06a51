/* The portable loops (rows.c, attention.c, gemv.c) built for AVX-512 (x86-64-v4): the row loops, fp32 attention
 * and GEMV of the tables at the levels avx512 and amx (dispatch.c). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC target("arch=x86-64-v4")
#define VARIANT(name) name##_avx512
#include "rows.c"
#include "attention.c"
#include "gemv.c"
#else
typedef int levels_avx512_empty;  /* (ISO C: a translation unit holds a declaration) */
#endif
