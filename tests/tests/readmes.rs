//! The READMEs and guides name only packages, features and targets that exist.
//!
//! Their Rust examples are compiled as doctests (each published crate's README by that crate, the
//! workspace README and ARCHITECTURE.md by this one). What a doctest cannot see is checked here,
//! in every Markdown file of the workspace but the changelog (which records what once was): each
//! dependency of a TOML snippet that is a workspace crate, with its `features = [...]` and its
//! `path`; each `cargo …` command, in a shell snippet or in inline code, with its `-p`,
//! `--features`, `--example`/`--bench`/`--test`/`--bin` and `cargo install`'s `--path`; each
//! relative link, with its `#anchor`. Against `cargo metadata` (offline, no build): a feature is
//! one that cargo accepts, optional dependencies included. No server, well under a second.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace as cargo sees it.
#[derive(Debug)]
struct Workspace {
    root: PathBuf,
    packages: BTreeMap<String, Package>,
    /// `cargo …` in the root without `-p` or `--workspace` selects these.
    default_members: Vec<String>,
    /// Whether the crates are on crates.io: until the workspace README stops saying "Not on
    /// crates.io yet", `cargo install NAME` of a workspace crate is a break.
    published: bool,
}

#[derive(Debug)]
struct Package {
    /// The directory of its Cargo.toml, relative to the workspace root.
    dir: PathBuf,
    features: BTreeSet<String>,
    /// (kind, name): `example`, `bench`, `test`, `bin`.
    targets: BTreeSet<(String, String)>,
}

impl Workspace {
    fn load() -> Workspace {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ is inside the workspace")
            .to_owned();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let output = Command::new(cargo)
            .args([
                "metadata",
                "--no-deps",
                "--offline",
                "--format-version",
                "1",
            ])
            .current_dir(&root)
            .output()
            .expect("cargo metadata runs");
        assert!(
            output.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
        let strings = |value: &serde_json::Value| -> Vec<String> {
            value
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        let mut packages = BTreeMap::new();
        let mut ids = BTreeMap::new();
        for package in metadata["packages"].as_array().expect("packages") {
            let name = package["name"].as_str().expect("a package name").to_owned();
            let manifest = Path::new(package["manifest_path"].as_str().expect("manifest_path"));
            let dir = manifest
                .parent()
                .and_then(|dir| dir.strip_prefix(&root).ok())
                .expect("a member inside the workspace")
                .to_owned();
            let features = package["features"]
                .as_object()
                .expect("features")
                .keys()
                .cloned()
                .collect();
            let mut targets = BTreeSet::new();
            for target in package["targets"].as_array().expect("targets") {
                let name = target["name"].as_str().expect("a target name");
                for kind in strings(&target["kind"]) {
                    targets.insert((kind, name.to_owned()));
                }
            }
            ids.insert(package["id"].as_str().expect("id").to_owned(), name.clone());
            packages.insert(
                name,
                Package {
                    dir,
                    features,
                    targets,
                },
            );
        }
        let default_members = strings(&metadata["workspace_default_members"])
            .iter()
            .filter_map(|id| ids.get(id).cloned())
            .collect();
        let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
        Workspace {
            published: !readme.contains("Not on crates.io yet"),
            root,
            packages,
            default_members,
        }
    }

    /// Every Markdown file of the workspace but CHANGELOG.md, outside build and tool directories.
    fn documents(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    if !name.starts_with('.') && name != "target" && name != "tools" {
                        walk(&path, found);
                    }
                } else if name.ends_with(".md") && name != "CHANGELOG.md" {
                    found.push(path);
                }
            }
        }
        let mut found = Vec::new();
        walk(&self.root, &mut found);
        found.sort();
        found
    }
}

/// A fenced code block: its language (the info string's first word), the line of its first
/// line, and its lines.
#[derive(Debug)]
struct Block<'a> {
    lang: &'a str,
    line: usize,
    lines: Vec<&'a str>,
}

