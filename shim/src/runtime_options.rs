//! Finding the runtime options for a container. containerd passes them as an `Any`:
//! CRI and `ctr --runtime-config-path` send `runtimeoptions.v1.Options` (a config path or an
//! inline TOML body); a runc-style `containerd.runc.v1.Options` (CRI's `BinaryName`/`Root`)
//! overrides the runsc binary and root of the default file. Nothing passed means the default.

use chalk_runtime::options::RuntimeOptions;
use containerd_shim::protos::{
    protobuf::{self, rt::WireType, well_known_types::any::Any, CodedInputStream, Message},
    shim::oci::{CheckpointOptions, Options as RuncOptions},
};

use crate::errors::{Result, ShimError};

const CRI_OPTIONS: &str = "runtimeoptions.v1.Options";
const RUNC_OPTIONS: &str = "containerd.runc.v1.Options";
const CHECKPOINT_OPTIONS: &str = "containerd.runc.v1.CheckpointOptions";

/// What a Checkpoint request asks for, once checked against what gVisor can do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CheckpointRequest {
    /// Stop the sandbox after the checkpoint (suspend).
    pub exit: bool,
    /// Where to write, instead of the directory containerd gives.
    pub image_path: Option<std::path::PathBuf>,
}

/// Decodes containerd's checkpoint options (`containerd.runc.v1.CheckpointOptions`, the only
/// type containerd 2.x sends). CRIU-specific requests that gVisor cannot honour are refused by
/// name; `terminal` and `file_locks` need nothing (gVisor saves ptys and locks with the rest
/// of the sandbox) and `work_path` is ignored, as runsc ignores it.
pub fn checkpoint_options(any: Option<&Any>) -> Result<CheckpointRequest> {
    let Some(any) = any.filter(|a| !a.type_url.is_empty() || !a.value.is_empty()) else {
        return Ok(CheckpointRequest::default());
    };
    if type_name(&any.type_url) != CHECKPOINT_OPTIONS {
        return Err(ShimError::InvalidArgument(format!(
            "checkpoint options of type {:?}: io.containerd.chalk.v1 takes {CHECKPOINT_OPTIONS}",
            any.type_url
        )));
    }
    let o = CheckpointOptions::parse_from_bytes(&any.value).map_err(|e| {
        ShimError::InvalidArgument(format!("cannot decode {CHECKPOINT_OPTIONS}: {e}"))
    })?;
    let mut refused = Vec::new();
    if o.open_tcp {
        refused.push("open_tcp (host TCP connections are outside the sandbox)".to_string());
    }
    if o.external_unix_sockets {
        refused.push("external_unix_sockets (host sockets are outside the sandbox)".to_string());
    }
    if !o.empty_namespaces.is_empty() {
        refused.push(format!("empty_namespaces {:?}", o.empty_namespaces));
    }
    if !o.cgroups_mode.is_empty() {
        refused.push(format!(
            "cgroups_mode {:?} (gVisor keeps its own cgroups)",
            o.cgroups_mode
        ));
    }
    if !refused.is_empty() {
        return Err(ShimError::InvalidArgument(format!(
            "checkpoint options gVisor cannot honour: {}",
            refused.join(", ")
        )));
    }
    let image_path = (!o.image_path.is_empty()).then(|| std::path::PathBuf::from(&o.image_path));
    if let Some(p) = &image_path {
        if !p.is_absolute() {
            return Err(ShimError::InvalidArgument(format!(
                "checkpoint image_path {p:?} is not absolute"
            )));
        }
    }
    Ok(CheckpointRequest {
        exit: o.exit,
        image_path,
    })
}

/// The fields of CRI's `runtimeoptions.v1.Options` (decoded by hand: no crate ships it).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CriOptions {
    pub type_url: String,
    pub config_path: String,
    pub config_body: Vec<u8>,
}

