//! The start sequence: which process needs which, seeding the demo users
//! and configuration, and the command line of every process.

use std::path::PathBuf;
use std::process::Stdio;

use gateway_proto::v1::GetConfigRequest;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::binaries::Program;
use crate::demo::demo_config;
use crate::error::StackError;
use crate::process::{ProcessSpec, Readiness};
use crate::stack::{Slot, Stack, try_join_all};
use crate::sys;

/// The demo users seeded into the auth service: (name, role, password).
pub const DEMO_USERS: [(&str, &str, &str); 2] =
    [("alice", "user", "wonderland"), ("bob", "admin", "builder")];

/// JWT issuer and audience the auth service signs with and data planes expect.
const JWT_ISSUER: &str = "gateway-auth";
const JWT_AUDIENCE: &str = "gateway";

impl Stack {
    /// Starts everything in dependency order, as much as possible at once,
    /// and returns the configuration version the data planes synced to.
    pub(crate) async fn boot(&self) -> Result<u64, StackError> {
        let o = &self.options;
        if o.redis {
            self.spawn("redis")?;
        }
        self.spawn("control-plane")?;
        for mock in ["users-1", "orders-1", "orders-2"] {
            self.spawn(mock)?;
        }

        // Redis, then the auth service (its users are seeded meanwhile).
        let auth_chain = async {
            let (redis, users) = tokio::join!(
                async {
                    if o.redis {
                        self.wait_ready("redis").await
                    } else {
                        Ok(())
                    }
                },
                self.seed_users()
            );
            redis?;
            users?;
            if o.auth {
                self.start_process("auth-service").await?;
            }
            Ok::<_, StackError>(())
        };
        // Control plane and demo configuration.
        let config_chain = async {
            self.wait_ready("control-plane").await?;
            let timeout = self.options.startup_timeout;
            tokio::time::timeout(timeout, self.seed_config())
                .await
                .map_err(|_| StackError::Timeout {
                    what: "the control plane to take the demo configuration".into(),
                    waited: timeout,
                    last: "GetConfig/ApplyConfig did not answer".into(),
                })?
        };
        let mocks = try_join_all(
            ["users-1", "orders-1", "orders-2"]
                .into_iter()
                .map(|n| self.wait_ready(n)),
        );
        let ((), version, ()) = tokio::try_join!(auth_chain, config_chain, mocks)?;

        // Data planes last: every upstream already answers their first
        // health checks, so none starts out marked unhealthy.
        let names = self.data_plane_names();
        for name in &names {
            self.spawn(name)?;
        }
        try_join_all(names.iter().map(|n| self.wait_ready(n))).await?;
        self.wait_synced(version).await?;
        Ok(version)
    }

    /// Adds the demo users to the auth service's database (one at a time:
    /// two writers creating the same new SQLite file would race).
    async fn seed_users(&self) -> Result<(), StackError> {
        let Some(auth_bin) = &self.auth_bin else {
            return Ok(());
        };
        let db = self.dir.join("auth.db");
        for (name, role, password) in DEMO_USERS {
            let args = [
                "--database".to_owned(),
                db.display().to_string(),
                "users".to_owned(),
                "add".to_owned(),
                name.to_owned(),
                "--role".to_owned(),
                role.to_owned(),
            ];
            let shown = format!("auth-service {}", args.join(" "));
            let mut command = Command::new(&auth_bin.path);
            command
                .args(auth_bin.args(args.iter().cloned()))
                .env("NO_COLOR", "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            sys::kill_when_parent_dies(&mut command);
            let mut child = command.spawn().map_err(|source| StackError::Spawn {
                name: "auth-service users add".into(),
                program: auth_bin.path.clone(),
                source,
            })?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin
                    .write_all(format!("{password}\n").as_bytes())
                    .await
                    .map_err(StackError::io(format!("writing the password to `{shown}`")))?;
            }
            let output =
                tokio::time::timeout(self.options.startup_timeout, child.wait_with_output())
                    .await
                    .map_err(|_| StackError::Timeout {
                        what: format!("`{shown}`"),
                        waited: self.options.startup_timeout,
                        last: "still running".into(),
                    })?
                    .map_err(StackError::io(format!("running `{shown}`")))?;
            if !output.status.success() {
                return Err(StackError::Command {
                    command: shown,
                    status: output.status.to_string(),
                    output: format!(
                        "{}{}",
                        String::from_utf8_lossy(&output.stdout),
                        String::from_utf8_lossy(&output.stderr)
                    ),
                });
            }
            tracing::debug!(user = name, role, "demo user added");
        }
        Ok(())
    }

