/* Flywheel's CPU kernels for decode-sized steps (cpu_kernels.py builds and loads them).
 *
 * flywheel_int8_mm: y = (x * columns) @ (w * scales)^T for a few rows of x, `Int8Linear`'s
 * product (w holds the weights divided by `columns`, column by column).
 *
 * x [M, K] float32, columns [K], scales [N] float32, y [M, N] float32; K a multiple of 16. w is
 * int8 in the packed layout of `cpu_kernels.pack_int8`: blocks of 32 output columns, and in a
 * block, for each pair of k, the 32 columns' two weights side by side ([ceil(N / 32), K / 2, 32,
 * 2], the last block padded with zero columns). Each row of x * columns becomes int16 with a
 * scale of its own (its largest magnitude maps to the largest value whose products cannot
 * overflow an int32 sum over K), and the products add up in int32 with AVX-512 VNNI
 * (vpdpwssd): exact integer sums, so a row's result never depends on the other rows or on how
 * many there are. Threads split the blocks, and each block's weights are read once from memory
 * for all the rows of x, five at a time: decoding one token and verifying five cost nearly the
 * same weight traffic.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CB 32 /* output columns per block */
#define RB 5  /* rows of x per block: 2 * RB * 2 accumulators stay in registers */
/* Bytes ahead of the weights being read that `block` asks the cache to fetch: the hardware's
 * prefetchers stop at page boundaries, and without this the rows' arithmetic waits for memory
 * instead of overlapping it, so every row of a verify step added to a product's time. */
#define PREFETCH 16384

static void quantize_rows(const float *x, const float *columns, int64_t M, int64_t K, int16_t *q,
                          float *qs) {
    const float qmax = (float)fmin(32767.0, floor(2147483647.0 / (127.0 * (double)K)));
    for (int64_t r = 0; r < M; r++) {
        const float *row = x + r * K;
        __m512 top = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int64_t k = 0; k < K; k += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(row + k), _mm512_loadu_ps(columns + k));
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
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(row + k), _mm512_loadu_ps(columns + k));
            __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
            _mm256_storeu_si256((__m256i *)(q + r * K + k), _mm512_cvtsepi32_epi16(i));
        }
        qs[r] = amax / qmax;
    }
}

/* RB rows of x times one block of CB weight columns: per pair of k, the block's 32 columns x 2
 * weights (64 int8, contiguous in the packed layout) widen to int16 once, and every row adds
 * its broadcast pair of activations times them (vpdpwssd), 16 columns per vector. The sums stay
 * in their lanes: no horizontal reductions. Two sets of accumulators (even and odd pairs) keep
 * the dependency chains short when there is one row. */
static inline __attribute__((always_inline)) void block(const int16_t *x, const float *xs,
                                                        int64_t K, const int8_t *wb,
                                                        const float *scales, int64_t N,
                                                        int64_t n, float *y, const int R) {
    __m512i acc[2][RB][2];
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
            acc[h][r][0] = acc[h][r][1] = _mm512_setzero_si512();
    for (int64_t p = 0; p < K / 2; p += 2) {
        _mm_prefetch((const char *)(wb + p * 2 * CB + PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(wb + p * 2 * CB + PREFETCH + 64), _MM_HINT_T0);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const int8_t *wp = wb + (p + h) * 2 * CB;
            const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)wp));
            const __m512i w1 =
                _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wp + CB)));
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, x + r * K + 2 * (p + h), sizeof pair);
                const __m512i xv = _mm512_set1_epi32(pair);
                acc[h][r][0] = _mm512_dpwssd_epi32(acc[h][r][0], xv, w0);
                acc[h][r][1] = _mm512_dpwssd_epi32(acc[h][r][1], xv, w1);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++) {
            const int64_t c = n + 16 * g;
            if (c >= N) break; /* the padding of the last block */
            const __mmask16 keep = N - c >= 16 ? 0xffff : (__mmask16)((1u << (N - c)) - 1);
            const __m512 scale =
                _mm512_mul_ps(_mm512_set1_ps(xs[r]), _mm512_maskz_loadu_ps(keep, scales + c));
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[0][r][g], acc[1][r][g]));
            _mm512_mask_storeu_ps(y + r * N + c, keep, _mm512_mul_ps(sum, scale));
        }
}

