/* SPDX-License-Identifier: MIT
 * llama2.c checkpoint and tokenizer loading, BPE encoding, forward pass, sampling and trace
 * export (see fk_llama2c.h). Written from the format description only. Generation (which
 * needs the GSL RNG, whose headers clash with <cblas.h>) is in fk_llama2c_gen.c.
 */
#include "gen/fk_llama2c.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fk_err.h"

#define RMS_EPS 1e-5
#define ROPE_THETA 10000.0
#define DIM_CAP (1 << 16) /* sanity bound on every header field */

/* ---------------------------------------------------------------- checkpoint ---- */

struct fk_llama2c_model {
    struct fk_llama2c_config cfg; /* header-derived shapes */
    char *path;                   /* file the model was read from */
    float *data;                  /* all floats of the file after the header */
    size_t n_floats;              /* length of data */
    const float *emb;             /* [vocab, dim] */
    const float *rms_att;         /* [L, dim] */
    const float *wq;              /* [L, dim, dim] */
    const float *wk;              /* [L, kv_dim, dim] */
    const float *wv;              /* [L, kv_dim, dim] */
    const float *wo;              /* [L, dim, dim] */
    const float *rms_ffn;         /* [L, dim] */
    const float *w1;              /* [L, hidden, dim] */
    const float *w2;              /* [L, dim, hidden] */
    const float *w3;              /* [L, hidden, dim] */
    const float *rms_final;       /* [dim] */
    const float *wcls;            /* [vocab, dim] (= emb when shared) */
    const float *freq_re, *freq_im; /* [seq_len, head_dim/2] the file's RoPE tables */
    int rope_default;             /* 1: the tables are theta 10000's (ROPE_DEFAULT_TOL) */
};

/* A checkpoint's RoPE tables within this of cos/sin(pos 10000^(-2i/d)) are the default ones
 * (exporters compute the angles in float32: the shipped models' tables are up to 2.9e-5 off
 * at 512 positions); the runner then uses those values in double, as before it read them. */
#define ROPE_DEFAULT_TOL 1e-3

static int read_i32le(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16
                 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static int check_header(const char *path, const int h[7], struct fk_llama2c_config *c)
{
    static const char *names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                   "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++) {
        int v = i == 5 && h[i] < 0 && h[i] > -DIM_CAP ? -h[i] : h[i];
        if (v <= 0 || v > DIM_CAP)
            return fk_err(FK_ECORRUPT, "file %s: header field %s = %d: expected 1..%d "
                          "(is this a llama2.c legacy checkpoint?)", path, names[i], h[i],
                          DIM_CAP);
    }
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->shared_classifier = h[5] > 0;
    c->vocab_size = h[5] > 0 ? h[5] : -h[5];
    c->seq_len = h[6];
    if (c->dim % c->n_heads != 0 || (c->dim / c->n_heads) % 2 != 0)
        return fk_err(FK_ECORRUPT, "file %s: header dim %d and n_heads %d: expected dim to be "
                      "an even multiple of n_heads", path, c->dim, c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return fk_err(FK_ECORRUPT, "file %s: header n_heads %d is not a multiple of "
                      "n_kv_heads %d", path, c->n_heads, c->n_kv_heads);
    c->head_dim = c->dim / c->n_heads;
    c->kv_dim = c->n_kv_heads * c->head_dim;
    return FK_OK;
}

/* Number of floats after the header, from the shapes alone. */
static uint64_t count_floats(const struct fk_llama2c_config *c)
{
    uint64_t d = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t kv = (uint64_t)c->kv_dim, V = (uint64_t)c->vocab_size;
    uint64_t half = (uint64_t)c->head_dim / 2;
    uint64_t n = V * d;                          /* token embedding */
    n += L * (d + d * d + 2 * kv * d + d * d);   /* rms_att, wq, wk, wv, wo */
    n += L * (d + 3 * hid * d);                  /* rms_ffn, w1, w2, w3 */
    n += d;                                      /* rms_final */
    n += 2 * (uint64_t)c->seq_len * half;        /* freq_cis real and imaginary */
    if (!c->shared_classifier)
        n += V * d;                              /* wcls */
    return n;
}

static void map_weights(struct fk_llama2c_model *m)
{
    const struct fk_llama2c_config *c = &m->cfg;
    size_t d = (size_t)c->dim, hid = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t kv = (size_t)c->kv_dim, V = (size_t)c->vocab_size;
    const float *p = m->data;
    m->emb = p;
    p += V * d;
    m->rms_att = p;
    p += L * d;
    m->wq = p;
    p += L * d * d;
    m->wk = p;
    p += L * kv * d;
    m->wv = p;
    p += L * kv * d;
    m->wo = p;
    p += L * d * d;
    m->rms_ffn = p;
    p += L * d;
    m->w1 = p;
    p += L * hid * d;
    m->w2 = p;
    p += L * d * hid;
    m->w3 = p;
    p += L * hid * d;
    m->rms_final = p;
    p += d;
    m->freq_re = p;
    p += (size_t)c->seq_len * (size_t)(c->head_dim / 2);
    m->freq_im = p;
    p += (size_t)c->seq_len * (size_t)(c->head_dim / 2);
    m->wcls = c->shared_classifier ? m->emb : p;
}

int fk_llama2c_model_load(const char *path, struct fk_llama2c_model **out)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return fk_err(FK_EIO, "file %s: cannot stat: %s", path, strerror(errno));
    FILE *f = fopen(path, "rb");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot open: %s", path, strerror(errno));
    unsigned char hb[FK_LLAMA2C_HEADER_BYTES];
    if (fread(hb, 1, sizeof hb, f) != sizeof hb) {
        fclose(f);
        return fk_err(FK_ECORRUPT, "file %s: %lld bytes, shorter than the %d-byte llama2.c "
                      "header", path, (long long)st.st_size, FK_LLAMA2C_HEADER_BYTES);
    }
    int h[7];
    for (int i = 0; i < 7; i++)
        h[i] = read_i32le(hb + 4 * i);
    struct fk_llama2c_config cfg;
    int rc = check_header(path, h, &cfg);
    if (rc < 0) {
        fclose(f);
        return rc;
    }
    uint64_t nf = count_floats(&cfg);
    uint64_t expect = FK_LLAMA2C_HEADER_BYTES + 4 * nf;
    if ((uint64_t)st.st_size != expect) {
        fclose(f);
        return fk_err(FK_ECORRUPT, "file %s: size %lld bytes, expected %llu = 28 + 4 * %llu "
                      "floats from the header (dim %d, hidden %d, layers %d, heads %d, "
                      "kv heads %d, vocab %d, seq_len %d, %s classifier): %s model", path,
                      (long long)st.st_size, (unsigned long long)expect,
                      (unsigned long long)nf, cfg.dim, cfg.hidden_dim, cfg.n_layers,
                      cfg.n_heads, cfg.n_kv_heads, h[5], cfg.seq_len,
                      cfg.shared_classifier ? "shared" : "separate",
                      (uint64_t)st.st_size < expect ? "truncated" : "mismatched");
    }
    struct fk_llama2c_model *m = calloc(1, sizeof *m);
    if (!m) {
        fclose(f);
        return fk_err(FK_ENOMEM, "file %s: out of memory", path);
    }
    m->cfg = cfg;
    m->n_floats = (size_t)nf;
    m->path = malloc(strlen(path) + 1);
    m->data = malloc(m->n_floats * sizeof(float));
    if (!m->path || !m->data) {
        fclose(f);
        fk_llama2c_model_free(&m);
        return fk_err(FK_ENOMEM, "file %s: cannot allocate %zu floats", path, (size_t)nf);
    }
    strcpy(m->path, path);
    size_t got = fread(m->data, sizeof(float), m->n_floats, f);
    fclose(f);
    if (got != m->n_floats) {
        fk_llama2c_model_free(&m);
        return fk_err(FK_EIO, "file %s: read %zu of %zu floats", path, got, (size_t)nf);
    }
    for (size_t i = 0; i < m->n_floats; i++) {
        if (!isfinite(m->data[i])) {
            fk_llama2c_model_free(&m);
            return fk_err(FK_ECORRUPT, "file %s: float %zu (byte offset %zu) is not finite",
                          path, i, FK_LLAMA2C_HEADER_BYTES + 4 * i);
        }
    }
    map_weights(m);
    m->rope_default = 1;
    int half = cfg.head_dim / 2;
    for (int p = 0; p < cfg.seq_len && m->rope_default; p++)
        for (int i = 0; i < half; i++) {
            double ang = (double)p * pow(ROPE_THETA, -(2.0 * i) / cfg.head_dim);
            size_t k = (size_t)p * half + i;
            if (fabs(m->freq_re[k] - cos(ang)) > ROPE_DEFAULT_TOL
                || fabs(m->freq_im[k] - sin(ang)) > ROPE_DEFAULT_TOL) {
                m->rope_default = 0;
                break;
            }
        }
    *out = m;
    return FK_OK;
}

