//! Differential test of the manifest reader and writer against kubectl's own reader.
//!
//! `e2e/bin/yamlread` (built by `e2e/controlplane/build.sh` from `k8s.io/apimachinery`'s
//! `YAMLOrJSONDecoder` and `sigs.k8s.io/yaml`, the code `kubectl apply -f` reads manifests with)
//! prints what kubectl reads from a stream. For every input of a corpus (the repo's examples,
//! golden inputs and deploy manifests, generated documents full of YAML 1.1 scalars, tabs, unicode,
//! anchors, merges and duplicate keys, and the stream shapes of [`SHAPES`]) this asserts:
//! 1. `manifest::read(input)` is what kubectl reads;
//! 2. kubectl reads `manifest::write` of it back unchanged;
//! 3. kubectl reads the output of `inject` as kubectl's reading of the input plus exactly the
//!    engine's patch for each pod.
//!
//! Run by `make test` (target `kubectl-yaml`), which builds the reader first. A plain `cargo test`
//! says how to run it and passes, like the e2e suite.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use sidecar_injector::cli::{self, Cli};
use sidecar_injector::engine::{Engine, Outcome, PodRequest, manifest, names, templates::set, workload};

fn yamlread() -> Option<PathBuf> {
    std::env::var_os("SIDECAR_INJECTOR_YAMLREAD").map(PathBuf::from)
}

/// kubectl's reading of `text`, or its error message.
fn kubectl_read(reader: &Path, text: &str) -> Result<Vec<Value>, String> {
    let mut child = Command::new(reader)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (build it with e2e/controlplane/build.sh)", reader.display()));
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok(serde_json::from_slice(&output.stdout).expect("yamlread prints JSON"))
}

/// JSON equality with numbers compared by value (Go prints whole floats as integers).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Scalars whose reading differs between YAML versions or readers.
const SCALARS: &[&str] = &[
    "0400",
    "0644",
    "0o17",
    "0O17",
    "0x1F",
    "0X1f",
    "0b101",
    "-0b101",
    "+12",
    "-0",
    "00",
    "08",
    "09.5",
    "1_000",
    "1__0",
    "_1",
    "1_000.5",
    "1.",
    ".5",
    "-.5",
    "1e3",
    "1E3",
    "1e-7",
    "1.5e300",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "y",
    "Y",
    "n",
    "N",
    "yes",
    "Yes",
    "YES",
    "yEs",
    "no",
    "on",
    "On",
    "ON",
    "oN",
    "off",
    "true",
    "True",
    "TRUE",
    "tRUE",
    "false",
    "~",
    "null",
    "Null",
    "NULL",
    "nULL",
    "2001-12-14",
    "2001-12-14T21:59:43.10-05:00",
    "2001-13-45",
    "12:30:00",
    "190:20:30",
    "1.2.3",
    "0x",
    "0b",
    "+",
    "a:b",
    "nginx:1.25",
    "=",
    "<<x",
    "!!str 0400",
    "!!int '12'",
    "!!float 1",
    "!!bool yes",
    "!custom x",
    "'0400'",
    "\"0x1F\"",
    "'yes'",
    "\"\\t tab\"",
    "\"\\u2028 ls\"",
    "\"caf\\u00e9 ✓\"",
    "\"\\x41\"",
    "\"a\\\\b\"",
    "\"line\\nnext\"",
    "\"\\ttab first\\nsecond\"",
    "é",
];

/// Plain scalars that end in `:` or hold ` :`, which go-yaml keeps whole inside `[...]` and
/// `{...}` where YAML 1.2 ends them at the colon (addresses, flags that end in `::`).
const FLOW_SCALARS: &[&str] = &["--listen-addr=::", "001:db8::", "fe80::1:", "a:", "a::", "x:y:", "a :", "a:b"];

