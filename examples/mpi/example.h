/*
 * example.h: the little the MPI examples share (header-only), around the
 * MPI channel API of include/strom_mpi.h (libstrom_mpi).
 *
 *   - OK(call): an unexpected error prints the rank, the call, the status
 *     and strom_mpi_last_error(), then aborts the job (exit status 2): an
 *     MPI program cannot carry on with a rank missing;
 *   - ex_options: the channel options every example takes from the
 *     environment (STROM_GROUP_FILE: attach to a running group;
 *     STROM_MPI_SERVERS_PER_NODE: embedded servers per node);
 *   - ex_topic / ex_done: a topic name that is unique on a shared group, and
 *     its deletion at the end there;
 *   - ex_pull: the next event, NULL at the end of the stream;
 *   - ex_all_ok: the verdict every rank agrees on (failed *checks* exit 1
 *     on every rank);
 *   - tiny readers of the flat JSON metadata the examples write.
 *
 * Servers, addresses and barriers are the channel's business: no example
 * starts a server or broadcasts an address.
 */
#ifndef STROM_MPI_EXAMPLE_H
#define STROM_MPI_EXAMPLE_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strom_mpi.h"

/* How long a pull may wait for the next event before the run is declared
 * stuck (the Makefile's timeout is the last resort). */
#define EX_PULL_TIMEOUT_MS 60000

static inline void ex_die(const char *file, int line, const char *what, strom_status s) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "[rank %d] %s:%d: %s -> %s (%d): %s\n", rank, file, line, what,
          strom_status_name(s), s, strom_mpi_last_error());
  MPI_Abort(MPI_COMM_WORLD, 2);
  exit(2);
}

/* Any status but STROM_OK is fatal. */
#define OK(call)                                               \
  do {                                                         \
    strom_status s_ = (call);                                  \
    if (s_ != STROM_OK) ex_die(__FILE__, __LINE__, #call, s_); \
  } while (0)

/* The defaults, plus what the environment says (the same on every rank
 * under mpirun, as a channel needs). */
static inline void ex_options(strom_mpi_channel_options *o) {
  OK(strom_mpi_channel_options_init(o));
  const char *group = getenv("STROM_GROUP_FILE");
  const char *per_node = getenv("STROM_MPI_SERVERS_PER_NODE");
  if (group && group[0]) o->group_file = group;
  if (per_node && per_node[0]) o->servers_per_node = atoi(per_node);
}

/* The topic's name: `base` with embedded servers (they are new), else
 * `base-<pid of rank 0>`, so that runs on a shared group do not meet. */
static inline void ex_topic(const strom_mpi_channel_options *o, const char *base, char *name,
                            size_t cap) {
  int rank = 0;
  long pid = (long)getpid();
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  if (o->group_file || o->master_addr) snprintf(name, cap, "%s-%ld", base, pid);
  else snprintf(name, cap, "%s", base);
}

/* After the verdict, before the close: on a shared group, rank 0 deletes
 * the run's topic (the embedded servers take theirs away at close). */
static inline void ex_done(const strom_mpi_channel *ch, const strom_mpi_channel_options *o,
                           const char *topic) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD); /* nobody streams any more */
  if (rank == 0 && (o->group_file || o->master_addr))
    OK(strom_topic_delete(strom_mpi_channel_driver(ch), topic));
}

/* The next event of this consumer rank; NULL at the end of the stream.
 * Anything else (a timeout, a gap) is fatal for these examples. */
static inline strom_event *ex_pull(strom_mpi_channel *ch) {
  strom_event *e = NULL;
  strom_status s = strom_mpi_channel_pull(ch, EX_PULL_TIMEOUT_MS, &e);
  if (s == STROM_END_OF_STREAM) return NULL;
  if (s != STROM_OK) ex_die(__FILE__, __LINE__, "strom_mpi_channel_pull", s);
  return e;
}

/* Every rank's verdict (1 = good) combined: 1 only if all ranks are good. */
static inline int ex_all_ok(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

/* Tiny JSON field readers for the flat metadata the examples write
 * ({"key":"text"} or {"key":123}); enough for them, not a JSON parser. */
static inline const char *ex_json_find(const char *json, size_t len, const char *key) {
  char pat[64];
  int n = snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = memmem(json, len, pat, (size_t)n);
  return p ? p + n : NULL;
}

static inline int ex_json_long(const char *json, size_t len, const char *key, long *out) {
  const char *p = ex_json_find(json, len, key);
  if (!p) return -1;
  char *end;
  *out = strtol(p, &end, 10);
  return end == p ? -1 : 0;
}

static inline int ex_json_str(const char *json, size_t len, const char *key, char *out,
                              size_t cap) {
  const char *p = ex_json_find(json, len, key);
  if (!p || *p != '"') return -1;
  p++;
  const char *q = memchr(p, '"', (size_t)(json + len - p));
  if (!q || (size_t)(q - p) >= cap) return -1;
  memcpy(out, p, (size_t)(q - p));
  out[q - p] = '\0';
  return 0;
}

#endif /* STROM_MPI_EXAMPLE_H */
