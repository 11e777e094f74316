//! ARCHITECTURE.md's import rules ("Dependencies"), checked: this test reads every `src/**/*.rs`
//! file of the library (from `lib.rs` down its `mod` declarations, leaving out `#[cfg(test)]`
//! items and modules, comments and string literals), takes each `crate::…`, `super::…` and
//! `self::…` path as an arrow from its file to the file that defines the module it names, and
//! fails on
//!
//! - an arrow [`FORBIDDEN`] names, or one out of a module that [`ONLY`] confines;
//! - a circle of top-level modules (a file or folder directly under `src/`): the modules then
//!   stand in floors, each importing only modules below it, and no arrow runs back up;
//! - a circle of files (in a folder or across folders).
//!
//! A module naming its own child module (`mod x;` and `x::f()` in its parent) is ownership, not an
//! arrow; a child naming its parent (`super::…`) is one. `main.rs` (a crate of its own that uses
//! the library by its name) is not read. Std only and no build step: it runs with `cargo test --lib`
//! in well under a second.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `(from, to, why)`: no file of module `from` (or below it) may name module `to` (or below it).
/// `to` ending in `::*` means only what is *inside* that module, not its face (its `mod.rs`).
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "store",
        "layers",
        "the store is below every layer; layers import it, never the reverse",
    ),
    ("store", "http", "the store knows no edge"),
    ("store", "upstream", "the store knows no upstream client"),
    (
        "store",
        "registry",
        "the registry owns the store, not the reverse",
    ),
    ("store", "exchange", "the store knows no request or reply"),
    (
        "store",
        "metrics",
        "metrics label store facts (Origin); the store reports through store::CommitObserver",
    ),
    ("layers", "http", "no layer knows the edge"),
    (
        "layers",
        "upstream",
        "no layer knows the upstream client; gateway.rs puts it under the stack",
    ),
    (
        "layers",
        "gateway",
        "layers are assembled by gateway.rs, they do not call it",
    ),
    (
        "http",
        "layers::*",
        "the edge meets the stack through its face only (crate::layers, exchange::McpStack)",
    ),
    (
        "http",
        "upstream",
        "the edge and the upstream client meet only in gateway.rs",
    ),
    (
        "upstream",
        "http",
        "the edge and the upstream client meet only in gateway.rs",
    ),
    (
        "upstream",
        "layers",
        "the upstream client is below every layer",
    ),
    (
        "registry",
        "layers",
        "the registry is no layer and is below them",
    ),
    ("registry", "http", "the registry knows no edge"),
    (
        "registry",
        "upstream",
        "the registry knows no upstream client",
    ),
    (
        "exchange",
        "layers",
        "the exchange types are below every layer",
    ),
    (
        "exchange",
        "registry",
        "the exchange types are below the registry",
    ),
    (
        "layers::relay",
        "layers::bridge",
        "the bridge calls the relay and hands it the era translation it needs, never the reverse",
    ),
    (
        "layers::relay",
        "layers::session",
        "the relay is handed what the client declared; it reads no session table",
    ),
    (
        "layers::relay",
        "registry",
        "the relay records no task fact (only observe does)",
    ),
    (
        "layers::relay",
        "layers::held_sessions",
        "the relay is handed what the client declared; it knows no held session",
    ),
    (
        "layers::bridge",
        "layers::session",
        "the bridge reads no session table: held_sessions hands down what it needs",
    ),
    (
        "layers::bridge",
        "layers::held_sessions",
        "held_sessions sits above the bridge and hands it typed facts, and its upstream stage sits below it; the bridge calls neither",
    ),
    (
        "layers::held_sessions::upstream",
        "layers::session",
        "a held session's upstream path is handed the HeldSession fact; it reads no session table",
    ),
    (
        "layers::held_sessions::listen",
        "layers::session",
        "a held session's GET stream is told whether its session lives (HeldAlive); it reads no session table",
    ),
    (
        "layers::held_sessions::upstream",
        "registry",
        "a held session's upstream path records no task fact (only observe does)",
    ),
    (
        "layers::held_sessions::listen",
        "registry",
        "a held session's GET stream records no task fact (only observe does)",
    ),
    (
        "layers::upgrade",
        "layers::session",
        "upgrade owns its tool cache and reads the SessionView the session stage hands down, never the session table",
    ),
];

