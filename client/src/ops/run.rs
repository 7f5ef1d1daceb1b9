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
    containerd::RUNTIME,
    containerd::{Client, Result, Stdio},
    ops::parts::image_config,
    Error,
};

const SPEC_TYPE: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";

/// The capabilities containerd gives a container by default.
const DEFAULT_CAPS: [&str; 14] = chalk_runtime::caps::CONTAINERD_DEFAULT;

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

/// What `chalkctl run` may set of a sandbox beyond the image's defaults.
#[derive(Debug, Default, Clone)]
pub struct RunOptions {
    /// The init gets a terminal.
    pub tty: bool,
    /// KEY=VALUE, added to (or replacing in) the image's environment.
    pub env: Vec<String>,
    pub cwd: Option<String>,
    /// The sandbox's memory limit in bytes.
    pub memory: Option<u64>,
    /// How many CPUs' time the sandbox may use.
    pub cpus: Option<f64>,
    pub lifetime: Option<String>,
    pub on_timeout: Option<String>,
    /// Labels of the container record.
    pub labels: HashMap<String, String>,
    /// The CNI network (`none`: loopback only); None: the default network where this host
    /// can give it.
    pub network: Option<String>,
    /// Published ports, as `-p` takes them.
    pub ports: Vec<String>,
}

/// Sets each KEY=VALUE of `add` in `env`, replacing an earlier value of the same key.
pub fn merge_env(env: &mut Vec<String>, add: &[String]) -> Result<()> {
    for kv in add {
        let Some((key, _)) = kv.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(format!("--env {kv:?}: give KEY=VALUE").into());
        };
        let prefix = format!("{key}=");
        env.retain(|e| !e.starts_with(&prefix));
        env.push(kv.clone());
    }
    Ok(())
}

/// A memory size: bytes, or with a suffix k, m, g (powers of 1024, as docker reads them;
/// `Ki`, `Mi`, `Gi` too).
pub fn parse_memory(s: &str) -> Result<u64> {
    let lower = s.trim().to_ascii_lowercase();
    let lower = lower.strip_suffix('b').unwrap_or(&lower);
    let lower = lower.strip_suffix('i').unwrap_or(lower);
    let (digits, unit) = match lower.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => lower.split_at(i),
        None => (lower, ""),
    };
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        _ => return Err(format!("memory {s:?}: give bytes or a number with k, m or g").into()),
    };
    let n: u64 = digits.parse().map_err(|_| {
        Error::from(format!(
            "memory {s:?}: give bytes or a number with k, m or g"
        ))
    })?;
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| Error::from(format!("memory {s:?} is too large")))?;
    // runsc and the kernel refuse less than a few megabytes; say so here.
    if bytes < 6 << 20 {
        return Err(format!("memory {s:?}: a sandbox needs at least 6m").into());
    }
    Ok(bytes)
}

/// A CPU count (fractions allowed: 0.5 is half of one CPU's time).
pub fn parse_cpus(s: &str) -> Result<f64> {
    match s.trim().parse::<f64>() {
        Ok(n) if (0.01..=1024.0).contains(&n) => Ok(n),
        _ => Err(format!("cpus {s:?}: give a number from 0.01 to 1024 (e.g. 1.5)").into()),
    }
}

/// Sets what `opts` asks for on `spec`: a terminal, environment, working directory, and the
/// memory and CPU limits (the cgroup runsc puts the sandbox in).
pub fn apply(spec: &mut Value, opts: &RunOptions) -> Result<()> {
    let p = &mut spec["process"];
    let mut env = strings(&p["env"]);
    if opts.tty {
        p["terminal"] = true.into();
        if !env.iter().any(|e| e.starts_with("TERM=")) {
            env.push("TERM=xterm".into());
        }
    }
    merge_env(&mut env, &opts.env)?;
    p["env"] = env.into();
    if let Some(cwd) = &opts.cwd {
        if !cwd.starts_with('/') {
            return Err(format!("--cwd {cwd}: give an absolute path").into());
        }
        p["cwd"] = cwd.clone().into();
    }
    if let Some(m) = opts.memory {
        spec["linux"]["resources"]["memory"]["limit"] = m.into();
    }
    if let Some(c) = opts.cpus {
        const PERIOD: u64 = 100_000;
        spec["linux"]["resources"]["cpu"] =
            json!({"quota": (c * PERIOD as f64).round() as i64, "period": PERIOD});
    }
    crate::ops::network::set_network(spec, opts.network.as_deref(), &opts.ports)
}

/// Runs `cmd` (or the image's command) from `image` as sandbox `id` with `opts`, its stdio on
/// `io` when given; returns its pid.
pub fn run(
    client: &mut Client,
    image: &str,
    id: &str,
    snapshotter: &str,
    cmd: &[String],
    opts: &RunOptions,
    io: Option<(&Stdio, Option<(u32, u32)>)>,
) -> Result<u32> {
    let lifetime = (opts.lifetime.as_deref(), opts.on_timeout.as_deref());
    // The cgroup `ctr run` gives a task: where runsc applies the limits.
    let cgroup = format!("/{}/{id}", client.namespace());
    let make_spec = |config: &Value| {
        let mut s = spec(id, config, lifetime, cmd)?;
        apply(&mut s, opts)?;
        s["linux"]["cgroupsPath"] = cgroup.into();
        Ok(s)
    };
    create(
        client,
        image,
        id,
        snapshotter,
        opts.labels.clone(),
        make_spec,
        io,
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

    #[test]
    fn run_options_set_terminal_env_dir_and_limits() {
        let config = json!({"config": {"Cmd": ["sh"], "Env": ["A=1", "B=2"]}});
        let mut s = spec("c1", &config, (None, None), &[]).unwrap();
        let opts = RunOptions {
            tty: true,
            env: vec!["B=3".into()],
            cwd: Some("/srv".into()),
            memory: Some(parse_memory("256m").unwrap()),
            cpus: Some(parse_cpus("1.5").unwrap()),
            ..Default::default()
        };
        apply(&mut s, &opts).unwrap();
        assert_eq!(s["process"]["terminal"], true);
        let env = strings(&s["process"]["env"]);
        assert!(
            env.contains(&"A=1".into()) && env.contains(&"B=3".into()),
            "{env:?}"
        );
        assert!(!env.contains(&"B=2".into()) && env.contains(&"TERM=xterm".into()));
        assert_eq!(s["process"]["cwd"], "/srv");
        assert_eq!(s["linux"]["resources"]["memory"]["limit"], 256 << 20);
        assert_eq!(s["linux"]["resources"]["cpu"]["quota"], 150_000);
        let bad = RunOptions {
            env: vec!["=x".into()],
            ..Default::default()
        };
        assert!(apply(&mut s, &bad).is_err());
    }

    #[test]
    fn sizes_and_cpu_counts_are_read_like_dockers() {
        assert_eq!(parse_memory("512m").unwrap(), 512 << 20);
        assert_eq!(parse_memory("1G").unwrap(), 1 << 30);
        assert_eq!(parse_memory("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_memory("67108864").unwrap(), 64 << 20);
        for bad in ["", "12x", "m", "1k", "99999999999g", "-5m"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cpus("0.5").unwrap(), 0.5);
        for bad in ["0", "-1", "x", "2000", "NaN"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
    }
}