pub fn decode_cri_options(bytes: &[u8]) -> Result<CriOptions> {
    let mut out = CriOptions::default();
    read_fields(bytes, CRI_OPTIONS, |field, input| {
        match field {
            1 => out.type_url = input.read_string()?,
            2 => out.config_path = input.read_string()?,
            3 => out.config_body = input.read_bytes()?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(out)
}

/// Walks the fields of a protobuf message: `take` reads the fields it knows and returns
/// false for the others, which are skipped.
fn read_fields(
    bytes: &[u8],
    what: &str,
    mut take: impl FnMut(u32, &mut CodedInputStream) -> protobuf::Result<bool>,
) -> Result<()> {
    let bad = |e: protobuf::Error| ShimError::InvalidArgument(format!("cannot decode {what}: {e}"));
    let mut input = CodedInputStream::from_bytes(bytes);
    while let Some(tag) = input.read_raw_tag_or_eof().map_err(bad)? {
        if take(tag >> 3, &mut input).map_err(bad)? {
            continue;
        }
        let wire_type = WireType::new(tag & 7).ok_or_else(|| {
            ShimError::InvalidArgument(format!("{what}: bad wire type in tag {tag}"))
        })?;
        input.skip_field(wire_type).map_err(bad)?;
    }
    Ok(())
}

/// The runc-style task options on `shim start`'s stdin. containerd 2.2+ sends its bootstrap
/// parameters (`containerd.runtime.bootstrap.v1.BootstrapParams`, the options among its
/// extensions), containerd 1.6 an `Any`, and 2.0/2.1 the bare message.
pub fn start_options(stdin: &[u8]) -> Option<RuncOptions> {
    if stdin.is_empty() {
        return None;
    }
    let mut extensions = Vec::new();
    let bootstrap = read_fields(stdin, "bootstrap parameters", |field, input| {
        if field != 8 {
            return Ok(false);
        }
        // Extension { google.protobuf.Any value = 1; }
        let extension = input.read_bytes()?;
        let mut inner = CodedInputStream::from_bytes(&extension);
        while let Some(tag) = inner.read_raw_tag_or_eof()? {
            if tag >> 3 == 1 {
                extensions.push(Any::parse_from_bytes(&inner.read_bytes()?)?);
            } else if let Some(wire_type) = WireType::new(tag & 7) {
                inner.skip_field(wire_type)?;
            }
        }
        Ok(true)
    });
    let runc = |any: &Any| {
        (type_name(&any.type_url) == RUNC_OPTIONS)
            .then(|| RuncOptions::parse_from_bytes(&any.value).ok())
            .flatten()
    };
    if bootstrap.is_ok() {
        if let Some(opts) = extensions.iter().find_map(runc) {
            return Some(opts);
        }
    }
    if let Some(opts) = Any::parse_from_bytes(stdin).ok().as_ref().and_then(runc) {
        return Some(opts);
    }
    RuncOptions::parse_from_bytes(stdin).ok()
}

fn type_name(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}

/// Resolves the options for a Create request.
pub fn resolve(any: Option<&Any>) -> Result<RuntimeOptions> {
    let Some(any) = any.filter(|a| !a.type_url.is_empty()) else {
        return Ok(RuntimeOptions::load_default()?);
    };
    match type_name(&any.type_url) {
        CRI_OPTIONS => {
            let cri = decode_cri_options(&any.value)?;
            if !cri.config_body.is_empty() {
                let body = String::from_utf8(cri.config_body).map_err(|_| {
                    ShimError::InvalidArgument("runtime options body is not UTF-8 TOML".into())
                })?;
                Ok(RuntimeOptions::parse(&body, "the inline runtime options")?)
            } else if !cri.config_path.is_empty() {
                Ok(RuntimeOptions::load(std::path::Path::new(
                    &cri.config_path,
                ))?)
            } else {
                Ok(RuntimeOptions::load_default()?)
            }
        }
        RUNC_OPTIONS => {
            let runc = RuncOptions::parse_from_bytes(&any.value).map_err(|e| {
                ShimError::InvalidArgument(format!("cannot decode {RUNC_OPTIONS}: {e}"))
            })?;
            let mut opts = RuntimeOptions::load_default()?;
            if !runc.binary_name.is_empty() {
                opts.binary_name = runc.binary_name;
            }
            if !runc.root.is_empty() {
                opts.root = runc.root.into();
                if !opts.root.is_absolute() {
                    return Err(ShimError::InvalidArgument(format!(
                        "runc options root {:?} is not an absolute path",
                        opts.root
                    )));
                }
            }
            Ok(opts)
        }
        other => Err(ShimError::InvalidArgument(format!(
            "runtime options of type {other:?} are not understood by io.containerd.chalk.v1; \
             pass {CRI_OPTIONS} with a config_path to a chalk TOML file"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use containerd_shim::protos::protobuf::CodedOutputStream;

    use super::*;

    fn encode_cri(path: &str, body: &[u8]) -> Vec<u8> {
        let mut buf = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut buf);
            out.write_string(1, "io.containerd.chalk.v1.options")
                .unwrap();
            if !path.is_empty() {
                out.write_string(2, path).unwrap();
            }
            if !body.is_empty() {
                out.write_bytes(3, body).unwrap();
            }
            out.write_uint32(9, 5).unwrap(); // an unknown field is skipped
            out.flush().unwrap();
        }
        buf
    }

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        a
    }

    fn runc_options(cgroup: &str) -> RuncOptions {
        let mut o = RuncOptions::new();
        o.shim_cgroup = cgroup.into();
        o
    }

    #[test]
    fn start_options_in_every_shape_containerd_sends() {
        let opts = runc_options("/containerd/shim");
        let bare = opts.write_to_bytes().unwrap();
        let wrapped = any("containerd.runc.v1.Options", bare.clone());
        // containerd 2.2+: BootstrapParams { instance_id = 1; ...; repeated Extension = 8 }.
        let mut extension = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut extension);
            out.write_message(1, &wrapped).unwrap();
            out.flush().unwrap();
        }
        let mut bootstrap = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut bootstrap);
            out.write_string(1, "c1").unwrap();
            out.write_string(2, "default").unwrap();
            out.write_bytes(8, &extension).unwrap();
            out.write_string(5, "unix:///run/containerd/containerd.sock.ttrpc")
                .unwrap();
            out.flush().unwrap();
        }
        for stdin in [bootstrap, wrapped.write_to_bytes().unwrap(), bare] {
            assert_eq!(start_options(&stdin), Some(opts.clone()));
        }
        assert_eq!(start_options(b""), None);
    }

    #[test]
    fn checkpoint_options_are_honoured_or_refused_by_name() {
        let encode = |o: CheckpointOptions| any(CHECKPOINT_OPTIONS, o.write_to_bytes().unwrap());
        assert_eq!(
            checkpoint_options(None).unwrap(),
            CheckpointRequest::default()
        );
        let mut o = CheckpointOptions::new();
        o.exit = true;
        o.image_path = "/var/lib/snap".into();
        o.terminal = true;
        o.file_locks = true;
        o.work_path = "/tmp/work".into();
        let got = checkpoint_options(Some(&encode(o))).unwrap();
        assert!(got.exit);
        assert_eq!(
            got.image_path.as_deref(),
            Some(std::path::Path::new("/var/lib/snap"))
        );

        let mut o = CheckpointOptions::new();
        o.open_tcp = true;
        o.cgroups_mode = "soft".into();
        let err = checkpoint_options(Some(&encode(o)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("open_tcp") && err.contains("cgroups_mode"),
            "{err}"
        );

        let mut o = CheckpointOptions::new();
        o.image_path = "relative/dir".into();
        assert!(checkpoint_options(Some(&encode(o))).is_err());
        let err = checkpoint_options(Some(&any("containerd.runc.v1.Options", vec![])))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("takes containerd.runc.v1.CheckpointOptions"),
            "{err}"
        );
    }

    #[test]
    fn decodes_cri_options() {
        let got = decode_cri_options(&encode_cri("/etc/chalk.toml", b"")).unwrap();
        assert_eq!(got.config_path, "/etc/chalk.toml");
        assert_eq!(got.type_url, "io.containerd.chalk.v1.options");
    }

    #[test]
    fn inline_body_wins_and_is_validated() {
        let a = any(
            "runtimeoptions.v1.Options",
            encode_cri("/nonexistent", b"[runsc_config]\nplatform = \"ptrace\"\n"),
        );
        let opts = resolve(Some(&a)).unwrap();
        assert_eq!(opts.runsc_flags().unwrap(), vec!["--platform=ptrace"]);

        let a = any("runtimeoptions.v1.Options", encode_cri("", b"typo = 1\n"));
        let err = resolve(Some(&a)).unwrap_err().to_string();
        assert!(err.contains("typo"), "{err}");
    }

    #[test]
    fn config_path_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chalk.toml");
        std::fs::write(&path, "binary_name = \"/opt/runsc\"\n").unwrap();
        let a = any(
            "type.googleapis.com/runtimeoptions.v1.Options",
            encode_cri(path.to_str().unwrap(), b""),
        );
        assert_eq!(resolve(Some(&a)).unwrap().binary_name, "/opt/runsc");
    }

    #[test]
    fn runc_style_options_override_binary_and_root() {
        let mut runc = RuncOptions::new();
        runc.binary_name = "/opt/runsc".into();
        runc.root = "/run/other".into();
        let a = any("containerd.runc.v1.Options", runc.write_to_bytes().unwrap());
        let opts = resolve(Some(&a)).unwrap();
        assert_eq!(opts.binary_name, "/opt/runsc");
        assert_eq!(opts.root, std::path::PathBuf::from("/run/other"));
        runc.root = "relative".into();
        let a = any("containerd.runc.v1.Options", runc.write_to_bytes().unwrap());
        assert!(resolve(Some(&a)).is_err());
    }

    #[test]
    fn unknown_type_is_refused_by_name() {
        let err = resolve(Some(&any("example.Other", vec![])))
            .unwrap_err()
            .to_string();
        assert!(err.contains("example.Other"), "{err}");
    }
}
