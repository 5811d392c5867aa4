/*
 * error.c: the message of this thread's last failed strom_mpi_* call
 * (strom_mpi_last_error), set by the other files of libstrom_mpi through
 * smi_fail, smi_strom (a libstrom failure) and smi_mpi (an MPI one).
 */
#include <stdarg.h>
#include <stdio.h>

#include "channel_internal.h"

static _Thread_local char last_error[1024];

strom_status smi_fail(strom_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return s;
}

strom_status smi_strom(strom_status s, const char *what) {
  return smi_fail(s, "%s: %s (%s)", what, strom_last_error(), strom_status_name(s));
}

strom_status smi_mpi(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return smi_fail(STROM_ERR_INTERNAL, "%s failed: %s", what, msg);
}

const char *strom_mpi_last_error(void) { return last_error; }

