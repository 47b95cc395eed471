/* The dot interaction, written once over the SIMD primitives (simd/<isa>.h; scalar: VL = 1).
 * Each pair's two rows are multiplied VL floats at a time into four accumulators (one for short
 * rows), a masked load for the tail, and the lanes summed once. */
#ifndef PK_INTERACTION_BODY_H
#define PK_INTERACTION_BODY_H

PK_INLINE float interaction_dot_row(const float *a, const float *b, int64_t dim)
{
    vf acc0 = v_zero(), acc1 = v_zero(), acc2 = v_zero(), acc3 = v_zero();
    int64_t d = 0;
    for (; d + 4 * VL <= dim; d += 4 * VL) {
        acc0 = v_fmadd(v_load(a + d), v_load(b + d), acc0);
        acc1 = v_fmadd(v_load(a + d + VL), v_load(b + d + VL), acc1);
        acc2 = v_fmadd(v_load(a + d + 2 * VL), v_load(b + d + 2 * VL), acc2);
        acc3 = v_fmadd(v_load(a + d + 3 * VL), v_load(b + d + 3 * VL), acc3);
    }
    for (; d + VL <= dim; d += VL) acc0 = v_fmadd(v_load(a + d), v_load(b + d), acc0);
#if VL > 1
    if (d < dim) {
        const v_tail t = v_tail_of((size_t)(dim - d));
        acc1 = v_fmadd(v_load_tail(a + d, t), v_load_tail(b + d, t), acc1);
    }
#endif
    return v_hsum(v_add(v_add(acc0, acc1), v_add(acc2, acc3)));
}

void PK_ISA_FN(pk_interaction_dot)(const float *z, int64_t dim, const int32_t *li,
                                   const int32_t *lj, int64_t n_pairs, float *out)
{
    for (int64_t p = 0; p < n_pairs; p++)
        out[p] = interaction_dot_row(z + (int64_t)li[p] * dim, z + (int64_t)lj[p] * dim, dim);
}

#endif