/* Returns 0, or -1 when scratch memory could not be allocated (y is then untouched). */
int flywheel_int8_mm(const float *x, const float *columns, int64_t M, int64_t K, const int8_t *w,
                     const float *scales, int64_t N, float *y, int threads) {
    int16_t *q = malloc((size_t)(M * K) * sizeof(int16_t) + 64);
    float *qs = malloc((size_t)M * sizeof(float) + 64);
    if (!q || !qs) {
        free(q);
        free(qs);
        return -1;
    }
    quantize_rows(x, columns, M, K, q, qs);
    const int64_t blocks = (N + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        const int8_t *wb = w + b * CB * K;
        for (int64_t m = 0; m < M; m += RB) {
            const int16_t *xm = q + m * K;
            const float *sm = qs + m;
            float *ym = y + m * N;
            switch (M - m >= RB ? RB : M - m) {
            case 5: block(xm, sm, K, wb, scales, N, CB * b, ym, 5); break;
            case 4: block(xm, sm, K, wb, scales, N, CB * b, ym, 4); break;
            case 3: block(xm, sm, K, wb, scales, N, CB * b, ym, 3); break;
            case 2: block(xm, sm, K, wb, scales, N, CB * b, ym, 2); break;
            default: block(xm, sm, K, wb, scales, N, CB * b, ym, 1);
            }
        }
    }
    free(q);
    free(qs);
    return 0;
}

/* e^x for x <= 0 (a softmax's shifted scores), 16 at a time: x = n ln2 + r, |r| <= ln2/2,
 * e^r by its Taylor polynomial to degree 7, times 2^n (vscalefps). Same input, same bits. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The 16 horizontal sums of d[0..15] as one vector (lane i: the sum of d[i]'s lanes), by a
 * transpose-and-add tree: far fewer shuffles than 16 reductions, and every d[i] is summed in
 * the same order whatever its slot. */
static inline __m512 sum16(const __m512 *d) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * i], d[2 * i + 1]),
                             _mm512_unpackhi_ps(d[2 * i], d[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(
            _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* e^(s - max s) in place for s[0..keys) (exp512), zeros in s[keys..span): the keys a query
 * does not see weigh nothing in its tile's value loop. Returns 1 / the sum of the weights. */
static float softmax(float *s, int64_t keys, int64_t span) {
    __m512 top16 = _mm512_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 16 <= keys; t += 16) top16 = _mm512_max_ps(top16, _mm512_loadu_ps(s + t));
    if (t < keys)
        top16 = _mm512_mask_max_ps(top16, (__mmask16)((1u << (keys - t)) - 1), top16,
                                   _mm512_loadu_ps(s + t));
    const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top16));
    __m512 total = _mm512_setzero_ps();
    for (t = 0; t + 16 <= keys; t += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), shift));
        _mm512_storeu_ps(s + t, e);
        total = _mm512_add_ps(total, e);
    }
    if (t < keys) {
        __mmask16 tail = (__mmask16)((1u << (keys - t)) - 1);
        __m512 e = _mm512_maskz_mov_ps(tail, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), shift)));
        _mm512_mask_storeu_ps(s + t, tail, e);
        total = _mm512_add_ps(total, e);
    }
    for (t = keys; t < span; t++) s[t] = 0.0f;
    return 1.0f / _mm512_reduce_add_ps(total);
}

#define TILE_MAX 8

/* Query i of a tree step sees the first `past` keys and those of the new positions whose bits
 * are set in `sees` (its own last), not the keys up to itself: its scores [0, keys) move
 * together so that the softmax sums them in the lanes a decode step over the same keys would
 * (`gather`), and go back to their places, with zeros for the keys it does not see, for the
 * value loop (`scatter`). Returns how many keys it sees. */
static int64_t gather(float *s, int64_t past, int64_t keys, uint64_t sees) {
    int64_t c = past;
    for (int64_t j = 0; past + j < keys; j++)
        if (sees >> j & 1) s[c++] = s[past + j];
    return c;
}

static void scatter(float *s, int64_t past, int64_t keys, int64_t seen, uint64_t sees) {
    for (int64_t j = keys - past - 1; j >= 0; j--)
        s[past + j] = sees >> j & 1 ? s[--seen] : 0.0f;
}

/* One tile: n <= T queries of one KV head (qs[i]: query i's vector; keys[i]: how many keys it
 * sees, or with sees[i] != 0 the keys up to itself, of which it sees the first `past` and the
 * new ones in sees[i]; outs[i]: where its output goes), L vectors of 16 per head. Each key and
 * value row is read once for the whole tile, and each query's arithmetic is the same as alone. */
