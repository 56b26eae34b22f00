//! The generator of `docs/flags.md`: every flag and environment variable of
//! every binary, rendered from the binaries' clap definitions
//! ([`clap::CommandFactory::command`]) plus the table of variables read
//! outside clap ([`OTHER_ENVIRONMENT`]).
//!
//! `tests/tests/flags_reference.rs` renders the commands of `control-plane`,
//! `data-plane`, `auth-service`, `mock-service`, `devstack` and `gatewayctl` with
//! [`render`] and fails when `docs/flags.md` differs; with `UPDATE_DOCS=1` it
//! writes the file instead. The same test checks that every variable the
//! binaries read with `std::env::var` (and the compose file's `${…}`) is in
//! the text, so a new variable needs a row in [`OTHER_ENVIRONMENT`].

use std::fmt::Write as _;

use clap::{Arg, ArgAction, Command};

/// How to regenerate `docs/flags.md` (also printed by the test on a mismatch).
pub const REGENERATE: &str = "UPDATE_DOCS=1 cargo test -p gateway-tests --test flags_reference";

/// A variable read outside clap: its name, who reads it, what it does.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    /// The variable.
    pub name: &'static str,
    /// Which binaries (or files) read it.
    pub read_by: &'static str,
    /// What it does, with its default.
    pub meaning: &'static str,
}

/// A titled group of [`EnvVar`]s.
#[derive(Debug, Clone, Copy)]
pub struct EnvGroup {
    /// Section title.
    pub title: &'static str,
    /// The variables.
    pub vars: &'static [EnvVar],
}

const SERVICES: &str = "control-plane, data-plane, auth-service, mock-service";

