/*
 * strom_mpi.h: MPI channels over libstrom (libstrom_mpi). Guide: docs/mpi.md.
 *
 * A channel is a Strom topic opened by every rank of an MPI communicator
 * at once, the way MPI codes open files or windows:
 *
 *   strom_mpi_channel *ch;
 *   strom_mpi_channel_open(MPI_COMM_WORLD, STROM_MPI_PRODUCER, "steps", NULL, &ch);
 *   strom_mpi_channel_push(ch, field, n, MPI_DOUBLE, "{\"step\":3}");
 *   ...
 *   strom_mpi_channel_close(&ch);    // collective; ends this rank's stream
 *
 * Consumers pull events until STROM_END_OF_STREAM, which comes once every
 * producer rank has ended (strom_mpi_channel_end or _close), and read each
 * event's elements with strom_mpi_event_unpack into their own datatype.
 *
 * The channel starts embedded servers inside chosen ranks (one per node by
 * default, on each node's lowest rank) and exchanges their addresses over
 * the communicator, or attaches to a running group (options.group_file or
 * options.master_addr). Every call returns a strom_status (strom.h); a
 * failing call's message is in strom_mpi_last_error() on that thread.
 * The collective calls (open, close) return the same status on every rank:
 * a failure on one rank fails the call everywhere, and nothing hangs.
 *
 * Build: compile the C files of crates/strom-ffi/mpi with your mpicc (make ffi-mpi-lib
 * gives target/ffi/libstrom_mpi.a) and link it before libstrom:
 *
 *   mpicc app.c -Iinclude libstrom_mpi.a libstrom.a -lpthread -ldl -lm
 */
#ifndef STROM_MPI_H
#define STROM_MPI_H

#include <mpi.h>
#include <stdint.h>

#include "strom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A rank's role in a channel (STROM_MPI_BOTH = producer and consumer). A
 * rank with STROM_MPI_NONE takes part in the collectives only (and may
 * host a server). */
#define STROM_MPI_NONE 0
#define STROM_MPI_PRODUCER 1
#define STROM_MPI_CONSUMER 2
#define STROM_MPI_BOTH 3

/* How consumer ranks share the stream. SHARE (default): each partition is
 * read by one consumer rank, so every element reaches exactly one consumer;
 * BROADCAST: every consumer rank reads every element. */
#define STROM_MPI_SHARE 0
#define STROM_MPI_BROADCAST 1

typedef struct strom_mpi_channel strom_mpi_channel;

/* How to open a channel. Fill with strom_mpi_channel_options_init, then
 * change what you need. Strings are borrowed for the duration of the open;
 * NULL and 0 mean the default. Every rank must pass the same options. */
typedef struct {
  /* Attach to this running group (a group file every rank can read)
   * instead of starting servers. */
  const char *group_file;
  /* Or attach to the group whose registry master listens here. */
  const char *master_addr;
  /* Embedded servers on each node, on its lowest ranks (default 1). */
  int servers_per_node;
  /* Where embedded servers keep their data: a fresh directory each, made
   * under this one (default $TMPDIR, else /tmp) and removed at close. */
  const char *data_dir;
  /* The host embedded servers listen on (default 127.0.0.1, which serves
   * one node). A network address needs `insecure` (docs/security.md). */
  const char *listen_host;
  int insecure;
  /* The topic, when the channel creates it: partitions (default: one per
   * consumer rank, at least 1), "memory" (default) or "file", and a
   * partition selector such as "hash:key" (default: each producer rank
   * writes one partition, so a consumer reads its elements in order). */
  uint32_t partitions;
  const char *partition_type;
  const char *selector;
  /* File topics: "always" (default), "never" or "interval:<ms>". */
  const char *durability;
  /* How each producer rank batches (NULL: libstrom's defaults). */
  const strom_producer_options *producer;
  /* STROM_MPI_SHARE (default) or STROM_MPI_BROADCAST. */
  int distribution;
  /* Consumers are named consumers, `<consumer_name>-<i>` for the i-th
   * consumer rank, with persistent acks: a later job that opens the same
   * channel on the same group resumes after each one's last ack.
   * Default: the topic's name. */
  const char *consumer_name;
  /* A built-in data selector for every consumer (strom_consumer_options
   * .select), e.g. "kind == signal". */
  const char *select;
} strom_mpi_channel_options;

/* Fills `opts` with the defaults. */
strom_status strom_mpi_channel_options_init(strom_mpi_channel_options *opts);

/* Collective over `comm`: opens the channel `topic` (creating the topic if
 * it does not exist), starts or attaches to the servers, opens this rank's
 * producer and consumer as `role` says, and returns once every producer
 * rank is registered (so no consumer sees the end of the stream early).
 * `opts` may be NULL. On failure `*out` is NULL on every rank. */
