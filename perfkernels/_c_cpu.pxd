# C declarations of include/perfkernels/cpu.h.

cdef extern from "perfkernels/cpu.h":
    unsigned long long pk_cpu_detect() nogil
    const char *pk_cpu_feature_name(int feature) nogil
    int pk_isa_compiled(int isa) nogil
    const char *pk_isa_name(int isa) nogil
    const char *pk_build_compiler() nogil
    int PK_CPU_FEATURE_COUNT

cdef extern from "perfkernels/bags.h":
    int pk_far_prefetch_mode() nogil
    int PK_FAR_INTO_L1
