/* SPDX-License-Identifier: MIT
 * Top-n correlation screening (spec: algorithms.md 3.2) and ridge / damped Gauss-Newton
 * coefficient refinement on a fixed support (spec 3.6).
 *
 * Top-n selects under the total order "larger |a| first, then smaller index", so the result
 * is unique. |a_j| is ranked by an integer key built from its bit pattern (for non-negative
 * floats the order of the bits is the numeric order): dead atoms 0, NaN 1, else bits + 2.
 *   - small n (PL: n = s; n <= TOPN_SMALL and n_atoms >= TOPN_SHARE n, or TOPN_SHARE512 n
 *     where AVX-512 runs): one pass keeping the n best in a sorted list over the blocks of
 *     TOPN_BLK atoms whose largest |a| reaches the n-th largest of the blocks' maxima (one
 *     vectorised pass computes them); within a block, only the keys above the list's
 *     threshold are visited. (A pool of N/4, GM at N = 128, would enter the list at nearly
 *     every key, each a mispredicted branch and a shift.)
 *   - otherwise (GM: the pool), O(n_atoms): the threshold t0 of a conservative rank among
 *     SAMPLE evenly spaced keys; one pass computes every key and collects the atoms with
 *     key >= t0 with their keys (a few more than n, ascending; on AVX-512 16 keys per
 *     compare and a compress, else 64 per mask whose set bits are visited); the exact n-th
 *     largest key among them comes from a bisection of their range with vectorised counts,
 *     ties go to the smaller index. When fewer than n atoms reach t0, every live atom is a
 *     candidate (same result, slower).
 * The pool comes out in ascending index order without sorting; only an ordered pool
 * (sort != 0) is sorted, O(n log n). Integer keys: every clone gives the same result.
 */
#include "kernels/fk_sparse.h"

#include "common/fk_err.h"
#include "kernels/fk_dot.h"
#include "kernels/fk_simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if FK_AVX512_FN
#include <immintrin.h>
#endif

#define TOPN_SMALL 32 /* n up to this: the sorted-list pass */
#define TOPN_BLK 32   /* keys per block of the sorted-list pass */
#define TOPN_MAXBLK 1024 /* blocks whose maxima screen the sorted-list pass (32k atoms) */
#define TOPN_SHARE 16 /* ... and n_atoms at least this many times n */
#define TOPN_SHARE512 64 /* ... on AVX-512, whose compress makes the other pass cheaper */
#define CHUNK 1024    /* atoms per call of the key pass */
#define SAMPLE 256    /* keys sampled for the threshold estimate */
#define SAMPLE_RES (1 << 16) /* its search's resolution in key units (|a| within 2^-7
                              * relative), finer when the sample keys span less */


/* Screening key of a live atom: order of keys = order of |a| (NaN lowest); always >= 1. */
static inline int32_t screen_key(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    int32_t b = (int32_t)(u & 0x7FFFFFFFu);
    return b > 0x7F800000 ? 1 : b + 2;
}

/* Keys of len atoms into key; returns their largest key and adds the live count to *live. */
FK_CLONES static int32_t keys_block(const float *restrict a, const uint8_t *restrict dead,
                                    int len, int32_t *restrict key, int *live)
{
    int32_t mx = 0;
    if (dead) {
        int lv = 0;
        for (int i = 0; i < len; i++) {
            int32_t k = dead[i] ? 0 : screen_key(a[i]);
            key[i] = k;
            mx = k > mx ? k : mx;
            lv += dead[i] == 0;
        }
        *live += lv;
    } else {
        for (int i = 0; i < len; i++) {
            int32_t k = screen_key(a[i]);
            key[i] = k;
            mx = k > mx ? k : mx;
        }
        *live += len;
    }
    return mx;
}