int fk_llama2c_model_rope_default(const struct fk_llama2c_model *m) { return m->rope_default; }

const float *fk_llama2c_model_floats(const struct fk_llama2c_model *m, size_t *n)
{
    *n = m->n_floats;
    return m->data;
}

void fk_llama2c_model_free(struct fk_llama2c_model **m)
{
    if (!m || !*m)
        return;
    free((*m)->data);
    free((*m)->path);
    free(*m);
    *m = NULL;
}

const struct fk_llama2c_config *fk_llama2c_model_config(const struct fk_llama2c_model *m)
{
    return &m->cfg;
}

const char *fk_llama2c_model_path(const struct fk_llama2c_model *m) { return m->path; }

/* ---------------------------------------------------------------- tokenizer ---- */

struct fk_llama2c_tokenizer {
    int n;               /* tokens */
    int max_len;         /* max_token_length from the file */
    char **piece;        /* [n] piece bytes (NUL-terminated copies) */
    int *len;            /* [n] piece lengths in bytes */
    float *score;        /* [n] merge scores */
    int *byte_of;        /* [n] byte value of a "<0xXX>" piece, else -1 */
    int *sorted;         /* [n] ids sorted by piece bytes, for lookup */
    int bos;             /* id of "\n<s>\n" */
    int eos;             /* id of "\n</s>\n" or -1 */
    int byte_level;      /* 1 when each byte value has a one-byte piece */
    int byte_piece[256]; /* id of the one-byte piece b, else -1 */
    int hex_piece[256];  /* id of the "<0xXX>" piece for byte b, else -1 */
    char bytes[256][2];  /* one-byte strings returned by decode */
};

static int piece_cmp(const char *a, int la, const char *b, int lb)
{
    int n = la < lb ? la : lb;
    int c = memcmp(a, b, (size_t)n);
    if (c != 0)
        return c;
    return (la > lb) - (la < lb);
}

struct piece_ref {
    const char *p; /* piece bytes */
    int len;       /* piece length */
    int id;        /* token id */
};

static int sort_cmp(const void *a, const void *b)
{
    const struct piece_ref *x = a, *y = b;
    int c = piece_cmp(x->p, x->len, y->p, y->len);
    return c != 0 ? c : (x->id > y->id) - (x->id < y->id);
}

