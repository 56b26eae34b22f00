//! Composition: requests that are more than one forward. [`aggregate`] fans a
//! request out to several upstreams and merges the JSON answers; [`coalesce`]
//! shares one upstream call among identical concurrent requests; [`response_cache`]
//! keeps routes' answers and serves them while fresh; [`websocket`]
//! admits upgrades and runs the byte tunnels; [`mirror`] sends sampled
//! copies to a shadow upstream. Built on [`crate::upstream`].

pub mod aggregate;
pub mod coalesce;
pub mod mirror;
pub mod response_cache;
pub mod websocket;
