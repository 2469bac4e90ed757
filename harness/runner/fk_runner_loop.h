/* SPDX-License-Identifier: MIT
 * The runner's part of a model dataset (struct fk_dataset.model): its exact decodes, written
 * as the dataset's traces before any cell, and each cell's codec in the loop
 * (harness/loop) after its replay. OpenBLAS runs one thread in both (bit-identical numbers).
 */
#ifndef FK_RUNNER_LOOP_H
#define FK_RUNNER_LOOP_H

#include "engine/fk_replay.h"
#include "engine/fk_sweep.h"
#include "loop/fk_loop.h"
#include "store/fk_results.h"

/* Loads ds's model, decodes every prompt exactly and, with write, writes the decodes at
 * ds->traces[i] (creating their folder), replacing what is there (the same bytes for the
 * same dataset). A worker process (isolation) reads the traces its run wrote: write 0. */
int fk_runner_model_dataset(const struct fk_dataset *ds, int write, struct fk_loop_set **out);
/* Runs in's codec in the loop on every prompt of set, teacher-forced and free-running. */
int fk_runner_loop_cell(const struct fk_loop_set *set, const struct fk_cell_input *in,
                        struct fk_cell_loop *out);
void fk_runner_loop_free(struct fk_cell_loop *l);

#endif
