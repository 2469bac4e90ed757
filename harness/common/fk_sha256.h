/* SPDX-License-Identifier: MIT
 * SHA-256 (FIPS 180-4): one-shot, incremental and whole-file digests. Used for model,
 * tokenizer and trace content hashes in provenance records.
 */
#ifndef FK_SHA256_H
#define FK_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct fk_sha256_ctx {
    uint32_t h[8];      /* chaining state */
    uint64_t n_bytes;   /* message bytes absorbed so far */
    uint8_t buf[64];    /* pending partial block */
    size_t buf_len;     /* bytes used in buf, 0..63 */
};

void fk_sha256_init(struct fk_sha256_ctx *c);
void fk_sha256_update(struct fk_sha256_ctx *c, const void *data, size_t n);
/* Writes the 32-byte digest; the context must be re-initialised before reuse. */
void fk_sha256_final(struct fk_sha256_ctx *c, uint8_t out[32]);

/* One-shot digest of n bytes. */
void fk_sha256(const void *data, size_t n, uint8_t out[32]);
/* Lower-case hex of a digest, NUL-terminated (65 bytes). */
void fk_sha256_hex(const uint8_t digest[32], char hex[65]);
/* Whether the x86 SHA extensions may be used (allow = 1, the default) or the portable code
 * only (0; for tests). Returns 1 if this CPU has them. Process-wide. */
int fk_sha256_accel(int allow);
/* Hex digest of a whole file; FK_EIO naming the file when it cannot be read. */
int fk_sha256_file(const char *path, char hex[65]);

#endif
