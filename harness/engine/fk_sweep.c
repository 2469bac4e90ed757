/* SPDX-License-Identifier: MIT
 * Sweep resolution (see fk_sweep.h).
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "engine/fk_sweep.h"

#include <dirent.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "common/fk_toml.h"
#include "core/fk_registry.h"
#include "engine/fk_schedule.h"
#include "formats/fk_dict.h"
#include "formats/fk_trace.h"

#define FK_HARNESS_VERSION "fadkv-bench-0.1"

const char *fk_sweep_preset_dir(void)
{
    const char *env = getenv("FADKV_PRESET_DIR");
    return env && *env ? env : FK_PRESET_DIR;
}

/* ---- helpers ---------------------------------------------------------------------------- */

static char *xstrdup(const char *s)
{
    char *d = s ? strdup(s) : NULL;
    return d;
}

/* Collapses "." and "seg/.." segments of a path in place (lexically). */
static void path_normalise(char *path)
{
    int abs = path[0] == '/', n = 0;
    char *seg[PATH_MAX / 2], *save = NULL, *copy = strdup(path);
    if (!copy)
        return;
    for (char *t = strtok_r(copy, "/", &save); t && n < PATH_MAX / 2;
         t = strtok_r(NULL, "/", &save)) {
        if (!strcmp(t, "."))
            continue;
        if (!strcmp(t, "..") && n > 0 && strcmp(seg[n - 1], "..")) {
            n--;
            continue;
        }
        if (!strcmp(t, "..") && abs)
            continue; /* /.. is / */
        seg[n++] = t;
    }
    size_t len = 0, cap = strlen(path) + 1;
    if (abs)
        path[len++] = '/';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(path + len, cap - len, "%s%s", i ? "/" : "", seg[i]);
    if (len == 0)
        snprintf(path, cap, ".");
    path[cap - 1] = 0;
    free(copy);
}

/* THE path rule of a sweep file: a relative path (traces, dictionary, basis,
 * reconstructions, output, plugins) is relative to the folder of the config file that
 * names it; absolute paths and --set values (relative to the current directory) are kept.
 * NULL out of memory. */
char *fk_sweep_path(const struct fk_toml_value *v, const char *p)
{
    const char *base = fk_toml_origin(v);
    const char *slash = base ? strrchr(base, '/') : NULL;
    if (p[0] == '/' || !slash || !strcmp(base, "--set"))
        return xstrdup(p);
    size_t n = (size_t)(slash - base) + strlen(p) + 2;
    char *j = malloc(n);
    if (!j)
        return NULL;
    snprintf(j, n, "%.*s/%s", (int)(slash - base), base, p);
    path_normalise(j);
    return j;
}

/* " (relative to ...)" for a message about path p of value v. */
static void path_rule_note(const struct fk_toml_value *v, const char *p, char *buf, size_t cap)
{
    char cwd[PATH_MAX];
    const char *base = fk_toml_origin(v);
    if (p[0] == '/')
        buf[0] = 0;
    else if (base && strcmp(base, "--set") && strrchr(base, '/'))
        snprintf(buf, cap, " (relative paths in a sweep file resolve against the folder of "
                 "that file, here %.*s)", (int)(strrchr(base, '/') - base), base);
    else
        snprintf(buf, cap, " (relative to the current directory, %s)",
                 getcwd(cwd, sizeof cwd) ? cwd : "?");
}

static int where(const struct fk_toml_value *v, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s:%d:%d", fk_toml_origin(v), fk_toml_line(v), fk_toml_col(v));
    return 0;
}

static int cfg_err(const struct fk_toml_value *v, const char *fmt, const char *a,
                   const char *b)
{
    char w[512];
    where(v, w, sizeof w);
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    return fk_err(FK_ECONFIG, "%s: %s", w, msg);
}

static int entry_err(const struct fk_toml_entry *e, const char *msg)
{
    /* a value that --set replaced is blamed on --set, not on the file's line of the key */
    const char *vo = e->value ? fk_toml_origin(e->value) : NULL;
    if (vo && strcmp(vo, e->origin))
        return fk_err(FK_ECONFIG, "%s: key '%s' (its value comes from %s, not from %s:%d): %s",
                      vo, e->key, vo, e->origin, e->line, msg);
    return fk_err(FK_ECONFIG, "%s:%d:%d: key '%s': %s", e->origin, e->line, e->col, e->key, msg);
}

static int get_str(const struct fk_toml_value *v, const char **out)
{
    size_t len;
    return fk_toml_get_string(v, out, &len);
}

static int get_int_range(const struct fk_toml_entry *e, long lo, long hi, long *out)
{
    int64_t v;
    FK_TRY(fk_toml_get_int(e->value, &v));
    if (v < lo || v > hi) {
        char msg[256];
        snprintf(msg, sizeof msg, "%lld is out of range [%ld, %ld]", (long long)v, lo, hi);
        return entry_err(e, msg);
    }
    *out = (long)v;
    return FK_OK;
}

/* Sets one codec option from a TOML scalar, with FILE:LINE:COL context on failure. */
static int set_option(const struct fk_codec_ops *ops, void *opts, const char *key,
                      const struct fk_toml_value *v, const char *ctx_origin, int line, int col)
{
    const struct fk_option *o = fk_codec_option(ops, key);
    char w[600];
    snprintf(w, sizeof w, "%s:%d:%d", ctx_origin, line, col);
    if (!o) {
        char allowed[1024] = "";
        for (const struct fk_option *p = ops->options; p->name; p++) {
            size_t n = strlen(allowed);
            snprintf(allowed + n, sizeof allowed - n, "%s%s", n ? ", " : "", p->name);
        }
        return fk_err(FK_ECONFIG, "%s: unknown option '%s' for codec '%s' (its options: %s)", w,
                      key, ops->name, allowed);
    }
    int rc;
    enum fk_toml_type t = fk_toml_type(v);
    if (o->type == FK_OPT_ENUM) {
        const char *s;
        if (t != FK_TOML_STRING)
            return fk_err(FK_ECONFIG, "%s: option '%s' of codec '%s' takes a string, got %s", w,
                          key, ops->name, fk_toml_type_name(t));
        get_str(v, &s);
        rc = fk_opts_set_enum(ops, opts, o, s);
    } else if (o->type == FK_OPT_BOOL) {
        int b;
        if (t != FK_TOML_BOOL)
            return fk_err(FK_ECONFIG, "%s: option '%s' of codec '%s' takes true or false, got %s",
                          w, key, ops->name, fk_toml_type_name(t));
        fk_toml_get_bool(v, &b);
        rc = fk_opts_set(ops, opts, o, b);
    } else {
        double d;
        if (o->type == FK_OPT_INT && t != FK_TOML_INT)
            return fk_err(FK_ECONFIG, "%s: option '%s' of codec '%s' takes an integer, got %s",
                          w, key, ops->name, fk_toml_type_name(t));
        if (t != FK_TOML_INT && t != FK_TOML_FLOAT)
            return fk_err(FK_ECONFIG, "%s: option '%s' of codec '%s' takes a number, got %s", w,
                          key, ops->name, fk_toml_type_name(t));
        if (t == FK_TOML_INT) {
            int64_t i;
            fk_toml_get_int(v, &i);
            d = (double)i;
        } else {
            fk_toml_get_float(v, &d);
        }
        rc = fk_opts_set(ops, opts, o, d);
    }
    if (rc < 0)
        return fk_err_context(rc, "%s", w);
    return FK_OK;
}

static int is_known_option(const char *key);

/* [sweep] budgets = [2, 5, 8]: the equal-budget table's budgets in bits per element (1 to 8
 * numbers in (0, 64]), kept as the text "2,5,8" that plot reads from provenance.json. */
static int get_budgets(const struct fk_toml_entry *e, char **out)
{
    size_t n = fk_toml_type(e->value) == FK_TOML_ARRAY ? fk_toml_array_len(e->value) : 0;
    if (n < 1 || n > 8)
        return entry_err(e, "expected an array of 1 to 8 budgets in bits per element, e.g. "
                            "[2, 5, 8]");
    char buf[256];
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        double b;
        if (fk_toml_get_float(fk_toml_array_at(e->value, i), &b) < 0) {
            fk_err_clear();
            return entry_err(e, "a budget is a number of bits per element");
        }
        if (!(b > 0 && b <= 64))
            return entry_err(e, "a budget is in (0, 64] bits per element");
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%g", i ? "," : "", b);
    }
    free(*out);
    *out = xstrdup(buf);
    return *out ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
}

/* Applies the preset `preset = "..."` (value pv) to opts: a name is the file NAME.toml of
 * the preset folder (fk_sweep_preset_dir), a value with a '/' or ending in .toml a file
 * under the path rule; the file is a flat table of option = value, and sets the options
 * the codec has (a key no codec has is an error, with its file and line). */
