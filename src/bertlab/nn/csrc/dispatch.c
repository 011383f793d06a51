/* The CPU dispatch: what this CPU reaches, and the table of kernels each level runs (kernels.h). The one place
 * that asks the CPU which instructions it has; the Python module selects a table once at import (and again only
 * when the level is forced: BERTLAB_CPU_ISA, nn/cpu_kernels.py), the C benchmark once per run. */
#include "common.h"

const char *const BL_LEVEL_NAMES[BL_LEVELS] = {"none", "avx2", "avxvnni", "avx512", "amx"};

typedef struct {
    int v3, v4;          /* x86-64-v3 (AVX2, FMA, BMI, ...), x86-64-v4 (AVX-512 F, BW, CD, DQ, VL) */
    int avxvnni;         /* AVX-VNNI (256-bit VPDPBUSD) */
    int vnni, bf16;      /* AVX-512 VNNI, AVX-512 BF16 (with v4) */
    int amx;             /* AMX-INT8, and the OS gave this process the tile state */
    int amx_bf16;        /* AMX-BF16 too */
} cpu_features;

static cpu_features features(void) {
    cpu_features f = {0};
#ifdef X86_KERNELS
    __builtin_cpu_init();
    f.v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("movbe");
    f.v4 = f.v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
    f.avxvnni = f.v3 && __builtin_cpu_supports("avxvnni");
    f.vnni = f.v4 && __builtin_cpu_supports("avx512vnni");
    f.bf16 = f.v4 && __builtin_cpu_supports("avx512bf16");
    f.amx = f.v4 && amx_int8_granted();
    f.amx_bf16 = f.amx && f.bf16 && __builtin_cpu_supports("amx-bf16");
#endif
    return f;
}

int bl_cpu_level(void) {
    const cpu_features f = features();
    return f.amx ? BL_AMX : f.v4 ? BL_AVX512 : f.avxvnni ? BL_AVXVNNI : f.v3 ? BL_AVX2 : BL_NONE;
}

#define FILL_PORTABLE(t, V)                                \
    do {                                                   \
        (t)->quantize_f32 = V(quantize_f32);               \
        (t)->quantize_bf16 = V(quantize_bf16);             \
        (t)->dequantize_f32 = V(dequantize_f32);           \
        (t)->softmax_f32 = V(softmax_f32);                 \
        (t)->softmax_bf16 = V(softmax_bf16);               \
        (t)->rms_norm_f32 = V(rms_norm_f32);               \
        (t)->rms_norm_bf16 = V(rms_norm_bf16);             \
        (t)->add_layer_norm_f32 = V(add_layer_norm_f32);   \
        (t)->add_layer_norm_bf16 = V(add_layer_norm_bf16); \
        (t)->row_logsumexp = V(row_logsumexp);             \
        (t)->gelu_f32 = V(gelu_f32);                       \
        (t)->gelu_bf16 = V(gelu_bf16);                     \
        (t)->gelu_tanh_f32 = V(gelu_tanh_f32);             \
        (t)->gelu_tanh_bf16 = V(gelu_tanh_bf16);           \
        (t)->one_query_heads = V(one_query_heads);         \
        (t)->attention_rows_heads = V(attention_rows_heads); \
        (t)->relative_rows_heads = V(relative_rows_heads); \
        (t)->gemv_columns = V(gemv_columns);               \
        (t)->rotate_heads_f32 = V(rotate_heads_f32);       \
        (t)->rotate_heads_bf16 = V(rotate_heads_bf16);     \
    } while (0)

/* The largest fp32 row tile of a level's GEMM: 12 rows x 32 columns in 24 of AVX-512's 32 registers, 6 x 16 in
 * 12 of AVX2's 16 */
static int f32_rows_max(int level) { return level >= BL_AVX512 ? 12 : 6; }

int bl_tune(bl_kernels *table, const bl_tuning *t) {
    if (t->f32_rows < 1 || t->f32_rows > f32_rows_max(table->level) || t->f32_block < 1 ||
        t->f32_prefetch < 0 || t->f32_prefetch > 4 || t->int8_panel_rows < 1 || t->split < 0 ||
        t->split > BL_SPLIT_ALL || t->few_prefetch < 0 || t->few_prefetch > 4)
        return BL_UNSUPPORTED;
    table->tune = *t;
    return BL_OK;
}

int bl_select(int level, bl_kernels *t) {
    if (level < BL_NONE || level > bl_cpu_level()) return BL_UNSUPPORTED;
    memset(t, 0, sizeof *t);
    t->level = level;
    /* the blocking the kernels were written with (measured on one Zen 5 core): the largest tile, 192 rows a
     * block, the next panel requested (AVX2 too: on an Intel Xeon held to AVX2, MiniLM's layers with their
     * weights coming from L3, as in an encoder pass, ran 1.06-1.47x faster with it), VNNI panels from 16 rows,
     * columns split in every class (fp32's bulk class by rows, from BL_SPLIT_F32_BULK_ROWS rows a thread: on an
     * Intel Xeon at 2 threads long bulk ran 1.20x, 0.98x and 0.88x columns in three runs, no steady gain; the
     * sweep at first use keeps it wherever it wins beyond its noise), and a one-tile call's next panel requested
     * too (the sweep times that class apart) */
    const bl_tuning defaults = {f32_rows_max(level), 192, level >= BL_AVX2, 16, 0, level >= BL_AVX2};
    t->tune = defaults;
#ifdef PORTABLE_LEVELS
    if (level >= BL_AVX512)
        FILL_PORTABLE(t, NAME_AVX512);
    else if (level >= BL_AVX2)
        FILL_PORTABLE(t, NAME_AVX2);
    else
#endif
        FILL_PORTABLE(t, NAME_BASE);
#ifdef X86_KERNELS
    const cpu_features f = features();
    if (level >= BL_AVX2) {
        t->gemm_f32 = gemm_f32_avx2;
        /* (a CPU may reach avx512 without AVX-VNNI: then AVX2's pairs) */
        const int avxvnni = level >= BL_AVXVNNI && f.avxvnni;
        t->int8_columns = avxvnni ? int8_columns_avxvnni : int8_columns_avx2;
        t->int8_unsigned = avxvnni;
        t->int8_columns_narrow = avxvnni ? NULL : int8_columns_avx2_narrow;
        t->int8_name = avxvnni ? "avxvnni" : "avx2";
        t->beam_topk_input = beam_topk_input_avx2;
    }
    if (level >= BL_AVX512) {
        t->gemm_f32 = gemm_f32_avx512;
        t->beam_topk_input = beam_topk_input;
        if (f.vnni) {
            t->int8_columns = int8_columns_vnni;
            t->int8_unsigned = 1;
            t->int8_columns_narrow = NULL;
            t->int8_name = "vnni";
        }
        if (f.bf16) {
            t->gemm_bf16 = gemm_bf16_avx512;
            t->attention_bf16_heads = attention_bf16_heads;
        }
    }
    if (level >= BL_AMX) t->int8_columns_amx = int8_columns_amx;
    if (level >= BL_AMX && f.amx_bf16) t->attention_amx_heads = attention_amx_heads;
#endif
    return BL_OK;
}
