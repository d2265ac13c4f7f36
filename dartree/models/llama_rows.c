/* The rest of a Llama decoder layer around the row kernel: norms, RoPE, the KV write, tree attention and
 * the SiLU gate, row by row, in three calls a layer (`llama_pre`, `tree_attention`, `llama_post`).
 *
 * Why: a plain decoding step of SmolLM2-135M on two cores spends about a third of its time outside the
 * weight-streaming products, in some 50 small torch operations a layer (a few microseconds of dispatch
 * each, 30 layers): norms, rotary, reshapes, the attention call and its mask. Here each layer is three C
 * functions that touch every activation once, behind one entry point a layer, `llama_layer`.
 * `dartree.models.llama` uses it for decoding and tree verify; the prefill keeps transformers' operations.
 *
 * Exactness: every result of a row is a function of that row's inputs, the weights and the keys and
 * values it sees, computed by the same operations in the same order whatever the row count, the tree,
 * or the thread that runs it:
 *   - norms: the sum of squares in 16 lanes over the row, a fixed lane reduction, one square root;
 *   - RoPE: x * cos + rotate_half(x) * sin, a multiply, a multiply and an add (no contraction);
 *   - attention: the keys a row may see are taken in cache order (prefix, then its tree ancestors, then
 *     itself), which is exactly the order in which plain decoding finds the same keys after the accepted
 *     path is moved down; each score is one chain of d multiply-adds; then their maximum, the
 *     exponentials (one vector exp, `vexp`), their sum key by key, and the weighted sum of values key by
 *     key, each a chain in key order in which a key the row does not see adds an exact zero or is skipped;
 *   - SiLU: g / (1 + exp(-g)) with the same `vexp`.
 * So a tree verify gives each node's row bit for bit what plain decoding gives it: the lossless
 * guarantee holds as with the row kernel alone. The numbers differ from transformers' operations in the
 * last bits (another reduction order, another exp), which is why the prefill, whose rows no other pass
 * recomputes, may keep those. OpenMP splits the products by panels and the attention by (kv head, 16 of
 * its queries): how the work is split never changes what a row computes.
 *
 * Built with rows_linear.c into one library (models/rows_kernel.py): gcc -O2 -mavx512f -ffp-contract=off.
 */
#include <immintrin.h>
#include <math.h>

#include "vec.h"

typedef void (*linear_fn)(const float *x, long ldx, const void *w, const float *b, float *y, long M, long K, long N);
void rows_linear_f32(const float *, long, const float *, const float *, float *, long, long, long);
void rows_linear_bf16w(const float *, long, const unsigned short *, const float *, float *, long, long, long);
void rows_linear_q4_1(const float *, long, const unsigned char *, const float *, float *, long, long, long);
void rows_linear_q8_0(const float *, long, const unsigned char *, const float *, float *, long, long, long);

/* Weight formats, as models/llama.py numbers them. */
static linear_fn linear_of(int kind) {
    switch (kind) {
    case 0: return (linear_fn)rows_linear_f32;
    case 1: return (linear_fn)rows_linear_bf16w;
    case 2: return (linear_fn)rows_linear_q4_1;
    default: return (linear_fn)rows_linear_q8_0;
    }
}

/* y = w * (x * 1 / sqrt(mean(x^2) + eps)) for one row of H. */
static void rms_norm_row(const float *x, const float *w, float eps, float *y, long H) {
    __m512 acc = _mm512_setzero_ps();
    for (long k = 0; k < H; k += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(tail_mask(H - k), x + k);
        acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
    }
    const float r = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)H + eps);
    const __m512 rv = _mm512_set1_ps(r);
    for (long k = 0; k < H; k += 16) {
        const __mmask16 m = tail_mask(H - k);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), rv);
        _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + k), v));
    }
}

/* out[e] = x[e] * cos[e] + rotate_half(x)[e] * sin[e], rotate_half(x) = (-x[d/2:], x[:d/2]). */
static void rope_row(const float *x, const float *cos, const float *sin, float *out, long d) {
    const long half = d / 2;
    for (long e = 0; e < d; e++) {
        const float rot = e < half ? -x[e + half] : x[e - half];
        const float a = x[e] * cos[e];
        const float b = rot * sin[e];
        out[e] = a + b;
    }
}

/* Before attention. x [n, H] -> q [n, hq, d]; this layer's keys and values of the n rows written into the
 * cache buffers [hkv, cap, d] at rows start..start+n-1. Scratch: h [n, H], qkv [n, (hq + 2 hkv) d]. */
