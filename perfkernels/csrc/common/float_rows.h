/* Block loads of float32 / float16 / bfloat16 table rows as floats, for the vector levels (the
 * generated per-level file includes simd/<isa>.h first): the float bags (embedding/body.h) and the
 * training gather and update (training/body.h) read float rows through these.  `format` is a
 * compile-time constant at every call: 0 float32, 1 float16, 2 bfloat16 (the order of both
 * families' table-type enums). */
#ifndef PK_COMMON_FLOAT_ROWS_H
#define PK_COMMON_FLOAT_ROWS_H

enum { PK_ROW_F32 = 0, PK_ROW_F16 = 1, PK_ROW_BF16 = 2 };

/* VL elements of a row starting at element col, as floats. */
PK_INLINE vf pk_load_float_row(const void *row, int64_t col, const int format)
{
    if (format == PK_ROW_F32) return v_load((const float *)row + col);
    const vh h = vh_load((const uint16_t *)row + col);
    return format == PK_ROW_F16 ? v_from_f16(h) : v_from_bf16(h);
}

/* The tail t of a row at col, other lanes 0, nothing past it read. */
PK_INLINE vf pk_load_float_row_tail(const void *row, int64_t col, v_tail t, const int format)
{
    if (format == PK_ROW_F32) return v_load_tail((const float *)row + col, t);
    const vh h = vh_load_tail((const uint16_t *)row + col, t);
    return format == PK_ROW_F16 ? v_from_f16(h) : v_from_bf16(h);
}

#endif
