//! DNS discovery (`Upstream.discovery`): an upstream's instances are the A and
//! AAAA records of a name, resolved again every `refresh_ms`.
//!
//! **One snapshot, still.** The resolved member sets are an *input* of
//! [`compile`](crate::config::compile_with_members), like the pushed
//! configuration. When a refresh finds a different set, its task records it
//! here and wakes the runtime, which compiles the last accepted configuration
//! again with the new sets and publishes the result through the one `ArcSwap`
//! ([`Runtime::rediscover`](crate::app::runtime::Runtime::rediscover)). No member
//! list is swapped on its own, so a request sees one consistent snapshot from
//! start to end, and the snapshot's version (which names the configuration)
//! does not change. Reconciling is then what compiling already does:
//!
//! * members that stay keep their pool, breaker and health state (compile
//!   reuses the state of every [`InstanceKey`](crate::upstream::InstanceKey) it
//!   finds in the previous snapshot, and a member's key is derived from its
//!   address);
//! * new members get fresh state and, with `health_check`, a check task
//!   (`HealthSupervisor::reconcile`); like configured instances they start
//!   healthy, guarded by their breaker until the first checks have run;
//! * vanished members are absent from the new snapshot: no new request reaches
//!   them, requests already on them finish (their snapshot, pool connection
//!   and in-flight guard live until the response body ends), and their health
//!   task stops.
//!
//! A failed resolution, a timeout, or an answer without addresses keeps the
//! last good set; the error is shown in `/health/load-balancer`. A newly
//! configured name is resolved once before its first snapshot is published
//! (at most [`PRIME_TIMEOUT`]), so an upstream does not go live empty when DNS
//! works. A refresh task stops when its upstream leaves the configuration or
//! its discovery settings change.
//!
//! Member ids are `ADDRESS:port` as a socket address prints
//! (`10.0.0.5:8080`, `[fd00::5]:8080`) and their URL is `http://` + that id:
//! deterministic, so every replica and every refresh names a member the same.
//!
//! The resolver is a trait so tests inject answers; the default,
//! [`SystemResolver`], is `tokio::net::lookup_host` (the system resolver,
//! which is what Docker's embedded DNS needs).

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use gateway_proto::defaults;
use gateway_proto::spec::DiscoverySpec;
use gateway_proto::v1::{DnsDiscovery, Upstream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::upstream::UpstreamEntry;

/// Longest wait for the first resolution of a newly configured name, before
/// the configuration that names it is published (with no members if it did
/// not answer in time; the refresh task keeps trying).
pub const PRIME_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for one periodic resolution.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves a name to socket addresses.
pub trait Resolver: Send + Sync + 'static {
    /// Every address of `host`, with `port`.
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>>;
}

/// The system resolver (`getaddrinfo` through `tokio::net::lookup_host`):
/// `/etc/hosts`, then the configured DNS servers (Docker's embedded DNS in a
/// container).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        let host = host.to_owned();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// What an upstream discovers: a name, a port, how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Name to resolve.
    pub dns_name: Arc<str>,
    /// Port of every member.
    pub port: u16,
    /// Time between resolutions.
    pub refresh: Duration,
}

impl Target {
    /// From a validated upstream's `discovery`.
    pub fn from_spec(d: &DiscoverySpec<'_>) -> Self {
        Self {
            dns_name: d.dns_name.into(),
            port: d.port,
            refresh: d.refresh,
        }
    }

    /// From the protobuf message of a configuration not validated yet (the
    /// members a new one needs are resolved before it is compiled);
    /// `refresh_ms` 0 is the default, as in [`DiscoverySpec`].
    pub fn from_proto(d: &DnsDiscovery) -> Self {
        let ms = match d.refresh_ms {
            0 => defaults::DNS_REFRESH_MS,
            ms => ms,
        };
        Self {
            dns_name: d.dns_name.as_str().into(),
            port: u16::try_from(d.port).unwrap_or(0),
            refresh: Duration::from_millis(ms.into()),
        }
    }

    /// Same name and port: the members of one are the members of the other.
    fn same_members(&self, other: &Self) -> bool {
        self.dns_name == other.dns_name && self.port == other.port
    }
}

/// The members of one discovering upstream.
#[derive(Debug, Clone)]
pub struct Membership {
    /// What is resolved.
    pub target: Target,
    /// The last good answer, sorted, without duplicates.
    pub addrs: Arc<[SocketAddr]>,
    /// Why the last resolution failed; `None` once one succeeds.
    pub last_error: Option<Arc<str>>,
    /// When the last resolution succeeded.
    pub resolved_at: Option<Instant>,
}