static void llama_pre(const float *x, long n, long H, const float *norm_w, float eps, int kind, const void *w_qkv,
               const float *cos, const float *sin, long hq, long hkv, long d, float *kbuf, float *vbuf, long cap,
               long start, float *h, float *qkv, float *q) {
    const long width = (hq + 2 * hkv) * d;
    for (long i = 0; i < n; i++)
        rms_norm_row(x + i * H, norm_w, eps, h + i * H, H);
    linear_of(kind)(h, H, w_qkv, 0, qkv, n, H, width);
    for (long i = 0; i < n; i++) {
        const float *row = qkv + i * width, *c = cos + i * d, *s = sin + i * d;
        for (long head = 0; head < hq; head++)
            rope_row(row + head * d, c, s, q + (i * hq + head) * d, d);
        for (long g = 0; g < hkv; g++) {
            const long slot = (g * cap + start + i) * d;
            rope_row(row + (hq + g) * d, c, s, kbuf + slot, d);
            for (long e = 0; e < d; e++)
                vbuf[slot + e] = row[(hq + hkv + g) * d + e];
        }
    }
}

#define LANES 16       /* queries per vector: a kv head's q heads of several rows side by side */
#define KEY_TILE 8     /* keys whose scores are summed at once (independent multiply-add chains) */
#define VALUE_BLOCK 64 /* keys per pass of the value sums: 16 KiB of values at d = 64, kept in L1 */
#define VALUE_TILE 6   /* queries per pass of the value sums: 6 x 4 accumulators + 4 values in registers */
#define MAX_CHUNKS 8   /* head_dim up to 128, in 16-lane chunks */

/* out[h] += sum over keys j0..j1-1 of p[j * LANES + u[h]] v_j for the nu <= VALUE_TILE queries whose lanes
 * are u[0..nu-1], key by key in order, each value row loaded once for all of them. The accumulators live
 * in out[u] [d] between calls, so a query's sum is the same chain of fused multiply-adds however its keys
 * are split into calls. `chunks` is a constant where it is called, so they stay in registers. */
static inline __attribute__((always_inline)) void add_values(const float *V, long d, long chunks,
                                                             const __mmask16 *mk, long j0, long j1,
                                                             const float *p, const long *u, long nu,
                                                             float *const *out) {
    __m512 acc[VALUE_TILE][MAX_CHUNKS];
    for (long h = 0; h < nu; h++)
        for (long c = 0; c < chunks; c++)
            acc[h][c] = _mm512_maskz_loadu_ps(mk[c], out[h] + 16 * c);
    for (long j = j0; j < j1; j++) {
        __m512 vc[MAX_CHUNKS];
        for (long c = 0; c < chunks; c++)
            vc[c] = _mm512_maskz_loadu_ps(mk[c], V + j * d + 16 * c);
        for (long h = 0; h < nu; h++) {
            const __m512 w = _mm512_set1_ps(p[j * LANES + u[h]]);
            for (long c = 0; c < chunks; c++)
                acc[h][c] = _mm512_fmadd_ps(w, vc[c], acc[h][c]);
        }
    }
    for (long h = 0; h < nu; h++)
        for (long c = 0; c < chunks; c++)
            _mm512_mask_storeu_ps(out[h] + 16 * c, mk[c], acc[h][c]);
}

static void add_values_any(const float *V, long d, long chunks, const __mmask16 *mk, long j0, long j1,
                           const float *p, const long *u, long nu, float *const *out) {
    if (chunks != 4) {  /* d = 64 (SmolLM2) below: constant trip counts, accumulators in registers */
        add_values(V, d, chunks, mk, j0, j1, p, u, nu, out);
        return;
    }
    switch (nu) {
    case 1: add_values(V, d, 4, mk, j0, j1, p, u, 1, out); break;
    case 2: add_values(V, d, 4, mk, j0, j1, p, u, 2, out); break;
    case 3: add_values(V, d, 4, mk, j0, j1, p, u, 3, out); break;
    case 4: add_values(V, d, 4, mk, j0, j1, p, u, 4, out); break;
    case 5: add_values(V, d, 4, mk, j0, j1, p, u, 5, out); break;
    default: add_values(V, d, 4, mk, j0, j1, p, u, VALUE_TILE, out);
    }
}

/* Attention of up to 16 queries of kv head g (query u: row u / groups, q head g * groups + u % groups, for u
 * in u0..u0+15) over its keys and values K, V [cap, d]. Every query scores every key of rows
 * 0..prefix+n-1, a key at a time for 16 queries (the queries transposed, so each score is one lane's
 * chain of d fused multiply-adds, e = 0..d-1, with no reduction across lanes); tree keys a row may not see
 * get -inf. Then per query: the maximum, the exponentials (`vexp`; 0 for unseen keys), their sum key by
 * key, and the values weighted key by key, unseen tree keys skipped. Each of these is a chain in key order
 * within one lane, so a query's result does not depend on the other queries, on its lane, or on keys it
 * does not see: a tree row gets exactly what plain decoding gets for it. S: [prefix + n, 16] scratch. */
