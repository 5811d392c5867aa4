//! How this process fits in its group: the master (rank 0, or a lone
//! server), a rank of a launcher (mpirun, srun, `strom cluster up`) that
//! joins rank 0, or a member joining a running group (`--join`).
//!
//! Ranks come from the launcher's environment, so no MPI library is linked:
//! `STROM_RANK`/`STROM_SIZE`, Open MPI's `OMPI_COMM_WORLD_RANK`/`_SIZE`,
//! MPICH/Hydra's `PMI_RANK`/`PMI_SIZE`, or Slurm's `SLURM_PROCID`/`SLURM_NTASKS`.

use std::path::{Path, PathBuf};

/// Rank and size from the first launcher whose variables are set.
pub fn rank_from_env() -> Option<(u32, u32)> {
    const VARS: [(&str, &str); 4] = [
        ("STROM_RANK", "STROM_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ];
    VARS.iter().find_map(|(r, s)| {
        let rank = std::env::var(r).ok()?.parse().ok()?;
        let size = std::env::var(s).ok()?.parse().ok()?;
        (size > 0 && rank < size).then_some((rank, size))
    })
}

/// Where rank 0 publishes its address for the other ranks.
pub fn rendezvous_file(group_file: &Path) -> PathBuf {
    let mut name = group_file.as_os_str().to_owned();
    name.push(".master");
    PathBuf::from(name)
}
