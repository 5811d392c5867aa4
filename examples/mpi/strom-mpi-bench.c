/*
 * strom-mpi-bench.c: N producer ranks and M consumer ranks through an MPI
 * channel, in the style of the Mofka benchmark.
 *
 * Roles: ranks [0, M) are STROM_MPI_CONSUMERs, ranks [M, M+N)
 * STROM_MPI_PRODUCERs, others STROM_MPI_NONE; by default M = P / 2 and
 * N = P - M. The channel starts the embedded servers (or attaches to
 * STROM_GROUP_FILE's group).
 *
 * What it shows:
 *   1. strom_mpi_channel_open on a topic of -P partitions (default M) of
 *      type -t (options.partition_type: "memory" or "file"), events spread
 *      round-robin (options.selector), durability "never" as `strom bench`
 *      uses (options.durability); SHARE distribution: consumer j reads
 *      the partitions p with p % M == j. A barrier starts the clock (every
 *      wait in the timed part sleeps instead of spinning in MPI);
 *   2. each producer pushes E events of META bytes of JSON metadata and
 *      DATA bytes (MPI_BYTE elements), then strom_mpi_channel_end (its time
 *      ends there: every event acknowledged); each consumer pulls until
 *      STROM_END_OF_STREAM (its time ends there);
 *   3. MPI_Reduce: counts, bytes, and the slowest rank's time per side.
 *
 * -S runs the two phases one after the other, as `strom bench produce` and
 * `strom bench consume` do: a producers-only channel first; once every
 * producer ended, a consumers-only channel on the same topic, attached to
 * the first channel's group (options.master_addr), so nothing was
 * prefetched during the produce phase; the consumers' clock starts before
 * that open (which connects to the group and opens the consumers).
 * Without it, consumers read while producers push.
 *
 * Rank 0 prints ONE JSON object on stdout: produce_* and consume_* rates,
 * and end-to-end events/bytes/seconds/events_per_s/mb_per_s in the shape
 * of `strom bench --json`. Exit status 1 when the consumers did not get
 * exactly what the producers pushed.
 *
 * Usage: strom-mpi-bench [-p producers] [-c consumers] [-e events_per_producer]
 *          [-m metadata_bytes] [-d data_bytes] [-P partitions]
 *          [-t memory|file] [-b batch_events] [-S]
 * (-b: batches of that many events through options.producer; 0, the
 * default, is libstrom's adaptive batching.)
 */
#include "example.h"

#include <getopt.h>
#include <time.h>

typedef struct {
  int producers, consumers, partitions, sequential;
  long events, meta_size, data_size, batch;
  const char *type;
} config;

enum { PUSHED, PUSHED_BYTES, PULLED, PULLED_BYTES, BAD, NCOUNTS };

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [-p producers] [-c consumers] [-e events_per_producer]\n"
          "          [-m metadata_bytes] [-d data_bytes] [-P partitions]\n"
          "          [-t memory|file] [-b batch_events] [-S]\n",
          argv0);
}

static void parse(int argc, char **argv, config *c) {
  int opt;
  while ((opt = getopt(argc, argv, "p:c:e:m:d:P:t:b:Sh")) != -1) {
    switch (opt) {
      case 'p': c->producers = atoi(optarg); break;
      case 'c': c->consumers = atoi(optarg); break;
      case 'e': c->events = atol(optarg); break;
      case 'm': c->meta_size = atol(optarg); break;
      case 'd': c->data_size = atol(optarg); break;
      case 'P': c->partitions = atoi(optarg); break;
      case 't': c->type = optarg; break;
      case 'S': c->sequential = 1; break;
      case 'b': c->batch = atol(optarg); break;
      default: usage(argv[0]); exit(2);
    }
  }
}

/* Fills in the defaults for `ranks` ranks; 0 if the sizes make no sense. */
static int settle(config *c, int ranks) {
  if (c->consumers < 0) c->consumers = c->producers < 0 ? ranks / 2 : ranks - c->producers;
  if (c->producers < 0) c->producers = ranks - c->consumers;
  if (c->partitions < 0) c->partitions = c->consumers > 0 ? c->consumers : 1;
  return c->producers >= 1 && c->consumers >= 1 && c->producers + c->consumers <= ranks &&
         c->events >= 0 && c->meta_size >= 50 && c->data_size >= 0 && c->batch >= 0 &&
         c->partitions >= c->consumers;
}

