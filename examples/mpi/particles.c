/*
 * particles.c: particle filter coupling (the iPIC3D case).
 *
 * A particle-in-cell code must not stop for I/O: each simulation rank
 * streams, every step, only the energetic particles (kinetic energy above a
 * threshold) to an I/O rank that writes them to disk as they come.
 *
 * Roles (P ranks, P >= 2): rank 0 is the I/O rank (and hosts the embedded
 * server); ranks 1..P-1 simulate.
 *
 * The MPI pattern:
 *   1. rank 0 creates topic "particles": P-1 file partitions (persisted in
 *      the server's data dir), partition selector "hash:rank";
 *   2. simulation ranks open their producers, then MPI_Barrier;
 *   3. each step, each simulation rank moves its particles, filters them and
 *      pushes one event: metadata {"step":s,"rank":r,"n":k}, data = the k
 *      selected `struct particle`s (the push copies them and returns at once,
 *      so the next step computes while the data travels); then it closes;
 *   4. rank 0 drives strom_consumer_process (the MPIStream "Operate" model):
 *      on_event appends each event's particles to step-<s>.bin in a mkdtemp
 *      dir and acks it; on_end runs once the last simulation rank closed;
 *   5. rank 0 re-reads the files and compares, per step, the particle count
 *      and an order-independent checksum with the ones the simulation ranks
 *      computed (MPI_Reduce), and checks every stored particle's energy.
 *
 * Usage: particles [-n particles_per_rank] [-s steps] [-t threshold]
 * Exit status 0 when the files hold exactly the filtered particles.
 */
#include "strom_mpi.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>

struct particle { /* 64 bytes, no padding */
  double x[3], v[3];
  double q;
  int64_t id;
};

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static double uniform(uint64_t seed) { /* [-1, 1) */
  return (double)(mix64(seed) >> 11) * 0x1.0p-52 - 1.0;
}

static double energy(const struct particle *p) {
  return 0.5 * (p->v[0] * p->v[0] + p->v[1] * p->v[1] + p->v[2] * p->v[2]);
}

/* FNV-1a of a particle's bytes; summed, it checks a set in any order. */
static uint64_t particle_hash(const struct particle *p) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < sizeof *p; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

/* One step of a toy PIC push: a random electric kick, damping, drift. */
static void advance(struct particle *ps, long n, int step) {
  for (long i = 0; i < n; i++) {
    struct particle *p = &ps[i];
    for (int d = 0; d < 3; d++) {
      double kick = uniform(((uint64_t)p->id << 20) ^ ((uint64_t)step << 2) ^ (uint64_t)d);
      p->v[d] = 0.9 * p->v[d] + 0.5 * kick * p->q;
      p->x[d] += 0.01 * p->v[d];
    }
  }
}

typedef struct { /* the I/O rank's state, given to the process callbacks */
  char dir[4096];
  int steps, sims, events, bad;
  FILE **files;
  int *seen; /* events per (step, rank): each must be 1 */
} io_state;

static void on_start(void *user) {
  io_state *io = user;
  printf("particles: I/O rank writing to %s\n", io->dir);
}

static strom_status on_event(void *user, strom_event *e) {
  io_state *io = user;
  strom_event_meta info;
  strom_status s = strom_event_info(e, &info);
  if (s != STROM_OK) return s;
  long step = -1, rank = -1, n = -1;
  smpi_json_long(info.metadata, info.metadata_len, "step", &step);
  smpi_json_long(info.metadata, info.metadata_len, "rank", &rank);
  smpi_json_long(info.metadata, info.metadata_len, "n", &n);
  size_t len = 0;
  const uint8_t *data = strom_event_data(e, &len);
  if (step < 0 || step >= io->steps || rank < 1 || rank > io->sims || n < 0 ||
      len != (size_t)n * sizeof(struct particle)) {
    fprintf(stderr, "particles: bad event %.*s with %zu bytes\n", (int)info.metadata_len,
            info.metadata, len);
    io->bad++;
    return STROM_ERR_INVALID_ARGUMENT; /* stops processing: STROM_ERR_CALLBACK */
  }
  if (!io->files[step]) {
    char path[4200];
    snprintf(path, sizeof path, "%s/step-%04ld.bin", io->dir, step);
    io->files[step] = fopen(path, "wb");
    if (!io->files[step]) return STROM_ERR_STORAGE_IO;
  }
  if (n && fwrite(data, sizeof(struct particle), (size_t)n, io->files[step]) != (size_t)n)
    return STROM_ERR_STORAGE_IO;
  io->events++;
  io->seen[step * (io->sims + 1) + rank]++;
  return strom_event_ack(e); /* written: the consumer name's progress moves on */
}

static void on_end(void *user) {
  io_state *io = user;
  for (int s = 0; s < io->steps; s++)
    if (io->files[s]) fclose(io->files[s]), io->files[s] = NULL;
}

/* Reads back step s's file: count, checksum, and energies above threshold. */
static int read_step(const io_state *io, int s, double threshold, uint64_t *count,
                     uint64_t *sum) {
  char path[4200];
  snprintf(path, sizeof path, "%s/step-%04d.bin", io->dir, s);
  *count = *sum = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return errno == ENOENT ? 0 : -1; /* no event had particles? */
  struct particle p;
  int ok = 0;
  while (fread(&p, sizeof p, 1, f) == 1) {
    if (!(energy(&p) > threshold)) ok = -1;
    (*count)++;
    *sum += particle_hash(&p);
  }
  fclose(f);
  return ok;
}

