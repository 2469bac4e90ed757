/* SPDX-License-Identifier: MIT
 * The list of codecs. It is generated: codecs/meson.build holds the one list (a codec's
 * name, source and ops symbol), and fk_registry_list.h carries it here.
 */
#include <string.h>

#include "core/fk_codec.h"
#include "core/fk_evict.h"
#include "fk_registry_list.h"

const struct fk_codec_ops *fk_codec_find(const char *name)
{
    for (int i = 0; fk_codecs[i]; i++)
        if (!strcmp(fk_codecs[i]->name, name))
            return fk_codecs[i];
    return NULL;
}


const char *fk_codec_family(const struct fk_codec_ops *ops)
{
    for (int i = 0; fk_codecs[i]; i++)
        if (fk_codecs[i] == ops)
            return fk_codec_families[i];
    return "";
}

const struct fk_evict_ops *fk_evict_find(const char *name)
{
    for (int i = 0; fk_evict_policies[i]; i++)
        if (!strcmp(fk_evict_policies[i]->name, name))
            return fk_evict_policies[i];
    return NULL;
}
