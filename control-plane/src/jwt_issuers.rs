//! JWT issuers (`JwtIssuer`): the upsert and delete mutations. Validation is
//! `gateway_proto::validate::validate_jwt_issuers`, run with the rest of the
//! configuration before every commit.

use crate::config::{Config, ConfigRef};
use crate::error::StoreError;
use gateway_proto::v1::JwtIssuer;

/// `current` with `issuer` created, or replacing the one of that name.
pub(crate) fn upsert(current: ConfigRef<'_>, issuer: JwtIssuer) -> Config {
    let mut c = current.to_config();
    match c.jwt_issuers.binary_search_by(|x| x.name.cmp(&issuer.name)) {
        Ok(i) => c.jwt_issuers[i] = issuer,
        Err(i) => c.jwt_issuers.insert(i, issuer),
    }
    c
}

/// `current` without the issuer `name`: `NotFound` when there is none, `Invalid`
/// while routes name it.
pub(crate) fn delete(current: ConfigRef<'_>, name: &str) -> Result<Config, StoreError> {
    let i = current
        .jwt_issuers
        .binary_search_by(|x| x.name.as_str().cmp(name))
        .map_err(|_| StoreError::NotFound(format!("jwt issuer \"{name}\" not found")))?;
    let users: Vec<String> = current
        .routes
        .iter()
        .filter(|r| r.jwt_issuers.iter().any(|n| n == name))
        .map(|r| format!("\"{}\"", r.name))
        .collect();
    if !users.is_empty() {
        return Err(StoreError::Invalid(format!(
            "jwt issuer \"{name}\": still named by route{} {}; change {} first",
            if users.len() == 1 { "" } else { "s" },
            users.join(", "),
            if users.len() == 1 { "it" } else { "them" },
        )));
    }
    let mut c = current.to_config();
    c.jwt_issuers.remove(i);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::{AuthMode, Route};

    fn issuer(name: &str) -> JwtIssuer {
        JwtIssuer {
            name: name.into(),
            issuer: format!("https://{name}.example.com/"),
            jwks_url: format!("https://{name}.example.com/jwks"),
            audiences: vec!["gateway".into()],
            ..Default::default()
        }
    }

    #[test]
    fn upsert_keeps_issuers_sorted_and_replaces_by_name() {
        let c = Config::default();
        let c = upsert(c.view(), issuer("b"));
        let c = upsert(c.view(), issuer("a"));
        let mut changed = issuer("b");
        changed.audiences = vec!["other".into()];
        let c = upsert(c.view(), changed.clone());
        assert_eq!(c.jwt_issuers, vec![issuer("a"), changed]);
    }

    #[test]
    fn issuers_survive_the_stored_encoding_and_change_the_hash() {
        let key = gateway_proto::hash::HashKey::from_bytes([3; 32]);
        let plain = Config::default();
        let c = plain.clone().with_jwt_issuers(vec![issuer("a")]);
        let decoded = Config::decode(&c.encode(None).unwrap(), None).unwrap();
        assert_eq!(decoded, c);
        assert_ne!(c.hash(&key), plain.hash(&key));
    }

    #[test]
    fn apply_config_keeps_issuers_when_it_lists_none_and_rollback_restores_them() {
        use crate::config::Mutation;
        let current = Config::default().with_jwt_issuers(vec![issuer("a")]);
        let kept = Mutation::Replace(Config::default())
            .apply(current.view())
            .unwrap();
        assert_eq!(kept.jwt_issuers, vec![issuer("a")]);
        let replaced = Mutation::Replace(Config::default().with_jwt_issuers(vec![issuer("b")]))
            .apply(current.view())
            .unwrap();
        assert_eq!(replaced.jwt_issuers, vec![issuer("b")]);
        let rolled = Mutation::Rollback {
            version: 1,
            content: Config::default().with_jwt_issuers(vec![issuer("c")]),
        }
        .apply(current.view())
        .unwrap();
        assert_eq!(rolled.jwt_issuers, vec![issuer("c")]);
    }

    #[test]
    fn delete_is_refused_while_a_route_names_the_issuer() {
        let route = Route {
            name: "orders".into(),
            auth: AuthMode::AuthJwt as i32,
            jwt_issuers: vec!["a".into()],
            ..Default::default()
        };
        let c = Config::new(vec![route], vec![]).with_jwt_issuers(vec![issuer("a"), issuer("b")]);
        let err = delete(c.view(), "a").unwrap_err();
        assert!(
            matches!(&err, StoreError::Invalid(m) if m.contains("still named by route \"orders\"")),
            "{err}"
        );
        assert!(matches!(
            delete(c.view(), "zz"),
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(
            delete(c.view(), "b").unwrap().jwt_issuers,
            vec![issuer("a")]
        );
    }
}