impl Membership {
    fn empty(target: Target) -> Self {
        Self {
            target,
            addrs: Arc::from([]),
            last_error: None,
            resolved_at: None,
        }
    }

    /// Applies a resolution result. Returns whether the member set changed.
    fn record(&mut self, result: Result<Arc<[SocketAddr]>, String>) -> bool {
        match result {
            Ok(addrs) => {
                self.last_error = None;
                self.resolved_at = Some(Instant::now());
                let changed = addrs != self.addrs;
                self.addrs = addrs;
                changed
            }
            Err(why) => {
                self.last_error = Some(why.into());
                false
            }
        }
    }
}

/// Member sets by upstream name: what a snapshot is compiled with.
#[derive(Debug, Clone, Default)]
pub struct Members(HashMap<Arc<str>, Membership>);

impl Members {
    /// The addresses of `upstream` (none when it is not known).
    pub fn addrs(&self, upstream: &str) -> &[SocketAddr] {
        self.0.get(upstream).map_or(&[], |m| &m.addrs)
    }

    /// The membership of `upstream`.
    pub fn get(&self, upstream: &str) -> Option<&Membership> {
        self.0.get(upstream)
    }

    /// Sets the members of `upstream` (for tests and tools compiling by hand).
    pub fn insert(&mut self, upstream: &str, target: Target, addrs: Vec<SocketAddr>) {
        let mut m = Membership::empty(target);
        m.record(Ok(normalise(addrs, m.target.port)));
        self.0.insert(upstream.into(), m);
    }
}

struct Entry {
    membership: Membership,
    task: JoinHandle<()>,
}

struct Shared {
    entries: Mutex<HashMap<Arc<str>, Entry>>,
    changed: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Entry>> {
        self.entries.lock()
    }
}

/// Follows every discovering upstream of the current configuration: the last
/// good member sets and one refresh task per upstream.
pub struct Discovery {
    resolver: Arc<dyn Resolver>,
    shared: Arc<Shared>,
}

impl Default for Discovery {
    fn default() -> Self {
        Self::new(Arc::new(SystemResolver))
    }
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("upstreams", &self.shared.lock().len())
            .finish()
    }
}

/// Sorted, without duplicates, every port set to `port`. Link-local IPv6
/// addresses with a scope (`fe80::1%eth0`) are dropped: they are no use for a
/// service and cannot be written as an instance URL.
fn normalise(mut addrs: Vec<SocketAddr>, port: u16) -> Arc<[SocketAddr]> {
    addrs.retain(|a| !matches!(a, SocketAddr::V6(v6) if v6.scope_id() != 0));
    for a in &mut addrs {
        a.set_port(port);
    }
    addrs.sort_unstable();
    addrs.dedup();
    addrs.into()
}

async fn resolve_within(
    resolver: &dyn Resolver,
    target: &Target,
    timeout: Duration,
) -> Result<Arc<[SocketAddr]>, String> {
    match tokio::time::timeout(timeout, resolver.resolve(&target.dns_name, target.port)).await {
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(addrs)) => {
            let addrs = normalise(addrs, target.port);
            if addrs.is_empty() {
                Err("no usable A or AAAA records".into())
            } else {
                Ok(addrs)
            }
        }
    }
}

fn diff(old: &[SocketAddr], new: &[SocketAddr]) -> (Vec<String>, Vec<String>) {
    let added = new.iter().filter(|a| !old.contains(a));
    let removed = old.iter().filter(|a| !new.contains(a));
    (
        added.map(ToString::to_string).collect(),
        removed.map(ToString::to_string).collect(),
    )
}

/// Resolves `target` every `refresh` and records the answers for `upstream`
/// until the entry is gone or replaced (the task is aborted then as well).
async fn refresh(
    shared: Arc<Shared>,
    resolver: Arc<dyn Resolver>,
    upstream: Arc<str>,
    target: Target,
) {
    loop {
        tokio::time::sleep(target.refresh).await;
        let result = resolve_within(&*resolver, &target, RESOLVE_TIMEOUT).await;
        let mut entries = shared.lock();
        let Some(entry) = entries
            .get_mut(&upstream)
            .filter(|e| e.membership.target == target)
        else {
            return;
        };
        let m = &mut entry.membership;
        let old = m.addrs.clone();
        let was_failing = m.last_error.is_some();
        if let Err(why) = &result
            && !was_failing
        {
            tracing::warn!(upstream = %upstream, dns_name = %target.dns_name, error = %why,
                members = old.len(), "DNS resolution failed; keeping the last good members");
        }
        if m.record(result) {
            let (added, removed) = diff(&old, &m.addrs);
            tracing::info!(upstream = %upstream, dns_name = %target.dns_name,
                ?added, ?removed, members = m.addrs.len(), "DNS members changed");
            drop(entries);
            shared.changed.notify_one();
        } else if was_failing && m.last_error.is_none() {
            tracing::info!(upstream = %upstream, dns_name = %target.dns_name, "DNS resolution works again");
        }
    }
}

