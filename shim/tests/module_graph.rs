//! The shim's top-level modules form a DAG: no module uses one that uses it back (directly or
//! through others). A cycle is how a Task adapter turns back into a utility module; this test
//! names the cycle it finds. `sandbox/*` counts as `sandbox`; test code is left out.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level modules named after `crate::` (paths and `use crate::{a, b::c}` groups).
fn used_modules(source: &str) -> BTreeSet<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or("");
    let mut used = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group, skipping nested braces.
            let (mut depth, mut start) = (0, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        used.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            used.insert(ident(rest));
        }
    }
    used.retain(|m| !m.is_empty());
    used
}

fn graph(src: &Path) -> Graph {
    let mut g = Graph::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = top.trim_end_matches(".rs").to_string();
            let mut used = used_modules(&std::fs::read_to_string(&path).unwrap());
            used.remove(&module);
            g.entry(module).or_default().extend(used);
        }
    }
    g
}

/// A cycle of `g`, as the modules along it, if there is one.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        n: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|m| m == n) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if !done.insert(n.to_string()) {
            return None;
        }
        stack.push(n.to_string());
        for d in g
            .get(n)
            .into_iter()
            .flatten()
            .filter(|d| g.contains_key(*d))
        {
            if let Some(c) = visit(g, d, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

#[test]
fn the_shims_modules_form_a_dag() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        g.contains_key("task") && g["task"].contains("sandbox"),
        "{g:?}"
    );
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let uses = |text: &str| used_modules(text);
    assert_eq!(
        uses("use crate::{a, b::{c, d}, e::f};\nfn x() { crate::g::h(); }"),
        ["a", "b", "e", "g"].map(String::from).into()
    );
    let mut g = Graph::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["c".to_string()].into());
    g.insert("c".into(), ["a".to_string()].into());
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    g.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&g), None);
}