/// `(module, may name, why)`: files of `module` may name only these modules (and their own).
const ONLY: &[(&str, &[&str], &str)] = &[
    (
        "mcp",
        &["mcp", "jsonrpc", "text"],
        "the protocol's words: no I/O, nothing above them",
    ),
    (
        "jsonrpc",
        &["jsonrpc"],
        "the envelope: no MCP names, nothing above it",
    ),
    (
        "headers",
        &["headers"],
        "header names shared by the edge and the upstream client",
    ),
    ("sse", &["sse"], "the SSE codec stands on its own"),
    (
        "text",
        &["text"],
        "texts cut at a character boundary: a leaf anything may use",
    ),
    (
        "tls",
        &["tls"],
        "TLS client settings: config, the store and the upstream client use them",
    ),
    (
        "telemetry",
        &["telemetry", "config", "jsonrpc", "text"],
        "traces are a leaf the edge, the layers and the upstream client use; it knows none of them",
    ),
];

/// The layers, outermost first (`layers`'s module doc, `gateway::build_stack`): a file of one
/// may name a layer below it, never one above it (review 18a #7: `cancel` named
/// `tasks::lost`, an arrow up that formed no circle and named nothing [`FORBIDDEN`]). A module
/// under `layers` that is not listed (`extensions`, `own_request`, `lost_task`, `relay`, ...)
/// is no layer: any layer may name it. A layer's own sub-modules are that layer.
const LAYERS: &[&str] = &[
    "layers::session_guard",
    "layers::session",
    "layers::upgrade",
    "layers::tasks",
    "layers::cancel",
    "layers::gateway_tasks",
    "layers::held_sessions",
    "layers::bridge",
    "layers::observe",
    "layers::ids",
];

/// `(layer, path, why)`: the arrows up the stack there are by design, by the path they name
/// (each still fails this test once no file names it, so the entry goes with it).
const UPWARD_BY_DESIGN: &[(&str, &str, &str)] = &[
    (
        "layers::bridge",
        "crate::layers::cancel::cancel_from_below",
        "the bridge's own `tasks/cancel` goes through the cancel layer's single-flight, from below",
    ),
    (
        "layers::bridge",
        "crate::layers::cancel::CancelState",
        "the cancel state `cancel_from_below` takes",
    ),
    (
        "layers::bridge",
        "crate::layers::cancel::MODERN_ACK",
        "a re-export of the protocol's `mcp::modern::MODERN_ACK`, no code of the cancel layer's",
    ),
    (
        "layers::gateway_tasks",
        "crate::layers::cancel::MODERN_ACK",
        "a re-export of the protocol's `mcp::modern::MODERN_ACK`, no code of the cancel layer's",
    ),
    (
        "layers::held_sessions",
        "crate::layers::session::Sessions",
        "held sessions live in the session table (`layers`: no layer below `session` reads it but `held_sessions`)",
    ),
];

/// Where `m` stands in [`LAYERS`] (the longest entry it is under), if it is in a layer.
fn floor(m: &[String]) -> Option<usize> {
    LAYERS
        .iter()
        .enumerate()
        .filter(|(_, l)| under(m, l))
        .max_by_key(|(_, l)| l.len())
        .map(|(i, _)| i)
}

/// File circles known and owned elsewhere: each is still reported if it grows, and this test
/// fails once it is gone (so the entry is removed with it).
/// (None today: the bridge's `calls.rs → held.rs → mrtr.rs → calls.rs` was opened when
/// `legacy_event` moved to `translate.rs`, issue 30.)
const KNOWN_CIRCLES: &[(&[&str], &str)] = &[];