/* Lowest id whose piece equals s[0..n), or -1. */
static int lookup(const struct fk_llama2c_tokenizer *t, const char *s, int n)
{
    int lo = 0, hi = t->n - 1, found = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, id = t->sorted[mid];
        int c = piece_cmp(t->piece[id], t->len[id], s, n);
        if (c < 0) {
            lo = mid + 1;
        } else {
            if (c == 0)
                found = id;
            hi = mid - 1;
        }
    }
    return found;
}

static int hex_byte(const char *p, int n)
{
    static const char xd[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    const char *a = strchr(xd, p[3]), *b = strchr(xd, p[4]);
    if (!p[3] || !p[4] || !a || !b)
        return -1;
    return (int)(a - xd) * 16 + (int)(b - xd);
}

static int tok_fail(FILE *f, struct fk_llama2c_tokenizer **t, int rc)
{
    if (f)
        fclose(f);
    fk_llama2c_tokenizer_free(t);
    return rc;
}

int fk_llama2c_tokenizer_load(const char *path, int vocab_size,
                              struct fk_llama2c_tokenizer **out)
{
    *out = NULL;
    if (vocab_size <= 0)
        return fk_err(FK_EINVAL, "tokenizer %s: vocab_size %d must be positive", path,
                      vocab_size);
    FILE *f = fopen(path, "rb");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot open: %s", path, strerror(errno));
    struct fk_llama2c_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return tok_fail(f, &t, fk_err(FK_ENOMEM, "file %s: out of memory", path));
    unsigned char b4[8];
    if (fread(b4, 1, 4, f) != 4)
        return tok_fail(f, &t, fk_err(FK_ECORRUPT, "file %s: missing max_token_length",
                                      path));
    t->max_len = read_i32le(b4);
    if (t->max_len <= 0 || t->max_len > 4096)
        return tok_fail(f, &t, fk_err(FK_ECORRUPT, "file %s: max_token_length %d: expected "
                                      "1..4096", path, t->max_len));
    int cap = vocab_size;
    t->piece = calloc((size_t)cap, sizeof *t->piece);
    t->len = calloc((size_t)cap, sizeof *t->len);
    t->score = calloc((size_t)cap, sizeof *t->score);
    if (!t->piece || !t->len || !t->score)
        return tok_fail(f, &t, fk_err(FK_ENOMEM, "file %s: out of memory", path));
    for (;;) {
        size_t got = fread(b4, 1, 8, f);
        if (got == 0 && feof(f))
            break;
        if (got != 8)
            return tok_fail(f, &t, fk_err(FK_ECORRUPT, "file %s: token %d: truncated score/"
                                          "length record", path, t->n));
        if (t->n == cap) {
            /* Count the remaining records only to report the true size. */
            int extra = 1;
            int l = read_i32le(b4 + 4);
            while (l >= 0 && l <= t->max_len && fseek(f, l, SEEK_CUR) == 0
                   && fread(b4, 1, 8, f) == 8) {
                extra++;
                l = read_i32le(b4 + 4);
            }
            return tok_fail(f, &t, fk_err(FK_EINVAL, "file %s: tokenizer has at least %d "
                                          "tokens but the model's vocab_size is %d", path,
                                          cap + extra, vocab_size));
        }
        float sc;
        memcpy(&sc, b4, sizeof sc);
        int l = read_i32le(b4 + 4);
        if (l < 0 || l > t->max_len)
            return tok_fail(f, &t, fk_err(FK_ECORRUPT, "file %s: token %d: length %d: "
                                          "expected 0..%d (max_token_length)", path, t->n, l,
                                          t->max_len));
        if (!isfinite(sc))
            return tok_fail(f, &t, fk_err(FK_ECORRUPT, "file %s: token %d: score is not "
                                          "finite", path, t->n));
        char *p = malloc((size_t)l + 1);
        if (!p)
            return tok_fail(f, &t, fk_err(FK_ENOMEM, "file %s: out of memory", path));
        t->piece[t->n] = p;
        if (fread(p, 1, (size_t)l, f) != (size_t)l)
            return tok_fail(f, &t, fk_err(FK_ECORRUPT, "file %s: token %d: truncated piece "
                                          "of %d bytes", path, t->n, l));
        p[l] = '\0';
        t->len[t->n] = l;
        t->score[t->n] = sc;
        t->n++;
    }
    fclose(f);
    f = NULL;
    if (t->n != vocab_size)
        return tok_fail(f, &t, fk_err(FK_EINVAL, "file %s: tokenizer has %d tokens but the "
                                      "model's vocab_size is %d", path, t->n, vocab_size));
    t->byte_of = malloc((size_t)t->n * sizeof *t->byte_of);
    t->sorted = malloc((size_t)t->n * sizeof *t->sorted);
    if (!t->byte_of || !t->sorted)
        return tok_fail(f, &t, fk_err(FK_ENOMEM, "file %s: out of memory", path));
    struct piece_ref *refs = malloc((size_t)t->n * sizeof *refs);
    if (!refs)
        return tok_fail(f, &t, fk_err(FK_ENOMEM, "file %s: out of memory", path));
    for (int i = 0; i < t->n; i++)
        refs[i] = (struct piece_ref){t->piece[i], t->len[i], i};
    qsort(refs, (size_t)t->n, sizeof *refs, sort_cmp);
    for (int i = 0; i < t->n; i++)
        t->sorted[i] = refs[i].id;
    free(refs);
    t->bos = lookup(t, "\n<s>\n", 5);
    t->eos = lookup(t, "\n</s>\n", 6);
    if (t->bos < 0)
        return tok_fail(f, &t, fk_err(FK_ECORRUPT, "file %s: no BOS piece \"\\n<s>\\n\" in "
                                      "the vocabulary", path));
    t->byte_level = 1;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_piece[b] = lookup(t, &c, 1);
        t->hex_piece[b] = -1;
        if (t->byte_piece[b] < 0)
            t->byte_level = 0;
        t->bytes[b][0] = c;
        t->bytes[b][1] = '\0';
    }
    for (int i = 0; i < t->n; i++) {
        t->byte_of[i] = hex_byte(t->piece[i], t->len[i]);
        if (t->byte_of[i] >= 0 && t->hex_piece[t->byte_of[i]] < 0)
            t->hex_piece[t->byte_of[i]] = i;
    }
    *out = t;
    return FK_OK;
}

