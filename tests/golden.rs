//! Golden tests: every directory under `tests/golden/cases/` holds an `input.yaml` and the `args`
//! (one flag per line) of the CLI; `inject` and `explain` run on it and their output must equal the
//! checked-in `inject.yaml` / `inject.err` and `explain.txt`. Successful injections are injected
//! once more and must not change (docs/cli.md's promise for `inject` on its own output).
//!
//! After an intended change: `UPDATE_GOLDEN=1 cargo test --test golden`, then review `git diff`.

use std::fs;
use std::path::{Path, PathBuf};

use clap::Parser;
use sidecar_injector::cli::{self, Cli, Command, OutputFormat};

const CASES: &str = "tests/golden/cases";

fn update() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some()
}

fn args_of(case: &Path) -> Vec<String> {
    fs::read_to_string(case.join("args"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn parse(subcommand: &str, input: &Path, args: &[String], extra: &[&str]) -> Command {
    let mut argv =
        vec!["sidecar-injector".to_owned(), subcommand.to_owned(), "-f".to_owned(), input.display().to_string()];
    argv.extend(args.iter().cloned());
    argv.extend(extra.iter().map(|s| (*s).to_owned()));
    Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}")).command
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
        let input = case.join("input.yaml");
        let args = args_of(case);

        let Command::Inject(inject_args) = parse("inject", &input, &args, &[]) else { unreachable!() };
        match cli::inject(&inject_args) {
            Ok((yaml, warnings)) => {
                failures.extend(check(&case.join("inject.yaml"), &yaml));
                let warnings: String = warnings.iter().map(|w| format!("warning: {w}\n")).collect();
                if warnings.is_empty() {
                    remove_stale(&case.join("inject.err"));
                } else {
                    failures.extend(check(&case.join("inject.err"), &warnings));
                }
                // Injecting the output again changes nothing.
                let again =
                    std::env::temp_dir().join(format!("golden-{}.yaml", case.file_name().unwrap().to_string_lossy()));
                fs::write(&again, &yaml).unwrap();
                let Command::Inject(again_args) = parse("inject", &again, &args, &[]) else { unreachable!() };
                let (second, _) = cli::inject(&again_args).unwrap();
                if second != yaml {
                    failures.push(format!("{}: injecting the output again changed it", case.display()));
                }
            }
            Err(errors) => {
                remove_stale(&case.join("inject.yaml"));
                failures.extend(check(&case.join("inject.err"), &format!("{errors}\n")));
            }
        }

        let Command::Explain { args: explain_args, .. } = parse("explain", &input, &args, &[]) else { unreachable!() };
        match cli::explain(&explain_args, OutputFormat::Text) {
            Ok(text) => failures.extend(check(&case.join("explain.txt"), &text)),
            Err(e) => failures.push(format!("{}: explain failed: {e}", case.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\n(run UPDATE_GOLDEN=1 cargo test --test golden after an intended change)",
        failures.join("\n\n")
    );
}

#[test]
fn explain_json_is_machine_readable() {
    let case = Path::new(CASES).join("selectors");
    let Command::Explain { args, .. } = parse("explain", &case.join("input.yaml"), &args_of(&case), &["-o", "json"])
    else {
        unreachable!()
    };
    let json: serde_json::Value = serde_json::from_str(&cli::explain(&args, OutputFormat::Json).unwrap()).unwrap();
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
