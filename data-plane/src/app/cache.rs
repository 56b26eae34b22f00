//! Disk cache of the last accepted snapshot, so a data plane can start and
//! serve while the control plane is down.
//!
//! The file is the snapshot in proto3 JSON (readable with `jq`). Writes are
//! atomic: a temporary file in the same directory is written, fsynced, and
//! renamed over the old one, then the directory is fsynced, so a crash leaves
//! either the old or the new snapshot, never a torn one. The file is
//! readable by its owner only (mode 0600): it holds upstreams'
//! `identity_signing_secret`.

use std::fs::{self, File};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use gateway_proto::v1::ConfigSnapshot;

/// File name of the cached snapshot inside `--cache-dir`.
pub const CACHE_FILE: &str = "config-snapshot.json";

/// Why the cache could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a snapshot.
    #[error("{path} is not a valid snapshot: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// The snapshot cache in one directory.
#[derive(Debug, Clone)]
pub struct SnapshotCache {
    dir: PathBuf,
}

impl SnapshotCache {
    /// A cache in `dir` (created on first save).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Path of the cache file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(CACHE_FILE)
    }

    /// Reads the cached snapshot; `Ok(None)` when there is none.
    pub fn load(&self) -> Result<Option<ConfigSnapshot>, CacheError> {
        let path = self.path();
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CacheError::Io {
                    action: "reading",
                    path,
                    source,
                });
            }
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| CacheError::Parse { path, source })
    }

    /// Writes `snapshot` atomically (temp file, fsync, rename, fsync of the directory).
    pub fn save(&self, snapshot: &ConfigSnapshot) -> Result<(), CacheError> {
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source| CacheError::Io {
                action,
                path,
                source,
            }
        };
        fs::create_dir_all(&self.dir).map_err(io("creating", &self.dir))?;
        let json = serde_json::to_vec_pretty(snapshot).expect("snapshots serialise");
        let tmp = self
            .dir
            .join(format!(".{CACHE_FILE}.{}.tmp", std::process::id()));
        // Owner-only: the snapshot holds upstream signing secrets.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("creating", &tmp))?;
        f.write_all(&json).map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("syncing", &tmp))?;
        drop(f);
        let path = self.path();
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io("renaming to", &path)(e));
        }
        // Make the rename itself durable.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing", &self.dir))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::{Instance, Route, Upstream};

    #[test]
    fn round_trip_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let cache = SnapshotCache::new(dir.path().join("sub"));
        assert!(cache.load().unwrap().is_none());
        let snap = ConfigSnapshot {
            version: 7,
            hash: "abc".into(),
            routes: vec![Route {
                name: "r".into(),
                path_prefix: "/r".into(),
                upstream: "u".into(),
                ..Default::default()
            }],
            upstreams: vec![Upstream {
                name: "u".into(),
                instances: vec![Instance {
                    id: "i".into(),
                    url: "http://127.0.0.1:1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        cache.save(&snap).unwrap();
        assert_eq!(cache.load().unwrap(), Some(snap.clone()));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(cache.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut newer = snap;
        newer.version = 8;
        cache.save(&newer).unwrap();
        assert_eq!(cache.load().unwrap().unwrap().version, 8);
        let leftovers: Vec<_> = fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [CACHE_FILE]);
    }

    #[test]
    fn corrupt_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(CACHE_FILE), b"{not json").unwrap();
        let e = SnapshotCache::new(dir.path()).load().unwrap_err();
        assert!(matches!(e, CacheError::Parse { .. }), "{e}");
    }
}
