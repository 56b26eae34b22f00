//! `AdminService`: the operator API. Reads are served from the published
//! current snapshot; every mutation goes through [`Store`] as one transaction.
//! No answer carries a credential: reads go through [`crate::credentials`]'
//! redaction (no signing secret, no API key hash, no private key), and an
//! API key itself is returned once, by `CreateApiKey`.

use crate::auth;
use crate::certificates::redact_certificate;
use crate::clock::rfc3339;
use crate::config::{Config, Mutation};
use crate::credentials::{generate_key, redact_key, redact_snapshot, redact_upstream};
use crate::error::StoreError;
use crate::nodes::NodeRegistry;
use crate::purge::{self, Purges};
use crate::store::{MutateOptions, Store};
use gateway_proto::v1::admin_service_server::AdminService;
use gateway_proto::v1::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The AdminService implementation.
pub struct Admin {
    store: Arc<Store>,
    nodes: Arc<NodeRegistry>,
    purges: Arc<Purges>,
}

impl Admin {
    /// Serves `store`'s configuration and `nodes`' status.
    pub fn new(store: Arc<Store>, nodes: Arc<NodeRegistry>) -> Self {
        Admin {
            store,
            nodes,
            purges: Arc::default(),
        }
    }

    /// The same service, handing cache purges to the config streams of `purges`.
    pub fn with_purges(mut self, purges: Arc<Purges>) -> Self {
        self.purges = purges;
        self
    }

    async fn mutate(
        &self,
        mutation: Mutation,
        expected_version: Option<u64>,
        author: String,
    ) -> Result<Response<ConfigChange>, Status> {
        let options = MutateOptions {
            expected_version,
            author: Some(author),
            ..Default::default()
        };
        let outcome = self.store.mutate(mutation, &options).await?;
        Ok(Response::new(ConfigChange {
            version: outcome.version,
            warnings: outcome.warnings,
        }))
    }
}

fn required_name(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        Err(StoreError::Invalid("name: required".into()).into())
    } else {
        Ok(())
    }
}

#[tonic::async_trait]
impl AdminService for Admin {
    async fn list_routes(
        &self,
        _: Request<ListRoutesRequest>,
    ) -> Result<Response<ListRoutesResponse>, Status> {
        let cur = self.store.current();
        Ok(Response::new(ListRoutesResponse {
            routes: cur.routes.clone(),
            version: cur.version,
        }))
    }

    async fn get_route(&self, req: Request<GetRouteRequest>) -> Result<Response<Route>, Status> {
        let name = req.into_inner().name;
        required_name(&name)?;
        let cur = self.store.current();
        cur.routes
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .map(Response::new)
            .ok_or_else(|| StoreError::NotFound(format!("route \"{name}\" not found")).into())
    }

    async fn upsert_route(
        &self,
        req: Request<UpsertRouteRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        let route = req
            .route
            .ok_or_else(|| StoreError::Invalid("route: required".into()))?;
        self.mutate(Mutation::UpsertRoute(route), req.expected_version, author)
            .await
    }

    async fn delete_route(
        &self,
        req: Request<DeleteRouteRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        required_name(&req.name)?;
        self.mutate(
            Mutation::DeleteRoute(req.name),
            req.expected_version,
            author,
        )
        .await
    }

    async fn list_upstreams(
        &self,
        _: Request<ListUpstreamsRequest>,
    ) -> Result<Response<ListUpstreamsResponse>, Status> {
        let cur = self.store.current();
        Ok(Response::new(ListUpstreamsResponse {
            upstreams: cur.upstreams.iter().map(redact_upstream).collect(),
            version: cur.version,
        }))
    }

    async fn get_upstream(
        &self,
        req: Request<GetUpstreamRequest>,
    ) -> Result<Response<Upstream>, Status> {
        let name = req.into_inner().name;
        required_name(&name)?;
        let cur = self.store.current();
        cur.upstreams
            .iter()
            .find(|u| u.name == name)
            .map(redact_upstream)
            .map(Response::new)
            .ok_or_else(|| StoreError::NotFound(format!("upstream \"{name}\" not found")).into())
    }