static inline __attribute__((always_inline)) void tile(
    const float *const *qs, const int64_t *keys, const uint64_t *sees, int64_t past,
    float *const *outs, int n, const float *kb, const float *vb, float scale, float *s,
    int64_t stride, const int L, const int T) {
    const int64_t hd = 16 * L;
    int64_t span = 0;
    for (int i = 0; i < n; i++) span = keys[i] > span ? keys[i] : span;
    for (int64_t t = 0; t < span; t += 16) {
        const int64_t nk = span - t < 16 ? span - t : 16;
        const __mmask16 valid = (__mmask16)((1u << nk) - 1);
        for (int i = 0; i < n; i++) {
            __m512 dot[16];
            _Pragma("GCC unroll 16") for (int u = 0; u < 16; u++) {
                dot[u] = _mm512_setzero_ps();
                if (u < nk)
                    _Pragma("GCC unroll 8") for (int l = 0; l < L; l++) dot[u] = _mm512_fmadd_ps(
                        _mm512_loadu_ps(qs[i] + 16 * l),
                        _mm512_loadu_ps(kb + (t + u) * hd + 16 * l), dot[u]);
            }
            _mm512_mask_storeu_ps(s + i * stride + t, valid,
                                  _mm512_mul_ps(sum16(dot), _mm512_set1_ps(scale)));
        }
    }
    float norm[TILE_MAX];
    for (int i = 0; i < n; i++) {
        float *si = s + i * stride;
        if (!sees[i]) {
            norm[i] = softmax(si, keys[i], span);
            continue;
        }
        const int64_t seen = gather(si, past, keys[i], sees[i]);
        norm[i] = softmax(si, seen, seen);
        scatter(si, past, keys[i], seen, sees[i]);
        for (int64_t t = keys[i]; t < span; t++) si[t] = 0.0f;
    }
    __m512 acc[T][L];
    _Pragma("GCC unroll 8") for (int i = 0; i < T; i++)
        _Pragma("GCC unroll 8") for (int l = 0; l < L; l++) acc[i][l] = _mm512_setzero_ps();
    for (int64_t u = 0; u < span; u++) {
        __m512 v[L];
        _Pragma("GCC unroll 8") for (int l = 0; l < L; l++) v[l] =
            _mm512_loadu_ps(vb + u * hd + 16 * l);
        _Pragma("GCC unroll 8") for (int i = 0; i < T; i++) {
            if (i >= n) break;
            const __m512 p = _mm512_set1_ps(s[i * stride + u]);
            _Pragma("GCC unroll 8") for (int l = 0; l < L; l++) acc[i][l] =
                _mm512_fmadd_ps(p, v[l], acc[i][l]);
        }
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < T; i++) {
        if (i >= n) break;
        _Pragma("GCC unroll 8") for (int l = 0; l < L; l++)
            _mm512_storeu_ps(outs[i] + 16 * l, _mm512_mul_ps(acc[i][l], _mm512_set1_ps(norm[i])));
    }
}

#define TILE(L) ((L) <= 3 ? 8 : 24 / (L)) /* queries per tile: T * L accumulators in registers */
#define META 9 /* int64s per part in flywheel_attend's meta */

/* Llama's rotary embedding of one head's vector: x * cos + rotate_half(x) * sin, where
 * rotate_half(x) = [-x2, x1] for the halves of x. Separate products and sums (the library is
 * compiled with -ffp-contract=off), as torch computes them, to the same bits. */
static void rope(const float *x, const float *cos, const float *sin, int64_t hd, float *out) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) out[i] = x[i] * cos[i] + -x[i + half] * sin[i];
    for (int64_t i = half; i < hd; i++) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

/* Causal attention of several parts' new positions, each part over its own KV cache, in one
 * call (a batched step's decode rows and verify steps).
 *
 * Part p is meta[9p..9p+9) = {offset, rows, m, length, k, v, row_stride, head_stride, tree}: its
 * rows * m new positions are tokens offset + r * m + j of q, and k, v point to its cache's
 * keys and values [rows, kv_heads, >= length, hd] (positions contiguous, the given row and
 * head strides, the same for both), whose last m positions are its new ones. Token t's query
 * for head h is at q + h * q_head + t * q_tok, its output at out + (t * heads + h) * hd. With
 * k_new (and v_new), the new keys and values (token t, kv head g at k_new + g * kn_head + t *
 * kn_tok) are first written into the caches. With cos (and sin), token t's [hd] rows at cos +
 * t * hd, q and k_new are given before the rotary embedding, which is applied here (`rope`).
 * New position j sees the first length - m + j + 1 keys, or with a tree (a pointer to m
 * uint64 masks, m <= 64) the first length - m and the new positions i whose bit i is set in
 * tree[j] (a branch of drafts: its own ancestors and itself); head h reads kv head h / (heads /
 * kv_heads); hd is a multiple of 16, at most 128. A step of one new position over fewer than
 * long_context keys runs on one thread (waking a second costs more than it saves, and far more
 * while another process holds its core); any other, on `threads`.
 *
 * The queries of one (part, row, KV head) go in tiles that read each key and value once, but
 * every query's own arithmetic is fixed (its scores by `sum16`, its softmax over its own keys,
 * its values added in key order), so a position's output is the same bits whether it comes in
 * a decode step, among a verify step's drafts, or beside other parts. Returns 0, or -1 when
 * scratch memory could not be allocated.
 */