void fk_llama2c_tokenizer_free(struct fk_llama2c_tokenizer **t)
{
    if (!t || !*t)
        return;
    struct fk_llama2c_tokenizer *p = *t;
    if (p->piece)
        for (int i = 0; i < p->n; i++)
            free(p->piece[i]);
    free(p->piece);
    free(p->len);
    free(p->score);
    free(p->byte_of);
    free(p->sorted);
    free(p);
    *t = NULL;
}

int fk_llama2c_tokenizer_bos(const struct fk_llama2c_tokenizer *t) { return t->bos; }
int fk_llama2c_tokenizer_eos(const struct fk_llama2c_tokenizer *t) { return t->eos; }
int fk_llama2c_tokenizer_byte_level(const struct fk_llama2c_tokenizer *t)
{
    return t->byte_level;
}
int fk_llama2c_tokenizer_size(const struct fk_llama2c_tokenizer *t) { return t->n; }

/* Bytes of the UTF-8 sequence starting at s[0] (1 for invalid or stray bytes). */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    size_t n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3
               : (s[0] & 0xF8) == 0xF0 ? 4 : 1;
    if (n > avail)
        return 1;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 1;
    return n;
}

int fk_llama2c_encode(const struct fk_llama2c_tokenizer *t, const char *text, int add_bos,
                      int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    size_t tl = strlen(text);
    if (tl > (size_t)(1 << 28))
        return fk_err(FK_EINVAL, "prompt of %zu bytes is too long to encode", tl);
    int32_t *v = malloc((tl + 3) * sizeof *v);
    char *scratch = malloc(2 * (size_t)t->max_len + 1);
    if (!v || !scratch) {
        free(v);
        free(scratch);
        return fk_err(FK_ENOMEM, "encoding a prompt of %zu bytes: out of memory", tl);
    }
    int k = 0;
    if (add_bos)
        v[k++] = t->bos;
    if (tl > 0 && !t->byte_level) {
        int sp = lookup(t, " ", 1);
        if (sp >= 0)
            v[k++] = sp;
    }
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < tl;) {
        size_t cl = utf8_len(s + i, tl - i);
        int id = lookup(t, text + i, (int)cl);
        if (id >= 0) {
            v[k++] = id;
        } else {
            for (size_t j = 0; j < cl; j++) {
                int b = s[i + j];
                id = t->hex_piece[b] >= 0 ? t->hex_piece[b] : t->byte_piece[b];
                if (id < 0) {
                    free(v);
                    free(scratch);
                    return fk_err(FK_EINVAL, "prompt byte offset %zu: character \"%.*s\" "
                                  "(byte 0x%02X) is not in the vocabulary and the vocabulary "
                                  "has no byte tokens", i, (int)cl, text + i, (unsigned)b);
                }
                v[k++] = id;
            }
        }
        i += cl;
    }
    /* Greedy merges: the adjacent pair whose concatenation is the best-scoring piece. */
    for (;;) {
        float best = -INFINITY;
        int best_id = -1, best_at = -1;
        for (int i = 0; i + 1 < k; i++) {
            int la = t->len[v[i]], lb = t->len[v[i + 1]];
            memcpy(scratch, t->piece[v[i]], (size_t)la);
            memcpy(scratch + la, t->piece[v[i + 1]], (size_t)lb);
            int id = la + lb <= t->max_len ? lookup(t, scratch, la + lb) : -1;
            if (id >= 0 && t->score[id] > best) {
                best = t->score[id];
                best_id = id;
                best_at = i;
            }
        }
        if (best_at < 0)
            break;
        v[best_at] = best_id;
        memmove(v + best_at + 1, v + best_at + 2, (size_t)(k - best_at - 2) * sizeof *v);
        k--;
    }
    free(scratch);
    *ids = v;
    *n = k;
    return FK_OK;
}

