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
}

impl Ports {
    /// The fixed defaults: gateways 8080, 8081…, ops 9901, 9902…, control
    /// plane 50051, auth 4000, redis 6390 (not 6379, to leave a system Redis
    /// alone), mocks 7001–7003.
    pub fn fixed(data_planes: usize) -> Self {
        let n = u16::try_from(data_planes).unwrap_or(u16::MAX);
        Ports {
            redis: 6390,
            control_plane: 50051,
            auth: 4000,
            users_1: 7001,
            orders_1: 7002,
            orders_2: 7003,
            gateways: (0..n).map(|i| 8080 + i).collect(),
            gateway_admins: (0..n).map(|i| 9901 + i).collect(),
        }
    }

    /// Free ports chosen by the OS. All probe sockets are held open until
    /// every port is chosen, so the ports are distinct.
    pub fn ephemeral(data_planes: usize) -> Result<Self, StackError> {
        let count = 6 + 2 * data_planes;
        let listeners = (0..count)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StackError::io("picking free ports"))?;
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
            gateways: ports[6..6 + data_planes].to_vec(),
            gateway_admins: ports[6 + data_planes..].to_vec(),
        })
    }

    /// Every port with what it is for.
    pub fn all(&self) -> Vec<(u16, String)> {
        let mut all = vec![
            (self.redis, "redis".to_owned()),
            (self.control_plane, "control-plane".to_owned()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn fixed_defaults() {
        let p = Ports::fixed(3);
        assert_eq!(p.gateways, vec![8080, 8081, 8082]);
        assert_eq!(p.gateway_admins, vec![9901, 9902, 9903]);
        assert_eq!(p.control_plane, 50051);
        assert_eq!((p.users_1, p.orders_1, p.orders_2), (7001, 7002, 7003));
    }

    #[test]
    fn ephemeral_ports_are_distinct() {
        let p = Ports::ephemeral(3).unwrap();
        let all = p.all();
        assert_eq!(all.len(), 12);
        let distinct: HashSet<u16> = all.iter().map(|(p, _)| *p).collect();
        assert_eq!(distinct.len(), 12);
        assert!(p.ensure_free().is_ok());
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