/// Generated documents: every scalar as a value, a key, a list item and an env var; anchors,
/// merges and duplicate keys; strings that are hard to write back (tabs, unicode, block text).
fn generated() -> String {
    let mut text = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: scalars}\ndata:\n");
    for (i, s) in SCALARS.iter().enumerate() {
        text.push_str(&format!("  k{i}: {s}\n"));
    }
    text.push_str("---\napiVersion: v1\nkind: List\nitems:\n");
    for s in SCALARS.iter().filter(|s| !s.starts_with('!')) {
        text.push_str(&format!("- {s}\n"));
    }
    text.push_str("---\nkeys:\n");
    // Keys kubectl refuses (null, beyond int64) are left out: the refusal is a unit test.
    let refused = ["~", "null", "Null", "NULL", "9223372036854775808", "18446744073709551615"];
    for s in SCALARS.iter().filter(|s| !s.starts_with('!') && !refused.contains(s)) {
        text.push_str(&format!("  {s}: v\n"));
    }
    // Every scalar (and the ones only flow collections read differently) in `[...]` and `{...}`.
    let flow: Vec<&str> =
        SCALARS.iter().chain(FLOW_SCALARS).copied().filter(|s| !s.starts_with('!') && !s.contains('\\')).collect();
    text.push_str(&format!("---\nflow:\n  list: [{}]\n  map: {{", flow.join(", ")));
    for (i, s) in flow.iter().enumerate() {
        text.push_str(&format!("{}k{i}: {s}", if i == 0 { "" } else { ", " }));
    }
    text.push_str("}\n  keys: {");
    for (i, s) in FLOW_SCALARS.iter().enumerate() {
        text.push_str(&format!("{}{s}: {i}", if i == 0 { "" } else { ", " }));
    }
    text.push_str("}\n");
    text.push_str(concat!(
        "---\n",
        "apiVersion: v1\nkind: Pod\n",
        "metadata:\n  name: odd\n  labels: {app: web, app: api}\n  annotations: {a: '1', a: '2', note: \"\\ttab\\nsecond\"}\n",
        "base: &base {image: nginx, imagePullPolicy: IfNotPresent}\n",
        "spec:\n",
        "  containers:\n",
        "  - <<: *base\n    name: web\n    args: [\"\\tx\\ny\", '  lead', \"trail \", \"a: b\", \"# not a comment\", \"- x\", \"*x\", \"&x\", \"{x}\", \"é ✓\", \"\\u0085nel\", \"\\ufeffbom\"]\n",
        "    env:\n    - {name: OCTAL, value: '0400'}\n    - {name: \"YES\", value: \"yes\"}\n",
        "    command:\n    - |\n      #!/bin/sh\n      echo \"multi\n        line\"\n\n    - >\n      folded\n      text\n",
        "  volumes:\n  - name: s\n    secret: {secretName: s, defaultMode: 0400}\n  - name: c\n    configMap: {name: c, defaultMode: 0644, items: [{key: k, path: p, mode: 0o600}]}\n",
        "  terminationGracePeriodSeconds: 1_000\n",
        "  priority: 1.0\n",
        "---\n# only a comment\n---\n",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
        "spec:\n  replicas: 0x2\n  template:\n    metadata: {labels: {app: d, on: \"yes\"}}\n",
        "    spec:\n      containers: [{name: app, image: app, ports: [{containerPort: 0x1F90}]}]\n",
    ));
    text
}

