//! trybuild suites: what compiles (`pass/`) and the errors for what does not (`fail/`).

#[test]
fn pass() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/pass/*.rs");
}

#[test]
fn fail() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/fail/*.rs");
}
