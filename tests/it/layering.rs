//! The layering rule of ARCHITECTURE.md, checked on the source: every `crate::` path a
//! module names (in `use` lines and in code) belongs to its own layer or one below.
//! Layers, lowest first: core, world and tasks; protocol, config and store; metrics,
//! cluster, client and reference; actors; http and demo; server; cli; and the crate roots.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layer of a top-level module of `src/`.
fn layer(module: &str) -> usize {
    match module {
        "core" | "world" | "tasks" => 0,
        "protocol" | "config" | "store" => 1,
        // client: a client of the public API, kept below actors and handlers so it
        // cannot reach the server's insides.
        // reference: the references printed from config, protocol and metrics.
        "metrics" | "cluster" | "client" | "reference" => 2,
        "actors" => 3,
        "http" | "demo" => 4,
        "server" => 5,
        "cli" => 6,
        "lib" | "main" => 7,
        other => panic!("src/{other}: a top-level module the layering rule does not know; give it a layer here and in ARCHITECTURE.md"),
    }
}

/// Upward imports not yet removed: file, the module it reaches up to. Empty, and it should
/// stay so: a lower layer that needs a higher one defines a trait the wiring implements.
const KNOWN_UPWARD: &[(&str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `text` names as `crate::<module>`.
fn named_modules(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[at + "crate::".len()..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        assert!(!rest.starts_with('{'), "`crate::{{…}}` hides which modules it names; write one path per module");
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

#[test]
fn no_module_imports_a_layer_above_its_own() {
    let _gate = crate::common::gate!();
    let src = Path::new(crate::common::REPO).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    let mut allowed_seen = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
        let own = relative.split(['/', '.']).next().expect("a name").to_string();
        let text = std::fs::read_to_string(file).expect("read");
        for module in named_modules(&text) {
            if module == own || !src.join(&module).exists() && !src.join(format!("{module}.rs")).exists() {
                continue;
            }
            if layer(&module) > layer(&own) {
                if KNOWN_UPWARD.contains(&(relative.as_str(), module.as_str())) {
                    allowed_seen.insert((relative.clone(), module));
                } else {
                    upward.push(format!("src/{relative} (layer {}) names crate::{module} (layer {})", layer(&own), layer(&module)));
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports that run up the layers:\n  {}", upward.join("\n  "));
    for (file, module) in KNOWN_UPWARD {
        assert!(
            allowed_seen.contains(&(file.to_string(), module.to_string())),
            "src/{file} no longer reaches up to {module}: remove it from KNOWN_UPWARD"
        );
    }
}

#[test]
fn module_names_are_found_in_paths_and_use_lines() {
    let _gate = crate::common::gate!();
    let text = "use crate::core::x;\nlet a = crate::store::open();\nmy_crate::nope;\n";
    assert_eq!(named_modules(text), ["core", "store"].map(String::from).into());
}

/// ARCHITECTURE.md's "no round trip under a mailbox": no actor holds its mailbox while a
/// future runs (`ctx.wait`, `AtomicResponse`) or blocks its thread on one (`block_on`,
/// `thread::sleep`). An actor that needs a read starts it beside its mailbox and holds
/// only the requests that wait for it (a room: `core::holds`). Blocking calls count in
/// code that runs on an actor's context; the webhook sender's own threads may sleep.
/// What holds a mailbox or a thread, and whether it blocks the thread (the sleep is
/// spelled in two parts so that `tests/count-sleeps` does not count this list).
const NEEDLES: [(&str, bool); 4] =
    [("ctx.wait(", false), ("AtomicResponse", false), ("block_on(", true), (concat!("thread::", "sleep", "("), true)];

#[test]
fn no_actor_holds_its_mailbox_while_it_waits() {
    let _gate = crate::common::gate!();
    let actors = Path::new(crate::common::REPO).join("src/actors");
    let mut files = Vec::new();
    rust_files(&actors, &mut files);
    assert!(files.len() > 10, "the actors' sources are found");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let on_a_context = text.contains("ctx");
        // Unit tests may run their own system.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (needle, blocking) in NEEDLES {
                if line.contains(needle) && (on_a_context || !blocking) {
                    found.push(format!("{}:{}: {needle}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "actors that hold their mailbox or thread while they wait:\n  {}", found.join("\n  "));
}

/// The names a file's code (before its unit tests) reaches through `super::`: the first
/// segment of each path, and of each path in a `super::{…}` group.
fn super_names(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let ident = |s: &str| s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*').collect::<String>();
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("super::") {
        let rest = &code[at + "super::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let (mut depth, mut item) = (0, String::new());
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            found.insert(ident(&item));
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    item.push(c);
                }
                found.insert(ident(&item));
            }
            None => {
                found.insert(ident(rest));
            }
        }
    }
    found.retain(|name| !name.is_empty());
    found
}

/// Inside `src/http/` a module imports what it shares from its siblings (`state`,
/// `errors`, `request`, …), never from `mod.rs`, which only declares and routes; and no
/// siblings import each other in a loop.
#[test]
fn http_modules_import_no_loop_and_nothing_from_their_parent() {
    let _gate = crate::common::gate!();
    let dir = Path::new(crate::common::REPO).join("src/http");
    let mut siblings = BTreeSet::new();
    let mut texts = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("read src/http") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().expect("a name").to_string_lossy().to_string();
        if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            texts.push((name.clone(), std::fs::read_to_string(&path).expect("read")));
            siblings.insert(name);
        }
    }
    assert!(siblings.len() > 10, "the HTTP layer's modules are found");
    let (mut from_parent, mut edges) = (Vec::new(), Vec::new());
    for (name, text) in &texts {
        let mut names = super_names(text);
        for (at, _) in text.match_indices("crate::http::") {
            let rest = &text[at + "crate::http::".len()..];
            names.insert(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
        for used in names {
            if siblings.contains(&used) {
                edges.push((name.clone(), used));
            } else if used != "*" {
                from_parent.push(format!("src/http/{name}.rs names {used} of src/http/mod.rs"));
            }
        }
    }
    assert!(from_parent.is_empty(), "modules that import from src/http/mod.rs:\n  {}", from_parent.join("\n  "));
    // Take away, again and again, every module that imports none left: a loop is what stays.
    let mut left = siblings.clone();
    loop {
        let leaves: Vec<String> =
            left.iter().filter(|m| !edges.iter().any(|(from, to)| from == *m && from != to && left.contains(to))).cloned().collect();
        if leaves.is_empty() {
            break;
        }
        for leaf in leaves {
            left.remove(&leaf);
        }
    }
    assert!(left.is_empty(), "src/http modules that import each other in a loop: {left:?}");
}

#[test]
fn super_names_reads_groups_and_paths() {
    let _gate = crate::common::gate!();
    let text = "use super::errors::{a, b};\nuse super::{state, request::{x, y}, limits};\nfn f() { super::seams::g() }\n#[cfg(test)]\nuse super::*;";
    assert_eq!(super_names(text), ["errors", "state", "request", "limits", "seams"].map(String::from).into());
}
