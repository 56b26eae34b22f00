//! The ports a stack listens on: free ones picked by the OS, or the fixed
//! defaults people type by hand.

use std::net::{Ipv4Addr, TcpListener};

use crate::error::StackError;

/// Every port of one stack (all on 127.0.0.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports {
    /// Redis.
    pub redis: u16,
    /// Control-plane gRPC.
    pub control_plane: u16,
    /// Control-plane web console.
    pub console: u16,
    /// Auth service HTTP.
    pub auth: u16,
    /// Mock `users-1`.
    pub users_1: u16,
    /// Mock `orders-1`.
    pub orders_1: u16,
    /// Mock `orders-2`.
    pub orders_2: u16,
    /// Proxy listener of each data plane, in order.
    pub gateways: Vec<u16>,
    /// Ops listener of each data plane, in order.
    pub gateway_admins: Vec<u16>,
    /// HTTPS listener of each data plane, in order.
    pub gateways_tls: Vec<u16>,
}

impl Ports {
    /// The fixed defaults: gateways 8080, 8081…, HTTPS 8443, 8444…, ops 9901, 9902…, control
    /// plane 50051, its console 8800, auth 4000, redis 6390 (not 6379, to leave a system Redis
    /// alone), mocks 7001–7003.
    pub fn fixed(data_planes: usize) -> Self {
        let n = u16::try_from(data_planes).unwrap_or(u16::MAX);
        Ports {
            redis: 6390,
            control_plane: 50051,
            console: 8800,
            auth: 4000,
            users_1: 7001,
            orders_1: 7002,
            orders_2: 7003,
            gateways: (0..n).map(|i| 8080 + i).collect(),
            gateway_admins: (0..n).map(|i| 9901 + i).collect(),
            gateways_tls: (0..n).map(|i| 8443 + i).collect(),
        }
    }

    /// Free ports for a stack nobody types by hand (tests, `--json`).
    ///
    /// A port is chosen here and bound later by the process that serves it,
    /// so something else could take it in between. Two things could: an
    /// outgoing connection (the kernel gives those a port from
    /// `ip_local_port_range`, where `bind(0)` also picks) and another stack
    /// starting at the same time. So ports are drawn at random from *below*
    /// that range, where the kernel never hands out ports by itself, are
    /// checked free with a bind (all probe sockets held until every port is
    /// chosen, so they are distinct), and are never handed out twice by one
    /// process. Where the range leaves no room below it, the OS picks (`bind(0)`).
    pub fn ephemeral(data_planes: usize) -> Result<Self, StackError> {
        let count = 7 + 3 * data_planes;
        let listeners = match below_kernel_range(count) {
            Some(listeners) => listeners,
            None => (0..count)
                .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(StackError::io("picking free ports"))?,
        };
        let ports = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StackError::io("picking free ports"))?;
        Ok(Ports {
            redis: ports[0],
            control_plane: ports[1],
            auth: ports[2],
            users_1: ports[3],
            orders_1: ports[4],
            orders_2: ports[5],
            console: ports[6],
            gateways: ports[7..7 + data_planes].to_vec(),
            gateway_admins: ports[7 + data_planes..7 + 2 * data_planes].to_vec(),
            gateways_tls: ports[7 + 2 * data_planes..].to_vec(),
        })
    }

    /// Every port with what it is for.
    pub fn all(&self) -> Vec<(u16, String)> {
        let mut all = vec![
            (self.redis, "redis".to_owned()),
            (self.control_plane, "control-plane".to_owned()),
            (self.console, "control-plane console".to_owned()),
            (self.auth, "auth-service".to_owned()),
            (self.users_1, "users-1".to_owned()),
            (self.orders_1, "orders-1".to_owned()),
            (self.orders_2, "orders-2".to_owned()),
        ];
        for (i, p) in self.gateways.iter().enumerate() {
            all.push((*p, format!("data-plane-{} proxy", i + 1)));
        }
        for (i, p) in self.gateway_admins.iter().enumerate() {
            all.push((*p, format!("data-plane-{} ops", i + 1)));
        }
        for (i, p) in self.gateways_tls.iter().enumerate() {
            all.push((*p, format!("data-plane-{} https", i + 1)));
        }
        all
    }

    /// Fails with the first port something already listens on.
    pub fn ensure_free(&self) -> Result<(), StackError> {
        for (port, what) in self.all() {
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
                return Err(StackError::PortInUse { port, what });
            }
        }
        Ok(())
    }
}

