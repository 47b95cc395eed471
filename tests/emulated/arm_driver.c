/* The Arm levels checked without Python: a static aarch64 program, linked with the kernels'
 * objects, that runs under qemu-aarch64 (tests/test_emulated_arm.py builds and runs it).
 *
 * For every Arm level this build contains and the (emulated) CPU can run, each kernel is called
 * on awkward sizes (D = 1, 7, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000 and empty inputs) and
 * compared:
 *   - conversions and quantization: bit for bit with the scalar level (which the Python tests
 *     hold to NumPy / PyTorch), every float16 and bfloat16 input included;
 *   - bags (float32 / float16 / bfloat16 tables, 8/4/2-bit rows) and the dot interaction: with a
 *     float64 sum computed here, within a bound on float32 rounding, and with the scalar level;
 *   - the LSTM unit, forward and backward (both gate orders, forget bias, int32 / int64 sequence
 *     lengths, drop_states), its exp / sigmoid / tanh, and the fused sparse optimizers (sgd,
 *     adagrad, rowwise_adagrad, adam, adamw, rowwise_adam, momentum, nesterov; float32 / float16 /
 *     bfloat16 tables, duplicate indices summed before one update per row, stochastic rounding):
 *     with float64 references written here from the definitions (perfkernels/training.h,
 *     docs/semantics.md), within bounds propagated from float32 rounding (struct ev), and with the
 *     scalar level;
 *   - unpooled lookups (the sequence family): rows bit for bit as stored, dequantised rows bit for
 *     bit the level's own dequantize_rowwise and within a rounding of float64;
 *   - an out-of-range index: refused with its position, as on the scalar level.
 * Output lines: "cpu ..." (the detected features, the SVE vector length), "level X: ok" for each
 * level checked (or "FAILED" with each family's failure count), and "FAIL ..." lines (the first
 * 40); the exit status is the number of failures (capped). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "perfkernels/convert.h"
#include "perfkernels/cpu.h"
#include "perfkernels/embedding.h"
#include "perfkernels/interaction.h"
#include "perfkernels/lstm.h"
#include "perfkernels/quantized.h"
#include "perfkernels/sequence.h"
#include "perfkernels/training.h"

#ifndef PR_SVE_GET_VL
#define PR_SVE_GET_VL 51
#endif

static int failures;
static const char *level_name;
static const pk_convert_kernels *scalar_convert;

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (!(cond)) {                                                   \
            if (failures < 40) {                                         \
                printf("FAIL [%s] %s:%d: ", level_name, __func__, __LINE__); \
                printf(__VA_ARGS__);                                     \
                printf("\n");                                            \
            }                                                            \
            failures++;                                                  \
        }                                                                \
    } while (0)

static const int64_t DIMS[] = {1, 7, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000};
#define N_DIMS (sizeof DIMS / sizeof DIMS[0])

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_float(void) { return ((float)(rnd() % 20001) - 10000.0f) / 5000.0f; } /* [-2, 2] */
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* reference conversions, written from IEEE 754 here (the scalar kernels are checked too) */
static double f16_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0) return s * ldexp(m, -24);
    if (e == 31) return m ? NAN : s * INFINITY;
    return s * ldexp(1024 + m, e - 25);
}

/* --- conversions: bit for bit with scalar, every 16-bit input ------------------------------ */
static void check_convert(const pk_convert_kernels *k, const pk_convert_kernels *s)
{
    enum { N = 65536 + 37 };
    float *src = malloc(N * 4), *a = malloc(N * 4), *b = malloc(N * 4);
    uint16_t *h = malloc(N * 2), *ha = malloc(N * 2), *hb = malloc(N * 2);
    for (size_t i = 0; i < N; i++) h[i] = (uint16_t)i;
    /* every float16 and bfloat16 bit pattern widened; exact, so also against the reference */
    k->half_to_float(h, a, N);
    s->half_to_float(h, b, N);
    for (size_t i = 0; i < N; i++) {
        CHECK(f32_bits(a[i]) == f32_bits(b[i]), "half_to_float(0x%04x): %08x, scalar %08x", h[i],
              f32_bits(a[i]), f32_bits(b[i]));
        const double r = f16_value(h[i]);
        CHECK(r != r ? a[i] != a[i] : (double)a[i] == r, "half_to_float(0x%04x) = %g", h[i], a[i]);
    }
    k->bf16_to_float(h, a, N);
    for (size_t i = 0; i < N; i++)
        CHECK(f32_bits(a[i]) == (uint32_t)h[i] << 16, "bf16_to_float(0x%04x)", h[i]);
    /* narrowing: random bit patterns, values around float16's range and rounding ties, specials */
    for (size_t i = 0; i < N; i++) {
        switch (i % 4) {
        case 0: src[i] = bits_f32(rnd()); break;
        case 1: src[i] = rnd_float() * 40000.0f; break;
        case 2: src[i] = bits_f32((rnd() & 0x8fffe000u) | 0x00001000u | (uint32_t)(100 + rnd() % 60) << 23); break;
        default: src[i] = rnd_float() * 1e-5f; break;
        }
    }
    src[0] = NAN; src[1] = -INFINITY; src[2] = 65520.0f; src[3] = 65519.0f; src[4] = -0.0f;
    src[5] = bits_f32(0x7f800001u); src[6] = bits_f32(0xffc12345u); src[7] = 5.9604645e-8f;
    for (int clip = 0; clip < 2; clip++) {
        for (size_t d = 0; d < N_DIMS; d++) {
            const size_t n = (size_t)DIMS[d], off = (size_t)d * 3;
            memset(ha, 0xab, (n + 8) * 2); memset(hb, 0xab, (n + 8) * 2);
            k->float_to_half(src + off, ha + 1, n, clip);
            s->float_to_half(src + off, hb + 1, n, clip);
            CHECK(memcmp(ha, hb, (n + 8) * 2) == 0, "float_to_half n=%zu clip=%d differs from scalar", n, clip);
        }
        k->float_to_half(src, ha, N, clip);
        s->float_to_half(src, hb, N, clip);
        for (size_t i = 0; i < N; i++)
            CHECK(ha[i] == hb[i], "float_to_half(%08x, clip=%d): %04x, scalar %04x", f32_bits(src[i]),
                  clip, ha[i], hb[i]);
    }
    k->float_to_bf16(src, ha, N);
    s->float_to_bf16(src, hb, N);
    for (size_t i = 0; i < N; i++)
        CHECK(ha[i] == hb[i], "float_to_bf16(%08x): %04x, scalar %04x", f32_bits(src[i]), ha[i], hb[i]);
    for (size_t d = 0; d < N_DIMS; d++) {   /* nothing written past n */
        const size_t n = (size_t)DIMS[d];
        memset(ha, 0xab, (n + 8) * 2);
        k->float_to_bf16(src + 5, ha + 1, n);
        CHECK(ha[0] == 0xabab && ha[n + 1] == 0xabab, "float_to_bf16 n=%zu wrote outside", n);
        memset(a, 0xab, (n + 8) * 4);
        k->half_to_float(h + 3, a + 1, n);
        CHECK(f32_bits(a[0]) == 0xabababab && f32_bits(a[n + 1]) == 0xabababab, "half_to_float n=%zu", n);
    }
    free(src); free(a); free(b); free(h); free(ha); free(hb);
}

/* --- bags ------------------------------------------------------------------------------------ */
enum { ROWS = 23, NBAGS = 7 };
static const int64_t LENGTHS[NBAGS] = {3, 0, 1, 8, 0, 5, 2};   /* empty bags included */

typedef struct bag_case {
    int64_t offsets[NBAGS + 1];
    int64_t idx64[32];
    int32_t idx32[32];
    float weights[32];
    int64_t n;
} bag_case;

static void make_bags(bag_case *c)
{
    c->offsets[0] = 0;
    for (int b = 0; b < NBAGS; b++) c->offsets[b + 1] = c->offsets[b] + LENGTHS[b];
    c->n = c->offsets[NBAGS];
    for (int64_t j = 0; j < c->n; j++) {
        c->idx64[j] = rnd() % ROWS;
        c->idx32[j] = (int32_t)c->idx64[j];
        c->weights[j] = rnd_float();
    }
    c->idx64[4] = c->idx64[6];   /* a row twice in a bag */
    c->idx32[4] = c->idx32[6];
}

/* out[b] = scale * sum w_j * row(idx_j), in float64, with the sum of |terms| for the bound */
typedef double (*row_value_fn)(const void *table, int64_t row, int64_t col, int64_t dim);

/* mag_value: the magnitude a row element's rounding errors scale with (NULL: |value|) */
static void reference_bags(const bag_case *c, const pk_bags *bags, row_value_fn value,
                           row_value_fn mag_value, const void *table, int64_t dim, double *ref,
                           double *mag)
{
    for (int b = 0; b < NBAGS; b++) {
        int64_t count = 0;
        for (int64_t j = c->offsets[b]; j < c->offsets[b + 1]; j++)
            count += c->idx64[j] != bags->padding_idx;
        for (int64_t d = 0; d < dim; d++) {
            double sum = 0, abs_sum = 0;
            for (int64_t j = c->offsets[b]; j < c->offsets[b + 1]; j++) {
                if (c->idx64[j] == bags->padding_idx) continue;
                const double w = bags->weights ? bags->weights[bags->positional ? j - c->offsets[b] : j] : 1.0;
                const double x = value(table, c->idx64[j], d, dim);
                sum += w * x;
                abs_sum += fabs(w) * (mag_value ? mag_value(table, c->idx64[j], d, dim) : fabs(x));
            }
            const double scale = bags->mean ? (count ? 1.0 / (double)count : 0.0) : 1.0;
            ref[b * dim + d] = sum * scale;
            mag[b * dim + d] = abs_sum * scale;
        }
    }
}

