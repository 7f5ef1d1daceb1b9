//! The snapshot registry's model, kept in containerd's image store: a snapshot is an image
//! record whose labels say what it is, and these are the pure rules over those labels
//! (statuses, user labels, filters, newest-first pages with a cursor). No I/O: `chalkctl`
//! reads and writes the records through containerd's API.

use std::collections::BTreeMap;

use crate::{Error, Result};

/// The longest page a list returns (walk further with its cursor).
pub const MAX_PAGE: usize = 1000;
/// The most user labels one snapshot may carry.
pub const MAX_USER_LABELS: usize = 64;
/// containerd's limit on a label's key plus value.
const MAX_LABEL: usize = 4096;

/// A snapshot's life: made `pending`, `in_progress` while runsc checkpoints, then
/// `completed` or `failed` (with the error kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Pending,
    InProgress,
    Completed,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "pending" => Status::Pending,
            "in_progress" => Status::InProgress,
            "completed" => Status::Completed,
            "failed" => Status::Failed,
            other => {
                return Err(Error::parse(
                    "snapshot status",
                    format!("{other:?}: expected pending, in_progress, completed or failed"),
                ))
            }
        })
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One snapshot, as its image record describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The image record's name.
    pub name: String,
    /// The snapshot's id once completed: its OCI manifest's digest.
    pub digest: String,
    /// The digest of the index the record points at (what a restore is given).
    pub index: String,
    pub sandbox_id: String,
    pub status: Status,
    /// RFC 3339; orders the registry.
    pub created: String,
    pub error: Option<String>,
    pub base_image: Option<String>,
    /// Who is taking it, while it is in progress.
    pub owner: Option<Owner>,
    /// The name it was given (`snapshot create --name`), accepted wherever its id is.
    pub given_name: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// A process, told apart from a later one with its pid: the boot it ran in and its start
/// time (clock ticks after boot, as /proc/<pid>/stat says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub boot: String,
    pub pid: u32,
    pub start: u64,
}

impl Owner {
    pub fn to_label(&self) -> String {
        format!("{}/{}/{}", self.boot, self.pid, self.start)
    }

    pub fn parse(s: &str) -> Option<Owner> {
        let mut parts = s.split('/');
        let (boot, pid, start) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || boot.is_empty() {
            return None;
        }
        Some(Owner {
            boot: boot.to_string(),
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
        })
    }
}

impl Snapshot {
    /// Reads a snapshot from an image record (`target` the digest it points at); None when
    /// the record is not a snapshot. Records made before ids were manifest digests go by
    /// their index's digest.
    pub fn from_record(
        name: &str,
        target: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<Snapshot> {
        if labels.get(chalk_labels::LABEL_SNAPSHOT).map(String::as_str) != Some("true") {
            return None;
        }
        let status = labels
            .get(chalk_labels::LABEL_STATUS)
            .and_then(|s| Status::parse(s).ok())
            .unwrap_or(Status::Failed);
        Some(Snapshot {
            name: name.to_string(),
            digest: labels
                .get(chalk_labels::LABEL_ID)
                .cloned()
                .unwrap_or_else(|| target.to_string()),
            index: target.to_string(),
            sandbox_id: labels
                .get(chalk_labels::LABEL_SANDBOX)
                .cloned()
                .unwrap_or_default(),
            status,
            created: labels
                .get(chalk_labels::LABEL_CREATED)
                .cloned()
                .unwrap_or_default(),
            error: labels.get(chalk_labels::LABEL_ERROR).cloned(),
            base_image: labels.get(chalk_labels::LABEL_BASE).cloned(),
            owner: labels
                .get(chalk_labels::LABEL_OWNER)
                .and_then(|o| Owner::parse(o)),
            given_name: labels.get(chalk_labels::NAME_LABEL).cloned(),
            labels: labels
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        k.strip_prefix(chalk_labels::USER_PREFIX)?.to_string(),
                        v.clone(),
                    ))
                })
                .collect(),
        })
    }

    /// The image record labels that describe this snapshot.
    pub fn to_labels(&self) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = self
            .labels
            .iter()
            .map(|(k, v)| (format!("{}{k}", chalk_labels::USER_PREFIX), v.clone()))
            .collect();
        out.insert(chalk_labels::LABEL_SNAPSHOT.into(), "true".into());
        out.insert(chalk_labels::LABEL_SANDBOX.into(), self.sandbox_id.clone());
        out.insert(
            chalk_labels::LABEL_STATUS.into(),
            self.status.as_str().into(),
        );
        out.insert(chalk_labels::LABEL_CREATED.into(), self.created.clone());
        if let Some(e) = &self.error {
            // Long errors are cut to fit containerd's label limit.
            let room = MAX_LABEL - chalk_labels::LABEL_ERROR.len();
            out.insert(
                chalk_labels::LABEL_ERROR.into(),
                e.chars().take(room / 4).collect(),
            );
        }
        if let Some(b) = &self.base_image {
            out.insert(chalk_labels::LABEL_BASE.into(), b.clone());
        }
        if let (Some(o), Status::InProgress) = (&self.owner, self.status) {
            out.insert(chalk_labels::LABEL_OWNER.into(), o.to_label());
        }
        if !self.digest.is_empty() && self.digest != self.index {
            out.insert(chalk_labels::LABEL_ID.into(), self.digest.clone());
        }
        if let Some(n) = &self.given_name {
            out.insert(chalk_labels::NAME_LABEL.into(), n.clone());
        }
        out
    }

    /// Whether `query` names this snapshot: its digest (with or without `sha256:`, or a
    /// unique prefix of at least 12 hex digits, checked by the caller), its record's name or
    /// the name it was given.
    pub fn matches(&self, query: &str) -> bool {
        if query == self.name || self.given_name.as_deref() == Some(query) {
            return true;
        }
        let hex = self.digest.trim_start_matches("sha256:");
        let q = query.trim_start_matches("sha256:");
        q.len() >= 12 && !hex.is_empty() && hex.starts_with(q)
    }
}

