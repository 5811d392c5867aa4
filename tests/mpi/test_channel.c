/*
 * test_channel.c: the MPI channel API (include/strom_mpi.h) under mpirun.
 *
 * Run with 4 ranks (make test-ffi does): each check is collective and
 * every rank agrees on the verdict; the exit status is 0 only if all pass.
 *   - share:     2 producers, 2 consumers, 2 servers on the node; every
 *                element reaches exactly one consumer, each producer's in
 *                its order; the servers really are two members
 *   - broadcast: every consumer reads every element
 *   - datatypes: a strided column (MPI_Type_vector) pushed and unpacked
 *                contiguous, a subarray unpacked into a strided layout, the
 *                descriptor a consumer reads, a type mismatch refused, a
 *                freed type's reused handle, and records (an MPI struct)
 *   - operate:   the Operate callbacks, with acks that a second open of the
 *                channel resumes after
 *   - errors:    a bad argument on one rank fails the open on every rank
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strom_mpi.h"

#define N 50 /* events per producer */
#define TIMEOUT 60000

static int rank, size;
static int failures;

#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "[rank %d] %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      failures++;                                            \
    }                                                        \
  } while (0)

#define OK(call)                                                                       \
  do {                                                                                 \
    strom_status s_ = (call);                                                          \
    if (s_ != STROM_OK) {                                                              \
      fprintf(stderr, "[rank %d] %s:%d: %s -> %s: %s\n", rank, __FILE__, __LINE__, #call, \
              strom_status_name(s_), strom_mpi_last_error());                         \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                    \
    }                                                                                  \
  } while (0)

static long meta_long(const strom_event *e, const char *key) {
  size_t len = 0;
  const char *m = strom_event_metadata(e, &len);
  char pat[32];
  int n = snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = memmem(m, len, pat, (size_t)n);
  return p ? strtol(p + n, NULL, 10) : -1;
}

/* 2 producers (ranks 0, 1) and 2 consumers (ranks 2, 3), 2 servers. */
static void share(void) {
  int role = rank < 2 ? STROM_MPI_PRODUCER : STROM_MPI_CONSUMER;
  strom_mpi_channel_options o;
  strom_mpi_channel_options_init(&o);
  o.servers_per_node = 2;
  strom_mpi_channel *ch;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, role, "share", &o, &ch));
  uint32_t members = 0;
  OK(strom_driver_members(strom_mpi_channel_driver(ch), &members, NULL));
  CHECK(members == 2, "share: %u members, want 2", members);
  CHECK(strom_mpi_channel_producers(ch) == 2 && strom_mpi_channel_consumers(ch) == 2,
        "share: roles counted wrong");
  int seen[2][N] = {{0}};
  if (role == STROM_MPI_PRODUCER) {
    for (int i = 0; i < N; i++) {
      char meta[64];
      snprintf(meta, sizeof meta, "{\"p\":%d,\"i\":%d}", rank, i);
      double v[3] = {rank, i, rank * 1000.0 + i};
      OK(strom_mpi_channel_push(ch, v, 3, MPI_DOUBLE, meta));
    }
    OK(strom_mpi_channel_end(ch));
  } else {
    long last[2] = {-1, -1};
    strom_event *e;
    strom_status s;
    while ((s = strom_mpi_channel_pull(ch, TIMEOUT, &e)) == STROM_OK) {
      long p = meta_long(e, "p"), i = meta_long(e, "i");
      double v[3];
      OK(strom_mpi_event_unpack(e, v, 3, MPI_DOUBLE));
      CHECK(p >= 0 && p < 2 && i >= 0 && i < N, "share: bad metadata");
      if (p >= 0 && p < 2 && i >= 0 && i < N) {
        CHECK(i > last[p], "share: producer %ld's %ld after %ld", p, i, last[p]);
        CHECK(v[2] == p * 1000.0 + i, "share: wrong data");
        last[p] = i;
        seen[p][i]++;
      }
      OK(strom_event_ack(e));
      strom_event_free(e);
    }
    CHECK(s == STROM_END_OF_STREAM, "share: pull ended with %s", strom_status_name(s));
  }
  int total[2][N];
  MPI_Allreduce(seen, total, 2 * N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  for (int p = 0; p < 2; p++)
    for (int i = 0; i < N; i++) CHECK(total[p][i] == 1, "share: %d/%d seen %d times", p, i, total[p][i]);
  OK(strom_mpi_channel_close(&ch));
  CHECK(ch == NULL, "close left the handle");
}

