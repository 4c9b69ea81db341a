//! The book (`docs/`) and the README tell the truth about themselves and about the
//! server: every relative link and anchor resolves (anchors as mdBook makes them from
//! headings), every chapter is in `SUMMARY.md`, the README stays short, ARCHITECTURE.md
//! stays a short map whose code map names every module of `src/`, and the `console`
//! blocks of Getting started run against the real binary with the real curl and get the
//! answers the page shows.
//!
//! A `console` block is a walk-through: each `$ ` line (with `\` continuation lines) is a
//! command, the lines after it up to the next `$ ` line are what it prints. A command is a
//! `curl -si ...`, whose shown answer is its status line (`HTTP/1.1 201 Created`) and then
//! its JSON body, headers left out; or an assignment `NAME=...`, run once and its value
//! kept for the commands after it. In the shown JSON, `…` stands for any value (bare or as
//! a string), and a string ending in `…` for any string that starts with what precedes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::process::ServeProcess;
use crate::common::REPO;

/// The README's length the issue allows: what livegate is, the two commands, a one-minute
/// walk-through, and links into the book.
const README_MAX_LINES: usize = 150;

fn repo() -> PathBuf {
    Path::new(REPO).canonicalize().expect("the repository's root")
}

/// Every Markdown file of the book, with its path.
fn book_pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut pages = Vec::new();
    walk(&repo().join("docs/src"), &mut pages);
    pages.sort();
    pages
}

/// The lines of `text` outside fenced code blocks, with their line numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match fence {
            Some(marker) if trimmed.starts_with(marker) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                fence = Some(&trimmed[..3])
            }
            None => out.push((i + 1, line)),
        }
    }
    out
}

/// `line` without its inline code spans (`` `...` ``).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for ch in line.chars() {
        if ch == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(ch);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`, outside code, with their
/// line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("").to_string();
            out.push((number, target));
            rest = &after[end..];
        }
    }
    out
}

/// The id mdBook gives a heading: its text without markup, lower-cased, each space a
/// `-`, anything but letters, digits, `_` and `-` left out.
fn heading_id(heading: &str) -> String {
    let text: String = heading.chars().filter(|c| *c != '`' && *c != '*').collect();
    let text = strip_link_targets(&text);
    text.trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => {
                Some(c.to_lowercase().next().unwrap_or(c))
            }
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// `[text](target)` → `text`, so that a link in a heading counts by its text.
fn strip_link_targets(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        let (before, after) = rest.split_at(at);
        out.push_str(&before.replace('[', ""));
        rest = after[2..].find(')').map_or("", |end| &after[2 + end + 1..]);
    }
    out.push_str(&rest.replace('[', ""));
    out
}

/// The anchors of a page: one per heading, a repeated one numbered as mdBook numbers it
/// (`id`, `id-1`, `id-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else { continue };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let id = heading_id(heading);
        let count = seen.entry(id.clone()).or_insert(0);
        out.insert(if *count == 0 { id.clone() } else { format!("{id}-{count}") });
        *count += 1;
    }
    out
}

/// `base/target` with `.` and `..` taken away (the file need not exist).
fn resolve(base: &Path, target: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for part in base.join(target).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every relative link of the Markdown file `page` that does not resolve, as
/// `file:line: target (why)`.
fn broken_links(page: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(page).unwrap_or_else(|e| panic!("read {}: {e}", page.display()));
    let name = page.strip_prefix(repo()).unwrap_or(page).display().to_string();
    let mut broken = Vec::new();
    for (line, target) in links(&text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) =
            target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
        let file = if path.is_empty() {
            page.to_path_buf()
        } else {
            resolve(page.parent().expect("a page's dir"), path)
        };
        if !file.exists() {
            broken.push(format!("{name}:{line}: {target} (no file {})", file.display()));
            continue;
        }
        if let Some(anchor) = anchor {
            let is_markdown = file.extension().is_some_and(|e| e == "md");
            let known = is_markdown
                && anchors(&std::fs::read_to_string(&file).unwrap_or_default()).contains(anchor);
            if !known {
                broken.push(format!("{name}:{line}: {target} (no heading with the id {anchor:?})"));
            }
        }
    }
    broken
}

