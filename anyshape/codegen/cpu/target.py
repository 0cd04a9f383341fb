"""Which CPU a library is built for: the compiler flags and the CPU features they need.

Sits beside ``build``. Plugin mode builds for the machine it runs on
(``-march=native``). Standalone artifacts run elsewhere, so ``export`` builds
for a named ISA level (``x86-64-v3``: AVX2 + FMA, any Haswell/Zen or later)
and records the CPU flags it needs; the loaders compare them with the CPU
they run on (``missing_cpu_flags``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime.host_cpu import host_cpu_flags, machine


@dataclass(frozen=True)
class Target:
    isa: str  # the name recorded in artifacts
    flags: tuple[str, ...]  # compiler flags selecting it
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags a CPU needs to run the code


NATIVE = Target("native", ("-march=native",), ())
# The x86-64 psABI levels, as /proc/cpuinfo spells their features.
_X86_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_X86_V3 = _X86_V2 + ("abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave")
# Flags that -march=native may turn on beyond v3 (recorded for native artifacts).
_X86_EXTRA = (
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi",
    "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "avx_vnni", "sha_ni", "vaes",
    "vpclmulqdq", "gfni", "adx", "rdrnd", "rdseed", "aes", "pclmulqdq",
)  # fmt: skip


def portable_target() -> Target:
    """The widest-reaching ISA level this machine can build and run fast code for."""
    arch, have = machine(), host_cpu_flags()
    if arch == "x86_64":
        if set(_X86_V3) <= have:
            return Target("x86-64-v3", ("-march=x86-64-v3", "-mtune=generic"), _X86_V3)
        if set(_X86_V2) <= have:
            return Target("x86-64-v2", ("-march=x86-64-v2", "-mtune=generic"), _X86_V2)
        return Target("x86-64", ("-march=x86-64", "-mtune=generic"), ())
    if arch == "aarch64":
        return Target("aarch64", ("-march=armv8-a",), ())
    return native_target()


def native_target() -> Target:
    """This machine's own ISA, with the CPU flags an artifact built for it needs."""
    arch, have = machine(), host_cpu_flags()
    needed = tuple(f for f in _X86_V3 + _X86_EXTRA if f in have) if arch == "x86_64" else ()
    if arch == "aarch64":
        needed = tuple(sorted(have))
    return Target(f"native-{arch.replace('_', '-')}", NATIVE.flags, needed)


def target_named(name: str) -> Target:
    if name == "portable":
        return portable_target()
    if name == "native":
        return native_target()
    raise ValueError(f"unknown target {name!r}: 'portable' (default) or 'native'")