/// Stream shapes where kubectl's reader is not a YAML stream reader (the corpus issue's five, and
/// their neighbours): it splits documents on `---` lines only and reads the first YAML document of
/// each, refuses anything but a comment after `---`, decodes `!!binary`, and reads a stream that
/// starts with `{` as JSON values one after another.
const SHAPES: &[(&str, &str)] = &[
    ("a document after a ... end marker", "a: 1\n...\nb: 2\n"),
    ("... then a separator", "a: 1\n...\n---\nb: 2\n"),
    ("!!binary", "v: !!binary aGVsbG8=\nargs: [!!binary d29ybGQ=]\n"),
    ("!!binary over lines", "v: !!binary |\n  aGVs\n  bG8=\n"),
    ("!!binary, not UTF-8", "v: !!binary /w==\n"),
    ("!!binary, not base64", "v: !!binary 'not base64'\n"),
    ("an inline document on the separator line", "--- {inline: document}\n"),
    ("a comment on the separator line", "a: 1\n--- # next\nb: 2\n"),
    ("a %YAML directive", "%YAML 1.1\n---\na: 1\n"),
    ("a line of four dashes", "a: 1\n----\nb: 2\n"),
    ("JSON objects one after another", "{\"a\": 1}\n{\"b\": [1, 2.5, \"x\"]}{\"c\": null}\n"),
    ("JSON after white space", "\n  \t{\"kind\": \"Pod\", \"metadata\": {\"name\": \"p\"}}\n"),
    ("JSON with // comments", "{\n  // \"context\"\n  \"a\": 1\n}\n"),
    ("JSON with a trailing comma", "{\"a\": 1,}\n"),
    ("JSON after a comment is YAML", "# c\n{\"a\": 1}\n"),
    ("a JSON list is YAML", "[{\"a\": 1}]\n"),
    ("one JSON value, then YAML", "{\"a\": 1}\n{\"b\": 1,}\n---\nc: 1\n"),
    ("two JSON values, then not JSON", "{\"a\": 1}{\"b\": 2}\n{\"c\": 3,}\n"),
    ("a key of a flow mapping over two lines", "# x\n{a\n b: 1}\n"),
    ("an explicit key of a flow mapping over two lines", "# x\n{? a\n b: 1}\n"),
    ("a flow sequence item over two lines", "# x\n[a\n \"b\"]\n"),
    ("flags and addresses ending in : in a flow list", "args: [--bind, --listen-addr=::]\nips: [1.2.3.4, 001:db8::]\n"),
    ("values ending in : in a flow mapping", "a: {k: v:, j: w::, l:}\n"),
    ("a key ending in : in a flow list", "a: [a: b:, x :]\n"),
    ("a plain value that starts with : in a flow list", "a: [::1]\n"),
    ("a flow value that starts with :", "a: {k: :v}\n"),
    ("a colon before a flow collection", "a: [a:[b]]\n"),
    ("an empty key in a flow list", "a: [a, :]\n"),
    ("an empty key in a flow mapping", "a: {: v}\n"),
    ("a ? in a flow list's plain value", "args: [--url=http://x/?a=b]\n"),
    ("a ? in a flow mapping's plain value", "a: {k: a?b}\n"),
    ("a lone ? in a flow list", "a: [a, ?]\n"),
    (
        "explicit keys in flow collections, ? in quotes and block values",
        "a: [? a]\nb: {? c: d}\ne: [\"f?\", 'g?h']\ni: j?k\n",
    ),
    (
        "colons before indicators in quotes, block text and comments",
        "a: [\"x:]\", 'y:,']\nb: |\n  [c:]\nc: d:,e # [f:]\n",
    ),
];

fn corpus() -> Vec<(String, String)> {
    let mut files = vec![("generated".to_owned(), generated())];
    files.extend(SHAPES.iter().map(|(name, text)| (format!("shape: {name}"), (*text).to_owned())));
    let mut paths: Vec<PathBuf> = Vec::new();
    for dir in ["examples", "crates/engine/tests/golden/cases", "deploy"] {
        let mut stack = vec![PathBuf::from(dir)];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            } else if path.extension().is_some_and(|e| e == "yaml") {
                paths.push(path);
            }
        }
    }
    paths.sort();
    files.extend(paths.into_iter().map(|p| (p.display().to_string(), std::fs::read_to_string(&p).unwrap())));
    files
}

/// The file `inject` reads in the test, removed when the test ends, failed or not.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The documents kubectl would apply: lists (`List` and every `<Kind>List`) flattened, nested too.
fn flatten<'a>(document: &'a mut Value, out: &mut Vec<&'a mut Value>) {
    if workload::is_list(document) {
        for item in document.get_mut("items").and_then(Value::as_array_mut).into_iter().flatten() {
            flatten(item, out);
        }
    } else {
        out.push(document);
    }
}

