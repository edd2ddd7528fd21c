/* Fused float64 CPU kernels for Neural Laplace training (see nlmodels/accel/native/__init__.py).
 *
 * Plain C99 over raw pointers, no Python or torch headers: compiled once per machine, loaded
 * with ctypes. Every kernel has a pure-torch twin (nlmodels/accel/gru.py and
 * nlmodels/accel/decoder.py) that the tests hold it to. The Python side checks every pointer
 * argument's shape against the sizes passed before calling (nlmodels/accel/native/__init__.py).
 *
 * Layout of the GRU kernels: "feature-major": a sequence of B-vectors is stored [F][T][B], so
 * every elementwise loop and every small matrix product runs over B contiguous doubles.
 */
#ifndef NL_WIDE_PASS
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;
#endif

/* Vectors of 8 doubles with AVX-512, 4 with AVX2 + FMA; the transcendentals are the inline
 * polynomials below. Any other target stops the build here, and the Python side keeps its
 * pure-torch path. */
#if defined(__AVX512F__)
typedef __m512d vd;
#define VW 8
#define V_SET1(a) _mm512_set1_pd(a)
#define V_LOAD(p) _mm512_loadu_pd(p)
#define V_STORE(p, v) _mm512_storeu_pd((p), (v))
#define V_MASK(m) ((__mmask8)((1u << (m)) - 1u))
#define V_LOAD_N(p, m) _mm512_maskz_loadu_pd(V_MASK(m), (p))
#define V_STORE_N(p, v, m) _mm512_mask_storeu_pd((p), V_MASK(m), (v))
#define V_SUM(v) _mm512_reduce_add_pd(v)
#define V_MIN(a, b) _mm512_min_pd((a), (b))
#define V_FMA(a, b, c) _mm512_fmadd_pd((a), (b), (c))
#define V_MAX(a, b) _mm512_max_pd((a), (b))
#if defined(NL_WIDE_PASS) /* the portable build's 512-bit pass: its 256-bit pass's division */
#define V_RECIP(d) (_mm512_set1_pd(1.0) / (d))
#else
/* 1/d: 14-bit estimate, two Newton steps (error 2^-56), far cheaper than vdivpd */
static inline vd V_RECIP(vd d) {
    vd y = _mm512_rcp14_pd(d);
    y = y * (_mm512_set1_pd(2.0) - d * y);
    return y * (_mm512_set1_pd(2.0) - d * y);
}
#endif
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256d vd;
#define VW 4
#define V_SET1(a) _mm256_set1_pd(a)
#define V_LOAD(p) _mm256_loadu_pd(p)
#define V_STORE(p, v) _mm256_storeu_pd((p), (v))
#define V_MASK(m) _mm256_cmpgt_epi64(_mm256_set1_epi64x(m), _mm256_setr_epi64x(0, 1, 2, 3))
#define V_LOAD_N(p, m) _mm256_maskload_pd((p), V_MASK(m))
#define V_STORE_N(p, v, m) _mm256_maskstore_pd((p), V_MASK(m), (v))
static inline double V_SUM(__m256d v) {
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#define V_MIN(a, b) _mm256_min_pd((a), (b))
#define V_FMA(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#define V_MAX(a, b) _mm256_max_pd((a), (b))
#define V_RECIP(d) (_mm256_set1_pd(1.0) / (d))
#else
#error "nlmodels native kernels need x86-64 with AVX2+FMA or AVX-512"
#endif

typedef long long vl __attribute__((vector_size(sizeof(vd))));

/* The portable build (256-bit vectors, no FMA contraction) compiles its lane-wise kernels (each
 * element computed on its own, no sum across lanes: the GRU's forward pass, the decoder's forward
 * layers and its tanh derivatives, whose column sums keep one column per lane) a second time for 512-bit vectors, taken where the CPU has AVX-512F: the same
 * operations lane by lane, so the same bits (the tests compare the two), in half the
 * instructions (the GRU's backward pass too, its sums along rows kept in 4 lanes). The passes
 * name them *_w4 and *_w8; the end of this file dispatches. */
#if !defined(NL_WIDE_PASS) && !defined(__AVX512F__)
#define NL_HAS_WIDE 1
#define nl_gru_forward nl_gru_forward_w4
#define nl_first_hidden nl_first_hidden_w4
#define nl_bias_tanh nl_bias_tanh_w4
#define nl_sphere_out_forward nl_sphere_out_forward_w4
#define nl_gru_backward nl_gru_backward_w4
#define nl_first_hidden_backward nl_first_hidden_backward_w4
#define nl_tanh_backward nl_tanh_backward_w4
#endif

/* Sums along a row (the GRU's weight gradients) keep partial sums in vector lanes, whose number
 * decides their bits: the 512-bit pass keeps the 256-bit pass's 4 lanes for them. */
#define NL_CAT_(a, b) a##b
#define NL_CAT(a, b) NL_CAT_(a, b)
#if defined(NL_WIDE_PASS)
typedef __m256d sd;
#define SW 4
#define S_SET1(a) _mm256_set1_pd(a)
#define S_LOAD(p) _mm256_loadu_pd(p)
#define S_STORE(p, v) _mm256_storeu_pd((p), (v))
#define S_LOAD_N(p, m)                                                                           \
    _mm256_maskload_pd((p), _mm256_cmpgt_epi64(_mm256_set1_epi64x(m), _mm256_setr_epi64x(0, 1, 2, 3)))
#define S_FMA(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#define NL_SUFFIX _w8
#else
typedef vd sd;
#define SW VW
#define S_SET1 V_SET1
#define S_LOAD V_LOAD
#define S_STORE V_STORE
#define S_LOAD_N V_LOAD_N
#define S_FMA V_FMA
#define NL_SUFFIX
#endif

/* The elementwise maths below take n <= ILP independent vectors at once (n a constant where they
 * are inlined) and do each step for all of them before the next: one vector's polynomial is a
 * chain of dependent multiply-adds that leaves the FP pipes idle, and out-of-order execution
 * cannot reach far enough ahead to fill them from the next vector. Each lane's operations are
 * the same in the same order, whatever n. */
#define ILP 4
#define FOR_U(n) for (int u = 0; u < (n); ++u)
#define NL_MATH static inline __attribute__((always_inline))

/* e^x - 1 for |x| <= 708 (clamped beyond): x = k ln2 + r with |r| <= ln2/2 (Cody-Waite split
 * of ln2), q = e^r - 1 by its Taylor polynomial to degree 12 (truncation < 2e-16 relative,
 * and accurate for tiny x because the leading 1 is never added), and twok = 2^k; x is replaced
 * by q. Inline and branch-free (cheaper than a call into glibc's libmvec); the GRU needs 3 of
 * these per unit and step. */
NL_MATH void v_expm1_parts(int n, vd *x, vd *twok) {
    const vd magic = V_SET1(6755399441055744.0); /* 1.5 * 2^52: adding it rounds to an integer */
    vd kd[ILP], r[ILP], p[ILP];
    FOR_U(n) x[u] = V_MIN(V_SET1(708.0), V_MAX(V_SET1(-708.0), x[u])); /* keeps NaN */
    FOR_U(n) kd[u] = (x[u] * V_SET1(1.4426950408889634) + magic) - magic;
    FOR_U(n) r[u] = V_FMA(-kd[u], V_SET1(1.90821492927058770002e-10),
                          V_FMA(-kd[u], V_SET1(0.693147180369123816490), x[u]));
    FOR_U(n) p[u] = V_SET1(1.0 / 479001600.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 39916800.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 3628800.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 362880.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 40320.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 5040.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 720.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 120.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 24.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(1.0 / 6.0);
    FOR_U(n) p[u] = p[u] * r[u] + V_SET1(0.5);
    FOR_U(n) {
        const vl k = (vl)(kd[u] + magic) - (vl)magic; /* the integer k, from the low mantissa bits */
        twok[u] = (vd)((k + 1023) << 52);
        x[u] = V_FMA(r[u] * r[u], p[u], r[u]);
    }
}

/* e^x, in place */
NL_MATH void v_exp(int n, vd *x) {
    vd twok[ILP];
    v_expm1_parts(n, x, twok);
    FOR_U(n) x[u] = V_FMA(x[u], twok[u], twok[u]);
}

/* 1/(1 + e^{-a}), in place */
NL_MATH void v_sigmoid(int n, vd *a) {
    FOR_U(n) a[u] = -a[u];
    v_exp(n, a);
    FOR_U(n) a[u] = V_RECIP(V_SET1(1.0) + a[u]);
}

/* tanh a = e/(e + 2) with e = e^{2a} - 1: relative accuracy near 0, no overflow; in place. */
NL_MATH void v_tanh_fast(int n, vd *a) {
    vd twok[ILP];
    FOR_U(n) a[u] = a[u] + a[u];
    v_expm1_parts(n, a, twok);
    FOR_U(n) a[u] = V_FMA(a[u], twok[u], twok[u] - V_SET1(1.0));
    FOR_U(n) a[u] = a[u] * V_RECIP(a[u] + V_SET1(2.0));
}

/* sin r and cos r for |r| <= pi/4: Taylor polynomials to degree 15 and 16 (truncation
 * < 1e-16). */
NL_MATH void v_sincos_reduced(int n, const vd *r, vd *sin_out, vd *cos_out) {
    vd r2[ILP], s[ILP], c[ILP];
    FOR_U(n) r2[u] = r[u] * r[u];
    FOR_U(n) s[u] = V_SET1(-1.0 / 1307674368000.0);
    FOR_U(n) s[u] = s[u] * r2[u] + V_SET1(1.0 / 6227020800.0);
    FOR_U(n) s[u] = s[u] * r2[u] + V_SET1(-1.0 / 39916800.0);
    FOR_U(n) s[u] = s[u] * r2[u] + V_SET1(1.0 / 362880.0);
    FOR_U(n) s[u] = s[u] * r2[u] + V_SET1(-1.0 / 5040.0);
    FOR_U(n) s[u] = s[u] * r2[u] + V_SET1(1.0 / 120.0);
    FOR_U(n) s[u] = s[u] * r2[u] + V_SET1(-1.0 / 6.0);
    FOR_U(n) sin_out[u] = V_FMA(r[u] * r2[u], s[u], r[u]);
    FOR_U(n) c[u] = V_SET1(1.0 / 20922789888000.0);
    FOR_U(n) c[u] = c[u] * r2[u] + V_SET1(-1.0 / 87178291200.0);
    FOR_U(n) c[u] = c[u] * r2[u] + V_SET1(1.0 / 479001600.0);
    FOR_U(n) c[u] = c[u] * r2[u] + V_SET1(-1.0 / 3628800.0);
    FOR_U(n) c[u] = c[u] * r2[u] + V_SET1(1.0 / 40320.0);
    FOR_U(n) c[u] = c[u] * r2[u] + V_SET1(-1.0 / 720.0);
    FOR_U(n) c[u] = c[u] * r2[u] + V_SET1(1.0 / 24.0);
    FOR_U(n) c[u] = c[u] * r2[u] + V_SET1(-0.5);
    FOR_U(n) cos_out[u] = V_FMA(r2[u], c[u], V_SET1(1.0));
}

/* sin x and cos x for |x| < ~1e5: x = k pi/2 + r with |r| <= pi/4 (pi/2 split in two for FMA
 * reduction), then the quadrant k mod 4 swaps and negates. One reduction serves both. */
NL_MATH void v_sincos(int n, const vd *x, vd *sin_out, vd *cos_out) {
    const vd magic = V_SET1(6755399441055744.0);
    vd kd[ILP], r[ILP], s[ILP], c[ILP];
    FOR_U(n) kd[u] = (x[u] * V_SET1(0.63661977236758134308) + magic) - magic;
    FOR_U(n) r[u] = V_FMA(-kd[u], V_SET1(1.57079632679489655800), x[u]);
    FOR_U(n) r[u] = V_FMA(-kd[u], V_SET1(6.12323399573676603587e-17), r[u]);
    v_sincos_reduced(n, r, s, c);
    FOR_U(n) {
        const vl k = (vl)(kd[u] + magic) - (vl)magic;
        const vl swap = (k & 1) != 0; /* odd quadrant: sin <-> cos */
        const vl vs = (vl)s[u], vc = (vl)c[u];
        const vl sin_bits = (vc & swap) | (vs & ~swap), cos_bits = (vs & swap) | (vc & ~swap);
        const vl sign = (vl)V_SET1(-0.0);
        sin_out[u] = (vd)(sin_bits ^ ((k << 62) & sign));       /* negative in quadrants 2, 3 */
        cos_out[u] = (vd)(cos_bits ^ (((k + 1) << 62) & sign)); /* negative in quadrants 1, 2 */
    }
}

/* tan(pi/4 + v) = (cos v + sin v)/(cos v - sin v) for |v| <= pi/4: the stereographic radius
 * tan(phi/2 + pi/4) with v = phi/2, phi in [-pi/2, pi/2]; no range reduction needed. In place. */
NL_MATH void v_tan_quarter_plus(int n, vd *v) {
    vd s[ILP], c[ILP];
    v_sincos_reduced(n, v, s, c);
    FOR_U(n) v[u] = (c[u] + s[u]) * V_RECIP(c[u] - s[u]);
}

/* Load/store m <= VW lanes; m == VW (a constant at full-vector call sites) is a plain access. */
#define LD(p, m) ((m) == VW ? V_LOAD(p) : V_LOAD_N((p), (m)))
#define ST(p, v, m) ((m) == VW ? V_STORE((p), (v)) : V_STORE_N((p), (v), (m)))
/* Run BODY(i, m) over [0, n) in full vectors, then one partial vector for the tail. */
#define FOR_VECTORS(n, BODY)                                  \
    do {                                                      \
        i64 i_ = 0;                                           \
        for (; i_ + VW <= (n); i_ += VW) BODY(i_, VW);        \
        if (i_ < (n)) BODY(i_, (int)((n) - i_));              \
    } while (0)
/* Run BODY(i, nv, m) over [0, n): nv vectors from i, all full but the last, which has m lanes;
 * ILP full vectors at a time (see ILP), then one at a time, the partial tail last. */
#define FOR_VECTOR_GROUPS(n, BODY)                                      \
    do {                                                                \
        i64 i_ = 0;                                                     \
        for (; i_ + ILP * VW <= (n); i_ += ILP * VW) BODY(i_, ILP, VW); \
        for (; i_ + VW <= (n); i_ += VW) BODY(i_, 1, VW);               \
        if (i_ < (n)) BODY(i_, 1, (int)((n) - i_));                     \
    } while (0)
/* Vector u of a group of nv from i: its first element and its lanes */
#define AT(i, u) ((i) + (u) * VW)
#define WIDTH(u, nv, m) ((u) == (nv) - 1 ? (m) : VW)

/* Vectors per register block of gemm_rows: R rows x GEMM_VECTORS vectors of accumulators stay in
 * registers (4 x 2 of the 16 ymm registers: a wider block spills them to the stack). */
#define GEMM_VECTORS 2
#define GEMM_COLUMNS (GEMM_VECTORS * VW)

/* A register block of R rows x GEMM_COLUMNS columns of gemm_rows: each element starts at its
 * row's bias (or 0) and adds w[j][kk] in[kk][c] for kk = 0 .. k-1 in order, as the scalar column
 * tail does, so its bits do not depend on the blocking; each loaded input vector feeds R
 * multiply-adds. */
#define GEMM_BLOCK(R)                                                                          \
    static inline void gemm_block_##R(i64 k, const double *restrict w, i64 ldw,               \
                                      const double *restrict bias, int accumulate,            \
                                      const double *restrict in, i64 in_stride,               \
                                      double *restrict out, i64 out_stride) {                 \
        vd acc[R][GEMM_VECTORS];                                                               \
        for (int jj = 0; jj < R; jj++) {                                                       \
            const vd init = V_SET1(bias ? bias[jj] : 0.0);                                     \
            for (int v = 0; v < GEMM_VECTORS; v++) acc[jj][v] = init;                          \
        }                                                                                      \
        for (i64 kk = 0; kk < k; kk++) {                                                       \
            const double *restrict src = in + kk * in_stride;                                  \
            vd sv[GEMM_VECTORS];                                                               \
            for (int v = 0; v < GEMM_VECTORS; v++) sv[v] = V_LOAD(src + v * VW);               \
            for (int jj = 0; jj < R; jj++) {                                                   \
                const vd wv = V_SET1(w[jj * ldw + kk]);                                        \
                for (int v = 0; v < GEMM_VECTORS; v++) acc[jj][v] = acc[jj][v] + wv * sv[v];   \
            }                                                                                  \
        }                                                                                      \
        for (int jj = 0; jj < R; jj++)                                                         \
            for (int v = 0; v < GEMM_VECTORS; v++) {                                           \
                double *dst = out + jj * out_stride + v * VW;                                  \
                if (accumulate) acc[jj][v] = V_LOAD(dst) + acc[jj][v];                         \
                V_STORE(dst, acc[jj][v]);                                                      \
            }                                                                                  \
    }
GEMM_BLOCK(4)
GEMM_BLOCK(2)
GEMM_BLOCK(1)

/* out[j][c] (=|+=) bias[j] + sum_k w[j][k] in[k][c] for j < m, c < n (bias may be NULL).
 * w is m x k with row stride ldw; in and out rows are strided (in_stride, out_stride doubles).
 * Register-blocked: 4, then 2, then 1 rows at a time, GEMM_COLUMNS columns at a time. */
static void gemm_rows(i64 m, i64 k, i64 n, const double *restrict w, i64 ldw,
                      const double *restrict bias, int accumulate, const double *restrict in,
                      i64 in_stride, double *restrict out, i64 out_stride) {
    i64 c0 = 0;
    for (; c0 + GEMM_COLUMNS <= n; c0 += GEMM_COLUMNS) {
        i64 j = 0;
        for (; j + 4 <= m; j += 4)
            gemm_block_4(k, w + j * ldw, ldw, bias ? bias + j : NULL, accumulate, in + c0,
                         in_stride, out + j * out_stride + c0, out_stride);
        for (; j + 2 <= m; j += 2)
            gemm_block_2(k, w + j * ldw, ldw, bias ? bias + j : NULL, accumulate, in + c0,
                         in_stride, out + j * out_stride + c0, out_stride);
        for (; j < m; j++)
            gemm_block_1(k, w + j * ldw, ldw, bias ? bias + j : NULL, accumulate, in + c0,
                         in_stride, out + j * out_stride + c0, out_stride);
    }
    for (; c0 < n; c0++) /* column tail (n not a multiple of GEMM_COLUMNS) */
        for (i64 j = 0; j < m; j++) {
            double s = bias ? bias[j] : 0.0;
            for (i64 kk = 0; kk < k; kk++) s += w[j * ldw + kk] * in[kk * in_stride + c0];
            double *dst = out + j * out_stride + c0;
            *dst = accumulate ? *dst + s : s;
        }
}

/* acc[j][k][:] += sum over column vectors c of a[j][c] * b[k][c] (j < m, k < nk, n columns),
 * lane-wise: acc keeps SW partial sums per (j, k), reduced once at the end (reduce_lanes). This is
 * a weight gradient's product dW += dA B^T taken one time step at a time, while dA is hot in
 * cache. Register-blocked R x S (up to 4 x 4): R*S accumulating vectors, R+S loads per R*S FMAs;
 * every block shape is its own function so its accumulators stay in registers. */
#define DOT_NAME(R, S) NL_CAT(dot_block_##R##_##S, NL_SUFFIX)
#if defined(NL_WIDE_PASS)
/* The 512-bit pass: two of a block's 4-lane sums side by side in one 512-bit register (b's rows
 * k and k + 1 in its halves, a's row in both), so each lane does what it does in the 256-bit
 * pass (the same fused multiply-adds in the same order), in half the instructions. */
/* One step of columns c .. c + w - 1 (w <= SW; lanes past w load zeros) */
#define S_LOAD_W(p, w) ((w) == SW ? S_LOAD(p) : S_LOAD_N((p), (w)))
#define DOT_STEP_PAIRED(R, S, w)                                                               \
    do {                                                                                       \
        sd ah[R], bo = S_SET1(0.0);                                                            \
        __m512d bv[PS];                                                                        \
        for (int jj = 0; jj < R; jj++) ah[jj] = S_LOAD_W(a + jj * lda + c, w);                 \
        for (int p = 0; p < P; p++) {                                                          \
            const double *b0 = b + 2 * p * ldb + c;                                            \
            bv[p] = _mm512_insertf64x4(_mm512_castpd256_pd512(S_LOAD_W(b0, w)),                \
                                       S_LOAD_W(b0 + ldb, w), 1);                              \
        }                                                                                      \
        if (ODD) bo = S_LOAD_W(b + (S - 1) * ldb + c, w);                                      \
        for (int jj = 0; jj < R; jj++) {                                                       \
            const __m512d av = _mm512_broadcast_f64x4(ah[jj]);                                 \
            for (int p = 0; p < P; p++) s2[jj][p] = _mm512_fmadd_pd(av, bv[p], s2[jj][p]);     \
            if (ODD) s1[jj] = S_FMA(ah[jj], bo, s1[jj]);                                       \
        }                                                                                      \
    } while (0)
#define DOT_BLOCK(R, S)                                                                        \
    static void DOT_NAME(R, S)(i64 n, const double *restrict a, i64 lda,                      \
                               const double *restrict b, i64 ldb, double *restrict acc,       \
                               i64 acc_stride) {                                               \
        enum { P = S / 2, PS = S / 2 > 0 ? S / 2 : 1, ODD = S % 2 };                           \
        __m512d s2[R][PS];                                                                     \
        sd s1[R];                                                                              \
        for (int jj = 0; jj < R; jj++) {                                                       \
            for (int p = 0; p < P; p++) s2[jj][p] = _mm512_setzero_pd();                       \
            s1[jj] = S_SET1(0.0);                                                              \
        }                                                                                      \
        i64 c = 0;                                                                             \
        for (; c + SW <= n; c += SW) DOT_STEP_PAIRED(R, S, SW);                                \
        if (c < n) DOT_STEP_PAIRED(R, S, (int)(n - c));                                        \
        for (int jj = 0; jj < R; jj++) {                                                       \
            for (int p = 0; p < P; p++) {                                                      \
                double *dst = acc + jj * acc_stride + 2 * p * SW;                              \
                _mm512_storeu_pd(dst, _mm512_loadu_pd(dst) + s2[jj][p]);                       \
            }                                                                                  \
            if (ODD) {                                                                         \
                double *dst = acc + jj * acc_stride + (S - 1) * SW;                            \
                S_STORE(dst, S_LOAD(dst) + s1[jj]);                                            \
            }                                                                                  \
        }                                                                                      \
    }
#else
#define DOT_BLOCK(R, S)                                                                        \
    static void DOT_NAME(R, S)(i64 n, const double *restrict a, i64 lda,                  \
                                    const double *restrict b, i64 ldb, double *restrict acc,  \
                                    i64 acc_stride) {                                          \
        sd s[R][S];                                                                            \
        for (int jj = 0; jj < R; jj++)                                                         \
            for (int kk = 0; kk < S; kk++) s[jj][kk] = S_SET1(0.0);                            \
        i64 c = 0;                                                                             \
        for (; c + SW <= n; c += SW) {                                                         \
            sd av[R], bv[S];                                                                   \
            for (int jj = 0; jj < R; jj++) av[jj] = S_LOAD(a + jj * lda + c);                  \
            for (int kk = 0; kk < S; kk++) bv[kk] = S_LOAD(b + kk * ldb + c);                  \
            for (int jj = 0; jj < R; jj++)                                                     \
                for (int kk = 0; kk < S; kk++) s[jj][kk] = S_FMA(av[jj], bv[kk], s[jj][kk]);   \
        }                                                                                      \
        if (c < n) { /* the last, partial vector: masked loads read zeros past the end */     \
            const int w = (int)(n - c);                                                        \
            sd av[R], bv[S];                                                                   \
            for (int jj = 0; jj < R; jj++) av[jj] = S_LOAD_N(a + jj * lda + c, w);             \
            for (int kk = 0; kk < S; kk++) bv[kk] = S_LOAD_N(b + kk * ldb + c, w);             \
            for (int jj = 0; jj < R; jj++)                                                     \
                for (int kk = 0; kk < S; kk++) s[jj][kk] = S_FMA(av[jj], bv[kk], s[jj][kk]);   \
        }                                                                                      \
        for (int jj = 0; jj < R; jj++)                                                         \
            for (int kk = 0; kk < S; kk++) {                                                   \
                double *dst = acc + jj * acc_stride + kk * SW;                                 \
                S_STORE(dst, S_LOAD(dst) + s[jj][kk]);                                         \
            }                                                                                  \
    }
#endif
#define DOT_BLOCKS(R) DOT_BLOCK(R, 1) DOT_BLOCK(R, 2) DOT_BLOCK(R, 3) DOT_BLOCK(R, 4)
DOT_BLOCKS(1)
DOT_BLOCKS(2)
DOT_BLOCKS(3)
DOT_BLOCKS(4)
typedef void (*dot_block_fn)(i64, const double *, i64, const double *, i64, double *, i64);
static const dot_block_fn DOT_BLOCK_TABLE[4][4] = {
    {DOT_NAME(1, 1), DOT_NAME(1, 2), DOT_NAME(1, 3), DOT_NAME(1, 4)},
    {DOT_NAME(2, 1), DOT_NAME(2, 2), DOT_NAME(2, 3), DOT_NAME(2, 4)},
    {DOT_NAME(3, 1), DOT_NAME(3, 2), DOT_NAME(3, 3), DOT_NAME(3, 4)},
    {DOT_NAME(4, 1), DOT_NAME(4, 2), DOT_NAME(4, 3), DOT_NAME(4, 4)},
};

/* Block columns: 4 x 4 blocks hold 16 accumulators and 8 operands, which 32 zmm registers take
 * and 16 ymm registers do not (the 256-bit pass spilled them): 4 x 3 there. Each (j, k) sum is
 * the same whatever the block. */
#if defined(NL_WIDE_PASS)
#define DOT_COLS 4
#else
#define DOT_COLS 3
#endif
static void dot_accumulate(i64 m, i64 nk, i64 n, const double *restrict a, i64 lda,
                           const double *restrict b, i64 ldb, double *restrict acc) {
    for (i64 j0 = 0; j0 < m; j0 += 4) {
        const i64 rows = m - j0 < 4 ? m - j0 : 4;
        for (i64 k0 = 0; k0 < nk; k0 += DOT_COLS) {
            const i64 cols = nk - k0 < DOT_COLS ? nk - k0 : DOT_COLS;
            DOT_BLOCK_TABLE[rows - 1][cols - 1](n, a + j0 * lda, lda, b + k0 * ldb, ldb,
                                                acc + (j0 * nk + k0) * SW, nk * SW);
        }
    }
}

/* acc[j][:] += sum over columns of a[j][:] (row sums, lane-wise), j < m. */
static void row_sums_accumulate(i64 m, i64 n, const double *restrict a, i64 lda,
                                double *restrict acc) {
    for (i64 j = 0; j < m; j++) {
        sd s = S_SET1(0.0);
        for (i64 c = 0; c < n; c += SW) {
            const int w = n - c < SW ? (int)(n - c) : SW;
            s = s + (w == SW ? S_LOAD(a + j * lda + c) : S_LOAD_N(a + j * lda + c, w));
        }
        S_STORE(acc + j * SW, S_LOAD(acc + j * SW) + s);
    }
}

/* out[i] = sum of the SW lanes of acc[i][:], i < n. */
static void reduce_lanes(i64 n, const double *restrict acc, double *restrict out) {
    for (i64 i = 0; i < n; i++) {
        double s = 0.0;
        for (int lane = 0; lane < SW; lane++) s += acc[i * SW + lane];
        out[i] = s;
    }
}


/* Scratch of n doubles (at least one, so an empty batch is not mistaken for a failure). */
static double *alloc_doubles(i64 n) { return malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); }

