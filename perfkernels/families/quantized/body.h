/* Row-wise quantized tables, written once over the SIMD primitives of the vector levels
 * (the generated per-level file includes simd/<isa>.h, then this): dequantize_rowwise here, the fused
 * embedding bags in quantized/bags.h, quantize_rowwise in quantized/prepack.h.  The scalar level
 * (quantized/scalar.c) is the plain reference these match. */
#ifndef PK_QUANTIZED_BODY_H
#define PK_QUANTIZED_BODY_H

#include "perfkernels/quantized.h"

/* The float16 scale / bias of a 4/2-bit trailer through the level's single-value conversion: the
 * same bits as common/half_bits.h for every non-NaN value (a NaN row is an error anyway). */
#define PK_Q_TO_F16(f) s_to_f16(f)
#define PK_Q_FROM_F16(h) s_from_f16(h)
#include "quantized/rows.h"

#include "quantized/bags.h"
#include "quantized/prepack.h"

void PK_ISA_FN(pk_dequantize_rowwise)(int bits, const uint8_t *packed, size_t rows, size_t row_bytes,
                                      size_t dim, float *out)
{
    const size_t codes_bytes = bits == 8 ? dim : pk_q_codes_bytes(bits, dim);
    const v_tail tail = v_tail_of(dim % VL);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = packed + r * row_bytes;
        float *o = out + r * dim;
        float scale, bias;
        pk_packed_trailer(bits, row, codes_bytes, &scale, &bias);
        const vf vscale = v_set1(scale), vbias = v_set1(bias);
        size_t c;
        for (c = 0; c + VL <= dim; c += VL)
            v_store(o + c, v_fmadd(load_codes(bits, row, (int64_t)c), vscale, vbias));
        if (c < dim)
            v_store_tail(o + c, v_fmadd(load_codes_tail(bits, row, (int64_t)c, tail), vscale, vbias), tail);
    }
}

#endif
