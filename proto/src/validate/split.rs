//! Validation of weighted traffic: a route's `split` (with its stickiness and
//! failover settings) and the instances' `weight`.

use std::collections::HashSet;

use super::{HOP_BY_HOP, MAX_HEADER_NAME_LEN, Validator, is_valid_header_name};
use crate::v1::{HashOn, Route, Upstream};

/// Fewest and most entries of a route's `split`.
pub const MIN_SPLIT_TARGETS: usize = 2;
/// Most entries of a route's `split`.
pub const MAX_SPLIT_TARGETS: usize = 16;
/// Largest weight of a split entry.
pub const MAX_SPLIT_WEIGHT: u32 = 10_000;
/// Largest instance weight.
pub const MAX_INSTANCE_WEIGHT: u32 = 1_000;

impl Validator {
    /// The split fields of route `r`; that each upstream exists is checked
    /// with the whole configuration.
    pub(super) fn split(&mut self, who: &str, r: &Route) {
        let hash_on = HashOn::try_from(r.split_hash_on);
        if r.split.is_empty() {
            if r.split_hash_on != 0 || !r.split_hash_header.is_empty() || r.split_fail_closed {
                self.push(format!(
                    "{who}: split_hash_on, split_hash_header and split_fail_closed are only used with split"
                ));
            }
            return;
        }
        if !r.upstream.is_empty() {
            self.push(format!(
                "{who}: upstream must be empty when split is set (split names the upstreams)"
            ));
        }
        if r.aggregate.is_some() {
            self.push(format!(
                "{who}: split is not supported on an aggregate route (each part names its own upstream)"
            ));
        }
        let n = r.split.len();
        if !(MIN_SPLIT_TARGETS..=MAX_SPLIT_TARGETS).contains(&n) {
            self.push(format!(
                "{who}: split must list {MIN_SPLIT_TARGETS} to {MAX_SPLIT_TARGETS} upstreams (got {n})"
            ));
        }
        let mut seen = HashSet::new();
        let mut total = 0u64;
        for (i, t) in r.split.iter().enumerate() {
            if t.upstream.is_empty() {
                self.push(format!("{who}: split[{i}]: upstream is required"));
            } else if !seen.insert(t.upstream.as_str()) {
                self.push(format!(
                    "{who}: split[{i}]: upstream \"{}\" is listed twice",
                    t.upstream
                ));
            }
            if t.weight > MAX_SPLIT_WEIGHT {
                self.push(format!(
                    "{who}: split[{i}]: weight must be at most {MAX_SPLIT_WEIGHT} (got {})",
                    t.weight
                ));
            }
            total += u64::from(t.weight);
        }
        if total == 0 {
            self.push(format!(
                "{who}: split weights add up to 0; at least one must be greater than 0"
            ));
        }
        let header = r.split_hash_header.as_str();
        match hash_on {
            Err(_) => self.push(format!(
                "{who}: split_hash_on: unknown value {}",
                r.split_hash_on
            )),
            Ok(HashOn::Header) if header.is_empty() => self.push(format!(
                "{who}: split_hash_header is required with split_hash_on HASH_ON_HEADER"
            )),
            Ok(HashOn::Header) if !is_valid_header_name(header) => self.push(format!(
                "{who}: split_hash_header \"{header}\" is not a valid header name (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME_LEN})"
            )),
            Ok(HashOn::Header) if HOP_BY_HOP.contains(&header.to_ascii_lowercase().as_str()) => {
                self.push(format!(
                    "{who}: split_hash_header \"{header}\" is a hop-by-hop header, removed before balancing"
                ))
            }
            Ok(HashOn::Header) => {}
            Ok(_) if !header.is_empty() => self.push(format!(
                "{who}: split_hash_header is only used with split_hash_on HASH_ON_HEADER"
            )),
            Ok(_) => {}
        }
    }

    /// The instances' weights of upstream `u`.
    pub(super) fn instance_weights(&mut self, who: &str, u: &Upstream) {
        for inst in &u.instances {
            if inst.weight > MAX_INSTANCE_WEIGHT {
                self.push(format!(
                    "{who}: instance \"{}\": weight must be at most {MAX_INSTANCE_WEIGHT} (0: the default, 1; got {})",
                    inst.id, inst.weight
                ));
            }
        }
    }
}
