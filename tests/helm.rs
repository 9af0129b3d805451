//! The Helm chart (`charts/sidecar-injector`) installs what `deploy/` installs: rendered with the
//! values of each overlay and component (`charts/sidecar-injector/ci/<name>-values.yaml`), it must
//! give the same objects, field for field, as `kubectl kustomize` of that overlay; only the labels
//! the chart adds to every object may be extra. So a change made to one and not the other fails.
//! `helm lint` passes on every values file. Helm and kubectl (for its kustomize) are built from the
//! Go module proxy (`e2e/tools/build.sh`, `e2e/controlplane/build.sh`); `make helm` passes them in
//! `SIDECAR_INJECTOR_HELM` and `SIDECAR_INJECTOR_KUBECTL`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sidecar_injector::engine::manifest;

const CHART: &str = "charts/sidecar-injector";

/// Labels the chart puts on every object; `deploy/` may lack them, never disagree with them.
const CHART_LABELS: [&str; 6] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

/// (values file, the kustomization it stands for: a directory, or components on top of deploy/).
const CASES: [(&str, &str, &[&str]); 6] = [
    ("default", "deploy", &[]),
    ("cert-manager", "deploy/overlays/cert-manager", &[]),
    ("lean", "deploy/overlays/lean", &[]),
    ("policy", "deploy/overlays/policy", &[]),
    ("no-drift-metrics", "deploy", &["no-drift-metrics"]),
    ("monitoring", "deploy", &["monitoring"]),
];

struct Tools {
    helm: PathBuf,
    kubectl: PathBuf,
}

fn tools() -> Option<Tools> {
    let helm = std::env::var_os("SIDECAR_INJECTOR_HELM").map(PathBuf::from);
    let kubectl = std::env::var_os("SIDECAR_INJECTOR_KUBECTL").map(PathBuf::from);
    match (helm, kubectl) {
        (Some(helm), Some(kubectl)) => Some(Tools { helm, kubectl }),
        _ => {
            eprintln!(
                "SIDECAR_INJECTOR_HELM/SIDECAR_INJECTOR_KUBECTL are not set: `make helm` builds them and runs this"
            );
            None
        }
    }
}

fn run(program: &Path, args: &[&str]) -> Result<String, String> {
    // Helm's cache, config and data in a scratch directory: nothing left in the user's home.
    let home = tempfile::tempdir().unwrap();
    let output = Command::new(program)
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{} {args:?}:\n{stdout}{}", program.display(), String::from_utf8_lossy(&output.stderr)))
    }
}

/// Kinds without a namespace. kustomize's namespace transformer sets one on the admission policies
/// all the same; the API server drops it (as it does for every cluster-scoped object), so both
/// sides are compared without it.
const CLUSTER_SCOPED: [&str; 8] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
];

/// Objects by (kind, namespace, name), as the API server would store them.
fn objects(yaml: &str) -> BTreeMap<(String, String, String), Value> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    manifest::read(yaml)
        .expect("rendered YAML")
        .into_iter()
        .filter(|o| o.is_object())
        .map(|mut o| {
            if CLUSTER_SCOPED.contains(&o["kind"].as_str().unwrap_or_default()) {
                o["metadata"].as_object_mut().map(|m| m.remove("namespace"));
            }
            ((text(&o["kind"]), text(&o["metadata"]["namespace"]), text(&o["metadata"]["name"])), o)
        })
        .collect()
}

/// The first place where `a` and `b` differ, as a path.
fn difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            difference(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"))
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| difference(p, q, &format!("{path}[{i}]")))
        }
        _ if a == b => None,
        _ => Some(format!("{path}: kustomize {a}, chart {b}")),
    }
}

fn kustomize(tools: &Tools, dir: &str, components: &[&str]) -> String {
    if components.is_empty() {
        return run(&tools.kubectl, &["kustomize", dir]).unwrap();
    }
    // kustomize takes only relative paths below its root's parent: a scratch kustomization in target/.
    let scratch = tempfile::Builder::new().prefix("helm-parity-").tempdir_in("target").unwrap();
    let listed: Vec<String> = components.iter().map(|c| format!("../../deploy/components/{c}")).collect();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../../{dir}]\ncomponents: [{}]\n",
        listed.join(", ")
    );
    std::fs::write(scratch.path().join("kustomization.yaml"), kustomization).unwrap();
    run(&tools.kubectl, &["kustomize", scratch.path().to_str().unwrap()]).unwrap()
}