#[test]
fn headings_get_mdbooks_ids() {
    let _gate = crate::common::gate!();
    assert_eq!(heading_id(" Backups of `data_dir`"), "backups-of-data_dir");
    assert_eq!(
        heading_id(" WebSocket protocol (v1, JSON text frames)"),
        "websocket-protocol-v1-json-text-frames"
    );
    assert_eq!(
        heading_id(" Churn: memory left behind by users who came and went"),
        "churn-memory-left-behind-by-users-who-came-and-went"
    );
    assert_eq!(heading_id(" recovered:false"), "recoveredfalse");
    assert_eq!(heading_id(" See [Cluster](cluster.md) first"), "see-cluster-first");
    let ids = anchors("# A\n## Delivery\n```\n# not a heading\n```\n## Delivery\n#hashtag\n");
    assert_eq!(
        ids,
        ["a", "delivery", "delivery-1"].map(String::from).into_iter().collect::<BTreeSet<_>>()
    );
}

#[test]
fn every_relative_link_and_anchor_of_the_book_and_the_readme_resolves() {
    let _gate = crate::common::gate!();
    let mut pages = book_pages();
    assert!(pages.len() >= 20, "the book has its chapters: {pages:?}");
    pages.push(repo().join("README.md"));
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in &pages {
        checked += links(&std::fs::read_to_string(page).expect("read page")).len();
        broken.extend(broken_links(page));
    }
    assert!(checked > 100, "the pages link to each other ({checked} links found)");
    assert!(broken.is_empty(), "{} broken links:\n{}", broken.len(), broken.join("\n"));
    // The checker finds what it is for.
    let scratch = tempfile::tempdir().expect("tempdir");
    let page = scratch.path().join("page.md");
    std::fs::write(
        &page,
        "# Here\n\n[ok](#here) [gone](missing.md) [no anchor](#there) `[code](x.md)`\n",
    )
    .unwrap();
    let found = broken_links(&page);
    assert_eq!(found.len(), 2, "{found:?}");
}

/// Whether a prose line speaks of a close code: the words, or a code of livegate's own
/// (1012 and up: smaller numbers are too common in prose to tell).
fn mentions_close_codes(line: &str) -> bool {
    let words = without_code_spans(line).to_ascii_lowercase();
    words.contains("close code")
        || livegate::protocol::CloseCode::ALL.iter().map(|c| c.code()).filter(|&c| c >= 1012).any(
            |code| {
                let code = code.to_string();
                words.split(|c: char| !c.is_ascii_digit()).any(|word| word == code)
            },
        )
}

#[test]
fn every_page_that_mentions_close_codes_links_to_the_one_table() {
    let _gate = crate::common::gate!();
    let reference = repo().join("docs/src/reference/close-codes.md");
    let mut pages = book_pages();
    pages.push(repo().join("README.md"));
    let (mut unlinked, mut tables, mut mentioning) = (Vec::new(), Vec::new(), 0);
    let codes: Vec<u16> = livegate::protocol::CloseCode::ALL
        .iter()
        .map(|c| c.code())
        .chain(livegate::protocol::OTHER_CLOSE_CODES.iter().map(|(code, _, _)| *code))
        .collect();
    for page in pages.iter().filter(|page| **page != reference) {
        let text = std::fs::read_to_string(page).expect("read page");
        let prose = prose_lines(&text);
        let name = page.strip_prefix(repo()).unwrap_or(page).display().to_string();
        if prose.iter().any(|(_, line)| mentions_close_codes(line)) {
            mentioning += 1;
            let linked = links(&text).iter().any(|(_, target)| {
                let path = target.split('#').next().unwrap_or_default();
                !path.is_empty() && resolve(page.parent().expect("a page's dir"), path) == reference
            });
            if !linked {
                unlinked.push(name.clone());
            }
        }
        // A table of its own: a row that starts with a close code.
        for (number, line) in &prose {
            let first = line
                .trim_start()
                .strip_prefix('|')
                .and_then(|rest| rest.split('|').next())
                .map(str::trim);
            if first
                .and_then(|cell| cell.parse::<u16>().ok())
                .is_some_and(|code| codes.contains(&code))
            {
                tables.push(format!("{name}:{number}: {line}"));
            }
        }
    }
    assert!(mentioning >= 10, "pages mentioning close codes found: {mentioning}");
    assert!(
        unlinked.is_empty(),
        "pages that mention close codes without linking to reference/close-codes.md: {unlinked:?}"
    );
    assert!(
        tables.is_empty(),
        "close-code tables besides the reference (link to it instead):\n{}",
        tables.join("\n")
    );
    assert!(
        mentions_close_codes("closed with 4009 at once")
            && mentions_close_codes("Close codes")
            && !mentions_close_codes("10120 rooms")
    );
}

