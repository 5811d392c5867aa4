/*
 * strom-mpi-bench.c: N producer ranks and M consumer ranks through Strom,
 * in the style of the Mofka benchmark.
 *
 * Roles: ranks [0, M) consume, ranks [M, M+N) produce, others idle; by
 * default M = P / 2 and N = P - M. Rank 0 also hosts the embedded server
 * (or every rank connects to STROM_GROUP_FILE's servers).
 *
 * The MPI pattern:
 *   1. rank 0 creates the topic (partitions default to M, "memory");
 *   2. producers open their producers, consumer j opens a consumer on the
 *      partitions p with p % M == j, then a barrier: the clock starts
 *      (every wait in the timed part sleeps instead of spinning in MPI);
 *   3. each producer pushes E events of META bytes of JSON metadata and
 *      DATA bytes of data, then closes (its time ends when close returns:
 *      every event acknowledged); each consumer pulls until
 *      STROM_END_OF_STREAM (its time ends there);
 *   4. MPI_Reduce: counts, bytes, and the slowest rank's time per side.
 *
 * Rank 0 prints ONE JSON object on stdout: produce_* and consume_* rates,
 * and end-to-end events/bytes/seconds/events_per_s/mb_per_s in the shape
 * of `strom bench --json`. Exit status 1 when the consumers did not get
 * exactly what the producers pushed.
 *
 * Usage: strom-mpi-bench [-p producers] [-c consumers] [-e events_per_producer]
 *          [-m metadata_bytes] [-d data_bytes] [-P partitions]
 *          [-t memory|file] [-b batch_events] [-S]
 *
 * -S runs the two phases one after the other, as `strom bench produce` and
 * `strom bench consume` do: the consumers start their clock once every
 * producer has closed. Without it, consumers read while producers push.
 */
#include "strom_mpi.h"

#include <getopt.h>
#include <time.h>

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [-p producers] [-c consumers] [-e events_per_producer]\n"
          "          [-m metadata_bytes] [-d data_bytes] [-P partitions]\n"
          "          [-t memory|file] [-b batch_events] [-S]\n",
          argv0);
}

/* Metadata of exactly `size` bytes (size >= 50 holds the fixed part):
 * {"p":<rank>,"i":<index>,"pad":"xxx..."}. The numbers have a fixed width,
 * so only they are rewritten per event; the padding is written once. */
static size_t make_metadata(char *buf, size_t size, int rank, long i) {
  char head[48];
  int n = snprintf(head, sizeof head, "{\"p\":%6d,\"i\":%12ld,\"pad\":\"", rank, i);
  if (buf[size - 1] != '}') {
    memset(buf, 'x', size);
    buf[size - 2] = '"';
    buf[size - 1] = '}';
  }
  memcpy(buf, head, (size_t)n);
  return size;
}

/* A barrier that sleeps while it waits. MPI implementations spin in
 * MPI_Barrier, and a rank spinning while the others stream would take a
 * core from them (and from the server) on a small node. */
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

/* A consumer of this rank's share of the partitions. */
static strom_consumer *open_consumer(strom_topic *topic, smpi *m, int partitions, int consumers) {
  uint32_t *mine = malloc((size_t)partitions * sizeof *mine);
  size_t nmine = 0;
  for (int p = m->rank; p < partitions; p += consumers) mine[nmine++] = (uint32_t)p;
  strom_consumer_options o;
  OK(strom_consumer_options_init(&o));
  o.partitions = mine;
  o.npartitions = nmine;
  char name[32];
  snprintf(name, sizeof name, "bench-%d", m->rank);
  strom_consumer *consumer = NULL;
  OK(strom_consumer_open(topic, name, &o, &consumer));
  free(mine);
  return consumer;
}

enum { PUSHED, PUSHED_BYTES, PULLED, PULLED_BYTES, BAD, NCOUNTS };

