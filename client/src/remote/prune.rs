//! Snapshots in a registry repository, kept to the newest few or all removed (tagged
//! `s<milliseconds since 1970>`; tags of any other form, a user's, the referrers fallback, the
//! base image, are never touched), or removed one by one by their full digests: what the
//! cluster agent does with the suspends it has a record of.

use oci_client::Reference;

use super::{
    hosts::Use,
    session::{self, Session},
    Access,
};
use crate::{Error, Result};

/// The tag of a snapshot taken at `millis` (ms since 1970): fixed width, so that tags sort
/// as their times do.
pub fn timed_tag(millis: u128) -> String {
    format!("s{millis:013}")
}

fn is_timed(tag: &str) -> bool {
    tag.strip_prefix('s')
        .is_some_and(|d| d.len() == 13 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The timed tags to remove so that the newest `keep` stay, oldest first.
pub fn beyond(tags: &[String], keep: usize) -> Vec<String> {
    let mut timed: Vec<&String> = tags.iter().filter(|t| is_timed(t)).collect();
    timed.sort();
    let drop = timed.len().saturating_sub(keep);
    timed.into_iter().take(drop).cloned().collect()
}

/// Removes from `repository` (`host[:port]/path`) the snapshots of its timed tags beyond the
/// newest `keep` (0: all of them): the references (`repo:tag@digest`) removed.
pub fn prune(access: &Access, repository: &str, keep: usize) -> Result<Vec<String>> {
    let r = super::reference(repository)?;
    if r.tag().is_some_and(|t| t != "latest") || r.digest().is_some() {
        return Err(Error::from(format!(
            "{repository}: give a repository, without a tag or digest"
        )));
    }
    let mut last = None;
    for s in session::sessions(access, &r, Use::Push)? {
        match prune_at(&s, &r, keep) {
            Ok(gone) => return Ok(gone),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::from(format!("no host for {repository}"))))
}

/// Removes each snapshot `references` names (`repo[:tag]@sha256:…`, its full digest) from
/// its repository: those removed (one already gone is not an error).
pub fn remove(access: &Access, references: &[String]) -> Result<Vec<String>> {
    let mut gone = Vec::new();
    for reference in references {
        let r = super::reference(reference)?;
        let digest = r
            .digest()
            .filter(|d| chalk_runtime::snapshot::oci::sha256_hex_of(d).is_some())
            .ok_or_else(|| {
                Error::from(format!("{reference}: a removal names a full sha256 digest"))
            })?
            .to_string();
        let mut last = None;
        for s in session::sessions(access, &r, Use::Push)? {
            match s.delete_manifest(&r, &digest) {
                Ok(true) => {
                    gone.push(reference.clone());
                    last = None;
                    break;
                }
                Ok(false) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
    }
    Ok(gone)
}

fn prune_at(s: &Session, r: &Reference, keep: usize) -> Result<Vec<String>> {
    let tags = match s.tags(r) {
        Ok(t) => t,
        // A repository never pushed to has nothing to remove.
        Err(e) if e.to_string().contains("404") || e.to_string().contains("NAME_UNKNOWN") => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e),
    };
    let mut gone = Vec::new();
    for tag in beyond(&tags, keep) {
        let tagged = Reference::with_tag(
            r.registry().to_string(),
            r.repository().to_string(),
            tag.clone(),
        );
        let Some((_, digest)) =
            s.try_manifest(&tagged, &[chalk_runtime::snapshot::oci::MANIFEST])?
        else {
            continue;
        };
        s.delete_manifest(r, &digest)?;
        gone.push(format!(
            "{}/{}:{tag}@{digest}",
            r.registry(),
            r.repository()
        ));
    }
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_timed_tags_stay_and_no_other_is_touched() {
        let tags: Vec<String> = [
            timed_tag(1_700_000_000_300),
            "v1".into(),
            timed_tag(1_700_000_000_100),
            "sha256-abc".into(),
            timed_tag(1_700_000_000_200),
            "s123".into(),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            beyond(&tags, 2),
            vec![timed_tag(1_700_000_000_100)],
            "the oldest goes"
        );
        assert_eq!(beyond(&tags, 5), Vec::<String>::new());
        assert_eq!(beyond(&tags, 0).len(), 3, "all timed ones, none other");
        assert_eq!(timed_tag(5), "s0000000000005");
    }
}
