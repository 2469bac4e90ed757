/* SPDX-License-Identifier: MIT
 * The list of codecs. It is generated: codecs/meson.build holds the one list (a codec's
 * name, source and ops symbol), and fk_registry_list.h carries it here. Plugins
 * (core/fk_codec.h, struct fk_plugin) add theirs at start-up, before any sweep runs.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "core/fk_codec.h"
#include "core/fk_evict.h"
#include "core/fk_registry.h"
#include "fk_registry_list.h"

#define FK_PLUGIN_MAX 16
#define FK_PLUGIN_CODECS_MAX 64

struct plugin {
    char *path;                  /* absolute */
    char sha256[65];
    char *family;
    void *handle;                /* dlopen's, kept open for the process */
};

static struct plugin g_plugins[FK_PLUGIN_MAX];
static int g_n_plugins;
static const struct fk_codec_ops *g_pcodecs[FK_PLUGIN_CODECS_MAX];
static int g_pcodec_plugin[FK_PLUGIN_CODECS_MAX]; /* index into g_plugins */
static int g_n_pcodecs;

static int n_builtin(void)
{
    int n = 0;
    while (fk_codecs[n])
        n++;
    return n;
}

int fk_codec_count(void)
{
    return n_builtin() + g_n_pcodecs;
}

const struct fk_codec_ops *fk_codec_at(int i)
{
    int nb = n_builtin();
    if (i < 0 || i >= nb + g_n_pcodecs)
        return NULL;
    return i < nb ? fk_codecs[i] : g_pcodecs[i - nb];
}

const struct fk_codec_ops *fk_codec_find(const char *name)
{
    for (int i = 0; fk_codecs[i]; i++)
        if (!strcmp(fk_codecs[i]->name, name))
            return fk_codecs[i];
    for (int i = 0; i < g_n_pcodecs; i++)
        if (!strcmp(g_pcodecs[i]->name, name))
            return g_pcodecs[i];
    return NULL;
}

static const struct plugin *plugin_of(const struct fk_codec_ops *ops)
{
    for (int i = 0; ops && i < g_n_pcodecs; i++)
        if (g_pcodecs[i] == ops)
            return &g_plugins[g_pcodec_plugin[i]];
    return NULL;
}

const char *fk_codec_family(const struct fk_codec_ops *ops)
{
    for (int i = 0; fk_codecs[i]; i++)
        if (fk_codecs[i] == ops)
            return fk_codec_families[i];
    const struct plugin *p = plugin_of(ops);
    return p ? p->family : "";
}

const struct fk_codec_ext *fk_codec_ext(const struct fk_codec_ops *ops)
{
    for (int i = 0; fk_codecs[i]; i++)
        if (fk_codecs[i] == ops)
            return fk_codec_exts[i];
    return NULL;
}

int fk_codec_takes_ahead(const struct fk_codec_ops *ops)
{
    const struct fk_codec_ext *x = fk_codec_ext(ops);
    return x && x->open_ahead;
}

int fk_codec_open(const struct fk_codec_ops *ops, const void *opts,
                  const struct fk_stream_env *env, const float *ahead, void **state)
{
    const struct fk_codec_ext *x = ahead ? fk_codec_ext(ops) : NULL;
    if (x && x->open_ahead)
        return x->open_ahead(opts, env, ahead, state);
    return ops->open(opts, env, state);
}

const char *fk_codec_plugin(const struct fk_codec_ops *ops)
{
    const struct plugin *p = plugin_of(ops);
    return p ? p->path : NULL;
}

const char *fk_codec_plugin_sha256(const struct fk_codec_ops *ops)
{
    const struct plugin *p = plugin_of(ops);
    return p ? p->sha256 : NULL;
}