    /// Applies the demo configuration and returns its version. A persistent
    /// database that already holds a configuration keeps it.
    async fn seed_config(&self) -> Result<u64, StackError> {
        let mut admin = self.admin_client().await;
        if self.options.database.is_some() {
            let current = admin
                .get_config(GetConfigRequest { version: None })
                .await
                .map_err(|status| StackError::Grpc {
                    call: "GetConfig",
                    status: Box::new(status),
                })?
                .into_inner();
            if current.version > 0 {
                tracing::info!(
                    version = current.version,
                    "the control-plane database already has a configuration; keeping it"
                );
                return Ok(current.version);
            }
        }
        let mut config = demo_config(&self.ports, self.options.auth)?;
        // The edge certificate every HTTPS listener offers (named `default`).
        config.certificates = vec![self.edge.certificate()];
        let applied = admin
            .apply_config(config)
            .await
            .map_err(|status| StackError::Grpc {
                call: "ApplyConfig",
                status: Box::new(status),
            })?
            .into_inner();
        tracing::debug!(version = applied.version, "demo configuration applied");
        Ok(applied.version)
    }

    /// Records how to start every process of the stack.
    pub(crate) fn register_all(
        &mut self,
        redis_bin: Option<Program>,
        control_plane_bin: Program,
        data_plane_bin: Program,
        mock_bin: Program,
        auth_bin: Option<Program>,
    ) -> Result<(), StackError> {
        let p = self.ports.clone();
        let dir = self.dir.clone();
        let local = |port: u16| format!("127.0.0.1:{port}");
        let path = |name: &str| dir.join(name).display().to_string();

        if let Some(bin) = redis_bin {
            let redis_dir = dir.join("redis");
            let _ = std::fs::create_dir_all(&redis_dir);
            // The password in a config file (mode 0600), not on the command line:
            // `ps` shows that, and so does the "starting" line of the log.
            let conf = match &self.redis_password {
                Some(password) => Some(crate::redis::password_conf(&redis_dir, password)?),
                None => None,
            };
            let args = crate::redis::server_args(
                p.redis,
                &redis_dir,
                conf.as_deref(),
                self.redis_pki.as_ref(),
            );
            self.register("redis", bin, args, Readiness::Redis(self.redis_target()));
        }

        let database = self
            .options
            .database
            .clone()
            .unwrap_or_else(|| dir.join("control-plane.db"));
        // Beside the database, so a persistent one keeps the key that opens its
        // certificates' private keys.
        let secrets_key = crate::secrets::secrets_key_file(&database)?;
        self.register(
            "control-plane",
            control_plane_bin,
            vec![
                "--listen".into(),
                local(p.control_plane),
                "--database".into(),
                database.display().to_string(),
                "--auth-tokens-file".into(),
                self.tokens_file().display().to_string(),
                "--secrets-key-file".into(),
                secrets_key.display().to_string(),
                "--console-listen".into(),
                local(p.console),
            ]
            .into_iter()
            .chain(self.pki.iter().flat_map(|pki| {
                [
                    "--tls-cert".to_owned(),
                    pki.server_cert.display().to_string(),
                    "--tls-key".to_owned(),
                    pki.server_key.display().to_string(),
                    "--client-ca".to_owned(),
                    pki.ca.display().to_string(),
                ]
            }))
            .collect(),
            Readiness::GrpcHealth(self.control_plane_url()),
        );

        for (name, service, port) in [
            ("users-1", "users", p.users_1),
            ("orders-1", "orders", p.orders_1),
            ("orders-2", "orders", p.orders_2),
        ] {
            self.register(
                name,
                mock_bin.clone(),
                vec![
                    "--listen".into(),
                    local(port),
                    "--service".into(),
                    service.into(),
                    "--instance-id".into(),
                    name.into(),
                ],
                Readiness::Http(format!("http://{}/health", local(port))),
            );
        }

        if let Some(bin) = auth_bin {
            self.register(
                "auth-service",
                bin,
                vec![
                    "--listen".into(),
                    local(p.auth),
                    "--database".into(),
                    path("auth.db"),
                ]
                .into_iter()
                .chain(self.redis_ca_args())
                .chain([
                    "--key-dir".into(),
                    path("auth-keys"),
                    "--issuer".into(),
                    JWT_ISSUER.into(),
                    "--audience".into(),
                    JWT_AUDIENCE.into(),
                ])
                .collect(),
                Readiness::Http(format!("{}/healthz", self.auth_url())),
            );
            // The URL may hold the password: environment, not command line.
            self.set_env("auth-service", "AUTH_REDIS_URL", self.redis_url())
                .expect("auth-service was just registered");
        }

        for (i, name) in self.data_plane_names().into_iter().enumerate() {
            let mut args = vec![
                "--listen".into(),
                local(p.gateways[i]),
                "--admin-listen".into(),
                local(p.gateway_admins[i]),
                "--tls-listen".into(),
                local(p.gateways_tls[i]),
                "--control-plane".into(),
                self.control_plane_url(),
                "--node-id".into(),
                name.clone(),
                "--cache-dir".into(),
                path(&format!("{name}-cache")),
            ];
            if self.options.auth {
                args.extend([
                    "--jwks-url".into(),
                    format!("{}/.well-known/jwks.json", self.auth_url()),
                    "--jwt-issuer".into(),
                    JWT_ISSUER.into(),
                    "--jwt-audience".into(),
                    JWT_AUDIENCE.into(),
                ]);
            }
            if self.options.redis {
                args.extend(self.redis_ca_args());
            }
            if let Some(pki) = &self.pki {
                // mTLS: the client certificate authenticates the data plane.
                args.extend([
                    "--control-plane-ca".into(),
                    pki.ca.display().to_string(),
                    "--tls-cert".into(),
                    pki.client_cert.display().to_string(),
                    "--tls-key".into(),
                    pki.client_key.display().to_string(),
                ]);
            }
            args.extend(self.options.data_plane_args.iter().cloned());
            let readyz = format!("http://{}/readyz", local(p.gateway_admins[i]));
            self.register(&name, data_plane_bin.clone(), args, Readiness::Http(readyz));
            // In the environment, not on the command line (which is logged and visible in ps).
            // With TLS the client certificate authenticates instead.
            if self.pki.is_none() {
                self.set_env(
                    &name,
                    "DP_CONTROL_PLANE_TOKEN",
                    self.tokens.data_plane.clone(),
                )
                .expect("the data plane was just registered");
            }
            // Like the token: the URL may hold Redis's password.
            if self.options.redis {
                self.set_env(&name, "DP_REDIS_URL", self.redis_url())
                    .expect("the data plane was just registered");
            }
        }
        Ok(())
    }

