/* SPDX-License-Identifier: MIT
 * The codec registry (codecs/fk_registry.c, generated from the one list in
 * codecs/meson.build, plus the plugins loaded at start-up) and what the harness gives
 * built-in codecs beyond the plugin interface of core/fk_codec.h. Internal: not installed.
 */
#ifndef FK_REGISTRY_H
#define FK_REGISTRY_H

#include "core/fk_codec.h"

/* What a built-in codec may take beyond the plugin interface (its fk_codec_ext, named
 * beside it in codecs/meson.build). Plugins never get it. */
struct fk_codec_ext {
    /* (optional) open() with the rows its events will hold, known in advance in a trace
     * replay: ahead [n_heads][n_tokens][head_dim] float32, kept by the harness until
     * close(). An aid to batch work only: the codec codes each event's rows as given and
     * reads ahead only where it checked they are equal. */
    int (*open_ahead)(const void *opts, const struct fk_stream_env *env, const float *ahead,
                      void **state);
};

/* Loads a plugin and registers its codecs (a file already loaded is not loaded again).
 * Errors name the file and what is wrong (cannot be opened, no fk_plugin_abi, ABI version
 * or struct sizes differ, a codec name taken by a built-in codec or another plugin). */
int fk_plugin_load(const char *path);
/* Every codec: the built-in ones (fk_codecs), then the plugins' in loading order. */
int fk_codec_count(void);
const struct fk_codec_ops *fk_codec_at(int i);
/* The plugin file of a codec (as loaded, made absolute) and its sha256, or NULL for a
 * built-in codec. */
const char *fk_codec_plugin(const struct fk_codec_ops *ops);
const char *fk_codec_plugin_sha256(const struct fk_codec_ops *ops);

extern const struct fk_codec_ops *const fk_codecs[]; /* NULL-terminated: built-in codecs */
/* The codec whose cost the relative cost columns divide by, unless a sweep says otherwise
 * ([sweep] cost_baseline): set next to the list in codecs/meson.build. */
extern const char *const fk_default_cost_baseline;
/* A codec by name, built-in or plugin's, or NULL. */
const struct fk_codec_ops *fk_codec_find(const char *name);
/* The family of a registered codec: the folder of its source ("dict", "quant", ...), a
 * plugin's declared family ("plugin" unless it names one), "" if ops is not registered. */
const char *fk_codec_family(const struct fk_codec_ops *ops);
/* The built-in extension of a codec, or NULL (plugins, codecs without one). */
const struct fk_codec_ext *fk_codec_ext(const struct fk_codec_ops *ops);
/* 1 when the codec opens with the rows ahead (its extension has open_ahead). */
int fk_codec_takes_ahead(const struct fk_codec_ops *ops);
/* Opens a stream group: through the extension's open_ahead with the rows ahead when the
 * codec has one and ahead is not NULL, else through ops->open. */
int fk_codec_open(const struct fk_codec_ops *ops, const void *opts,
                  const struct fk_stream_env *env, const float *ahead, void **state);
/* The buffer rule of stream `kind`: ops->buffer, or SLIDE with the common n_b and a_len. */
void fk_codec_buffer(const struct fk_codec_ops *ops, const void *opts, int kind,
                     struct fk_buffer *b);

#endif