static int apply_preset(const struct fk_toml_value *pv, const struct fk_codec_ops *ops,
                        void *opts)
{
    const char *name;
    FK_TRY(get_str(pv, &name));
    size_t n = strlen(name);
    int is_path = strchr(name, '/') || (n > 5 && !strcmp(name + n - 5, ".toml"));
    char *path = NULL;
    if (is_path) {
        path = fk_sweep_path(pv, name);
    } else if (n > 0 && strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-_.") == n) {
        const char *dir = fk_sweep_preset_dir();
        size_t cap = strlen(dir) + n + 8;
        if ((path = malloc(cap)))
            snprintf(path, cap, "%s/%s.toml", dir, name);
    } else {
        return cfg_err(pv, "preset '%s': a preset is a name ([a-z0-9_.-], a file of %s) or a "
                           "path to a .toml file", name, fk_sweep_preset_dir());
    }
    if (!path)
        return fk_err(FK_ENOMEM, "out of memory");
    struct fk_toml_value *doc = NULL;
    int rc = access(path, R_OK) == 0 ? fk_toml_parse_file(path, &doc) : FK_EIO;
    if (rc < 0 && !doc && access(path, R_OK) != 0) {
        fk_err_clear();
        char w[600];
        where(pv, w, sizeof w);
        rc = fk_err(FK_ECONFIG, "%s: unknown preset '%s': no file %s (`fadkv-bench codecs` "
                    "lists the presets; a path to a .toml file names your own)", w, name, path);
    }
    for (size_t i = 0; rc == FK_OK && i < fk_toml_table_len(doc); i++) {
        const struct fk_toml_entry *e = fk_toml_table_at(doc, i);
        if (fk_codec_option(ops, e->key))
            rc = set_option(ops, opts, e->key, e->value, e->origin, e->line, e->col);
        else if (!is_known_option(e->key))
            rc = entry_err(e, "no codec has this option (a preset is a flat table of codec "
                              "options)");
    }
    fk_toml_free(&doc);
    free(path);
    return rc;
}

static int is_known_option(const char *key)
{
    for (int c = 0; fk_codec_at(c); c++)
        if (fk_codec_option(fk_codec_at(c), key))
            return 1;
    for (int c = 0; fk_evict_policies[c]; c++)
        if (fk_evict_option(fk_evict_policies[c], key))
            return 1;
    return 0;
}

/* A defaults table's key: an option of some codec or policy; the row rewrites' keys are
 * refused there (they belong to a [[codec]] block, where they make it a rewrite block). */
static int defaults_key_err(const struct fk_toml_entry *e)
{
    if (fk_rewrite_is_option(e->key))
        return entry_err(e, "a key of the row rewrites (merge, think): set it in a [[codec]] "
                            "block or its grid or zip, not in defaults");
    return entry_err(e, "no codec has this option (see `fadkv-bench codecs`)");
}

/* A codec composed with an eviction policy and/or the prefill's row rewrites
 * (evict/fk_rewrite.h), seen as one codec by the resolution: its options are the codec's,
 * then the policy's at `off`, then the rewrite's at `rw_off`, in one options buffer. */
struct composite {
    struct fk_codec_ops ops;     /* first: a composite is passed as its ops */
    const struct fk_codec_ops *codec;
    const struct fk_evict_ops *ev; /* or NULL */
    size_t off;
    int has_rw;                  /* the block sets a rewrite option */
    size_t rw_off;
    struct fk_option *options;
    char name[128];
};

/* The composite of ops, or NULL when ops is a registered codec. */
static const struct composite *composite_of(const struct fk_codec_ops *ops)
{
    return fk_codec_find(ops->name) == ops ? NULL : (const struct composite *)ops;
}

static int composite_init(struct composite *c, const struct fk_codec_ops *codec,
                          const struct fk_evict_ops *ev, int has_rw)
{
    size_t nc = 0, ne = 0, nr = 0;
    while (codec->options[nc].name)
        nc++;
    while (ev && ev->options[ne].name)
        ne++;
    while (has_rw && fk_rewrite_options[nr].name)
        nr++;
    memset(c, 0, sizeof *c);
    c->options = calloc(nc + ne + nr + 1, sizeof *c->options);
    if (!c->options)
        return fk_err(FK_ENOMEM, "out of memory");
    c->codec = codec;
    c->ev = ev;
    c->has_rw = has_rw;
    c->off = (codec->opts_size + 15) / 16 * 16;
    c->rw_off = c->off + (ev ? (ev->opts_size + 15) / 16 * 16 : 0);
    memcpy(c->options, codec->options, nc * sizeof *c->options);
    for (size_t i = 0; i < ne; i++) {
        c->options[nc + i] = ev->options[i];
        c->options[nc + i].offset += c->off;
    }
    for (size_t i = 0; i < nr; i++) {
        c->options[nc + ne + i] = fk_rewrite_options[i];
        c->options[nc + ne + i].offset += c->rw_off;
    }
    snprintf(c->name, sizeof c->name, "%s+%s", codec->name, ev ? ev->name : "rewrite");
    c->ops = *codec;
    c->ops.name = c->name;
    c->ops.options = c->options;
    c->ops.opts_size = c->rw_off + (has_rw ? sizeof(struct fk_rewrite) : 0);
    return FK_OK;
}

/* ---- datasets ---------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int expand_traces(const struct fk_toml_value *arr, struct fk_dataset *ds)
{
    if (fk_toml_type(arr) == FK_TOML_STRING) {
        const char *p0;
        get_str(arr, &p0);
        char *p = fk_sweep_path(arr, p0);
        if (!p)
            return fk_err(FK_ENOMEM, "out of memory");
        glob_t g;
        int gr = glob(p, 0, NULL, &g);
        if (gr != 0 || g.gl_pathc == 0) {
            if (gr == 0)
                globfree(&g);
            char note[PATH_MAX + 128], looked[2 * PATH_MAX + 160];
            path_rule_note(arr, p0, note, sizeof note);
            snprintf(looked, sizeof looked, "%s%s", p, note);
            int rc = cfg_err(arr, "traces: '%s' matches no file: looked for %s", p0, looked);
            free(p);
            return rc;
        }
        free(p);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            char **nt = realloc(ds->traces, sizeof(char *) * (size_t)(ds->n_traces + 1));
            if (!nt) {
                globfree(&g);
                return fk_err(FK_ENOMEM, "out of memory");
            }
            ds->traces = nt;
            ds->traces[ds->n_traces++] = xstrdup(g.gl_pathv[i]);
        }
        globfree(&g);
        return FK_OK;
    }
    if (fk_toml_type(arr) != FK_TOML_ARRAY)
        return cfg_err(arr, "traces: expected a path, a glob or an array of them%s%s", "", "");
    for (size_t i = 0; i < fk_toml_array_len(arr); i++) {
        const struct fk_toml_value *e = fk_toml_array_at(arr, i);
        if (fk_toml_type(e) != FK_TOML_STRING)
            return cfg_err(e, "traces: expected a string (path or glob)%s%s", "", "");
        FK_TRY(expand_traces(e, ds));
    }
    return FK_OK;
}

static int load_dataset(const struct fk_toml_value *tab, const char *name, int is_sweep,
                        const char *output, struct fk_dataset *ds)
{
    ds->name = xstrdup(name);
    for (size_t i = 0; i < fk_toml_table_len(tab); i++) {
        const struct fk_toml_entry *e = fk_toml_table_at(tab, i);
        int model_key = 0;
        if (!is_sweep)
            FK_TRY(fk_sweep_model_key(e, ds, &model_key));
        if (model_key) {
            continue;
        } else if (!strcmp(e->key, "traces")) {
            FK_TRY(expand_traces(e->value, ds));
        } else if (!strcmp(e->key, "dictionary")) {
            const char *p;
            FK_TRY(get_str(e->value, &p));
            if (!(ds->dict = fk_sweep_path(e->value, p)))
                return fk_err(FK_ENOMEM, "out of memory");
        } else if (!strcmp(e->key, "basis")) {
            const char *p;
            FK_TRY(get_str(e->value, &p));
            if (!(ds->basis = fk_sweep_path(e->value, p)))
                return fk_err(FK_ENOMEM, "out of memory");
        } else if (!strcmp(e->key, "calibration")) {
            const char *p;
            FK_TRY(get_str(e->value, &p));
            if (!(ds->calib = fk_sweep_path(e->value, p)))
                return fk_err(FK_ENOMEM, "out of memory");
        } else if (!is_sweep && !strcmp(e->key, "head_pattern")) {
            const char *p;
            FK_TRY(get_str(e->value, &p));
            if (!(ds->head_pattern = fk_sweep_path(e->value, p)))
                return fk_err(FK_ENOMEM, "out of memory");
        } else if (!strcmp(e->key, "reconstructions")) {
            const char *p;
            FK_TRY(get_str(e->value, &p));
            if (!(ds->recon_dir = fk_sweep_path(e->value, p)))
                return fk_err(FK_ENOMEM, "out of memory");
        } else if (!is_sweep && !strcmp(e->key, "defaults")) {
            if (fk_toml_type(e->value) != FK_TOML_TABLE)
                return entry_err(e, "expected a table of codec options, e.g. { s = 4, n = 64 }");
            for (size_t j = 0; j < fk_toml_table_len(e->value); j++) {
                const struct fk_toml_entry *o = fk_toml_table_at(e->value, j);
                if (!is_known_option(o->key))
                    return defaults_key_err(o);
            }
            ds->defaults = e->value;
        } else if (!is_sweep && strcmp(e->key, "name")) {
            return entry_err(e, "unknown key in [[dataset]] (allowed: name, traces, dictionary, "
                                "basis, calibration, head_pattern, reconstructions, defaults; "
                                "model, "
                                "tokenizer, prompts, steps)");
        }
    }
    if (!is_sweep)
        FK_TRY(fk_sweep_model_finish(tab, output, ds));
    if (ds->n_traces == 0)
        return cfg_err(tab, "dataset '%s' has no traces (set traces = [\"...\"])%s", name, "");
    qsort(ds->traces, (size_t)ds->n_traces, sizeof(char *), cmp_str);
    /* drop duplicates of overlapping globs */
    int k = 0;
    for (int i = 0; i < ds->n_traces; i++) {
        if (k && !strcmp(ds->traces[k - 1], ds->traces[i])) {
            free(ds->traces[i]);
            continue;
        }
        ds->traces[k++] = ds->traces[i];
    }
    ds->n_traces = k;
    if (ds->recon_dir) { /* DIR/<trace file name>: a prototype's output for each trace */
        ds->recon = calloc((size_t)ds->n_traces, sizeof(char *));
        if (!ds->recon)
            return fk_err(FK_ENOMEM, "out of memory");
        for (int i = 0; i < ds->n_traces; i++) {
            const char *b = strrchr(ds->traces[i], '/');
            size_t n = strlen(ds->recon_dir) + strlen(b ? b + 1 : ds->traces[i]) + 2;
            if (!(ds->recon[i] = malloc(n)))
                return fk_err(FK_ENOMEM, "out of memory");
            snprintf(ds->recon[i], n, "%s/%s", ds->recon_dir, b ? b + 1 : ds->traces[i]);
        }
    }
    return FK_OK;
}

