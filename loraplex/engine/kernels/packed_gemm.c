/* loraplex packed sgemm: y[M][O] = x[M][K] · w[O][K]ᵀ for a frozen weight packed in panels.
 *
 * The weight is packed once (engine/kernels/packed_linear.py) as panels of LANES outputs,
 * k-major: wp[p][k][l] = w[p·LANES + l][k] (zero past O). A micro-kernel keeps MR rows × two
 * panels of accumulators in registers and streams the panels once per row block. The panel
 * layout is given by two strides (panel p starts at p·panel_stride floats, its row k at
 * k·row_stride): (K·LANES, LANES) for a packed weight, and (LANES, O) to multiply by an
 * unpacked [K][O] matrix, whose rows already hold LANES consecutive outputs side by side: the
 * backward's dx = dy · w reads the weight as it is (O a multiple of LANES).
 *
 * Summation order, which is the point: each output element sums its K products in blocks of
 * `block` (k ascending; the last block may be shorter), each block a chain of fused
 * multiply-adds starting from zero, and adds the blocks' sums to the running total in order.
 * That is the order MKL's sgemm uses on the machines we run on (blocks of 192 for K ≥ 384), so
 * y has the bits F.linear gives; the loader checks it on the machine before using the kernel
 * (engine/kernels/gemm_order.py). Every element is computed the same way whatever M, the row
 * block it falls in, the thread that computes it or the thread count: a row's bits never
 * depend on the batch.
 *
 * Built at run time with -march=native (engine/kernels/native_library.py): AVX-512F or
 * AVX2 + FMA; lp_lanes() says which (0: neither, the kernel is not used).
 */

#include <stdint.h>
#include <string.h>

#include "simd.h"

#if LANES == 16
#define MR 8
#elif LANES == 8
#define MR 4
#endif

/* Rows per cache chunk: a chunk's slice of x for one K block (256 × 192 floats) stays in L2
 * while every panel pair's slice of the weight for that block (192 × 2·LANES floats) streams
 * past it. */
#define ROW_CHUNK 256
/* Largest panel pair (K × 2 panels) streamed whole per row chunk (half an L2). */
#define PAIR_PANEL_BYTES (512 * 1024)

int lp_lanes(void) { return LANES; }

#if LANES > 0

/* Row pointers of rows 0 .. mr-1 of x (rows past mr repeat row 0; their sums are dropped). */
static inline __attribute__((always_inline)) void row_pointers(const float *x, int64_t K, int mr,
                                                               const float **xr) {
    for (int m = 0; m < MR; m++) xr[m] = x + (int64_t)(m < mr ? m : 0) * K;
}

/* acc0/acc1[m] = Σ_{k0 ≤ k < k1} x[m][k] · w0/w1[k]: an FMA chain from zero per output. */
static inline __attribute__((always_inline)) void block_sums(
        const float *const *xr, int64_t k0, int64_t k1, const float *w0, const float *w1,
        int64_t row_stride, vec_t *acc0, vec_t *acc1) {
    for (int m = 0; m < MR; m++) {
        acc0[m] = v_zero();
        acc1[m] = v_zero();
    }
    for (int64_t k = k0; k < k1; k++) {
        vec_t a = v_load(w0 + k * row_stride);
        vec_t b = v_load(w1 + k * row_stride);
        for (int m = 0; m < MR; m++) {
            vec_t xv = v_bcast(xr[m] + k);
            acc0[m] = v_fma(xv, a, acc0[m]);
            acc1[m] = v_fma(xv, b, acc1[m]);
        }
    }
}

/* Rows m0 .. m0+mr-1 (mr ≤ MR), products k0 .. k1-1 (one K block), against panels w0 (n0
 * outputs) and w1 (n1 outputs; n1 = 0: no second panel, w1 aliases w0 and its sums are
 * dropped). x and the panels point at k0; y at output column 0 of the first panel in row m0.
 * The block's sums start from zero and are stored (first block) or added to y. */
static inline __attribute__((always_inline)) void micro_kernel(
                         const float *x, int64_t K, int64_t kn, const float *w0,
                         const float *w1, int64_t row_stride, int first, int n0, int n1,
                         int mr, float *y, int64_t O) {
    const float *xr[MR];
    row_pointers(x, K, mr, xr);
    vec_t acc0[MR], acc1[MR];
    block_sums(xr, 0, kn, w0, w1, row_stride, acc0, acc1);
    for (int m = 0; m < mr; m++) {
        float *row = y + (int64_t)m * O;
        if (!first) {
            acc0[m] = v_add(v_load_n(row, n0), acc0[m]);
            if (n1 > 0) acc1[m] = v_add(v_load_n(row + LANES, n1), acc1[m]);
        }
        v_store_n(row, acc0[m], n0);
        if (n1 > 0) v_store_n(row + LANES, acc1[m], n1);
    }
}

/* micro_kernel over every K block in order, the running totals kept in registers and y
 * written once (the forward's weights, whose panel pair stays in L2). */
