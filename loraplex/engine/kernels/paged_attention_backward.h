/* loraplex paged attention, backward (included by paged_attention.c, which supplies the
 * vector helpers, v_exp and the key transposes): FlashAttention-2's backward over the same
 * pages, probabilities recomputed from the forward's log-sum-exp.
 *
 * Work items are (sequence, kv head): an item writes the query gradients of its sequence's
 * rows for that head group and the key/value gradients of its sequence's pages for that head,
 * and nothing else, so items run on any thread without locks as long as no page belongs to two
 * sequences (the caller checks; shared pages take the torch backward). Within an item the
 * order is fixed (rows in chunks of RUN_ROWS, pages in order, keys in order), so a sequence's
 * gradients are the same bits in any batch, on any thread, at any thread count. Per row i,
 * head h and visible key j (q already scaled, lse and delta = rowsum(dO ∘ O) per row and head):
 *
 *   p_ij = exp(q_i · k_j − lse_i)      dp_ij = dO_i · v_j      ds_ij = p_ij (dp_ij − delta_i)
 *   dq_i += Σ_j ds_ij k_j              dk_j += Σ_i ds_ij q_i   dv_j += Σ_i p_ij dO_i
 */

/* The scores and dO · v of one row's G heads against one page (keys transposed into kt, values
 * into vt), then p and ds of its nvis visible keys into p_out / ds_out ([G][BS]). */
static void row_page_grad(const float *q, const float *dout, const float *kt, const float *vt,
                          const float *lse, const float *delta, int nvis, int G, int D, int BS,
                          float *p_out, float *ds_out) {
    const int SV = (nvis + LANES - 1) / LANES;
    vec_t s[MAX_GROUP][MAX_BLOCK / LANES], dp[MAX_GROUP][MAX_BLOCK / LANES];
    for (int h = 0; h < G; h++)
        for (int c = 0; c < SV; c++) s[h][c] = dp[h][c] = v_zero();
    for (int d = 0; d < D; d++) {
        const float *kd = kt + (int64_t)d * BS, *vd = vt + (int64_t)d * BS;
        for (int h = 0; h < G; h++) {
            vec_t qd = v_set1(q[(int64_t)h * D + d]), od = v_set1(dout[(int64_t)h * D + d]);
            for (int c = 0; c < SV; c++) {
                s[h][c] = v_fma(qd, v_load(kd + c * LANES), s[h][c]);
                dp[h][c] = v_fma(od, v_load(vd + c * LANES), dp[h][c]);
            }
        }
    }
    for (int h = 0; h < G; h++) {
        vec_t lv = v_set1(lse[h]), dv = v_set1(delta[h]);
        for (int c = 0; c < SV; c++) {
            vec_t sc = v_mask_from(s[h][c], c * LANES, nvis);
            vec_t p = v_exp(v_sub(sc, lv));
            vec_t ds = v_zero_from(v_mul(p, v_sub(dp[h][c], dv)), c * LANES, nvis);
            v_store(p_out + (int64_t)h * BS + c * LANES, p);
            v_store(ds_out + (int64_t)h * BS + c * LANES, ds);
        }
    }
}

/* dst[0 .. n) of a D-vector += Σ over rows of coef[row] · src[row] — the key/value gradient of
 * one key: rows are the (row, head) pairs of a chunk that see it. */
static inline void add_outer(float *dst, const float *coef, int64_t coef_stride,
                             const float *const *src, int rows, int D) {
    const int DV = D / LANES;
    vec_t a[MAX_DIM / LANES];
    for (int e = 0; e < DV; e++) a[e] = v_zero();
    for (int r = 0; r < rows; r++) {
        vec_t c = v_set1(coef[r * coef_stride]);
        for (int e = 0; e < DV; e++) a[e] = v_fma(c, v_load(src[r] + e * LANES), a[e]);
    }
    for (int e = 0; e < DV; e++) v_store(dst + e * LANES, v_add(v_load(dst + e * LANES), a[e]));
}

typedef struct {
    const float *q, *kp, *vp, *dout, *lse, *delta;
    const int64_t *row_keys;
    int H, Hkv, D, BS;
    float *dq, *dkp, *dvp;
} grad_args;

