//! Golden tests: every directory under `tests/golden/cases/` holds an `input.yaml` and the `args`
//! (one CLI flag per line) it is run with; `inject` and `explain` (`offline`, what the CLI prints)
//! run on it and their output must equal the checked-in `inject.yaml` / `inject.err` and
//! `explain.txt`. Successful injections are injected once more and must not change (docs/cli.md's
//! promise for `inject` on its own output).
//!
//! After an intended change: `make golden` (`UPDATE_GOLDEN=1 cargo test -p sidecar-injector-engine
//! --test golden`), then review `git diff`.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use sidecar_injector_engine::TemplateSet;
use sidecar_injector_engine::offline::{self, Manifests, explain::Format};
use sidecar_injector_engine::templates::set::embedded_sources;

use common::{CaseArgs, case_args};

/// Relative to the engine crate, where cargo runs the tests: messages name the input by this path.
const CASES: &str = "tests/golden/cases";

fn update() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some()
}

/// The case's templates: `--templates DIR`, or the embedded ones as the CLI has them.
fn templates(args: &CaseArgs) -> TemplateSet {
    match args.templates.as_str() {
        "" => {
            let (set, errors) = TemplateSet::load(embedded_sources());
            assert!(errors.is_empty(), "{errors:?}");
            set
        }
        dir => common::load_templates(Path::new(dir)),
    }
}

/// Compares with (or, when updating, writes) a golden file; returns a mismatch description.
fn check(path: &Path, actual: &str) -> Option<String> {
    if update() {
        fs::write(path, actual).unwrap();
        return None;
    }
    let expected = fs::read_to_string(path).unwrap_or_default();
    (expected != actual).then(|| format!("{} differs:\n--- expected\n{expected}\n--- actual\n{actual}", path.display()))
}

fn remove_stale(path: &Path) {
    if update() && path.exists() {
        fs::remove_file(path).unwrap();
    }
}

#[test]
fn golden_cases() {
    let mut cases: Vec<PathBuf> =
        fs::read_dir(CASES).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    cases.sort();
    assert!(cases.len() >= 10, "golden cases are missing");
    let mut failures = Vec::new();
    for case in &cases {
        let args = case_args(case);
        let file = case.join("input.yaml").display().to_string();
        let text = fs::read_to_string(&file).unwrap();
        let input = Manifests { file: &file, text: &text };

        match offline::inject(templates(&args), input, &args.facts) {
            Ok((yaml, warnings)) => {
                failures.extend(check(&case.join("inject.yaml"), &yaml));
                let warnings: String = warnings.iter().map(|w| format!("warning: {w}\n")).collect();
                if warnings.is_empty() {
                    remove_stale(&case.join("inject.err"));
                } else {
                    failures.extend(check(&case.join("inject.err"), &warnings));
                }
                // Injecting the output again changes nothing.
                let again = Manifests { file: "the injected output", text: &yaml };
                let (second, _) = offline::inject(templates(&args), again, &args.facts).unwrap();
                if second != yaml {
                    failures.push(format!("{}: injecting the output again changed it", case.display()));
                }
            }
            Err(errors) => {
                remove_stale(&case.join("inject.yaml"));
                failures.extend(check(&case.join("inject.err"), &format!("{}\n", errors.join("\n"))));
            }
        }

        match offline::explain::explain(templates(&args), input, &args.facts, Format::Text) {
            Ok(text) => failures.extend(check(&case.join("explain.txt"), &text)),
            Err(e) => failures.push(format!("{}: explain failed: {e}", case.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\n(run `make golden` after an intended change, then review the diff)",
        failures.join("\n\n")
    );
}

#[test]
fn explain_json_is_machine_readable() {
    let case = Path::new(CASES).join("selectors");
    let args = case_args(&case);
    let file = case.join("input.yaml").display().to_string();
    let text = fs::read_to_string(&file).unwrap();
    let json =
        offline::explain::explain(templates(&args), Manifests { file: &file, text: &text }, &args.facts, Format::Json);
    let json: serde_json::Value = serde_json::from_str(&json.unwrap()).unwrap();
    let pods = json.as_array().unwrap();
    assert_eq!(pods.len(), 3);
    assert_eq!(pods[0]["result"], "inject");
    assert_eq!(pods[0]["templates"]["source"], "namespaceAnnotation");
    let verdicts = &pods[1]["templates"]["verdicts"];
    assert_eq!(verdicts[0]["name"], "mesh");
    assert_eq!(verdicts[0]["result"], "podSelectorMismatch");
    assert_eq!(verdicts[1]["result"], "namespaceSelectorMismatch");
    assert_eq!(pods[1]["status"]["templates"][0]["name"], "logs");
}

/// Every directory of templates the repository keeps: the shipped ones (`templates/`, embedded),
/// the golden sets and cases', and the upgrade fixture's.
fn template_sets() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries.into_iter().filter(|p| p.is_dir()) {
            let name = path.file_name().unwrap().to_string_lossy();
            let has_yaml =
                fs::read_dir(&path).unwrap().any(|e| e.unwrap().path().extension().is_some_and(|x| x == "yaml"));
            if (name == "templates"
                || name.ends_with("-templates")
                || path.parent().is_some_and(|p| p.ends_with("upgrade/templates")))
                && has_yaml
            {
                out.push(path.clone());
            }
            walk(&path, out);
        }
    }
    let mut sets = vec![PathBuf::from("../../templates")];
    walk(Path::new("tests"), &mut sets);
    sets
}

/// The policy mode's output (`emit::policy::compile`: the MutatingAdmissionPolicy, its binding and
/// the templates left to the webhook) for every template set in the repository, on clusters that
/// run native sidecars and on those that do not, against `tests/golden/policies/`: a change to the
/// engine that was meant to keep behaviour keeps the policies byte for byte.
#[test]
fn golden_policies() {
    use sidecar_injector_engine::emit::policy;
    let sets = template_sets();
    assert!(sets.len() >= 10, "template sets are missing: {sets:?}");
    let dir = Path::new("tests/golden/policies");
    fs::create_dir_all(dir).unwrap();
    let mut failures = Vec::new();
    let mut written = Vec::new();
    for set in &sets {
        let templates = common::load_templates(set);
        let mut out = String::new();
        for native in [true, false] {
            let compiled = policy::compile(&templates, native, &["sidecar-injector".to_owned()]);
            out.push_str(&format!("# native sidecars: {native}; injects {:?}\n", compiled.compiled));
            for (template, reason) in &compiled.webhook_only {
                out.push_str(&format!("# webhook-only: {template}: {reason}\n"));
            }
            for document in [&compiled.policy, &compiled.binding] {
                out.push_str(&serde_json::to_string_pretty(document).unwrap());
                out.push('\n');
            }
        }
        let name =
            set.display().to_string().trim_start_matches("../../").trim_start_matches("tests/").replace('/', "_");
        let file = dir.join(format!("{name}.txt"));
        failures.extend(check(&file, &out));
        written.push(file);
    }
    let stale: Vec<PathBuf> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| !written.contains(p)).collect();
    assert!(stale.is_empty(), "golden policies of no template set: {stale:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
