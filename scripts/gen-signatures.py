#!/usr/bin/env python3
"""Generates the C signatures cudaw's typed calls are checked against, from the CUDA
headers: crates/driver/src/abi/runtime.rs (cuda_runtime_api.h, plus the registration
ABI nvcc's generated code calls, declared in crt/host_runtime.h and crt/device_functions.h)
and crates/driver/src/abi/driver.rs (cuda.h).

Each function becomes its ABI classes, return value first: `I4` (a 4-byte integer or
enum), `I8`, `I1`, `I2`, `F4`, `F8`, `Ptr` (any pointer or handle), `Void`, `S(size,
align)` (a struct by value). The verdict comes from the compiler, not from reading
prototypes: a C++ program made of the preprocessed headers (so no `#define cuMemAlloc
cuMemAlloc_v2` renames a name) asks std::is_pointer / is_integral / is_enum / sizeof
of every parameter of every name the export lists hold (`decltype(&name)`). A name the
headers do not declare takes the signature of its base name without `_ptsz` / `_ptds`
(the per-thread-stream variants share it) or of its entry in ALIASES, else it is left out
(a check against it then fails to compile: no such constant).

Names: the runtime's are every export of crates/cudart-shim/exports/cudart-*.exports;
the driver's every function of crates/driver-shim/data/cuda-13.driver-functions.

Usage: scripts/gen-signatures.py [--check]   (--check: compare with the committed files,
exit 1 when they differ)
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "target/cuda/include")
OUT_DIR = os.path.join(ROOT, "crates/driver/src/abi")

PROBE = r"""
template <class T> void cls() {
    if constexpr (std::is_void<T>::value) std::printf(" Void");
    else if constexpr (std::is_pointer<T>::value) std::printf(" Ptr");
    else if constexpr (std::is_floating_point<T>::value) std::printf(" F%zu", sizeof(T));
    else if constexpr (std::is_integral<T>::value || std::is_enum<T>::value)
        std::printf(" I%zu", sizeof(T));
    else std::printf(" S(%zu,%zu)", sizeof(T), alignof(T));
}
template <class F> struct Sig;
template <class R, class... A> struct Sig<R (*)(A...)> {
    static void print(const char *n) { std::printf("%s", n); cls<R>(); (cls<A>(), ...); std::printf("\n"); }
};
template <class R, class... A> struct Sig<R (*)(A..., ...)> {
    static void print(const char *n) { std::printf("%s variadic\n", n); }
};
int main() {
"""

# The registration ABI nvcc's generated code calls (crt/host_runtime.h declares it only
# for nvcc's own compilation): every `extern ... __cuda*(...);` declaration there.
REGISTRATION_HEADERS = ["crt/host_runtime.h", "crt/device_functions.h"]

# Exports no header at hand declares under their own name, and the declared name whose
# signature they have: CUDA 12's header renamed cudaGetDeviceProperties to its _v2 export,
# which CUDA 13's declares under the plain name again.
ALIASES = {"cudaGetDeviceProperties_v2": "cudaGetDeviceProperties"}

# Driver functions exported under a name today's cuda.h gives to a newer version (`#define
# cuGetProcAddress cuGetProcAddress_v2`), declared as CUDA 11's cuda.h did.
DRIVER_DECLARATIONS = [
    ("cuGetProcAddress", 'extern "C" CUresult cuGetProcAddress(const char *symbol, void **pfn, '
                         'int cudaVersion, cuuint64_t flags);'),
    ("cuDeviceGetUuid", 'extern "C" CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);'),
    ("cuDevicePrimaryCtxRelease", 'extern "C" CUresult cuDevicePrimaryCtxRelease(CUdevice dev);'),
    ("cuMemHostRegister", 'extern "C" CUresult cuMemHostRegister(void *p, size_t bytesize, '
                          'unsigned int Flags);'),
    ("cuEventElapsedTime", 'extern "C" CUresult cuEventElapsedTime(float *pMilliseconds, '
                           'CUevent hStart, CUevent hEnd);'),
]


def read_list(path):
    names = []
    for line in open(path):
        w = line.split()
        if w and not w[0].startswith("#"):
            names.append(w[0])
    return names


def registration_declarations():
    out = []
    for h in REGISTRATION_HEADERS:
        text = open(os.path.join(INCLUDE, h)).read()
        for m in re.finditer(r'extern\s+(?:"C"\s+)?([^;{}#()]*?\b(__cuda\w+)\s*\([^;{}#]*\))\s*;', text):
            decl = re.sub(r"\b(CUDARTAPI|__host__|__device__|__cudart_builtin__)\b", "", m.group(1))
            out.append((m.group(2), 'extern "C" ' + decl + ";"))
    return out


def signatures(header, names, extra=()):
    """{name: "I4 Ptr I8"} for the names `header` declares (or their base name)."""
    flags = ["-w", "-I", INCLUDE]
    pre = subprocess.run(["g++", "-x", "c++", "-std=c++17", "-E", "-P", *flags, "-"],
                         input=f"#include <cstdio>\n#include <type_traits>\n#include <{header}>\n", capture_output=True, text=True,
                         check=True).stdout
    decls = [d for n, d in extra if not re.search(rf"\b{n}\s*\(", pre)]
    body = pre + "\nstruct textureReference; struct surfaceReference;\n" + "\n".join(decls)
    declared = set(re.findall(r"\b(\w+)\s*\(", body))
    base = lambda n: ALIASES.get(n, re.sub(r"_(ptsz|ptds)$", "", n))
    todo = sorted({n if n in declared else base(n) for n in names} & declared)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "sigs.cpp")
        with open(src, "w") as f:
            f.write(body + PROBE)
            for n in todo:
                f.write(f'    Sig<decltype(&{n})>::print("{n}");\n')
            f.write("}\n")
        exe = os.path.join(d, "sigs")
        subprocess.run(["g++", "-std=c++17", "-w", "-o", exe, src], check=True)
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    found = dict(l.split(" ", 1) for l in out.splitlines())
    sigs = {}
    for n in names:
        s = found.get(n, found.get(base(n)))
        if s is not None and s != "variadic":
            sigs[n] = s
    return sigs


def rust(sigs, what):
    lines = [
        f"//! The C signatures of {what}, as ABI classes (return value first).",
        "//! Generated by scripts/gen-signatures.py from the CUDA headers; do not edit.",
        "#![allow(non_upper_case_globals, missing_docs)]",
        "",
        "use super::Class::{self, *};",
        "",
    ]
    for n in sorted(sigs):
        classes = ", ".join(sigs[n].split())
        lines.append(f"pub const {n}: &[Class] = &[{classes}];")
    return "\n".join(lines) + "\n"


def main():
    if not os.path.isfile(os.path.join(INCLUDE, "cuda_runtime_api.h")):
        sys.exit("gen-signatures: no target/cuda/include/cuda_runtime_api.h (run scripts/setup-cuda.sh)")
    runtime_names = sorted({n for f in glob.glob(os.path.join(ROOT, "crates/cudart-shim/exports/cudart-*.exports"))
                            for n in read_list(f)})
    driver_names = sorted(set(read_list(os.path.join(ROOT, "crates/driver-shim/data/cuda-13.driver-functions"))))
    files = {
        "runtime.rs": rust(signatures("cuda_runtime_api.h", runtime_names, registration_declarations()),
                           "the CUDA runtime's exports (cuda_runtime_api.h, crt/host_runtime.h)"),
        "driver.rs": rust(signatures("cuda.h", driver_names, DRIVER_DECLARATIONS), "the CUDA driver's functions (cuda.h)"),
    }
    stale = []
    for name, text in files.items():
        path = os.path.join(OUT_DIR, name)
        if "--check" in sys.argv:
            if not os.path.exists(path) or open(path).read() != text:
                stale.append(os.path.relpath(path, ROOT))
        else:
            open(path, "w").write(text)
            print(f"gen-signatures: {text.count('pub const')} signatures to {os.path.relpath(path, ROOT)}")
    if stale:
        sys.exit(f"gen-signatures: {', '.join(stale)} out of date; run scripts/gen-signatures.py")
    if "--check" in sys.argv:
        print("gen-signatures: as committed")


if __name__ == "__main__":
    main()
