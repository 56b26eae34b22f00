//! The console's one way to read and change the configuration: the
//! AdminService itself, called in process as the signed-in [`Caller`], who
//! becomes the author of what it commits. Each call is first checked against
//! the gRPC API's role table ([`auth::allowed`]), so a viewer can do in the
//! console exactly what its token allows through grpcurl, and a rollback is
//! `RollbackConfig` with its compare-and-swap, not a path of its own.

use gateway_proto::v1::admin_service_server::AdminService;
use gateway_proto::v1::*;
use tonic::{Request, Status};

use crate::admin::Admin;
use crate::auth::{self, Caller};

/// The AdminService, as the console calls it.
pub struct Backend {
    admin: Admin,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").finish_non_exhaustive()
    }
}

/// Whether `caller` may call AdminService method `method` (`RollbackConfig`).
pub fn may(caller: &Caller, method: &str) -> bool {
    auth::allowed(caller.role, &format!("/gateway.v1.AdminService/{method}"))
}

fn request<T>(caller: &Caller, method: &str, message: T) -> Result<Request<T>, Status> {
    if !may(caller, method) {
        return Err(Status::permission_denied(format!(
            "{} (role {}) may not call gateway.v1.AdminService/{method}",
            caller.name, caller.role
        )));
    }
    let mut request = Request::new(message);
    request.extensions_mut().insert(caller.clone());
    Ok(request)
}

impl Backend {
    /// Calls `admin`.
    pub fn new(admin: Admin) -> Self {
        Backend { admin }
    }

    /// `ListDataPlanes`.
    pub async fn data_planes(&self, caller: &Caller) -> Result<ListDataPlanesResponse, Status> {
        let r = request(caller, "ListDataPlanes", ListDataPlanesRequest {})?;
        Ok(self.admin.list_data_planes(r).await?.into_inner())
    }

    /// `ListConfigVersions` (newest first).
    pub async fn versions(
        &self,
        caller: &Caller,
        limit: u32,
    ) -> Result<Vec<ConfigVersion>, Status> {
        let r = request(
            caller,
            "ListConfigVersions",
            ListConfigVersionsRequest { limit: Some(limit) },
        )?;
        Ok(self
            .admin
            .list_config_versions(r)
            .await?
            .into_inner()
            .versions)
    }

    /// `GetConfig`: the current version, or `version` (redacted).
    pub async fn config(
        &self,
        caller: &Caller,
        version: Option<u64>,
    ) -> Result<ConfigSnapshot, Status> {
        let r = request(caller, "GetConfig", GetConfigRequest { version })?;
        Ok(self.admin.get_config(r).await?.into_inner())
    }

    /// `RollbackConfig` to `version`, only if `expected_version` is still current.
    pub async fn rollback(
        &self,
        caller: &Caller,
        version: u64,
        expected_version: u64,
    ) -> Result<ConfigChange, Status> {
        let r = request(
            caller,
            "RollbackConfig",
            RollbackConfigRequest {
                version,
                expected_version: Some(expected_version),
            },
        )?;
        Ok(self.admin.rollback_config(r).await?.into_inner())
    }

    /// `ListApiKeys` (no hashes).
    pub async fn api_keys(&self, caller: &Caller) -> Result<ListApiKeysResponse, Status> {
        let r = request(caller, "ListApiKeys", ListApiKeysRequest {})?;
        Ok(self.admin.list_api_keys(r).await?.into_inner())
    }

    /// `CreateApiKey`: the answer holds the key, shown once.
    pub async fn create_api_key(
        &self,
        caller: &Caller,
        name: String,
        subject: String,
        role: String,
    ) -> Result<CreateApiKeyResponse, Status> {
        let r = request(
            caller,
            "CreateApiKey",
            CreateApiKeyRequest {
                name,
                subject,
                role,
                expected_version: None,
            },
        )?;
        Ok(self.admin.create_api_key(r).await?.into_inner())
    }

    /// `RevokeApiKey`.
    pub async fn revoke_api_key(
        &self,
        caller: &Caller,
        name: String,
    ) -> Result<ConfigChange, Status> {
        let r = request(
            caller,
            "RevokeApiKey",
            RevokeApiKeyRequest {
                name,
                expected_version: None,
            },
        )?;
        Ok(self.admin.revoke_api_key(r).await?.into_inner())
    }

    /// `ListCertificates` (no private keys).
    pub async fn certificates(&self, caller: &Caller) -> Result<ListCertificatesResponse, Status> {
        let r = request(caller, "ListCertificates", ListCertificatesRequest {})?;
        Ok(self.admin.list_certificates(r).await?.into_inner())
    }
}
