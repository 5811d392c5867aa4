/*
 * particles.c: particle filter coupling (the iPIC3D case) over an MPI
 * channel, with an MPI struct datatype and the Operate callbacks.
 *
 * A particle-in-cell code must not stop for I/O: each simulation rank
 * streams, every step, only the energetic particles (kinetic energy above a
 * threshold) to an I/O rank that writes them to disk as they come.
 *
 * Roles (P ranks, P >= 2): rank 0 is the I/O rank (STROM_MPI_CONSUMER);
 * ranks 1..P-1 simulate (STROM_MPI_PRODUCER).
 *
 * What it shows:
 *   1. strom_mpi_channel_open on topic "particles": P-1 file partitions
 *      (options.partition_type), each simulation rank writing its own, so
 *      the I/O rank reads each rank's steps in order;
 *   2. `struct particle` described to MPI once (MPI_Type_create_struct,
 *      resized to the struct's extent); each step, each simulation rank
 *      moves its particles, filters them and pushes the k selected ones as
 *      k elements of that type, metadata {"step":s,"rank":r,"n":k} (the push
 *      copies them and returns at once, so the next step computes while the
 *      data travels); then strom_mpi_channel_end;
 *   3. rank 0 runs strom_mpi_channel_operate (MPIStream's Operate): on_event
 *      counts the event's elements (strom_mpi_event_count), unpacks them
 *      into its own buffer (strom_mpi_event_unpack) and appends them to
 *      step-<s>.bin in a mkdtemp dir; the channel acks each event on_event
 *      took; on_end runs at the end of the stream and closes the files;
 *   4. rank 0 re-reads the files and compares, per step, the particle count
 *      and an order-independent checksum with the ones the simulation ranks
 *      computed (MPI_Reduce), and checks every stored particle's energy.
 *
 * Usage: particles [-n particles_per_rank] [-s steps] [-t threshold]
 * Exit status 0 when the files hold exactly the filtered particles.
 */
#include "example.h"

#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <stddef.h>

struct particle { /* 64 bytes, no padding */
  double x[3], v[3];
  double q;
  int64_t id;
};

typedef struct {
  long n;
  int steps;
  double threshold;
} params;

typedef struct { /* the I/O rank's state, given to the Operate callbacks */
  char dir[4096];
  int steps, sims, events, bad;
  MPI_Datatype type;
  FILE **files;
  int *seen;                /* events per (step, rank): each must be 1 */
  struct particle *landing; /* where an event's particles are unpacked */
  long cap;
} io_state;

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

/* `struct particle` as an MPI datatype: 7 doubles and an int64 by field
 * offset, resized to sizeof(struct particle) so arrays of it line up. */
static MPI_Datatype particle_type(void) {
  int lengths[4] = {3, 3, 1, 1};
  MPI_Aint offsets[4] = {offsetof(struct particle, x), offsetof(struct particle, v),
                         offsetof(struct particle, q), offsetof(struct particle, id)};
  MPI_Datatype types[4] = {MPI_DOUBLE, MPI_DOUBLE, MPI_DOUBLE, MPI_INT64_T}, raw, t;
  MPI_Type_create_struct(4, lengths, offsets, types, &raw);
  MPI_Type_create_resized(raw, 0, sizeof(struct particle), &t);
  MPI_Type_free(&raw);
  MPI_Type_commit(&t);
  return t;
}

/* ---- simulation ranks -------------------------------------------------- */

