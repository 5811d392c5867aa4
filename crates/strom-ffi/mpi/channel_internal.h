/*
 * channel_internal.h: what the files of libstrom_mpi share (not installed).
 * channel.c owns the channel (servers, topic, roles, collectives);
 * datatype.c owns MPI datatypes (descriptors, packing, unpacking);
 * error.c owns this thread's error message.
 */
#ifndef STROM_MPI_INTERNAL_H
#define STROM_MPI_INTERNAL_H

#include <stddef.h>

#include "strom_mpi.h"

/* Records this thread's error message and returns `s`. */
strom_status smi_fail(strom_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Records libstrom's message for a failed libstrom call `what`. */
strom_status smi_strom(strom_status s, const char *what);

/* Records an MPI failure of `what` (its MPI_Error_string) as
 * STROM_ERR_INTERNAL. */
strom_status smi_mpi(int rc, const char *what);

/* The event descriptor of `count` elements of `type` (JSON, see
 * strom_mpi_channel_push), written into out[cap]. */
strom_status smi_describe(MPI_Datatype type, int count, char *out, size_t cap);

/* Whether `type` is a predefined (named) type, whose handle never changes
 * meaning. */
int smi_predefined(MPI_Datatype type);

/* `count` elements of `type` at `buf` as one contiguous run: `*run` is
 * `buf` itself when the layout is contiguous (`*owned` NULL), else a
 * malloc'd packed copy (`*owned` = `*run`, for the caller to free). */
strom_status smi_contiguous(const void *buf, int count, MPI_Datatype type, const void **run,
                            size_t *len, void **owned);

#endif
