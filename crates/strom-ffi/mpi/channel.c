/*
 * channel.c: MPI channels (include/strom_mpi.h). It owns a channel's life:
 * the roles of the ranks, the embedded servers (where they run, how they
 * find each other over the communicator), the topic, each rank's producer
 * and consumer, the collective open and close that agree on one outcome,
 * Datatypes are datatype.c's, error messages error.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "channel_internal.h"

#define ADDR_CAP 512
#define FILE_CAP (64 * 1024) /* a group file or secret exchanged at open */
#define JOIN_WAIT_MS 60000   /* how long open waits for the servers to join */

struct strom_mpi_channel {
  MPI_Comm comm;
  int rank, size, role;
  int producer_index, consumer_index, producers, consumers;
  strom_driver *server; /* this rank's embedded server, if it hosts one */
  strom_driver *client; /* a connection to the group (NULL: use `server`) */
  strom_topic *topic;
  strom_producer *producer;
  strom_consumer *consumer;
  int ended;
  uint32_t partitions;
  int explicit_partition;
  char dir[4096]; /* the embedded server's data dir ("" if none) */
  MPI_Datatype desc_type;
  int desc_count;
  char desc[1024];
};

/* Every rank learns the worst outcome of a step: its own when it failed,
 * else the failing rank's status, with a message naming that rank. */
static strom_status agree(const strom_mpi_channel *ch, strom_status s, const char *step) {
  struct {
    int status, rank;
  } mine = {s, ch->rank}, worst;
  int rc = MPI_Allreduce(&mine, &worst, 1, MPI_2INT, MPI_MAXLOC, ch->comm);
  if (rc != MPI_SUCCESS) return smi_mpi(rc, "MPI_Allreduce");
  if (s != STROM_OK || worst.status == STROM_OK) return s;
  return smi_fail(worst.status, "%s failed on rank %d (%s); see its message", step, worst.rank,
                  strom_status_name(worst.status));
}

/* ---- files ------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static strom_status read_file(const char *path, char *buf, int *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return smi_fail(STROM_ERR_GROUP_FILE, "cannot read %s: %s", path, strerror(errno));
  size_t n = fread(buf, 1, FILE_CAP, f);
  int big = !feof(f);
  fclose(f);
  if (big) return smi_fail(STROM_ERR_GROUP_FILE, "%s is over %d bytes", path, FILE_CAP);
  *len = (int)n;
  return STROM_OK;
}

/* Writes a file only this user may read. */
static strom_status write_private(const char *path, const char *buf, int len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return smi_fail(STROM_ERR_GROUP_FILE, "cannot create %s: %s", path, strerror(errno));
  ssize_t n = write(fd, buf, (size_t)len);
  int ok = n == len && fsync(fd) == 0;
  close(fd);
  return ok ? STROM_OK : smi_fail(STROM_ERR_GROUP_FILE, "cannot write %s", path);
}

static strom_status make_dir(strom_mpi_channel *ch, const char *parent) {
  const char *tmp = getenv("TMPDIR");
  const char *base = parent && parent[0] ? parent : (tmp && tmp[0] ? tmp : "/tmp");
  int n = snprintf(ch->dir, sizeof ch->dir, "%s/strom-mpi-%d-XXXXXX", base, ch->rank);
  if (n < 0 || (size_t)n >= sizeof ch->dir || !mkdtemp(ch->dir)) {
    ch->dir[0] = '\0';
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "cannot make a data dir under %s: %s", base,
                    strerror(errno));
  }
  return STROM_OK;
}

/* ---- servers ----------------------------------------------------------- */

/* Starts this rank's server: the group's first (rank 0), or one that joins
 * it through the group file and secret rank 0 sent. */