/* Rank 0 produces; ranks 1..3 each read everything. */
static void broadcast(void) {
  int role = rank == 0 ? STROM_MPI_PRODUCER : STROM_MPI_CONSUMER;
  strom_mpi_channel_options o;
  strom_mpi_channel_options_init(&o);
  o.distribution = STROM_MPI_BROADCAST;
  o.partitions = 2;
  strom_mpi_channel *ch;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, role, "bcast", &o, &ch));
  if (role == STROM_MPI_PRODUCER) {
    for (int i = 0; i < N; i++) OK(strom_mpi_channel_push(ch, &i, 1, MPI_INT, NULL));
    OK(strom_mpi_channel_end(ch));
  } else {
    int n = 0, sum = 0;
    strom_event *e;
    while (strom_mpi_channel_pull(ch, TIMEOUT, &e) == STROM_OK) {
      int v;
      OK(strom_mpi_event_unpack(e, &v, 1, MPI_INT));
      sum += v, n++;
      strom_event_free(e);
    }
    CHECK(n == N && sum == N * (N - 1) / 2, "broadcast: rank %d read %d events, sum %d", rank, n,
          sum);
  }
  OK(strom_mpi_channel_close(&ch));
}

/* {double x; int32_t id;} as an MPI struct type. */
static MPI_Datatype record_type(void) {
  int lens[2] = {1, 1};
  MPI_Aint displs[2] = {0, 8};
  MPI_Datatype types[2] = {MPI_DOUBLE, MPI_INT32_T}, t, resized;
  MPI_Type_create_struct(2, lens, displs, types, &t);
  MPI_Type_create_resized(t, 0, 16, &resized);
  MPI_Type_free(&t);
  MPI_Type_commit(&resized);
  return resized;
}

/* Records: described as such, read back as records or raw bytes, and
 * refused as anything else. */
static void records(strom_mpi_channel *ch) {
  strom_event *e;
  OK(strom_mpi_channel_pull(ch, TIMEOUT, &e));
  strom_event_meta m;
  OK(strom_event_info(e, &m));
  const char *want = "{\"dtype\":\"|V12\",\"shape\":[2],\"order\":\"C\",\"mpi\":\"struct(1@0:MPI_DOUBLE,1@8:MPI_INT32_T)\"}";
  CHECK(m.descriptor_len == strlen(want) && memcmp(m.descriptor, want, m.descriptor_len) == 0,
        "records: descriptor %.*s", (int)m.descriptor_len, (const char *)m.descriptor);
  struct {
    double x;
    int32_t id;
  } back[2];
  MPI_Datatype rec = record_type();
  OK(strom_mpi_event_unpack(e, back, 2, rec));
  CHECK(back[0].x == 1.5 && back[1].id == 2, "records: read back %g %d", back[0].x, back[1].id);
  int n = 0;
  OK(strom_mpi_event_count(e, MPI_BYTE, &n));
  CHECK(n == 24, "records: %d raw bytes", n);
  int wrong[6];
  strom_status s = strom_mpi_event_unpack(e, wrong, 6, MPI_INT);
  CHECK(s == STROM_ERR_INVALID_ARGUMENT, "records: as ints gave %s", strom_status_name(s));
  MPI_Type_free(&rec);
  strom_event_free(e);
}

