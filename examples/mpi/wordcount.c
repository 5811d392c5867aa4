/*
 * wordcount.c: a streaming word count (MapReduce) over an MPI channel.
 *
 * Roles (P ranks, P >= 2): ranks [0, R) reduce, R = P / 2, and are the
 * channel's STROM_MPI_CONSUMERs; ranks [R, P) map, STROM_MPI_PRODUCERs.
 *
 * What it shows:
 *   1. strom_mpi_channel_open (collective) with options.partitions = R and
 *      options.selector = "hash:word": every occurrence of a word lands in
 *      one partition; SHARE distribution gives reducer r partition r;
 *   2. each mapper reads its share of a generated, deterministic text (line
 *      l belongs to mapper l % M), chunk by chunk, and pushes one event per
 *      distinct word of a chunk: metadata {"word":"foo"}, data one MPI_LONG
 *      (the count); then strom_mpi_channel_end;
 *   3. each reducer pulls (strom_mpi_channel_pull) until
 *      STROM_END_OF_STREAM, which comes once every mapper has ended, reads
 *      each count with strom_mpi_event_unpack and sums;
 *   4. MPI_Reduce gathers the sums on rank 0, which counts the same text
 *      sequentially and compares word by word (and checks that no word
 *      reached two reducers, and that the group has as many servers as
 *      options.servers_per_node, from STROM_MPI_SERVERS_PER_NODE, asks);
 *      every rank agrees on the verdict.
 *
 * Usage: wordcount [-l lines] [-w words_per_line] [-k lines_per_chunk]
 * Exit status 0 when the streamed counts equal the sequential ones.
 */
#include "example.h"

#include <getopt.h>

#define VOCAB 64

static const char *syllables[8] = {"ba", "ke", "li", "mo", "nu", "ra", "si", "to"};
static char vocab[VOCAB][8];

typedef struct {
  long lines, chunk;
  int per_line;
} text;

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The id of word `pos` of line `line`: skewed towards small ids, like text. */
static int word_at(long line, int pos) {
  uint64_t h = mix64((uint64_t)line * 1000003u + (uint64_t)pos);
  int a = (int)(h % VOCAB), b = (int)((h >> 32) % VOCAB);
  return a < b ? a : b;
}

static int word_id(const char *w) {
  for (int i = 0; i < VOCAB; i++)
    if (strcmp(vocab[i], w) == 0) return i;
  return -1;
}

/* Pushes one (word, count) event per word of a chunk; returns how many. */
static long emit_chunk(strom_mpi_channel *ch, const long counts[VOCAB]) {
  long events = 0;
  for (int w = 0; w < VOCAB; w++) {
    if (!counts[w]) continue;
    char meta[64];
    snprintf(meta, sizeof meta, "{\"word\":\"%.7s\"}", vocab[w]);
    OK(strom_mpi_channel_push(ch, &counts[w], 1, MPI_LONG, meta));
    events++;
  }
  return events;
}

/* Mapper `me` of `mappers`: counts its lines chunk by chunk. */
static long map(strom_mpi_channel *ch, const text *t, int me, int mappers) {
  long counts[VOCAB] = {0}, in_chunk = 0, events = 0;
  for (long l = me; l < t->lines; l += mappers) {
    for (int p = 0; p < t->per_line; p++) counts[word_at(l, p)]++;
    if (++in_chunk < t->chunk && l + mappers < t->lines) continue;
    events += emit_chunk(ch, counts);
    memset(counts, 0, sizeof counts);
    in_chunk = 0;
  }
  OK(strom_mpi_channel_end(ch)); /* flushes: push errors surface here */
  return events;
}

/* Adds one (word, count) event to `counts`; 0 if it is malformed or came
 * through a partition that is not this reducer's. */
static int reduce_event(const strom_mpi_channel *ch, const strom_event *e, long counts[VOCAB]) {
  strom_event_meta info;
  OK(strom_event_info(e, &info));
  char word[16];
  long count = 0;
  int id = -1;
  if (ex_json_str(info.metadata, info.metadata_len, "word", word, sizeof word) == 0 &&
      strom_mpi_event_unpack(e, &count, 1, MPI_LONG) == STROM_OK)
    id = word_id(word);
  int mine = (int)info.partition % strom_mpi_channel_consumers(ch) ==
             strom_mpi_channel_consumer_index(ch);
  if (id < 0 || count < 1 || !mine) {
    fprintf(stderr, "[reducer %d] bad event in partition %u: %.*s (%s)\n",
            strom_mpi_channel_consumer_index(ch), info.partition, (int)info.metadata_len,
            info.metadata, strom_mpi_last_error());
    return 0;
  }
  counts[id] += count;
  return 1;
}

/* A reducer: sums its partitions' counts to the end of the stream. */
static long reduce(strom_mpi_channel *ch, long counts[VOCAB], int *ok) {
  long events = 0;
  strom_event *e;
  while ((e = ex_pull(ch)) != NULL) {
    if (!reduce_event(ch, e, counts)) *ok = 0;
    if (++events % 64 == 0) OK(strom_event_ack(e)); /* progress survives a restart */
    strom_event_free(e);
  }
  return events;
}

