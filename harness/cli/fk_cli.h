/* SPDX-License-Identifier: MIT
 * The commands of the command line, one function each: argv[0] is the command's own name
 * ("plot", "check", "omp" for `bench omp`, ...). Each parses its arguments, calls the
 * library and prints; it returns the process exit status: 0 ok, 1 runtime error, 2 usage
 * error (130 after an interrupt). The table that maps names to them is in fk_cli.c.
 */
#ifndef FK_CLI_H
#define FK_CLI_H

/* Process-wide set-up, once, before a command: HDF5's error printing and GSL's aborting
 * error handler off (errors come back as values), SIGXFSZ ignored (EFBIG is reported). */
void fk_cli_init(void);
/* Prints one line per damaged cell of results directory dir (files that do not match their
 * record, so every reader skips them), prefixed by the command's name; returns how many. */
int fk_cli_warn_damaged(const char *cmd, const char *dir);

int fk_cli_sweep(int argc, char **argv);
int fk_cli_codecs(int argc, char **argv);
int fk_cli_info(int argc, char **argv);
int fk_cli_synth(int argc, char **argv);
int fk_cli_trace(int argc, char **argv);
int fk_cli_loop(int argc, char **argv);
int fk_cli_train_dict(int argc, char **argv);
int fk_cli_train_basis(int argc, char **argv);
int fk_cli_bench_omp(int argc, char **argv);
int fk_cli_bench_replay(int argc, char **argv);
int fk_cli_bench_loop(int argc, char **argv);
int fk_cli_plot(int argc, char **argv);
int fk_cli_check(int argc, char **argv);
int fk_cli_merge(int argc, char **argv);
int fk_cli_prune(int argc, char **argv);
int fk_cli_conformance(int argc, char **argv);

#endif
