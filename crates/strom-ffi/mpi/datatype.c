/*
 * datatype.c: MPI datatypes in Strom events. It owns the event descriptor
 * of an MPI datatype (numpy's dtype and shape of the packed elements, and
 * the type's constructor as text), packing a non-contiguous layout into one
 * run for a push, and counting and unpacking an event's elements into a
 * consumer's datatype (strom_mpi_event_count, strom_mpi_event_unpack).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel_internal.h"

#define MAX_DIMS 32

/* A named MPI type's numpy kind: 'f', 'i', 'u', 'c' or 'b' (0: none). */
static char named_kind(MPI_Datatype t) {
  const struct {
    MPI_Datatype t;
    char kind;
  } kinds[] = {
      {MPI_FLOAT, 'f'},          {MPI_DOUBLE, 'f'},           {MPI_REAL, 'f'},
      {MPI_DOUBLE_PRECISION, 'f'}, {MPI_C_FLOAT_COMPLEX, 'c'}, {MPI_C_DOUBLE_COMPLEX, 'c'},
      {MPI_COMPLEX, 'c'},        {MPI_DOUBLE_COMPLEX, 'c'},   {MPI_CHAR, 'i'},
      {MPI_SIGNED_CHAR, 'i'},    {MPI_SHORT, 'i'},            {MPI_INT, 'i'},
      {MPI_LONG, 'i'},           {MPI_LONG_LONG, 'i'},        {MPI_INT8_T, 'i'},
      {MPI_INT16_T, 'i'},        {MPI_INT32_T, 'i'},          {MPI_INT64_T, 'i'},
      {MPI_INTEGER, 'i'},        {MPI_AINT, 'i'},             {MPI_OFFSET, 'i'},
      {MPI_UNSIGNED_CHAR, 'u'},  {MPI_BYTE, 'u'},             {MPI_UNSIGNED_SHORT, 'u'},
      {MPI_UNSIGNED, 'u'},       {MPI_UNSIGNED_LONG, 'u'},    {MPI_UNSIGNED_LONG_LONG, 'u'},
      {MPI_UINT8_T, 'u'},        {MPI_UINT16_T, 'u'},         {MPI_UINT32_T, 'u'},
      {MPI_UINT64_T, 'u'},       {MPI_C_BOOL, 'b'},           {MPI_LOGICAL, 'b'},
  };
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (kinds[i].t == t) return kinds[i].kind;
  return 0;
}

static int little_endian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

/* numpy's dtype string of a named type ("<f8"); 0 when it has none. */
static int named_dtype(MPI_Datatype t, char *out, size_t cap) {
  char kind = named_kind(t);
  int size = 0;
  if (!kind || MPI_Type_size(t, &size) != MPI_SUCCESS || size <= 0) return 0;
  char order = size == 1 ? '|' : (little_endian() ? '<' : '>');
  snprintf(out, cap, "%c%c%d", order, kind, size);
  return 1;
}

/* What walking a type's constructors found. */
typedef struct {
  MPI_Datatype base; /* the one named element type, or MPI_DATATYPE_NULL */
  int mixed;         /* more than one element type */
  int dims[MAX_DIMS];
  int ndims;
  int fortran; /* one Fortran-order subarray and nothing else */
  int shaped;  /* the dims describe the whole type */
  char text[256];
} walk;

static void append(char *s, size_t cap, const char *fmt, int a) {
  size_t n = strlen(s);
  if (n < cap) snprintf(s + n, cap - n, fmt, a);
}

static void append_str(char *s, size_t cap, const char *text) {
  size_t n = strlen(s);
  if (n < cap) snprintf(s + n, cap - n, "%s", text);
}

static void add_dim(walk *w, int d) {
  if (w->ndims < MAX_DIMS) w->dims[w->ndims++] = d;
  else w->shaped = 0;
}

static void note_base(walk *w, MPI_Datatype t) {
  if (w->base == MPI_DATATYPE_NULL) w->base = t;
  else if (w->base != t) w->mixed = 1;
}

static strom_status walk_type(MPI_Datatype t, walk *w, int depth);

