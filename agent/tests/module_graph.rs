//! The agent's modules form a DAG: the pure pod templates, the CRD and the Sandbox rules sit
//! under the node side, the controllers and the plugin.

#[test]
fn the_agents_modules_form_a_dag() {
    let g = chalk_module_graph::assert_acyclic(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    );
    let top = chalk_module_graph::collapse(&g, 1);
    for pure in ["pods", "crd", "sandbox"] {
        for above in ["agent", "sandboxes", "reconcile", "plugin", "node"] {
            assert!(
                !top.get(pure).is_some_and(|d| d.contains(above)),
                "{pure} must not depend on {above}: {top:?}"
            );
        }
    }
    assert!(top["agent"].contains("node"), "{top:?}");
    assert!(top["sandboxes"].contains("reconcile"), "{top:?}");
}
