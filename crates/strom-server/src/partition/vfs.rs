//! The file system file partitions live on: the operating system's, or,
//! when the environment variable `STROM_TEST_IO_FAULTS` names a control
//! file, the same with the I/O errors that file names
//! (`strom_storage::faulty`: a full disk, a failing fdatasync). Tests that
//! run the real server binary set it to break one member's disk; nothing
//! else should.

use std::sync::{Arc, OnceLock};

use strom_storage::faulty::FaultyFs;
use strom_storage::vfs::{RealFs, Vfs};

/// The variable naming the control file.
pub const FAULTS_VAR: &str = "STROM_TEST_IO_FAULTS";

/// The file system every file partition of this process opens on.
pub(super) fn partition_vfs() -> Arc<dyn Vfs> {
    static VFS: OnceLock<Arc<dyn Vfs>> = OnceLock::new();
    VFS.get_or_init(|| match std::env::var_os(FAULTS_VAR) {
        Some(control) if !control.is_empty() => {
            tracing::warn!(control = %std::path::Path::new(&control).display(),
                "{FAULTS_VAR} is set: partition I/O errors are injected as its control file says (tests only)");
            Arc::new(FaultyFs::new(std::path::Path::new(&control)))
        }
        _ => Arc::new(RealFs),
    })
    .clone()
}