int main(int argc, char **argv) {
  long n = 2000;
  int steps = 10, opt;
  double threshold = 0.8;
  while ((opt = getopt(argc, argv, "n:s:t:")) != -1) {
    if (opt == 'n') n = atol(optarg);
    else if (opt == 's') steps = atoi(optarg);
    else if (opt == 't') threshold = atof(optarg);
    else {
      fprintf(stderr, "usage: %s [-n particles_per_rank] [-s steps] [-t threshold]\n", argv[0]);
      return 2;
    }
  }
  smpi m;
  smpi_init(&m, &argc, &argv);
  if (m.size < 2 || n < 1 || steps < 1) {
    if (m.rank == 0) fprintf(stderr, "particles needs at least 2 ranks and positive sizes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int sims = m.size - 1;

  strom_topic_spec spec;
  OK(strom_topic_spec_init(&spec, "particles", (uint32_t)sims));
  spec.partition_type = "file";
  spec.durability = "never"; /* a coupling buffer; the I/O rank writes the files */
  spec.selector = "hash:rank";
  strom_topic *topic = smpi_topic(&m, &spec);

  strom_producer *producer = NULL;
  if (m.rank != 0) OK(strom_producer_open(topic, NULL, &producer));
  MPI_Barrier(MPI_COMM_WORLD); /* every producer is registered */

  /* Per step: particle count and checksum sum (sims: pushed; rank 0: zero). */
  uint64_t *mine = calloc(2 * (size_t)steps, sizeof *mine);
  uint64_t *sent = calloc(2 * (size_t)steps, sizeof *sent);
  int ok = 1;
  if (m.rank != 0) {
    struct particle *ps = malloc((size_t)n * sizeof *ps), *hot = malloc((size_t)n * sizeof *hot);
    for (long i = 0; i < n; i++) {
      struct particle *p = &ps[i];
      p->id = (int64_t)m.rank * n + i;
      for (int d = 0; d < 3; d++) {
        p->x[d] = uniform((uint64_t)p->id * 7 + (uint64_t)d);
        p->v[d] = 0.5 * uniform((uint64_t)p->id * 7 + 3 + (uint64_t)d);
      }
      p->q = i % 2 ? 1.0 : -1.0;
    }
    for (int s = 0; s < steps; s++) {
      advance(ps, n, s);
      long k = 0;
      for (long i = 0; i < n; i++)
        if (energy(&ps[i]) > threshold) {
          hot[k++] = ps[i];
          mine[2 * s] += 1;
          mine[2 * s + 1] += particle_hash(&ps[i]);
        }
      char meta[96];
      int len = snprintf(meta, sizeof meta, "{\"step\":%d,\"rank\":%d,\"n\":%ld}", s, m.rank, k);
      strom_iovec iov = {hot, (size_t)k * sizeof *hot};
      OK(strom_producer_push(producer, meta, (size_t)len, &iov, k ? 1 : 0, NULL));
    }
    OK(strom_producer_close(producer));
    strom_producer_free(producer);
    free(ps);
    free(hot);
  }

  io_state io = {.steps = steps, .sims = sims};
  if (m.rank == 0) { /* consumes while the simulation runs */
    io.files = calloc((size_t)steps, sizeof *io.files);
    io.seen = calloc((size_t)steps * (size_t)(sims + 1), sizeof *io.seen);
    if (smpi_mkdtemp(io.dir, sizeof io.dir, "strom-particles") != 0) {
      perror("mkdtemp");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    strom_consumer *c;
    OK(strom_consumer_open(topic, "io-rank", NULL, &c));
    strom_process_callbacks cb = {on_start, on_event, on_end};
    strom_status s = strom_consumer_process(c, &cb, &io);
    if (s != STROM_OK) {
      fprintf(stderr, "particles: process -> %s: %s\n", strom_status_name(s), strom_last_error());
      on_end(&io);
      ok = 0;
    }
    strom_consumer_free(c);
  }
  MPI_Reduce(mine, sent, 2 * steps, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);

  if (m.rank == 0) { /* the check */
    uint64_t total = 0;
    for (int st = 0; ok && st < steps; st++) {
      uint64_t count, sum;
      if (read_step(&io, st, threshold, &count, &sum) != 0) {
        fprintf(stderr, "particles: step %d: unreadable file or a particle below threshold\n",
                st);
        ok = 0;
      } else if (count != sent[2 * st] || sum != sent[2 * st + 1]) {
        fprintf(stderr,
                "particles: step %d: files hold %llu particles (checksum %016llx), the "
                "simulation sent %llu (checksum %016llx)\n",
                st, (unsigned long long)count, (unsigned long long)sum,
                (unsigned long long)sent[2 * st], (unsigned long long)sent[2 * st + 1]);
        ok = 0;
      }
      for (int r = 1; r <= sims; r++) {
        if (io.seen[st * (sims + 1) + r] != 1) {
          fprintf(stderr, "particles: step %d: %d events from rank %d\n", st,
                  io.seen[st * (sims + 1) + r], r);
          ok = 0;
        }
      }
      total += count;
    }
    printf("particles: %d simulation ranks x %ld particles, %d steps: %d events, %llu particles "
           "above %.2f written to %d files: %s\n",
           sims, n, steps, io.events, (unsigned long long)total, threshold, steps,
           ok ? "counts and checksums match" : "MISMATCH");
    smpi_rmtree(io.dir);
    free(io.files);
    free(io.seen);
  }
  free(mine);
  free(sent);
  strom_topic_free(topic);
  ok = smpi_all_ok(ok);
  smpi_finish(&m);
  return ok ? 0 : 1;
}
