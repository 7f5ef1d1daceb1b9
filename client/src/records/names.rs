//! Names people give sandboxes and snapshots (`--name`), accepted wherever an id is: a
//! container label for a sandbox, a record label for a snapshot. An id always wins over a
//! name; a name is refused where it could be read as something else (another sandbox's id
//! or name, a snapshot id).

use containerd_client::services::v1::Container;

use crate::{containerd::Client, Error, Result};

/// Names follow containerd's rules for ids (they may become ids: `fork --name`), and a name
/// of 12 or more hex digits is refused: it would read as a snapshot id.
pub fn check(name: &str) -> Result<()> {
    chalk_runtime::ids::validate("name", name).map_err(|e| Error::from(e.to_string()))?;
    if name.len() >= 12 && name.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "name {name:?} reads as a snapshot id (12 or more hex digits): choose another"
        )
        .into());
    }
    Ok(())
}

/// The names of `count` sandboxes made at once from `name`: the name itself for one,
/// `name-1` .. `name-N` for several (as their ids are numbered).
pub fn numbered(name: Option<&str>, count: usize) -> Vec<Option<String>> {
    match (name, count) {
        (None, _) => vec![None; count],
        (Some(n), 1) => vec![Some(n.to_string())],
        (Some(n), _) => (1..=count).map(|i| Some(format!("{n}-{i}"))).collect(),
    }
}

/// The id `query` names among `(id, name)` pairs: itself when it is an id, else the one
/// sandbox named so.
pub fn pick(all: &[(String, Option<String>)], query: &str) -> Result<Option<String>> {
    if all.iter().any(|(id, _)| id == query) {
        return Ok(Some(query.to_string()));
    }
    let named: Vec<&String> = all
        .iter()
        .filter(|(_, n)| n.as_deref() == Some(query))
        .map(|(id, _)| id)
        .collect();
    match named.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((*one).clone())),
        many => Err(format!(
            "name {query} is given to {} sandboxes ({}): use an id",
            many.len(),
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into()),
    }
}

fn pairs(containers: &[Container]) -> Vec<(String, Option<String>)> {
    containers
        .iter()
        .map(|c| {
            (
                c.id.clone(),
                c.labels.get(chalk_labels::NAME_LABEL).cloned(),
            )
        })
        .collect()
}

/// The sandbox id `query` (an id or a name) stands for; `query` itself when nothing here
/// has that id or name (the command's own lookup then says it is not found).
pub fn resolve(client: &Client, query: &str) -> Result<String> {
    match client.container(query) {
        Ok(_) => return Ok(query.to_string()),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    Ok(pick(&pairs(&client.containers()?), query)?.unwrap_or_else(|| query.to_string()))
}

/// Refuses names a new sandbox may not take: invalid ones, and ones already an id or a name
/// here.
pub fn check_free(client: &Client, names: &[Option<String>]) -> Result<()> {
    let names: Vec<&String> = names.iter().flatten().collect();
    if names.is_empty() {
        return Ok(());
    }
    let all = pairs(&client.containers()?);
    for name in names {
        check(name)?;
        if let Some((id, _)) = all
            .iter()
            .find(|(id, n)| id == name || n.as_ref() == Some(name))
        {
            return Err(format!(
                "name {name} is taken (by sandbox {id}): choose another, or remove that one \
                 with chalkctl rm"
            )
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_like_ids_and_never_read_as_snapshot_ids() {
        assert!(check("my-box").is_ok());
        assert!(check("cafe").is_ok());
        for bad in ["", "a b", "../x", "-x", "deadbeefcafe", "0123456789abcdef"] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_id_wins_over_a_name_and_a_shared_name_is_refused() {
        let all = vec![
            ("a".to_string(), Some("web".to_string())),
            ("web".to_string(), None),
            ("b".to_string(), Some("db".to_string())),
            ("c".to_string(), Some("twin".to_string())),
            ("d".to_string(), Some("twin".to_string())),
        ];
        assert_eq!(pick(&all, "web").unwrap().as_deref(), Some("web"));
        assert_eq!(pick(&all, "db").unwrap().as_deref(), Some("b"));
        assert_eq!(pick(&all, "none").unwrap(), None);
        let e = pick(&all, "twin").unwrap_err().to_string();
        assert!(e.contains("c, d"), "{e}");
    }

    #[test]
    fn several_at_once_are_numbered() {
        assert_eq!(numbered(None, 2), vec![None, None]);
        assert_eq!(numbered(Some("x"), 1), vec![Some("x".to_string())]);
        assert_eq!(
            numbered(Some("x"), 2),
            vec![Some("x-1".to_string()), Some("x-2".to_string())]
        );
    }
}
