/*
 * libstrom with a token over TLS (docs/security.md), against a real
 * `strom server --auth --listen tls://...` that tests/c/tls_token.sh starts:
 * without the CA the client cannot connect; a token whose principal has no
 * rights is refused with STROM_ERR_NOT_AUTHORIZED, and so is an anonymous
 * connection (no token), told so; a super user's token creates a topic, produces
 * and reads back its events, data parts included.
 *
 * Usage: test_tls_token GROUP_FILE CA_PEM ADMIN_TOKEN USER_TOKEN
 * (the library reads STROM_TLS_CA and STROM_TOKEN, which this sets).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strom.h"

static int failures = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, " (last error: %s)\n", strom_last_error()); \
      failures++;                                          \
      return;                                              \
    }                                                      \
  } while (0)

static const char *group_file;

/* Connects with these settings (NULL unsets), creates topic `name`:
 * the first status that is not STROM_OK, or STROM_OK. */
static strom_status connect_and_create(const char *ca, const char *token, const char *name) {
  if (ca) setenv("STROM_TLS_CA", ca, 1); else unsetenv("STROM_TLS_CA");
  if (token) setenv("STROM_TOKEN", token, 1); else unsetenv("STROM_TOKEN");
  strom_driver *d = NULL;
  strom_status s = strom_driver_connect(group_file, &d);
  if (s != STROM_OK) return s;
  strom_topic_spec spec;
  strom_topic_spec_init(&spec, name, 1);
  strom_topic *t = NULL;
  s = strom_topic_create(d, &spec, &t);
  if (t) strom_topic_free(t);
  strom_driver_free(d);
  return s;
}

static void test_refusals(const char *ca, const char *user_token) {
  strom_status s = connect_and_create(NULL, user_token, "c.denied");
  CHECK(s != STROM_OK, "connected over tls:// without trusting a CA");
  s = connect_and_create(ca, user_token, "c.denied");
  CHECK(s == STROM_ERR_NOT_AUTHORIZED, "a user without rights created a topic: %s (%d)",
        strom_status_name(s), s);
  CHECK(strstr(strom_last_error(), "User:alice") != NULL, "the refusal names the principal");
  s = connect_and_create(ca, NULL, "c.anonymous");
  CHECK(s == STROM_ERR_NOT_AUTHORIZED, "no token: %s (%d)", strom_status_name(s), s);
  CHECK(strstr(strom_last_error(), "anonymous") != NULL, "the refusal says the connection is anonymous");
}

static void test_admin_round_trip(const char *ca, const char *admin_token) {
  setenv("STROM_TLS_CA", ca, 1);
  setenv("STROM_TOKEN", admin_token, 1);
  strom_driver *d = NULL;
  CHECK(strom_driver_connect(group_file, &d) == STROM_OK, "admin connect");
  strom_topic_spec spec;
  strom_topic_spec_init(&spec, "c.secure", 1);
  strom_topic *t = NULL;
  CHECK(strom_topic_create(d, &spec, &t) == STROM_OK, "admin creates a topic");
  strom_producer *p = NULL;
  CHECK(strom_producer_open(t, NULL, &p) == STROM_OK, "producer");
  for (int i = 0; i < 3; i++) {
    char meta[32], data[64];
    int n = snprintf(meta, sizeof meta, "{\"i\":%d}", i);
    memset(data, 'a' + i, sizeof data);
    strom_iovec v = {data, sizeof data};
    CHECK(strom_producer_push(p, meta, (size_t)n, &v, 1, NULL) == STROM_OK, "push %d", i);
  }
  CHECK(strom_producer_close(p) == STROM_OK, "close");
  strom_producer_free(p);
  strom_consumer *c = NULL;
  CHECK(strom_consumer_open(t, "reader", NULL, &c) == STROM_OK, "consumer");
  for (int i = 0; i < 3; i++) {
    strom_event *e = NULL;
    strom_status s = strom_consumer_pull(c, 20000, &e);
    CHECK(s == STROM_OK, "pull %d: %s", i, strom_status_name(s));
    size_t len = 0;
    const char *meta = strom_event_metadata(e, &len);
    char want[32];
    int n = snprintf(want, sizeof want, "{\"i\":%d}", i);
    CHECK(len == (size_t)n && memcmp(meta, want, len) == 0, "event %d's metadata", i);
    char data[64];
    size_t copied = 0;
    CHECK(strom_event_copy_data(e, data, sizeof data, &copied) == STROM_OK && copied == sizeof data,
          "event %d's data", i);
    CHECK(data[0] == 'a' + i && data[63] == 'a' + i, "event %d's data bytes", i);
    strom_event_free(e);
  }
  strom_event *end = NULL;
  CHECK(strom_consumer_pull(c, 20000, &end) == STROM_END_OF_STREAM, "end of stream");
  strom_consumer_free(c);
  strom_topic_free(t);
  strom_driver_free(d);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s GROUP_FILE CA_PEM ADMIN_TOKEN USER_TOKEN\n", argv[0]);
    return 2;
  }
  group_file = argv[1];
  test_refusals(argv[2], argv[4]);
  test_admin_round_trip(argv[2], argv[3]);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("libstrom over TLS with tokens: all passed\n");
  return 0;
}
