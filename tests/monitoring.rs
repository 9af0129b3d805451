//! The monitoring component (`deploy/components/monitoring`) is tested like code: every alert of
//! the PrometheusRule fires and stays silent on the synthetic series of `rules.test.yaml`, run by
//! `promtool test rules` (promtool is built from the Go module proxy by `e2e/tools/build.sh`;
//! `make monitoring` passes it in `SIDECAR_INJECTOR_PROMTOOL`), and every injector metric a rule or
//! a dashboard panel uses is one the injector exports, so a renamed metric breaks the build. The
//! API server's metrics they use are checked against a real API server by the e2e suite.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sidecar_injector::engine::manifest;

mod common;

const COMPONENT: &str = "deploy/components/monitoring";

fn read_yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    manifest::read(&text).unwrap_or_else(|e| panic!("{path}: {e}")).remove(0)
}

/// Every alerting rule: name → the rule.
fn alerts() -> BTreeMap<String, Value> {
    let rule = read_yaml(&format!("{COMPONENT}/prometheusrule.yaml"));
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| (r["alert"].as_str().expect("alerting rules only").to_owned(), r))
        .collect()
}

/// `{{ $labels.x }}` replaced by the labels' values.
fn expand(template: &str, labels: &serde_json::Map<String, Value>) -> String {
    let mut text = template.to_owned();
    for (key, value) in labels {
        text = text.replace(&format!("{{{{ $labels.{key} }}}}"), value.as_str().unwrap_or_default());
    }
    assert!(!text.contains("{{"), "write exp_annotations by hand for a template beyond $labels: {template}");
    text
}

#[test]
fn every_injector_metric_the_rules_and_dashboard_use_is_exported() {
    let exported = common::metrics::series_names();
    let mut unknown = Vec::new();
    let mut used = 0;
    for (whose, expression) in common::metrics::monitoring_expressions() {
        for name in common::metrics::used_in(&expression, "sidecar_injector_") {
            used += 1;
            if !exported.contains(&name) {
                unknown.push(format!("{whose}: {name}"));
            }
        }
    }
    assert!(used > 20, "only {used} uses found");
    assert!(unknown.is_empty(), "metrics the injector does not export: {unknown:?}\nexported: {exported:?}");
}

#[test]
fn the_metric_name_scanner_finds_names_and_only_names() {
    let expression = r#"rate(sidecar_injector_x_total{a="sidecar_injector_not"}[5m]) / my_sidecar_injector_y"#;
    assert_eq!(
        common::metrics::used_in(expression, "sidecar_injector_"),
        vec!["sidecar_injector_x_total", "sidecar_injector_not"]
    );
}

#[test]
fn every_alert_fires_and_stays_silent_as_its_promtool_tests_say() {
    let Some(promtool) = std::env::var_os("SIDECAR_INJECTOR_PROMTOOL").map(PathBuf::from) else {
        eprintln!("SIDECAR_INJECTOR_PROMTOOL is not set: `make monitoring` builds promtool and runs this");
        return;
    };
    let alerts = alerts();
    let dir = tempfile::tempdir().unwrap();
    let rule = read_yaml(&format!("{COMPONENT}/prometheusrule.yaml"));
    std::fs::write(dir.path().join("rules.yaml"), rule["spec"].to_string()).unwrap();

    let mut tests = read_yaml(&format!("{COMPONENT}/rules.test.yaml"));
    let (mut firing, mut silent): (BTreeMap<String, usize>, BTreeMap<String, usize>) = Default::default();
    for test in tests["tests"].as_array_mut().unwrap() {
        for case in test["alert_rule_test"].as_array_mut().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_owned();
            let rule = alerts.get(&name).unwrap_or_else(|| panic!("rules.test.yaml tests unknown alert {name}"));
            let expected = case["exp_alerts"].as_array_mut().unwrap();
            *(if expected.is_empty() { &mut silent } else { &mut firing }).entry(name).or_default() += 1;
            for alert in expected {
                if alert.get("exp_annotations").is_none() {
                    let labels = alert["exp_labels"].as_object().cloned().unwrap_or_default();
                    let annotations: serde_json::Map<String, Value> = rule["annotations"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), json!(expand(v.as_str().unwrap(), &labels))))
                        .collect();
                    alert["exp_annotations"] = Value::Object(annotations);
                }
            }
        }
    }
    let untested: Vec<&String> =
        alerts.keys().filter(|a| !firing.contains_key(*a) || !silent.contains_key(*a)).collect();
    assert!(untested.is_empty(), "alerts without a firing and a silent case: {untested:?}");
    let test_file = dir.path().join("rules.test.yaml");
    std::fs::write(&test_file, tests.to_string()).unwrap();

    let run = |args: &[&str], file: &Path| {
        let output = Command::new(&promtool).args(args).arg(file).output().expect("running promtool");
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "promtool {args:?}:\n{text}");
        text
    };
    run(&["check", "rules"], &dir.path().join("rules.yaml"));
    let text = run(&["test", "rules"], &test_file);
    println!("{text}");
    println!(
        "{} alerts, each with a firing and a silent case ({} cases)",
        alerts.len(),
        firing.values().sum::<usize>() + silent.values().sum::<usize>()
    );
}