static int hash_dataset(struct fk_dataset *ds)
{
    struct fk_sha256_ctx c;
    fk_sha256_init(&c);
    char hex[65];
    for (int i = 0; !ds->model && i < ds->n_traces; i++) {
        FK_TRY(fk_sha256_file(ds->traces[i], hex));
        fk_sha256_update(&c, hex, 64);
    }
    if (ds->model) /* its traces are written later, from what this hashes */
        FK_TRY(fk_sweep_model_hash(ds, &c));
    if (ds->dict) {
        FK_TRY(fk_sha256_file(ds->dict, hex));
        fk_sha256_update(&c, hex, 64);
    }
    if (ds->basis) { /* after the dictionary: datasets without a basis keep their hash */
        FK_TRY(fk_sha256_file(ds->basis, hex));
        fk_sha256_update(&c, "basis", 5);
        fk_sha256_update(&c, hex, 64);
    }
    if (ds->head_pattern) { /* likewise: datasets without one keep their hash */
        FK_TRY(fk_sha256_file(ds->head_pattern, hex));
        fk_sha256_update(&c, "head_pattern", 12);
        fk_sha256_update(&c, hex, 64);
    }
    for (int i = 0; ds->recon && i < ds->n_traces; i++) { /* new reconstructions, new ids */
        if (fk_sha256_file(ds->recon[i], hex) < 0)
            return fk_err_context(FK_ECONFIG, "dataset '%s': reconstructions of %s (expected "
                                  "%s, a trace-shaped file of the external codec's rows)",
                                  ds->name, ds->traces[i], ds->recon[i]);
        fk_sha256_update(&c, "recon", 5);
        fk_sha256_update(&c, hex, 64);
    }
    uint8_t d[32];
    fk_sha256_final(&c, d);
    fk_sha256_hex(d, hex);
    if (!ds->calib) {
        ds->content_hash = xstrdup(hex);
        return FK_OK;
    }
    /* the calibration's hash after a '+': only the cells that read it (FK_CAP_CALIB) hash
     * it into their ids, so naming one keeps every other cell's id */
    char both[64 + 1 + 64 + 1];
    memcpy(both, hex, 64);
    both[64] = '+';
    FK_TRY(fk_sha256_file(ds->calib, both + 65));
    ds->content_hash = xstrdup(both);
    return FK_OK;
}

/* ---- cells ------------------------------------------------------------------------------ */

struct cellvec {
    struct fk_sweep_cell *v;
    int n, cap;
};

static int canon_opts(const struct fk_codec_ops *ops, const void *opts, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "codec=%s", ops->name);
    for (const struct fk_option *o = ops->options; o->name && n < cap; o++) {
        char v[64];
        fk_opts_format(opts, o, v, sizeof v);
        n += (size_t)snprintf(buf + n, cap - n, ";%s=%s", o->name, v);
    }
    if (fk_codec_plugin_sha256(ops) && n < cap) /* a changed plugin file is another cell */
        n += (size_t)snprintf(buf + n, cap - n, ";plugin_sha256=%s", fk_codec_plugin_sha256(ops));
    return n < cap ? FK_OK : fk_err(FK_ENOMEM, "canonical cell text too long");
}

/* Dataset d's head_dim (its first trace's) and dictionary N (attributes only), 0 where
 * not known (no trace yet: a model dataset; no dictionary), read once. */
static void dataset_shape(struct fk_sweep *s, int d, int *head_dim, int *n_atoms)
{
    struct fk_dataset *ds = &s->datasets[d];
    if (!ds->shape_read) {
        struct fk_trace *t;
        if (ds->n_traces > 0 && !ds->model && fk_trace_open(ds->traces[0], &t) == FK_OK) {
            ds->head_dim = fk_trace_get_info(t)->head_dim;
            fk_trace_close(&t);
        }
        if (ds->dict && fk_dict_atoms(ds->dict, &ds->n_atoms) < 0)
            ds->n_atoms = 0;
        fk_err_clear(); /* a missing file is the loader's to report, with its context */
        ds->shape_read = 1;
    }
    *head_dim = ds->head_dim;
    *n_atoms = ds->n_atoms;
}

static int push_resolved(struct fk_sweep *s, struct cellvec *cv, const struct fk_codec_ops *ops,
                         const void *opts, const struct fk_toml_value *excl, int d,
                         const struct fk_toml_value *blk);

/* Pushes the cells of one setting: the options the data decide filled in (ops->resolve:
 * the screening pool n = N / 16, ...), then checked against the dataset's head_dim and
 * dictionary N as the run checks them, so that --dry-run and --print-config refuse what the
 * run would (s > n at any N, n > N on this dictionary). */
static int push_cell(struct fk_sweep *s, struct cellvec *cv, const struct fk_codec_ops *ops,
                     const void *opts_in, const struct fk_toml_value *excl, int d,
                     const struct fk_toml_value *blk)
{
    void *opts = malloc(ops->opts_size);
    if (!opts)
        return fk_err(FK_ENOMEM, "out of memory");
    memcpy(opts, opts_in, ops->opts_size);
    int hd = 0, na = 0;
    dataset_shape(s, d, &hd, &na);
    if (!(ops->caps & FK_CAP_DICT))
        na = 0; /* a basis codec's N is its basis's components: checked when it loads */
    if (ops->resolve)
        ops->resolve(opts, hd, na);
    int rc = FK_OK;
    if (ops->check && ops->check(opts, hd, na) < 0) {
        char shape[160] = "";
        if (na > 0)
            snprintf(shape, sizeof shape, ", dictionary %s of N = %d atoms",
                     s->datasets[d].dict, na);
        rc = fk_err_context(FK_ECONFIG, "%s:%d:%d: codec '%s' (dataset '%s'%s)",
                            fk_toml_origin(blk), fk_toml_line(blk), fk_toml_col(blk), ops->name,
                            s->datasets[d].name, shape);
    }
    if (rc == FK_OK)
        rc = push_resolved(s, cv, ops, opts, excl, d, blk);
    free(opts);
    return rc;
}

/* Appends ";name=value" for every option of `options` (values in opts) to canon, which
 * holds n characters; returns the new length (>= cap when it did not fit). */
static size_t canon_append(char *canon, size_t n, size_t cap, const struct fk_option *options,
                           const void *opts)
{
    for (const struct fk_option *o = options; o->name && n < cap; o++) {
        char v[64];
        fk_opts_format(opts, o, v, sizeof v);
        n += (size_t)snprintf(canon + n, cap - n, ";%s=%s", o->name, v);
    }
    return n;
}