static void compare_rows(const char *what, int64_t dim, int variant, const float *out,
                         const float *scalar_out, const double *ref, const double *mag, double rel)
{
    for (int64_t i = 0; i < NBAGS * dim; i++) {
        const double bound = rel * (mag[i] + 1e-30) + 1e-30;
        CHECK(fabs((double)out[i] - ref[i]) <= bound, "%s D=%lld variant %d [%lld]: %.9g, float64 %.9g",
              what, (long long)dim, variant, (long long)i, out[i], ref[i]);
        CHECK(fabs((double)out[i] - (double)scalar_out[i]) <= 2 * bound,
              "%s D=%lld variant %d [%lld]: %.9g, scalar %.9g", what, (long long)dim, variant,
              (long long)i, out[i], scalar_out[i]);
    }
}

static double f32_row_value(const void *t, int64_t r, int64_t c, int64_t dim)
{
    return ((const float *)t)[r * (dim + 3) + c];
}
static double f16_row_value(const void *t, int64_t r, int64_t c, int64_t dim)
{
    return f16_value(((const uint16_t *)t)[r * (dim + 3) + c]);
}
static double bf16_row_value(const void *t, int64_t r, int64_t c, int64_t dim)
{
    return (double)bits_f32((uint32_t)((const uint16_t *)t)[r * (dim + 3) + c] << 16);
}

/* the bags' variants: index width, weighting, mean, padding */
static void set_variant(pk_bags *bags, const bag_case *c, int v)
{
    memset(bags, 0, sizeof *bags);
    bags->index_64 = v & 1;
    bags->indices = bags->index_64 ? (const void *)c->idx64 : (const void *)c->idx32;
    bags->n_indices = c->n;
    bags->offsets = c->offsets;
    bags->num_bags = NBAGS;
    bags->weights = (v >> 1) % 3 ? c->weights : NULL;
    bags->positional = (v >> 1) % 3 == 2;
    bags->mean = v == 6 || v == 7;
    bags->padding_idx = v >= 6 ? c->idx64[0] : -1;
}
#define N_VARIANTS 8

static void check_float_bags(const pk_embedding_kernels *k, const pk_embedding_kernels *s)
{
    bag_case c;
    make_bags(&c);
    for (size_t di = 0; di < N_DIMS; di++) {
        const int64_t dim = DIMS[di], stride = dim + 3;   /* rows spaced wider than D, unaligned */
        float *f32 = malloc((size_t)(ROWS * stride) * 4);
        uint16_t *f16 = malloc((size_t)(ROWS * stride) * 2), *bf16 = malloc((size_t)(ROWS * stride) * 2);
        for (int64_t i = 0; i < ROWS * stride; i++) {
            f32[i] = rnd_float();
            f16[i] = (uint16_t)(rnd() % 0x7c00) | (uint16_t)(rnd() & 0x8000);
            bf16[i] = (uint16_t)(f32_bits(rnd_float()) >> 16);
        }
        const size_t out_len = (size_t)(NBAGS * dim) + 4;
        float *out = malloc(out_len * 4), *sout = malloc(out_len * 4);
        double *ref = malloc(out_len * 8), *mag = malloc(out_len * 8);
        for (int v = 0; v < N_VARIANTS; v++) {
            pk_bags bags;
            set_variant(&bags, &c, v);
            bags.out_stride = dim;
            const struct { const char *name; pk_embedding_bag_fn fn, sfn; const void *t; row_value_fn val; } types[3] = {
                {"f32", k->embedding_bag_f32, s->embedding_bag_f32, f32, f32_row_value},
                {"f16", k->embedding_bag_f16, s->embedding_bag_f16, f16, f16_row_value},
                {"bf16", k->embedding_bag_bf16, s->embedding_bag_bf16, bf16, bf16_row_value},
            };
            for (int ty = 0; ty < 3; ty++) {
                int64_t bad = -1;
                for (size_t i = 0; i < out_len; i++) out[i] = sout[i] = bits_f32(0x7fc00bad);
                bags.out = out;
                CHECK(types[ty].fn(&bags, types[ty].t, ROWS, dim, stride, &bad) == PK_OK, "%s status", types[ty].name);
                bags.out = sout;
                CHECK(types[ty].sfn(&bags, types[ty].t, ROWS, dim, stride, &bad) == PK_OK, "%s scalar status", types[ty].name);
                CHECK(f32_bits(out[NBAGS * dim]) == 0x7fc00bad, "%s D=%lld wrote past the output",
                      types[ty].name, (long long)dim);
                reference_bags(&c, &bags, types[ty].val, NULL, types[ty].t, dim, ref, mag);
                compare_rows(types[ty].name, dim, v, out, sout, ref, mag, 2e-6);
            }
        }
        /* an index out of range: refused with its position */
        {
            pk_bags bags;
            set_variant(&bags, &c, 1);
            bags.out_stride = dim;
            bags.out = out;
            int64_t saved = c.idx64[9], bad = -1;
            c.idx64[9] = ROWS;
            CHECK(k->embedding_bag_f32(&bags, f32, ROWS, dim, stride, &bad) == PK_ERR_INDEX && bad == 9,
                  "index out of range: bad_pos %lld", (long long)bad);
            c.idx64[9] = -1;
            bad = -1;
            CHECK(k->embedding_bag_bf16(&bags, bf16, ROWS, dim, stride, &bad) == PK_ERR_INDEX && bad == 9,
                  "negative index: bad_pos %lld", (long long)bad);
            c.idx64[9] = saved;
        }
        free(f32); free(f16); free(bf16); free(out); free(sout); free(ref); free(mag);
    }
}

/* --- quantized rows -------------------------------------------------------------------------- */
typedef struct packed_table {
    const uint8_t *rows;
    size_t row_bytes;
    int bits;
} packed_table;

/* scale * q + bias, or with magnitude set |scale * q| + |bias| (the kernels round (w * scale) * q
 * and w * bias separately, so a row's errors scale with those, not with their sum) */
static double packed_element(const void *t_, int64_t r, int64_t c, int magnitude)
{
    const packed_table *t = t_;
    const uint8_t *row = t->rows + (size_t)r * t->row_bytes;
    const size_t codes = t->row_bytes - (t->bits == 8 ? 8 : 4);
    double scale, bias;
    unsigned q;
    if (t->bits == 8) {
        float sb[2];
        memcpy(sb, row + codes, 8);
        scale = sb[0], bias = sb[1];
        q = row[c];
    } else {
        uint16_t sb[2];
        memcpy(sb, row + codes, 4);
        scale = f16_value(sb[0]), bias = f16_value(sb[1]);
        const int per = 8 / t->bits;
        q = (row[c / per] >> (t->bits * (c % per))) & ((1u << t->bits) - 1);
    }
    return magnitude ? fabs(scale * q) + fabs(bias) : scale * q + bias;
}
static double packed_value(const void *t, int64_t r, int64_t c, int64_t dim)
{
    (void)dim;
    return packed_element(t, r, c, 0);
}
static double packed_magnitude(const void *t, int64_t r, int64_t c, int64_t dim)
{
    (void)dim;
    return packed_element(t, r, c, 1);
}

static void check_quantized(const pk_quantized_kernels *k, const pk_quantized_kernels *s)
{
    bag_case c;
    make_bags(&c);
    for (size_t di = 0; di < N_DIMS; di++) {
        const int64_t dim = DIMS[di];
        float *w = malloc((size_t)(ROWS * dim) * 4);
        uint16_t *wh = malloc((size_t)(ROWS * dim) * 2);
        for (int64_t i = 0; i < ROWS * dim; i++) w[i] = rnd_float() * (1 + (i / dim) % 5);
        for (int64_t j = 0; j < dim; j++) w[3 * dim + j] = fabsf(w[3 * dim + j]);  /* min 0 */
        for (int64_t j = 0; j < dim; j++) w[5 * dim + j] = 0.25f;                  /* constant row */
        if (dim > 3) w[7 * dim + 2] = -0.0f;
        /* float16 inputs: the weights rounded (any rounding will do: both levels read the same) */
        scalar_convert->float_to_half(w, wh, (size_t)(ROWS * dim), 0);
        for (int bits = 8; bits >= 2; bits /= 2) {
            const size_t rb = pk_quantized_row_bytes(bits, (size_t)dim);
            uint8_t *pa = malloc(ROWS * rb + 16), *pb = malloc(ROWS * rb + 16);
            for (int half = 0; half < 2; half++) {
                const void *src = half ? (const void *)wh : (const void *)w;
                size_t bad = 0;
                memset(pa, 0x5a, ROWS * rb + 16); memset(pb, 0x5a, ROWS * rb + 16);
                CHECK(k->quantize_rowwise(bits, half, src, ROWS, (size_t)dim, pa, &bad) == PK_OK, "quantize status");
                CHECK(s->quantize_rowwise(bits, half, src, ROWS, (size_t)dim, pb, &bad) == PK_OK, "scalar status");
                for (size_t r = 0; r < ROWS; r++)
                    CHECK(memcmp(pa + r * rb, pb + r * rb, rb) == 0,
                          "quantize_rowwise bits=%d half=%d D=%lld row %zu differs from scalar", bits, half,
                          (long long)dim, r);
                CHECK(pa[ROWS * rb] == 0x5a, "quantize_rowwise wrote past the output");
            }
            /* bags over the (scalar-checked) packed rows */
            const packed_table pt = {pb, rb, bits};
            float *out = malloc((size_t)(NBAGS * dim + 4) * 4), *sout = malloc((size_t)(NBAGS * dim + 4) * 4);
            double *ref = malloc((size_t)(NBAGS * dim) * 8), *mag = malloc((size_t)(NBAGS * dim) * 8);
            for (int v = 0; v < N_VARIANTS; v++) {
                pk_bags bags;
                set_variant(&bags, &c, v);
                bags.out_stride = dim;
                int64_t bad = -1;
                bags.out = out;
                out[NBAGS * dim] = bits_f32(0x7fc00bad);
                CHECK(k->embedding_bag_quantized(bits, &bags, pb, ROWS, (int64_t)rb, dim, &bad) == PK_OK, "status");
                CHECK(f32_bits(out[NBAGS * dim]) == 0x7fc00bad, "quantized bag wrote past the output");
                bags.out = sout;
                CHECK(s->embedding_bag_quantized(bits, &bags, pb, ROWS, (int64_t)rb, dim, &bad) == PK_OK, "status");
                reference_bags(&c, &bags, packed_value, packed_magnitude, &pt, dim, ref, mag);
                char what[32];
                snprintf(what, sizeof what, "%d-bit bag", bits);
                compare_rows(what, dim, v, out, sout, ref, mag, 4e-6);
            }
            /* dequantize: each element scale * q + bias within a float32 rounding or two */
            float *deq = malloc((size_t)(ROWS * dim) * 4);
            k->dequantize_rowwise(bits, pb, ROWS, rb, (size_t)dim, deq);
            for (int64_t r = 0; r < ROWS; r++)
                for (int64_t j = 0; j < dim; j++) {
                    const double want = packed_value(&pt, r, j, dim);
                    CHECK(fabs(deq[r * dim + j] - want) <= 3e-7 * (fabs(want) + 4.0),
                          "dequantize bits=%d D=%lld [%lld, %lld]: %.9g, float64 %.9g", bits, (long long)dim,
                          (long long)r, (long long)j, deq[r * dim + j], want);
                }
            free(deq); free(out); free(sout); free(ref); free(mag); free(pa); free(pb);
        }
        free(w); free(wh);
    }
}

