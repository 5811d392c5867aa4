/*
 * sensor.c: sensors streaming to classifiers, which fetch only the signal.
 *
 * Detectors produce mostly background. The classifiers decide from the
 * metadata alone which events are worth their data, and the built-in data
 * selector `kind == signal` runs inside libstrom: a background event's
 * metadata arrives, its data is never fetched.
 *
 * Roles (P ranks, P >= 2): ranks [0, C) classify, C = P / 2, and ranks
 * [C, P) are sensors. Rank 0 also hosts the embedded server.
 *
 * The MPI pattern:
 *   1. rank 0 creates topic "sensor": C memory partitions, round-robin;
 *   2. sensors open their producers, then MPI_Barrier;
 *   3. each sensor pushes its generated records (fixed-size `struct record`,
 *      about 1 in 5 a signal with a pulse), metadata
 *      {"kind":"signal"|"background","sensor":s,"seq":i}, then closes;
 *   4. classifier c reads partition c with o.select = "kind == signal" until
 *      STROM_END_OF_STREAM, checks each event's fetched bytes
 *      (strom_event_fetched_len: a whole record for a signal, 0 for
 *      background) and looks for the pulse in the signal records;
 *   5. MPI_Reduce on rank 0: events and signals seen == sent, bytes fetched
 *      == signals x record size, checksums of the fetched records == the
 *      sensors' ones, every pulse found.
 *
 * Usage: sensor [-n records_per_sensor] [-f signal_one_in]
 * Exit status 0 when the classifiers got exactly the signal data.
 */
#include "strom_mpi.h"

#include <getopt.h>

#define SAMPLES 60

