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
        assert!(
            !rest.starts_with('{'),
            "`crate::{{…}}` hides which modules it names; write one path per module"
        );
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
        let relative =
            file.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
        let own = relative.split(['/', '.']).next().expect("a name").to_string();
        let text = std::fs::read_to_string(file).expect("read");
        for module in named_modules(&text) {
            if module == own
                || !src.join(&module).exists() && !src.join(format!("{module}.rs")).exists()
            {
                continue;
            }
            if layer(&module) > layer(&own) {
                if KNOWN_UPWARD.contains(&(relative.as_str(), module.as_str())) {
                    allowed_seen.insert((relative.clone(), module));
                } else {
                    upward.push(format!(
                        "src/{relative} (layer {}) names crate::{module} (layer {})",
                        layer(&own),
                        layer(&module)
                    ));
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
/// only the requests that wait for it (a room: `core::delivery::holds`). Blocking calls count in
/// code that runs on an actor's context; the webhook sender's own threads may sleep.
/// What holds a mailbox or a thread, and whether it blocks the thread (the sleep is
/// spelled in two parts so that `tests/count-sleeps` does not count this list).
const NEEDLES: [(&str, bool); 4] = [
    ("ctx.wait(", false),
    ("AtomicResponse", false),
    ("block_on(", true),
    (concat!("thread::", "sleep", "("), true),
];

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
    assert!(
        found.is_empty(),
        "actors that hold their mailbox or thread while they wait:\n  {}",
        found.join("\n  ")
    );
}

/// The modules of `src/<top>/` one file or folder each (`mod.rs` is the parent itself,
/// named `mod`), and which of them each one names: `super::x` from a file directly in the
/// folder, `crate::<top>::x`, and `self::x`/`x::` from `mod.rs`; a name that is not a child
/// module is the parent's own item (an import of `mod`). `mod.rs` names every child it
/// declares.
fn child_imports(top: &Path) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut children = BTreeSet::new();
    for entry in std::fs::read_dir(top).expect("read the folder") {
        let path = entry.expect("entry").path();
        let stem = path.file_stem().expect("a name").to_string_lossy().to_string();
        if path.is_dir() || path.extension().is_some_and(|e| e == "rs") && stem != "mod" {
            children.insert(stem);
        }
    }
    // The folder's module path: `core::delivery` for `src/core/delivery`.
    let parts: Vec<String> =
        top.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
    let below_src = parts.iter().rposition(|p| p == "src").map_or(parts.len() - 1, |at| at + 1);
    let top_name = parts[below_src..].join("::");
    let mut files = Vec::new();
    rust_files(top, &mut files);
    let mut graph: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for file in &files {
        let relative =
            file.strip_prefix(top).expect("under the folder").to_string_lossy().replace('\\', "/");
        let own = match relative.split('/').next().expect("a name") {
            "mod.rs" => "mod".to_string(),
            first => first.trim_end_matches(".rs").to_string(),
        };
        let text = std::fs::read_to_string(file).expect("read");
        // Unit tests may reach anywhere.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let directly_in_folder = !relative.contains('/')
            || relative.ends_with("/mod.rs") && relative.matches('/').count() == 1;
        let mut prefixes = vec![format!("crate::{top_name}::")];
        if directly_in_folder && own != "mod" {
            prefixes.push("super::".to_string());
        }
        let names = graph.entry(own.clone()).or_default();
        for prefix in &prefixes {
            for (at, _) in code.match_indices(prefix.as_str()) {
                if code[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                {
                    continue;
                }
                let rest = &code[at + prefix.len()..];
                if rest.starts_with("super::") {
                    continue;
                }
                for name in first_segments(rest) {
                    let target = if children.contains(&name) { name } else { "mod".to_string() };
                    if target != own && target != "self" {
                        names.insert(target);
                    }
                }
            }
        }
        if own == "mod" {
            for child in &children {
                if code.contains(&format!("mod {child};")) {
                    names.insert(child.clone());
                }
            }
        }
    }
    graph
}

/// The first segment of the path that starts `rest`, or of each path of a `{…}` group.
fn first_segments(rest: &str) -> Vec<String> {
    let ident = |s: &str| {
        s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>()
    };
    if rest.starts_with('*') {
        return vec!["*".to_string()]; // a glob: the parent's items
    }
    let Some(group) = rest.strip_prefix('{') else { return vec![ident(rest)] };
    let (mut depth, mut item, mut found) = (0, String::new(), Vec::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                found.push(ident(&item));
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    found.push(ident(&item));
    found.retain(|name| !name.is_empty());
    found
}

/// A cycle of `graph` as the names along it, if there is one.
fn a_cycle(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Folders of `src/` (at any depth) whose modules still import each other round (a child importing its
/// parent `mod.rs` counts: the parent's shared types belong in a child the others import):
/// each is a debt, named here so that a new one fails the test.
/// `actors/room` is one actor split by concern, whose parts name the actor's types in
/// `mod.rs`.
const KNOWN_CYCLIC: &[&str] = &["actors/room", "client", "cluster", "protocol", "server", "store"];

#[test]
fn no_folder_of_src_has_modules_that_import_each_other_round() {
    let _gate = crate::common::gate!();
    let src = Path::new(crate::common::REPO).join("src");
    let mut cyclic = Vec::new();
    let mut folders = 0;
    let mut pending = vec![src.clone()];
    while let Some(parent) = pending.pop() {
        for entry in std::fs::read_dir(&parent).expect("read a folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            }
        }
        if parent == src {
            continue;
        }
        let folder = parent;
        folders += 1;
        let name =
            folder.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
        let cycle = a_cycle(&child_imports(&folder));
        match (cycle, KNOWN_CYCLIC.contains(&name.as_str())) {
            (Some(cycle), false) => cyclic.push(format!("src/{name}: {}", cycle.join(" -> "))),
            (None, true) => cyclic
                .push(format!("src/{name} has no cycle any more: remove it from KNOWN_CYCLIC")),
            _ => {}
        }
    }
    assert!(folders >= 12, "the folders of src/ and their folders are found ({folders})");
    assert!(cyclic.is_empty(), "modules that import each other round:\n  {}", cyclic.join("\n  "));
}

#[test]
fn a_child_that_imports_its_parent_is_a_cycle() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("a temp dir");
    let top = dir.path().join("http");
    std::fs::create_dir(&top).expect("mkdir");
    std::fs::write(top.join("mod.rs"), "mod sse;\nmod state;\npub struct AppState;\n")
        .expect("write");
    std::fs::write(top.join("state.rs"), "pub struct Shared;\n").expect("write");
    std::fs::write(top.join("sse.rs"), "use super::state::Shared;\n").expect("write");
    assert_eq!(a_cycle(&child_imports(&top)), None, "mod -> sse -> state is no cycle");
    std::fs::write(top.join("sse.rs"), "use super::AppState;\n").expect("write");
    assert_eq!(
        a_cycle(&child_imports(&top)),
        Some(["mod", "sse", "mod"].map(String::from).to_vec())
    );
    std::fs::write(top.join("sse.rs"), "use super::{state::{self, Shared}, AppState};\n")
        .expect("write");
    assert!(a_cycle(&child_imports(&top)).is_some(), "a parent's item named in a group");
    std::fs::write(top.join("sse.rs"), "use super::{state::{self, Shared}};\n").expect("write");
    assert_eq!(a_cycle(&child_imports(&top)), None, "a sibling named in a group");
    std::fs::write(top.join("sse.rs"), "use crate::http::state::Shared;\n").expect("write");
    std::fs::write(top.join("state.rs"), "use super::sse;\n").expect("write");
    assert!(a_cycle(&child_imports(&top)).is_some(), "siblings that import each other");
}
