//! The files of every crate import each other without a circle (issues 26 and 34), each backend's
//! wire client imports nothing above it, no library file is over 500 lines of code, and library
//! code keeps to the seams of the deterministic simulation (issue 35): it starts tasks, reads the
//! clock and draws random numbers only where lease-sim can take them over.
//!
//! Read from the sources. A file *imports* another when its code (outside comments and
//! `#[cfg(test)]` items) names an item the other defines, by any path: `crate::…`, `super::…`,
//! `self::…`, a child module, or a name a `use` brought in. `pub use` re-exports are transparent
//! (a path through one leads to the file that defines the item) and `mod x;` is no import, so
//! `lib.rs` and each `mod.rs` are files like any other: a child naming `super::Thing` while its
//! parent names the child is a circle. A new circle fails here, naming its files, the arrows
//! between them and the names that make each arrow.
//!
//! The reading is lexical, not a compiler's: a glob import (`use super::*`) and a macro's expansion
//! are not followed, and an item defined inside a function is not told apart from one of its file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use lease_tests::consul::workspace_root;

/// The longest a library file may be, in lines of code (not blank, not only a comment), outside
/// `#[cfg(test)]` items.
const MOST_LINES_OF_CODE: usize = 500;

// ---------------------------------------------------------------------------------------------
// Reading a file

/// `text` with comments removed, and string and character literals emptied (a path inside one is
/// no import).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    let replace = |out: &mut String, copied: &mut usize, from: usize, to: usize, with: &str| {
        out.push_str(&text[*copied..from]);
        out.push_str(with);
        *copied = to;
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = (text[i..].find('\n')).map_or(b.len(), |n| i + n);
            replace(&mut out, &mut copied, i, end, "");
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    (depth, j) = (depth + 1, j + 2);
                } else if b[j..].starts_with(b"*/") {
                    (depth, j) = (depth - 1, j + 2);
                } else {
                    j += 1;
                }
            }
            replace(&mut out, &mut copied, i, j, " ");
            i = j;
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#"))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let body = i + 2 + hashes;
            let end = (text[body..].find(&close)).map_or(b.len(), |n| body + n + close.len());
            replace(&mut out, &mut copied, i, end, "\"\"");
            i = end;
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            replace(&mut out, &mut copied, i, end, "\"\"");
            i = end;
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{..}', '"'); a lifetime has no closing quote.
            let char_len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
            let end = if rest.get(1) == Some(&b'\\') {
                text[i + 2..].find('\'').map(|n| i + 2 + n + 1)
            } else if b.get(i + 1 + char_len) == Some(&b'\'') {
                Some(i + 2 + char_len)
            } else {
                None
            };
            match end {
                Some(end) => {
                    replace(&mut out, &mut copied, i, end, "' '");
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// The index of the `}` that closes the `{` at `open`.
fn closing_brace(code: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    code.len().saturating_sub(1)
}

/// An identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = (s.char_indices())
        .find(|&(_, c)| !(c.is_alphanumeric() || c == '_'))
        .map_or(s.len(), |(i, _)| i);
    &s[..end]
}

/// `code` without its `#[cfg(test)]` (or `#[cfg(all(test, …))]`) items, and the names of the
/// modules declared under one (`#[cfg(test)] mod tests;`), whose files are test code.
fn strip_cfg_test(mut code: String) -> (String, BTreeSet<String>) {
    let mut test_modules = BTreeSet::new();
    let attribute = |code: &str| -> Option<(usize, usize)> {
        ["#[cfg(test)]", "#[cfg(all(test,", "#[cfg(all(test ,"]
            .iter()
            .filter_map(|a| code.find(a))
            .min()
            .map(|at| (at, at + code[at..].find(']').map_or(0, |n| n + 1)))
    };
    while let Some((at, after)) = attribute(&code) {
        let rest = &code[after..];
        let item = rest.trim_start();
        let item_at = after + (rest.len() - item.len());
        let declared = (item
            .strip_prefix("pub(crate) ")
            .or(item.strip_prefix("pub ")))
        .unwrap_or(item)
        .strip_prefix("mod ")
        .map(|m| ident(m.trim_start()));
        let brace = code[item_at..].find('{').map(|n| item_at + n);
        let semi = code[item_at..].find(';').map(|n| item_at + n);
        let end = match (brace, semi) {
            (_, Some(semi)) if brace.is_none_or(|brace| semi < brace) => {
                if let Some(name) = declared {
                    test_modules.insert(name.to_owned());
                }
                semi + 1
            }
            (Some(brace), _) => closing_brace(&code, brace) + 1,
            _ => code.len(),
        };
        code.replace_range(at..end, "");
    }
    (code, test_modules)
}

/// Lines of code: not blank once comments are gone.
fn lines_of_code(code: &str) -> usize {
    code.lines().filter(|l| !l.trim().is_empty()).count()
}

/// One path a `use` statement brings in, and the name it is brought in as (`as e`), if not its own.
type UsePath = (Vec<String>, Option<String>);

/// The paths of a `use` tree (`a::{b, c::d as e}` → `a::b`, `a::c::d` named `e`), whitespace gone.
fn use_paths(tree: &str, prefix: &[String], out: &mut Vec<UsePath>) {
    let mut depth = 0;
    let mut parts = vec![String::new()];
    for c in tree.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("one part").push(c);
    }
    for part in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        if let Some(open) = part.find('{') {
            let head = &part[..open];
            let inner = &part[open + 1..part.rfind('}').unwrap_or(part.len())];
            let mut path = prefix.to_vec();
            path.extend(
                head.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            use_paths(inner, &path, out);
        } else {
            let (path, alias) = match part.split_once(" as ") {
                Some((path, alias)) => (path.trim(), Some(alias.trim().to_owned())),
                None => (part, None),
            };
            let mut segments = prefix.to_vec();
            segments.extend(path.split("::").map(|s| s.trim().to_owned()));
            segments.retain(|s| !s.is_empty());
            if !segments.is_empty() {
                out.push((segments, alias));
            }
        }
    }
}