/* The text a constructor without a shape of its own starts with. */
static const char *combiner_name(int comb) {
  if (comb == MPI_COMBINER_STRUCT) return "struct(";
  if (comb == MPI_COMBINER_INDEXED) return "indexed(";
  if (comb == MPI_COMBINER_HINDEXED) return "hindexed(";
  if (comb == MPI_COMBINER_INDEXED_BLOCK) return "indexed_block(";
  if (comb == MPI_COMBINER_HINDEXED_BLOCK) return "hindexed_block(";
  if (comb == MPI_COMBINER_DARRAY) return "darray(";
  return "derived(";
}

int smi_predefined(MPI_Datatype type) {
  int ni, na, nd, comb;
  return MPI_Type_get_envelope(type, &ni, &na, &nd, &comb) == MPI_SUCCESS &&
         comb == MPI_COMBINER_NAMED;
}

/* Walks the contents of a derived type (combiner `comb`). */
static strom_status walk_derived(MPI_Datatype t, int comb, int ni, int na, int nd, walk *w,
                                 int depth) {
  int *ints = calloc((size_t)ni + 1, sizeof *ints);
  MPI_Aint *addrs = calloc((size_t)na + 1, sizeof *addrs);
  MPI_Datatype *types = calloc((size_t)nd + 1, sizeof *types);
  if (!ints || !addrs || !types) {
    free(ints), free(addrs), free(types);
    return smi_fail(STROM_ERR_INTERNAL, "out of memory describing an MPI datatype");
  }
  strom_status s = STROM_OK;
  int rc = MPI_Type_get_contents(t, ni, na, nd, ints, addrs, types);
  if (rc != MPI_SUCCESS) s = smi_mpi(rc, "MPI_Type_get_contents");
  else if (comb == MPI_COMBINER_CONTIGUOUS) {
    append(w->text, sizeof w->text, "contiguous(%d,", ints[0]);
    add_dim(w, ints[0]);
  } else if (comb == MPI_COMBINER_VECTOR || comb == MPI_COMBINER_HVECTOR) {
    append(w->text, sizeof w->text, "vector(%d,", ints[0]);
    append(w->text, sizeof w->text, "%d,", ints[1]);
    if (comb == MPI_COMBINER_VECTOR) append(w->text, sizeof w->text, "%d,", ints[2]);
    else append(w->text, sizeof w->text, "%dB,", (int)addrs[0]);
    add_dim(w, ints[0]);
    if (ints[1] != 1) add_dim(w, ints[1]);
  } else if (comb == MPI_COMBINER_SUBARRAY) {
    int n = ints[0], order = ints[1 + 3 * n];
    append(w->text, sizeof w->text, "subarray(%d,", n);
    w->fortran = order == MPI_ORDER_FORTRAN && depth == 0 && w->ndims == 0;
    for (int i = 0; i < n; i++) {
      int d = w->fortran || order != MPI_ORDER_FORTRAN ? i : n - 1 - i;
      add_dim(w, ints[1 + n + d]);
    }
  } else if (comb == MPI_COMBINER_DUP || comb == MPI_COMBINER_RESIZED) {
    /* the same elements */
  } else {
    append_str(w->text, sizeof w->text, combiner_name(comb));
    w->shaped = 0;
  }
  int members = comb == MPI_COMBINER_STRUCT ? nd : nd > 0;
  for (int i = 0; s == STROM_OK && i < members; i++) {
    if (comb == MPI_COMBINER_STRUCT) { /* blocklength@displacement:type */
      append(w->text, sizeof w->text, i ? ",%d@" : "%d@", ints[1 + i]);
      append(w->text, sizeof w->text, "%d:", (int)addrs[i]);
    }
    s = walk_type(types[i], w, depth + 1);
  }
  if (comb != MPI_COMBINER_DUP && comb != MPI_COMBINER_RESIZED)
    append_str(w->text, sizeof w->text, ")");
  for (int i = 0; i < nd; i++) {
    int ni2, na2, nd2, comb2;
    if (MPI_Type_get_envelope(types[i], &ni2, &na2, &nd2, &comb2) == MPI_SUCCESS &&
        comb2 != MPI_COMBINER_NAMED)
      MPI_Type_free(&types[i]);
  }
  free(ints), free(addrs), free(types);
  return s;
}

