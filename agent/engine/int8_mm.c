/* y = x @ (w * scales)^T for a few rows of x: the int8 weight-only product of `Int8Linear`.
 *
 * x [M, K] float32, w [N, K] int8, scales [N] float32, y [M, N] float32; K a multiple of 32.
 * Each row of x becomes int16 with a scale of its own (its largest magnitude maps to the
 * largest value whose products cannot overflow an int32 sum over K), and the products add up
 * in int32 with AVX-512 VNNI (vpdpwssd): exact integer sums, so a row's result never depends
 * on the other rows or on how many there are. Threads split the output columns, and every
 * block of 4 weight rows is read once from memory for all the rows of x, six at a time:
 * decoding one token and verifying five cost nearly the same weight traffic.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define NB 4 /* weight rows (output columns) per block */
#define RB 5 /* rows of x per block: RB * NB accumulators stay in registers */

static void quantize_rows(const float *x, int64_t M, int64_t K, int16_t *q, float *qs) {
    const float qmax = (float)fmin(32767.0, floor(2147483647.0 / (127.0 * (double)K)));
    for (int64_t r = 0; r < M; r++) {
        const float *row = x + r * K;
        __m512 top = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int64_t k = 0; k < K; k += 16) {
            __m512 v = _mm512_loadu_ps(row + k);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            top = _mm512_max_ps(top, _mm512_abs_ps(v));
        }
        float amax = nan ? NAN : _mm512_reduce_max_ps(top);
        if (!(amax > 0.0f) || isinf(amax)) { /* zero row, or NaN/inf: pass it through */
            for (int64_t k = 0; k < K; k++) q[r * K + k] = 0;
            qs[r] = amax == 0.0f ? 0.0f : NAN;
            continue;
        }
        __m512 inv = _mm512_set1_ps(qmax / amax);
        for (int64_t k = 0; k < K; k += 16) {
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + k), inv));
            _mm256_storeu_si256((__m256i *)(q + r * K + k), _mm512_cvtsepi32_epi16(v));
        }
        qs[r] = amax / qmax;
    }
}

static inline __attribute__((always_inline)) void block(
    const int16_t *x, const float *xs, int64_t K, const int8_t *w, const float *scales,
    int64_t N, int64_t n, float *y, const int R) {
    __m512i acc[RB][NB];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int i = 0; i < NB; i++) acc[r][i] = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 32) {
        __m512i wv[NB];
        _Pragma("GCC unroll 4") for (int i = 0; i < NB; i++) wv[i] = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256((const __m256i *)(w + (n + i) * K + k)));
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_loadu_si512((const void *)(x + r * K + k));
            _Pragma("GCC unroll 4") for (int i = 0; i < NB; i++)
                acc[r][i] = _mm512_dpwssd_epi32(acc[r][i], xv, wv[i]);
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int i = 0; i < NB; i++)
            y[r * N + n + i] = (float)_mm512_reduce_add_epi32(acc[r][i]) * (xs[r] * scales[n + i]);
}

/* Returns 0, or -1 when scratch memory could not be allocated (y is then untouched). */
int flywheel_int8_mm(const float *x, int64_t M, int64_t K, const int8_t *w,
                     const float *scales, int64_t N, float *y, int threads) {
    int16_t *q = malloc((size_t)(M * K) * sizeof(int16_t) + 64);
    float *qs = malloc((size_t)M * sizeof(float) + 64);
    if (!q || !qs) {
        free(q);
        free(qs);
        return -1;
    }
    quantize_rows(x, M, K, q, qs);
    int64_t full = N / NB * NB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < full; n += NB) {
        for (int64_t m = 0; m < M; m += RB) {
            const int16_t *xm = q + m * K;
            const float *sm = qs + m;
            float *ym = y + m * N;
            switch (M - m >= RB ? RB : M - m) {
            case 5: block(xm, sm, K, w, scales, N, n, ym, 5); break;
            case 4: block(xm, sm, K, w, scales, N, n, ym, 4); break;
            case 3: block(xm, sm, K, w, scales, N, n, ym, 3); break;
            case 2: block(xm, sm, K, w, scales, N, n, ym, 2); break;
            default: block(xm, sm, K, w, scales, N, n, ym, 1);
            }
        }
    }
    for (int64_t n = full; n < N; n++) /* the last N % 4 columns: the same sums, one by one */
        for (int64_t m = 0; m < M; m++) {
            __m512i acc = _mm512_setzero_si512();
            for (int64_t k = 0; k < K; k += 32)
                acc = _mm512_dpwssd_epi32(
                    acc, _mm512_loadu_si512((const void *)(q + m * K + k)),
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + n * K + k))));
            y[m * N + n] = (float)_mm512_reduce_add_epi32(acc) * (qs[m] * scales[n]);
        }
    free(q);
    free(qs);
    return 0;
}
