//! A simulated disk for tests: an in-memory [`Vfs`] that keeps what a real
//! disk would lose on power loss, so that tests can crash the storage at
//! any point and reopen it on what survived. Not for production use.
//!
//! Model: each file has its *disk* contents (durable), its *pending* writes
//! and size changes since its last `sync_data` (in order), and the *view*
//! that reads return (the page cache). `sync_data` moves the pending
//! operations to disk. A failed `sync_data` drops them (as Linux may after
//! an fsync error: the pages are marked clean but never reached the disk)
//! while reads still see them. Directory entries (creations, renames,
//! removals) are pending until `sync_dir` of their parent. A crash image
//! keeps, per file, a random prefix of its pending operations, the last one
//! possibly torn at a random byte, and a random prefix of the pending
//! directory operations.
//!
//! Faults: [`SimFs::inject`] makes matching writes or syncs fail with an
//! errno (EIO, ENOSPC, ...), a number of times or until cleared.
//! [`SimFs::crash_after`] freezes the crash image after N more mutating
//! operations; every operation after that point fails, as if the machine
//! had stopped. Bytes read are counted per file extension.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::vfs::{Vfs, VfsFile};

/// A small deterministic PRNG (xorshift64*), so that seeds replay exactly.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

#[derive(Clone, Debug)]
enum FileOp {
    Write { at: u64, bytes: Vec<u8> },
    SetLen(u64),
}

