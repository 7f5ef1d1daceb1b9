//! The import graph of a crate's modules, read from its source, and the cycles in it.
//!
//! A module is a file (`a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs`, the crate
//! root that only declares and re-exports, are left out, and so is test code: files named
//! `tests.rs` and items under `#[cfg(test)]`). A module uses another when it names a path into
//! it (`crate::`, `super::` or `self::`). A module reaching into its own parent or children is
//! not counted: a folder is one unit to the modules beside it. The graph must be acyclic at
//! every depth: between the top-level modules (`a` and `b` when `a::x` uses `b::y`), then
//! between the modules one level down, and so on, so a layer can neither call back into a
//! higher one nor hide a cycle inside a folder.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use syn::visit::Visit;

/// Module path (`a::b`) to the module paths it uses.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The graph of the crate whose source root (the folder holding `lib.rs` or `main.rs`) is `src`.
pub fn of_crate(src: &Path) -> Graph {
    let files = module_files(src);
    let known: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut g = Graph::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let file = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("cannot parse {}: {e}", path.display()));
        let mut paths = Paths::default();
        paths.visit_file(&file);
        let used = g.entry(module.clone()).or_default();
        for p in paths.found {
            if let Some(target) = resolve(module, &p, &known) {
                if !related(module, &target) {
                    used.insert(target);
                }
            }
        }
    }
    g
}

/// Panics, naming the cycle, unless the graph of the crate at `src` is acyclic at every
/// depth; returns the graph for the caller's own checks.
pub fn assert_acyclic(src: &Path) -> Graph {
    let g = of_crate(src);
    assert!(!g.is_empty(), "no modules found under {}", src.display());
    if let Some(cycle) = find_cycle_at_any_depth(&g) {
        panic!("module cycle in {}: {}", src.display(), cycle.join(" -> "));
    }
    g
}

/// The first cycle found, collapsing module paths to their first 1, 2, ... segments.
pub fn find_cycle_at_any_depth(g: &Graph) -> Option<Vec<String>> {
    let deepest = g.keys().map(|m| m.split("::").count()).max().unwrap_or(0);
    (1..=deepest).find_map(|depth| find_cycle(&collapse(g, depth)))
}

/// `g` with every module path cut to its first `depth` segments (self-uses dropped).
pub fn collapse(g: &Graph, depth: usize) -> Graph {
    let cut = |m: &str| m.split("::").take(depth).collect::<Vec<_>>().join("::");
    let mut out = Graph::new();
    for (from, to) in g {
        let from = cut(from);
        let entry = out.entry(from.clone()).or_default();
        entry.extend(to.iter().map(|t| cut(t)).filter(|t| *t != from));
    }
    out
}

/// A cycle of `g`, as the modules along it (the first repeated at the end), if there is one.
pub fn find_cycle(g: &Graph) -> Option<Vec<String>> {
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
        for next in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, next, stack, done) {
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

/// Every non-test source file under `src` with its module path; the crate root is left out.
fn module_files(src: &Path) -> Vec<(String, std::path::PathBuf)> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            if let Some(module) = module_of(rel) {
                out.push((module, path));
            }
        }
    }
    out.sort();
    out
}

/// `a/b.rs` and `a/b/mod.rs` → `a::b`; the crate root, test files, `bin/` targets and non-Rust
/// files → none.
fn module_of(rel: &Path) -> Option<String> {
    let text = rel.to_str()?;
    let stem = text.strip_suffix(".rs")?;
    if matches!(stem, "lib" | "main") || stem.starts_with("bin/") {
        return None;
    }
    if stem == "tests" || stem.ends_with("/tests") {
        return None;
    }
    let stem = stem.strip_suffix("/mod").unwrap_or(stem);
    Some(stem.replace('/', "::"))
}

