/* loraplex paged attention, forward: causal attention over fixed-size pages of keys/values,
 * an online softmax over the pages of each query row (FlashAttention's recurrence).
 *
 * Batch invariance by construction: every query row is computed alone, in a fixed order that
 * depends only on its own query, the keys/values it sees and how many it sees. Rows are
 * grouped into runs (consecutive rows of one sequence, which read the same pages) only so
 * that a page's keys are transposed once for all of them; a row's arithmetic is the same in
 * a run of 1 (a decode step) or of 16 (training, prefill), on any thread, at any thread count.
 * Per row, head and page b (keys j of the page the row may see, the others masked):
 *
 *   s_j   = q · k_j        an FMA chain over d = 0 .. D-1, from zero
 *   m'    = max(m, max_j s_j);  α = exp(m − m');  p_j = exp(s_j − m')
 *   l     = l·α + Σ_j p_j  (the sum in a fixed lane order)
 *   acc_d = acc_d·α + pv_d  where pv_d is an FMA chain over the page's keys j, from zero
 *
 * and finally out = acc / l, lse = m + log l. exp is this file's own (a Cephes-style
 * polynomial, within 2 ulp; exp(−∞) = 0), not libm's: the same code on every path.
 *
 * Layout: q [R][H][D] (already scaled by D^-1/2); pages [blocks][Hkv][BS][D]; a run u covers
 * rows run_row[u] .. run_row[u] + run_len[u] − 1 (at most RUN_ROWS), whose block table
 * starts at tables[run_table[u]]; row r sees keys 0 .. row_keys[r] − 1 (0: a padding row,
 * whose output and lse are zeros). GQA: head h reads kv head h / (H / Hkv).
 * Built at run time (engine/kernels/native_library.py); la_lanes() = 0 means no vector ISA.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RUN_ROWS 16
#define MAX_GROUP 16
#define MAX_DIM 256
#define MAX_BLOCK 256

#include "simd.h"

int la_lanes(void) { return LANES; }

#if LANES > 0

/* exp: x = n·ln2 + r (Cody-Waite), e^r by a degree-6 polynomial, times 2^n; 0 below -87.3
 * (exp(-inf) included), clamped at 88.7. */
static inline vec_t v_exp(vec_t x) {
    vec_t c = v_min(x, v_set1(88.3762626647949f));
    c = v_max(c, v_set1(-87.3365478515625f));
    vec_t n = v_floor(v_fma(c, v_set1(1.44269504088896341f), v_set1(0.5f)));
    vec_t r = v_fma(n, v_set1(-0.693359375f), c);
    r = v_fma(n, v_set1(2.12194440e-4f), r);
    vec_t r2 = v_mul(r, r);
    vec_t p = v_set1(1.9875691500E-4f);
    p = v_fma(p, r, v_set1(1.3981999507E-3f));
    p = v_fma(p, r, v_set1(8.3334519073E-3f));
    p = v_fma(p, r, v_set1(4.1665795894E-2f));
    p = v_fma(p, r, v_set1(1.6666665459E-1f));
    p = v_fma(p, r, v_set1(5.0000001201E-1f));
    p = v_add(v_fma(p, r2, r), v_set1(1.0f));
    return v_zero_below(v_mul(p, v_pow2(n)), x, -87.3365478515625f);
}

static inline float s_exp(float x) {
    float out[LANES];
    v_store(out, v_exp(v_set1(x)));
    return out[0];
}

#if LANES == 16
/* dst[i][j] = src[j][i] for a 16 × 16 tile (row strides lds, ldd). */
static inline void transpose_tile(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]),
                                                   _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]),
                                                       _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ldd, r[i]);  /* column i */
}
#else
static inline void transpose_tile(const float *src, int64_t lds, float *dst, int64_t ldd) {
    for (int i = 0; i < LANES; i++)
        for (int j = 0; j < LANES; j++) dst[j * ldd + i] = src[i * lds + j];
}
#endif

/* kt[d][j] = k[j][d] for the page's keys j < kn rounded up to whole tiles (the other
 * columns are never read unmasked). Transposing moves values exactly. */