    async fn upsert_upstream(
        &self,
        req: Request<UpsertUpstreamRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        let upstream = req
            .upstream
            .ok_or_else(|| StoreError::Invalid("upstream: required".into()))?;
        self.mutate(
            Mutation::UpsertUpstream(upstream),
            req.expected_version,
            author,
        )
        .await
    }

    async fn delete_upstream(
        &self,
        req: Request<DeleteUpstreamRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        required_name(&req.name)?;
        self.mutate(
            Mutation::DeleteUpstream(req.name),
            req.expected_version,
            author,
        )
        .await
    }

    async fn get_config(
        &self,
        req: Request<GetConfigRequest>,
    ) -> Result<Response<ConfigSnapshot>, Status> {
        let snapshot = match req.into_inner().version {
            None => redact_snapshot(&self.store.current()),
            Some(v) => redact_snapshot(&self.store.snapshot(v).await?),
        };
        Ok(Response::new(snapshot))
    }

    async fn apply_config(
        &self,
        req: Request<ApplyConfigRequest>,
    ) -> Result<Response<ApplyConfigResponse>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        let options = MutateOptions {
            expected_version: req.expected_version,
            dry_run: req.dry_run,
            author: Some(author),
        };
        let config = Config::new(req.routes, req.upstreams)
            .with_certificates(req.certificates)
            .with_jwt_issuers(req.jwt_issuers);
        let mutation = if req.clear_certificates {
            Mutation::ReplaceClearingCertificates(config)
        } else {
            Mutation::Replace(config)
        };
        let outcome = self.store.mutate(mutation, &options).await?;
        Ok(Response::new(ApplyConfigResponse {
            version: outcome.version,
            dry_run: req.dry_run,
            changes: outcome.changes.iter().map(ResourceChange::from).collect(),
            warnings: outcome.warnings,
        }))
    }

    async fn list_config_versions(
        &self,
        req: Request<ListConfigVersionsRequest>,
    ) -> Result<Response<ListConfigVersionsResponse>, Status> {
        let limit = req.into_inner().limit.unwrap_or(0);
        let versions = self.store.versions(limit).await?;
        Ok(Response::new(ListConfigVersionsResponse { versions }))
    }

    async fn rollback_config(
        &self,
        req: Request<RollbackConfigRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        let options = MutateOptions {
            expected_version: req.expected_version,
            author: Some(author),
            ..Default::default()
        };
        let outcome = self.store.rollback(req.version, &options).await?;
        Ok(Response::new(ConfigChange {
            version: outcome.version,
            warnings: outcome.warnings,
        }))
    }

    async fn list_data_planes(
        &self,
        _: Request<ListDataPlanesRequest>,
    ) -> Result<Response<ListDataPlanesResponse>, Status> {
        let current_version = self.store.current().version;
        Ok(Response::new(ListDataPlanesResponse {
            data_planes: self.nodes.list(current_version).await?,
            current_version,
        }))
    }

    async fn create_api_key(
        &self,
        req: Request<CreateApiKeyRequest>,
    ) -> Result<Response<CreateApiKeyResponse>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        gateway_proto::validate::validate_api_key_fields(&req.name, &req.subject, &req.role)
            .map_err(StoreError::from)?;
        let new = generate_key();
        let record = ApiKey {
            name: req.name,
            subject: req.subject,
            role: req.role,
            key_sha256: new.sha256.clone(),
            prefix: new.prefix.clone(),
            created_at: rfc3339(chrono::Utc::now()),
        };
        let shown = redact_key(&record);
        let change = self
            .mutate(Mutation::CreateApiKey(record), req.expected_version, author)
            .await?
            .into_inner();
        Ok(Response::new(CreateApiKeyResponse {
            key: new.key,
            api_key: Some(shown),
            version: change.version,
        }))
    }

    async fn list_api_keys(
        &self,
        _: Request<ListApiKeysRequest>,
    ) -> Result<Response<ListApiKeysResponse>, Status> {
        let cur = self.store.current();
        Ok(Response::new(ListApiKeysResponse {
            api_keys: cur.api_keys.iter().map(redact_key).collect(),
            version: cur.version,
        }))
    }

    async fn revoke_api_key(
        &self,
        req: Request<RevokeApiKeyRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        required_name(&req.name)?;
        self.mutate(
            Mutation::RevokeApiKey(req.name),
            req.expected_version,
            author,
        )
        .await
    }

    async fn upsert_certificate(
        &self,
        req: Request<UpsertCertificateRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        let certificate = req
            .certificate
            .ok_or_else(|| StoreError::Invalid("certificate: required".into()))?;
        self.mutate(
            Mutation::UpsertCertificate(certificate),
            req.expected_version,
            author,
        )
        .await
    }

    async fn get_certificate(
        &self,
        req: Request<GetCertificateRequest>,
    ) -> Result<Response<Certificate>, Status> {
        let name = req.into_inner().name;
        required_name(&name)?;
        let cur = self.store.current();
        cur.certificates
            .iter()
            .find(|c| c.name == name)
            .map(redact_certificate)
            .map(Response::new)
            .ok_or_else(|| StoreError::NotFound(format!("certificate \"{name}\" not found")).into())
    }

    async fn list_certificates(
        &self,
        _: Request<ListCertificatesRequest>,
    ) -> Result<Response<ListCertificatesResponse>, Status> {
        let cur = self.store.current();
        Ok(Response::new(ListCertificatesResponse {
            certificates: cur.certificates.iter().map(redact_certificate).collect(),
            version: cur.version,
        }))
    }

    async fn delete_certificate(
        &self,
        req: Request<DeleteCertificateRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        required_name(&req.name)?;
        self.mutate(
            Mutation::DeleteCertificate(req.name),
            req.expected_version,
            author,
        )
        .await
    }

    async fn upsert_jwt_issuer(
        &self,
        req: Request<UpsertJwtIssuerRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        let issuer = req
            .jwt_issuer
            .ok_or_else(|| StoreError::Invalid("jwt_issuer: required".into()))?;
        self.mutate(
            Mutation::UpsertJwtIssuer(issuer),
            req.expected_version,
            author,
        )
        .await
    }

    async fn get_jwt_issuer(
        &self,
        req: Request<GetJwtIssuerRequest>,
    ) -> Result<Response<JwtIssuer>, Status> {
        let name = req.into_inner().name;
        required_name(&name)?;
        let cur = self.store.current();
        cur.jwt_issuers
            .iter()
            .find(|i| i.name == name)
            .cloned()
            .map(Response::new)
            .ok_or_else(|| StoreError::NotFound(format!("jwt issuer \"{name}\" not found")).into())
    }

    async fn list_jwt_issuers(
        &self,
        _: Request<ListJwtIssuersRequest>,
    ) -> Result<Response<ListJwtIssuersResponse>, Status> {
        let cur = self.store.current();
        Ok(Response::new(ListJwtIssuersResponse {
            jwt_issuers: cur.jwt_issuers.clone(),
            version: cur.version,
        }))
    }

    async fn delete_jwt_issuer(
        &self,
        req: Request<DeleteJwtIssuerRequest>,
    ) -> Result<Response<ConfigChange>, Status> {
        let author = auth::author(&req);
        let req = req.into_inner();
        required_name(&req.name)?;
        self.mutate(
            Mutation::DeleteJwtIssuer(req.name),
            req.expected_version,
            author,
        )
        .await
    }

    async fn purge_cache(
        &self,
        req: Request<PurgeCacheRequest>,
    ) -> Result<Response<PurgeCacheResponse>, Status> {
        let author = auth::author(&req);
        let purge = purge::check(&self.store.current(), req.into_inner())?;
        // The other control planes on the same Postgres hand it to their data planes.
        self.store.announce_purge(&purge).await?;
        let (route, prefix) = (purge.route.clone(), purge.path_prefix.clone());
        let data_planes = self.purges.send(purge);
        tracing::info!(%route, path_prefix = %prefix, data_planes, %author, "cache purge sent");
        Ok(Response::new(PurgeCacheResponse { data_planes }))
    }
}