    /// `--redis-ca FILE` for the clients of a TLS Redis, else nothing.
    fn redis_ca_args(&self) -> Vec<String> {
        self.redis_ca()
            .map(|ca| vec!["--redis-ca".to_owned(), ca.display().to_string()])
            .unwrap_or_default()
    }

    /// The control plane's tokens file, in the stack directory.
    pub(crate) fn tokens_file(&self) -> PathBuf {
        self.dir.join("control-plane-tokens")
    }

    fn register(&mut self, name: &str, program: Program, args: Vec<String>, readiness: Readiness) {
        // Log files are plain text: no colour codes.
        let mut env = vec![("NO_COLOR".to_owned(), "1".to_owned())];
        if let Some(url) = &self.options.otlp_endpoint {
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), url.clone()));
        }
        env.extend(
            self.options
                .env
                .iter()
                .filter(|(process, _, _)| process == name || process == "*")
                .map(|(_, k, v)| (k.clone(), v.clone())),
        );
        let spec = ProcessSpec {
            name: name.to_owned(),
            args: program.args(args),
            program: program.path,
            env,
            // A FAIL_RATE left in the caller's shell must not make mocks fail.
            env_remove: vec!["FAIL_RATE".to_owned()],
            log: self.log_path(name),
            readiness,
        };
        self.order.push(name.to_owned());
        self.lock()
            .insert(name.to_owned(), Slot { spec, child: None });
    }
}
