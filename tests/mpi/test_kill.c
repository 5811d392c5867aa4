/*
 * test_kill.c: what a channel does when a consumer rank's process dies
 * (docs/mpi.md, "When a rank dies"). tests/mpi/kill.sh runs it under
 * mpirun -n 4 in these modes:
 *
 *   test_kill GROUP produce N       every rank pushes N ints to partition
 *                                   = its rank, then ends (GROUP: the
 *                                   group file of a group that outlives
 *                                   the jobs)
 *   test_kill GROUP consume-die K V  consumer rank V acks K events (each ack
 *                                   persisted), then SIGKILLs itself; the
 *                                   other ranks wait in a barrier, so the
 *                                   job can only end by MPI aborting it
 *   test_kill GROUP consume K V      every rank reads its partition to the
 *                                   end: rank V must resume after its K
 *                                   acked events, the others read all N
 *   test_kill - embedded-die         embedded servers; consumer rank 3 dies
 *                                   after its first event: the job must
 *                                   end (non-zero), not hang
 *
 * Exit status 0 when the mode's expectation holds.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strom_mpi.h"

#define N_EMBEDDED 200
#define TIMEOUT 60000

static int rank;

static void must(strom_status s, const char *what) {
  if (s == STROM_OK) return;
  fprintf(stderr, "[rank %d] %s -> %s: %s\n", rank, what, strom_status_name(s),
          strom_mpi_last_error());
  MPI_Abort(MPI_COMM_WORLD, 2);
}

static strom_mpi_channel *open_channel(const char *group, int role) {
  strom_mpi_channel_options o;
  strom_mpi_channel_options_init(&o);
  if (strcmp(group, "-") != 0) o.group_file = group, o.partition_type = "file";
  o.partitions = 4;
  strom_mpi_channel *ch = NULL;
  must(strom_mpi_channel_open(MPI_COMM_WORLD, role, "kill", &o, &ch), "open");
  return ch;
}

static void produce(strom_mpi_channel *ch, int n) {
  for (int i = 0; i < n; i++) must(strom_mpi_channel_push(ch, &i, 1, MPI_INT, NULL), "push");
  must(strom_mpi_channel_end(ch), "end");
}

/* Reads to the end; returns how many events, and the first one's value. */
static int drain(strom_mpi_channel *ch, int *first) {
  int n = 0;
  strom_event *e;
  strom_status s;
  *first = -1;
  while ((s = strom_mpi_channel_pull(ch, TIMEOUT, &e)) == STROM_OK) {
    int v = -1;
    must(strom_mpi_event_unpack(e, &v, 1, MPI_INT), "unpack");
    if (n++ == 0) *first = v;
    must(strom_event_ack(e), "ack");
    strom_event_free(e);
  }
  if (s != STROM_END_OF_STREAM) must(s, "pull");
  return n;
}

/* Consumer rank `victim` acks `k` events for good, then dies. */
static void consume_die(strom_mpi_channel *ch, int k, int victim) {
  if (rank != victim) {
    MPI_Barrier(MPI_COMM_WORLD); /* never returns: the victim never joins */
    fprintf(stderr, "[rank %d] the barrier returned without the victim\n", rank);
    exit(1);
  }
  for (int i = 0; i < k; i++) {
    strom_event *e;
    must(strom_mpi_channel_pull(ch, TIMEOUT, &e), "pull");
    must(strom_event_ack_sync(e, TIMEOUT), "ack_sync");
    strom_event_free(e);
  }
  fprintf(stderr, "[rank %d] acked %d events; killing myself\n", rank, k);
  raise(SIGKILL);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 3) {
    fprintf(stderr, "usage: test_kill GROUP_FILE|- MODE [ARGS]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char *group = argv[1], *mode = argv[2];
  int a = argc > 3 ? atoi(argv[3]) : 0, victim = argc > 4 ? atoi(argv[4]) : 0;
  int ok = 1;
  if (strcmp(mode, "produce") == 0) {
    strom_mpi_channel *ch = open_channel(group, STROM_MPI_PRODUCER);
    produce(ch, a);
    must(strom_mpi_channel_close(&ch), "close");
  } else if (strcmp(mode, "consume-die") == 0) {
    strom_mpi_channel *ch = open_channel(group, STROM_MPI_CONSUMER);
    consume_die(ch, a, victim);
  } else if (strcmp(mode, "consume") == 0) {
    strom_mpi_channel *ch = open_channel(group, STROM_MPI_CONSUMER);
    int first, n = drain(ch, &first), total = 0;
    int want_first = rank == victim ? a : 0;
    MPI_Allreduce(&n, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("consumer %d: %d events from value %d (after the restart)\n", rank, n, first);
    ok = first == want_first;
    must(strom_mpi_channel_close(&ch), "close");
    if (rank == 0) printf("{\"events_after_restart\":%d}\n", total);
  } else if (strcmp(mode, "embedded-die") == 0) {
    int role = rank < 2 ? STROM_MPI_PRODUCER : STROM_MPI_CONSUMER;
    strom_mpi_channel *ch = open_channel("-", role);
    if (role == STROM_MPI_PRODUCER) produce(ch, N_EMBEDDED);
    else if (rank == 3) consume_die(ch, 1, 3);
    else ok = drain(ch, &(int){0}) > 0;
    must(strom_mpi_channel_close(&ch), "close"); /* waits for rank 3: never returns */
    fprintf(stderr, "[rank %d] closed a channel whose consumer died\n", rank);
    ok = 0;
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    ok = 0;
  }
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return all ? 0 : 1;
}