static strom_status start_server(strom_mpi_channel *ch, const strom_mpi_channel_options *o,
                                 const char *group, int glen, const char *secret, int slen) {
  strom_status s = make_dir(ch, o->data_dir);
  if (s != STROM_OK) return s;
  char listen[ADDR_CAP], group_file[4200], secret_file[4300];
  snprintf(listen, sizeof listen, "%s:0", o->listen_host ? o->listen_host : "127.0.0.1");
  snprintf(group_file, sizeof group_file, "%s/group.json", ch->dir);
  snprintf(secret_file, sizeof secret_file, "%s.secret", group_file);
  strom_server_options so;
  strom_server_options_init(&so, ch->dir);
  so.listen = listen;
  so.insecure = o->insecure;
  if (ch->rank == 0) {
    so.group_file = group_file;
  } else {
    if ((s = write_private(group_file, group, glen)) != STROM_OK ||
        (s = write_private(secret_file, secret, slen)) != STROM_OK)
      return s;
    so.join = group_file;
    so.cluster_secret_file = secret_file;
  }
  s = strom_driver_embedded_ex(&so, &ch->server);
  return s == STROM_OK ? s : smi_strom(s, "starting the embedded server");
}

/* Rank 0 waits until the registry lists every server alive, so the
 * topic's partitions are spread over all of them. */