static void group_attention(const float *q, long n, long hq, long groups, long g, long u0, long d, const float *K,
                            const float *V, long prefix, const unsigned char *visible, float scale, float *S,
                            float *out) {
    const long keys = prefix + n, nq = n * groups, lanes = nq - u0 < LANES ? nq - u0 : LANES;
    const long chunks = (d + 15) / 16;
    __mmask16 mk[MAX_CHUNKS];
    for (long c = 0; c < chunks; c++)
        mk[c] = tail_mask(d - 16 * c);
    float qt[d][LANES];  /* the queries transposed: qt[e][lane] */
    long row_of[LANES];
    for (long l = 0; l < LANES; l++) {
        const long u = u0 + (l < lanes ? l : 0);
        row_of[l] = u / groups;
        for (long e = 0; e < d; e++)
            qt[e][l] = l < lanes ? q[(row_of[l] * hq + g * groups + u % groups) * d + e] : 0.0f;
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (long j0 = 0; j0 < keys; j0 += KEY_TILE) {
        __m512 acc[KEY_TILE];
        const float *k[KEY_TILE];
        for (int t = 0; t < KEY_TILE; t++) {
            acc[t] = _mm512_setzero_ps();
            k[t] = K + (j0 + t < keys ? j0 + t : j0) * d;
        }
        for (long e = 0; e < d; e++) {
            const __m512 qe = _mm512_loadu_ps(qt[e]);
            for (int t = 0; t < KEY_TILE; t++)
                acc[t] = _mm512_fmadd_ps(qe, _mm512_set1_ps(k[t][e]), acc[t]);
        }
        for (int t = 0; t < KEY_TILE && j0 + t < keys; t++)
            _mm512_storeu_ps(S + (j0 + t) * LANES, _mm512_mul_ps(acc[t], sc));
    }
    for (long j = 0; j < n; j++)  /* the tree keys a row does not see */
        for (long l = 0; l < lanes; l++)
            if (!visible[row_of[l] * n + j])
                S[(prefix + j) * LANES + l] = -INFINITY;
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (long j = 0; j < keys; j++)
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + j * LANES));
    for (long j = 0; j < keys; j++) {
        const __m512 s = _mm512_loadu_ps(S + j * LANES);
        const __mmask16 seen = _mm512_cmp_ps_mask(s, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m512 e = _mm512_maskz_mov_ps(seen, vexp(_mm512_sub_ps(s, mx)));
        _mm512_storeu_ps(S + j * LANES, e);
        sum = _mm512_add_ps(sum, e);
    }
    float inv[LANES];
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
    float *o[LANES];
    long lane[LANES];
    for (long l = 0; l < lanes; l++) {
        const long u = u0 + l;
        o[l] = out + (row_of[l] * hq + g * groups + u % groups) * d;
        lane[l] = l;
        for (long e = 0; e < d; e++)
            o[l][e] = 0.0f;
    }
    for (long j = 0; j < prefix; j += VALUE_BLOCK)  /* the prefix: seen by all, a block of values at a time */
        for (long l = 0; l < lanes; l += VALUE_TILE)
            add_values_any(V, d, chunks, mk, j, j + VALUE_BLOCK < prefix ? j + VALUE_BLOCK : prefix, S, lane + l,
                           lanes - l < VALUE_TILE ? lanes - l : VALUE_TILE, o + l);
    for (long l = 0; l < lanes; l++) {  /* each query's tree keys, in order, then 1 / the sum */
        for (long j = 0; j < n; j++)
            if (visible[row_of[l] * n + j])
                add_values_any(V, d, chunks, mk, prefix + j, prefix + j + 1, S, lane + l, 1, o + l);
        for (long c = 0; c < chunks; c++)
            _mm512_mask_storeu_ps(o[l] + 16 * c, mk[c],
                                  _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[c], o[l] + 16 * c), _mm512_set1_ps(inv[l])));
    }
}

/* Attention of the n new rows q [n, hq, d] over the cache [hkv, cap, d]: row i sees the `prefix` committed
 * rows and the new rows j with visible[i * n + j] (its ancestors and itself), in cache order, which is the
 * order plain decoding finds the same keys in once the accepted path is moved down. out [n, hq * d].
 * One task per (kv head, 16 of its n * groups queries); scratch: scores [tasks, prefix + n, 16]. */