static int push_resolved(struct fk_sweep *s, struct cellvec *cv, const struct fk_codec_ops *ops,
                         const void *opts, const struct fk_toml_value *excl, int d,
                         const struct fk_toml_value *blk)
{
    const struct composite *cm = composite_of(ops);
    const struct fk_evict_ops *ev = cm ? cm->ev : NULL;
    const struct fk_rewrite *rw =
        cm && cm->has_rw ? (const struct fk_rewrite *)((const char *)opts + cm->rw_off) : NULL;
    if (rw && fk_rewrite_check(rw, ev, cm->codec) < 0)
        return fk_err_context(FK_ECONFIG, "%s:%d:%d: codec '%s' (dataset '%s')",
                              fk_toml_origin(blk), fk_toml_line(blk), fk_toml_col(blk),
                              cm->codec->name, s->datasets[d].name);
    if (rw && rw->merge == FK_MERGE_NONE && !(rw->think > 0))
        rw = NULL; /* rewrites that change nothing: the plain cell, its id and its numbers */
    if (ev && ev->check && ev->check((const char *)opts + cm->off) < 0)
        return fk_err_context(FK_ECONFIG, "%s:%d:%d: eviction policy '%s' (dataset '%s')",
                              fk_toml_origin(blk), fk_toml_line(blk), fk_toml_col(blk),
                              ev->name, s->datasets[d].name);
    char canon[4096];
    FK_TRY(canon_opts(cm ? cm->codec : ops, opts, canon, sizeof canon));
    if (cm) { /* ";evict=POLICY;its=options", then ";merge=...", after the codec's */
        size_t n = strlen(canon);
        if (ev)
            n += (size_t)snprintf(canon + n, sizeof canon - n, ";evict=%s", ev->name);
        if (ev)
            n = canon_append(canon, n, sizeof canon, ev->options, (const char *)opts + cm->off);
        if (rw)
            n = canon_append(canon, n, sizeof canon, fk_rewrite_options, rw);
        if (n >= sizeof canon)
            return fk_err(FK_ENOMEM, "canonical cell text too long");
    }
    {
        /* [[exclude]]: drop the cell if every key of one rule matches */
        int excluded = 0;
        for (size_t r = 0; excl && r < fk_toml_array_len(excl) && !excluded; r++) {
            const struct fk_toml_value *rule = fk_toml_array_at(excl, r);
            int all = 1;
            for (size_t i = 0; i < fk_toml_table_len(rule) && all; i++) {
                const struct fk_toml_entry *e = fk_toml_table_at(rule, i);
                if (!strcmp(e->key, "codec") || !strcmp(e->key, "dataset")) {
                    const char *v;
                    get_str(e->value, &v);
                    all = !strcmp(v, !strcmp(e->key, "codec") ? ops->name : s->datasets[d].name);
                    continue;
                }
                const struct fk_option *o = fk_codec_option(ops, e->key);
                if (!o) {
                    all = 0;
                    continue;
                }
                double want;
                if (o->type == FK_OPT_ENUM) {
                    const char *v;
                    get_str(e->value, &v);
                    all = !strcmp(v, o->choices[(int)fk_opts_get(opts, o)]);
                    continue;
                }
                if (fk_toml_type(e->value) == FK_TOML_BOOL) {
                    int b;
                    fk_toml_get_bool(e->value, &b);
                    want = b;
                } else if (fk_toml_get_float(e->value, &want) < 0) {
                    all = 0;
                    continue;
                }
                all = fk_opts_get(opts, o) == want;
            }
            excluded = all && fk_toml_table_len(rule) > 0;
        }
        if (excluded)
            return FK_OK;
        for (int rep = 0; rep < s->repeats; rep++) {
            char full[4600];
            snprintf(full, sizeof full, "%s;dataset=%s;repeat=%d", canon, s->datasets[d].name,
                     rep);
            int dup = 0;
            for (int i = 0; i < cv->n && !dup; i++)
                dup = !strcmp(cv->v[i].canon, full);
            if (dup)
                continue;
            if (cv->n == cv->cap) {
                int nc = cv->cap ? cv->cap * 2 : 16;
                struct fk_sweep_cell *nv = realloc(cv->v, sizeof *nv * (size_t)nc);
                if (!nv)
                    return fk_err(FK_ENOMEM, "out of memory");
                cv->v = nv;
                cv->cap = nc;
            }
            struct fk_sweep_cell *c = &cv->v[cv->n];
            memset(c, 0, sizeof *c);
            const struct fk_codec_ops *co = cm ? cm->codec : ops;
            c->ops = co;
            c->opts = malloc(co->opts_size);
            c->canon = xstrdup(full);
            if (ev)
                c->evict_opts = malloc(ev->opts_size);
            if (rw)
                c->rewrite = malloc(sizeof *c->rewrite);
            if (!c->opts || !c->canon || (ev && !c->evict_opts) || (rw && !c->rewrite)) {
                free(c->opts);
                free(c->canon);
                free(c->evict_opts);
                free(c->rewrite);
                return fk_err(FK_ENOMEM, "out of memory");
            }
            memcpy(c->opts, opts, co->opts_size);
            if (ev) {
                c->evict = ev;
                memcpy(c->evict_opts, (const char *)opts + cm->off, ev->opts_size);
            }
            if (rw)
                *c->rewrite = *rw;
            c->dataset = d;
            c->repeat = rep;
            cv->n++;
        }
    }
    return FK_OK;
}

/* Expands grid dimensions recursively (first key outermost, values in order). */
struct dim {
    const struct fk_toml_entry *e[16]; /* keys advanced together (one for grid, many for zip) */
    int n_keys;
    size_t len;
};

static int expand(struct fk_sweep *s, struct cellvec *cv, const struct fk_codec_ops *ops,
                  void *opts, const struct dim *dims, int n_dims, int at,
                  const struct fk_toml_value *excl, int ds, const struct fk_toml_value *blk)
{
    if (at == n_dims)
        return push_cell(s, cv, ops, opts, excl, ds, blk);
    const struct dim *d = &dims[at];
    void *saved = malloc(ops->opts_size);
    if (!saved)
        return fk_err(FK_ENOMEM, "out of memory");
    memcpy(saved, opts, ops->opts_size);
    int rc = FK_OK;
    for (size_t i = 0; i < d->len && rc == FK_OK; i++) {
        memcpy(opts, saved, ops->opts_size);
        for (int k = 0; k < d->n_keys && rc == FK_OK; k++) {
            const struct fk_toml_value *v = fk_toml_array_at(d->e[k]->value, i);
            rc = set_option(ops, opts, d->e[k]->key, v, fk_toml_origin(v), fk_toml_line(v),
                            fk_toml_col(v));
        }
        /* cross-option checks run on whole cells (push_cell): a partial combination (the
         * grid's first key set, the next ones still at their defaults) may be invalid on
         * its own */
        if (rc == FK_OK)
            rc = expand(s, cv, ops, opts, dims, n_dims, at + 1, excl, ds, blk);
    }
    memcpy(opts, saved, ops->opts_size);
    free(saved);
    return rc;
}

static int add_dims(const struct fk_toml_value *tab, int zip, struct dim *dims, int *n_dims,
                    const char *what)
{
    if (fk_toml_type(tab) != FK_TOML_TABLE)
        return cfg_err(tab, "%s: expected a table of lists, e.g. %s = { s = [4, 8] }", what,
                       what);
    struct dim *z = zip ? &dims[*n_dims] : NULL;
    if (zip) {
        memset(z, 0, sizeof *z);
        if (fk_toml_table_len(tab) == 0)
            return FK_OK;
    }
    for (size_t i = 0; i < fk_toml_table_len(tab); i++) {
        const struct fk_toml_entry *e = fk_toml_table_at(tab, i);
        if (fk_toml_type(e->value) != FK_TOML_ARRAY || fk_toml_array_len(e->value) == 0)
            return entry_err(e, zip ? "zip values must be non-empty lists"
                                    : "grid values must be non-empty lists");
        if (!is_known_option(e->key) && !fk_rewrite_is_option(e->key))
            return entry_err(e, "no codec has this option (see `fadkv-bench codecs`)");
        if (zip) {
            if (z->n_keys == 16)
                return entry_err(e, "at most 16 keys can be zipped");
            if (z->n_keys && fk_toml_array_len(e->value) != z->len) {
                char msg[160];
                snprintf(msg, sizeof msg, "zip lists must have equal lengths (%zu vs %zu)",
                         fk_toml_array_len(e->value), z->len);
                return entry_err(e, msg);
            }
            z->len = fk_toml_array_len(e->value);
            z->e[z->n_keys++] = e;
        } else {
            if (*n_dims == 63)
                return entry_err(e, "too many grid dimensions (63 at most)");
            struct dim *d = &dims[(*n_dims)++];
            memset(d, 0, sizeof *d);
            d->e[0] = e;
            d->n_keys = 1;
            d->len = fk_toml_array_len(e->value);
        }
    }
    if (zip)
        (*n_dims)++;
    return FK_OK;
}