/* --- the dot interaction --------------------------------------------------------------------- */
static void check_interaction(const pk_interaction_kernels *k, const pk_interaction_kernels *s)
{
    enum { NF = 5 };
    int32_t li[NF * NF], lj[NF * NF];
    int64_t pairs = 0;
    for (int i = 0; i < NF; i++)
        for (int j = 0; j < i; j++) li[pairs] = i, lj[pairs] = j, pairs++;
    for (size_t di = 0; di < N_DIMS; di++) {
        const int64_t dim = DIMS[di];
        float *z = malloc((size_t)(NF * dim) * 4), out[NF * NF], sout[NF * NF];
        for (int64_t i = 0; i < NF * dim; i++) z[i] = rnd_float();
        k->interaction_dot(z, dim, li, lj, pairs, out);
        s->interaction_dot(z, dim, li, lj, pairs, sout);
        for (int64_t p = 0; p < pairs; p++) {
            double ref = 0, mag = 0;
            for (int64_t d = 0; d < dim; d++) {
                const double t = (double)z[li[p] * dim + d] * z[lj[p] * dim + d];
                ref += t, mag += fabs(t);
            }
            CHECK(fabs(out[p] - ref) <= 2e-6 * mag + 1e-30, "dot D=%lld pair %lld: %.9g, float64 %.9g",
                  (long long)dim, (long long)p, out[p], ref);
            CHECK(fabs(out[p] - sout[p]) <= 4e-6 * mag + 1e-30, "dot D=%lld pair %lld vs scalar",
                  (long long)dim, (long long)p);
        }
        free(z);
    }
}

/* --- float32 error bounds -------------------------------------------------------------------- */
/* A result the kernels compute in float32, as its float64 value from the definitions and a bound
 * on how far a float32 evaluation can be from it: each operation adds one rounding of its result
 * (an unfused a * b + c two, which the bounds of its product and sum cover) to the first-order
 * propagation of its operands' bounds.  The checks allow twice the bound (ev_ok). */
typedef struct ev { double v, e; } ev;
#define U32 0x1p-24      /* float32's unit roundoff */
#define MATH_REL 3e-7    /* sigmoid / tanh relative error: lstm/vmath.h measures 1.5e-7 / 1.6e-7,
                            the Python tests assert 3e-7 */
static inline ev ev_x(double v) { ev r = {v, 0.0}; return r; }   /* an exact float32 input */
static inline ev ev_round(double v, double e) { ev r = {v, e + U32 * fabs(v)}; return r; }
static inline ev ev_add(ev a, ev b) { return ev_round(a.v + b.v, a.e + b.e); }
static inline ev ev_sub(ev a, ev b) { return ev_round(a.v - b.v, a.e + b.e); }
static inline ev ev_mul(ev a, ev b) { return ev_round(a.v * b.v, fabs(a.v) * b.e + fabs(b.v) * a.e + a.e * b.e); }
static inline ev ev_div(ev a, ev b)
{
    const double v = a.v / b.v, lo = fabs(b.v) - b.e;
    return ev_round(v, lo > 0 ? (a.e + fabs(v) * b.e) / lo : INFINITY);
}
static inline ev ev_sqrt(ev a)
{
    const double v = sqrt(a.v);
    return ev_round(v, v - sqrt(fmax(0.0, a.v - a.e)));
}
static inline ev ev_sigmoid(ev x)
{
    const double s = 1.0 / (1.0 + exp(-x.v));
    ev r = {s, s * (1.0 - s) * x.e + MATH_REL * s};
    return r;
}
static inline ev ev_tanh(ev x)
{
    const double t = tanh(x.v);
    ev r = {t, (1.0 - t * t) * x.e + MATH_REL * fabs(t)};
    return r;
}
/* got within twice want's bound, plus `slack` and float32's smallest normal (results near the
 * underflow threshold round absolutely); a NaN reference wants a NaN */
static inline int ev_ok(double got, ev want, double slack)
{
    if (want.v != want.v) return got != got;
    return fabs(got - want.v) <= 2.0 * want.e + slack + 0x1p-126;
}
/* a level against the scalar level: each within twice the bound of the reference */
static inline int ev_near(double got, double scalar, ev want, double slack)
{
    if (want.v != want.v) return got != got && scalar != scalar;
    return fabs(got - scalar) <= 4.0 * want.e + slack + 0x1p-125;
}

/* --- the LSTM unit --------------------------------------------------------------------------- */
static void check_lstm_math(const pk_lstm_kernels *k)
{
    enum { N = 2003 };
    float *x = malloc(N * 4), *y = malloc((N + 1) * 4);
    for (int i = 0; i < N - 8; i++) x[i] = -30.0f + 60.0f * (float)i / (float)(N - 9);
    const float special[8] = {-0.0f, 1e-30f, -1e-41f, 100.0f, -100.0f, INFINITY, -INFINITY, NAN};
    memcpy(x + N - 8, special, sizeof special);
    for (int fn = PK_MATH_EXP; fn <= PK_MATH_TANH; fn++) {
        y[N] = bits_f32(0x7fc00bad);
        k->lstm_math(fn, x, y, N);
        CHECK(f32_bits(y[N]) == 0x7fc00bad, "lstm_math(%d) wrote past the output", fn);
        for (int i = 0; i < N; i++) {
            const double xv = x[i];
            const double want = fn == PK_MATH_EXP ? exp(xv) : fn == PK_MATH_SIGMOID ? 1.0 / (1.0 + exp(-xv)) : tanh(xv);
            const double rel = fn == PK_MATH_EXP ? 2.5e-7 : MATH_REL;
            const int ok = want != want ? y[i] != y[i]
                         : fabs(want) > 0x1.fffffep127 ? y[i] == copysign(INFINITY, want)
                         : fabs(y[i] - want) <= rel * fabs(want) + 0x1p-126;
            CHECK(ok, "lstm_math(%d, %.9g) = %.9g, float64 %.9g", fn, xv, y[i], want);
        }
        if (fn == PK_MATH_TANH)
            CHECK(f32_bits(y[N - 8]) == 0x80000000u && y[N - 5] == 1.0f && y[N - 4] == -1.0f,
                  "tanh(-0), tanh(+-100): %08x %.9g %.9g", f32_bits(y[N - 8]), y[N - 5], y[N - 4]);
        if (fn == PK_MATH_SIGMOID)
            CHECK(y[N - 5] == 1.0f && y[N - 4] == 0.0f, "sigmoid(+-100) saturates: %.9g %.9g", y[N - 5], y[N - 4]);
    }
    free(x); free(y);
}

