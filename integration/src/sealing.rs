//! Keys for the tests and bench of encrypted and signed snapshots, made by chalkctl as a user
//! makes them; the runtime options that use them; a signature changed behind chalkctl's back.

use std::path::Path;

/// `chalkctl snapshot keygen --out OUT` (with `signing`: `--signing`): what it printed, an
/// age recipient or the public key's path.
pub fn keygen(out: &Path, signing: bool) -> Result<String, String> {
    let chalkctl = crate::containerd::chalkctl_binary().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(chalkctl);
    cmd.args(["snapshot", "keygen", "--out"]).arg(out);
    if signing {
        cmd.arg("--signing");
    }
    let got = cmd.output().map_err(|e| e.to_string())?;
    if !got.status.success() {
        return Err(format!(
            "keygen {}: {}",
            out.display(),
            String::from_utf8_lossy(&got.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&got.stdout).trim().to_string())
}

/// Runtime options: `[encryption]` with `identities` (when given), and a `[trust]` rule that
/// lets in what `public_key` signed under `scope`.
pub fn options(identities: Option<&Path>, scope: &str, public_key: &Path) -> String {
    let encryption = identities.map_or_else(String::new, |p| {
        format!("[encryption]\nidentities = \"{}\"\n", p.display())
    });
    format!(
        "{encryption}[trust]\n[[trust.rules]]\nscope = \"{scope}\"\nkeys = [\"{}\"]\n",
        public_key.display()
    )
}

/// Appends `text` to the runtime options file at `path`.
pub fn add_options(path: &Path, text: &str) -> Result<(), String> {
    let mut all = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    all.push('\n');
    all.push_str(text);
    std::fs::write(path, all).map_err(|e| format!("{}: {e}", path.display()))
}

/// Changes one character of the first signature in a cosign signature image.
pub fn tamper_signature(m: &mut serde_json::Value) {
    let at = &mut m["layers"][0]["annotations"]["dev.cosignproject.cosign/signature"];
    let changed: String = at
        .as_str()
        .unwrap_or_default()
        .char_indices()
        .map(|(i, c)| match (i, c) {
            (12, 'A') => 'B',
            (12, _) => 'A',
            _ => c,
        })
        .collect();
    *at = changed.into();
}
