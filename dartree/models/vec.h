/* The vector helpers llama_rows.c and sample_rows.c share: the lane mask of a row's tail, and the one exp. */
#ifndef DARTREE_VEC_H
#define DARTREE_VEC_H
#include <immintrin.h>

/* The first min(left, 16) lanes. */
static inline __mmask16 tail_mask(long left) { return left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u); }

/* exp(x) for 16 lanes, x clamped to [-87, 88]: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts), e^r by
 * its Taylor polynomial to r^7 (relative error below 1e-7 there), times 2^n. Hand-written because the
 * lossless guarantee needs one fixed exp for every row, and libm's scalar expf would cost more than the
 * attention's dot products at long contexts. */
static inline __m512 vexp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    static const float c[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(c[0]);
    for (int i = 1; i < 8; i++)
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c[i]));
    return _mm512_scalef_ps(p, n);
}

#endif
