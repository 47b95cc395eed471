"""CPU feature detection and build information (baseline flags only)."""

from perfkernels._c_common cimport PK_ISA_COUNT
from perfkernels._c_cpu cimport (PK_CPU_FEATURE_COUNT, PK_FAR_INTO_L1, pk_build_compiler,
                                 pk_cpu_detect, pk_cpu_feature_name, pk_far_prefetch_mode,
                                 pk_isa_compiled, pk_isa_name)

def detect():
    """Return ``{feature_name: bool}`` for the features of this build's architecture: cpuid and
    xgetbv on x86-64, getauxval(AT_HWCAP, AT_HWCAP2) on aarch64 Linux (no names elsewhere)."""
    cdef unsigned long long bits = pk_cpu_detect()
    return {pk_cpu_feature_name(i).decode(): bool((bits >> i) & 1) for i in range(PK_CPU_FEATURE_COUNT)
            if pk_cpu_feature_name(i)[0] != 0}


def isa_compiled(int isa):
    """True if this build contains the kernels of ISA level ``isa`` (its index in the registry: 0 scalar, 1 avx2, ...)."""
    return bool(pk_isa_compiled(isa))


def isa_names():
    """The ISA levels of the C side (include/perfkernels/isa_list.h), lowest first."""
    return tuple(pk_isa_name(i).decode() for i in range(PK_ISA_COUNT))


def build_compiler():
    return pk_build_compiler().decode()


def far_prefetch():
    """Where the lookup kernels prefetch the rows of tables of 16 MiB and more: ``"l1"`` (AMD
    CPUs) or ``"l2"`` (others), unless the environment variable ``PERFKERNELS_FAR_PREFETCH``
    (``l1`` or ``l2``, read once per process) says otherwise."""
    return "l1" if pk_far_prefetch_mode() == PK_FAR_INTO_L1 else "l2"