/* Pair (ka, ia) precedes pair (kb, ib) in the screening order. */
static int before(int32_t ka, int32_t ia, int32_t kb, int32_t ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

/* The screening key of atom j (0 when dead). */
static inline int32_t key_of(const float *a, const uint8_t *dead, int32_t j)
{
    return dead && dead[j] ? 0 : screen_key(a[j]);
}

static void sift_down(const float *a, const uint8_t *dead, int32_t *id, int root, int end)
{
    for (;;) {
        int ch = 2 * root + 1;
        if (ch >= end)
            return;
        if (ch + 1 < end &&
            before(key_of(a, dead, id[ch]), id[ch], key_of(a, dead, id[ch + 1]), id[ch + 1]))
            ch++;
        if (!before(key_of(a, dead, id[root]), id[root], key_of(a, dead, id[ch]), id[ch]))
            return;
        int32_t t = id[root];
        id[root] = id[ch];
        id[ch] = t;
        root = ch;
    }
}

/* Heapsort of n atom ids into screening order (first = largest key): a max-heap under
 * "comes later", whose root is the id that belongs last. */
static void sort_ids(const float *a, const uint8_t *dead, int32_t *id, int n)
{
    for (int start = n / 2 - 1; start >= 0; start--)
        sift_down(a, dead, id, start, n);
    for (int end = n - 1; end > 0; end--) {
        int32_t t = id[0];
        id[0] = id[end];
        id[end] = t;
        sift_down(a, dead, id, 0, end);
    }
}

static void sort_ascending(int32_t *v, int n)
{
    for (int i = 1; i < n; i++) {
        int32_t t = v[i];
        int p = i;
        for (; p > 0 && v[p - 1] > t; p--)
            v[p] = v[p - 1];
        v[p] = t;
    }
}

/* Index of the lowest set bit of m != 0. */
static inline int lowest_bit(uint64_t m)
{
#if defined(__GNUC__)
    return __builtin_ctzll(m);
#else
    int i = 0;
    while (!(m & 1u)) {
        m >>= 1;
        i++;
    }
    return i;
#endif
}

/* f[i] = key[i] >= t0, i < len (vectorised). */
FK_CLONES static void ge_flags(const int32_t *restrict key, int len, int32_t t0,
                               uint8_t *restrict f)
{
    for (int i = 0; i < len; i++)
        f[i] = key[i] >= t0;
}

/* Eight 0/1 bytes f[0 .. 8) packed to eight bits (bit i = f[i]) by one multiplication. */
static inline uint64_t pack8(const uint8_t *f)
{
    uint64_t w; /* byte i holds flag i on a little-endian CPU */
    memcpy(&w, f, sizeof w);
    return (w * 0x0102040810204080u) >> 56;
}

/* Bit i set when key[i] >= t0, i < len <= 64: the flags, packed eight at a time. */
static uint64_t ge_mask(const int32_t *key, int len, int32_t t0)
{
    uint8_t f[64];
    memset(f + len, 0, (size_t)(64 - len));
    ge_flags(key, len, t0, f);
    uint64_t mk = 0;
    for (int b = 0; b < (len + 7) / 8; b++)
        mk |= pack8(f + 8 * b) << (8 * b);
    return mk;
}

/* bm[b] = the largest |a| bit pattern among atoms b TOPN_BLK .. (b + 1) TOPN_BLK - 1 of
 * a[0 .. n) (the last block may be shorter), in one vectorised pass; returns the largest.
 * A NaN gives a pattern above 0x7F800000. */
FK_CLONES512 static int32_t block_absmax(const float *restrict a, int n,
                                          int32_t *restrict bm)
{
    int b = 0;
    int32_t top = 0;
    for (int b0 = 0; b0 < n; b0 += TOPN_BLK, b++) {
        int len = n - b0 < TOPN_BLK ? n - b0 : TOPN_BLK;
        uint32_t mx = 0;
        for (int i = 0; i < len; i++) {
            uint32_t u;
            memcpy(&u, &a[b0 + i], sizeof u);
            u &= 0x7FFFFFFFu;
            mx = u > mx ? u : mx;
        }
        bm[b] = (int32_t)mx;
        top = bm[b] > top ? bm[b] : top;
    }
    return top; /* the largest of all */
}

FK_CLONES512 static int count_live_bytes(const uint8_t *restrict dead, int n);
FK_CLONES512 static int32_t kth_key_count(const int32_t *restrict kb, int nc, int r,
                                          int32_t res);

/* Small n: one pass keeping the best n (key desc, index asc) in a sorted list. Without dead
 * atoms or NaN, only the blocks whose largest |a| reaches the n-th largest of the blocks'
 * maxima, t0, are read: n blocks hold an atom >= t0, so every one of the best n is >= t0
 * (t0 from a bisection over the maxima; the blocks' order cannot make many keys enter).
 * Returns n_eff = min(n, live atoms). */
static int topn_small(const float *a, const uint8_t *dead, int n_atoms, int n, int sort,
                      int32_t *out)
{
    int32_t kb[TOPN_BLK], lk[TOPN_SMALL], li[TOPN_SMALL], bm[TOPN_MAXBLK];
    int cnt = 0, live = 0;
    int32_t thr = 0; /* a key must exceed thr to enter: 0 (not dead) until the list is full */
    int nb = (n_atoms + TOPN_BLK - 1) / TOPN_BLK, pre = 0;
    if (dead && count_live_bytes(dead, n_atoms) == n_atoms)
        dead = NULL;
    int32_t t0 = 0;
    if (!dead && nb >= n && nb <= TOPN_MAXBLK) {
        memset(bm, 0, sizeof(int32_t) * (size_t)nb); /* what GCC cannot see the clone do */
        int32_t top = block_absmax(a, n_atoms, bm);
        t0 = kth_key_count(bm, nb, n, 1);
        if (top <= 0x7F800000) { /* no NaN */
            pre = 1;
            thr = t0 + 1; /* keys >= t0 + 2 enter */
        }
    }
    for (int b0 = 0; b0 < n_atoms; b0 += TOPN_BLK) {
        int len = n_atoms - b0 < TOPN_BLK ? n_atoms - b0 : TOPN_BLK;
        if (pre && bm[b0 / TOPN_BLK] < t0)
            continue;
        int32_t mx = keys_block(a + b0, dead ? dead + b0 : NULL, len, kb, &live);
        if (mx <= thr)
            continue;
        /* the keys above the threshold at the block's start, in index order */
        for (uint64_t mk = ge_mask(kb, len, thr + 1); mk; mk &= mk - 1) {
            int i = lowest_bit(mk);
            int32_t k = kb[i];
            if (k <= thr)
                continue;
            /* later atoms lose ties, so k goes after every key >= k */
            int p = cnt < n ? cnt : n - 1;
            for (; p > 0 && lk[p - 1] < k; p--) {
                lk[p] = lk[p - 1];
                li[p] = li[p - 1];
            }
            lk[p] = k;
            li[p] = b0 + i;
            if (cnt < n)
                cnt++;
            if (cnt == n)
                thr = lk[n - 1];
        }
    }
    memcpy(out, li, sizeof(int32_t) * (size_t)cnt);
    if (!sort)
        sort_ascending(out, cnt);
    return cnt;
}

/* The r-th largest (1-based, 1 <= r <= nc) of the keys kb[0 .. nc), all >= 0: the largest
 * t with at least r keys >= t, by bisection of [min, max] with one vectorised count per
 * halving (about log2(max - min) counts, one clone for the whole search; a radix select on
 * a few hundred keys cost several times as much in histogram updates, bin scans and
 * compactions). A halving that finds exactly r keys >= its midpoint ends the search: the
 * r-th largest is then the smallest of them (one more pass; far fewer halvings when the
 * keys are few). res > 1: stop once the interval is at most res key units and at most
 * 2^-10 of the keys' range, and return its lower end: a key t with at least r keys >= t,
 * that close below the r-th largest (res = 1: exact). */
FK_CLONES512 static int32_t kth_key_count(const int32_t *restrict kb, int nc, int r,
                                          int32_t res)
{
    int32_t mx = 0, mn = INT32_MAX;
    for (int i = 0; i < nc; i++) {
        mx = kb[i] > mx ? kb[i] : mx;
        mn = kb[i] < mn ? kb[i] : mn;
    }
    int64_t a = mn, b = (int64_t)mx + 1; /* count(>= a) = nc >= r > count(>= b) = 0 */
    int64_t stop = (b - a) >> 10;
    stop = stop < res ? stop : res;
    stop = stop > 1 ? stop : 1;
    while (b - a > stop) {
        int32_t mid = (int32_t)(a + (b - a) / 2);
        int c = 0;
        for (int i = 0; i < nc; i++)
            c += kb[i] >= mid;
        if (c == r) { /* mid lies between the (r+1)-th and the r-th largest: the r-th is
                       * the smallest key >= mid (exact whatever res) */
            uint32_t d = UINT32_MAX; /* keys below mid wrap above every key >= mid: an
                                      * unsigned min the compiler vectorises (a select
                                      * and a min ran as a scalar cmov chain) */
            for (int i = 0; i < nc; i++) {
                uint32_t v = (uint32_t)(kb[i] - mid);
                d = v < d ? v : d;
            }
            return (int32_t)(mid + (int64_t)d);
        }
        if (c >= r)
            a = mid;
        else
            b = mid;
    }
    return (int32_t)a;
}

/* Live atoms among dead[0 .. n) (vectorised). */
FK_CLONES512 static int count_live_bytes(const uint8_t *restrict dead, int n)
{
    int lv = 0;
    for (int i = 0; i < n; i++)
        lv += dead[i] == 0;
    return lv;
}

/* The atoms of a[0 .. n) whose screening key is >= t0 >= 1, in index order: their ids to
 * cand and their keys to ck; returns how many. 64 keys at a time are computed and compared
 * (vectorised), their flags packed to a mask, and only its set bits are visited. */
FK_CLONES512 static int collect_keys(const float *restrict a, const uint8_t *restrict dead,
                                     int n, int32_t t0, int32_t *restrict cand,
                                     int32_t *restrict ck)
{
    int nc = 0;
    for (int j0 = 0; j0 < n; j0 += 64) {
        int len = n - j0 < 64 ? n - j0 : 64;
        int32_t k[64];
        uint8_t f[64];
        if (len == 64 && !dead) {
            for (int i = 0; i < 64; i++)
                k[i] = screen_key(a[j0 + i]);
        } else {
            for (int i = 0; i < len; i++)
                k[i] = key_of(a, dead, j0 + i);
            for (int i = len; i < 64; i++)
                k[i] = 0;
        }
        for (int i = 0; i < 64; i++)
            f[i] = k[i] >= t0;
        uint64_t mk = 0;
        for (int b = 0; b < 8; b++)
            mk |= pack8(f + 8 * b) << (8 * b);
        for (; mk; mk &= mk - 1) {
            int i = lowest_bit(mk);
            cand[nc] = j0 + i;
            ck[nc] = k[i];
            nc++;
        }
    }
    return nc;
}

#if FK_AVX512_FN
/* collect_keys for AVX-512F: 16 keys per compare, the ids and keys of those >= t0 moved
 * together by a compress and written by a masked store (no branch per candidate). The same
 * keys and order as collect_keys. */
FK_AVX512_ONLY static int collect_keys16(const float *restrict a, const uint8_t *restrict dead,
                                         int n, int32_t t0, int32_t *restrict cand,
                                         int32_t *restrict ck)
{
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i two = _mm512_set1_epi32(2), one = _mm512_set1_epi32(1);
    const __m512i tv = _mm512_set1_epi32(t0), step = _mm512_set1_epi32(16);
    __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int nc = 0;
    for (int j = 0; j < n; j += 16) {
        int len = n - j < 16 ? n - j : 16;
        __mmask16 lm = (__mmask16)((1u << len) - 1u);
        __m512i b = _mm512_and_si512(_mm512_maskz_loadu_epi32(lm, a + j), absm);
        __m512i k = _mm512_mask_mov_epi32(_mm512_add_epi32(b, two),
                                          _mm512_cmpgt_epi32_mask(b, inf), one); /* NaN */
        __mmask16 m = _mm512_mask_cmpge_epi32_mask(lm, k, tv);
        if (dead) {
            uint8_t tail[16] = {0};
            const uint8_t *dj = dead + j;
            if (len < 16)
                dj = memcpy(tail, dj, (size_t)len);
            __m128i db = _mm_loadu_si128((const __m128i *)(const void *)dj);
            m &= _mm512_cmpeq_epi32_mask(_mm512_cvtepu8_epi32(db), _mm512_setzero_si512());
        }
        __mmask16 st = (__mmask16)((1u << __builtin_popcount(m)) - 1u);
        _mm512_mask_storeu_epi32(cand + nc, st, _mm512_maskz_compress_epi32(m, ids));
        _mm512_mask_storeu_epi32(ck + nc, st, _mm512_maskz_compress_epi32(m, k));
        nc += __builtin_popcount(m);
        ids = _mm512_add_epi32(ids, step);
    }
    return nc;
}

/* The n_eff ids of cand[0 .. nc) whose keys ck exceed thr, with the first ties of thr in
 * index order up to n_eff, to out (in order). */
FK_AVX512_ONLY static void select16(const int32_t *restrict cand, const int32_t *restrict ck,
                                    int nc, int32_t thr, int ties, int32_t *restrict out)
{
    const __m512i tv = _mm512_set1_epi32(thr);
    int w = 0;
    for (int i = 0; i < nc; i += 16) {
        int len = nc - i < 16 ? nc - i : 16;
        __mmask16 lm = (__mmask16)((1u << len) - 1u);
        __m512i k = _mm512_maskz_loadu_epi32(lm, ck + i);
        __mmask16 m = _mm512_mask_cmpgt_epi32_mask(lm, k, tv);
        unsigned eq = _mm512_mask_cmpeq_epi32_mask(lm, k, tv);
        for (; eq && ties > 0; eq &= eq - 1, ties--)
            m |= (__mmask16)(eq & -eq);
        __mmask16 st = (__mmask16)((1u << __builtin_popcount(m)) - 1u);
        _mm512_mask_storeu_epi32(out + w, st,
                                 _mm512_maskz_compress_epi32(m, _mm512_loadu_si512(cand + i)));
        w += __builtin_popcount(m);
    }
}
#endif

/* How many of ck[0 .. nc) exceed thr (vectorised). */
FK_CLONES512 static int count_gt(const int32_t *restrict ck, int nc, int32_t thr)
{
    int c = 0;
    for (int i = 0; i < nc; i++)
        c += ck[i] > thr;
    return c;
}

/* Every atom a candidate (t0 1, none dead: collect_keys's result without its masks): ids and
 * keys of a[0 .. n) in one vectorised pass. */
FK_CLONES512 static int all_keys(const float *restrict a, int n, int32_t *restrict cand,
                                 int32_t *restrict ck)
{
    for (int i = 0; i < n; i++) {
        cand[i] = i;
        ck[i] = screen_key(a[i]);
    }
    return n;
}

/* collect_keys16 where this CPU has AVX-512F, else collect_keys. */
static int collect_any(const float *a, const uint8_t *dead, int n, int32_t t0, int32_t *cand,
                       int32_t *ck)
{
#if FK_AVX512_FN
    if (fk_have_avx512())
        return collect_keys16(a, dead, n, t0, cand, ck);
#endif
    return collect_keys(a, dead, n, t0, cand, ck);
}

/* The ids of cand[0 .. nc) whose keys ck exceed thr, then the first ties of thr in index
 * order (ties of them), to out in order (select16 on AVX-512F; cand is overwritten). */
static void select_any(int32_t *cand, const int32_t *ck, int nc, int32_t thr, int ties,
                       int32_t *out)
{
#if FK_AVX512_FN
    if (fk_have_avx512()) {
        select16(cand, ck, nc, thr, ties, out);
        return;
    }
#endif
    int w = 0;
    for (int i = 0; i < nc; i++) { /* in place, branch-free: w <= i */
        int32_t k = ck[i];
        int tie = (k == thr) & (ties > 0);
        ties -= tie;
        cand[w] = cand[i];
        w += (k > thr) | tie;
    }
    memcpy(out, cand, sizeof(int32_t) * (size_t)w);
}

/* Larger n (see the file comment). cand, ck: n_atoms int32 each. Returns n_eff. */
static int topn_large(const float *a, const uint8_t *dead, int n_atoms, int n, int32_t *out,
                      int32_t *cand, int32_t *ck)
{
    int live = n_atoms;
    if (dead) {
        live = count_live_bytes(dead, n_atoms);
        if (live == n_atoms)
            dead = NULL; /* the keys without the dead test: the same keys, a shorter pass */
    }
    int n_eff = n < live ? n : live;
    if (n_eff <= 0)
        return 0;
    int32_t t0 = 1; /* live atoms only */
    if (n_atoms >= 4 * SAMPLE && n_eff < live) {
        /* a rank q among SAMPLE evenly spaced keys with about 1.3 n + 6 strides of atoms
         * above it; when fewer than n_eff atoms reach it, every live atom is a candidate */
        int stride = n_atoms / SAMPLE;
        int q = (int)(1.3 * n_eff * (double)SAMPLE / n_atoms) + 6;
        if (q < SAMPLE / 2) {
            int32_t sk[SAMPLE];
            for (int i = 0; i < SAMPLE; i++) {
                int j = i * stride;
                sk[i] = key_of(a, dead, j);
            }
            t0 = kth_key_count(sk, SAMPLE, q, SAMPLE_RES);
            t0 = t0 > 1 ? t0 : 1;
        }
    }
    int nc = t0 <= 1 && !dead ? all_keys(a, n_atoms, cand, ck)
                              : collect_any(a, dead, n_atoms, t0, cand, ck);
    if (nc < n_eff)
        nc = collect_any(a, dead, n_atoms, 1, cand, ck);
    if (nc == n_eff) {
        memcpy(out, cand, sizeof(int32_t) * (size_t)n_eff);
        return n_eff;
    }
    /* the n_eff-th largest key among the candidates, which is the n_eff-th largest of all
     * keys (every key outside them is below t0) */
    int32_t thr = kth_key_count(ck, nc, n_eff, 1);
    select_any(cand, ck, nc, thr, n_eff - count_gt(ck, nc, thr), out);
    return n_eff;
}

int fk_topn(const float *a, const uint8_t *dead, int n_atoms, int n, int sort, int32_t *out,
            float *work)
{
    if (n <= 0 || n_atoms <= 0)
        return 0;
    /* the sorted list pays off while few keys enter it: n a small share of the atoms, a
     * smaller one where AVX-512 collects the candidates (docs/PERFORMANCE.md) */
    long share = fk_have_avx512() ? TOPN_SHARE512 : TOPN_SHARE;
    if (n <= TOPN_SMALL && (long)n * share <= n_atoms)
        return topn_small(a, dead, n_atoms, n, sort, out);
    int32_t *cand = (int32_t *)(void *)work, *ck = cand + n_atoms;
    int n_eff = topn_large(a, dead, n_atoms, n, out, cand, ck);
    if (sort && n_eff > 1)
        sort_ids(a, dead, out, n_eff);
    return n_eff;
}

/* ||x - D_S gam||^2 and ||x||^2 in double (each residual coordinate subtracts the atoms in
 * support order). */
FK_CLONES static double resid_refine(const float *restrict atoms, const int32_t *idx,
                                     const double *gam, int k, int m, const float *restrict x,
                                     double *xx_out)
{
    double acc[FK_DL] = {0}, accx[FK_DL] = {0};
    int i0 = 0; /* coordinate i goes to lane i % FK_DL, and FK_RB is a multiple of FK_DL */
    for (; i0 + FK_RB <= m; i0 += FK_RB) {
        double r[FK_RB];
        fk_resid_block(atoms, m, idx, gam, k, x, i0, r);
        for (int i = 0; i < FK_RB; i++) {
            acc[(i0 + i) % FK_DL] += r[i] * r[i];
            accx[(i0 + i) % FK_DL] += (double)x[i0 + i] * x[i0 + i];
        }
    }
    for (int i = i0; i < m; i++) {
        double r = fk_resid_coord(atoms, m, idx, gam, k, x, i);
        acc[i % FK_DL] += r * r;
        accx[i % FK_DL] += (double)x[i] * x[i];
    }
    *xx_out = fk_lanes_sum(accx);
    return fk_lanes_sum(acc);
}

/* One refinement in caller memory: G_SS (k x k, row-major stride k), its Cholesky factor
 * ch, D_S^T x (as), the coefficients (gam) and a step's right-hand side (res). */
struct ridge {
    int k;
    double *g, *ch, *as, *gam, *res;
};

static size_t ridge_doubles(int k)
{
    return 2 * (size_t)k * (size_t)k + 3 * (size_t)k;
}

static void ridge_bind(struct ridge *r, int k, double *mem)
{
    r->k = k;
    r->g = mem;
    r->ch = r->g + (size_t)k * k;
    r->as = r->ch + (size_t)k * k;
    r->gam = r->as + k;
    r->res = r->gam + k;
}

/* Checks one refinement's arguments (lambda0, rho and iters are checked by the caller). */
static int ridge_check(const struct fk_dict_view *d, const float *x, const struct fk_code *code)
{
    if (!d || !x || !code || !d->atoms || d->m <= 0)
        return fk_err(FK_EINVAL, "fk_refine: expected a dictionary view, x and a code");
    int k = code->k;
    if (k < 0 || k > FK_SMAX)
        return fk_err(FK_EINVAL, "fk_refine: support size %d outside 0..%d", k, FK_SMAX);
    for (int l = 0; l < k; l++)
        if (code->idx[l] < 0 || code->idx[l] >= d->n_atoms)
            return fk_err(FK_EINVAL, "fk_refine: support entry %d is atom %d, outside 0..%d",
                          l, (int)code->idx[l], d->n_atoms - 1);
    for (int i = 0; i < d->m; i++)
        if (!isfinite(x[i]))
            return fk_err(FK_EINVAL, "fk_refine: input vector element %d is not finite", i);
    return FK_OK;
}

static int ridge_params(double lambda0, double rho, int iters)
{
    if (iters < 1)
        return fk_err(FK_EINVAL, "fk_refine: expected iters >= 1, got %d", iters);
    if (!(lambda0 >= 0) || !(rho >= 0) || !isfinite(lambda0) || !isfinite(rho))
        return fk_err(FK_EINVAL, "fk_refine: expected finite lambda0, rho >= 0, got %g, %g",
                      lambda0, rho);
    return FK_OK;
}

/* G_SS (from gss when given, else fk_dot_fd products) and D_S^T x into r. */
static void ridge_fill(const struct fk_dict_view *d, const float *x, const struct fk_code *code,
                       const double *gss, struct ridge *r)
{
    int k = r->k, m = d->m;
    double *g = r->g;
    if (gss) { /* x . d_p for the whole support in one call (two rows per pass over x) */
        const float *rows[FK_SMAX];
        for (int p = 0; p < k; p++)
            rows[p] = d->atoms + (size_t)code->idx[p] * m;
        fk_dots_fd(rows, k, x, m, r->as);
        for (int p = 0; p < k; p++)
            for (int q = 0; q <= p; q++) {
                g[p * k + q] = gss[(size_t)p * FK_SMAX + q];
                g[q * k + p] = gss[(size_t)p * FK_SMAX + q];
            }
        return;
    }
    for (int p = 0; p < k; p++) {
        const float *dp = d->atoms + (size_t)code->idx[p] * m;
        const float *rows[FK_SMAX + 1]; /* x . d_p, then d_q . d_p, q <= p */
        double dots[FK_SMAX + 1];
        rows[0] = x;
        int nr = 1;
        for (int q = 0; q <= p; q++)
            rows[nr++] = d->atoms + (size_t)code->idx[q] * m;
        fk_dots_fd(rows, nr, dp, m, dots);
        r->as[p] = dots[0];
        for (int q = 0; q <= p; q++) {
            g[p * k + q] = dots[q + 1];
            g[q * k + p] = dots[q + 1];
        }
    }
}

/* The coefficients of L refinements of one support size (1 <= L <= FK_REFINE_LANES) in
 * lockstep: each lane runs exactly the operations it runs alone, in the same order, and
 * the lanes only overlap the latency of their chains of divisions and square roots (the
 * Cholesky factor's and the two triangular solves'; a refinement alone waits on them).
 * Returns the first lane (in lane order) whose G_SS + Lambda is not positive definite,
 * with its row in *bad_row, or -1. */
static int ridge_solve(struct ridge *const *r, int L, double lambda0, double rho, int iters,
                       int *bad_row)
{
    int k = r[0]->k;
    for (int p = 0; p < k; p++)
        for (int q = 0; q <= p; q++) {
            double v[FK_REFINE_LANES];
            for (int l = 0; l < L; l++) {
                const double *g = r[l]->g;
                v[l] = g[p * k + q];
                if (p == q)
                    v[l] += lambda0 + rho * g[p * k + p];
            }
            for (int j = 0; j < q; j++)
                for (int l = 0; l < L; l++)
                    v[l] -= r[l]->ch[p * k + j] * r[l]->ch[q * k + j];
            if (p != q) {
                for (int l = 0; l < L; l++)
                    r[l]->ch[p * k + q] = v[l] / r[l]->ch[q * k + q];
                continue;
            }
            for (int l = 0; l < L; l++)
                if (!(v[l] > 0)) {
                    *bad_row = p;
                    return l;
                }
            for (int l = 0; l < L; l++)
                r[l]->ch[p * k + p] = sqrt(v[l]);
        }
    for (int l = 0; l < L; l++)
        for (int p = 0; p < k; p++)
            r[l]->gam[p] = 0.0;
    for (int it = 0; it < iters; it++) {
        for (int l = 0; l < L; l++)
            for (int p = 0; p < k; p++) {
                double v = r[l]->as[p];
                for (int q = 0; q < k; q++)
                    v -= r[l]->g[p * k + q] * r[l]->gam[q];
                r[l]->res[p] = v;
            }
        for (int p = 0; p < k; p++) { /* M y = res */
            double v[FK_REFINE_LANES];
            for (int l = 0; l < L; l++)
                v[l] = r[l]->res[p];
            for (int j = 0; j < p; j++)
                for (int l = 0; l < L; l++)
                    v[l] -= r[l]->ch[p * k + j] * r[l]->res[j];
            for (int l = 0; l < L; l++)
                r[l]->res[p] = v[l] / r[l]->ch[p * k + p];
        }
        for (int p = k - 1; p >= 0; p--) { /* M^T dy = y */
            double v[FK_REFINE_LANES];
            for (int l = 0; l < L; l++)
                v[l] = r[l]->res[p];
            for (int j = p + 1; j < k; j++)
                for (int l = 0; l < L; l++)
                    v[l] -= r[l]->ch[j * k + p] * r[l]->res[j];
            for (int l = 0; l < L; l++)
                r[l]->res[p] = v[l] / r[l]->ch[p * k + p];
        }
        for (int l = 0; l < L; l++)
            for (int p = 0; p < k; p++)
                r[l]->gam[p] += r[l]->res[p];
    }
    return -1;
}

/* The coefficients to the code, its residual energy recomputed from the atoms. */
static void ridge_finish(const struct fk_dict_view *d, const float *x, const struct ridge *r,
                         struct fk_code *code)
{
    double xx;
    double e = resid_refine(d->atoms, code->idx, r->gam, r->k, d->m, x, &xx);
    for (int p = 0; p < r->k; p++)
        code->coef[p] = r->gam[p];
    code->err2 = e;
    code->xx = xx;
}

static int ridge_error(int row, double lambda0, double rho)
{
    return fk_err(FK_EINVAL, "fk_refine: G_SS + Lambda not positive definite at row %d "
                  "(lambda0 = %g, rho = %g)", row, lambda0, rho);
}

size_t fk_refine_work_doubles(int nv, int kmax)
{
    kmax = kmax < 0 ? 0 : kmax > FK_SMAX ? FK_SMAX : kmax;
    return (size_t)(nv < 1 ? 1 : nv) * ridge_doubles(kmax);
}

int fk_refine_many(const struct fk_dict_view *d, int nv, const float *const x[], double lambda0,
                   double rho, int iters, struct fk_code *const code[],
                   const double *const gss[], double *work, size_t work_doubles)
{
    if (nv < 0 || !work || (nv > 0 && (!x || !code)))
        return fk_err(FK_EINVAL, "fk_refine_many: expected nv >= 0 vectors, codes and work");
    double *end = work + work_doubles;
    FK_TRY(ridge_params(lambda0, rho, iters));
    struct ridge r[FK_REFINE_LANES];
    struct ridge *rl[FK_REFINE_LANES];
    for (int v0 = 0; v0 < nv;) {
        /* the next vectors of one support size, at most FK_REFINE_LANES */
        int L = 0;
        double *mem = work;
        for (; v0 + L < nv && L < FK_REFINE_LANES; L++) {
            const struct fk_code *c = code[v0 + L];
            int rc = ridge_check(d, x[v0 + L], c);
            if (rc < 0 && L == 0)
                return rc;
            if (rc < 0 || (L > 0 && c->k != r[0].k))
                break; /* the next group's first: reported after this group's */
            if (ridge_doubles(c->k) > (size_t)(end - mem)) {
                if (L == 0)
                    return fk_err(FK_EINVAL, "fk_refine_many: work too small for k = %d",
                                  c->k);
                break;
            }
            ridge_bind(&r[L], c->k, mem);
            mem += ridge_doubles(c->k);
            ridge_fill(d, x[v0 + L], c, gss ? gss[v0 + L] : NULL, &r[L]);
            rl[L] = &r[L];
        }
        int row, bad = ridge_solve(rl, L, lambda0, rho, iters, &row);
        if (bad >= 0) { /* report what the lanes one by one report first */
            for (int l = 0; l < L; l++)
                if (ridge_solve(rl + l, 1, lambda0, rho, iters, &row) >= 0)
                    return ridge_error(row, lambda0, rho);
        }
        for (int l = 0; l < L; l++)
            ridge_finish(d, x[v0 + l], &r[l], code[v0 + l]);
        v0 += L;
    }
    return FK_OK;
}

int fk_refine(const struct fk_dict_view *d, const float *x, double lambda0, double rho,
              int iters, struct fk_code *code)
{
    double work[2 * FK_SMAX * FK_SMAX + 3 * FK_SMAX];
    struct fk_code *const c[1] = {code};
    return fk_refine_many(d, 1, &x, lambda0, rho, iters, c, NULL, work,
                          sizeof work / sizeof *work);
}

int fk_refine_gss(const struct fk_dict_view *d, const float *x, double lambda0, double rho,
                  int iters, struct fk_code *code, const double *gss)
{
    if (!gss)
        return fk_err(FK_EINVAL, "fk_refine_gss: expected gss");
    double work[2 * FK_SMAX * FK_SMAX + 3 * FK_SMAX];
    struct fk_code *const c[1] = {code};
    return fk_refine_many(d, 1, &x, lambda0, rho, iters, c, &gss, work,
                          sizeof work / sizeof *work);
}