fn apply(buf: &mut Vec<u8>, op: &FileOp, torn_at: Option<usize>) {
    match op {
        FileOp::Write { at, bytes } => {
            let n = torn_at.unwrap_or(bytes.len()).min(bytes.len());
            let at = *at as usize;
            if buf.len() < at + n {
                buf.resize(at + n, 0);
            }
            buf[at..at + n].copy_from_slice(&bytes[..n]);
        }
        FileOp::SetLen(len) => {
            if torn_at.is_none() {
                buf.resize(*len as usize, 0);
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Inode {
    disk: Vec<u8>,
    view: Vec<u8>,
    pending: Vec<FileOp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Dir,
    File(u64),
}

#[derive(Clone, Debug)]
enum DirOp {
    Link(PathBuf, Entry),
    Unlink(PathBuf),
    Rename(PathBuf, PathBuf),
}

impl DirOp {
    fn touches(&self, dir: &Path) -> bool {
        let parent = |p: &PathBuf| p.parent() == Some(dir);
        match self {
            DirOp::Link(p, _) | DirOp::Unlink(p) => parent(p),
            DirOp::Rename(a, b) => parent(a) || parent(b),
        }
    }

    fn apply(&self, entries: &mut BTreeMap<PathBuf, Entry>) {
        match self {
            DirOp::Link(p, e) => {
                entries.insert(p.clone(), *e);
            }
            DirOp::Unlink(p) => {
                entries.remove(p);
            }
            DirOp::Rename(a, b) => {
                if let Some(e) = entries.remove(a) {
                    entries.insert(b.clone(), e);
                }
            }
        }
    }
}

/// Which operations a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// `write_all_at` and growing `set_len`.
    Write,
    /// `sync_data` and `sync_dir`.
    Sync,
}

/// An injected I/O error.
#[derive(Clone, Debug)]
pub struct Fault {
    pub op: FaultOp,
    /// The errno returned (`libc::EIO`, `libc::ENOSPC`, ...).
    pub errno: i32,
    /// Only paths whose text contains this (all paths when empty).
    pub path_contains: String,
    /// How many times it fires; `None`: until [`SimFs::clear_faults`].
    pub times: Option<u32>,
}

#[derive(Clone, Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    entries: BTreeMap<PathBuf, Entry>,
    durable: BTreeMap<PathBuf, Entry>,
    dir_ops: Vec<DirOp>,
}

#[derive(Default)]
struct Sim {
    state: State,
    faults: Vec<Fault>,
    /// Mutating operations left before the crash image is frozen.
    crash_in: Option<u64>,
    frozen: Option<State>,
    reads: HashMap<String, u64>,
}

impl Sim {
    /// Counts one mutating operation; errors once the machine has "stopped".
    fn tick(&mut self) -> io::Result<()> {
        if self.frozen.is_some() {
            return Err(io::Error::other("simulated machine crashed"));
        }
        if let Some(n) = self.crash_in.as_mut() {
            if *n == 0 {
                self.frozen = Some(self.state.clone());
                return Err(io::Error::other("simulated machine crashed"));
            }
            *n -= 1;
        }
        Ok(())
    }

    fn fault(&mut self, op: FaultOp, path: &Path) -> io::Result<()> {
        let text = path.to_string_lossy();
        let hit = self
            .faults
            .iter_mut()
            .find(|f| f.op == op && text.contains(f.path_contains.as_str()));
        if let Some(f) = hit {
            let errno = f.errno;
            if let Some(t) = f.times.as_mut() {
                *t = t.saturating_sub(1);
            }
            self.faults.retain(|f| f.times != Some(0));
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(())
    }
}

/// The simulated disk; clones share it.
#[derive(Clone, Default)]
pub struct SimFs {
    sim: Arc<Mutex<Sim>>,
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

impl SimFs {
    /// An empty disk holding only the root directory `/`.
    pub fn new() -> Self {
        let fs = SimFs::default();
        {
            let mut sim = fs.sim.lock();
            sim.state.entries.insert(PathBuf::from("/"), Entry::Dir);
            sim.state.durable.insert(PathBuf::from("/"), Entry::Dir);
        }
        fs
    }

    pub fn inject(&self, fault: Fault) {
        self.sim.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.sim.lock().faults.clear();
    }

    /// Freezes the crash image after `ops` more mutating operations (write,
    /// set_len, sync, directory change); that operation and all later ones
    /// fail.
    pub fn crash_after(&self, ops: u64) {
        self.sim.lock().crash_in = Some(ops);
    }

    /// Whether the crash point was reached.
    pub fn crashed(&self) -> bool {
        self.sim.lock().frozen.is_some()
    }

    /// Bytes read so far from files whose name ends with `.{ext}` (or is `ext`).
    pub fn bytes_read(&self, ext: &str) -> u64 {
        self.sim.lock().reads.get(ext).copied().unwrap_or(0)
    }

    pub fn reset_read_counters(&self) {
        self.sim.lock().reads.clear();
    }

    /// What a reboot finds after power loss at the crash point (or now, if
    /// no crash point was reached): a new, independent disk.
    pub fn crash_image(&self, rng: &mut SimRng) -> SimFs {
        let sim = self.sim.lock();
        let st = sim.frozen.clone().unwrap_or_else(|| sim.state.clone());
        drop(sim);
        let mut durable = st.durable.clone();
        let keep_dir_ops = rng.below(st.dir_ops.len() as u64 + 1) as usize;
        for op in &st.dir_ops[..keep_dir_ops] {
            op.apply(&mut durable);
        }
        // An entry whose directory did not survive did not survive either.
        loop {
            let before = durable.len();
            let dirs: Vec<PathBuf> = durable
                .iter()
                .filter(|(_, e)| **e == Entry::Dir)
                .map(|(p, _)| p.clone())
                .collect();
            durable.retain(|p, _| p.parent().is_none_or(|d| dirs.iter().any(|x| x == d)));
            if durable.len() == before {
                break;
            }
        }
        let mut inodes = HashMap::new();
        for entry in durable.values() {
            let Entry::File(ino) = *entry else { continue };
            if inodes.contains_key(&ino) {
                continue;
            }
            let Some(node) = st.inodes.get(&ino) else {
                continue;
            };
            let mut disk = node.disk.clone();
            let keep = rng.below(node.pending.len() as u64 + 1) as usize;
            for (i, op) in node.pending.iter().take(keep).enumerate() {
                let torn = if i + 1 == keep && rng.below(2) == 0 {
                    match op {
                        FileOp::Write { bytes, .. } => {
                            Some(rng.below(bytes.len() as u64 + 1) as usize)
                        }
                        FileOp::SetLen(_) => Some(0),
                    }
                } else {
                    None
                };
                apply(&mut disk, op, torn);
            }
            inodes.insert(
                ino,
                Inode {
                    view: disk.clone(),
                    disk,
                    pending: Vec::new(),
                },
            );
        }
        let state = State {
            inodes,
            next_ino: st.next_ino,
            entries: durable.clone(),
            durable,
            dir_ops: Vec::new(),
        };
        SimFs {
            sim: Arc::new(Mutex::new(Sim {
                state,
                ..Sim::default()
            })),
        }
    }
}

struct SimFile {
    sim: Arc<Mutex<Sim>>,
    ino: u64,
    path: PathBuf,
    ext: String,
}

impl SimFile {
    /// Runs `f` on the inode after `pre` (crash point and fault checks, which
    /// must see the whole state).
    fn with<T>(
        &self,
        pre: impl FnOnce(&mut Sim) -> io::Result<()>,
        f: impl FnOnce(&mut Sim, &mut Inode) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut sim = self.sim.lock();
        pre(&mut sim)?;
        let mut node = sim.state.inodes.remove(&self.ino).unwrap_or_default();
        let res = f(&mut sim, &mut node);
        sim.state.inodes.insert(self.ino, node);
        res
    }
}

impl VfsFile for SimFile {
    fn len(&self) -> io::Result<u64> {
        self.with(|_| Ok(()), |_, n| Ok(n.view.len() as u64))
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(
            |_| Ok(()),
            |sim, n| {
                *sim.reads.entry(self.ext.clone()).or_default() += buf.len() as u64;
                let end = offset as usize + buf.len();
                if end > n.view.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past the end",
                    ));
                }
                buf.copy_from_slice(&n.view[offset as usize..end]);
                Ok(())
            },
        )
    }

    fn write_all_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.with(
            |sim| {
                sim.tick()?;
                sim.fault(FaultOp::Write, &self.path)
            },
            |_, n| {
                let op = FileOp::Write {
                    at: offset,
                    bytes: bufs.concat(),
                };
                apply(&mut n.view, &op, None);
                n.pending.push(op);
                Ok(())
            },
        )
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let grows = self.len()? < len;
        self.with(
            |sim| {
                sim.tick()?;
                if grows {
                    sim.fault(FaultOp::Write, &self.path)?;
                }
                Ok(())
            },
            |_, n| {
                let op = FileOp::SetLen(len);
                apply(&mut n.view, &op, None);
                n.pending.push(op);
                Ok(())
            },
        )
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(
            |sim| sim.tick(),
            |sim, n| {
                if let Err(e) = sim.fault(FaultOp::Sync, &self.path) {
                    // The kernel dropped the dirty pages: they never reach the
                    // disk, but reads keep seeing them.
                    n.pending.clear();
                    return Err(e);
                }
                for op in n.pending.drain(..) {
                    apply(&mut n.disk, &op, None);
                }
                Ok(())
            },
        )
    }
}

