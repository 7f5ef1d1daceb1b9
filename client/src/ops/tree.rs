//! `chalkctl tree`: the sandboxes of this runtime as the fork tree they make, each under the
//! sandbox it was forked from. The tree is built from `list --all`'s records; building and
//! drawing it are pure.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::{
    containerd::{Client, Result},
    progress::short,
    records::sandboxes,
    Error,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub status: String,
    pub parent_snapshot_id: Option<String>,
    /// Set when the sandbox it was forked from no longer exists.
    pub parent_gone: Option<String>,
    pub children: Vec<Node>,
}

/// The whole forest, or only the tree below `id`.
pub fn forest(client: &Client, id: Option<&str>) -> Result<Vec<Node>> {
    let all = build(&sandboxes::list(client, true)?);
    match id {
        None => Ok(all),
        Some(id) => find(&all, id)
            .map(|n| vec![n.clone()])
            .ok_or_else(|| Error::from(format!("sandbox {id}: not found"))),
    }
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(String::from)
}

/// Nodes from sandbox records (`id`, `status`, `parent_sandbox_id`, `parent_snapshot_id`):
/// roots are those with no parent or whose parent is gone; children in id order.
pub fn build(records: &[Value]) -> Vec<Node> {
    let by_id: BTreeMap<String, &Value> = records
        .iter()
        .filter_map(|r| Some((text(&r["id"])?, r)))
        .collect();
    let mut children: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut roots = Vec::new();
    for (id, r) in &by_id {
        match text(&r["parent_sandbox_id"]) {
            Some(parent) if by_id.contains_key(&parent) && &parent != id => {
                children.entry(parent).or_default().push(id.clone())
            }
            _ => roots.push(id.clone()),
        }
    }
    let mut seen = BTreeSet::new();
    let mut out: Vec<Node> = roots
        .iter()
        .map(|id| node(id, &by_id, &children, &mut seen))
        .collect();
    // Records whose parents point at each other in a ring reach no root: list them too.
    for id in by_id.keys() {
        if !seen.contains(id) {
            out.push(node(id, &by_id, &children, &mut seen));
        }
    }
    out
}

fn node(
    id: &str,
    by_id: &BTreeMap<String, &Value>,
    children: &BTreeMap<String, Vec<String>>,
    seen: &mut BTreeSet<String>,
) -> Node {
    seen.insert(id.to_string());
    let r = by_id[id];
    let parent = text(&r["parent_sandbox_id"]);
    let mut kids = Vec::new();
    for c in children.get(id).into_iter().flatten() {
        if !seen.contains(c) {
            kids.push(node(c, by_id, children, seen));
        }
    }
    Node {
        id: id.to_string(),
        status: text(&r["status"]).unwrap_or_default(),
        parent_snapshot_id: text(&r["parent_snapshot_id"]),
        parent_gone: parent.filter(|p| !by_id.contains_key(p)),
        children: kids,
    }
}

fn find<'a>(nodes: &'a [Node], id: &str) -> Option<&'a Node> {
    nodes.iter().find_map(|n| {
        if n.id == id {
            Some(n)
        } else {
            find(&n.children, id)
        }
    })
}

/// The forest as lines: `id  status  (from snapshot)`, children indented under their parent.
pub fn draw(nodes: &[Node]) -> Vec<String> {
    let mut lines = Vec::new();
    for n in nodes {
        lines.push(line(n, ""));
        draw_children(n, "", &mut lines);
    }
    lines
}

fn line(n: &Node, prefix: &str) -> String {
    let mut s = format!("{prefix}{}  {}", n.id, n.status);
    if let Some(snap) = &n.parent_snapshot_id {
        s.push_str(&format!("  from {}", short(snap)));
    }
    if let Some(parent) = &n.parent_gone {
        s.push_str(&format!("  (forked from {parent}, gone)"));
    }
    s
}

fn draw_children(n: &Node, indent: &str, lines: &mut Vec<String>) {
    for (i, c) in n.children.iter().enumerate() {
        let last = i + 1 == n.children.len();
        let branch = if last { "`-- " } else { "|-- " };
        lines.push(line(c, &format!("{indent}{branch}")));
        let deeper = format!("{indent}{}", if last { "    " } else { "|   " });
        draw_children(c, &deeper, lines);
    }
}

pub fn to_json(n: &Node) -> Value {
    json!({
        "id": n.id,
        "status": n.status,
        "parent_snapshot_id": n.parent_snapshot_id,
        "parent_gone": n.parent_gone,
        "children": n.children.iter().map(to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, status: &str, parent: Option<&str>) -> Value {
        json!({"id": id, "status": status, "parent_sandbox_id": parent,
               "parent_snapshot_id": parent.map(|_| "sha256:0123456789abcdef")})
    }

    #[test]
    fn forks_hang_under_their_parents() {
        let records = [
            rec("web", "running", None),
            rec("web-f2", "running", Some("web")),
            rec("web-f1", "suspended", Some("web")),
            rec("web-f1-a", "running", Some("web-f1")),
            rec("lone", "running", Some("deleted-source")),
        ];
        let forest = build(&records);
        assert_eq!(
            draw(&forest),
            [
                "lone  running  from 0123456789ab  (forked from deleted-source, gone)",
                "web  running",
                "|-- web-f1  suspended  from 0123456789ab",
                "|   `-- web-f1-a  running  from 0123456789ab",
                "`-- web-f2  running  from 0123456789ab",
            ]
        );
        let sub = find(&forest, "web-f1").unwrap();
        assert_eq!(sub.children.len(), 1);
        assert_eq!(to_json(sub)["children"][0]["id"], "web-f1-a");
    }

    #[test]
    fn a_ring_of_parents_is_still_listed_once() {
        let records = [
            rec("a", "running", Some("b")),
            rec("b", "running", Some("a")),
        ];
        let forest = build(&records);
        let mut ids = Vec::new();
        fn walk(n: &Node, ids: &mut Vec<String>) {
            ids.push(n.id.clone());
            n.children.iter().for_each(|c| walk(c, ids));
        }
        forest.iter().for_each(|n| walk(n, &mut ids));
        ids.sort();
        assert_eq!(ids, ["a", "b"]);
    }
}
