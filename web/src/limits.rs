//! What the server lets clients make: sandboxes in all and per client, the memory and the
//! lifetime of each; and the check of where it listens (a token beyond loopback).

use std::{net::SocketAddr, time::Duration};

#[derive(Debug, Clone)]
pub struct Limits {
    pub total: usize,
    pub per_client: usize,
    /// Each sandbox's memory limit (its spec's `linux.resources.memory.limit`), bytes.
    pub memory: u64,
    /// How long a sandbox may run from each start, and stay suspended.
    pub lifetime: Duration,
}

/// Refuses one more sandbox when `total` are live here or `mine` are the client's.
pub fn admit(l: &Limits, total: usize, mine: usize) -> Result<(), String> {
    if total >= l.total {
        return Err(format!(
            "the server runs its limit of {} sandboxes: close one (or wait for one's lifetime \
             to end) and try again",
            l.total
        ));
    }
    if mine >= l.per_client {
        return Err(format!(
            "you have {mine} sandboxes, the most one client may have: close one and try again"
        ));
    }
    Ok(())
}

/// `256M`, `1G`, `65536k` or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 256M, 1G)"))?;
    let mul = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use k, M or G)")),
    };
    let bytes = n
        .checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if bytes < 32 << 20 {
        return Err(format!("{s:?}: a sandbox needs at least 32M"));
    }
    Ok(bytes)
}

/// Listening beyond loopback exposes shells to whoever reaches the port: it takes a token.
pub fn check_listen(addr: &SocketAddr, token: Option<&str>) -> Result<(), String> {
    match token {
        Some(t) if t.len() < 16 => Err("--token must be at least 16 characters".into()),
        None if !addr.ip().is_loopback() => Err(format!(
            "{addr} is not a loopback address: anyone who reaches it gets a shell, so it needs \
             --token (at least 16 characters; the page is then opened as /?token=...)"
        )),
        _ => Ok(()),
    }
}

/// Compares a presented token without leaking, by timing, how much of it matched.
pub fn token_matches(expected: &str, given: &str) -> bool {
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            total: 3,
            per_client: 2,
            memory: 256 << 20,
            lifetime: Duration::from_secs(60),
        }
    }

    #[test]
    fn admits_within_both_limits() {
        assert!(admit(&limits(), 0, 0).is_ok());
        assert!(admit(&limits(), 2, 1).is_ok());
        assert!(admit(&limits(), 3, 0).unwrap_err().contains("limit of 3"));
        assert!(admit(&limits(), 2, 2).unwrap_err().contains("you have 2"));
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("65536k").unwrap(), 64 << 20);
        assert!(parse_size("12").unwrap_err().contains("at least"));
        assert!(parse_size("1T").unwrap_err().contains("unknown unit"));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn beyond_loopback_needs_a_token() {
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(check_listen(&lo, None).is_ok());
        assert!(check_listen(&any, None).unwrap_err().contains("--token"));
        assert!(check_listen(&any, Some("short")).is_err());
        assert!(check_listen(&any, Some("0123456789abcdef")).is_ok());
        assert!(token_matches("0123456789abcdef", "0123456789abcdef"));
        assert!(!token_matches("0123456789abcdef", "0123456789abcdeF"));
        assert!(!token_matches("0123456789abcdef", "0123"));
    }
}