/// The fenced blocks of a Markdown text, and its prose (everything outside them, with each
/// line's number) for inline code.
fn split_markdown(text: &str) -> (Vec<Block<'_>>, Vec<(usize, &str)>) {
    let mut blocks = Vec::new();
    let mut prose = Vec::new();
    let mut open: Option<(&str, Block<'_>)> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        match open.take() {
            None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                let fence = &trimmed[..3];
                let info = trimmed.trim_start_matches(['`', '~']).trim();
                let lang = info.split([',', ' ']).next().unwrap_or("");
                open = Some((
                    fence,
                    Block {
                        lang,
                        line: number + 1,
                        lines: Vec::new(),
                    },
                ));
            }
            None => prose.push((number, line)),
            Some((fence, block)) if trimmed.starts_with(fence) => blocks.push(block),
            Some((fence, mut block)) => {
                block.lines.push(line);
                open = Some((fence, block));
            }
        }
    }
    (blocks, prose)
}

/// The `cargo …` commands of a shell or console block, with their line numbers: comments and
/// prompts taken off, `&&`/`;`/`|` chains split.
fn block_commands<'a>(block: &Block<'a>) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    for (offset, line) in block.lines.iter().enumerate() {
        let line = line.trim();
        let line = line.strip_prefix("$ ").unwrap_or(line);
        let line = match line.find(" #") {
            Some(at) => &line[..at],
            None if line.starts_with('#') => "",
            None => line,
        };
        for part in line.split(['&', ';', '|']) {
            if let Some(command) = cargo_command(part) {
                commands.push((block.line + offset, command));
            }
        }
    }
    commands
}

/// The `cargo …` command of a shell command line, without the environment assignments before
/// it (`VAR=value cargo run …`), its words joined by single spaces.
fn cargo_command(line: &str) -> Option<String> {
    let words: Vec<&str> = line
        .split_whitespace()
        .skip_while(|word| word.contains('=') && !word.starts_with('-'))
        .collect();
    (words.first() == Some(&"cargo")).then(|| words.join(" "))
}

/// The inline code spans of the prose that are `cargo …` commands, with the line each starts on
/// (a span may run over a line break).
fn inline_commands(prose: &[(usize, &str)]) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    let mut span: Option<(usize, String)> = None;
    for &(number, line) in prose {
        for (index, piece) in line.split('`').enumerate() {
            if index > 0 {
                // A backtick: it closes the open span, or opens one.
                match span.take() {
                    Some((start, code)) => {
                        commands.extend(cargo_command(&code).map(|c| (start, c)))
                    }
                    None => span = Some((number, String::new())),
                }
            }
            if let Some((_, code)) = span.as_mut() {
                code.push_str(piece);
            }
        }
        match span.as_mut() {
            // Markdown ends an unclosed span at a blank line.
            Some(_) if line.trim().is_empty() => span = None,
            Some((_, code)) => code.push(' '),
            None => {}
        }
    }
    commands
}

