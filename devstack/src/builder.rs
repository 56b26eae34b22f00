//! [`StackBuilder`]: the options of a stack and the start sequence's entry point.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::binaries::{Program, find_binary, search_dirs};
use crate::error::StackError;
use crate::pki::{EdgeTls, Pki};
use crate::ports::Ports;
use crate::readiness::http_client;
use crate::secrets::{Tokens, random_token};
use crate::stack::Stack;

/// Builder options; defaults written down in [`StackBuilder::default`].
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) data_planes: usize,
    pub(crate) auth: bool,
    pub(crate) redis: bool,
    pub(crate) otlp_endpoint: Option<String>,
    pub(crate) bin_dir: Option<PathBuf>,
    pub(crate) multi_call: Option<PathBuf>,
    pub(crate) fixed_ports: bool,
    pub(crate) database: Option<PathBuf>,
    pub(crate) startup_timeout: Duration,
    pub(crate) keep_temp_dir: bool,
    pub(crate) env: Vec<(String, String, String)>,
    pub(crate) data_plane_args: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) redis_password: bool,
    pub(crate) redis_tls: bool,
}

/// Configures a [`Stack`]; get one with [`Stack::new`].
#[derive(Debug, Clone)]
pub struct StackBuilder {
    options: Options,
}

impl Default for StackBuilder {
    /// Two data planes, auth service and Redis on, free ports, a temporary
    /// control-plane database, 60 s to become ready.
    fn default() -> Self {
        StackBuilder {
            options: Options {
                data_planes: 2,
                auth: true,
                redis: true,
                otlp_endpoint: None,
                bin_dir: None,
                multi_call: None,
                fixed_ports: false,
                database: None,
                startup_timeout: Duration::from_secs(60),
                keep_temp_dir: std::env::var_os("DEVSTACK_KEEP_TEMP").is_some_and(|v| v == "1"),
                env: Vec::new(),
                data_plane_args: Vec::new(),
                tls: false,
                redis_password: false,
                redis_tls: false,
            },
        }
    }
}

impl StackBuilder {
    /// Number of data-plane replicas (at least 1; default 2).
    pub fn data_planes(mut self, n: usize) -> Self {
        self.options.data_planes = n;
        self
    }

    /// Whether to run the auth service (default true). Without it the demo
    /// `login` and `auth` routes are left out and data planes get no JWKS URL.
    pub fn auth(mut self, on: bool) -> Self {
        self.options.auth = on;
        self
    }

    /// Whether to run Redis (default true). The auth service needs it; data
    /// planes without it get no `--redis-url` and limit locally.
    pub fn redis(mut self, on: bool) -> Self {
        self.options.redis = on;
        self
    }

    /// Serve the control plane over TLS with a throwaway CA (default false).
    /// Data planes then authenticate by client certificate (mTLS), and the
    /// control-plane URL becomes `https://127.0.0.1:P`.
    pub fn tls(mut self, on: bool) -> Self {
        self.options.tls = on;
        self
    }

    /// Protect Redis with a random password (default false). redis-server reads
    /// it from a config file (mode 0600); data planes and the auth service get
    /// `redis://:PASSWORD@…` through the environment (`DP_REDIS_URL`,
    /// `AUTH_REDIS_URL`), never on a command line.
    pub fn redis_password(mut self, on: bool) -> Self {
        self.options.redis_password = on;
        self
    }

    /// Serve Redis over TLS only (default false), with a throwaway CA: no
    /// plain-text port, data planes and the auth service use `rediss://` and
    /// `--redis-ca`.
    pub fn redis_tls(mut self, on: bool) -> Self {
        self.options.redis_tls = on;
        self
    }

    /// Sets `OTEL_EXPORTER_OTLP_ENDPOINT` for every process.
    pub fn otlp_endpoint(mut self, url: impl Into<String>) -> Self {
        self.options.otlp_endpoint = Some(url.into());
        self
    }