int flywheel_attend(const float *q, int64_t q_head, int64_t q_tok, int64_t heads, int64_t hd,
                    int64_t kv_heads, const float *k_new, const float *v_new, int64_t kn_head,
                    int64_t kn_tok, int64_t vn_head, int64_t vn_tok, const float *cos,
                    const float *sin, const int64_t *meta, int64_t parts, float scale,
                    float *out, int threads, int64_t long_context) {
    const int64_t group = heads / kv_heads;
    const int L = (int)(hd / 16), T = TILE(L);
    int64_t items = 0, longest = 0, positions = 0;
    for (int64_t p = 0; p < parts; p++) {
        const int64_t *pm = meta + META * p, rows = pm[1], m = pm[2];
        items += rows * kv_heads * ((group * m + T - 1) / T);
        longest = pm[3] > longest ? pm[3] : longest;
        positions += rows * m;
    }
    if (positions == 1 && longest < long_context) threads = 1;
    const int64_t stride = longest + 16;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        if (k_new) {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < parts; p++) {
                const int64_t *pm = meta + META * p, past = pm[3] - pm[2];
                float *kc = (float *)(intptr_t)pm[4], *vc = (float *)(intptr_t)pm[5];
                for (int64_t r = 0; r < pm[1]; r++)
                    for (int64_t j = 0; j < pm[2]; j++)
                        for (int64_t g = 0; g < kv_heads; g++) {
                            const int64_t t = pm[0] + r * pm[2] + j;
                            const int64_t at = r * pm[6] + g * pm[7] + (past + j) * hd;
                            const float *key = k_new + g * kn_head + t * kn_tok;
                            if (cos)
                                rope(key, cos + t * hd, sin + t * hd, hd, kc + at);
                            else
                                memcpy(kc + at, key, hd * sizeof(float));
                            memcpy(vc + at, v_new + g * vn_head + t * vn_tok, hd * sizeof(float));
                        }
            }
        }
        float *s = malloc((size_t)(T * stride + TILE_MAX * hd) * sizeof(float));
        float *rotated = s ? s + T * stride : NULL; /* the tile's queries after `rope` */
        if (!s) failed = 1;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; item++) {
            if (!s) continue;
            int64_t p = 0, local = item, tiles = 0;
            for (;; p++) { /* the part this item belongs to */
                tiles = (group * meta[META * p + 2] + T - 1) / T;
                const int64_t count = meta[META * p + 1] * kv_heads * tiles;
                if (local < count) break;
                local -= count;
            }
            const int64_t *pm = meta + META * p, m = pm[2], past = pm[3] - m;
            const int64_t r = local / (kv_heads * tiles), g = local / tiles % kv_heads;
            const int64_t first = local % tiles * T, per_head = group * m;
            const int n = (int)(per_head - first < T ? per_head - first : T);
            const float *qs[TILE_MAX];
            float *outs[TILE_MAX];
            int64_t keys[TILE_MAX];
            uint64_t sees[TILE_MAX];
            const uint64_t *tree = (const uint64_t *)(intptr_t)pm[8];
            for (int i = 0; i < n; i++) {
                const int64_t h = g * group + (first + i) / m, j = (first + i) % m;
                const int64_t t = pm[0] + r * m + j;
                qs[i] = q + h * q_head + t * q_tok;
                if (cos) {
                    rope(qs[i], cos + t * hd, sin + t * hd, hd, rotated + i * hd);
                    qs[i] = rotated + i * hd;
                }
                outs[i] = out + (t * heads + h) * hd;
                keys[i] = past + j + 1;
                sees[i] = tree ? tree[j] : 0;
            }
            const int64_t at = r * pm[6] + g * pm[7];
            const float *kb = (const float *)(intptr_t)pm[4] + at;
            const float *vb = (const float *)(intptr_t)pm[5] + at;
            switch (L) {
            case 1: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 1, TILE(1)); break;
            case 2: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 2, TILE(2)); break;
            case 3: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 3, TILE(3)); break;
            case 4: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 4, TILE(4)); break;
            case 5: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 5, TILE(5)); break;
            case 6: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 6, TILE(6)); break;
            case 7: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 7, TILE(7)); break;
            default: tile(qs, keys, sees, past, outs, n, kb, vb, scale, s, stride, 8, TILE(8));
            }
        }
        free(s);
    }
    return failed ? -1 : 0;
}
