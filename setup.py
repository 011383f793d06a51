"""Build the optional C accelerators (the tokenizer's encoders; CPU inference's kernels: fused row passes,
attention, GEMMs, search);
everything else is declared in pyproject.toml.

`optional=True`: without a C compiler the build still succeeds, and the tokenizer and the int8 / attention
paths run their pure Python and torch code instead.
"""

import sys

from setuptools import Extension, setup

# Linux: the kernels split rows over OpenMP threads -- torch's own OpenMP runtime (libgomp), which is already
# loaded when they are imported. Elsewhere they are built single-threaded.
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []

setup(
    ext_modules=[
        Extension(
            "bertlab.tokenizer._fast",
            sources=[f"src/bertlab/tokenizer/csrc/{name}.c" for name in ("module", "wordpiece", "bpe")],
            depends=["src/bertlab/tokenizer/csrc/encoder.h"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        ),
        Extension(
            "bertlab.nn._cpu_kernels",
            # (csrc/bench.c is not part of it: a C benchmark, built by the command in its header)
            sources=[f"src/bertlab/nn/csrc/{name}.c" for name in (
                "module", "dispatch", "ops", "rows", "attention", "gemv", "levels_avx2", "levels_avx512",
                "attention_bf16", "linear", "linear_avx2", "linear_amx", "search")],
            depends=[f"src/bertlab/nn/csrc/{name}.h" for name in ("common", "kernels")],
            extra_compile_args=["-O3", "-std=c99", "-ffp-contract=fast", *OPENMP],
            extra_link_args=OPENMP,
            libraries=["m"] if sys.platform.startswith("linux") else [],
            optional=True,
        ),
    ]
)