static strom_status await_servers(strom_mpi_channel *ch, uint32_t want) {
  for (int waited = 0;; waited += 20) {
    uint32_t alive = 0;
    strom_status s = strom_driver_members(ch->server, NULL, &alive);
    if (s != STROM_OK) return smi_strom(s, "listing the members");
    if (alive >= want) return STROM_OK;
    if (waited >= JOIN_WAIT_MS)
      return smi_fail(STROM_ERR_TIMEOUT, "%u of %u servers joined within %d ms", alive, want,
                      JOIN_WAIT_MS);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* Sends rank 0's group file and secret to the other server ranks. */
static strom_status share_group(strom_mpi_channel *ch, MPI_Comm servers, char *group, int *glen,
                                char *secret, int *slen) {
  strom_status s = STROM_OK;
  if (ch->rank == 0) {
    char path[4300];
    snprintf(path, sizeof path, "%s/group.json", ch->dir);
    s = read_file(path, group, glen);
    snprintf(path, sizeof path, "%s/group.json.secret", ch->dir);
    if (s == STROM_OK) s = read_file(path, secret, slen);
  }
  int lens[3] = {s, *glen, *slen};
  MPI_Bcast(lens, 3, MPI_INT, 0, servers);
  if (lens[0] != STROM_OK) return ch->rank == 0 ? s : smi_fail(lens[0], "rank 0 failed");
  *glen = lens[1], *slen = lens[2];
  MPI_Bcast(group, *glen, MPI_CHAR, 0, servers);
  MPI_Bcast(secret, *slen, MPI_CHAR, 0, servers);
  return STROM_OK;
}

/* Starts the embedded servers (each node's lowest `servers_per_node`
 * ranks) and connects every rank to the group. */
static strom_status start_servers(strom_mpi_channel *ch, const strom_mpi_channel_options *o,
                                  char *master) {
  MPI_Comm node, servers = MPI_COMM_NULL;
  int node_rank = 0, nservers = 0;
  MPI_Comm_split_type(ch->comm, MPI_COMM_TYPE_SHARED, ch->rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_free(&node);
  int per_node = o->servers_per_node > 0 ? o->servers_per_node : 1;
  int is_server = node_rank < per_node;
  MPI_Comm_split(ch->comm, is_server ? 0 : MPI_UNDEFINED, ch->rank, &servers);
  MPI_Allreduce(&is_server, &nservers, 1, MPI_INT, MPI_SUM, ch->comm);
  strom_status s = ch->rank == 0 ? start_server(ch, o, NULL, 0, NULL, 0) : STROM_OK;
  s = agree(ch, s, "starting the first server");
  char *group = calloc(2, FILE_CAP), *secret = group ? group + FILE_CAP : NULL;
  int glen = 0, slen = 0;
  if (!group) s = smi_fail(STROM_ERR_INTERNAL, "out of memory");
  if (s == STROM_OK && servers != MPI_COMM_NULL && nservers > 1)
    s = share_group(ch, servers, group, &glen, secret, &slen);
  if (s == STROM_OK && is_server && ch->rank != 0)
    s = start_server(ch, o, group, glen, secret, slen);
  if (group) explicit_bzero(secret, FILE_CAP);
  free(group);
  if (servers != MPI_COMM_NULL) MPI_Comm_free(&servers);
  s = agree(ch, s, "starting the servers");
  if (s == STROM_OK && ch->rank == 0) {
    s = await_servers(ch, (uint32_t)nservers);
    snprintf(master, ADDR_CAP, "%s", strom_driver_master_addr(ch->server));
  }
  s = agree(ch, s, "waiting for the servers to join");
  if (s == STROM_OK) MPI_Bcast(master, ADDR_CAP, MPI_CHAR, 0, ch->comm);
  return s;
}

/* Starts or attaches to the servers; every rank ends with a client. */
static strom_status connect_group(strom_mpi_channel *ch, const strom_mpi_channel_options *o) {
  char master[ADDR_CAP] = "";
  strom_status s = STROM_OK;
  if (o->group_file) {
    s = strom_driver_connect(o->group_file, &ch->client);
    return s == STROM_OK ? s : smi_strom(s, "connecting through the group file");
  }
  if (o->master_addr) snprintf(master, sizeof master, "%s", o->master_addr);
  else if ((s = start_servers(ch, o, master)) != STROM_OK) return s;
  if (ch->rank == 0 && ch->server) return STROM_OK;
  s = strom_driver_connect_addr(master, &ch->client);
  return s == STROM_OK ? s : smi_strom(s, "connecting to the group");
}

/* ---- roles, topic, producer, consumer ---------------------------------- */

static strom_status count_roles(strom_mpi_channel *ch) {
  int *roles = malloc((size_t)ch->size * sizeof *roles);
  if (!roles) return smi_fail(STROM_ERR_INTERNAL, "out of memory");
  MPI_Allgather(&ch->role, 1, MPI_INT, roles, 1, MPI_INT, ch->comm);
  ch->producer_index = ch->consumer_index = -1;
  for (int r = 0; r < ch->size; r++) {
    if (r == ch->rank && (roles[r] & STROM_MPI_PRODUCER)) ch->producer_index = ch->producers;
    if (r == ch->rank && (roles[r] & STROM_MPI_CONSUMER)) ch->consumer_index = ch->consumers;
    ch->producers += (roles[r] & STROM_MPI_PRODUCER) != 0;
    ch->consumers += (roles[r] & STROM_MPI_CONSUMER) != 0;
  }
  free(roles);
  return STROM_OK;
}

static const strom_driver *driver_of(const strom_mpi_channel *ch) {
  return ch->client ? ch->client : ch->server;
}

/* Rank 0 creates the topic unless it exists; then every rank opens it. */
static strom_status open_topic(strom_mpi_channel *ch, const char *name,
                               const strom_mpi_channel_options *o) {
  strom_status s = STROM_OK;
  if (ch->rank == 0) {
    strom_topic_spec spec;
    uint32_t parts = o->partitions ? o->partitions : (uint32_t)(ch->consumers ? ch->consumers : 1);
    strom_topic_spec_init(&spec, name, parts);
    spec.partition_type = o->partition_type ? o->partition_type : "memory";
    spec.selector = o->selector;
    spec.durability = o->durability;
    strom_topic *t = NULL;
    s = strom_topic_create(driver_of(ch), &spec, &t);
    strom_topic_free(t);
    if (s == STROM_ERR_TOPIC_EXISTS) s = STROM_OK;
    else if (s != STROM_OK) s = smi_strom(s, "creating the topic");
  }
  if ((s = agree(ch, s, "creating the topic")) != STROM_OK) return s;
  s = strom_topic_open(driver_of(ch), name, &ch->topic);
  if (s != STROM_OK) return smi_strom(s, "opening the topic");
  ch->partitions = strom_topic_partitions(ch->topic);
  ch->explicit_partition = o->selector == NULL;
  return STROM_OK;
}

static strom_status open_producer(strom_mpi_channel *ch, const strom_mpi_channel_options *o) {
  if (ch->producer_index < 0) return STROM_OK;
  strom_status s = strom_producer_open(ch->topic, o->producer, &ch->producer);
  return s == STROM_OK ? s : smi_strom(s, "opening the producer");
}

/* A consumer rank's partitions: SHARE gives it every consumers-th one. */
static strom_status open_consumer(strom_mpi_channel *ch, const char *topic,
                                  const strom_mpi_channel_options *o) {
  if (ch->consumer_index < 0) return STROM_OK;
  uint32_t *mine = malloc((ch->partitions + 1) * sizeof *mine);
  if (!mine) return smi_fail(STROM_ERR_INTERNAL, "out of memory");
  size_t n = 0;
  for (uint32_t p = 0; p < ch->partitions; p++)
    if (o->distribution == STROM_MPI_BROADCAST || p % (uint32_t)ch->consumers == (uint32_t)ch->consumer_index)
      mine[n++] = p;
  strom_status s = STROM_OK;
  if (n > 0) {
    char name[512];
    snprintf(name, sizeof name, "%s-%d", o->consumer_name ? o->consumer_name : topic,
             ch->consumer_index);
    strom_consumer_options co;
    strom_consumer_options_init(&co);
    co.partitions = mine;
    co.npartitions = n;
    co.select = o->select;
    s = strom_consumer_open(ch->topic, name, &co, &ch->consumer);
    if (s != STROM_OK) s = smi_strom(s, "opening the consumer");
  }
  free(mine);
  return s;
}

/* ---- open and close ---------------------------------------------------- */

strom_status strom_mpi_channel_options_init(strom_mpi_channel_options *opts) {
  if (!opts) return smi_fail(STROM_ERR_NULL_ARGUMENT, "opts is NULL");
  memset(opts, 0, sizeof *opts);
  opts->servers_per_node = 1;
  opts->distribution = STROM_MPI_SHARE;
  return STROM_OK;
}

static strom_status check_args(int role, const char *topic, const strom_mpi_channel_options *o) {
  if (!topic || !topic[0]) return smi_fail(STROM_ERR_INVALID_ARGUMENT, "a channel needs a topic");
  if (role < STROM_MPI_NONE || role > STROM_MPI_BOTH)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "role %d is not one of STROM_MPI_*", role);
  if (o->distribution != STROM_MPI_SHARE && o->distribution != STROM_MPI_BROADCAST)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "distribution %d is not SHARE or BROADCAST",
                    o->distribution);
  if (o->group_file && o->master_addr)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "give group_file or master_addr, not both");
  return STROM_OK;
}

