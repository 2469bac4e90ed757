/* SPDX-License-Identifier: MIT
 * libFuzzer target: the trace reader (datasets/fk_trace.h) and the dictionary reader
 * (datasets/fk_dict.h) on mutated HDF5 files.
 *
 * The input is written to a temporary file; fk_trace_open, then fk_trace_read of every layer
 * and kind (keys, values, queries), fk_trace_read_query_idx and a few attributes; then
 * fk_dict_load. Every error is fine, and must come with a message naming the file.
 *
 * HDF5 1.10.8 itself is not robust against hostile files (see tests/fuzz/README.md): inputs
 * are only passed on when they start with an intact HDF5 version-0 superblock (signature,
 * versions, sizes of offsets/lengths, and the addresses it records inside the input), so the
 * fuzzer spends its time on files HDF5 can parse and on what our readers do with them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fk_dict.h"
#include "fk_err.h"
#include "fk_trace.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fk_hdf5_quiet();
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_path, sizeof g_path, "%s/fk-fuzz-trace-%ld.h5", dir, (long)getpid());
    return 0;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Superblock version 0 with 8-byte offsets and lengths, as HDF5 1.10 writes by default. */
static int plausible(const uint8_t *d, size_t n)
{
    static const uint8_t sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    if (n < 96 || memcmp(d, sig, 8))
        return 0;
    if (d[8] != 0 || d[9] != 0 || d[10] != 0 || d[12] != 0 || d[13] != 8 || d[14] != 8)
        return 0;
    uint64_t base = le64(d + 24), eof = le64(d + 40), root = le64(d + 64);
    return base == 0 && eof == n && root < n;
}

static const float *g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!plausible(data, size))
        return 0;
    FILE *f = fopen(g_path, "wb");
    if (!f)
        abort();
    if (fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    struct fk_trace *t = NULL;
    int rc = fk_trace_open(g_path, &t);
    if (rc == FK_OK) {
        const struct fk_trace_info *in = fk_trace_get_info(t);
        if (in->n_layers < 1 || in->n_kv_heads < 1 || in->n_q_heads % in->n_kv_heads ||
            in->n_tokens < 1 || in->head_dim < 1 || in->prompt_len > in->n_tokens)
            abort();
        size_t kv = (size_t)in->n_kv_heads * (size_t)in->n_tokens * (size_t)in->head_dim;
        size_t q = (size_t)in->n_q_heads * (size_t)in->n_queries * (size_t)in->head_dim;
        size_t cap = kv > q ? kv : q;
        /* the replay engine allocates these too; skip shapes beyond 64 MiB here */
        if (in->n_queries >= 0 && cap <= ((size_t)16 << 20)) {
            float *buf = malloc(sizeof(float) * (cap ? cap : 1));
            int32_t *qi = malloc(sizeof(int32_t) * ((size_t)in->n_queries + 1));
            if (!buf || !qi)
                abort();
            for (int l = 0; l < in->n_layers && l < 64; l++) {
                for (int k = 0; k < (in->has_queries ? 3 : 2); k++) {
                    if (fk_trace_read(t, l, (enum fk_kind)k, buf) == FK_OK)
                        g_sink = buf;
                    else if (!strstr(fk_errmsg(), g_path))
                        abort();
                }
                if (in->has_queries && fk_trace_read_query_idx(t, l, qi) != FK_OK &&
                    !strstr(fk_errmsg(), g_path))
                    abort();
            }
            free(buf);
            free(qi);
        }
        (void)fk_trace_attr(t, "prompt");
        (void)fk_trace_attr(t, "model_sha256");
        (void)fk_trace_positions(t);
        fk_trace_close(&t);
    } else if (t || !strstr(fk_errmsg(), g_path)) {
        fprintf(stderr, "error without the file name: rc %d: %s\n", rc, fk_errmsg());
        abort();
    }
    struct fk_dict *d = NULL;
    rc = fk_dict_load(g_path, &d);
    if (rc == FK_OK)
        fk_dict_free(&d);
    else if (d || !strstr(fk_errmsg(), g_path)) {
        fprintf(stderr, "dictionary error without the file name: rc %d: %s\n", rc, fk_errmsg());
        abort();
    }
    unlink(g_path);
    return 0;
}
