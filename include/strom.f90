!> strom.f90: Fortran 2008 bindings of libstrom, the C API of Strom.
!>
!> A thin `iso_c_binding` layer over include/strom.h (read it for what
!> each call does): drivers, topics, producers, futures, and status
!> messages as Fortran strings. Fortran consumers read through the MPI
!> channels of include/strom_mpi.f90 (module strom_mpi, docs/mpi.md; see
!> examples/mpi/fortran_push.f90).
!>
!> Build the module with your compiler and link libstrom:
!>
!>     mpifort -c strom.f90                  # gives strom.mod and strom.o
!>     mpifort app.f90 strom.o libstrom.a -lpthread -ldl -lm
!>
!> Conventions:
!> - every function returns an integer(c_int32_t) status, STROM_OK (0) or a
!>   code; strom_status_str(status) and strom_last_error() explain it;
!> - handles are type(c_ptr), freed by their *_free subroutine;
!> - string arguments must be NUL-terminated: pass f_c_string("text").
!>   The metadata of a push is the exception: it takes a length instead;
!> - strings stored in a strom_topic_spec are pointers (c_loc of a
!>   NUL-terminated character variable with the TARGET attribute) and must
!>   stay alive until strom_topic_create returns;
!> - data is pushed as strom_iovec pieces: base = c_loc(array),
!>   len = size(array) * c_sizeof(array(1)) bytes.
module strom
  use, intrinsic :: iso_c_binding
  implicit none
  private

  ! Status codes (the subset a Fortran program usually tests).
  integer(c_int32_t), parameter, public :: STROM_OK = 0
  integer(c_int32_t), parameter, public :: STROM_ERR_TOPIC_NOT_FOUND = 200
  integer(c_int32_t), parameter, public :: STROM_ERR_TOPIC_EXISTS = 201
  integer(c_int32_t), parameter, public :: STROM_ERR_CONNECTION_FAILED = 500
  integer(c_int32_t), parameter, public :: STROM_ERR_TIMEOUT = 502
  integer(c_int32_t), parameter, public :: STROM_ERR_INVALID_ARGUMENT = 504
  integer(c_int32_t), parameter, public :: STROM_END_OF_STREAM = 900
  integer(c_int32_t), parameter, public :: STROM_ERR_NULL_ARGUMENT = 901
  integer(c_int32_t), parameter, public :: STROM_ERR_CLOSED = 905

  !> One piece of an event's data part (strom_iovec).
  type, bind(C), public :: strom_iovec
    type(c_ptr) :: base
    integer(c_size_t) :: len
  end type strom_iovec

  !> Where an acknowledged event was stored (strom_event_id).
  type, bind(C), public :: strom_event_id
    integer(c_int32_t) :: partition
    integer(c_int64_t) :: offset
  end type strom_event_id

  !> How to create a topic (strom_topic_spec): fill it with
  !> strom_topic_spec_init, then set what you need. c_null_ptr strings and
  !> zero numbers mean the server's default.
  type, bind(C), public :: strom_topic_spec
    type(c_ptr) :: name
    integer(c_int32_t) :: partitions
    type(c_ptr) :: partition_type   ! "file" (default) or "memory"
    type(c_ptr) :: durability       ! "always", "never", "interval:<ms>"
    type(c_ptr) :: validator
    type(c_ptr) :: schema
    type(c_ptr) :: selector         ! "round-robin", "hash:<field>", "explicit"
    type(c_ptr) :: serializer
    type(c_ptr) :: overflow
    integer(c_int64_t) :: retention_bytes
    integer(c_int64_t) :: retention_ms
    integer(c_int64_t) :: segment_bytes
  end type strom_topic_spec

  public :: f_c_string, c_f_string
  public :: strom_status_str, strom_status_name, strom_last_error, strom_version
  public :: strom_driver_embedded, strom_driver_connect, strom_driver_connect_addr
  public :: strom_driver_master_addr, strom_driver_free
  public :: strom_topic_spec_init, strom_topic_create, strom_topic_open
  public :: strom_topic_partitions, strom_topic_free
  public :: strom_producer_open, strom_producer_push, strom_producer_flush
  public :: strom_producer_close, strom_producer_id, strom_producer_free
  public :: strom_future_wait, strom_future_free

  interface
    ! --- driver ---------------------------------------------------------
    function strom_driver_embedded(data_dir, out) bind(C, name="strom_driver_embedded")
      import :: c_char, c_ptr, c_int32_t
      character(kind=c_char), intent(in) :: data_dir(*)
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_driver_embedded
    end function

    function strom_driver_connect(group_file, out) bind(C, name="strom_driver_connect")
      import :: c_char, c_ptr, c_int32_t
      character(kind=c_char), intent(in) :: group_file(*)
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_driver_connect
    end function

    function strom_driver_connect_addr(addr, out) bind(C, name="strom_driver_connect_addr")
      import :: c_char, c_ptr, c_int32_t
      character(kind=c_char), intent(in) :: addr(*)
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_driver_connect_addr
    end function

    subroutine strom_driver_free(driver) bind(C, name="strom_driver_free")
      import :: c_ptr
      type(c_ptr), value :: driver
    end subroutine

    ! --- topics ---------------------------------------------------------
    !> `name` is borrowed (c_loc of a NUL-terminated target), not copied.
    function strom_topic_spec_init(spec, name, partitions) bind(C, name="strom_topic_spec_init")
      import :: strom_topic_spec, c_ptr, c_int32_t
      type(strom_topic_spec), intent(out) :: spec
      type(c_ptr), value :: name
      integer(c_int32_t), value :: partitions
      integer(c_int32_t) :: strom_topic_spec_init
    end function

    function strom_topic_create(driver, spec, out) bind(C, name="strom_topic_create")
      import :: strom_topic_spec, c_ptr, c_int32_t
      type(c_ptr), value :: driver
      type(strom_topic_spec), intent(in) :: spec
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_topic_create
    end function

    function strom_topic_open(driver, name, out) bind(C, name="strom_topic_open")
      import :: c_char, c_ptr, c_int32_t
      type(c_ptr), value :: driver
      character(kind=c_char), intent(in) :: name(*)
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_topic_open
    end function

    function strom_topic_partitions(topic) bind(C, name="strom_topic_partitions")
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: topic
      integer(c_int32_t) :: strom_topic_partitions
    end function

    subroutine strom_topic_free(topic) bind(C, name="strom_topic_free")
      import :: c_ptr
      type(c_ptr), value :: topic
    end subroutine

    ! --- producers and futures ------------------------------------------
    !> `opts`: c_null_ptr for the defaults.
    function strom_producer_open(topic, opts, out) bind(C, name="strom_producer_open")
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: topic, opts
      type(c_ptr), intent(out) :: out
      integer(c_int32_t) :: strom_producer_open
    end function

    !> Pushes `metadata(1:metadata_len)` (JSON) and the `ndata` pieces of
    !> `data`, all copied before it returns. `out`: c_loc of a type(c_ptr)
    !> target that receives a future (free it with strom_future_free), or
    !> c_null_ptr for none (errors then surface at flush or close).
    function strom_producer_push(producer, metadata, metadata_len, data, ndata, out) &
        bind(C, name="strom_producer_push")
      import :: strom_iovec, c_char, c_ptr, c_size_t, c_int32_t
      type(c_ptr), value :: producer
      character(kind=c_char), intent(in) :: metadata(*)
      integer(c_size_t), value :: metadata_len
      type(strom_iovec), intent(in) :: data(*)
      integer(c_size_t), value :: ndata
      type(c_ptr), value :: out
      integer(c_int32_t) :: strom_producer_push
    end function

    function strom_producer_flush(producer) bind(C, name="strom_producer_flush")
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: producer
      integer(c_int32_t) :: strom_producer_flush
    end function

    !> Flushes, then closes this producer's part of the stream.
    function strom_producer_close(producer) bind(C, name="strom_producer_close")
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: producer
      integer(c_int32_t) :: strom_producer_close
    end function

    function strom_producer_id(producer) bind(C, name="strom_producer_id")
      import :: c_ptr, c_int64_t
      type(c_ptr), value :: producer
      integer(c_int64_t) :: strom_producer_id
    end function

    subroutine strom_producer_free(producer) bind(C, name="strom_producer_free")
      import :: c_ptr
      type(c_ptr), value :: producer
    end subroutine

    !> Waits until the push is acknowledged; `out` receives where it went.
    function strom_future_wait(future, out) bind(C, name="strom_future_wait")
      import :: strom_event_id, c_ptr, c_int32_t
      type(c_ptr), value :: future
      type(strom_event_id), intent(out) :: out
      integer(c_int32_t) :: strom_future_wait
    end function

    subroutine strom_future_free(future) bind(C, name="strom_future_free")
      import :: c_ptr
      type(c_ptr), value :: future
    end subroutine

    ! --- C strings behind the Fortran wrappers below --------------------
    function c_strom_status_str(status) bind(C, name="strom_status_str")
      import :: c_ptr, c_int32_t
      integer(c_int32_t), value :: status
      type(c_ptr) :: c_strom_status_str
    end function

    function c_strom_status_name(status) bind(C, name="strom_status_name")
      import :: c_ptr, c_int32_t
      integer(c_int32_t), value :: status
      type(c_ptr) :: c_strom_status_name
    end function

    function c_strom_last_error() bind(C, name="strom_last_error")
      import :: c_ptr
      type(c_ptr) :: c_strom_last_error
    end function

    function c_strom_version() bind(C, name="strom_version")
      import :: c_ptr
      type(c_ptr) :: c_strom_version
    end function

    function c_strom_driver_master_addr(driver) bind(C, name="strom_driver_master_addr")
      import :: c_ptr
      type(c_ptr), value :: driver
      type(c_ptr) :: c_strom_driver_master_addr
    end function

    function c_strlen(s) bind(C, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: c_strlen
    end function
  end interface

contains

  !> A NUL-terminated copy of `s`, for the C string arguments.
  pure function f_c_string(s) result(c)
    character(len=*), intent(in) :: s
    character(len=:, kind=c_char), allocatable :: c
    c = s // c_null_char
  end function f_c_string

  !> A Fortran copy of the NUL-terminated C string at `p` ("" for NULL).
  function c_f_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    if (.not. c_associated(p)) then
      s = ""
      return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate (character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function c_f_string

  !> A one-line description of a status.
  function strom_status_str(status) result(s)
    integer(c_int32_t), intent(in) :: status
    character(len=:), allocatable :: s
    s = c_f_string(c_strom_status_str(status))
  end function strom_status_str

  !> The short stable name of a status ("TOPIC_NOT_FOUND", "OK").
  function strom_status_name(status) result(s)
    integer(c_int32_t), intent(in) :: status
    character(len=:), allocatable :: s
    s = c_f_string(c_strom_status_name(status))
  end function strom_status_name

  !> The message of this thread's last failed call ("" if none).
  function strom_last_error() result(s)
    character(len=:), allocatable :: s
    s = c_f_string(c_strom_last_error())
  end function strom_last_error

  !> The library's version ("0.1.0").
  function strom_version() result(s)
    character(len=:), allocatable :: s
    s = c_f_string(c_strom_version())
  end function strom_version

  !> The registry master's address (host:port) of a driver, for the other
  !> ranks' strom_driver_connect_addr.
  function strom_driver_master_addr(driver) result(s)
    type(c_ptr), intent(in) :: driver
    character(len=:), allocatable :: s
    s = c_f_string(c_strom_driver_master_addr(driver))
  end function strom_driver_master_addr

end module strom
