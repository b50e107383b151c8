/* The SIMD vocabulary both kernels are written in: one vector type ``vec_t`` of ``LANES``
 * floats (16 with AVX-512, 8 with AVX2 + FMA, 0 when neither is compiled in: callers then
 * leave their vector paths out) and the same small set of operations on it, so the packed GEMM
 * and the paged attention kernels share one definition of each (and their results stay the
 * bits they were). Included by packed_gemm.c and paged_attention.c. */
#ifndef LORAPLEX_SIMD_H
#define LORAPLEX_SIMD_H

#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define LANES 16
typedef __m512 vec_t;
static inline vec_t v_zero(void) { return _mm512_setzero_ps(); }
static inline vec_t v_set1(float x) { return _mm512_set1_ps(x); }
static inline vec_t v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vec_t v) { _mm512_storeu_ps(p, v); }
static inline vec_t v_fma(vec_t a, vec_t b, vec_t c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec_t v_mul(vec_t a, vec_t b) { return _mm512_mul_ps(a, b); }
static inline vec_t v_add(vec_t a, vec_t b) { return _mm512_add_ps(a, b); }
static inline vec_t v_sub(vec_t a, vec_t b) { return _mm512_sub_ps(a, b); }
static inline vec_t v_max(vec_t a, vec_t b) { return _mm512_max_ps(a, b); }
static inline vec_t v_min(vec_t a, vec_t b) { return _mm512_min_ps(a, b); }
static inline vec_t v_floor(vec_t a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF); }
static inline vec_t v_pow2(vec_t n) {
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n),
                                                   _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(e);
}
/* lanes where x < limit get 0 */
static inline vec_t v_zero_below(vec_t y, vec_t x, float limit) {
    __mmask16 m = _mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(m, y, _mm512_setzero_ps());
}
/* lanes j (j = base + lane) at or past n get -inf */
static inline vec_t v_mask_from(vec_t s, int base, int n) {
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                     13, 14, 15));
    __mmask16 m = _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(n));
    return _mm512_mask_blend_ps(m, s, _mm512_set1_ps(-INFINITY));
}
/* lanes j (j = base + lane) at or past n get 0 */
static inline vec_t v_zero_from(vec_t s, int base, int n) {
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                     13, 14, 15));
    __mmask16 m = _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(n));
    return _mm512_mask_blend_ps(m, s, _mm512_setzero_ps());
}
static inline float v_hmax(vec_t v) { return _mm512_reduce_max_ps(v); }
static inline float v_hsum(vec_t v) { return _mm512_reduce_add_ps(v); }
static inline vec_t v_bcast(const float *p) { return _mm512_set1_ps(*p); }
static inline __mmask16 v_mask(int n) { return (__mmask16)((1u << n) - 1u); }
static inline vec_t v_load_n(const float *p, int n) {
    return n == LANES ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(v_mask(n), p);
}
static inline void v_store_n(float *p, vec_t v, int n) {
    if (n == LANES) _mm512_storeu_ps(p, v);
    else _mm512_mask_storeu_ps(p, v_mask(n), v);
}
/* LANES bfloat16 values widened to float: exact (a bfloat16 is a float's upper 16 bits). */
static inline vec_t v_load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LANES 8
typedef __m256 vec_t;
static inline vec_t v_zero(void) { return _mm256_setzero_ps(); }
static inline vec_t v_set1(float x) { return _mm256_set1_ps(x); }
static inline vec_t v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vec_t v) { _mm256_storeu_ps(p, v); }
static inline vec_t v_fma(vec_t a, vec_t b, vec_t c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec_t v_mul(vec_t a, vec_t b) { return _mm256_mul_ps(a, b); }
static inline vec_t v_add(vec_t a, vec_t b) { return _mm256_add_ps(a, b); }
static inline vec_t v_sub(vec_t a, vec_t b) { return _mm256_sub_ps(a, b); }
static inline vec_t v_max(vec_t a, vec_t b) { return _mm256_max_ps(a, b); }
static inline vec_t v_min(vec_t a, vec_t b) { return _mm256_min_ps(a, b); }
static inline vec_t v_floor(vec_t a) { return _mm256_floor_ps(a); }
static inline vec_t v_pow2(vec_t n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n),
                                                   _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(e);
}
static inline vec_t v_zero_below(vec_t y, vec_t x, float limit) {
    vec_t m = _mm256_cmp_ps(x, _mm256_set1_ps(limit), _CMP_LT_OQ);
    return _mm256_blendv_ps(y, _mm256_setzero_ps(), m);
}
static inline vec_t v_mask_from(vec_t s, int base, int n) {
    __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(base),
                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i past = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(n - 1));
    return _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(past));
}
static inline vec_t v_zero_from(vec_t s, int base, int n) {
    __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(base),
                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i past = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(n - 1));
    return _mm256_blendv_ps(s, _mm256_setzero_ps(), _mm256_castsi256_ps(past));
}
static inline float v_hmax(vec_t v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}
static inline float v_hsum(vec_t v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}
static inline vec_t v_bcast(const float *p) { return _mm256_broadcast_ss(p); }
static inline __m256i v_mask(int n) {
    static const int32_t ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_loadu_si256((const __m256i *)ramp));
}
static inline vec_t v_load_n(const float *p, int n) {
    return n == LANES ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, v_mask(n));
}
static inline void v_store_n(float *p, vec_t v, int n) {
    if (n == LANES) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, v_mask(n), v);
}
/* LANES bfloat16 values widened to float: exact (a bfloat16 is a float's upper 16 bits). */
static inline vec_t v_load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
#else
#define LANES 0
#endif

#endif /* LORAPLEX_SIMD_H */
