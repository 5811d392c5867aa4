/*
 * The C conformance essentials of libstrom, against an embedded server in a
 * fresh temporary directory: order, data selection (built-in and callback),
 * brokers, acks that persist per consumer name, end of stream with several
 * producers, the process callbacks, lent data, and error reporting.
 *
 * Built plain and with -fsanitize=address,undefined by `make test-ffi`.
 * Exits non-zero, naming the failed check, when anything is wrong.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strom.h"

static int failures = 0;

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                   \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                 \
      failures++;                                                            \
      return;                                                                \
    }                                                                        \
  } while (0)

#define OK(call)                                                             \
  do {                                                                       \
    strom_status s_ = (call);                                                \
    if (s_ != STROM_OK) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s -> %s (%d): %s\n", __FILE__, __LINE__, \
              #call, strom_status_name(s_), s_, strom_last_error());         \
      failures++;                                                            \
      return;                                                                \
    }                                                                        \
  } while (0)

static strom_driver *driver;
static char data_dir[] = "/tmp/strom-c-test-XXXXXX";

static strom_topic *make_topic(const char *name, uint32_t partitions, const char *selector) {
  strom_topic_spec spec;
  strom_topic_spec_init(&spec, name, partitions);
  spec.partition_type = "memory";
  spec.selector = selector;
  strom_topic *t = NULL;
  if (strom_topic_create(driver, &spec, &t) != STROM_OK) {
    fprintf(stderr, "topic %s: %s\n", name, strom_last_error());
    exit(2);
  }
  return t;
}

static strom_status push_text(strom_producer *p, const char *meta, const void *data, size_t len,
                              strom_future **f) {
  strom_iovec iov = {data, len};
  return strom_producer_push(p, meta, strlen(meta), &iov, len ? 1 : 0, f);
}

/* One producer's events come back in push order with their data. */
static void test_order_and_data(void) {
  strom_topic *t = make_topic("order", 1, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  strom_future *futs[100];
  for (int i = 0; i < 100; i++) {
    char meta[64], data[32];
    snprintf(meta, sizeof meta, "{\"seq\":%d}", i);
    snprintf(data, sizeof data, "payload-%d", i);
    OK(push_text(p, meta, data, strlen(data), &futs[i]));
  }
  OK(strom_producer_close(p));
  uint64_t last = 0;
  for (int i = 0; i < 100; i++) {
    strom_event_id id;
    OK(strom_future_wait(futs[i], &id));
    CHECK(i == 0 || id.offset > last, "offsets not increasing at %d", i);
    last = id.offset;
    int done = 0;
    OK(strom_future_test(futs[i], &done));
    CHECK(done == 1, "a waited future is not done");
    strom_future_free(futs[i]);
  }
  strom_consumer *c;
  OK(strom_consumer_open(t, "reader", NULL, &c));
  for (int i = 0; i < 100; i++) {
    strom_event *e;
    OK(strom_consumer_pull(c, 10000, &e));
    size_t mlen, dlen;
    const char *meta = strom_event_metadata(e, &mlen);
    char want[64];
    snprintf(want, sizeof want, "{\"seq\":%d}", i);
    CHECK(mlen == strlen(want) && memcmp(meta, want, mlen) == 0, "event %d metadata %.*s", i,
          (int)mlen, meta);
    const uint8_t *data = strom_event_data(e, &dlen);
    snprintf(want, sizeof want, "payload-%d", i);
    CHECK(dlen == strlen(want) && memcmp(data, want, dlen) == 0, "event %d data", i);
    strom_event_meta info;
    OK(strom_event_info(e, &info));
    CHECK(info.data_size == dlen && info.partition == 0, "event %d info", i);
    strom_event_free(e);
  }
  strom_event *e = (strom_event *)1;
  strom_status s = strom_consumer_pull(c, 10000, &e);
  CHECK(s == STROM_END_OF_STREAM && e == NULL, "expected the end of the stream, got %s",
        strom_status_name(s));
  strom_consumer_free(c);
  strom_producer_free(p);
  strom_topic_free(t);
}

/* A C selector picks a range of each event; a built-in one skips events. */
static strom_status pick_middle(void *user, const strom_event_meta *meta, strom_selection *out) {
  (void)user;
  out->kind = STROM_SELECT_RANGE;
  out->offset = 4;
  out->len = meta->data_size - 8;
  return STROM_OK;
}

static void test_selection(void) {
  strom_topic *t = make_topic("select", 1, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  char data[64];
  for (int i = 0; i < 64; i++) data[i] = (char)i;
  for (int i = 0; i < 10; i++) {
    const char *meta = i % 2 ? "{\"kind\":\"signal\"}" : "{\"kind\":\"noise\"}";
    OK(push_text(p, meta, data, sizeof data, NULL));
  }
  OK(strom_producer_close(p));

  strom_consumer_options o;
  strom_consumer_options_init(&o);
  o.selector = pick_middle;
  strom_consumer *c;
  OK(strom_consumer_open(t, "middle", &o, &c));
  for (int i = 0; i < 10; i++) {
    strom_event *e;
    OK(strom_consumer_pull(c, 10000, &e));
    size_t n;
    const uint8_t *d = strom_event_data(e, &n);
    CHECK(n == 56 && memcmp(d, data + 4, 56) == 0, "range selection fetched %zu bytes", n);
    strom_event_free(e);
  }
  strom_consumer_free(c);

  strom_consumer_options_init(&o);
  o.select = "kind == signal then bytes[0:16]";
  OK(strom_consumer_open(t, "signals", &o, &c));
  int signals = 0;
  for (;;) {
    strom_event *e;
    strom_status s = strom_consumer_pull(c, 10000, &e);
    if (s == STROM_END_OF_STREAM) break;
    OK(s);
    size_t n;
    const uint8_t *d = strom_event_data(e, &n);
    size_t mlen;
    const char *m = strom_event_metadata(e, &mlen);
    int is_signal = memmem(m, mlen, "signal", 6) != NULL;
    CHECK(is_signal ? (n == 16 && memcmp(d, data, 16) == 0) : n == 0,
          "built-in selector fetched %zu bytes of a %s event", n, is_signal ? "signal" : "noise");
    signals += is_signal;
    strom_event_free(e);
  }
  CHECK(signals == 5, "saw %d signal events", signals);
  strom_consumer_free(c);

  o.select = "kind ==";
  strom_status s = strom_consumer_open(t, "bad", &o, &c);
  CHECK(s == STROM_ERR_INVALID_ARGUMENT && strstr(strom_last_error(), "kind"),
        "a bad selector gave %s: %s", strom_status_name(s), strom_last_error());
  strom_producer_free(p);
  strom_topic_free(t);
}

/* A broker lands each event's data across two caller buffers. */
typedef struct {
  atomic_int given, released;
} broker_state;

static strom_status two_buffers(void *user, const strom_event_meta *meta,
                                const strom_selection *sel, uint64_t len, strom_buffer *bufs,
                                size_t max, size_t *n) {
  (void)meta;
  (void)sel;
  broker_state *st = user;
  if (max < 2) return STROM_ERR_DATA_BROKER;
  size_t half = len / 2;
  bufs[0].base = malloc(half ? half : 1);
  bufs[0].len = half;
  bufs[1].base = malloc(len - half + 1);
  bufs[1].len = len - half;
  *n = 2;
  atomic_fetch_add(&st->given, 2);
  return STROM_OK;
}

static void release_buffer(void *user, const strom_buffer *b) {
  broker_state *st = user;
  free(b->base);
  atomic_fetch_add(&st->released, 1);
}

static void test_broker(void) {
  strom_topic *t = make_topic("broker", 1, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  char data[1000];
  for (int i = 0; i < 1000; i++) data[i] = (char)(i * 7);
  for (int i = 0; i < 5; i++) OK(push_text(p, "{}", data, sizeof data, NULL));
  OK(strom_producer_close(p));
  broker_state st = {0, 0};
  strom_consumer_options o;
  strom_consumer_options_init(&o);
  o.broker = two_buffers;
  o.broker_release = release_buffer;
  o.broker_user = &st;
  strom_consumer *c;
  OK(strom_consumer_open(t, "brokered", &o, &c));
  for (int i = 0; i < 5; i++) {
    strom_event *e;
    OK(strom_consumer_pull(c, 10000, &e));
    char out[1000];
    size_t n = 0;
    OK(strom_event_copy_data(e, out, sizeof out, &n));
    CHECK(n == 1000 && memcmp(out, data, n) == 0, "brokered data differs (%zu bytes)", n);
    strom_event_free(e);
  }
  strom_event *e;
  CHECK(strom_consumer_pull(c, 10000, &e) == STROM_END_OF_STREAM, "no end of stream");
  strom_consumer_free(c);
  CHECK(atomic_load(&st.given) == 10 && atomic_load(&st.released) == 10,
        "broker gave %d buffers and got %d back", atomic_load(&st.given),
        atomic_load(&st.released));
  strom_producer_free(p);
  strom_topic_free(t);
}

/* Acks persist per consumer name: a new consumer of the name resumes. */
static void test_acks(void) {
  strom_topic *t = make_topic("acks", 1, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  for (int i = 0; i < 20; i++) {
    char meta[32];
    snprintf(meta, sizeof meta, "{\"i\":%d}", i);
    OK(push_text(p, meta, NULL, 0, NULL));
  }
  OK(strom_producer_flush(p));
  strom_consumer *c;
  OK(strom_consumer_open(t, "acker", NULL, &c));
  for (int i = 0; i < 8; i++) {
    strom_event *e;
    OK(strom_consumer_pull(c, 10000, &e));
    if (i == 7) OK(strom_event_ack_sync(e, 10000));
    strom_event_free(e);
  }
  strom_consumer_free(c);
  OK(strom_consumer_open(t, "acker", NULL, &c));
  strom_event *e;
  OK(strom_consumer_pull(c, 10000, &e));
  strom_event_meta info;
  OK(strom_event_info(e, &info));
  CHECK(info.offset == 8, "resumed at offset %llu, not 8", (unsigned long long)info.offset);
  strom_event_free(e);
  OK(strom_consumer_seek(c, STROM_START_OFFSET, 3));
  OK(strom_consumer_pull(c, 10000, &e));
  OK(strom_event_info(e, &info));
  CHECK(info.offset == 3, "seek to 3 gave offset %llu", (unsigned long long)info.offset);
  strom_event_free(e);
  strom_consumer_free(c);
  OK(strom_producer_close(p));
  strom_producer_free(p);
  strom_topic_free(t);
}

/* The stream ends only after every producer (each on its own thread) closed. */
typedef struct {
  strom_producer *p;
  int id;
  int n;
} producer_job;

static void *produce(void *arg) {
  producer_job *j = arg;
  for (int i = 0; i < j->n; i++) {
    char meta[64];
    snprintf(meta, sizeof meta, "{\"producer\":%d,\"seq\":%d}", j->id, i);
    if (push_text(j->p, meta, &i, sizeof i, NULL) != STROM_OK) return (void *)1;
  }
  return strom_producer_close(j->p) == STROM_OK ? NULL : (void *)1;
}

typedef struct {
  int started, ended, events;
  int last_seq[3];
  int out_of_order;
} counts;

static void on_start(void *user) { ((counts *)user)->started++; }
static void on_end(void *user) { ((counts *)user)->ended++; }
static strom_status on_event(void *user, strom_event *e) {
  counts *c = user;
  size_t n;
  const char *m = strom_event_metadata(e, &n);
  int producer = -1, seq = -1;
  char text[128];
  snprintf(text, sizeof text, "%.*s", (int)n, (const char *)m);
  sscanf(text, "{\"producer\":%d,\"seq\":%d}", &producer, &seq);
  if (producer < 0 || producer > 2) return STROM_ERR_INVALID_ARGUMENT;
  if (seq != c->last_seq[producer] + 1) c->out_of_order++;
  c->last_seq[producer] = seq;
  c->events++;
  return strom_event_ack(e);
}

static void test_end_of_stream_and_process(void) {
  strom_topic *t = make_topic("eos", 3, "hash:producer");
  enum { N = 200 };
  strom_producer *ps[3];
  for (int k = 0; k < 3; k++) OK(strom_producer_open(t, NULL, &ps[k]));
  pthread_t th[3];
  producer_job jobs[3];
  for (int k = 0; k < 3; k++) {
    jobs[k] = (producer_job){ps[k], k, N};
    pthread_create(&th[k], NULL, produce, &jobs[k]);
  }
  counts cs = {0, 0, 0, {-1, -1, -1}, 0};
  strom_consumer *c;
  OK(strom_consumer_open(t, "processor", NULL, &c));
  strom_process_callbacks cb = {on_start, on_event, on_end};
  OK(strom_consumer_process(c, &cb, &cs));
  for (int k = 0; k < 3; k++) {
    void *r;
    pthread_join(th[k], &r);
    CHECK(r == NULL, "producer %d failed", k);
    strom_producer_free(ps[k]);
  }
  CHECK(cs.started == 1 && cs.ended == 1, "on_start %d, on_end %d", cs.started, cs.ended);
  CHECK(cs.events == 3 * N, "processed %d events, not %d", cs.events, 3 * N);
  CHECK(cs.out_of_order == 0, "%d events out of producer order", cs.out_of_order);
  strom_consumer_free(c);
  strom_topic_free(t);
}

/* One producer and one consumer handle, each shared by several threads. */
typedef struct {
  strom_producer *p;
  strom_consumer *c;
  int id;
  int pulled;
  unsigned char *seen;
  int ack; /* ack every event (shared groups) */
} shared_job;

static void *push_shared(void *arg) {
  shared_job *j = arg;
  for (int i = 0; i < 250; i++) {
    char meta[64];
    snprintf(meta, sizeof meta, "{\"n\":%d}", j->id * 250 + i);
    strom_future *f = NULL;
    if (push_text(j->p, meta, NULL, 0, &f) != STROM_OK) return (void *)1;
    strom_event_id id;
    strom_status s = strom_future_get(f, &id);
    if (s != STROM_NOT_READY && s != STROM_OK) return (void *)1;
    strom_future_free(f);
  }
  return NULL;
}

static void *pull_shared(void *arg) {
  shared_job *j = arg;
  for (;;) {
    strom_event *e;
    strom_status s = strom_consumer_pull(j->c, 20000, &e);
    if (s == STROM_END_OF_STREAM) return NULL;
    if (s != STROM_OK) return (void *)1;
    size_t len;
    const char *m = strom_event_metadata(e, &len);
    char text[64];
    snprintf(text, sizeof text, "%.*s", (int)len, m);
    int n = -1;
    sscanf(text, "{\"n\":%d}", &n);
    if (n >= 0 && n < 1000) __atomic_fetch_add(&j->seen[n], 1, __ATOMIC_RELAXED);
    j->pulled++;
    s = j->ack ? strom_event_ack(e) : STROM_OK;
    strom_event_free(e);
    if (s != STROM_OK) return (void *)1;
  }
}

static void test_shared_handles(void) {
  strom_topic *t = make_topic("shared-handles", 2, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  strom_consumer *c;
  OK(strom_consumer_open(t, "many-threads", NULL, &c));
  unsigned char seen[1000] = {0};
  shared_job jobs[4];
  pthread_t th[4];
  for (int k = 0; k < 4; k++) {
    jobs[k] = (shared_job){p, c, k, 0, seen, 0};
    pthread_create(&th[k], NULL, push_shared, &jobs[k]);
  }
  for (int k = 0; k < 4; k++) {
    void *r;
    pthread_join(th[k], &r);
    CHECK(r == NULL, "pushing thread %d failed: %s", k, strom_last_error());
  }
  OK(strom_producer_close(p));
  for (int k = 0; k < 3; k++) pthread_create(&th[k], NULL, pull_shared, &jobs[k]);
  int pulled = 0;
  for (int k = 0; k < 3; k++) {
    void *r;
    pthread_join(th[k], &r);
    CHECK(r == NULL, "pulling thread %d failed", k);
    pulled += jobs[k].pulled;
  }
  CHECK(pulled == 1000, "three threads pulled %d events, not 1000", pulled);
  for (int n = 0; n < 1000; n++) CHECK(seen[n] == 1, "event %d seen %d times", n, seen[n]);
  strom_consumer_free(c);
  strom_producer_free(p);
  strom_topic_free(t);
}

/* Two members of a shared consumer group split the stream: every event
 * goes to exactly one of them. */
static void test_shared_group(void) {
  strom_topic *t = make_topic("work", 2, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  strom_consumer_options o;
  strom_consumer_options_init(&o);
  o.group = "workers";
  o.group_mode = "shared";
  strom_consumer *members[2];
  OK(strom_consumer_open(t, "worker-a", &o, &members[0]));
  OK(strom_consumer_open(t, "worker-b", &o, &members[1]));
  unsigned char seen[1000] = {0};
  shared_job jobs[2];
  pthread_t th[2];
  for (int k = 0; k < 2; k++) {
    jobs[k] = (shared_job){p, members[k], k, 0, seen, 1};
    pthread_create(&th[k], NULL, pull_shared, &jobs[k]);
  }
  for (int i = 0; i < 400; i++) {
    char meta[32];
    snprintf(meta, sizeof meta, "{\"n\":%d}", i);
    OK(push_text(p, meta, NULL, 0, NULL));
  }
  OK(strom_producer_close(p));
  int pulled = 0;
  for (int k = 0; k < 2; k++) {
    void *r;
    pthread_join(th[k], &r);
    CHECK(r == NULL, "group member %d failed: %s", k, strom_last_error());
    pulled += jobs[k].pulled;
  }
  CHECK(pulled == 400, "the group pulled %d events, not 400", pulled);
  for (int n = 0; n < 400; n++) CHECK(seen[n] == 1, "event %d delivered %d times", n, seen[n]);
  o.group_mode = "everyone";
  strom_consumer *bad;
  strom_status s = strom_consumer_open(t, "worker-c", &o, &bad);
  CHECK(s == STROM_ERR_INVALID_ARGUMENT, "a bad group mode gave %d", s);
  for (int k = 0; k < 2; k++) strom_consumer_free(members[k]);
  strom_producer_free(p);
  strom_topic_free(t);
}

/* A worker acks each task once its result is stored (strom_event_ack_when),
 * never waiting: with a prefetch window of 4, 200 tasks still all pass
 * through one worker, each delivered once. */
static void test_ack_when(void) {
  strom_topic *tasks = make_topic("ack-when-tasks", 1, NULL);
  strom_topic *results = make_topic("ack-when-results", 1, NULL);
  strom_producer *p, *out;
  OK(strom_producer_open(tasks, NULL, &p));
  OK(strom_producer_open(results, NULL, &out));
  for (int i = 0; i < 200; i++) OK(push_text(p, "{}", NULL, 0, NULL));
  OK(strom_producer_close(p));
  strom_consumer_options o;
  strom_consumer_options_init(&o);
  o.group = "ack-when";
  o.group_mode = "shared";
  o.prefetch = 4;
  strom_consumer *worker;
  OK(strom_consumer_open(tasks, "worker", &o, &worker));
  int done = 0;
  strom_event *e;
  strom_status s;
  while ((s = strom_consumer_pull(worker, 20000, &e)) == STROM_OK) {
    strom_event_meta m;
    OK(strom_event_info(e, &m));
    strom_future *result;
    OK(push_text(out, "{\"r\":1}", NULL, 0, &result));
    const strom_future *results_of_task[1] = {result};
    OK(strom_event_ack_when(e, results_of_task, 1));
    strom_future_free(result); /* the ack does not need the handle */
    strom_event_free(e);
    CHECK(m.offset == (uint64_t)done, "task %llu came after %d tasks (a redelivery?)",
          (unsigned long long)m.offset, done);
    done++;
  }
  CHECK(s == STROM_END_OF_STREAM, "the worker stopped with %s after %d tasks: %s",
        strom_status_name(s), done, strom_last_error());
  CHECK(done == 200, "the worker did %d tasks", done);
  CHECK(strom_event_ack_when(NULL, NULL, 0) == STROM_ERR_NULL_ARGUMENT, "a NULL event passed");
  OK(strom_producer_close(out));
  strom_consumer_free(worker);
  strom_producer_free(p);
  strom_producer_free(out);
  strom_topic_free(tasks);
  strom_topic_free(results);
}

/* strom_topic_complete ends the stream while a producer is still open. */
static void test_complete(void) {
  strom_topic *t = make_topic("complete", 1, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  for (int i = 0; i < 3; i++) OK(push_text(p, "{}", NULL, 0, NULL));
  OK(strom_producer_flush(p));
  OK(strom_topic_complete(t));
  strom_consumer *c;
  OK(strom_consumer_open(t, "after-complete", NULL, &c));
  int n = 0;
  strom_event *e;
  strom_status s;
  while ((s = strom_consumer_pull(c, 10000, &e)) == STROM_OK) {
    n++;
    strom_event_free(e);
  }
  CHECK(s == STROM_END_OF_STREAM && n == 3, "read %d events, then %s", n, strom_status_name(s));
  strom_future *f = NULL;
  s = push_text(p, "{}", NULL, 0, &f);
  if (s == STROM_OK) s = strom_future_wait(f, NULL);
  CHECK(s == STROM_ERR_TOPIC_CLOSED, "a push after complete gave %s", strom_status_name(s));
  strom_future_free(f);
  strom_consumer_free(c);
  strom_producer_free(p);
  strom_topic_free(t);
}

/* A callback's non-zero status stops processing with STROM_ERR_CALLBACK. */
static strom_status refuse(void *user, strom_event *e) {
  (void)user;
  (void)e;
  return 42;
}

static void test_callback_error(void) {
  strom_topic *t = make_topic("refuse", 1, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  OK(push_text(p, "{}", NULL, 0, NULL));
  OK(strom_producer_close(p));
  strom_consumer *c;
  OK(strom_consumer_open(t, "refuser", NULL, &c));
  strom_process_callbacks cb = {NULL, refuse, NULL};
  strom_status s = strom_consumer_process(c, &cb, NULL);
  CHECK(s == STROM_ERR_CALLBACK && strstr(strom_last_error(), "42"),
        "a refusing callback gave %s: %s", strom_status_name(s), strom_last_error());
  strom_consumer_free(c);
  strom_producer_free(p);
  strom_topic_free(t);
}

/* Lent data is not copied and is released once libstrom is done with it. */
static atomic_int lent_released;
static void release_lent(void *user) {
  free(user);
  atomic_fetch_add(&lent_released, 1);
}

static void test_lent_data(void) {
  strom_topic *t = make_topic("lent", 1, NULL);
  strom_producer *p;
  OK(strom_producer_open(t, NULL, &p));
  for (int i = 0; i < 10; i++) {
    char *buf = malloc(4096);
    memset(buf, 'a' + i, 4096);
    strom_iovec iov[2] = {{buf, 1000}, {buf + 1000, 3096}};
    strom_push push;
    strom_push_init(&push, "{}", 2);
    push.data = iov;
    push.ndata = 2;
    push.partition = 0;
    push.release = release_lent;
    push.release_user = buf;
    OK(strom_producer_push_ex(p, &push, NULL));
  }
  OK(strom_producer_close(p));
  for (int i = 0; i < 200 && atomic_load(&lent_released) < 10; i++) usleep(10000);
  CHECK(atomic_load(&lent_released) == 10, "%d of 10 lent buffers released",
        atomic_load(&lent_released));
  strom_consumer *c;
  OK(strom_consumer_open(t, "lent", NULL, &c));
  for (int i = 0; i < 10; i++) {
    strom_event *e;
    OK(strom_consumer_pull(c, 10000, &e));
    size_t n;
    const uint8_t *d = strom_event_data(e, &n);
    CHECK(n == 4096 && d[0] == 'a' + i && d[4095] == 'a' + i, "lent event %d", i);
    strom_event_free(e);
  }
  strom_consumer_free(c);
  strom_producer_free(p);
  strom_topic_free(t);
}

/* Errors carry stable codes, names and a message; NULL handles are refused. */
static void test_errors(void) {
  strom_topic *t = NULL;
  strom_status s = strom_topic_open(driver, "no-such-topic", &t);
  CHECK(s == STROM_ERR_TOPIC_NOT_FOUND, "open of a missing topic gave %d", s);
  CHECK(strcmp(strom_status_name(s), "TOPIC_NOT_FOUND") == 0, "name %s", strom_status_name(s));
  CHECK(strstr(strom_last_error(), "no-such-topic") != NULL, "message: %s", strom_last_error());
  s = strom_producer_open(NULL, NULL, NULL);
  CHECK(s == STROM_ERR_NULL_ARGUMENT, "NULL topic gave %d", s);
  CHECK(strcmp(strom_status_name(STROM_END_OF_STREAM), "END_OF_STREAM") == 0, "EOS name");
  CHECK(strcmp(strom_status_name(12345), "UNKNOWN") == 0, "unknown name");
  CHECK(strstr(strom_status_str(STROM_ERR_DISK_FULL), "disk") != NULL, "DISK_FULL text");
  strom_topic_spec spec;
  strom_topic_spec_init(&spec, "bad-spec", 1);
  spec.partition_type = "tape";
  s = strom_topic_create(driver, &spec, &t);
  CHECK(s == STROM_ERR_INVALID_ARGUMENT && strstr(strom_last_error(), "tape"),
        "bad partition type gave %d: %s", s, strom_last_error());
  strom_driver_free(NULL);
  strom_event_free(NULL);
}

/* Whatever transport ran (libfabric and its providers, loaded on first
 * use, install handlers for SIGINT, SIGTERM, SIGSEGV and more when they
 * load), this program's signal dispositions are still its own: as they
 * were when main started. */
static void *dispositions_at_start[32];

static void *disposition(int sig) {
  struct sigaction a;
  if (sigaction(sig, NULL, &a) != 0) return NULL;
  return (a.sa_flags & SA_SIGINFO) ? (void *)a.sa_sigaction : (void *)a.sa_handler;
}

static void keep_signal_dispositions(void) {
  for (int sig = 1; sig < 32; sig++) dispositions_at_start[sig] = disposition(sig);
}

static void test_signals_untouched(void) {
  for (int sig = 1; sig < 32; sig++)
    CHECK(disposition(sig) == dispositions_at_start[sig],
          "signal %d's handler changed while the tests ran (libfabric's providers?)", sig);
}

int main(void) {
  if (!mkdtemp(data_dir)) {
    perror("mkdtemp");
    return 2;
  }
  /* STROM_TEST_LISTEN runs the whole suite over another transport, e.g.
   * ofi+tcp://auto or ofi+shm://auto (make test-ffi does both). */
  keep_signal_dispositions();
  const char *listen = getenv("STROM_TEST_LISTEN");
  strom_server_options so;
  strom_server_options_init(&so, data_dir);
  so.listen = listen && listen[0] ? listen : NULL;
  /* ofi+tcp://auto binds the provider's network address: no auth here. */
  so.insecure = so.listen != NULL;
  if (strom_driver_embedded_ex(&so, &driver) != STROM_OK) {
    fprintf(stderr, "embedded server on %s: %s\n", listen ? listen : "tcp", strom_last_error());
    return 2;
  }
  printf("libstrom C tests over %s\n", strom_driver_master_addr(driver));
  test_order_and_data();
  test_selection();
  test_broker();
  test_acks();
  test_end_of_stream_and_process();
  test_callback_error();
  test_shared_handles();
  test_shared_group();
  test_ack_when();
  test_complete();
  test_lent_data();
  test_errors();
  test_signals_untouched();
  strom_driver_free(driver);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", data_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", data_dir);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("libstrom C tests: all passed (version %s)\n", strom_version());
  return 0;
}