/* Frees this rank's handles and, once every rank got there, the servers:
 * the joined ones first, rank 0's (the registry) last. */
static strom_status teardown(strom_mpi_channel *ch) {
  strom_status s = STROM_OK;
  if (ch->producer && !ch->ended) {
    s = strom_producer_close(ch->producer);
    if (s != STROM_OK) s = smi_strom(s, "closing the producer");
  }
  strom_producer_free(ch->producer);
  strom_consumer_free(ch->consumer);
  strom_topic_free(ch->topic);
  strom_driver_free(ch->client);
  s = agree(ch, s, "closing the channel");
  if (ch->rank != 0) strom_driver_free(ch->server);
  MPI_Barrier(ch->comm);
  if (ch->rank == 0) strom_driver_free(ch->server);
  if (ch->dir[0]) nftw(ch->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  MPI_Comm_free(&ch->comm);
  free(ch);
  return s;
}

strom_status strom_mpi_channel_open(MPI_Comm comm, int role, const char *topic,
                                    const strom_mpi_channel_options *opts,
                                    strom_mpi_channel **out) {
  strom_mpi_channel_options defaults;
  strom_mpi_channel_options_init(&defaults);
  const strom_mpi_channel_options *o = opts ? opts : &defaults;
  if (!out) return smi_fail(STROM_ERR_NULL_ARGUMENT, "out is NULL");
  *out = NULL;
  strom_mpi_channel *ch = calloc(1, sizeof *ch);
  if (!ch) return smi_fail(STROM_ERR_INTERNAL, "out of memory");
  int rc = MPI_Comm_dup(comm, &ch->comm);
  if (rc != MPI_SUCCESS) {
    free(ch);
    return smi_mpi(rc, "MPI_Comm_dup");
  }
  MPI_Comm_rank(ch->comm, &ch->rank);
  MPI_Comm_size(ch->comm, &ch->size);
  ch->role = role;
  ch->desc_type = MPI_DATATYPE_NULL;
  strom_status s = agree(ch, check_args(role, topic, o), "checking the arguments");
  if (s == STROM_OK) s = count_roles(ch);
  if (s == STROM_OK) s = agree(ch, connect_group(ch, o), "connecting to the group");
  if (s == STROM_OK) s = open_topic(ch, topic, o);
  /* Every producer is registered before any consumer can see the end. */
  if (s == STROM_OK) s = agree(ch, open_producer(ch, o), "opening the producers");
  if (s == STROM_OK) s = agree(ch, open_consumer(ch, topic, o), "opening the consumers");
  if (s != STROM_OK) {
    char kept[1024];
    snprintf(kept, sizeof kept, "%s", strom_mpi_last_error());
    ch->ended = 1; /* nothing was pushed: do not end a stream others use */
    teardown(ch);
    smi_fail(s, "%s", kept);
    return s;
  }
  *out = ch;
  return STROM_OK;
}

strom_status strom_mpi_channel_close(strom_mpi_channel **ch) {
  if (!ch || !*ch) return smi_fail(STROM_ERR_NULL_ARGUMENT, "channel is NULL");
  strom_status s = teardown(*ch);
  *ch = NULL;
  return s;
}

strom_status strom_mpi_channel_open_f(MPI_Fint comm, int role, const char *topic,
                                      const strom_mpi_channel_options *opts,
                                      strom_mpi_channel **out) {
  return strom_mpi_channel_open(MPI_Comm_f2c(comm), role, topic, opts, out);
}

/* ---- streaming --------------------------------------------------------- */

strom_status strom_mpi_channel_push(strom_mpi_channel *ch, const void *buf, int count,
                                    MPI_Datatype type, const char *metadata) {
  if (!ch || !ch->producer)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "this rank is not a producer of the channel");
  /* A derived type's handle may name another type once it is freed (MPI
   * reuses handles), so only predefined types' descriptors are kept. */
  if (ch->desc_type != type || ch->desc_count != count || !ch->desc[0]) {
    strom_status s = smi_describe(type, count, ch->desc, sizeof ch->desc);
    if (s != STROM_OK) return s;
    ch->desc_type = smi_predefined(type) ? type : MPI_DATATYPE_NULL;
    ch->desc_count = count;
  }
  const void *run = NULL;
  size_t len = 0;
  void *owned = NULL;
  strom_status s = smi_contiguous(buf, count, type, &run, &len, &owned);
  if (s != STROM_OK) return s;
  const char *meta = metadata ? metadata : "{}";
  strom_iovec piece = {run, len};
  strom_push push;
  strom_push_init(&push, meta, strlen(meta));
  push.data = &piece;
  push.ndata = len ? 1 : 0;
  push.descriptor = (const uint8_t *)ch->desc;
  push.descriptor_len = strlen(ch->desc);
  if (ch->explicit_partition && ch->partitions)
    push.partition = (int64_t)((uint32_t)ch->producer_index % ch->partitions);
  if (owned) push.release = free, push.release_user = owned;
  s = strom_producer_push_ex(ch->producer, &push, NULL);
  return s == STROM_OK ? s : smi_strom(s, "pushing");
}

