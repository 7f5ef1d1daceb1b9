//! Snapshots safe to share: encrypted for a host's key (unreadable in the registry's storage,
//! refused where there is no key), and pulled only under host B's `[trust]` policy (a rule
//! over this run's `trust/` repositories naming one key), with the real cosign both ways.

use std::{path::Path, process::Command};

use chalk_integration::{
    ensure, sealing,
    testkit::{self, Failed, TestResult, COUNTER},
};
use serde_json::Value;

use super::{files_under, fresh_host, Hosts, Own};

/// The keys made at start: B's decryption key and two signing keys, one the policy names.
pub struct Keys {
    pub dir: std::path::PathBuf,
    /// B's age recipient.
    pub recipient: String,
}

impl Keys {
    pub fn trusted(&self) -> String {
        self.dir.join("trusted.key").display().to_string()
    }

    pub fn other(&self) -> String {
        self.dir.join("other.key").display().to_string()
    }
}

/// Makes the keys with chalkctl and gives host B (its runtime options at `options`) an
/// `[encryption]` key and a `[trust]` rule over `scope`.
pub fn set_up(dir: &Path, options: &Path, scope: &str) -> Result<Keys, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let b = dir.join("b.age");
    let recipient = sealing::keygen(&b, false)?;
    for name in ["trusted.key", "other.key"] {
        sealing::keygen(&dir.join(name), true)?;
    }
    sealing::add_options(
        options,
        &sealing::options(Some(&b), scope, &dir.join("trusted.key.pub")),
    )?;
    Ok(Keys {
        dir: dir.to_path_buf(),
        recipient,
    })
}

/// Whether any file under `dir` holds `marker`, as it is or once decompressed (memory is
/// pushed as zstd frames).
fn storage_holds(dir: &Path, marker: &[u8]) -> bool {
    let has = |bytes: &[u8]| bytes.windows(marker.len()).any(|w| w == marker);
    walk(dir).iter().any(|f| {
        std::fs::read(f).is_ok_and(|bytes| {
            has(&bytes) || zstd::decode_all(&bytes[..]).is_ok_and(|plain| has(&plain))
        })
    })
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A marker only the sandbox's memory holds (its command has it reversed), pushed encrypted
/// then plain to a registry of its own: absent from its storage, then present. Suspended
/// encrypted, it is refused by a host with no key, fetching nothing, and resumes on B.
pub fn an_encrypted_snapshot_is_unreadable_and_opens_only_with_its_key(h: &Hosts) -> TestResult {
    let id = "tr-sealed";
    let own = Own::start()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let marker = format!("chalk-secret-{nanos:09}");
    let reversed: String = marker.chars().rev().collect();
    let keys = h.keys.as_ref().ok_or("no keys")?;
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    let result = (|| {
        let script = format!("M=$(echo {reversed} | rev); echo \"$M\" > /tmp/m; {COUNTER}");
        h.a.run_detached(id, &["sh", "-c", &script])?;
        h.a.count_reaches(id, 2)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let sealed_ref = own.reference("sealed/app:enc");
        let pushed = own.json(
            &h.a,
            &[
                "snapshot",
                "push",
                "--snapshot-id",
                &snap,
                &sealed_ref,
                "--encrypt-to",
                &keys.recipient,
            ],
        )?;
        ensure!(
            pushed["encrypted"] == true
                && pushed["reference"]
                    .as_str()
                    .is_some_and(|r| !r.ends_with(&snap)),
            "encrypted push: {pushed}"
        );
        let storage = own.registry.blobs();
        ensure!(
            !storage_holds(&storage, marker.as_bytes()),
            "the registry's storage holds the marker after an encrypted push"
        );
        let plain_ref = own.reference("sealed/app:plain");
        own.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &plain_ref],
        )?;
        // Debian's runsc compresses its checkpoint: the marker is plain only in a current one's.
        if testkit::current_runsc() {
            ensure!(
                storage_holds(&storage, marker.as_bytes()),
                "a plain push should leave the marker readable in the registry's storage"
            );
        }

        let suspended_ref = own.reference("sealed/app:suspended");
        let out = own.json(
            &h.a,
            &[
                "suspend",
                "--id",
                id,
                "--to",
                &suspended_ref,
                "--release",
                "--encrypt-to",
                &keys.recipient,
            ],
        )?;
        let suspended = out["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ensure!(out["pushed"]["encrypted"] == true, "suspend --to: {out}");
        // Pieces encrypted for the same recipients in the same repository are not sent again.
        if testkit::current_runsc() {
            ensure!(
                out["pushed"]["transfer"]["bytes_present"].as_u64() > Some(0),
                "the encrypted suspend sent every piece again: {out}"
            );
        }

        let bare = fresh_host()?;
        let refused = own.chalkctl(&bare, &["resume", "--id", id, "--from", &suspended_ref]);
        let store = bare.c.snapshot_store();
        let fetched = (
            files_under(&store.join("blobs/sha256")),
            files_under(&bare.c.content_blobs()),
        );
        ensure!(
            refused.code != 0
                && refused
                    .stderr
                    .contains("is encrypted and this host has no key"),
            "resume on a host without the key: {refused:?}"
        );
        ensure!(
            fetched == (0, 0),
            "the host without the key fetched {fetched:?} blobs"
        );

        let out = own.json(&h.b, &["resume", "--id", id, "--from", &suspended_ref])?;
        on_b.push(suspended.clone());
        ensure!(out["snapshot"] == suspended.as_str(), "resume on B: {out}");
        let n = h.b.count(id)?;
        h.b.count_reaches(id, n + 2)?;
        let m = h.b.sh(id, "m", "cat /tmp/m");
        ensure!(m.stdout.trim() == marker, "the memory on B: {m:?}");
        Ok(())
    })();
    let on_b = h.b.conclude(result, &[id], &on_b);
    h.a.conclude(on_b, &[id], &on_a)
}

