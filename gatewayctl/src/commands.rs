//! The subcommands, each writing what it shows to `out`.

use std::io::Write;

use gateway_proto::v1::{
    ApplyConfigRequest, DataPlaneState, GetConfigRequest, ListConfigVersionsRequest,
    ListDataPlanesRequest, RollbackConfigRequest,
};
use serde_json::{Map, Value};

use crate::args::Format;
use crate::connect::Admin;
use crate::diff::Sides;
use crate::emit;
use crate::error::CtlError;
use crate::file::ConfigFile;

/// What a command ended with, for the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done (exit 0).
    Done,
    /// `diff --exit-code` found changes (exit 1).
    Changes,
}

fn io(e: std::io::Error) -> CtlError {
    CtlError::Read("standard output".into(), e)
}

/// `dump`: the configuration as a file `apply` takes back. Secrets are not
/// returned by the control plane; an upstream that has one gets a comment
/// saying so (an empty secret in a file keeps the current one).
pub async fn dump(
    admin: &mut Admin,
    version: Option<u64>,
    format: Format,
    out: &mut dyn Write,
) -> Result<Outcome, CtlError> {
    let snapshot = admin
        .get_config(GetConfigRequest { version })
        .await?
        .into_inner();
    let mut upstreams = Vec::new();
    let mut with_secret = Vec::new();
    for u in &snapshot.upstreams {
        let mut v = serde_json::to_value(u).unwrap_or(Value::Null);
        // Output only: a file does not carry it.
        if let Value::Object(map) = &mut v {
            map.remove("identitySigningSecretSet");
        }
        if u.identity_signing_secret_set {
            with_secret.push(u.name.clone());
        }
        upstreams.push(escape_env(v));
    }
    let routes: Vec<Value> = snapshot
        .routes
        .iter()
        .map(|r| escape_env(serde_json::to_value(r).unwrap_or(Value::Null)))
        .collect();
    let mut doc = Map::new();
    doc.insert("routes".into(), Value::Array(routes));
    doc.insert("upstreams".into(), Value::Array(upstreams));
    if !snapshot.jwt_issuers.is_empty() {
        let issuers = snapshot
            .jwt_issuers
            .iter()
            .map(|i| escape_env(serde_json::to_value(i).unwrap_or(Value::Null)))
            .collect();
        doc.insert("jwtIssuers".into(), Value::Array(issuers));
    }
    let doc = Value::Object(doc);
    let text = match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Yaml => {
            let mut s = format!(
                "# gateway configuration version {} ({}, by {})\n",
                snapshot.version, snapshot.created_at, snapshot.author
            );
            for name in &with_secret {
                s.push_str(&format!(
                    "# upstream \"{name}\" has an identitySigningSecret (never returned): left out it stays as it is; \
                     set identitySigningSecret: \"${{GATEWAY_VAR_NAME}}\" to change it\n"
                ));
            }
            s.push_str(&emit::yaml(&doc));
            s
        }
    };
    out.write_all(text.as_bytes()).map_err(io)?;
    Ok(Outcome::Done)
}

/// Every string's `${` written as `$${`, so reading the file back does not
/// take it for an environment variable.
fn escape_env(value: Value) -> Value {
    match value {
        Value::String(s) if s.contains("${") => Value::String(s.replace("${", "$${")),
        Value::Array(items) => Value::Array(items.into_iter().map(escape_env).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, escape_env(v))).collect())
        }
        other => other,
    }
}

fn apply_request(file: &ConfigFile, dry_run: bool, expected: Option<u64>) -> ApplyConfigRequest {
    ApplyConfigRequest {
        routes: file.routes.clone(),
        upstreams: file.upstreams.clone(),
        dry_run,
        expected_version: expected,
        // A file has no certificates section: an empty list keeps the
        // control plane's certificates as they are.
        certificates: Vec::new(),
        clear_certificates: false,
        // Likewise for a file without JWT issuers.
        jwt_issuers: file.jwt_issuers.clone(),
    }
}