static strom_status walk_type(MPI_Datatype t, walk *w, int depth) {
  if (depth > 16) return smi_fail(STROM_ERR_INVALID_ARGUMENT, "MPI datatype nested too deeply");
  int ni, na, nd, comb;
  int rc = MPI_Type_get_envelope(t, &ni, &na, &nd, &comb);
  if (rc != MPI_SUCCESS) return smi_mpi(rc, "MPI_Type_get_envelope");
  if (comb == MPI_COMBINER_NAMED) {
    char name[MPI_MAX_OBJECT_NAME] = "";
    int len = 0;
    MPI_Type_get_name(t, name, &len);
    append_str(w->text, sizeof w->text, name);
    note_base(w, t);
    return STROM_OK;
  }
  return walk_derived(t, comb, ni, na, nd, w, depth);
}

strom_status smi_describe(MPI_Datatype type, int count, char *out, size_t cap) {
  walk w;
  memset(&w, 0, sizeof w);
  w.base = MPI_DATATYPE_NULL;
  w.shaped = 1;
  strom_status s = walk_type(type, &w, 0);
  if (s != STROM_OK) return s;
  int size = 0;
  MPI_Type_size(type, &size);
  char dtype[16] = "";
  int base_size = 0;
  if (w.mixed || !named_dtype(w.base, dtype, sizeof dtype)) {
    snprintf(dtype, sizeof dtype, "|V%d", size);
    w.ndims = 0; /* one opaque record per element */
  } else {
    MPI_Type_size(w.base, &base_size);
  }
  long total = (long)count * (base_size ? size / base_size : 1);
  char shape[512];
  size_t n = 0;
  if (count != 1 || w.ndims == 0) n += (size_t)snprintf(shape, sizeof shape, "%d", count);
  if (base_size && !w.shaped) n = (size_t)snprintf(shape, sizeof shape, "%ld", total);
  else
    for (int i = 0; i < w.ndims && n < sizeof shape; i++)
      n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%d", n ? "," : "", w.dims[i]);
  const char *order = w.fortran && count == 1 && w.shaped ? "F" : "C";
  int len = snprintf(out, cap, "{\"dtype\":\"%s\",\"shape\":[%s],\"order\":\"%s\",\"mpi\":\"%s\"}",
                     dtype, shape, order, w.text);
  if (len < 0 || (size_t)len >= cap)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "MPI datatype too complex to describe");
  return STROM_OK;
}

/* Whether `count` elements of `type` are one run of bytes from the buffer. */
static int is_contiguous(MPI_Datatype type, int count) {
  MPI_Aint lb, extent, tlb, textent;
  int size;
  if (MPI_Type_get_extent(type, &lb, &extent) != MPI_SUCCESS ||
      MPI_Type_get_true_extent(type, &tlb, &textent) != MPI_SUCCESS ||
      MPI_Type_size(type, &size) != MPI_SUCCESS)
    return 0;
  return tlb == 0 && textent == size && (count <= 1 || extent == size);
}

/* The bytes `count` elements of `type` pack into, checked against int
 * overflow. */
static strom_status packed_len(MPI_Datatype type, int count, size_t *len) {
  int size = 0;
  int rc = MPI_Type_size(type, &size);
  if (rc != MPI_SUCCESS) return smi_mpi(rc, "MPI_Type_size");
  if (count < 0 || size < 0) return smi_fail(STROM_ERR_INVALID_ARGUMENT, "negative count or size");
  *len = (size_t)count * (size_t)size;
  return STROM_OK;
}

strom_status smi_contiguous(const void *buf, int count, MPI_Datatype type, const void **run,
                            size_t *len, void **owned) {
  *owned = NULL;
  strom_status s = packed_len(type, count, len);
  if (s != STROM_OK) return s;
  if (is_contiguous(type, count) || *len == 0) {
    *run = buf;
    return STROM_OK;
  }
  if (*len > (size_t)INT32_MAX)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "a strided push of %zu bytes is over 2 GiB", *len);
  void *packed = malloc(*len);
  if (!packed) return smi_fail(STROM_ERR_INTERNAL, "out of memory packing %zu bytes", *len);
  int pos = 0;
  int rc = MPI_Pack(buf, count, type, packed, (int)*len, &pos, MPI_COMM_SELF);
  if (rc != MPI_SUCCESS || (size_t)pos != *len) {
    free(packed);
    return rc != MPI_SUCCESS ? smi_mpi(rc, "MPI_Pack")
                             : smi_fail(STROM_ERR_INTERNAL, "MPI_Pack wrote %d of %zu bytes", pos,
                                        *len);
  }
  *run = *owned = packed;
  return STROM_OK;
}

