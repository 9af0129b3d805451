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
        Command::Inject(args) => cli::inject(args).map(|(yaml, warnings)| {
            for warning in warnings {
                eprintln!("warning: {warning}");
            }
            yaml
        }),
        Command::Explain { args, output } => cli::explain(args, *output),
        Command::CheckTemplates { path } => cli::check_templates(path),
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
