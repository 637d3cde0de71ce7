//! What must compile: every place the attributes may be put, the signatures they produce, and
//! generated code that the caller's own names cannot capture. An ordinary test rather than a
//! trybuild `pass` case, so it is built with the rest of the workspace's tests.

// The cases declare items only to put attributes on them, as trybuild's `pass` binaries did.
#[allow(unreachable_pub)]
#[path = "pass/crate_path.rs"]
mod crate_path;
#[allow(dead_code, unreachable_pub, clippy::let_underscore_future)]
#[path = "pass/forms.rs"]
mod forms;
#[allow(unreachable_pub)]
#[path = "pass/shadowing.rs"]
mod shadowing;

#[test]
fn the_attribute_forms_compile() {
    forms::compiles();
}

#[tokio::test]
async fn the_crate_path_is_used() {
    crate_path::runs().await;
}