/* Metadata of exactly `size` bytes (size >= 50 holds the fixed part):
 * {"p":<rank>,"i":<index>,"pad":"xxx..."}. The numbers have a fixed width,
 * so only they are rewritten per event; the padding is written once. */
static void make_metadata(char *buf, size_t size, int rank, long i) {
  char head[48];
  int n = snprintf(head, sizeof head, "{\"p\":%6d,\"i\":%12ld,\"pad\":\"", rank, i);
  if (buf[size - 1] != '}') {
    memset(buf, 'x', size);
    buf[size - 2] = '"';
    buf[size - 1] = '}';
  }
  memcpy(buf, head, (size_t)n);
}

/* A barrier that sleeps while it waits. MPI implementations spin in
 * MPI_Barrier, and a rank spinning while the others stream would take a
 * core from them (and from the servers) on a small node. */
static void quiet_barrier(void) {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    struct timespec nap = {0, 100 * 1000};
    nanosleep(&nap, NULL);
  }
}

/* A producer's E events, then the end of its stream. */
static void produce(strom_mpi_channel *ch, const config *c, int rank, long long counts[NCOUNTS]) {
  char *meta = calloc(1, (size_t)c->meta_size + 1); /* NUL-terminated */
  char *data = malloc(c->data_size ? (size_t)c->data_size : 1);
  for (long i = 0; i < c->data_size; i++) data[i] = (char)(i * 31 + rank);
  for (long i = 0; i < c->events; i++) {
    make_metadata(meta, (size_t)c->meta_size, rank, i);
    OK(strom_mpi_channel_push(ch, data, (int)c->data_size, MPI_BYTE, meta));
    counts[PUSHED]++;
    counts[PUSHED_BYTES] += c->meta_size + c->data_size;
  }
  OK(strom_mpi_channel_end(ch)); /* every event acknowledged */
  free(meta);
  free(data);
}

/* A consumer: pulls to the end of the stream. */
static void consume(strom_mpi_channel *ch, const config *c, long long counts[NCOUNTS]) {
  strom_event *e;
  while ((e = ex_pull(ch)) != NULL) {
    size_t mlen = 0;
    strom_event_metadata(e, &mlen);
    uint64_t dlen = strom_event_fetched_len(e);
    if (mlen != (size_t)c->meta_size || dlen != (uint64_t)c->data_size) counts[BAD]++;
    counts[PULLED]++;
    counts[PULLED_BYTES] += (long long)(mlen + dlen);
    strom_event_free(e);
  }
}

/* Rank 0: the JSON line, and whether everything arrived. */
static int report(const config *c, int attached, int ranks, const double slowest[2],
                  const long long t[NCOUNTS]) {
  long long expect = (long long)c->producers * c->events;
  int ok = t[PUSHED] == expect && t[PULLED] == expect && t[PULLED_BYTES] == t[PUSHED_BYTES] &&
           t[BAD] == 0;
  double ps = slowest[0] > 0 ? slowest[0] : 1e-9, cs = slowest[1] > 0 ? slowest[1] : 1e-9;
  double e2e = c->sequential ? ps + cs : ps > cs ? ps : cs;
  printf("{\"target\":\"strom://%s\",\"mode\":\"mpi\",\"producers\":%d,\"consumers\":%d,"
         "\"ranks\":%d,\"partitions\":%d,\"partition_type\":\"%s\",\"metadata_size\":%ld,"
         "\"data_size\":%ld,\"durability\":\"%s\",\"sequential\":%s,\"events\":%lld,"
         "\"produced\":%lld,"
         "\"consumed\":%lld,\"bytes\":%lld,"
         "\"produce_seconds\":%.6f,\"produce_events_per_s\":%.1f,\"produce_MB_per_s\":%.3f,"
         "\"consume_seconds\":%.6f,\"consume_events_per_s\":%.1f,\"consume_MB_per_s\":%.3f,"
         "\"seconds\":%.6f,\"events_per_s\":%.1f,\"mb_per_s\":%.3f,\"ok\":%s}\n",
         attached ? "group" : "embedded", c->producers, c->consumers, ranks, c->partitions,
         c->type, c->meta_size, c->data_size, "never",
         c->sequential ? "true" : "false", expect, t[PUSHED], t[PULLED],
         t[PUSHED_BYTES], ps, t[PUSHED] / ps, t[PUSHED_BYTES] / ps / 1e6, cs, t[PULLED] / cs,
         t[PULLED_BYTES] / cs / 1e6, e2e, t[PULLED] / e2e, t[PULLED_BYTES] / e2e / 1e6,
         ok ? "true" : "false");
  fflush(stdout);
  if (!ok)
    fprintf(stderr,
            "strom-mpi-bench: produced %lld events (%lld bytes), consumed %lld (%lld bytes), "
            "%lld of the wrong size; expected %lld\n",
            t[PUSHED], t[PUSHED_BYTES], t[PULLED], t[PULLED_BYTES], t[BAD], expect);
  return ok;
}