#[test]
fn the_license_is_mit_as_the_packages_say() {
    let _gate = crate::common::gate!();
    let license =
        std::fs::read_to_string(repo().join("LICENSE")).expect("a LICENSE file at the root");
    assert!(
        license.starts_with("MIT License\n\nCopyright (c) 2026 the livegate authors\n"),
        "{license}"
    );
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        cargo.lines().any(|line| line.trim() == "license = \"MIT\""),
        "Cargo.toml's license field"
    );
    let package: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("clients/js/package.json")).expect("package.json"),
    )
    .expect("JSON");
    assert_eq!(package["license"], "MIT");
}

#[test]
fn every_chapter_is_in_the_summary() {
    let _gate = crate::common::gate!();
    let src = repo().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let listed: BTreeSet<PathBuf> =
        links(&summary).into_iter().map(|(_, target)| resolve(&src, &target)).collect();
    let missing: Vec<_> = book_pages()
        .into_iter()
        .filter(|page| !page.ends_with("SUMMARY.md") && !listed.contains(page))
        .collect();
    assert!(
        missing.is_empty(),
        "chapters SUMMARY.md does not list (mdBook would not build them): {missing:?}"
    );
    for reference in ["configuration", "metrics", "errors", "close-codes"] {
        assert!(
            listed.contains(&src.join(format!("reference/{reference}.md"))),
            "SUMMARY.md lists reference/{reference}.md"
        );
    }
}

#[test]
fn the_readme_is_short_and_points_into_the_book() {
    let _gate = crate::common::gate!();
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; at most {README_MAX_LINES}: move the rest into docs/src"
    );
    let into_book =
        links(&readme).into_iter().filter(|(_, target)| target.starts_with("docs/src/")).count();
    assert!(into_book >= 10, "README.md links into the book ({into_book} links to docs/src/)");
    for command in ["cargo run --release\n", ".ci/test\n"] {
        assert!(readme.contains(command), "README.md shows the command {command:?}");
    }
}

/// ARCHITECTURE.md's length: the map a newcomer reads in ten minutes; the detail is in the
/// book's Inside pages (`docs/src/internals/`).
const ARCHITECTURE_MAX_LINES: usize = 300;

/// The names a Markdown section gives in code spans, each split at `/` and without `.rs`:
/// `` `room/local` `` names `room` and `local`, `` `config.rs` `` names `config`.
fn named_in_code(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 1 {
            for part in span.split('/') {
                names.insert(part.trim_end_matches(".rs").to_string());
            }
        }
    }
    names
}

/// The modules of `src/` a code map must name: every directory (but `web/`, embedded files)
/// and every `.rs` file but `mod.rs`, `lib.rs` and `main.rs`, by its name.
fn source_modules() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for entry in
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        {
            let path = entry.expect("dir entry").path();
            let name = path.file_stem().expect("a name").to_string_lossy().to_string();
            if path.is_dir() && name != "web" {
                out.insert(name);
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !["mod", "lib", "main"].contains(&name.as_str())
            {
                out.insert(name);
            }
        }
    }
    let mut modules = BTreeSet::new();
    walk(&repo().join("src"), &mut modules);
    modules
}

#[test]
fn architecture_is_a_short_map_naming_every_module_and_its_links_resolve() {
    let _gate = crate::common::gate!();
    let page = repo().join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&page).expect("ARCHITECTURE.md");
    let lines = text.lines().count();
    let most = ARCHITECTURE_MAX_LINES;
    assert!(
        lines <= most,
        "ARCHITECTURE.md has {lines} lines; at most {most}: move detail into docs/src/internals/"
    );
    let broken = broken_links(&page);
    assert!(broken.is_empty(), "broken links in ARCHITECTURE.md:\n{}", broken.join("\n"));
    let into_book = links(&text)
        .into_iter()
        .filter(|(_, target)| target.starts_with("docs/src/internals/"))
        .count();
    assert!(
        into_book >= 3,
        "ARCHITECTURE.md points to the book's Inside pages ({into_book} links)"
    );
    let start =
        text.find("\n## Code map\n").expect("ARCHITECTURE.md has a \"## Code map\" section");
    let map = &text[start + 1..];
    let map = &map[..map[1..].find("\n## ").map_or(map.len(), |end| end + 1)];
    let named = named_in_code(map);
    let modules = source_modules();
    assert!(
        modules.len() > 80 && modules.contains("seqlog") && modules.contains("actors"),
        "{modules:?}"
    );
    let missing: Vec<_> = modules.iter().filter(|module| !named.contains(*module)).collect();
    assert!(
        missing.is_empty(),
        "modules of src/ ARCHITECTURE.md's code map does not name (a line each): {missing:?}"
    );
    for section in ["## Invariants", "## Where the bounds live"] {
        assert!(
            text.contains(&format!("\n{section}\n")),
            "ARCHITECTURE.md has a {section:?} section"
        );
    }
    // The name finder sees through paths and extensions, and only in code.
    assert_eq!(
        named_in_code("- `room/local` and `config.rs`; seqlog"),
        ["room", "local", "config"].map(String::from).into_iter().collect::<BTreeSet<_>>()
    );
}