/// One free port, chosen as [`Ports::ephemeral`] chooses (for a single server).
pub fn free_port() -> Result<u16, StackError> {
    let listener = match below_kernel_range(1) {
        Some(mut listeners) => listeners.remove(0),
        None => TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(StackError::io("picking a free port"))?,
    };
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(StackError::io("picking a free port"))
}

/// Lowest port [`Ports::ephemeral`] draws from (below it: well-known
/// services people run by hand).
const DRAW_FROM: u16 = 15_000;

/// `count` listeners on distinct free ports drawn at random from
/// `DRAW_FROM..` the kernel's ephemeral range, none handed out before by this
/// process. `None` when there is no such room (an unusual
/// `ip_local_port_range`) or too few free ports were found.
fn below_kernel_range(count: usize) -> Option<Vec<TcpListener>> {
    use parking_lot::Mutex;
    use std::collections::HashSet;
    use std::hash::{BuildHasher, RandomState};
    use std::sync::OnceLock;

    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();

    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = range.split_whitespace().next()?.parse().ok()?;
    let room = low.checked_sub(DRAW_FROM)?;
    if usize::from(room) < count * 16 {
        return None;
    }
    let mut handed_out = HANDED_OUT.get_or_init(Mutex::default).lock();
    // std's RandomState is randomly keyed: hashing a counter gives random draws without a crate.
    let random = RandomState::new();
    let mut listeners = Vec::with_capacity(count);
    for draw in 0u64..(count as u64 * 64) {
        if listeners.len() == count {
            break;
        }
        let port = DRAW_FROM + (random.hash_one(draw) % u64::from(room)) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            handed_out.insert(port);
            listeners.push(listener);
        }
    }
    (listeners.len() == count).then_some(listeners)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn fixed_defaults() {
        let p = Ports::fixed(3);
        assert_eq!(p.gateways, vec![8080, 8081, 8082]);
        assert_eq!(p.gateway_admins, vec![9901, 9902, 9903]);
        assert_eq!(p.gateways_tls, vec![8443, 8444, 8445]);
        assert_eq!(p.control_plane, 50051);
        assert_eq!(p.console, 8800);
        assert_eq!((p.users_1, p.orders_1, p.orders_2), (7001, 7002, 7003));
    }

    #[test]
    fn ephemeral_ports_are_distinct() {
        let p = Ports::ephemeral(3).unwrap();
        let all = p.all();
        assert_eq!(all.len(), 16);
        let distinct: HashSet<u16> = all.iter().map(|(p, _)| *p).collect();
        assert_eq!(distinct.len(), 16);
        assert!(p.ensure_free().is_ok());
    }

    #[test]
    fn ephemeral_ports_avoid_the_kernel_range_and_never_repeat() {
        let a = Ports::ephemeral(2).unwrap();
        let b = Ports::ephemeral(2).unwrap();
        let a: HashSet<u16> = a.all().iter().map(|(p, _)| *p).collect();
        let b: HashSet<u16> = b.all().iter().map(|(p, _)| *p).collect();
        assert!(a.is_disjoint(&b), "{a:?} {b:?}");
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
        if low >= DRAW_FROM + 1000 {
            assert!(
                a.iter().chain(&b).all(|p| (DRAW_FROM..low).contains(p)),
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn taken_port_is_reported() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let mut p = Ports::ephemeral(1).unwrap();
        p.auth = taken.local_addr().unwrap().port();
        let err = p.ensure_free().unwrap_err();
        assert!(
            matches!(err, StackError::PortInUse { ref what, .. } if what == "auth-service"),
            "{err}"
        );
    }
}