/* Rank 0: compares the streamed totals with a sequential count. */
static int compare(const text *t, const long total[VOCAB], const long owners[VOCAB],
                   const long ev[2], int mappers, int reducers, unsigned servers) {
  long seq[VOCAB] = {0}, words = 0;
  for (long l = 0; l < t->lines; l++)
    for (int p = 0; p < t->per_line; p++) seq[word_at(l, p)]++, words++;
  int wrong = 0, top = 0;
  for (int w = 0; w < VOCAB; w++) {
    if ((total[w] != seq[w] || owners[w] > 1) && wrong++ < 10)
      fprintf(stderr, "word %s: streamed %ld, sequential %ld, on %ld reducers\n", vocab[w],
              total[w], seq[w], owners[w]);
    if (seq[w] > seq[top]) top = w;
  }
  if (ev[0] != ev[1]) {
    fprintf(stderr, "mappers pushed %ld events, reducers consumed %ld\n", ev[0], ev[1]);
    wrong++;
  }
  printf("wordcount: %d mappers -> %d reducers through %u servers, %ld words in %ld lines, %ld "
         "(word,count) events; most frequent \"%s\" x %ld: %s\n",
         mappers, reducers, servers, words, t->lines, ev[1], vocab[top], seq[top],
         wrong ? "MISMATCH" : "matches the sequential count");
  return wrong == 0;
}

/* How many embedded servers the channel should have started: each node's
 * lowest servers_per_node ranks (0 when attached to a running group). */
static int expected_servers(const strom_mpi_channel_options *o) {
  if (o->group_file || o->master_addr) return 0;
  MPI_Comm node;
  int node_rank, hosts, total = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_free(&node);
  hosts = node_rank < (o->servers_per_node > 0 ? o->servers_per_node : 1);
  MPI_Allreduce(&hosts, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

static void parse(int argc, char **argv, text *t) {
  int opt;
  while ((opt = getopt(argc, argv, "l:w:k:")) != -1) {
    if (opt == 'l') t->lines = atol(optarg);
    else if (opt == 'w') t->per_line = atoi(optarg);
    else if (opt == 'k') t->chunk = atol(optarg);
    else {
      fprintf(stderr, "usage: %s [-l lines] [-w words_per_line] [-k lines_per_chunk]\n", argv[0]);
      exit(2);
    }
  }
}

int main(int argc, char **argv) {
  text t = {.lines = 2000, .chunk = 50, .per_line = 12};
  parse(argc, argv, &t);
  for (int i = 0; i < VOCAB; i++)
    snprintf(vocab[i], sizeof vocab[i], "%s%s", syllables[i / 8], syllables[i % 8]);
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2 || t.lines < 1 || t.per_line < 1 || t.chunk < 1) {
    if (rank == 0) fprintf(stderr, "wordcount needs at least 2 ranks and positive sizes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int reducers = size / 2, mappers = size - reducers, is_reducer = rank < reducers;

  strom_mpi_channel_options o;
  ex_options(&o);
  o.partitions = (uint32_t)reducers;
  o.selector = "hash:word";
  char topic[64];
  ex_topic(&o, "words", topic, sizeof topic);
  strom_mpi_channel *ch;
  OK(strom_mpi_channel_open(MPI_COMM_WORLD, is_reducer ? STROM_MPI_CONSUMER : STROM_MPI_PRODUCER,
                            topic, &o, &ch));

  long counts[VOCAB] = {0}; /* reducer: streamed totals */
  int ok = 1;
  long events = is_reducer ? reduce(ch, counts, &ok)
                           : map(ch, &t, strom_mpi_channel_producer_index(ch), mappers);

  /* Gather: summed counts, how many reducers saw each word, event totals. */
  long owners[VOCAB], total[VOCAB], total_owners[VOCAB];
  for (int w = 0; w < VOCAB; w++) owners[w] = counts[w] > 0;
  long ev[2] = {is_reducer ? 0 : events, is_reducer ? events : 0}, total_ev[2];
  MPI_Reduce(counts, total, VOCAB, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(owners, total_owners, VOCAB, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(ev, total_ev, 2, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  uint32_t servers = 0;
  int want = expected_servers(&o);
  if (rank == 0) OK(strom_driver_members(strom_mpi_channel_driver(ch), &servers, NULL));
  if (rank == 0 && want && servers != (uint32_t)want) {
    fprintf(stderr, "wordcount: %u servers, want %d (servers_per_node %d)\n", servers, want,
            o.servers_per_node);
    ok = 0;
  }
  if (rank == 0 && !compare(&t, total, total_owners, total_ev, mappers, reducers, servers)) ok = 0;

  ok = ex_all_ok(ok);
  ex_done(ch, &o, topic);
  OK(strom_mpi_channel_close(&ch));
  MPI_Finalize();
  return ok ? 0 : 1;
}