typedef struct {
    float *kt, *vt;  /* the item's pages transposed: [pages][D][BS] each */
    float *p, *ds;   /* a chunk's probabilities and score gradients for one page: [rows][G][BS] */
    float *dq;       /* a chunk's query gradients: [rows][G][D] */
} grad_work;

/* One chunk (rows r0 .. r0 + n − 1 of a sequence, in position order: each sees one key more
 * than the one before) of item (table, g) against every page it sees. */
static void chunk_grad(const grad_args *a, const int64_t *table, int g, int64_t r0, int n,
                       const grad_work *w) {
    const int G = a->H / a->Hkv, D = a->D, BS = a->BS, H = a->H;
    const int64_t *keys = a->row_keys + r0;
    int64_t max_keys = keys[n - 1];
    memset(w->dq, 0, sizeof(float) * (size_t)(n * G * D));
    const float *q_rows[RUN_ROWS * MAX_GROUP], *o_rows[RUN_ROWS * MAX_GROUP], *kj[MAX_BLOCK];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < G; h++) {
            int64_t at = ((r0 + i) * H + (int64_t)g * G + h) * D;
            q_rows[i * G + h] = a->q + at;
            o_rows[i * G + h] = a->dout + at;
        }
    for (int64_t b = 0; b * BS < max_keys; b++) {
        const float *kt = w->kt + b * D * BS, *vt = w->vt + b * D * BS;
        int64_t page_off = (table[b] * a->Hkv + g) * (int64_t)BS * D;
        int kn = (int)(max_keys - b * BS < BS ? max_keys - b * BS : BS);
        for (int j = 0; j < kn; j++) kj[j] = a->kp + page_off + (int64_t)j * D;
        int first = 0;  /* rows first .. n − 1 see this page */
        while (keys[first] <= b * BS) first++;
        for (int i = first; i < n; i++) {
            int nvis = (int)(keys[i] - b * BS < BS ? keys[i] - b * BS : BS);
            int64_t at = (r0 + i) * H + (int64_t)g * G;
            float *p = w->p + (int64_t)i * G * BS, *ds = w->ds + (int64_t)i * G * BS;
            row_page_grad(a->q + at * D, a->dout + at * D, kt, vt, a->lse + at, a->delta + at,
                          nvis, G, D, BS, p, ds);
            for (int h = 0; h < G; h++)  /* dq_i += Σ_j ds_ij k_j */
                add_outer(w->dq + ((int64_t)i * G + h) * D, ds + (int64_t)h * BS, 1, kj, nvis,
                          D);
        }
        int seen = first;  /* rows seen .. n − 1 see key j */
        for (int j = 0; j < kn; j++) {  /* dk_j, dv_j over the (row, head) pairs that see j */
            while (keys[seen] <= b * BS + j) seen++;
            int pairs = (n - seen) * G;
            int64_t key = page_off + (int64_t)j * D, c = (int64_t)seen * G * BS + j;
            add_outer(a->dvp + key, w->p + c, BS, o_rows + seen * G, pairs, D);
            add_outer(a->dkp + key, w->ds + c, BS, q_rows + seen * G, pairs, D);
        }
    }
    for (int i = 0; i < n; i++)
        memcpy(a->dq + ((r0 + i) * H + (int64_t)g * G) * D, w->dq + (int64_t)i * G * D,
               sizeof(float) * (size_t)(G * D));
}

/* Item (sequence rows r0 .. r0 + n − 1, kv head g): its pages transposed once, then its rows
 * chunk by chunk. Values past a page's last key are zeroed in vt (pages may hold anything
 * there), so dO · v stays finite where p is 0. */
