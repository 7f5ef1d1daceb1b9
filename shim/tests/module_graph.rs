//! The shim's modules form a DAG at every depth (see chalk-module-graph): a cycle is how a
//! Task adapter turns back into a utility module. The test names the cycle it finds.

#[test]
fn the_shims_modules_form_a_dag() {
    let g = chalk_module_graph::assert_acyclic(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    );
    // The Task layer sits on the sandbox operations, never the other way round.
    let top = chalk_module_graph::collapse(&g, 1);
    assert!(top["task"].contains("sandbox"), "{top:?}");
}
