"""Build the private native hot path; everything else is declared in pyproject.toml."""

import os
import sys

from setuptools import Extension, setup

COMPILE = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
LINK: list[str] = []
if os.environ.get("CHRONQ_SANITIZE") == "1":
    # `make test-asan` builds a copy of the tree this way: AddressSanitizer and UndefinedBehaviorSanitizer
    # turn an out-of-bounds read or write, a use after free, a misaligned load or a signed overflow into an
    # immediate report with a stack instead of silent corruption. -O1 keeps the stacks readable; the later
    # -O1 overrides the -O2 above and the interpreter's own CFLAGS.
    SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
    COMPILE += ["-O1", "-g", *SANITIZE]
    LINK += SANITIZE


# chronq._native's C files (chronq/csrc, one concept each; chronq/csrc/native.h is their shared header)
NATIVE = ("module", "buffers", "cycle", "appender", "tailer", "merge", "runs", "doorbell", "uring")

WITHOUT = ("building without OpenSSL: AES-GCM codecs seal and open through `cryptography`, one message at "
           "a time; nothing else changes")


def openssl() -> dict[str, list[str]]:
    """chronq._codecs seals AES-GCM batches with OpenSSL's EVP when its headers are here; without them it
    builds without (chronq.codecs then uses `cryptography` per message). CHRONQ_OPENSSL=0 forces that."""
    if os.environ.get("CHRONQ_OPENSSL") == "0":
        print(f"chronq._codecs: {WITHOUT} (CHRONQ_OPENSSL=0)", file=sys.stderr)
        return {}
    prefix = os.environ.get("OPENSSL_DIR", "/usr")
    header = os.path.join(prefix, "include", "openssl", "evp.h")
    if not os.path.exists(header):
        print(f"chronq._codecs: {WITHOUT} ({header} not found; OPENSSL_DIR names another prefix)",
              file=sys.stderr)
        return {}
    return {"define_macros": [("CHRONQ_OPENSSL", "1")], "libraries": ["crypto"],
            "include_dirs": [os.path.join(prefix, "include")]}


setup(
    ext_modules=[
        Extension(
            "chronq._native",
            [f"chronq/csrc/{name}.c" for name in NATIVE],
            depends=["chronq/csrc/native.h", "chronq/csrc/pyerr.h", "chronq/csrc/doorbell.h", "chronq/csrc/uring.h", "wire/_document_source.h"],
            extra_compile_args=COMPILE,
            extra_link_args=LINK,
        ),
        Extension(
            "chronq._codecs",
            ["chronq/_codecs.c"],
            depends=["chronq/csrc/pyerr.h", "wire/_document_source.h"],
            extra_compile_args=COMPILE,
            extra_link_args=LINK,
            **openssl(),  # type: ignore[arg-type]
        ),
        Extension(
            "wire._speedups",
            ["wire/_speedups.c"],
            depends=["wire/_document_source.h"],
            extra_compile_args=COMPILE,
            extra_link_args=LINK,
        ),
    ]
)
