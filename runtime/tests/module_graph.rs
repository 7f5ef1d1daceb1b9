//! This crate's modules form a DAG at every depth (see chalk-module-graph): a layer never
//! reaches back into one above it. The test names the cycle it finds.

#[test]
fn the_modules_form_a_dag() {
    chalk_module_graph::assert_acyclic(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    );
}