int main(int argc, char **argv) {
  config c = {.producers = -1, .consumers = -1, .partitions = -1, .events = 1000,
              .meta_size = 64, .data_size = 1024, .type = "memory"};
  parse(argc, argv, &c);
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!settle(&c, size) || c.data_size > INT32_MAX) {
    if (rank == 0) {
      fprintf(stderr,
              "strom-mpi-bench: need producers >= 1, consumers >= 1, producers + consumers <= "
              "ranks (%d), partitions >= consumers, metadata >= 50 bytes\n",
              size);
      usage(argv[0]);
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int is_consumer = rank < c.consumers;
  const int is_producer = !is_consumer && rank < c.consumers + c.producers;
  const int seq = c.sequential;

  strom_mpi_channel_options o;
  ex_options(&o);
  o.partitions = (uint32_t)c.partitions;
  o.partition_type = c.type;
  o.selector = "round-robin";
  o.durability = "never";
  strom_producer_options batching;
  OK(strom_producer_options_init(&batching));
  batching.batch_events = (uint32_t)c.batch;
  o.producer = &batching;
  char topic[64];
  ex_topic(&o, "bench", topic, sizeof topic);
  const int attached = o.group_file != NULL;
  /* With -S the consumers join a second channel, after the produce phase. */
  int role = (is_producer ? STROM_MPI_PRODUCER : STROM_MPI_NONE) |
             (is_consumer && !seq ? STROM_MPI_CONSUMER : STROM_MPI_NONE);
  strom_mpi_channel *ch, *consumers = NULL;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, role, topic, &o, &ch));

  long long counts[NCOUNTS] = {0}, totals[NCOUNTS];
  quiet_barrier(); /* every producer registered: the clock starts */
  double t0 = MPI_Wtime();
  if (is_producer) produce(ch, &c, rank, counts);
  double produced_at = MPI_Wtime() - t0;
  if (seq) {
    quiet_barrier(); /* every producer ended: the consume clock starts */
    t0 = MPI_Wtime();
    /* Opened now (its consumers start fetching at open), on the same group. */
    strom_mpi_channel_options again = o;
    if (!o.group_file) again.master_addr = strom_driver_master_addr(strom_mpi_channel_driver(ch));
    OK(strom_mpi_channel_open(MPI_COMM_WORLD, is_consumer ? STROM_MPI_CONSUMER : STROM_MPI_NONE,
                              topic, &again, &consumers));
  }
  if (is_consumer) consume(seq ? consumers : ch, &c, counts);
  double mine[2] = {is_producer ? produced_at : 0, is_consumer ? MPI_Wtime() - t0 : 0}, slowest[2];
  quiet_barrier(); /* ranks done early sleep while the others finish */
  MPI_Reduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(counts, totals, NCOUNTS, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

  int ok = rank != 0 || report(&c, attached, size, slowest, totals);
  ok = ex_all_ok(ok);
  if (consumers) OK(strom_mpi_channel_close(&consumers));
  ex_done(ch, &o, topic);
  OK(strom_mpi_channel_close(&ch));
  MPI_Finalize();
  return ok ? 0 : 1;
}
