//! `chalkctl run IMAGE ID [-- CMD...]`: a sandbox of this runtime, to try things with. It
//! gets containerd's usual defaults (those of `ctr run`) and no stdio.

use std::collections::HashMap;

use chalk_runtime::{
    lifetime::{Lifetime, LIFETIME_ANNOTATION, ON_TIMEOUT_ANNOTATION},
    spec::strings,
};
use containerd_client::services::v1::{container::Runtime, Container};
use serde_json::{json, Value};

use crate::{
    client::{Client, Result, Stdio},
    fork::image_config,
    snapshots::RUNTIME,
    Error,
};

const SPEC_TYPE: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";

/// The capabilities containerd gives a container by default.
const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The OCI spec for `id` from the image `config` (its `config` section: Entrypoint, Cmd, Env,
/// WorkingDir), with `cmd` replacing the image's Cmd when given, and `lifetime` (its length
/// and what happens at its end) as the annotations the shim reads.
pub fn spec(
    id: &str,
    config: &Value,
    lifetime: (Option<&str>, Option<&str>),
    cmd: &[String],
) -> Result<Value> {
    let c = &config["config"];
    let mut args = strings(&c["Entrypoint"]);
    if cmd.is_empty() {
        args.extend(strings(&c["Cmd"]));
    } else {
        args.extend(cmd.iter().cloned());
    }
    if args.is_empty() {
        return Err("the image names no command: give one after --".into());
    }
    let mut env = strings(&c["Env"]);
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    }
    let cwd = c["WorkingDir"]
        .as_str()
        .filter(|w| !w.is_empty())
        .unwrap_or("/");
    let tmpfs = |dest: &str, source: &str, opts: &[&str]| json!({"destination": dest, "type": "tmpfs", "source": source, "options": opts});
    let mut annotations = serde_json::Map::new();
    if let Some(l) = lifetime.0 {
        annotations.insert(LIFETIME_ANNOTATION.into(), l.into());
    }
    if let Some(o) = lifetime.1 {
        annotations.insert(ON_TIMEOUT_ANNOTATION.into(), o.into());
    }
    let spec = json!({
        "ociVersion": "1.1.0",
        "root": {"path": "rootfs"},
        "hostname": id,
        "process": {
            "user": {"uid": 0, "gid": 0},
            "cwd": cwd,
            "args": args,
            "env": env,
            "capabilities": {
                "bounding": DEFAULT_CAPS, "permitted": DEFAULT_CAPS, "effective": DEFAULT_CAPS,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true,
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc",
             "options": ["nosuid", "noexec", "nodev"]},
            tmpfs("/dev", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"]),
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            tmpfs("/dev/shm", "shm", &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            tmpfs("/run", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"]),
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                {"type": "network"},
            ],
            "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
                            "/sys/firmware", "/proc/scsi"],
            "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq",
                              "/proc/sys", "/proc/sysrq-trigger"],
        },
        "annotations": annotations,
    });
    // The shim would refuse it at Create: say so before anything is made.
    Lifetime::of_spec(&spec)?;
    Ok(spec)
}

/// Runs `cmd` (or the image's command) from `image` as sandbox `id`; returns its pid.
pub fn run(
    client: &mut Client,
    image: &str,
    id: &str,
    snapshotter: &str,
    lifetime: (Option<&str>, Option<&str>),
    cmd: &[String],
) -> Result<u32> {
    let make_spec = |config: &Value| spec(id, config, lifetime, cmd);
    create(
        client,
        image,
        id,
        snapshotter,
        HashMap::new(),
        make_spec,
        None,
    )
}

/// Makes sandbox `id` from `image` with the spec `make_spec` builds from the image's config,
/// the container labelled `labels`, and starts it, its stdio on `io` (with the terminal's
/// size) when given; returns its pid. Nothing is left when it fails.
pub fn create(
    client: &mut Client,
    image: &str,
    id: &str,
    snapshotter: &str,
    labels: HashMap<String, String>,
    make_spec: impl FnOnce(&Value) -> Result<Value>,
    io: Option<(&Stdio, Option<(u32, u32)>)>,
) -> Result<u32> {
    chalk_runtime::ids::container_id(id).map_err(|e| Error::from(e.to_string()))?;
    let record = client.image(image)?;
    let target = record
        .target
        .ok_or_else(|| Error::from(format!("image {image} has no target")))?;
    let (config, chain_id) = image_config(client, &target)?;
    let spec = make_spec(&config)?;
    client.lease(&format!("chalkctl-run-{id}"))?;
    client
        .prepare_snapshot(snapshotter, id, &chain_id)
        .map_err(|e| {
            format!("{e} (is {image} unpacked for {snapshotter}? `ctr images unpack` does it)")
        })?;
    let container = Container {
        id: id.to_string(),
        labels,
        image: image.to_string(),
        runtime: Some(Runtime {
            name: RUNTIME.into(),
            options: None,
        }),
        spec: Some(prost_types::Any {
            type_url: SPEC_TYPE.into(),
            value: serde_json::to_vec(&spec).map_err(|e| Error::from(e.to_string()))?,
        }),
        snapshotter: snapshotter.to_string(),
        snapshot_key: id.to_string(),
        ..Default::default()
    };
    let started = client
        .create_container(container.clone())
        .and_then(|_| match io {
            Some((io, size)) => client.start_task_with(&container, None, io, size),
            None => client.start_task(&container, None),
        });
    if started.is_err() && client.kill_and_delete_task(id) {
        client.delete_container(id);
        client.remove_snapshot(snapshotter, id);
    }
    client.release();
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_comes_from_the_image_unless_given() {
        let config = json!({"config": {"Entrypoint": ["/bin/ep"], "Cmd": ["a"],
                                       "Env": ["X=1"], "WorkingDir": "/w"}});
        let s = spec("c1", &config, (None, None), &[]).unwrap();
        assert_eq!(s["process"]["args"], json!(["/bin/ep", "a"]));
        assert_eq!(s["process"]["cwd"], "/w");
        assert!(s["process"]["env"].to_string().contains("PATH="));
        let s = spec("c1", &config, (Some("10m"), Some("suspend")), &["b".into()]).unwrap();
        assert_eq!(s["process"]["args"], json!(["/bin/ep", "b"]));
        assert_eq!(s["annotations"][LIFETIME_ANNOTATION], "10m");
        assert_eq!(s["annotations"][ON_TIMEOUT_ANNOTATION], "suspend");
        assert!(spec("c1", &json!({}), (None, None), &[]).is_err());
    }
}
