//! The content of one configuration (routes and upstreams) and the mutations
//! operators apply to it. Pure functions: no I/O, no clock.

use crate::credentials::carry_secret;
use crate::error::StoreError;
use gateway_proto::hash::HashKey;
use gateway_proto::v1::{ApiKey, ConfigSnapshot, Route, Upstream};
use prost::Message;

/// Routes, upstreams and API keys of one configuration, each sorted by name.
///
/// Sorted order makes the encoding canonical: the same content always gives the
/// same bytes. The content hash ([`Config::hash`]) is taken over the same
/// encoding with every secret replaced by a keyed digest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// Every route, sorted by name.
    pub routes: Vec<Route>,
    /// Every upstream, sorted by name.
    pub upstreams: Vec<Upstream>,
    /// Every API key (with its hash), sorted by name.
    pub api_keys: Vec<ApiKey>,
}

impl Config {
    /// Builds a configuration, sorting both lists by name.
    pub fn new(mut routes: Vec<Route>, mut upstreams: Vec<Upstream>) -> Self {
        routes.sort_by(|a, b| a.name.cmp(&b.name));
        upstreams.sort_by(|a, b| a.name.cmp(&b.name));
        Config {
            routes,
            upstreams,
            api_keys: Vec::new(),
        }
    }

    /// The same configuration with these API keys (sorted by name).
    pub fn with_api_keys(mut self, mut api_keys: Vec<ApiKey>) -> Self {
        api_keys.sort_by(|a, b| a.name.cmp(&b.name));
        self.api_keys = api_keys;
        self
    }

    /// A borrowed view of this configuration.
    pub fn view(&self) -> ConfigRef<'_> {
        ConfigRef {
            routes: &self.routes,
            upstreams: &self.upstreams,
            api_keys: &self.api_keys,
        }
    }

    /// The canonical encoding: a `ConfigSnapshot` holding only routes, upstreams and API keys.
    /// This is what the database stores (secrets included).
    pub fn encode(&self) -> Vec<u8> {
        // Encode through a borrowed view so 10,000 routes are not cloned just to be written.
        let mut buf = Vec::with_capacity(self.encoded_len());
        for r in &self.routes {
            prost::encoding::message::encode(3, r, &mut buf);
        }
        for u in &self.upstreams {
            prost::encoding::message::encode(4, u, &mut buf);
        }
        for k in &self.api_keys {
            prost::encoding::message::encode(8, k, &mut buf);
        }
        buf
    }

    fn encoded_len(&self) -> usize {
        prost::encoding::message::encoded_len_repeated(3, &self.routes)
            + prost::encoding::message::encoded_len_repeated(4, &self.upstreams)
            + prost::encoding::message::encoded_len_repeated(8, &self.api_keys)
    }

    /// Decodes bytes written by [`Config::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
        let s = ConfigSnapshot::decode(bytes)?;
        Ok(Config::new(s.routes, s.upstreams).with_api_keys(s.api_keys))
    }

    /// The content hash: [`gateway_proto::config_hash`] under the store's
    /// hash key (secrets replaced by keyed digests, so the hash shown to
    /// viewers reveals nothing about them, yet changes when one changes).
    pub fn hash(&self, key: &HashKey) -> String {
        gateway_proto::config_hash(&self.routes, &self.upstreams, &self.api_keys, key)
    }

    /// The route with this name.
    pub fn route(&self, name: &str) -> Option<&Route> {
        self.routes
            .binary_search_by(|r| r.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.routes[i])
    }

    /// The upstream with this name.
    pub fn upstream(&self, name: &str) -> Option<&Upstream> {
        self.upstreams
            .binary_search_by(|u| u.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.upstreams[i])
    }

    /// Validates the whole configuration with the rules data planes also apply.
    pub fn validate(&self) -> Result<(), StoreError> {
        // The typed form is the data planes'; the control plane stores the messages.
        gateway_proto::validate_config(&self.routes, &self.upstreams)?;
        gateway_proto::validate::validate_api_keys(&self.api_keys)?;
        Ok(())
    }
}

/// A borrowed configuration, e.g. the content of a stored snapshot, so a
/// 10,000-route configuration need not be copied just to be compared.
#[derive(Clone, Copy, Debug)]
pub struct ConfigRef<'a> {
    /// Every route, sorted by name.
    pub routes: &'a [Route],
    /// Every upstream, sorted by name.
    pub upstreams: &'a [Upstream],
    /// Every API key, sorted by name.
    pub api_keys: &'a [ApiKey],
}