/* Strided layouts both ways, the descriptor, and a mismatch. */
static void datatypes(void) {
  int role = rank == 0 ? STROM_MPI_PRODUCER : rank == 1 ? STROM_MPI_CONSUMER : STROM_MPI_NONE;
  strom_mpi_channel *ch;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, role, "types", NULL, &ch));
  double grid[4][5]; /* rows of 5 */
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 5; c++) grid[r][c] = r * 10 + c;
  MPI_Datatype column, block;
  MPI_Type_vector(4, 1, 5, MPI_DOUBLE, &column);
  MPI_Type_commit(&column);
  int sizes[2] = {4, 5}, sub[2] = {2, 3}, starts[2] = {1, 1};
  MPI_Type_create_subarray(2, sizes, sub, starts, MPI_ORDER_C, MPI_DOUBLE, &block);
  MPI_Type_commit(&block);
  if (role == STROM_MPI_PRODUCER) {
    OK(strom_mpi_channel_push(ch, &grid[0][2], 1, column, "{\"what\":\"column 2\"}"));
    double flat[6] = {11, 12, 13, 21, 22, 23};
    OK(strom_mpi_channel_push(ch, flat, 6, MPI_DOUBLE, "{\"what\":\"block\"}"));
    /* A derived type freed and another made (MPI may reuse the handle):
     * the second push is described as what it is. */
    MPI_Datatype pair, triple;
    MPI_Type_vector(2, 1, 2, MPI_DOUBLE, &pair);
    MPI_Type_commit(&pair);
    OK(strom_mpi_channel_push(ch, flat, 1, pair, NULL));
    MPI_Type_free(&pair);
    MPI_Type_contiguous(3, MPI_INT, &triple);
    MPI_Type_commit(&triple);
    int ints[3] = {7, 8, 9};
    OK(strom_mpi_channel_push(ch, ints, 1, triple, NULL));
    MPI_Type_free(&triple);
    /* A record of two types. */
    struct rec {
      double x;
      int32_t id;
    } recs[2] = {{1.5, 1}, {2.5, 2}};
    MPI_Datatype rec = record_type();
    OK(strom_mpi_channel_push(ch, recs, 2, rec, NULL));
    MPI_Type_free(&rec);
    OK(strom_mpi_channel_end(ch));
  } else if (role == STROM_MPI_CONSUMER) {
    strom_event *e;
    OK(strom_mpi_channel_pull(ch, TIMEOUT, &e));
    strom_event_meta m;
    OK(strom_event_info(e, &m));
    const char *want = "{\"dtype\":\"<f8\",\"shape\":[4],\"order\":\"C\",\"mpi\":\"vector(4,1,5,MPI_DOUBLE)\"}";
    CHECK(m.descriptor_len == strlen(want) && memcmp(m.descriptor, want, m.descriptor_len) == 0,
          "datatypes: descriptor %.*s", (int)m.descriptor_len, (const char *)m.descriptor);
    int count = 0;
    OK(strom_mpi_event_count(e, MPI_DOUBLE, &count));
    CHECK(count == 4, "datatypes: count %d", count);
    double col[4];
    OK(strom_mpi_event_unpack(e, col, 4, MPI_DOUBLE));
    for (int r = 0; r < 4; r++) CHECK(col[r] == r * 10 + 2, "datatypes: column[%d] = %g", r, col[r]);
    int wrong[8];
    strom_status s = strom_mpi_event_unpack(e, wrong, 8, MPI_INT);
    CHECK(s == STROM_ERR_INVALID_ARGUMENT && strstr(strom_mpi_last_error(), "<f8"),
          "datatypes: ints from doubles gave %s: %s", strom_status_name(s), strom_mpi_last_error());
    strom_event_free(e);
    OK(strom_mpi_channel_pull(ch, TIMEOUT, &e));
    double into[4][5] = {{0}};
    OK(strom_mpi_event_unpack(e, into, 1, block));
    CHECK(into[1][1] == 11 && into[1][3] == 13 && into[2][1] == 21 && into[2][3] == 23 &&
              into[0][0] == 0 && into[3][4] == 0,
          "datatypes: the block landed wrong");
    strom_event_free(e);
    OK(strom_mpi_channel_pull(ch, TIMEOUT, &e));
    strom_event_free(e);
    OK(strom_mpi_channel_pull(ch, TIMEOUT, &e));
    OK(strom_event_info(e, &m));
    want = "{\"dtype\":\"<i4\",\"shape\":[3],\"order\":\"C\",\"mpi\":\"contiguous(3,MPI_INT)\"}";
    CHECK(m.descriptor_len == strlen(want) && memcmp(m.descriptor, want, m.descriptor_len) == 0,
          "datatypes: a reused handle's descriptor %.*s", (int)m.descriptor_len,
          (const char *)m.descriptor);
    int three[3];
    OK(strom_mpi_event_unpack(e, three, 3, MPI_INT));
    CHECK(three[0] == 7 && three[2] == 9, "datatypes: ints %d %d", three[0], three[2]);
    strom_event_free(e);
    records(ch);
    CHECK(strom_mpi_channel_pull(ch, TIMEOUT, &e) == STROM_END_OF_STREAM, "datatypes: no end");
  }
  MPI_Type_free(&column);
  MPI_Type_free(&block);
  OK(strom_mpi_channel_close(&ch));
}

