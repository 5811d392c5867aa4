/*
 * strom_mpi.h: the few helpers every MPI example shares (header-only).
 *
 * The server pattern of all the examples:
 *
 *   rank 0: mkdtemp() a data dir, strom_driver_embedded() in it (a server
 *           inside rank 0 on a free port), MPI_Bcast(strom_driver_master_addr())
 *   others: receive the address, strom_driver_connect_addr()
 *   rank 0: strom_topic_create(), MPI_Barrier, others strom_topic_open()
 *   ...     the example's streaming ...
 *   all:    free their handles, MPI_Barrier (rank 0's server must outlive
 *           every client), then rank 0 frees its driver and removes the dir.
 *
 * With STROM_GROUP_FILE set, every rank connects to that server group instead.
 *
 * Unexpected libstrom errors abort the whole job (smpi_die, the OK macro):
 * an MPI program cannot carry on with a rank missing. Failed *checks* are
 * reported by the examples themselves, which agree on the verdict with an
 * MPI_Allreduce so every rank cleans up and returns the same exit code.
 */
#ifndef STROM_MPI_H
#define STROM_MPI_H

#define _GNU_SOURCE
#include <ftw.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strom.h"

/* How long a pull may wait for the next event before the run is declared
 * stuck (the Makefile's timeout is the last resort). */
#define SMPI_PULL_TIMEOUT_MS 60000

typedef struct {
  int rank, size;
  strom_driver *driver;
  char dir[4096];  /* rank 0: the embedded server's data dir ("" elsewhere) */
  char topic[128]; /* the topic smpi_topic made */
} smpi;

static int smpi_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* Removes a directory tree (a temp dir this program made). */
static inline void smpi_rmtree(const char *dir) {
  if (dir[0] && nftw(dir, smpi_rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
}

/* Makes a fresh directory under $TMPDIR (or /tmp); path receives it. */
static inline int smpi_mkdtemp(char *path, size_t cap, const char *prefix) {
  const char *tmp = getenv("TMPDIR");
  snprintf(path, cap, "%s/%s-XXXXXX", tmp && tmp[0] ? tmp : "/tmp", prefix);
  return mkdtemp(path) ? 0 : -1;
}

static smpi *smpi_self; /* for smpi_die's clean-up */

/* Reports a fatal error and aborts every rank. When rank 0 is the one
 * failing it removes its data dir first; when another rank fails, rank 0 is
 * killed and its dir stays, for inspection. */
static inline void smpi_die(const char *file, int line, const char *what, strom_status s) {
  int rank = smpi_self ? smpi_self->rank : -1;
  fprintf(stderr, "[rank %d] %s:%d: %s -> %s (%d): %s\n", rank, file, line, what,
          strom_status_name(s), s, strom_last_error());
  if (smpi_self) smpi_rmtree(smpi_self->dir);
  MPI_Abort(MPI_COMM_WORLD, 2);
  exit(2);
}

/* Any status but STROM_OK is fatal. */
#define OK(call)                                                 \
  do {                                                           \
    strom_status s_ = (call);                                    \
    if (s_ != STROM_OK) smpi_die(__FILE__, __LINE__, #call, s_); \
  } while (0)

/* Starts the server on rank 0 and connects every other rank to it. With
 * STROM_GROUP_FILE set, every rank connects to that group instead (servers
 * started apart, e.g. `mpirun strom server`), and no server is embedded. */
static inline void smpi_init(smpi *m, int *argc, char ***argv) {
  MPI_Init(argc, argv);
  memset(m, 0, sizeof *m);
  smpi_self = m;
  MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &m->size);
  const char *group = getenv("STROM_GROUP_FILE");
  if (group && group[0]) {
    OK(strom_driver_connect(group, &m->driver));
    return;
  }
  char addr[256] = "";
  if (m->rank == 0) {
    if (smpi_mkdtemp(m->dir, sizeof m->dir, "strom-mpi") != 0) {
      perror("mkdtemp");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    OK(strom_driver_embedded(m->dir, &m->driver));
    snprintf(addr, sizeof addr, "%s", strom_driver_master_addr(m->driver));
  }
  MPI_Bcast(addr, sizeof addr, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (m->rank != 0) OK(strom_driver_connect_addr(addr, &m->driver));
}

/* Rank 0 creates the topic, then every rank opens it (collective). On a
 * shared group (STROM_GROUP_FILE) the name gets a unique suffix, and
 * smpi_finish deletes the topic. */
static inline strom_topic *smpi_topic(smpi *m, const strom_topic_spec *spec) {
  strom_topic_spec s = *spec;
  if (m->rank == 0 && m->dir[0])
    snprintf(m->topic, sizeof m->topic, "%s", spec->name);
  else if (m->rank == 0)
    snprintf(m->topic, sizeof m->topic, "%s-%ld", spec->name, (long)getpid());
  MPI_Bcast(m->topic, sizeof m->topic, MPI_CHAR, 0, MPI_COMM_WORLD);
  s.name = m->topic;
  strom_topic *t = NULL;
  if (m->rank == 0) OK(strom_topic_create(m->driver, &s, &t));
  MPI_Barrier(MPI_COMM_WORLD);
  if (m->rank != 0) OK(strom_topic_open(m->driver, s.name, &t));
  return t;
}

/* Every rank's verdict (1 = good) combined: 1 only if all ranks are good. */
static inline int smpi_all_ok(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

/* Collective end: waits for every rank, stops the server, removes its dir. */
static inline void smpi_finish(smpi *m) {
  MPI_Barrier(MPI_COMM_WORLD); /* no rank still talks to rank 0's server */
  if (m->rank == 0 && !m->dir[0] && m->topic[0]) OK(strom_topic_delete(m->driver, m->topic));
  strom_driver_free(m->driver);
  m->driver = NULL;
  if (m->rank == 0) smpi_rmtree(m->dir);
  smpi_self = NULL;
  MPI_Finalize();
}

/* Pulls the next event; NULL at the end of the stream. Anything else
 * (a timeout, a gap) is fatal for these examples. */
static inline strom_event *smpi_pull(const strom_consumer *c) {
  strom_event *e = NULL;
  strom_status s = strom_consumer_pull(c, SMPI_PULL_TIMEOUT_MS, &e);
  if (s == STROM_END_OF_STREAM) return NULL;
  if (s != STROM_OK) smpi_die(__FILE__, __LINE__, "strom_consumer_pull", s);
  return e;
}

/* Tiny JSON field readers for the flat metadata the examples write
 * ({"key":"text"} or {"key":123}); enough for them, not a JSON parser. */
static inline const char *smpi_json_find(const char *json, size_t len, const char *key) {
  char pat[64];
  int n = snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = memmem(json, len, pat, (size_t)n);
  return p ? p + n : NULL;
}

static inline int smpi_json_long(const char *json, size_t len, const char *key, long *out) {
  const char *p = smpi_json_find(json, len, key);
  if (!p) return -1;
  char *end;
  *out = strtol(p, &end, 10);
  return end == p ? -1 : 0;
}

static inline int smpi_json_str(const char *json, size_t len, const char *key, char *out,
                                size_t cap) {
  const char *p = smpi_json_find(json, len, key);
  if (!p || *p != '"') return -1;
  p++;
  const char *q = memchr(p, '"', (size_t)(json + len - p));
  if (!q || (size_t)(q - p) >= cap) return -1;
  memcpy(out, p, (size_t)(q - p));
  out[q - p] = '\0';
  return 0;
}

#endif /* STROM_MPI_H */