/* Adds warning w once (the same text twice is said once). */
static int add_warning(struct fk_sweep *s, const char *w)
{
    for (int i = 0; i < s->n_warnings; i++)
        if (!strcmp(s->warnings[i], w))
            return FK_OK;
    char **nw = realloc(s->warnings, sizeof(char *) * (size_t)(s->n_warnings + 1));
    if (!nw || !(nw[s->n_warnings] = strdup(w))) {
        if (nw)
            s->warnings = nw;
        return fk_err(FK_ENOMEM, "out of memory");
    }
    s->warnings = nw;
    s->n_warnings++;
    return FK_OK;
}

/* A --set default (defaults.KEY or a dataset's) that the codec block sets itself never
 * reaches the block's cells: said once, as a warning (the caller prints them). */
static int warn_overridden(struct fk_sweep *s, const struct fk_toml_value *const layers[2],
                           const struct fk_toml_entry *be)
{
    for (int li = 0; li < 2; li++) {
        const struct fk_toml_value *v = layers[li] ? fk_toml_table_get(layers[li], be->key)
                                                   : NULL;
        if (!v || !strcmp(fk_toml_origin(v), be->origin))
            continue;
        char w[512];
        snprintf(w, sizeof w, "the %s value of '%s' is overridden by the %s at %s:%d, so it "
                 "changes none of the cells it reaches", fk_toml_origin(v), be->key, be->key,
                 be->origin, be->line);
        FK_TRY(add_warning(s, w));
    }
    return FK_OK;
}

static int resolve_block(struct fk_sweep *s, struct cellvec *cv, const struct fk_toml_value *blk,
                         const struct fk_toml_value *defaults, const struct fk_toml_value *excl,
                         const struct fk_codec_ops *ops);

static int resolve_codec(struct fk_sweep *s, struct cellvec *cv, const struct fk_toml_value *blk,
                         const struct fk_toml_value *defaults, const struct fk_toml_value *excl)
{
    if (fk_toml_type(blk) != FK_TOML_TABLE)
        return cfg_err(blk, "[[codec]] entries must be tables%s%s", "", "");
    const struct fk_toml_value *nv = fk_toml_table_get(blk, "name");
    if (!nv)
        return cfg_err(blk, "[[codec]] needs a name (one of the codecs listed by `fadkv-bench "
                            "codecs`)%s%s", "", "");
    const char *name;
    FK_TRY(get_str(nv, &name));
    const struct fk_codec_ops *ops = fk_codec_find(name);
    if (!ops) {
        char allowed[512] = "";
        for (int i = 0; fk_codec_at(i); i++) {
            size_t n = strlen(allowed);
            snprintf(allowed + n, sizeof allowed - n, "%s%s", i ? ", " : "", fk_codec_at(i)->name);
        }
        return cfg_err(nv, "unknown codec '%s' (registered: %s)", name, allowed);
    }
    /* evict = "POLICY": the codec stores what the policy keeps */
    const struct fk_toml_value *evv = fk_toml_table_get(blk, "evict");
    struct composite comp = {0};
    const struct fk_evict_ops *pol = NULL;
    if (evv) {
        const char *pname;
        FK_TRY(get_str(evv, &pname));
        const struct fk_evict_ops *ev = fk_evict_find(pname);
        if (!ev) {
            char allowed[512] = "";
            for (int i = 0; fk_evict_policies[i]; i++) {
                size_t n = strlen(allowed);
                snprintf(allowed + n, sizeof allowed - n, "%s%s", i ? ", " : "",
                         fk_evict_policies[i]->name);
            }
            return cfg_err(evv, "unknown eviction policy '%s' (registered: %s)", pname,
                           allowed);
        }
        if (fk_evict_check_names(ev, ops) < 0)
            return fk_err_context(FK_ECONFIG, "%s:%d:%d", fk_toml_origin(evv),
                                  fk_toml_line(evv), fk_toml_col(evv));
        pol = ev;
    }
    /* merge = ..., think = ...: the prefill's row rewrites, with or without a policy */
    int has_rw = 0;
    for (size_t i = 0; i < fk_toml_table_len(blk); i++)
        has_rw |= fk_rewrite_is_option(fk_toml_table_at(blk, i)->key);
    for (int g = 0; g < 2; g++) { /* and the keys its grid or zip varies */
        const struct fk_toml_value *dv = fk_toml_table_get(blk, g ? "zip" : "grid");
        for (size_t i = 0; dv && fk_toml_type(dv) == FK_TOML_TABLE &&
             i < fk_toml_table_len(dv); i++)
            has_rw |= fk_rewrite_is_option(fk_toml_table_at(dv, i)->key);
    }
    if (pol || has_rw) {
        for (const struct fk_option *o = fk_rewrite_options; has_rw && o->name; o++)
            if (fk_codec_option(ops, o->name) || (pol && fk_evict_option(pol, o->name)))
                return cfg_err(blk, "option '%s' of the row rewrites is also an option of %s",
                               o->name, ops->name);
        FK_TRY(composite_init(&comp, ops, pol, has_rw));
        ops = &comp.ops;
    }
    int rc = resolve_block(s, cv, blk, defaults, excl, ops);
    free(comp.options);
    return rc;
}

/* resolve_codec for the block's codec (or composite). */
static int resolve_block(struct fk_sweep *s, struct cellvec *cv, const struct fk_toml_value *blk,
                         const struct fk_toml_value *defaults, const struct fk_toml_value *excl,
                         const struct fk_codec_ops *ops)
{
    /* datasets = ["a", "b"] restricts the block to those datasets */
    const struct fk_toml_value *only = fk_toml_table_get(blk, "datasets");
    if (only && fk_toml_type(only) != FK_TOML_ARRAY)
        return cfg_err(only, "datasets: expected a list of dataset names%s%s", "", "");
    for (size_t i = 0; only && i < fk_toml_array_len(only); i++) {
        const char *dn;
        FK_TRY(get_str(fk_toml_array_at(only, i), &dn));
        int found = 0;
        for (int d = 0; d < s->n_datasets; d++)
            found |= !strcmp(s->datasets[d].name, dn);
        if (!found)
            return cfg_err(fk_toml_array_at(only, i), "unknown dataset '%s'%s", dn, "");
    }
    void *opts = calloc(1, ops->opts_size);
    if (!opts)
        return fk_err(FK_ENOMEM, "out of memory");
    int rc = FK_OK;
    for (int d = 0; d < s->n_datasets && rc == FK_OK; d++) {
        int take = !only;
        for (size_t i = 0; only && i < fk_toml_array_len(only); i++) {
            const char *dn = NULL;
            get_str(fk_toml_array_at(only, i), &dn);
            take |= !strcmp(dn, s->datasets[d].name);
        }
        if (!take)
            continue;
        fk_opts_defaults(ops, opts);
        /* [defaults], then the dataset's defaults: keys the codec lacks are skipped (each key
         * was checked once to belong to some codec) */
        const struct fk_toml_value *layers[2] = {defaults, s->datasets[d].defaults};
        for (int li = 0; li < 2 && rc == FK_OK; li++)
            for (size_t i = 0; layers[li] && i < fk_toml_table_len(layers[li]) && rc == FK_OK;
                 i++) {
                const struct fk_toml_entry *e = fk_toml_table_at(layers[li], i);
                if (fk_codec_option(ops, e->key))
                    rc = set_option(ops, opts, e->key, e->value, e->origin, e->line, e->col);
            }
        /* a --set [defaults] key that the dataset's own defaults set again */
        for (size_t i = 0; layers[1] && i < fk_toml_table_len(layers[1]) && rc == FK_OK; i++) {
            const struct fk_toml_value *const top[2] = {layers[0], NULL};
            if (fk_codec_option(ops, fk_toml_table_at(layers[1], i)->key))
                rc = warn_overridden(s, top, fk_toml_table_at(layers[1], i));
        }
        const struct fk_toml_value *pv = fk_toml_table_get(blk, "preset");
        if (rc == FK_OK && pv)
            rc = apply_preset(pv, ops, opts);
        struct dim dims[64];
        int n_dims = 0;
        for (size_t i = 0; i < fk_toml_table_len(blk) && rc == FK_OK; i++) {
            const struct fk_toml_entry *e = fk_toml_table_at(blk, i);
            if (!strcmp(e->key, "name") || !strcmp(e->key, "preset") ||
                !strcmp(e->key, "datasets") || !strcmp(e->key, "evict"))
                continue;
            if (!strcmp(e->key, "grid"))
                rc = add_dims(e->value, 0, dims, &n_dims, "grid");
            else if (!strcmp(e->key, "zip"))
                rc = add_dims(e->value, 1, dims, &n_dims, "zip");
            else
                rc = set_option(ops, opts, e->key, e->value, e->origin, e->line, e->col);
            if (rc == FK_OK && strcmp(e->key, "grid") && strcmp(e->key, "zip"))
                rc = warn_overridden(s, layers, e);
        }
        for (int i = 0; i < n_dims && rc == FK_OK; i++)
            for (int k = 0; k < dims[i].n_keys && rc == FK_OK; k++)
                rc = warn_overridden(s, layers, dims[i].e[k]);
        if (rc == FK_OK)
            rc = expand(s, cv, ops, opts, dims, n_dims, 0, excl, d, blk);
    }
    free(opts);
    return rc;
}

