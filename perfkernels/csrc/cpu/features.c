/* CPU feature detection.  Built with baseline flags: it must run on every x86-64 (every aarch64). */
#include "perfkernels/cpu.h"

#if PK_X86_64 && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

static uint64_t read_xcr0(void)
{
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

uint64_t pk_cpu_detect(void)
{
    uint32_t eax, ebx, ecx, edx;
    uint64_t f = 0;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 1 || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    if (edx & (1u << 26)) f |= 1ull << PK_CPU_SSE2;
    if (ecx & (1u << 28)) f |= 1ull << PK_CPU_AVX;
    if (ecx & (1u << 12)) f |= 1ull << PK_CPU_FMA;
    if (ecx & (1u << 29)) f |= 1ull << PK_CPU_F16C;
    int osxsave = (ecx >> 27) & 1;
    if (osxsave) {
        uint64_t xcr0 = read_xcr0();
        if ((xcr0 & 0x6) == 0x6) f |= 1ull << PK_CPU_OS_YMM;
        if ((xcr0 & 0xe6) == 0xe6) f |= 1ull << PK_CPU_OS_ZMM;
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, eax, ebx, ecx, edx);
        if (ebx & (1u << 5)) f |= 1ull << PK_CPU_AVX2;
        if (ebx & (1u << 16)) f |= 1ull << PK_CPU_AVX512F;
        if (ebx & (1u << 17)) f |= 1ull << PK_CPU_AVX512DQ;
        if (ebx & (1u << 30)) f |= 1ull << PK_CPU_AVX512BW;
        if (ebx & (1u << 31)) f |= 1ull << PK_CPU_AVX512VL;
        if (edx & (1u << 23)) f |= 1ull << PK_CPU_AVX512_FP16;
        uint32_t sub_leaves = eax;
        if (sub_leaves >= 1) {
            __cpuid_count(7, 1, eax, ebx, ecx, edx);
            if (eax & (1u << 5)) f |= 1ull << PK_CPU_AVX512_BF16;
        }
    }
    return f;
}
#elif PK_AARCH64 && defined(__linux__)
#include <sys/auxv.h>

/* The kernel's bits (arch/arm64/include/uapi/asm/hwcap.h), spelled out for older C libraries. */
#define PK_HWCAP_ASIMD (1ul << 1)
#define PK_HWCAP_ASIMDHP (1ul << 10)
#define PK_HWCAP_SVE (1ul << 22)
#define PK_HWCAP2_SVE2 (1ul << 1)
#define PK_HWCAP2_BF16 (1ul << 14)

uint64_t pk_cpu_detect(void)
{
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    uint64_t f = 0;
    if (hw & PK_HWCAP_ASIMD) f |= 1ull << PK_CPU_ASIMD;
    if (hw & PK_HWCAP_ASIMDHP) f |= 1ull << PK_CPU_ASIMDHP;
    /* HWCAP_SVE is set only when the kernel also saves the SVE registers */
    if (hw & PK_HWCAP_SVE) f |= 1ull << PK_CPU_SVE;
    if (hw2 & PK_HWCAP2_SVE2) f |= 1ull << PK_CPU_SVE2;
    if (hw2 & PK_HWCAP2_BF16) f |= 1ull << PK_CPU_BF16;
    return f;
}
#elif PK_AARCH64
/* aarch64 without Linux's auxiliary vector: Advanced SIMD is part of every Armv8-A profile. */
uint64_t pk_cpu_detect(void) { return 1ull << PK_CPU_ASIMD; }
#else
uint64_t pk_cpu_detect(void) { return 0; }
#endif

static const char *const feature_names[PK_CPU_FEATURE_COUNT] = {
    "sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512_bf16", "avx512_fp16", "os_ymm", "os_zmm",
    "asimd", "asimdhp", "sve", "sve2", "bf16",
};

const char *pk_cpu_feature_name(int feature)
{
    if (feature < 0 || feature >= PK_CPU_FEATURE_COUNT) return "";
    /* only the features of the build's architecture (the first PK_CPU_ASIMD are x86's) */
    if (PK_AARCH64 ? feature < PK_CPU_ASIMD : feature >= PK_CPU_ASIMD) return "";
    return feature_names[feature];
}

static const unsigned char isa_built[] = {PK_ISA_LIST(PK_ISA_BUILT_, ~)};
static const char *const isa_names[] = {PK_ISA_LIST(PK_ISA_NAME_, ~)};

int pk_isa_compiled(int isa) { return isa >= 0 && isa < PK_ISA_COUNT && isa_built[isa]; }

const char *pk_isa_name(int isa) { return isa >= 0 && isa < PK_ISA_COUNT ? isa_names[isa] : ""; }

const char *pk_build_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown compiler";
#endif
}