static void transpose(i64 m, i64 k, const double *restrict a, double *restrict at) {
    for (i64 i = 0; i < m; i++)
        for (i64 j = 0; j < k; j++) at[j * m + i] = a[i * k + j];
}

static inline i64 layer_inputs(i64 layer, i64 n_inputs, i64 units) {
    return layer ? units : n_inputs;
}

/* Offset of layer l's input weights [3H][K_l] in the packed w_ih. */
static inline i64 w_ih_offset(i64 layer, i64 n_inputs, i64 units) {
    return layer ? 3 * units * n_inputs + (layer - 1) * 3 * units * units : 0;
}

/* One GRU cell update on the nv vectors from lane i (FOR_VECTOR_GROUPS): r, z = sigma(.),
 * n = tanh(n_in + r n_hid), h' = n + z (h - n). */
NL_MATH void gru_cell_forward(i64 i, int nv, int m, const double *ir, const double *iz,
                              const double *in_, const double *hr, const double *hz,
                              const double *hn, const double *hp, double *hnew, double *r_out,
                              double *z_out, double *n_out, double *hn_out) {
    vd h_n[ILP], r[ILP], z[ILP], n[ILP];
    FOR_U(nv) {
        const i64 o = AT(i, u);
        const int w = WIDTH(u, nv, m);
        h_n[u] = LD(hn + o, w);
        r[u] = LD(ir + o, w) + LD(hr + o, w);
        z[u] = LD(iz + o, w) + LD(hz + o, w);
    }
    v_sigmoid(nv, r);
    v_sigmoid(nv, z);
    FOR_U(nv) n[u] = LD(in_ + AT(i, u), WIDTH(u, nv, m)) + r[u] * h_n[u];
    v_tanh_fast(nv, n);
    FOR_U(nv) {
        const i64 o = AT(i, u);
        const int w = WIDTH(u, nv, m);
        ST(hnew + o, n[u] + z[u] * (LD(hp + o, w) - n[u]), w);
        ST(r_out + o, r[u], w);
        ST(z_out + o, z[u], w);
        ST(n_out + o, n[u], w);
        ST(hn_out + o, h_n[u], w);
    }
}