/* ---- the [sweep] table ------------------------------------------------------------------ */

/* The results directory `path` that `output` (value v, text str) names must be safe to
 * write into before anything is written: not empty, not the root of the file system, and
 * when it exists, a directory that is empty or already a results directory (provenance.json
 * or cells/): the store writes cells/, cells.csv, summary.csv, ... into it. */
static int check_output(const struct fk_toml_value *v, const char *str, const char *path)
{
    if (!str[0])
        return cfg_err(v, "[sweep] output is empty: expected the results directory to write, "
                       "e.g. \"results/NAME\"%s%s", "", "");
    char real[PATH_MAX];
    const char *p = path;
    if (realpath(path, real))
        p = real;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    if (n == 1 && p[0] == '/')
        return cfg_err(v, "[sweep] output = \"%s\" is the root of the file system: expected "
                       "a results directory of its own, e.g. \"results/NAME\"%s", str, "");
    struct stat stt;
    if (stat(path, &stt) != 0)
        return FK_OK; /* made when the run starts */
    if (!S_ISDIR(stt.st_mode))
        return cfg_err(v, "[sweep] output = \"%s\" exists and is not a directory%s", str, "");
    DIR *dir = opendir(path);
    if (!dir)
        return FK_OK; /* unreadable: the store reports what it cannot write */
    int empty = 1, results = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        empty = 0;
        results |= !strcmp(e->d_name, "provenance.json") || !strcmp(e->d_name, "cells");
    }
    closedir(dir);
    if (!empty && !results)
        return cfg_err(v, "[sweep] output = \"%s\" names a directory that holds other files "
                       "and is no results directory (no provenance.json, no cells/): refusing "
                       "to write cells.csv, summary.csv and cells/ into it; name a new or empty "
                       "directory, e.g. \"%s/results\"", str, str);
    return FK_OK;
}

static int load_sweep_table(struct fk_sweep *s, const struct fk_toml_value *tab)
{
    for (size_t i = 0; i < fk_toml_table_len(tab); i++) {
        const struct fk_toml_entry *e = fk_toml_table_at(tab, i);
        const char *k = e->key;
        long v = 0;
        int b = 0;
        const char *str = NULL;
        if (!strcmp(k, "name")) {
            FK_TRY(get_str(e->value, &str));
            free(s->name);
            s->name = xstrdup(str);
        } else if (!strcmp(k, "output")) {
            FK_TRY(get_str(e->value, &str));
            free(s->output);
            if (!(s->output = fk_sweep_path(e->value, str)))
                return fk_err(FK_ENOMEM, "out of memory");
            FK_TRY(check_output(e->value, str, s->output));
        } else if (!strcmp(k, "jobs")) {
            FK_TRY(get_int_range(e, 1, 256, &v));
            s->jobs = (int)v;
        } else if (!strcmp(k, "cell_timeout")) {
            double t = 0;
            if (fk_toml_get_float(e->value, &t) < 0 || !(t >= 0) || !isfinite(t))
                return entry_err(e, "cell_timeout: expected seconds >= 0 (0: no limit)");
            s->cell_timeout_s = t;
        } else if (!strcmp(k, "mem_limit")) {
            FK_TRY(get_int_range(e, 1, 1L << 30, &v));
            s->mem_limit_mib = v;
        } else if (!strcmp(k, "attention")) {
            FK_TRY(fk_toml_get_bool(e->value, &b));
            s->attention = b;
        } else if (!strcmp(k, "attn_stride")) {
            FK_TRY(get_int_range(e, 1, 1 << 20, &v));
            s->attn_stride = (int)v;
        } else if (!strcmp(k, "attn_layers")) {
            if (fk_toml_type(e->value) != FK_TOML_ARRAY)
                return entry_err(e, "expected a list of layer indices, e.g. [0, 13, 27]");
            free(s->attn_layers);
            s->n_attn_layers = 4096;
            s->attn_layers = calloc(4096, 1);
            if (!s->attn_layers)
                return fk_err(FK_ENOMEM, "out of memory");
            for (size_t j = 0; j < fk_toml_array_len(e->value); j++) {
                int64_t l;
                FK_TRY(fk_toml_get_int(fk_toml_array_at(e->value, j), &l));
                if (l < 0 || l >= 4096)
                    return entry_err(e, "layer index out of range [0, 4095]");
                s->attn_layers[l] = 1;
            }
        } else if (!strcmp(k, "recall")) {
            FK_TRY(fk_toml_get_bool(e->value, &b));
            s->recall = b;
        } else if (!strcmp(k, "recall_every")) {
            FK_TRY(get_int_range(e, 1, 1 << 20, &v));
            s->recall_every = (int)v;
        } else if (!strcmp(k, "repeats")) {
            FK_TRY(get_int_range(e, 1, 1000, &v));
            s->repeats = (int)v;
        } else if (!strcmp(k, "base_seed")) {
            int64_t x;
            FK_TRY(fk_toml_get_int(e->value, &x));
            s->base_seed = (uint64_t)x;
        } else if (!strcmp(k, "cost_baseline")) {
            FK_TRY(get_str(e->value, &str));
            if (!fk_codec_find(str))
                return entry_err(e, "cost_baseline names no codec (see `fadkv-bench codecs`)");
            free(s->cost_baseline);
            s->cost_baseline = xstrdup(str);
        } else if (!strcmp(k, "budgets")) {
            FK_TRY(get_budgets(e, &s->budgets));
        } else if (strcmp(k, "traces") && strcmp(k, "dictionary") && strcmp(k, "basis") &&
                   strcmp(k, "calibration") && strcmp(k, "reconstructions") &&
                   strcmp(k, "plugins")) {
            return entry_err(e, "unknown key in [sweep] (allowed: name, traces, dictionary, basis, "
                                "calibration, "
                                "output, jobs, mem_limit, cell_timeout, attention, attn_stride, "
                                "attn_layers, recall, recall_every, repeats, base_seed, "
                                "cost_baseline, budgets, plugins)");
        }
    }
    return FK_OK;
}

void fk_sweep_free(struct fk_sweep **sp)
{
    struct fk_sweep *s = sp ? *sp : NULL;
    if (!s)
        return;
    for (int i = 0; i < s->n_warnings; i++)
        free(s->warnings[i]);
    free(s->warnings);
    for (int d = 0; d < s->n_datasets; d++) {
        struct fk_dataset *ds = &s->datasets[d];
        for (int i = 0; i < ds->n_traces; i++)
            free(ds->traces[i]);
        free(ds->traces);
        free(ds->name);
        free(ds->dict);
        free(ds->basis);
        free(ds->calib);
        free(ds->head_pattern);
        for (int i = 0; ds->recon && i < ds->n_traces; i++)
            free(ds->recon[i]);
        free(ds->recon);
        free(ds->recon_dir);
        free(ds->content_hash);
        fk_sweep_model_free(ds);
    }
    for (int c = 0; c < s->n_cells; c++) {
        free(s->cells[c].opts);
        free(s->cells[c].evict_opts);
        free(s->cells[c].rewrite);
        free(s->cells[c].canon);
    }
    free(s->datasets);
    free(s->cells);
    free(s->attn_layers);
    free(s->path);
    free(s->name);
    free(s->output);
    free(s->resolved);
    free(s->cost_baseline);
    free(s->budgets);
    free(s);
    *sp = NULL;
}

static int check_top_keys(const struct fk_toml_value *root)
{
    static const char *const top_keys[] = {"sweep", "dataset", "defaults", "codec", "exclude",
                                           NULL};
    for (size_t i = 0; i < fk_toml_table_len(root); i++) {
        const struct fk_toml_entry *e = fk_toml_table_at(root, i);
        int ok = 0;
        for (int k = 0; top_keys[k]; k++)
            ok |= !strcmp(e->key, top_keys[k]);
        if (!ok)
            return entry_err(e, "unknown top-level key (allowed: [sweep], [[dataset]], "
                                "[defaults], [[codec]], [[exclude]])");
    }
    return FK_OK;
}

