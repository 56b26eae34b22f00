//! `--seed FILE`: an initial configuration in the `ApplyConfigRequest` proto3-JSON
//! shape, committed only when the database has no version yet.

use crate::config::{Config, Mutation};
use crate::error::StoreError;
use crate::store::{MutateOptions, Store};
use gateway_proto::v1::ApplyConfigRequest;
use std::path::{Path, PathBuf};

/// `author` recorded for the version a seed file creates.
pub const SEED_AUTHOR: &str = "seed";

/// Why a seed file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The file cannot be read.
    #[error("cannot read seed file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not an `ApplyConfigRequest` in proto3 JSON.
    #[error("seed file {path} is not an ApplyConfigRequest in proto3 JSON")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// The file uses fields that make no sense for a seed.
    #[error("seed file {path}: {reason}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// The configuration is invalid, or could not be committed.
    #[error("seed file {path} was refused")]
    Config {
        /// The file.
        path: PathBuf,
        /// The validation or storage error.
        source: StoreError,
    },
}

/// Reads and validates a seed file.
pub fn load(path: &Path) -> Result<Config, SeedError> {
    let text = std::fs::read_to_string(path).map_err(|source| SeedError::Read {
        path: path.to_owned(),
        source,
    })?;
    let req: ApplyConfigRequest =
        serde_json::from_str(&text).map_err(|source| SeedError::Parse {
            path: path.to_owned(),
            source,
        })?;
    if req.dry_run || req.expected_version.is_some() {
        return Err(SeedError::Unsupported {
            path: path.to_owned(),
            reason: "dry_run and expected_version are not allowed in a seed file",
        });
    }
    let mut config = Config::new(req.routes, req.upstreams)
        .with_certificates(req.certificates)
        .with_jwt_issuers(req.jwt_issuers);
    for c in &mut config.certificates {
        crate::certificates::prepare(c);
    }
    config.validate().map_err(|source| SeedError::Config {
        path: path.to_owned(),
        source,
    })?;
    Ok(config)
}

/// Validates the seed file and commits it if the database is empty.
/// Returns the version it created, or `None` when the database already had one.
pub async fn apply(store: &Store, path: &Path) -> Result<Option<u64>, SeedError> {
    let config = load(path)?;
    let err = |source| SeedError::Config {
        path: path.to_owned(),
        source,
    };
    if !store.is_empty().await.map_err(err)? {
        tracing::info!(seed = %path.display(), "database already has a configuration; seed file not applied");
        return Ok(None);
    }
    let options = MutateOptions {
        // Only the first writer of an empty database seeds it.
        expected_version: Some(0),
        dry_run: false,
        author: Some(SEED_AUTHOR.into()),
    };
    let outcome = match store.mutate(Mutation::Replace(config), &options).await {
        Ok(outcome) => outcome,
        // Another control plane of a shared database seeded it first.
        Err(StoreError::VersionMismatch { expected: 0, .. }) => {
            tracing::info!(seed = %path.display(), "another control plane seeded the database first; seed file not applied");
            return Ok(None);
        }
        Err(e) => return Err(err(e)),
    };
    tracing::info!(seed = %path.display(), version = outcome.version, "seeded configuration");
    Ok(outcome.committed.then_some(outcome.version))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its causes, as an operator sees them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            out.push_str(": ");
            out.push_str(&c.to_string());
            cur = c.source();
        }
        out
    }

    fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let p = dir.path().join("seed.json");
        std::fs::write(&p, text).unwrap();
        p
    }

    const GOOD: &str = r#"{
        "upstreams": [{"name": "users", "instances": [{"id": "users-1", "url": "http://127.0.0.1:9001"}]}],
        "routes": [{"name": "users", "pathPrefix": "/api/users", "upstream": "users", "auth": "AUTH_JWT"}]
    }"#;

    #[tokio::test]
    async fn applies_only_to_an_empty_database() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("cp.db")).await.unwrap();
        let seed = write(&dir, GOOD);
        assert_eq!(apply(&store, &seed).await.unwrap(), Some(1));
        let cur = store.current();
        assert_eq!(cur.routes[0].path_prefix, "/api/users");
        assert_eq!(cur.author, SEED_AUTHOR);
        assert_eq!(apply(&store, &seed).await.unwrap(), None);
        assert_eq!(store.current().version, 1);
    }

    #[test]
    fn bad_files_give_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = load(&dir.path().join("nope.json")).unwrap_err();
        assert!(matches!(missing, SeedError::Read { .. }), "{missing}");

        let e = load(&write(&dir, "{\"routes\": [{\"nmae\": \"x\"}]}")).unwrap_err();
        assert!(e.to_string().contains("not an ApplyConfigRequest"), "{e}");
        assert!(chain(&e).contains("unknown field `nmae`"), "{e:?}");

        let e = load(&write(
            &dir,
            r#"{"routes": [{"name": "a", "pathPrefix": "a", "upstream": "u"}]}"#,
        ))
        .unwrap_err();
        let text = chain(&e);
        assert!(text.contains("path_prefix must start with"), "{text}");
        assert!(text.contains("upstream \"u\" does not exist"), "{text}");

        let e = load(&write(&dir, r#"{"dryRun": true}"#)).unwrap_err();
        assert!(matches!(e, SeedError::Unsupported { .. }), "{e}");
    }
}