/// The module `path` (as written in `module`) points into: the longest known prefix.
fn resolve(module: &str, path: &[String], known: &BTreeSet<String>) -> Option<String> {
    let mut here: Vec<&str> = module.split("::").collect();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            here.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                here.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let full: Vec<&str> = here
        .into_iter()
        .chain(rest.iter().map(String::as_str))
        .collect();
    (1..=full.len())
        .rev()
        .map(|n| full[..n].join("::"))
        .find(|m| known.contains(m))
}

/// Whether one of `a` and `b` is the other or contains it.
fn related(a: &str, b: &str) -> bool {
    let inside = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}::"));
    inside(a, b) || inside(b, a)
}

/// Every path a file names (in `use` trees, expressions, types and patterns), outside test code.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.found.push(with(prefix, &n.ident)),
            syn::UseTree::Rename(r) => self.found.push(with(prefix, &r.ident)),
            syn::UseTree::Glob(_) => self.found.push(prefix.clone()),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }
}

fn with(prefix: &[String], ident: &syn::Ident) -> Vec<String> {
    let mut p = prefix.to_vec();
    if ident != "self" {
        p.push(ident.to_string());
    }
    p
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            _ => &Vec::new(),
        };
        if !is_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.found
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(a, bs)| (a.to_string(), bs.iter().map(|b| b.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_cycle_is_found_and_named() {
        let mut g = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])]);
        assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
        g.get_mut("c").unwrap().clear();
        assert_eq!(find_cycle(&g), None);
    }

    #[test]
    fn a_cycle_between_folders_is_found_at_their_depth() {
        // a::x -> b::y and b::z -> a::w: no file cycle, but the folders a and b use each other.
        let g = graph(&[
            ("a::x", &["b::y"]),
            ("b::z", &["a::w"]),
            ("a::w", &[]),
            ("b::y", &[]),
        ]);
        assert_eq!(find_cycle(&g), None);
        assert_eq!(find_cycle_at_any_depth(&g).unwrap(), ["a", "b", "a"]);
    }

    #[test]
    fn paths_resolve_to_the_longest_known_module() {
        let known: BTreeSet<String> = ["a", "a::b", "c"].map(String::from).into();
        let p = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
        assert_eq!(
            resolve("c", &p("crate::a::b::Item"), &known).unwrap(),
            "a::b"
        );
        assert_eq!(resolve("a::b", &p("super::Thing"), &known).unwrap(), "a");
        assert_eq!(
            resolve("a::b", &p("super::super::c::f"), &known).unwrap(),
            "c"
        );
        assert_eq!(resolve("c", &p("std::fs::read"), &known), None);
        assert!(related("a::b", "a") && related("a", "a::b") && !related("a", "ab"));
    }

    #[test]
    fn use_trees_and_paths_are_read_and_test_code_is_not() {
        let file = syn::parse_file(
            "use crate::{a, b::{c, d as e}, f::*};\nfn x() { crate::g::h(); }\n\
             #[cfg(test)] mod tests { use crate::t; }",
        )
        .unwrap();
        let mut paths = Paths::default();
        paths.visit_file(&file);
        let found: BTreeSet<String> = paths.found.iter().map(|p| p.join("::")).collect();
        for p in [
            "crate::a",
            "crate::b::c",
            "crate::b::d",
            "crate::f",
            "crate::g::h",
        ] {
            assert!(found.contains(p), "{p} missing from {found:?}");
        }
        assert!(!found.iter().any(|p| p.contains("crate::t")), "{found:?}");
    }

    #[test]
    fn files_map_to_module_paths() {
        assert_eq!(module_of(Path::new("a/b.rs")).unwrap(), "a::b");
        assert_eq!(module_of(Path::new("a/mod.rs")).unwrap(), "a");
        assert_eq!(module_of(Path::new("lib.rs")), None);
        assert_eq!(module_of(Path::new("sandbox/tests.rs")), None);
        assert_eq!(module_of(Path::new("bin/tool.rs")), None);
    }
}