/// Every environment variable read outside clap, by group.
pub const OTHER_ENVIRONMENT: &[EnvGroup] = &[
    EnvGroup {
        title: "Logging and tracing",
        vars: &[
            EnvVar {
                name: "RUST_LOG",
                read_by: SERVICES,
                meaning: "Log filter (`tracing` `EnvFilter` syntax, e.g. `info,data_plane=debug`); default `info`. devstack uses `DEVSTACK_LOG` instead.",
            },
            EnvVar {
                name: "OTEL_EXPORTER_OTLP_ENDPOINT",
                read_by: SERVICES,
                meaning: "OTLP/gRPC collector URL (e.g. `http://127.0.0.1:4317`). Spans are exported only when it is set and not empty.",
            },
            EnvVar {
                name: "OTEL_SDK_DISABLED",
                read_by: SERVICES,
                meaning: "`true`: no export, whatever the endpoint.",
            },
            EnvVar {
                name: "OTEL_TRACES_EXPORTER",
                read_by: SERVICES,
                meaning: "`none`: no export, whatever the endpoint.",
            },
            EnvVar {
                name: "OTEL_SERVICE_NAME",
                read_by: SERVICES,
                meaning: "`service.name` of the spans; default the binary's name (a mock's: `users` or `orders`).",
            },
            EnvVar {
                name: "OTEL_TRACES_SAMPLER",
                read_by: SERVICES,
                meaning: "`always_on`, `always_off`, `traceidratio`, `parentbased_always_on`, `parentbased_always_off` or `parentbased_traceidratio`; unset: `parentbased_traceidratio` with ratio 0.1 (follow the caller's decision, sample 10 % of new traces). Anything else stops the binary at start.",
            },
            EnvVar {
                name: "OTEL_TRACES_SAMPLER_ARG",
                read_by: SERVICES,
                meaning: "Ratio 0 to 1 of the ratio samplers (default 1.0 when a ratio sampler is named; alone it changes the default sampler's 0.1).",
            },
            EnvVar {
                name: "OTEL_BSP_MAX_QUEUE_SIZE",
                read_by: SERVICES,
                meaning: "Most spans waiting for export; more are dropped and counted. Default 2048.",
            },
            EnvVar {
                name: "OTEL_BSP_SCHEDULE_DELAY",
                read_by: SERVICES,
                meaning: "Milliseconds between two scheduled exports. Default 5000.",
            },
            EnvVar {
                name: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                read_by: SERVICES,
                meaning: "Most spans per export call. Default 512.",
            },
            EnvVar {
                name: "OTEL_EXPORTER_OTLP_TIMEOUT",
                read_by: SERVICES,
                meaning: "Read by the `opentelemetry-otlp` exporter itself (see its documentation), as are `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_COMPRESSION`.",
            },
        ],
    },
    EnvGroup {
        title: "data-plane",
        vars: &[EnvVar {
            name: "HOSTNAME",
            read_by: "data-plane",
            meaning: "Host name announced to the control plane (`Node.hostname`) and the first part of the default node id `HOSTNAME-PID`; unset: `/proc/sys/kernel/hostname`, then `/etc/hostname`, then `localhost`.",
        }],
    },
    EnvGroup {
        title: "mock-service fault hooks",
        vars: &[
            EnvVar {
                name: "FAIL_RATE",
                read_by: "mock-service",
                meaning: "Fraction 0.0 to 1.0 of requests (`/health`, `/stats`, `/ws` excepted) answered with `FAIL_STATUS`; default 0.",
            },
            EnvVar {
                name: "FAIL_STATUS",
                read_by: "mock-service",
                meaning: "Status of a `FAIL_RATE` failure, 500 to 599; default 500.",
            },
            EnvVar {
                name: "DELAY_MS",
                read_by: "mock-service",
                meaning: "Milliseconds (0 to 600000) every request but `/health` waits before it is answered; default 0.",
            },
            EnvVar {
                name: "DRAIN_DELAY_MS",
                read_by: "mock-service",
                meaning: "On SIGTERM/SIGINT, keep serving this many milliseconds (0 to 600000) with `/health` answering 503 before stopping; default 0.",
            },
        ],
    },
    EnvGroup {
        title: "auth-service",
        vars: &[EnvVar {
            name: "(the variable named by `--password-env`)",
            read_by: "auth-service users add",
            meaning: "The new user's password, instead of the terminal or stdin.",
        }],
    },
    EnvGroup {
        title: "devstack",
        vars: &[
            EnvVar {
                name: "DEVSTACK_LOG",
                read_by: "devstack",
                meaning: "devstack's own log filter (`EnvFilter` syntax); default `devstack=info`. The processes it starts inherit `RUST_LOG`.",
            },
            EnvVar {
                name: "DEVSTACK_KEEP_TEMP",
                read_by: "devstack library (test suites)",
                meaning: "`1`: a stack started by the library keeps its temporary directory. The binary reads the same variable as its `--keep-temp` switch, where only `true` or `false` is accepted.",
            },
            EnvVar {
                name: "GATEWAY_BIN_DIR",
                read_by: "devstack library (test suites)",
                meaning: "Directory of the gateway binaries when the builder names none (the binary's `--bin-dir` reads it too); default for the library: next to the running executable and its parent directory; the binary without it runs every program from itself (`devstack serve`).",
            },
            EnvVar {
                name: "PATH",
                read_by: "devstack",
                meaning: "Where `redis-server` (and the other tools devstack runs) are looked for.",
            },
        ],
    },
    EnvGroup {
        title: "gatewayctl",
        vars: &[EnvVar {
            name: "GATEWAY_TOKEN",
            read_by: "gatewayctl",
            meaning: "The control plane's bearer token; when set and not empty it is used instead of `--token-file` (an admin token for `diff`, `apply` and `rollback`: `diff` is the control plane's ApplyConfig dry run; a viewer token is enough for `dump` and `status`).",
        }],
    },
    EnvGroup {
        title: "Compose file (`docker-compose.yml`, `.env`) and container entrypoint",
        vars: &[
            EnvVar {
                name: "GATEWAY_ADMIN_TOKEN",
                read_by: "compose, entrypoint",
                meaning: "Required. Control-plane token of role `admin` (name `compose-admin`); at least 32 characters, no spaces.",
            },
            EnvVar {
                name: "GATEWAY_DATA_PLANE_TOKEN",
                read_by: "compose, entrypoint",
                meaning: "Required. Token of role `data-plane` (name `compose-data-plane`); data planes get it as `DP_CONTROL_PLANE_TOKEN`. Must differ from the admin token.",
            },
            EnvVar {
                name: "GATEWAY_VIEWER_TOKEN",
                read_by: "compose, entrypoint",
                meaning: "Optional token of role `viewer` (name `compose-viewer`); empty: none.",
            },
            EnvVar {
                name: "GATEWAY_REDIS_PASSWORD",
                read_by: "compose",
                meaning: "Required. Redis `requirepass`, at least 32 letters and digits; the auth service and data planes get it inside their Redis URL.",
            },
            EnvVar {
                name: "GATEWAY_SECRETS_KEY",
                read_by: "compose, entrypoint",
                meaning: "Optional, needed for HTTPS and upstream signing secrets: 64 hex digits; written to `GATEWAY_SECRETS_KEY_FILE` (default /run/gateway/secrets-key, in memory: a tmpfs in compose, an emptyDir in Kubernetes, never the database's volume) and passed as the control plane's `--secrets-key-file`, which encrypts certificates' private keys and upstream signing secrets.",
            },
            EnvVar {
                name: "GATEWAY_SECRETS_KEY_FILE",
                read_by: "entrypoint",
                meaning: "Where the entrypoint writes `GATEWAY_SECRETS_KEY` (mode 0600); default /run/gateway/secrets-key (it also removes a /var/lib/gateway/secrets-key left by earlier images).",
            },
            EnvVar {
                name: "GATEWAY_SEED_USERS",
                read_by: "compose, entrypoint",
                meaning: "`name:password:role ...`: users the auth service's entrypoint creates when its database is new; default none.",
            },
            EnvVar {
                name: "GATEWAY_OPS_NET",
                read_by: "compose, entrypoint",
                meaning: "First three octets of a /24 (compose: the edge network's, `GATEWAY_EDGE_NET`): without `--admin-listen`, the data plane's entrypoint binds the ops listener to the container's address in that network only and writes it to /tmp/ops-address (the healthcheck's); no address there stops the container. Unset: the data plane's own default.",
            },
            EnvVar {
                name: "GATEWAY_TOKENS_FILE",
                read_by: "entrypoint",
                meaning: "Where the control plane's entrypoint writes the tokens file (SHA-256 digests of the tokens above); default `/var/lib/gateway/auth-tokens`.",
            },
            EnvVar {
                name: "GATEWAY_IMAGE",
                read_by: "compose",
                meaning: "Image of every gateway service; default `gateway:latest`.",
            },
            EnvVar {
                name: "GATEWAY_OTLP_ENDPOINT",
                read_by: "compose",
                meaning: "`OTEL_EXPORTER_OTLP_ENDPOINT` of every service; default `http://jaeger:4317`.",
            },
            EnvVar {
                name: "GATEWAY_OTLP_SINK",
                read_by: "docker/compose.offline.yml",
                meaning: "Where the offline stack's OTLP relay forwards spans; default `host.docker.internal:4317`.",
            },
            EnvVar {
                name: "GATEWAY_EDGE_PORT",
                read_by: "compose",
                meaning: "Host port (on 127.0.0.1) of the edge load balancer; default 8080.",
            },
            EnvVar {
                name: "GATEWAY_EDGE_TLS_PORT",
                read_by: "compose",
                meaning: "Host port (on 127.0.0.1) of the edge's TLS pass-through to the data planes' HTTPS listeners; default 8443.",
            },
            EnvVar {
                name: "GATEWAY_CONTROL_PLANE_PORT",
                read_by: "compose",
                meaning: "Host port (on 127.0.0.1) of the control plane's gRPC; default 50051.",
            },
            EnvVar {
                name: "GATEWAY_JAEGER_UI_PORT",
                read_by: "compose",
                meaning: "Host port (on 127.0.0.1) of the Jaeger UI; default 16686.",
            },
            EnvVar {
                name: "GATEWAY_EDGE_NET",
                read_by: "compose",
                meaning: "First three octets of the edge network; default `10.213.80`.",
            },
            EnvVar {
                name: "GATEWAY_STATE_NET",
                read_by: "compose",
                meaning: "First three octets of the state network (Redis, auth service, data planes); default `10.213.82`.",
            },
        ],
    },
];