    /// Directory holding the gateway binaries (overrides `$GATEWAY_BIN_DIR`
    /// and the directory of the running executable).
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.options.bin_dir = Some(dir.into());
        self
    }

    /// Runs every gateway program from the multi-call executable `exe` (`exe
    /// serve <program> …`, [`crate::serve`]) instead of its own binary;
    /// devstack's binary passes itself. An explicit [`Self::bin_dir`] wins.
    pub fn multi_call(mut self, exe: impl Into<PathBuf>) -> Self {
        self.options.multi_call = Some(exe.into());
        self
    }

    /// Use the fixed default ports (gateway 8080…, control plane 50051, …)
    /// instead of free ones (default false).
    pub fn fixed_ports(mut self, on: bool) -> Self {
        self.options.fixed_ports = on;
        self
    }

    /// A persistent control-plane database. When it already holds a
    /// configuration, that configuration is kept instead of the demo one.
    pub fn database(mut self, path: impl Into<PathBuf>) -> Self {
        self.options.database = Some(path.into());
        self
    }

    /// How long starting (and each later readiness or sync wait) may take (default 60 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.options.startup_timeout = timeout;
        self
    }

    /// Keep the temporary directory (logs, databases, caches) after the stack
    /// is dropped. Also on with `DEVSTACK_KEEP_TEMP=1`.
    pub fn keep_temp_dir(mut self, on: bool) -> Self {
        self.options.keep_temp_dir = on;
        self
    }

    /// Sets an environment variable for one process (by stack name, e.g.
    /// `"orders-1"`), or for every process with `"*"`. Example:
    /// `.env("orders-2", "FAIL_RATE", "0.5")`.
    pub fn env(
        mut self,
        process: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.options
            .env
            .push((process.into(), key.into(), value.into()));
        self
    }

    /// An extra command-line argument for every data plane (e.g.
    /// `"--trusted-proxies=127.0.0.1/32"`).
    pub fn data_plane_arg(mut self, arg: impl Into<String>) -> Self {
        self.options.data_plane_args.push(arg.into());
        self
    }

    /// Starts every process, seeds the demo configuration, and returns once
    /// every process is ready and every data plane is SYNCED at the seeded
    /// version. On failure everything already started is killed.
    pub async fn start(self) -> Result<Stack, StackError> {
        let o = self.options;
        if o.data_planes == 0 {
            return Err(StackError::Options(
                "at least one data plane is needed".into(),
            ));
        }
        if (o.redis_password || o.redis_tls) && !o.redis {
            return Err(StackError::Options(
                ".redis_password(true) and .redis_tls(true) need .redis(true)".into(),
            ));
        }
        if o.auth && !o.redis {
            return Err(StackError::Options(
                "the auth service stores refresh tokens in Redis: .auth(true) needs .redis(true)"
                    .into(),
            ));
        }

        let dirs = search_dirs(o.bin_dir.as_deref());
        let program = |name: &str| match &o.multi_call {
            Some(exe) if o.bin_dir.is_none() => Ok(Program::multi_call(exe, name)),
            _ => find_binary(name, &dirs).map(Program::binary),
        };
        let control_plane_bin = program("control-plane")?;
        let data_plane_bin = program("data-plane")?;
        let mock_bin = program("mock-service")?;
        let auth_bin = if o.auth {
            Some(program("auth-service")?)
        } else {
            None
        };
        let redis_bin = if o.redis {
            Some(Program::binary(crate::redis::redis_server_binary()?))
        } else {
            None
        };

        let ports = if o.fixed_ports {
            let ports = Ports::fixed(o.data_planes);
            ports.ensure_free()?;
            ports
        } else {
            Ports::ephemeral(o.data_planes)?
        };
        let temp = tempfile::Builder::new()
            .prefix("devstack-")
            .tempdir()
            .map_err(StackError::io("creating the temporary directory"))?;
        let dir = temp.path().to_path_buf();
        std::fs::create_dir_all(dir.join("logs"))
            .map_err(StackError::io("creating the log directory"))?;

        // Beside a persistent database, which keeps the certificate the CA signed.
        let edge_dir = match &o.database {
            Some(db) => {
                let mut name = db.as_os_str().to_owned();
                name.push(".edge-tls");
                std::path::PathBuf::from(name)
            }
            None => dir.join("edge-tls"),
        };
        let edge = EdgeTls::load_or_generate(&edge_dir)?;
        let mut stack = Stack {
            ports,
            edge,
            dir,
            temp: Some(temp),
            procs: Mutex::new(BTreeMap::new()),
            order: Vec::new(),
            seeded_version: 0,
            http: http_client(),
            auth_bin: auth_bin.clone(),
            tokens: Tokens::generate()?,
            pki: None,
            redis_password: None,
            redis_pki: None,
            options: o,
        };
        stack.tokens.write_file(&stack.tokens_file())?;
        if stack.options.tls {
            stack.pki = Some(Pki::generate(&stack.dir.join("tls"))?);
        }
        if stack.options.redis_password {
            stack.redis_password = Some(random_token()?);
        }
        if stack.options.redis_tls {
            stack.redis_pki = Some(Pki::generate(&stack.dir.join("redis-tls"))?);
        }
        stack.register_all(
            redis_bin,
            control_plane_bin,
            data_plane_bin,
            mock_bin,
            auth_bin,
        )?;
        tracing::info!(dir = %stack.dir.display(), "starting the stack; logs in {}", stack.log_dir().display());
        stack.seeded_version = stack.boot().await?;
        tracing::info!(version = stack.seeded_version, "stack ready");
        Ok(stack)
    }
}