static inline __attribute__((always_inline)) void micro_kernel_all(
        const float *x, int64_t K, int64_t block, const float *w0, const float *w1,
        int64_t row_stride, int n0, int n1, int mr, float *y, int64_t O) {
    const float *xr[MR];
    row_pointers(x, K, mr, xr);
    vec_t tot0[MR], tot1[MR];
    for (int64_t k0 = 0; k0 < K; k0 += block) {
        int64_t k1 = k0 + block < K ? k0 + block : K;
        vec_t acc0[MR], acc1[MR];
        block_sums(xr, k0, k1, w0, w1, row_stride, acc0, acc1);
        for (int m = 0; m < MR; m++) {
            tot0[m] = k0 == 0 ? acc0[m] : v_add(tot0[m], acc0[m]);
            tot1[m] = k0 == 0 ? acc1[m] : v_add(tot1[m], acc1[m]);
        }
    }
    for (int m = 0; m < mr; m++) {
        v_store_n(y + (int64_t)m * O, tot0[m], n0);
        if (n1 > 0) v_store_n(y + (int64_t)m * O + LANES, tot1[m], n1);
    }
}

/* One panel pair (p, p+1) against rows m0 .. c1-1, K blocks k0 .. k0+kn-1. */
static void pair_rows(const float *x, const float *wp, float *y, int64_t O, int64_t K,
                      int64_t panels, int64_t q, int64_t c0, int64_t c1, int64_t k0,
                      int64_t kn, int64_t panel_stride, int64_t row_stride) {
    int64_t p = 2 * q;
    int64_t o0 = p * LANES;
    int n0 = O - o0 < LANES ? (int)(O - o0) : LANES;
    int n1 = p + 1 < panels ? (O - o0 - LANES < LANES ? (int)(O - o0 - LANES) : LANES) : 0;
    const float *w0 = wp + p * panel_stride + k0 * row_stride;
    const float *w1 = n1 > 0 ? w0 + panel_stride : w0;
    for (int64_t m0 = c0; m0 < c1; m0 += MR) {
        int mr = c1 - m0 < MR ? (int)(c1 - m0) : MR;
        if (row_stride == LANES)  /* a packed weight: the stride a constant, inlined */
            micro_kernel(x + m0 * K + k0, K, kn, w0, w1, LANES, k0 == 0, n0, n1, mr,
                         y + m0 * O + o0, O);
        else
            micro_kernel(x + m0 * K + k0, K, kn, w0, w1, row_stride, k0 == 0, n0, n1, mr,
                         y + m0 * O + o0, O);
    }
}

/* One panel pair against rows c0 .. c1-1, all K blocks per row block (micro_kernel_all). */
static void pair_rows_all(const float *x, const float *wp, float *y, int64_t O, int64_t K,
                          int64_t block, int64_t panels, int64_t q, int64_t c0, int64_t c1,
                          int64_t panel_stride, int64_t row_stride) {
    int64_t p = 2 * q;
    int64_t o0 = p * LANES;
    int n0 = O - o0 < LANES ? (int)(O - o0) : LANES;
    int n1 = p + 1 < panels ? (O - o0 - LANES < LANES ? (int)(O - o0 - LANES) : LANES) : 0;
    const float *w0 = wp + p * panel_stride;
    const float *w1 = n1 > 0 ? w0 + panel_stride : w0;
    for (int64_t m0 = c0; m0 < c1; m0 += MR) {
        int mr = c1 - m0 < MR ? (int)(c1 - m0) : MR;
        if (row_stride == LANES)
            micro_kernel_all(x + m0 * K, K, block, w0, w1, LANES, n0, n1, mr, y + m0 * O + o0,
                             O);
        else
            micro_kernel_all(x + m0 * K, K, block, w0, w1, row_stride, n0, n1, mr,
                             y + m0 * O + o0, O);
    }
}

/* Loop nest. When a panel pair's whole K fits in half an L2 (every weight of the forward):
 * panel pairs across threads, each streamed from memory once while every row block passes
 * it with its totals in registers (x, at most a few MB, stays in L3). Else (the backward's
 * dy · w through a 49152-wide head): row chunks, then K blocks in order, then the pairs, so
 * a block's slice of the weight stays in L1 across the chunk's rows (a pair stays on one
 * thread for every block: a static schedule). An element's block sums are added in order
 * either way: the same arithmetic, the same bits. */
int lp_linear(const float *x, const float *wp, float *y, int64_t M, int64_t O, int64_t K,
              int64_t block, int64_t panel_stride, int64_t row_stride, int64_t num_threads) {
    /* -1, nothing written: a negative size, no summation block, strides too small for the
     * panels they step over, or no thread. */
    if (M < 0 || O < 0 || K < 0 || num_threads < 1 || (K > 0 && block < 1)
        || panel_stride < 1 || row_stride < 1) return -1;
    if (M == 0 || O == 0) return 0;
    if (K == 0) {
        memset(y, 0, (size_t)(M * O) * sizeof(float));
        return 0;
    }
    int64_t panels = (O + LANES - 1) / LANES;
    int64_t pairs = (panels + 1) / 2;
    if (K * 2 * LANES * (int64_t)sizeof(float) <= PAIR_PANEL_BYTES) {
        #pragma omp parallel for schedule(static) num_threads((int)num_threads)
        for (int64_t q = 0; q < pairs; q++)
            pair_rows_all(x, wp, y, O, K, block, panels, q, 0, M, panel_stride, row_stride);
        return 0;
    }
    #pragma omp parallel num_threads((int)num_threads)
    for (int64_t c0 = 0; c0 < M; c0 += ROW_CHUNK) {
        int64_t c1 = c0 + ROW_CHUNK < M ? c0 + ROW_CHUNK : M;
        for (int64_t k0 = 0; k0 < K; k0 += block) {
            #pragma omp for schedule(static)
            for (int64_t q = 0; q < pairs; q++)
                pair_rows(x, wp, y, O, K, panels, q, c0, c1, k0, k0 + block < K ? block : K - k0,
                          panel_stride, row_stride);
        }
    }
    return 0;
}

#endif