typedef struct {
  int started, events, ended, stop_after;
} tally;

static void on_start(void *u) { ((tally *)u)->started++; }
static void on_end(void *u) { ((tally *)u)->ended++; }
static strom_status on_event(void *u, strom_event *e) {
  tally *t = u;
  (void)e;
  return ++t->events == t->stop_after ? STROM_ERR_CALLBACK : STROM_OK;
}

/* Operate in two jobs' worth of opens on one file-backed group: the second
 * resumes after the first's acks. */
static void operate(void) {
  char dir[256] = "";
  if (rank == 0) {
    snprintf(dir, sizeof dir, "%s/strom-test-op-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) MPI_Abort(MPI_COMM_WORLD, 2);
  }
  /* One rank hosts a server the two opens attach to. */
  strom_driver *server = NULL;
  char addr[256] = "";
  if (rank == 0) {
    OK(strom_driver_embedded(dir, &server));
    snprintf(addr, sizeof addr, "%s", strom_driver_master_addr(server));
  }
  MPI_Bcast(addr, sizeof addr, MPI_CHAR, 0, MPI_COMM_WORLD);
  strom_mpi_channel_options o;
  strom_mpi_channel_options_init(&o);
  o.master_addr = addr;
  o.partition_type = "file";
  o.partitions = 1;
  int role = rank == 0 ? STROM_MPI_PRODUCER : rank == 1 ? STROM_MPI_CONSUMER : STROM_MPI_NONE;
  tally first = {0, 0, 0, 20}, second = {0, 0, 0, 0};
  strom_mpi_channel *ch;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, role, "op", &o, &ch));
  strom_process_callbacks cb = {on_start, on_event, on_end};
  if (role == STROM_MPI_PRODUCER) {
    for (int i = 0; i < N; i++) OK(strom_mpi_channel_push(ch, &i, 1, MPI_INT, NULL));
    OK(strom_mpi_channel_end(ch));
  } else if (role == STROM_MPI_CONSUMER) {
    strom_status s = strom_mpi_channel_operate(ch, &cb, &first);
    CHECK(s == STROM_ERR_CALLBACK, "operate: stop gave %s", strom_status_name(s));
  }
  OK(strom_mpi_channel_close(&ch));
  /* The same channel again, consumers only: the 19 acked events are not
   * delivered again; the 20th (its callback failed) and the rest are. */
  int again = rank == 1 ? STROM_MPI_CONSUMER : STROM_MPI_NONE;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, again, "op", &o, &ch));
  if (again == STROM_MPI_CONSUMER) {
    OK(strom_mpi_channel_operate(ch, &cb, &second));
    CHECK(first.started == 1 && first.events == 20, "operate: first run %d/%d", first.started,
          first.events);
    CHECK(second.started == 1 && second.ended == 1 && second.events == N - 19,
          "operate: second run saw %d events, want %d", second.events, N - 19);
  }
  OK(strom_mpi_channel_close(&ch));
  MPI_Barrier(MPI_COMM_WORLD);
  strom_driver_free(server);
  if (rank == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "rm failed");
  }
}

/* One rank's bad argument fails the open everywhere, without a hang. */
static void errors(void) {
  strom_mpi_channel *ch = (strom_mpi_channel *)&ch;
  int role = rank == 3 ? 7 : STROM_MPI_CONSUMER;
  strom_status s = strom_mpi_channel_open(MPI_COMM_WORLD, role, "bad", NULL, &ch);
  CHECK(s == STROM_ERR_INVALID_ARGUMENT && ch == NULL, "errors: open gave %s",
        strom_status_name(s));
  CHECK(rank == 3 ? strstr(strom_mpi_last_error(), "role 7") != NULL
                  : strstr(strom_mpi_last_error(), "rank 3") != NULL,
        "errors: message %s", strom_mpi_last_error());
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) {
    if (rank == 0) fprintf(stderr, "run with 4 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  share();
  broadcast();
  datatypes();
  operate();
  errors();
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("MPI channel tests: %s (%d failures)\n", all ? "FAILED" : "passed", all);
  MPI_Finalize();
  return all ? 1 : 0;
}
