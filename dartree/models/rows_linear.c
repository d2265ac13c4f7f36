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
 * GGUF block panels (Q4_1, Q8_0): the same panels, holding the GGUF's own quantised blocks instead of the
 * fp32 weights they dequantise to (`models.gguf_panels` re-lays them). Each weight is rebuilt in registers
 * to exactly the fp32 value the dequantisation gives (see "GGUF blocks" below), then goes through the very
 * same multiply-add sequence as above: the results are the fp32 panels' results, bit for bit, at a sixth
 * (Q4_1) or a quarter (Q8_0) of the bytes.
 *
 * Built at first use by models/rows_kernel.py with gcc -O2 -mavx512f -ffp-contract=off -fopenmp. OpenMP
 * resolves to the libgomp that torch has already loaded (same soname), so this shares torch's thread pool.
 */
#include <immintrin.h>

#define P 32       /* output columns per panel: two zmm vectors */
#define RT_MAX 12  /* rows per tile: 2 * RT_MAX accumulators + 2 weight vectors fit the 32 zmm registers */
#ifndef PF_AHEAD
#define PF_AHEAD 8192 /* weights: prefetch the panel stream this far ahead (32 KiB of fp32), into L2 */
#endif

/* ---- The multiply-add sequence shared by every weight format ---------------------------------------- */

static inline __attribute__((always_inline)) void acc_zero(__m512 *acc0, __m512 *acc1, int rt) {
#pragma GCC unroll 12
    for (int r = 0; r < rt; r++) {
        acc0[r] = _mm512_setzero_ps();
        acc1[r] = _mm512_setzero_ps();
    }
}

/* acc[r] += w * x[r][k] for the 32 columns (w0: columns 0-15, w1: 16-31), one fused multiply-add each. */
static inline __attribute__((always_inline)) void acc_fma(__m512 *acc0, __m512 *acc1, __m512 w0, __m512 w1,
                                                          const float *x, long ldx, long k, int rt) {
#pragma GCC unroll 12
    for (int r = 0; r < rt; r++) {
        const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
        acc0[r] = _mm512_fmadd_ps(w0, xv, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(w1, xv, acc1[r]);
    }
}

/* y[r] = acc[r] (+ b), the first `cols` columns through the masks m0 (columns 0-15) and m1 (16-31). */
static inline __attribute__((always_inline)) void acc_store(const __m512 *acc0, const __m512 *acc1, const float *b,
                                                            float *y, long ldy, int rt, __mmask16 m0, __mmask16 m1) {
    const __m512 b0 = b ? _mm512_maskz_loadu_ps(m0, b) : _mm512_setzero_ps();
    const __m512 b1 = b ? _mm512_maskz_loadu_ps(m1, b + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
    for (int r = 0; r < rt; r++) {
        _mm512_mask_storeu_ps(y + r * ldy, m0, b ? _mm512_add_ps(acc0[r], b0) : acc0[r]);
        _mm512_mask_storeu_ps(y + r * ldy + 16, m1, b ? _mm512_add_ps(acc1[r], b1) : acc1[r]);
    }
}

/* ---- fp32 and bf16 panels ---------------------------------------------------------------------------- */

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
    acc_zero(acc0, acc1, rt);
    const long elem = bf16 ? 2 : 4; /* bytes per weight */
    for (long k = 0; k < K; k++) {
        const long off = k * P;
        if (prefetch) {
            const char *ahead = (const char *)wp + (off + PF_AHEAD) * elem;
            _mm_prefetch(ahead, _MM_HINT_T1);
            if (!bf16) _mm_prefetch(ahead + 64, _MM_HINT_T1); /* a bf16 panel row is one cache line */
        }
        acc_fma(acc0, acc1, load_w(wp, off, bf16), load_w(wp, off + 16, bf16), x, ldx, k, rt);
    }
    acc_store(acc0, acc1, b, y, ldy, rt, m0, m1);
}

/* ---- GGUF blocks --------------------------------------------------------------------------------------
 *
 * A GGUF row of K weights is K / 32 blocks of QK = 32 consecutive weights. A block panel keeps one block of
 * each of the panel's 32 output columns side by side, for each of the K / 32 block positions in order
 * (`gguf_panels.q4_1_panels` / `q8_0_panels`):
 *
 *   Q4_1, 640 bytes per 32 x 32 weights:  d[32] fp16 | m[32] fp16 | q[32 k][16 bytes]
 *     byte t of q[kk] holds column t's 4-bit value at k = kk in its low nibble, column t + 16's in its high
 *     one, so one 16-byte load widens to both 16-column halves.  w = d * q + m
 *   Q8_0, 1088 bytes per 32 x 32 weights: d[32] fp16 | q[32 k][32 int8], byte t of q[kk] is column t.  w = q * d
 *
 * Exactness: `gguf.quants` (which the conversion to fp32 used) widens d and m from fp16 to fp32 (exact),
 * then computes in fp32 (d * q) + m for Q4_1, a multiply and then an add, and q * d for Q8_0. The rebuild
 * below does the same IEEE operations in the same order: the widening is exact (vcvtph2ps), q converts
 * exactly, then the multiply and the add. The product is in fact exact too (an 11-bit fp16 significand
 * times a 4- or 8-bit integer fits fp32's 24 bits), so the add is the one rounding; still, the file is
 * compiled with -ffp-contract=off so that gcc, which writes _mm512_mul_ps and _mm512_add_ps as plain vector
 * `*` and `+`, keeps them the two separate operations gguf.quants does rather than fusing them. The rebuilt
 * weight then enters acc_fma exactly as its fp32 value would from an fp32 panel, in the same order.
 */
#define QK 32
#define Q4_1_BYTES (2 * P * 2 + QK * P / 2) /* d, m, nibbles: 640 */
#define Q8_0_BYTES (P * 2 + QK * P)         /* d, int8: 1088 */
enum { Q4_1 = 0, Q8_0 = 1 };

/* The 32 fp16 values at p as fp32, columns 0-15 in *lo and 16-31 in *hi (exact). */
static inline __attribute__((always_inline)) void widen_fp16(const unsigned char *p, __m512 *lo, __m512 *hi) {
    *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
}

/* The 32 weights at k = kk of one block panel `blk`, given its widened scales d (and mins m for Q4_1). */
static inline __attribute__((always_inline)) void block_weights(const unsigned char *blk, int kk, int kind,
                                                                __m512 d0, __m512 d1, __m512 mn0, __m512 mn1,
                                                                __m512 *w0, __m512 *w1) {
    if (kind == Q4_1) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4 * P + kk * (P / 2))));
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))); /* low nibbles */
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));                    /* high nibbles */
        *w0 = _mm512_add_ps(_mm512_mul_ps(d0, q0), mn0); /* (d * q) + m: a multiply, then an add, as gguf.quants */
        *w1 = _mm512_add_ps(_mm512_mul_ps(d1, q1), mn1);
    } else {
        const unsigned char *q = blk + 2 * P + kk * P;
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), d0);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))), d1);
    }
}