static int valid_name(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

/* The plugin's description, checked against this build's ABI; its codecs counted. */
static int plugin_check(const char *path, const struct fk_plugin *pl, int *n_codecs)
{
    static const unsigned want[4] = FK_PLUGIN_SIZES;
    static const char *const what[4] = {"struct fk_codec_ops", "struct fk_stream_env",
                                        "struct fk_vec_out", "struct fk_stream_stats"};
    if (!pl)
        return fk_err(FK_EINVAL, "plugin %s: " FK_PLUGIN_ENTRY "() returned NULL", path);
    if (pl->abi_version != FK_PLUGIN_ABI_VERSION)
        return fk_err(FK_EINVAL, "plugin %s was built for plugin ABI version %d, this "
                      "fadkv-bench has ABI version %d: rebuild it against this fadkv-bench's "
                      "core/fk_codec.h (pkg-config --cflags fadkv-bench)", path,
                      pl->abi_version, FK_PLUGIN_ABI_VERSION);
    for (int k = 0; k < 4; k++)
        if (pl->sizes[k] != want[k])
            return fk_err(FK_EINVAL, "plugin %s says ABI version %d, but its %s is %u bytes "
                          "and this fadkv-bench's %u: it was built against another "
                          "core/fk_codec.h; rebuild it", path, pl->abi_version, what[k],
                          pl->sizes[k], want[k]);
    if (!pl->codecs || !pl->codecs[0])
        return fk_err(FK_EINVAL, "plugin %s holds no codec (its codecs list is empty)", path);
    int n = 0;
    for (; pl->codecs[n]; n++) {
        const struct fk_codec_ops *c = pl->codecs[n];
        if (!valid_name(c->name))
            return fk_err(FK_EINVAL, "plugin %s: codec %d has the name '%s', expected "
                          "[a-z0-9_-]+", path, n, c->name ? c->name : "(NULL)");
        if (!c->options || !c->open || !c->encode || !c->reconstruct || !c->stats ||
            !c->close || c->opts_size < sizeof(struct fk_common_opts))
            return fk_err(FK_EINVAL, "plugin %s: codec %s lacks an option table, a mandatory "
                          "callback (open, encode, reconstruct, stats, close) or room for "
                          "struct fk_common_opts (`fadkv-bench conformance %s` says which)",
                          path, c->name, path);
        const struct plugin *owner = plugin_of(fk_codec_find(c->name));
        if (fk_codec_find(c->name))
            return fk_err(FK_EINVAL, "plugin %s: its codec '%s' clashes with %s%s: rename it",
                          path, c->name, owner ? "the codec of plugin " : "the built-in codec ",
                          owner ? owner->path : c->name);
        for (int k = 0; k < n; k++)
            if (!strcmp(pl->codecs[k]->name, c->name))
                return fk_err(FK_EINVAL, "plugin %s holds two codecs named '%s'", path,
                              c->name);
    }
    if (g_n_pcodecs + n > FK_PLUGIN_CODECS_MAX)
        return fk_err(FK_ENOTSUP, "plugin %s: more than %d plugin codecs in all", path,
                      FK_PLUGIN_CODECS_MAX);
    *n_codecs = n;
    return FK_OK;
}

int fk_plugin_load(const char *path)
{
    char abs[PATH_MAX], hex[65];
    if (!realpath(path, abs))
        return fk_err(FK_EIO, "plugin %s: no such file (a relative path is relative to %s)",
                      path, "the current directory");
    if (fk_sha256_file(abs, hex) < 0)
        return fk_err_context(FK_EIO, "plugin %s", path);
    for (int i = 0; i < g_n_plugins; i++)
        if (!strcmp(g_plugins[i].path, abs)) {
            if (strcmp(g_plugins[i].sha256, hex))
                return fk_err(FK_EINVAL, "plugin %s changed on disk since it was loaded", abs);
            return FK_OK;
        }
    if (g_n_plugins == FK_PLUGIN_MAX)
        return fk_err(FK_ENOTSUP, "plugin %s: more than %d plugins", path, FK_PLUGIN_MAX);
    dlerror();
    void *h = dlopen(abs, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return fk_err(FK_EINVAL, "plugin %s cannot be loaded: %s", abs, dlerror());
    union {
        void *obj;
        const struct fk_plugin *(*fn)(void);
    } entry;
    dlerror();
    entry.obj = dlsym(h, FK_PLUGIN_ENTRY);
    if (!entry.obj) {
        const char *why = dlerror();
        fk_err(FK_EINVAL, "plugin %s is no fadkv-bench plugin: it exports no " FK_PLUGIN_ENTRY
               "() (%s); see core/fk_codec.h, struct fk_plugin", abs, why ? why : "NULL");
        dlclose(h);
        return FK_EINVAL;
    }
    const struct fk_plugin *pl = entry.fn();
    int n = 0;
    if (plugin_check(abs, pl, &n) < 0) {
        dlclose(h);
        return FK_EINVAL;
    }
    const char *fam = pl->family && *pl->family ? pl->family : "plugin";
    struct plugin *p = &g_plugins[g_n_plugins];
    p->path = strdup(abs);
    p->family = strdup(fam);
    if (!p->path || !p->family) {
        free(p->path);
        free(p->family);
        dlclose(h);
        return fk_err(FK_ENOMEM, "plugin %s: out of memory", abs);
    }
    memcpy(p->sha256, hex, sizeof hex);
    p->handle = h;
    for (int k = 0; k < n; k++) {
        g_pcodecs[g_n_pcodecs] = pl->codecs[k];
        g_pcodec_plugin[g_n_pcodecs++] = g_n_plugins;
    }
    g_n_plugins++;
    return FK_OK;
}

const struct fk_evict_ops *fk_evict_find(const char *name)
{
    for (int i = 0; fk_evict_policies[i]; i++)
        if (!strcmp(fk_evict_policies[i]->name, name))
            return fk_evict_policies[i];
    return NULL;
}
