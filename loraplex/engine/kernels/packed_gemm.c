/* loraplex packed sgemm: y[M][O] = x[M][K] · w[O][K]ᵀ for a frozen weight packed in panels.
 *
 * The weight is packed once (engine/kernels/packed_linear.py) as panels of LANES outputs,
 * k-major: wp[p][k][l] = w[p·LANES + l][k] (zero past O). A micro-kernel keeps up to MR rows ×
 * two panels of accumulators in registers and streams the panels once per row block. The panel
 * layout is given by two strides (panel p starts at p·panel_stride weights, its row k at
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
 * block it falls in (a block holds 1 .. MR rows, each its own FMA chains), the thread that
 * computes it, the thread count or the copies below: a row's bits never depend on the batch.
 *
 * Copies, for speed only (the same values, so the same bits): an unpacked matrix read by
 * several row blocks is copied pair by pair into a packed layout first (one cache line per
 * page otherwise), and rows of x that lie a multiple of 4 KB apart (K a multiple of 1024) are
 * copied a chunk at a time with a padded stride (such rows share the L1 cache's sets).
 *
 * Weights: float, or with -DLP_WEIGHT_BF16 bfloat16 (uint16_t, a float's upper half), widened
 * to float as they are loaded (exact) and multiplied in float with the same FMA chains: a
 * bfloat16 weight gives the bits the float kernel gives on its widened copy, at half the bytes
 * streamed. x, y and every sum stay float.
 *
 * Built at run time with -march=native (engine/kernels/native_library.py): AVX-512F or
 * AVX2 + FMA; lp_lanes() says which (0: neither, the kernel is not used).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* Most rows of a micro-kernel: MR × 2 accumulators plus the two weight vectors and a
 * broadcast fill the vector registers (AVX-512: 16 + 3 of 32; AVX2: 12 + 3 of 16). */
#if LANES == 16
#define MR 8
#elif LANES == 8
#define MR 6
#endif

#ifdef LP_WEIGHT_BF16
typedef uint16_t weight_t;
#define w_load v_load_bf16
#else
typedef float weight_t;
#define w_load v_load
#endif

/* Rows per cache chunk of the stretched nest: a chunk's slice of x for one stretch stays in
 * L3 while every panel pair's slice of the weight for that stretch streams past it. */
#define ROW_CHUNK 256
/* Rows of x copied at a time by the whole-K nest (at most 512 × (8192 + 16) floats). */
#define X_CHUNK 512
/* Largest panel pair (K × 2 panels) streamed whole per row chunk (half a 1 MB L2). */
#define PAIR_PANEL_BYTES (512 * 1024)
/* A longer K goes in stretches of whole blocks whose panel pair fills this (an L2's share). */
#define STRETCH_BYTES (128 * 1024)
/* Padding of copied rows of x: 64 bytes, one cache set further per row. */
#define X_PAD 16

int lp_lanes(void) { return LANES; }

/* Bits per weight: 32 (float) or 16 (bfloat16). */
int lp_weight_bits(void) { return (int)(8 * sizeof(weight_t)); }

#if LANES > 0

/* acc0/acc1[m] = Σ_{k < kn} x[m][k] · w0/w1[k] for m < mr: an FMA chain from zero per output.
 * x and the panels point at the block's first product; rows of x are ldx floats apart.
 * ``mr`` is a constant wherever this is inlined (see `rows_kernel`), so the loops over m
 * unroll and the accumulators live in registers. */
static inline __attribute__((always_inline)) void block_sums(
        const float *x, int64_t ldx, int mr, int64_t kn, const weight_t *w0,
        const weight_t *w1, int64_t row_stride, vec_t *acc0, vec_t *acc1) {
    for (int m = 0; m < mr; m++) {
        acc0[m] = v_zero();
        acc1[m] = v_zero();
    }
    for (int64_t k = 0; k < kn; k++) {
        vec_t a = w_load(w0 + k * row_stride);
        vec_t b = w_load(w1 + k * row_stride);
        for (int m = 0; m < mr; m++) {
            vec_t xv = v_bcast(x + m * ldx + k);
            acc0[m] = v_fma(xv, a, acc0[m]);
            acc1[m] = v_fma(xv, b, acc1[m]);
        }
    }
}

/* Rows 0 .. mr-1 of x, products 0 .. kn-1 of a stretch of whole K blocks (each `block`
 * products but the last), against panels w0 (n0 outputs) and w1 (n1 outputs; n1 = 0: no
 * second panel, w1 aliases w0 and its sums are dropped); x and the panels point at the
 * stretch, y at output column 0 of the first panel in row 0. Each block's sums are added to the
 * running totals in order, kept in registers: the first stretch's first block starts them,
 * a later stretch starts from y. y is written once. */