/* One block panel's scales (and Q4_1's mins), widened once for its 32 k. */
static inline __attribute__((always_inline)) void block_scales(const unsigned char *blk, int kind, __m512 *d0,
                                                               __m512 *d1, __m512 *mn0, __m512 *mn1) {
    widen_fp16(blk, d0, d1);
    if (kind == Q4_1) widen_fp16(blk + 2 * P, mn0, mn1);
    else *mn0 = *mn1 = _mm512_setzero_ps(); /* unused */
}

static inline __attribute__((always_inline)) void tile_blocks(const float *x, long ldx, const void *wp, long K,
                                                              const float *b, float *y, long ldy, int rt,
                                                              __mmask16 m0, __mmask16 m1, int prefetch, int kind) {
    __m512 acc0[RT_MAX], acc1[RT_MAX];
    acc_zero(acc0, acc1, rt);
    const long bytes = kind == Q4_1 ? Q4_1_BYTES : Q8_0_BYTES;
    for (long kb = 0; kb < K / QK; kb++) {
        const unsigned char *blk = (const unsigned char *)wp + kb * bytes;
        if (prefetch) /* as far ahead in bytes as the fp32 panels prefetch */
            for (long line = 0; line < bytes; line += 64)
                _mm_prefetch((const char *)blk + 4 * PF_AHEAD + line, _MM_HINT_T1);
        __m512 d0, d1, mn0, mn1;
        block_scales(blk, kind, &d0, &d1, &mn0, &mn1);
        for (int kk = 0; kk < QK; kk++) {
            __m512 w0, w1;
            block_weights(blk, kk, kind, d0, d1, mn0, mn1, &w0, &w1);
            acc_fma(acc0, acc1, w0, w1, x, ldx, kb * QK + kk, rt);
        }
    }
    acc_store(acc0, acc1, b, y, ldy, rt, m0, m1);
}

/* How many weights of w [N][K] (fp32, contiguous) differ, in any bit, from what the kernel rebuilds from the
 * block panels wp: zero means the panels give the fp32 panels' results bit for bit. It runs the very
 * functions the kernel runs, so the loader (at every start) and the tests check the kernel's own rebuild
 * against the weights the conversion produced. */
