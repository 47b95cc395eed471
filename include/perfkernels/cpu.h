/* perfkernels: CPU feature detection (x86-64: cpuid leaves 1 and 7 + xgetbv; aarch64 Linux:
 * getauxval(AT_HWCAP, AT_HWCAP2)) and build information. */
#ifndef PERFKERNELS_CPU_H
#define PERFKERNELS_CPU_H

#include "perfkernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pk_cpu_feature {
    PK_CPU_SSE2 = 0,
    PK_CPU_AVX,
    PK_CPU_AVX2,
    PK_CPU_FMA,
    PK_CPU_F16C,
    PK_CPU_AVX512F,
    PK_CPU_AVX512BW,
    PK_CPU_AVX512DQ,
    PK_CPU_AVX512VL,
    PK_CPU_AVX512_BF16,
    PK_CPU_AVX512_FP16,
    PK_CPU_OS_YMM, /* the OS saves YMM state (XCR0 bits 1, 2) */
    PK_CPU_OS_ZMM, /* the OS saves opmask and ZMM state (XCR0 bits 5, 6, 7) */
    /* aarch64 (HWCAP_ASIMD, HWCAP_ASIMDHP, HWCAP_SVE, HWCAP2_SVE2, HWCAP2_BF16) */
    PK_CPU_ASIMD,
    PK_CPU_ASIMDHP,
    PK_CPU_SVE,
    PK_CPU_SVE2,
    PK_CPU_BF16,
    PK_CPU_FEATURE_COUNT
} pk_cpu_feature;

/* Bit i of the result is feature i.  Zero on other machines. */
uint64_t pk_cpu_detect(void);
/* The feature's name; "" for a feature of another architecture than the build's (and out of
 * range), so cpu_features() lists only the ones this machine can have. */
const char *pk_cpu_feature_name(int feature);
/* 1 if this build contains the kernels of that level (isa_list.h: the x86 levels only on x86-64,
 * the Arm levels only on aarch64). */
int pk_isa_compiled(int isa);
/* The level's name ("scalar", "avx2", ...), "" out of range. */
const char *pk_isa_name(int isa);
const char *pk_build_compiler(void);

#ifdef __cplusplus
}
#endif
#endif
