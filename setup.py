"""Build the optional C accelerator of the tokenizer; everything else is declared in pyproject.toml.

`optional=True`: without a C compiler the build still succeeds and BertTokenizer runs in pure Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "bertlab.tokenizer._fast",
            sources=["src/bertlab/tokenizer/_fast.c"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        )
    ]
)