static inline __attribute__((always_inline)) void stretch_kernel(
        const float *x, int64_t ldx, int mr, int first, int64_t kn, int64_t block,
        const weight_t *w0, const weight_t *w1, int64_t row_stride, int n0, int n1, float *y,
        int64_t O) {
    vec_t tot0[MR], tot1[MR];
    for (int m = 0; m < mr; m++) {
        tot0[m] = first ? v_zero() : v_load_n(y + (int64_t)m * O, n0);
        tot1[m] = first || n1 == 0 ? v_zero() : v_load_n(y + (int64_t)m * O + LANES, n1);
    }
    for (int64_t k0 = 0; k0 < kn; k0 += block) {
        int64_t bn = k0 + block < kn ? block : kn - k0;
        vec_t acc0[MR], acc1[MR];
        block_sums(x + k0, ldx, mr, bn, w0 + k0 * row_stride, w1 + k0 * row_stride,
                   row_stride, acc0, acc1);
        for (int m = 0; m < mr; m++) {  /* the very first block is stored, not added to 0 */
            tot0[m] = first && k0 == 0 ? acc0[m] : v_add(tot0[m], acc0[m]);
            tot1[m] = first && k0 == 0 ? acc1[m] : v_add(tot1[m], acc1[m]);
        }
    }
    for (int m = 0; m < mr; m++) {
        v_store_n(y + (int64_t)m * O, tot0[m], n0);
        if (n1 > 0) v_store_n(y + (int64_t)m * O + LANES, tot1[m], n1);
    }
}

/* What one call of `pair_rows` computes: rows of x (ldx apart) against one panel pair, the
 * stretch of ``kn`` products starting at product k0. */
typedef struct {
    const float *x;
    int64_t ldx;
    float *y;
    int64_t O, block, k0, kn;
} Pass;

/* One row block of ``mr`` rows (a constant after inlining). A packed weight's row stride is the
 * constant LANES, inlined. */
static inline __attribute__((always_inline)) void rows_kernel(
        const Pass *s, const float *x, int mr, const weight_t *w0, const weight_t *w1,
        int64_t row_stride, int n0, int n1, float *y) {
    if (row_stride == LANES)
        stretch_kernel(x, s->ldx, mr, s->k0 == 0, s->kn, s->block, w0, w1, LANES, n0, n1, y,
                       s->O);
    else
        stretch_kernel(x, s->ldx, mr, s->k0 == 0, s->kn, s->block, w0, w1, row_stride, n0, n1,
                       y, s->O);
}

/* `rows_kernel` for a run-time ``mr`` (1 .. MR): one specialisation per row count, so a block
 * of fewer rows computes only those rows. */
static void rows_dispatch(const Pass *s, const float *x, int mr, const weight_t *w0,
                          const weight_t *w1, int64_t row_stride, int n0, int n1, float *y) {
#define LP_ROWS(R) case R: rows_kernel(s, x, R, w0, w1, row_stride, n0, n1, y); break;
    switch (mr) {
        LP_ROWS(1) LP_ROWS(2) LP_ROWS(3) LP_ROWS(4) LP_ROWS(5) LP_ROWS(6)
#if MR > 6
        LP_ROWS(7) LP_ROWS(8)
#endif
        default: break;
    }
#undef LP_ROWS
}

/* Rows of the row block starting with ``left`` rows to go: MR, except that the last two
 * blocks share what is left evenly when one full block would leave a short one (8 rows with
 * MR 6: 4 + 4, not 6 + 2: a block of few rows keeps few FMA chains in flight). */
static inline int block_rows(int64_t left) {
    if (left <= MR) return (int)left;
    if (left >= 2 * MR) return MR;
    return (int)((left + 1) / 2);
}

/* ``n`` rows of two strided panels copied side by side into ``scratch`` (panel 0's rows, then
 * panel 1's, LANES weights each): a packed weight's layout. */
static void pack_pair(const weight_t *w0, const weight_t *w1, int64_t row_stride, int64_t n,
                      weight_t *scratch) {
    for (int64_t k = 0; k < n; k++) {
        memcpy(scratch + k * LANES, w0 + k * row_stride, LANES * sizeof(weight_t));
        memcpy(scratch + (n + k) * LANES, w1 + k * row_stride, LANES * sizeof(weight_t));
    }
}

/* Panel pair (2q, 2q+1) against ``rows`` rows of the pass. With ``scratch`` (room for the
 * pair's products of the pass) an unpacked matrix's pair is first copied there. */
static void pair_rows(const Pass *s, const weight_t *wp, int64_t panels, int64_t q,
                      int64_t rows, int64_t panel_stride, int64_t row_stride,
                      weight_t *scratch) {
    int64_t p = 2 * q, O = s->O;
    int64_t o0 = p * LANES;
    int n0 = O - o0 < LANES ? (int)(O - o0) : LANES;
    int n1 = p + 1 < panels ? (O - o0 - LANES < LANES ? (int)(O - o0 - LANES) : LANES) : 0;
    int64_t count = s->kn;
    const weight_t *w0 = wp + p * panel_stride + s->k0 * row_stride;
    const weight_t *w1 = n1 > 0 ? w0 + panel_stride : w0;
    if (scratch != NULL && row_stride != LANES && n0 == LANES && (n1 == LANES || n1 == 0)) {
        pack_pair(w0, w1, row_stride, count, scratch);
        w0 = scratch;
        w1 = scratch + count * LANES;
        row_stride = LANES;
    }
    for (int64_t m0 = 0; m0 < rows;) {
        int mr = block_rows(rows - m0);
        rows_dispatch(s, s->x + m0 * s->ldx, mr, w0, w1, row_stride, n0, n1,
                      s->y + m0 * O + o0);
        m0 += mr;
    }
}

