//! The template sandbox with the real child process (this crate's binary): what a templates
//! ConfigMap holding hostile templates does at start-up and on hot reload (`TemplateSet::update`
//! with the sandbox as the pre-check, exactly as the webhook calls it), and `serve --templates` on a
//! directory holding one.

use std::time::{Duration, Instant};

use sidecar_injector::engine::templates::set::{PreCheck, TemplateSet, TemplateSource};
use sidecar_injector::sandbox::{DEADLINE, Sandbox};

const BOMB: &str = "inject:\n  annotations:\n    a: \"{% set x = 'x' * 100000000 ~ 'x' * 50000000 %}{{ x|length }}\"\n";
/// Dies on memory (20 MB strings, upper-cased 120 times).
const MEMORY_HOG: &str = "inject:\n  annotations:\n    a: \"{% set x = 'x' * 20000000 %}{% for i in range(120) %}{{ (x|upper)|length }}{% endfor %}\"\n";
/// Dies on CPU time: 5,000 passes over a 5 MB string, memory flat, within the fuel.
const CPU_HOG: &str = "inject:\n  annotations:\n    a: \"{% set x = 'x' * 5000000 %}{% for i in range(5000) %}{{ (x|upper)|length }}{% endfor %}\"\n";
const GOOD: &str = "inject:\n  labels:\n    team: \"{{ namespace.name }}\"\n";
const TYPO: &str = "inject:\n  labels:\n    team: \"{{ namespace.nam }}\"\n";

fn source(name: &str, text: &str) -> TemplateSource {
    TemplateSource { name: name.into(), text: text.into() }
}

fn sandbox() -> Sandbox {
    Sandbox::new(env!("CARGO_BIN_EXE_sidecar-injector").into())
}

#[test]
fn hostile_templates_are_refused_by_name_and_the_others_serve() {
    let sources = vec![
        source("first", GOOD),
        source("bomb", BOMB),
        source("middle", GOOD),
        source("hog", MEMORY_HOG),
        source("typo", TYPO),
        source("last", GOOD),
    ];
    let started = Instant::now();
    let (set, errors) = TemplateSet::default().update(sources, &sandbox());
    let took = started.elapsed();
    let served: Vec<&str> = set.names().collect();
    assert_eq!(served, ["first", "last", "middle"], "{errors:?}");
    let by_name =
        |name: &str| errors.iter().find(|e| e.template == name).map(|e| e.message.clone()).unwrap_or_default();
    assert!(by_name("bomb").contains("exceeded the sandbox limits (96 MiB of memory"), "{errors:?}");
    assert!(by_name("hog").contains("sandbox limits") || by_name("hog").contains("did not finish"), "{errors:?}");
    assert!(by_name("typo").contains("undefined value in \"{{ namespace.nam }}\""), "{errors:?}");
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(took < DEADLINE + Duration::from_secs(1), "the check took {took:?}");
    println!("6 templates (1 memory bomb, 1 memory hog, 1 typo) checked in {} ms", took.as_millis());
}

#[test]
fn a_reload_with_a_bomb_keeps_the_last_good_version() {
    let (set, errors) = TemplateSet::default().update([source("logs", GOOD)], &sandbox());
    assert!(errors.is_empty());
    let good_hash = set.get("logs").unwrap().hash.clone();
    let (set, errors) = set.update([source("logs", BOMB)], &sandbox());
    assert_eq!(set.get("logs").unwrap().hash, good_hash, "the last good version stays in service");
    assert_eq!(errors.len(), 1);
}

#[test]
fn a_check_never_outlives_its_deadline() {
    // Eight CPU hogs: each child is stopped at the CPU limit (2 s); after the deadline (8 s) the
    // rest are refused as not checked, so the guard answers within its webhook timeout.
    let sources: Vec<TemplateSource> = (0..8).map(|i| source(&format!("hog-{i}"), CPU_HOG)).collect();
    let started = Instant::now();
    let errors = sandbox().precheck(&sources);
    let took = started.elapsed();
    assert!(took < DEADLINE + Duration::from_secs(1), "took {took:?}");
    assert_eq!(errors.len(), 8, "every hog is refused: {errors:?}");
    assert!(errors[0].message.contains("sandbox limits") || errors[0].message.contains("did not finish"), "{errors:?}");
    assert!(errors.last().unwrap().message.contains("ran out of time"), "{errors:?}");
    println!("8 CPU hogs: refused in {} ms", took.as_millis());
}

#[test]
fn serve_refuses_a_bomb_in_its_template_directory_by_name_instead_of_dying() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.yaml"), GOOD).unwrap();
    std::fs::write(dir.path().join("bomb.yaml"), BOMB).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .args(["serve", "--templates"])
        .arg(dir.path())
        .env("SIDECAR_INJECTOR__CLUSTER__MODE", "off")
        .env("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", "0")
        .env("SIDECAR_INJECTOR__SERVER__HTTP_PORT", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("template \"bomb\"") && stderr.contains("sandbox limits"), "{stderr}");
}