/// Each `use` statement of `code`: whether it is public (`pub`, `pub(crate)`, …: a re-export),
/// and its paths.
fn use_statements(code: &str) -> Vec<(bool, Vec<UsePath>)> {
    let mut statements = Vec::new();
    let mut from = 0;
    while let Some(n) = code[from..].find("use ") {
        let at = from + n;
        from = at + 4;
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        // What stands between the statement before (or an attribute) and `use`: `pub`, `pub(…)`.
        let start = code[..at].rfind([';', '{', '}', ']']).map_or(0, |n| n + 1);
        let visibility = code[start..at].trim();
        let public = visibility == "pub" || visibility.starts_with("pub(");
        let Some(end) = code[at..].find(';') else {
            break;
        };
        let tree: String = code[at + 4..at + end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let tree = tree
            .replace(" :: ", "::")
            .replace(":: ", "::")
            .replace(" ::", "::");
        let mut paths = Vec::new();
        use_paths(&tree, &[], &mut paths);
        statements.push((public, paths));
        from = at + end;
    }
    statements
}

/// Every path of two or more segments (`a::b::C`) in `code`, `use` statements left out.
fn code_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut k = 0;
    while k < chars.len() {
        let (at, c) = chars[k];
        let starts = (c.is_alphabetic() || c == '_') && (k == 0 || !is_ident(chars[k - 1].1));
        let after_colons = k >= 2 && chars[k - 1].1 == ':' && chars[k - 2].1 == ':';
        if !starts || after_colons {
            k += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut end = at;
        loop {
            let name = ident(&code[end..]);
            if name.is_empty() {
                break;
            }
            segments.push(name.to_owned());
            end += name.len();
            if code[end..].starts_with("::") && code[end + 2..].starts_with(|c: char| is_ident(c)) {
                end += 2;
            } else {
                break;
            }
        }
        if segments.len() > 1 && segments[0] != "use" {
            paths.push(segments);
        }
        while k < chars.len() && chars[k].0 < end {
            k += 1;
        }
        k += 1;
    }
    paths
}

// ---------------------------------------------------------------------------------------------
// A crate's files and what they import

/// A module's path in its crate (`[]` is the crate root).
type Module = Vec<String>;

struct Crate {
    name: String,
    /// Each module that is a file: its path from the workspace root and its code.
    files: BTreeMap<Module, (PathBuf, String)>,
    /// Each module's `pub use` names: name → (the module it is written in, the path).
    reexports: BTreeMap<Module, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn read(root: &Path, dir: &str) -> Option<Crate> {
        let src = root.join(dir).join("src");
        let top = ["lib.rs", "main.rs"]
            .map(|f| src.join(f))
            .into_iter()
            .find(|p| p.exists())?;
        let mut krate = Crate {
            name: dir.to_owned(),
            files: BTreeMap::new(),
            reexports: BTreeMap::new(),
        };
        krate.load(root, Vec::new(), &top);
        let modules: Vec<Module> = krate.files.keys().cloned().collect();
        for module in modules {
            for (public, paths) in use_statements(&krate.files[&module].1) {
                for (path, alias) in paths.into_iter().filter(|_| public) {
                    let last = path.last().expect("a segment").clone();
                    if last != "*" && last != "self" {
                        let name = alias.unwrap_or(last);
                        (krate.reexports.entry(module.clone()).or_default()).insert(name, path);
                    }
                }
            }
        }
        Some(krate)
    }

    fn load(&mut self, root: &Path, module: Module, path: &Path) {
        let text = std::fs::read_to_string(path).expect("read a source file");
        let (code, test_modules) = strip_cfg_test(strip_comments(&text));
        let file_name = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        let base = if ["lib.rs", "main.rs", "mod.rs"].contains(&file_name) {
            path.parent().expect("a directory").to_path_buf()
        } else {
            path.with_extension("")
        };
        let mut children = Vec::new();
        for (at, _) in code.match_indices("mod ") {
            let line_start = code[..at].rfind(['\n', ';', '{', '}']).map_or(0, |n| n + 1);
            let before = code[line_start..at].trim();
            let declaration = before.is_empty()
                || before.ends_with("pub")
                || before.ends_with(')') && before.contains("pub(")
                || before.ends_with(']');
            let name = ident(&code[at + 4..]);
            let after = code[at + 4 + name.len()..].trim_start();
            if declaration && !name.is_empty() && after.starts_with(';') {
                if !test_modules.contains(name) {
                    children.push(name.to_owned());
                }
            }
        }
        let relative = path.strip_prefix(root).unwrap_or(path).to_path_buf();
        self.files.insert(module.clone(), (relative, code));
        for child in children {
            let file = [
                base.join(format!("{child}.rs")),
                base.join(&child).join("mod.rs"),
            ]
            .into_iter()
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{}: no file for `mod {child};`", path.display()));
            let mut path = module.clone();
            path.push(child);
            self.load(root, path, &file);
        }
    }

    fn is_child(&self, module: &Module, name: &str) -> bool {
        let mut child = module.clone();
        child.push(name.to_owned());
        self.files.contains_key(&child)
    }

    /// The file that defines what `path`, written in `module`, names; `None` outside this crate.
    fn resolve(
        &self,
        module: &Module,
        path: &[String],
        seen: &mut BTreeSet<(Module, String)>,
    ) -> Option<Module> {
        let (mut at, mut rest): (Module, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (module.clone(), &path[1..]),
            "super" => {
                let mut at = module.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    at.pop();
                    rest = &rest[1..];
                }
                (at, rest)
            }
            first if self.is_child(module, first) => (module.clone(), path),
            _ => return None,
        };
        while let Some(next) = rest.first().filter(|next| self.is_child(&at, next)) {
            at.push(next.clone());
            rest = &rest[1..];
        }
        if let Some(name) = rest.first().filter(|n| *n != "*" && *n != "self") {
            if seen.insert((at.clone(), name.clone())) {
                if let Some(target) = self.reexports.get(&at).and_then(|r| r.get(name)) {
                    let mut through = target.clone();
                    through.extend(rest[1..].iter().cloned());
                    if let Some(file) = self.resolve(&at, &through, seen) {
                        return Some(file);
                    }
                }
            }
        }
        Some(at)
    }

    /// Each file's imports: file → imported file → the paths that name it.
    fn imports(&self) -> BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> {
        let mut imports: BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> = BTreeMap::new();
        for (module, (_, code)) in &self.files {
            let mut arrow = |to: Module, path: &[String]| {
                if &to != module {
                    (imports.entry(module.clone()).or_default())
                        .entry(to)
                        .or_default()
                        .insert(path.join("::"));
                }
            };
            // Names brought in by `use`, for the paths in the code that start with one.
            let mut names: BTreeMap<String, Module> = BTreeMap::new();
            for (public, paths) in use_statements(code) {
                for (mut path, alias) in paths {
                    if path.last().is_some_and(|s| s == "self") {
                        path.pop();
                    }
                    let Some(to) = self.resolve(module, &path, &mut BTreeSet::new()) else {
                        continue;
                    };
                    if let Some(last) = path.last().filter(|l| *l != "*") {
                        names.insert(alias.unwrap_or_else(|| last.clone()), to.clone());
                    }
                    if !public || path.last().is_some_and(|s| s == "*") {
                        arrow(to, &path);
                    }
                }
            }
            let mut body = code.clone();
            while let Some(at) = (body.find("use ")).filter(|&at| {
                at == 0 || !body[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            }) {
                let end = body[at..].find(';').map_or(body.len(), |n| at + n + 1);
                body.replace_range(at..end, "");
            }
            for path in code_paths(&body) {
                let first = path[0].as_str();
                let named = names.get(first).filter(|_| {
                    !["crate", "self", "super"].contains(&first) && !self.is_child(module, first)
                });
                let to = match named {
                    Some(base) if self.files.contains_key(base) => {
                        let mut through = vec!["self".to_owned()];
                        through.extend(path[1..].iter().cloned());
                        self.resolve(base, &through, &mut BTreeSet::new())
                    }
                    Some(base) => Some(base.clone()),
                    None => self.resolve(module, &path, &mut BTreeSet::new()),
                };
                if let Some(to) = to {
                    arrow(to, &path);
                }
            }
        }
        imports
    }

    fn file(&self, module: &Module) -> String {
        self.files[module].0.display().to_string()
    }
}

/// The circles of a graph: its strongly connected components of two or more nodes.
fn circles<N: Ord + Clone>(
    nodes: impl IntoIterator<Item = N>,
    arrows: &BTreeMap<N, BTreeMap<N, BTreeSet<String>>>,
) -> Vec<BTreeSet<N>> {
    let reach = |from: &N| -> BTreeSet<N> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in arrows.get(&node).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<N, BTreeSet<N>> = nodes
        .into_iter()
        .map(|n| {
            let r = reach(&n);
            (n, r)
        })
        .collect();
    let mut circles: Vec<BTreeSet<N>> = Vec::new();
    for (node, reached) in &reaches {
        if !reached.contains(node) || circles.iter().any(|c| c.contains(node)) {
            continue;
        }
        let circle = (reached.iter())
            .filter(|other| reaches[*other].contains(node))
            .cloned()
            .collect();
        circles.push(circle);
    }
    circles
}

/// The crates of the workspace: every member with a `src/lib.rs` or `src/main.rs`.
fn workspace_crates() -> Vec<Crate> {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("read Cargo.toml");
    let members = manifest
        .split("members = [")
        .nth(1)
        .expect("workspace members");
    let members = &members[..members.find(']').expect("the end of the members")];
    let crates: Vec<Crate> = (members.split(','))
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .filter_map(|m| Crate::read(&root, m))
        .collect();
    assert!(
        crates.len() >= 10,
        "the reading found {} crates: it reads nothing",
        crates.len()
    );
    crates
}

/// Each circle among `krate`'s files, told in full.
fn describe_circles(krate: &Crate) -> Vec<String> {
    let imports = krate.imports();
    (circles(krate.files.keys().cloned(), &imports).into_iter())
        .map(|circle| {
            let mut text = format!("{}: a circle of {} files:", krate.name, circle.len());
            for from in &circle {
                for (to, names) in imports[from].iter().filter(|(to, _)| circle.contains(*to)) {
                    let names: Vec<&String> = names.iter().take(4).collect();
                    text += &format!(
                        "\n    {} -> {} through {names:?}",
                        krate.file(from),
                        krate.file(to)
                    );
                }
            }
            text
        })
        .collect()
}

#[test]
fn no_file_of_any_crate_imports_in_a_circle() {
    let crates = workspace_crates();
    let found: Vec<String> = crates.iter().flat_map(describe_circles).collect();
    assert!(
        found.is_empty(),
        "import circles among the files of a crate: {} (move what both sides need below both):\n{}",
        found.len(),
        found.join("\n")
    );
    // The reading reads: lease-core's keeper imports the lease model, across directories.
    let core = crates
        .iter()
        .find(|c| c.name == "lease-core")
        .expect("lease-core");
    let keeper = vec!["backend".to_owned(), "keeper".to_owned()];
    assert!(
        core.imports()
            .get(&keeper)
            .is_some_and(|to| to.keys().any(|m| m.first().is_some_and(|m| m == "lease"))),
        "the reading found no import of lease/ by backend/keeper.rs: it reads nothing"
    );
}

#[test]
fn each_wire_client_imports_nothing_above_it() {
    // The wire client is the bottom of its crate: it imports its own files, and the crate root's
    // constants (lease-postgres's LEASE_SQL), nothing else of the crate.
    let crates = workspace_crates();
    let wires = [
        ("lease-consul", vec!["wire"]),
        ("lease-etcd", vec!["wire"]),
        ("lease-postgres", vec!["backend", "wire"]),
        ("lease-redis", vec!["wire"]),
    ];
    for (name, wire) in wires {
        let krate = crates.iter().find(|c| c.name == name).expect("the crate");
        let wire: Module = wire.into_iter().map(str::to_owned).collect();
        let imports = krate.imports();
        let in_wire = |m: &Module| m.starts_with(&wire);
        assert!(
            krate.files.keys().any(in_wire),
            "{name} has no {wire:?} module"
        );
        let mut above = Vec::new();
        for (from, to) in imports.iter().filter(|(from, _)| in_wire(from)) {
            for (to, names) in to.iter().filter(|(to, _)| !in_wire(to) && !to.is_empty()) {
                above.push(format!(
                    "{} -> {} through {names:?}",
                    krate.file(from),
                    krate.file(to)
                ));
            }
        }
        assert!(
            above.is_empty(),
            "{name}'s wire client imports the crate above it (hand it the value instead, or move \
             the item down into the wire):\n{}",
            above.join("\n")
        );
    }
}

#[test]
fn lease_core_top_level_modules_form_no_cycle() {
    // Coarser than the files: the contract (backend/) depends on the lease model (lease/), never
    // the other way round, and so on for every top-level module and directory.
    let crates = workspace_crates();
    let core = crates
        .iter()
        .find(|c| c.name == "lease-core")
        .expect("lease-core");
    let top = |m: &Module| m.first().cloned().unwrap_or_else(|| "lib".to_owned());
    let mut arrows: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, to) in core.imports() {
        for (to, names) in to.into_iter().filter(|(to, _)| top(to) != top(&from)) {
            (arrows
                .entry(top(&from))
                .or_default()
                .entry(top(&to))
                .or_default())
            .extend(names);
        }
    }
    let found = circles(core.files.keys().map(top), &arrows);
    let detail: Vec<String> = (found.iter().flatten())
        .flat_map(|a| {
            (arrows.get(a).into_iter().flatten())
                .filter(|(b, _)| found.iter().any(|c| c.contains(a) && c.contains(*b)))
                .map(move |(b, names)| format!("{a} -> {b} through {names:?}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "lease-core's modules {found:?} depend on each other in a cycle:\n{}",
        detail.join("\n")
    );
    assert!(
        arrows
            .get("backend")
            .is_some_and(|u| u.contains_key("lease")),
        "the reading found no dependency of the backend contract on the lease: it reads nothing"
    );
}

#[test]
fn no_library_file_is_over_500_lines_of_code() {
    // The published crates; test support and examples are not library code.
    let mut sizes: Vec<(usize, String)> = (workspace_crates().iter())
        .filter(|c| c.name.starts_with("lease-"))
        .flat_map(|c| {
            c.files
                .iter()
                .map(|(m, (_, code))| (lines_of_code(code), c.file(m)))
        })
        .collect();
    sizes.sort_by(|a, b| b.cmp(a));
    let over: Vec<&(usize, String)> = sizes
        .iter()
        .filter(|(n, _)| *n > MOST_LINES_OF_CODE)
        .collect();
    assert!(
        over.is_empty(),
        "files over {MOST_LINES_OF_CODE} lines of code outside #[cfg(test)] (split them by idea; \
         move a long test module to a sibling tests.rs): {over:?}"
    );
    println!(
        "largest files (lines of code): {:?}",
        &sizes[..3.min(sizes.len())]
    );
}

/// What each rule of the simulation's seams forbids, and the files allowed to do it: the one place
/// that does it for everyone.
struct Seam {
    rule: &'static str,
    /// The crates it applies to.
    crates: &'static [&'static str],
    /// Each forbidden text (in code: comments and literals are not read).
    forbidden: &'static [&'static str],
    /// Files that are that one place.
    allowed: &'static [&'static str],
}

