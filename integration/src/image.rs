//! Builds an OCI image archive (the layout `ctr images import` takes) holding a static busybox
//! with all its applets, deterministic so that the same host gives the same image digest.

use std::{io, path::Path, process::Command};

use sha2::{Digest, Sha256};

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
";

const GROUP: &str = "root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
utmp:x:43:
plugdev:x:46:
staff:x:50:
lock:x:54:
netdev:x:82:
users:x:100:
nogroup:x:65534:
";

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn header(path: &str, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_path(path).expect("tar path");
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn add_file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) -> io::Result<()> {
    let mut h = header(path, tar::EntryType::Regular, mode, data.len() as u64);
    h.set_cksum();
    b.append(&h, data)
}

fn add_dir(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32) -> io::Result<()> {
    let mut h = header(path, tar::EntryType::Directory, mode, 0);
    h.set_cksum();
    b.append(&h, io::empty())
}

/// The root filesystem layer: busybox, a link per applet, and the usual top-level dirs.
pub fn busybox_layer(busybox: &Path) -> io::Result<Vec<u8>> {
    busybox_layer_with(busybox, &[])
}

/// A file added to the busybox layer: path (relative), mode, content.
pub type ExtraFile<'a> = (&'a str, u32, &'a [u8]);

/// [`busybox_layer`] plus `extra` files (e.g. the cuda-checkpoint stand-in).
pub fn busybox_layer_with(busybox: &Path, extra: &[ExtraFile]) -> io::Result<Vec<u8>> {
    let binary = std::fs::read(busybox)?;
    let list = Command::new(busybox).arg("--list").output()?;
    if !list.status.success() {
        return Err(io::Error::other(format!(
            "{} --list failed",
            busybox.display()
        )));
    }
    let mut applets: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
        .map(String::from)
        .collect();
    applets.sort();
    applets.dedup();

    let mut b = tar::Builder::new(Vec::new());
    for (dir, mode) in [
        ("bin/", 0o755),
        ("dev/", 0o755),
        ("etc/", 0o755),
        ("proc/", 0o555),
        ("root/", 0o700),
        ("sys/", 0o555),
        ("tmp/", 0o1777),
        ("usr/", 0o755),
        ("var/", 0o755),
        ("workspace/", 0o777),
    ] {
        add_dir(&mut b, dir, mode)?;
    }
    add_file(&mut b, "bin/busybox", 0o755, &binary)?;
    for applet in &applets {
        let mut h = header(&format!("bin/{applet}"), tar::EntryType::Symlink, 0o777, 0);
        b.append_link(&mut h, format!("bin/{applet}"), "busybox")?;
    }
    let mut h = header("sbin", tar::EntryType::Symlink, 0o777, 0);
    b.append_link(&mut h, "sbin", "bin")?;
    let mut h = header("usr/bin", tar::EntryType::Symlink, 0o777, 0);
    b.append_link(&mut h, "usr/bin", "../bin")?;
    // The users and groups of the stock busybox image, which tests (containerd's among them)
    // look up by name and id.
    add_file(&mut b, "etc/passwd", 0o644, PASSWD.as_bytes())?;
    add_file(&mut b, "etc/group", 0o644, GROUP.as_bytes())?;
    add_file(&mut b, "etc/hostname", 0o644, b"chalk\n")?;
    for (path, mode, data) in extra {
        add_file(&mut b, path, *mode, data)?;
    }
    b.into_inner()
}

/// An OCI archive for `ctr images import`, named `name` (a full reference).
pub fn oci_archive(layer: &[u8], name: &str) -> io::Result<Vec<u8>> {
    oci_archive_labelled(layer, name, "")
}

/// Like [`oci_archive`], with a `chalk.variant` label in the image config when `variant` is
/// not empty: the same files under another digest.
pub fn oci_archive_labelled(layer: &[u8], name: &str, variant: &str) -> io::Result<Vec<u8>> {
    oci_archive_running(layer, name, variant, &["/bin/sh"])
}

/// Like [`oci_archive_labelled`], with `cmd` as the image's command.
pub fn oci_archive_running(
    layer: &[u8],
    name: &str,
    variant: &str,
    cmd: &[&str],
) -> io::Result<Vec<u8>> {
    let mut image_config = serde_json::json!({
        "Env": ["PATH=/bin:/sbin:/usr/bin"], "Cmd": cmd, "WorkingDir": "/"
    });
    if !variant.is_empty() {
        image_config["Labels"] = serde_json::json!({ "chalk.variant": variant });
    }
    oci_archive_configured(layer, name, image_config)
}

/// An OCI archive of one layer whose image config's `config` is `image_config` (Cmd, User,
/// Env, Labels...).
pub fn oci_archive_configured(
    layer: &[u8],
    name: &str,
    image_config: serde_json::Value,
) -> io::Result<Vec<u8>> {
    let tag = name.rsplit(':').next().unwrap_or("latest");
    let layer_digest = sha256(layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": image_config,
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": { "mediaType": CONFIG_TYPE, "digest": sha256(&config), "size": config.len() },
        "layers": [{ "mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer.len() }],
    }))?;
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": MANIFEST_TYPE,
            "digest": sha256(&manifest),
            "size": manifest.len(),
            "platform": { "architecture": oci_arch(), "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;

    let mut b = tar::Builder::new(Vec::new());
    add_file(
        &mut b,
        "oci-layout",
        0o644,
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    add_dir(&mut b, "blobs/", 0o755)?;
    add_dir(&mut b, "blobs/sha256/", 0o755)?;
    for blob in [layer, &config[..], &manifest[..]] {
        let hex = sha256(blob);
        add_file(
            &mut b,
            &format!("blobs/sha256/{}", &hex["sha256:".len()..]),
            0o644,
            blob,
        )?;
    }
    add_file(&mut b, "index.json", 0o644, &index)?;
    b.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_holds_a_consistent_layout() {
        let layer = b"not really a tar".to_vec();
        let archive = oci_archive(&layer, "docker.io/chalk/busybox:test").unwrap();
        let mut names = Vec::new();
        let mut index = String::new();
        for entry in tar::Archive::new(&archive[..]).entries().unwrap() {
            let mut e = entry.unwrap();
            let path = e.path().unwrap().display().to_string();
            if path == "index.json" {
                io::Read::read_to_string(&mut e, &mut index).unwrap();
            }
            names.push(path);
        }
        assert!(names.contains(&"oci-layout".to_string()));
        let layer_blob = format!("blobs/sha256/{}", &sha256(&layer)["sha256:".len()..]);
        assert!(names.contains(&layer_blob), "{names:?}");
        assert!(index.contains("docker.io/chalk/busybox:test"));
        // Deterministic: the same input gives the same bytes.
        assert_eq!(
            archive,
            oci_archive(&layer, "docker.io/chalk/busybox:test").unwrap()
        );
    }
}