/// The whole of `docs/flags.md` for these commands (in this order).
pub fn render(commands: &[Command]) -> String {
    let mut out = String::new();
    out.push_str("# Flags and environment variables\n\n");
    let _ = writeln!(
        out,
        "<!-- Generated from the binaries' clap definitions by tests/src/flags_reference.rs; do not edit.\n     Regenerate with: {REGENERATE} -->\n"
    );
    out.push_str(
        "Every flag can also be set through the environment variable next to it; a flag given on \
         the command line wins over its variable. A switch (a flag without a value) takes `true` or \
         `false` from its variable, nothing else. Every binary also answers `-h`/`--help` and \
         `-V`/`--version` (subcommands: `--help`).\n\n",
    );
    out.push_str("| binary | |\n|---|---|\n");
    for c in commands {
        let _ = writeln!(
            out,
            "| [`{name}`](#{name}) | {about} |",
            name = c.get_name(),
            about = cell(&about(c))
        );
    }
    out.push_str(
        "| [other variables](#environment-variables-read-outside-clap) | logging, tracing, fault \
         hooks, devstack, compose |\n",
    );
    for c in commands {
        let mut c = c.clone();
        c.build();
        render_command(&mut out, &c, &[]);
    }
    render_other(&mut out);
    // Sections without a table (a command with only subcommands) leave double blank lines.
    while out.contains("\n\n\n") {
        out = out.replace("\n\n\n", "\n\n");
    }
    out
}

