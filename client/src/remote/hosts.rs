//! Where a registry host's requests go, read as containerd reads it: the host's directory
//! under the hosts directory (`/etc/containerd/certs.d/<host[:port]>/hosts.toml`, else
//! `_default/`), with its mirrors (`[host."https://mirror"]`, tried in file order), the
//! upstream `server`, CA files and `skip_verify`. Pure but for reading those files.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::{Error, Result};

/// The directory ctr and containerd read registry hosts from by default.
pub const DEFAULT_DIR: &str = "/etc/containerd/certs.d";

/// What a host may be used for (hosts.toml's `capabilities`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Fetching manifests by tag.
    Resolve,
    /// Fetching blobs and manifests by digest.
    Pull,
    Push,
}

/// One place to send a registry's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host[:port]`, as in a reference.
    pub host: String,
    pub plain_http: bool,
    pub resolve: bool,
    pub pull: bool,
    pub push: bool,
    /// Extra CA certificates (PEM files) this endpoint's certificate may chain to.
    pub ca: Vec<PathBuf>,
    pub skip_verify: bool,
}

impl Endpoint {
    pub fn can(&self, u: Use) -> bool {
        match u {
            Use::Resolve => self.resolve,
            Use::Pull => self.pull,
            Use::Push => self.push,
        }
    }

    /// The registry host as a URL, for messages.
    pub fn url(&self) -> String {
        let scheme = if self.plain_http { "http" } else { "https" };
        format!("{scheme}://{}", self.host)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsFile {
    server: Option<String>,
    #[serde(default)]
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    ca: Option<OneOrMany>,
    #[serde(default)]
    skip_verify: Option<bool>,
    #[serde(default)]
    client: Option<toml::Value>,
    #[serde(default)]
    header: Option<toml::Value>,
    #[serde(default)]
    override_path: Option<bool>,
    #[serde(default)]
    host: BTreeMap<String, HostEntry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    #[serde(default)]
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    ca: Option<OneOrMany>,
    #[serde(default)]
    skip_verify: Option<bool>,
    #[serde(default)]
    client: Option<toml::Value>,
    #[serde(default)]
    header: Option<toml::Value>,
    #[serde(default)]
    override_path: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn paths(self, dir: &Path) -> Vec<PathBuf> {
        let list = match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        };
        list.into_iter().map(|p| dir.join(p)).collect()
    }
}

/// The endpoints for registry `registry` (a reference's `host[:port]`) under hosts directory
/// `dir`: its mirrors in file order, then its server. With no file for it, the registry
/// itself (over HTTPS unless `plain_http`), trusting the `*.crt` files its directory holds.
pub fn endpoints(dir: &Path, registry: &str, plain_http: bool) -> Result<Vec<Endpoint>> {
    let host_dir = [registry, "_default"]
        .iter()
        .map(|h| dir.join(h))
        .find(|d| d.is_dir());
    let Some(host_dir) = host_dir else {
        return Ok(vec![direct(registry, plain_http, Vec::new())]);
    };
    let file = host_dir.join("hosts.toml");
    match std::fs::read_to_string(&file) {
        Ok(text) => parse(&text, &host_dir, registry, plain_http)
            .map_err(|e| Error::from(format!("{}: {e}", file.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut ca: Vec<PathBuf> = std::fs::read_dir(&host_dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "crt"))
                .collect();
            ca.sort();
            Ok(vec![direct(registry, plain_http, ca)])
        }
        Err(e) => Err(format!("read {}: {e}", file.display()).into()),
    }
}

fn direct(registry: &str, plain_http: bool, ca: Vec<PathBuf>) -> Endpoint {
    Endpoint {
        host: registry.to_string(),
        plain_http,
        resolve: true,
        pull: true,
        push: true,
        ca,
        skip_verify: false,
    }
}

/// Parses one hosts.toml (its directory `dir` resolves relative CA paths).
pub fn parse(text: &str, dir: &Path, registry: &str, plain_http: bool) -> Result<Vec<Endpoint>> {
    let f: HostsFile = toml::from_str(text).map_err(|e| Error::from(e.to_string()))?;
    let unsupported = |what: &str, set: bool| -> Result<()> {
        if set {
            return Err(format!(
                "{what} is not supported by chalkctl yet: remove it, or move snapshots with a \
                 host that does not need it"
            )
            .into());
        }
        Ok(())
    };
    unsupported("client certificates (client)", f.client.is_some())?;
    unsupported("headers (header)", f.header.is_some())?;
    unsupported("override_path", f.override_path.unwrap_or(false))?;
    // TOML tables have no order of their own: mirrors go in the order the file lists them.
    let mut mirrors: Vec<(usize, String, HostEntry)> = f
        .host
        .into_iter()
        .map(|(url, entry)| {
            let at = text.find(&format!("\"{url}\"")).unwrap_or(usize::MAX);
            (at, url, entry)
        })
        .collect();
    mirrors.sort_by_key(|(at, ..)| *at);
    let mut out = Vec::new();
    for (_, url, entry) in mirrors {
        unsupported("client certificates (client)", entry.client.is_some())?;
        unsupported("headers (header)", entry.header.is_some())?;
        unsupported("override_path", entry.override_path.unwrap_or(false))?;
        let (host, http) = split_url(&url)?;
        let mut e = with_capabilities(host, http, entry.capabilities.as_deref())?;
        e.ca = entry.ca.map(|c| c.paths(dir)).unwrap_or_default();
        e.skip_verify = entry.skip_verify.unwrap_or(false);
        out.push(e);
    }
    let (host, http) = match &f.server {
        Some(url) => split_url(url)?,
        None => (registry.to_string(), plain_http),
    };
    let mut server = with_capabilities(host, http, f.capabilities.as_deref())?;
    server.ca = f.ca.map(|c| c.paths(dir)).unwrap_or_default();
    server.skip_verify = f.skip_verify.unwrap_or(false);
    out.push(server);
    Ok(out)
}

fn with_capabilities(host: String, plain_http: bool, caps: Option<&[String]>) -> Result<Endpoint> {
    let mut e = direct(&host, plain_http, Vec::new());
    if let Some(caps) = caps {
        e.resolve = false;
        e.pull = false;
        e.push = false;
        for c in caps {
            match c.as_str() {
                "resolve" => e.resolve = true,
                "pull" => e.pull = true,
                "push" => e.push = true,
                other => {
                    return Err(format!(
                        "capability {other:?} of {host}: expected pull, resolve or push"
                    )
                    .into())
                }
            }
        }
    }
    Ok(e)
}

/// `https://host[:port][/v2]` as host and whether it is plain HTTP.
fn split_url(url: &str) -> Result<(String, bool)> {
    let (http, rest) = if let Some(r) = url.strip_prefix("http://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (false, r)
    } else {
        return Err(format!("{url:?}: a host must be an http:// or https:// URL").into());
    };
    let host = rest.trim_end_matches('/');
    let host = host.strip_suffix("/v2").unwrap_or(host);
    if host.is_empty() || host.contains('/') {
        return Err(format!(
            "{url:?}: only a host[:port] (optionally /v2) is supported, not a path"
        )
        .into());
    }
    Ok((host.to_string(), http))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_come_first_in_file_order_then_the_server() {
        let text = r#"
server = "https://registry.example:5000"
ca = "ca.crt"

[host."https://zz-mirror.local"]
  capabilities = ["pull", "resolve"]
  skip_verify = true

[host."http://aa-mirror.local:8080"]
  capabilities = ["pull"]
  ca = ["/abs/one.pem", "two.pem"]
"#;
        let got = parse(text, Path::new("/etc/certs.d/reg"), "reg", false).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].host, "zz-mirror.local");
        assert!(got[0].skip_verify && got[0].resolve && !got[0].push);
        assert_eq!(got[1].host, "aa-mirror.local:8080");
        assert!(got[1].plain_http && got[1].pull && !got[1].resolve);
        assert_eq!(
            got[1].ca,
            [
                PathBuf::from("/abs/one.pem"),
                PathBuf::from("/etc/certs.d/reg/two.pem")
            ]
        );
        assert_eq!(got[2].host, "registry.example:5000");
        assert!(got[2].push && !got[2].plain_http);
        assert_eq!(got[2].ca, [PathBuf::from("/etc/certs.d/reg/ca.crt")]);
    }

