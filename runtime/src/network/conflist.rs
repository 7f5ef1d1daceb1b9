//! CNI network configuration lists: found by name in a directory as libcni finds them (files
//! in name order, the first whose network has the name), the default network written on
//! first use, and each plugin's input composed as the CNI spec says (the list's name and
//! version, the previous plugin's result, and the runtime values its capabilities ask for).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// A network configuration list, as read (a single-plugin `.conf` becomes a list of one).
#[derive(Debug, Clone, PartialEq)]
pub struct Conflist {
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Value>,
    /// The file it came from.
    pub file: PathBuf,
}

impl Conflist {
    /// Reads a `.conflist`, or a `.conf`/`.json` holding one plugin.
    pub fn parse(text: &str, file: &Path) -> Result<Conflist, String> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
        let name = v["name"]
            .as_str()
            .ok_or_else(|| format!("{}: no \"name\"", file.display()))?
            .to_string();
        let cni_version = v["cniVersion"].as_str().unwrap_or("0.4.0").to_string();
        let plugins = match v.get("plugins") {
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return Err(format!("{}: \"plugins\" is not a list", file.display())),
            None => vec![v.clone()],
        };
        if plugins.is_empty() || plugins.iter().any(|p| !p["type"].is_string()) {
            return Err(format!(
                "{}: each plugin needs a \"type\" (and there must be one)",
                file.display()
            ));
        }
        Ok(Conflist {
            name,
            cni_version,
            plugins,
            file: file.to_path_buf(),
        })
    }

    /// The list in `dir` whose network is `name`; None when none is.
    pub fn find(dir: &Path, name: &str) -> Result<Option<Conflist>, String> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("read {}: {e}", dir.display())),
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("conflist" | "conf" | "json")
                )
            })
            .collect();
        files.sort();
        for file in files {
            // Another program's broken file must not hide ours: skip what does not parse.
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            match Conflist::parse(&text, &file) {
                Ok(list) if list.name == name => return Ok(Some(list)),
                Ok(_) => {}
                Err(e) => log::debug!("skipping CNI configuration: {e}"),
            }
        }
        Ok(None)
    }

    /// What plugin `index` reads on stdin: its own configuration with the list's name and
    /// version, `prev` (the result so far) and the runtime values its capabilities take.
    pub fn plugin_input(&self, index: usize, prev: Option<&Value>, runtime: &Value) -> Value {
        let mut input = self.plugins[index].clone();
        input["name"] = self.name.clone().into();
        input["cniVersion"] = self.cni_version.clone().into();
        if let Some(prev) = prev {
            input["prevResult"] = prev.clone();
        }
        let mut rc = serde_json::Map::new();
        if let Some(caps) = input.get("capabilities").and_then(Value::as_object) {
            for (cap, on) in caps {
                if on.as_bool() == Some(true) {
                    if let Some(v) = runtime.get(cap) {
                        rc.insert(cap.clone(), v.clone());
                    }
                }
            }
        }
        if !rc.is_empty() {
            input["runtimeConfig"] = Value::Object(rc);
        }
        input
    }

    /// Each plugin's type, in order.
    pub fn types(&self) -> Vec<&str> {
        self.plugins
            .iter()
            .filter_map(|p| p["type"].as_str())
            .collect()
    }
}

/// The default network: a bridge with NAT to the host's networks, published ports through
/// portmap, and forwarding allowed for its subnet (firewall), as nerdctl's default is; its
/// IPAM takes an address asked for (`ips`: a sandbox back on its host asks for its own).
pub fn default_conflist(name: &str, subnet: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {"type": "bridge", "bridge": format!("{name}0"), "isGateway": true, "ipMasq": true,
             "hairpinMode": true, "capabilities": {"ips": true},
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "firewall"}
        ]
    })
}

/// The list named `name` in `dir`, writing the default network there first when it is the
/// default's name and no file has it.
pub fn find_or_write_default(
    dir: &Path,
    name: &str,
    default_subnet: &str,
) -> Result<Conflist, String> {
    if let Some(list) = Conflist::find(dir, name)? {
        return Ok(list);
    }
    if name != super::DEFAULT_NETWORK {
        return Err(format!(
            "no CNI network named {name:?} in {}: write its configuration list there, or use \
             --net {} (written on first use) or --net none",
            dir.display(),
            super::DEFAULT_NETWORK
        ));
    }
    let file = dir.join(format!("{name}.conflist"));
    let text = serde_json::to_string_pretty(&default_conflist(name, default_subnet))
        .expect("a JSON value serializes");
    write_atomically(&file, text.as_bytes())
        .map_err(|e| format!("write the default network {}: {e}", file.display()))?;
    log::info!("wrote the default network {name:?} to {}", file.display());
    Conflist::parse(&text, &file)
}

/// Writes `file` whole or not at all: two sandboxes starting at once may both write it.
fn write_atomically(file: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = file.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}",
        file.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("conflist"),
        std::process::id()
    ));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_found_by_its_network_name_in_file_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("00-broken.conflist"), "{").unwrap();
        std::fs::write(
            dir.path().join("10-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("20-b.conf"),
            r#"{"cniVersion":"0.4.0","name":"b","type":"bridge"}"#,
        )
        .unwrap();
        let b = Conflist::find(dir.path(), "b").unwrap().unwrap();
        assert_eq!(b.types(), ["bridge"]);
        assert_eq!(b.cni_version, "0.4.0");
        assert!(Conflist::find(dir.path(), "c").unwrap().is_none());
    }

    #[test]
    fn the_default_is_written_once_and_other_names_are_not_made_up() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        let list = find_or_write_default(&conf, "chalk", "10.9.0.0/16").unwrap();
        assert_eq!(list.types(), ["bridge", "portmap", "firewall"]);
        assert_eq!(
            list.plugins[0]["ipam"]["ranges"][0][0]["subnet"],
            "10.9.0.0/16"
        );
        assert!(conf.join("chalk.conflist").exists());
        let e = find_or_write_default(&conf, "lab", "10.9.0.0/16").unwrap_err();
        assert!(e.contains("no CNI network named \"lab\""), "{e}");
    }

    #[test]
    fn plugin_input_carries_name_version_result_and_only_asked_capabilities() {
        let list = Conflist::parse(
            &default_conflist("chalk", "10.9.0.0/16").to_string(),
            Path::new("x"),
        )
        .unwrap();
        let runtime = json!({"portMappings": [{"hostPort": 8080}], "ips": ["10.9.0.5"]});
        let bridge = list.plugin_input(0, None, &runtime);
        assert_eq!(bridge["name"], "chalk");
        // The bridge takes the addresses asked for (its IPAM reads them), not the ports.
        assert_eq!(bridge["runtimeConfig"], json!({"ips": ["10.9.0.5"]}));
        assert!(bridge.get("prevResult").is_none());
        let firewall = list.plugin_input(2, None, &runtime);
        assert!(firewall.get("runtimeConfig").is_none());
        let prev = json!({"ips": []});
        let portmap = list.plugin_input(1, Some(&prev), &runtime);
        assert_eq!(portmap["prevResult"], prev);
        assert_eq!(
            portmap["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080}]})
        );
    }
}
