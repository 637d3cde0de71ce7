//! trybuild suite: the errors for what does not compile (`fail/`). What must compile is in
//! `pass.rs`, an ordinary test: trybuild then only type-checks (`cargo check`), and builds no
//! binaries of its own.

#[test]
fn fail() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/fail/*.rs");
}