static void transpose_block(const float *k, float *kt, int kn, int D, int BS) {
    int jn = (kn + LANES - 1) / LANES * LANES;
    for (int j = 0; j < jn; j += LANES)
        for (int d = 0; d < D; d += LANES)
            transpose_tile(k + (int64_t)j * D + d, D, kt + (int64_t)d * BS + j, BS);
}

/* One row's heads of kv head g against one page (nvis visible keys, kt its keys transposed,
 * vb its values): the online-softmax update of m, l, acc (G heads). */
static void row_page(const float *q, const float *kt, const float *vb, int nvis, int G, int D,
                     int BS, float *m, float *l, float *acc) {
    const int SV = BS / LANES, DV = D / LANES;
    vec_t s[MAX_GROUP][MAX_BLOCK / LANES];
    for (int h = 0; h < G; h++)
        for (int c = 0; c < SV; c++) s[h][c] = v_zero();
    for (int d = 0; d < D; d++) {
        const float *kd = kt + (int64_t)d * BS;
        for (int h = 0; h < G; h++) {
            vec_t qd = v_set1(q[(int64_t)h * D + d]);
            for (int c = 0; c < SV; c++) s[h][c] = v_fma(qd, v_load(kd + c * LANES), s[h][c]);
        }
    }
    for (int h = 0; h < G; h++) {
        vec_t vmax = v_set1(-INFINITY);
        for (int c = 0; c < SV; c++) {
            if (c * LANES + LANES > nvis) s[h][c] = v_mask_from(s[h][c], c * LANES, nvis);
            vmax = v_max(vmax, s[h][c]);
        }
        float block_max = v_hmax(vmax);
        float m_new = m[h] > block_max ? m[h] : block_max;
        float alpha = s_exp(m[h] - m_new);
        vec_t mv = v_set1(m_new);
        vec_t psum = v_zero();
        float p[MAX_BLOCK];
        for (int c = 0; c < SV; c++) {
            vec_t pc = v_exp(v_sub(s[h][c], mv));
            v_store(p + c * LANES, pc);
            psum = v_add(psum, pc);
        }
        l[h] = l[h] * alpha + v_hsum(psum);
        vec_t pv[MAX_DIM / LANES];
        for (int e = 0; e < DV; e++) pv[e] = v_zero();
        for (int j = 0; j < nvis; j++) {
            vec_t pj = v_set1(p[j]);
            const float *vj = vb + (int64_t)j * D;
            for (int e = 0; e < DV; e++) pv[e] = v_fma(pj, v_load(vj + e * LANES), pv[e]);
        }
        vec_t av = v_set1(alpha);
        float *ah = acc + (int64_t)h * D;
        for (int e = 0; e < DV; e++)
            v_store(ah + e * LANES, v_add(v_mul(v_load(ah + e * LANES), av), pv[e]));
        m[h] = m_new;
    }
}

static void run_item(const float *q, const float *kp, const float *vp, const int64_t *table,
                     const int64_t *row_keys, int64_t r0, int n, int g, int H, int Hkv, int D,
                     int BS, float *kt, float *state, float *out, float *lse) {
    const int G = H / Hkv;
    float *m = state, *l = state + RUN_ROWS * MAX_GROUP, *acc = state + 2 * RUN_ROWS * MAX_GROUP;
    int64_t max_keys = 0;
    for (int i = 0; i < n; i++) {
        if (row_keys[r0 + i] > max_keys) max_keys = row_keys[r0 + i];
        for (int h = 0; h < G; h++) {
            m[i * MAX_GROUP + h] = -INFINITY;
            l[i * MAX_GROUP + h] = 0.0f;
        }
        memset(acc + (int64_t)i * G * D, 0, sizeof(float) * (size_t)(G * D));
    }
    for (int64_t b = 0; b * BS < max_keys; b++) {
        int64_t page_off = (table[b] * Hkv + g) * (int64_t)BS * D;
        int kn = (int)(max_keys - b * BS < BS ? max_keys - b * BS : BS);
        transpose_block(kp + page_off, kt, kn, D, BS);
        for (int i = 0; i < n; i++) {
            int64_t keys = row_keys[r0 + i];
            if (keys <= b * BS) continue;
            int nvis = (int)(keys - b * BS < BS ? keys - b * BS : BS);
            row_page(q + ((r0 + i) * H + (int64_t)g * G) * D, kt, vp + page_off, nvis, G, D,
                     BS, m + i * MAX_GROUP, l + i * MAX_GROUP, acc + (int64_t)i * G * D);
        }
    }
    for (int i = 0; i < n; i++) {
        int64_t r = r0 + i;
        for (int h = 0; h < G; h++) {
            float *o = out + (r * H + (int64_t)g * G + h) * D;
            const float *a = acc + ((int64_t)i * G + h) * D;
            float li = l[i * MAX_GROUP + h];
            if (row_keys[r] == 0) {
                memset(o, 0, sizeof(float) * (size_t)D);
                lse[r * H + g * G + h] = 0.0f;
                continue;
            }
            for (int d = 0; d < D; d++) o[d] = a[d] / li;
            lse[r * H + g * G + h] = m[i * MAX_GROUP + h] + logf(li);
        }
    }
}