/// `diff`: the control plane's dry run of the file, field by field.
pub async fn diff(
    admin: &mut Admin,
    file: &ConfigFile,
    exit_code: bool,
    out: &mut dyn Write,
) -> Result<Outcome, CtlError> {
    file.validate()?;
    let current = admin
        .get_config(GetConfigRequest { version: None })
        .await?
        .into_inner();
    let answer = admin
        .apply_config(apply_request(file, true, None))
        .await?
        .into_inner();
    if answer.changes.is_empty() {
        writeln!(
            out,
            "no changes: version {} already is this file",
            current.version
        )
        .map_err(io)?;
        return Ok(Outcome::Done);
    }
    let desired_issuers = if file.jwt_issuers.is_empty() {
        &current.jwt_issuers
    } else {
        &file.jwt_issuers
    };
    let sides = Sides::new(
        (&current.routes, &current.upstreams),
        (&file.routes, &file.upstreams),
    )
    .with_jwt_issuers(&current.jwt_issuers, desired_issuers);
    out.write_all(sides.render(&answer.changes).as_bytes())
        .map_err(io)?;
    writeln!(
        out,
        "{} change(s) against version {}; `gatewayctl apply` would commit version {}",
        answer.changes.len(),
        current.version,
        answer.version
    )
    .map_err(io)?;
    Ok(if exit_code {
        Outcome::Changes
    } else {
        Outcome::Done
    })
}

/// `apply`: the file becomes the configuration, as one version.
pub async fn apply(
    admin: &mut Admin,
    file: &ConfigFile,
    expected: Option<u64>,
    out: &mut dyn Write,
) -> Result<Outcome, CtlError> {
    file.validate()?;
    let answer = admin
        .apply_config(apply_request(file, false, expected))
        .await?
        .into_inner();
    if answer.changes.is_empty() {
        writeln!(out, "no changes: version {} is current", answer.version).map_err(io)?;
    } else {
        for c in &answer.changes {
            writeln!(out, "{} {} \"{}\"", c.action, c.kind, c.name).map_err(io)?;
        }
        writeln!(out, "committed version {}", answer.version).map_err(io)?;
    }
    Ok(Outcome::Done)
}

/// `rollback`: a new version with an old one's content.
pub async fn rollback(
    admin: &mut Admin,
    version: u64,
    expected: Option<u64>,
    out: &mut dyn Write,
) -> Result<Outcome, CtlError> {
    let before = admin
        .list_config_versions(ListConfigVersionsRequest { limit: Some(1) })
        .await?
        .into_inner()
        .versions
        .first()
        .map_or(0, |v| v.version);
    let answer = admin
        .rollback_config(RollbackConfigRequest {
            version,
            expected_version: expected,
        })
        .await?
        .into_inner();
    if answer.version == before {
        writeln!(
            out,
            "no changes: version {before} is current and has the content of version {version}"
        )
    } else {
        writeln!(
            out,
            "committed version {} (the content of version {version})",
            answer.version
        )
    }
    .map_err(io)?;
    Ok(Outcome::Done)
}

/// `status`: the current version and each data plane's.
pub async fn status(admin: &mut Admin, out: &mut dyn Write) -> Result<Outcome, CtlError> {
    let planes = admin
        .list_data_planes(ListDataPlanesRequest {})
        .await?
        .into_inner();
    writeln!(out, "current version {}", planes.current_version).map_err(io)?;
    if planes.data_planes.is_empty() {
        writeln!(out, "no data plane has connected").map_err(io)?;
        return Ok(Outcome::Done);
    }
    let rows: Vec<[String; 5]> = planes
        .data_planes
        .iter()
        .map(|d| {
            let state = DataPlaneState::try_from(d.status)
                .map(|s| s.as_str_name().to_owned())
                .unwrap_or_else(|_| d.status.to_string());
            let nack = if d.last_nack_version > 0 {
                format!("v{}: {}", d.last_nack_version, d.last_nack_error)
            } else {
                String::new()
            };
            [
                d.node_id.clone(),
                state,
                d.acked_version.to_string(),
                d.last_seen.clone(),
                nack,
            ]
        })
        .collect();
    let header = ["NODE", "STATE", "ACKED", "LAST SEEN", "LAST NACK"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s.trim_end().to_owned()
    };
    writeln!(out, "{}", line(header)).map_err(io)?;
    for row in &rows {
        writeln!(out, "{}", line(row.each_ref().map(String::as_str))).map_err(io)?;
    }
    Ok(Outcome::Done)
}

/// `validate`: the file checked offline.
pub fn validate(file: &ConfigFile, out: &mut dyn Write) -> Result<Outcome, CtlError> {
    file.validate()?;
    writeln!(
        out,
        "{}: valid ({} routes, {} upstreams)",
        file.name,
        file.routes.len(),
        file.upstreams.len()
    )
    .map_err(io)?;
    Ok(Outcome::Done)
}