int fk_llama2c_decode(const struct fk_llama2c_tokenizer *t, int prev, int id, const char **s,
                      size_t *len)
{
    if (id < 0 || id >= t->n)
        return fk_err(FK_EINVAL, "token id %d outside the vocabulary [0, %d)", id, t->n);
    if (t->byte_of[id] >= 0) {
        *s = t->bytes[t->byte_of[id]];
        *len = 1;
        return FK_OK;
    }
    const char *p = t->piece[id];
    size_t n = (size_t)t->len[id];
    if (prev == t->bos && !t->byte_level && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    *s = p;
    *len = n;
    return FK_OK;
}

/* ---------------------------------------------------------------- forward ---- */

struct fk_llama2c_run {
    const struct fk_llama2c_model *m; /* weights (not owned) */
    int n_fed;                        /* positions held in the caches */
    float *kc;                        /* [L, seq_len, kv_dim] post-RoPE keys */
    float *vc;                        /* [L, seq_len, kv_dim] values */
    float *qc;                        /* [L, seq_len, dim] post-RoPE queries */
    double *rope_cos;                 /* [seq_len, head_dim/2] cos(pos * freq_i) */
    double *rope_sin;                 /* [seq_len, head_dim/2] sin(pos * freq_i) */
    float *x;                         /* [dim] residual stream */
    float *xb;                        /* [dim] normed input / attention output */
    float *xb2;                       /* [dim] projection output */
    float *hb;                        /* [hidden] w1 x, then silu(w1 x) * w3 x */
    float *hb2;                       /* [hidden] w3 x */
    float *att;                       /* [seq_len] attention scores */
    float *logits;                    /* [vocab] */
    struct fk_llama2c_tap tap;        /* optional copies of attention outputs / weights */
};

int fk_llama2c_run_create(const struct fk_llama2c_model *m, struct fk_llama2c_run **out)
{
    *out = NULL;
    const struct fk_llama2c_config *c = &m->cfg;
    struct fk_llama2c_run *r = calloc(1, sizeof *r);
    if (!r)
        return fk_err(FK_ENOMEM, "model %s: out of memory for a run", m->path);
    size_t L = (size_t)c->n_layers, S = (size_t)c->seq_len, half = (size_t)c->head_dim / 2;
    r->m = m;
    r->kc = malloc(L * S * (size_t)c->kv_dim * sizeof(float));
    r->vc = malloc(L * S * (size_t)c->kv_dim * sizeof(float));
    r->qc = malloc(L * S * (size_t)c->dim * sizeof(float));
    r->rope_cos = malloc(S * half * sizeof(double));
    r->rope_sin = malloc(S * half * sizeof(double));
    r->x = malloc((size_t)c->dim * sizeof(float));
    r->xb = malloc((size_t)c->dim * sizeof(float));
    r->xb2 = malloc((size_t)c->dim * sizeof(float));
    r->hb = malloc((size_t)c->hidden_dim * sizeof(float));
    r->hb2 = malloc((size_t)c->hidden_dim * sizeof(float));
    r->att = malloc(S * sizeof(float));
    r->logits = malloc((size_t)c->vocab_size * sizeof(float));
    if (!r->kc || !r->vc || !r->qc || !r->rope_cos || !r->rope_sin || !r->x || !r->xb
        || !r->xb2 || !r->hb || !r->hb2 || !r->att || !r->logits) {
        fk_llama2c_run_free(&r);
        return fk_err(FK_ENOMEM, "model %s: out of memory for the KV cache", m->path);
    }
    for (size_t p = 0; p < S; p++) {
        for (size_t i = 0; i < half; i++) {
            double freq = pow(ROPE_THETA, -(2.0 * (double)i) / (double)c->head_dim);
            double ang = (double)p * freq;
            /* the checkpoint's own tables unless they are the default ones */
            r->rope_cos[p * half + i] = m->rope_default ? cos(ang) : m->freq_re[p * half + i];
            r->rope_sin[p * half + i] = m->rope_default ? sin(ang) : m->freq_im[p * half + i];
        }
    }
    *out = r;
    return FK_OK;
}

void fk_llama2c_run_free(struct fk_llama2c_run **r)
{
    if (!r || !*r)
        return;
    struct fk_llama2c_run *p = *r;
    free(p->kc);
    free(p->vc);
    free(p->qc);
    free(p->rope_cos);
    free(p->rope_sin);
    free(p->x);
    free(p->xb);
    free(p->xb2);
    free(p->hb);
    free(p->hb2);
    free(p->att);
    free(p->logits);
    free(p);
    *r = NULL;
}

int fk_llama2c_run_len(const struct fk_llama2c_run *r) { return r->n_fed; }

const struct fk_llama2c_model *fk_llama2c_run_model(const struct fk_llama2c_run *r)
{
    return r->m;
}

static void rmsnorm(float *out, const float *x, const float *w, int n)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + RMS_EPS));
    for (int i = 0; i < n; i++)
        out[i] = w[i] * (x[i] * inv);
}

/* Rotates each head's pairs (2i, 2i+1) of vec [n_heads * head_dim] at position pos. */
static void rope(const struct fk_llama2c_run *r, float *vec, int n_heads, int pos)
{
    int hd = r->m->cfg.head_dim, half = hd / 2;
    const double *cs = r->rope_cos + (size_t)pos * half, *sn = r->rope_sin + (size_t)pos * half;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * hd;
        for (int i = 0; i < half; i++) {
            double a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = (float)(a * cs[i] - b * sn[i]);
            v[2 * i + 1] = (float)(a * sn[i] + b * cs[i]);
        }
    }
}

/* y[rows] = W[rows, cols] x[cols], W row-major. */
static void matvec(float *y, const float *w, const float *x, int rows, int cols)
{
    cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, w, cols, x, 1, 0.0f, y, 1);
}

/* Attention of position pos's query q [n_heads * head_dim] in layer l over the cache rows
 * 0..pos (those an eviction mask keeps), heads' outputs into out [dim]; each head's logits
 * into logit [n_heads][seq_len] (nullable). */
