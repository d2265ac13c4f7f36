/* y = x @ w.T + b for a few rows, streaming the weight once: the CPU kernel of decoding and tree verify.
 *
 * Why: decoding a 135M-parameter model on two cores is bound by reading its ~540 MB of fp32 weights.
 * A tree verify over 9-33 rows should cost about what one row costs, since every weight read serves all
 * rows; MKL's small-M GEMM paths (packed or not) spend 1.4-1.6x a row's time there.
 *
 * Layout: the weight is re-laid once into panels of P = 32 output columns, each panel [K][P] contiguous
 * (`rows_kernel.panel_weight`). Each thread takes a contiguous run of panels and streams them in order;
 * for every k it loads the panel's two 16-wide vectors once and multiplies them with x[r][k] broadcast
 * for every row r of the tile, so there is no horizontal reduction and each weight byte comes from DRAM
 * once per pass, whatever the row count.
 *
 * Exactness: y[i][j] = (((0 + w[j][0] x[i][0]) + w[j][1] x[i][1]) + ... ) + b[j], one fused
 * multiply-add per k in order 0..K-1, then the bias: the same operations whatever the row count M and
 * whichever tile the row falls in. A row's result is a function of that row and the weights alone, bit
 * for bit, so a tree verify over B + 1 rows gives each row exactly what plain decoding gives it one row
 * at a time: that is what keeps speculative decoding lossless at T = 0.
 *
 * Weights that are all exact bf16 numbers (a bf16 checkpoint run in fp32) may come as bf16 panels: each is
 * widened to the same fp32 value before its multiply, so the result is the fp32 panels' result, bit for bit.
 *
 * Built at first use by models/rows_kernel.py with gcc -O2 -mavx512f -fopenmp. OpenMP resolves to the
 * libgomp that torch has already loaded (same soname), so this shares torch's thread pool.
 */
#include <immintrin.h>

#define P 32       /* output columns per panel: two zmm vectors */
#define RT_MAX 12  /* rows per tile: 2 * RT_MAX accumulators + 2 weight vectors fit the 32 zmm registers */
#ifndef PF_AHEAD
#define PF_AHEAD 8192 /* weights: prefetch the panel stream this far ahead (32 KiB of fp32), into L2 */
#endif

/* 16 weights at wp[off..off+15] as fp32: a plain load, or bf16 widened exactly (its bits shifted up). */
static inline __attribute__((always_inline)) __m512 load_w(const void *wp, long off, int bf16) {
    if (bf16) {
        const __m256i half = _mm256_loadu_si256((const __m256i *)((const unsigned short *)wp + off));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    return _mm512_loadu_ps((const float *)wp + off);
}

static inline __attribute__((always_inline)) void tile(const float *x, long ldx, const void *wp, long K,
                                                       const float *b, float *y, long ldy, int rt,
                                                       __mmask16 m0, __mmask16 m1, int prefetch, int bf16) {
    __m512 acc0[RT_MAX], acc1[RT_MAX];
#pragma GCC unroll 12
    for (int r = 0; r < rt; r++) {
        acc0[r] = _mm512_setzero_ps();
        acc1[r] = _mm512_setzero_ps();
    }
    const long elem = bf16 ? 2 : 4; /* bytes per weight */
    for (long k = 0; k < K; k++) {
        const long off = k * P;
        if (prefetch) {
            const char *ahead = (const char *)wp + (off + PF_AHEAD) * elem;
            _mm_prefetch(ahead, _MM_HINT_T1);
            if (!bf16) _mm_prefetch(ahead + 64, _MM_HINT_T1); /* a bf16 panel row is one cache line */
        }
        const __m512 w0 = load_w(wp, off, bf16), w1 = load_w(wp, off + 16, bf16);
#pragma GCC unroll 12
        for (int r = 0; r < rt; r++) {
            const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
            acc0[r] = _mm512_fmadd_ps(w0, xv, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(w1, xv, acc1[r]);
        }
    }
    const __m512 b0 = b ? _mm512_maskz_loadu_ps(m0, b) : _mm512_setzero_ps();
    const __m512 b1 = b ? _mm512_maskz_loadu_ps(m1, b + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
    for (int r = 0; r < rt; r++) {
        _mm512_mask_storeu_ps(y + r * ldy, m0, b ? _mm512_add_ps(acc0[r], b0) : acc0[r]);
        _mm512_mask_storeu_ps(y + r * ldy + 16, m1, b ? _mm512_add_ps(acc1[r], b1) : acc1[r]);
    }
}

/* One case per row count, so the compiler keeps every accumulator of the tile in a register; one
 * dispatcher per weight type (bf16 is a compile-time constant inside each). */
#define TILE(RT) tile(x, ldx, wp, K, b, y, ldy, RT, m0, m1, prefetch, bf16)
#define TILE_DISPATCH(NAME, BF16)                                                                            \
    static void NAME(const float *x, long ldx, const void *wp, long K, const float *b, float *y, long ldy,  \
                     int rt, __mmask16 m0, __mmask16 m1, int prefetch) {                                     \
        const int bf16 = BF16;                                                                               \
        switch (rt) {                                                                                        \
        case 1: TILE(1); break;                                                                              \
        case 2: TILE(2); break;                                                                              \
        case 3: TILE(3); break;                                                                              \
        case 4: TILE(4); break;                                                                              \
        case 5: TILE(5); break;                                                                              \
        case 6: TILE(6); break;                                                                              \
        case 7: TILE(7); break;                                                                              \
        case 8: TILE(8); break;                                                                              \
        case 9: TILE(9); break;                                                                              \
        case 10: TILE(10); break;                                                                            \
        case 11: TILE(11); break;                                                                            \
        default: TILE(12); break;                                                                            \
        }                                                                                                    \
    }

TILE_DISPATCH(tile_dispatch_f32, 0)
TILE_DISPATCH(tile_dispatch_bf16, 1)

/* Both entry points: x: [M, K] rows with row stride ldx; wp: [ceil(N / P), K, P] panels (zero-padded past
 * N) of fp32 or of bf16; b: [N] or NULL; y: [M, N] contiguous. */
#define ROWS_LINEAR(NAME, WTYPE, DISPATCH)                                                                   \
    void NAME(const float *x, long ldx, const WTYPE *wp, const float *b, float *y, long M, long K, long N) { \
        const long panels = (N + P - 1) / P;                                                                 \
        _Pragma("omp parallel for schedule(static) if (panels > 1)")                                         \
        for (long p = 0; p < panels; p++) {                                                                  \
            const long j = p * P, cols = N - j < P ? N - j : P;                                              \
            const __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1u);                      \
            const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1u); \
            for (long i = 0; i < M; i += RT_MAX) {                                                           \
                const int rt = (int)(M - i < RT_MAX ? M - i : RT_MAX);                                       \
                /* the first row tile streams the panel from memory; later ones find it in L1/L2 */          \
                DISPATCH(x + i * ldx, ldx, wp + p * K * P, K, b ? b + j : 0, y + i * N + j, N, rt, m0, m1,  \
                         i == 0 && p + 1 < panels);                                                          \
            }                                                                                                \
        }                                                                                                    \
    }

ROWS_LINEAR(rows_linear_f32, float, tile_dispatch_f32)
ROWS_LINEAR(rows_linear_bf16w, unsigned short, tile_dispatch_bf16)
