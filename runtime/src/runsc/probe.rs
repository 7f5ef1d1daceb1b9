//! Whether runsc can give a sandbox its own network on this host, found by trying: runsc's
//! default (`--network=sandbox`, gVisor's netstack over the container's namespace) works
//! with a current runsc, while Debian 12's 2022 build takes any namespace for the host's on
//! kernels that show net.core sysctls in every namespace, and refuses to start ("cannot run
//! with network enabled in root network namespace"). Only the host and the binary together
//! say which; the shim asks once per binary and boot, with a sandbox that runs `/bin/true`
//! from the host's root, read-only.

use std::path::Path;

use super::Runsc;
use crate::{netns, Error, Result};

/// What runsc's default settings give on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NetworkProbe {
    /// `--network=sandbox` works.
    Sandbox,
    /// Only `--network=none` does.
    NoneOnly,
}

/// The bundle of a sandbox that runs `/bin/true` from the host's root, read-only, with no
/// capabilities, in a network namespace of its own (as `ctr run` gets one).
fn probe_spec(netns_path: &Path) -> serde_json::Value {
    serde_json::json!({
        "ociVersion": "1.0.2",
        "root": {"path": "/", "readonly": true},
        "process": {"args": ["/bin/true"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                    "env": ["PATH=/usr/bin:/bin"]},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [
            {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
            {"type": "network", "path": netns_path.display().to_string()}
        ]}
    })
}

/// Tries `runsc create` and `start` (the 2022 build sets the network up at start) with
/// `runsc`'s flags plus `network`, in `work` (a private directory, emptied after); Ok(())
/// when the sandbox could run.
fn try_create(runsc: &Runsc, work: &Path, network: &str) -> Result<()> {
    let io = |what: &str, e| Error::io(format!("network probe: {what}"), e);
    let bundle = work.join(format!("bundle-{network}"));
    std::fs::create_dir_all(&bundle).map_err(|e| io("make its bundle", e))?;
    let ns = work.join(format!("netns-{network}"));
    std::fs::write(bundle.join("config.json"), probe_spec(&ns).to_string())
        .map_err(|e| io("write its spec", e))?;
    netns::create(&ns).map_err(|e| io("make its network namespace", e))?;
    let mut probe = runsc.clone();
    probe.global.root = work.join(format!("root-{network}"));
    probe.log_dir = bundle.clone();
    probe.global.flags.retain(|f| !f.starts_with("--network="));
    probe.add_flag(&format!("--network={network}"));
    let id = format!("chalk-probe-{}-{network}", std::process::id());
    let made = probe
        .create(
            &id,
            &bundle,
            &bundle.join("pid"),
            super::ProcessStdio::default(),
            None,
        )
        .and_then(|()| probe.start(&id));
    let _ = probe.delete(&id, true);
    netns::remove(&ns);
    made
}

/// What runsc says when it cannot give a sandbox a network of its own here.
const NO_NETWORK_HERE: &str = "cannot run with network enabled in root network namespace";

/// Whether runsc failed because it cannot give the sandbox a network of its own here: the
/// one place its words are read for that.
pub fn refuses_network(e: &Error) -> bool {
    matches!(e, Error::Runsc { message, .. } if message.contains(NO_NETWORK_HERE))
}

/// Finds out which network runsc's default settings can have here: None when the probe could
/// not tell (a failure that is not runsc refusing the network), and runsc's default stands.
pub fn network(runsc: &Runsc, work: &Path) -> Result<Option<NetworkProbe>> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(work)
        .map_err(|e| Error::io(format!("create {}", work.display()), e))?;
    let outcome = match try_create(runsc, work, "sandbox") {
        Ok(()) => Ok(Some(NetworkProbe::Sandbox)),
        Err(e) if !refuses_network(&e) => {
            log::warn!("network probe of {}: {e}", runsc.binary().display());
            Ok(None)
        }
        Err(_) => match try_create(runsc, work, "none") {
            Ok(()) => Ok(Some(NetworkProbe::NoneOnly)),
            Err(none) => Err(Error::Options {
                source_name: "without a network".into(),
                message: format!(
                    "{} cannot start a sandbox on this host with the runtime options' flags \
                     ({none}); choose them under [runsc_config] in the runtime options \
                     (/etc/containerd/chalk.toml by default): platform = \"ptrace\" works on \
                     any host, and set network",
                    runsc.binary().display()
                ),
            }),
        },
    };
    let _ = std::fs::remove_dir_all(work);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_sandbox_is_read_only_and_in_its_own_network() {
        let spec = probe_spec(Path::new("/run/chalk/.probe/netns"));
        assert_eq!(spec["root"]["readonly"], true);
        let nss = spec["linux"]["namespaces"].as_array().unwrap();
        assert!(nss
            .iter()
            .any(|n| n["type"] == "network" && n["path"] == "/run/chalk/.probe/netns"));
        assert!(spec["process"]["capabilities"].is_null(), "no capabilities");
    }
}
