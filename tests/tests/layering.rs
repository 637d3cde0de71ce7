//! lease-core's modules depend on each other without a cycle (issue 26): the backend contract
//! depends on the lease model, never the other way round, and so on. Read from the sources: each
//! top-level module's `crate::…` paths (through the crate root's re-exports), outside comments
//! and test modules. A new cycle fails here, naming the modules and the names that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use lease_tests::consul::workspace_root;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The code of a file without comments and without its `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    (text.lines())
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers right after each `crate::`, and inside each `use crate::{…}` group.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(group.split([',', ' ', '\n']).map(ident));
        } else {
            names.insert(ident(rest));
        }
    }
    names.remove("");
    names
}

#[test]
fn lease_core_modules_form_no_cycle() {
    let src = workspace_root().join("lease-core/src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    // Top-level modules: the files and directories beside lib.rs.
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("read lease-core/src") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if name == "lib" {
            continue;
        }
        let files = if path.is_dir() {
            rust_files(&path)
        } else {
            vec![path]
        };
        modules.entry(name).or_default().extend(files);
    }
    // The crate root's re-exports: `pub use module::{A, B};` makes `crate::A` module's.
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for statement in code_of(&lib).split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = path.split_once("::") else {
            continue;
        };
        if modules.contains_key(module) {
            for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
                owner.insert(item.trim().to_owned(), module.to_owned());
            }
        }
    }
    let mut uses: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, files) in &modules {
        for file in files {
            let text = std::fs::read_to_string(file).expect("read a source file");
            for name in crate_paths(&code_of(&text)) {
                let target = if modules.contains_key(&name) {
                    Some(name.clone())
                } else {
                    owner.get(&name).cloned()
                };
                if let Some(target) = target.filter(|t| t != module) {
                    (uses.entry(module.clone()).or_default())
                        .entry(target)
                        .or_default()
                        .insert(name);
                }
            }
        }
    }
    // A cycle is a module that reaches itself.
    let reaches = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(module) = todo.pop() {
            for next in uses.get(&module).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let cyclic: Vec<String> = (modules.keys())
        .filter(|m| reaches(m).contains(*m))
        .cloned()
        .collect();
    let detail: Vec<String> = (cyclic.iter())
        .flat_map(|a| {
            (uses.get(a).into_iter().flatten())
                .filter(|(b, _)| cyclic.contains(b))
                .map(move |(b, names)| format!("{a} -> {b} through {names:?}"))
        })
        .collect();
    assert!(
        cyclic.is_empty(),
        "lease-core's modules {cyclic:?} depend on each other in a cycle:\n{}",
        detail.join("\n")
    );
    assert!(
        uses.get("backend").is_some_and(|u| u.contains_key("lease")),
        "the reading found no dependency of the backend contract on the lease: it reads nothing"
    );
}