/// The library crates whose code runs inside lease-sim.
const SIMULATED: &[&str] = &["lease-core", "lease-http", "lease-consul", "lease-etcd"];

/// Every published library crate.
const LIBRARIES: &[&str] = &[
    "lease-core",
    "lease-http",
    "lease-consul",
    "lease-etcd",
    "lease-postgres",
    "lease-redis",
    "lease-amqp",
    "lease-tower",
    "lease-conformance",
];

const SEAMS: &[Seam] = &[
    Seam {
        rule: "every task starts through lease_core::runtime::spawn (so a simulated process \
               keeps its tasks, and freezes with them)",
        crates: LIBRARIES,
        forbidden: &[
            "tokio::spawn(",
            "task::spawn(",
            "spawn_blocking(",
            "spawn_local(",
            "thread::spawn(",
            ".spawn(",
            "TokioExecutor",
        ],
        allowed: &[
            "lease-core/src/runtime.rs",
            "lease-core/src/lease/detached.rs",
        ],
    },
    Seam {
        rule: "time is tokio's (the simulation's paused clock): no std::time::Instant or \
               SystemTime",
        crates: SIMULATED,
        forbidden: &[
            "std::time::Instant",
            "std::time::SystemTime",
            "SystemTime::now",
            "UNIX_EPOCH",
        ],
        // The process-wide clean-up thread's budget is real time; the random draws' fallback
        // seeds from the wall clock outside the simulation.
        allowed: &[
            "lease-core/src/lease/detached.rs",
            "lease-core/src/backoff.rs",
        ],
    },
    Seam {
        rule: "ordered collections: a hash map's order changes from run to run, and an order \
               that reaches behaviour breaks a replay",
        crates: SIMULATED,
        forbidden: &["HashMap", "HashSet"],
        allowed: &[],
    },
];