fn render(tools: &Tools, values: &[&str]) -> Result<String, String> {
    let mut args = vec!["template", "sidecar-injector", CHART, "--namespace", "sidecar-injector"];
    for file in values {
        args.extend(["--values", file]);
    }
    run(&tools.helm, &args)
}

#[test]
fn the_chart_installs_what_each_overlay_installs() {
    let Some(tools) = tools() else { return };
    let mut problems = Vec::new();
    for (name, dir, components) in CASES {
        let want = objects(&kustomize(&tools, dir, components));
        let values = format!("{CHART}/ci/{name}-values.yaml");
        let have = objects(&render(&tools, &[&values]).unwrap());
        for key in want.keys().filter(|k| !have.contains_key(*k)) {
            problems.push(format!("{name}: the chart lacks {key:?}"));
        }
        for key in have.keys().filter(|k| !want.contains_key(*k)) {
            problems.push(format!("{name}: the chart adds {key:?}"));
        }
        for (key, kustomized) in &want {
            let Some(charted) = have.get(key) else { continue };
            let mut charted = charted.clone();
            if let Some(labels) = charted["metadata"]["labels"].as_object_mut() {
                labels.retain(|k, _| {
                    !CHART_LABELS.contains(&k.as_str()) || kustomized["metadata"]["labels"].get(k).is_some()
                });
                if labels.is_empty() && kustomized["metadata"].get("labels").is_none() {
                    charted["metadata"].as_object_mut().unwrap().remove("labels");
                }
            }
            if let Some(difference) = difference(kustomized, &charted, "") {
                problems.push(format!("{name}: {key:?}: {difference}"));
            }
        }
        println!("{name}: {} objects, {} from the chart", want.len(), have.len());
    }
    assert!(problems.is_empty(), "the chart and deploy/ differ:\n{}", problems.join("\n"));
}

#[test]
fn helm_lint_passes_with_every_values_file() {
    let Some(tools) = tools() else { return };
    for (name, _, _) in CASES {
        let values = format!("{CHART}/ci/{name}-values.yaml");
        let output =
            run(&tools.helm, &["lint", "--strict", CHART, "--namespace", "sidecar-injector", "--values", &values]);
        assert!(output.is_ok(), "{}", output.unwrap_err());
    }
}

#[test]
fn values_without_an_overlay_do_what_they_say() {
    let Some(tools) = tools() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let values = scratch.path().join("values.yaml");
    std::fs::write(
        &values,
        "image: {repository: registry.example/injector, tag: dev, pullPolicy: Never}\nreplicas: 3\n\
         apiServerClientCA: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n\"\n\
         extraTemplates:\n  audit: \"inject:\\n  labels: {audited: \\\"true\\\"}\\n\"\n\
         extraEnv: [{name: SIDECAR_INJECTOR__TELEMETRY__LOG_LEVEL, value: debug}]\n",
    )
    .unwrap();
    let have = objects(&render(&tools, &[values.to_str().unwrap()]).unwrap());
    let key = |kind: &str, name: &str| (kind.to_owned(), "sidecar-injector".to_owned(), name.to_owned());
    let deployment = &have[&key("Deployment", "sidecar-injector")];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(container["image"], "registry.example/injector:dev");
    assert_eq!(container["imagePullPolicy"], "Never");
    let env: Vec<&str> = container["env"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(
        env.contains(&"SIDECAR_INJECTOR__TLS__CLIENT_CA_FILE")
            && env.contains(&"SIDECAR_INJECTOR__TELEMETRY__LOG_LEVEL"),
        "{env:?}"
    );
    assert!(have[&key("ConfigMap", "sidecar-injector-client-ca")]["data"]["ca.crt"].as_str().unwrap().contains("MIIB"));
    let extra = &have[&key("ConfigMap", "sidecar-templates-extra")];
    assert_eq!(extra["metadata"]["labels"]["sidecar-injector.io/templates"], "true");
    assert!(extra["data"]["audit.yaml"].as_str().unwrap().contains("audited"));
    // The namespace object is Helm's or the user's unless asked for.
    assert!(!have.contains_key(&("Namespace".to_owned(), String::new(), "sidecar-injector".to_owned())));

    let elsewhere = run(&tools.helm, &["template", "x", CHART, "--namespace", "default"]).unwrap_err();
    assert!(elsewhere.contains("install the chart into the namespace sidecar-injector"), "{elsewhere}");
    let bad = scratch.path().join("bad.yaml");
    std::fs::write(&bad, "certificates: {mode: vault}\n").unwrap();
    let refused = render(&tools, &[bad.to_str().unwrap()]).unwrap_err();
    assert!(refused.contains("certificates.mode is \"vault\": selfManaged or certManager"), "{refused}");
}