    #[test]
    fn no_file_means_the_registry_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let got = endpoints(tmp.path(), "127.0.0.1:5000", true).unwrap();
        assert_eq!(got, [direct("127.0.0.1:5000", true, Vec::new())]);
        // A directory with only certificates: trusted, as containerd does.
        let d = tmp.path().join("127.0.0.1:5000");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("ca.crt"), "pem").unwrap();
        let got = endpoints(tmp.path(), "127.0.0.1:5000", false).unwrap();
        assert_eq!(got[0].ca, [d.join("ca.crt")]);
        // _default applies to hosts without a directory of their own.
        let def = tmp.path().join("_default");
        std::fs::create_dir(&def).unwrap();
        std::fs::write(def.join("hosts.toml"), "skip_verify = true\n").unwrap();
        let got = endpoints(tmp.path(), "other:1", false).unwrap();
        assert!(got[0].skip_verify && got[0].host == "other:1");
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let dir = Path::new("/x");
        for (text, word) in [
            ("server = \"ftp://x\"", "http:// or https://"),
            ("server = \"https://x/some/path\"", "not a path"),
            ("capabilities = [\"delete\"]", "capability \"delete\""),
            (
                "[host.\"https://m\"]\nclient = \"c.pem\"",
                "client certificates",
            ),
            ("override_path = true", "override_path"),
            ("sever = \"https://typo\"", "unknown field"),
        ] {
            let err = parse(text, dir, "r", false).unwrap_err().to_string();
            assert!(err.contains(word), "{text}: {err}");
        }
    }
}
