/* What the embedding-bag vector kernels share before their ISA primitives: the table / weighting
 * kinds the primitives and embedding_body.h specialise on.  Included first by embedding_avx2.c and
 * embedding_avx512.c (x86-64 ISA files only). */
#ifndef PK_EMBEDDING_VEC_H
#define PK_EMBEDDING_VEC_H

#include "perfkernels/embedding.h"

/* Every helper is static (NumPy#25274: non-static inline functions built with different ISA
 * flags may be merged by the linker). */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* `#pragma GCC unroll` does not expand macros; this does, so counts can be written as MAX_VECS. */
#define PK_EMB_PRAGMA_(x) _Pragma(#x)
#define UNROLL(n) PK_EMB_PRAGMA_(GCC unroll n)

enum table_type { TABLE_F32, TABLE_F16, TABLE_BF16 };
enum weighting { UNWEIGHTED, PER_SAMPLE, POSITIONAL };

#endif
