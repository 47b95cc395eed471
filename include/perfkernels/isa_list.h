/* perfkernels: the ISA levels, lowest first, as one X-macro list.
 *
 *     X(A, name, built)
 *
 * name:  the level (PERFKERNELS_ISA value), the suffix of its C symbols (pk_lstm_forward_avx2) and
 *        the stem of its files (build/csrc/<family>/<name>.c, perfkernels/csrc/simd/<name>.h);
 * built: 1 when the build contains the level: always for scalar; for another level,
 *        PK_BUILT_<name>, 1 when the target is the level's architecture (PK_X86_64,
 *        PK_AARCH64) and the build does not leave the level out (setup.py's
 *        PERFKERNELS_LEVELS defines PK_OMIT_<name> for each level it omits; the level's files
 *        then compile to nothing and its table rows are NULL);
 * A:     passed through unchanged, so one list serves every generator below.
 *
 * The rows are written from perfkernels/_registry.py by the build (perfkernels/_codegen.py,
 * isa_list_source; tests/test_build.py checks this copy): edit the registry, not the rows.
 * From this list come the pk_isa enum, each family's dispatch table (PK_DEFINE_KERNEL_TABLE, in
 * the dispatch.c the build generates) and pk_isa_compiled().
 */
#ifndef PERFKERNELS_ISA_LIST_H
#define PERFKERNELS_ISA_LIST_H

#if defined(__x86_64__) || defined(_M_X64)
#define PK_X86_64 1
#else
#define PK_X86_64 0
#endif
#if defined(__aarch64__)
#define PK_AARCH64 1
#else
#define PK_AARCH64 0
#endif

/* The generated rows: begin (perfkernels/_codegen.py, isa_list_source) */
#if PK_X86_64 && !defined(PK_OMIT_avx2)
#define PK_BUILT_avx2 1
#else
#define PK_BUILT_avx2 0
#endif
#if PK_X86_64 && !defined(PK_OMIT_avx512)
#define PK_BUILT_avx512 1
#else
#define PK_BUILT_avx512 0
#endif
#if PK_AARCH64 && !defined(PK_OMIT_neon)
#define PK_BUILT_neon 1
#else
#define PK_BUILT_neon 0
#endif
#if PK_AARCH64 && !defined(PK_OMIT_sve)
#define PK_BUILT_sve 1
#else
#define PK_BUILT_sve 0
#endif
#define PK_ISA_LIST(X, A)            \
    X(A, scalar, 1)                  \
    X(A, avx2, PK_BUILT_avx2)        \
    X(A, avx512, PK_BUILT_avx512)    \
    X(A, neon, PK_BUILT_neon)        \
    X(A, sve, PK_BUILT_sve)
/* The generated rows: end */

/* PK_WHEN(c)(tokens): the tokens when c expands to 1, nothing when it expands to 0. */
#define PK_WHEN(c) PK_WHEN_(c)
#define PK_WHEN_(c) PK_WHEN_##c
#define PK_WHEN_1(...) __VA_ARGS__
#define PK_WHEN_0(...)

#define PK_ISA_ENUM_(A, name, built) PK_ISA_##name,
#define PK_ISA_BUILT_(A, name, built) built,
#define PK_ISA_NAME_(A, name, built) #name,
#define PK_ISA_TABLE_ROW_(ROW, name, built) PK_WHEN(built)([PK_ISA_##name] = ROW(name),)

/* A family's dispatch table: `const type *getter(int isa)` returns ROW(isa) (an initializer of
 * `type`), or NULL for a level this build does not contain. */
#define PK_DEFINE_KERNEL_TABLE(type, getter, ROW)                                              \
    static const type getter##_rows_[] = {PK_ISA_LIST(PK_ISA_TABLE_ROW_, ROW)};                \
    static const unsigned char getter##_built_[] = {PK_ISA_LIST(PK_ISA_BUILT_, ~)};            \
    const type *getter(int isa)                                                                \
    {                                                                                          \
        if (isa < 0 || isa >= PK_ISA_COUNT || !getter##_built_[isa]) return NULL;              \
        return &getter##_rows_[isa];                                                           \
    }

#endif