/* Datasets: [sweep].traces/dictionary, and/or [[dataset]] blocks. */
static int load_datasets(struct fk_sweep *s, const struct fk_toml_value *root,
                         const struct fk_toml_value *sw, int hash_content)
{
    const struct fk_toml_value *dsa = fk_toml_table_get(root, "dataset");
    int n_ds = (fk_toml_table_get(sw, "traces") ? 1 : 0) + (int)fk_toml_array_len(dsa);
    if (n_ds == 0)
        return cfg_err(sw, "no traces: set [sweep] traces = [\"...\"] or add [[dataset]] "
                           "blocks%s%s", "", "");
    s->datasets = calloc((size_t)n_ds, sizeof *s->datasets);
    if (!s->datasets)
        return fk_err(FK_ENOMEM, "out of memory");
    if (fk_toml_table_get(sw, "traces"))
        FK_TRY(load_dataset(sw, "default", 1, s->output, &s->datasets[s->n_datasets++]));
    for (size_t i = 0; i < fk_toml_array_len(dsa); i++) {
        const struct fk_toml_value *t = fk_toml_array_at(dsa, i);
        const struct fk_toml_value *nm = fk_toml_table_get(t, "name");
        const char *name = NULL;
        if (!nm)
            return cfg_err(t, "[[dataset]] needs a name%s%s", "", "");
        FK_TRY(get_str(nm, &name));
        for (int d = 0; d < s->n_datasets; d++)
            if (!strcmp(s->datasets[d].name, name))
                return cfg_err(nm, "dataset name '%s' is used twice%s", name, "");
        FK_TRY(load_dataset(t, name, 0, s->output, &s->datasets[s->n_datasets++]));
    }
    if (s->given_hashes) { /* a cell's child process: the parent's hashes */
        if (s->n_given_hashes != s->n_datasets)
            return fk_err(FK_EINVAL, "%s: %d content hashes given for %d datasets", s->path,
                          s->n_given_hashes, s->n_datasets);
        for (int d = 0; d < s->n_datasets; d++)
            if (!(s->datasets[d].content_hash = xstrdup(s->given_hashes[d])))
                return fk_err(FK_ENOMEM, "out of memory");
    } else if (hash_content) {
        for (int d = 0; d < s->n_datasets; d++)
            FK_TRY(hash_dataset(&s->datasets[d]));
    }
    return FK_OK;
}

/* [defaults] keys are options of some codec; [[exclude]] keys are codec, dataset or
 * options, with string values where the key takes names. */
static int check_defaults_excludes(const struct fk_toml_value *defs,
                                   const struct fk_toml_value *excl)
{
    for (size_t i = 0; defs && i < fk_toml_table_len(defs); i++) {
        const struct fk_toml_entry *e = fk_toml_table_at(defs, i);
        if (!is_known_option(e->key))
            return defaults_key_err(e);
    }
    for (size_t r = 0; excl && r < fk_toml_array_len(excl); r++) {
        const struct fk_toml_value *rule = fk_toml_array_at(excl, r);
        for (size_t i = 0; i < fk_toml_table_len(rule); i++) {
            const struct fk_toml_entry *e = fk_toml_table_at(rule, i);
            if (strcmp(e->key, "codec") && strcmp(e->key, "dataset") && !is_known_option(e->key) &&
                !fk_rewrite_is_option(e->key))
                return entry_err(e, "[[exclude]] keys are codec, dataset or codec options");
            int want_str = !strcmp(e->key, "codec") || !strcmp(e->key, "dataset");
            for (int c = 0; fk_codec_at(c) && !want_str; c++) {
                const struct fk_option *o = fk_codec_option(fk_codec_at(c), e->key);
                want_str = o && o->type == FK_OPT_ENUM;
            }
            if (want_str && fk_toml_type(e->value) != FK_TOML_STRING)
                return entry_err(e, "expected a string (a codec, dataset or option value name)");
        }
    }
    return FK_OK;
}

/* Cell c's id and seed: a hash of the canonical cell, its data and the harness version. */
static void cell_identity(const struct fk_sweep *s, struct fk_sweep_cell *cell)
{
    const struct fk_dataset *ds = &s->datasets[cell->dataset];
    struct fk_sha256_ctx h;
    fk_sha256_init(&h);
    fk_sha256_update(&h, cell->canon, strlen(cell->canon));
    fk_sha256_update(&h, FK_HARNESS_VERSION, strlen(FK_HARNESS_VERSION));
    if (ds->content_hash)
        fk_sha256_update(&h, ds->content_hash, 64);
    if (ds->content_hash && (cell->ops->caps & FK_CAP_CALIB) && strlen(ds->content_hash) == 129)
        fk_sha256_update(&h, ds->content_hash + 65, 64); /* the calibration (hash_dataset) */
    char extra[128];
    snprintf(extra, sizeof extra, ";attention=%d;stride=%d;recall=%d/%d;seed=%llu",
             s->attention, s->attn_stride, s->recall, s->recall_every,
             (unsigned long long)s->base_seed);
    fk_sha256_update(&h, extra, strlen(extra));
    uint8_t dg[32];
    fk_sha256_final(&h, dg);
    char hex[65];
    fk_sha256_hex(dg, hex);
    memcpy(cell->id, hex, 16);
    cell->id[16] = 0;
    uint64_t seed = 0;
    for (int b = 0; b < 8; b++)
        seed = seed << 8 | dg[8 + b];
    cell->seed = seed ^ s->base_seed;
}

/* Ids and seeds of every cell, the canonical text of the whole sweep and its hash. */
static int identify(struct fk_sweep *s)
{
    size_t tot = 512 + strlen(s->cost_baseline);
    for (int c = 0; c < s->n_cells; c++)
        tot += strlen(s->cells[c].canon) + 128;
    s->resolved = malloc(tot);
    if (!s->resolved)
        return fk_err(FK_ENOMEM, "out of memory");
    size_t n = (size_t)snprintf(s->resolved, tot,
                                "sweep=%s;attention=%d;attn_stride=%d;recall=%d;recall_every=%d",
                                s->name, s->attention, s->attn_stride, s->recall,
                                s->recall_every);
    /* the cost baseline labels no cell: named only when it is not the default */
    if (strcmp(s->cost_baseline, fk_default_cost_baseline))
        n += (size_t)snprintf(s->resolved + n, tot - n, ";cost_baseline=%s", s->cost_baseline);
    n += (size_t)snprintf(s->resolved + n, tot - n, "\n");
    for (int c = 0; c < s->n_cells; c++) {
        cell_identity(s, &s->cells[c]);
        n += (size_t)snprintf(s->resolved + n, tot - n, "%s %s\n", s->cells[c].id,
                              s->cells[c].canon);
    }
    uint8_t dg[32];
    fk_sha256(s->resolved, n, dg);
    fk_sha256_hex(dg, s->config_hash);
    return FK_OK;
}

/* A trace that a cell's buffer rule compresses no token of (T <= n_b): the cell runs, but
 * with nothing compressed its bytes are the full cache's (bytes_ratio_full 1) and its
 * reconstruction errors and attention metrics are means over nothing (empty in cells.csv).
 * Said once per dataset, trace, codec and buffer rule, at load (so by --dry-run too). */
static int warn_uncompressed(struct fk_sweep *s)
{
    for (int d = 0; d < s->n_datasets; d++) {
        const struct fk_dataset *ds = &s->datasets[d];
        for (int i = 0; i < ds->n_traces; i++) {
            struct fk_trace *t;
            if (fk_trace_open(ds->traces[i], &t) < 0) {
                fk_err_clear(); /* the runner reports an unreadable trace, with its cell */
                continue;
            }
            const struct fk_trace_info *in = fk_trace_get_info(t);
            int T = in->n_tokens, P = in->prompt_len;
            fk_trace_close(&t);
            for (int c = 0; c < s->n_cells; c++) {
                const struct fk_sweep_cell *cell = &s->cells[c];
                if (cell->dataset != d)
                    continue;
                int done = 0, nb = 0;
                for (int kind = 0; kind < 2; kind++) {
                    struct fk_buffer b;
                    fk_codec_buffer(cell->ops, cell->opts, kind, &b);
                    struct fk_sched sc = {.n_tokens = T, .prompt_len = P, .n_b = b.n_b,
                                          .a_len = b.a_len, .mode = b.mode};
                    done += fk_sched_final(&sc);
                    nb = b.n_b > nb ? b.n_b : nb;
                }
                if (done)
                    continue;
                char w[PATH_MAX + 512];
                snprintf(w, sizeof w, "dataset '%s', trace %s: codec '%s' with n_b = %d keeps "
                         "all T = %d tokens exact (T <= n_b), so nothing is compressed: its "
                         "cells run, with bytes_ratio_full 1 and empty errors and attention "
                         "metrics",
                         ds->name, ds->traces[i], cell->ops->name, nb, T);
                FK_TRY(add_warning(s, w));
            }
        }
    }
    return FK_OK;
}

