/*
 * fortran_check.c: the C side of fortran_push.f90.
 *
 * The Fortran module (include/strom.f90) covers producing; consuming is
 * easier in C, so the Fortran program calls strom_example_check (through a
 * bind(C) interface) on rank 0 to read the topic to its end and verify
 * every event, and strom_example_rmtree to remove its temporary directory.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strom.h"

/* The value rank r stores at index i (0-based) of step s's array; the same
 * formula as in fortran_push.f90. */
static double expected(int r, int s, int i) { return r * 1000.0 + s + i * 0.001; }

/* Reads `topic` to the end of the stream and checks that it holds exactly
 * one event per (rank, step), rank in [0, nranks), step in [1, nsteps],
 * each with metadata {"rank":r,"step":s} and `n` doubles of data.
 * Returns the number of problems found (0: all good). */
int strom_example_check(const strom_topic *topic, int nranks, int nsteps, int n) {
  int problems = 0, events = 0;
  int *seen = calloc((size_t)nranks * (size_t)nsteps, sizeof *seen);
  double *x = malloc((size_t)n * sizeof *x);
  strom_consumer *c = NULL;
  strom_status st = strom_consumer_open(topic, "fortran-check", NULL, &c);
  if (st != STROM_OK) {
    fprintf(stderr, "fortran_check: consumer: %s\n", strom_last_error());
    free(seen);
    free(x);
    return 1;
  }
  for (;;) {
    strom_event *e = NULL;
    st = strom_consumer_pull(c, 60000, &e);
    if (st == STROM_END_OF_STREAM) break;
    if (st != STROM_OK) {
      fprintf(stderr, "fortran_check: pull -> %s: %s\n", strom_status_name(st),
              strom_last_error());
      problems++;
      break;
    }
    events++;
    size_t mlen = 0, copied = 0;
    const char *meta = strom_event_metadata(e, &mlen);
    char text[128];
    snprintf(text, sizeof text, "%.*s", (int)mlen, meta);
    int r = -1, s = -1;
    if (sscanf(text, "{\"rank\":%d,\"step\":%d}", &r, &s) != 2 || r < 0 || r >= nranks ||
        s < 1 || s > nsteps) {
      fprintf(stderr, "fortran_check: unexpected metadata %s\n", text);
      problems++;
    } else if (strom_event_copy_data(e, x, (size_t)n * sizeof *x, &copied) != STROM_OK ||
               copied != (size_t)n * sizeof *x) {
      fprintf(stderr, "fortran_check: %s: %zu data bytes, not %zu\n", text,
              (size_t)strom_event_fetched_len(e), (size_t)n * sizeof *x);
      problems++;
    } else {
      int bad = 0;
      for (int i = 0; i < n; i++) bad += x[i] != expected(r, s, i);
      if (bad) fprintf(stderr, "fortran_check: %s: %d wrong values\n", text, bad);
      problems += bad != 0;
      seen[r * nsteps + (s - 1)]++;
    }
    strom_event_free(e);
  }
  strom_consumer_free(c);
  for (int k = 0; k < nranks * nsteps; k++) {
    if (seen[k] != 1) {
      fprintf(stderr, "fortran_check: rank %d step %d seen %d times\n", k / nsteps,
              k % nsteps + 1, seen[k]);
      problems++;
    }
  }
  printf("fortran_push: rank 0 consumed %d events of %d doubles from %d ranks x %d steps: %s\n",
         events, n, nranks, nsteps, problems ? "MISMATCH" : "all values as pushed");
  fflush(stdout);
  free(seen);
  free(x);
  return problems;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Removes a directory tree; 0 on success. */
int strom_example_rmtree(const char *dir) {
  return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
