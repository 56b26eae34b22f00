//! What can go wrong, each with the message the user sees.

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The command line or its files do not make sense.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read.
    #[error("reading {0}: {1}")]
    Read(String, std::io::Error),
    /// A configuration file is invalid: each problem with its file and line.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
    /// The control plane answered with an error.
    #[error("control plane: {}: {}", code_name(.0.code()), .0.message())]
    Refused(tonic::Status),
}

impl From<tonic::Status> for CtlError {
    fn from(status: tonic::Status) -> Self {
        CtlError::Refused(status)
    }
}

/// A gRPC code as grpcurl prints it (`FAILED_PRECONDITION`).
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
