!> fortran_push.f90: every MPI rank of a Fortran program streams arrays.
!>
!> The MPI pattern:
!>   1. rank 0 makes a temporary directory (mkdtemp), starts an embedded
!>      server in it (strom_driver_embedded) and broadcasts its address
!>      (MPI_Bcast); the other ranks strom_driver_connect_addr to it;
!>   2. rank 0 creates topic "fortran" (one memory partition per rank),
!>      MPI_Barrier, the others open it;
!>   3. every rank opens a producer, MPI_Barrier (so the stream cannot end
!>      before every rank is registered), then pushes one real(c_double)
!>      array per step, metadata {"rank":r,"step":s}, keeping each push's
!>      future; it waits for the futures (where each event was stored),
!>      checks them, and closes its producer;
!>   4. rank 0 reads the whole stream back through a small C function
!>      (fortran_check.c) that checks every value; MPI_Allreduce spreads the
!>      verdict, MPI_Barrier, then rank 0 frees its driver (stopping the
!>      server) and removes the directory.
!>
!> Exit status 0 when everything pushed came back, else non-zero.
program fortran_push
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use strom
  implicit none

  interface
    ! libc: fills the XXXXXX of `template` in place; NULL on failure.
    function mkdtemp(template) bind(C, name="mkdtemp")
      import :: c_char, c_ptr
      character(kind=c_char), intent(inout) :: template(*)
      type(c_ptr) :: mkdtemp
    end function
    ! fortran_check.c
    function strom_example_check(topic, nranks, nsteps, n) bind(C, name="strom_example_check")
      import :: c_ptr, c_int
      type(c_ptr), value :: topic
      integer(c_int), value :: nranks, nsteps, n
      integer(c_int) :: strom_example_check
    end function
    function strom_example_rmtree(dir) bind(C, name="strom_example_rmtree")
      import :: c_char, c_int
      character(kind=c_char), intent(in) :: dir(*)
      integer(c_int) :: strom_example_rmtree
    end function
  end interface

  integer, parameter :: n = 1000, nsteps = 8
  real(c_double), target :: x(n)
  type(c_ptr), target :: futures(nsteps)
  type(c_ptr) :: driver, topic, producer
  type(strom_topic_spec) :: spec
  type(strom_iovec) :: iov(1)
  type(strom_event_id) :: id
  character(len=:, kind=c_char), allocatable, target :: topic_name, memory
  character(len=:), allocatable :: dir
  character(len=256) :: addr, tmp
  character(len=64) :: meta
  integer :: rank, nranks, step, i, tmplen, problems, all_problems

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  problems = 0
  dir = ""

  ! 1. The server on rank 0, its address to everyone.
  addr = ""
  if (rank == 0) then
    call get_environment_variable("TMPDIR", tmp, tmplen)
    if (tmplen == 0) tmp = "/tmp"
    dir = f_c_string(trim(tmp) // "/strom-fortran-XXXXXX")
    if (.not. c_associated(mkdtemp(dir))) call fail("mkdtemp", 0_c_int32_t)
    dir = dir(1:len(dir) - 1) ! without the NUL
    call check("strom_driver_embedded", strom_driver_embedded(f_c_string(dir), driver))
    addr = strom_driver_master_addr(driver)
  end if
  call MPI_Bcast(addr, len(addr), MPI_CHARACTER, 0, MPI_COMM_WORLD)
  if (rank /= 0) then
    call check("strom_driver_connect_addr", strom_driver_connect_addr(f_c_string(trim(addr)), driver))
  end if

  ! 2. The topic: created on rank 0, opened elsewhere.
  topic_name = f_c_string("fortran")
  memory = f_c_string("memory")
  if (rank == 0) then
    call check("strom_topic_spec_init", strom_topic_spec_init(spec, c_loc(topic_name), int(nranks, c_int32_t)))
    spec%partition_type = c_loc(memory)
    call check("strom_topic_create", strom_topic_create(driver, spec, topic))
  end if
  call MPI_Barrier(MPI_COMM_WORLD)
  if (rank /= 0) call check("strom_topic_open", strom_topic_open(driver, topic_name, topic))

  ! 3. Every rank produces.
  call check("strom_producer_open", strom_producer_open(topic, c_null_ptr, producer))
  call MPI_Barrier(MPI_COMM_WORLD)
  do step = 1, nsteps
    do i = 1, n
      x(i) = real(rank, c_double) * 1000.0_c_double + real(step, c_double) &
             + real(i - 1, c_double) * 0.001_c_double
    end do
    write (meta, '(a,i0,a,i0,a)') '{"rank":', rank, ',"step":', step, '}'
    iov(1) = strom_iovec(c_loc(x), int(size(x), c_size_t) * c_sizeof(x(1)))
    call check("strom_producer_push", strom_producer_push(producer, trim(meta), &
               int(len_trim(meta), c_size_t), iov, 1_c_size_t, c_loc(futures(step))))
  end do
  do step = 1, nsteps ! every push acknowledged, each at its own place
    call check("strom_future_wait", strom_future_wait(futures(step), id))
    if (id%partition < 0 .or. id%partition >= nranks .or. id%offset < 0) then
      print '(a,i0,a,i0,a,i0)', "rank ", rank, ": bad event id ", id%partition, "/", id%offset
      problems = problems + 1
    end if
    call strom_future_free(futures(step))
  end do
  call check("strom_producer_close", strom_producer_close(producer))
  call strom_producer_free(producer)

  ! 4. Rank 0 reads everything back (in C) and checks it.
  if (rank == 0) problems = problems + strom_example_check(topic, nranks, nsteps, n)
  call MPI_Allreduce(problems, all_problems, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  call strom_topic_free(topic)
  call MPI_Barrier(MPI_COMM_WORLD) ! nobody talks to rank 0's server any more
  call strom_driver_free(driver)
  if (rank == 0) then
    if (strom_example_rmtree(f_c_string(dir)) /= 0) print '(a)', "could not remove " // dir
  end if
  call MPI_Finalize()
  if (all_problems /= 0) error stop 1

contains

  !> Aborts the job when a call did not return STROM_OK.
  subroutine check(what, status)
    character(len=*), intent(in) :: what
    integer(c_int32_t), intent(in) :: status
    if (status /= STROM_OK) call fail(what, status)
  end subroutine check

  subroutine fail(what, status)
    character(len=*), intent(in) :: what
    integer(c_int32_t), intent(in) :: status
    write (*, '(a,i0,5a)') "rank ", rank, ": ", what, " -> ", strom_status_name(status), &
      ": " // strom_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 2)
  end subroutine fail

end program fortran_push
