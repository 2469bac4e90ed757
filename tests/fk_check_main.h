/* SPDX-License-Identifier: MIT
 * The main() tail every Check suite shares: run the suite, exit non-zero if a test failed.
 */
#ifndef FK_CHECK_MAIN_H
#define FK_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

static inline int fk_suite_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