/* Rows r0 .. r1-1, columns k0 .. k0+kn-1 of x copied to ``dst`` with row stride ldd; the
 * rows shared among the team's threads (a work-sharing loop: call from every thread). */
static void copy_rows(const float *x, int64_t K, int64_t r0, int64_t r1, int64_t k0,
                      int64_t kn, float *dst, int64_t ldd) {
    #pragma omp for schedule(static)
    for (int64_t r = r0; r < r1; r++)
        memcpy(dst + (r - r0) * ldd, x + r * K + k0, (size_t)kn * sizeof(float));
}

/* The passes of one thread of the team, in order: row chunks, then stretches of K, each a
 * work-sharing loop over the panel pairs (so every thread runs every pass). */
static void run_passes(const float *x, const weight_t *wp, float *y, int64_t M, int64_t O,
                       int64_t K, int64_t block, int64_t span, int64_t panel_stride,
                       int64_t row_stride, float *xcopy, int64_t ldc, weight_t *scratch) {
    int64_t panels = (O + LANES - 1) / LANES, pairs = (panels + 1) / 2;
    int64_t chunk = span < K ? ROW_CHUNK : (xcopy != NULL ? X_CHUNK : M);
    for (int64_t c0 = 0; c0 < M; c0 += chunk) {
        int64_t c1 = c0 + chunk < M ? c0 + chunk : M;
        for (int64_t k0 = 0; k0 < K; k0 += span) {
            int64_t kn = k0 + span < K ? span : K - k0;
            Pass s = {x + c0 * K + k0, K, y + c0 * O, O, block, k0, kn};
            if (xcopy != NULL) {  /* the implicit barrier after copy_rows orders the reads */
                copy_rows(x, K, c0, c1, k0, kn, xcopy, ldc);
                s.x = xcopy;
                s.ldx = ldc;
            }
            #pragma omp for schedule(static)
            for (int64_t q = 0; q < pairs; q++)
                pair_rows(&s, wp, panels, q, c1 - c0, panel_stride, row_stride, scratch);
        }
    }
}

/* Loop nest: row chunks, then stretches of K in order, then the panel pairs across threads
 * (a static schedule: a pair stays on one thread for every stretch). When a panel pair's whole
 * K fits in half an L2 (every weight of the forward), one stretch: each pair streamed from
 * memory once per row chunk while every row block passes it with its totals in registers.
 * Else (the backward's dy · w through a 49152-wide head) stretches of whole K blocks, each
 * row block's totals carried from one to the next through y. An element's block sums are
 * added in order either way: the same arithmetic, the same bits. */
int lp_linear(const float *x, const weight_t *wp, float *y, int64_t M, int64_t O, int64_t K,
              int64_t block, int64_t panel_stride, int64_t row_stride, int64_t num_threads) {
    /* -1, nothing written: a negative size, no summation block, strides too small for the
     * panels they step over, or no thread; -2: no memory for the copies. */
    if (M < 0 || O < 0 || K < 0 || num_threads < 1 || (K > 0 && block < 1)
        || panel_stride < 1 || row_stride < 1) return -1;
    if (M == 0 || O == 0) return 0;
    if (K == 0) {
        memset(y, 0, (size_t)(M * O) * sizeof(float));
        return 0;
    }
    /* Products per stretch: all K where a panel pair's K fits PAIR_PANEL_BYTES, else whole
     * blocks filling STRETCH_BYTES. */
    int64_t pair_bytes = 2 * LANES * (int64_t)sizeof(weight_t);
    int64_t stretch = STRETCH_BYTES / pair_bytes / block * block;
    int64_t span = K * pair_bytes <= PAIR_PANEL_BYTES ? K : (stretch > block ? stretch : block);
    int copy_w = row_stride != LANES && M > MR;
    float *xcopy = NULL;
    int64_t ldc = span + X_PAD;
    if (K % 1024 == 0 && M > MR) {
        int64_t chunk = span < K ? ROW_CHUNK : X_CHUNK;
        int64_t rows = M < chunk ? M : chunk;
        xcopy = malloc((size_t)(rows * ldc) * sizeof(float));
        if (xcopy == NULL) return -2;
    }
    int failed = 0;
    #pragma omp parallel num_threads((int)num_threads) shared(failed)
    {
        weight_t *scratch = NULL;
        if (copy_w && (scratch = malloc((size_t)(2 * LANES * span) * sizeof(weight_t))) == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        int any_failed;
        #pragma omp atomic read
        any_failed = failed;
        if (!any_failed)
            run_passes(x, wp, y, M, O, K, block, span, panel_stride, row_stride, xcopy, ldc,
                       scratch);
        free(scratch);
    }
    free(xcopy);
    return failed ? -2 : 0;
}

#endif
