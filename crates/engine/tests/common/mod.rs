//! What the golden and upgrade tests share: a case's `args` file (the CLI flags the case is run
//! with, one `--flag=value` per line) read as the offline commands' inputs, and a directory of
//! templates loaded as the CLI loads it.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use sidecar_injector_engine::offline::{OfflineFacts, node_pool, parse_key_values};
use sidecar_injector_engine::templates::rollout::Kept;
use sidecar_injector_engine::templates::set::InProcess;
use sidecar_injector_engine::{ClusterFacts, TemplateSet, TemplateSource};

/// A case's flags: its templates (the `--templates` value, resolved by each test) and the facts.
pub struct CaseArgs {
    pub templates: String,
    pub facts: OfflineFacts,
}

/// Reads `<case>/args`. Paths in it (`--nodes`) are relative to the engine crate, where cargo runs
/// the tests. A flag the offline commands do not have fails the test.
pub fn case_args(case: &Path) -> CaseArgs {
    let mut args = CaseArgs {
        templates: String::new(),
        facts: OfflineFacts { namespace: "default".into(), ..Default::default() },
    };
    let text = fs::read_to_string(case.join("args")).unwrap_or_default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (flag, value) =
            line.split_once('=').unwrap_or_else(|| panic!("{}: {line}: not --flag=value", case.display()));
        let key_values = || Some(parse_key_values(value).unwrap_or_else(|e| panic!("{}: {e}", case.display())));
        match flag {
            "--templates" => args.templates = value.to_owned(),
            "--namespace" => args.facts.namespace = value.to_owned(),
            "--namespace-labels" => args.facts.namespace_labels = key_values(),
            "--namespace-annotations" => args.facts.namespace_annotations = key_values(),
            "--kube-version" => args.facts.cluster = ClusterFacts::from_version_string(value).expect("a version"),
            "--nodes" => {
                let text = fs::read_to_string(value).unwrap_or_else(|e| panic!("{value}: {e}"));
                args.facts.nodes = Some(Arc::new(node_pool(value, &text).unwrap()));
            }
            other => panic!("{}: flag {other} is not one of the offline commands'", case.display()),
        }
    }
    args
}

/// The `*.yaml` templates of a directory, named by file stem, loaded in name order; any error
/// fails the test.
pub fn load_templates(dir: &Path) -> TemplateSet {
    let mut sources: Vec<TemplateSource> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .map(|path| TemplateSource {
            name: path.file_stem().unwrap().to_string_lossy().into_owned(),
            text: fs::read_to_string(&path).unwrap(),
        })
        .collect();
    sources.sort_by(|a, b| a.name.cmp(&b.name));
    // `kept/`: the kept ConfigMap's data, a file per key (as the CLI reads it).
    let kept_dir = dir.join("kept");
    let data: BTreeMap<String, String> = match kept_dir.is_dir() {
        true => fs::read_dir(&kept_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|path| (path.file_name().unwrap().to_string_lossy().into_owned(), fs::read_to_string(&path).unwrap()))
            .collect(),
        false => BTreeMap::new(),
    };
    let (kept, kept_errors) = Kept::from_data(&data);
    assert!(kept_errors.is_empty(), "{}: {kept_errors:?}", kept_dir.display());
    let (set, errors) = TemplateSet::default().update_with_kept(sources, &kept, &InProcess);
    assert!(errors.is_empty(), "{}: {errors:?}", dir.display());
    set
}
