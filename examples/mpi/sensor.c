/*
 * sensor.c: sensors streaming to classifiers over an MPI channel, the
 * classifiers fetching only the signal's data.
 *
 * Detectors produce mostly background. The classifiers decide from the
 * metadata alone which events are worth their data: the channel's
 * options.select = "kind == signal" is a built-in data selector that runs
 * inside libstrom for every consumer rank, so a background event's
 * metadata arrives and its data is never fetched.
 *
 * Roles (P ranks, P >= 2): ranks [0, C) classify, C = P / 2
 * (STROM_MPI_CONSUMER), and ranks [C, P) are sensors (STROM_MPI_PRODUCER).
 *
 * What it shows:
 *   1. strom_mpi_channel_open on topic "sensor" (C memory partitions, one
 *      per classifier, the default) with options.select;
 *   2. each sensor pushes its generated records as one element of a
 *      256-byte MPI type (MPI_Type_contiguous of MPI_BYTE; about 1 in 5 a
 *      signal with a pulse), metadata
 *      {"kind":"signal"|"background","sensor":s,"seq":i}, then ends;
 *   3. each classifier pulls until STROM_END_OF_STREAM, checks each
 *      event's fetched bytes (strom_event_fetched_len: a whole record for a
 *      signal, 0 for background; strom_mpi_event_count agrees), unpacks
 *      the signal records (strom_mpi_event_unpack) and looks for the pulse;
 *   4. MPI_Reduce on rank 0: events and signals seen == sent, bytes fetched
 *      == signals x record size, checksums of the fetched records == the
 *      sensors' ones, every pulse found.
 *
 * Usage: sensor [-n records_per_sensor] [-f signal_one_in]
 * Exit status 0 when the classifiers got exactly the signal data.
 */
#include "example.h"

#include <getopt.h>

#define SAMPLES 60

struct record { /* 256 bytes */
  uint64_t id;
  uint32_t sensor, seq;
  float samples[SAMPLES];
};

enum { EVENTS, SIGNALS, SIGNAL_BYTES, BACKGROUND_BYTES, CHECKSUM, PULSES, NSTATS };
static const char *stat_names[NSTATS] = {"events", "signals", "signal bytes",
                                         "background bytes", "checksum", "pulses"};

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

/* A sensor: pushes n records, one event each. */
static void sense(strom_mpi_channel *ch, MPI_Datatype type, long n, int one_in, int rank,
                  uint64_t sent[NSTATS]) {
  struct record r;
  for (uint32_t i = 0; i < (uint32_t)n; i++) {
    int signal = make_record(&r, (uint32_t)rank, i, one_in);
    char meta[96];
    snprintf(meta, sizeof meta, "{\"kind\":\"%s\",\"sensor\":%d,\"seq\":%u}",
             signal ? "signal" : "background", rank, i);
    OK(strom_mpi_channel_push(ch, &r, 1, type, meta));
    sent[EVENTS]++;
    if (signal) {
      sent[SIGNALS]++;
      sent[SIGNAL_BYTES] += sizeof r;
      sent[CHECKSUM] += bytes_hash(&r, sizeof r);
      sent[PULSES]++;
    }
  }
  OK(strom_mpi_channel_end(ch));
}

/* Accounts one event a classifier pulled; 0 if it is not as expected. */
static int classify(const strom_event *e, MPI_Datatype type, uint64_t seen[NSTATS]) {
  strom_event_meta info;
  OK(strom_event_info(e, &info));
  char kind[16] = "";
  ex_json_str(info.metadata, info.metadata_len, "kind", kind, sizeof kind);
  uint64_t fetched = strom_event_fetched_len(e);
  int count = -1, ok = info.data_size == sizeof(struct record);
  OK(strom_mpi_event_count(e, type, &count)); /* whole records fetched: 1 or 0 */
  seen[EVENTS]++;
  if (strcmp(kind, "signal") != 0) {
    seen[BACKGROUND_BYTES] += fetched;
    return ok && count == 0;
  }
  struct record r;
  seen[SIGNALS]++;
  seen[SIGNAL_BYTES] += fetched;
  if (count != 1 || strom_mpi_event_unpack(e, &r, 1, type) != STROM_OK) return 0;
  seen[CHECKSUM] += bytes_hash(&r, sizeof r);
  seen[PULSES] += (uint64_t)has_pulse(&r);
  return ok;
}

