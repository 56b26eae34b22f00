//! Steady background traffic through the edge, recording every answer: which replica served it
//! (X-Served-By), which backend instance (X-Instance-Id), and every failure.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::task::JoinHandle;

use super::{Stack, header, wait_for};

/// Concurrent clients; each sends one request every `PACE` (about 4 × 100 requests/s): enough to
/// catch any lost request, light enough for two shared cores running the whole stack.
const WORKERS: usize = 4;
const PACE: Duration = Duration::from_millis(10);
/// Failures kept verbatim for the report.
const KEPT_FAILURES: usize = 20;

struct Answer {
    at: Instant,
    served_by: Arc<str>,
    instance: Arc<str>,
}

#[derive(Default)]
struct Log {
    answers: Vec<Answer>,
    failed: u64,
    failures: Vec<String>,
}

/// A running traffic generator.
pub(crate) struct Traffic {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    tasks: Vec<JoinHandle<()>>,
    started: Instant,
}

/// What the traffic saw, from start to stop.
pub(crate) struct Report {
    /// Requests answered 200.
    pub ok: u64,
    /// Requests that failed (transport error or any other status).
    pub failed: u64,
    /// The first failures, verbatim.
    pub failures: Vec<String>,
    /// 200s per replica slot.
    pub per_server: BTreeMap<String, u64>,
    /// 200s per backend instance.
    pub per_instance: BTreeMap<String, u64>,
    /// How long the traffic ran.
    pub took: Duration,
}

impl Traffic {
    /// Starts `WORKERS` clients sending `GET {prefix}/<n>` through the edge.
    pub(crate) fn start(stack: &Stack, prefix: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Log::default()));
        let tasks = (0..WORKERS)
            .map(|w| {
                let (stop, log) = (stop.clone(), log.clone());
                let client = stack.http().clone();
                let url = stack.edge_url(&format!("{prefix}/{w}"));
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(PACE);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        let outcome = match client.get(&url).send().await {
                            Ok(resp) if resp.status() == 200 => {
                                let served_by: Arc<str> = header(&resp, "x-served-by").into();
                                let instance: Arc<str> = header(&resp, "x-instance-id").into();
                                // Read the body: a response cut short is a failure too.
                                match resp.bytes().await {
                                    Ok(_) => Ok((served_by, instance)),
                                    Err(e) => Err(format!("body from {served_by}: {e}")),
                                }
                            }
                            Ok(resp) => {
                                let status = resp.status();
                                let served_by = header(&resp, "x-served-by");
                                let body = resp.text().await.unwrap_or_default();
                                Err(format!("{status} from {served_by:?}: {body:.200}"))
                            }
                            Err(e) => Err(format!("transport: {e:#}")),
                        };
                        let mut log = log.lock();
                        match outcome {
                            Ok((served_by, instance)) => log.answers.push(Answer {
                                at: Instant::now(),
                                served_by,
                                instance,
                            }),
                            Err(e) => {
                                log.failed += 1;
                                if log.failures.len() < KEPT_FAILURES {
                                    log.failures.push(e);
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        Traffic {
            stop,
            log,
            tasks,
            started: Instant::now(),
        }
    }

    /// Waits until `n` requests have been answered (either way).
    pub(crate) async fn wait_requests(&self, n: u64, within: Duration) -> Result<()> {
        wait_for(&format!("{n} requests of traffic"), within, || async {
            let log = self.log.lock();
            Ok(log.answers.len() as u64 + log.failed >= n)
        })
        .await
    }

    /// Waits until `n` requests have been answered 200 after `mark`.
    pub(crate) async fn wait_requests_since(
        &self,
        mark: Instant,
        n: usize,
        within: Duration,
    ) -> Result<()> {
        wait_for(&format!("{n} answered requests"), within, || async {
            let log = self.log.lock();
            Ok(log
                .answers
                .iter()
                .rev()
                .take_while(|a| a.at >= mark)
                .count()
                >= n)
        })
        .await
    }

    /// Replica slots (X-Served-By) that answered 200 since `mark`.
    pub(crate) fn servers_since(&self, mark: Instant) -> BTreeSet<String> {
        let log = self.log.lock();
        log.answers
            .iter()
            .rev()
            .take_while(|a| a.at >= mark)
            .map(|a| a.served_by.to_string())
            .collect()
    }

    /// Backend instances (X-Instance-Id) that answered 200 since `mark`.
    pub(crate) fn instances_since(&self, mark: Instant) -> BTreeSet<String> {
        let log = self.log.lock();
        log.answers
            .iter()
            .rev()
            .take_while(|a| a.at >= mark)
            .map(|a| a.instance.to_string())
            .collect()
    }

    /// Stops the clients (letting in-flight requests finish) and reports.
    pub(crate) async fn stop(self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let log = std::mem::take(&mut *self.log.lock());
        let mut per_server = BTreeMap::new();
        let mut per_instance = BTreeMap::new();
        for a in &log.answers {
            *per_server.entry(a.served_by.to_string()).or_insert(0) += 1;
            *per_instance.entry(a.instance.to_string()).or_insert(0) += 1;
        }
        Report {
            ok: log.answers.len() as u64,
            failed: log.failed,
            failures: log.failures,
            per_server,
            per_instance,
            took: self.started.elapsed(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "traffic: {} ok, {} failed in {:.1?}; per replica {:?}; per instance {:?}",
            self.ok, self.failed, self.took, self.per_server, self.per_instance
        )?;
        for failure in &self.failures {
            write!(f, "\n  failure: {failure}")?;
        }
        Ok(())
    }
}