strom_status strom_mpi_channel_open(MPI_Comm comm, int role, const char *topic,
                                    const strom_mpi_channel_options *opts,
                                    strom_mpi_channel **out);

/* Pushes `count` elements of `type` from `buf` as one event, with JSON
 * `metadata` (NULL: "{}"). Contiguous data is copied; other layouts
 * (vector, subarray, any derived type) are packed. The event carries a
 * descriptor of what was sent: {"dtype":"<f8","shape":[...],"order":"C",
 * "mpi":"vector(4,1,8,MPI_DOUBLE)"} (numpy-readable when the type has
 * one element type). Returns once the event is queued; errors surface
 * here or at strom_mpi_channel_end. Producer ranks only. */
strom_status strom_mpi_channel_push(strom_mpi_channel *ch, const void *buf, int count,
                                    MPI_Datatype type, const char *metadata);

/* Flushes and ends this rank's part of the stream (not collective). Later
 * pushes fail with STROM_ERR_CLOSED. Close does it if not done. */
strom_status strom_mpi_channel_end(strom_mpi_channel *ch);

/* The next event for this consumer rank, waiting up to `timeout_ms` (-1:
 * no limit): STROM_OK with `*out` (free it with strom_event_free),
 * STROM_END_OF_STREAM once every producer rank has ended and this rank
 * has read everything, or STROM_ERR_TIMEOUT. Ack events with
 * strom_event_ack to keep the position across jobs. */
strom_status strom_mpi_channel_pull(strom_mpi_channel *ch, int64_t timeout_ms, strom_event **out);

/* MPIStream's Operate: runs `cb->on_start`, then `cb->on_event` for every
 * event until the end of the stream (each acked after on_event returns
 * STROM_OK), then `cb->on_end`. Consumer ranks only. */
strom_status strom_mpi_channel_operate(strom_mpi_channel *ch, const strom_process_callbacks *cb,
                                       void *user);

/* Like MPI_Get_count: how many whole elements of `type` the event's data
 * holds (STROM_ERR_INVALID_ARGUMENT if it is not a whole number, or the
 * event's element type, from its descriptor, differs from `type`'s). */
strom_status strom_mpi_event_count(const strom_event *ev, MPI_Datatype type, int *count);

/* Unpacks the event's elements into `buf` laid out as `count` elements of
 * `type` (any layout: a producer's strided column may land contiguous, and
 * the other way). The event must hold exactly `count` elements of the same
 * element type (see strom_mpi_event_count). */
strom_status strom_mpi_event_unpack(const strom_event *ev, void *buf, int count,
                                    MPI_Datatype type);

/* Collective: ends this rank's part of the stream if it has not, frees
 * its producer and consumer, waits for every rank, stops the embedded
 * servers and removes their directories. Returns the first error any rank
 * met (a failed flush included); `*ch` is NULL afterwards. */
strom_status strom_mpi_channel_close(strom_mpi_channel **ch);

/* This rank's producer and consumer indices among the channel's producer
 * and consumer ranks (-1 when it has no such role), and their counts. */
int strom_mpi_channel_producer_index(const strom_mpi_channel *ch);
int strom_mpi_channel_consumer_index(const strom_mpi_channel *ch);
int strom_mpi_channel_producers(const strom_mpi_channel *ch);
int strom_mpi_channel_consumers(const strom_mpi_channel *ch);

/* The handles underneath, for everything else libstrom offers. Borrowed:
 * valid until the channel is closed. NULL when this rank has none. */
const strom_driver *strom_mpi_channel_driver(const strom_mpi_channel *ch);
const strom_topic *strom_mpi_channel_topic(const strom_mpi_channel *ch);
const strom_producer *strom_mpi_channel_producer(const strom_mpi_channel *ch);
const strom_consumer *strom_mpi_channel_consumer(const strom_mpi_channel *ch);

/* The message of this thread's last failed strom_mpi_* call (or, when
 * libstrom failed underneath, strom_last_error()). */
const char *strom_mpi_last_error(void);

/* Fortran: the same calls with MPI_Fint handles (include/strom_mpi.f90). */
strom_status strom_mpi_channel_open_f(MPI_Fint comm, int role, const char *topic,
                                      const strom_mpi_channel_options *opts,
                                      strom_mpi_channel **out);
strom_status strom_mpi_channel_push_f(strom_mpi_channel *ch, const void *buf, int count,
                                      MPI_Fint type, const char *metadata);
strom_status strom_mpi_event_count_f(const strom_event *ev, MPI_Fint type, int *count);
strom_status strom_mpi_event_unpack_f(const strom_event *ev, void *buf, int count, MPI_Fint type);

#ifdef __cplusplus
}
#endif

#endif /* STROM_MPI_H */