struct record { /* 256 bytes */
  uint64_t id;
  uint32_t sensor, seq;
  float samples[SAMPLES];
};

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint64_t bytes_hash(const void *p, size_t n) { /* FNV-1a */
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

/* Record `seq` of sensor `sensor`: noise below 0.1, plus a pulse of height
 * 1 for a signal. Returns whether it is a signal. */
static int make_record(struct record *r, uint32_t sensor, uint32_t seq, int one_in) {
  r->id = ((uint64_t)sensor << 32) | seq;
  r->sensor = sensor;
  r->seq = seq;
  uint64_t h = mix64(r->id);
  int signal = h % (uint64_t)one_in == 0;
  for (int i = 0; i < SAMPLES; i++)
    r->samples[i] = (float)(mix64(h + (uint64_t)i) >> 40) * 0x1.0p-24f * 0.1f;
  if (signal) {
    int at = (int)((h >> 32) % (SAMPLES - 4));
    for (int i = 0; i < 4; i++) r->samples[at + i] += i == 1 || i == 2 ? 1.0f : 0.5f;
  }
  return signal;
}

/* The classifier: a pulse is a sample above 0.5. */
static int has_pulse(const struct record *r) {
  for (int i = 0; i < SAMPLES; i++)
    if (r->samples[i] > 0.5f) return 1;
  return 0;
}

enum { EVENTS, SIGNALS, SIGNAL_BYTES, BACKGROUND_BYTES, CHECKSUM, PULSES, NSTATS };
static const char *stat_names[NSTATS] = {"events", "signals", "signal bytes",
                                         "background bytes", "checksum", "pulses"};

int main(int argc, char **argv) {
  long n = 2000;
  int one_in = 5, opt;
  while ((opt = getopt(argc, argv, "n:f:")) != -1) {
    if (opt == 'n') n = atol(optarg);
    else if (opt == 'f') one_in = atoi(optarg);
    else {
      fprintf(stderr, "usage: %s [-n records_per_sensor] [-f signal_one_in]\n", argv[0]);
      return 2;
    }
  }
  smpi m;
  smpi_init(&m, &argc, &argv);
  if (m.size < 2 || n < 1 || n > UINT32_MAX || one_in < 1) {
    if (m.rank == 0) fprintf(stderr, "sensor needs at least 2 ranks and positive sizes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int classifiers = m.size / 2, sensors = m.size - classifiers;
  const int is_classifier = m.rank < classifiers;

  strom_topic_spec spec;
  OK(strom_topic_spec_init(&spec, "sensor", (uint32_t)classifiers));
  spec.partition_type = "memory";
  strom_topic *topic = smpi_topic(&m, &spec);

  strom_producer *producer = NULL;
  if (!is_classifier) OK(strom_producer_open(topic, NULL, &producer));
  MPI_Barrier(MPI_COMM_WORLD); /* every producer is registered */

  /* What the sensors sent, and what the classifiers saw. */
  uint64_t sent[NSTATS] = {0}, seen[NSTATS] = {0};
  int ok = 1;
  if (!is_classifier) {
    struct record r;
    for (uint32_t i = 0; i < (uint32_t)n; i++) {
      int signal = make_record(&r, (uint32_t)m.rank, i, one_in);
      char meta[96];
      int len = snprintf(meta, sizeof meta, "{\"kind\":\"%s\",\"sensor\":%d,\"seq\":%u}",
                         signal ? "signal" : "background", m.rank, i);
      strom_iovec iov = {&r, sizeof r};
      OK(strom_producer_push(producer, meta, (size_t)len, &iov, 1, NULL));
      sent[EVENTS]++;
      if (signal) {
        sent[SIGNALS]++;
        sent[SIGNAL_BYTES] += sizeof r;
        sent[CHECKSUM] += bytes_hash(&r, sizeof r);
        sent[PULSES]++;
      }
    }
    OK(strom_producer_close(producer));
    strom_producer_free(producer);
  } else {
    strom_consumer_options o;
    OK(strom_consumer_options_init(&o));
    uint32_t mine = (uint32_t)m.rank;
    o.partitions = &mine;
    o.npartitions = 1;
    o.select = "kind == signal"; /* evaluated inside libstrom, per event */
    char name[32];
    snprintf(name, sizeof name, "classifier-%d", m.rank);
    strom_consumer *c;
    OK(strom_consumer_open(topic, name, &o, &c));
    strom_event *e;
    while ((e = smpi_pull(c)) != NULL) {
      strom_event_meta info;
      OK(strom_event_info(e, &info));
      char kind[16] = "";
      smpi_json_str(info.metadata, info.metadata_len, "kind", kind, sizeof kind);
      uint64_t fetched = strom_event_fetched_len(e);
      size_t len = 0;
      const uint8_t *data = strom_event_data(e, &len);
      seen[EVENTS]++;
      if (info.data_size != sizeof(struct record)) {
        fprintf(stderr, "[classifier %d] event of %llu bytes\n", m.rank,
                (unsigned long long)info.data_size);
        ok = 0;
      }
      if (strcmp(kind, "signal") == 0) {
        seen[SIGNALS]++;
        seen[SIGNAL_BYTES] += fetched;
        if (len == sizeof(struct record) && fetched == len) {
          struct record r;
          memcpy(&r, data, sizeof r); /* the data buffer has no alignment promise */
          seen[CHECKSUM] += bytes_hash(&r, sizeof r);
          seen[PULSES] += (uint64_t)has_pulse(&r);
        }
      } else {
        seen[BACKGROUND_BYTES] += fetched + len;
      }
      strom_event_free(e);
    }
    strom_consumer_free(c);
  }
  strom_topic_free(topic);

  uint64_t total_sent[NSTATS], total_seen[NSTATS];
  MPI_Reduce(sent, total_sent, NSTATS, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(seen, total_seen, NSTATS, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  if (m.rank == 0) {
    for (int i = 0; i < NSTATS; i++) {
      if (total_seen[i] != total_sent[i]) {
        fprintf(stderr, "sensor: %s: classifiers saw %llu, sensors sent %llu\n", stat_names[i],
                (unsigned long long)total_seen[i], (unsigned long long)total_sent[i]);
        ok = 0;
      }
    }
    if (total_seen[SIGNAL_BYTES] != total_seen[SIGNALS] * sizeof(struct record)) ok = 0;
    printf("sensor: %d sensors -> %d classifiers, %llu events, %llu signals, %llu bytes fetched "
           "(= %llu signals x %zu bytes), background bytes fetched %llu: %s\n",
           sensors, classifiers, (unsigned long long)total_seen[EVENTS],
           (unsigned long long)total_seen[SIGNALS], (unsigned long long)total_seen[SIGNAL_BYTES],
           (unsigned long long)total_seen[SIGNALS], sizeof(struct record),
           (unsigned long long)total_seen[BACKGROUND_BYTES], ok ? "as expected" : "MISMATCH");
  }
  ok = smpi_all_ok(ok);
  smpi_finish(&m);
  return ok ? 0 : 1;
}