/* Stacked GRU forward (PyTorch's convention), zero initial state.
 *   x      [I][T][B]            input sequence
 *   w_ih   packed [3H][K_l] per layer (K_0 = I, K_l = H), gates ordered r, z, n
 *   w_hh   [L][3H][H];  b_ih, b_hh [L][3H]
 *   states [L][H][T+1][B]       out: states[l][:, 0] = 0, states[l][:, t+1] = h_l after step t
 *   gates  [L][4H][T][B]        out: r, z, n and the hidden n pre-activation W_hn h + b_hn
 * Returns 0, or -1 when scratch memory cannot be allocated. */
int nl_gru_forward(i64 n_time, i64 batch, i64 n_inputs, i64 units, i64 n_layers,
                   const double *x, const double *w_ih, const double *w_hh, const double *b_ih,
                   const double *b_hh, double *states, double *gates) {
    const i64 h = units, g3 = 3 * units, tb = n_time * batch, sb = (n_time + 1) * batch;
    double *gi = alloc_doubles(2 * g3 * batch);
    if (!gi) return -1;
    double *gh = gi + g3 * batch;
    for (i64 l = 0; l < n_layers; l++) {
        const i64 k = layer_inputs(l, n_inputs, units);
        const double *wi = w_ih + w_ih_offset(l, n_inputs, units);
        const double *wh = w_hh + l * g3 * h;
        double *st = states + l * h * sb;
        double *gt = gates + l * 4 * h * tb;
        /* layer input at step t: x[:, t] or the layer below's state after step t */
        const double *src = l ? states + (l - 1) * h * sb + batch : x;
        const i64 src_stride = l ? sb : tb;
        for (i64 j = 0; j < h; j++) memset(st + j * sb, 0, sizeof(double) * batch);
        for (i64 t = 0; t < n_time; t++) {
            gemm_rows(g3, k, batch, wi, k, b_ih + l * g3, 0, src + t * batch, src_stride, gi, batch);
            gemm_rows(g3, h, batch, wh, h, b_hh + l * g3, 0, st + t * batch, sb, gh, batch);
            for (i64 j = 0; j < h; j++) {
                const double *ir = gi + j * batch, *iz = gi + (h + j) * batch;
                const double *in_ = gi + (2 * h + j) * batch;
                const double *hr = gh + j * batch, *hz = gh + (h + j) * batch;
                const double *hn = gh + (2 * h + j) * batch;
                const double *hp = st + j * sb + t * batch;
                double *hnew = st + j * sb + (t + 1) * batch;
                double *r_out = gt + j * tb + t * batch, *z_out = gt + (h + j) * tb + t * batch;
                double *n_out = gt + (2 * h + j) * tb + t * batch;
                double *hn_out = gt + (3 * h + j) * tb + t * batch;
#define CELL(i, nv, m) \
    gru_cell_forward(i, nv, m, ir, iz, in_, hr, hz, hn, hp, hnew, r_out, z_out, n_out, hn_out)
                FOR_VECTOR_GROUPS(batch, CELL);
#undef CELL
            }
        }
    }
    free(gi);
    return 0;
}

/* Backward of one GRU cell on lanes [i, i+m), from g = dL/dh' (plus the layer above's share):
 * the pre-activation gradients dr, dz, dn (= the input side's) and dn r (the hidden n's), and
 * z g, the direct part of dL/dh. */
static inline void gru_cell_backward(i64 i, int m, const double *g, const double *above,
                                     const double *r_, const double *z_, const double *n_,
                                     const double *hn, const double *hp, double *dr_out,
                                     double *dz_out, double *dn_out, double *dnr_out,
                                     double *direct) {
    const vd one = V_SET1(1.0);
    vd gb = LD(g + i, m);
    if (above) gb = gb + LD(above + i, m);
    const vd r = LD(r_ + i, m), z = LD(z_ + i, m), n = LD(n_ + i, m);
    const vd dn = gb * (one - z) * (one - n * n);
    const vd dz = gb * (LD(hp + i, m) - n) * z * (one - z);
    const vd dr = dn * LD(hn + i, m) * r * (one - r);
    ST(dr_out + i, dr, m);
    ST(dz_out + i, dz, m);
    ST(dn_out + i, dn, m);
    ST(dnr_out + i, dn * r, m);
    ST(direct + i, gb * z, m);
}

/* Backpropagation through time of nl_gru_forward, given grad_top [H][B] = dL/d(top layer's
 * final state), with the same x, weights, states and gates. Writes every parameter gradient,
 * laid out like the parameters (g_w_ih packed as w_ih, g_w_hh [L][3H][H], g_b_ih and g_b_hh
 * [L][3H]) and, if d_x is not NULL, dL/dx [I][T][B].
 *
 * Per step, the cell's pre-activation gradients [dr; dz; dn; dn r] (one [4H][B] block, so they
 * stay in cache) feed the two products that carry the gradient on (to h_{t-1} and to the layer
 * below) and the weight gradients' accumulation: nothing of size T is written but dL/dx and the
 * layer-to-layer gradient. Returns 0, or -1 when scratch memory cannot be allocated. */
