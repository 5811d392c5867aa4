/*
 * wordcount.c: a streaming word count (MapReduce over a Strom topic).
 *
 * Roles (P ranks, P >= 2): ranks [0, R) are reducers, R = P / 2, and ranks
 * [R, P) are mappers. Rank 0 also hosts the embedded server.
 *
 * The MPI pattern:
 *   1. rank 0 creates topic "words": R memory partitions, partition selector
 *      "hash:word", so every occurrence of a word lands in one partition;
 *   2. mappers open their producers, then MPI_Barrier: the stream cannot end
 *      before every mapper is registered;
 *   3. each mapper reads its share of a generated, deterministic text (line
 *      l belongs to mapper l % M), chunk by chunk, and pushes one event per
 *      distinct word of a chunk, metadata {"word":"foo","count":3}; then it
 *      closes its producer;
 *   4. reducer r consumes partition r only (strom_consumer_options
 *      .partitions) and sums the counts until STROM_END_OF_STREAM, which
 *      arrives once every mapper has closed;
 *   5. MPI_Reduce gathers the reducers' counts on rank 0, which counts the
 *      same text sequentially and compares word by word (and checks that no
 *      word reached two reducers).
 *
 * Usage: wordcount [-l lines] [-w words_per_line] [-k lines_per_chunk]
 * Exit status 0 when the streamed counts equal the sequential ones.
 */
#include "strom_mpi.h"

#include <getopt.h>

#define VOCAB 64

static const char *syllables[8] = {"ba", "ke", "li", "mo", "nu", "ra", "si", "to"};
static char vocab[VOCAB][8];

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

int main(int argc, char **argv) {
  long lines = 2000, chunk = 50;
  int per_line = 12, opt;
  while ((opt = getopt(argc, argv, "l:w:k:")) != -1) {
    if (opt == 'l') lines = atol(optarg);
    else if (opt == 'w') per_line = atoi(optarg);
    else if (opt == 'k') chunk = atol(optarg);
    else {
      fprintf(stderr, "usage: %s [-l lines] [-w words_per_line] [-k lines_per_chunk]\n", argv[0]);
      return 2;
    }
  }
  for (int i = 0; i < VOCAB; i++)
    snprintf(vocab[i], sizeof vocab[i], "%s%s", syllables[i / 8], syllables[i % 8]);

  smpi m;
  smpi_init(&m, &argc, &argv);
  if (m.size < 2 || lines < 1 || per_line < 1 || chunk < 1) {
    if (m.rank == 0) fprintf(stderr, "wordcount needs at least 2 ranks and positive sizes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int reducers = m.size / 2, mappers = m.size - reducers;
  const int is_reducer = m.rank < reducers;

  strom_topic_spec spec;
  OK(strom_topic_spec_init(&spec, "words", (uint32_t)reducers));
  spec.partition_type = "memory";
  spec.selector = "hash:word";
  strom_topic *topic = smpi_topic(&m, &spec);

  strom_producer *producer = NULL;
  if (!is_reducer) OK(strom_producer_open(topic, NULL, &producer));
  MPI_Barrier(MPI_COMM_WORLD); /* every producer is registered */

  long counts[VOCAB] = {0}; /* reducer: streamed totals */
  long events = 0;          /* pushed (mapper) or consumed (reducer) */
  int ok = 1;
  if (!is_reducer) {
    const int me = m.rank - reducers;
    long chunk_counts[VOCAB];
    long in_chunk = 0;
    memset(chunk_counts, 0, sizeof chunk_counts);
    for (long l = me; l < lines; l += mappers) {
      for (int p = 0; p < per_line; p++) chunk_counts[word_at(l, p)]++;
      if (++in_chunk < chunk && l + mappers < lines) continue;
      for (int w = 0; w < VOCAB; w++) { /* emit the chunk's (word, count) pairs */
        if (!chunk_counts[w]) continue;
        char meta[96];
        int n = snprintf(meta, sizeof meta, "{\"word\":\"%s\",\"count\":%ld}", vocab[w],
                         chunk_counts[w]);
        OK(strom_producer_push(producer, meta, (size_t)n, NULL, 0, NULL));
        events++;
      }
      memset(chunk_counts, 0, sizeof chunk_counts);
      in_chunk = 0;
    }
    OK(strom_producer_close(producer)); /* flushes: push errors surface here */
    strom_producer_free(producer);
  } else {
    strom_consumer_options o;
    OK(strom_consumer_options_init(&o));
    uint32_t mine = (uint32_t)m.rank;
    o.partitions = &mine;
    o.npartitions = 1;
    char name[32];
    snprintf(name, sizeof name, "reducer-%d", m.rank);
    strom_consumer *c;
    OK(strom_consumer_open(topic, name, &o, &c));
    strom_event *e;
    while ((e = smpi_pull(c)) != NULL) {
      strom_event_meta info;
      OK(strom_event_info(e, &info));
      char word[16];
      long count = 0;
      int id = -1;
      if (smpi_json_str(info.metadata, info.metadata_len, "word", word, sizeof word) == 0 &&
          smpi_json_long(info.metadata, info.metadata_len, "count", &count) == 0)
        id = word_id(word);
      if (id < 0 || count < 1 || info.partition != mine) {
        fprintf(stderr, "[reducer %d] bad event in partition %u: %.*s\n", m.rank,
                info.partition, (int)info.metadata_len, info.metadata);
        ok = 0;
      } else {
        counts[id] += count;
      }
      events++;
      if (events % 64 == 0) OK(strom_event_ack(e)); /* progress survives a restart */
      strom_event_free(e);
    }
    strom_consumer_free(c);
  }
  strom_topic_free(topic);

  /* Gather: summed counts, how many reducers saw each word, event totals. */
  long owners[VOCAB], total_counts[VOCAB], total_owners[VOCAB];
  for (int w = 0; w < VOCAB; w++) owners[w] = is_reducer && counts[w] > 0;
  long ev[2] = {is_reducer ? 0 : events, is_reducer ? events : 0}, total_ev[2];
  MPI_Reduce(counts, total_counts, VOCAB, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(owners, total_owners, VOCAB, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(ev, total_ev, 2, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

  if (m.rank == 0) {
    long seq[VOCAB] = {0}, words = 0;
    for (long l = 0; l < lines; l++)
      for (int p = 0; p < per_line; p++) seq[word_at(l, p)]++, words++;
    int wrong = 0;
    for (int w = 0; w < VOCAB; w++) {
      if (total_counts[w] != seq[w] || total_owners[w] > 1) {
        if (wrong++ < 10)
          fprintf(stderr, "word %s: streamed %ld, sequential %ld, on %ld reducers\n", vocab[w],
                  total_counts[w], seq[w], total_owners[w]);
      }
    }
    if (total_ev[0] != total_ev[1]) {
      fprintf(stderr, "mappers pushed %ld events, reducers consumed %ld\n", total_ev[0],
              total_ev[1]);
      wrong++;
    }
    int top = 0;
    for (int w = 1; w < VOCAB; w++)
      if (seq[w] > seq[top]) top = w;
    printf("wordcount: %d mappers -> %d reducers, %ld words in %ld lines, %ld (word,count) "
           "events; most frequent \"%s\" x %ld: %s\n",
           mappers, reducers, words, lines, total_ev[1], vocab[top], seq[top],
           wrong ? "MISMATCH" : "matches the sequential count");
    if (wrong) ok = 0;
  }
  ok = smpi_all_ok(ok);
  smpi_finish(&m);
  return ok ? 0 : 1;
}