static void attend(struct fk_llama2c_run *r, int l, int pos, const float *q, float *out,
                   float *logit)
{
    const struct fk_llama2c_config *c = &r->m->cfg;
    int kvd = c->kv_dim, hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    size_t S = (size_t)c->seq_len, lo = (size_t)l;
    float scale = (float)(1.0 / sqrt((double)hd));
    const float *kl = r->kc + lo * S * kvd, *vl = r->vc + lo * S * kvd;
    const uint8_t *keep = r->tap.keep ? r->tap.keep[l] : NULL;
    for (int h = 0; h < c->n_heads; h++) {
        int kvh = h / group;
        /* scores[t] = q_h . k_t / sqrt(hd) for t = 0..pos */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, pos + 1, hd, scale, kl + (size_t)kvh * hd,
                    kvd, q + (size_t)h * hd, 1, 0.0f, r->att, 1);
        if (logit)
            memcpy(logit + (lo * (size_t)c->n_heads + (size_t)h) * S, r->att,
                   (size_t)(pos + 1) * sizeof(float));
        if (keep) /* rows an eviction policy dropped get no weight */
            for (int t = 0; t <= pos; t++)
                if (!keep[(size_t)kvh * r->tap.keep_stride + t])
                    r->att[t] = -INFINITY;
        float mx = r->att[0];
        for (int t = 1; t <= pos; t++)
            mx = r->att[t] > mx ? r->att[t] : mx;
        double sum = 0.0;
        for (int t = 0; t <= pos; t++) {
            r->att[t] = expf(r->att[t] - mx);
            sum += r->att[t];
        }
        float inv = (float)(1.0 / sum);
        for (int t = 0; t <= pos; t++)
            r->att[t] *= inv;
        /* out_h = sum_t att[t] v_t */
        cblas_sgemv(CblasRowMajor, CblasTrans, pos + 1, hd, 1.0f, vl + (size_t)kvh * hd, kvd,
                    r->att, 1, 0.0f, out + (size_t)h * hd, 1);
    }
}

int fk_llama2c_forward(struct fk_llama2c_run *r, int token, int pos, const float **logits)
{
    const struct fk_llama2c_model *m = r->m;
    const struct fk_llama2c_config *c = &m->cfg;
    if (token < 0 || token >= c->vocab_size)
        return fk_err(FK_EINVAL, "model %s: token id %d outside [0, %d)", m->path, token,
                      c->vocab_size);
    if (pos < 0 || pos >= c->seq_len || pos > r->n_fed)
        return fk_err(FK_EINVAL, "model %s: position %d: expected 0..%d (tokens fed so far, "
                      "below seq_len %d)", m->path, pos, r->n_fed < c->seq_len - 1 ? r->n_fed
                      : c->seq_len - 1, c->seq_len);
    int d = c->dim, kvd = c->kv_dim, hid = c->hidden_dim;
    size_t S = (size_t)c->seq_len;
    memcpy(r->x, m->emb + (size_t)token * d, (size_t)d * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        size_t lo = (size_t)l;
        float *kl = r->kc + lo * S * kvd, *vl = r->vc + lo * S * kvd;
        float *q = r->qc + (lo * S + (size_t)pos) * d;
        float *k = kl + (size_t)pos * kvd, *v = vl + (size_t)pos * kvd;
        rmsnorm(r->xb, r->x, m->rms_att + lo * d, d);
        matvec(q, m->wq + lo * d * d, r->xb, d, d);
        matvec(k, m->wk + lo * kvd * d, r->xb, kvd, d);
        matvec(v, m->wv + lo * kvd * d, r->xb, kvd, d);
        rope(r, q, c->n_heads, pos);
        rope(r, k, c->n_kv_heads, pos);
        if (r->tap.pre_attention) {
            int rc = r->tap.pre_attention(r->tap.ctx, l, pos, q);
            if (rc < 0)
                return rc;
        }
        attend(r, l, pos, q, r->xb, r->tap.att_logit);
        if (r->tap.att_out)
            memcpy(r->tap.att_out + lo * d, r->xb, (size_t)d * sizeof(float));
        matvec(r->xb2, m->wo + lo * d * d, r->xb, d, d);
        for (int i = 0; i < d; i++)
            r->x[i] += r->xb2[i];
        rmsnorm(r->xb, r->x, m->rms_ffn + lo * d, d);
        matvec(r->hb, m->w1 + lo * hid * d, r->xb, hid, d);
        matvec(r->hb2, m->w3 + lo * hid * d, r->xb, hid, d);
        for (int i = 0; i < hid; i++) {
            float a = r->hb[i];
            r->hb[i] = a / (1.0f + expf(-a)) * r->hb2[i];
        }
        matvec(r->xb2, m->w2 + lo * d * hid, r->hb, d, hid);
        for (int i = 0; i < d; i++)
            r->x[i] += r->xb2[i];
    }
    rmsnorm(r->xb, r->x, m->rms_final, d);
    matvec(r->logits, m->wcls, r->xb, c->vocab_size, d);
    r->n_fed = pos + 1;
    if (logits)
        *logits = r->logits;
    return FK_OK;
}

/* Y[n][rows] = X[n][cols] W[rows, cols]^T: one read of W for the n rows. */
static void matmat(float *y, const float *w, const float *x, int n, int rows, int cols)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, cols, 1.0f, x, cols, w, cols,
                0.0f, y, rows);
}

