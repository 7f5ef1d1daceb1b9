//! Where a stdio URI of containerd's points: a fifo path (or `fifo://`), a `file://` or a
//! `binary://` logging binary.

use std::{io, path::PathBuf};

use crate::logger::{self, LoggerSpec};

/// Where one output stream goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    None,
    Fifo(PathBuf),
    File(PathBuf),
    Binary(LoggerSpec),
}

pub fn parse_target(uri: &str) -> io::Result<Target> {
    if uri.is_empty() {
        return Ok(Target::None);
    }
    if let Some(path) = uri.strip_prefix("file://") {
        return absolute(path).map(Target::File);
    }
    if let Some(path) = uri.strip_prefix("fifo://") {
        return absolute(path).map(Target::Fifo);
    }
    if uri.starts_with("binary://") {
        return logger::parse(uri).map(Target::Binary);
    }
    if let Some((scheme, _)) = uri.split_once("://") {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("stdio uri scheme {scheme:?} is not supported (use a fifo path, file:// or binary://)"),
        ));
    }
    absolute(uri).map(Target::Fifo)
}

fn absolute(path: &str) -> io::Result<PathBuf> {
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("stdio path {path:?} is not absolute"),
        ));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stdio_targets() {
        assert_eq!(parse_target("").unwrap(), Target::None);
        assert_eq!(
            parse_target("/run/x/stdout").unwrap(),
            Target::Fifo("/run/x/stdout".into())
        );
        assert_eq!(
            parse_target("fifo:///run/x/out").unwrap(),
            Target::Fifo("/run/x/out".into())
        );
        assert_eq!(
            parse_target("file:///var/log/c.log").unwrap(),
            Target::File("/var/log/c.log".into())
        );
        assert!(parse_target("relative/fifo").is_err());
        assert!(parse_target("ftp://host/x").is_err());
    }
}
