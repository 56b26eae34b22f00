//! The data plane's groups import only the groups below them
//! (`gateway_tests::layers`): no import cycle between `app`, `config`,
//! `composition`, `upstream`, `error`, `policy` and `metrics`.

use std::path::Path;

use gateway_tests::layers::{DATA_PLANE_LAYERS, check};

#[test]
fn the_data_plane_groups_have_no_cycle_and_no_upward_import() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data-plane/src");
    let v = check(&src, DATA_PLANE_LAYERS).expect("the data plane's source is readable");
    assert!(v.is_empty(), "the data plane's layering is broken:\n{v}");
}
