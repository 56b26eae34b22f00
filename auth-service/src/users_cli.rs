//! The `users` subcommands (`add`, `list`, `delete`) on the `--database` file, and where
//! `users add` takes the password from.
//!
//! They work while a server uses the same file (SQLite in WAL mode, and the server reads a user
//! at every login), so `docker compose exec auth-service auth-service users add NAME --role
//! user` takes effect at once. The password never comes from a command-line argument (shell
//! history, `ps`): it is asked for on the terminal without echo, piped in on stdin, or named by
//! `--password-env`.

use gateway_database::Database;
use std::io::{BufRead, Read};

use crate::args::UsersCommand;
use crate::users::{MAX_PASSWORD_BYTES, UserError, UserStore};

/// Where `users add` reads the password from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordInput {
    /// The environment variable of this name (`--password-env`).
    Env(String),
    /// Stdin is a terminal: ask twice, without echo.
    Terminal,
    /// Stdin is a pipe or a file: all of it, one trailing newline stripped.
    Stdin,
}

/// What a subcommand printed: `stdout` is for scripts (`users list`), `stderr` for people.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Machine-readable output.
    pub stdout: String,
    /// What was done.
    pub stderr: String,
}

/// How a report names the database: a SQLite file by its path, Postgres by its URL, password masked.
pub fn shown(database: &Database) -> String {
    match database {
        Database::Sqlite(path) => path.display().to_string(),
        Database::Postgres(url) => url.to_string(),
    }
}

/// Runs one `users` subcommand on `database`; `password` is called only by `add`.
pub async fn run(
    database: &Database,
    command: &UsersCommand,
    password: impl FnOnce(&str) -> Result<String, UserError>,
) -> Result<Report, UserError> {
    match command {
        UsersCommand::Add {
            name,
            role,
            replace,
            ..
        } => {
            // Refuse a bad name or role before asking for a password.
            crate::users::validate_username(name)?;
            crate::users::validate_role(role)?;
            let password = password(name)?;
            let store = UserStore::connect(database).await?;
            let outcome = store.add_user(name, role, password, *replace).await?;
            Ok(Report {
                stderr: format!("{outcome}\n"),
                ..Report::default()
            })
        }
        UsersCommand::List => {
            let store = UserStore::connect(database).await?;
            let users = store.list().await?;
            let mut stdout = String::new();
            for user in &users {
                stdout.push_str(&format!("{} {}\n", user.username, user.role));
            }
            Ok(Report {
                stdout,
                stderr: format!("{} user(s) in {}\n", users.len(), shown(database)),
            })
        }
        UsersCommand::Delete { name } => {
            let store = UserStore::connect(database).await?;
            store.delete(name).await?;
            Ok(Report {
                stderr: format!(
                    "user {name:?} deleted (tokens already issued stay valid until they expire; its refresh tokens are refused)\n"
                ),
                ..Report::default()
            })
        }
    }
}

/// Reads the password for user `name` from `input`.
pub fn read_password_from(input: &PasswordInput, name: &str) -> Result<String, UserError> {
    match input {
        PasswordInput::Env(var) => match std::env::var(var) {
            Ok(value) => check_password(value, &format!("${var}")),
            Err(std::env::VarError::NotPresent) => Err(UserError::Invalid(format!(
                "--password-env {var}: the variable is not set"
            ))),
            Err(std::env::VarError::NotUnicode(_)) => Err(UserError::Invalid(format!(
                "--password-env {var}: the value is not UTF-8"
            ))),
        },
        PasswordInput::Stdin => read_password(std::io::stdin().lock()),
        PasswordInput::Terminal => {
            let first = prompt(&format!("Password for {name}: "))?;
            let first = check_password(first, "the terminal")?;
            let again = prompt("Again: ")?;
            if again != first {
                return Err(UserError::Invalid(
                    "the two passwords differ; nothing was changed".into(),
                ));
            }
            Ok(first)
        }
    }
}

/// Asks on stderr and reads one line from the terminal on stdin with echo off (restored after,
/// also when reading fails).
fn prompt(question: &str) -> Result<String, UserError> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    use std::io::Write as _;
    let stdin = std::io::stdin();
    let saved = tcgetattr(&stdin).map_err(std::io::Error::from)?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    tcsetattr(&stdin, OptionalActions::Flush, &quiet).map_err(std::io::Error::from)?;
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    let restored = tcsetattr(&stdin, OptionalActions::Now, &saved);
    eprintln!();
    read?;
    restored.map_err(std::io::Error::from)?;
    if line.ends_with('\n') {
        line.pop();
        if line.ends_with('\r') {
            line.pop();
        }
    }
    Ok(line)
}