int nl_gru_backward(i64 n_time, i64 batch, i64 n_inputs, i64 units, i64 n_layers,
                    const double *x, const double *w_ih, const double *w_hh, const double *states,
                    const double *gates, const double *grad_top, double *g_w_ih, double *g_w_hh,
                    double *g_b_ih, double *g_b_hh, double *d_x) {
    const i64 h = units, g3 = 3 * units, tb = n_time * batch, sb = (n_time + 1) * batch;
    const i64 k_max = n_inputs > units ? n_inputs : units;
    const i64 n_acc = (g3 * k_max + g3 * h + 4 * h) * SW;
    const i64 scratch = 2 * h * batch + 2 * h * tb + 2 * g3 * k_max + 4 * h * batch + n_acc;
    double *mem = alloc_doubles(scratch);
    if (!mem) return -1;
    double *dh = mem, *dh_prev = dh + h * batch;
    double *from_above = dh_prev + h * batch; /* [H][T][B]: dL/d(this layer's output), per step */
    double *to_below = from_above + h * tb;
    double *wt_hh = to_below + h * tb, *wt_ih = wt_hh + g3 * k_max; /* [H][3H], [K][3H] */
    double *ds = wt_ih + g3 * k_max; /* [4H][B]: dr, dz, dn, dn r of the current step */
    double *acc_ih = ds + 4 * h * batch, *acc_hh = acc_ih + g3 * k_max * SW;
    double *acc_b = acc_hh + g3 * h * SW; /* [4H][SW]: sums of dr, dz, dn, dn r */
    double *d_r = ds, *d_n = ds + 2 * h * batch, *d_nr = ds + 3 * h * batch;
    for (i64 l = n_layers - 1; l >= 0; l--) {
        const i64 k = layer_inputs(l, n_inputs, units);
        const double *st = states + l * h * sb;
        const double *gt = gates + l * 4 * h * tb;
        /* layer input at step t: x[:, t] or the layer below's state after step t */
        const double *src = l ? states + (l - 1) * h * sb + batch : x;
        const i64 src_stride = l ? sb : tb;
        double *d_in = l ? to_below : d_x; /* dL/d(layer input), [K][T][B] */
        const int has_above = l < n_layers - 1;
        transpose(g3, h, w_hh + l * g3 * h, wt_hh);
        transpose(g3, k, w_ih + w_ih_offset(l, n_inputs, units), wt_ih);
        memset(acc_ih, 0, sizeof(double) * n_acc);
        if (l == n_layers - 1)
            memcpy(dh, grad_top, sizeof(double) * h * batch);
        else
            memset(dh, 0, sizeof(double) * h * batch);
        for (i64 t = n_time - 1; t >= 0; t--) {
            const i64 at = t * batch;
            for (i64 j = 0; j < h; j++) {
                const double *g = dh + j * batch;
                const double *above = has_above ? from_above + j * tb + at : NULL;
                const double *r_ = gt + j * tb + at, *z_ = gt + (h + j) * tb + at;
                const double *n_ = gt + (2 * h + j) * tb + at, *hn = gt + (3 * h + j) * tb + at;
                const double *hp = st + j * sb + at;
                double *dr = d_r + j * batch, *dz = d_r + (h + j) * batch;
                double *dn = d_n + j * batch, *dnr = d_nr + j * batch;
                double *direct = dh_prev + j * batch;
#define CELL(i, m) gru_cell_backward(i, m, g, above, r_, z_, n_, hn, hp, dr, dz, dn, dnr, direct)
                FOR_VECTORS(batch, CELL);
#undef CELL
            }
            /* dL/dh_{t-1} = z dL/dh_t + W_hh^T [dr; dz; dn r];  dL/d(input_t) = W_ih^T [dr; dz; dn] */
            gemm_rows(h, 2 * h, batch, wt_hh, g3, NULL, 1, d_r, batch, dh_prev, batch);
            gemm_rows(h, h, batch, wt_hh + 2 * h, g3, NULL, 1, d_nr, batch, dh_prev, batch);
            if (d_in) gemm_rows(k, g3, batch, wt_ih, g3, NULL, 0, d_r, batch, d_in + at, tb);
            /* dW_ih += [dr; dz; dn] input_t^T;  dW_hh += [dr; dz] h_{t-1}^T, [dn r] h_{t-1}^T */
            dot_accumulate(g3, k, batch, d_r, batch, src + at, src_stride, acc_ih);
            dot_accumulate(2 * h, h, batch, d_r, batch, st + at, sb, acc_hh);
            dot_accumulate(h, h, batch, d_nr, batch, st + at, sb, acc_hh + 2 * h * h * SW);
            row_sums_accumulate(4 * h, batch, ds, batch, acc_b);
            double *swap = dh;
            dh = dh_prev;
            dh_prev = swap;
        }
        reduce_lanes(g3 * k, acc_ih, g_w_ih + w_ih_offset(l, n_inputs, units));
        reduce_lanes(g3 * h, acc_hh, g_w_hh + l * g3 * h);
        reduce_lanes(g3, acc_b, g_b_ih + l * g3);              /* dr, dz, dn */
        reduce_lanes(2 * h, acc_b, g_b_hh + l * g3);           /* dr, dz */
        reduce_lanes(h, acc_b + 3 * h * SW, g_b_hh + l * g3 + 2 * h); /* dn r */
        double *swap = from_above;
        from_above = to_below;
        to_below = swap;
    }
    free(mem);
    return 0;
}

/* ---- Neural Laplace's decoder g (see nlmodels/accel/decoder.py) ---- */

/* dst = tanh(a + b) on the nv vectors from lane i (FOR_VECTOR_GROUPS); dst may be a. */
NL_MATH void tanh_of_sum(i64 i, int nv, int m, const double *a, const double *b, double *dst) {
    vd v[ILP];
    FOR_U(nv) v[u] = LD(a + AT(i, u), WIDTH(u, nv, m)) + LD(b + AT(i, u), WIDTH(u, nv, m));
    v_tanh_fast(nv, v);
    FOR_U(nv) ST(dst + AT(i, u), v[u], WIDTH(u, nv, m));
}

/* First hidden layer: h1[b][t][:] = tanh(per_time[(b,) t][:] + per_traj[b][:]). */
void nl_first_hidden(i64 n, i64 n_time, i64 units, int per_row, const double *per_time,
                     const double *per_traj, double *h1) {
    for (i64 b = 0; b < n; b++)
        for (i64 t = 0; t < n_time; t++) {
            const double *pt = per_time + ((per_row ? b * n_time : 0) + t) * units;
            const double *pp = per_traj + b * units;
            double *dst = h1 + (b * n_time + t) * units;
#define LANES(i, nv, m) tanh_of_sum(i, nv, m, pt, pp, dst)
            FOR_VECTOR_GROUPS(units, LANES);
#undef LANES
        }
}

/* Backward of nl_first_hidden, in place on g [n][T][H] (dL/dh1 -> dL/d(pre-activation)):
 * g_traj[b] = sum_t g[b][t]; g_time[t] += sum_b g[b][t] (shared grid) or g_time[b][t] = g[b][t]. */
void nl_first_hidden_backward(i64 n, i64 n_time, i64 units, int per_row, double *g,
                              const double *h1, double *g_time, double *g_traj) {
    const vd one = V_SET1(1.0);
    for (i64 b = 0; b < n; b++) {
        double *traj = g_traj + b * units;
        for (i64 t = 0; t < n_time; t++) {
            double *gr = g + (b * n_time + t) * units;
            const double *hr = h1 + (b * n_time + t) * units;
            double *time = g_time + ((per_row ? b * n_time : 0) + t) * units;
#define LANES(i, m)                                                \
    do {                                                           \
        const vd h = LD(hr + i, m), v = LD(gr + i, m) * (one - h * h); \
        ST(gr + i, v, m);                                          \
        ST(traj + i, LD(traj + i, m) + v, m);                      \
        if (per_row)                                               \
            ST(time + i, v, m);                                    \
        else                                                       \
            ST(time + i, LD(time + i, m) + v, m);                  \
    } while (0)
            FOR_VECTORS(units, LANES);
#undef LANES
        }
    }
}

/* h[r][:] = tanh(h[r][:] + bias), in place. */
void nl_bias_tanh(i64 rows, i64 units, double *h, const double *bias) {
    for (i64 r = 0; r < rows; r++) {
        double *hr = h + r * units;
#define LANES(i, nv, m) tanh_of_sum(i, nv, m, hr, bias, hr)
        FOR_VECTOR_GROUPS(units, LANES);
#undef LANES
    }
}

/* g *= 1 - h^2 (tanh's derivative from its output) over [rows][units]; g_bias += column sums. */
void nl_tanh_backward(i64 rows, i64 units, double *g, const double *h, double *g_bias) {
    const vd one = V_SET1(1.0);
    for (i64 r = 0; r < rows; r++) {
        double *gr = g + r * units;
        const double *hr = h + r * units;
#define LANES(i, m)                                                \
    do {                                                           \
        const vd hv = LD(hr + i, m), v = LD(gr + i, m) * (one - hv * hv); \
        ST(gr + i, v, m);                                          \
        ST(g_bias + i, LD(g_bias + i, m) + v, m);                  \
    } while (0)
        FOR_VECTORS(units, LANES);
#undef LANES
    }
}

/* The output map for a linear ILT, fused (forward), on the output layer laid out transposed:
 * out_t [2*D*Q][rows] holds column c = (k, d, q) of the output layer (k = 0: theta, 1: phi) for
 * every row (trajectory b, time t) = b*T + t, so each loop runs over T contiguous times. With
 * a = out_t[(0, d, q)][row] + bias, c = out_t[(1, d, q)][row] + bias:
 *   theta = pi tanh(a),  r = tan(phi_scale tanh(c) + phi_centre),
 *   x[row][d] = sum_q r |w_q| cos(theta + arg w_q)
 * and out_t is overwritten with dx/d(out). The ILT weights are w_abs/w_arg [Q][T] (one grid for
 * all trajectories) or [n][Q][T] (per_row). acc is scratch of T doubles. */
NL_MATH void sphere_out_lanes(i64 i, int nv, int m, double *oa, double *oc, double ba,
                              double bc, const double *wa, const double *wg, double phi_scale,
                              double phi_centre, double *acc) {
    const double pi_s = 3.14159265358979323846;
    const vd pi = V_SET1(pi_s), one = V_SET1(1.0), scale = V_SET1(phi_scale);
    vd ta[ILP], tc[ILP], angle[ILP], sn[ILP], cs[ILP], radius[ILP];
    FOR_U(nv) {
        ta[u] = LD(oa + AT(i, u), WIDTH(u, nv, m)) + V_SET1(ba);
        tc[u] = LD(oc + AT(i, u), WIDTH(u, nv, m)) + V_SET1(bc);
    }
    v_tanh_fast(nv, ta);
    v_tanh_fast(nv, tc);
    FOR_U(nv) angle[u] = LD(wg + AT(i, u), WIDTH(u, nv, m)) + pi * ta[u];
    v_sincos(nv, angle, sn, cs);
    FOR_U(nv) radius[u] = scale * tc[u] + V_SET1(phi_centre - 0.25 * pi_s);
    v_tan_quarter_plus(nv, radius);
    FOR_U(nv) {
        const i64 o = AT(i, u);
        const int w = WIDTH(u, nv, m);
        const vd amp = LD(wa + o, w), scaled = radius[u] * amp;
        ST(acc + o, V_FMA(scaled, cs[u], LD(acc + o, w)), w);
        ST(oa + o, pi * (ta[u] * ta[u] - one) * sn[u] * scaled, w);
        ST(oc + o, scale * (one - tc[u] * tc[u]) * cs[u] * amp * (one + radius[u] * radius[u]), w);
    }
}

void nl_sphere_out_forward(i64 n, i64 n_time, i64 dims, i64 n_query, int per_row, double *out_t,
                           const double *bias, const double *w_abs, const double *w_arg,
                           double phi_scale, double phi_centre, double *x, double *acc) {
    const i64 rows = n * n_time, dq = dims * n_query;
    for (i64 b = 0; b < n; b++) {
        const double *wa_b = w_abs + (per_row ? b * n_query * n_time : 0);
        const double *wg_b = w_arg + (per_row ? b * n_query * n_time : 0);
        for (i64 d = 0; d < dims; d++) {
            memset(acc, 0, sizeof(double) * n_time);
            for (i64 q = 0; q < n_query; q++) {
                const i64 ca = d * n_query + q, cc = dq + ca;
                double *oa = out_t + ca * rows + b * n_time, *oc = out_t + cc * rows + b * n_time;
                const double *wa = wa_b + q * n_time, *wg = wg_b + q * n_time;
#define LANES(i, nv, m) \
    sphere_out_lanes(i, nv, m, oa, oc, bias[ca], bias[cc], wa, wg, phi_scale, phi_centre, acc)
                FOR_VECTOR_GROUPS(n_time, LANES);
#undef LANES
            }
            for (i64 t = 0; t < n_time; t++) x[(b * n_time + t) * dims + d] = acc[t];
        }
    }
}

#ifndef NL_WIDE_PASS /* the 256-bit pass only (see the end of this file) */
/* Backward entry: g_t[c][row] = d_out_t[c][row] * grad_x[row][d(c)] for c = (k, d, q); g_bias[c]
 * += sum over rows. gx_t is scratch of D*rows doubles. */
/* One column c of it: dst = src * mul over rows, each product added to the lane of its row
 * (the row's index modulo VW) of sum, which is returned. Rows split into parts whose starts are
 * multiples of VW, each part's sum going on from the last's, give the lanes of one pass. */
static inline vd sphere_out_backward_column(i64 rows, const double *src, const double *mul,
                                            double *dst, vd sum) {
#define LANES(i, m)                                      \
    do {                                                 \
        const vd v = LD(src + i, m) * LD(mul + i, m);    \
        ST(dst + i, v, m);                               \
        sum = sum + v;                                   \
    } while (0)
    FOR_VECTORS(rows, LANES);
#undef LANES
    return sum;
}

void nl_sphere_out_backward(i64 rows, i64 dims, i64 n_query, const double *d_out_t,
                            const double *grad_x, double *g_t, double *g_bias, double *gx_t) {
    transpose(rows, dims, grad_x, gx_t);
    for (i64 c = 0; c < 2 * dims * n_query; c++) {
        const double *mul = gx_t + ((c / n_query) % dims) * rows;
        g_bias[c] += V_SUM(sphere_out_backward_column(rows, d_out_t + c * rows, mul,
                                                      g_t + c * rows, V_SET1(0.0)));
    }
}

/* nl_sphere_out_backward over rows split into parts (each a start that is a multiple of VW but
 * the last), for nl_decoder_backward: each part's column sums go on in lanes [2*D*Q][VW] (zeros
 * before the first part), which sphere_out_lanes_done adds to g_bias as the whole pass would. */
