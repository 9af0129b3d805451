//! Test-rendering new template text in a child process with memory and CPU limits before it is
//! loaded into the webhook (see `engine::template::PreCheck` for why).
//!
//! The child is this same binary (`sidecar-injector sandbox-check`, hidden): it reads the sources
//! as JSON on stdin and loads each one (parse, compile, test-render). The parent only looks at how
//! it ended: a clean exit means every source can be loaded safely in-process (template *errors*
//! included — they are reported by the in-process load); an abort, a kill or a timeout means one of
//! them exceeded the limits, and each source is then tried alone to name the culprit.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::engine::template::PreCheck;
use crate::engine::{Template, TemplateError, TemplateSource};

/// Address space the child may use. A real template renders in a few MiB; the binary itself maps
/// about 30 MiB.
pub const MEMORY_LIMIT_BYTES: u64 = 512 * 1024 * 1024;
/// CPU time the child may use.
pub const CPU_LIMIT_SECONDS: u64 = 10;
/// Wall-clock time before the child is killed.
pub const TIMEOUT: Duration = Duration::from_secs(15);

/// The child-process pre-check.
#[derive(Debug, Clone)]
pub struct Sandbox {
    program: PathBuf,
}

impl Sandbox {
    /// A sandbox that runs `program sandbox-check` (normally this binary).
    pub fn new(program: PathBuf) -> Self {
        Sandbox { program }
    }

    /// A sandbox running this very binary.
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(Sandbox::new(std::env::current_exe()?))
    }

    /// Loads `sources` in a child; `Err` says how the child ended when it did not finish cleanly.
    fn run(&self, sources: &[TemplateSource]) -> Result<(), String> {
        let input: Vec<(&str, &str)> = sources.iter().map(|s| (s.name.as_str(), s.text.as_str())).collect();
        let mut command = Command::new(&self.program);
        command.arg("sandbox-check").stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: setrlimit is async-signal-safe and touches no parent memory.
        unsafe {
            command.pre_exec(|| {
                let limit = |resource, value: u64| {
                    let rlimit = libc::rlimit { rlim_cur: value, rlim_max: value };
                    libc::setrlimit(resource, &rlimit)
                };
                limit(libc::RLIMIT_AS, MEMORY_LIMIT_BYTES);
                limit(libc::RLIMIT_CPU, CPU_LIMIT_SECONDS);
                limit(libc::RLIMIT_CORE, 0);
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("the template sandbox could not start ({}): {e}", self.program.display()))?;
        let written = child
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(&serde_json::to_vec(&input).expect("sources serialize")));
        if let Some(Err(e)) = written {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the template sandbox did not take its input: {e}"));
        }
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(_)) => {
                    return Err(format!(
                        "test-rendering it exceeded the sandbox limits ({} MiB of memory, {CPU_LIMIT_SECONDS} s of CPU)",
                        MEMORY_LIMIT_BYTES / 1024 / 1024
                    ));
                }
                Ok(None) if started.elapsed() > TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("test-rendering it did not finish within {} s", TIMEOUT.as_secs()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(format!("the template sandbox failed: {e}")),
            }
        }
    }
}

impl PreCheck for Sandbox {
    fn precheck(&self, sources: &[TemplateSource]) -> Vec<TemplateError> {
        let refuse = |source: &TemplateSource, why: String| TemplateError {
            template: source.name.clone(),
            line: None,
            message: why,
        };
        match self.run(sources) {
            Ok(()) => Vec::new(),
            Err(why) if sources.len() == 1 => vec![refuse(&sources[0], why)],
            // Find which ones: each source alone.
            Err(_) => sources
                .iter()
                .filter_map(|s| self.run(std::slice::from_ref(s)).err().map(|why| refuse(s, why)))
                .collect(),
        }
    }
}

/// The child: loads every source given on stdin as `[[name, text], ...]`. Exits 0 when it got
/// through all of them, whatever their errors.
pub fn child_main() -> ExitCode {
    let mut input = Vec::new();
    if std::io::stdin().read_to_end(&mut input).is_err() {
        return ExitCode::from(2);
    }
    let Ok(sources) = serde_json::from_slice::<Vec<(String, String)>>(&input) else {
        return ExitCode::from(2);
    };
    for (name, text) in sources {
        let _ = Template::load(&name, &text);
    }
    ExitCode::SUCCESS
}