static void check_lstm(const pk_lstm_kernels *k, const pk_lstm_kernels *s)
{
    enum { N = 6, GUARD = 4 };
    /* t = 1: rows 1 and 3 are invalid where sequence lengths are given */
    const int32_t len32[N] = {2, 1, 3, 0, 5, 2};
    const int64_t len64[N] = {2, 1, 3, 0, 5, 2};
    check_lstm_math(k);
    for (size_t di = 0; di < N_DIMS; di++) {
        const int64_t d = DIMS[di];
        const size_t nd = (size_t)(N * d);
        /* inputs one float past malloc's alignment: element alignment is all the kernels get */
        float *buf = malloc((nd * 13 + 16 * nd + 64) * 4);
        float *h_prev = buf + 1, *c_prev = h_prev + nd, *gates = c_prev + nd, *c_in = gates + 4 * nd;
        float *dh = c_in + nd, *dc = dh + nd;
        float *o = dc + nd + 1;   /* outputs: h, c, dh_prev, dc_prev (nd + GUARD each), dgates */
        float *h = o, *c = h + nd + GUARD, *dh_prev = c + nd + GUARD, *dc_prev = dh_prev + nd + GUARD;
        float *dgates = dc_prev + nd + GUARD;
        float *so = dgates + 4 * nd + GUARD;   /* the scalar level's */
        float *sh = so, *sc = sh + nd + GUARD, *sdh_prev = sc + nd + GUARD, *sdc_prev = sdh_prev + nd + GUARD;
        float *sdgates = sdc_prev + nd + GUARD;
        float *calias = sdgates + 4 * nd + GUARD;   /* c computed in place over a copy of c_prev */
        for (size_t i = 0; i < nd; i++) {
            h_prev[i] = rnd_float(), c_prev[i] = rnd_float(), c_in[i] = 1.5f * rnd_float();
            dh[i] = rnd_float(), dc[i] = rnd_float();
        }
        for (size_t i = 0; i < 4 * nd; i++) gates[i] = 3.0f * rnd_float();
        /* saturation, infinities and a NaN in the last row's first columns */
        float *last = gates + 4 * (N - 1) * d;
        last[0] = -100.0f, last[d] = 30.0f, last[2 * d] = NAN, last[3 * d] = INFINITY;
        if (d > 1) last[1] = -INFINITY, last[3 * d + 1] = -30.0f, last[d + 1] = -90.0f;
        /* 6 of the 12 variants (gate order x sequence lengths none / int32 / int64 x drop_states)
         * per D, every one over the dims; forget_bias 1 in a third */
        for (int q = 0; q < 6; q++) {
            const int v = 2 * q + (q + (int)di) % 2;
            pk_lstm_params p;
            memset(&p, 0, sizeof p);
            p.n = N, p.d = (size_t)d, p.t = 1;
            p.gate_order = v % 2 ? PK_LSTM_IFGO : PK_LSTM_IFOG;
            p.seq_lengths32 = (v / 2) % 3 == 1 ? len32 : NULL;
            p.seq_lengths64 = (v / 2) % 3 == 2 ? len64 : NULL;
            p.drop_states = v >= 6;
            p.forget_bias = v % 3 == 0 ? 1.0f : 0.0f;
            size_t oi, of, oo, og;
            pk_lstm_gate_blocks(p.gate_order, &oi, &of, &oo, &og);
            for (size_t i = 0; i < so - o; i++) o[i] = bits_f32(0x7fc00bad);
            for (size_t i = 0; i < calias - so; i++) so[i] = bits_f32(0x7fc00bad);
            k->lstm_forward(&p, h_prev, c_prev, gates, h, c);
            s->lstm_forward(&p, h_prev, c_prev, gates, sh, sc);
            k->lstm_backward(&p, c_prev, gates, c_in, dh, dc, dh_prev, dc_prev, dgates);
            s->lstm_backward(&p, c_prev, gates, c_in, dh, dc, sdh_prev, sdc_prev, sdgates);
            if (q == 0) {   /* c written over c_prev, element for element */
                memcpy(calias, c_prev, nd * 4);
                float *hh = malloc(nd * 4);
                k->lstm_forward(&p, h_prev, calias, gates, hh, calias);
                CHECK(memcmp(calias, c, nd * 4) == 0 && memcmp(hh, h, nd * 4) == 0,
                      "lstm_forward D=%lld with c over c_prev differs", (long long)d);
                free(hh);
            }
            for (int g = 0; g < GUARD; g++)
                CHECK(f32_bits(h[nd + g]) == 0x7fc00bad && f32_bits(c[nd + g]) == 0x7fc00bad &&
                      f32_bits(dh_prev[nd + g]) == 0x7fc00bad && f32_bits(dc_prev[nd + g]) == 0x7fc00bad &&
                      f32_bits(dgates[4 * nd + g]) == 0x7fc00bad, "lstm D=%lld wrote past an output", (long long)d);
            for (int64_t n = 0; n < N; n++) {
                const size_t r = (size_t)(n * d);
                if (!pk_lstm_row_valid(&p, (size_t)n)) {   /* copies or zeros, bit for bit */
                    const float *want[4] = {h_prev, c_prev, dh, dc};
                    float *got[4] = {h, c, dh_prev, dc_prev};
                    for (int a = 0; a < 4; a++)
                        for (int64_t j = 0; j < d; j++)
                            CHECK(f32_bits(got[a][r + j]) == (p.drop_states ? 0u : f32_bits(want[a][r + j])),
                                  "lstm variant %d D=%lld invalid row %lld output %d [%lld]", v, (long long)d,
                                  (long long)n, a, (long long)j);
                    for (int64_t j = 0; j < 4 * d; j++)
                        CHECK(f32_bits(dgates[4 * r + j]) == 0, "lstm variant %d invalid row: dgates not 0", v);
                    continue;
                }
                const float *x = gates + 4 * r;
                const float *dxi = dgates + 4 * r + oi * d, *dxf = dgates + 4 * r + of * d;
                const float *dxo = dgates + 4 * r + oo * d, *dxg = dgates + 4 * r + og * d;
                const float *sdxi = sdgates + 4 * r + oi * d, *sdxf = sdgates + 4 * r + of * d;
                const float *sdxo = sdgates + 4 * r + oo * d, *sdxg = sdgates + 4 * r + og * d;
                for (int64_t j = 0; j < d; j++) {
                    const size_t e = r + (size_t)j;
                    const ev one = ev_x(1.0);
                    const ev i = ev_sigmoid(ev_x(x[oi * d + j]));
                    const ev f = ev_sigmoid(ev_add(ev_x(x[of * d + j]), ev_x(p.forget_bias)));
                    const ev og_ = ev_sigmoid(ev_x(x[oo * d + j]));
                    const ev g = ev_tanh(ev_x(x[og * d + j]));
                    /* forward: c = f c_prev + i g, h = o tanh(c) */
                    const ev cc = ev_add(ev_mul(f, ev_x(c_prev[e])), ev_mul(i, g));
                    const ev hh = ev_mul(og_, ev_tanh(cc));
                    CHECK(ev_ok(c[e], cc, 0) && ev_near(c[e], sc[e], cc, 0),
                          "lstm_forward variant %d D=%lld [%lld, %lld]: c %.9g, float64 %.9g, scalar %.9g",
                          v, (long long)d, (long long)n, (long long)j, c[e], cc.v, sc[e]);
                    CHECK(ev_ok(h[e], hh, 0) && ev_near(h[e], sh[e], hh, 0),
                          "lstm_forward variant %d D=%lld [%lld, %lld]: h %.9g, float64 %.9g, scalar %.9g",
                          v, (long long)d, (long long)n, (long long)j, h[e], hh.v, sh[e]);
                    /* backward, given c (c_in), dh, dc */
                    const ev tc = ev_tanh(ev_x(c_in[e]));
                    const ev dct = ev_add(ev_mul(ev_mul(ev_x(dh[e]), og_), ev_sub(one, ev_mul(tc, tc))), ev_x(dc[e]));
                    const ev want[5] = {
                        ev_mul(dct, f),
                        ev_mul(ev_mul(ev_mul(dct, g), i), ev_sub(one, i)),
                        ev_mul(ev_mul(ev_mul(dct, ev_x(c_prev[e])), f), ev_sub(one, f)),
                        ev_mul(ev_mul(ev_mul(ev_x(dh[e]), tc), og_), ev_sub(one, og_)),
                        ev_mul(ev_mul(dct, i), ev_sub(one, ev_mul(g, g))),
                    };
                    const float got[5] = {dc_prev[e], dxi[j], dxf[j], dxo[j], dxg[j]};
                    const float sgot[5] = {sdc_prev[e], sdxi[j], sdxf[j], sdxo[j], sdxg[j]};
                    static const char *names[5] = {"dc_prev", "di", "df", "do", "dg"};
                    for (int a = 0; a < 5; a++)
                        CHECK(ev_ok(got[a], want[a], 0) && ev_near(got[a], sgot[a], want[a], 0),
                              "lstm_backward variant %d D=%lld [%lld, %lld]: %s %.9g, float64 %.9g, scalar %.9g",
                              v, (long long)d, (long long)n, (long long)j, names[a], got[a], want[a].v, sgot[a]);
                    CHECK(f32_bits(dh_prev[e]) == 0, "lstm_backward: dh_prev of a valid row not +0");
                }
            }
        }
        free(buf);
    }
}

/* --- training: the fused backward and optimizer step ----------------------------------------- */
typedef struct opt_case { int optimizer, nesterov; const char *name; } opt_case;
static const opt_case OPTS[] = {
    {PK_OPT_SGD, 0, "sgd"}, {PK_OPT_ADAGRAD, 0, "adagrad"}, {PK_OPT_ROWWISE_ADAGRAD, 0, "rowwise_adagrad"},
    {PK_OPT_ADAM, 0, "adam"}, {PK_OPT_ADAMW, 0, "adamw"}, {PK_OPT_ROWWISE_ADAM, 0, "rowwise_adam"},
    {PK_OPT_MOMENTUM, 0, "momentum"}, {PK_OPT_MOMENTUM, 1, "nesterov"},
};
#define N_OPTS (sizeof OPTS / sizeof OPTS[0])
enum { T_F32, T_F16, T_BF16 };
static const char *const TYPE_NAMES[3] = {"f32", "f16", "bf16"};

static int state_rowwise(int o) { return o == PK_OPT_ROWWISE_ADAGRAD; }
static int has_state2(int o) { return o == PK_OPT_ADAM || o == PK_OPT_ADAMW || o == PK_OPT_ROWWISE_ADAM; }

static double table_value(const void *t, int type, int64_t i)
{
    if (type == T_F32) return ((const float *)t)[i];
    const uint16_t h = ((const uint16_t *)t)[i];
    return type == T_F16 ? f16_value(h) : (double)bits_f32((uint32_t)h << 16);
}

