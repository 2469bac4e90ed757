/* SPDX-License-Identifier: MIT
 * The numerical core shared by every dictionary codec (spec: algorithms.md sections 3.2,
 * 3.3, 3.6, 3.7): correlations, Batch-OMP in Gram mode, naive OMP, Top-n screening,
 * ridge refinement and FP8 E4M3FN coefficients.
 *
 * Data are float32; the small triangular solves, coefficients and energies are double.
 * Every routine is deterministic and single-threaded per vector (ties go to the lowest
 * atom index), so results do not depend on how vectors are spread over threads.
 */
#ifndef FK_SPARSE_H
#define FK_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#define FK_SMAX 64 /* largest sparsity a code can hold */

enum fk_code_flag {
    FK_CODE_ZERO = 1u << 0,      /* ||x||^2 <= 1e-30: empty code, x_hat = 0 */
    FK_CODE_PREMATURE = 1u << 1, /* residual orthogonal to every candidate: k < s */
    FK_CODE_TOL = 1u << 2,       /* stopped by the relative error threshold */
    FK_CODE_DEPENDENT = 1u << 3, /* at least one atom excluded by the dependency guard */
    FK_CODE_GUARDED = 1u << 4,   /* the coefficient solve lost precision: the code was cut
                                  * to its best prefix (precision guard, fk_omp_gram) */
};

/* One sparse code of a vector x. */
struct fk_code {
    int k;                   /* atoms used, 0..s */
    int32_t idx[FK_SMAX];    /* atom ids in selection order */
    double coef[FK_SMAX];    /* coefficients (unquantised) */
    double xx;               /* ||x||^2 */
    double err2;             /* ||x - D_S coef||^2, recomputed from the atoms */
    unsigned flags;          /* enum fk_code_flag */
    int iters;               /* greedy iterations run, counting excluded candidates */
};

/* Row j of the Gram matrix D^T D (n_atoms floats) in at most two pieces: row[i] = head[i]
 * for i < split, tail[i - split] after (tail NULL: the row is head alone). A dictionary that
 * grows keeps its stored base Gram as the head and the appended atoms' entries as the tail,
 * so a row is read where it lies, never copied. */
struct fk_gram_row {
    const float *head;
    const float *tail;
    int split;
};

/* Row j of D^T D: pointers into stored matrices, or into scratch (n_atoms floats) when the
 * function computes the row. */
typedef struct fk_gram_row (*fk_gram_row_fn)(void *ctx, int j, float *scratch);

/* A read-only view of a dictionary as a coder sees it. */
struct fk_dict_view {
    int m;                   /* head_dim */
    int n_atoms;             /* N_t, current atom count */
    const float *atoms;      /* [n_atoms][m] row-major, unit norm, dead atoms all zero */
    const uint8_t *dead;     /* [n_atoms], 1 = never select; NULL = none dead */
    fk_gram_row_fn gram_row; /* NULL: Gram mode unavailable */
    void *gram_ctx;
};

/* A = X D^T: correlations of nx vectors X [nx][m] with every atom -> A [nx][n_atoms].
 * One SGEMM (kernels/fk_blas.h). For bit-identical results at any thread count, call it with
 * the same block partition and the BLAS at one thread (fk_blas_single) in worker threads. */
void fk_correlate(const struct fk_dict_view *d, const float *x, int nx, float *a);

/* The same product for atoms [n_atoms][m] into a [nx][lda] (lda >= n_atoms): a[i * lda + j]
 * = x_i . atom_j. */
void fk_correlate_to(const float *atoms, int n_atoms, int m, const float *x, int nx, float *a,
                     size_t lda);

/* A buffer of n_floats floats for a Gram matrix (free() it): 2 MiB-aligned and advised
 * for transparent huge pages. The page faults of a fresh buffer in 4 KiB pages can cost
 * more than several SSYRKs, and Batch-OMP's random Gram rows miss the TLB less in huge
 * pages (figures in docs/PERFORMANCE.md). Below 1 MiB (N < 512) it is a 64-byte-aligned
 * buffer of its own size: a stream's Gram at N 128 is 64 KiB, and a huge page for it cost
 * the zeroing of 2 MiB. */
