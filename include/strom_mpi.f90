!> strom_mpi.f90: Fortran 2008 bindings of libstrom_mpi, the MPI channels.
!>
!> A thin `iso_c_binding` layer over include/strom_mpi.h (read it for what
!> each call does): open a channel on a communicator, push arrays with an
!> MPI datatype, pull events and unpack them into arrays, close. It uses
!> module `strom` (include/strom.f90) for the status constants and strings
!> (strom_status_name, f_c_string) and adds the few libstrom calls strom.f90
!> lacks that a channel program needs: strom_event_metadata,
!> strom_event_ack, strom_event_free, and strom_topic_delete (with
!> strom_mpi_channel_driver) to remove a run's topic from a shared group.
!>
!> MPI handles cross as integers (MPI_Fint), so the module itself does not
!> use MPI and works with `use mpi` and `use mpi_f08` alike:
!>
!>     use mpi:     strom_mpi_channel_open_f(MPI_COMM_WORLD, ...)
!>                  strom_mpi_channel_push_f(ch, c_loc(x), n, MPI_DOUBLE_PRECISION, ...)
!>     use mpi_f08: strom_mpi_channel_open_f(MPI_COMM_WORLD%MPI_VAL, ...)
!>                  strom_mpi_channel_push_f(ch, c_loc(x), n, MPI_DOUBLE_PRECISION%MPI_VAL, ...)
!>
!> Build both modules with your compiler, link libstrom_mpi before libstrom:
!>
!>     mpifort -c strom.f90 strom_mpi.f90    # strom.mod, strom_mpi.mod, .o files
!>     mpifort app.f90 strom_mpi.o strom.o libstrom_mpi.a libstrom.a -lpthread -ldl -lm
!>
!> Conventions (as in strom.f90):
!> - every function returns an integer(c_int32_t) status, STROM_OK (0) or a
!>   code; strom_mpi_last_error() explains a failed strom_mpi_* call;
!> - channels and events are type(c_ptr); a pulled event is freed with
!>   strom_event_free, a channel closed (collectively) with
!>   strom_mpi_channel_close;
!> - string arguments must be NUL-terminated: pass f_c_string("text");
!> - strings stored in strom_mpi_channel_options are pointers (c_loc of a
!>   NUL-terminated character variable with the TARGET attribute) and must
!>   stay alive until strom_mpi_channel_open_f returns;
!> - buffers are passed as c_loc(array) (the array needs TARGET) with a
!>   count of elements of the given MPI datatype.
module strom_mpi
  use, intrinsic :: iso_c_binding
  use strom, only: c_f_string
  implicit none
  private

  ! A rank's role in a channel (STROM_MPI_BOTH = producer and consumer).
  integer(c_int), parameter, public :: STROM_MPI_NONE = 0
  integer(c_int), parameter, public :: STROM_MPI_PRODUCER = 1
  integer(c_int), parameter, public :: STROM_MPI_CONSUMER = 2
  integer(c_int), parameter, public :: STROM_MPI_BOTH = 3

  ! How consumer ranks share the stream: SHARE (default), each element to
  ! one consumer rank; BROADCAST, every element to every consumer rank.
  integer(c_int), parameter, public :: STROM_MPI_SHARE = 0
  integer(c_int), parameter, public :: STROM_MPI_BROADCAST = 1

  !> How to open a channel (strom_mpi_channel_options): fill it with
  !> strom_mpi_channel_options_init, then set what you need. c_null_ptr
  !> strings and zero numbers mean the default. Every rank passes the same.
  type, bind(C), public :: strom_mpi_channel_options
    type(c_ptr) :: group_file          ! attach to this running group
    type(c_ptr) :: master_addr         ! or to the group of this registry
    integer(c_int) :: servers_per_node ! embedded servers per node (1)
    type(c_ptr) :: data_dir            ! parent of their data dirs ($TMPDIR)
    type(c_ptr) :: listen_host         ! where they listen (127.0.0.1)
    integer(c_int) :: insecure
    integer(c_int32_t) :: partitions   ! uint32_t: one per consumer rank
    type(c_ptr) :: partition_type      ! "memory" (default) or "file"
    type(c_ptr) :: selector            ! e.g. "hash:key"
    integer(c_int) :: distribution     ! STROM_MPI_SHARE or _BROADCAST
    type(c_ptr) :: consumer_name       ! default: the topic's name
    type(c_ptr) :: select              ! a data selector, "kind == signal"
  end type strom_mpi_channel_options

  public :: strom_mpi_channel_options_init, strom_mpi_channel_open_f
  public :: strom_mpi_channel_push_f, strom_mpi_channel_end, strom_mpi_channel_pull
  public :: strom_mpi_event_count_f, strom_mpi_event_unpack_f, strom_mpi_channel_close
  public :: strom_mpi_channel_producer_index, strom_mpi_channel_consumer_index
  public :: strom_mpi_channel_producers, strom_mpi_channel_consumers
  public :: strom_mpi_channel_driver, strom_mpi_last_error
  public :: strom_event_metadata, strom_event_ack, strom_event_free, strom_topic_delete

  interface
    ! --- open and close -------------------------------------------------
    function strom_mpi_channel_options_init(opts) bind(C, name="strom_mpi_channel_options_init")
      import :: strom_mpi_channel_options, c_int32_t
      type(strom_mpi_channel_options), intent(out) :: opts
      integer(c_int32_t) :: strom_mpi_channel_options_init
    end function

    !> Collective over `comm` (an MPI_Fint handle): opens the channel
    !> `topic` with this rank's `role`; `out` receives the channel.
    function strom_mpi_channel_open_f(comm, role, topic, opts, out) &
        bind(C, name="strom_mpi_channel_open_f")
      import :: strom_mpi_channel_options, c_int, c_char, c_ptr, c_int32_t
      integer(c_int), value :: comm, role
      character(kind=c_char), intent(in) :: topic(*)
      type(strom_mpi_channel_options), intent(in) :: opts
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_mpi_channel_open_f
    end function

    !> Collective: ends this rank's stream if needed, frees everything,
    !> stops the embedded servers; `ch` is c_null_ptr afterwards.
    function strom_mpi_channel_close(ch) bind(C, name="strom_mpi_channel_close")
      import :: c_ptr, c_int32_t
      type(c_ptr), intent(inout) :: ch
      integer(c_int32_t) :: strom_mpi_channel_close
    end function

    ! --- streaming ------------------------------------------------------
    !> Pushes `count` elements of MPI datatype `datatype` (an MPI_Fint
    !> handle) from `buf` (c_loc of the array) as one event, with JSON
    !> `metadata` (NUL-terminated).
    function strom_mpi_channel_push_f(ch, buf, count, datatype, metadata) &
        bind(C, name="strom_mpi_channel_push_f")
      import :: c_ptr, c_int, c_char, c_int32_t
      type(c_ptr), value :: ch, buf
      integer(c_int), value :: count, datatype
      character(kind=c_char), intent(in) :: metadata(*)
      integer(c_int32_t) :: strom_mpi_channel_push_f
    end function

    !> Flushes and ends this rank's part of the stream (not collective).
    function strom_mpi_channel_end(ch) bind(C, name="strom_mpi_channel_end")
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: ch
      integer(c_int32_t) :: strom_mpi_channel_end
    end function

    !> The next event (free it with strom_event_free), waiting up to
    !> `timeout_ms` (-1: no limit); STROM_END_OF_STREAM at the end.
    function strom_mpi_channel_pull(ch, timeout_ms, out) bind(C, name="strom_mpi_channel_pull")
      import :: c_ptr, c_int64_t, c_int32_t
      type(c_ptr), value :: ch
      integer(c_int64_t), value :: timeout_ms
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_mpi_channel_pull
    end function

    !> How many whole elements of `datatype` the event holds.
    function strom_mpi_event_count_f(ev, datatype, count) bind(C, name="strom_mpi_event_count_f")
      import :: c_ptr, c_int, c_int32_t
      type(c_ptr), value :: ev
      integer(c_int), value :: datatype
      integer(c_int), intent(out) :: count
      integer(c_int32_t) :: strom_mpi_event_count_f
    end function

    !> Unpacks the event's `count` elements into `buf` (c_loc of the array)
    !> laid out as `count` elements of `datatype`.
    function strom_mpi_event_unpack_f(ev, buf, count, datatype) &
        bind(C, name="strom_mpi_event_unpack_f")
      import :: c_ptr, c_int, c_int32_t
      type(c_ptr), value :: ev, buf
      integer(c_int), value :: count, datatype
      integer(c_int32_t) :: strom_mpi_event_unpack_f
    end function

    ! --- roles ----------------------------------------------------------
    !> This rank's index among the producer (consumer) ranks, -1 if none.
    function strom_mpi_channel_producer_index(ch) bind(C, name="strom_mpi_channel_producer_index")
      import :: c_ptr, c_int
      type(c_ptr), value :: ch
      integer(c_int) :: strom_mpi_channel_producer_index
    end function

    function strom_mpi_channel_consumer_index(ch) bind(C, name="strom_mpi_channel_consumer_index")
      import :: c_ptr, c_int
      type(c_ptr), value :: ch
      integer(c_int) :: strom_mpi_channel_consumer_index
    end function

    !> How many producer (consumer) ranks the channel has.
    function strom_mpi_channel_producers(ch) bind(C, name="strom_mpi_channel_producers")
      import :: c_ptr, c_int
      type(c_ptr), value :: ch
      integer(c_int) :: strom_mpi_channel_producers
    end function

    function strom_mpi_channel_consumers(ch) bind(C, name="strom_mpi_channel_consumers")
      import :: c_ptr, c_int
      type(c_ptr), value :: ch
      integer(c_int) :: strom_mpi_channel_consumers
    end function

    !> The channel's driver (borrowed: valid until the channel is closed).
    function strom_mpi_channel_driver(ch) bind(C, name="strom_mpi_channel_driver")
      import :: c_ptr
      type(c_ptr), value :: ch
      type(c_ptr) :: strom_mpi_channel_driver
    end function

    ! --- libstrom calls strom.f90 lacks ---------------------------------
    !> Deletes a topic and its data.
    function strom_topic_delete(driver, name) bind(C, name="strom_topic_delete")
      import :: c_ptr, c_char, c_int32_t
      type(c_ptr), value :: driver
      character(kind=c_char), intent(in) :: name(*)
      integer(c_int32_t) :: strom_topic_delete
    end function

    !> Acknowledges the event: a later job resumes after it.
    function strom_event_ack(ev) bind(C, name="strom_event_ack")
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: ev
      integer(c_int32_t) :: strom_event_ack
    end function

    subroutine strom_event_free(ev) bind(C, name="strom_event_free")
      import :: c_ptr
      type(c_ptr), value :: ev
    end subroutine

    ! --- C strings behind the Fortran wrappers below --------------------
    function c_strom_mpi_last_error() bind(C, name="strom_mpi_last_error")
      import :: c_ptr
      type(c_ptr) :: c_strom_mpi_last_error
    end function

    function c_strom_event_metadata(ev, len) bind(C, name="strom_event_metadata")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: ev
      integer(c_size_t), intent(out) :: len
      type(c_ptr) :: c_strom_event_metadata
    end function
  end interface

contains

  !> The message of this thread's last failed strom_mpi_* call.
  function strom_mpi_last_error() result(s)
    character(len=:), allocatable :: s
    s = c_f_string(c_strom_mpi_last_error())
  end function strom_mpi_last_error

  !> A Fortran copy of an event's metadata (JSON text, not NUL-terminated
  !> in C, hence the length).
  function strom_event_metadata(ev) result(s)
    type(c_ptr), intent(in) :: ev
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer(c_size_t) :: n
    type(c_ptr) :: p
    integer :: i
    p = c_strom_event_metadata(ev, n)
    if (.not. c_associated(p) .or. n == 0) then
      s = ""
      return
    end if
    call c_f_pointer(p, chars, [n])
    allocate (character(len=int(n)) :: s)
    do i = 1, int(n)
      s(i:i) = chars(i)
    end do
  end function strom_event_metadata

end module strom_mpi
