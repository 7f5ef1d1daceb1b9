//! `containerd-shim-chalk-v1 -info`: containerd 2.x asks a shim binary what it is (name,
//! version, and the OCI runtime features it supports) before it runs anything.

use std::io::{Read, Write};

use containerd_shim::protos::{
    protobuf::{well_known_types::any::Any, Message},
    types::introspection::{RuntimeInfo, RuntimeVersion},
};

const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// The OCI runtime features document for what runsc supports. Mount options, hooks and
/// namespaces are those gVisor honours; nothing is claimed that the sandbox would ignore
/// (no "rro": gVisor has no recursive read-only mounts).
pub fn features_json() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.1.0",
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"],
        "mountOptions": ["ro", "rw", "bind", "rbind", "nosuid", "nodev", "noexec", "private", "rprivate", "shared", "rshared", "slave", "rslave", "mode", "size"],
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "user", "uts"],
            "cgroup": { "v1": true, "v2": true },
            "seccomp": { "enabled": false },
            "apparmor": { "enabled": false },
            "selinux": { "enabled": false }
        },
        "annotations": { "dev.chalk.runtime": "gvisor" }
    })
}

pub fn runtime_info() -> RuntimeInfo {
    let mut version = RuntimeVersion::new();
    version.version = env!("CARGO_PKG_VERSION").to_string();
    let mut features = Any::new();
    features.type_url = FEATURES_TYPE_URL.to_string();
    features.value = features_json().to_string().into_bytes();
    let mut info = RuntimeInfo::new();
    info.name = "io.containerd.chalk.v1".to_string();
    info.version = Some(version).into();
    info.features = Some(features).into();
    info
}

/// Handles `-info` if it is on the command line: reads (and ignores) the options containerd
/// sends on stdin, prints the RuntimeInfo message. Returns whether it did.
pub fn handle_info_flag() -> bool {
    if !std::env::args()
        .skip(1)
        .any(|a| a == "-info" || a == "--info")
    {
        return false;
    }
    let mut options = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut options);
    match runtime_info().write_to_bytes() {
        Ok(bytes) => {
            let _ = std::io::stdout().write_all(&bytes);
        }
        Err(e) => {
            eprintln!("io.containerd.chalk.v1: encode runtime info: {e}");
            std::process::exit(1);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_names_the_runtime_and_carries_oci_features() {
        let info =
            RuntimeInfo::parse_from_bytes(&runtime_info().write_to_bytes().unwrap()).unwrap();
        assert_eq!(info.name, "io.containerd.chalk.v1");
        assert_eq!(info.features.type_url, FEATURES_TYPE_URL);
        let doc: serde_json::Value = serde_json::from_slice(&info.features.value).unwrap();
        assert_eq!(doc["ociVersionMax"], "1.1.0");
        assert!(doc["mountOptions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o != "rro"));
    }
}