fn check_password(password: String, from: &str) -> Result<String, UserError> {
    if password.is_empty() {
        return Err(UserError::Invalid(format!("empty password from {from}")));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(UserError::Invalid(format!(
            "the password must be at most {MAX_PASSWORD_BYTES} bytes"
        )));
    }
    Ok(password)
}

/// Reads a password from `input` (all of it), stripping one trailing `\n` or `\r\n`.
pub fn read_password(mut input: impl Read) -> Result<String, UserError> {
    let mut buf = Vec::new();
    input
        .by_ref()
        .take(MAX_PASSWORD_BYTES as u64 + 3)
        .read_to_end(&mut buf)?;
    if buf.ends_with(b"\n") {
        buf.pop();
        if buf.ends_with(b"\r") {
            buf.pop();
        }
    }
    let password = String::from_utf8(buf)
        .map_err(|_| UserError::Invalid("the password must be UTF-8".into()))?;
    if password.is_empty() {
        return Err(UserError::Invalid(
            "no password on stdin (pipe it in, e.g. `printf %s \"$PW\" | auth-service users add NAME --role user`, or run it on a terminal to be asked)".into(),
        ));
    }
    check_password(password, "stdin")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn password_from_stdin_strips_one_newline() {
        assert_eq!(read_password(&b"secret\n"[..]).unwrap(), "secret");
        assert_eq!(read_password(&b"secret\r\n"[..]).unwrap(), "secret");
        assert_eq!(read_password(&b"sec ret \n\n"[..]).unwrap(), "sec ret \n");
        assert!(read_password(&b"\n"[..]).is_err());
        assert!(read_password(&b""[..]).is_err());
        assert!(read_password(&[0xff, 0xfe][..]).is_err());
        let long = vec![b'x'; MAX_PASSWORD_BYTES + 1];
        assert!(read_password(&long[..]).is_err());
    }

    /// The set case runs in a child process (`tests/tests/auth_service.rs`): edition 2024 makes
    /// `set_var` unsafe, and this crate forbids unsafe code.
    #[test]
    fn password_from_a_variable_that_is_not_set() {
        let var = "AUTH_SERVICE_TEST_PASSWORD_NEVER_SET_7f3a";
        let input = PasswordInput::Env(var.into());
        let err = read_password_from(&input, "alice").unwrap_err().to_string();
        assert!(err.contains(var) && err.contains("not set"), "{err}");
    }

    async fn run_ok(db: &Path, args: &[&str], password: &str) -> Report {
        let cli = <crate::args::Cli as clap::Parser>::try_parse_from(
            ["auth-service", "--database", db.to_str().unwrap()]
                .into_iter()
                .chain(args.iter().copied()),
        )
        .unwrap();
        let Some(crate::args::Command::Users { command }) = cli.command else {
            panic!("not a users command: {args:?}");
        };
        let password = password.to_owned();
        run(&Database::sqlite(db), &command, move |_| Ok(password))
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn add_list_delete() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("auth.db");
        let r = run_ok(&db, &["users", "add", "carol", "--role", "admin"], "pw-1").await;
        assert!(r.stderr.contains("\"carol\" created"), "{r:?}");
        run_ok(&db, &["users", "add", "bob", "--role", "user"], "pw-2").await;
        let r = run_ok(&db, &["users", "list"], "").await;
        assert_eq!(r.stdout, "bob user\ncarol admin\n");
        let r = run_ok(&db, &["users", "delete", "carol"], "").await;
        assert!(r.stderr.contains("\"carol\" deleted"), "{r:?}");
        assert_eq!(
            run_ok(&db, &["users", "list"], "").await.stdout,
            "bob user\n"
        );
        let store = UserStore::open(&db).await.unwrap();
        assert!(store.verify("bob", "pw-2").await.unwrap().is_some());
        assert!(store.verify("carol", "pw-1").await.unwrap().is_none());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn clear_errors_and_no_password_asked_for_a_bad_name() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("auth.db");
        let add = |name: &'static str, role: &'static str| UsersCommand::Add {
            name: name.into(),
            role: role.into(),
            replace: false,
            password_env: None,
        };
        let never = |_: &str| -> Result<String, UserError> { panic!("password asked for") };
        let err = run(&Database::sqlite(&db), &add("a b", "user"), never)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("must be 1-64 characters"), "{err}");
        let err = run(&Database::sqlite(&db), &add("dave", "Admin"), never)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("role \"Admin\""), "{err}");
        run(&Database::sqlite(&db), &add("dave", "user"), |_| {
            Ok("x".into())
        })
        .await
        .unwrap();
        let err = run(&Database::sqlite(&db), &add("dave", "user"), |_| {
            Ok("y".into())
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("already exists"), "{err}");
        assert!(err.to_string().contains("--replace"), "{err}");
        let err = run(
            &Database::sqlite(&db),
            &UsersCommand::Delete { name: "zed".into() },
            never,
        )
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "no user \"zed\"");
    }
}
