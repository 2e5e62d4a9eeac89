"""Known answers for the program digest (docs/programs.md, Digest).

The renderer and the checker share ``manifest.program_digest``: a field dropped from it (the
flags, say) changes every digest alike, so every rendered tree still checks clean and the
mutation suite passes. These fixed inputs pin the digest to hex values computed once by
``_digest_by_the_docs`` below, written from the documented formula alone (not from
``program_digest``), so any change to the formula fails here.
"""

from __future__ import annotations

import hashlib

import pytest

from cake.core import manifest as mf

LIBRARY = "cake_toy_det_train_0123456789abcdef0123"
HEADER_A = "7a9b1f3c02d6b0e2e1a8f59c3d4e5f60718293a4b5c6d7e8f90112233445566a"
HEADER_B = "0000000000000000000000000000000000000000000000000000000000000001"
KERNEL = (b'#include "cake/toy.h"\n'
          b'extern "C" __global__ void kernel_' + LIBRARY.encode() + b'_forward(float* x) {}\n')
KERNEL_BACKWARD = b"CAKE_TOY_BACKWARD_KERNEL(kernel_" + LIBRARY.encode() + b"_backward)\n"
BINDING = (b'#include "cake/program.h"\n'
           b"CAKE_EXPORT int " + LIBRARY.encode() + b"_forward(void) { return 0; }\n"
           b"CAKE_EXPORT int " + LIBRARY.encode() + b"_backward(void) { return 0; }\n")

# name -> ((library, sources, header sha256s, flags), the digest)
KNOWN = {
    "kernels-binding-headers-flags": (
        (LIBRARY, [("kernel", KERNEL), ("kernel_backward", KERNEL_BACKWARD), ("binding", BINDING)],
         [HEADER_A, HEADER_B], ["--use_fast_math", "-DTOY_NAME=\u00e9t\u00e9"]),
        "f873dd49bde22b49442f"),
    "no-headers-no-flags": (
        (LIBRARY, [("kernel", KERNEL), ("binding", BINDING)], [], []),
        "174a81e54cc332a41649"),
    "triton-flags": (
        (LIBRARY, [("kernel", b"@triton.jit\ndef kernel(x):\n    pass\n"), ("binding", BINDING)],
         [HEADER_B], ["triton==3.9.0", "fp-fusion=1", "line-info=0"]),
        "20d73a9950d2532e45c3"),
    "empty-kernel": (
        (LIBRARY, [("kernel", b""), ("binding", b"")], [HEADER_A], ["x"]),
        "234d193be5668adeeb73"),
}


def _digest_by_the_docs(library: str, sources: list, header_sha256s: list, flags: list) -> str:
    """docs/programs.md, Digest, as written there: the first 20 lowercase hex digits of a sha256
    over ``cake-program-digest-v1\\n``, then each source in manifest order as ``source <role>
    <length>\\n`` and its bytes with every occurrence of the library name replaced by
    ``cake_library``, then ``header <sha256>\\n`` for each header, then ``flag <length>\\n`` and
    the bytes of each flag (lengths in bytes)."""
    stream = bytearray(b"cake-program-digest-v1\n")
    for role, data in sources:
        body = data.replace(library.encode("utf-8"), b"cake_library")
        stream += b"source %s %d\n" % (role.encode("ascii"), len(body)) + body
    for sha256 in header_sha256s:
        stream += b"header %s\n" % sha256.encode("ascii")
    for flag in flags:
        raw = flag.encode("utf-8")
        stream += b"flag %d\n" % len(raw) + raw
    return hashlib.sha256(bytes(stream)).hexdigest()[:20]


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_program_digest_gives_the_known_answer(name):
    inputs, digest = KNOWN[name]
    assert mf.program_digest(*inputs) == digest


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_the_known_answer_is_the_documented_formula(name):
    """The literals above are what the documented formula gives (so they are not typos)."""
    inputs, digest = KNOWN[name]
    assert _digest_by_the_docs(*inputs) == digest


def test_a_renamed_library_keeps_the_known_answer():
    (library, sources, headers, flags), digest = KNOWN["kernels-binding-headers-flags"]
    renamed = "cake_other_nondet_train_0123456789abcdef0123_kcp"
    moved = [(role, data.replace(library.encode(), renamed.encode())) for role, data in sources]
    assert moved != sources
    assert mf.program_digest(renamed, moved, headers, flags) == digest


@pytest.mark.parametrize("change", ["role", "source byte", "source order", "header",
                                    "header order", "flag", "flag order", "flag split"])
def test_every_part_of_the_formula_changes_the_known_answer(change):
    (library, sources, headers, flags), digest = KNOWN["kernels-binding-headers-flags"]
    sources, headers, flags = list(sources), list(headers), list(flags)
    if change == "role":
        sources[1] = ("kernel_other", sources[1][1])
    elif change == "source byte":
        sources[0] = (sources[0][0], sources[0][1].replace(b"float", b"floaT"))
    elif change == "source order":
        sources[0], sources[1] = sources[1], sources[0]
    elif change == "header":
        headers[0] = headers[0][:-1] + "b"
    elif change == "header order":
        headers.reverse()
    elif change == "flag":
        flags[1] = flags[1] + " "
    elif change == "flag order":
        flags.reverse()
    else:  # the lengths keep "ab" from reading as "a" + "b"
        flags = flags[:1] + [flags[1][:5], flags[1][5:]]
    assert mf.program_digest(library, sources, headers, flags) != digest
    assert _digest_by_the_docs(library, sources, headers, flags) != digest