#define MISMATCHES(NAME, KIND, BYTES)                                                                        \
    long NAME(const unsigned char *wp, const float *w, long K, long N) {                                     \
        const long panels = (N + P - 1) / P;                                                                 \
        const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,  \
                                                                  13, 14, 15), _mm512_set1_epi32((int)K));   \
        long bad = 0;                                                                                        \
        _Pragma("omp parallel for schedule(static) reduction(+ : bad)")                                      \
        for (long p = 0; p < panels; p++) {                                                                  \
            const long cols = N - p * P < P ? N - p * P : P;                                                 \
            const __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1u);                      \
            const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1u); \
            for (long kb = 0; kb < K / QK; kb++) {                                                           \
                const unsigned char *blk = wp + (p * (K / QK) + kb) * BYTES;                                 \
                __m512 d0, d1, mn0, mn1, w0, w1;                                                             \
                block_scales(blk, KIND, &d0, &d1, &mn0, &mn1);                                               \
                for (int kk = 0; kk < QK; kk++) {                                                            \
                    block_weights(blk, kk, KIND, d0, d1, mn0, mn1, &w0, &w1);                                \
                    const float *col0 = w + p * P * K + kb * QK + kk; /* w[p * P][k]: columns K apart */     \
                    const __m512i ref0 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m0, rows, col0, 4); \
                    const __m512i ref1 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m1, rows,      \
                                                                     col0 + 16 * K, 4);                      \
                    bad += __builtin_popcount(_mm512_mask_cmpneq_epi32_mask(m0, _mm512_castps_si512(w0), ref0)); \
                    bad += __builtin_popcount(_mm512_mask_cmpneq_epi32_mask(m1, _mm512_castps_si512(w1), ref1)); \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        return bad;                                                                                          \
    }

MISMATCHES(rows_mismatches_q4_1, Q4_1, Q4_1_BYTES)
MISMATCHES(rows_mismatches_q8_0, Q8_0, Q8_0_BYTES)

/* ---- Entry points ------------------------------------------------------------------------------------- */

/* One case per row count, so the compiler keeps every accumulator of the tile in a register; one
 * dispatcher per weight format (the format is a compile-time constant inside each). */
#define TILE(FN, RT, FORMAT) FN(x, ldx, wp, K, b, y, ldy, RT, m0, m1, prefetch, FORMAT)
#define TILE_DISPATCH(NAME, FN, FORMAT)                                                                      \
    static void NAME(const float *x, long ldx, const void *wp, long K, const float *b, float *y, long ldy,  \
                     int rt, __mmask16 m0, __mmask16 m1, int prefetch) {                                     \
        switch (rt) {                                                                                        \
        case 1: TILE(FN, 1, FORMAT); break;                                                                  \
        case 2: TILE(FN, 2, FORMAT); break;                                                                  \
        case 3: TILE(FN, 3, FORMAT); break;                                                                  \
        case 4: TILE(FN, 4, FORMAT); break;                                                                  \
        case 5: TILE(FN, 5, FORMAT); break;                                                                  \
        case 6: TILE(FN, 6, FORMAT); break;                                                                  \
        case 7: TILE(FN, 7, FORMAT); break;                                                                  \
        case 8: TILE(FN, 8, FORMAT); break;                                                                  \
        case 9: TILE(FN, 9, FORMAT); break;                                                                  \
        case 10: TILE(FN, 10, FORMAT); break;                                                                \
        case 11: TILE(FN, 11, FORMAT); break;                                                                \
        default: TILE(FN, 12, FORMAT); break;                                                                \
        }                                                                                                    \
    }

TILE_DISPATCH(tile_dispatch_f32, tile, 0)
TILE_DISPATCH(tile_dispatch_bf16, tile, 1)
TILE_DISPATCH(tile_dispatch_q4_1, tile_blocks, Q4_1)
TILE_DISPATCH(tile_dispatch_q8_0, tile_blocks, Q8_0)

/* Every entry point: x: [M, K] rows with row stride ldx; wp: ceil(N / P) panels (zero-padded past N) of
 * PANEL_SIZE WTYPEs each: [K][P] fp32 or bf16, or [K / QK][bytes] blocks; b: [N] or NULL; y: [M, N]. */
#define ROWS_LINEAR(NAME, WTYPE, PANEL_SIZE, DISPATCH)                                                       \
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
                DISPATCH(x + i * ldx, ldx, wp + p * (PANEL_SIZE), K, b ? b + j : 0, y + i * N + j, N, rt, m0, \
                         m1, i == 0 && p + 1 < panels);                                                      \
            }                                                                                                \
        }                                                                                                    \
    }

ROWS_LINEAR(rows_linear_f32, float, K * P, tile_dispatch_f32)
ROWS_LINEAR(rows_linear_bf16w, unsigned short, K * P, tile_dispatch_bf16)
ROWS_LINEAR(rows_linear_q4_1, unsigned char, K / QK * Q4_1_BYTES, tile_dispatch_q4_1)
ROWS_LINEAR(rows_linear_q8_0, unsigned char, K / QK * Q8_0_BYTES, tile_dispatch_q8_0)