/// One command of a walk-through and the answer the page shows for it.
#[derive(Debug)]
struct Step {
    line: usize,
    command: String,
    shown: Vec<String>,
}

/// The steps of every `console` block of `text`.
fn walkthrough(text: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_console = false;
    let mut continued = false;
    for (i, line) in text.lines().enumerate() {
        if !in_console {
            in_console = line.trim() == "```console";
            continue;
        }
        if line.trim() == "```" {
            in_console = false;
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                line: i + 1,
                command: command.trim_end_matches('\\').trim().to_string(),
                shown: Vec::new(),
            });
            continued = line.ends_with('\\');
        } else if continued {
            let step = steps.last_mut().expect("a continued command");
            step.command.push(' ');
            step.command.push_str(line.trim_end_matches('\\').trim());
            continued = line.ends_with('\\');
        } else {
            steps
                .last_mut()
                .unwrap_or_else(|| panic!("line {}: output before any `$ ` command", i + 1))
                .shown
                .push(line.to_string());
        }
    }
    steps
}

/// The shown JSON with each bare `…` (outside strings) made the string `"…"`.
fn pattern(shown: &str) -> Value {
    let mut text = String::new();
    let mut in_string = false;
    let mut escaped = false;
    for ch in shown.chars() {
        match ch {
            '"' if !escaped => in_string = !in_string,
            '…' if !in_string => {
                text.push_str("\"…\"");
                continue;
            }
            _ => {}
        }
        escaped = ch == '\\' && !escaped;
        text.push(ch);
    }
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the shown answer is not JSON ({e}): {shown}"))
}

/// Where `actual` differs from the shown `want` (`…` matches anything), as paths.
fn differences(want: &Value, actual: &Value, path: &str, out: &mut Vec<String>) {
    match (want, actual) {
        (Value::String(w), _) if w == "…" => {}
        (Value::String(w), Value::String(a)) if w.ends_with('…') => {
            if !a.starts_with(w.trim_end_matches('…')) {
                out.push(format!("{path}: {a:?} does not start with {w:?}"));
            }
        }
        (Value::Object(w), Value::Object(a)) => {
            for (key, value) in w {
                match a.get(key) {
                    Some(got) => differences(value, got, &format!("{path}.{key}"), out),
                    None => out.push(format!("{path}.{key}: missing")),
                }
            }
        }
        (Value::Array(w), Value::Array(a)) if w.len() == a.len() => {
            for (i, (value, got)) in w.iter().zip(a).enumerate() {
                differences(value, got, &format!("{path}[{i}]"), out);
            }
        }
        _ if want == actual => {}
        _ => out.push(format!("{path}: shown {want}, got {actual}")),
    }
}