strom_status strom_mpi_channel_push_f(strom_mpi_channel *ch, const void *buf, int count,
                                      MPI_Fint type, const char *metadata) {
  return strom_mpi_channel_push(ch, buf, count, MPI_Type_f2c(type), metadata);
}

strom_status strom_mpi_channel_end(strom_mpi_channel *ch) {
  if (!ch || !ch->producer)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "this rank is not a producer of the channel");
  if (ch->ended) return STROM_OK;
  ch->ended = 1;
  strom_status s = strom_producer_close(ch->producer);
  return s == STROM_OK ? s : smi_strom(s, "ending this rank's stream");
}

strom_status strom_mpi_channel_pull(strom_mpi_channel *ch, int64_t timeout_ms, strom_event **out) {
  if (!ch || !out) return smi_fail(STROM_ERR_NULL_ARGUMENT, "channel and out are required");
  *out = NULL;
  if (ch->consumer_index < 0)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "this rank is not a consumer of the channel");
  if (!ch->consumer) return STROM_END_OF_STREAM; /* more consumers than partitions */
  strom_status s = strom_consumer_pull(ch->consumer, timeout_ms, out);
  return s == STROM_OK || s == STROM_END_OF_STREAM ? s : smi_strom(s, "pulling");
}

/* The user's callbacks, with an ack after each event they took. */
typedef struct {
  const strom_process_callbacks *cb;
  void *user;
} operation;

