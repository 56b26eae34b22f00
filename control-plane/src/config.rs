//! The content of one configuration (routes, upstreams, API keys,
//! certificates and JWT issuers) and the mutations operators apply to it. Pure functions: no
//! I/O, no clock (sealing private keys takes random nonces from the OS).

use crate::certificates::{self, CertificateNotes, carry_private_key};
use crate::credentials::carry_secret;
use crate::error::StoreError;
use crate::secrets::{SealedKey, SecretsKey};
use gateway_proto::ValidationError;
use gateway_proto::hash::HashKey;
use gateway_proto::v1::{ApiKey, Certificate, ConfigSnapshot, JwtIssuer, Route, Upstream};
use prost::Message;

/// Routes, upstreams, API keys and certificates of one configuration, each sorted by name.
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
    /// Every TLS certificate (with its private key, in memory only), sorted by name.
    pub certificates: Vec<Certificate>,
    /// Every JWT issuer, sorted by name.
    pub jwt_issuers: Vec<JwtIssuer>,
}

/// Field numbers of the stored encoding: those of `ConfigSnapshot`, plus 11
/// (reserved there) for the sealed private keys and 13 for the sealed
/// upstream signing secrets.
const ROUTES_TAG: u32 = 3;
const UPSTREAMS_TAG: u32 = 4;
const API_KEYS_TAG: u32 = 8;
const CERTIFICATES_TAG: u32 = 10;
const SEALED_KEYS_TAG: u32 = 11;
const JWT_ISSUERS_TAG: u32 = 12;
const SEALED_SIGNING_SECRETS_TAG: u32 = 13;

/// The associated data of an upstream's sealed signing secret: the prefix and
/// the upstream's name. The space keeps it apart from every certificate name,
/// so a sealed private key never opens as a signing secret or the reverse.
const SIGNING_SECRET_OWNER: &str = "upstream ";

/// The stored encoding, decoded: a `ConfigSnapshot`'s lists and the sealed keys.
#[derive(Clone, PartialEq, prost::Message)]
struct Stored {
    #[prost(message, repeated, tag = "3")]
    routes: Vec<Route>,
    #[prost(message, repeated, tag = "4")]
    upstreams: Vec<Upstream>,
    #[prost(message, repeated, tag = "8")]
    api_keys: Vec<ApiKey>,
    #[prost(message, repeated, tag = "10")]
    certificates: Vec<Certificate>,
    #[prost(message, repeated, tag = "11")]
    sealed_keys: Vec<SealedKey>,
    #[prost(message, repeated, tag = "12")]
    jwt_issuers: Vec<JwtIssuer>,
    #[prost(message, repeated, tag = "13")]
    sealed_signing_secrets: Vec<SealedKey>,
}