static void tree_attention(const float *q, long n, long hq, long hkv, long d, const float *kbuf, const float *vbuf,
                           long cap, long prefix, const unsigned char *visible, float scale, float *scores,
                           float *out) {
    const long groups = hq / hkv, vectors = (n * groups + LANES - 1) / LANES, keys = prefix + n;
    #pragma omp parallel for schedule(static) if (hkv * vectors > 1 && n * hq * keys * d > 65536)
    for (long t = 0; t < hkv * vectors; t++) {
        const long g = t / vectors, vec = t % vectors;
        group_attention(q, n, hq, groups, g, vec * LANES, d, kbuf + g * cap * d, vbuf + g * cap * d, prefix, visible,
                        scale, scores + t * keys * LANES, out);
    }
}

/* After attention: x [n, H] += o(attn); x += down(silu(gate) * up) of the normed x, with gate and up the two
 * halves of one product [n, 2 * inter]. Scratch: tmp [n, H], h [n, H], gu [n, 2 * inter], act [n, inter]. */
static void llama_post(float *x, const float *attn, long n, long H, long attn_width, int kind_o, const void *w_o,
                const float *norm_w, float eps, int kind_gu, const void *w_gu, long inter, int kind_down,
                const void *w_down, float *tmp, float *h, float *gu, float *act) {
    linear_of(kind_o)(attn, attn_width, w_o, 0, tmp, n, attn_width, H);
    for (long k = 0; k < n * H; k++)
        x[k] = x[k] + tmp[k];
    for (long i = 0; i < n; i++)
        rms_norm_row(x + i * H, norm_w, eps, h + i * H, H);
    linear_of(kind_gu)(h, H, w_gu, 0, gu, n, H, 2 * inter);
    for (long i = 0; i < n; i++) {
        const float *gate = gu + i * 2 * inter, *up = gate + inter;
        float *a = act + i * inter;
        for (long k = 0; k < inter; k += 16) {
            const __mmask16 m = tail_mask(inter - k);
            const __m512 g = _mm512_maskz_loadu_ps(m, gate + k);
            const __m512 e = vexp(_mm512_sub_ps(_mm512_setzero_ps(), g));
            const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            _mm512_mask_storeu_ps(a + k, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + k)));
        }
    }
    linear_of(kind_down)(act, inter, w_down, 0, tmp, n, inter, H);
    for (long k = 0; k < n * H; k++)
        x[k] = x[k] + tmp[k];
}

#define SCORES(n, hq, hkv, keys) (((n) * (hq) / (hkv) + 15) / 16 * (hkv) * 16 * (keys)) /* tree_attention's */

/* Floats of scratch one `llama_layer` call needs. */
long llama_scratch_floats(long n, long H, long hq, long hkv, long d, long prefix, long inter) {
    return n * H + n * (hq + 2 * hkv) * d + 2 * n * hq * d + SCORES(n, hq, hkv, prefix + n) + n * H
           + 3 * n * inter;
}

/* One decoder layer over the n new rows x [n, H] (updated in place): `llama_pre`, `tree_attention` over the
 * `prefix` cached rows and the rows `visible` [n, n] allows, `llama_post`. kinds / weights: the qkv, o,
 * gate_up and down products' formats and panels. The new rows' keys and values land in the cache buffers
 * at rows prefix..prefix+n-1. */
void llama_layer(float *x, long n, long H, long hq, long hkv, long d, long inter, const float *norm_in,
                 const float *norm_post, float eps, const int *kinds, const void *const *weights, const float *cos,
                 const float *sin, float *kbuf, float *vbuf, long cap, long prefix, const unsigned char *visible,
                 float scale, float *scratch) {
    float *h = scratch, *qkv = h + n * H, *q = qkv + n * (hq + 2 * hkv) * d, *attn = q + n * hq * d;
    float *scores = attn + n * hq * d, *tmp = scores + SCORES(n, hq, hkv, prefix + n), *gu = tmp + n * H;
    float *act = gu + 2 * n * inter;
    llama_pre(x, n, H, norm_in, eps, kinds[0], weights[0], cos, sin, hq, hkv, d, kbuf, vbuf, cap, prefix, h, qkv, q);
    tree_attention(q, n, hq, hkv, d, kbuf, vbuf, cap, prefix, visible, scale, scores, attn);
    llama_post(x, attn, n, H, hq * d, kinds[1], weights[1], norm_post, eps, kinds[2], weights[2], inter, kinds[3],
               weights[3], tmp, h, gu, act);
}