float *fk_gram_alloc(size_t n_floats);

/* G = D^T D for atom-major atoms [n_atoms][m] -> gram [n_atoms][n_atoms] (one SSYRK, then
 * mirrored, so G is exactly symmetric). Runs OpenBLAS on one thread (restoring the caller's
 * setting) so that the bits do not depend on the thread count. Returns FK_OK or FK_EINVAL. */
int fk_gram_compute(const float *atoms, int n_atoms, int m, float *gram);

/* Scratch size in floats for fk_omp_gram and fk_omp_naive (either mode; any alignment):
 * about (s + 2) * n_atoms + 2 * s^2 floats. Callers allocate once per thread. */
size_t fk_omp_work_floats(int n_atoms, int m, int s);

/* OMP over all live atoms in Gram mode (spec 3.3/3.4: progressive update, one Gram row per
 * iteration, correlation update fused with the |max| search). a = D^T x (length n_atoms).
 * s_eff = min(s, m, live atoms). tol_rel <= 0: no error threshold. Returns FK_OK, or
 * FK_EINVAL when x is not finite or d has no Gram.
 * Implementation: progressive Cholesky of G_SS in double (w = L^{-1} G_{S,j} from the row
 * fetched for j) plus the v0 rows q_k^T D (float) for the correlation update; memory
 * (s - 1) * n_atoms floats of work. The dependency guard excludes j when
 * G_jj - ||w||^2 <= 1e-6 G_jj; out->iters counts accepted plus excluded candidates.
 * Precision guard (both modes): the recomputed err2 = ||x - D_S coef||^2 should equal the
 * implicit residual ||x||^2 - ||z||^2 up to rounding. Atoms that pass the dependency guard
 * but are dependent within the float32 Gram's own rounding (clusters of near-identical atoms
 * trained on data with few distinct vectors) make the solve cancel, and err2 can exceed
 * ||x||^2. When err2 exceeds the implicit residual by more than 1e-3 ||x||^2, the code is cut
 * to the prefix S_1..S_k' (k' < k, coefficients from the leading block of the same Cholesky
 * factor) whose recomputed err2 is smallest, if that is smaller, and flagged
 * FK_CODE_GUARDED. Codes whose solve kept its precision are not touched. */
int fk_omp_gram(const struct fk_dict_view *d, const float *x, const float *a, int s,
                double tol_rel, float *work, struct fk_code *out);

/* Vectors a lane of fk_omp_gram_batch holds in flight. */
#define FK_OMP_LANES 2

/* Scratch size in floats for fk_omp_gram_batch (FK_OMP_LANES single workspaces). */
size_t fk_omp_batch_work_floats(int n_atoms, int m, int s);

/* fk_omp_gram on nx vectors x [nx][m] with correlations a (row i at a + i * lda) into
 * out [nx]. The codes are bit-identical to nx calls of fk_omp_gram; the vectors are coded
 * FK_OMP_LANES at a time, stepping in turn, so that the Gram row one reads next is
 * prefetched during another's correlation pass (a row of a large Gram comes from DRAM, and
 * one vector alone waits for it). work: fk_omp_batch_work_floats. */
int fk_omp_gram_batch(const struct fk_dict_view *d, int nx, const float *x, const float *a,
                      size_t lda, int s, double tol_rel, float *work, struct fk_code *out);

/* OMP in naive mode: recomputes c = D_C^T r every iteration. cand: candidate atom ids
 * (NULL = all live atoms), nc their count. a: D^T x over all atoms (nullable: computed).
 * Same selection rule and guards as Gram mode; the reference path for tests and for the
 * cost model, and the screened coder of GM (cand = the pool). */
int fk_omp_naive(const struct fk_dict_view *d, const float *x, const float *a,
                 const int32_t *cand, int nc, int s, double tol_rel, float *work,
                 struct fk_code *out);