/// The image record name of a new snapshot of `sandbox_id` taken at `created` (RFC 3339).
pub fn record_name(sandbox_id: &str, created: &str) -> String {
    let stamp: String = created.chars().filter(|c| c.is_ascii_digit()).collect();
    format!("chalk.io/snapshots/{sandbox_id}:{stamp}")
}

/// Parses a `key=value` user label.
pub fn parse_label(s: &str) -> Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| Error::parse("label", format!("{s:?}: expected key=value")))?;
    let valid_key = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
    if !valid_key {
        return Err(Error::parse(
            "label",
            format!("key {k:?}: letters, digits and . _ - / only"),
        ));
    }
    if chalk_labels::USER_PREFIX.len() + k.len() + v.len() > MAX_LABEL {
        return Err(Error::parse(
            "label",
            format!("{k:?}: key and value exceed containerd's {MAX_LABEL} bytes"),
        ));
    }
    Ok((k.to_string(), v.to_string()))
}

/// What `snapshot list` selects.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub sandbox_id: Option<String>,
    pub status: Option<Status>,
}

/// One page of snapshots, newest first, and the cursor of the next (None on the last).
#[derive(Debug, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<Snapshot>,
    pub next_cursor: Option<String>,
}

/// The page of `all` that `filter` selects, after `cursor` (as a previous page returned it),
/// at most `limit` long. Pages stay consistent while snapshots are added: the cursor is the
/// position of the last item shown, not a count.
pub fn page(all: &[Snapshot], filter: &Filter, limit: usize, cursor: Option<&str>) -> Result<Page> {
    if limit == 0 || limit > MAX_PAGE {
        return Err(Error::parse(
            "limit",
            format!("{limit}: must be 1 to {MAX_PAGE} (walk further pages with --cursor)"),
        ));
    }
    let after = cursor.map(decode_cursor).transpose()?;
    let mut selected: Vec<&Snapshot> = all
        .iter()
        .filter(|s| {
            filter
                .sandbox_id
                .as_ref()
                .is_none_or(|id| &s.sandbox_id == id)
        })
        .filter(|s| filter.status.is_none_or(|st| s.status == st))
        .collect();
    // Newest first; the name breaks ties, so the order is total.
    selected.sort_by(|a, b| (&b.created, &b.name).cmp(&(&a.created, &a.name)));
    let start = match &after {
        None => 0,
        Some((created, name)) => selected
            .iter()
            .position(|s| (&s.created, &s.name) < (created, name))
            .unwrap_or(selected.len()),
    };
    let items: Vec<Snapshot> = selected[start..]
        .iter()
        .take(limit)
        .map(|s| (*s).clone())
        .collect();
    let more = selected.len() > start + items.len();
    let next_cursor = match (more, items.last()) {
        (true, Some(last)) => Some(encode_cursor(&last.created, &last.name)),
        _ => None,
    };
    Ok(Page { items, next_cursor })
}

fn encode_cursor(created: &str, name: &str) -> String {
    format!("{created}|{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_cursor(cursor: &str) -> Result<(String, String)> {
    let bad = || Error::parse("cursor", format!("{cursor:?} is not one that list printed"));
    if !cursor.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&cursor[i..i + 2], 16))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (created, name) = text.split_once('|').ok_or_else(bad)?;
    Ok((created.to_string(), name.to_string()))
}

