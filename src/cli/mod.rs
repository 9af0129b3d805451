//! The command line: argument definitions and the offline commands (`inject`, `explain`,
//! `check-templates`). These read files, call the engine and print; every decision is the engine's.

mod check;
pub mod cluster;
mod policies;
pub mod serve;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::engine::injection::nodes::NodePool;
use crate::engine::offline::{self, Manifests, OfflineFacts, explain::Format, parse_key_values};
use crate::engine::templates::rollout::Kept;
use crate::engine::templates::set::PreCheck;
use crate::engine::templates::set::embedded_sources;
use crate::engine::{ClusterFacts, TemplateError, TemplateSet, TemplateSource};

pub use check::check_templates;
pub use policies::compile_policies;

/// sidecar-injector: injects sidecars into Kubernetes pods from templates.
#[derive(Debug, Parser)]
#[command(name = "sidecar-injector", version, about, propagate_version = true)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the admission webhook (HTTPS /mutate and /validate; HTTP /healthz, /readyz, /metrics).
    Serve {
        /// YAML settings file (see docs/settings.md for every setting); environment variables
        /// SIDECAR_INJECTOR__SECTION__KEY override it.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Templates to serve when there is no cluster (default: the embedded ones).
        #[arg(long, value_name = "DIR")]
        templates: Option<PathBuf>,
    },
    /// Inject into the pods of YAML manifests and print the result (like `istioctl kube-inject`).
    Inject(OfflineArgs),
    /// Say for each pod whether it would be injected, with which templates, and why. With
    /// --cluster, for a live namespace, pod or workload (TARGET: pod/NAME, deployment/NAME, ...).
    Explain {
        /// The manifests to read, and the cluster facts to assume.
        #[command(flatten)]
        args: OfflineArgs,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
        /// Ask the cluster (kubeconfig or in-cluster): the namespace, the webhook configuration, the
        /// live templates; --namespace names the namespace.
        #[arg(long, conflicts_with = "file")]
        cluster: bool,
        /// With --cluster: pod/NAME, deployment/NAME, statefulset/NAME, daemonset/NAME,
        /// replicaset/NAME, job/NAME or cronjob/NAME (default: a new pod in the namespace).
        #[arg(requires = "cluster")]
        target: Option<String>,
        /// With --cluster: where the injector runs (its namespace and webhook).
        #[command(flatten)]
        injector: cluster::InjectorRef,
    },
    /// List pods injected with template versions that changed, or never injected although they
    /// should have been, by workload; --restart rolls their workloads one at a time.
    Drift(cluster::DriftArgs),
    /// (internal) The template sandbox's child process: loads templates given on stdin.
    #[command(hide = true)]
    SandboxCheck,
    /// Print the MutatingAdmissionPolicy and binding compiled from the templates (the policy
    /// mode, for applying them yourself), with the templates left to the webhook and why.
    CompilePolicies {
        /// Directory of templates (`<name>.yaml`); the embedded defaults when absent.
        #[arg(long, value_name = "DIR")]
        templates: Option<PathBuf>,
        /// Kubernetes version of the target cluster (decides native sidecars for `sidecarMode: auto`).
        #[arg(long, value_name = "1.33", value_parser = parse_kube_version)]
        kube_version: Option<ClusterFacts>,
        /// The injector's namespace (never injected).
        #[arg(long, value_name = "NAME", default_value = crate::engine::names::INJECTOR_NAMESPACE)]
        injector_namespace: String,
    },
    /// Parse and test-render templates; exit 1 naming the template, line and problem of each error.
    CheckTemplates {
        /// A directory of `<name>.yaml` templates, or one template file.
        path: PathBuf,
    },
}

/// Output formats of `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Human text.
    Text,
    /// JSON for machines.
    Json,
}

/// Inputs shared by `inject` and `explain`.
#[derive(Debug, Clone, Args)]
pub struct OfflineArgs {
    /// Manifest file with one or many YAML documents, or `-` for stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: Option<String>,
    /// Directory of templates (`<name>.yaml`); the embedded defaults when absent.
    #[arg(long, value_name = "DIR")]
    pub templates: Option<PathBuf>,
    /// Namespace for objects that do not name one.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub namespace: String,
    /// The namespace's labels; without them the namespace counts as opted in.
    #[arg(long, value_name = "k=v,...", value_parser = parse_key_values)]
    pub namespace_labels: Option<BTreeMap<String, String>>,
    /// The namespace's annotations (e.g. `sidecar-injector.io/templates=a,b` needs quoting).
    #[arg(long, value_name = "k=v,...", value_parser = parse_key_values)]
    pub namespace_annotations: Option<BTreeMap<String, String>>,
    /// Kubernetes version of the target cluster (decides native sidecars for `sidecarMode: auto`).
    #[arg(long, value_name = "1.33", value_parser = parse_kube_version)]
    pub kube_version: Option<ClusterFacts>,
    /// The cluster's nodes (`kubectl get nodes -o yaml`): native sidecars for `sidecarMode: auto`
    /// are then decided by the kubelets of the nodes each pod can run on, as the webhook does.
    #[arg(long, value_name = "FILE", value_parser = read_nodes)]
    pub nodes: Option<Arc<NodePool>>,
}