/// B's policy names one key for this run's `trust/` repositories: unsigned, signed by
/// another key, a signature changed in the registry and a signature moved onto another
/// manifest are refused, fetching nothing of the snapshot; chalkctl's and cosign's
/// signatures by the named key are accepted, and cosign accepts chalkctl's.
pub fn a_trust_policy_lets_in_only_what_its_key_signed(h: &Hosts) -> TestResult {
    let id = "tr-trust";
    let keys = h.keys.as_ref().ok_or("no keys")?;
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    let result = (|| {
        h.a.start_counter(id)?;
        let s1 = h.a.snapshot_of(id)?;
        on_a.push(s1.clone());
        let s2 = h.a.snapshot_of(id)?;
        on_a.push(s2.clone());
        let push = |snap: &str, repo: &str, sign: Option<&str>| -> Result<String, Failed> {
            let reference = h.reference(repo);
            let mut args = vec!["snapshot", "push", "--snapshot-id", snap, &reference];
            if let Some(k) = sign {
                args.extend(["--sign", k]);
            }
            Ok(h.json(&h.a, &args)?["reference"]
                .as_str()
                .unwrap_or_default()
                .to_string())
        };
        let (trusted, other) = (keys.trusted(), keys.other());
        let unsigned = push(&s1, "trust/unsigned:v1", None)?;
        let wrong = push(&s1, "trust/wrong:v1", Some(&other))?;
        let changed = push(&s1, "trust/changed:v1", Some(&trusted))?;
        let swapped = push(&s2, "trust/swap:v2", None)?;
        let swap_signed = push(&s1, "trust/swap:v1", Some(&trusted))?;
        // The signature's bytes changed in the registry; one moved onto another manifest.
        // Signatures are of the pushed manifest (a snapshot's packed form, not its id).
        let sig_path = |repo: &str, pushed: &str| {
            format!(
                "{repo}/manifests/sha256-{}.sig",
                pushed.rsplit("@sha256:").next().unwrap_or_default()
            )
        };
        let mut sig = h.registry_manifest(&sig_path("trust/changed", &changed))?;
        sealing::tamper_signature(&mut sig);
        h.registry_put_manifest(&sig_path("trust/changed", &changed), &sig)?;
        let moved = h.registry_manifest(&sig_path("trust/swap", &swap_signed))?;
        h.registry_put_manifest(&sig_path("trust/swap", &swapped), &moved)?;

        for (reference, why) in [
            (&unsigned, "it has no signature"),
            (&wrong, "does not verify with any of the keys"),
            (&changed, "does not verify with any of the keys"),
            (
                &swapped,
                "the manifest was changed or swapped after signing",
            ),
        ] {
            let out = h.chalkctl(&h.b, &["snapshot", "pull", reference]);
            ensure!(
                out.code != 0
                    && out.stderr.contains("refused by the trust policy")
                    && out.stderr.contains(why)
                    && out.stderr.contains("[[trust.rules]] #1")
                    && out.stderr.contains("trusted.key.pub"),
                "pull of {reference} on B: {out:?}"
            );
        }
        // Nothing of either snapshot was fetched: no record, none of its files.
        for snap in [&s1, &s2] {
            let (_, m) = h.a.stored_snapshot(snap)?;
            for layer in m["layers"].as_array().into_iter().flatten() {
                let digest = layer["digest"].as_str().unwrap_or_default();
                ensure!(
                    !h.b.store_blob(digest).exists(),
                    "B fetched {digest} of a refused snapshot"
                );
            }
        }

        let good = push(&s1, "trust/good:v1", Some(&trusted))?;
        let pulled = h.json(&h.b, &["snapshot", "pull", &good])?;
        on_b.push(s1.clone());
        ensure!(pulled["id"] == s1.as_str(), "signed pull on B: {pulled}");
        let verdict = h.chalkctl(&h.b, &["snapshot", "verify", &good]);
        ensure!(
            verdict.code == 0 && verdict.stdout.contains("signed by"),
            "chalkctl snapshot verify by the policy: {verdict:?}"
        );

        // cosign, both ways.
        let cosign = std::env::var_os("CHALK_COSIGN")
            .filter(|v| !v.is_empty())
            .ok_or("CHALK_COSIGN names no cosign (scripts/peers builds it)")?;
        let cosign = |args: &[&str]| -> Result<String, Failed> {
            let out = h
                .registry
                .client(&mut Command::new(&cosign))
                .env("SSL_CERT_FILE", h.registry.dir.join("ca.crt"))
                .env("COSIGN_PASSWORD", "")
                .current_dir(&keys.dir)
                .args(args)
                .output()
                .map_err(|e| format!("cosign: {e}"))?;
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            ensure!(out.status.success(), "cosign {args:?}: {said}");
            Ok(said)
        };
        let pub_key = format!("{trusted}.pub");
        // `repo@digest` of what chalkctl pushed (`repo:tag@digest`), as cosign takes it.
        let pinned = |repo: &str, pushed: &str| {
            let digest = pushed.rsplit('@').next().unwrap_or_default();
            format!("{}@{digest}", h.reference(repo))
        };
        let good_pinned = pinned("trust/good", &good);
        cosign(&[
            "verify",
            "--key",
            &pub_key,
            "--insecure-ignore-tlog=true",
            &good_pinned,
        ])?;
        if !keys.dir.join("cosign.key").exists() {
            cosign(&[
                "import-key-pair",
                "--key",
                &trusted,
                "--output-key-prefix",
                "cosign",
            ])?;
        }
        let cosigned = push(&s2, "trust/cosigned:v1", None)?;
        let cosigned_pinned = pinned("trust/cosigned", &cosigned);
        cosign(&[
            "sign",
            "--key",
            "cosign.key",
            "--tlog-upload=false",
            "--yes",
            &cosigned_pinned,
        ])?;
        let pulled: Value = h.json(&h.b, &["snapshot", "pull", &cosigned])?;
        on_b.push(s2.clone());
        ensure!(
            pulled["id"] == s2.as_str(),
            "pull of cosign's signed snapshot on B: {pulled}"
        );
        Ok(())
    })();
    let on_b = h.b.conclude(result, &[], &on_b);
    h.a.conclude(on_b, &[id], &on_a)
}
