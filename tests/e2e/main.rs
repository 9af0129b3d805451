//! End-to-end suite on a real control plane: etcd and kube-apiserver built from Go modules
//! (`e2e/controlplane/build.sh`), `deploy/overlays/e2e` applied, the injector running as a local
//! process with its own ServiceAccount's token, then the scenarios.
//!
//! Runs when `SIDECAR_INJECTOR_E2E=1` (`make e2e` and `make test` set it); without it, it says so and
//! passes, so a plain `cargo test` stays fast. When Go or a build step is missing it fails with a
//! message saying what to install — it never skips silently when asked to run.

mod controlplane;
mod flows;
#[allow(dead_code)]
#[path = "../common/metrics.rs"]
mod metrics;
mod namespaces;
mod oracle;
mod policy;
mod rollouts;
mod scale;
mod scenarios;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::FutureExt;

use controlplane::ControlPlane;
use scenarios::Ctx;

type Scenario = for<'a> fn(&'a mut Ctx) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), (|ctx| Box::pin($name(ctx))) as Scenario)),*]
    };
}

fn main() -> ExitCode {
    if std::env::var_os("SIDECAR_INJECTOR_E2E").is_none() {
        println!("e2e: not run (set SIDECAR_INJECTOR_E2E=1, or run `make e2e`)");
        return ExitCode::SUCCESS;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(root).unwrap();
    let started = Instant::now();
    let build = Command::new("bash").arg("e2e/controlplane/build.sh").status();
    match build {
        Ok(status) if status.success() => {}
        Ok(_) => {
            eprintln!("e2e: building the control plane failed (see above)");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("e2e: cannot run e2e/controlplane/build.sh: {e} (install bash and Go)");
            return ExitCode::FAILURE;
        }
    }
    println!("e2e: control plane binaries ready after {:.1} s", started.elapsed().as_secs_f64());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    match runtime.block_on(run(root)) {
        Ok(true) => {
            println!("e2e: all scenarios passed in {:.1} s", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("e2e: setup failed: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(root: &Path) -> Result<bool> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::Builder::new().prefix("sidecar-injector-e2e-").tempdir()?;
    let setup = Instant::now();
    let plane = ControlPlane::start(&root.join("e2e/bin"), dir.path())?;
    println!("e2e: etcd and kube-apiserver ready after {:.1} s ({})", setup.elapsed().as_secs_f64(), plane.url);
    let applied = plane.kubectl(&["apply", "-k", "deploy/overlays/e2e"]).context("applying deploy/overlays/e2e")?;
    let client = plane.admin_client().await?;
    let mut ctx = Ctx {
        plane,
        injector: None,
        // `make e2e` passes the release binary built by the Dockerfile's command.
        binary: std::env::var_os("SIDECAR_INJECTOR_BIN")
            .map_or_else(|| env!("CARGO_BIN_EXE_sidecar-injector").into(), Into::into),
        client: client.clone(),
        applied,
        first_ca_bundle: Vec::new(),
    };
    ctx.start_injector().context("starting the injector")?;
    ctx.first_ca_bundle = scenarios::ca_bundle(&client).await?;
    if ctx.first_ca_bundle.is_empty() {
        bail!("the injector did not create its certificate Secret");
    }
    scenarios::setup(&mut ctx).await.context("the namespaces every scenario may use")?;
    println!("e2e: injector ready, setup took {:.1} s", setup.elapsed().as_secs_f64());

    use flows::*;
    use namespaces::s38_namespace_unreadable;
    use oracle::s37_api_server_oracle;
    use policy::s23_policy_mode;
    use rollouts::s43_progressive_rollout;
    use scale::scale as scale_run_scenario;
    use scenarios::*;
    let all = scenarios![
        s01_overlay_accepted,
        s02_pod_injected,
        s03_untouched,
        s04_dry_run,
        s05_hot_reload,
        s06_broken_edit_refused,
        s07_other_mutators,
        s08_injector_down,
        s09_job_pod_native_sidecar,
        s10_self_managed_certificates,
        s11_least_privilege,
        s13_explain_cluster,
        s14_drift,
        s15_only_the_api_server,
        s16_enforced_templates,
        s17_workloads,
        s18_opt_in_later,
        s19_namespace_reborn,
        s20_two_injectors_race,
        s21_restart_during_rollout,
        s22_limit_range_and_quota,
        s23_policy_mode,
        s25_namespace_defaults,
        s26_enforcement_audit,
        s27_events,
        s28_native_by_nodes,
        s29_pod_level_resources,
        s30_host_aliases,
        s31_port_collisions,
        s32_enforced_resize,
        s33_resized_sidecar_stays_injected,
        s34_positions,
        s35_in_place_upgrade,
        s36_image_volumes_by_nodes,
        s37_api_server_oracle,
        s38_namespace_unreadable,
        s39_claims_and_gates,
        s40_pod_security_levels,
        s41_node_declared_features,
        s42_sized_from_the_app,
        s43_progressive_rollout,
        // Before the API server restart, which sets its counters back to zero.
        s24_monitoring_uses_real_api_server_metrics,
        s12_api_server_outage,
    ];
    // `make scale` (SIDECAR_INJECTOR_E2E_SCALE=1): the scale run alone, with a budget of its own.
    let scale_run = std::env::var_os("SIDECAR_INJECTOR_E2E_SCALE").is_some();
    let (all, limit) = match scale_run {
        // 30 minutes at the default size, more for a larger one (`scale::time_budget`).
        true => (scenarios![scale_run_scenario], scale::time_budget()),
        false => (all, Duration::from_secs(180)),
    };
    let mut failed = Vec::new();
    // `SIDECAR_INJECTOR_E2E_ONLY=s16,s12` runs only the scenarios whose names start with these (for
    // working on one; `make test` runs them all).
    let only: Vec<String> = std::env::var("SIDECAR_INJECTOR_E2E_ONLY")
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let all = all.into_iter().filter(|(name, _)| only.is_empty() || only.iter().any(|o| name.starts_with(o.as_str())));
    for (name, scenario) in all {
        let started = Instant::now();
        // `make oracle` runs many cases: its own budget.
        let limit = if name == "s37_api_server_oracle" { limit.max(oracle::time_budget()) } else { limit };
        let outcome =
            tokio::time::timeout(limit, std::panic::AssertUnwindSafe(scenario(&mut ctx)).catch_unwind()).await;
        let result = match outcome {
            Err(_) => Err(anyhow::anyhow!("timed out after {limit:?}")),
            Ok(Err(panic)) => Err(anyhow::anyhow!(
                "panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
            Ok(Ok(result)) => result,
        };
        match result {
            Ok(()) => println!("  ok    {name} ({:.1} s)", started.elapsed().as_secs_f64()),
            Err(error) => {
                println!("  FAIL  {name} ({:.1} s): {error:#}", started.elapsed().as_secs_f64());
                failed.push(name);
            }
        }
    }
    scenarios::cleanup(&ctx).await;
    if let Some(pid) = ctx.injector.as_ref().and_then(|i| i.process.pid()) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let peak = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .unwrap_or("VmHWM: ?")
            .split_whitespace()
            .nth(1)
            .unwrap_or("?")
            .to_owned();
        println!("e2e: injector peak RSS {peak} kB");
    }
    if !failed.is_empty() {
        println!("e2e: {} scenario(s) failed: {}", failed.len(), failed.join(", "));
        if let Some(injector) = &ctx.injector {
            println!("--- injector log (last 40 lines)\n{}", injector.process.tail(40));
        }
        if let Some(apiserver) = &ctx.plane.apiserver {
            println!("--- kube-apiserver log (last 20 lines)\n{}", apiserver.tail(20));
        }
        println!("--- etcd log (last 10 lines)\n{}", ctx.plane.etcd.tail(10));
    }
    // Teardown: dropping the context stops the injector, kube-apiserver and etcd.
    drop(ctx);
    if !failed.is_empty() {
        println!("e2e: logs kept in {}", dir.keep().display());
    }
    Ok(failed.is_empty())
}