/// Reads a file of Node objects (a `List` or one document per node) into a pool.
fn read_nodes(path: &str) -> Result<Arc<NodePool>, String> {
    let text = read_input(path).map_err(|e| e.to_string())?;
    offline::node_pool(path, &text).map(Arc::new)
}

impl OfflineArgs {
    /// What the flags say about the cluster.
    pub fn facts(&self) -> OfflineFacts {
        OfflineFacts {
            namespace: self.namespace.clone(),
            namespace_labels: self.namespace_labels.clone(),
            namespace_annotations: self.namespace_annotations.clone(),
            cluster: self.kube_version.unwrap_or_default(),
            nodes: self.nodes.clone(),
        }
    }

    /// The templates (`--templates` or the embedded ones) and the manifests' text (`-f`).
    fn read(&self) -> Result<(TemplateSet, String, &str), CliError> {
        let file =
            self.file.as_deref().ok_or_else(|| CliError::one("-f FILE|- is required (the manifests to read)"))?;
        let text = read_input(file)?;
        Ok((load_templates(self.templates.as_deref())?, text, display_path(file)))
    }
}

/// Runs `inject`: returns the injected manifests as YAML and the warnings, or every error.
pub fn inject(args: &OfflineArgs) -> Result<(String, Vec<String>), CliError> {
    let (templates, text, file) = args.read()?;
    offline::inject(templates, Manifests { file, text: &text }, &args.facts()).map_err(CliError)
}

/// Runs `explain` and returns what to print.
pub fn explain(args: &OfflineArgs, format: OutputFormat) -> Result<String, CliError> {
    let (templates, text, file) = args.read()?;
    let format = match format {
        OutputFormat::Text => Format::Text,
        OutputFormat::Json => Format::Json,
    };
    offline::explain::explain(templates, Manifests { file, text: &text }, &args.facts(), format).map_err(CliError::one)
}

fn parse_kube_version(text: &str) -> Result<ClusterFacts, String> {
    ClusterFacts::from_version_string(text).ok_or_else(|| format!("{text:?} is not a Kubernetes version like 1.33"))
}

/// A CLI failure: one or more messages, exit status 1.
#[derive(Debug)]
pub struct CliError(pub Vec<String>);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

impl std::error::Error for CliError {}

impl CliError {
    fn one(message: impl Into<String>) -> Self {
        CliError(vec![message.into()])
    }
}

impl From<Vec<TemplateError>> for CliError {
    fn from(errors: Vec<TemplateError>) -> Self {
        CliError(errors.iter().map(ToString::to_string).collect())
    }
}

/// Reads `path` (`-` is stdin).
pub fn read_input(path: &str) -> Result<String, CliError> {
    let mut text = String::new();
    let result = if path == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    result.map_err(|e| CliError::one(format!("{}: {e}", display_path(path))))?;
    Ok(text)
}

fn display_path(path: &str) -> &str {
    if path == "-" { "<stdin>" } else { path }
}

/// The template sources in a directory (`*.yaml`, name = file stem) or a single file.
pub fn template_sources_from(path: &Path) -> Result<Vec<TemplateSource>, CliError> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| CliError::one(format!("{}: {e}", p.display())));
    let source = |p: &Path| -> Result<TemplateSource, CliError> {
        let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
        Ok(TemplateSource { name, text: read(p)? })
    };
    if path.is_file() {
        return Ok(vec![source(path)?]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| CliError::one(format!("{}: {e}", path.display())))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(CliError::one(format!("{}: no *.yaml templates in this directory", path.display())));
    }
    paths.iter().map(|p| source(p)).collect()
}

/// Loads the templates from `--templates DIR` or the embedded defaults; any error fails.
pub fn load_templates(dir: Option<&Path>) -> Result<TemplateSet, CliError> {
    load_templates_checked(dir, &crate::engine::templates::set::InProcess)
}

/// [`load_templates`], each new template first passing `precheck` (the webhook's sandbox, so that
/// a template that would exhaust memory fails with its name instead of killing the process).
pub fn load_templates_checked(dir: Option<&Path>, precheck: &dyn PreCheck) -> Result<TemplateSet, CliError> {
    let sources = match dir {
        Some(dir) => template_sources_from(dir)?,
        None => embedded_sources(),
    };
    let kept = match dir {
        Some(dir) => kept_from(&dir.join("kept"))?,
        None => Kept::default(),
    };
    let (set, errors) = TemplateSet::default().update_with_kept(sources, &kept, precheck);
    if errors.is_empty() { Ok(set) } else { Err(errors.into()) }
}

/// What a templates directory's `kept/` holds: the kept ConfigMap's data (`sidecar-injector-versions`,
/// one file per key), so that offline commands choose versions as the webhook does during a
/// rollout. No such directory: nothing kept.
pub fn kept_from(dir: &Path) -> Result<Kept, CliError> {
    if !dir.is_dir() {
        return Ok(Kept::default());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| CliError::one(format!("{}: {e}", dir.display())))?;
    let mut data = BTreeMap::new();
    for path in entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()) {
        let key = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        let text = std::fs::read_to_string(&path).map_err(|e| CliError::one(format!("{}: {e}", path.display())))?;
        data.insert(key, text);
    }
    let (kept, errors) = Kept::from_data(&data);
    if errors.is_empty() { Ok(kept) } else { Err(CliError::one(format!("{}: {}", dir.display(), errors.join("; ")))) }
}