/* OMP on the candidates cand (tol 0) for a caller that refines the code next (the GM
 * coder): also writes the Gram entries G_pq of the accepted atoms (support order) to gss
 * [FK_SMAX][FK_SMAX] (row-major), and a code with k > 0 ends without its coefficients and
 * err2, which fk_refine_gss computes. Without d->gram_row it is fk_omp_naive (the same
 * support, flags and iters; G_pq = fk_dot_fd(d_p, d_q)). With d->gram_row (a given) the
 * entries come from the Gram rows of the selected atoms and the pool's correlations are
 * updated from them as Batch-OMP updates its own (no pass over the pool's atoms): the same
 * rule, with numbers that agree with the naive mode's up to rounding. */
int fk_omp_pool(const struct fk_dict_view *d, const float *x, const float *a,
                const int32_t *cand, int nc, int s, float *work, struct fk_code *out,
                double *gss);

/* Scratch size in floats for fk_omp_pool2. */
size_t fk_omp_pool2_work_floats(int n_atoms, int m, int s);

/* fk_omp_pool in Gram mode (d->gram_row) on two vectors at once (x, a, cand, nc, out, gss:
 * one of each per vector), stepping in turn: both vectors gather, then extend their Cholesky
 * factors in lockstep (their chains of divisions overlap), then update; where the Gram lies
 * beyond L2 the row entries one vector reads next are requested while the other updates. The
 * same bits as two calls of fk_omp_pool. work: fk_omp_pool2_work_floats. */
int fk_omp_pool2(const struct fk_dict_view *d, const float *const x[2],
                 const float *const a[2], const int32_t *const cand[2], const int nc[2], int s,
                 float *work, struct fk_code *const out[2], double *const gss[2]);

/* Top-n screening: the n_eff = min(n, live atoms) atoms with the largest |a_j|, ties to the
 * smaller index, O(n_atoms). With sort != 0 the output is ordered by |a| descending (ties:
 * smaller index first); otherwise ascending by index. work: 2*n_atoms floats.
 * Returns n_eff. */
int fk_topn(const float *a, const uint8_t *dead, int n_atoms, int n, int sort,
            int32_t *out, float *work);

/* Ridge refinement (spec 3.6) on the support S (k atoms): lambda_j = lambda0 + rho*G_jj,
 * M = chol(G_SS + Lambda), gamma0 = 0, iters (>= 1) damped steps. Writes code->coef and
 * recomputes code->err2 (code->idx, k, xx must be set). */
int fk_refine(const struct fk_dict_view *d, const float *x, double lambda0, double rho,
              int iters, struct fk_code *code);

/* fk_refine with G_SS given (gss as written by fk_omp_pool for code->idx): the same bits as
 * fk_refine, whose G_SS entries are the same fk_dot_fd products (exact in double, summed in
 * the same lanes whichever operand comes first). */
int fk_refine_gss(const struct fk_dict_view *d, const float *x, double lambda0, double rho,
                  int iters, struct fk_code *code, const double *gss);

/* fk_refine (gss NULL) or fk_refine_gss (gss[i] for code i) of nv vectors x[i], codes
 * code[i]: the same bits and errors as nv calls in order. Vectors of one support size, up to
 * FK_REFINE_LANES at a time, run in lockstep so that their chains of divisions and square
 * roots overlap. work: work_doubles >= fk_refine_work_doubles(FK_REFINE_LANES, k) for the
 * largest support size k (FK_EINVAL when a code does not fit). */
#define FK_REFINE_LANES 4
size_t fk_refine_work_doubles(int nv, int kmax);
int fk_refine_many(const struct fk_dict_view *d, int nv, const float *const x[], double lambda0,
                   double rho, int iters, struct fk_code *const code[],
                   const double *const gss[], double *work, size_t work_doubles);

/* FP8 E4M3FN (spec 3.7). encode: round to nearest even, saturate to +-448 (|f| >= 464
 * counts as saturation: *saturated is incremented when non-NULL). NaN -> 0x7F. */
uint8_t fk_fp8_encode(double f, uint64_t *saturated);
float fk_fp8_decode(uint8_t c);

/* Half precision (IEEE binary16) round trip used for fp16 coefficient storage. */
uint16_t fk_fp16_encode(float f);
float fk_fp16_decode(uint16_t h);
/* fk_fp16_decode(fk_fp16_encode(x[i])) for n floats in place, vectorised (the same bits; a
 * NaN comes out as the quiet NaN of its sign). */
void fk_fp16_round(float *x, size_t n);

#endif
