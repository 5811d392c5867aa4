//! The object-store tier: objects in an S3-compatible store (`s3://bucket/
//! prefix`, credentials and endpoint from the usual `AWS_*` environment
//! variables or explicit options) or any other `object_store` backend
//! (tests use `LocalFileSystem` where no S3 server is at hand).
//!
//! `object_store` is async; the tier owns a small runtime (one worker
//! thread) and every call spawns its future there and waits for its result on a
//! plain channel, so the storage code stays synchronous and may be called
//! from any thread, an async worker's included. Objects up to [`CHUNK`] go
//! in one PUT; larger ones as a multipart upload of `CHUNK`-sized parts,
//! which the store makes visible atomically when it completes.

use std::future::Future;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartUpload, ObjectStore, PutPayload};

use super::{read_file_range, tier_io, TierStore, CHUNK};
use crate::vfs::VfsFile;
use crate::{Result, StorageError};

/// A tier in an object store.
pub struct ObjectTier {
    store: Arc<dyn ObjectStore>,
    /// Key prefix inside the store ("" for none).
    root: String,
    name: String,
    /// Always `Some` until dropped (shut down without blocking, so the
    /// tier may be dropped on an async worker).
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for ObjectTier {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn to_io(e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, e),
        other => io::Error::other(other),
    }
}

impl ObjectTier {
    /// Any `object_store` backend, keys under `root`.
    pub fn new(store: Arc<dyn ObjectStore>, root: &str, name: &str) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("strom-tier-io")
            .enable_all()
            .build()
            .map_err(|e| StorageError::io("starting the object-store tier's runtime", e))?;
        Ok(ObjectTier {
            store,
            root: root.trim_matches('/').to_string(),
            name: name.to_string(),
            rt: Some(rt),
        })
    }

    /// `s3://bucket[/prefix]` (credentials, region and endpoint from the
    /// `AWS_*` environment variables, then `options`, e.g.
    /// `("aws_endpoint", "http://127.0.0.1:9000")`), or
    /// `file:///absolute/path` (object_store's local-filesystem backend).
    pub fn from_url(url: &str, options: &[(String, String)]) -> Result<Self> {
        let bad = |why: String| StorageError::InvalidConfig(format!("tier_url '{url}': {why}"));
        if let Some(path) = url.strip_prefix("file://") {
            std::fs::create_dir_all(path)
                .map_err(|e| StorageError::io(format!("creating the tier directory {path}"), e))?;
            let fs = LocalFileSystem::new_with_prefix(path).map_err(|e| bad(e.to_string()))?;
            return Self::new(Arc::new(fs), "", url);
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(bad("only s3:// and file:// URLs are supported".into()));
        };
        let (bucket, root) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket named".into()));
        }
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        for (key, value) in options {
            let key: AmazonS3ConfigKey = key
                .parse()
                .map_err(|e: object_store::Error| bad(e.to_string()))?;
            builder = builder.with_config(key, value);
        }
        let store = builder.build().map_err(|e| bad(e.to_string()))?;
        Self::new(Arc::new(store), root, url)
    }

    fn path(&self, key: &str) -> ObjectPath {
        if self.root.is_empty() {
            ObjectPath::from(key)
        } else {
            ObjectPath::from(format!("{}/{key}", self.root))
        }
    }

    /// Runs `fut` on the tier's runtime and waits for it.
    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> io::Result<T> {
        let Some(rt) = &self.rt else {
            return Err(io::Error::other("the object-store tier was shut down"));
        };
        // A plain channel, not the task's JoinHandle: polling a tokio
        // handle from a thread inside another tokio task (a server worker)
        // draws on that task's cooperative budget, which never refills
        // while the thread blocks here, and the wait would spin forever.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        match rx.recv() {
            Ok(r) => r.map_err(to_io),
            Err(_) => Err(io::Error::other("the object-store tier's task stopped")),
        }
    }

    fn err(&self, what: &str, key: &str, e: io::Error) -> StorageError {
        tier_io(&self.name, what, key, e)
    }

    fn put_small(&self, path: ObjectPath, src: &dyn VfsFile, len: u64) -> io::Result<()> {
        let bytes = Bytes::from(read_file_range(src, 0, len)?);
        let store = self.store.clone();
        self.block(async move { store.put(&path, PutPayload::from(bytes)).await.map(|_| ()) })
    }

    fn put_multipart(&self, path: ObjectPath, src: &dyn VfsFile, len: u64) -> io::Result<()> {
        let store = self.store.clone();
        let mut upload = self.block(async move { store.put_multipart(&path).await })?;
        let mut pos = 0;
        let sent = loop {
            if pos >= len {
                break Ok(());
            }
            let n = CHUNK.min(len - pos);
            let part = match read_file_range(src, pos, n) {
                Ok(buf) => upload.put_part(PutPayload::from(Bytes::from(buf))),
                Err(e) => break Err(e),
            };
            if let Err(e) = self.block(part) {
                break Err(e);
            }
            pos += n;
        };
        let (mut upload, done) = self.block(async move {
            let done = match sent {
                Ok(()) => upload.complete().await.map(|_| ()).map_err(to_io),
                Err(e) => Err(e),
            };
            Ok((upload, done))
        })?;
        if done.is_err() {
            let _ = self.block(async move { upload.abort().await });
        }
        done
    }
}

impl TierStore for ObjectTier {
    fn put(&self, key: &str, src: &dyn VfsFile) -> Result<()> {
        let len = src
            .len()
            .map_err(|e| self.err("reading the source of", key, e))?;
        let path = self.path(key);
        let r = if len <= CHUNK {
            self.put_small(path, src, len)
        } else {
            self.put_multipart(path, src, len)
        };
        r.map_err(|e| self.err("writing", key, e))?;
        tracing::debug!(tier = %self.name, key, bytes = len, "wrote a tier object");
        Ok(())
    }

    fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let (store, path) = (self.store.clone(), self.path(key));
        let bytes = self
            .block(async move { store.get_range(&path, start..start + len).await })
            .map_err(|e| self.err("reading", key, e))?;
        Ok(bytes.to_vec())
    }

    fn size(&self, key: &str) -> Result<u64> {
        let (store, path) = (self.store.clone(), self.path(key));
        let meta = self
            .block(async move { store.head(&path).await })
            .map_err(|e| self.err("reading the size of", key, e))?;
        Ok(meta.size)
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        let store = self.store.clone();
        let dir = prefix.rsplit_once('/').map_or("", |(d, _)| d);
        let list_path = (!dir.is_empty() || !self.root.is_empty()).then(|| self.path(dir));
        let metas = self
            .block(async move {
                let mut stream = store.list(list_path.as_ref());
                let mut out = Vec::new();
                while let Some(meta) = stream.next().await {
                    out.push(meta?);
                }
                Ok(out)
            })
            .map_err(|e| self.err("listing", prefix, e))?;
        let strip = if self.root.is_empty() {
            0
        } else {
            self.root.len() + 1
        };
        let mut out: Vec<(String, u64)> = metas
            .into_iter()
            .filter_map(|m| {
                let key = m.location.as_ref().get(strip..)?.to_string();
                key.starts_with(prefix).then_some((key, m.size))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let (store, path) = (self.store.clone(), self.path(key));
        match self.block(async move { store.delete(&path).await }) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("removing", key, e)),
        }
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}
