/* SPDX-License-Identifier: MIT
 * `fadkv-bench trace` subcommand (llama2.c decode traces). argv[0] = "trace".
 * Returns the process exit status: 0 ok, 1 runtime error, 2 usage error.
 */
#ifndef FK_CLI_TRACE_H
#define FK_CLI_TRACE_H

int fk_cli_trace(int argc, char **argv);

#endif
