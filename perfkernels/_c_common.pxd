# C declarations of include/perfkernels/common.h (cimported by every family module).

cdef extern from "perfkernels/common.h":
    ctypedef enum pk_status:
        PK_OK
        PK_ERR_INDEX
        PK_ERR_VALUE
        PK_ERR_NONFINITE
    int PK_ISA_COUNT
