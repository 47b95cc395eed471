"""CPU feature detection and build information (baseline flags only)."""

cdef extern from "perfkernels/cpu.h":
    unsigned long long pk_cpu_detect() nogil
    const char *pk_cpu_feature_name(int feature) nogil
    int pk_isa_compiled(int isa) nogil
    const char *pk_isa_name(int isa) nogil
    const char *pk_build_compiler() nogil
    int PK_CPU_FEATURE_COUNT
    int PK_ISA_COUNT


def detect():
    """Return ``{feature_name: bool}`` from cpuid and xgetbv (all False off x86-64)."""
    cdef unsigned long long bits = pk_cpu_detect()
    return {pk_cpu_feature_name(i).decode(): bool((bits >> i) & 1) for i in range(PK_CPU_FEATURE_COUNT)}


def isa_compiled(int isa):
    """True if this build contains the kernels of ISA level ``isa`` (0 scalar, 1 avx2, 2 avx512)."""
    return bool(pk_isa_compiled(isa))


def isa_names():
    """The ISA levels of the C side (include/perfkernels/isa_list.h), lowest first."""
    return tuple(pk_isa_name(i).decode() for i in range(PK_ISA_COUNT))


def build_compiler():
    return pk_build_compiler().decode()