/// Why stored bytes are not a configuration.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not the protobuf encoding.
    #[error(transparent)]
    Proto(#[from] prost::DecodeError),
    /// A sealed private key that cannot be restored.
    #[error("the private key of certificate \"{name}\" {why}")]
    Sealed {
        /// The certificate.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// A sealed upstream signing secret that cannot be restored.
    #[error("the signing secret of upstream \"{name}\" {why}")]
    SealedSecret {
        /// The upstream.
        name: String,
        /// What is wrong.
        why: String,
    },
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
            certificates: Vec::new(),
            jwt_issuers: Vec::new(),
        }
    }

    /// The same configuration with these API keys (sorted by name).
    pub fn with_api_keys(mut self, mut api_keys: Vec<ApiKey>) -> Self {
        api_keys.sort_by(|a, b| a.name.cmp(&b.name));
        self.api_keys = api_keys;
        self
    }

    /// The same configuration with these certificates (sorted by name).
    pub fn with_certificates(mut self, mut certificates: Vec<Certificate>) -> Self {
        certificates.sort_by(|a, b| a.name.cmp(&b.name));
        self.certificates = certificates;
        self
    }

    /// The same configuration with these JWT issuers (sorted by name).
    pub fn with_jwt_issuers(mut self, mut jwt_issuers: Vec<JwtIssuer>) -> Self {
        jwt_issuers.sort_by(|a, b| a.name.cmp(&b.name));
        self.jwt_issuers = jwt_issuers;
        self
    }

    /// A borrowed view of this configuration.
    pub fn view(&self) -> ConfigRef<'_> {
        ConfigRef {
            routes: &self.routes,
            upstreams: &self.upstreams,
            api_keys: &self.api_keys,
            certificates: &self.certificates,
            jwt_issuers: &self.jwt_issuers,
        }
    }

    /// The stored encoding: a `ConfigSnapshot` holding only routes, upstreams,
    /// API keys and certificates, plus (field 11) each certificate's private
    /// key and (field 13) each upstream's `identity_signing_secret`, sealed
    /// with `secrets` ([`SecretsKey::seal`]). Certificates and upstreams are
    /// written without them, so no plaintext key or signing secret reaches the
    /// database. API key hashes are stored as they are.
    ///
    /// A private key or a signing secret without a `secrets` key is refused
    /// (`NoSecretsKey`).
    pub fn encode(&self, secrets: Option<&SecretsKey>) -> Result<Vec<u8>, StoreError> {
        let mut sealed = Vec::new();
        for c in self
            .certificates
            .iter()
            .filter(|c| !c.private_key_pem.is_empty())
        {
            let secrets = secrets.ok_or(StoreError::NoSecretsKey)?;
            sealed.push(secrets.seal(&c.name, c.private_key_pem.as_bytes()));
        }
        let mut sealed_signing = Vec::new();
        for u in self
            .upstreams
            .iter()
            .filter(|u| !u.identity_signing_secret.is_empty())
        {
            let secrets = secrets.ok_or(StoreError::NoSecretsKey)?;
            let owner = format!("{SIGNING_SECRET_OWNER}{}", u.name);
            sealed_signing.push(secrets.seal(&owner, u.identity_signing_secret.as_bytes()));
        }
        // Encode through a borrowed view so 10,000 routes are not cloned just to be written.
        let mut buf = Vec::with_capacity(self.encoded_len());
        for r in &self.routes {
            prost::encoding::message::encode(ROUTES_TAG, r, &mut buf);
        }
        for u in &self.upstreams {
            if u.identity_signing_secret.is_empty() {
                prost::encoding::message::encode(UPSTREAMS_TAG, u, &mut buf);
            } else {
                let without_secret = Upstream {
                    identity_signing_secret: String::new(),
                    ..u.clone()
                };
                prost::encoding::message::encode(UPSTREAMS_TAG, &without_secret, &mut buf);
            }
        }
        for k in &self.api_keys {
            prost::encoding::message::encode(API_KEYS_TAG, k, &mut buf);
        }
        for c in &self.certificates {
            let without_key = Certificate {
                private_key_pem: String::new(),
                ..c.clone()
            };
            prost::encoding::message::encode(CERTIFICATES_TAG, &without_key, &mut buf);
        }
        for k in &sealed {
            prost::encoding::message::encode(SEALED_KEYS_TAG, k, &mut buf);
        }
        for i in &self.jwt_issuers {
            prost::encoding::message::encode(JWT_ISSUERS_TAG, i, &mut buf);
        }
        for k in &sealed_signing {
            prost::encoding::message::encode(SEALED_SIGNING_SECRETS_TAG, k, &mut buf);
        }
        Ok(buf)
    }

    fn encoded_len(&self) -> usize {
        prost::encoding::message::encoded_len_repeated(ROUTES_TAG, &self.routes)
            + prost::encoding::message::encoded_len_repeated(UPSTREAMS_TAG, &self.upstreams)
            + prost::encoding::message::encoded_len_repeated(API_KEYS_TAG, &self.api_keys)
            + prost::encoding::message::encoded_len_repeated(CERTIFICATES_TAG, &self.certificates)
            + prost::encoding::message::encoded_len_repeated(JWT_ISSUERS_TAG, &self.jwt_issuers)
    }

    /// Decodes bytes written by [`Config::encode`], opening each sealed
    /// private key and signing secret with `secrets`. (Rows written before
    /// signing secrets were sealed hold them in the upstream itself; they
    /// decode as they are.)
    pub fn decode(bytes: &[u8], secrets: Option<&SecretsKey>) -> Result<Self, DecodeError> {
        let s = Stored::decode(bytes)?;
        let mut config = Config::new(s.routes, s.upstreams)
            .with_api_keys(s.api_keys)
            .with_certificates(s.certificates)
            .with_jwt_issuers(s.jwt_issuers);
        for sealed in &s.sealed_keys {
            let fail = |why: &str| DecodeError::Sealed {
                name: sealed.name.clone(),
                why: why.to_owned(),
            };
            let secrets = secrets.ok_or_else(|| fail("is sealed, and no secrets key was given"))?;
            let plain = secrets.open(sealed).map_err(|e| fail(&e.to_string()))?;
            let pem = String::from_utf8(plain).map_err(|_| fail("is not text"))?;
            let i = config
                .certificates
                .binary_search_by(|c| c.name.cmp(&sealed.name))
                .map_err(|_| fail("belongs to no stored certificate"))?;
            config.certificates[i].private_key_pem = pem;
        }
        for sealed in &s.sealed_signing_secrets {
            let name = sealed
                .name
                .strip_prefix(SIGNING_SECRET_OWNER)
                .unwrap_or(&sealed.name);
            let fail = |why: &str| DecodeError::SealedSecret {
                name: name.to_owned(),
                why: why.to_owned(),
            };
            if !sealed.name.starts_with(SIGNING_SECRET_OWNER) {
                return Err(fail("is not sealed for an upstream"));
            }
            let secrets = secrets.ok_or_else(|| fail("is sealed, and no secrets key was given"))?;
            let plain = secrets.open(sealed).map_err(|e| fail(&e.to_string()))?;
            let secret = String::from_utf8(plain).map_err(|_| fail("is not text"))?;
            let i = config
                .upstreams
                .binary_search_by(|u| u.name.as_str().cmp(name))
                .map_err(|_| fail("belongs to no stored upstream"))?;
            config.upstreams[i].identity_signing_secret = secret;
        }
        Ok(config)
    }

    /// The content hash: [`gateway_proto::config_hash`] under the store's
    /// hash key (secrets replaced by keyed digests, so the hash shown to
    /// viewers reveals nothing about them, yet changes when one changes).
    pub fn hash(&self, key: &HashKey) -> String {
        gateway_proto::config_hash_with_issuers(
            &self.routes,
            &self.upstreams,
            &self.api_keys,
            &self.certificates,
            &self.jwt_issuers,
            key,
        )
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

    /// The certificate with this name.
    pub fn certificate(&self, name: &str) -> Option<&Certificate> {
        self.view().certificate(name)
    }

    /// Validates the whole configuration with the rules data planes also
    /// apply, reporting every problem of every part, and fills each
    /// certificate's output fields from its parsed leaf. Returns what was
    /// learnt of each certificate, in order.
    pub fn validate(&mut self) -> Result<Vec<CertificateNotes>, StoreError> {
        let mut problems = Vec::new();
        // The typed form is the data planes'; the control plane stores the messages.
        if let Err(e) = gateway_proto::validate_config(&self.routes, &self.upstreams) {
            problems.extend(e.problems);
        }
        if let Err(e) = gateway_proto::validate::validate_api_keys(&self.api_keys) {
            problems.extend(e.problems);
        }
        if let Err(e) =
            gateway_proto::validate::validate_jwt_issuers(&self.jwt_issuers, &self.routes)
        {
            problems.extend(e.problems);
        }
        if let Err(e) = gateway_proto::validate::validate_client_certificates(
            &self.upstreams,
            &self.certificates,
        ) {
            problems.extend(e.problems);
        }
        let notes: Vec<CertificateNotes> =
            match gateway_proto::validate::validate_certificates(&self.certificates) {
                Ok(specs) => specs.iter().map(CertificateNotes::from).collect(),
                Err(e) => {
                    problems.extend(e.problems);
                    Vec::new()
                }
            };
        if !problems.is_empty() {
            return Err(ValidationError { problems }.into());
        }
        for (c, n) in self.certificates.iter_mut().zip(&notes) {
            n.fill(c);
        }
        Ok(notes)
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
    /// Every certificate, sorted by name.
    pub certificates: &'a [Certificate],
    /// Every JWT issuer, sorted by name.
    pub jwt_issuers: &'a [JwtIssuer],
}

impl<'a> From<&'a ConfigSnapshot> for ConfigRef<'a> {
    /// The content of a snapshot the store produced (always sorted by name).
    fn from(s: &'a ConfigSnapshot) -> Self {
        ConfigRef {
            routes: &s.routes,
            upstreams: &s.upstreams,
            api_keys: &s.api_keys,
            certificates: &s.certificates,
            jwt_issuers: &s.jwt_issuers,
        }
    }
}