#[test]
fn imports_follow_the_architecture() {
    let house = House::read();
    let mut faults = Vec::new();

    for arrow in &house.arrows {
        let (from, to) = (&house.files[&arrow.from], &house.files[&arrow.to]);
        for (a, b, why) in FORBIDDEN {
            if under(from, a) && matches(to, b) {
                faults.push(format!(
                    "{a} → {b}: {} names `{}` ({why})",
                    arrow.from, arrow.path
                ));
            }
        }
        for (a, allowed, why) in ONLY {
            if under(from, a) && !allowed.iter().any(|b| under(to, b)) && !to.is_empty() {
                faults.push(format!(
                    "{a} names only {allowed:?}: {} names `{}` ({why})",
                    arrow.from, arrow.path
                ));
            }
        }
    }

    // Layers: imports point down the stack.
    let mut unused: BTreeSet<usize> = (0..UPWARD_BY_DESIGN.len()).collect();
    for arrow in &house.arrows {
        let (from, to) = (&house.files[&arrow.from], &house.files[&arrow.to]);
        if let (Some(a), Some(b)) = (floor(from), floor(to)) {
            let by_design = UPWARD_BY_DESIGN
                .iter()
                .position(|(l, path, _)| under(from, l) && arrow.path == *path);
            if let Some(i) = by_design {
                unused.remove(&i);
            } else if b < a {
                faults.push(format!(
                    "{} → {}: {} names `{}` (a layer names only layers below it)",
                    LAYERS[a], LAYERS[b], arrow.from, arrow.path
                ));
            }
        }
    }
    for i in unused {
        faults.push(format!(
            "UPWARD_BY_DESIGN lists {:?}, which no file names any more: remove the entry",
            UPWARD_BY_DESIGN[i]
        ));
    }

    // Top-level modules: no circle, so each stands above all that it imports.
    let mut tops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for arrow in &house.arrows {
        let (from, to) = (&house.files[&arrow.from], &house.files[&arrow.to]);
        if let (Some(a), Some(b)) = (from.first(), to.first()) {
            tops.entry(a.clone()).or_default();
            if a != b {
                tops.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    for circle in circles(&tops) {
        let ties = ties_of(&house, &circle, |f| house.files[f].first().cloned());
        faults.push(format!(
            "top-level modules in a circle: {} ({})",
            circle.join(" ↔ "),
            ties.join("; ")
        ));
    }

    // Files: no circle.
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in house.files.keys() {
        graph.entry(f.clone()).or_default();
    }
    for arrow in &house.arrows {
        graph
            .entry(arrow.from.clone())
            .or_default()
            .insert(arrow.to.clone());
    }
    let mut known: BTreeSet<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|(files, _)| files.iter().map(|f| f.to_string()).collect())
        .collect();
    for circle in circles(&graph) {
        if known.remove(&circle) {
            continue;
        }
        let ties = ties_of(&house, &circle, |f| Some(f.to_string()));
        faults.push(format!(
            "files in a circle: {} ({})",
            circle.join(" ↔ "),
            ties.join("; ")
        ));
    }
    for gone in known {
        faults.push(format!(
            "KNOWN_CIRCLES lists {gone:?}, which is no longer a circle: remove the entry"
        ));
    }

    assert!(
        faults.is_empty(),
        "{} import rule(s) broken (ARCHITECTURE.md, \"Dependencies\"):\n  {}",
        faults.len(),
        faults.join("\n  ")
    );
}

/// sled 0.34 calls that switch its process-global concurrency-control lock (`sled-0.34.7/src/
/// concurrency_control.rs`) into its blocking mode for the rest of the process: a transaction,
/// a batch, a checksum. taskgate's sled code makes none (`store::sled_store::swap` says why and
/// what replaces them): sled's calls about one task run on the serving threads
/// (`TaskStore::quick_point_calls`), which must never queue behind a transaction waiting for a
/// flush.
const SLED_EXCLUSIVE: &[&str] = &[
    "transaction",
    "Transactional",
    "TransactionalTree",
    "apply_batch",
    "checksum",
];

/// The files that may name sled: the embedded store's.
fn names_sled_legitimately(file: &str) -> bool {
    file == "src/store/sled_store.rs" || file.starts_with("src/store/sled_store/")
}

/// Every `.rs` file under `dir` (tests included), as `src/…` paths with their text.
fn every_source(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            every_source(root, &path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The code of `sources` (comments and strings left out) that names sled (`sled::…`) outside
/// the embedded store's files, or that makes one of the [`SLED_EXCLUSIVE`] calls in them: one
/// line per fault.
fn sled_faults(sources: &BTreeMap<String, String>) -> Vec<String> {
    let mut faults = Vec::new();
    for (file, text) in sources {
        let t = tokens(&strip(text));
        let sled_path = t
            .windows(2)
            .any(|w| w[0] == Token::Ident("sled".into()) && w[1] == Token::PathSep);
        if !names_sled_legitimately(file) {
            if sled_path {
                faults.push(format!("{file} names sled outside src/store/sled_store"));
            }
            continue;
        }
        for call in SLED_EXCLUSIVE {
            if t.contains(&Token::Ident(call.to_string())) {
                faults.push(format!("{file} names sled's `{call}`"));
            }
        }
    }
    faults
}

/// taskgate's sled code runs no sled transaction (nor anything else that takes sled's global
/// lock exclusively): every file naming sled is the embedded store's, and none of them names
/// a [`SLED_EXCLUSIVE`] call. PostgreSQL's transactions (`src/store/pg/`) name no sled.
#[test]
fn the_sled_store_runs_no_transaction() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = BTreeMap::new();
    every_source(root, &root.join("src"), &mut sources);
    assert!(sources.contains_key("src/store/sled_store.rs"));
    let faults = sled_faults(&sources);
    assert!(
        faults.is_empty(),
        "sled's lock must stay in its lock-free mode:\n  {}",
        faults.join("\n  ")
    );
    // The check sees what it should: a transaction (whatever the spelling) in the store's
    // files, sled named elsewhere; not a word in a comment or a string, nor PostgreSQL's.
    let probe = |file: &str, text: &str| {
        let one = BTreeMap::from([(file.to_string(), text.to_string())]);
        sled_faults(&one).len()
    };
    let tx = "fn f(a: &sled::Tree, b: &sled::Tree) { (a, b).transaction(|(a, b)| Ok(())); }";
    assert_eq!(probe("src/store/sled_store/held.rs", tx), 1);
    assert_eq!(
        probe("src/store/sled_store.rs", "use sled::Transactional;"),
        1
    );
    assert_eq!(probe("src/store/sled_store/x.rs", "t.apply_batch(b)?;"), 1);
    assert_eq!(probe("src/registry/x.rs", "let t: sled::Tree;"), 1);
    assert_eq!(
        probe("src/store/pg/x.rs", "let tx = c.transaction().await?;"),
        0
    );
    assert_eq!(
        probe(
            "src/store/sled_store.rs",
            "// no .transaction(\nlet s = \"transaction\";"
        ),
        0
    );
}

/// Whether module `m` is `area` or inside it.
fn under(m: &[String], area: &str) -> bool {
    let area: Vec<&str> = area.split("::").collect();
    m.len() >= area.len() && m.iter().zip(&area).all(|(a, b)| a == b)
}

/// [`under`], where `pattern` ending in `::*` wants strictly inside.
fn matches(m: &[String], pattern: &str) -> bool {
    match pattern.strip_suffix("::*") {
        Some(area) => under(m, area) && m.len() > area.split("::").count(),
        None => under(m, pattern),
    }
}

/// One arrow: `from` names `path`, defined in `to` (files, as `src/…` paths).
struct Arrow {
    from: String,
    to: String,
    path: String,
}

/// The library's files (path → module path) and the arrows between them.
struct House {
    files: BTreeMap<String, Vec<String>>,
    arrows: Vec<Arrow>,
}

impl House {
    fn read() -> House {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut sources: BTreeMap<String, (Vec<String>, String)> = BTreeMap::new();
        let mut todo = vec![(root.join("src/lib.rs"), Vec::<String>::new())];
        while let Some((file, module)) = todo.pop() {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let code = without_tests(&strip(&text));
            assert!(
                !code.contains("#[path"),
                "{}: a #[path] module outside #[cfg(test)]: teach architecture_tests to follow it",
                file.display()
            );
            let tokens = tokens(&code);
            for child in declared_modules(&tokens) {
                let mut m = module.clone();
                m.push(child.clone());
                todo.push((child_file(&file, &child), m));
            }
            let name = file
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            sources.insert(name, (module, code));
        }
        let by_module: BTreeMap<Vec<String>, String> = sources
            .iter()
            .map(|(f, (m, _))| (m.clone(), f.clone()))
            .collect();
        let mut arrows = Vec::new();
        for (file, (module, code)) in &sources {
            let mut seen = BTreeSet::new();
            for path in paths(&tokens(code), module) {
                // The longest prefix that is a file's module.
                let target = (0..=path.len())
                    .rev()
                    .find_map(|n| by_module.get(&path[..n]).map(|f| (f, n)));
                let Some((to, n)) = target else { continue };
                // Itself, or a module naming its own child: no arrow.
                let to_module = &path[..n];
                if to == file || (to_module.len() > module.len() && to_module.starts_with(module)) {
                    continue;
                }
                if seen.insert(to.clone()) {
                    arrows.push(Arrow {
                        from: file.clone(),
                        to: to.clone(),
                        path: format!("crate::{}", path.join("::")),
                    });
                }
            }
        }
        House {
            files: sources.into_iter().map(|(f, (m, _))| (f, m)).collect(),
            arrows,
        }
    }
}

/// The file `mod child;` in `parent` declares.
fn child_file(parent: &Path, child: &str) -> PathBuf {
    let dir = parent.parent().unwrap();
    let stem = parent.file_stem().unwrap().to_string_lossy();
    let base = if stem == "lib" || stem == "mod" {
        dir.to_path_buf()
    } else {
        dir.join(&*stem)
    };
    let flat = base.join(format!("{child}.rs"));
    if flat.exists() {
        flat
    } else {
        base.join(child).join("mod.rs")
    }
}

/// `text` with comments removed and string and char literals emptied (newlines kept).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || c[i] == 'b')
            && !is_ident(at(i.wrapping_sub(1)))
            && raw_string_start(&c, i).is_some()
        {
            let (hashes, body) = raw_string_start(&c, i).unwrap();
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat('#').take(hashes))
                .collect();
            i = body;
            while i < c.len() && !c[i..].starts_with(&close) {
                if c[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if at(i) == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (at(i + 1) == '\\' || (at(i + 2) == '\'' && at(i + 1) != '\'')) {
            // A char literal ('x', '\n', '\''); a lifetime ('a) has no closing quote.
            i += if at(i + 1) == '\\' { 3 } else { 2 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// `(hashes, body start)` of a raw string (`r"`, `r#"`, `br#"`) starting at `i`.
fn raw_string_start(c: &[char], i: usize) -> Option<(usize, usize)> {
    let mut k = i;
    if c.get(k) == Some(&'b') {
        k += 1;
    }
    if c.get(k) != Some(&'r') {
        return None;
    }
    k += 1;
    let mut hashes = 0;
    while c.get(k) == Some(&'#') {
        hashes += 1;
        k += 1;
    }
    (c.get(k) == Some(&'"')).then_some((hashes, k + 1))
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// `code` without the items `#[cfg(test)]` marks (a `mod x;`, a `mod x { … }`, a `use`, a fn).
fn without_tests(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let mut depth = 0i32;
        let mut end = item.len();
        for (k, ch) in item.char_indices() {
            match ch {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokens(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_whitespace() {
            i += 1;
        } else if is_ident(c[i]) {
            let start = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            out.push(Token::Ident(c[start..i].iter().collect()));
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(Token::Punct(c[i]));
            i += 1;
        }
    }
    out
}

/// The modules `mod x;` declares (inline `mod x { … }` stays part of its file).
fn declared_modules(t: &[Token]) -> Vec<String> {
    let mut out = Vec::new();
    for w in t.windows(3) {
        if let [Token::Ident(m), Token::Ident(name), Token::Punct(';')] = w {
            if m == "mod" {
                out.push(name.clone());
            }
        }
    }
    out
}

/// Every absolute module path (without `crate`) the `crate::`/`super::`/`self::` paths in `t`
/// name, from a file whose module is `module`; `use` groups are expanded.
fn paths(t: &[Token], module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for i in 0..t.len() {
        let Token::Ident(head) = &t[i] else { continue };
        if t.get(i + 1) != Some(&Token::PathSep) {
            continue;
        }
        // Only the start of a path (not `a::self::`), and `$crate` counts as `crate`.
        if i > 0 && t[i - 1] == Token::PathSep {
            continue;
        }
        let mut base: Vec<String> = match head.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        let mut k = i + 2;
        while t.get(k) == Some(&Token::Ident("super".into()))
            && t.get(k + 1) == Some(&Token::PathSep)
        {
            base.pop();
            k += 2;
        }
        tree(t, k, base, &mut out);
    }
    out
}

/// Reads one use-tree at `t[k]` under `base`; returns where it ends.
fn tree(t: &[Token], mut k: usize, mut base: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match t.get(k) {
            Some(Token::Ident(name)) if name == "self" => {
                out.push(base);
                return k + 1;
            }
            Some(Token::Ident(name)) => {
                base.push(name.clone());
                k += 1;
                if t.get(k) == Some(&Token::PathSep) {
                    k += 1;
                    continue;
                }
                out.push(base);
                return k;
            }
            Some(Token::Punct('{')) => {
                k += 1;
                loop {
                    match t.get(k) {
                        None => return k,
                        Some(Token::Punct('}')) => return k + 1,
                        Some(Token::Punct(',')) => k += 1,
                        Some(Token::Ident(a)) if a == "as" => k += 2,
                        _ => k = tree(t, k, base.clone(), out),
                    }
                }
            }
            _ => {
                // `*`, or an unexpected token: the module itself.
                out.push(base);
                return k + 1;
            }
        }
    }
}

/// The circles (strongly connected components of more than one node) of `graph`, each sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on_stack.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut c = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(w);
                    c.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if c.len() > 1 {
                    c.sort();
                    self.out.push(c);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// The arrows that tie `circle` (its members are `node(file)`), as `from → path`.
fn ties_of(house: &House, circle: &[String], node: impl Fn(&str) -> Option<String>) -> Vec<String> {
    house
        .arrows
        .iter()
        .filter(|a| {
            let (f, t) = (node(&a.from), node(&a.to));
            f != t
                && f.is_some_and(|f| circle.contains(&f))
                && t.is_some_and(|t| circle.contains(&t))
        })
        .map(|a| format!("{} → {}", a.from, a.path))
        .collect()
}

#[test]
fn the_reader_sees_what_it_should() {
    let code = without_tests(&strip(
        "use crate::a::{b::{self, C}, d as e};\n// crate::comment::X\nlet s = \"crate::string::Y\";\n\
         #[cfg(test)]\nmod tests { use crate::test_only::Z; }\nfn f<'a>(c: char) { let _ = '{'; super::up::V; }\n",
    ));
    let t = tokens(&code);
    let got = paths(&t, &["x".to_string(), "y".to_string()]);
    let want: Vec<Vec<String>> = [
        vec!["a", "b"],
        vec!["a", "b", "C"],
        vec!["a", "d"],
        vec!["x", "up", "V"],
    ]
    .iter()
    .map(|p| p.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(got, want);
}
