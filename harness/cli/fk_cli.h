/* SPDX-License-Identifier: MIT
 * The commands of the command line, one function each: argv[0] is the command's own name
 * ("plot", "check", "omp" for `bench omp`, ...). Each parses its arguments, calls the
 * library and prints; it returns the process exit status: 0 ok, 1 runtime error, 2 usage
 * error (130 after an interrupt). The table that maps names to them is in fk_cli.c.
 */
#ifndef FK_CLI_H
#define FK_CLI_H

#include <stddef.h>

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
int fk_cli_train_calib(int argc, char **argv);
int fk_cli_bench_omp(int argc, char **argv);
int fk_cli_bench_replay(int argc, char **argv);
int fk_cli_bench_loop(int argc, char **argv);
int fk_cli_plot(int argc, char **argv);
int fk_cli_check(int argc, char **argv);
int fk_cli_merge(int argc, char **argv);
int fk_cli_prune(int argc, char **argv);
int fk_cli_conformance(int argc, char **argv);
int fk_cli_metrics(int argc, char **argv);

/* Kernel honesty of the benchmarks (fk_cli_kernels.c): `--kernels MODE` reruns the benchmark
 * in a child process with other OpenBLAS kernels and prints its figures in a column of
 * their own. MODE: best (OPENBLAS_CORETYPE unset in the child: the kernels OpenBLAS picks
 * for this CPU; skipped when this run has them already), a core name (OPENBLAS_CORETYPE=NAME,
 * e.g. Haswell), same (the child keeps this environment: the mechanism alone), none. */
#define FK_CLI_FIGS_MAX 96
struct fk_cli_figs {
    int n;
    char name[FK_CLI_FIGS_MAX][48];
    char value[FK_CLI_FIGS_MAX][48];
};
/* 0 and *mode = v when v is a mode (a core name is letters and digits), else -1. */
int fk_cli_kernels_mode(const char *v, const char **mode);
/* 1 when mode asks for a child run (not none; best only when OPENBLAS_CORETYPE is set). */
int fk_cli_kernels_wanted(const char *mode);
/* How this run's kernels were chosen: "OPENBLAS_CORETYPE set" or "chosen for this CPU". */
const char *fk_cli_kernels_origin(void);
/* Runs `fadkv-bench bench ARGV... --tsv --kernels none` (argv[0]: omp or replay) with
 * mode's OPENBLAS_CORETYPE and reads its NAME<TAB>VALUE lines. 0, or -1 with err set. */
int fk_cli_kernels_child(const char *mode, int argc, char **argv, struct fk_cli_figs *figs,
                         char *err, size_t cap);
/* The value of figure name (NULL: the child did not print it). */
const char *fk_cli_fig(const struct fk_cli_figs *figs, const char *name);
/* How a figure is shown: its NAME, label and printf format. */
struct fk_cli_fig_label {
    const char *name, *label, *fmt;
};
/* The kernel-set table: runs the child with mode's kernels, then one with this run's again,
 * and prints each figure of own (those of labels, NULL-name terminated, in that order; or
 * all of own by name when labels is NULL) in the three runs, with other / mean(this, again);
 * a codes_hash figure is compared. A child that fails is reported in a line. */
void fk_cli_kernels_compare(const char *mode, int argc, char **argv,
                            const struct fk_cli_figs *own,
                            const struct fk_cli_fig_label *labels);

#endif