int main(int argc, char **argv) {
  int producers = -1, consumers = -1, partitions = -1, batch = 0, sequential = 0, opt;
  long events = 1000;
  long meta_size = 64, data_size = 1024;
  const char *type = "memory";
  while ((opt = getopt(argc, argv, "p:c:e:m:d:P:t:b:Sh")) != -1) {
    switch (opt) {
      case 'p': producers = atoi(optarg); break;
      case 'c': consumers = atoi(optarg); break;
      case 'e': events = atol(optarg); break;
      case 'm': meta_size = atol(optarg); break;
      case 'd': data_size = atol(optarg); break;
      case 'P': partitions = atoi(optarg); break;
      case 't': type = optarg; break;
      case 'b': batch = atoi(optarg); break;
      case 'S': sequential = 1; break;
      default: usage(argv[0]); return 2;
    }
  }
  smpi m;
  smpi_init(&m, &argc, &argv);
  if (consumers < 0) consumers = producers < 0 ? m.size / 2 : m.size - producers;
  if (producers < 0) producers = m.size - consumers;
  if (partitions < 0) partitions = consumers > 0 ? consumers : 1;
  if (producers < 1 || consumers < 1 || producers + consumers > m.size || events < 0 ||
      meta_size < 50 || data_size < 0 || partitions < consumers) {
    if (m.rank == 0) {
      fprintf(stderr,
              "strom-mpi-bench: need producers >= 1, consumers >= 1, producers + consumers <= "
              "ranks (%d), partitions >= consumers, metadata >= 50 bytes\n",
              m.size);
      usage(argv[0]);
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int is_consumer = m.rank < consumers;
  const int is_producer = !is_consumer && m.rank < consumers + producers;

  strom_topic_spec spec;
  OK(strom_topic_spec_init(&spec, "bench", (uint32_t)partitions));
  spec.partition_type = type;
  spec.durability = "never";
  strom_topic *topic = smpi_topic(&m, &spec);

  strom_producer *producer = NULL;
  strom_consumer *consumer = NULL;
  if (is_producer) {
    strom_producer_options po;
    OK(strom_producer_options_init(&po));
    po.batch_events = (uint32_t)batch;
    OK(strom_producer_open(topic, &po, &producer));
  }
  if (is_consumer && !sequential) consumer = open_consumer(topic, &m, partitions, consumers);
  char *meta = calloc(1, (size_t)meta_size + 1);
  char *data = malloc(data_size ? (size_t)data_size : 1);
  for (long i = 0; i < data_size; i++) data[i] = (char)(i * 31 + m.rank);

  long long counts[NCOUNTS] = {0}, totals[NCOUNTS];
  quiet_barrier(); /* every producer registered: the clock starts */
  double t0 = MPI_Wtime();
  if (is_producer) {
    strom_iovec iov = {data, (size_t)data_size};
    for (long i = 0; i < events; i++) {
      size_t len = make_metadata(meta, (size_t)meta_size, m.rank, i);
      OK(strom_producer_push(producer, meta, len, &iov, data_size ? 1 : 0, NULL));
      counts[PUSHED]++;
      counts[PUSHED_BYTES] += (long long)(len + (size_t)data_size);
    }
    OK(strom_producer_close(producer)); /* every event acknowledged */
  }
  double produced_at = MPI_Wtime() - t0;
  if (sequential) {
    quiet_barrier(); /* every producer closed: the consume clock starts */
    t0 = MPI_Wtime();
    /* Opened now, so that nothing was prefetched during the produce phase. */
    if (is_consumer) consumer = open_consumer(topic, &m, partitions, consumers);
  }
  if (is_consumer) {
    strom_event *e;
    while ((e = smpi_pull(consumer)) != NULL) {
      size_t mlen = 0;
      strom_event_metadata(e, &mlen);
      uint64_t dlen = strom_event_fetched_len(e);
      if (mlen != (size_t)meta_size || dlen != (uint64_t)data_size) counts[BAD]++;
      counts[PULLED]++;
      counts[PULLED_BYTES] += (long long)(mlen + dlen);
      strom_event_free(e);
    }
  }
  double mine[2] = {is_producer ? produced_at : 0, is_consumer ? MPI_Wtime() - t0 : 0};
  double slowest[2];
  quiet_barrier(); /* ranks done early sleep while the others finish */
  MPI_Reduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(counts, totals, NCOUNTS, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

  strom_consumer_free(consumer);
  strom_producer_free(producer);
  strom_topic_free(topic);
  free(meta);
  free(data);

  int ok = 1;
  if (m.rank == 0) {
    long long expect = (long long)producers * events;
    ok = totals[PUSHED] == expect && totals[PULLED] == expect &&
         totals[PULLED_BYTES] == totals[PUSHED_BYTES] && totals[BAD] == 0;
    double ps = slowest[0] > 0 ? slowest[0] : 1e-9, cs = slowest[1] > 0 ? slowest[1] : 1e-9;
    double e2e = sequential ? ps + cs : ps > cs ? ps : cs;
    printf("{\"target\":\"strom://%s\",\"mode\":\"mpi\",\"producers\":%d,\"consumers\":%d,"
           "\"ranks\":%d,\"partitions\":%d,\"partition_type\":\"%s\",\"metadata_size\":%ld,"
           "\"data_size\":%ld,\"batch\":%d,\"sequential\":%s,\"events\":%lld,\"produced\":%lld,\"consumed\":%lld,"
           "\"bytes\":%lld,"
           "\"produce_seconds\":%.6f,\"produce_events_per_s\":%.1f,\"produce_MB_per_s\":%.3f,"
           "\"consume_seconds\":%.6f,\"consume_events_per_s\":%.1f,\"consume_MB_per_s\":%.3f,"
           "\"seconds\":%.6f,\"events_per_s\":%.1f,\"mb_per_s\":%.3f,\"ok\":%s}\n",
           m.dir[0] ? "embedded" : "group", producers, consumers, m.size, partitions, type,
           meta_size, data_size, batch, sequential ? "true" : "false", expect, totals[PUSHED], totals[PULLED],
           totals[PUSHED_BYTES], ps, totals[PUSHED] / ps, totals[PUSHED_BYTES] / ps / 1e6, cs,
           totals[PULLED] / cs, totals[PULLED_BYTES] / cs / 1e6, e2e, totals[PULLED] / e2e,
           totals[PULLED_BYTES] / e2e / 1e6, ok ? "true" : "false");
    fflush(stdout);
    if (!ok)
      fprintf(stderr,
              "strom-mpi-bench: produced %lld events (%lld bytes), consumed %lld (%lld bytes), "
              "%lld of the wrong size; expected %lld\n",
              totals[PUSHED], totals[PUSHED_BYTES], totals[PULLED], totals[PULLED_BYTES],
              totals[BAD], expect);
  }
  ok = smpi_all_ok(ok);
  smpi_finish(&m);
  return ok ? 0 : 1;
}