/// `use std::time::{…}` trees that bring in `Instant` or `SystemTime`, which the plain texts of
/// [`SEAMS`] would miss.
fn std_clock_imports(code: &str) -> bool {
    code.match_indices("std::time::{").any(|(at, found)| {
        let tree = &code[at + found.len()..];
        let tree = &tree[..tree.find('}').unwrap_or(tree.len())];
        tree.split(',')
            .map(|name| name.trim().split(" as ").next().unwrap_or("").trim())
            .any(|name| name == "Instant" || name == "SystemTime")
    })
}

/// Each `tokio::select!` that is not `biased;`: one that polls its branches in a random order
/// makes two runs of one seed differ.
fn unbiased_selects(code: &str) -> usize {
    code.match_indices("select!")
        .filter(|(at, found)| {
            let rest = code[at + found.len()..].trim_start();
            let body = rest.strip_prefix(['{', '(']).unwrap_or(rest).trim_start();
            !body.starts_with("biased;")
        })
        .count()
}

#[test]
fn library_code_keeps_to_the_simulation_s_seams() {
    let crates = workspace_crates();
    let mut broken = Vec::new();
    let mut read = 0;
    for krate in &crates {
        for (module, (_, code)) in &krate.files {
            let file = krate.file(module);
            for seam in SEAMS
                .iter()
                .filter(|s| s.crates.contains(&krate.name.as_str()))
            {
                read += 1;
                if seam.allowed.contains(&file.as_str()) {
                    continue;
                }
                for text in seam.forbidden.iter().filter(|t| code.contains(*t)) {
                    broken.push(format!("{file}: `{text}`: {}", seam.rule));
                }
                if seam.forbidden.contains(&"std::time::Instant") && std_clock_imports(code) {
                    broken.push(format!(
                        "{file}: `use std::time::{{Instant…}}`: {}",
                        seam.rule
                    ));
                }
            }
            if SIMULATED.contains(&krate.name.as_str()) && unbiased_selects(code) > 0 {
                broken.push(format!(
                    "{file}: {} `tokio::select!` without `biased;` (the simulation replays a seed \
                     exactly only if each select polls its branches in one order: write them in \
                     the order they must win)",
                    unbiased_selects(code)
                ));
            }
        }
    }
    assert!(
        read > 50,
        "the seams test read {read} files: it reads nothing"
    );
    assert!(
        broken.is_empty(),
        "library code outside the simulation's seams:\n{}",
        broken.join("\n")
    );
    // The reading finds what it forbids.
    assert_eq!(unbiased_selects("tokio::select! { a = x => {} }"), 1);
    assert_eq!(
        unbiased_selects("tokio::select! {\n biased;\n a = x => {} }"),
        0
    );
    assert!(std_clock_imports("use std::time::{Duration, Instant};"));
    assert!(!std_clock_imports(
        "use std::time::Duration;\nuse tokio::time::Instant;"
    ));
}