impl<'a> ConfigRef<'a> {
    /// An owned copy.
    pub fn to_config(self) -> Config {
        Config {
            routes: self.routes.to_vec(),
            upstreams: self.upstreams.to_vec(),
            api_keys: self.api_keys.to_vec(),
            certificates: self.certificates.to_vec(),
            jwt_issuers: self.jwt_issuers.to_vec(),
        }
    }

    fn upstream(&self, name: &str) -> Option<&'a Upstream> {
        self.upstreams
            .binary_search_by(|u| u.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.upstreams[i])
    }

    fn certificate(&self, name: &str) -> Option<&'a Certificate> {
        self.certificates
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.certificates[i])
    }

    /// `new`'s content with this configuration's credentials: its API keys,
    /// each upstream's signing secret resolved by [`carry_secret`] and each
    /// certificate's private key by [`carry_private_key`], against the
    /// resource of the same name here.
    fn keep_credentials(&self, mut new: Config) -> Result<Config, StoreError> {
        for u in &mut new.upstreams {
            carry_secret(u, self.upstream(&u.name))?;
        }
        for c in &mut new.certificates {
            certificates::prepare(c);
            carry_private_key(c, self.certificate(&c.name))?;
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
    /// Replace everything (`ApplyConfig`). An empty certificate list keeps
    /// the current certificates (clients that send none, or predate them,
    /// never remove any); a non-empty one replaces them all.
    Replace(Config),
    /// `ApplyConfig` with `clear_certificates`: replace everything and remove
    /// every certificate (refused when the configuration lists any).
    ReplaceClearingCertificates(Config),
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
    /// Create or replace the certificate of that name.
    UpsertCertificate(Certificate),
    /// Remove the certificate of that name.
    DeleteCertificate(String),
    /// Create or replace the JWT issuer of that name.
    UpsertJwtIssuer(JwtIssuer),
    /// Remove the JWT issuer of that name; refused while a route names it.
    DeleteJwtIssuer(String),
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
            Mutation::Replace(mut config) => {
                if config.certificates.is_empty() {
                    config.certificates = current.certificates.to_vec();
                }
                if config.jwt_issuers.is_empty() {
                    config.jwt_issuers = current.jwt_issuers.to_vec();
                }
                current.keep_credentials(config)
            }
            Mutation::ReplaceClearingCertificates(mut config) => {
                if config.jwt_issuers.is_empty() {
                    config.jwt_issuers = current.jwt_issuers.to_vec();
                }
                if !config.certificates.is_empty() {
                    return Err(StoreError::Invalid(
                        "certificates and clear_certificates cannot both be set".into(),
                    ));
                }
                current.keep_credentials(config)
            }
            // A rollback never brings back a credential: the old version's keys
            // and secrets are dropped before the current ones are carried over.
            // Certificates are configuration: the old ones come back with
            // their private keys, as they were.
            Mutation::Rollback {
                content: mut config,
                ..
            } => {
                for u in &mut config.upstreams {
                    u.identity_signing_secret.clear();
                }
                current.keep_credentials(config)
            }
            Mutation::UpsertCertificate(mut certificate) => {
                certificates::prepare(&mut certificate);
                let existing = current.certificate(&certificate.name);
                carry_private_key(&mut certificate, existing)?;
                let mut c = current.to_config();
                match c
                    .certificates
                    .binary_search_by(|x| x.name.cmp(&certificate.name))
                {
                    Ok(i) => c.certificates[i] = certificate,
                    Err(i) => c.certificates.insert(i, certificate),
                }
                Ok(c)
            }
            Mutation::DeleteCertificate(name) => {
                let i = current
                    .certificates
                    .binary_search_by(|c| c.name.cmp(&name))
                    .map_err(|_| {
                        StoreError::NotFound(format!("certificate \"{name}\" not found"))
                    })?;
                let mut c = current.to_config();
                c.certificates.remove(i);
                Ok(c)
            }
            Mutation::UpsertJwtIssuer(issuer) => Ok(crate::jwt_issuers::upsert(current, issuer)),
            Mutation::DeleteJwtIssuer(name) => crate::jwt_issuers::delete(current, &name),
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
            Mutation::Replace(_) | Mutation::ReplaceClearingCertificates(_) => None,
            Mutation::Rollback { version, .. } => Some(format!("rollback to version {version}")),
            Mutation::CreateApiKey(k) => Some(format!("create api key \"{}\"", k.name)),
            Mutation::RevokeApiKey(n) => Some(format!("revoke api key \"{n}\"")),
            Mutation::UpsertCertificate(c) => Some(format!("upsert certificate \"{}\"", c.name)),
            Mutation::DeleteCertificate(n) => Some(format!("delete certificate \"{n}\"")),
            Mutation::UpsertJwtIssuer(i) => Some(format!("upsert jwt issuer \"{}\"", i.name)),
            Mutation::DeleteJwtIssuer(n) => Some(format!("delete jwt issuer \"{n}\"")),
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
                ..Default::default()
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
        assert_eq!(a.encode(None).unwrap(), b.encode(None).unwrap());
        let key = HashKey::from_bytes([5; 32]);
        assert_eq!(a.hash(&key), b.hash(&key));
        // No secret: the hash is the SHA-256 of the stored bytes.
        assert_eq!(
            a.hash(&key),
            gateway_proto::hash::plain_sha256(&a.encode(None).unwrap())
        );
        assert_eq!(Config::decode(&a.encode(None).unwrap(), None).unwrap(), a);
        assert_eq!(Config::default().encode(None).unwrap(), Vec::<u8>::new());
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
        assert_eq!(Config::decode(&c.encode(None).unwrap(), None).unwrap(), c);
        // A key hash is a secret: masked in the content hash.
        let key = HashKey::from_bytes([5; 32]);
        assert_ne!(
            c.hash(&key),
            gateway_proto::hash::plain_sha256(&c.encode(None).unwrap())
        );
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