impl Discovery {
    /// Discovery that asks `resolver`.
    pub fn new(resolver: Arc<dyn Resolver>) -> Self {
        Self {
            resolver,
            shared: Arc::new(Shared {
                entries: Mutex::new(HashMap::new()),
                changed: Notify::new(),
            }),
        }
    }

    /// The members to compile `upstreams` with: for names already followed,
    /// the last good set; new names (or changed name/port) are resolved now,
    /// all at once, each within [`PRIME_TIMEOUT`]. Changes nothing here:
    /// [`reconcile`](Self::reconcile) adopts the result once the configuration
    /// is accepted.
    pub async fn prepare(&self, upstreams: &[Upstream]) -> Members {
        let mut members = Members::default();
        let mut fresh = Vec::new();
        {
            let entries = self.shared.lock();
            for u in upstreams {
                let Some(d) = &u.discovery else { continue };
                let target = Target::from_proto(d);
                match entries.get(u.name.as_str()) {
                    Some(e) if e.membership.target.same_members(&target) => {
                        let mut m = e.membership.clone();
                        m.target = target;
                        members.0.insert(u.name.as_str().into(), m);
                    }
                    _ => fresh.push((u.name.as_str(), target)),
                }
            }
        }
        let resolver = &*self.resolver;
        let answers = join_all(fresh.into_iter().map(|(name, target)| async move {
            let result = resolve_within(resolver, &target, PRIME_TIMEOUT).await;
            if let Err(why) = &result {
                tracing::warn!(upstream = %name, dns_name = %target.dns_name, error = %why,
                    "DNS resolution failed; the upstream has no members until it succeeds");
            }
            let mut m = Membership::empty(target);
            m.record(result);
            (name, m)
        }))
        .await;
        for (name, m) in answers {
            members.0.insert(name.into(), m);
        }
        members
    }

    /// Follows exactly the discovering ones of `upstreams` (a snapshot just published,
    /// compiled with `members`): starts a refresh task for each new one, stops
    /// those of upstreams that left or changed their discovery settings. Must
    /// run inside a Tokio runtime.
    pub fn reconcile(&self, upstreams: &[Arc<UpstreamEntry>], members: &Members) {
        let mut entries = self.shared.lock();
        let wanted: HashMap<&str, &Target> = upstreams
            .iter()
            .filter_map(|u| u.discovery.as_ref().map(|t| (&*u.name, t)))
            .collect();
        entries.retain(|name, e| {
            let keep = wanted.get(&**name) == Some(&&e.membership.target);
            if !keep {
                e.task.abort();
                tracing::debug!(upstream = %name, "DNS discovery task stopped");
            }
            keep
        });
        for (name, target) in wanted {
            if entries.contains_key(name) {
                continue;
            }
            let membership = members
                .get(name)
                .filter(|m| m.target.same_members(target))
                .map_or_else(
                    || Membership::empty(target.clone()),
                    |m| Membership {
                        target: target.clone(),
                        ..m.clone()
                    },
                );
            let name: Arc<str> = name.into();
            let task = tokio::spawn(refresh(
                self.shared.clone(),
                self.resolver.clone(),
                name.clone(),
                target.clone(),
            ));
            entries.insert(name, Entry { membership, task });
        }
    }

    /// The last good member sets of every followed upstream.
    pub fn members(&self) -> Members {
        Members(
            self.shared
                .lock()
                .iter()
                .map(|(name, e)| (name.clone(), e.membership.clone()))
                .collect(),
        )
    }

    /// Waits until a refresh has changed a member set (a change made while
    /// nobody waits is not lost: the next call returns at once).
    pub async fn changed(&self) {
        self.shared.changed.notified().await;
    }

    /// Number of running refresh tasks.
    pub fn task_count(&self) -> usize {
        self.shared
            .lock()
            .values()
            .filter(|e| !e.task.is_finished())
            .count()
    }

    /// Stops every refresh task and forgets every member set.
    pub fn stop(&self) {
        for (_, e) in self.shared.lock().drain() {
            e.task.abort();
        }
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests;