int fk_llama2c_forward_block(struct fk_llama2c_run *r, const int32_t *tokens, int n, int pos0,
                             float *logits, float *att_out, float *att_logit)
{
    const struct fk_llama2c_model *m = r->m;
    const struct fk_llama2c_config *c = &m->cfg;
    if (r->tap.pre_attention || r->tap.keep)
        return fk_err(FK_EINVAL, "model %s: a block forward cannot run a per-position "
                      "attention hook or eviction mask", m->path);
    if (n < 1 || pos0 < 0 || pos0 > r->n_fed || pos0 + n > c->seq_len)
        return fk_err(FK_EINVAL, "model %s: block of %d positions from %d: expected n >= 1, "
                      "the first position at most %d (tokens fed) and the last below seq_len "
                      "%d", m->path, n, pos0, r->n_fed, c->seq_len);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return fk_err(FK_EINVAL, "model %s: token id %d (block position %d) outside "
                          "[0, %d)", m->path, tokens[i], pos0 + i, c->vocab_size);
    size_t d = (size_t)c->dim, kvd = (size_t)c->kv_dim, hid = (size_t)c->hidden_dim;
    size_t S = (size_t)c->seq_len, L = (size_t)c->n_layers, N = (size_t)n;
    float *x = malloc(N * d * sizeof(float)), *xb = malloc(N * d * sizeof(float));
    float *xb2 = malloc(N * d * sizeof(float)), *hb = malloc(N * hid * sizeof(float));
    float *hb2 = malloc(N * hid * sizeof(float));
    if (!x || !xb || !xb2 || !hb || !hb2) {
        free(x), free(xb), free(xb2), free(hb), free(hb2);
        return fk_err(FK_ENOMEM, "model %s: out of memory for a block of %d positions",
                      m->path, n);
    }
    for (size_t i = 0; i < N; i++)
        memcpy(x + i * d, m->emb + (size_t)tokens[i] * d, d * sizeof(float));
    for (size_t l = 0; l < L; l++) {
        float *q = r->qc + (l * S + (size_t)pos0) * d;
        float *k = r->kc + (l * S + (size_t)pos0) * kvd, *v = r->vc + (l * S + (size_t)pos0) * kvd;
        for (size_t i = 0; i < N; i++)
            rmsnorm(xb + i * d, x + i * d, m->rms_att + l * d, (int)d);
        matmat(q, m->wq + l * d * d, xb, n, (int)d, (int)d);
        matmat(k, m->wk + l * kvd * d, xb, n, (int)kvd, (int)d);
        matmat(v, m->wv + l * kvd * d, xb, n, (int)kvd, (int)d);
        for (int i = 0; i < n; i++) {
            rope(r, q + (size_t)i * d, c->n_heads, pos0 + i);
            rope(r, k + (size_t)i * kvd, c->n_kv_heads, pos0 + i);
        }
        /* position pos0 + i reads rows 0..pos0 + i: the cache before the block, then the
         * block's own exact rows up to itself (causal) */
        for (int i = 0; i < n; i++) {
            float *o = xb + (size_t)i * d;
            attend(r, (int)l, pos0 + i, q + (size_t)i * d, o,
                   att_logit ? att_logit + (size_t)i * L * c->n_heads * S : NULL);
            if (att_out)
                memcpy(att_out + ((size_t)i * L + l) * d, o, d * sizeof(float));
        }
        matmat(xb2, m->wo + l * d * d, xb, n, (int)d, (int)d);
        for (size_t i = 0; i < N * d; i++)
            x[i] += xb2[i];
        for (size_t i = 0; i < N; i++)
            rmsnorm(xb + i * d, x + i * d, m->rms_ffn + l * d, (int)d);
        matmat(hb, m->w1 + l * hid * d, xb, n, (int)hid, (int)d);
        matmat(hb2, m->w3 + l * hid * d, xb, n, (int)hid, (int)d);
        for (size_t i = 0; i < N * hid; i++) {
            float a = hb[i];
            hb[i] = a / (1.0f + expf(-a)) * hb2[i];
        }
        matmat(xb2, m->w2 + l * d * hid, hb, n, (int)d, (int)hid);
        for (size_t i = 0; i < N * d; i++)
            x[i] += xb2[i];
    }
    for (size_t i = 0; i < N; i++)
        rmsnorm(xb + i * d, x + i * d, m->rms_final, (int)d);
    matmat(logits, m->wcls, xb, n, c->vocab_size, (int)d);
    r->n_fed = pos0 + n;
    free(x), free(xb), free(xb2), free(hb), free(hb2);
    return FK_OK;
}

float *fk_llama2c_kv_row(struct fk_llama2c_run *r, int layer, enum fk_kind kind, int pos)
{
    const struct fk_llama2c_config *c = &r->m->cfg;
    if (layer < 0 || layer >= c->n_layers || pos < 0 || pos >= c->seq_len
        || (kind != FK_KIND_K && kind != FK_KIND_V))
        return NULL;
    float *base = kind == FK_KIND_K ? r->kc : r->vc;
    return base + ((size_t)layer * (size_t)c->seq_len + (size_t)pos) * (size_t)c->kv_dim;
}

void fk_llama2c_set_tap(struct fk_llama2c_run *r, const struct fk_llama2c_tap *tap)
{
    if (tap)
        r->tap = *tap;
    else
        memset(&r->tap, 0, sizeof r->tap);
}

int fk_llama2c_gather(const struct fk_llama2c_run *r, int layer, enum fk_kind kind, int n,
                      float *dst)
{
    const struct fk_llama2c_config *c = &r->m->cfg;
    if (layer < 0 || layer >= c->n_layers || n < 0 || n > r->n_fed)
        return fk_err(FK_EINVAL, "model %s: gather layer %d, %d positions: expected layer "
                      "< %d and at most %d positions", r->m->path, layer, n, c->n_layers,
                      r->n_fed);
    size_t S = (size_t)c->seq_len, hd = (size_t)c->head_dim;
    int heads = kind == FK_KIND_Q ? c->n_heads : c->n_kv_heads;
    size_t row = kind == FK_KIND_Q ? (size_t)c->dim : (size_t)c->kv_dim;
    const float *src = kind == FK_KIND_K ? r->kc : kind == FK_KIND_V ? r->vc : r->qc;
    src += (size_t)layer * S * row;
    for (int h = 0; h < heads; h++)
        for (int t = 0; t < n; t++)
            memcpy(dst + ((size_t)h * n + t) * hd, src + (size_t)t * row + h * hd,
                   hd * sizeof(float));
    return FK_OK;
}

/* ---------------------------------------------------------------- sampling ---- */