static void op_start(void *o) { ((operation *)o)->cb->on_start(((operation *)o)->user); }
static void op_end(void *o) { ((operation *)o)->cb->on_end(((operation *)o)->user); }
static strom_status op_event(void *o, strom_event *ev) {
  const operation *op = o;
  strom_status s = op->cb->on_event ? op->cb->on_event(op->user, ev) : STROM_OK;
  return s == STROM_OK ? strom_event_ack(ev) : s;
}

strom_status strom_mpi_channel_operate(strom_mpi_channel *ch, const strom_process_callbacks *cb,
                                       void *user) {
  if (!ch || !cb) return smi_fail(STROM_ERR_NULL_ARGUMENT, "channel and callbacks are required");
  if (ch->consumer_index < 0)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "this rank is not a consumer of the channel");
  if (!ch->consumer) {
    if (cb->on_start) cb->on_start(user);
    if (cb->on_end) cb->on_end(user);
    return STROM_OK;
  }
  operation op = {cb, user};
  strom_process_callbacks acking = {cb->on_start ? op_start : NULL, op_event,
                                    cb->on_end ? op_end : NULL};
  strom_status s = strom_consumer_process(ch->consumer, &acking, &op);
  return s == STROM_OK ? s : smi_strom(s, "processing");
}

/* ---- accessors --------------------------------------------------------- */

int strom_mpi_channel_producer_index(const strom_mpi_channel *ch) {
  return ch ? ch->producer_index : -1;
}
int strom_mpi_channel_consumer_index(const strom_mpi_channel *ch) {
  return ch ? ch->consumer_index : -1;
}
int strom_mpi_channel_producers(const strom_mpi_channel *ch) { return ch ? ch->producers : 0; }
int strom_mpi_channel_consumers(const strom_mpi_channel *ch) { return ch ? ch->consumers : 0; }
const strom_driver *strom_mpi_channel_driver(const strom_mpi_channel *ch) {
  return ch ? driver_of(ch) : NULL;
}
const strom_topic *strom_mpi_channel_topic(const strom_mpi_channel *ch) {
  return ch ? ch->topic : NULL;
}
const strom_producer *strom_mpi_channel_producer(const strom_mpi_channel *ch) {
  return ch ? ch->producer : NULL;
}
const strom_consumer *strom_mpi_channel_consumer(const strom_mpi_channel *ch) {
  return ch ? ch->consumer : NULL;
}