static void item_grad(const grad_args *a, const int64_t *table, int g, int64_t r0, int64_t n,
                      const grad_work *w) {
    const int D = a->D, BS = a->BS;
    int64_t keys = 0;
    for (int64_t i = 0; i < n; i++)
        if (a->row_keys[r0 + i] > keys) keys = a->row_keys[r0 + i];
    for (int64_t b = 0; b * BS < keys; b++) {
        int64_t page_off = (table[b] * a->Hkv + g) * (int64_t)BS * D;
        int kn = (int)(keys - b * BS < BS ? keys - b * BS : BS);
        float *kt = w->kt + b * D * BS, *vt = w->vt + b * D * BS;
        transpose_block(a->kp + page_off, kt, kn, D, BS);
        transpose_block(a->vp + page_off, vt, kn, D, BS);
        if (kn < BS)
            for (int d = 0; d < D; d++) memset(vt + (int64_t)d * BS + kn, 0,
                                               sizeof(float) * (size_t)(BS - kn));
    }
    for (int64_t c = 0; c < n; c += RUN_ROWS)
        chunk_grad(a, table, g, r0 + c, (int)(n - c < RUN_ROWS ? n - c : RUN_ROWS), w);
}

/* Gradients of q (dq [R][H][D]) and of the pages (dkp, dvp, like the pages) for sequences
 * s = 0 .. S − 1 (rows seq_row[s] .. + seq_len[s] − 1, block table at tables[seq_table[s]]),
 * given the forward's lse [R][H] and delta [R][H]. The caller zeroes dq, dkp and dvp (rows and
 * pages no item touches stay zero) and orders sequences as it wants them started (longest
 * first balances threads). max_keys: the most keys any row sees. R, table_rows, width, num_pages:
 * as `la_forward` checks them. Returns 0; -1 when a dimension, a row, a table offset or a page
 * id is out of range or a sequence's rows are not consecutive positions (keys rising by one, at
 * most max_keys), and nothing is written then; -2 when work memory ran out. */
int la_backward(const float *q, const float *kp, const float *vp, const float *dout,
                const float *lse, const float *delta, const int64_t *tables,
                const int64_t *seq_row, const int64_t *seq_len, const int64_t *seq_table,
                const int64_t *row_keys, int64_t S, int64_t max_keys, int64_t H, int64_t Hkv,
                int64_t D, int64_t BS, int64_t R, int64_t table_rows, int64_t width,
                int64_t num_pages, int64_t num_threads, float *dq, float *dkp, float *dvp) {
    if (bad_shape(H, Hkv, D, BS) || S < 0 || max_keys < 0 || num_threads < 1) return -1;
    for (int64_t s = 0; s < S; s++) {  /* chunk_grad relies on it */
        if (bad_rows(tables, row_keys, seq_table[s], seq_row[s], seq_len[s], R, table_rows,
                     width, num_pages, BS)) return -1;
        const int64_t *keys = row_keys + seq_row[s];
        if (keys[0] < 1 || keys[seq_len[s] - 1] > max_keys) return -1;
        for (int64_t i = 1; i < seq_len[s]; i++)
            if (keys[i] != keys[i - 1] + 1) return -1;
    }
    int failed = 0;
    grad_args a = {q, kp, vp, dout, lse, delta, row_keys, (int)H, (int)Hkv, (int)D, (int)BS,
                   dq, dkp, dvp};
    const int64_t G = H / Hkv, pages = (max_keys + BS - 1) / BS;
    #pragma omp parallel num_threads((int)num_threads)
    {
        grad_work w;
        w.kt = aligned_alloc(64, sizeof(float) * (size_t)((pages ? pages : 1) * D * BS));
        w.vt = aligned_alloc(64, sizeof(float) * (size_t)((pages ? pages : 1) * D * BS));
        w.p = aligned_alloc(64, sizeof(float) * (size_t)(RUN_ROWS * G * BS));
        w.ds = aligned_alloc(64, sizeof(float) * (size_t)(RUN_ROWS * G * BS));
        w.dq = aligned_alloc(64, sizeof(float) * (size_t)(RUN_ROWS * G * D));
        int ok = w.kt && w.vt && w.p && w.ds && w.dq;
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < S * Hkv; it++) {
            int64_t s = it / Hkv;
            if (ok)
                item_grad(&a, tables + seq_table[s], (int)(it % Hkv), seq_row[s], seq_len[s],
                          &w);
        }
        free(w.kt);
        free(w.vt);
        free(w.p);
        free(w.ds);
        free(w.dq);
    }
    return failed ? -2 : 0;
}
