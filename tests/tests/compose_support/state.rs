//! The stack's state services as an operator and an attacker on the inside see them: users
//! added with `compose exec auth-service auth-service users add`, and Redis (password, which
//! networks reach it), probed from inside containers with bash's `/dev/tcp` (the images have no
//! redis-cli except Redis's own).

use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::{Stack, docker, run_with_stdin};

/// The users the suite adds to the fresh stack (name, password, role): the logins the
/// demo configuration's scenarios use.
pub(crate) const USERS: [(&str, &str, &str); 2] =
    [("alice", "wonderland", "user"), ("bob", "builder", "admin")];

impl Stack {
    /// `auth-service users list` in the auth service's container (stdout: `NAME ROLE` lines).
    pub(crate) async fn users_list(&self) -> Result<String> {
        self.compose(&[
            "exec",
            "-T",
            "auth-service",
            "auth-service",
            "users",
            "list",
        ])
        .await
    }

    /// Adds a user as the README shows, the password piped in on stdin (`-T`: no terminal, so
    /// `users add` reads stdin instead of asking).
    pub(crate) async fn add_user(&self, name: &str, password: &str, role: &str) -> Result<()> {
        let args = [
            "exec",
            "-T",
            "auth-service",
            "auth-service",
            "users",
            "add",
            name,
            "--role",
            role,
        ];
        run_with_stdin(
            self.compose_cli(&args),
            &format!("compose {}", args.join(" ")),
            Duration::from_secs(60),
            Some(&format!("{password}\n")),
        )
        .await?;
        eprintln!(
            "added user {name} ({role}) with `compose exec auth-service auth-service users add`"
        );
        Ok(())
    }

    /// Status of `POST /auth/login` through the edge.
    pub(crate) async fn login_status(&self, user: &str, password: &str) -> Result<u16> {
        let resp = self
            .http()
            .post(self.edge_url("/auth/login"))
            .json(&serde_json::json!({"username": user, "password": password}))
            .send()
            .await?;
        Ok(resp.status().as_u16())
    }

    /// A fresh stack has no user (no seeded demo login): `users list` is empty and alice's
    /// demo password is refused.
    pub(crate) async fn ensure_no_users(&self) -> Result<()> {
        let listed = self.users_list().await?;
        ensure!(
            listed.trim().is_empty(),
            "a fresh stack must have no users: {listed:?}"
        );
        let status = self.login_status("alice", "wonderland").await?;
        ensure!(
            status == 401,
            "login as alice on a fresh stack answered {status}, not 401"
        );
        eprintln!("fresh stack: no users, login as alice/wonderland is 401");
        Ok(())
    }

    /// The oldest running container of `service` (`docker ps`: much quicker than `compose ps`).
    pub(crate) async fn container_of(&self, service: &str) -> Result<String> {
        self.service_ids(service)
            .await?
            .into_iter()
            .next()
            .with_context(|| format!("no running container of {service}"))
    }

    /// The addresses of a container, one per network.
    pub(crate) async fn addresses_of(&self, container: &str) -> Result<Vec<String>> {
        let out = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            container,
        ])
        .await?;
        Ok(out.split_whitespace().map(str::to_owned).collect())
    }

    /// Sends `commands` (RESP inline commands, one per line) to `host`:6379 from inside the
    /// first container of `service` and returns Redis's reply lines; `Err` when the connection
    /// cannot be made.
    pub(crate) async fn redis_from(
        &self,
        service: &str,
        host: &str,
        commands: &[&str],
    ) -> Result<String> {
        let container = self.container_of(service).await?;
        let mut send = String::new();
        for c in commands {
            send.push_str(c);
            send.push_str("\\r\\n");
        }
        // Connect (within the 4 s the whole exchange may take), send, then print reply lines
        // until Redis is quiet for 1 s.
        let script = format!(
            "exec 3<>/dev/tcp/{host}/6379 || exit 7; printf '{send}' >&3; \
             while IFS= read -r -t 1 line <&3; do printf '%s\\n' \"$line\"; done"
        );
        docker(&["exec", &container, "timeout", "5", "bash", "-c", &script]).await
    }

    /// Whether a container of `service` can resolve `name` in Docker's DNS within 3 s (on an
    /// internal network Docker's DNS forwards an unknown name to resolvers it cannot reach, so
    /// a name that is not there takes long to fail; a known one answers at once).
    pub(crate) async fn resolves_from(&self, service: &str, name: &str) -> Result<bool> {
        let container = self.container_of(service).await?;
        Ok(
            docker(&["exec", &container, "timeout", "3", "getent", "hosts", name])
                .await
                .is_ok(),
        )
    }
}