/* The dtype field of an event's descriptor into out[cap]; 0 if it has none
 * (raw bytes, or a descriptor of another kind). */
static int event_dtype(const strom_event *ev, char *out, size_t cap) {
  strom_event_meta m;
  if (strom_event_info(ev, &m) != STROM_OK || !m.descriptor || m.descriptor_len == 0) return 0;
  const char key[] = "\"dtype\":\"";
  const char *d = (const char *)m.descriptor, *end = d + m.descriptor_len;
  const char *p = memmem(d, m.descriptor_len, key, sizeof key - 1);
  if (!p) return 0;
  p += sizeof key - 1;
  const char *q = memchr(p, '"', (size_t)(end - p));
  if (!q || (size_t)(q - p) >= cap) return 0;
  memcpy(out, p, (size_t)(q - p));
  out[q - p] = '\0';
  return 1;
}

/* Checks the event's element type against `type`'s. MPI_BYTE reads any
 * event's bytes as they are, as it matches any type in MPI. Records
 * (|V<size>) match records of the same size only. */
static strom_status same_elements(const strom_event *ev, MPI_Datatype type) {
  char theirs[64], ours[512];
  if (type == MPI_BYTE || !event_dtype(ev, theirs, sizeof theirs)) return STROM_OK;
  strom_status s = smi_describe(type, 1, ours, sizeof ours);
  if (s != STROM_OK) return s;
  char mine[64] = "";
  const char *p = strstr(ours, "\"dtype\":\"") + 9;
  size_t n = strcspn(p, "\"");
  memcpy(mine, p, n < sizeof mine ? n : sizeof mine - 1);
  if (strcmp(mine, theirs) == 0) return STROM_OK;
  return smi_fail(STROM_ERR_INVALID_ARGUMENT,
                  "the event holds %s elements; the datatype given has %s elements", theirs, mine);
}

strom_status strom_mpi_event_count(const strom_event *ev, MPI_Datatype type, int *count) {
  if (!ev || !count) return smi_fail(STROM_ERR_NULL_ARGUMENT, "event and count are required");
  strom_status s = same_elements(ev, type);
  if (s != STROM_OK) return s;
  int size = 0;
  int rc = MPI_Type_size(type, &size);
  if (rc != MPI_SUCCESS) return smi_mpi(rc, "MPI_Type_size");
  uint64_t len = strom_event_fetched_len(ev);
  if (size <= 0 || len % (uint64_t)size != 0 || len / (uint64_t)size > INT32_MAX)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT,
                    "the event's %llu bytes are not a whole number of %d-byte elements",
                    (unsigned long long)len, size);
  *count = (int)(len / (uint64_t)size);
  return STROM_OK;
}

strom_status strom_mpi_event_unpack(const strom_event *ev, void *buf, int count,
                                    MPI_Datatype type) {
  int have = 0;
  strom_status s = strom_mpi_event_count(ev, type, &have);
  if (s != STROM_OK) return s;
  if (have != count)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "the event holds %d elements, not %d", have,
                    count);
  size_t len = 0;
  const uint8_t *data = strom_event_data(ev, &len);
  if (len == 0) return STROM_OK;
  if (!data) return smi_fail(STROM_ERR_INVALID_ARGUMENT, "the event's data is in several buffers");
  if (is_contiguous(type, count)) {
    memcpy(buf, data, len);
    return STROM_OK;
  }
  if (len > (size_t)INT32_MAX)
    return smi_fail(STROM_ERR_INVALID_ARGUMENT, "a strided unpack of %zu bytes is over 2 GiB", len);
  int pos = 0;
  int rc = MPI_Unpack(data, (int)len, &pos, buf, count, type, MPI_COMM_SELF);
  return rc == MPI_SUCCESS ? STROM_OK : smi_mpi(rc, "MPI_Unpack");
}

strom_status strom_mpi_event_count_f(const strom_event *ev, MPI_Fint type, int *count) {
  return strom_mpi_event_count(ev, MPI_Type_f2c(type), count);
}

strom_status strom_mpi_event_unpack_f(const strom_event *ev, void *buf, int count, MPI_Fint type) {
  return strom_mpi_event_unpack(ev, buf, count, MPI_Type_f2c(type));
}