impl<'a> From<&'a ConfigSnapshot> for ConfigRef<'a> {
    /// The content of a snapshot the store produced (always sorted by name).
    fn from(s: &'a ConfigSnapshot) -> Self {
        ConfigRef {
            routes: &s.routes,
            upstreams: &s.upstreams,
            api_keys: &s.api_keys,
        }
    }
}

impl ConfigRef<'_> {
    /// An owned copy.
    pub fn to_config(self) -> Config {
        Config {
            routes: self.routes.to_vec(),
            upstreams: self.upstreams.to_vec(),
            api_keys: self.api_keys.to_vec(),
        }
    }

    fn upstream(&self, name: &str) -> Option<&Upstream> {
        self.upstreams
            .binary_search_by(|u| u.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.upstreams[i])
    }

    /// `new`'s routes and upstreams with this configuration's credentials:
    /// its API keys, and each upstream's signing secret resolved by
    /// [`carry_secret`] against the upstream of the same name here.
    fn keep_credentials(&self, mut new: Config) -> Result<Config, StoreError> {
        for u in &mut new.upstreams {
            carry_secret(u, self.upstream(&u.name))?;
        }
        new.api_keys = self.api_keys.to_vec();
        Ok(new)
    }
}

/// One change an operator asks for.
// A `Route` (with its policies) is large next to a name; one mutation exists
// per admin call, so boxing it would add noise and save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Create or replace the route of that name.
    UpsertRoute(Route),
    /// Remove the route of that name.
    DeleteRoute(String),
    /// Create or replace the upstream of that name.
    UpsertUpstream(Upstream),
    /// Remove the upstream of that name; refused while a route uses it.
    DeleteUpstream(String),
    /// Replace everything (`ApplyConfig`).
    Replace(Config),
    /// Make an old version's content current again (`RollbackConfig`).
    Rollback {
        /// The old version.
        version: u64,
        /// Its content.
        content: Config,
    },
    /// Add an API key (its hash); refused when the name is taken.
    CreateApiKey(ApiKey),
    /// Remove the API key of that name.
    RevokeApiKey(String),
}

impl Mutation {
    /// The configuration this mutation produces from `current`, not yet validated.
    ///
    /// Fails with `NotFound` for a delete of a missing name and with `Invalid`
    /// when an upstream to delete is still used by routes.
    pub fn apply(self, current: ConfigRef<'_>) -> Result<Config, StoreError> {
        // Edits work on a copy of the current configuration; replacing needs none.
        match self {
            Mutation::UpsertRoute(route) => {
                let mut c = current.to_config();
                match c.routes.binary_search_by(|r| r.name.cmp(&route.name)) {
                    Ok(i) => c.routes[i] = route,
                    Err(i) => c.routes.insert(i, route),
                }
                Ok(c)
            }
            Mutation::DeleteRoute(name) => {
                let i = current
                    .routes
                    .binary_search_by(|r| r.name.cmp(&name))
                    .map_err(|_| StoreError::NotFound(format!("route \"{name}\" not found")))?;
                let mut c = current.to_config();
                c.routes.remove(i);
                Ok(c)
            }
            Mutation::UpsertUpstream(mut upstream) => {
                let existing = current.upstream(&upstream.name);
                carry_secret(&mut upstream, existing)?;
                let mut c = current.to_config();
                match c.upstreams.binary_search_by(|u| u.name.cmp(&upstream.name)) {
                    Ok(i) => c.upstreams[i] = upstream,
                    Err(i) => c.upstreams.insert(i, upstream),
                }
                Ok(c)
            }
            Mutation::DeleteUpstream(name) => {
                let i = current
                    .upstreams
                    .binary_search_by(|u| u.name.cmp(&name))
                    .map_err(|_| StoreError::NotFound(format!("upstream \"{name}\" not found")))?;
                let users: Vec<String> = current
                    .routes
                    .iter()
                    .filter(|r| {
                        r.upstream == name
                            || r.aggregate
                                .iter()
                                .flat_map(|a| &a.parts)
                                .any(|p| p.upstream == name)
                    })
                    .map(|r| format!("\"{}\"", r.name))
                    .collect();
                if !users.is_empty() {
                    return Err(StoreError::Invalid(format!(
                        "upstream \"{name}\": still used by route{} {}; delete or change {} first",
                        if users.len() == 1 { "" } else { "s" },
                        users.join(", "),
                        if users.len() == 1 { "it" } else { "them" },
                    )));
                }
                let mut c = current.to_config();
                c.upstreams.remove(i);
                Ok(c)
            }
            // Credentials are not routing configuration: the current API keys
            // stay, and signing secrets carry over by upstream name.
            Mutation::Replace(config) => current.keep_credentials(config),
            // A rollback never brings back a credential: the old version's keys
            // and secrets are dropped before the current ones are carried over.
            Mutation::Rollback {
                content: mut config,
                ..
            } => {
                for u in &mut config.upstreams {
                    u.identity_signing_secret.clear();
                }
                current.keep_credentials(config)
            }
            Mutation::CreateApiKey(key) => {
                let mut c = current.to_config();
                match c.api_keys.binary_search_by(|k| k.name.cmp(&key.name)) {
                    Ok(_) => Err(StoreError::AlreadyExists(format!(
                        "api key \"{}\" already exists",
                        key.name
                    ))),
                    Err(i) => {
                        c.api_keys.insert(i, key);
                        Ok(c)
                    }
                }
            }
            Mutation::RevokeApiKey(name) => {
                let i = current
                    .api_keys
                    .binary_search_by(|k| k.name.cmp(&name))
                    .map_err(|_| StoreError::NotFound(format!("api key \"{name}\" not found")))?;
                let mut c = current.to_config();
                c.api_keys.remove(i);
                Ok(c)
            }
        }
    }

