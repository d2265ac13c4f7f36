/* One draw per row from softmax(logits / T): the target's next token at T > 0 (top-p 1), for plain decoding
 * and for every node of a tree verify alike (`dartree.sampling.next_tokens`).
 *
 * Why hand-written: at T = 0.8 a round draws at all B + 1 nodes of the verified tree. The torch version
 * (`sampling.processed_probs`, then `sampling.draw`'s two-level inverse-CDF search) runs about twenty
 * operations over [N, V] and took 1.6 ms of a 46 ms round for 9 rows, and 0.6 ms of plain decoding's 28 ms step
 * for one row, on this 2-core CPU (docs/speed.md). Here a row is one pass for its maximum and one for its
 * weights and their block sums, then two short searches, in one call for all rows.
 *
 * The draw, row by row (rows run in parallel; a row's token depends only on its logits and its uniform u):
 *   w_j = exp((x_j - max) / T)  (`vexp`; exactly 0 where x_j = -inf), in float;
 *   S_b = the sum of block b's w_j (256 tokens a block), in double, in token order; total = S_0 + S_1 + ...;
 *   the block b is the first whose running sum exceeds u * total, and the token the first of b whose running
 *   sum (double) exceeds what is left of u * total; both searches stop at the last positive weight, so a
 *   token of weight 0 never comes out.
 * This is `sampling.draw` on the unnormalised weights (scaling u rather than the weights), so token j comes
 * out with probability w_j / total: the softmax of logits / T, computed with another exp than torch's.
 * Plain decoding and the tree walk both draw here, so they sample one and the same distribution.
 */
#include <immintrin.h>
#include <math.h>

#include "vec.h"

#define DRAW_BLOCK 256 /* tokens a block, as sampling.DRAW_BLOCK */

/* The 16 weights at x[k..k+15] (lanes past v are 0): exp((x - max) / T), 0 for x = -inf. */
static inline __m512 weights16(const float *x, long k, long v, __m512 mx, __m512 inv_t) {
    const __mmask16 in = tail_mask(v - k);
    const __m512 xv = _mm512_maskz_loadu_ps(in, x + k);
    const __mmask16 seen = _mm512_mask_cmp_ps_mask(in, xv, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    return _mm512_maskz_mov_ps(seen, vexp(_mm512_mul_ps(_mm512_sub_ps(xv, mx), inv_t)));
}

static long sample_row(const float *x, long v, float inv_t, double u) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (long k = 0; k < v; k += 16)
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(v - k), x + k));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), it = _mm512_set1_ps(inv_t);
    const long blocks = (v + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double sums[blocks];
    double total = 0.0;
    long last = 0; /* the last block of positive weight */
    for (long b = 0; b < blocks; b++) {
        __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
        for (long k = b * DRAW_BLOCK; k < v && k < (b + 1) * DRAW_BLOCK; k += 16) {
            const __m512 w = weights16(x, k, v, mx, it);
            lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(w)));
            hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1))));
        }
        sums[b] = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
        total += sums[b];
        if (sums[b] > 0.0) last = b;
    }
    const double goal = u * total;
    double before = 0.0; /* the weight of the blocks before b */
    long b = 0;
    while (b < last && before + sums[b] <= goal)
        before += sums[b++];
    const double rest = goal - before;
    float w[DRAW_BLOCK];
    const long first = b * DRAW_BLOCK, count = v - first < DRAW_BLOCK ? v - first : DRAW_BLOCK;
    long pick = -1; /* the last positive weight of the block, then the token */
    for (long k = 0; k < count; k += 16) /* the block's weights again: the same operations give the same values */
        _mm512_mask_storeu_ps(w + k, tail_mask(count - k), weights16(x, first + k, v, mx, it));
    for (long k = 0; k < count; k++)
        if (w[k] > 0.0f) pick = k;
    double run = 0.0;
    for (long k = 0; k < pick; k++) {
        run += (double)w[k];
        if (run > rest) {
            pick = k;
            break;
        }
    }
    return first + (pick < 0 ? 0 : pick); /* pick < 0: a row of -inf only, which has no distribution */
}

/* out[i] = a draw from softmax(x[i] / T) with the uniform u[i] in [0, 1), for the n rows x [n, v] (row stride
 * ldx). inv_t = 1 / T. */
void sample_rows(const float *x, long n, long v, long ldx, float inv_t, const double *u, long *out) {
    #pragma omp parallel for schedule(static) if (n > 1)
    for (long i = 0; i < n; i++)
        out[i] = sample_row(x + i * ldx, v, inv_t, u[i]);
}
