"""Build the private native hot path; everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "chronq._native",
            ["chronq/_native.c"],
            depends=["wire/_document_source.h"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
        Extension(
            "wire._speedups",
            ["wire/_speedups.c"],
            depends=["wire/_document_source.h"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
    ]
)