/* Whether a dimension is out of range (nothing is written then). */
static int bad_shape(int64_t H, int64_t Hkv, int64_t D, int64_t BS) {
    return H <= 0 || Hkv <= 0 || H % Hkv || H / Hkv > MAX_GROUP || D <= 0 || D % LANES
        || D > MAX_DIM || BS <= 0 || BS % LANES || BS > MAX_BLOCK;
}

/* The memory one run (or sequence) reads, checked before anything is: rows r0 .. r0 + n − 1
 * within the R rows, their key counts ≥ 0, its table (flat offset `table` into tables
 * [table_rows][width]) a whole row of the tables, the pages its keys need within that row, and
 * every page id there within the `pages` pages. Whether anything is out of range. */
static int bad_rows(const int64_t *tables, const int64_t *row_keys, int64_t table, int64_t r0,
                    int64_t n, int64_t R, int64_t table_rows, int64_t width, int64_t pages,
                    int64_t BS) {
    if (n < 1 || r0 < 0 || r0 > R - n || table < 0 || width < 0) return 1;
    if (width > 0 && (table % width || table / width >= table_rows)) return 1;
    int64_t max_keys = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = row_keys[r0 + i];
        if (k < 0) return 1;
        if (k > max_keys) max_keys = k;
    }
    int64_t used = (max_keys + BS - 1) / BS;
    if (used > width) return 1;
    for (int64_t b = 0; b < used; b++)
        if (tables[table + b] < 0 || tables[table + b] >= pages) return 1;
    return 0;
}

/* Attention of R query rows (U runs of ≤ RUN_ROWS consecutive rows of one sequence) over
 * `pages` pages of keys and values through block tables [table_rows][width]. Returns 0; -1
 * when a dimension, a run, a row, a table offset or a page id is out of range (checked first:
 * nothing is read or written then); -2 when work memory ran out. */
int la_forward(const float *q, const float *kp, const float *vp, const int64_t *tables,
               const int64_t *run_row, const int64_t *run_len, const int64_t *run_table,
               const int64_t *row_keys, int64_t U, int64_t H, int64_t Hkv, int64_t D,
               int64_t BS, int64_t R, int64_t table_rows, int64_t width, int64_t pages,
               int64_t num_threads, float *out, float *lse) {
    if (bad_shape(H, Hkv, D, BS) || U < 0 || num_threads < 1) return -1;
    for (int64_t u = 0; u < U; u++)
        if (run_len[u] < 1 || run_len[u] > RUN_ROWS
            || bad_rows(tables, row_keys, run_table[u], run_row[u], run_len[u], R, table_rows,
                        width, pages, BS)) return -1;
    int64_t items = U * Hkv;
    int failed = 0;
    #pragma omp parallel num_threads((int)num_threads)
    {
        float *kt = aligned_alloc(64, sizeof(float) * (size_t)(D * BS));
        float *state = aligned_alloc(
            64, sizeof(float) * (size_t)(2 * RUN_ROWS * MAX_GROUP + RUN_ROWS * (H / Hkv) * D));
        int ok = kt && state;
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            int64_t u = it / Hkv;
            if (ok)
                run_item(q, kp, vp, tables + run_table[u], row_keys, run_row[u],
                         (int)run_len[u], (int)(it % Hkv), (int)H, (int)Hkv, (int)D, (int)BS,
                         kt, state, out, lse);
        }
        free(kt);
        free(state);
    }
    return failed ? -2 : 0;
}

#include "paged_attention_backward.h"

#endif
