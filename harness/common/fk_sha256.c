/* SPDX-License-Identifier: MIT
 * SHA-256 written from the FIPS 180-4 description (section 6.2).
 */
#include "common/fk_sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/fk_err.h"

/* First 32 bits of the fractional parts of the cube roots of the first 64 primes. */
static const uint32_t k256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t h[8], const uint8_t blk[64])
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)blk[4 * t] << 24 | (uint32_t)blk[4 * t + 1] << 16
               | (uint32_t)blk[4 * t + 2] << 8 | (uint32_t)blk[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g))
                      + k256[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

/* ---- x86 SHA extensions ----------------------------------------------------------------
 * The same compression with SHA256RNDS2 (two rounds), SHA256MSG1/MSG2 (message schedule),
 * written from the instruction definitions in the Intel SDM. The state is kept as the two
 * registers the round instruction takes: ABEF and CDGH (dword 3 first). */
#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

#define FK_SHA_NI 1

__attribute__((target("sha,sse4.1"))) static void compress_ni(uint32_t h[8], const uint8_t *p,
                                                              size_t nblk)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i dcba = _mm_loadu_si128((const __m128i *)(const void *)&h[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)(const void *)&h[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
    for (; nblk > 0; nblk--, p += 64) {
        __m128i abef0 = abef, cdgh0 = cdgh, w[4];
        for (int i = 0; i < 4; i++)
            w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)),
                                    bswap);
        for (int g = 0; g < 16; g++) { /* rounds 4g .. 4g + 3 */
            __m128i cur = w[g & 3];
            __m128i wk = _mm_add_epi32(cur, _mm_loadu_si128((const __m128i *)(const void *)
                                                             &k256[4 * g]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
            if (g < 12) { /* W[4(g+4) ..] from the four groups before it */
                __m128i t = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
                w[g & 3] = _mm_sha256msg2_epu32(t, w[(g + 3) & 3]);
            }
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    dcba = _mm_blend_epi16(feba, dchg, 0xF0);
    hgfe = _mm_alignr_epi8(dchg, feba, 8);
    _mm_storeu_si128((__m128i *)(void *)&h[0], dcba);
    _mm_storeu_si128((__m128i *)(void *)&h[4], hgfe);
}

static atomic_int sha_ni_state; /* 0 unknown, 1 available, 2 not available */
static atomic_int sha_ni_allowed = 1;

static int sha_ni_available(void)
{
    int st = atomic_load_explicit(&sha_ni_state, memory_order_relaxed);
    if (st == 0) {
        unsigned a, b, c, d;
        int ok = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_1) && (c & bit_SSSE3) &&
                 __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
        st = ok ? 1 : 2;
        atomic_store_explicit(&sha_ni_state, st, memory_order_relaxed);
    }
    return st == 1;
}
#endif

static void compress_blocks(uint32_t h[8], const uint8_t *p, size_t nblk)
{
#ifdef FK_SHA_NI
    if (atomic_load_explicit(&sha_ni_allowed, memory_order_relaxed) && sha_ni_available()) {
        compress_ni(h, p, nblk);
        return;
    }
#endif
    for (; nblk > 0; nblk--, p += 64)
        compress(h, p);
}

int fk_sha256_accel(int allow)
{
#ifdef FK_SHA_NI
    atomic_store_explicit(&sha_ni_allowed, allow != 0, memory_order_relaxed);
    return sha_ni_available();
#else
    (void)allow;
    return 0;
#endif
}

void fk_sha256_init(struct fk_sha256_ctx *c)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->n_bytes = 0;
    c->buf_len = 0;
}

void fk_sha256_update(struct fk_sha256_ctx *c, const void *data, size_t n)
{
    const uint8_t *p = data;
    c->n_bytes += n;
    if (c->buf_len > 0) {
        size_t take = 64 - c->buf_len < n ? 64 - c->buf_len : n;
        memcpy(c->buf + c->buf_len, p, take);
        c->buf_len += take;
        p += take;
        n -= take;
        if (c->buf_len < 64)
            return;
        compress_blocks(c->h, c->buf, 1);
        c->buf_len = 0;
    }
    compress_blocks(c->h, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    memcpy(c->buf, p, n);
    c->buf_len = n;
}

void fk_sha256_final(struct fk_sha256_ctx *c, uint8_t out[32])
{
    uint64_t bits = c->n_bytes * 8;
    c->buf[c->buf_len++] = 0x80;
    if (c->buf_len > 56) {
        memset(c->buf + c->buf_len, 0, 64 - c->buf_len);
        compress_blocks(c->h, c->buf, 1);
        c->buf_len = 0;
    }
    memset(c->buf + c->buf_len, 0, 56 - c->buf_len);
    for (int i = 0; i < 8; i++)
        c->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress_blocks(c->h, c->buf, 1);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    c->buf_len = 0;
}

void fk_sha256(const void *data, size_t n, uint8_t out[32])
{
    struct fk_sha256_ctx c;
    fk_sha256_init(&c);
    fk_sha256_update(&c, data, n);
    fk_sha256_final(&c, out);
}

void fk_sha256_hex(const uint8_t digest[32], char hex[65])
{
    static const char xd[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = xd[digest[i] >> 4];
        hex[2 * i + 1] = xd[digest[i] & 15];
    }
    hex[64] = '\0';
}

int fk_sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot open for hashing: %s", path, strerror(errno));
    struct fk_sha256_ctx c;
    uint8_t buf[65536], dig[32];
    size_t n;
    fk_sha256_init(&c);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fk_sha256_update(&c, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return fk_err(FK_EIO, "file %s: read error while hashing", path);
    fk_sha256_final(&c, dig);
    fk_sha256_hex(dig, hex);
    return FK_OK;
}
