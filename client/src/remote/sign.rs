//! The keys snapshots are signed and checked with: ECDSA P-256 in PEM, as cosign's (a
//! `cosign.pub` is a public key here; `cosign import-key-pair --key FILE` gives cosign a
//! private key made here). Signatures are DER, base64, over the payload's SHA-256.

use std::path::{Path, PathBuf};

use base64::{engine::general_purpose::STANDARD, Engine};
use p256::ecdsa::{signature::Signer, signature::Verifier, DerSignature, Signature};
use p256::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding,
};

use crate::{Error, Result};

pub struct SigningKey(p256::ecdsa::SigningKey);

/// A public key, with the file it came from (what a verdict names).
pub struct PublicKey {
    pub path: PathBuf,
    key: p256::ecdsa::VerifyingKey,
}

impl SigningKey {
    /// A PEM private key (PKCS#8, or SEC1 as openssl's `ecparam -genkey` writes), owner-only.
    pub fn load(path: &Path) -> Result<SigningKey> {
        super::crypt::owner_only(path, "--sign")?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::from(format!("--sign {}: {e}", path.display())))?;
        if text.contains("ENCRYPTED SIGSTORE PRIVATE KEY") || text.contains("ENCRYPTED COSIGN") {
            return Err(format!(
                "--sign {}: a cosign key file is encrypted with its password; give a PEM \
                 P-256 key (chalkctl snapshot keygen --signing makes one, and cosign \
                 import-key-pair --key FILE gives cosign the same key)",
                path.display()
            )
            .into());
        }
        let key = p256::ecdsa::SigningKey::from_pkcs8_pem(&text)
            .or_else(|_| p256::SecretKey::from_sec1_pem(&text).map(Into::into))
            .map_err(|e| {
                Error::from(format!(
                    "--sign {}: not a PEM P-256 private key ({e})",
                    path.display()
                ))
            })?;
        Ok(SigningKey(key))
    }

    /// The base64 DER signature of `payload`.
    pub fn sign(&self, payload: &[u8]) -> String {
        let sig: DerSignature = self.0.sign(payload);
        STANDARD.encode(sig.as_bytes())
    }
}

impl PublicKey {
    /// A PEM public key (`-----BEGIN PUBLIC KEY-----`, P-256).
    pub fn load(path: &Path) -> Result<PublicKey> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::from(format!("key {}: {e}", path.display())))?;
        let key = p256::ecdsa::VerifyingKey::from_public_key_pem(&text).map_err(|e| {
            Error::from(format!(
                "key {}: not a PEM P-256 public key ({e})",
                path.display()
            ))
        })?;
        Ok(PublicKey {
            path: path.to_path_buf(),
            key,
        })
    }

    /// Whether `signature` (base64 DER) signs `payload` with this key.
    pub fn verifies(&self, payload: &[u8], signature: &str) -> bool {
        let Ok(der) = STANDARD.decode(signature.trim()) else {
            return false;
        };
        let Ok(sig) = Signature::from_der(&der) else {
            return false;
        };
        self.key.verify(payload, &sig).is_ok()
    }
}

/// A new signing key in `out` (PKCS#8 PEM, 0600) and its public key in `out.pub`: that path.
pub fn generate(out: &Path) -> Result<PathBuf> {
    let key = p256::ecdsa::SigningKey::random(&mut rand_core::OsRng);
    let private = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| Error::from(format!("encode a key: {e}")))?;
    let public = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| Error::from(format!("encode a key: {e}")))?;
    let pub_path = PathBuf::from(format!("{}.pub", out.display()));
    if pub_path.exists() {
        return Err(format!(
            "{}: exists (keys are never overwritten)",
            pub_path.display()
        )
        .into());
    }
    super::crypt::write_secret(out, private.as_bytes())?;
    std::fs::write(&pub_path, public)
        .map_err(|e| Error::from(format!("{}: {e}", pub_path.display())))?;
    Ok(pub_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_with_its_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.key");
        let b = dir.path().join("b.key");
        let a_pub = generate(&a).unwrap();
        let b_pub = generate(&b).unwrap();
        let sig = SigningKey::load(&a).unwrap().sign(b"payload");
        let pa = PublicKey::load(&a_pub).unwrap();
        assert!(pa.verifies(b"payload", &sig));
        assert!(!pa.verifies(b"payload!", &sig));
        assert!(!PublicKey::load(&b_pub).unwrap().verifies(b"payload", &sig));
        let mut bad = STANDARD.decode(&sig).unwrap();
        let n = bad.len() - 1;
        bad[n] ^= 1;
        assert!(!pa.verifies(b"payload", &STANDARD.encode(bad)));
        assert!(!pa.verifies(b"payload", "not base64"));
    }

    #[test]
    fn bad_input_keys_name_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let k = dir.path().join("k");
        generate(&k).unwrap();
        assert!(generate(&k)
            .unwrap_err()
            .to_string()
            .contains("never overwritten"));
        let cosign = dir.path().join("cosign.key");
        super::super::crypt::write_secret(
            &cosign,
            b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nx\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = SigningKey::load(&cosign).err().unwrap().to_string();
        assert!(e.contains("import-key-pair"), "{e}");
        let e = PublicKey::load(&k).err().unwrap().to_string();
        assert!(e.contains("not a PEM P-256 public key"), "{e}");
    }
}
