//! Registry credentials, found where the docker and containerd tools keep them: `--user`
//! (`user[:password]`, the password read from stdin when left out), else the docker
//! `config.json` (`$DOCKER_CONFIG`, else `~/.docker`): its `auths` or a credential helper.
//! Credentials are passed to the registry and to nothing else: never written, never logged,
//! and their Debug form shows the user only.

use std::path::PathBuf;

use base64::Engine;
use serde_json::Value;

use crate::{Error, Result};

#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Anonymous,
    Basic { user: String, password: String },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("anonymous"),
            Credentials::Basic { user, .. } => write!(f, "user {user:?} (password hidden)"),
        }
    }
}

impl Credentials {
    /// Who, for messages: never the secret.
    pub fn describe(&self) -> String {
        format!("{self:?}")
    }
}

/// `--user user[:password]`; `read_password` is asked when the password is left out.
pub fn from_user_flag(
    flag: &str,
    read_password: impl FnOnce() -> Result<String>,
) -> Result<Credentials> {
    let (user, password) = match flag.split_once(':') {
        Some((u, p)) => (u.to_string(), p.to_string()),
        None => (flag.to_string(), read_password()?),
    };
    if user.is_empty() {
        return Err(
            "--user: give user[:password] (the password is read from stdin when left \
                    out)"
                .into(),
        );
    }
    Ok(Credentials::Basic { user, password })
}

/// Where a docker config says to find `registry`'s credentials.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    Inline(Credentials),
    /// A credential helper: `docker-credential-<name>`.
    Helper(String),
}

/// What docker config `text` holds for `registry` (`host[:port]`); None when nothing.
pub fn from_docker_config(text: &str, registry: &str) -> Result<Option<Found>> {
    let config: Value = serde_json::from_str(text)
        .map_err(|e| Error::from(format!("the docker config is not JSON: {e}")))?;
    let wanted = aliases(registry);
    if let Some(helper) = config["credHelpers"]
        .as_object()
        .into_iter()
        .flatten()
        .find(|(k, _)| wanted.contains(&key_host(k)))
        .and_then(|(_, v)| v.as_str())
    {
        return Ok(Some(Found::Helper(helper.to_string())));
    }
    let entry = config["auths"]
        .as_object()
        .into_iter()
        .flatten()
        .find(|(k, _)| wanted.contains(&key_host(k)))
        .map(|(_, v)| v);
    if let Some(entry) = entry {
        if let Some(auth) = entry["auth"].as_str().filter(|a| !a.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    Error::from(format!(
                        "the docker config's auth for {registry} is not base64 of user:password"
                    ))
                })?;
            let (user, password) = decoded.split_once(':').ok_or_else(|| {
                Error::from(format!(
                    "the docker config's auth for {registry} is not user:password"
                ))
            })?;
            return Ok(Some(Found::Inline(Credentials::Basic {
                user: user.into(),
                password: password.into(),
            })));
        }
        if let (Some(u), Some(p)) = (entry["username"].as_str(), entry["password"].as_str()) {
            return Ok(Some(Found::Inline(Credentials::Basic {
                user: u.into(),
                password: p.into(),
            })));
        }
    }
    Ok(config["credsStore"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(|s| Found::Helper(s.to_string())))
}

/// A config key's host: keys may be URLs (`https://index.docker.io/v1/`).
fn key_host(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k).to_string()
}

/// The names a registry goes by in docker configs (Docker Hub has three).
fn aliases(registry: &str) -> Vec<String> {
    match registry {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => {
            vec![
                "docker.io".into(),
                "index.docker.io".into(),
                "registry-1.docker.io".into(),
            ]
        }
        other => vec![other.to_string()],
    }
}

/// The docker config file in effect, if there is one.
pub fn docker_config_path() -> Option<PathBuf> {
    let dir = std::env::var_os("DOCKER_CONFIG")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))?;
    Some(dir.join("config.json")).filter(|p| p.is_file())
}

/// The credentials for `registry`: `flag` (`--user`) first, else the docker config, else
/// anonymous.
pub fn lookup(registry: &str, flag: Option<&str>) -> Result<Credentials> {
    if let Some(flag) = flag {
        return from_user_flag(flag, read_password_line);
    }
    let Some(path) = docker_config_path() else {
        return Ok(Credentials::Anonymous);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::from(format!("read {}: {e}", path.display())))?;
    match from_docker_config(&text, registry)
        .map_err(|e| Error::from(format!("{}: {e}", path.display())))?
    {
        None => Ok(Credentials::Anonymous),
        Some(Found::Inline(c)) => Ok(c),
        Some(Found::Helper(name)) => run_helper(&name, registry),
    }
}

fn read_password_line() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Error::from(format!("read the password from stdin: {e}")))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Asks credential helper `docker-credential-<name>` for `registry`'s credentials.
fn run_helper(name: &str, registry: &str) -> Result<Credentials> {
    use std::io::Write;
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!("credential helper {name:?}: not a helper name").into());
    }
    let program = format!("docker-credential-{name}");
    let mut child = std::process::Command::new(&program)
        .arg("get")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| Error::from(format!("run {program} (the docker config names it): {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(registry.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::from(format!("{program}: {e}")))?;
    if !out.status.success() {
        // Helpers say "credentials not found" this way: go anonymous, as docker does.
        return Ok(Credentials::Anonymous);
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|_| Error::from(format!("{program} did not answer in JSON")))?;
    match (v["Username"].as_str(), v["Secret"].as_str()) {
        (Some(u), Some(s)) if !u.is_empty() => Ok(Credentials::Basic {
            user: u.into(),
            password: s.into(),
        }),
        _ => Ok(Credentials::Anonymous),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_flag_with_or_without_a_password() {
        let c = from_user_flag("ann:s3cret:x", || unreachable!()).unwrap();
        assert_eq!(
            c,
            Credentials::Basic {
                user: "ann".into(),
                password: "s3cret:x".into()
            }
        );
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "Debug shows no secret"
        );
        let c = from_user_flag("bob", || Ok("pw".into())).unwrap();
        assert!(matches!(c, Credentials::Basic { password, .. } if password == "pw"));
        assert!(from_user_flag(":pw", || unreachable!()).is_err());
    }

    #[test]
    fn docker_config_auths_and_helpers() {
        let text = r#"{
            "auths": {
                "https://index.docker.io/v1/": {"auth": "aHViOmh1YnB3"},
                "127.0.0.1:5000": {"username": "u", "password": "p"},
                "bad.example": {"auth": "!!"}
            },
            "credHelpers": {"gcr.io": "gcloud"},
            "credsStore": "desktop"
        }"#;
        let hub = from_docker_config(text, "docker.io").unwrap().unwrap();
        assert_eq!(
            hub,
            Found::Inline(Credentials::Basic {
                user: "hub".into(),
                password: "hubpw".into()
            })
        );
        let local = from_docker_config(text, "127.0.0.1:5000").unwrap().unwrap();
        assert!(matches!(local, Found::Inline(Credentials::Basic { user, .. }) if user == "u"));
        assert_eq!(
            from_docker_config(text, "gcr.io").unwrap(),
            Some(Found::Helper("gcloud".into()))
        );
        assert_eq!(
            from_docker_config(text, "elsewhere:1").unwrap(),
            Some(Found::Helper("desktop".into()))
        );
        assert!(from_docker_config(text, "bad.example").is_err());
        assert_eq!(from_docker_config("{}", "x").unwrap(), None);
    }
}
