/* SPDX-License-Identifier: MIT
 * The CSV reader (and field writer) of the results store (RFC 4180 quoting, first line = header): cells.csv,
 * summary.csv and the regression baselines.
 */
#ifndef FK_CSV_H
#define FK_CSV_H

struct fk_sb;

struct fk_csv {
    char **head;                 /* [n_cols] column names */
    int n_cols;                  /* columns */
    char ***rows;                /* [n_rows][n_cols] fields ("" when a row is short) */
    int n_rows;                  /* data rows (header excluded) */
};

/* Loads a CSV file; FK_EIO if unreadable, FK_ECORRUPT naming path:line on bad quoting. */
int fk_csv_load(const char *path, struct fk_csv *out);
void fk_csv_free(struct fk_csv *c);
/* Column index of name, or -1. */
int fk_csv_col(const struct fk_csv *c, const char *name);
/* Field as a number (NaN when empty, "nan" or not a number). */
double fk_csv_num(const struct fk_csv *c, int row, int col);
/* Field as text ("" when col < 0). */
const char *fk_csv_str(const struct fk_csv *c, int row, int col);

/* Appends v as one CSV field: quoted (quotes doubled) when it holds a comma, a quote or a
 * newline. */
void fk_csv_field(struct fk_sb *b, const char *v);

#endif