/// The user label of a snapshot pulled from a registry: where from.
pub const PULLED_FROM: &str = "pulled-from";

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(i: u32, sandbox: &str, status: Status) -> Snapshot {
        let created = format!("2026-11-29T10:00:{i:02}Z");
        Snapshot {
            name: record_name(sandbox, &created),
            digest: format!("sha256:{i:064x}"),
            index: format!("sha256:{:064x}", i + 1000),
            sandbox_id: sandbox.into(),
            status,
            created,
            error: None,
            base_image: Some("docker.io/library/busybox@sha256:abc".into()),
            owner: None,
            given_name: None,
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn labels_round_trip_and_user_labels_are_kept_apart() {
        let mut s = snap(1, "web", Status::Failed);
        s.error = Some("runsc checkpoint web: exited with status 128".into());
        s.labels.insert("team".into(), "a".into());
        s.labels.insert("status".into(), "mine".into()); // cannot clash with chalk.io/status
        let labels = s.to_labels();
        assert_eq!(labels[chalk_labels::LABEL_STATUS], "failed");
        assert_eq!(labels["chalk.io/label.status"], "mine");
        let back = Snapshot::from_record(&s.name, &s.index, &labels).unwrap();
        assert_eq!(back, s);
        assert!(Snapshot::from_record("x", "d", &BTreeMap::new()).is_none());
    }

    #[test]
    fn statuses_parse_and_unknown_ones_are_named() {
        for st in [
            Status::Pending,
            Status::InProgress,
            Status::Completed,
            Status::Failed,
        ] {
            assert_eq!(Status::parse(st.as_str()).unwrap(), st);
        }
        let err = Status::parse("done").unwrap_err().to_string();
        assert!(
            err.contains("\"done\"") && err.contains("in_progress"),
            "{err}"
        );
    }

    #[test]
    fn snapshots_are_found_by_digest_prefix_or_name() {
        let s = snap(7, "web", Status::Completed);
        assert!(s.matches(&s.digest));
        assert!(s.matches(&s.digest["sha256:".len()..]));
        assert!(s.matches(&s.digest[.."sha256:".len() + 12]));
        assert!(
            !s.matches(&s.digest[.."sha256:".len() + 6]),
            "too short to trust"
        );
        assert!(s.matches(&s.name));
        assert!(!s.matches("web"));
    }

    #[test]
    fn labels_are_checked() {
        assert_eq!(
            parse_label("team=a=b").unwrap(),
            ("team".into(), "a=b".into())
        );
        assert!(parse_label("novalue").is_err());
        assert!(parse_label("bad key=x").is_err());
        assert!(parse_label(&format!("k={}", "x".repeat(5000))).is_err());
    }

    #[test]
    fn pages_are_newest_first_and_the_cursor_walks_them_all() {
        let all: Vec<Snapshot> = (0..7).map(|i| snap(i, "web", Status::Completed)).collect();
        let f = Filter::default();
        let first = page(&all, &f, 3, None).unwrap();
        assert_eq!(first.items[0].created, "2026-11-29T10:00:06Z");
        let mut seen: Vec<String> = first.items.iter().map(|s| s.name.clone()).collect();
        let mut cursor = first.next_cursor;
        while let Some(c) = cursor {
            let p = page(&all, &f, 3, Some(&c)).unwrap();
            seen.extend(p.items.iter().map(|s| s.name.clone()));
            cursor = p.next_cursor;
        }
        assert_eq!(seen.len(), 7);
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 7, "no snapshot twice");
        // A page that ends exactly at the last snapshot has no next cursor.
        assert!(page(&all, &f, 7, None).unwrap().next_cursor.is_none());
    }

    #[test]
    fn a_new_snapshot_does_not_shift_the_next_page() {
        let mut all: Vec<Snapshot> = (0..4).map(|i| snap(i, "web", Status::Completed)).collect();
        let f = Filter::default();
        let first = page(&all, &f, 2, None).unwrap();
        all.push(snap(9, "web", Status::Completed));
        let second = page(&all, &f, 2, first.next_cursor.as_deref()).unwrap();
        let names: Vec<_> = second.items.iter().map(|s| &s.created[17..19]).collect();
        assert_eq!(names, ["01", "00"]);
    }

    #[test]
    fn filters_by_sandbox_and_status() {
        let all = vec![
            snap(1, "web", Status::Completed),
            snap(2, "db", Status::Completed),
            snap(3, "web", Status::Failed),
        ];
        let by_web = Filter {
            sandbox_id: Some("web".into()),
            status: None,
        };
        assert_eq!(page(&all, &by_web, 10, None).unwrap().items.len(), 2);
        let failed = Filter {
            sandbox_id: None,
            status: Some(Status::Failed),
        };
        let p = page(&all, &failed, 10, None).unwrap();
        assert_eq!(p.items.len(), 1);
        assert_eq!(p.items[0].sandbox_id, "web");
    }

    #[test]
    fn bad_cursors_and_limits_are_refused() {
        let all = vec![snap(1, "web", Status::Completed)];
        assert!(page(&all, &Filter::default(), 0, None).is_err());
        let too_long = page(&all, &Filter::default(), MAX_PAGE + 1, None).unwrap_err();
        assert!(too_long.to_string().contains("1 to 1000"), "{too_long}");
        assert!(page(&all, &Filter::default(), MAX_PAGE, None).is_ok());
        assert!(page(&all, &Filter::default(), 1, Some("zz")).is_err());
        assert!(page(&all, &Filter::default(), 1, Some("616263")).is_err()); // no separator
    }

    #[test]
    fn record_names_are_valid_references() {
        assert_eq!(
            record_name("web", "2026-11-29T10:00:06Z"),
            "chalk.io/snapshots/web:20261129100006"
        );
    }
}
