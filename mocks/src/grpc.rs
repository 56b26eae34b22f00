//! The gRPC `mock.v1.Echo` service every mock serves beside its HTTP
//! endpoints (`proto/mock/v1/echo.proto`), with server reflection (v1 and
//! v1alpha, as the control plane's, so grpcurl 1.8 lists it). The fault
//! hooks apply as to HTTP: `DELAY_MS` waits, `FAIL_RATE` answers
//! `UNAVAILABLE`; a request can ask for a delay and a status of its own.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tonic::service::Routes;
use tonic::{Code, Request, Response, Status};

use crate::config::MockConfig;

/// Generated types and stubs of package `mock.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
pub mod v1 {
    tonic::include_proto!("mock.v1");
}

/// The encoded descriptor set of `mock.v1`, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mock_descriptor.bin"));

use v1::echo_server::{Echo, EchoServer};
use v1::{EchoReply, EchoRequest, StreamRequest};

/// Most answers one ServerStream call sends.
pub const MAX_STREAM_COUNT: u32 = 10_000;

/// The Echo service of one mock.
#[derive(Debug, Clone)]
pub struct EchoService {
    config: MockConfig,
}

/// The routes of the gRPC side: Echo and reflection; an error when the
/// reflection descriptors are broken (a build problem).
pub fn routes(config: MockConfig) -> Result<Routes, tonic_reflection::server::Error> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok(Routes::new(EchoServer::new(EchoService { config }))
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha))
}

/// A request's status code hook: 0 none, 1–16 that code.
fn requested_failure(code: i32, what: &str) -> Result<Option<Status>, Status> {
    match code {
        0 => Ok(None),
        1..=16 => Ok(Some(Status::new(Code::from(code), what.to_owned()))),
        _ => Err(Status::invalid_argument(format!(
            "fail_code must be 0 (none) or a gRPC status code 1-16, got {code}"
        ))),
    }
}

fn millis(ms: u32, field: &str, max: u32) -> Result<Duration, Status> {
    if ms > max {
        return Err(Status::invalid_argument(format!(
            "{field} must be 0-{max}, got {ms}"
        )));
    }
    Ok(Duration::from_millis(u64::from(ms)))
}

impl EchoService {
    /// `DELAY_MS`, then `FAIL_RATE`, as for HTTP requests.
    async fn hooks(&self) -> Result<(), Status> {
        if !self.config.delay.is_zero() {
            tokio::time::sleep(self.config.delay).await;
        }
        if self.config.fail_rate > 0.0 && rand::random::<f64>() < self.config.fail_rate {
            return Err(Status::unavailable("injected failure (FAIL_RATE)"));
        }
        Ok(())
    }

    fn reply<T>(&self, req: &Request<T>, message: String, sequence: u32) -> EchoReply {
        let metadata = req
            .metadata()
            .iter()
            .filter_map(|entry| match entry {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned()))
                }
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        EchoReply {
            message,
            instance: self.config.instance_id.clone(),
            metadata,
            sequence,
        }
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<EchoReply, Status>> + Send>>;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn unary(&self, req: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let failure = requested_failure(req.get_ref().fail_code, "fail_code")?;
        let delay = millis(req.get_ref().delay_ms, "delay_ms", 600_000)?;
        self.hooks().await?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(status) = failure {
            return Err(status);
        }
        let message = req.get_ref().message.clone();
        Ok(Response::new(self.reply(&req, message, 0)))
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(
        &self,
        req: Request<StreamRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let r = req.get_ref();
        let failure = requested_failure(r.fail_code, "fail_code")?;
        let interval = millis(r.interval_ms, "interval_ms", 60_000)?;
        if r.count > MAX_STREAM_COUNT {
            return Err(Status::invalid_argument(format!(
                "count must be 0-{MAX_STREAM_COUNT}, got {}",
                r.count
            )));
        }
        self.hooks().await?;
        let (count, fail_after) = (r.count, r.fail_after);
        let template = self.reply(&req, r.message.clone(), 0);
        let stream = futures::stream::unfold(0u32, move |i| {
            let template = template.clone();
            let failure = failure.clone();
            async move {
                if let Some(status) = failure.filter(|_| i == fail_after) {
                    // One past the end, so the error is the stream's last item.
                    return (i <= count).then_some((Err(status), count + 1));
                }
                if i >= count {
                    return None;
                }
                if i > 0 && !interval.is_zero() {
                    tokio::time::sleep(interval).await;
                }
                Some((
                    Ok(EchoReply {
                        sequence: i,
                        ..template
                    }),
                    i + 1,
                ))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