/* the spacing of the 16-bit table format at magnitude |x| */
static double ulp16(double x, int type)
{
    int e;
    frexp(fmax(fabs(x), type == T_F16 ? 0x1p-14 : 0x1p-126), &e);   /* |x| in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - (type == T_F16 ? 10 : 7));
}

/* One touched row's new weights w[0:dim], state h and state2 v (dim values, or one for a row-wise
 * state), in float64 with bounds, from the definitions in perfkernels/training.h; g: the row's
 * summed gradient; w0, h0, v0: the row and its state before. */
static void train_reference_row(const opt_case *oc, const pk_sparse_optim *o, const ev *g,
                                const double *w0, const float *h0, const float *v0, int64_t dim,
                                ev *w, ev *h, ev *v)
{
    const ev one = ev_x(1.0), lr = ev_x(o->lr), eps = ev_x(o->eps), wd = ev_x(o->weight_decay);
    const ev b1 = ev_x(o->beta1), b2 = ev_x(o->beta2), c1 = ev_sub(one, b1), c2 = ev_sub(one, b2);
    ev ss = ev_x(0.0);
    switch (oc->optimizer) {
    case PK_OPT_SGD:
        for (int64_t d = 0; d < dim; d++) {
            const ev W = ev_x(w0[d]);
            w[d] = ev_sub(W, ev_mul(lr, ev_add(g[d], ev_mul(wd, W))));
        }
        break;
    case PK_OPT_ADAGRAD:
        for (int64_t d = 0; d < dim; d++) {
            const ev W = ev_x(w0[d]), gd = ev_add(g[d], ev_mul(wd, W));
            h[d] = ev_add(ev_x(h0[d]), ev_mul(gd, gd));
            w[d] = ev_sub(W, ev_div(ev_mul(lr, gd), ev_add(ev_sqrt(h[d]), eps)));
        }
        break;
    case PK_OPT_ROWWISE_ADAGRAD: {
        for (int64_t d = 0; d < dim; d++) {
            w[d] = ev_add(g[d], ev_mul(wd, ev_x(w0[d])));   /* g + wd w, for now */
            ss = ev_add(ss, ev_mul(w[d], w[d]));
        }
        h[0] = ev_add(ev_x(h0[0]), ev_div(ss, ev_x((double)dim)));
        const ev step = ev_div(lr, ev_add(ev_sqrt(h[0]), eps));
        for (int64_t d = 0; d < dim; d++) w[d] = ev_sub(ev_x(w0[d]), ev_mul(step, w[d]));
        break;
    }
    case PK_OPT_ADAM:
    case PK_OPT_ADAMW:
        for (int64_t d = 0; d < dim; d++) {
            ev W = ev_x(w0[d]), gd = g[d];
            if (oc->optimizer == PK_OPT_ADAMW) W = ev_mul(ev_x(o->decay), W);
            else gd = ev_add(gd, ev_mul(wd, W));
            const ev m0 = ev_x(h0[d]), s0 = ev_x(v0[d]);
            h[d] = ev_add(m0, ev_mul(c1, ev_sub(gd, m0)));
            v[d] = ev_add(s0, ev_mul(c2, ev_sub(ev_mul(gd, gd), s0)));
            w[d] = ev_sub(W, ev_mul(ev_x(o->step_size), ev_div(h[d], ev_add(ev_sqrt(v[d]), eps))));
        }
        break;
    case PK_OPT_ROWWISE_ADAM: {
        for (int64_t d = 0; d < dim; d++) {
            h[d] = ev_add(ev_mul(b1, ev_x(h0[d])), ev_mul(c1, g[d]));
            ss = ev_add(ss, ev_mul(g[d], g[d]));
        }
        v[0] = ev_add(ev_mul(b2, ev_x(v0[0])), ev_mul(c2, ev_div(ss, ev_x((double)dim))));
        const ev a = ev_div(lr, ev_mul(ev_x(o->bias1), ev_add(ev_sqrt(ev_div(v[0], ev_x(o->bias2))), eps)));
        const ev lwd = ev_mul(lr, wd);
        for (int64_t d = 0; d < dim; d++) {
            const ev W = ev_x(w0[d]);
            w[d] = ev_sub(ev_sub(W, ev_mul(a, h[d])), ev_mul(lwd, W));
        }
        break;
    }
    default: {   /* momentum */
        const ev mu = ev_x(o->momentum);
        for (int64_t d = 0; d < dim; d++) {
            const ev W = ev_x(w0[d]), gd = ev_add(g[d], ev_mul(wd, W));
            h[d] = ev_add(ev_mul(mu, ev_x(h0[d])), gd);
            const ev u = oc->nesterov ? ev_add(gd, ev_mul(mu, h[d])) : h[d];
            w[d] = ev_sub(W, ev_mul(lr, u));
        }
    }
    }
}

/* One table, its state and the upstream gradient, as they were before a call. */
typedef struct train_data {
    int type;
    int64_t dim, wstride, sstride, s2stride, gstride;
    size_t table_bytes, state_floats, state2_floats;
    void *table;
    float *state, *state2, *grad;
    float *state_signed, *state_positive;   /* state points at one of them */
} train_data;

/* A copy of the table and its state, the optimizer pointing at the copy's state. */
typedef struct train_copy {
    void *table;
    float *state, *state2;
    pk_sparse_optim opt;
} train_copy;

static void train_copy_init(train_copy *c, const train_data *t, const pk_sparse_optim *opt)
{
    memcpy(c->table, t->table, t->table_bytes);
    memcpy(c->state, t->state, t->state_floats * 4);
    memcpy(c->state2, t->state2, t->state2_floats * 4);
    c->opt = *opt;
    c->opt.state = opt->optimizer == PK_OPT_SGD ? NULL : c->state;
    c->opt.state_stride = t->sstride;
    c->opt.state2 = has_state2(opt->optimizer) ? c->state2 : NULL;
    c->opt.state2_stride = t->s2stride;
}

static int train_same(const train_copy *c, const train_data *t)
{
    return memcmp(c->table, t->table, t->table_bytes) == 0 && memcmp(c->state, t->state, t->state_floats * 4) == 0 &&
           memcmp(c->state2, t->state2, t->state2_floats * 4) == 0;
}

static pk_status train_run(pk_training_update_fn fn, const pk_bags *bags, const train_data *t,
                           train_copy *c, int64_t dim, int64_t *bad)
{
    pk_training_call call = {bags, ROWS, t->grad, t->gstride, c->table, dim, t->wstride, fn, &c->opt};
    pk_training_plan plan;
    pk_training_plan_call(&call, 1, &plan);
    void *work = malloc((size_t)plan.workspace_bytes);
    const pk_status st = pk_training_run(&call, &plan, work, NULL, bad);
    free(work);
    return st;
}

/* The same update through the two steps of training.h, the groups cut in two ranges at `cut`:
 * each row belongs to one group, so the result must be the whole call's, bit for bit. */
static void train_split(pk_training_update_fn fn, const pk_bags *bags, const train_data *t,
                        train_copy *c, int64_t cut_num, int64_t cut_den)
{
    const int64_t n = bags->n_indices, nb = bags->num_bags;
    pk_training_work w;
    memset(&w, 0, sizeof w);
    w.keys = malloc((size_t)n * 8 + 8), w.keys_tmp = malloc((size_t)n * 8 + 8);
    w.entry_bag = malloc((size_t)n * 8 + 8);
    w.entry_coef = w.bag_scale = malloc((size_t)(n > nb ? n : nb) * 4 + 4);
    w.group_start = malloc((size_t)(n + 1) * 8);
    w.histogram = malloc(PK_TRAINING_HISTOGRAM * 8);
    uint64_t *keys = w.keys, *keys_tmp = w.keys_tmp;
    int64_t bad = -1;
    float *scratch = malloc((size_t)(2 * t->dim + 16) * 4);
    CHECK(pk_training_group(bags, ROWS, &w, &bad, NULL, 1, 1) == PK_OK, "pk_training_group status");
    const int64_t cut = w.num_groups * cut_num / cut_den;
    fn(&w, 0, cut, t->grad, t->gstride, c->table, t->dim, t->wstride, &c->opt, scratch);
    fn(&w, cut, w.num_groups, t->grad, t->gstride, c->table, t->dim, t->wstride, &c->opt, scratch);
    free(keys); free(keys_tmp); free(w.entry_bag); free(w.entry_coef); free(w.group_start);
    free(w.histogram); free(scratch);
}

/* Compares a call's result (c) with the float64 reference and with the scalar level's (sc). */
static void train_compare(const char *what, const opt_case *oc, const bag_case *bc, const pk_bags *bags,
                          const train_data *t, const train_copy *c, const train_copy *sc)
{
    const int64_t dim = t->dim;
    const int stochastic = c->opt.stochastic_rounding && t->type != T_F32;
    ev *g = malloc((size_t)dim * sizeof(ev) * 4 + 64);
    ev *w = g + dim, *h = w + dim, *v = h + dim;
    double *w0 = malloc((size_t)dim * 8 + 8);
    const size_t esize = t->type == T_F32 ? 4 : 2;
    for (int64_t r = 0; r < ROWS; r++) {
        /* the row's gradient: its entries in index order, padding skipped */
        int touched = 0;
        for (int64_t d = 0; d < dim; d++) g[d] = ev_x(0.0);
        for (int b = 0; b < NBAGS; b++) {
            int64_t count = 0;
            for (int64_t j = bc->offsets[b]; j < bc->offsets[b + 1]; j++) count += bc->idx64[j] != bags->padding_idx;
            for (int64_t j = bc->offsets[b]; j < bc->offsets[b + 1]; j++) {
                if (bc->idx64[j] != r || r == bags->padding_idx) continue;
                touched = 1;
                const ev wj = ev_x(bags->weights ? bags->weights[bags->positional ? j - bc->offsets[b] : j] : 1.0);
                const ev coef = bags->mean ? ev_mul(wj, ev_div(ev_x(1.0), ev_x((double)count))) : wj;
                const float *G = t->grad + b * t->gstride;
                for (int64_t d = 0; d < dim; d++) g[d] = ev_add(g[d], ev_mul(coef, ev_x(G[d])));
            }
        }
        const size_t row_off = (size_t)(r * t->wstride) * esize;
        const float *h0 = t->state + r * t->sstride, *v0 = t->state2 + r * t->s2stride;
        const float *hk = c->state + r * t->sstride, *vk = c->state2 + r * t->s2stride;
        const float *hs = sc->state + r * t->sstride, *vs = sc->state2 + r * t->s2stride;
        const int64_t nh = oc->optimizer == PK_OPT_SGD ? 0 : state_rowwise(oc->optimizer) ? 1 : dim;
        const int64_t nv = !has_state2(oc->optimizer) ? 0 : oc->optimizer == PK_OPT_ROWWISE_ADAM ? 1 : dim;
        if (!touched) {   /* untouched rows and their state: as they were */
            CHECK(memcmp((char *)c->table + row_off, (char *)t->table + row_off, (size_t)dim * esize) == 0 &&
                  memcmp(hk, h0, (size_t)nh * 4) == 0 && memcmp(vk, v0, (size_t)nv * 4) == 0,
                  "%s %s %s D=%lld: untouched row %lld changed", what, oc->name, TYPE_NAMES[t->type],
                  (long long)dim, (long long)r);
            continue;
        }
        for (int64_t d = 0; d < dim; d++) w0[d] = table_value(t->table, t->type, r * t->wstride + d);
        train_reference_row(oc, &c->opt, g, w0, h0, v0, dim, w, h, v);
        for (int64_t d = 0; d < dim; d++) {
            const double got = table_value(c->table, t->type, r * t->wstride + d);
            const double sgot = table_value(sc->table, t->type, r * t->wstride + d);
            /* a 16-bit table rounds the float32 result: half a unit of its last place (one when
             * stochastic), and the two levels' may round to neighbours */
            const double u16 = t->type == T_F32 ? 0.0 : ulp16(fmax(fabs(w[d].v) + 2 * w[d].e, fabs(got)), t->type);
            CHECK(ev_ok(got, w[d], (stochastic ? 1.0 : 0.5) * u16) &&
                  ev_near(got, sgot, w[d], (stochastic ? 2.0 : 1.0) * u16),
                  "%s %s %s D=%lld row %lld [%lld]: w %.9g, float64 %.9g (bound %.3g), scalar %.9g", what, oc->name,
                  TYPE_NAMES[t->type], (long long)dim, (long long)r, (long long)d, got, w[d].v, 2 * w[d].e, sgot);
        }
        for (int64_t d = 0; d < nh; d++)
            CHECK(ev_ok(hk[d], h[d], 0) && ev_near(hk[d], hs[d], h[d], 0),
                  "%s %s %s D=%lld row %lld [%lld]: state %.9g, float64 %.9g, scalar %.9g", what, oc->name,
                  TYPE_NAMES[t->type], (long long)dim, (long long)r, (long long)d, hk[d], h[d].v, hs[d]);
        for (int64_t d = 0; d < nv; d++)
            CHECK(ev_ok(vk[d], v[d], 0) && ev_near(vk[d], vs[d], v[d], 0),
                  "%s %s %s D=%lld row %lld [%lld]: state2 %.9g, float64 %.9g, scalar %.9g", what, oc->name,
                  TYPE_NAMES[t->type], (long long)dim, (long long)r, (long long)d, vk[d], v[d].v, vs[d]);
    }
    /* the elements between rows (strides wider than D) are never written */
    for (int64_t r = 0; r < ROWS; r++) {
        const size_t gap = (size_t)(r * t->wstride + dim) * esize;
        CHECK(memcmp((char *)c->table + gap, (char *)t->table + gap, (size_t)(t->wstride - dim) * esize) == 0,
              "%s %s D=%lld: wrote between rows", what, oc->name, (long long)dim);
    }
    CHECK(memcmp(c->state + ROWS * t->sstride, t->state + ROWS * t->sstride, 4) == 0 &&
          memcmp(c->state2 + ROWS * t->s2stride, t->state2 + ROWS * t->s2stride, 4) == 0,
          "%s %s D=%lld: wrote past the state", what, oc->name, (long long)dim);
    free(g); free(w0);
}

static void train_data_init(train_data *t, int type, int64_t dim)
{
    t->type = type, t->dim = dim;
    t->wstride = dim + 3, t->sstride = dim + 1, t->s2stride = dim + 2, t->gstride = dim + 2;
    const size_t esize = type == T_F32 ? 4 : 2;
    t->table_bytes = (size_t)(ROWS * t->wstride) * esize;
    t->state_floats = (size_t)((ROWS + 1) * t->sstride), t->state2_floats = (size_t)((ROWS + 1) * t->s2stride);
    t->table = malloc(t->table_bytes);
    t->state_signed = malloc(t->state_floats * 4), t->state_positive = malloc(t->state_floats * 4);
    t->state = t->state_signed, t->state2 = malloc(t->state2_floats * 4);
    t->grad = malloc((size_t)(NBAGS * t->gstride) * 4);
    float *w = malloc((size_t)(ROWS * t->wstride) * 4);
    for (int64_t i = 0; i < ROWS * t->wstride; i++) w[i] = rnd_float();
    if (type == T_F32) memcpy(t->table, w, t->table_bytes);
    else if (type == T_F16) scalar_convert->float_to_half(w, t->table, (size_t)(ROWS * t->wstride), 0);
    else scalar_convert->float_to_bf16(w, t->table, (size_t)(ROWS * t->wstride));
    /* states: m and the momentum buffer of either sign; h and v (the adagrad family's sums, Adam's
     * second moments) positive */
    for (size_t i = 0; i < t->state_floats; i++)
        t->state_signed[i] = rnd_float(), t->state_positive[i] = fabsf(rnd_float());
    for (size_t i = 0; i < t->state2_floats; i++) t->state2[i] = 0.25f * fabsf(rnd_float());
    for (int64_t i = 0; i < NBAGS * t->gstride; i++) t->grad[i] = rnd_float();
    free(w);
}

static void train_data_free(train_data *t)
{
    free(t->table); free(t->state_signed); free(t->state_positive); free(t->state2); free(t->grad);
}

static void train_copy_alloc(train_copy *c, const train_data *t)
{
    c->table = malloc(t->table_bytes);
    c->state = malloc(t->state_floats * 4), c->state2 = malloc(t->state2_floats * 4);
}

static void train_copy_free(train_copy *c) { free(c->table); free(c->state); free(c->state2); }

static void check_training(const pk_training_kernels *k, const pk_training_kernels *s)
{
    bag_case bc;
    make_bags(&bc);
    /* duplicates within a bag (make_bags) and across bags: row idx[1] three times */
    bc.idx64[13] = bc.idx64[17] = bc.idx64[1];
    for (int64_t j = 0; j < bc.n; j++) bc.idx32[j] = (int32_t)bc.idx64[j];
    for (size_t di = 0; di < N_DIMS; di++) {
        const int64_t dim = DIMS[di];
        for (int type = T_F32; type <= T_BF16; type++) {
            const pk_training_update_fn fn = type == T_F32 ? k->training_update_f32
                                           : type == T_F16 ? k->training_update_f16 : k->training_update_bf16;
            const pk_training_update_fn sfn = type == T_F32 ? s->training_update_f32
                                            : type == T_F16 ? s->training_update_f16 : s->training_update_bf16;
            train_data t;
            train_data_init(&t, type, dim);
            train_copy c, sc;
            train_copy_alloc(&c, &t), train_copy_alloc(&sc, &t);
            for (size_t oi = 0; oi < N_OPTS; oi++) {
                const opt_case *oc = &OPTS[oi];
                const int combo = (int)(di * 3 * N_OPTS + (size_t)type * N_OPTS + oi);
                pk_sparse_optim opt;
                memset(&opt, 0, sizeof opt);
                opt.optimizer = oc->optimizer;
                opt.lr = 0.05f, opt.eps = 1e-8f;
                opt.weight_decay = combo % 2 ? 0.01f : 0.0f;
                opt.stochastic_rounding = type != T_F32 && combo % 3 == 0;
                opt.seed = 0x5eed0000u + (uint64_t)combo;
                opt.momentum = 0.9f, opt.nesterov = oc->nesterov;
                if (has_state2(oc->optimizer)) {
                    pk_sparse_optim_adam(&opt, 0.05f, opt.weight_decay, 3, 0.9f, 0.999f, oc->optimizer == PK_OPT_ADAMW);
                    const double lr = 0.05f, wd = opt.weight_decay, b1 = 0.9f, b2 = 0.999f;
                    const double step_size = lr * sqrt(1 - b2 * b2 * b2) / (1 - b1 * b1 * b1);
                    CHECK(fabs(opt.step_size - step_size) <= 1e-7 * step_size &&
                          fabs(opt.bias1 - (1 - b1 * b1 * b1)) <= 1e-7 * opt.bias1 &&
                          fabs(opt.decay - (oc->optimizer == PK_OPT_ADAMW ? 1 - lr * wd : 1.0)) <= 1e-7,
                          "pk_sparse_optim_adam: step_size %.9g bias1 %.9g decay %.9g", opt.step_size, opt.bias1,
                          opt.decay);
                }
                t.state = oc->optimizer == PK_OPT_ADAGRAD || oc->optimizer == PK_OPT_ROWWISE_ADAGRAD
                          ? t.state_positive : t.state_signed;
                t.sstride = state_rowwise(oc->optimizer) ? 2 : dim + 1;
                t.s2stride = oc->optimizer == PK_OPT_ROWWISE_ADAM ? 3 : dim + 2;
                /* two of the bag variants (index width, weights, mean, padding) per combination:
                 * every variant with every optimizer over the dims */
                for (int rep = 0; rep < 2; rep++) {
                    const int v = (combo + rep * 3) % N_VARIANTS;
                    pk_bags bags;
                    set_variant(&bags, &bc, v);
                    int64_t bad = -1;
                    train_copy_init(&c, &t, &opt), train_copy_init(&sc, &t, &opt);
                    CHECK(train_run(fn, &bags, &t, &c, dim, &bad) == PK_OK, "training status");
                    CHECK(train_run(sfn, &bags, &t, &sc, dim, &bad) == PK_OK, "scalar training status");
                    char what[32];
                    snprintf(what, sizeof what, "variant %d", v);
                    train_compare(what, oc, &bc, &bags, &t, &c, &sc);
                    if (rep == 0 && (type == T_F32 || opt.stochastic_rounding)) {
                        /* the groups in two ranges (and stochastic rounding's bits again): bit for bit */
                        train_copy split;
                        train_copy_alloc(&split, &t);
                        train_copy_init(&split, &t, &opt);
                        train_split(fn, &bags, &t, &split, 1 + combo % 3, 4);
                        CHECK(memcmp(split.table, c.table, t.table_bytes) == 0 &&
                              memcmp(split.state, c.state, t.state_floats * 4) == 0 &&
                              memcmp(split.state2, c.state2, t.state2_floats * 4) == 0,
                              "%s %s D=%lld: the groups in two ranges differ from the whole call", oc->name,
                              TYPE_NAMES[type], (long long)dim);
                        train_copy_free(&split);
                    }
                }
                if (oi == di % N_OPTS) {
                    /* nothing to do: no indices, no bags, only padding, D = 0; and a bad index:
                     * refused with its position before anything is written */
                    pk_bags bags;
                    set_variant(&bags, &bc, 7);   /* 64-bit indices, mean, padding */
                    int64_t zeros[NBAGS + 1] = {0}, bad = -1;
                    bags.offsets = zeros, bags.n_indices = 0;
                    train_copy_init(&c, &t, &opt);
                    CHECK(train_run(fn, &bags, &t, &c, dim, &bad) == PK_OK && train_same(&c, &t), "no indices");
                    bags.num_bags = 0;
                    CHECK(train_run(fn, &bags, &t, &c, dim, &bad) == PK_OK && train_same(&c, &t), "no bags");
                    set_variant(&bags, &bc, 6);
                    int64_t same[32];
                    for (int j = 0; j < 32; j++) same[j] = 5;
                    bags.indices = same, bags.index_64 = 1, bags.padding_idx = 5;
                    CHECK(train_run(fn, &bags, &t, &c, dim, &bad) == PK_OK && train_same(&c, &t), "only padding");
                    set_variant(&bags, &bc, 3);
                    CHECK(train_run(fn, &bags, &t, &c, 0, &bad) == PK_OK && train_same(&c, &t), "D = 0");
                    for (int neg = 0; neg < 2; neg++) {
                        const int64_t saved = bc.idx64[9];
                        bc.idx64[9] = neg ? -1 : ROWS;
                        bad = -1;
                        CHECK(train_run(fn, &bags, &t, &c, dim, &bad) == PK_ERR_INDEX && bad == 9 && train_same(&c, &t),
                              "training: bad index refused at %lld", (long long)bad);
                        bc.idx64[9] = saved;
                    }
                }
            }
            train_copy_free(&c), train_copy_free(&sc);
            train_data_free(&t);
        }
    }
}

/* --- unpooled lookups (the sequence family) -------------------------------------------------- */
enum { SEQ_ROWS = 37, SEQ_N = 45 };   /* 45 lookups: past the prefetch distances (16, 32) */

/* rows copied as stored: every row's bytes, bit for bit (random bytes, NaN payloads among them) */
static void check_rows_call(const pk_sequence_kernels *k, const pk_sequence_kernels *s, const char *table,
                            int64_t rows, int64_t row_stride, int64_t row_bytes, const int64_t *idx64,
                            const int32_t *idx32, int64_t n, const char *what)
{
    for (int iw = 0; iw < 2; iw++) {
        const void *idx = iw ? (const void *)idx64 : (const void *)idx32;
        unsigned char *out = malloc((size_t)(n * row_bytes) + 32), *sout = malloc((size_t)(n * row_bytes) + 32);
        memset(out, 0xcd, (size_t)(n * row_bytes) + 32);
        int64_t bad = -1;
        CHECK(k->embedding_rows(table, rows, row_stride, row_bytes, idx, iw, n, out, &bad) == PK_OK, "status");
        CHECK(s->embedding_rows(table, rows, row_stride, row_bytes, idx, iw, n, sout, &bad) == PK_OK, "scalar status");
        for (int64_t j = 0; j < n; j++)
            CHECK(memcmp(out + j * row_bytes, table + idx64[j] * row_stride, (size_t)row_bytes) == 0 &&
                  memcmp(out + j * row_bytes, sout + j * row_bytes, (size_t)row_bytes) == 0,
                  "embedding_rows %s row_bytes=%lld stride=%lld index_64=%d n=%lld: lookup %lld not the row's bytes",
                  what, (long long)row_bytes, (long long)row_stride, iw, (long long)n, (long long)j);
        for (int g = 0; g < 32; g++)
            CHECK(out[n * row_bytes + g] == 0xcd, "embedding_rows %s row_bytes=%lld: wrote past the output", what,
                  (long long)row_bytes);
        free(out); free(sout);
    }
}

/* dequantised rows: q * scale + bias within a rounding or two of float64, and bit for bit the
 * level's own dequantize_rowwise of the row (deq) */
static void check_qrows_call(const pk_sequence_kernels *k, const pk_sequence_kernels *s, int bits,
                             const uint8_t *packed, int64_t rows, int64_t row_bytes, int64_t dim,
                             const packed_table *pt, const float *deq, const int64_t *idx64,
                             const int32_t *idx32, int64_t n, const char *what)
{
    for (int iw = 0; iw < 2; iw++) {
        const void *idx = iw ? (const void *)idx64 : (const void *)idx32;
        float *out = malloc((size_t)(n * dim + 8) * 4), *sout = malloc((size_t)(n * dim + 8) * 4);
        for (int64_t i = 0; i < n * dim + 8; i++) out[i] = bits_f32(0x7fc00bad);
        int64_t bad = -1;
        CHECK(k->embedding_rows_quantized(bits, packed, rows, row_bytes, dim, idx, iw, n, out, &bad) == PK_OK,
              "status");
        CHECK(s->embedding_rows_quantized(bits, packed, rows, row_bytes, dim, idx, iw, n, sout, &bad) == PK_OK,
              "scalar status");
        for (int64_t j = 0; j < n; j++) {
            const int64_t r = idx64[j] % SEQ_ROWS;   /* far tables repeat the small table's rows */
            for (int64_t c = 0; c < dim; c++) {
                const double want = packed_element(pt, r, c, 0), mag = packed_element(pt, r, c, 1);
                const float got = out[j * dim + c];
                CHECK(f32_bits(got) == f32_bits(deq[r * dim + c]) &&
                      fabs(got - want) <= 2.5 * U32 * mag + 0x1p-126 &&
                      fabs(got - sout[j * dim + c]) <= 5 * U32 * mag + 0x1p-125,
                      "embedding_rows_quantized %s bits=%d D=%lld row_bytes=%lld index_64=%d [%lld, %lld]: %.9g, "
                      "dequantize_rowwise %.9g, float64 %.9g, scalar %.9g", what, bits, (long long)dim,
                      (long long)row_bytes, iw, (long long)j, (long long)c, got, deq[r * dim + c], want,
                      sout[j * dim + c]);
            }
        }
        for (int g = 0; g < 8; g++)
            CHECK(f32_bits(out[n * dim + g]) == 0x7fc00bad, "embedding_rows_quantized wrote past the output");
        free(out); free(sout);
    }
}

/* an index out of range (or negative) at position 20: refused there, the rows before it written */
static void check_rows_bad(const pk_sequence_kernels *k, int quantized, int bits, const void *table,
                           int64_t rows, int64_t row_stride, int64_t row_bytes, int64_t dim,
                           const int64_t *idx64, const int32_t *idx32)
{
    int64_t i64[SEQ_N];
    int32_t i32[SEQ_N];
    memcpy(i64, idx64, sizeof i64), memcpy(i32, idx32, sizeof i32);
    i64[20] = rows, i32[20] = -1;
    const size_t out_bytes = quantized ? (size_t)(SEQ_N * dim) * 4 : (size_t)(SEQ_N * row_bytes);
    char *a = malloc(out_bytes + 8), *b = malloc(out_bytes + 8);
    for (int iw = 0; iw < 2; iw++) {
        int64_t bad = -1;
        const void *idx = iw ? (const void *)i64 : (const void *)i32;
        const pk_status st = quantized
            ? k->embedding_rows_quantized(bits, table, rows, row_bytes, dim, idx, iw, SEQ_N, (float *)a, &bad)
            : k->embedding_rows(table, rows, row_stride, row_bytes, idx, iw, SEQ_N, a, &bad);
        CHECK(st == PK_ERR_INDEX && bad == 20, "%s: bad index (index_64=%d) status %d at %lld",
              quantized ? "embedding_rows_quantized" : "embedding_rows", iw, (int)st, (long long)bad);
    }
    /* the rows before it: as a call over those 20 alone */
    int64_t bad = -1;
    const pk_status st = quantized
        ? k->embedding_rows_quantized(bits, table, rows, row_bytes, dim, idx64, 1, 20, (float *)b, &bad)
        : k->embedding_rows(table, rows, row_stride, row_bytes, idx64, 1, 20, b, &bad);
    const size_t before = quantized ? (size_t)(20 * dim) * 4 : (size_t)(20 * row_bytes);
    CHECK(st == PK_OK && memcmp(a, b, before) == 0, "bad index: the rows before it differ");
    free(a); free(b);
}

static void check_sequence(const pk_sequence_kernels *k, const pk_sequence_kernels *s,
                           const pk_quantized_kernels *kq, const pk_quantized_kernels *sq)
{
    int64_t idx64[SEQ_N];
    int32_t idx32[SEQ_N];
    for (int j = 0; j < SEQ_N; j++) idx64[j] = rnd() % SEQ_ROWS, idx32[j] = (int32_t)idx64[j];
    idx64[7] = idx64[8], idx32[7] = idx32[8];
    /* the awkward dims, and those whose rows the kernels specialise (64 .. 1024 bytes) */
    int64_t dims[N_DIMS + 3];
    memcpy(dims, DIMS, sizeof DIMS);
    dims[N_DIMS] = 32, dims[N_DIMS + 1] = 256, dims[N_DIMS + 2] = 512;
    for (size_t di = 0; di < N_DIMS + 3; di++) {
        const int64_t dim = dims[di];
        for (int64_t esize = 4; esize >= 2; esize -= 2) {
            const int64_t row_bytes = dim * esize;
            for (int layout = 0; layout < 2; layout++) {
                /* rows back to back on a 64-byte boundary, or 6 bytes apart from an odd address */
                const int64_t stride = layout ? row_bytes + 6 : row_bytes;
                unsigned char *base = aligned_alloc(64, (size_t)(SEQ_ROWS * stride + 64) / 64 * 64 + 64);
                unsigned char *table = base + (layout ? 3 : 0);
                for (int64_t i = 0; i < SEQ_ROWS * stride; i++) table[i] = (unsigned char)rnd();
                const char *what = esize == 4 ? "f32 rows" : "16-bit rows";
                const int64_t ns[3] = {0, 1, SEQ_N};
                for (int ni = 0; ni < 3; ni++)
                    check_rows_call(k, s, (const char *)table, SEQ_ROWS, stride, row_bytes, idx64, idx32, ns[ni], what);
                check_rows_bad(k, 0, 0, table, SEQ_ROWS, stride, row_bytes, dim, idx64, idx32);
                free(base);
            }
        }
        for (int bits = 8; bits >= 2; bits /= 2) {
            const size_t rb = pk_quantized_row_bytes(bits, (size_t)dim);
            float *w = malloc((size_t)(SEQ_ROWS * dim) * 4), *deq = malloc((size_t)(SEQ_ROWS * dim) * 4);
            uint8_t *packed = malloc(SEQ_ROWS * rb), *padded = malloc(SEQ_ROWS * (rb + 5));
            for (int64_t i = 0; i < SEQ_ROWS * dim; i++) w[i] = rnd_float() * (float)(1 + (i / dim) % 4);
            size_t badr = 0;
            CHECK(sq->quantize_rowwise(bits, 0, w, SEQ_ROWS, (size_t)dim, packed, &badr) == PK_OK, "quantize status");
            kq->dequantize_rowwise(bits, packed, SEQ_ROWS, rb, (size_t)dim, deq);
            /* rows of rb + 5 bytes: codes, scale and bias, 5 bytes of padding */
            for (int64_t r = 0; r < SEQ_ROWS; r++) {
                memcpy(padded + r * (rb + 5), packed + r * rb, rb);
                for (int p = 0; p < 5; p++) padded[r * (rb + 5) + rb + p] = (uint8_t)rnd();
            }
            const packed_table pt = {packed, rb, bits};
            const int64_t ns[3] = {0, 1, SEQ_N};
            for (int ni = 0; ni < 3; ni++) {
                check_qrows_call(k, s, bits, packed, SEQ_ROWS, (int64_t)rb, dim, &pt, deq, idx64, idx32, ns[ni],
                                 "packed");
                check_qrows_call(k, s, bits, padded, SEQ_ROWS, (int64_t)rb + 5, dim, &pt, deq, idx64, idx32,
                                 ns[ni], "padded");
            }
            check_rows_bad(k, 1, bits, packed, SEQ_ROWS, 0, (int64_t)rb, dim, idx64, idx32);
            free(w); free(deq); free(packed); free(padded);
        }
    }
    /* tables of 16 MiB and more take the far-prefetch loops: 45 random rows of them */
    {
        static const struct { int64_t dim, esize; } far[2] = {{64, 4}, {33, 2}};
        for (int f = 0; f < 2; f++) {
            const int64_t row_bytes = far[f].dim * far[f].esize;
            const int64_t rows = (int64_t)((PK_BAGS_FAR_MIN_BYTES + (uint64_t)row_bytes - 1) / (uint64_t)row_bytes);
            char *table = malloc((size_t)(rows * row_bytes));
            int64_t i64[SEQ_N];
            int32_t i32[SEQ_N];
            for (int j = 0; j < SEQ_N; j++) {
                i64[j] = (int64_t)(((uint64_t)rnd() << 20 | rnd()) % (uint64_t)rows), i32[j] = (int32_t)i64[j];
                for (int64_t b = 0; b < row_bytes; b++) table[i64[j] * row_bytes + b] = (char)rnd();
            }
            check_rows_call(k, s, table, rows, row_bytes, row_bytes, i64, i32, SEQ_N, "far");
            free(table);
        }
        for (int bits = 8; bits >= 4; bits /= 2) {
            const int64_t dim = bits == 8 ? 64 : 7;
            const size_t rb = pk_quantized_row_bytes(bits, (size_t)dim);
            const int64_t rows = (int64_t)((PK_BAGS_FAR_MIN_BYTES + rb - 1) / rb);
            float *w = malloc((size_t)(SEQ_ROWS * dim) * 4), *deq = malloc((size_t)(SEQ_ROWS * dim) * 4);
            uint8_t *packed = malloc(SEQ_ROWS * rb), *table = malloc((size_t)rows * rb);
            for (int64_t i = 0; i < SEQ_ROWS * dim; i++) w[i] = rnd_float();
            size_t badr = 0;
            CHECK(sq->quantize_rowwise(bits, 0, w, SEQ_ROWS, (size_t)dim, packed, &badr) == PK_OK, "quantize status");
            kq->dequantize_rowwise(bits, packed, SEQ_ROWS, rb, (size_t)dim, deq);
            int64_t i64[SEQ_N];
            int32_t i32[SEQ_N];
            for (int j = 0; j < SEQ_N; j++) {   /* row i of the far table: row i % SEQ_ROWS of packed */
                i64[j] = (int64_t)(((uint64_t)rnd() << 20 | rnd()) % (uint64_t)rows), i32[j] = (int32_t)i64[j];
                memcpy(table + (size_t)i64[j] * rb, packed + (size_t)(i64[j] % SEQ_ROWS) * rb, rb);
            }
            const packed_table pt = {packed, rb, bits};
            check_qrows_call(k, s, bits, table, rows, (int64_t)rb, dim, &pt, deq, i64, i32, SEQ_N, "far");
            free(w); free(deq); free(packed); free(table);
        }
    }
}

/* `arm_driver bench LEVEL KIND D ROWS`: one bag of ROWS random rows of a 4096-row table (KIND f32:
 * float32, q8: 8-bit rows) summed at LEVEL (or none: the same setup, no kernel call), for counting
 * instructions per row under the emulator (docs/arm.md). */
static int bench(const char *level, const char *kind, int64_t dim, int64_t n)
{
    enum { TABLE_ROWS = 4096 };
    int isa = -1;
    for (int i = 0; i < PK_ISA_COUNT; i++)
        if (strcmp(pk_isa_name(i), level) == 0) isa = i;
    int64_t *idx = malloc((size_t)n * 8), offsets[2] = {0, n}, bad = -1;
    for (int64_t j = 0; j < n; j++) idx[j] = rnd() % TABLE_ROWS;
    float *out = calloc((size_t)dim, 4);
    pk_bags bags = {idx, n, 1, offsets, 1, NULL, 0, 0, -1, out, dim};
    pk_status st = PK_OK;
    if (strcmp(kind, "f32") == 0) {
        float *t = calloc((size_t)(TABLE_ROWS * dim), 4);
        if (isa >= 0) st = pk_embedding_table(isa)->embedding_bag_f32(&bags, t, TABLE_ROWS, dim, dim, &bad);
    } else {
        const size_t rb = pk_quantized_row_bytes(8, (size_t)dim);
        uint8_t *t = calloc(TABLE_ROWS, rb);
        if (isa >= 0) st = pk_quantized_table(isa)->embedding_bag_quantized(8, &bags, t, TABLE_ROWS, (int64_t)rb, dim, &bad);
    }
    printf("bench %s %s D=%lld rows=%lld status %d\n", level, kind, (long long)dim, (long long)n, (int)st);
    return st != PK_OK;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "bench") == 0)
        return bench(argv[2], argv[3], atoll(argv[4]), atoll(argv[5]));
    const uint64_t have = pk_cpu_detect();
    printf("cpu");
    for (int f = 0; f < PK_CPU_FEATURE_COUNT; f++)
        if ((have >> f) & 1) printf(" %s", pk_cpu_feature_name(f));
    const int sve_vl = (have >> PK_CPU_SVE) & 1 ? prctl(PR_SVE_GET_VL) & 0xffff : 0;
    printf("; sve vector length %d bits\n", sve_vl * 8);
    const pk_convert_kernels *sc = scalar_convert = pk_convert_table(PK_ISA_scalar);
    const pk_embedding_kernels *se = pk_embedding_table(PK_ISA_scalar);
    const pk_quantized_kernels *sq = pk_quantized_table(PK_ISA_scalar);
    const pk_interaction_kernels *si = pk_interaction_table(PK_ISA_scalar);
    const pk_lstm_kernels *sl = pk_lstm_table(PK_ISA_scalar);
    const pk_training_kernels *st = pk_training_table(PK_ISA_scalar);
    const pk_sequence_kernels *ss = pk_sequence_table(PK_ISA_scalar);
    static const struct { int isa; int needs; } levels[] = {
        {PK_ISA_neon, PK_CPU_ASIMD}, {PK_ISA_sve, PK_CPU_SVE},
    };
    for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
        const int isa = levels[l].isa;
        level_name = pk_isa_name(isa);
        if (argc > 1 && strcmp(argv[1], level_name) != 0) continue;
        if (!pk_isa_compiled(isa)) {
            printf("level %s: not built\n", level_name);
            continue;
        }
        if (!((have >> levels[l].needs) & 1) || !((have >> PK_CPU_ASIMD) & 1)) {
            printf("level %s: skipped (cpu lacks %s)\n", level_name, pk_cpu_feature_name(levels[l].needs));
            continue;
        }
        /* each family's failures counted (only the first 40 failures are printed) */
        int counts[7], at = failures;
        const char *const names[7] = {"convert", "embedding", "quantized", "interaction", "lstm", "training",
                                      "sequence"};
#define COUNTED(i, call) do { call; counts[i] = failures - at; at = failures; } while (0)
        COUNTED(0, check_convert(pk_convert_table(isa), sc));
        COUNTED(1, check_float_bags(pk_embedding_table(isa), se));
        COUNTED(2, check_quantized(pk_quantized_table(isa), sq));
        COUNTED(3, check_interaction(pk_interaction_table(isa), si));
        COUNTED(4, check_lstm(pk_lstm_table(isa), sl));
        COUNTED(5, check_training(pk_training_table(isa), st));
        COUNTED(6, check_sequence(pk_sequence_table(isa), ss, pk_quantized_table(isa), sq));
#undef COUNTED
        int failed = 0;
        for (int i = 0; i < 7; i++) failed += counts[i];
        printf("level %s: %s", level_name, failed ? "FAILED (failures:" : "ok");
        for (int i = 0; i < 7 && failed; i++)
            if (counts[i]) printf(" %s %d", names[i], counts[i]);
        printf("%s\n", failed ? ")" : "");
    }
    return failures > 100 ? 100 : failures;
}
