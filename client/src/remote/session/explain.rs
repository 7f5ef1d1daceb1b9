//! What a registry's refusal or failure means to the user, in words that say what to do;
//! never a credential, never an upload URL's session.

use oci_client::{errors::OciDistributionError, Reference};

use super::Session;
use crate::Error;

impl Session {
    /// oci-client's error as what the user can do about it; never a credential.
    pub(super) fn explain(&self, what: &str, r: &Reference, e: OciDistributionError) -> Error {
        let host = &self.endpoint.host;
        // A blob stream that fails its digest check ends as an I/O error carrying it.
        let damaged = matches!(e, OciDistributionError::DigestError(_))
            || e.to_string().contains("Invalid digest. Expected");
        let text = match &e {
            _ if damaged => format!(
                "what the registry sent does not match its digest ({e}): it was changed or \
                 damaged there; refused (nothing was stored)"
            ),
            OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. } => format!(
                "{host} refused {} (unauthorized): give the right credentials with --user \
                 user[:password] or in the docker config (docker login {host})",
                self.who
            ),
            OciDistributionError::ServerError { code: 401, .. } => format!(
                "{host} refused {} (401 unauthorized): give the right credentials with --user \
                 user[:password] or in the docker config (docker login {host})",
                self.who
            ),
            OciDistributionError::ServerError { code: 403, .. } => {
                format!(
                    "{host} does not allow {} to do this (403 forbidden)",
                    self.who
                )
            }
            e if not_found(e) => format!("{} does not exist (404)", r.whole()),
            OciDistributionError::RequestError(re) => {
                let mut chain = re.to_string();
                let mut source = std::error::Error::source(re);
                while let Some(s) = source {
                    chain.push_str(": ");
                    chain.push_str(&s.to_string());
                    source = s.source();
                }
                let hint = if chain.contains("certificate") || chain.contains("UnknownIssuer") {
                    format!(
                        " (trust the registry's CA: put it in {host}'s directory of the hosts \
                         directory as ca.crt, or name it in its hosts.toml)"
                    )
                } else if chain.contains("InvalidContentType") || chain.contains("wrong version") {
                    " (is it plain HTTP? then pass --plain-http)".to_string()
                } else if !cut_or_full(&chain).is_empty() {
                    cut_or_full(&chain).to_string()
                } else if chain.contains("onnect") {
                    " (is the registry up, and is this its address?)".to_string()
                } else {
                    String::new()
                };
                format!("{} {chain}{hint}", self.endpoint.url())
            }
            other => {
                let said = other.to_string();
                format!("{}{}", said.trim_end(), cut_or_full(&said))
            }
        };
        Error::from(format!(
            "{what} of {}: {}",
            r.whole(),
            without_url_queries(&text)
        ))
    }
}

/// What to do about a transfer the registry cut off or could not store.
pub(super) fn cut_or_full(text: &str) -> &'static str {
    let t = text.to_ascii_lowercase();
    if t.contains("os error 28") {
        " (this host's disk is full: make room where the snapshot store is, then run the same \
         command again)"
    } else if t.contains("no space left") {
        " (the registry's storage is full: make room there, then push again; the blobs it \
         has already are not sent again)"
    } else if [
        "error decoding response body",
        "connection reset",
        "broken pipe",
        "unexpected eof",
        "incompletemessage",
    ]
    .iter()
    .any(|m| t.contains(m))
    {
        " (the connection to the registry broke mid-transfer: run the same command again \
         once it is back)"
    } else {
        ""
    }
}

/// `text` with every URL's query cut off: an upload URL's `_state` is a session of the
/// registry's, noise at best in an error.
pub(super) fn without_url_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | ',' | '"' | '\''))
            .unwrap_or(tail.len());
        let url = &tail[..end];
        out.push_str(url.split_once('?').map_or(url, |(u, _)| u));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Whether the registry said there is no such manifest or repository.
pub(super) fn not_found(e: &OciDistributionError) -> bool {
    use oci_client::errors::OciErrorCode;
    match e {
        OciDistributionError::ImageManifestNotFoundError(_)
        | OciDistributionError::ServerError { code: 404, .. } => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown
            )
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_queries_are_cut_from_errors() {
        let text = "Server error: url https://r:5000/v2/a/blobs/uploads/1?_state=SECRET&digest=x, \
                    code: 500 (see http://r/x?y=1)";
        let cut = without_url_queries(text);
        assert_eq!(
            cut,
            "Server error: url https://r:5000/v2/a/blobs/uploads/1, code: 500 (see http://r/x)"
        );
        assert_eq!(without_url_queries("no url here"), "no url here");
    }

    #[test]
    fn a_full_or_cut_transfer_says_what_to_do() {
        assert!(cut_or_full("write …/data: no space left on device").contains("registry's"));
        assert!(cut_or_full("No space left on device (os error 28)").contains("this host's"));
        assert!(cut_or_full("error decoding response body").contains("run the same command"));
        assert!(cut_or_full("Connection reset by peer (os error 104)").contains("again"));
        assert_eq!(cut_or_full("404 not found"), "");
    }
}