static void init_particles(struct particle *ps, long n, int rank) {
  for (long i = 0; i < n; i++) {
    struct particle *p = &ps[i];
    p->id = (int64_t)rank * n + i;
    for (int d = 0; d < 3; d++) {
      p->x[d] = uniform((uint64_t)p->id * 7 + (uint64_t)d);
      p->v[d] = 0.5 * uniform((uint64_t)p->id * 7 + 3 + (uint64_t)d);
    }
    p->q = i % 2 ? 1.0 : -1.0;
  }
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

/* Simulates and pushes the hot particles of every step; `mine` receives
 * each step's count and checksum sum. */
static void simulate(strom_mpi_channel *ch, const params *pa, MPI_Datatype type, int rank,
                     uint64_t *mine) {
  struct particle *ps = malloc((size_t)pa->n * sizeof *ps);
  struct particle *hot = malloc((size_t)pa->n * sizeof *hot);
  init_particles(ps, pa->n, rank);
  for (int s = 0; s < pa->steps; s++) {
    advance(ps, pa->n, s);
    int k = 0;
    for (long i = 0; i < pa->n; i++)
      if (energy(&ps[i]) > pa->threshold) {
        hot[k++] = ps[i];
        mine[2 * s] += 1;
        mine[2 * s + 1] += particle_hash(&ps[i]);
      }
    char meta[96];
    snprintf(meta, sizeof meta, "{\"step\":%d,\"rank\":%d,\"n\":%d}", s, rank, k);
    OK(strom_mpi_channel_push(ch, hot, k, type, meta));
  }
  OK(strom_mpi_channel_end(ch)); /* flushes: push errors surface here */
  free(ps);
  free(hot);
}

/* ---- the I/O rank: the Operate callbacks ------------------------------- */

static void on_start(void *user) {
  io_state *io = user;
  printf("particles: I/O rank writing to %s\n", io->dir);
}

/* Reads an event's step and rank (-1 when missing or out of range) and
 * unpacks its particles into io->landing; returns how many, or -1. */
static long land(io_state *io, const strom_event *e, long *step, long *rank) {
  strom_event_meta info;
  int count = -1;
  long n = -1;
  *step = *rank = -1;
  if (strom_event_info(e, &info) != STROM_OK) return -1;
  ex_json_long(info.metadata, info.metadata_len, "step", step);
  ex_json_long(info.metadata, info.metadata_len, "rank", rank);
  ex_json_long(info.metadata, info.metadata_len, "n", &n);
  if (strom_mpi_event_count(e, io->type, &count) != STROM_OK || count != n || count > io->cap ||
      *step < 0 || *step >= io->steps || *rank < 1 || *rank > io->sims ||
      strom_mpi_event_unpack(e, io->landing, count, io->type) != STROM_OK) {
    fprintf(stderr, "particles: bad event %.*s holding %d particles (%s)\n",
            (int)info.metadata_len, info.metadata, count, strom_mpi_last_error());
    return -1;
  }
  return count;
}

static strom_status on_event(void *user, strom_event *e) {
  io_state *io = user;
  long step, rank, n = land(io, e, &step, &rank);
  if (n < 0) {
    io->bad++;
    return STROM_ERR_INVALID_ARGUMENT; /* stops Operate: STROM_ERR_CALLBACK */
  }
  if (!io->files[step]) {
    char path[4200];
    snprintf(path, sizeof path, "%s/step-%04ld.bin", io->dir, step);
    io->files[step] = fopen(path, "wb");
    if (!io->files[step]) return STROM_ERR_STORAGE_IO;
  }
  if (n && fwrite(io->landing, sizeof(struct particle), (size_t)n, io->files[step]) != (size_t)n)
    return STROM_ERR_STORAGE_IO;
  io->events++;
  io->seen[step * (io->sims + 1) + rank]++;
  return STROM_OK; /* written: the channel acks it, the consumer's progress moves on */
}

static void on_end(void *user) {
  io_state *io = user;
  for (int s = 0; s < io->steps; s++)
    if (io->files[s]) fclose(io->files[s]), io->files[s] = NULL;
}

/* Consumes the whole stream while the simulation runs. */
static int write_files(strom_mpi_channel *ch, io_state *io) {
  strom_process_callbacks cb = {on_start, on_event, on_end};
  strom_status s = strom_mpi_channel_operate(ch, &cb, io);
  if (s == STROM_OK) return 1;
  fprintf(stderr, "particles: operate -> %s: %s\n", strom_status_name(s), strom_mpi_last_error());
  on_end(io);
  return 0;
}

/* ---- the check --------------------------------------------------------- */

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

/* Compares step st's file with what the simulation sent. */
static int check_step(const io_state *io, int st, double threshold, const uint64_t *sent,
                      uint64_t *total) {
  uint64_t count, sum;
  int ok = 1;
  if (read_step(io, st, threshold, &count, &sum) != 0) {
    fprintf(stderr, "particles: step %d: unreadable file or a particle below threshold\n", st);
    return 0;
  }
  if (count != sent[2 * st] || sum != sent[2 * st + 1]) {
    fprintf(stderr,
            "particles: step %d: files hold %llu particles (checksum %016llx), the "
            "simulation sent %llu (checksum %016llx)\n",
            st, (unsigned long long)count, (unsigned long long)sum,
            (unsigned long long)sent[2 * st], (unsigned long long)sent[2 * st + 1]);
    ok = 0;
  }
  for (int r = 1; r <= io->sims; r++) {
    if (io->seen[st * (io->sims + 1) + r] != 1) {
      fprintf(stderr, "particles: step %d: %d events from rank %d\n", st,
              io->seen[st * (io->sims + 1) + r], r);
      ok = 0;
    }
  }
  *total += count;
  return ok;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static int check(io_state *io, const params *pa, const uint64_t *sent, int ok) {
  uint64_t total = 0;
  for (int st = 0; ok && st < pa->steps; st++) ok = check_step(io, st, pa->threshold, sent, &total);
  printf("particles: %d simulation ranks x %ld particles, %d steps: %d events, %llu particles "
         "above %.2f written to %d files: %s\n",
         io->sims, pa->n, pa->steps, io->events, (unsigned long long)total, pa->threshold,
         pa->steps, ok ? "counts and checksums match" : "MISMATCH");
  nftw(io->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return ok;
}

static void parse(int argc, char **argv, params *pa) {
  int opt;
  while ((opt = getopt(argc, argv, "n:s:t:")) != -1) {
    if (opt == 'n') pa->n = atol(optarg);
    else if (opt == 's') pa->steps = atoi(optarg);
    else if (opt == 't') pa->threshold = atof(optarg);
    else {
      fprintf(stderr, "usage: %s [-n particles_per_rank] [-s steps] [-t threshold]\n", argv[0]);
      exit(2);
    }
  }
}

/* The I/O rank's state, with a fresh directory for the files. */
static void io_init(io_state *io, const params *pa, int sims, MPI_Datatype type) {
  const char *tmp = getenv("TMPDIR");
  snprintf(io->dir, sizeof io->dir, "%s/strom-particles-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(io->dir)) {
    perror("mkdtemp");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  io->steps = pa->steps, io->sims = sims, io->type = type, io->cap = pa->n;
  io->files = calloc((size_t)pa->steps, sizeof *io->files);
  io->seen = calloc((size_t)pa->steps * (size_t)(sims + 1), sizeof *io->seen);
  io->landing = malloc((size_t)pa->n * sizeof *io->landing);
}

int main(int argc, char **argv) {
  params pa = {.n = 2000, .steps = 10, .threshold = 0.8};
  parse(argc, argv, &pa);
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2 || pa.n < 1 || pa.n > INT32_MAX || pa.steps < 1) {
    if (rank == 0) fprintf(stderr, "particles needs at least 2 ranks and positive sizes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int sims = size - 1;
  MPI_Datatype type = particle_type();

  strom_mpi_channel_options o;
  ex_options(&o);
  o.partitions = (uint32_t)sims;
  o.partition_type = "file";
  char topic[64];
  ex_topic(&o, "particles", topic, sizeof topic);
  strom_mpi_channel *ch;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, rank == 0 ? STROM_MPI_CONSUMER : STROM_MPI_PRODUCER,
                            topic, &o, &ch));

  /* Per step: particle count and checksum sum (sims: pushed; rank 0: zero). */
  uint64_t *mine = calloc(2 * (size_t)pa.steps, sizeof *mine);
  uint64_t *sent = calloc(2 * (size_t)pa.steps, sizeof *sent);
  io_state io = {0};
  int ok = 1;
  if (rank != 0) simulate(ch, &pa, type, rank, mine);
  if (rank == 0) io_init(&io, &pa, sims, type);
  if (rank == 0) ok = write_files(ch, &io);
  MPI_Reduce(mine, sent, 2 * pa.steps, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) ok = check(&io, &pa, sent, ok);

  ok = ex_all_ok(ok);
  ex_done(ch, &o, topic);
  OK(strom_mpi_channel_close(&ch));
  MPI_Type_free(&type);
  free(io.files), free(io.seen), free(io.landing), free(mine), free(sent);
  MPI_Finalize();
  return ok ? 0 : 1;
}