/// The reading itself, on a crate written for it: a circle is found, and what is not one is not.
#[test]
fn the_reading_finds_a_circle_and_only_a_circle() {
    let dir = std::env::temp_dir().join(format!("lease-layering-{}", std::process::id()));
    let src = dir.join("fixture/src");
    std::fs::create_dir_all(src.join("wire")).expect("create the fixture");
    let write = |file: &str, text: &str| std::fs::write(src.join(file), text).expect("write");
    write(
        "lib.rs",
        "//! docs\nmod client;\nmod wire;\npub use client::Client;\npub use wire::Wire;\n",
    );
    write(
        "wire/mod.rs",
        "mod error;\npub(crate) use error::Error;\npub struct Wire;\n",
    );
    write(
        "wire/error.rs",
        "/// [crate::Client] in a comment is no import\npub struct Error(&'static str);\nfn f() -> char { '\"' }\n",
    );
    write(
        "client.rs",
        "use crate::wire::{self, Error};\npub struct Client(wire::Wire, Error);\n\
         #[cfg(test)]\nmod tests { use crate::Client; }\n",
    );
    let read = || Crate::read(&dir, "fixture").expect("the fixture");
    let fixture = read();
    assert_eq!(describe_circles(&fixture), Vec::<String>::new());
    let client = fixture.imports();
    let client = &client[&vec!["client".to_owned()]];
    assert!(client.contains_key(&vec!["wire".to_owned()]), "{client:?}");
    assert!(
        client.contains_key(&vec!["wire".to_owned(), "error".to_owned()]),
        "through the re-export: {client:?}"
    );

    // An arrow back up, through the crate root's re-export, closes a circle.
    write("wire/error.rs", "pub struct Error(crate::Client);\n");
    let found = describe_circles(&read());
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(
            "fixture/src/wire/error.rs -> fixture/src/client.rs through [\"crate::Client\"]"
        ),
        "{}",
        found[0]
    );
}