enum { SPHERE_LANES = VW };
static void sphere_out_backward_part(i64 rows, i64 dims, i64 n_query, const double *d_out_t,
                                     const double *grad_x, double *g_t, double *lanes,
                                     double *gx_t) {
    transpose(rows, dims, grad_x, gx_t);
    for (i64 c = 0; c < 2 * dims * n_query; c++) {
        const double *mul = gx_t + ((c / n_query) % dims) * rows;
        const vd sum = V_LOAD(lanes + c * VW);
        V_STORE(lanes + c * VW,
                sphere_out_backward_column(rows, d_out_t + c * rows, mul, g_t + c * rows, sum));
    }
}

static void sphere_out_lanes_done(i64 outputs, const double *lanes, double *g_bias) {
    for (i64 c = 0; c < outputs; c++) g_bias[c] += V_SUM(V_LOAD(lanes + c * VW));
}

/* The vector maths above, elementwise over n values, for the tests: op 0 e^x, 1 sigmoid,
 * 2 tanh, 3 sin, 4 cos. */
NL_MATH void math_op(int op, int nv, vd *x) {
    vd s[ILP], c[ILP];
    switch (op) {
    case 0: v_exp(nv, x); return;
    case 1: v_sigmoid(nv, x); return;
    case 2: v_tanh_fast(nv, x); return;
    default:
        v_sincos(nv, x, s, c);
        FOR_U(nv) x[u] = op == 3 ? s[u] : c[u];
    }
}

void nl_vector_math(int op, i64 n, const double *x, double *y) {
#define LANES(i, nv, m)                                                        \
    do {                                                                       \
        vd v_[ILP];                                                            \
        FOR_U(nv) v_[u] = LD(x + AT(i, u), WIDTH(u, nv, m));                   \
        math_op(op, nv, v_);                                                   \
        FOR_U(nv) ST(y + AT(i, u), v_[u], WIDTH(u, nv, m));                    \
    } while (0)
    FOR_VECTOR_GROUPS(n, LANES);
#undef LANES
}

/* ---- Matrix products of the portable CPU numerics mode (nlmodels/accel/portable.py) ---------
 *
 * c[p][i][j] = sum over l of a[p][i][l] * b[p][l][j], p < batch, for a and b given by element
 * strides (any layout: transposed and broadcast views need no copy) and c row-major contiguous
 * [batch][m][n]. Every element starts from its first product (rounded) and adds the others in
 * increasing l, each by one fused multiply-add (one rounding):
 *     acc = a[i][0] * b[0][j];  acc = fma(a[i][l], b[l][j], acc) for l = 1 .. k-1.
 * Vector lanes and register tiles hold different elements, never parts of one sum, and a sum
 * interrupted between blocks of l is stored and reloaded exactly, so the bits do not depend on
 * the tiling, the blocking, the vector width, the packing of operands or the CPU (every x86-64-v3
 * CPU has FMA, exactly rounded): the 512-bit tiles, taken where the CPU has AVX-512F, give the
 * 256-bit tiles' bits (the tests compare the two and the plain loop, mm_reference).
 *
 * The blocking is Goto and van de Geijn's ("Anatomy of High-Performance Matrix Multiplication",
 * ACM TOMS 34(3), 2008): a block of MM_KC inner indices of b packed in panels of NR columns (one
 * panel stays in L1 while it meets every row panel), of a in panels of MR rows (MM_MC rows stay
 * in L2), and an MR x NR register tile of accumulators per pair of panels; a panel that is read
 * only a few times and whose layout a tile reads as fast in place is not copied at all (small
 * products' operands read in place are the way of libxsmm: Heinecke et al., "LIBXSMM:
 * Accelerating Small Matrix Multiplications by Runtime Code Generation", SC 2016). Narrow
 * products (n < NR / 2, m > n) are computed as c^T = b^T a^T, the same arithmetic per element. */
#include <math.h>

#define MM_KC 256
#define MM_MC 96 /* a multiple of every MR */
#define MM_NC 4096

/* An MR x NR tile: c (row stride ldc) = (first ? a0 b0 : c) then + a_l b_l for kc inner indices.
 * Element (r, l) of a is ap[r * RS + l * LS] and row l of b is bp + l * ldb: a packed row panel
 * [kc][MR] (RS = 1, LS = MR) and column panel [kc][NR] (ldb = NR), or either operand read in
 * place (see mm_blocked). Each element's sum is the same whatever the strides: the same
 * products, the same fused multiply-adds, in the same order. */
typedef void (*mm_tile_fn)(i64 kc, const double *restrict ap, i64 ars, i64 acs,
                           const double *restrict bp, i64 ldb, double *restrict c, i64 ldc,
                           int first);

/* R rows x V vectors of W lanes: the accumulators stay in registers (the loops over r and v
 * have constant bounds and unroll). RS, LS: a's strides, one of them the literal 1, so that the
 * broadcasts' addresses cost no more than a packed panel's; LDB: b's (both panels packed: all
 * three constants). */
#define MM_TILE(NAME, ATTR, VEC, W, R, V, SET1, LOADU, STOREU, MUL, FMADD, RS, LS, LDB)         \
    ATTR static void NAME(i64 kc, const double *restrict ap, i64 ars, i64 acs,                  \
                          const double *restrict bp, i64 ldb, double *restrict c, i64 ldc,       \
                          int first)                                                             \
    {                                                                                            \
        VEC acc[R][V];                                                                           \
        i64 l = 0;                                                                               \
        (void)ars;                                                                               \
        (void)acs;                                                                               \
        (void)ldb;                                                                               \
        if (first) {                                                                             \
            VEC bv[V];                                                                           \
            for (int v = 0; v < V; ++v) bv[v] = LOADU(bp + W * v);                               \
            for (int r = 0; r < R; ++r) {                                                        \
                const VEC ar = SET1(ap[r * (RS)]);                                               \
                for (int v = 0; v < V; ++v) acc[r][v] = MUL(ar, bv[v]);                          \
            }                                                                                    \
            l = 1;                                                                               \
        } else {                                                                                 \
            for (int r = 0; r < R; ++r)                                                          \
                for (int v = 0; v < V; ++v) acc[r][v] = LOADU(c + r * ldc + W * v);              \
        }                                                                                        \
        for (; l < kc; ++l) {                                                                    \
            const double *al = ap + l * (LS), *bl = bp + l * (LDB);                              \
            VEC bv[V];                                                                           \
            for (int v = 0; v < V; ++v) bv[v] = LOADU(bl + W * v);                               \
            for (int r = 0; r < R; ++r) {                                                        \
                const VEC ar = SET1(al[r * (RS)]);                                               \
                for (int v = 0; v < V; ++v) acc[r][v] = FMADD(ar, bv[v], acc[r][v]);             \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < R; ++r)                                                              \
            for (int v = 0; v < V; ++v) STOREU(c + r * ldc + W * v, acc[r][v]);                  \
    }

/* 6 x 8: 12 accumulators of the 16 ymm registers: both operands packed, a's columns
 * contiguous (or a packed panel), a's rows contiguous */
MM_TILE(mm_tile_avx2, , __m256d, 4, 6, 2, _mm256_set1_pd, _mm256_loadu_pd, _mm256_storeu_pd,
        _mm256_mul_pd, _mm256_fmadd_pd, 1, 6, 8)
MM_TILE(mm_tile_avx2_cols, , __m256d, 4, 6, 2, _mm256_set1_pd, _mm256_loadu_pd,
        _mm256_storeu_pd, _mm256_mul_pd, _mm256_fmadd_pd, 1, acs, ldb)
MM_TILE(mm_tile_avx2_rows, , __m256d, 4, 6, 2, _mm256_set1_pd, _mm256_loadu_pd,
        _mm256_storeu_pd, _mm256_mul_pd, _mm256_fmadd_pd, ars, 1, ldb)
/* 12 x 16: 24 accumulators of the 32 zmm registers (AVX-512F, taken where the CPU has it) */
#define MM_TILE_512(NAME, RS, LS, LDB)                                                            \
    MM_TILE(NAME, __attribute__((target("avx512f"))), __m512d, 8, 12, 2, _mm512_set1_pd,         \
            _mm512_loadu_pd, _mm512_storeu_pd, _mm512_mul_pd, _mm512_fmadd_pd, RS, LS, LDB)
MM_TILE_512(mm_tile_avx512, 1, 12, 16)
MM_TILE_512(mm_tile_avx512_cols, 1, acs, ldb)
MM_TILE_512(mm_tile_avx512_rows, ars, 1, ldb)

typedef struct {
    int mr, nr;
    mm_tile_fn packed, cols, rows; /* both operands packed; a's columns, rows contiguous */
} mm_isa;

enum { MM_REFERENCE = 0, MM_AVX2 = 1, MM_AVX512 = 2, MM_DIRECT = 3 };
static const mm_isa MM_ISAS[3] = {
    {0, 0, NULL, NULL, NULL},
    {6, 8, mm_tile_avx2, mm_tile_avx2_cols, mm_tile_avx2_rows},
    {12, 16, mm_tile_avx512, mm_tile_avx512_cols, mm_tile_avx512_rows},
};

static int mm_supported(int isa)
{
    if (isa == MM_AVX512) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f"); /* libgcc also checks the OS saves zmm state */
    }
    return isa == MM_REFERENCE || isa == MM_AVX2 || isa == MM_DIRECT;
}

/* dst [rows][cols] contiguous from src element (r, q) at src[r * rs + q * cs]; a transposed
 * source (rs == 1) is copied in 8 x 8 tiles, so that reads and writes both stay in cache */
static void mm_pack(i64 rows, i64 cols, const double *src, i64 rs, i64 cs, double *dst)
{
    if (rs == 1 && cs != 1) {
        for (i64 q0 = 0; q0 < cols; q0 += 8)
            for (i64 r0 = 0; r0 < rows; r0 += 8) {
                const i64 q1 = q0 + 8 < cols ? q0 + 8 : cols, r1 = r0 + 8 < rows ? r0 + 8 : rows;
                for (i64 q = q0; q < q1; ++q)
                    for (i64 r = r0; r < r1; ++r) dst[r * cols + q] = src[r + q * cs];
            }
    } else {
        for (i64 r = 0; r < rows; ++r)
            for (i64 q = 0; q < cols; ++q) dst[r * cols + q] = src[r * rs + q * cs];
    }
}

/* Small products (MM_SMALL multiply-adds or fewer) skip the packing: R rows (R <= 4) of a by
 * 8 columns of b straight from the operands (b's rows contiguous, else packed once). */
/* R rows of a (element (r, l) at a[r * ars + l * acs]) times 4 * V columns of b, whose rows are
 * contiguous with stride ldb; into c (row stride ldc). */
