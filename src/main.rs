//! The `sidecar-injector` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;
use sidecar_injector::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::SandboxCheck = cli.command {
        return sidecar_injector::sandbox::child_main();
    }
    if let Command::Serve { config, templates } = cli.command {
        return match cli::serve::serve(config, templates) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error:#}");
                ExitCode::FAILURE
            }
        };
    }
    let result = match &cli.command {
        Command::Explain { args, output, cluster: true, target, injector } => on_cluster(|client| async move {
            cli::cluster::explain(&client, &args.namespace, target.as_deref(), injector, *output).await
        }),
        Command::Drift(args) => on_cluster(|client| async move { cli::cluster::drift(&client, args).await }),
        Command::Inject(args) => cli::inject(args).map(|(yaml, warnings)| {
            for warning in warnings {
                eprintln!("warning: {warning}");
            }
            yaml
        }),
        Command::Explain { args, output, .. } => cli::explain(args, *output),
        Command::CheckTemplates { path } => cli::check_templates(path),
        Command::CompilePolicies { templates, kube_version, injector_namespace } => {
            cli::compile_policies(templates.as_deref(), kube_version.unwrap_or_default(), injector_namespace)
        }
        Command::Serve { .. } | Command::SandboxCheck => unreachable!("handled above"),
    };
    match result {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            for line in error.0 {
                eprintln!("error: {line}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Runs a cluster command on a small runtime; errors become the CLI's.
fn on_cluster<F, Fut>(command: F) -> Result<String, cli::CliError>
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime
        .block_on(async {
            let client = cli::cluster::client().await?;
            command(client).await
        })
        .map_err(|e| cli::CliError(vec![format!("{e:#}")]))
}
