/* SPDX-License-Identifier: MIT
 * libFuzzer target: the TOML reader (harness/common/fk_toml.h).
 *
 * Properties checked on every input: fk_toml_parse either succeeds or fails with
 * FK_ECONFIG and a message that starts with "FILE:" (the origin); an accepted document
 * prints (fk_toml_to_string) to text that parses back as a value and prints identically;
 * clone and set_path work on it; the input as a single value (fk_toml_parse_value) and as a
 * dotted key (fk_toml_table_find) never crashes. Sanitizers catch memory errors and leaks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "common/fk_toml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fk_toml_value *v = NULL;
    int rc = fk_toml_parse((const char *)data, size, "f.toml", &v);
    if (rc == FK_OK) {
        char *s = NULL, *s2 = NULL;
        if (fk_toml_to_string(v, &s, NULL) != FK_OK)
            abort();
        struct fk_toml_value *b = NULL;
        if (fk_toml_parse_value(s, "c", &b) != FK_OK)
            abort();
        if (fk_toml_to_string(b, &s2, NULL) != FK_OK)
            abort();
        if (strcmp(s, s2))
            abort();
        struct fk_toml_value *c = NULL;
        if (fk_toml_clone(v, &c) != FK_OK)
            abort();
        struct fk_toml_value *one = NULL;
        if (fk_toml_parse_value("1", "x", &one) != FK_OK)
            abort();
        (void)fk_toml_set_path(c, "a.b", "x", &one);
        if (one)
            abort(); /* set_path takes ownership, also on error */
        free(s);
        free(s2);
        fk_toml_free(&b);
        fk_toml_free(&c);
    } else if (rc != FK_ECONFIG || strncmp(fk_errmsg(), "f.toml:", 7) || v) {
        abort();
    }
    fk_toml_free(&v);
    char *z = malloc(size + 1);
    if (!z)
        return 0;
    memcpy(z, data, size);
    z[size] = 0;
    if (fk_toml_parse_value(z, "v", &v) == FK_OK) {
        (void)fk_toml_table_find(v, "a.b");
        fk_toml_free(&v);
    }
    struct fk_toml_value *root = NULL;
    if (fk_toml_parse("[a.b]\nc = 1\n", 12, "k", &root) == FK_OK) {
        (void)fk_toml_table_find(root, z);
        fk_toml_free(&root);
    }
    free(z);
    return 0;
}