#define MM_BLOCK(R, V)                                                                           \
    static void mm_block_##R##x##V(i64 k, const double *a, i64 ars, i64 acs, const double *b,    \
                                   i64 ldb, double *c, i64 ldc)                                  \
    {                                                                                            \
        __m256d acc[R][V];                                                                       \
        for (int r = 0; r < R; ++r) {                                                            \
            const __m256d ar = _mm256_set1_pd(a[r * ars]);                                       \
            for (int v = 0; v < V; ++v) acc[r][v] = _mm256_mul_pd(ar, _mm256_loadu_pd(b + 4 * v)); \
        }                                                                                        \
        for (i64 l = 1; l < k; ++l) {                                                            \
            const double *bl = b + l * ldb;                                                      \
            __m256d bv[V];                                                                       \
            for (int v = 0; v < V; ++v) bv[v] = _mm256_loadu_pd(bl + 4 * v);                     \
            for (int r = 0; r < R; ++r) {                                                        \
                const __m256d ar = _mm256_set1_pd(a[r * ars + l * acs]);                         \
                for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_pd(ar, bv[v], acc[r][v]);   \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < R; ++r)                                                              \
            for (int v = 0; v < V; ++v) _mm256_storeu_pd(c + r * ldc + 4 * v, acc[r][v]);        \
    }
MM_BLOCK(4, 2)
MM_BLOCK(3, 2)
MM_BLOCK(2, 2)
MM_BLOCK(1, 2)
MM_BLOCK(4, 1)
MM_BLOCK(3, 1)
MM_BLOCK(2, 1)
MM_BLOCK(1, 1)

typedef void (*mm_block_fn)(i64, const double *, i64, i64, const double *, i64, double *, i64);
static const mm_block_fn MM_BLOCKS[2][5] = {
    {NULL, mm_block_1x1, mm_block_2x1, mm_block_3x1, mm_block_4x1},
    {NULL, mm_block_1x2, mm_block_2x2, mm_block_3x2, mm_block_4x2},
};

/* R rows of a times the last 4 * (V - 1) + w columns of b, 0 < w < 4 (as MM_BLOCK): the last
 * vector's lanes past w are neither read nor written (masked loads and stores), so each
 * element's sum is the block's */
#define MM_TAIL(R, V)                                                                            \
    static void mm_tail_##R##x##V(i64 k, const double *a, i64 ars, i64 acs, const double *b,     \
                                  i64 ldb, double *c, i64 ldc, i64 w)                            \
    {                                                                                            \
        const __m256i mask =                                                                     \
            _mm256_cmpgt_epi64(_mm256_set1_epi64x(w), _mm256_setr_epi64x(0, 1, 2, 3));           \
        const int last = V - 1;                                                                  \
        __m256d acc[R][V], bv[V];                                                                \
        for (int v = 0; v < last; ++v) bv[v] = _mm256_loadu_pd(b + 4 * v);                      \
        bv[last] = _mm256_maskload_pd(b + 4 * last, mask);                                       \
        for (int r = 0; r < R; ++r) {                                                            \
            const __m256d ar = _mm256_set1_pd(a[r * ars]);                                       \
            for (int v = 0; v < V; ++v) acc[r][v] = _mm256_mul_pd(ar, bv[v]);                    \
        }                                                                                        \
        for (i64 l = 1; l < k; ++l) {                                                            \
            const double *bl = b + l * ldb;                                                      \
            for (int v = 0; v < last; ++v) bv[v] = _mm256_loadu_pd(bl + 4 * v);                 \
            bv[last] = _mm256_maskload_pd(bl + 4 * last, mask);                                  \
            for (int r = 0; r < R; ++r) {                                                        \
                const __m256d ar = _mm256_set1_pd(a[r * ars + l * acs]);                         \
                for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_pd(ar, bv[v], acc[r][v]);   \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < R; ++r) {                                                            \
            for (int v = 0; v < last; ++v) _mm256_storeu_pd(c + r * ldc + 4 * v, acc[r][v]);     \
            _mm256_maskstore_pd(c + r * ldc + 4 * last, mask, acc[r][last]);                     \
        }                                                                                        \
    }
MM_TAIL(4, 2)
MM_TAIL(3, 2)
MM_TAIL(2, 2)
MM_TAIL(1, 2)
MM_TAIL(4, 1)
MM_TAIL(3, 1)
MM_TAIL(2, 1)
MM_TAIL(1, 1)

typedef void (*mm_tail_fn)(i64, const double *, i64, i64, const double *, i64, double *, i64, i64);
static const mm_tail_fn MM_TAILS[2][5] = {
    {NULL, mm_tail_1x1, mm_tail_2x1, mm_tail_3x1, mm_tail_4x1},
    {NULL, mm_tail_1x2, mm_tail_2x2, mm_tail_3x2, mm_tail_4x2},
};

/* the last n - j < 8 columns of R rows: a masked block of one or two vectors, or a full one */
static inline void mm_last_columns(int rows, i64 k, const double *a, i64 ars, i64 acs,
                                   const double *b, i64 ldb, double *c, i64 ldc, i64 rest)
{
    if (rest == 4)
        MM_BLOCKS[0][rows](k, a, ars, acs, b, ldb, c, ldc);
    else if (rest > 0)
        MM_TAILS[rest > 4][rows](k, a, ars, acs, b, ldb, c, ldc, rest > 4 ? rest - 4 : rest);
}

/* c [m][n] (row stride n) = a (strides ars, acs) times b (contiguous rows, stride ldb) */
static void mm_core(i64 m, i64 n, i64 k, const double *a, i64 ars, i64 acs, const double *b,
                    i64 ldb, double *c)
{
    const i64 full = m - m % 4;
    for (i64 i = 0; i < full; i += 4) { /* the bulk: direct calls the compiler can inline */
        const double *ai = a + i * ars;
        double *ci = c + i * n;
        i64 j = 0;
        for (; j + 8 <= n; j += 8) mm_block_4x2(k, ai, ars, acs, b + j, ldb, ci + j, n);
        mm_last_columns(4, k, ai, ars, acs, b + j, ldb, ci + j, n, n - j);
    }
    if (full < m) {
        const int rows = (int)(m - full);
        const double *ai = a + full * ars;
        double *ci = c + full * n;
        i64 j = 0;
        for (; j + 8 <= n; j += 8) MM_BLOCKS[1][rows](k, ai, ars, acs, b + j, ldb, ci + j, n);
        mm_last_columns(rows, k, ai, ars, acs, b + j, ldb, ci + j, n, n - j);
    }
}


/* Panels of w lines of a strided block: dst[p][l][t] = src[(p w + t) * ts + l * ls] for
 * l < depth, t < w, p < ceil(lines / w), zero past the last line. b's column panels
 * (lines = columns, ts = its column stride) and a's row panels (lines = rows) alike. */
static void mm_panels(i64 lines, i64 depth, const double *src, i64 ts, i64 ls, int w,
                      double *dst)
{
    for (i64 p0 = 0; p0 < lines; p0 += w, dst += depth * w) {
        const i64 full = lines - p0 < w ? lines - p0 : w;
        const double *s = src + p0 * ts;
        if (ts == 1 || ls != 1) { /* lines adjacent in memory, or neither: l outer */
            for (i64 l = 0; l < depth; ++l) {
                i64 t = 0;
                for (; t < full; ++t) dst[l * w + t] = s[t * ts + l * ls];
                for (; t < w; ++t) dst[l * w + t] = 0.0;
            }
        } else { /* each line contiguous along l: t outer, 4 lines by 4 indices transposed in
                  * registers (w is a multiple of 4), the rest one by one */
            i64 t = 0;
            for (; t + 4 <= full; t += 4) {
                const double *s0 = s + t * ts, *s1 = s0 + ts, *s2 = s1 + ts, *s3 = s2 + ts;
                i64 l = 0;
                for (; l + 4 <= depth; l += 4) {
                    const __m256d r0 = _mm256_loadu_pd(s0 + l), r1 = _mm256_loadu_pd(s1 + l);
                    const __m256d r2 = _mm256_loadu_pd(s2 + l), r3 = _mm256_loadu_pd(s3 + l);
                    const __m256d u0 = _mm256_unpacklo_pd(r0, r1), u1 = _mm256_unpackhi_pd(r0, r1);
                    const __m256d u2 = _mm256_unpacklo_pd(r2, r3), u3 = _mm256_unpackhi_pd(r2, r3);
                    double *d = dst + l * w + t;
                    _mm256_storeu_pd(d, _mm256_permute2f128_pd(u0, u2, 0x20));
                    _mm256_storeu_pd(d + w, _mm256_permute2f128_pd(u1, u3, 0x20));
                    _mm256_storeu_pd(d + 2 * w, _mm256_permute2f128_pd(u0, u2, 0x31));
                    _mm256_storeu_pd(d + 3 * w, _mm256_permute2f128_pd(u1, u3, 0x31));
                }
                for (; l < depth; ++l) {
                    dst[l * w + t] = s0[l];
                    dst[l * w + t + 1] = s1[l];
                    dst[l * w + t + 2] = s2[l];
                    dst[l * w + t + 3] = s3[l];
                }
            }
            for (; t < full; ++t)
                for (i64 l = 0; l < depth; ++l) dst[l * w + t] = s[t * ts + l];
            for (; t < w; ++t)
                for (i64 l = 0; l < depth; ++l) dst[l * w + t] = 0.0;
        }
    }
}

/* one growing scratch buffer per thread: a fresh allocation per product would cost more than
 * small products themselves (large ones are mmap'ed and page-faulted in every time) */
static __thread double *mm_scratch;
static __thread i64 mm_scratch_size;

static double *mm_scratch_of(i64 need)
{
    if (need > mm_scratch_size) {
        double *grown = realloc(mm_scratch, (size_t)need * sizeof(double));
        if (grown == NULL) return NULL;
        mm_scratch = grown;
        mm_scratch_size = need;
    }
    return mm_scratch;
}

static i64 mm_round_up(i64 x, i64 w) { return (x + w - 1) / w * w; }

/* doubles of scratch the blocked product of (m, n, k) needs (its packed panels) */
static i64 mm_blocked_need(const mm_isa *isa, i64 m, i64 n, i64 k)
{
    const i64 nc = n < MM_NC ? n : MM_NC, kc = k < MM_KC ? k : MM_KC;
    const i64 mc = m < MM_MC ? m : MM_MC;
    return kc * (mm_round_up(nc, isa->nr) + mm_round_up(mc, isa->mr));
}

/* c [m][n] (row stride ldc) = a (strides ars, acs) times b (strides brs, bcs), k >= 1; with
 * resume, c + a b, each element's sum going on from c's value by the same multiply-adds (a product
 * over k split into parts, each resuming the last, has the bits of the whole one).
 * Packing copies an operand whole, which costs as much as a fifth of the products Neural
 * Laplace's decoder takes (an inner or outer size of 64): the full panels of an operand whose
 * layout a tile reads as fast in place (b's rows contiguous; a's rows or columns contiguous) and
 * that are read at most MM_IN_PLACE times each are not packed, only the others and the partial
 * panels at the edges (zero-padded). */
#define MM_IN_PLACE 16
static void mm_blocked(const mm_isa *isa, i64 m, i64 n, i64 k, const double *a, i64 ars,
                       i64 acs, const double *b, i64 brs, i64 bcs, double *c, i64 ldc,
                       double *scratch, int resume)
{
    const int mr = isa->mr, nr = isa->nr;
    /* in place only where the panels are read few times (each of a's once per column panel,
     * each of b's once per row panel): a panel read often is worth its packed copy */
    const int b_direct = bcs == 1 && m <= MM_IN_PLACE * mr;
    const int a_direct = (ars == 1 || acs == 1) && n <= MM_IN_PLACE * nr;
    const mm_tile_fn a_tile = ars == 1 ? isa->cols : isa->rows; /* a read in place */
    double edge[12 * 16]; /* a tile that overhangs c: computed here, its part in c copied */
    for (i64 jc = 0; jc < n; jc += MM_NC) {
        const i64 nc = n - jc < MM_NC ? n - jc : MM_NC;
        const i64 kmax = k < MM_KC ? k : MM_KC; /* as mm_blocked_need */
        const i64 b_full = b_direct ? nc - nc % nr : 0; /* columns read in place */
        double *bpack = scratch, *apack = scratch + kmax * mm_round_up(nc, nr);
        for (i64 pc = 0; pc < k; pc += MM_KC) {
            const i64 kc = k - pc < MM_KC ? k - pc : MM_KC;
            const int first = pc == 0 && !resume; /* resume: each sum goes on from c */
            if (b_full < nc)
                mm_panels(nc - b_full, kc, b + pc * brs + (jc + b_full) * bcs, bcs, brs, nr,
                          bpack + b_full * kc);
            for (i64 ic = 0; ic < m; ic += MM_MC) {
                const i64 mc = m - ic < MM_MC ? m - ic : MM_MC;
                const i64 a_full = a_direct ? mc - mc % mr : 0; /* rows read in place */
                if (a_full < mc)
                    mm_panels(mc - a_full, kc, a + (ic + a_full) * ars + pc * acs, ars, acs, mr,
                              apack + a_full * kc);
                for (i64 jr = 0; jr < nc; jr += nr) {
                    const int b_here = jr < b_full;
                    const double *bp = b_here ? b + pc * brs + jc + jr : bpack + jr * kc;
                    const i64 ldb = b_here ? brs : nr;
                    const i64 cols = nc - jr < nr ? nc - jr : nr;
                    for (i64 ir = 0; ir < mc; ir += mr) {
                        const int a_here = ir < a_full;
                        const double *ap =
                            a_here ? a + (ic + ir) * ars + pc * acs : apack + ir * kc;
                        const mm_tile_fn tile =
                            a_here ? a_tile : (b_here ? isa->cols : isa->packed);
                        const i64 rs = a_here ? ars : 1, ls = a_here ? acs : mr;
                        const i64 rows = mc - ir < mr ? mc - ir : mr;
                        double *ct = c + (ic + ir) * ldc + jc + jr;
                        if (rows == mr && cols == nr) {
                            tile(kc, ap, rs, ls, bp, ldb, ct, ldc, first);
                            continue;
                        }
                        if (!first)
                            for (i64 r = 0; r < rows; ++r)
                                memcpy(edge + r * nr, ct + r * ldc, (size_t)cols * sizeof(double));
                        tile(kc, ap, rs, ls, bp, ldb, edge, nr, first);
                        for (i64 r = 0; r < rows; ++r)
                            memcpy(ct + r * ldc, edge + r * nr, (size_t)cols * sizeof(double));
                    }
                }
            }
        }
    }
}

/* doubles of scratch mm_direct needs */
static i64 mm_direct_need(i64 m, i64 n, i64 k, i64 bcs)
{
    return n < 8 && m >= 8 ? k * m + n * m : (bcs == 1 ? 0 : k * n);
}

/* c [m][n] = a b without packing a (b's rows packed unless contiguous), k >= 1 */
static void mm_direct(i64 m, i64 n, i64 k, const double *ap, i64 ars, i64 acs, const double *bp,
                      i64 brs, i64 bcs, double *cp, double *scratch)
{
    if (n < 8 && m >= 8) { /* narrow: c^T [n][m] = b^T [n][k] a^T [k][m] */
        double *at = scratch, *ct = scratch + k * m;
        mm_pack(k, m, ap, acs, ars, at);
        mm_core(n, m, k, bp, bcs, brs, at, m, ct);
        mm_pack(m, n, ct, 1, m, cp);
    } else if (bcs == 1) {
        mm_core(m, n, k, ap, ars, acs, bp, brs, cp);
    } else {
        mm_pack(k, n, bp, brs, bcs, scratch);
        mm_core(m, n, k, ap, ars, acs, scratch, n, cp);
    }
}

/* the definition itself, one element after another (the tests' reference for the tiles) */
static void mm_reference(i64 m, i64 n, i64 k, const double *a, i64 ars, i64 acs,
                         const double *b, i64 brs, i64 bcs, double *c)
{
    for (i64 i = 0; i < m; ++i)
        for (i64 j = 0; j < n; ++j) {
            double acc = a[i * ars] * b[j * bcs];
            for (i64 l = 1; l < k; ++l) acc = fma(a[i * ars + l * acs], b[l * brs + j * bcs], acc);
            c[i * n + j] = acc;
        }
}

/* nl_matmul by a chosen code: 0 the plain loop, 1 the 256-bit tiles, 2 the 512-bit tiles, 3 the
 * unpacked row blocks of small products; returns 1 when out of memory, 2 when this CPU cannot run
 * that code */
int nl_matmul_isa(int which, i64 batch, i64 m, i64 n, i64 k, const double *a, i64 abs_, i64 ars,
                  i64 acs, const double *b, i64 bbs, i64 brs, i64 bcs, double *c)
{
    if (which < 0 || which > MM_DIRECT || !mm_supported(which)) return 2;
    const int tiled = which == MM_AVX2 || which == MM_AVX512;
    const mm_isa *isa = &MM_ISAS[tiled ? which : MM_REFERENCE];
    const int narrow = tiled && 2 * n < isa->nr && m > n;
    i64 need = 0;
    if (k > 0 && which == MM_DIRECT)
        need = mm_direct_need(m, n, k, bcs);
    else if (k > 0 && tiled)
        need = narrow ? mm_blocked_need(isa, n, m, k) + m * n : mm_blocked_need(isa, m, n, k);
    double *scratch = need ? mm_scratch_of(need) : NULL;
    if (need && scratch == NULL) return 1;
    for (i64 p = 0; p < batch; ++p) {
        const double *ap = a + p * abs_, *bp = b + p * bbs;
        double *cp = c + p * m * n;
        if (k == 0) {
            memset(cp, 0, (size_t)(m * n) * sizeof(double));
        } else if (which == MM_REFERENCE) {
            mm_reference(m, n, k, ap, ars, acs, bp, brs, bcs, cp);
        } else if (which == MM_DIRECT) {
            mm_direct(m, n, k, ap, ars, acs, bp, brs, bcs, cp, scratch);
        } else if (narrow) { /* c^T [n][m] = b^T a^T: each element b_l a_l = a_l b_l */
            double *ct = scratch + (need - m * n);
            mm_blocked(isa, n, m, k, bp, bcs, brs, ap, acs, ars, ct, m, scratch, 0);
            mm_pack(m, n, ct, 1, m, cp);
        } else {
            mm_blocked(isa, m, n, k, ap, ars, acs, bp, brs, bcs, cp, n, scratch, 0);
        }
    }
    return 0;
}

/* c = a b by the fastest code for its size on this CPU (the bits are every code's: see above):
 * packing pays from about MM_SMALL multiply-adds per matrix (measured on 256- and 512-bit tiles) */
#define MM_SMALL (1 << 18)
static int mm_best(void)
{
    static int best = -1;
    if (best < 0) best = mm_supported(MM_AVX512) ? MM_AVX512 : MM_AVX2;
    return best;
}

int nl_matmul(i64 batch, i64 m, i64 n, i64 k, const double *a, i64 abs_, i64 ars, i64 acs,
              const double *b, i64 bbs, i64 brs, i64 bcs, double *c)
{
    const int which = m * n * k <= MM_SMALL ? MM_DIRECT : mm_best();
    return nl_matmul_isa(which, batch, m, n, k, a, abs_, ars, acs, b, bbs, brs, bcs, c);
}

/* ---- Elementary functions of the portable CPU numerics mode (nlmodels/accel/portable.py) ----
 *
 * y[i] = f(x[i]) for contiguous arrays of double, float (computed in double, rounded once),
 * complex double and complex float. Real arguments go through glibc's vector maths library
 * (libmvec), always its AVX2 variant (_ZGVdN4v_*, named explicitly): the same code on every
 * x86-64-v3 CPU, each lane computed on its own (a short tail is padded into a full vector), so an
 * element's bits depend on its value only; sqrt is the exactly rounded instruction; erfinv is
 * below. Complex arguments go through C99's complex functions. torch's own CPU kernels for these
 * functions call MKL's vector maths, whose code paths differ between CPU vendors (even for sqrt). */
#include <complex.h>

#define UN_FUNCTIONS(X) X(exp) X(expm1) X(log) X(log1p) X(log2) X(log10) X(sin) X(cos) X(tan)   \
    X(asin) X(acos) X(atan) X(sinh) X(cosh) X(tanh) X(asinh) X(acosh) X(atanh) X(erf) X(erfc)
#define UN_DECLARE(f) __m256d _ZGVdN4v_##f(__m256d);
UN_FUNCTIONS(UN_DECLARE)
#define UN_ENTRY(f) _ZGVdN4v_##f,
typedef __m256d (*un_vector_fn)(__m256d);
/* in nlmodels/accel/portable.py's ELEMENTARY order; then erfinv (UN_FUNCTION_COUNT) and sqrt */
static const un_vector_fn UN_VECTOR[] = {UN_FUNCTIONS(UN_ENTRY)};
enum { UN_FUNCTION_COUNT = sizeof(UN_VECTOR) / sizeof(UN_VECTOR[0]), UN_ERFINV = UN_FUNCTION_COUNT,
       UN_SQRT, UN_COUNT };

static double un_erfinv(double y)
{
    /* erf^-1 by Newton's method on glibc's erf from a starting point of Giles's single-precision
     * branches ("Approximating the erfinv function", GPU Computing Gems Jade, 2011); a fixed
     * number of steps, so the bits depend only on y */
    if (isnan(y) || y < -1.0 || y > 1.0) return NAN;
    if (y == 1.0) return INFINITY;
    if (y == -1.0) return -INFINITY;
    double w = -log((1.0 - y) * (1.0 + y)), p;
    if (w < 5.0) {
        w = w - 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w;
        p = -3.5233877e-06 + p * w;
        p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w;
        p = -0.00125372503 + p * w;
        p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w;
        p = 1.50140941 + p * w;
    } else {
        w = sqrt(w) - 3.0;
        p = -0.000200214257;
        p = 0.000100950558 + p * w;
        p = 0.00134934322 + p * w;
        p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w;
        p = -0.0076224613 + p * w;
        p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w;
        p = 2.83297682 + p * w;
    }
    double x = p * y;
    for (int step = 0; step < 3; ++step) { /* d/dx erf(x) = 2/sqrt(pi) exp(-x^2) */
        const double slope = 1.1283791670955126 * exp(-x * x);
        if (slope == 0.0) break;
        x = x - (erf(x) - y) / slope;
    }
    return x;
}

static inline __m256d un_vector(int op, __m256d v)
{
    if (op < UN_FUNCTION_COUNT) return UN_VECTOR[op](v);
    if (op == UN_SQRT) return _mm256_sqrt_pd(v);
    double lanes[4];
    _mm256_storeu_pd(lanes, v);
    for (int q = 0; q < 4; ++q) lanes[q] = un_erfinv(lanes[q]);
    return _mm256_loadu_pd(lanes);
}

static double complex un_complex(int op, double complex z)
{
    switch (op) {
    case 0: return cexp(z);
    case 1: return cexp(z) - 1.0;
    case 2: return clog(z);
    case 3: return clog(1.0 + z);
    case 4: return clog(z) / 0.6931471805599453;
    case 5: return clog(z) / 2.302585092994046;
    case 6: return csin(z);
    case 7: return ccos(z);
    case 8: return ctan(z);
    case 9: return casin(z);
    case 10: return cacos(z);
    case 11: return catan(z);
    case 12: return csinh(z);
    case 13: return ccosh(z);
    case 14: return ctanh(z);
    case 15: return casinh(z);
    case 16: return cacosh(z);
    case 17: return catanh(z);
    case UN_SQRT: return csqrt(z);
    default: return NAN; /* erf, erfc, erfinv: refused for complex by the Python side */
    }
}

/* kind: 0 double, 1 float, 2 complex double, 3 complex float; returns 1 for a bad op or kind */
int nl_unary(int op, int kind, i64 n, const void *x, void *y)
{
    if (op < 0 || op >= UN_COUNT || kind < 0 || kind > 3) return 1;
    if (kind == 0) {
        const double *in = x;
        double *out = y;
        i64 i = 0;
        for (; i + 4 <= n; i += 4) _mm256_storeu_pd(out + i, un_vector(op, _mm256_loadu_pd(in + i)));
        if (i < n) {
            double pad[4] = {0.0, 0.0, 0.0, 0.0}, res[4];
            for (i64 q = i; q < n; ++q) pad[q - i] = in[q];
            _mm256_storeu_pd(res, un_vector(op, _mm256_loadu_pd(pad)));
            for (i64 q = i; q < n; ++q) out[q] = res[q - i];
        }
    } else if (kind == 1) {
        const float *in = x;
        float *out = y;
        i64 i = 0;
        for (; i + 4 <= n; i += 4)
            _mm_storeu_ps(out + i, _mm256_cvtpd_ps(un_vector(op, _mm256_cvtps_pd(_mm_loadu_ps(in + i)))));
        if (i < n) {
            float pad[4] = {0.0f, 0.0f, 0.0f, 0.0f}, res[4];
            for (i64 q = i; q < n; ++q) pad[q - i] = in[q];
            _mm_storeu_ps(res, _mm256_cvtpd_ps(un_vector(op, _mm256_cvtps_pd(_mm_loadu_ps(pad)))));
            for (i64 q = i; q < n; ++q) out[q] = res[q - i];
        }
    } else if (kind == 2) {
        const double complex *in = x;
        double complex *out = y;
        for (i64 i = 0; i < n; ++i) out[i] = un_complex(op, in[i]);
    } else {
        const float complex *in = x;
        float complex *out = y;
        for (i64 i = 0; i < n; ++i) out[i] = (float complex)un_complex(op, (double complex)in[i]);
    }
    return 0;
}

/* ---- The lane-wise kernels for 512-bit vectors in the portable build (see the top) ---------
 * This file again, its lane-wise kernels only (NL_WIDE_PASS), for AVX-512F, every name of theirs
 * suffixed _w8; then each kernel's entry point runs the 512-bit code where the CPU has it. */
#if defined(NL_HAS_WIDE)
#undef VW
#undef V_SET1
#undef V_LOAD
#undef V_STORE
#undef V_MASK
#undef V_LOAD_N
#undef V_STORE_N
#undef V_MIN
#undef V_FMA
#undef V_MAX
#undef V_RECIP
#undef LD
#undef ST
#undef FOR_VECTORS
#undef FOR_VECTOR_GROUPS
#undef AT
#undef WIDTH
#undef ILP
#undef FOR_U
#undef NL_MATH
#undef GEMM_VECTORS
#undef GEMM_COLUMNS
#undef GEMM_BLOCK
#undef DOT_BLOCK /* the wide pass defines its own (two sums to a register) */
#undef DOT_COLS
#undef SW
#undef S_SET1
#undef S_LOAD
#undef S_STORE
#undef S_LOAD_N
#undef S_FMA
#undef NL_SUFFIX
#undef nl_gru_forward
#undef nl_first_hidden
#undef nl_bias_tanh
#undef nl_sphere_out_forward
#undef nl_gru_backward
#undef nl_first_hidden_backward
#undef nl_tanh_backward
#define vd vd_w8
#define vl vl_w8
#define v_expm1_parts v_expm1_parts_w8
#define v_exp v_exp_w8
#define v_sigmoid v_sigmoid_w8
#define v_tanh_fast v_tanh_fast_w8
#define v_sincos_reduced v_sincos_reduced_w8
#define v_sincos v_sincos_w8
#define v_tan_quarter_plus v_tan_quarter_plus_w8
#define gemm_block_4 gemm_block_4_w8
#define gemm_block_2 gemm_block_2_w8
#define gemm_block_1 gemm_block_1_w8
#define gemm_rows gemm_rows_w8
#define alloc_doubles alloc_doubles_w8
#define layer_inputs layer_inputs_w8
#define w_ih_offset w_ih_offset_w8
#define gru_cell_forward gru_cell_forward_w8
#define sphere_out_lanes sphere_out_lanes_w8
#define tanh_of_sum tanh_of_sum_w8
#define nl_gru_forward nl_gru_forward_w8
#define nl_first_hidden nl_first_hidden_w8
#define nl_bias_tanh nl_bias_tanh_w8
#define nl_sphere_out_forward nl_sphere_out_forward_w8
#define sd sd_w8
#define dot_block_fn dot_block_fn_w8
#define DOT_BLOCK_TABLE DOT_BLOCK_TABLE_w8
#define dot_accumulate dot_accumulate_w8
#define row_sums_accumulate row_sums_accumulate_w8
#define reduce_lanes reduce_lanes_w8
#define transpose transpose_w8
#define gru_cell_backward gru_cell_backward_w8
#define nl_gru_backward nl_gru_backward_w8
#define nl_first_hidden_backward nl_first_hidden_backward_w8
#define nl_tanh_backward nl_tanh_backward_w8
#define NL_WIDE_PASS
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,prefer-vector-width=512")
#include __FILE__
#pragma GCC pop_options
#undef NL_WIDE_PASS
#undef vd
#undef vl
#undef v_expm1_parts
#undef v_exp
#undef v_sigmoid
#undef v_tanh_fast
#undef v_sincos_reduced
#undef v_sincos
#undef v_tan_quarter_plus
#undef gemm_block_4
#undef gemm_block_2
#undef gemm_block_1
#undef gemm_rows
#undef alloc_doubles
#undef layer_inputs
#undef w_ih_offset
#undef gru_cell_forward
#undef sphere_out_lanes
#undef tanh_of_sum
#undef nl_gru_forward
#undef nl_first_hidden
#undef nl_bias_tanh
#undef nl_sphere_out_forward
#undef sd
#undef dot_block_fn
#undef DOT_BLOCK_TABLE
#undef dot_accumulate
#undef row_sums_accumulate
#undef reduce_lanes
#undef transpose
#undef gru_cell_backward
#undef nl_gru_backward
#undef nl_first_hidden_backward
#undef nl_tanh_backward

static int nl_wide(void)
{
    static int wide = -1;
    if (wide < 0) wide = mm_supported(MM_AVX512);
    return wide;
}

int nl_gru_forward(i64 n_time, i64 batch, i64 n_inputs, i64 units, i64 n_layers,
                   const double *x, const double *w_ih, const double *w_hh, const double *b_ih,
                   const double *b_hh, double *states, double *gates)
{
    return (nl_wide() ? nl_gru_forward_w8 : nl_gru_forward_w4)(
        n_time, batch, n_inputs, units, n_layers, x, w_ih, w_hh, b_ih, b_hh, states, gates);
}

int nl_gru_backward(i64 n_time, i64 batch, i64 n_inputs, i64 units, i64 n_layers,
                    const double *x, const double *w_ih, const double *w_hh, const double *states,
                    const double *gates, const double *grad_top, double *g_w_ih, double *g_w_hh,
                    double *g_b_ih, double *g_b_hh, double *d_x)
{
    return (nl_wide() ? nl_gru_backward_w8 : nl_gru_backward_w4)(
        n_time, batch, n_inputs, units, n_layers, x, w_ih, w_hh, states, gates, grad_top, g_w_ih,
        g_w_hh, g_b_ih, g_b_hh, d_x);
}

void nl_first_hidden(i64 n, i64 n_time, i64 units, int per_row, const double *per_time,
                     const double *per_traj, double *h1)
{
    (nl_wide() ? nl_first_hidden_w8 : nl_first_hidden_w4)(n, n_time, units, per_row, per_time,
                                                          per_traj, h1);
}

void nl_bias_tanh(i64 rows, i64 units, double *h, const double *bias)
{
    (nl_wide() ? nl_bias_tanh_w8 : nl_bias_tanh_w4)(rows, units, h, bias);
}

void nl_tanh_backward(i64 rows, i64 units, double *g, const double *h, double *g_bias)
{
    (nl_wide() ? nl_tanh_backward_w8 : nl_tanh_backward_w4)(rows, units, g, h, g_bias);
}

void nl_first_hidden_backward(i64 n, i64 n_time, i64 units, int per_row, double *g,
                              const double *h1, double *g_time, double *g_traj)
{
    (nl_wide() ? nl_first_hidden_backward_w8 : nl_first_hidden_backward_w4)(
        n, n_time, units, per_row, g, h1, g_time, g_traj);
}

void nl_sphere_out_forward(i64 n, i64 n_time, i64 dims, i64 n_query, int per_row, double *out_t,
                           const double *bias, const double *w_abs, const double *w_arg,
                           double phi_scale, double phi_centre, double *x, double *acc)
{
    (nl_wide() ? nl_sphere_out_forward_w8 : nl_sphere_out_forward_w4)(
        n, n_time, dims, n_query, per_row, out_t, bias, w_abs, w_arg, phi_scale, phi_centre, x,
        acc);
}
#endif

/* ---- Neural Laplace's fused decoder, a chunk at a time in slices (nlmodels/accel/decoder.py) --
 * The decoder's chunk steps there (g's first-layer tanh and last two layers, the sphere map and
 * the linear ILT, then their backward pass) as the portable mode runs them, the same kernels
 * and nl_matmul products with the same operands, element by element in the same order, but in
 * one call (no Python, dispatch or allocation between the steps) and slice by slice of `slice`
 * trajectories, so that what one step writes can still be in cache when the next reads it. Over the
 * chunk, the backward's weight gradients are sums over its rows: each slice's product resumes
 * the last slice's sums (mm_blocked), and the output bias's lane sums go on from slice to slice
 * (sphere_out_backward_part), so that the bits are the whole chunk's, whatever `slice`; only the
 * lanes ask that each slice but the last hold a multiple of SPHERE_LANES rows.
 * out_t is laid out by slice: the slice of rows r0.. (n_s of them) is [2*D*Q][n_s] from
 * out_t + r0 * 2*D*Q. Both return 1 when out of memory, 2 for a slice of the wrong size. */
static int decoder_slice_bad(i64 n, i64 n_time, i64 slice)
{
    return slice < 1 || (slice < n && (slice * n_time) % SPHERE_LANES != 0);
}

int nl_decoder_forward(i64 n, i64 n_time, i64 units, i64 dims, i64 n_query, i64 slice,
                       int per_row_time, const double *per_time, const double *per_traj,
                       const double *w2, const double *b2, const double *w3, const double *b3,
                       int per_row_w, const double *w_abs, const double *w_arg, double phi_scale,
                       double phi_centre, double *h1, double *h2, double *out_t, double *x,
                       double *acc)
{
    const i64 outputs = 2 * dims * n_query;
    if (decoder_slice_bad(n, n_time, slice)) return 2;
    for (i64 b0 = 0; b0 < n; b0 += slice) {
        const i64 s = n - b0 < slice ? n - b0 : slice, r0 = b0 * n_time, rows = s * n_time;
        const i64 w0 = per_row_w ? b0 * n_query * n_time : 0;
        double *h1s = h1 + r0 * units, *h2s = h2 + r0 * units, *os = out_t + r0 * outputs;
        nl_first_hidden(s, n_time, units, per_row_time,
                        per_time + (per_row_time ? r0 * units : 0), per_traj + b0 * units, h1s);
        /* h2 = tanh(h1 w2^T + b2), then out^T = w3 h2^T */
        if (nl_matmul(1, rows, units, units, h1s, 0, units, 1, w2, 0, 1, units, h2s)) return 1;
        nl_bias_tanh(rows, units, h2s, b2);
        if (nl_matmul(1, outputs, rows, units, w3, 0, units, 1, h2s, 0, 1, units, os)) return 1;
        nl_sphere_out_forward(s, n_time, dims, n_query, per_row_w, os, b3, w_abs + w0,
                              w_arg + w0, phi_scale, phi_centre, x + r0 * dims, acc);
    }
    return 0;
}

/* c [m][n] = a b (resume 0), or c + a b with each sum going on from c (see mm_blocked) */
static int mm_resumed(i64 m, i64 n, i64 k, const double *a, i64 ars, i64 acs, const double *b,
                      i64 brs, i64 bcs, double *c, int resume)
{
    if (!resume) return nl_matmul(1, m, n, k, a, 0, ars, acs, b, 0, brs, bcs, c);
    const mm_isa *isa = &MM_ISAS[mm_best()];
    double *scratch = mm_scratch_of(mm_blocked_need(isa, m, n, k));
    if (scratch == NULL) return 1;
    mm_blocked(isa, m, n, k, a, ars, acs, b, brs, bcs, c, n, scratch, 1);
    return 0;
}

int nl_decoder_backward(i64 n, i64 n_time, i64 units, i64 dims, i64 n_query, i64 slice,
                        int per_row_time, const double *w2, const double *w3, const double *h1,
                        const double *h2, const double *d_out_t, const double *grad_x,
                        double *g_time, double *g_traj, double *g_w2, double *g_b2,
                        double *g_w3, double *g_b3)
{
    const i64 outputs = 2 * dims * n_query;
    if (decoder_slice_bad(n, n_time, slice)) return 2;
    const i64 most = (slice < n ? slice : n) * n_time; /* rows of the largest slice */
    /* the chunk's sums (g_w3's, g_w2's, g_b3's lanes); a slice's dL/d(out)^T, dL/dh2 (then its
     * pre-activation's), dL/dh1 and grad_x^T */
    double *p3 = calloc((size_t)(outputs * units + units * units + outputs * SPHERE_LANES +
                                 most * (outputs + 2 * units + dims)),
                        sizeof(double));
    if (p3 == NULL) return 1;
    double *p2 = p3 + outputs * units, *lanes = p2 + units * units;
    double *g_out = lanes + outputs * SPHERE_LANES, *g_z2 = g_out + outputs * most;
    double *g_h1 = g_z2 + most * units, *gx_t = g_h1 + most * units;
    int status = 0;
    for (i64 b0 = 0; b0 < n && !status; b0 += slice) {
        const i64 s = n - b0 < slice ? n - b0 : slice, r0 = b0 * n_time, rows = s * n_time;
        const double *h1s = h1 + r0 * units, *h2s = h2 + r0 * units;
        sphere_out_backward_part(rows, dims, n_query, d_out_t + r0 * outputs,
                                 grad_x + r0 * dims, g_out, lanes, gx_t);
        /* g_out is dL/d(out) [rows][2DQ] held transposed: g_w3 += g_out^T h2, g_z2 = g_out w3 */
        status = mm_resumed(outputs, units, rows, g_out, rows, 1, h2s, units, 1, p3, b0 > 0) ||
                 nl_matmul(1, rows, units, outputs, g_out, 0, 1, rows, w3, 0, units, 1, g_z2);
        if (status) break;
        nl_tanh_backward(rows, units, g_z2, h2s, g_b2);
        /* g_w2 += g_z2^T h1, dL/dh1 = g_z2 w2 */
        status = mm_resumed(units, units, rows, g_z2, 1, units, h1s, units, 1, p2, b0 > 0) ||
                 nl_matmul(1, rows, units, units, g_z2, 0, units, 1, w2, 0, units, 1, g_h1);
        if (status) break;
        nl_first_hidden_backward(s, n_time, units, per_row_time, g_h1, h1s,
                                 g_time + (per_row_time ? r0 * units : 0), g_traj + b0 * units);
    }
    if (!status) { /* the chunk's sums into the gradients, as addmm_ adds its product */
        sphere_out_lanes_done(outputs, lanes, g_b3);
        for (i64 i = 0; i < outputs * units; i++) g_w3[i] += p3[i];
        for (i64 i = 0; i < units * units; i++) g_w2[i] += p2[i];
    }
    free(p3);
    return status;
}
#endif /* NL_WIDE_PASS */