/* [sweep] plugins = ["FILE.so", ...]: codec plugins (core/fk_codec.h), loaded before any
 * codec is looked up (paths: sweep_path). */
static int load_plugins(const struct fk_toml_value *sw)
{
    const struct fk_toml_value *pl = fk_toml_table_get(sw, "plugins");
    if (!pl)
        return FK_OK;
    int one = fk_toml_type(pl) == FK_TOML_STRING;
    if (!one && fk_toml_type(pl) != FK_TOML_ARRAY)
        return cfg_err(pl, "plugins: expected a list of shared library files, e.g. "
                       "[\"plugins/my_codec.so\"]%s%s", "", "");
    size_t n = one ? 1 : fk_toml_array_len(pl);
    for (size_t i = 0; i < n; i++) {
        const struct fk_toml_value *v = one ? pl : fk_toml_array_at(pl, i);
        const char *p;
        if (fk_toml_type(v) != FK_TOML_STRING || get_str(v, &p) < 0)
            return cfg_err(v, "plugins: expected a file name (a string)%s%s", "", "");
        char *full = fk_sweep_path(v, p);
        if (!full)
            return fk_err(FK_ENOMEM, "out of memory");
        int rc = fk_plugin_load(full);
        free(full);
        if (rc < 0)
            return fk_err_context(FK_ECONFIG, "%s:%d:%d: plugins", fk_toml_origin(v),
                                  fk_toml_line(v), fk_toml_col(v));
    }
    return FK_OK;
}

static int resolve(struct fk_sweep *s, const struct fk_toml_value *root, int hash_content)
{
    FK_TRY(check_top_keys(root));
    const struct fk_toml_value *sw = fk_toml_table_get(root, "sweep");
    if (!sw || fk_toml_type(sw) != FK_TOML_TABLE)
        return fk_err(FK_ECONFIG, "%s: missing [sweep] table (name, traces, output, ...)",
                      s->path);
    FK_TRY(load_plugins(sw));
    FK_TRY(load_sweep_table(s, sw));
    if (!s->output)
        return cfg_err(sw, "[sweep] needs output = \"results/NAME\"%s%s", "", "");
    if (!s->cost_baseline && !(s->cost_baseline = xstrdup(fk_default_cost_baseline)))
        return fk_err(FK_ENOMEM, "out of memory");
    FK_TRY(load_datasets(s, root, sw, hash_content));
    const struct fk_toml_value *defs = fk_toml_table_get(root, "defaults");
    const struct fk_toml_value *excl = fk_toml_table_get(root, "exclude");
    FK_TRY(check_defaults_excludes(defs, excl));
    const struct fk_toml_value *codecs = fk_toml_table_get(root, "codec");
    if (!codecs || fk_toml_array_len(codecs) == 0)
        return fk_err(FK_ECONFIG, "%s: no [[codec]] blocks: nothing to run", s->path);
    struct cellvec cv = {0};
    int rc = FK_OK;
    for (size_t i = 0; i < fk_toml_array_len(codecs) && rc == FK_OK; i++)
        rc = resolve_codec(s, &cv, fk_toml_array_at(codecs, i), defs, excl);
    s->cells = cv.v;
    s->n_cells = cv.n;
    FK_TRY(rc);
    if (s->n_cells == 0)
        return fk_err(FK_ECONFIG, "%s: no cells left to run ([[exclude]] rules drop every cell)",
                      s->path);
    if (hash_content)
        FK_TRY(warn_uncompressed(s));
    return identify(s);
}

/* --set KEY=VALUE into the parsed file: KEY a dotted path, or codec.N.KEY for the N-th
 * [[codec]] block (1-based, in file order) alone. */
static int set_in(struct fk_toml_value *root, const char *key, struct fk_toml_value **v)
{
    int n = 0, used = 0;
    if (sscanf(key, "codec.%d.%n", &n, &used) == 1 && used > 0) {
        const struct fk_toml_value *blocks = fk_toml_table_get(root, "codec");
        size_t nb = blocks ? fk_toml_array_len(blocks) : 0;
        if (n < 1 || (size_t)n > nb) {
            fk_toml_free(v);
            return fk_err(FK_ECONFIG, "--set %s: block %d of %zu: expected codec.N.KEY with N "
                          "from 1 to the number of [[codec]] blocks", key, n, nb);
        }
        /* the tree is ours: the block is modified in place */
        struct fk_toml_value *blk = (struct fk_toml_value *)fk_toml_array_at(blocks,
                                                                              (size_t)n - 1);
        return fk_toml_set_path(blk, key + used, "--set", v);
    }
    return fk_toml_set_path(root, key, "--set", v);
}

/* 1 if text is a bare word: letters, digits, '_', '-', '.', '/', ':' and '+', starting with a
 * letter (so not a number, and true/false/inf/nan parse as TOML before this is asked). */
static int bare_word(const char *text)
{
    if (!((*text >= 'a' && *text <= 'z') || (*text >= 'A' && *text <= 'Z')) ||
        strlen(text) > 400)
        return 0;
    for (const char *p = text; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("_-./:+", *p)))
            return 0;
    return 1;
}

static int sweep_load(const char *path, const char *const *sets, int n_sets, int hash_content,
                      const char *const *hashes, int n_hashes, struct fk_sweep **out)
{
    *out = NULL;
    struct fk_toml_value *root = NULL;
    FK_TRY(fk_toml_parse_file(path, &root));
    int rc = FK_OK;
    for (int i = 0; i < n_sets && rc == FK_OK; i++) {
        const char *eq = strchr(sets[i], '=');
        if (!eq || eq == sets[i]) {
            rc = fk_err(FK_ECONFIG, "--set %s: expected KEY=VALUE (e.g. sweep.jobs=1)", sets[i]);
            break;
        }
        char key[512];
        snprintf(key, sizeof key, "%.*s", (int)(eq - sets[i]), sets[i]);
        struct fk_toml_value *v = NULL;
        rc = fk_toml_parse_value(eq + 1, "--set", &v);
        if (rc < 0 && bare_word(eq + 1)) {
            /* a bare word (--set defaults.coef=fp16) is the string it spells */
            char q[512];
            snprintf(q, sizeof q, "\"%s\"", eq + 1);
            fk_err_clear();
            rc = fk_toml_parse_value(q, "--set", &v);
        } else if (rc < 0) {
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", fk_errmsg());
            rc = fk_err(rc, "%s (a value is TOML: quote a string with spaces or symbols, e.g. "
                        "--set 'sweep.output=\"results/my run\"')", msg);
        }
        if (rc == FK_OK)
            rc = set_in(root, key, &v);
        fk_toml_free(&v);
        if (rc < 0)
            rc = fk_err_context(rc, "--set %s", sets[i]);
    }
    struct fk_sweep *s = calloc(1, sizeof *s);
    if (rc == FK_OK && !s)
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK) {
        s->path = xstrdup(path);
        s->name = xstrdup("sweep");
        s->jobs = 1;
        s->attn_stride = 16;
        s->recall = 1;
        s->recall_every = 8;
        s->repeats = 1;
        s->given_hashes = hashes;
        s->n_given_hashes = n_hashes;
        rc = resolve(s, root, hash_content);
        s->given_hashes = NULL;
    }
    fk_toml_free(&root);
    if (rc < 0) {
        fk_sweep_free(&s);
        return rc;
    }
    *out = s;
    return FK_OK;
}

int fk_sweep_load(const char *path, const char *const *sets, int n_sets, int hash_content,
                  struct fk_sweep **out)
{
    return sweep_load(path, sets, n_sets, hash_content, NULL, 0, out);
}

int fk_sweep_load_hashed(const char *path, const char *const *sets, int n_sets,
                         const char *const *hashes, int n_hashes, struct fk_sweep **out)
{
    return sweep_load(path, sets, n_sets, 0, hashes, n_hashes, out);
}

double fk_sweep_cell_macs(const struct fk_sweep *s, const struct fk_sweep_cell *c,
                          double *vectors)
{
    const struct fk_dataset *ds = &s->datasets[c->dataset];
    double vec = 0, m = 0, N = 0;
    for (int i = 0; i < ds->n_traces; i++) {
        struct fk_trace *t;
        if (fk_trace_open(ds->traces[i], &t) < 0)
            return NAN;
        const struct fk_trace_info *in = fk_trace_get_info(t);
        vec += 2.0 * in->n_layers * in->n_kv_heads * in->n_tokens;
        m = in->head_dim;
        fk_trace_close(&t);
    }
    if (vectors)
        *vectors = vec;
    N = 4096;
    int na;
    if (ds->dict && fk_dict_atoms(ds->dict, &na) == FK_OK)
        N = na; /* attributes only: loading the atoms is slow at paper scale */
    return vec * (c->ops->estimate_macs ? c->ops->estimate_macs(c->opts, (int)m, (int)N) : m);
}
