//! A configuration file: YAML or JSON, `routes` and `upstreams` with the
//! field names of the proto's JSON mapping (camelCase, or the proto's
//! snake_case), unknown fields refused. Every error names the file and line.

use std::path::Path;

use gateway_proto::v1::{JwtIssuer, Route, Upstream};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::CtlError;
use crate::yaml::{self, Document};

/// The sections a file may have.
const SECTIONS: [&str; 4] = ["routes", "upstreams", "jwtIssuers", "jwt_issuers"];

/// A configuration read from a file, not yet validated.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// Where it came from, for messages (`-` for stdin).
    pub name: String,
    /// Its routes, in file order.
    pub routes: Vec<Route>,
    /// Its upstreams, in file order.
    pub upstreams: Vec<Upstream>,
    /// Its JWT issuers (section `jwtIssuers`), in file order. Empty (or no
    /// section) keeps the control plane's issuers as they are.
    pub jwt_issuers: Vec<JwtIssuer>,
    /// Its nodes' lines.
    pub document: Document,
}

/// Reads `path` (`-`: standard input), `${NAME}` filled from the environment.
pub fn load(path: &Path) -> Result<ConfigFile, CtlError> {
    let name = path.display().to_string();
    let text = if name == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| CtlError::Read(name.clone(), e))?
    } else {
        std::fs::read_to_string(path).map_err(|e| CtlError::Read(name.clone(), e))?
    };
    parse(&name, &text, &|var| std::env::var(var).ok())
}

/// Parses `text` (named `name` in messages).
pub fn parse(
    name: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConfigFile, CtlError> {
    let document = yaml::read(text, env)
        .map_err(|e| CtlError::Invalid(vec![format!("{name}:{}: {}", e.line, e.message)]))?;
    let at = |path: &str, message: String| {
        let line = document.line_of(path).unwrap_or(1);
        format!("{name}:{line}: {message}")
    };
    let sections = match &document.value {
        Value::Object(map) => map,
        Value::Null => {
            return Err(CtlError::Invalid(vec![format!(
                "{name}:1: the file is empty; it needs `routes:` and `upstreams:`"
            )]));
        }
        _ => {
            return Err(CtlError::Invalid(vec![format!(
                "{name}:1: the file must be a mapping with `routes:` and `upstreams:`"
            )]));
        }
    };
    let mut problems = Vec::new();
    for key in sections.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            problems.push(at(
                &yaml::snake_case(key),
                format!(
                    "unknown section `{key}` (a file has `routes`, `upstreams` and `jwtIssuers`)"
                ),
            ));
        }
    }
    let routes: Vec<Route> = items(sections.get("routes"), "routes", &at, &mut problems);
    let upstreams: Vec<Upstream> =
        items(sections.get("upstreams"), "upstreams", &at, &mut problems);
    let issuers_key = if sections.contains_key("jwt_issuers") {
        "jwt_issuers"
    } else {
        "jwtIssuers"
    };
    let jwt_issuers: Vec<JwtIssuer> =
        items(sections.get(issuers_key), issuers_key, &at, &mut problems);
    if !problems.is_empty() {
        return Err(CtlError::Invalid(problems));
    }
    Ok(ConfigFile {
        name: name.to_owned(),
        routes,
        upstreams,
        jwt_issuers,
        document,
    })
}

/// Each item of the list `section`, deserialised on its own so an error names
/// the item; `null` or absent is an empty list.
fn items<T: DeserializeOwned>(
    list: Option<&Value>,
    section: &str,
    at: &dyn Fn(&str, String) -> String,
    problems: &mut Vec<String>,
) -> Vec<T> {
    let list = match list {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Array(list)) => list,
        Some(_) => {
            problems.push(at(section, format!("`{section}` must be a list")));
            return Vec::new();
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let item_path = format!("{section}[{i}]");
        match serde_path_to_error::deserialize::<_, T>(item.clone()) {
            Ok(v) => out.push(v),
            Err(e) => {
                let inner = e.path().to_string();
                let path = if inner == "." || inner.is_empty() {
                    item_path.clone()
                } else {
                    format!("{item_path}.{}", yaml::snake_case(&inner))
                };
                let shown = if inner == "." || inner.is_empty() {
                    item_path.clone()
                } else {
                    format!("{item_path}.{inner}")
                };
                problems.push(at(&path, format!("{shown}: {}", e.inner())));
            }
        }
    }
    out
}

impl ConfigFile {
    /// The control plane's own validation; each problem points at the line of
    /// the route or upstream it names (and of the field, when it names one).
    pub fn validate(&self) -> Result<(), CtlError> {
        let mut all = Vec::new();
        if let Err(e) = gateway_proto::validate_config(&self.routes, &self.upstreams) {
            all.extend(e.problems);
        }
        // Without a `jwtIssuers` section the control plane keeps its issuers,
        // which it checks the routes' jwt_issuers against.
        if !self.jwt_issuers.is_empty()
            && let Err(e) =
                gateway_proto::validate::validate_jwt_issuers(&self.jwt_issuers, &self.routes)
        {
            all.extend(e.problems);
        }
        if all.is_empty() {
            return Ok(());
        }
        let problems = all
            .iter()
            .map(|p| {
                let line = self.line_of_problem(p).unwrap_or(1);
                format!("{}:{line}: {p}", self.name)
            })
            .collect();
        Err(CtlError::Invalid(problems))
    }

    /// `route "NAME": FIELD …` → the line of that route's FIELD (or of the
    /// route), likewise for upstreams.
    fn line_of_problem(&self, problem: &str) -> Option<usize> {
        let (section, rest, index) = if let Some(rest) = problem.strip_prefix("route \"") {
            let (name, rest) = rest.split_once('"')?;
            let i = self.routes.iter().position(|r| r.name == name)?;
            ("routes", rest, i)
        } else if let Some(rest) = problem.strip_prefix("upstream \"") {
            let (name, rest) = rest.split_once('"')?;
            let i = self.upstreams.iter().position(|u| u.name == name)?;
            ("upstreams", rest, i)
        } else if let Some(rest) = problem.strip_prefix("jwt issuer \"") {
            let (name, rest) = rest.split_once('"')?;
            let i = self.jwt_issuers.iter().position(|u| u.name == name)?;
            ("jwt_issuers", rest, i)
        } else {
            return None;
        };
        let rest = rest.strip_prefix(": ").unwrap_or_default();
        let field = |r: &str| r.split([' ', ':']).next().unwrap_or_default().to_owned();
        // `instance "ID": FIELD …` names one of an upstream's instances.
        let field = match rest.strip_prefix("instance \"") {
            Some(r) if section == "upstreams" => {
                let (id, r) = r.split_once('"')?;
                let i = self.upstreams[index]
                    .instances
                    .iter()
                    .position(|inst| inst.id == id)?;
                format!(
                    "instances[{i}].{}",
                    field(r.strip_prefix(": ").unwrap_or_default())
                )
            }
            _ => field(rest),
        };
        self.document
            .line_of(&format!("{section}[{index}].{field}"))
    }
}

#[cfg(test)]
mod tests;
