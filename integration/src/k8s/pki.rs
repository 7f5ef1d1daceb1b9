//! The cluster's certificates, made for this run only: a CA, the API server's serving
//! certificate, the admin's and each node's client certificates, the kubelets' serving
//! certificates, and the service account signing key; and the kubeconfigs that use them.

use std::{fs, path::Path, process::Command};

use super::API_PORT;

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Makes the run's CA and the certificates signed by it: `name.crt`/`name.key` in `pki`,
/// a kubelet's client and serving pair for each of `nodes`.
pub(super) fn make_pki(pki: &Path, nodes: &[(&str, &str)]) -> Result<(), String> {
    fs::create_dir_all(pki).map_err(|e| e.to_string())?;
    openssl(
        pki,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=chalk-k8s-ca",
        ],
    )?;
    let mut certs: Vec<(String, String, &str, String)> = vec![
        (
            "apiserver".into(),
            "/CN=kube-apiserver".into(),
            "serverAuth",
            "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default".into(),
        ),
        (
            "admin".into(),
            "/O=system:masters/CN=chalk-admin".into(),
            "clientAuth",
            String::new(),
        ),
        (
            "apiserver-kubelet-client".into(),
            "/O=system:masters/CN=kube-apiserver-kubelet-client".into(),
            "clientAuth",
            String::new(),
        ),
    ];
    for (node, ip) in nodes {
        certs.push((
            format!("kubelet-client-{node}"),
            format!("/O=system:nodes/CN=system:node:{node}"),
            "clientAuth",
            String::new(),
        ));
        certs.push((
            format!("kubelet-{node}"),
            format!("/CN={node}"),
            "serverAuth",
            format!("IP:127.0.0.1,IP:{ip},DNS:{node},DNS:localhost"),
        ));
    }
    for (name, subj, usage, sans) in certs {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        let subj = subj.as_str();
        let mut e = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n"
        );
        if !sans.is_empty() {
            e.push_str(&format!("subjectAltName={sans}\n"));
        }
        fs::write(pki.join(&ext), e).map_err(|e| e.to_string())?;
        openssl(
            pki,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subj,
            ],
        )?;
        openssl(
            pki,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        )?;
    }
    openssl(pki, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(pki, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    Ok(())
}

pub(super) fn kubeconfig(pki: &Path, user: &str) -> String {
    let p = |f: &str| pki.join(f).display().to_string();
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: chalk
  cluster:
    server: https://127.0.0.1:{API_PORT}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: chalk
  context: {{cluster: chalk, user: {user}}}
current-context: chalk
"#,
        ca = p("ca.crt"),
        crt = p(&format!("{user}.crt")),
        key = p(&format!("{user}.key")),
    )
}