/// Runs the page's steps in order in `dir` (whose `data/` is the server's data dir),
/// with `localhost:7070` the server's address; every difference from the page, by line.
fn run_walkthrough(steps: &[Step], dir: &Path, addr: &str) -> Vec<String> {
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut failures = Vec::new();
    for step in steps {
        let command = step.command.replace("localhost:7070", addr);
        let assignment = command.split_once('=').filter(|(name, _)| {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        });
        let script = match assignment {
            Some((name, _)) => format!("{command} && printf %s \"${name}\""),
            None if command.starts_with("curl ") => command.clone(),
            None => {
                failures.push(format!(
                    "line {}: `{}` is neither a curl command nor an assignment",
                    step.line, step.command
                ));
                continue;
            }
        };
        let output = Command::new("bash")
            .args(["-c", &script])
            .current_dir(dir)
            .envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .expect("run bash (and curl: .ci/test installs Debian's curl)");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        if !output.status.success() {
            failures.push(format!(
                "line {}: `{}` failed ({}): {}",
                step.line,
                step.command,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
            continue;
        }
        if let Some((name, _)) = assignment {
            assert!(step.shown.is_empty(), "line {}: an assignment prints nothing", step.line);
            vars.push((name.to_string(), stdout));
            continue;
        }
        let (head, body) = stdout.split_once("\r\n\r\n").unwrap_or((stdout.as_str(), ""));
        let status = head.lines().next().unwrap_or("").trim();
        let mut shown = step.shown.iter().map(|s| s.trim()).filter(|s| !s.is_empty());
        match shown.next() {
            Some(want) if want.starts_with("HTTP/") => {
                if want != status {
                    failures
                        .push(format!("line {}: status shown {want:?}, got {status:?}", step.line));
                }
            }
            _ => failures.push(format!(
                "line {}: a curl step shows its status line first (curl -si)",
                step.line
            )),
        }
        let want_body: String = shown.collect::<Vec<_>>().join("");
        if want_body.is_empty() {
            continue;
        }
        let actual: Value = match serde_json::from_str(body.trim()) {
            Ok(value) => value,
            Err(e) => {
                failures.push(format!("line {}: the answer is not JSON ({e}): {body}", step.line));
                continue;
            }
        };
        let mut differs = Vec::new();
        differences(&pattern(&want_body), &actual, "$", &mut differs);
        for difference in differs {
            failures.push(format!("line {}: {difference} (answer: {actual})", step.line));
        }
    }
    failures
}

#[test]
fn shown_json_matches_what_it_shows_and_nothing_else() {
    let _gate = crate::common::gate!();
    let want = pattern(
        r#"{"room":"lobby","seq":1,"epoch":"…","ts_ms":…,"id":"ab…","events":[{"seq":1}]}"#,
    );
    let good: Value = serde_json::json!({"room":"lobby","seq":1,"epoch":"e1","ts_ms":7,"id":"abc","events":[{"seq":1,"x":2}],"more":true});
    let mut out = Vec::new();
    differences(&want, &good, "$", &mut out);
    assert!(out.is_empty(), "{out:?}");
    let bad: Value =
        serde_json::json!({"room":"lobby","seq":2,"id":"xbc","events":[{"seq":1},{"seq":2}]});
    differences(&want, &bad, "$", &mut out);
    assert_eq!(out.len(), 5, "seq, epoch, ts_ms, id and events differ: {out:?}");
    let steps = walkthrough("```console\n$ A=1\n$ curl -si x \\\n  -d y\nHTTP/1.1 200 OK\n{}\n```\n```sh\n$ not run\n```\n");
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!(steps[1].command, "curl -si x -d y");
    assert_eq!(steps[1].shown, ["HTTP/1.1 200 OK", "{}"]);
}

#[test]
fn the_curl_walkthrough_of_getting_started_runs_against_the_real_binary() {
    let _gate = crate::common::gate!();
    let page = repo().join("docs/src/getting-started.md");
    let steps = walkthrough(&std::fs::read_to_string(&page).expect("docs/src/getting-started.md"));
    let curls = steps.iter().filter(|s| s.command.starts_with("curl ")).count();
    assert!(
        curls >= 5,
        "Getting started walks through the HTTP API with curl ({curls} curl steps)"
    );
    let dir = tempfile::Builder::new().prefix("livegate-book-").tempdir().expect("tempdir");
    // No --api-key: the server generates data/api_key, which the page reads.
    let server =
        ServeProcess::start_without_key(&dir.path().join("data"), &dir.path().join("log"), &[]);
    let failures = run_walkthrough(&steps, dir.path(), &server.addr.to_string());
    assert!(
        failures.is_empty(),
        "docs/src/getting-started.md differs from the server:\n{}",
        failures.join("\n")
    );
    // The same steps against a page that shows a wrong answer fail.
    let wrong = walkthrough(
        "```console\n$ KEY=$(cat data/api_key)\n$ curl -si localhost:7070/v1/rooms/lobby/state -H \"Authorization: Bearer $KEY\"\nHTTP/1.1 200 OK\n{\"seq\":99}\n```\n",
    );
    let failures = run_walkthrough(&wrong, dir.path(), &server.addr.to_string());
    assert_eq!(failures.len(), 1, "a wrong seq is found: {failures:?}");
}
