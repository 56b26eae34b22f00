//! The control plane's error type and the one place it is mapped to gRPC status codes.

use tonic::{Code, Status};

/// Why a read or a mutation of the configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The request, or the configuration it would produce, is invalid. Nothing changed.
    /// The text names the resource, the field and the reason.
    #[error("{0}")]
    Invalid(String),
    /// A named route, upstream or version does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A resource to create already exists (an API key of that name).
    #[error("{0}")]
    AlreadyExists(String),
    /// The caller's compare-and-swap version is not the current one.
    #[error("expected version {expected}, current is {current}")]
    VersionMismatch {
        /// The version the caller expected to be current.
        expected: u64,
        /// The version that actually is current.
        current: u64,
    },
    /// A private key or an upstream signing secret was to be stored, and the
    /// control plane has no `--secrets-key-file` to seal it with. Nothing changed.
    #[error(
        "storing a certificate's private key or an upstream's identity_signing_secret needs a \
         secrets key: start the control plane with --secrets-key-file FILE \
         (CONTROL_PLANE_SECRETS_KEY_FILE; 32 random bytes, e.g. `openssl rand -hex 32 > FILE`), \
         which encrypts private keys and signing secrets in the database"
    )]
    NoSecretsKey,
    /// The database holds private keys sealed with a secrets key, and the one
    /// given (or none) is not it. Found when the database is opened.
    #[error("{0}")]
    WrongSecretsKey(String),
    /// A stored row cannot be decoded, or its hash does not match its content.
    #[error("corrupt stored configuration: {0}")]
    Corrupt(String),
    /// A bug: a task panicked.
    #[error("internal error: {0}")]
    Internal(String),
    /// The database failed (I/O, lock timeout, a constraint, ...). The text is
    /// the whole story (it becomes the gRPC message), so the cause is not
    /// exposed again as `source`.
    #[error("storage error: {0}")]
    Database(sqlx::Error),
    /// The database cannot be reached (Postgres down or restarting, no
    /// connection within the acquire timeout). Nothing changed; retry later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The schema migrations failed.
    #[error("database migration failed: {0}")]
    Migrate(sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if gateway_database::postgres::is_unreachable(&e) {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Database(e)
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migrate(e)
    }
}

impl From<gateway_proto::ValidationError> for StoreError {
    fn from(e: gateway_proto::ValidationError) -> Self {
        StoreError::Invalid(e.to_string())
    }
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Self {
        let code = match &e {
            StoreError::Invalid(_) => Code::InvalidArgument,
            StoreError::NotFound(_) => Code::NotFound,
            StoreError::AlreadyExists(_) => Code::AlreadyExists,
            StoreError::VersionMismatch { .. } | StoreError::NoSecretsKey => {
                Code::FailedPrecondition
            }
            StoreError::Unavailable(_) => Code::Unavailable,
            StoreError::WrongSecretsKey(_)
            | StoreError::Corrupt(_)
            | StoreError::Internal(_)
            | StoreError::Database(_)
            | StoreError::Migrate(_) => Code::Internal,
        };
        if code == Code::Internal {
            tracing::error!(error = %e, "request failed");
        } else if code == Code::Unavailable {
            tracing::warn!(error = %e, "request failed");
        }
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_kind_to_its_code() {
        let s: Status = StoreError::Invalid("route \"a\": bad".into()).into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "route \"a\": bad");
        let s: Status = StoreError::NotFound("route \"x\" not found".into()).into();
        assert_eq!(s.code(), Code::NotFound);
        let s: Status = StoreError::VersionMismatch {
            expected: 3,
            current: 5,
        }
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "expected version 3, current is 5");
        let s: Status = StoreError::Corrupt("x".into()).into();
        assert_eq!(s.code(), Code::Internal);
        let s: Status = StoreError::from(sqlx::Error::PoolTimedOut).into();
        assert_eq!(s.code(), Code::Unavailable);
        let s: Status = StoreError::from(sqlx::Error::RowNotFound).into();
        assert_eq!(s.code(), Code::Internal);
        let s: Status = StoreError::NoSecretsKey.into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("--secrets-key-file"), "{s:?}");
    }
}
