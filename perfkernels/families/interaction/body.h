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

/* dz[i] = sum over j of s[i, j] * z[j], over one column block of VL * NV floats (plus a tail
 * vector), for rows i and i + 1 at once (`two`; else row i alone) so that each z[j] vector is
 * loaded once for both.  NV, has_tail and two are compile-time constants at each call. */
PK_INLINE void dot_backward_block(const float *z, const float *s, int64_t n, int64_t dim,
                                  int64_t i, int64_t col, v_tail tail, float *dz, const int NV,
                                  const int has_tail, const int two)
{
    vf a[5], b[5];
    for (int v = 0; v <= NV; v++) a[v] = b[v] = v_zero();
    const float *si = s + i * n, *si2 = s + (i + 1) * n;
    for (int64_t j = 0; j < n; j++) {
        const float *zj = z + j * dim + col;
        const vf w = v_set1(si[j]);
        const vf w2 = two ? v_set1(si2[j]) : w;
        for (int v = 0; v < NV; v++) {
            const vf x = v_load(zj + v * VL);
            a[v] = v_fmadd(w, x, a[v]);
            if (two) b[v] = v_fmadd(w2, x, b[v]);
        }
#if VL > 1
        if (has_tail) {
            const vf x = v_load_tail(zj + NV * VL, tail);
            a[NV] = v_fmadd(w, x, a[NV]);
            if (two) b[NV] = v_fmadd(w2, x, b[NV]);
        }
#endif
    }
    float *o = dz + i * dim + col;
    for (int v = 0; v < NV; v++) {
        v_store(o + v * VL, a[v]);
        if (two) v_store(o + dim + v * VL, b[v]);
    }
#if VL > 1
    if (has_tail) {
        v_store_tail(o + NV * VL, a[NV], tail);
        if (two) v_store_tail(o + dim + NV * VL, b[NV], tail);
    }
#else
    (void)tail;
#endif
}

PK_INLINE void dot_backward_rows(const float *z, const float *s, int64_t n, int64_t dim,
                                 int64_t i, float *dz, const int two)
{
    int64_t col = 0;
    for (; col + 4 * VL <= dim; col += 4 * VL)
        dot_backward_block(z, s, n, dim, i, col, v_tail_of(0), dz, 4, 0, two);
    for (; col + VL <= dim; col += VL)
        dot_backward_block(z, s, n, dim, i, col, v_tail_of(0), dz, 1, 0, two);
#if VL > 1
    if (col < dim)
        dot_backward_block(z, s, n, dim, i, col, v_tail_of((size_t)(dim - col)), dz, 0, 1, two);
#endif
}

/* The gradient of one sample's pairs with respect to its n rows z ([n, dim], back to back):
 * dz = (G + G^T) z, G[li[p], lj[p]] += grad[p] (a pair (i, i) contributes 2 grad[p] z[i]).  `s` is
 * an [n, n] workspace; dz[i] sums its n rows j in order, so the result does not depend on how
 * the samples are shared among threads. */
void PK_ISA_FN(pk_interaction_dot_backward)(const float *z, int64_t n, int64_t dim,
                                            const int32_t *li, const int32_t *lj,
                                            int64_t n_pairs, const float *grad, float *s,
                                            float *dz)
{
    for (int64_t k = 0; k < n * n; k++) s[k] = 0.0f;
    for (int64_t p = 0; p < n_pairs; p++) {
        s[(int64_t)li[p] * n + lj[p]] += grad[p];
        s[(int64_t)lj[p] * n + li[p]] += grad[p];
    }
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) dot_backward_rows(z, s, n, dim, i, dz, 1);
    if (i < n) dot_backward_rows(z, s, n, dim, i, dz, 0);
}

#endif