/// What is wrong with a `cargo …` command, against the workspace.
fn check_cargo(workspace: &Workspace, command: &str) -> Vec<String> {
    let mut problems = Vec::new();
    // A placeholder (`-p <crate>`, `[--features <client>]`) names nothing to check.
    let concrete = |value: &str| !value.is_empty() && !value.contains(['<', '[', ']', '$']);
    let mut tokens = command
        .split_whitespace()
        .skip(1)
        .filter(|token| !token.starts_with('+'));
    let subcommand = tokens.next().unwrap_or("");
    let (mut packages, mut features, mut targets, mut positional) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut path, mut locked, mut git, mut all) = (None, false, false, false);
    while let Some(token) = tokens.next() {
        let (flag, inline) = match token.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
            _ => (token, None),
        };
        let (flag, inline) = match flag.strip_prefix("-p").or(flag.strip_prefix("-F")) {
            Some(rest) if !rest.is_empty() && !flag.starts_with("--") => (&flag[..2], Some(rest)),
            _ => (flag, inline),
        };
        let takes_value = [
            "-p",
            "--package",
            "-F",
            "--features",
            "--example",
            "--bench",
            "--test",
            "--bin",
            "--path",
            "--git",
        ];
        let value = if takes_value.contains(&flag) {
            inline.or_else(|| tokens.next()).unwrap_or("")
        } else {
            ""
        };
        match flag {
            // The rest goes to the program, the test harness or the benchmark.
            "--" => break,
            "-p" | "--package" => packages.push(value),
            "-F" | "--features" => features.extend(value.split(',')),
            "--example" | "--bench" | "--test" | "--bin" => {
                targets.push((&flag[2..], value));
            }
            "--path" => path = Some(value),
            "--git" => git = true,
            "--locked" => locked = true,
            "--workspace" | "--all" => all = true,
            _ if !flag.starts_with('-') => positional.push(flag),
            _ => {}
        }
    }
    let packages: Vec<&str> = packages.into_iter().filter(|p| concrete(p)).collect();
    for package in &packages {
        if !workspace.packages.contains_key(*package) {
            problems.push(format!(
                "no package `{package}` in the workspace (its packages: {})",
                workspace
                    .packages
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let selected: Vec<&Package> = if packages.is_empty() && !all {
        workspace
            .default_members
            .iter()
            .filter_map(|name| workspace.packages.get(name))
            .collect()
    } else {
        packages
            .iter()
            .filter_map(|name| workspace.packages.get(*name))
            .collect()
    };
    for feature in features.into_iter().filter(|f| concrete(f)) {
        // `dep/feature` turns on a dependency's feature: the part before the slash is checked.
        let own = feature.split('/').next().unwrap_or(feature);
        if !all && !selected.iter().any(|p| p.features.contains(own)) {
            let names: Vec<String> = if packages.is_empty() {
                workspace.default_members.clone()
            } else {
                packages.iter().map(|p| (*p).to_owned()).collect()
            };
            let known: BTreeSet<&String> = selected.iter().flat_map(|p| &p.features).collect();
            problems.push(format!(
                "{} has no feature `{own}` (features: {})",
                names.join(", "),
                known.into_iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    for (kind, name) in targets.into_iter().filter(|(_, name)| concrete(name)) {
        let target = (kind.to_owned(), name.to_owned());
        let found = if packages.is_empty() {
            workspace
                .packages
                .values()
                .any(|p| p.targets.contains(&target))
        } else {
            selected.iter().any(|p| p.targets.contains(&target))
        };
        if !found {
            let place = if packages.is_empty() {
                "the workspace".to_owned()
            } else {
                packages.join(", ")
            };
            problems.push(format!("no {kind} target `{name}` in {place}"));
        }
    }
    if subcommand == "install" {
        match path.filter(|p| concrete(p)) {
            Some(path) => {
                let dir = Path::new(path.trim_end_matches('/'));
                match workspace.packages.values().find(|p| p.dir == dir) {
                    None => {
                        problems.push(format!("`--path {path}` is no package of the workspace"))
                    }
                    Some(p) if !p.targets.iter().any(|(kind, _)| kind == "bin") => {
                        problems.push(format!("`--path {path}` has no binary to install"));
                    }
                    Some(_) => {}
                }
            }
            None if !git && !workspace.published => {
                for name in positional {
                    if workspace.packages.contains_key(name) {
                        problems.push(format!(
                            "`{name}` is not on crates.io (the README's \"Using it\"): install it \
                             from a checkout, `cargo install --locked --path DIR`"
                        ));
                    }
                }
            }
            None => {}
        }
        if (path.is_some() || git) && !locked {
            problems.push(
                "a workspace crate is installed with `--locked`: without it cargo resolves every \
                 dependency afresh, ignoring the tested Cargo.lock"
                    .to_owned(),
            );
        }
    }
    problems
}

/// What is wrong with a TOML snippet: a workspace crate that does not exist, a feature it does
/// not have, a `path` that does not end in its directory.
fn check_toml(workspace: &Workspace, snippet: &str) -> Vec<String> {
    let table: toml::Table = match snippet.parse() {
        Ok(table) => table,
        Err(error) => return vec![format!("the TOML does not parse: {error}")],
    };
    let mut dependency_tables = Vec::new();
    let sections = ["dependencies", "dev-dependencies", "build-dependencies"];
    for section in sections {
        dependency_tables.extend(table.get(section).and_then(toml::Value::as_table));
    }
    if let Some(targets) = table.get("target").and_then(toml::Value::as_table) {
        for target in targets.values().filter_map(toml::Value::as_table) {
            for section in sections {
                dependency_tables.extend(target.get(section).and_then(toml::Value::as_table));
            }
        }
    }
    let mut problems = Vec::new();
    for dependencies in dependency_tables {
        for (name, spec) in dependencies {
            let package = spec
                .get("package")
                .and_then(toml::Value::as_str)
                .unwrap_or(name);
            let Some(found) = workspace.packages.get(package) else {
                if package.starts_with("lease") {
                    problems.push(format!("no package `{package}` in the workspace"));
                }
                continue;
            };
            let features = spec.get("features").and_then(toml::Value::as_array);
            for feature in features
                .into_iter()
                .flatten()
                .filter_map(toml::Value::as_str)
            {
                let own = feature.split('/').next().unwrap_or(feature);
                if !found.features.contains(own) {
                    problems.push(format!(
                        "{package} has no feature `{own}` (features: {})",
                        found
                            .features
                            .iter()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
            if let Some(path) = spec.get("path").and_then(toml::Value::as_str) {
                if Path::new(path).file_name() != found.dir.file_name() {
                    problems.push(format!(
                        "{package} is in the directory `{}`, not at `{path}`",
                        found.dir.display()
                    ));
                }
            }
        }
    }
    problems
}

/// The anchors GitHub gives the headings of a Markdown text: lower case, punctuation but `-` and
/// `_` dropped, spaces made hyphens.
fn anchors(text: &str) -> BTreeSet<String> {
    let (_, prose) = split_markdown(text);
    prose
        .iter()
        .filter(|(_, line)| line.starts_with('#'))
        .map(|(_, line)| {
            line.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// What is wrong with the relative links of the prose (`[text](path#anchor)`): a file that
/// does not exist, or an anchor its Markdown has no heading for. `dir` is the document's
/// directory; `own` its text, for `#anchor` alone.
fn check_links(dir: &Path, own: &str, prose: &[(usize, &str)]) -> Vec<(usize, String)> {
    let mut problems = Vec::new();
    for &(number, line) in prose {
        for (_, rest) in line
            .match_indices("](")
            .map(|(at, _)| line.split_at(at + 2))
        {
            let Some(target) = rest.split(')').next() else {
                continue;
            };
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = dir.join(path);
            let text = if path.is_empty() {
                Some(own.to_owned())
            } else if !file.exists() {
                problems.push((number, format!("the link `{target}`: no such file")));
                continue;
            } else if path.ends_with(".md") {
                std::fs::read_to_string(&file).ok()
            } else {
                None
            };
            if let (false, Some(text)) = (anchor.is_empty(), text) {
                if !anchors(&text).contains(anchor) {
                    problems.push((number, format!("the link `{target}`: no such heading")));
                }
            }
        }
    }
    problems
}

/// Every problem of one Markdown text, as `FILE:LINE: what`; `dir` is its directory.
fn check_document(workspace: &Workspace, dir: &Path, name: &str, text: &str) -> Vec<String> {
    let (blocks, prose) = split_markdown(text);
    let mut commands = inline_commands(&prose);
    let mut problems: Vec<String> = check_links(dir, text, &prose)
        .into_iter()
        .map(|(line, problem)| format!("{name}:{line}: {problem}"))
        .collect();
    for block in &blocks {
        match block.lang {
            "toml" => {
                let snippet = block.lines.join("\n");
                for problem in check_toml(workspace, &snippet) {
                    problems.push(format!("{name}:{}: {problem}", block.line));
                }
            }
            "sh" | "bash" | "shell" | "console" | "text" => commands.extend(block_commands(block)),
            _ => {}
        }
    }
    for (line, command) in commands {
        for problem in check_cargo(workspace, &command) {
            problems.push(format!("{name}:{line}: `{command}`: {problem}"));
        }
    }
    problems
}

#[test]
fn every_readme_and_guide_names_only_what_exists() {
    let workspace = Workspace::load();
    let documents = workspace.documents();
    // The crates' READMEs, the workspace's, ARCHITECTURE.md and BENCHMARKS.md at least.
    assert!(documents.len() >= 14, "found only {documents:?}");
    let mut problems = Vec::new();
    for path in &documents {
        let text = std::fs::read_to_string(path).expect("a readable Markdown file");
        let name = path.strip_prefix(&workspace.root).unwrap_or(path);
        let dir = path.parent().unwrap_or(&workspace.root);
        problems.extend(check_document(
            &workspace,
            dir,
            &name.display().to_string(),
            &text,
        ));
    }
    assert!(
        problems.is_empty(),
        "the docs name what does not exist:\n{}",
        problems.join("\n")
    );
}

/// The check itself, on the breaks it exists for: each must be found.
#[test]
fn the_check_finds_each_kind_of_break() {
    let workspace = Workspace::load();
    let found = |markdown: &str| check_document(&workspace, &workspace.root, "X.md", markdown);
    // lease-macros/README.md before this test: lease-core has no `consul` feature.
    let macros = "```toml\n[dependencies]\nlease-core = { version = \"0.1\", features = [\"macros\", \"consul\"] }\n```\n";
    let problems = found(macros);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("X.md:2: lease-core has no feature `consul`"),
        "{problems:?}"
    );
    assert!(found("```toml\n[dependencies]\nlease-core = { version = \"0.1\", features = [\"macros\"] }\n```\n").is_empty());
    // A crate that is not in the workspace, and a path that is not its directory.
    assert_eq!(
        found("```toml\n[dependencies]\nlease-zookeeper = \"0.1\"\n```\n").len(),
        1
    );
    assert_eq!(
        found(
            "```toml\n[dev-dependencies]\nlease-postgres = { path = \"../lease/postgres\" }\n```\n"
        )
        .len(),
        1
    );
    // Commands: a feature, a package, targets, in a block or inline, over a line break.
    assert_eq!(
        found("```sh\ncargo run -p lease-demo --features zookeeper -- --zookeeper URL\n```\n")
            .len(),
        1
    );
    assert_eq!(
        found("```console\n$ cargo test -p lease-nope && echo ok\n```\n").len(),
        1
    );
    assert_eq!(
        found("Run `cargo run -p lease-postgres\n--features backend --example follower`.\n").len(),
        1
    );
    assert_eq!(found("`cargo bench -p lease-etcd --bench etcd_leader`, `cargo test -p lease-tests --test nope`").len(), 1);
    assert_eq!(
        found("`cargo build --features consul`").len(),
        1,
        "lease-core, the default member"
    );
    assert!(found("`cargo run -p lease-demo --features etcd -- --features nope`").is_empty());
    assert!(found("`cargo build -p <crate> [--features <client>]`").is_empty());
    assert_eq!(
        found("`URL=postgres://h/db cargo run -p lease-postgres --example nope`").len(),
        1
    );
    // lease-cli/README.md before the fix: not on crates.io; and a checkout's install is locked.
    assert_eq!(found("```sh\ncargo install lease-cli\n```\n").len(), 1);
    assert_eq!(found("`cargo install --path lease-cli`").len(), 1);
    assert_eq!(found("`cargo install --path lease-core --locked`").len(), 1);
    assert!(found("`cargo install --locked --path lease-cli`").is_empty());
    // Links: to a file, to a heading of another file or of the document itself.
    assert!(found("[a](ARCHITECTURE.md#ci), [b](lease-core), [c](#x)\n\n## X\n").is_empty());
    assert_eq!(
        found("[a](ARCHITECTURE.md#no-such-heading), [b](lease-nope)").len(),
        2
    );
    assert_eq!(found("See [the rules](#rules).").len(), 1);
}