#[test]
fn manifests_read_and_write_exactly_as_kubectl_reads_them() {
    let Some(reader) = yamlread() else {
        eprintln!("kubectl_yaml: not run (run `make kubectl-yaml`, which builds kubectl's reader first)");
        return;
    };
    // As `inject` does: the embedded templates, never the injector's own namespace.
    let engine =
        Engine::new(set::TemplateSet::load(set::embedded_sources()).0, vec![names::INJECTOR_NAMESPACE.to_owned()]);
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut generated_checked = false;
    let scratch = Scratch(std::env::temp_dir().join(format!("kubectl-yaml-{}.yaml", std::process::id())));
    for (name, text) in corpus() {
        let theirs = match kubectl_read(&reader, &text) {
            Ok(docs) => docs,
            Err(e) => {
                // kubectl refuses it: so must we (and the generated corpus must be valid).
                if name == "generated" {
                    failures.push(format!("{name}: kubectl refuses the generated corpus: {e}"));
                } else if manifest::read(&text).is_ok() {
                    failures.push(format!("{name}: kubectl refuses it ({e}) but we read it"));
                }
                continue;
            }
        };
        let ours = match manifest::read(&text) {
            Ok(docs) => docs,
            Err(e) => {
                failures.push(format!("{name}: kubectl reads it, we refuse it: {e}"));
                continue;
            }
        };
        if !same(&json!(ours), &json!(theirs)) {
            let diff = ours.iter().zip(&theirs).position(|(a, b)| !same(a, b));
            failures.push(format!(
                "{name}: read differently (document {diff:?}):\n ours:    {}\n kubectl: {}",
                json!(diff.map(|d| &ours[d])),
                json!(diff.map(|d| &theirs[d]))
            ));
            continue;
        }
        let written = manifest::write(&ours);
        match kubectl_read(&reader, &written) {
            Ok(back) if same(&json!(back), &json!(theirs)) => {}
            Ok(_) => failures.push(format!("{name}: kubectl reads our output differently:\n{written}")),
            Err(e) => failures.push(format!("{name}: kubectl cannot read our output ({e}):\n{written}")),
        }

        // inject: kubectl's reading of the output is kubectl's reading of the input plus the patches.
        let file = &scratch.0;
        std::fs::write(file, &text).unwrap();
        let argv = ["sidecar-injector", "inject", "-f", file.to_str().unwrap(), "--namespace", "shop"];
        let cli::Command::Inject(args) = <Cli as clap::Parser>::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let output = match cli::inject(&args) {
            Ok((output, _)) => output,
            Err(e) if name == "generated" => {
                failures.push(format!("{name}: inject refuses the generated corpus: {e}"));
                continue;
            }
            Err(_) => continue,
        };
        let mut expected = theirs.clone();
        let mut pods = Vec::new();
        for document in expected.iter_mut() {
            flatten(document, &mut pods);
        }
        for document in pods {
            let Some(pod) = workload::pod_of(document) else { continue };
            let namespace = workload::namespace_of(document).unwrap_or("shop").to_owned();
            let request = PodRequest {
                pod: Arc::new(pod.clone()),
                namespace: args.facts().namespace_facts(&namespace),
                cluster: args.facts().cluster,
                workload: workload::Workload::of_document(document),
            };
            if let Outcome::Inject(injection) = engine.evaluate(&request).outcome {
                let mut pod = pod;
                json_patch::patch(&mut pod, &injection.patch).unwrap();
                workload::set_pod(document, pod);
            }
        }
        match kubectl_read(&reader, &output) {
            Ok(back) if same(&json!(back), &json!(expected)) => {
                checked += 1;
                generated_checked |= name == "generated";
            }
            Ok(back) => failures.push(format!(
                "{name}: inject output is not the input plus the injection:\n ours:     {}\n expected: {}",
                json!(back),
                json!(expected)
            )),
            Err(e) => failures.push(format!("{name}: kubectl cannot read the inject output ({e})")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(checked >= 15, "only {checked} inputs were compared");
    assert!(generated_checked, "the generated corpus was not compared end to end");
    eprintln!("kubectl_yaml: {checked} inputs read, written and injected exactly as kubectl reads them");
}