static int prob_desc(const void *a, const void *b)
{
    const struct fk_llama2c_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

int fk_llama2c_sample(const float *logits, int n, double temperature, double top_p, double u,
                      struct fk_llama2c_cand *work)
{
    if (n <= 0 || !(temperature >= 0.0) || !(top_p > 0.0 && top_p <= 1.0) || !(u >= 0.0)
        || !(u < 1.0))
        return fk_err(FK_EINVAL, "sampling: n %d, temperature %g, top_p %g, u %g: expected "
                      "n > 0, temperature >= 0, top_p in (0, 1], u in [0, 1)", n, temperature,
                      top_p, u);
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temperature == 0.0)
        return best;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        work[i].p = (float)exp(((double)logits[i] - logits[best]) / temperature);
        work[i].id = i;
        sum += work[i].p;
    }
    for (int i = 0; i < n; i++)
        work[i].p = (float)(work[i].p / sum);
    /* Candidates in descending probability (ids ascending on ties); keep the smallest
     * prefix whose mass reaches top_p, then draw u within it. */
    qsort(work, (size_t)n, sizeof *work, prob_desc);
    int m = n;
    double mass = 0.0;
    if (top_p < 1.0) {
        for (m = 0; m < n;) {
            mass += work[m++].p;
            if (mass >= top_p)
                break;
        }
    } else {
        for (int i = 0; i < n; i++)
            mass += work[i].p;
    }
    double target = u * mass, acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += work[i].p;
        if (target < acc)
            return work[i].id;
    }
    return work[m - 1].id;
}

/* ---------------------------------------------------------------- trace export ---- */

int fk_llama2c_write_trace(const struct fk_llama2c_run *r, const struct fk_llama2c_gen *g,
                           const char *path, enum fk_encoding enc,
                           const struct fk_llama2c_trace_meta *meta)
{
    const struct fk_llama2c_config *c = &r->m->cfg;
    int T = g->n_tokens;
    if (T <= 0 || T > r->n_fed || g->prompt_len <= 0 || g->prompt_len > T)
        return fk_err(FK_EINVAL, "trace %s: %d tokens (%d prompt) but the run holds %d",
                      path, T, g->prompt_len, r->n_fed);
    struct fk_trace_info info;
    memset(&info, 0, sizeof info);
    snprintf(info.model_id, sizeof info.model_id, "%s", meta->model_id);
    snprintf(info.source, sizeof info.source, "llama2c");
    info.n_layers = c->n_layers;
    info.n_q_heads = c->n_heads;
    info.n_kv_heads = c->n_kv_heads;
    info.head_dim = c->head_dim;
    info.n_tokens = T;
    info.prompt_len = g->prompt_len;
    info.keys_post_rope = 1;
    info.rope_theta = r->m->rope_default ? ROPE_THETA : 0.0;
    /* rope(): pairs (2i, 2i+1), f_i = theta^(-2i/d), no scaling; other tables (another
     * base, a scaling) are not described by a theta: the trace leaves its RoPE out */
    info.has_rope = r->m->rope_default;
    info.rope = (struct fk_rope){.theta = ROPE_THETA, .layout = FK_ROPE_INTERLEAVED,
                                 .type = FK_ROPE_DEFAULT};
    info.has_queries = 1;
    info.n_queries = T;
    size_t per = (size_t)T * (size_t)c->dim; /* largest layer array: queries */
    float *buf = malloc(per * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    uint8_t *phase = malloc((size_t)T);
    if (!buf || !pos || !phase) {
        free(buf);
        free(pos);
        free(phase);
        return fk_err(FK_ENOMEM, "trace %s: out of memory", path);
    }
    for (int t = 0; t < T; t++) {
        pos[t] = t;
        phase[t] = t < g->prompt_len ? 0 : 1;
    }
    char sampling[160];
    const struct fk_llama2c_sampling *s = meta->sampling;
    if (!s || s->temperature == 0.0)
        snprintf(sampling, sizeof sampling, "greedy");
    else
        snprintf(sampling, sizeof sampling, "temperature=%g top_p=%g seed=%lu rng=mt19937",
                 s->temperature, s->top_p, s->seed);
    char nb[32];
    struct fk_trace_writer *w = NULL;
    int rc = fk_trace_create(path, &info, enc, &w);
    if (rc >= 0 && meta->model_sha256)
        rc = fk_trace_put_attr(w, "model_sha256", meta->model_sha256);
    if (rc >= 0 && meta->tokenizer_sha256)
        rc = fk_trace_put_attr(w, "tokenizer_sha256", meta->tokenizer_sha256);
    if (rc >= 0)
        rc = fk_trace_put_attr(w, "prompt", meta->prompt ? meta->prompt : "");
    if (rc >= 0)
        rc = fk_trace_put_attr(w, "sampling", sampling);
    if (rc >= 0 && meta->generator)
        rc = fk_trace_put_attr(w, "generator", meta->generator);
    if (rc >= 0)
        rc = fk_trace_put_attr(w, "text", g->text ? g->text : "");
    snprintf(nb, sizeof nb, "%d", T - g->prompt_len);
    if (rc >= 0)
        rc = fk_trace_put_attr(w, "generated_tokens", nb);
    if (rc >= 0)
        rc = fk_trace_put_attr(w, "stopped_at_eos", g->stopped_at_eos ? "1" : "0");
    if (rc >= 0)
        rc = fk_trace_write_tokens(w, pos, phase, g->ids);
    for (int l = 0; rc >= 0 && l < c->n_layers; l++) {
        for (int k = 0; rc >= 0 && k < 3; k++) {
            enum fk_kind kind = (enum fk_kind)k;
            rc = fk_llama2c_gather(r, l, kind, T, buf);
            if (rc >= 0)
                rc = fk_trace_write_layer(w, l, kind, buf, kind == FK_KIND_Q ? pos : NULL);
        }
    }
    if (rc >= 0)
        rc = fk_trace_finish(&w);
    else
        fk_trace_abort(&w);
    free(buf);
    free(pos);
    free(phase);
    return rc;
}