fn render_command(out: &mut String, c: &Command, parents: &[&str]) {
    let mut path: Vec<&str> = parents.to_vec();
    path.push(c.get_name());
    let title = path.join(" ");
    let level = if parents.is_empty() { "##" } else { "###" };
    let _ = writeln!(out, "\n{level} {title}\n");
    let text = about(c);
    if !text.is_empty() {
        let _ = writeln!(out, "{}\n", escape_html(&text));
    }
    let _ = writeln!(out, "Usage: `{}`\n", usage(c, &path));
    let args: Vec<&Arg> = c.get_arguments().filter(|a| shown(a)).collect();
    if !args.is_empty() {
        out.push_str("| flag | environment variable | default | meaning |\n|---|---|---|---|\n");
        for a in args {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                flag(a),
                env(a),
                default(a),
                meaning(a)
            );
        }
    }
    let subs: Vec<&Command> = c
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        out.push_str("\nSubcommands: ");
        let names: Vec<String> = subs
            .iter()
            .map(|s| {
                let anchor = format!("{title} {}", s.get_name()).replace(' ', "-");
                format!("[`{}`](#{anchor})", s.get_name())
            })
            .collect();
        out.push_str(&names.join(", "));
        out.push_str(".\n");
        for s in subs {
            render_command(out, s, &path);
        }
    }
}

fn render_other(out: &mut String) {
    out.push_str("\n## Environment variables read outside clap\n\n");
    out.push_str(
        "Read with `std::env` (or by a library) rather than through a flag, or used by the \
         container files. `tests/tests/flags_reference.rs` checks that every variable the \
         binaries' sources read, and every `${…}` of the compose files, is listed here.\n",
    );
    for group in OTHER_ENVIRONMENT {
        let _ = writeln!(
            out,
            "\n### {}\n\n| variable | read by | meaning |\n|---|---|---|",
            group.title
        );
        for v in group.vars {
            let name = if v.name.starts_with('(') {
                cell(v.name)
            } else {
                format!("`{}`", v.name)
            };
            let _ = writeln!(out, "| {name} | {} | {} |", v.read_by, cell(v.meaning));
        }
    }
}

/// Whether `a` belongs in the table (clap's own `--help` / `--version` do not).
fn shown(a: &Arg) -> bool {
    !a.is_hide_set()
        && !matches!(
            a.get_action(),
            ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
        )
}

fn takes_value(a: &Arg) -> bool {
    a.get_action().takes_values()
}

fn value_name(a: &Arg) -> String {
    a.get_value_names()
        .and_then(|v| v.first())
        .map(ToString::to_string)
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase())
}

/// `--listen <LISTEN>`, `-v, --verbose`, `<NAME>` for a positional argument.
fn flag(a: &Arg) -> String {
    if a.is_positional() {
        return format!("`<{}>`", value_name(a));
    }
    let mut text = String::new();
    if let Some(s) = a.get_short() {
        let _ = write!(text, "-{s}");
        if a.get_long().is_some() {
            text.push_str(", ");
        }
    }
    if let Some(l) = a.get_long() {
        let _ = write!(text, "--{l}");
    }
    if takes_value(a) {
        let _ = write!(text, " <{}>", value_name(a));
    }
    format!("`{text}`")
}

fn env(a: &Arg) -> String {
    a.get_env()
        .map_or_else(|| "—".to_owned(), |e| format!("`{}`", e.to_string_lossy()))
}

fn default(a: &Arg) -> String {
    if a.is_required_set() {
        return "required".to_owned();
    }
    if !takes_value(a) {
        return "off".to_owned();
    }
    let values: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    if values.is_empty() {
        "—".to_owned()
    } else {
        values.join(", ")
    }
}