impl Vfs for SimFs {
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn VfsFile>> {
        let mut sim = self.sim.lock();
        let ino = match sim.state.entries.get(path) {
            Some(Entry::File(ino)) => *ino,
            Some(Entry::Dir) => return Err(io::Error::other("is a directory")),
            None if !create => return Err(not_found(path)),
            None => {
                let parent = path.parent().ok_or_else(|| not_found(path))?;
                if sim.state.entries.get(parent) != Some(&Entry::Dir) {
                    return Err(not_found(parent));
                }
                sim.tick()?;
                sim.state.next_ino += 1;
                let ino = sim.state.next_ino;
                sim.state.inodes.insert(ino, Inode::default());
                let op = DirOp::Link(path.to_path_buf(), Entry::File(ino));
                op.apply(&mut sim.state.entries);
                sim.state.dir_ops.push(op);
                ino
            }
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ext = name.rsplit('.').next().unwrap_or_default().to_string();
        Ok(Box::new(SimFile {
            sim: self.sim.clone(),
            ino,
            path: path.to_path_buf(),
            ext,
        }))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        Ok(self.sim.lock().state.entries.contains_key(path))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let sim = self.sim.lock();
        if sim.state.entries.get(dir) != Some(&Entry::Dir) {
            return Err(not_found(dir));
        }
        Ok(sim
            .state
            .entries
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut sim = self.sim.lock();
        if !sim.state.entries.contains_key(from) {
            return Err(not_found(from));
        }
        sim.tick()?;
        let op = DirOp::Rename(from.to_path_buf(), to.to_path_buf());
        op.apply(&mut sim.state.entries);
        sim.state.dir_ops.push(op);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.sim.lock();
        if !matches!(sim.state.entries.get(path), Some(Entry::File(_))) {
            return Err(not_found(path));
        }
        sim.tick()?;
        let op = DirOp::Unlink(path.to_path_buf());
        op.apply(&mut sim.state.entries);
        sim.state.dir_ops.push(op);
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.sim.lock();
        if sim.state.entries.contains_key(path) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        let parent = path.parent().ok_or_else(|| not_found(path))?;
        if sim.state.entries.get(parent) != Some(&Entry::Dir) {
            return Err(not_found(parent));
        }
        sim.tick()?;
        let op = DirOp::Link(path.to_path_buf(), Entry::Dir);
        op.apply(&mut sim.state.entries);
        sim.state.dir_ops.push(op);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut sim = self.sim.lock();
        sim.tick()?;
        sim.fault(FaultOp::Sync, dir)?;
        let ops = std::mem::take(&mut sim.state.dir_ops);
        let (now, later): (Vec<DirOp>, Vec<DirOp>) = ops.into_iter().partition(|o| o.touches(dir));
        let st = &mut sim.state;
        for op in &now {
            op.apply(&mut st.durable);
        }
        st.dir_ops = later;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(fs: &SimFs, path: &str, bytes: &[u8]) -> Box<dyn VfsFile> {
        let f = fs.open(Path::new(path), true).unwrap();
        let at = f.len().unwrap();
        f.write_all_at(&[bytes], at).unwrap();
        f
    }

    #[test]
    fn unsynced_data_and_entries_may_be_lost_synced_ones_survive() {
        let fs = SimFs::new();
        let f = write(&fs, "/a", b"hello");
        f.sync_data().unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        f.write_all_at(&[b" world"], 5).unwrap();
        write(&fs, "/b", b"unsynced entry");
        let mut lost_tail = false;
        let mut lost_b = false;
        for seed in 0..64 {
            let img = fs.crash_image(&mut SimRng::new(seed));
            let a = img.open(Path::new("/a"), false).unwrap();
            let len = a.len().unwrap() as usize;
            assert!((5..=11).contains(&len));
            let mut buf = vec![0u8; len];
            a.read_exact_at(&mut buf, 0).unwrap();
            assert_eq!(&buf[..5], b"hello");
            lost_tail |= len < 11;
            lost_b |= !img.exists(Path::new("/b")).unwrap();
        }
        assert!(lost_tail && lost_b);
    }

    #[test]
    fn a_failed_sync_drops_the_pending_writes_for_good() {
        let fs = SimFs::new();
        let f = write(&fs, "/a", b"x");
        fs.sync_dir(Path::new("/")).unwrap();
        fs.inject(Fault {
            op: FaultOp::Sync,
            errno: libc::EIO,
            path_contains: String::new(),
            times: Some(1),
        });
        assert!(f.sync_data().is_err());
        f.sync_data().unwrap(); // "succeeds", but the write is gone
        let img = fs.crash_image(&mut SimRng::new(1));
        assert_eq!(img.open(Path::new("/a"), false).unwrap().len().unwrap(), 0);
        assert_eq!(f.len().unwrap(), 1, "the page cache still shows it");
    }
}
