!> fortran_push.f90: a Fortran program producing and consuming arrays over
!> an MPI channel (include/strom_mpi.f90).
!>
!> Roles (P ranks, P >= 2): ranks [0, (P+1)/2) produce, the others consume.
!>
!> What it shows:
!>   1. strom_mpi_channel_open_f on MPI_COMM_WORLD%MPI_VAL (collective; the
!>      channel starts the embedded servers, no server or address is
!>      handled here); options from strom_mpi_channel_options_init, with
!>      `STROM_GROUP_FILE` (if set) as options%group_file: attached to a
!>      shared group, the topic is "fortran-<pid of rank 0>", deleted at the
!>      end (strom_topic_delete on strom_mpi_channel_driver);
!>   2. each producer pushes one real(c_double) array per step as n
!>      elements of MPI_DOUBLE_PRECISION (strom_mpi_channel_push_f),
!>      metadata {"rank":r,"step":s}, then strom_mpi_channel_end;
!>   3. each consumer pulls (strom_mpi_channel_pull) until
!>      STROM_END_OF_STREAM, reads rank and step from the metadata, counts
!>      the elements (strom_mpi_event_count_f), unpacks them into its own
!>      array (strom_mpi_event_unpack_f), and checks every value and the
!>      array's sum against what that producer pushed;
!>   4. MPI_Allreduce: every (rank, step) reached exactly one consumer, and
!>      every rank agrees on the verdict; strom_mpi_channel_close.
!>
!> Exit status 0 when everything pushed came back, else non-zero.
program fortran_push
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use strom, only: STROM_OK, STROM_END_OF_STREAM, strom_status_name, f_c_string
  use strom_mpi
  implicit none

  interface
    ! POSIX: this process's id, for a topic name unique on a shared group.
    function getpid() bind(C, name="getpid")
      import :: c_int
      integer(c_int) :: getpid
    end function
  end interface

  integer, parameter :: n = 1000, nsteps = 8
  integer(c_int64_t), parameter :: timeout_ms = 60000
  type(strom_mpi_channel_options) :: opts
  type(c_ptr) :: ch
  character(len=:, kind=c_char), allocatable, target :: group_file
  character(len=32) :: topic
  integer(c_int) :: pid
  integer, allocatable :: seen(:, :), all_seen(:, :)
  integer :: rank, nranks, producers, role, problems, all_problems, events, all_events

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  if (nranks < 2) then
    if (rank == 0) print '(a)', "fortran_push needs at least 2 ranks"
    call MPI_Abort(MPI_COMM_WORLD, 2)
  end if
  producers = (nranks + 1) / 2
  allocate (seen(0:producers - 1, nsteps), all_seen(0:producers - 1, nsteps))
  seen = 0
  problems = 0
  events = 0

  call check("strom_mpi_channel_options_init", strom_mpi_channel_options_init(opts))
  call group_from_env(opts, group_file)
  topic = "fortran"
  pid = getpid()
  call MPI_Bcast(pid, 1, MPI_INTEGER, 0, MPI_COMM_WORLD)
  if (allocated(group_file)) write (topic, '(a,i0)') "fortran-", pid
  role = STROM_MPI_CONSUMER
  if (rank < producers) role = STROM_MPI_PRODUCER
  call check("strom_mpi_channel_open_f", strom_mpi_channel_open_f(MPI_COMM_WORLD%MPI_VAL, role, &
             f_c_string(trim(topic)), opts, ch))

  if (role == STROM_MPI_PRODUCER) then
    call produce()
  else
    call consume()
  end if

  ! Every (rank, step) exactly once, and the verdict everywhere.
  call MPI_Allreduce(seen, all_seen, size(seen), MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  call MPI_Allreduce(events, all_events, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0 .and. any(all_seen /= 1)) then
    print '(a,i0,a)', "fortran_push: ", count(all_seen /= 1), " (rank, step) pairs not seen once"
    problems = problems + 1
  end if
  call MPI_Allreduce(problems, all_problems, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) then
    if (all_problems == 0) then
      print '(a,i0,a,i0,a,i0,a,i0,a)', "fortran_push: ", producers, " producer ranks x ", nsteps, &
        " arrays of ", n, " doubles -> ", nranks - producers, &
        " consumer ranks: every array once, values and sums as pushed"
    else
      print '(a,i0,a,i0,a)', "fortran_push: MISMATCH (", all_problems, " problems, ", &
        all_events, " events)"
    end if
  end if
  if (rank == 0 .and. allocated(group_file)) then ! everyone is done: all_problems is in
    call check("strom_topic_delete", strom_topic_delete(strom_mpi_channel_driver(ch), &
               f_c_string(trim(topic))))
  end if
  call check("strom_mpi_channel_close", strom_mpi_channel_close(ch))
  call MPI_Finalize()
  if (all_problems /= 0) error stop 1

contains

  !> The array rank r pushes at step s.
  pure subroutine fill(x, r, s)
    real(c_double), intent(out) :: x(:)
    integer, intent(in) :: r, s
    integer :: i
    do i = 1, size(x)
      x(i) = real(r, c_double) * 1000.0_c_double + real(s, c_double) &
             + real(i - 1, c_double) * 0.001_c_double
    end do
  end subroutine fill

  !> STROM_GROUP_FILE, when set, attaches the channel to a running group.
  subroutine group_from_env(o, path)
    type(strom_mpi_channel_options), intent(inout) :: o
    character(len=:, kind=c_char), allocatable, target, intent(inout) :: path
    character(len=4096) :: value
    integer :: length, stat
    call get_environment_variable("STROM_GROUP_FILE", value, length, stat)
    if (stat /= 0 .or. length == 0) return
    path = f_c_string(value(1:length))
    o%group_file = c_loc(path)
  end subroutine group_from_env

  !> A producer: one array per step, then the end of its stream.
  subroutine produce()
    real(c_double), target :: x(n)
    character(len=64) :: meta
    integer :: step
    do step = 1, nsteps
      call fill(x, rank, step)
      write (meta, '(a,i0,a,i0,a)') '{"rank":', rank, ',"step":', step, '}'
      call check("strom_mpi_channel_push_f", strom_mpi_channel_push_f(ch, c_loc(x), n, &
                 MPI_DOUBLE_PRECISION%MPI_VAL, f_c_string(trim(meta))))
      events = events + 1
    end do
    call check("strom_mpi_channel_end", strom_mpi_channel_end(ch))
  end subroutine produce

  !> A consumer: pulls and checks to the end of the stream.
  subroutine consume()
    type(c_ptr) :: ev
    integer(c_int32_t) :: status
    do
      status = strom_mpi_channel_pull(ch, timeout_ms, ev)
      if (status == STROM_END_OF_STREAM) exit
      call check("strom_mpi_channel_pull", status)
      call check_event(ev)
      call check("strom_event_ack", strom_event_ack(ev))
      call strom_event_free(ev)
      events = events + 1
    end do
  end subroutine consume

  !> Checks one event against the array its producer pushed.
  subroutine check_event(ev)
    type(c_ptr), intent(in) :: ev
    real(c_double), target :: y(n)
    real(c_double) :: want(n)
    character(len=:), allocatable :: meta
    integer(c_int) :: got
    integer :: r, s
    meta = strom_event_metadata(ev)
    r = json_int(meta, "rank")
    s = json_int(meta, "step")
    call check("strom_mpi_event_count_f", strom_mpi_event_count_f(ev, &
               MPI_DOUBLE_PRECISION%MPI_VAL, got))
    if (r < 0 .or. r >= producers .or. s < 1 .or. s > nsteps .or. got /= n) then
      print '(3a,i0,a)', "fortran_push: unexpected event ", meta, " of ", got, " doubles"
      problems = problems + 1
      return
    end if
    call check("strom_mpi_event_unpack_f", strom_mpi_event_unpack_f(ev, c_loc(y), got, &
               MPI_DOUBLE_PRECISION%MPI_VAL))
    call fill(want, r, s)
    if (any(y /= want) .or. sum(y) /= sum(want)) then
      print '(2a,i0,a)', meta, ": ", count(y /= want), " wrong values"
      problems = problems + 1
    end if
    seen(r, s) = seen(r, s) + 1
  end subroutine check_event

  !> The integer value of "key" in flat JSON metadata; -1 if absent.
  function json_int(json, key) result(v)
    character(len=*), intent(in) :: json, key
    integer :: v, k, e, stat
    v = -1
    k = index(json, '"' // key // '":')
    if (k == 0) return
    k = k + len(key) + 3
    e = k
    do while (e <= len(json))
      if (verify(json(e:e), "0123456789") /= 0) exit
      e = e + 1
    end do
    if (e == k) return
    read (json(k:e - 1), *, iostat=stat) v
    if (stat /= 0) v = -1
  end function json_int

  !> Aborts the job when a call did not return STROM_OK.
  subroutine check(what, status)
    character(len=*), intent(in) :: what
    integer(c_int32_t), intent(in) :: status
    if (status == STROM_OK) return
    write (*, '(a,i0,5a)') "rank ", rank, ": ", what, " -> ", strom_status_name(status), &
      ": " // strom_mpi_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 2)
  end subroutine check

end program fortran_push