/* A classifier: reads its partitions to the end of the stream. */
static int classify_all(strom_mpi_channel *ch, MPI_Datatype type, uint64_t seen[NSTATS]) {
  int ok = 1;
  strom_event *e;
  while ((e = ex_pull(ch)) != NULL) {
    if (!classify(e, type, seen)) {
      size_t len = 0;
      const char *meta = strom_event_metadata(e, &len);
      fprintf(stderr, "sensor: unexpected event %.*s: %llu bytes fetched\n", (int)len, meta,
              (unsigned long long)strom_event_fetched_len(e));
      ok = 0;
    }
    strom_event_free(e);
  }
  return ok;
}

/* Rank 0: what the classifiers saw against what the sensors sent. */
static int compare(const uint64_t sent[NSTATS], const uint64_t seen[NSTATS], int sensors,
                   int classifiers) {
  int ok = 1;
  for (int i = 0; i < NSTATS; i++) {
    if (seen[i] != sent[i]) {
      fprintf(stderr, "sensor: %s: classifiers saw %llu, sensors sent %llu\n", stat_names[i],
              (unsigned long long)seen[i], (unsigned long long)sent[i]);
      ok = 0;
    }
  }
  if (seen[SIGNAL_BYTES] != seen[SIGNALS] * sizeof(struct record)) ok = 0;
  printf("sensor: %d sensors -> %d classifiers, %llu events, %llu signals, %llu bytes fetched "
         "(= %llu signals x %zu bytes), background bytes fetched %llu: %s\n",
         sensors, classifiers, (unsigned long long)seen[EVENTS], (unsigned long long)seen[SIGNALS],
         (unsigned long long)seen[SIGNAL_BYTES], (unsigned long long)seen[SIGNALS],
         sizeof(struct record), (unsigned long long)seen[BACKGROUND_BYTES],
         ok ? "as expected" : "MISMATCH");
  return ok;
}

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
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2 || n < 1 || n > UINT32_MAX || one_in < 1) {
    if (rank == 0) fprintf(stderr, "sensor needs at least 2 ranks and positive sizes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int classifiers = size / 2, sensors = size - classifiers;
  const int is_classifier = rank < classifiers;
  MPI_Datatype type; /* one record, as raw bytes */
  MPI_Type_contiguous(sizeof(struct record), MPI_BYTE, &type);
  MPI_Type_commit(&type);

  strom_mpi_channel_options o;
  ex_options(&o);
  o.select = "kind == signal"; /* evaluated inside libstrom, per event */
  char topic[64];
  ex_topic(&o, "sensor", topic, sizeof topic);
  strom_mpi_channel *ch;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD,
                            is_classifier ? STROM_MPI_CONSUMER : STROM_MPI_PRODUCER, topic, &o,
                            &ch));

  /* What the sensors sent, and what the classifiers saw. */
  uint64_t sent[NSTATS] = {0}, seen[NSTATS] = {0}, total_sent[NSTATS], total_seen[NSTATS];
  int ok = 1;
  if (is_classifier) ok = classify_all(ch, type, seen);
  else sense(ch, type, n, one_in, rank, sent);
  MPI_Reduce(sent, total_sent, NSTATS, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(seen, total_seen, NSTATS, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0 && !compare(total_sent, total_seen, sensors, classifiers)) ok = 0;

  ok = ex_all_ok(ok);
  ex_done(ch, &o, topic);
  OK(strom_mpi_channel_close(&ch));
  MPI_Type_free(&type);
  MPI_Finalize();
  return ok ? 0 : 1;
}