    /// The one-line summary of the commit, unless it depends on the changes
    /// (`None` for `Replace`, whose summary counts them: `apply: +2 routes, ~1 upstream`).
    pub fn fixed_summary(&self) -> Option<String> {
        match self {
            Mutation::UpsertRoute(r) => Some(format!("upsert route \"{}\"", r.name)),
            Mutation::DeleteRoute(n) => Some(format!("delete route \"{n}\"")),
            Mutation::UpsertUpstream(u) => Some(format!("upsert upstream \"{}\"", u.name)),
            Mutation::DeleteUpstream(n) => Some(format!("delete upstream \"{n}\"")),
            Mutation::Replace(_) => None,
            Mutation::Rollback { version, .. } => Some(format!("rollback to version {version}")),
            Mutation::CreateApiKey(k) => Some(format!("create api key \"{}\"", k.name)),
            Mutation::RevokeApiKey(n) => Some(format!("revoke api key \"{n}\"")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::Instance;

    fn route(name: &str, upstream: &str) -> Route {
        Route {
            name: name.into(),
            path_prefix: format!("/{name}"),
            upstream: upstream.into(),
            ..Default::default()
        }
    }

    fn upstream(name: &str) -> Upstream {
        Upstream {
            name: name.into(),
            instances: vec![Instance {
                id: "i1".into(),
                url: "http://127.0.0.1:8000".into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn encoding_is_canonical_and_hash_matches_the_plain_one_without_secrets() {
        let a = Config::new(
            vec![route("b", "u"), route("a", "u")],
            vec![upstream("v"), upstream("u")],
        );
        let b = Config::new(
            vec![route("a", "u"), route("b", "u")],
            vec![upstream("u"), upstream("v")],
        );
        assert_eq!(a.encode(), b.encode());
        let key = HashKey::from_bytes([5; 32]);
        assert_eq!(a.hash(&key), b.hash(&key));
        // No secret: the hash is the SHA-256 of the stored bytes.
        assert_eq!(a.hash(&key), gateway_proto::hash::plain_sha256(&a.encode()));
        assert_eq!(Config::decode(&a.encode()).unwrap(), a);
        assert_eq!(Config::default().encode(), Vec::<u8>::new());
    }

    #[test]
    fn upsert_inserts_sorted_and_replaces_by_name() {
        let c = Config::new(vec![route("b", "u")], vec![upstream("u")]);
        let c = Mutation::UpsertRoute(route("a", "u"))
            .apply(c.view())
            .unwrap();
        let c = Mutation::UpsertRoute(route("c", "u"))
            .apply(c.view())
            .unwrap();
        let names: Vec<_> = c.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        let mut changed = route("b", "u");
        changed.timeout_ms = 5;
        let c = Mutation::UpsertRoute(changed).apply(c.view()).unwrap();
        assert_eq!(c.routes.len(), 3);
        assert_eq!(c.route("b").unwrap().timeout_ms, 5);
    }

    fn api_key(name: &str) -> ApiKey {
        ApiKey {
            name: name.into(),
            subject: "s".into(),
            role: "r".into(),
            key_sha256: crate::credentials::key_sha256(name),
            ..Default::default()
        }
    }

    #[test]
    fn keys_are_created_once_revoked_by_name_and_kept_by_replace_and_rollback() {
        let c = Config::new(vec![], vec![upstream("u")]);
        let c = Mutation::CreateApiKey(api_key("b"))
            .apply(c.view())
            .unwrap();
        let c = Mutation::CreateApiKey(api_key("a"))
            .apply(c.view())
            .unwrap();
        let names: Vec<_> = c.api_keys.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(matches!(
            Mutation::CreateApiKey(api_key("a")).apply(c.view()),
            Err(StoreError::AlreadyExists(_))
        ));
        assert!(matches!(
            Mutation::RevokeApiKey("x".into()).apply(c.view()),
            Err(StoreError::NotFound(_))
        ));
        // Replace and rollback bring their routes and upstreams, never keys.
        let old = Config::new(vec![], vec![upstream("v")]).with_api_keys(vec![api_key("z")]);
        let replaced = Mutation::Replace(old.clone()).apply(c.view()).unwrap();
        assert_eq!(replaced.api_keys, c.api_keys);
        assert_eq!(replaced.upstreams[0].name, "v");
        let rolled = Mutation::Rollback {
            version: 1,
            content: old,
        }
        .apply(c.view())
        .unwrap();
        assert_eq!(rolled.api_keys, c.api_keys);
        let c = Mutation::RevokeApiKey("a".into()).apply(c.view()).unwrap();
        assert_eq!(c.api_keys.len(), 1);
        assert_eq!(Config::decode(&c.encode()).unwrap(), c);
        // A key hash is a secret: masked in the content hash.
        let key = HashKey::from_bytes([5; 32]);
        assert_ne!(c.hash(&key), gateway_proto::hash::plain_sha256(&c.encode()));
        let without_keys = Config::new(c.routes.clone(), c.upstreams.clone());
        assert_ne!(c.hash(&key), without_keys.hash(&key));
    }

    #[test]
    fn rollback_keeps_current_secrets_and_drops_old_ones() {
        let mut with_secret = upstream("u");
        with_secret.identity_signing_secret = "current".into();
        let current = Config::new(vec![], vec![with_secret]);
        let mut old_u = upstream("u");
        old_u.identity_signing_secret = "old".into();
        let mut old_v = upstream("v");
        old_v.identity_signing_secret = "old-v".into();
        let old = Config::new(vec![], vec![old_u, old_v]);
        let rolled = Mutation::Rollback {
            version: 1,
            content: old.clone(),
        }
        .apply(current.view())
        .unwrap();
        assert_eq!(
            rolled.upstream("u").unwrap().identity_signing_secret,
            "current"
        );
        assert_eq!(rolled.upstream("v").unwrap().identity_signing_secret, "");
        // ApplyConfig with a secret sets it; without, keeps the current one.
        let applied = Mutation::Replace(old).apply(current.view()).unwrap();
        assert_eq!(
            applied.upstream("u").unwrap().identity_signing_secret,
            "old"
        );
    }

    #[test]
    fn delete_of_a_missing_name_is_not_found() {
        let c = Config::default();
        let e = Mutation::DeleteRoute("x".into())
            .apply(c.view())
            .unwrap_err();
        assert!(matches!(e, StoreError::NotFound(ref m) if m == "route \"x\" not found"));
        let e = Mutation::DeleteUpstream("y".into())
            .apply(c.view())
            .unwrap_err();
        assert!(matches!(e, StoreError::NotFound(ref m) if m == "upstream \"y\" not found"));
    }

    #[test]
    fn delete_of_an_upstream_in_use_names_the_routes() {
        let c = Config::new(
            vec![route("a", "u"), route("b", "u"), route("c", "v")],
            vec![upstream("u"), upstream("v")],
        );
        let e = Mutation::DeleteUpstream("u".into())
            .apply(c.view())
            .unwrap_err();
        match e {
            StoreError::Invalid(m) => {
                assert!(m.contains("\"a\", \"b\""), "{m}");
                assert!(!m.contains("\"c\""), "{m}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let c = Mutation::DeleteRoute("c".into()).apply(c.view()).unwrap();
        let c = Mutation::DeleteUpstream("v".into())
            .apply(c.view())
            .unwrap();
        assert!(c.upstream("v").is_none());
        assert!(c.upstream("u").is_some());
    }

    #[test]
    fn delete_of_an_upstream_used_by_an_aggregate_part_names_the_route() {
        use gateway_proto::v1::{Aggregate, AggregatePart};
        let overview = Route {
            name: "overview".into(),
            path_prefix: "/overview".into(),
            aggregate: Some(Aggregate {
                parts: vec![AggregatePart {
                    name: "p".into(),
                    upstream: "v".into(),
                    path: "/p".into(),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        };
        let c = Config::new(
            vec![route("a", "u"), overview],
            vec![upstream("u"), upstream("v")],
        );
        match Mutation::DeleteUpstream("v".into()).apply(c.view()) {
            Err(StoreError::Invalid(m)) => assert!(m.contains("\"overview\""), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