fn meaning(a: &Arg) -> String {
    let mut text = a
        .get_long_help()
        .or_else(|| a.get_help())
        .map(|h| one_line(&h.to_string()))
        .unwrap_or_default();
    if takes_value(a) {
        let values: Vec<String> = a
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| match v.get_help() {
                Some(h) => format!("`{}` ({})", v.get_name(), one_line(&h.to_string())),
                None => format!("`{}`", v.get_name()),
            })
            .collect();
        if !values.is_empty() {
            sentence(&mut text, &format!("One of: {}.", values.join(", ")));
        }
    }
    if let Some(delimiter) = a.get_value_delimiter() {
        sentence(&mut text, &format!("A list separated by `{delimiter}`."));
    }
    cell(text.trim())
}

/// Appends `more` to `text` as a new sentence (ending `text`'s with a period).
fn sentence(text: &mut String, more: &str) {
    if !text.is_empty() {
        if !text.ends_with(['.', '!', '?', ')']) {
            text.push('.');
        }
        text.push(' ');
    }
    text.push_str(more);
}

fn about(c: &Command) -> String {
    c.get_long_about()
        .or_else(|| c.get_about())
        .map(|s| one_line(&s.to_string()))
        .unwrap_or_default()
}

/// The usage line clap prints, without its `Usage: ` prefix.
fn usage(c: &Command, path: &[&str]) -> String {
    let mut sub = c.clone().bin_name(path.join(" "));
    let text = sub.render_usage().to_string();
    let text = one_line(&text);
    text.strip_prefix("Usage: ").unwrap_or(&text).to_owned()
}

/// Every run of whitespace (line breaks of wrapped help text included) as one space.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text for a table cell: one line, `|` escaped, `<`/`>` outside code spans as entities.
pub fn cell(s: &str) -> String {
    escape_html(&one_line(s)).replace('|', "\\|")
}

/// `<` and `>` outside backtick code spans as HTML entities, so `<stack dir>`
/// is shown rather than taken for a tag.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_code = false;
    for ch in s.chars() {
        match ch {
            '`' => {
                in_code = !in_code;
                out.push(ch);
            }
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            _ => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A demo binary with every kind of argument.
    #[derive(Debug, Parser)]
    #[command(name = "demo", version, about = "A demo binary: it shows the table.")]
    struct Demo {
        /// Where to listen
        /// (wrapped).
        #[arg(long, env = "DEMO_LISTEN", default_value = "127.0.0.1:1")]
        listen: String,
        /// A switch; see <stack dir> | pipes.
        #[arg(long, env = "DEMO_SWITCH")]
        switch: bool,
        /// Proxies.
        #[arg(long, value_delimiter = ',')]
        proxies: Vec<String>,
        /// Format.
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        #[command(subcommand)]
        command: Option<Sub>,
    }

    #[derive(Debug, Clone, Copy, clap::ValueEnum)]
    enum Format {
        /// Lines for people.
        Text,
        /// JSON.
        Json,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        /// Do it.
        Run {
            /// The target.
            name: String,
        },
    }

    #[test]
    fn renders_flags_env_defaults_values_and_subcommands() {
        use clap::CommandFactory as _;
        let text = render(&[Demo::command()]);
        for line in [
            "| [`demo`](#demo) | A demo binary: it shows the table. |",
            "## demo\n\nA demo binary: it shows the table.\n\nUsage: `demo [OPTIONS] [COMMAND]`",
            "| `--listen <LISTEN>` | `DEMO_LISTEN` | `127.0.0.1:1` | Where to listen (wrapped) |",
            "| `--switch` | `DEMO_SWITCH` | off | A switch; see &lt;stack dir&gt; \\| pipes |",
            "| `--proxies <PROXIES>` | — | — | Proxies. A list separated by `,`. |",
            "| `--format <FORMAT>` | — | `text` | Format. One of: `text` (Lines for people), `json` (JSON). |",
            "Subcommands: [`run`](#demo-run).",
            "### demo run\n\nDo it\n\nUsage: `demo run <NAME>`",
            "| `<NAME>` | — | required | The target |",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        // clap's own flags are left out; the trailing period of a one-line doc comment is clap's to drop.
        assert!(!text.contains("| `-h, --help`"), "{text}");
        assert!(!text.contains("| `-V, --version`"), "{text}");
    }

    #[test]
    fn html_is_escaped_outside_code_only() {
        assert_eq!(escape_html("a <b> `<c>` d"), "a &lt;b&gt; `<c>` d");
        assert_eq!(cell("x |\n y"), "x \\| y");
    }
}
